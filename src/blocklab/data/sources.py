"""Where documents come from, and which split each one belongs to.

A source yields ``(name, text)`` documents in a fixed order: the embedded snapshot (sorted by
path), the files of a directory or glob (sorted by path; ``.jsonl`` files give one document per
record), one text or JSONL file, or a Hugging Face `datasets` data set (row order). Each source
has a cheap `fingerprint` of its content (file sizes and modification times, the snapshot's
sha256, the data set's fingerprint) that keys the caches without reading the text again.

The train/validation split is by document: a document is held out when the sha256 of its name,
read as a number in [0, 1), is below `val_fraction`. The split of a file therefore never depends
on which other files are present, on the order or on the machine.
"""

from __future__ import annotations

import difflib
import glob
import hashlib
import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blocklab.data.config import EMBEDDED, DataConfig
from blocklab.data.snapshot import iter_snapshot, snapshot_info
from blocklab.errors import ConfigError

Select = Callable[[str], bool]

ACCEPTED = (f"{EMBEDDED!r} (the embedded Python-stdlib snapshot), a directory of text files, a glob such as "
            "'data/**/*.py', a text file, a .jsonl file with a text field, or 'hf:NAME' for "
            "datasets.load_dataset(NAME, **hf_kwargs)")


def split_of(name: str, val_fraction: float) -> str:
    """'val' when sha256(name), read as a fraction in [0, 1), is below `val_fraction`, else 'train'."""
    u = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big") / 2.0**64
    return "val" if u < val_fraction else "train"


@dataclass
class Source:
    """A re-iterable sequence of documents; `skipped` lists what the last full pass could not read."""

    kind: str
    description: str
    skipped: list[str] = field(default_factory=list)

    @property
    def file_count(self) -> int | None:
        """How many files the source reads (None: not a file source, e.g. a hub dataset)."""
        return None

    def fingerprint(self) -> dict[str, Any]:
        raise NotImplementedError

    def documents(self, select: Select | None = None) -> Iterator[tuple[str, str]]:
        """Yield (name, text); documents whose name `select` rejects are passed over unread."""
        raise NotImplementedError


class SnapshotSource(Source):
    def __init__(self) -> None:
        info = snapshot_info()
        super().__init__("snapshot", f"embedded Python {info['python_version']} standard library "
                                     f"({info['documents']} files)")

    @property
    def file_count(self) -> int:
        return snapshot_info()["documents"]

    def fingerprint(self) -> dict[str, Any]:
        info = snapshot_info()
        return {"sha256": info["sha256"], "python_version": info["python_version"]}

    def documents(self, select: Select | None = None) -> Iterator[tuple[str, str]]:
        self.skipped = []
        for name, text in iter_snapshot():
            if select is None or select(name):
                yield name, text


class FileSource(Source):
    """Files read as UTF-8 text; `.jsonl` files give one document per record (`text_field`)."""

    def __init__(self, files: list[Path], base: Path, text_field: str, description: str) -> None:
        super().__init__("files", description)
        self.files, self.base, self.text_field = files, base, text_field

    @property
    def file_count(self) -> int:
        return len(self.files)
        self.bad_records = 0

    def _name(self, path: Path) -> str:
        return path.relative_to(self.base).as_posix()

    def fingerprint(self) -> dict[str, Any]:
        entries = [[self._name(p), s.st_size, s.st_mtime_ns] for p in self.files for s in [p.stat()]]
        digest = hashlib.sha256(json.dumps(entries).encode("utf-8")).hexdigest()
        return {"files": len(self.files), "stat_sha256": digest, "text_field": self.text_field}

    def documents(self, select: Select | None = None) -> Iterator[tuple[str, str]]:
        self.skipped, self.bad_records = [], 0
        for path in self.files:
            name = self._name(path)
            if path.suffix == ".jsonl":
                yield from self._records(path, name, select)
                continue
            if select is not None and not select(name):
                continue
            try:
                text = path.read_bytes().decode("utf-8")
            except UnicodeDecodeError:
                self.skipped.append(name)  # binary or another encoding: skip, report in stats
                continue
            if text:
                yield name, text

    def _records(self, path: Path, name: str, select: Select | None) -> Iterator[tuple[str, str]]:
        with path.open("rb") as fh:
            for lineno, line in enumerate(fh, start=1):
                doc = f"{name}:{lineno}"
                if not line.strip() or (select is not None and not select(doc)):
                    continue
                try:
                    record = json.loads(line.decode("utf-8"))
                    text = record[self.text_field]
                except (UnicodeDecodeError, ValueError, KeyError, TypeError):
                    self.bad_records += 1
                    continue
                if not isinstance(text, str):
                    self.bad_records += 1
                elif text:
                    yield doc, text


class HFSource(Source):
    """`datasets.load_dataset(name, **kwargs)`; rows are documents named by their index."""

    def __init__(self, name: str, kwargs: dict[str, Any], text_field: str) -> None:
        super().__init__("hf", f"datasets.load_dataset({name!r}, **{kwargs!r})")
        self.name, self.kwargs, self.text_field = name, kwargs, text_field
        self._dataset = None

    @property
    def dataset(self):
        if self._dataset is None:
            try:
                import datasets
            except ImportError as err:
                raise ConfigError(f"DataConfig.source = 'hf:{self.name}' needs the `datasets` package: "
                                  "pip install 'blocklab[hf]'.") from err
            ds = datasets.load_dataset(self.name, **self.kwargs)
            if isinstance(ds, (datasets.DatasetDict, datasets.IterableDatasetDict)):
                if "train" not in ds:
                    raise ConfigError(f"hf:{self.name} has splits {sorted(ds)}; choose one with "
                                      "hf_kwargs={'split': ...}.")
                ds = ds["train"]
            columns = ds.column_names
            if columns is not None and self.text_field not in columns:
                raise ConfigError(f"DataConfig.text_field = {self.text_field!r} is not a column of "
                                  f"hf:{self.name}; its columns are {columns}.")
            self._dataset = ds
        return self._dataset

    def fingerprint(self) -> dict[str, Any]:
        ds_fingerprint = getattr(self.dataset, "_fingerprint", None)
        return {"name": self.name, "kwargs": json.dumps(self.kwargs, sort_keys=True, default=str),
                "dataset_fingerprint": ds_fingerprint, "text_field": self.text_field}

    def documents(self, select: Select | None = None) -> Iterator[tuple[str, str]]:
        self.skipped = []
        for i, row in enumerate(self.dataset.select_columns([self.text_field])):
            name = str(i)
            text = row[self.text_field]
            if (select is None or select(name)) and isinstance(text, str) and text:
                yield name, text


def _glob_base(pattern: str) -> Path:
    """The longest leading directory of `pattern` without wildcards (names are relative to it)."""
    parts = []
    for part in Path(pattern).parts:
        if glob.has_magic(part):
            break
        parts.append(part)
    return Path(*parts) if parts else Path(".")


def _visible_files(root: Path) -> list[Path]:
    """Regular files under `root`, skipping hidden files and directories (.git, .cache ...)."""
    files = [p for p in root.rglob("*")
             if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def open_source(cfg: DataConfig) -> Source:
    """The source `cfg.source` names; a missing or empty path raises `ConfigError`."""
    spec = cfg.source
    if spec == EMBEDDED:
        return SnapshotSource()
    if spec.startswith("hf:"):
        return HFSource(spec[3:], dict(cfg.hf_kwargs), cfg.text_field)
    if glob.has_magic(spec):
        files = sorted((Path(p) for p in glob.glob(spec, recursive=True) if os.path.isfile(p)),
                       key=lambda p: p.as_posix())
        if not files:
            raise ConfigError(f"DataConfig.source = {spec!r}: the glob matches no files. "
                              f"Accepted: {ACCEPTED}.")
        return FileSource(files, _glob_base(spec), cfg.text_field, f"files matching {spec!r}")
    path = Path(spec).expanduser()
    if path.is_dir():
        files = _visible_files(path)
        if not files:
            raise ConfigError(f"DataConfig.source = {spec!r}: the directory holds no files. "
                              f"Accepted: {ACCEPTED}.")
        return FileSource(files, path, cfg.text_field, f"files under {spec!r}")
    if path.is_file():
        return FileSource([path], path.parent, cfg.text_field, f"file {spec!r}")
    close = difflib.get_close_matches(spec, [EMBEDDED], n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"DataConfig.source = {spec!r}: no such file or directory.{hint} Accepted: {ACCEPTED}.")


def split_documents(source: Source, cfg: DataConfig, splits: tuple[str, ...] = ("train", "val"),
                    max_chars: dict[str, int | None] | None = None) -> Iterator[tuple[str, str, str]]:
    """Yield (split, name, text) for the documents of `splits`, in source order.

    With `cfg.max_chars` the validation split gets ceil(max_chars * val_fraction) characters and
    the training split the rest; each takes documents until its budget is full (the last one cut),
    and reading stops when every wanted split is full. `max_chars` overrides the budgets per split.
    """
    budget = max_chars if max_chars is not None else split_budgets(cfg)
    left = {s: budget.get(s) for s in splits}

    def wanted(name: str) -> bool:
        split = split_of(name, cfg.val_fraction)
        return split in left and left[split] != 0

    for name, text in source.documents(wanted):
        split = split_of(name, cfg.val_fraction)
        if left[split] is not None:
            text = text[: left[split]]
            left[split] -= len(text)
        yield split, name, text
        if all(v == 0 for v in left.values()):
            return


def split_budgets(cfg: DataConfig) -> dict[str, int | None]:
    if cfg.max_chars is None:
        return {"train": None, "val": None}
    val = math.ceil(cfg.max_chars * cfg.val_fraction)
    if cfg.max_chars - val <= 0:
        raise ConfigError(f"DataConfig.max_chars = {cfg.max_chars} leaves no characters for the training "
                          f"split after the validation share (val_fraction = {cfg.val_fraction}).")
    return {"train": cfg.max_chars - val, "val": val}
