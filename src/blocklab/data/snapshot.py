"""The embedded default corpus: a pinned snapshot of the Python 3.11.7 standard library.

A stand-in for the CodeParrot Python-code data of *Simplifying Transformer Blocks* (He & Hofmann,
2024) that needs no download. `build_snapshot.py` made it once; `python-stdlib.json` records the
Python version, the document count and the sha256 of the decompressed bytes, so every machine and
every Python version reads the same 612 documents in the same order.
"""

from __future__ import annotations

import hashlib
import json
import lzma
from collections.abc import Iterator
from functools import cache
from importlib import resources
from typing import Any


@cache
def snapshot_info() -> dict[str, Any]:
    """The sidecar record: file name, python_version, documents, bytes, sha256."""
    return json.loads(resources.files("blocklab.data").joinpath("corpora", "python-stdlib.json").read_text())


def snapshot_bytes(verify: bool = True) -> bytes:
    """The decompressed JSON lines; with `verify`, checked against the recorded sha256."""
    info = snapshot_info()
    with resources.files("blocklab.data").joinpath("corpora", info["file"]).open("rb") as fh:
        raw = lzma.decompress(fh.read())
    if verify and hashlib.sha256(raw).hexdigest() != info["sha256"]:
        raise RuntimeError(f"the embedded corpus {info['file']} does not match its recorded sha256 "
                           f"{info['sha256']}; the package files are damaged, reinstall blocklab.")
    return raw


def iter_snapshot() -> Iterator[tuple[str, str]]:
    """Yield (path, text) for every file of the snapshot, sorted by path."""
    # Split on "\n" only: JSON escapes it inside strings, but not U+2028 or U+0085, which
    # str.splitlines() would also break on.
    for line in snapshot_bytes().split(b"\n"):
        if not line:
            continue
        record = json.loads(line)
        yield record["path"], record["text"]
