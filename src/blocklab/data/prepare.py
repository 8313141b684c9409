"""`prepare_data`: corpus -> tokenizer -> memory-mapped token shards, cached.

The cache (`DataConfig.cache_dir`, else ``$BLOCKLAB_CACHE``, else ``~/.cache/blocklab``) holds

* ``tokenizers/bpe-<key>/``: a trained BPE (``tokenizer.json``) and its ``manifest.json`` (the
  file's size and sha256, the settings), keyed by the corpus fingerprint and the BPE settings, so a
  second run with the same corpus does not train again;
* ``shards/<key>/``: ``train.bin`` and ``val.bin`` (flat token ids, uint16 when the vocabulary has
  fewer than 65,536 entries, else uint32; every document followed by the separator), the
  ``tokenizer.json`` they were made with and ``manifest.json`` (sources, document and file counts,
  skipped files, tokenizer hash, token / byte / character counts, settings, and each shard's size
  and sha256, taken while writing it). The key hashes the corpus fingerprint, the split settings
  and the tokenizer hash.

Everything is written into a temporary name and renamed into place, so a crashed or concurrent
run never leaves a half-written entry that a later run would trust; the leftovers of a killed run
on this host (``.tmp-*``, ``.bad-*``) are removed when an entry is next built.

An entry is checked before it is used (`cache_entry`: sizes, sha256 and id range, once per
process); a damaged one (a file changed or cut short after it was written, a manifest deleted or
edited) is named in one line on stderr, moved aside and rebuilt, and a damaged cached BPE (its
tokenizer.json edited, even into another valid tokenizer) is trained again.

A write that the disk refuses (full, or over quota) leaves nothing behind and raises a DiskFullError
naming the entry, the space free and needed, and the cache's folder with what chose it
(data.cache_dir, BLOCKLAB_CACHE or the default; `cache_folder`).

This module builds the entries: the tokenizer (a cached BPE read, or trained and stored), the shards
(tokenised, counted and hashed as they are written) and `prepare_data` over them; an entry's layout,
its checks and its repair are `cache_entry`'s, the cache's folder and its writes `cache_folder`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers

from blocklab.data.cache_entry import (
    FORMAT,
    SPLITS,
    DamagedEntry,
    aside,
    cached_bpe,
    check_entry,
    discard,
    locked,
    put_in_place,
    remove_leftovers,
    repair_lock,
    store_bpe,
    token_dtype,
)
from blocklab.data.cache_folder import cache_root, cache_write, entry_key
from blocklab.data.config import DataConfig
from blocklab.data.digests import DigestRecord
from blocklab.data.sources import (
    FileSource,
    Source,
    no_documents,
    open_source,
    split_budgets,
    split_documents,
    utf8_size,
)
from blocklab.data.tokenise import write_documents
from blocklab.data.tokenizer import Tokenizer, byte_tokenizer, load_tokenizer, train_bpe
from blocklab.util.errors import ConfigError

# The BPE cache key's own version: kept apart from FORMAT so that a shard layout change does not train
# tokenizers again (a retrained BPE need not equal the one saved runs were trained with).
TOKENIZER_FORMAT = 1
MANIFEST_BYTES = 2048  # about a shard manifest.json (1.7 KB measured; more for a long list of skipped files)
DEFAULTS = DataConfig()


@dataclass
class PreparedData:
    """Token arrays of both splits, the tokenizer that made them and what is known about them."""

    config: DataConfig
    tokenizer: Tokenizer
    train: np.ndarray  # 1-D memmap of token ids
    val: np.ndarray
    bytes_per_token: dict[str, float]  # UTF-8 bytes of the split's text / its tokens (separators included)
    manifest: dict[str, Any]
    stats: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None  # the shard directory

    def split(self, name: str) -> np.ndarray:
        if name not in SPLITS:
            raise ConfigError(f"split {name!r} is not allowed: choose 'train' or 'val'.")
        return self.train if name == "train" else self.val


def _say(message: str) -> None:
    """A message on stderr ("blocklab: ..."), written above any progress bar."""
    from tqdm import tqdm

    tqdm.write(f"blocklab: {message}", file=sys.stderr)


# -- tokenizer ---------------------------------------------------------------------------------------


def get_tokenizer(cfg: DataConfig, source: Source, corpus: dict[str, Any],
                  root: Path, progress: bool = False) -> tuple[Tokenizer, bool]:
    """The tokenizer `cfg` asks for, and whether a BPE was trained by this call; with `progress`, a
    line before and after training one (not when it comes from the cache). A cached BPE that does not
    match its manifest or cannot be loaded is named on stderr and trained again."""
    if cfg.tokenizer == "byte":
        return byte_tokenizer(cfg.eos_token, cfg.mask_token), False
    if cfg.tokenizer != "bpe":
        # The default names mean "whatever the file calls its separator / mask token".
        eos = None if cfg.eos_token == DEFAULTS.eos_token else cfg.eos_token
        mask = None if cfg.mask_token == DEFAULTS.mask_token else cfg.mask_token
        return load_tokenizer(cfg.tokenizer, eos, mask), False
    settings = {"format": TOKENIZER_FORMAT, "corpus": corpus, "vocab_size": cfg.vocab_size,
                "min_frequency": cfg.bpe_min_frequency, "train_chars": cfg.bpe_train_chars,
                "special": cfg.special_tokens, "tokenizers": tokenizers.__version__}
    entry = root / "tokenizers" / f"bpe-{entry_key(settings)}"
    if not entry.exists():
        return _train_cached_bpe(cfg, source, settings, entry, progress), True
    try:
        return cached_bpe(cfg, entry), False
    except DamagedEntry:
        pass
    with locked(cfg, entry):
        try:  # another process may have trained it again while this one waited
            return cached_bpe(cfg, entry), False
        except DamagedEntry as damage:
            _say(f"cached tokenizer {entry}: {damage}; training it again")
        discard(entry)
        return _train_cached_bpe(cfg, source, settings, entry, progress), True


def _train_cached_bpe(cfg: DataConfig, source: Source, settings: dict[str, Any], entry: Path,
                      progress: bool) -> Tokenizer:
    """Train the BPE `cfg` asks for on the training split and store it in `entry` (unless a concurrent
    run stored one first: then that one, so that every process uses the same file)."""
    budget = split_budgets(cfg)["train"]
    if cfg.bpe_train_chars is not None:
        budget = min(budget or cfg.bpe_train_chars, cfg.bpe_train_chars)
    n_docs = n_chars = 0

    def texts() -> Iterator[str]:
        nonlocal n_docs, n_chars
        for _, _, text in split_documents(source, cfg, ("train",), max_chars={"train": budget}):
            n_docs += 1
            n_chars += len(text)
            yield text

    start = time.perf_counter()
    if progress:
        at_most = f" (at most {budget:,} characters)" if budget is not None else ""
        _say(f"training a {cfg.vocab_size:,}-token BPE tokenizer on the training split of "
             f"{source.description}{at_most} ...")
    tok = train_bpe(texts(), cfg.vocab_size, cfg.bpe_min_frequency, cfg.eos_token, cfg.mask_token)
    if n_docs == 0:
        raise no_documents(source, "train", cfg)
    if progress:
        _say(f"tokenizer trained in {time.perf_counter() - start:.1f} s on {n_chars / 1e6:.1f} M characters "
             f"({n_docs:,} documents); cached for the next run")
    if store_bpe(cfg, tok, settings, entry):
        return tok
    try:  # a concurrent run stored it first: every process uses the same file
        return cached_bpe(cfg, entry)
    except DamagedEntry as damage:
        raise RuntimeError(f"cached tokenizer {entry} is damaged right after it was stored ({damage}); "
                           "check the disk and the file system holding the cache.") from None


# -- shards ------------------------------------------------------------------------------------------


class _ShardFiles:
    """The shard files of an entry being written: each split's ids appended, counted and hashed as they
    are written (never read back), and closed together however the writing ends."""

    def __init__(self, folder: Path, dtype: np.dtype) -> None:
        self.dtype = dtype
        fields = ("documents", "tokens", "bytes", "chars")
        self.counts: dict[str, dict[str, Any]] = {s: dict.fromkeys(fields, 0) for s in SPLITS}
        self.sums = {s: hashlib.sha256() for s in SPLITS}
        self.sizes = dict.fromkeys(SPLITS, 0)
        self.finished = False  # every document written
        stack = contextlib.ExitStack()
        with stack:  # a failed open closes those already open
            self.files = {s: stack.enter_context(open(folder / f"{s}.bin", "wb")) for s in SPLITS}
            self._open = stack.pop_all()

    def add(self, chunk: list[tuple[str, str]], tokenizer: Tokenizer) -> None:
        """Tokenise the (split, text) documents of `chunk` and append each, then the separator (on the
        worker thread of `tokenise.write_documents`: one chunk at a time, in order)."""
        ids = tokenizer.encode_batch([text for _, text in chunk])
        rows: dict[str, list[list[int]]] = {s: [] for s in SPLITS}
        eos = [tokenizer.eos_id]
        for (split, text), row in zip(chunk, ids, strict=True):
            rows[split] += [row, eos]
            c = self.counts[split]
            c["documents"] += 1
            c["tokens"] += len(row) + 1
            c["bytes"] += utf8_size(text)
            c["chars"] += len(text)
        for split, parts in rows.items():
            if parts:
                block = np.fromiter(itertools.chain.from_iterable(parts), dtype=self.dtype)
                # file.write, not ndarray.tofile: a full disk then raises OSError(ENOSPC), where numpy
                # says only "361537 requested and 30720 written"
                self.files[split].write(block.data)
                self.sums[split].update(block.data)
                self.sizes[split] += block.nbytes

    def close(self) -> None:
        self._open.close()  # every file, even when closing one fails (its buffer's last write)

    def needed(self, source: Source, cfg: DataConfig, extra: int) -> int | None:
        """About the bytes the whole entry takes: the shards as written once finished, else the ids so
        far scaled by the source's size over the characters read so far; plus `extra` (tokenizer.json
        and manifest). None when the source's size is not known."""
        if self.finished:
            return sum(self.sizes.values()) + extra
        chars = sum(c["chars"] for c in self.counts.values())
        tokens = sum(c["tokens"] for c in self.counts.values())
        total = source.text_bytes()
        if total is None or chars == 0:
            return None
        if cfg.max_chars is not None:
            total = min(total, cfg.max_chars)
        return int(tokens * max(1.0, total / chars)) * self.dtype.itemsize + extra


def _write_shards(shards: _ShardFiles, source: Source, cfg: DataConfig, tokenizer: Tokenizer,
                  progress: bool) -> None:
    """Every document of `source`, tokenised in chunks (`tokenise.write_documents`)."""
    write_documents(shards, source, cfg, tokenizer, progress)
    shards.close()  # the last buffered bytes reach the disk here
    shards.finished = True


def _manifest(cfg: DataConfig, source: Source, tokenizer: Tokenizer, corpus: dict[str, Any],
              shards: _ShardFiles) -> dict[str, Any]:
    """The manifest of a shard entry (see the module docstring)."""
    counts = shards.counts
    for c in counts.values():
        c["bytes_per_token"] = c["bytes"] / c["tokens"] if c["tokens"] else None  # None: empty split
    return {
        "format": FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "source": {"spec": cfg.source, "kind": source.kind, "description": source.description,
                   "fingerprint": corpus["fingerprint"], "files": source.file_count,
                   "skipped_files": list(source.skipped), "skipped_count": len(source.skipped),
                   "bad_records": getattr(source, "bad_records", 0),
                   "records": getattr(source, "census", lambda: "")()},
        "settings": {name: getattr(cfg, name) for name in
                     ("source", "text_field", "hf_kwargs", "max_chars", "val_fraction", "tokenizer",
                      "vocab_size", "bpe_min_frequency", "bpe_train_chars", "eos_token", "mask_token")},
        "tokenizer": {"hash": tokenizer.hash, "vocab_size": tokenizer.vocab_size,
                      "eos_id": tokenizer.eos_id, "mask_id": tokenizer.mask_id, "file": "tokenizer.json"},
        "dtype": shards.dtype.name,
        "splits": {s: {"file": f"{s}.bin", **counts[s]} for s in SPLITS},
        # Apart from "splits", whose entries compare.data_differences reads whole.
        "checksums": {f"{s}.bin": {"size": shards.sizes[s], "sha256": shards.sums[s].hexdigest()}
                      for s in SPLITS},
    }


def build_shards(cfg: DataConfig, source: Source, tokenizer: Tokenizer, corpus: dict[str, Any],
                 out_dir: Path, progress: bool = False) -> None:
    """Tokenise every document into `out_dir/{train,val}.bin` and write the manifest, atomically. A
    write the disk refuses leaves nothing behind and raises a DiskFullError (`_cache_write`). With
    `progress`, a bar of the bytes read."""
    tmp = aside(out_dir, "tmp")
    shards: _ShardFiles | None = None

    def needed() -> int | None:
        extra = len(tokenizer.to_str().encode("utf-8")) + MANIFEST_BYTES
        return shards.needed(source, cfg, extra) if shards is not None else None

    with cache_write(cfg, "the token cache entry", out_dir, needed):
        try:
            tmp.mkdir(parents=True)
            shards = _ShardFiles(tmp, token_dtype(tokenizer.vocab_size))
            try:
                _write_shards(shards, source, cfg, tokenizer, progress)
            finally:
                shards.close()
            if shards.counts["train"]["documents"] == 0:
                raise no_documents(source, "train", cfg)
            if cfg.val_fraction > 0 and shards.counts["val"]["documents"] == 0:
                raise no_documents(source, "val", cfg)
            tokenizer.save(tmp)
            manifest = _manifest(cfg, source, tokenizer, corpus, shards)
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
            put_in_place(tmp, out_dir)  # or a concurrent run finished the same entry first: theirs is used
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _load_split(path: Path, dtype: np.dtype) -> np.ndarray:
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)  # np.memmap cannot map an empty file
    return np.memmap(path, dtype=dtype, mode="r")


def _checked_entry(cfg: DataConfig, source: Source, tokenizer: Tokenizer, corpus: dict[str, Any],
                   out_dir: Path, progress: bool) -> tuple[dict[str, Any], bool]:
    """The checked manifest of cache entry `out_dir`, built first when it is missing or damaged (said
    on stderr, whatever `progress`), and whether this call tokenised."""
    if out_dir.exists():
        try:
            return check_entry(out_dir, tokenizer), False
        except DamagedEntry:
            pass
        with repair_lock(out_dir):
            try:  # another process may have rebuilt it while this one waited
                return check_entry(out_dir, tokenizer), False
            except DamagedEntry as damage:
                _say(f"cache entry {out_dir}: {damage}; rebuilding it")
            discard(out_dir)
            return _build(cfg, source, tokenizer, corpus, out_dir, progress), True
    return _build(cfg, source, tokenizer, corpus, out_dir, progress), True


def _build(cfg: DataConfig, source: Source, tokenizer: Tokenizer, corpus: dict[str, Any],
           out_dir: Path, progress: bool) -> dict[str, Any]:
    began = time.perf_counter()
    if progress:
        _say(f"tokenizing {source.description} with the {tokenizer.vocab_size:,}-token tokenizer ...")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(out_dir)
    build_shards(cfg, source, tokenizer, corpus, out_dir, progress)
    try:  # the entry just written, or a concurrent run's written first: checked like any other
        manifest = check_entry(out_dir, tokenizer)
    except DamagedEntry as damage:
        raise RuntimeError(f"cache entry {out_dir} is damaged right after it was built ({damage}); "
                           "check the disk and the file system holding the cache.") from None
    if progress:
        counts = manifest["splits"]
        _say(f"tokenized in {time.perf_counter() - began:.1f} s: {counts['train']['tokens']:,} training and "
             f"{counts['val']['tokens']:,} validation tokens, cached in {out_dir.parent}")
    return manifest


def prepare_data(cfg: DataConfig, progress: bool = False) -> PreparedData:
    """Read, split, tokenise and cache the corpus `cfg` describes; a second call reuses the cache once
    it is checked (a damaged entry is rebuilt). With `progress`, training a tokenizer and tokenising
    (the slow parts, done once) say so on stderr, before and after."""
    start = time.perf_counter()
    root = cache_root(cfg)
    source = open_source(cfg)  # a file source reads only the files changed since it recorded their sha256
    record = DigestRecord.for_source(root, cfg.source)
    fingerprint = source.fingerprint(record) if isinstance(source, FileSource) else source.fingerprint()
    corpus = {"source": cfg.source, "kind": source.kind, "fingerprint": fingerprint,
              "val_fraction": cfg.val_fraction, "max_chars": cfg.max_chars}
    tokenizer, trained = get_tokenizer(cfg, source, corpus, root, progress)
    tokenizer_done = time.perf_counter()
    out_dir = root / "shards" / entry_key({"format": FORMAT, "corpus": corpus, "tokenizer": tokenizer.hash})
    manifest, tokenised = _checked_entry(cfg, source, tokenizer, corpus, out_dir, progress)
    record.save()  # once the entry is in place: a write refused above leaves no record either
    end = time.perf_counter()
    dtype = np.dtype(manifest["dtype"])
    splits = manifest["splits"]
    arrays = {s: _load_split(out_dir / f"{s}.bin", dtype) for s in SPLITS}
    stats = {
        "tokenizer_trained": trained,
        "tokenised": tokenised,
        "seconds": end - start,
        "tokenizer_seconds": tokenizer_done - start,  # the source opened and keyed, a BPE trained or loaded
        "shards_seconds": end - tokenizer_done,  # tokenising (when `tokenised`) and checking the entry
        "documents": {s: splits[s]["documents"] for s in SPLITS},
        "tokens": {s: splits[s]["tokens"] for s in SPLITS},
        "bytes": {s: splits[s]["bytes"] for s in SPLITS},
        "skipped_files": manifest["source"]["skipped_files"],
        "skipped_count": manifest["source"]["skipped_count"],
        "bad_records": manifest["source"]["bad_records"],
        "records": manifest["source"].get("records", ""),
    }
    return PreparedData(
        config=cfg, tokenizer=tokenizer, train=arrays["train"], val=arrays["val"],
        bytes_per_token={s: splits[s]["bytes_per_token"] or float("nan") for s in SPLITS},
        manifest=manifest, stats=stats, path=out_dir)
