"""`prepare_data`: corpus -> tokenizer -> memory-mapped token shards, cached.

The cache (`DataConfig.cache_dir`, else ``$BLOCKLAB_CACHE``, else ``~/.cache/blocklab``) holds

* ``tokenizers/bpe-<key>.json``: a trained BPE, keyed by the corpus fingerprint and the BPE
  settings, so a second run with the same corpus does not train again;
* ``shards/<key>/``: ``train.bin`` and ``val.bin`` (flat token ids, uint16 when the vocabulary has
  fewer than 65,536 entries, else uint32; every document followed by the separator), the
  ``tokenizer.json`` they were made with and ``manifest.json`` (sources, document and file counts,
  skipped files, tokenizer hash, token / byte / character counts, settings). The key hashes the
  corpus fingerprint, the split settings and the tokenizer hash.

Everything is written into a temporary name and renamed into place, so a crashed or concurrent
run never leaves a half-written entry that a later run would trust.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers

from blocklab.data.config import DataConfig
from blocklab.data.sources import Source, open_source, split_budgets, split_census, split_documents
from blocklab.data.tokenizer import Tokenizer, byte_tokenizer, load_tokenizer, train_bpe
from blocklab.errors import ConfigError

FORMAT = 1  # bump when the shard or manifest layout changes
SPLITS = ("train", "val")
CHUNK_CHARS = 4_000_000  # characters per encode_batch call: parallel, yet bounded memory
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


def cache_root(cfg: DataConfig) -> Path:
    root = cfg.cache_dir or os.environ.get("BLOCKLAB_CACHE") or Path.home() / ".cache" / "blocklab"
    return Path(root).expanduser()


def _key(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:24]


def _no_documents(source: Source, split: str, cfg: DataConfig) -> ConfigError:
    """The error for a split left empty: what the source holds and where each document went."""
    skipped = f"; {len(source.skipped)} files were skipped as not UTF-8" if source.skipped else ""
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


def _say(message: str) -> None:
    """A progress message on stderr ("blocklab: ..."), written above any progress bar."""
    from tqdm import tqdm

    tqdm.write(f"blocklab: {message}", file=sys.stderr)


# -- tokenizer ---------------------------------------------------------------------------------------


def get_tokenizer(cfg: DataConfig, source: Source, corpus: dict[str, Any],
                  root: Path, progress: bool = False) -> tuple[Tokenizer, bool]:
    """The tokenizer `cfg` asks for, and whether a BPE was trained by this call; with `progress`, a
    line before and after training one (not when it comes from the cache)."""
    if cfg.tokenizer == "byte":
        return byte_tokenizer(cfg.eos_token, cfg.mask_token), False
    if cfg.tokenizer != "bpe":
        # The default names mean "whatever the file calls its separator / mask token".
        eos = None if cfg.eos_token == DEFAULTS.eos_token else cfg.eos_token
        mask = None if cfg.mask_token == DEFAULTS.mask_token else cfg.mask_token
        return load_tokenizer(cfg.tokenizer, eos, mask), False
    settings = {"format": FORMAT, "corpus": corpus, "vocab_size": cfg.vocab_size,
                "min_frequency": cfg.bpe_min_frequency, "train_chars": cfg.bpe_train_chars,
                "special": cfg.special_tokens, "tokenizers": tokenizers.__version__}
    path = root / "tokenizers" / f"bpe-{_key(settings)}.json"
    if path.exists():
        return load_tokenizer(path, cfg.eos_token, cfg.mask_token), False
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
        raise _no_documents(source, "train", cfg)
    if progress:
        _say(f"tokenizer trained in {time.perf_counter() - start:.1f} s on {n_chars / 1e6:.1f} M characters "
             f"({n_docs:,} documents); cached for the next run")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(tok.to_str(), encoding="utf-8")
    try:
        os.link(tmp, path)  # atomic, and fails if a concurrent run (another DDP rank) got there first
    except FileExistsError:
        tok = load_tokenizer(path, cfg.eos_token, cfg.mask_token)  # every process uses the same file
    except OSError:
        tmp.replace(path)  # a file system without hard links
    finally:
        tmp.unlink(missing_ok=True)
    return tok, True


# -- shards ------------------------------------------------------------------------------------------


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size < 2**16 else np.uint32)


def build_shards(cfg: DataConfig, source: Source, tokenizer: Tokenizer, corpus: dict[str, Any],
                 out_dir: Path) -> None:
    """Tokenise every document into `out_dir/{train,val}.bin` and write the manifest, atomically."""
    dtype = token_dtype(tokenizer.vocab_size)
    tmp = out_dir.parent / f".tmp-{out_dir.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    counts = {s: {"documents": 0, "tokens": 0, "bytes": 0, "chars": 0} for s in SPLITS}
    try:
        outs = {s: open(tmp / f"{s}.bin", "wb") for s in SPLITS}  # closed in the finally below
        try:
            chunk: list[tuple[str, str]] = []

            def flush() -> None:
                ids = tokenizer.encode_batch([text for _, text in chunk])
                rows: dict[str, list[list[int]]] = {s: [] for s in SPLITS}
                for (split, text), row in zip(chunk, ids, strict=True):
                    rows[split] += [row, [tokenizer.eos_id]]  # each document, then the separator
                    c = counts[split]
                    c["documents"] += 1
                    c["tokens"] += len(row) + 1
                    c["bytes"] += len(text.encode("utf-8"))
                    c["chars"] += len(text)
                for split, parts in rows.items():
                    if parts:
                        np.fromiter(itertools.chain.from_iterable(parts), dtype=dtype).tofile(outs[split])
                chunk.clear()

            n_chars = 0
            for split, _, text in split_documents(source, cfg):
                chunk.append((split, text))
                n_chars += len(text)
                if n_chars >= CHUNK_CHARS:
                    flush()
                    n_chars = 0
            flush()
        finally:
            for fh in outs.values():
                fh.close()
        if counts["train"]["documents"] == 0:
            raise _no_documents(source, "train", cfg)
        if cfg.val_fraction > 0 and counts["val"]["documents"] == 0:
            raise _no_documents(source, "val", cfg)
        for c in counts.values():
            c["bytes_per_token"] = c["bytes"] / c["tokens"] if c["tokens"] else None  # None: empty split
        tokenizer.save(tmp)
        manifest = {
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
            "dtype": dtype.name,
            "splits": {s: {"file": f"{s}.bin", **counts[s]} for s in SPLITS},
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
        try:
            tmp.rename(out_dir)
        except OSError:
            if not (out_dir / "manifest.json").exists():
                raise
            shutil.rmtree(tmp)  # a concurrent run finished the same entry first; use theirs
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _load_split(path: Path, dtype: np.dtype) -> np.ndarray:
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)  # np.memmap cannot map an empty file
    return np.memmap(path, dtype=dtype, mode="r")


def prepare_data(cfg: DataConfig, progress: bool = False) -> PreparedData:
    """Read, split, tokenise and cache the corpus `cfg` describes; a second call reuses the cache.
    With `progress`, training a tokenizer and tokenising (the slow parts, done once) say so on stderr,
    before and after."""
    start = time.perf_counter()
    root = cache_root(cfg)
    source = open_source(cfg)
    corpus = {"source": cfg.source, "kind": source.kind, "fingerprint": source.fingerprint(),
              "val_fraction": cfg.val_fraction, "max_chars": cfg.max_chars}
    tokenizer, trained = get_tokenizer(cfg, source, corpus, root, progress)
    out_dir = root / "shards" / _key({"format": FORMAT, "corpus": corpus, "tokenizer": tokenizer.hash})
    tokenised = not (out_dir / "manifest.json").exists()
    if tokenised:
        began = time.perf_counter()
        if progress:
            _say(f"tokenizing {source.description} with the {tokenizer.vocab_size:,}-token tokenizer ...")
        (root / "shards").mkdir(parents=True, exist_ok=True)
        build_shards(cfg, source, tokenizer, corpus, out_dir)
    manifest = json.loads((out_dir / "manifest.json").read_text())
    if tokenised and progress:
        counts = manifest["splits"]
        _say(f"tokenized in {time.perf_counter() - began:.1f} s: {counts['train']['tokens']:,} training and "
             f"{counts['val']['tokens']:,} validation tokens, cached in {out_dir.parent}")
    dtype = np.dtype(manifest["dtype"])
    splits = manifest["splits"]
    arrays = {s: _load_split(out_dir / splits[s]["file"], dtype) for s in SPLITS}
    for s in SPLITS:
        if arrays[s].size != splits[s]["tokens"]:
            raise RuntimeError(f"cache entry {out_dir} is damaged ({s}: {arrays[s].size} tokens on disk, "
                               f"{splits[s]['tokens']} in the manifest); delete it and run again.")
    stats = {
        "tokenizer_trained": trained,
        "tokenised": tokenised,
        "seconds": time.perf_counter() - start,
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
