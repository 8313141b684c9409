"""A token-cache entry's layout, its checks and its repair, and a cached BPE tokenizer read and stored
(the cache itself: `prepare`; its folder and the disk-full refusal of a write into it: `cache_folder`).

An entry (``shards/<key>/``) is checked before it is used, once per process: the manifest must
parse, hold the fields `prepare_data` reads and name the tokenizer in use; each shard must have the
size and sha256 its manifest recorded (taken while it was written) and hold only ids below the
tokenizer's vocabulary size. Each shard is read once per process for this (sha256 and the largest
id in one pass), keyed by its path, inode, modification time and size; a later call finds the
result by a stat. Measured (benchmarks/token_cache_check.py, a shared 2-core EPYC, uint16 ids):
about 20 ms per 10M tokens once per process (74 ms for 50M), 0.2-0.3 ms for every later call, as
much as opening the memmaps; hashing while writing adds about 11 ms per 10M tokens to tokenising.

A cached BPE tokenizer (``tokenizers/bpe-<key>/``) is an entry too: its ``tokenizer.json`` beside a
``manifest.json`` that records the file's size and sha256 (taken from the bytes written), checked the
same way each time it is used, so that a tokenizer edited into another valid one (two ids swapped) is
named and trained again rather than used. Reading it costs about as much as loading it (a few ms).

Temporary and discarded copies of an entry carry the pid and host of the process that made them,
so a later build can remove those of dead processes on this host.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from blocklab.data.cache_folder import cache_write
from blocklab.data.config import DataConfig
from blocklab.data.tokenizer import Tokenizer, tokenizer_from_json
from blocklab.util import locks
from blocklab.util.errors import ConfigError

FORMAT = 2  # bump when the shard or manifest layout changes (2: each shard's size and sha256)
TOKENIZER_ENTRY = 1  # the layout of a cached tokenizer's folder (1: tokenizer.json and its manifest)
TOKENIZER_FILE = "tokenizer.json"
SPLITS = ("train", "val")
READ_BYTES = 1 << 24  # bytes per read when checking a shard: a multiple of every id width


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size < 2**16 else np.uint32)


class DamagedEntry(Exception):
    """What is wrong with a cache entry, in words ("train.bin is missing")."""


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def manifest_error(m: Any, tokenizer: Tokenizer) -> str | None:
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


def shard_digest(path: Path, dtype: np.dtype) -> tuple[str, int]:
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
        _DIGESTS[key] = shard_digest(path, dtype)
    return _DIGESTS[key]


def check_entry(out_dir: Path, tokenizer: Tokenizer) -> dict[str, Any]:
    """The manifest of cache entry `out_dir` once the entry is found whole for `tokenizer` (see the
    module docstring); raises DamagedEntry naming the file and what is wrong with it."""
    manifest = read_manifest(out_dir)
    problem = manifest_error(manifest, tokenizer)
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


def read_manifest(entry: Path) -> Any:
    """The parsed manifest.json of `entry` (of any JSON type: the caller checks its fields); raises
    DamagedEntry when it is missing, unreadable or not JSON."""
    try:
        text = (entry / "manifest.json").read_text()
    except FileNotFoundError:
        raise DamagedEntry("no manifest.json (it was deleted, or the entry was left incomplete)") from None
    except (OSError, UnicodeDecodeError) as err:
        raise DamagedEntry(f"manifest.json cannot be read ({err})") from None
    try:
        return json.loads(text)
    except ValueError as err:
        raise DamagedEntry(f"manifest.json is not valid JSON ({err})") from None


# -- a cached tokenizer ------------------------------------------------------------------------------


def tokenizer_manifest(data: bytes, tokenizer: Tokenizer, settings: dict[str, Any]) -> dict[str, Any]:
    """The manifest of a cached tokenizer whose tokenizer.json holds `data`: its size and sha256, taken
    from the bytes written, never read back; the settings it was trained with, for a reader."""
    return {"format": TOKENIZER_ENTRY, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "settings": settings,
            "tokenizer": {"hash": tokenizer.hash, "vocab_size": tokenizer.vocab_size, "file": TOKENIZER_FILE},
            "checksums": {TOKENIZER_FILE: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}}


def check_tokenizer_entry(entry: Path) -> bytes:
    """The bytes of cached tokenizer `entry`'s tokenizer.json once they have the size and sha256 its
    manifest recorded; raises DamagedEntry naming the file and what is wrong with it."""
    manifest = read_manifest(entry)
    if not isinstance(manifest, dict) or manifest.get("format") != TOKENIZER_ENTRY:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise DamagedEntry(f"manifest.json has format {got!r} where this blocklab writes {TOKENIZER_ENTRY}")
    sums = manifest.get("checksums")
    want = sums.get(TOKENIZER_FILE) if isinstance(sums, dict) else None
    if not (isinstance(want, dict) and _count(want.get("size")) and isinstance(want.get("sha256"), str)):
        raise DamagedEntry(f"manifest.json lacks the size and sha256 of {TOKENIZER_FILE}")
    try:
        data = (entry / TOKENIZER_FILE).read_bytes()
    except FileNotFoundError:
        raise DamagedEntry(f"{TOKENIZER_FILE} is missing") from None
    except OSError as err:
        raise DamagedEntry(f"{TOKENIZER_FILE} cannot be read ({err})") from None
    if len(data) != want["size"]:
        raise DamagedEntry(f"{TOKENIZER_FILE} holds {len(data):,} bytes where its manifest says "
                        f"{want['size']:,} (the file was cut short or changed after it was written)")
    if hashlib.sha256(data).hexdigest() != want["sha256"]:
        raise DamagedEntry(f"{TOKENIZER_FILE} sha256 differs from its manifest (the file was changed after "
                        "it was written)")
    return data


def cached_bpe(cfg: DataConfig, entry: Path) -> Tokenizer:
    """The cached BPE in `entry`, once its tokenizer.json has the size and sha256 its manifest recorded;
    raises DamagedEntry when it has not or cannot be loaded."""
    data = check_tokenizer_entry(entry)
    try:
        return tokenizer_from_json(data.decode("utf-8"), cfg.eos_token, cfg.mask_token,
                                   name=str(entry / TOKENIZER_FILE))
    except (ConfigError, UnicodeDecodeError) as err:
        why = first_line(err.__cause__ or err)
        raise DamagedEntry(f"{TOKENIZER_FILE} cannot be loaded ({why})") from None


def store_bpe(cfg: DataConfig, tok: Tokenizer, settings: dict[str, Any], entry: Path) -> bool:
    """Write `tok` and its manifest into cache entry `entry` through a temporary folder and a rename;
    False when a concurrent run put its own there first. Nothing is left behind when a write fails."""
    data = tok.to_str().encode("utf-8")
    manifest = json.dumps(tokenizer_manifest(data, tok, settings), indent=2, default=str) + "\n"
    with cache_write(cfg, "the cached tokenizer", entry, lambda: len(data) + len(manifest)):
        entry.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(entry)
        tmp = aside(entry, "tmp")
        try:
            tmp.mkdir()
            (tmp / TOKENIZER_FILE).write_bytes(data)
            (tmp / "manifest.json").write_text(manifest)
            return put_in_place(tmp, entry)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


# -- writing and repairing ---------------------------------------------------------------------------


def put_in_place(tmp: Path, entry: Path) -> bool:
    """Rename the finished folder `tmp` to `entry`: True, or False when a concurrent run put a finished
    entry there first (then `tmp` is removed and theirs is to be used, once checked)."""
    try:
        tmp.rename(entry)
    except OSError:
        if not (entry / "manifest.json").exists():
            raise
        shutil.rmtree(tmp)
        return False
    return True


def first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def _where() -> str:
    """This host and pid namespace: where a pid means this process (containers on one host may share
    a host name and a cache but not their pids)."""
    try:
        space = os.readlink("/proc/self/ns/pid").strip("pid:[]")
    except OSError:
        space = ""
    return f"{socket.gethostname()}~{space}" if space.isdigit() else socket.gethostname()


def aside(out_dir: Path, kind: str) -> Path:
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


def remove_leftovers(out_dir: Path) -> None:
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


def discard(out_dir: Path) -> None:
    """Remove a damaged entry: renamed aside first, so that no run ever finds half of it under its
    name, then deleted. A concurrent run may have moved it already."""
    moved = aside(out_dir, "bad")
    try:
        out_dir.rename(moved)
    except FileNotFoundError:
        return
    except OSError as err:
        raise ConfigError(f"cache entry {out_dir} is damaged and cannot be moved aside ({err}): delete "
                          "it, or set data.cache_dir to a folder this process can write.") from None
    shutil.rmtree(moved, ignore_errors=True)


def repair_lock(target: Path) -> contextlib.AbstractContextManager[None]:
    """Hold `target`'s lock (`blocklab.util.locks`, waiting) while a damaged cache file is replaced, so that
    processes finding the same damage (DDP ranks, launcher workers) repair it once: the others wait,
    then find it whole. In a folder this process cannot write there is no lock (the repair itself says
    what is wrong); the temporary names and renames keep every entry whole either way."""
    if not os.access(target.parent, os.W_OK):
        return contextlib.nullcontext()
    return locks.hold(target, wait=True)


@contextlib.contextmanager
def locked(cfg: DataConfig, target: Path) -> Iterator[None]:
    """`repair_lock(target)`, a lock file the disk refuses said like any other write to the cache."""
    with contextlib.ExitStack() as stack:
        with cache_write(cfg, "a lock for", target, lambda: None):
            stack.enter_context(repair_lock(target))
        yield
