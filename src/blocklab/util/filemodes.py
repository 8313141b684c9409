"""File permissions like those of any file the user's process writes (the umask's).

safetensors and `tempfile.mkdtemp` create owner-only files (0600) and folders (0700); beside the
0644 files of a run that breaks sharing a run with a colleague or a container. Every weight file and
every folder written through a temporary name passes through `as_created` once complete.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

_LOCK = threading.Lock()


def umask() -> int:
    """The process's umask (read by setting and restoring it; under a lock, as os.umask is global)."""
    with _LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def as_created(path: str | Path) -> None:
    """Give `path` the mode a plain `open(path, "w")` (file) or `mkdir` (folder) would have given it."""
    path = Path(path)
    base = 0o777 if path.is_dir() else 0o666
    os.chmod(path, base & ~umask())


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` through a temporary name in the same folder and a rename, so a reader
    sees the old file or the whole new one, never a part (a process killed mid-write leaves only a
    `.tmp-*` file behind; a write that fails removes its own)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed write (a full disk) leaves nothing behind
        raise
