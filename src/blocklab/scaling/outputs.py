"""Every path `blocklab scaling` writes, checked before anything trains (as benchmarks/gpu_campaign.py
checks its own): a wrong one found after a run has trained loses that run's time, on a lent GPU the
call's. The export tarball's rules are `reproduce.budgeted_launch.check_export`'s."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from blocklab.util.errors import ConfigError


def check_outputs(args: argparse.Namespace, root: Path) -> None:
    """--export (a tarball blocklab may write: `check_export`), the report's folder (--report, else the
    store's) and, when training, the store: each a folder this user can write to, or can make."""
    from blocklab.reproduce.budgeted_launch import check_export

    if args.export is not None:
        if not args.export.strip():
            raise ConfigError(f"--export {args.export!r} is not allowed: give the path of a .tgz to write")
        if args.minutes is None:
            raise ConfigError("--export writes the tarball of a piece: give --minutes M too (the piece's "
                              "budget), or leave out --export")
        check_export(Path(args.export), root, args.overwrite)
    if args.report is not None:
        check_folder("--report", Path(args.report))
    if not args.no_train or args.report is None:
        check_folder("--out", Path(args.out), root)


def check_folder(option: str, path: Path, inside: Path | None = None) -> None:
    """Refuse `path` (given as `option`) unless it is a folder this user can write to, or one that can be
    made in the nearest folder that exists; `inside`, a folder to be made under it, likewise."""
    if not str(path).strip():
        raise ConfigError(f"{option} {str(path)!r} is not allowed: give a folder")
    for folder in (path, inside) if inside is not None else (path,):
        if folder.exists() and not folder.is_dir():
            raise ConfigError(f"{option} {path}: {folder} is a file, not a folder: give a folder (the report "
                              "writes scaling.md, .html, .json and its figures in it)")
    target = inside if inside is not None else path
    existing = next(p for p in (target.absolute(), *target.absolute().parents) if p.exists())
    try:
        if not existing.is_dir():
            raise NotADirectoryError(existing)
        with tempfile.TemporaryFile(dir=existing):  # permissions alone miss read-only mounts, /proc ...
            pass
    except OSError:
        raise ConfigError(f"{option} {path} is not allowed: {str(existing)!r} is not a folder this user can "
                          "write to") from None
