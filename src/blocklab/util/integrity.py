"""sha256 records of saved files, so that a changed byte is refused by name instead of loaded.

A checkpoint's state.json records the sha256 of its own weight and optimizer files and of the run's
`model_config.json` and `tokenizer.json` as they were when it was written; an export's config.json
records its weights and tokenizer. Loading recomputes them (`verify`). Files saved before these
records existed carry none and load as before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from blocklab.util.errors import ConfigError

CHUNK = 1 << 20


class IntegrityError(ConfigError):
    """A saved file differs from the sha256 recorded when it was written."""


def sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def record(folder: str | Path, names: Iterable[str]) -> dict[str, str]:
    """{name: sha256} of the files of `folder` among `names` that exist."""
    folder = Path(folder)
    return {name: sha256(folder / name) for name in names if (folder / name).is_file()}


def verify(folder: str | Path, recorded: dict[str, str] | None, where: str) -> None:
    """Raise IntegrityError naming the first file of `folder` whose sha256 differs from `recorded`
    (or that is missing); `where` names the record (e.g. the state.json that holds it)."""
    folder = Path(folder)
    for name, expected in (recorded or {}).items():
        path = folder / name
        if not path.is_file():
            raise IntegrityError(f"{path} is missing, but {where} records it: the run was changed after it "
                                 "was saved.")
        actual = sha256(path)
        if actual != expected:
            raise IntegrityError(f"{path} has changed since it was saved (sha256 {actual[:12]}..., {where} "
                                 f"records {expected[:12]}...): refusing to load a file that is not the one "
                                 "trained. Restore it, or load with verify=False (load_run, load_pretrained) "
                                 "to use it anyway.")
