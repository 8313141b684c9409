"""What the data tests check against, written from the definitions rather than through the code under
test: the split rule from sha256, documents joined as the shards pack them; and files written by hand."""

from __future__ import annotations

import hashlib
from pathlib import Path

from blocklab.data import DataConfig

EOS, MASK = 256, 257  # byte tokenizer specials


def ref_split(name: str, val_fraction: float) -> str:
    """The split rule, written from its definition: first 64 bits of sha256(name) as a fraction."""
    u = int(hashlib.sha256(name.encode()).hexdigest()[:16], 16)
    return "val" if u < val_fraction * 16**16 else "train"


def write_files(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return root


def byte_stream(texts: list[str]) -> list[int]:
    """Documents joined the way the shards pack them: bytes, then the separator."""
    return [t for text in texts for t in [*text.encode("utf-8"), EOS]]


def byte_cfg(source, cache: Path, **kw) -> DataConfig:
    return DataConfig(source=str(source), tokenizer="byte", cache_dir=str(cache), **kw)
