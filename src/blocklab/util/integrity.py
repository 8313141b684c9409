"""sha256 records of saved files, so that a changed byte is refused by name instead of loaded.

A checkpoint's state.json records the sha256 of its own weight and optimizer files and of the run's
`model_config.json` and `tokenizer.json` as they were when it was written; an export's config.json
records its weights and tokenizer, and the sha256 of its own other fields (`fields_sha256`: a file
cannot hold the hash of its bytes, so its fields are hashed in a canonical JSON form). Loading
recomputes them (`verify`, `verify_fields`). Files saved before these records existed carry none and
load as before.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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


def fields_sha256(fields: dict[str, Any]) -> str:
    """The sha256 of a JSON object's fields, in a form that does not depend on the file's layout (keys
    sorted, no spaces): what a file records of its own other fields."""
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def verify_fields(path: str | Path, fields: dict[str, Any], recorded: Any) -> None:
    """Raise IntegrityError when the `fields` read from `path` differ from the sha256 `recorded` in it
    (`fields_sha256`); nothing to check when it records none (written before the record)."""
    if recorded is None:
        return
    actual = fields_sha256(fields)
    if actual != recorded:
        raise IntegrityError(f"{path} has changed since it was saved (its fields' sha256 {actual[:12]}..., "
                             f"recorded {str(recorded)[:12]}...): refusing to load a model whose config is "
                             "not the one trained, as its logits would be off. Restore it (or export again), "
                             "or load with verify=False (load_run, load_pretrained) to use it anyway.")
