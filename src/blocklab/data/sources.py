"""Where documents come from, and which split each one belongs to.

A source yields ``(name, text)`` documents in a fixed order: an embedded snapshot (sorted by
path), the files of a directory or glob (sorted by path; ``.jsonl`` files give one document per
record), one text or JSONL file, or a Hugging Face `datasets` data set (row order). Each source
has a `fingerprint` of its content that keys the caches: the sha256 of every file's bytes (a copy made
with `cp -p`, `rsync -a` or `tar` keeps a file's name, size and modification time, so only the bytes
tell an edited file; each file's sha256 is recorded with its stat, `digests`, so that a start reads
only the files changed since, measured in benchmarks/RESULTS.md), the snapshot's sha256, the data
set's own fingerprint.

The train/validation split is by document: a document is held out when the sha256 of its name,
read as a number in [0, 1), is below `val_fraction`. The split of a file therefore never depends
on which other files are present, on the order or on the machine. A single text file given as the
source is read as many documents, its paragraphs (runs of lines between blank lines; its lines when
it has no blank line), named `<file>:<first line>`, so that it splits like a directory does.
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

from blocklab.data.config import EMBEDDED, EMBEDDED_CORPORA, PROSE, DataConfig
from blocklab.data.digests import DigestRecord
from blocklab.data.snapshot import iter_snapshot, snapshot_info
from blocklab.util.errors import ConfigError
from blocklab.util.pathtext import is_text, not_text, what_is_there

Select = Callable[[str], bool]

ACCEPTED = (f"{EMBEDDED!r} (the embedded Python-stdlib snapshot), {PROSE!r} (the embedded English corpus: "
            "Shakespeare's plays and poems), a directory of text files, a glob such as "
            "'data/**/*.py', a text file, a .jsonl file with a text field, or 'hf:NAME' for "
            "datasets.load_dataset(NAME, **hf_kwargs)")


def split_of(name: str, val_fraction: float) -> str:
    """'val' when sha256(name), read as a fraction in [0, 1), is below `val_fraction`, else 'train'."""
    u = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big") / 2.0**64
    return "val" if u < val_fraction else "train"


def utf8_size(text: str) -> int:
    """The UTF-8 bytes of `text`, without encoding it when it is ASCII (str.isascii takes no pass)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


@dataclass
class Source:
    """A re-iterable sequence of documents; `skipped` lists what the last full pass could not read, and
    `bytes_read` counts the bytes read so far in the current pass (the files' bytes; the texts' UTF-8
    bytes for the snapshot and a data set): a progress bar's position against `text_bytes`."""

    kind: str
    description: str
    skipped: list[str] = field(default_factory=list)
    bytes_read: int = 0

    @property
    def file_count(self) -> int | None:
        """How many files the source reads (None: not a file source, e.g. a hub dataset)."""
        return None

    def fingerprint(self) -> dict[str, Any]:
        raise NotImplementedError

    def text_bytes(self) -> int | None:
        """About how many bytes of text the source holds (None: not known without reading it), for
        the size a token cache entry will take."""
        return None

    def documents(self, select: Select | None = None) -> Iterator[tuple[str, str]]:
        """Yield (name, text); documents whose name `select` rejects are passed over unread."""
        raise NotImplementedError


class SnapshotSource(Source):
    """An embedded corpus (`EMBEDDED_CORPORA`), fingerprinted by the sha256 its sidecar records."""

    def __init__(self, name: str = EMBEDDED) -> None:
        self.name = name
        info = snapshot_info(name)
        default = f"embedded Python {info.get('python_version')} standard library ({info['documents']} files)"
        super().__init__("snapshot", info.get("description") or default)

    @property
    def file_count(self) -> int:
        return snapshot_info(self.name)["documents"]

    def fingerprint(self) -> dict[str, Any]:
        info = snapshot_info(self.name)
        if self.name == EMBEDDED:  # the default's key, as cache entries made before a second corpus have it
            return {"sha256": info["sha256"], "python_version": info["python_version"]}
        return {"sha256": info["sha256"], "corpus": self.name}

    def text_bytes(self) -> int:
        return int(snapshot_info(self.name)["bytes"])

    def documents(self, select: Select | None = None) -> Iterator[tuple[str, str]]:
        self.skipped, self.bytes_read = [], 0
        for name, text in iter_snapshot(self.name):
            self.bytes_read += utf8_size(text)
            if select is None or select(name):
                yield name, text


def paragraphs(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, text) of each paragraph of `text`: the runs of lines between blank lines,
    or each line when there is no blank line. Blank lines are dropped: the separator token after
    each document takes their place."""
    lines = text.splitlines(keepends=True)
    if all(line.strip() for line in lines):
        yield from ((n, line) for n, line in enumerate(lines, start=1))
        return
    start, run = 0, []
    for n, line in enumerate(lines, start=1):
        if line.strip():
            start = start or n
            run.append(line)
        elif run:
            yield start, "".join(run)
            start, run = 0, []
    if run:
        yield start, "".join(run)


class FileSource(Source):
    """Files read as UTF-8 text; `.jsonl` files give one document per record (`text_field`). With
    `by_paragraph` (a single text file given as the source), a text file's paragraphs are its
    documents."""

    def __init__(self, files: list[Path], base: Path, text_field: str, description: str,
                 by_paragraph: bool = False) -> None:
        super().__init__("files", description)
        # a file's path names its documents (the split, the data census, skipped files): text only
        bad = next((p for p in files if not is_text(str(p))), None)
        if bad is not None:
            raise not_text("DataConfig.source's file", str(bad))
        self.files, self.base, self.text_field, self.by_paragraph = files, base, text_field, by_paragraph
        self.records = self.bad_records = self.missing_field = 0  # JSONL: read, unreadable, of them no field
        self.fields_seen: list[str] = []  # the fields of the first record without `text_field`
        self.digests_read = 0  # files the last `fingerprint` read (the others' sha256 were recorded)

    @property
    def file_count(self) -> int:
        return len(self.files)

    def _name(self, path: Path) -> str:
        return path.relative_to(self.base).as_posix()

    def fingerprint(self, record: DigestRecord | None = None) -> dict[str, Any]:
        """The sha256 of every file's bytes, with the files' count and the reading settings. A file
        whose size, times and inode match `record` (`digests.DigestRecord`, kept in the token cache)
        is not read; `digests_read` counts the files read."""
        record = record or DigestRecord(None)
        entries = [[self._name(p), record.sha256(p)] for p in self.files]
        self.digests_read = record.read
        digest = hashlib.sha256(json.dumps(entries).encode("utf-8")).hexdigest()
        return {"files": len(self.files), "content_sha256": digest, "text_field": self.text_field,
                **({"documents": "paragraphs"} if self.by_paragraph else {})}

    def text_bytes(self) -> int | None:
        """The files' sizes (JSONL's field names and quoting included: a little more than the text)."""
        try:
            return sum(p.stat().st_size for p in self.files)
        except OSError:
            return None

    def documents(self, select: Select | None = None) -> Iterator[tuple[str, str]]:
        self.skipped, self.records, self.bad_records, self.missing_field = [], 0, 0, 0
        self.bytes_read = 0
        for path in self.files:
            name = self._name(path)
            if path.suffix == ".jsonl":
                yield from self._records(path, name, select)
                continue
            if not self.by_paragraph and select is not None and not select(name):
                continue
            data = path.read_bytes()
            self.bytes_read += len(data)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                self.skipped.append(name)  # binary or another encoding: skip, report in stats
                continue
            if self.by_paragraph:
                pieces = ((f"{name}:{n}", piece) for n, piece in paragraphs(text))
                yield from ((doc, piece) for doc, piece in pieces if select is None or select(doc))
            elif text:
                yield name, text

    def _records(self, path: Path, name: str, select: Select | None) -> Iterator[tuple[str, str]]:
        with path.open("rb") as fh:
            for lineno, line in enumerate(fh, start=1):
                self.bytes_read += len(line)
                doc = f"{name}:{lineno}"
                if not line.strip() or (select is not None and not select(doc)):
                    continue
                self.records += 1
                try:
                    record = json.loads(line.decode("utf-8"))
                except (UnicodeDecodeError, ValueError):
                    self.bad_records += 1
                    continue
                text = record.get(self.text_field) if isinstance(record, dict) else None
                if not isinstance(text, str):
                    self.bad_records += 1
                    self.missing_field += 1
                    if not self.fields_seen and isinstance(record, dict):
                        self.fields_seen = sorted(record)
                elif text:
                    yield doc, text

    def census(self) -> str:
        """What the last pass found in JSONL records, in words ("" when the source has none)."""
        if not self.records:
            return ""
        found = (f"{self.records - self.bad_records:,} of {self.records:,} JSONL records read with a string "
                 f"field {self.text_field!r}")
        if self.missing_field:
            seen = f" (the first one's fields: {self.fields_seen})" if self.fields_seen else ""
            found += (f"; {self.missing_field:,} without it{seen}: set data.text_field to the field that "
                      "holds the text")
        if self.bad_records > self.missing_field:
            found += f"; {self.bad_records - self.missing_field:,} not JSON objects"
        return found


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
        self.skipped, self.bytes_read = [], 0
        for i, row in enumerate(self.dataset.select_columns([self.text_field])):
            name = str(i)
            text = row[self.text_field]
            self.bytes_read += utf8_size(text) if isinstance(text, str) else 0
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
    if spec in EMBEDDED_CORPORA:
        return SnapshotSource(spec)
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
    if path.is_file():  # its paragraphs are its documents, unless it is JSONL (a record each)
        return FileSource([path], path.parent, cfg.text_field, f"file {spec!r}",
                          by_paragraph=path.suffix != ".jsonl")
    close = difflib.get_close_matches(spec, EMBEDDED_CORPORA, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"DataConfig.source = {spec!r}: {what_is_there(path)}.{hint} Accepted: {ACCEPTED}.")


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
        room = left[split]
        if room is not None:
            text = text[:room]
            left[split] = room - len(text)
        yield split, name, text
        if all(v == 0 for v in left.values()):
            return


def split_census(source: Source, cfg: DataConfig, shown: int = 5) -> str:
    """Which documents went to which split, in words: the counts and the first few names of each
    (read again in full: for the messages of a split left empty)."""
    names: dict[str, list[str]] = {"train": [], "val": []}
    for name, _ in source.documents():
        names[split_of(name, cfg.val_fraction)].append(name)
    parts = []
    for split, label in (("train", "training"), ("val", "validation")):
        listed = ", ".join(names[split][:shown]) + (", ..." if len(names[split]) > shown else "")
        parts.append(f"{len(names[split]):,} to {label}" + (f" ({listed})" if listed else ""))
    found = f"of {sum(map(len, names.values())):,} readable documents, " + " and ".join(parts)
    census = getattr(source, "census", lambda: "")()
    return found + (f"; {census}" if census else "")


def split_budgets(cfg: DataConfig) -> dict[str, int | None]:
    if cfg.max_chars is None:
        return {"train": None, "val": None}
    val = math.ceil(cfg.max_chars * cfg.val_fraction)
    if cfg.max_chars - val <= 0:
        raise ConfigError(f"DataConfig.max_chars = {cfg.max_chars} leaves no characters for the training "
                          f"split after the validation share (val_fraction = {cfg.val_fraction}).")
    return {"train": cfg.max_chars - val, "val": val}


def skipped_lines(stats: dict[str, Any], listed_in: str, shown: int = 5) -> list[str]:
    """What the source's reading passed over, as lines for the user (none when nothing): the files that
    are not UTF-8 text, named (the first `shown`, then how many more; all are in `listed_in`), and
    the JSONL records without the text, counted. `blocklab prepare` and `train` say the same."""
    lines = []
    if stats["skipped_files"]:
        lines.append(f"{skipped_files(stats['skipped_files'], shown)}; all are listed in {listed_in}")
    if stats["bad_records"]:  # how many records were read, how many skipped and why
        lines.append(stats["records"] or f"skipped {stats['bad_records']} unreadable JSONL records")
    return lines


def skipped_files(names: list[str], shown: int = 5) -> str:
    """"skipped N files that are not UTF-8 text ...: a, b, ..." for the files a source passed over."""
    few = ", ".join(names[:shown]) + (f" and {len(names) - shown:,} more" if len(names) > shown else "")
    files = "1 file that is" if len(names) == 1 else f"{len(names):,} files that are"
    return f"skipped {files} not UTF-8 text (binary or another encoding): {few}"


def no_documents(source: Source, split: str, cfg: DataConfig) -> ConfigError:
    """The error for a split left empty: what the source holds and where each document went."""
    skipped = f"; {skipped_files(source.skipped)}" if source.skipped else ""
    found = f" ({split_census(source, cfg)}{skipped})"
    if split == "val":
        return ConfigError(
            f"no document of {source.description} fell into the validation split (val_fraction = "
            f"{cfg.val_fraction}, split by a hash of each document's name){found}. Add documents, raise "
            "val_fraction, or set val_fraction = 0 to train without validation.")
    one_file = " (or give that one file as the source: a file is split by paragraphs)" \
        if getattr(source, "file_count", 0) == 1 else ""
    return ConfigError(f"no training documents in {source.description}{found}. Add documents, or lower "
                       f"val_fraction{one_file}.")
