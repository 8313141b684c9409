"""The token cache's folder: where it is (data.cache_dir, else ``$BLOCKLAB_CACHE``, else
``~/.cache/blocklab``), the keys that name its entries, and writes into it, where a refusal for want of
space is said as a DiskFullError naming what was written, the space free and needed, and the folder
with what chose it. What the entries hold and how they are checked: `cache_entry`; how they are
built: `prepare`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from blocklab.data.config import DataConfig
from blocklab.util import diskfull


def cache_root(cfg: DataConfig) -> Path:
    """The token cache's folder: data.cache_dir, else $BLOCKLAB_CACHE, else ~/.cache/blocklab."""
    root = cfg.cache_dir or os.environ.get("BLOCKLAB_CACHE") or Path.home() / ".cache" / "blocklab"
    return Path(root).expanduser()


def cache_origin(cfg: DataConfig) -> str:
    """What to do when the cache's disk is full, naming the cache folder and what chose it."""
    root = cache_root(cfg)
    if cfg.cache_dir:
        return (f"The token cache is {root}, set by data.cache_dir: free some space there, or set "
                "data.cache_dir (which takes precedence over BLOCKLAB_CACHE) to a folder on a disk with "
                "room, then run again.")
    chosen = "set by BLOCKLAB_CACHE" if os.environ.get("BLOCKLAB_CACHE") else "the default"
    return (f"The token cache is {root} ({chosen}): free some space there, or set BLOCKLAB_CACHE to a "
            "folder on a disk with room, then run again.")


@contextlib.contextmanager
def cache_write(cfg: DataConfig, what: str, path: Path, needed: Callable[[], int | None]) -> Iterator[None]:
    """Writes into the cache, a refusal for want of space said as a DiskFullError naming `what` at
    `path`, the space free there and the size `needed()` estimates (called only then), and the cache
    folder (`cache_origin`). The writes inside remove what a failed one left before it gets here, so
    that the free space said is what a retry finds."""
    try:
        yield
    except Exception as err:
        if diskfull.failed_write(err) is None:
            raise
        raise diskfull.disk_full(err, what, path, needed(), "Nothing half-written was left. "
                                 + cache_origin(cfg)) from err


def entry_key(obj: Any) -> str:
    """The name of the entry that `obj` (settings, fingerprints, hashes) keys: 24 hex digits of the
    sha256 of its JSON."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:24]
