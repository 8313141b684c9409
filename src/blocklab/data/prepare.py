"""`prepare_data`: corpus -> tokenizer -> memory-mapped token shards, cached.

The cache (`DataConfig.cache_dir`, else ``$BLOCKLAB_CACHE``, else ``~/.cache/blocklab``) holds

* ``tokenizers/bpe-<key>.json``: a trained BPE, keyed by the corpus fingerprint and the BPE
  settings, so a second run with the same corpus does not train again;
* ``shards/<key>/``: ``train.bin`` and ``val.bin`` (flat token ids, uint16 when the vocabulary has
  fewer than 65,536 entries, else uint32; every document followed by the separator), the
  ``tokenizer.json`` they were made with and ``manifest.json`` (sources, document and file counts,
  skipped files, tokenizer hash, token / byte / character counts, settings, and each shard's size
  and sha256, taken while writing it). The key hashes the corpus fingerprint, the split settings
  and the tokenizer hash.

Everything is written into a temporary name and renamed into place, so a crashed or concurrent
run never leaves a half-written entry that a later run would trust; the leftovers of a killed run
on this host (``.tmp-*``, ``.bad-*``) are removed when an entry is next built.

An entry is checked before it is used, once per process: the manifest must parse, hold the fields
read here and name the tokenizer in use; each shard must have the size and sha256 its manifest
recorded and hold only ids below the tokenizer's vocabulary size. A damaged entry (a file changed
or cut short after it was written, a manifest deleted or edited) is named in one line on stderr,
moved aside and rebuilt; a damaged cached BPE file is trained again. Each shard is read once per
process for the check (sha256 and the largest id in one pass), keyed by its path, inode,
modification time and size; a later call finds the result by a stat. Measured
(benchmarks/token_cache_check.py, a shared 2-core EPYC, uint16 ids): about 20 ms per 10M tokens
once per process (74 ms for 50M), 0.2-0.3 ms for every later call, as much as opening the memmaps;
hashing while writing adds about 11 ms per 10M tokens to tokenising.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import socket
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

FORMAT = 2  # bump when the shard or manifest layout changes (2: each shard's size and sha256)
# The BPE cache key's own version: kept apart from FORMAT so that a shard layout change does not train
# tokenizers again (a retrained BPE need not equal the one saved runs were trained with).
TOKENIZER_FORMAT = 1
SPLITS = ("train", "val")
CHUNK_CHARS = 4_000_000  # characters per encode_batch call: parallel, yet bounded memory
READ_BYTES = 1 << 24  # bytes per read when checking a shard: a multiple of every id width
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
    """A message on stderr ("blocklab: ..."), written above any progress bar."""
    from tqdm import tqdm

    tqdm.write(f"blocklab: {message}", file=sys.stderr)


# -- tokenizer ---------------------------------------------------------------------------------------


def get_tokenizer(cfg: DataConfig, source: Source, corpus: dict[str, Any],
                  root: Path, progress: bool = False) -> tuple[Tokenizer, bool]:
    """The tokenizer `cfg` asks for, and whether a BPE was trained by this call; with `progress`, a
    line before and after training one (not when it comes from the cache). A cached BPE file that
    cannot be loaded is named on stderr and trained again."""
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
    path = root / "tokenizers" / f"bpe-{_key(settings)}.json"
    if not path.exists():
        return _train_cached_bpe(cfg, source, path, progress), True
    try:
        return load_tokenizer(path, cfg.eos_token, cfg.mask_token), False
    except ConfigError:
        pass
    with _repair_lock(path):
        try:  # another process may have trained it again while this one waited
            return load_tokenizer(path, cfg.eos_token, cfg.mask_token), False
        except ConfigError as err:
            _say(f"cached tokenizer {path} cannot be read ({_first_line(err.__cause__ or err)}); "
                 "training it again")
        path.unlink(missing_ok=True)
        return _train_cached_bpe(cfg, source, path, progress), True


def _train_cached_bpe(cfg: DataConfig, source: Source, path: Path, progress: bool) -> Tokenizer:
    """Train the BPE `cfg` asks for on the training split and store it at `path` (unless a concurrent
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
        try:
            tok = load_tokenizer(path, cfg.eos_token, cfg.mask_token)  # every process uses the same file
        except ConfigError:
            tmp.replace(path)  # theirs was damaged since it was stored: ours replaces it
    except OSError:
        tmp.replace(path)  # a file system without hard links
    finally:
        tmp.unlink(missing_ok=True)
    return tok


# -- shards ------------------------------------------------------------------------------------------


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size < 2**16 else np.uint32)


def build_shards(cfg: DataConfig, source: Source, tokenizer: Tokenizer, corpus: dict[str, Any],
                 out_dir: Path) -> None:
    """Tokenise every document into `out_dir/{train,val}.bin` and write the manifest, atomically."""
    dtype = token_dtype(tokenizer.vocab_size)
    tmp = _aside(out_dir, "tmp")
    tmp.mkdir(parents=True)
    counts: dict[str, dict[str, Any]] = {s: dict.fromkeys(("documents", "tokens", "bytes", "chars"), 0)
                                         for s in SPLITS}
    sums = {s: hashlib.sha256() for s in SPLITS}  # of the bytes as they are written, never read back
    sizes = dict.fromkeys(SPLITS, 0)
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
                        block = np.fromiter(itertools.chain.from_iterable(parts), dtype=dtype)
                        block.tofile(outs[split])
                        sums[split].update(block.data)
                        sizes[split] += block.nbytes
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
            # Apart from "splits", whose entries compare.data_differences reads whole.
            "checksums": {f"{s}.bin": {"size": sizes[s], "sha256": sums[s].hexdigest()} for s in SPLITS},
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


class DamagedEntry(Exception):
    """What is wrong with a cache entry, in words ("train.bin is missing")."""


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _manifest_error(m: Any, tokenizer: Tokenizer) -> str | None:
    """What makes `m` no manifest of an entry made with `tokenizer` ("manifest.json ..."), or None.
    Every field prepare_data reads is checked, so that a bad one is named here, not in a traceback."""
    if not isinstance(m, dict):
        return f"manifest.json is not a JSON object but {type(m).__name__}"
    if m.get("format") != FORMAT:
        return f"manifest.json has format {m.get('format')!r} where this blocklab writes {FORMAT}"
    want = token_dtype(tokenizer.vocab_size).name
    if m.get("dtype") != want:  # uint16 or uint32, as token_dtype chose when writing
        return f"manifest.json has dtype {m.get('dtype')!r} where the tokenizer's ids need {want!r}"
    if not isinstance(m.get("tokenizer"), dict) or m["tokenizer"].get("hash") != tokenizer.hash:
        return "manifest.json names another tokenizer than the one in use"
    source = m.get("source")
    if not (isinstance(source, dict) and isinstance(source.get("skipped_files"), list)
            and _count(source.get("skipped_count")) and _count(source.get("bad_records"))):
        return "manifest.json lacks the source's skipped files and bad record counts"
    splits, sums = m.get("splits"), m.get("checksums")
    if not isinstance(splits, dict) or not isinstance(sums, dict):
        return f"manifest.json lacks {'splits' if not isinstance(splits, dict) else 'checksums'}"
    itemsize = np.dtype(want).itemsize
    for s in SPLITS:
        split, name = splits.get(s), f"{s}.bin"
        if not isinstance(split, dict):
            return f"manifest.json lacks the {s} split"
        if split.get("file") != name:  # a shard is always named after its split, never another file
            return f"manifest.json names {split.get('file')!r} as the {s} split's file, not {name!r}"
        for key in ("documents", "tokens", "bytes", "chars"):
            if not _count(split.get(key)):
                return f"manifest.json gives the {s} split {split.get(key)!r} {key}, not a count"
        ratio = split.get("bytes_per_token")
        if ratio is not None and (not isinstance(ratio, int | float) or isinstance(ratio, bool)):
            return f"manifest.json gives the {s} split bytes_per_token {ratio!r}, not a number"
        check = sums.get(name)
        if not (isinstance(check, dict) and _count(check.get("size"))
                and isinstance(check.get("sha256"), str)):
            return f"manifest.json lacks the size and sha256 of {name}"
        if check["size"] != split["tokens"] * itemsize:
            return (f"manifest.json gives {name} {check['size']:,} bytes, which do not hold its "
                    f"{split['tokens']:,} {want} tokens")
    return None


def _shard_digest(path: Path, dtype: np.dtype) -> tuple[str, int]:
    """sha256 and the largest id (-1 when empty) of shard `path`, in one pass of bounded reads."""
    digest, top = hashlib.sha256(), -1
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(max(1, min(READ_BYTES, os.fstat(fh.fileno()).st_size)))  # no 16 MB for a small file
        view = memoryview(buf)
        while n := fh.readinto(buf):
            digest.update(view[:n])
            if n >= dtype.itemsize:
                top = max(top, int(np.frombuffer(buf, dtype=dtype, count=n // dtype.itemsize).max()))
    return digest.hexdigest(), top


# (path, inode, mtime_ns, size, dtype) -> (sha256, largest id): each shard is read once per process.
_DIGESTS: dict[tuple[str, int, int, int, str], tuple[str, int]] = {}


def _digest(path: Path, stat: os.stat_result, dtype: np.dtype) -> tuple[str, int]:
    # stat is taken before reading, so a file changed meanwhile gets a new key and is read again.
    key = (str(path), stat.st_ino, stat.st_mtime_ns, stat.st_size, dtype.name)
    if key not in _DIGESTS:
        _DIGESTS[key] = _shard_digest(path, dtype)
    return _DIGESTS[key]


def check_entry(out_dir: Path, tokenizer: Tokenizer) -> dict[str, Any]:
    """The manifest of cache entry `out_dir` once the entry is found whole for `tokenizer` (see the
    module docstring); raises DamagedEntry naming the file and what is wrong with it."""
    try:
        text = (out_dir / "manifest.json").read_text()
    except FileNotFoundError:
        raise DamagedEntry("no manifest.json (it was deleted, or the entry was left incomplete)") from None
    except (OSError, UnicodeDecodeError) as err:
        raise DamagedEntry(f"manifest.json cannot be read ({err})") from None
    try:
        manifest = json.loads(text)
    except ValueError as err:
        raise DamagedEntry(f"manifest.json is not valid JSON ({err})") from None
    problem = _manifest_error(manifest, tokenizer)
    if problem:
        raise DamagedEntry(problem)
    dtype = np.dtype(manifest["dtype"])
    for s in SPLITS:
        name = f"{s}.bin"
        want = manifest["checksums"][name]
        try:
            stat = (out_dir / name).stat()
        except FileNotFoundError:
            raise DamagedEntry(f"{name} is missing") from None
        if stat.st_size != want["size"]:
            raise DamagedEntry(f"{name} holds {stat.st_size:,} bytes where its manifest says "
                               f"{want['size']:,} (the file was cut short or changed after it was written)")
        sha256, top = _digest(out_dir / name, stat, dtype)
        if sha256 != want["sha256"]:
            raise DamagedEntry(f"{name} sha256 differs from its manifest (the file was changed after it "
                               "was written)")
        if top >= tokenizer.vocab_size:
            raise DamagedEntry(f"{name} holds token id {top}, beyond the tokenizer's "
                               f"{tokenizer.vocab_size} ids")
    return manifest


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def _where() -> str:
    """This host and pid namespace: where a pid means this process (containers on one host may share
    a host name and a cache but not their pids)."""
    try:
        space = os.readlink("/proc/self/ns/pid").strip("pid:[]")
    except OSError:
        space = ""
    return f"{socket.gethostname()}~{space}" if space.isdigit() else socket.gethostname()


def _aside(out_dir: Path, kind: str) -> Path:
    """A hidden name beside `out_dir` for a temporary ("tmp") or discarded ("bad") copy of it, naming
    the process that made it and where, so that a later run can tell a dead process's leftovers."""
    return out_dir.parent / f".{kind}-{out_dir.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}@{_where()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (PermissionError), or a pid we cannot ask about
        return True
    return True


def _remove_leftovers(out_dir: Path) -> None:
    """Remove the temporary and discarded copies of `out_dir` left by processes of this host that have
    since died (killed while tokenising or deleting). Another host's are left alone: its pids mean
    nothing here."""
    here = _where()
    for path in out_dir.parent.glob(f".*-{out_dir.name}-*@*"):
        head, _, where = path.name.partition("@")
        parts = head.split("-")
        if (where == here and len(parts) == 4 and parts[0] in (".tmp", ".bad") and parts[2].isdigit()
                and not _alive(int(parts[2]))):
            shutil.rmtree(path, ignore_errors=True)


def _discard(out_dir: Path) -> None:
    """Remove a damaged entry: renamed aside first, so that no run ever finds half of it under its
    name, then deleted. A concurrent run may have moved it already."""
    aside = _aside(out_dir, "bad")
    try:
        out_dir.rename(aside)
    except FileNotFoundError:
        return
    except OSError as err:
        raise ConfigError(f"cache entry {out_dir} is damaged and cannot be moved aside ({err}): delete "
                          "it, or set data.cache_dir to a folder this process can write.") from None
    shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def _repair_lock(target: Path) -> Iterator[None]:
    """An exclusive `flock` on `.<name>.lock` beside `target` while a damaged cache file is replaced, so
    that processes finding the same damage (DDP ranks, launcher workers) repair it once: the others
    wait, then find it whole. Without flock (Windows, some network file systems) there is no lock;
    the temporary names and renames still keep every entry whole."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    try:
        handle = open(target.with_name(f".{target.name}.lock"), "a")
    except OSError:  # a folder this process cannot write: the repair itself will say so
        yield
        return
    with handle:
        with contextlib.suppress(OSError):
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


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
        with _repair_lock(out_dir):
            try:  # another process may have rebuilt it while this one waited
                return check_entry(out_dir, tokenizer), False
            except DamagedEntry as damage:
                _say(f"cache entry {out_dir}: {damage}; rebuilding it")
            _discard(out_dir)
            return _build(cfg, source, tokenizer, corpus, out_dir, progress), True
    return _build(cfg, source, tokenizer, corpus, out_dir, progress), True


def _build(cfg: DataConfig, source: Source, tokenizer: Tokenizer, corpus: dict[str, Any],
           out_dir: Path, progress: bool) -> dict[str, Any]:
    began = time.perf_counter()
    if progress:
        _say(f"tokenizing {source.description} with the {tokenizer.vocab_size:,}-token tokenizer ...")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(out_dir)
    build_shards(cfg, source, tokenizer, corpus, out_dir)
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
    source = open_source(cfg)
    corpus = {"source": cfg.source, "kind": source.kind, "fingerprint": source.fingerprint(),
              "val_fraction": cfg.val_fraction, "max_chars": cfg.max_chars}
    tokenizer, trained = get_tokenizer(cfg, source, corpus, root, progress)
    out_dir = root / "shards" / _key({"format": FORMAT, "corpus": corpus, "tokenizer": tokenizer.hash})
    manifest, tokenised = _checked_entry(cfg, source, tokenizer, corpus, out_dir, progress)
    dtype = np.dtype(manifest["dtype"])
    splits = manifest["splits"]
    arrays = {s: _load_split(out_dir / f"{s}.bin", dtype) for s in SPLITS}
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
