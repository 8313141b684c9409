"""The sha256 of a file source's files, remembered across processes so that a start costs a stat a file.

The token cache is keyed by the bytes of every file of a file source (`sources.FileSource.fingerprint`):
a copy made with `cp -p`, `rsync -a` or `tar` keeps a file's name, size and modification time, so only
the bytes tell an edited file. Reading them all at every start costs a read of the corpus (0.7 s a
cached gigabyte with about one core free, 49 s for 10 GB under load; benchmarks/RESULTS.md, "The token
cache's key at stat cost"). A `DigestRecord` keeps each file's sha256 beside its size,
modification time, change time and inode, in ``<cache>/digests/<key>.json`` (the key: the source's
absolute path or glob), written once the cache entry is in place; a later start trusts a
recorded sha256 when all four still match, and reads the file again when any differs.

Why the change time makes this safe: the kernel sets a file's ctime to its clock at every change of
its bytes or its metadata, and no user call can set it (``touch -d``, `os.utime` and every copying
tool set the modification time, and that change moves the ctime on). A file edited with its size and
modification time restored therefore has a new ctime and is read again; a file only touched is read
again too, and keeps its sha256, so the cache key and the entry stay the same. A file replaced by a
rename has a new inode.

A file changed within the clock's granularity after it was read could keep the ctime recorded (a
racy record, as git's index calls it): a sha256 is recorded only for a file whose ctime is more than
`RACY_NS` older than the read began, and that did not change while being read; a newer file is read
again at the next start, by when it is old enough. In one process the same rule serves a memo, so a
file is read at most once a process unless it changes.

The record is an optimisation, never trusted blindly for anything but the stat: an unreadable, foreign
or malformed record (or entry) is passed over and the files read; one that cannot be written (a
read-only cache, a full disk) is not written. It is written through a temporary name and a rename, so
concurrent starts leave one whole record (each one's is right).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

from blocklab.util.filemodes import atomic_write_text
from blocklab.util.integrity import sha256

# the record's layout: {"format": 1, "files": {absolute path: [size, mtime_ns, ctime_ns, inode, sha256]}}
FORMAT = 1
FOLDER = "digests"  # under the token cache's root
RACY_NS = 2 * 10**9  # a file changed this recently may change again within the clock's tick: not recorded

SHA256 = re.compile(r"[0-9a-f]{64}")
Stat = tuple[int, int, int, int]
Known = tuple[Stat, str]

# absolute path -> (stat, sha256) of the files this process read or trusted (racy ones left out)
_SEEN: dict[str, Known] = {}


def stat_of(path: Path) -> Stat:
    """(size, mtime_ns, ctime_ns, inode): what must all be unchanged for a recorded sha256 to hold."""
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def _entry(value: Any) -> Known | None:
    """A record's entry as (stat, sha256), or None when it is not four counts and a sha256."""
    if not (isinstance(value, list) and len(value) == 5 and isinstance(value[4], str)):
        return None
    stat, digest = value[:4], value[4]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in stat):
        return None
    if not SHA256.fullmatch(digest):
        return None
    return (stat[0], stat[1], stat[2], stat[3]), digest


def _load(path: Path) -> dict[str, Known]:
    """The well-formed entries of the record at `path`; nothing when it is missing, unreadable,
    not JSON or not this format."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    files = record.get("files") if isinstance(record, dict) and record.get("format") == FORMAT else None
    if not isinstance(files, dict):
        return {}
    entries = {name: _entry(value) for name, value in files.items()}
    return {name: known for name, known in entries.items() if known is not None}


class DigestRecord:
    """The sha256 of one source's files: trusted from the record at `path` (None: this process's memo
    only) while a file's stat matches, else read. `read` counts the files read, `save` writes the
    record when what was found differs from what was loaded."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.loaded = _load(path) if path is not None else {}
        self.found: dict[str, Known] = {}
        self.read = 0

    @classmethod
    def for_source(cls, cache_root: Path, spec: str) -> DigestRecord:
        """The record of the file source `spec` (`DataConfig.source`: a folder, a glob or a file, taken
        as an absolute path) in the token cache at `cache_root`."""
        where = str(Path(spec).expanduser().absolute())
        return cls(cache_root / FOLDER / f"{hashlib.sha256(where.encode('utf-8')).hexdigest()[:24]}.json")

    def sha256(self, file: Path) -> str:
        name = str(file.absolute())
        began = time.time_ns()
        stat = stat_of(file)
        for known in (self.loaded.get(name), _SEEN.get(name)):
            if known is not None and known[0] == stat:
                self.found[name] = _SEEN[name] = known
                return known[1]
        digest = sha256(file)
        self.read += 1
        if stat_of(file) == stat and stat[2] < began - RACY_NS:  # unchanged while read, and not racy
            self.found[name] = _SEEN[name] = (stat, digest)
        return digest

    def save(self) -> None:
        """Write what was found, when it differs from what was loaded; a cache that cannot be written
        keeps no record (the next start reads the files again)."""
        if self.path is None or self.found == self.loaded:
            return
        files = {name: [*stat, digest] for name, (stat, digest) in sorted(self.found.items())}
        try:
            atomic_write_text(self.path, json.dumps({"format": FORMAT, "files": files}) + "\n")
        except OSError:
            pass
