"""Report files blocklab owns: a command that writes a report into a folder replaces only files it wrote
there, and refuses any other file of the same name by name (compare's rule, `report.write.check_report_files`,
made reusable for `blocklab scaling` and `blocklab plot`).

A file is blocklab's when
- the folder's record (RECORD, a JSON object of name -> sha256 that every write updates) names it with
  its content unchanged since; or, for a file the record does not name (a folder written before the
  record existed, or a checkout, where the record is not committed),
- it carries the report's mark near its start (a markdown or HTML title, a JSON key), or it is a figure
  that a marked markdown report of the same folder links.

A recorded file whose content changed since is the user's now (an edit, or a file of theirs put in its
place) and is refused like any other. `overwrite` (the commands' --overwrite) replaces the named files
and nothing else in the folder.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from blocklab.util.errors import ConfigError

RECORD = ".blocklab-wrote.json"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _record(out: Path) -> dict[str, str]:
    try:
        files = json.loads((out / RECORD).read_text(encoding="utf-8")).get("files", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else {}


def _head(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[:4000] if path.is_file() else ""
    except OSError:
        return ""


def check_folder(out: Path, flag: str) -> None:
    """Refuse an output folder that is a file, or lies under one: `flag` names the option given."""
    for place in (out, *out.parents):
        if place.exists():
            if not place.is_dir():
                what = "is a file" if place == out else f"lies under {place}, which is a file"
                raise ConfigError(f"{flag} {out} {what}: give a folder (it is created if missing) for the "
                                  "report's files.")
            return


def foreign_files(out: Path, marks: Mapping[str, str | None], report: str) -> list[str]:
    """The files of `marks` (name -> the text that marks it blocklab's, None for a figure) present in `out`
    that blocklab did not write: not recorded unchanged, not marked, not a figure linked from the markdown
    report `report` when that is blocklab's. A changed recorded file is named "(changed since blocklab
    wrote it)"."""
    recorded = _record(out)
    linking = _head(out / report) if _whose(out / report, recorded, marks.get(report), "") == "ours" else ""
    foreign = []
    for name, mark in marks.items():
        whose = _whose(out / name, recorded, mark, linking)
        if whose == "changed":
            foreign.append(f"{name} (changed since blocklab wrote it)")
        elif whose == "theirs":
            foreign.append(name)
    return foreign


def _whose(path: Path, recorded: dict[str, str], mark: str | None, linking: str) -> str:
    """"absent", "ours", "changed" (recorded, content changed since) or "theirs"."""
    if not path.exists() and not path.is_symlink():
        return "absent"
    plain = path.is_file() and not path.is_symlink()
    if path.name in recorded:
        try:
            return "ours" if plain and _sha256(path) == recorded[path.name] else "changed"
        except OSError:
            return "changed"
    if not plain:
        return "theirs"
    if mark is not None:
        return "ours" if mark in _head(path) else "theirs"
    return "ours" if f"]({path.name})" in linking else "theirs"


def check_owned(out: str | Path, marks: Mapping[str, str | None], report: str, overwrite: bool,
                flag: str, command: str) -> None:
    """Refuse writing `marks`' files into `out` when any there is not blocklab's (`foreign_files`), unless
    `overwrite`; refuse an `out` that is a file. One line naming the files and the ways out."""
    out = Path(out)
    check_folder(out, flag)
    if overwrite or not out.is_dir():
        return
    foreign = foreign_files(out, marks, report)
    if foreign:
        raise ConfigError(f"{flag} {out} holds {', '.join(foreign)}, not blocklab {command}'s own, which its "
                          "report would replace: choose another folder, or pass --overwrite to replace them.")


def record_written(out: str | Path, paths: Iterable[Path]) -> None:
    """Add the files just written (`paths`, in `out`) to the folder's record with their sha256."""
    out = Path(out)
    files = _record(out)
    for path in paths:
        files[Path(path).name] = _sha256(Path(path))
    (out / RECORD).write_text(json.dumps({"format": "blocklab report files, version 1",
                                          "files": dict(sorted(files.items()))}, indent=2) + "\n")
