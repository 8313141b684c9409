"""One writer per folder: a run's folder (`train`, a launcher's run), a comparison's `--out`, an export.

The writer holds an exclusive `flock` on `.<name>.lock` beside the folder. Beside, not inside, so that
clearing a folder (a run stopped before its first checkpoint starts afresh) never drops a lock that is
held; and `flock`, because the OS releases it when its holder exits however it ends, kill -9
included, so a lock is never stale. The holder writes its pid and command line into the file, so a
process turned away can say who has the folder.

The lock lies beside the folder's real path (symlinks and `..` resolved), so that every spelling of
one folder (runs/x, ./runs/../runs/x, a symlink to it) meets the same lock. A bind mount of the folder,
or a container's volume mounted at another path, is a spelling `realpath` cannot see: the same folder
has another parent there, so another lock beside it. So the holder of a folder that exists (or that
`make` creates) also holds a `flock` on the folder itself, its directory inode, which every path to it
shares; a second writer through another mount meets that one. A holder may remove its
lock file as it lets go (`remove=True`, for exports, which leave nothing beside them): whoever locked
the file just before it went checks that the file at the path is still the one it locked, and locks
again if not.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from blocklab.util.errors import ConfigError


class FolderInUse(ConfigError):
    """Another process holds the folder: the message names it (pid, command, since when)."""


def lock_path(folder: str | Path) -> Path:
    """`.<name>.lock` beside `folder`'s real path (made absolute, symlinks and `..` resolved, so that
    "." has a name and every spelling of one folder has one lock)."""
    real = Path(os.path.realpath(folder))
    return real.with_name(f".{real.name}.lock")


def holder(path: Path) -> str:
    """Who holds the lock at `path`, in words, from what the holder wrote into it."""
    try:
        info = json.loads(path.read_text())
        return (f"process {info['pid']} (`{info['command']}`, running since "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(info['since']))})")
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"  # it has the lock but has not written its name yet


@contextlib.contextmanager
def hold(folder: str | Path, wait: bool = False, on_wait: Callable[[], None] | None = None,
         remove: bool = False, make: bool = False) -> Iterator[None]:
    """Hold `folder`'s lock for the block. Held elsewhere: wait for it with `wait` (calling `on_wait`
    once first), else raise FolderInUse naming the holder. With `remove`, the lock file goes as the
    lock is let go. With `make`, the folder is created if missing, so that its own inode is locked too
    (the module doc), and removed again if the block leaves it empty; a folder that exists is always.
    Where `fcntl` is missing (Windows) or the file system has no `flock` (some network mounts) there is
    no lock."""
    try:
        import fcntl  # noqa: F401
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    path = lock_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = _acquire(path, folder, wait, on_wait)
    if handle is None:  # a file system without flock: no lock to be had
        yield
        return
    inode = None
    made = None  # the folder `make` created: removed again if the block leaves it empty (a refusal)
    try:
        if make and not os.path.isdir(folder):  # through a symlink to a folder not made yet: that folder
            made = Path(os.path.realpath(folder))
            made.mkdir(parents=True, exist_ok=True)
        inode = _lock_inode(folder, wait, on_wait)
        handle.seek(0)
        handle.truncate()
        command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
        handle.write(json.dumps({"pid": os.getpid(), "command": command, "since": time.time()}))
        handle.flush()
        yield
    finally:
        if remove:  # while still held, so that nobody holds a lock on a file no longer at the path
            path.unlink(missing_ok=True)
        if made is not None:
            with contextlib.suppress(OSError):  # not empty: the block wrote there
                made.rmdir()
        if inode is not None:
            os.close(inode)
        handle.close()  # closing lets go of the flock


def _lock_inode(folder: str | Path, wait: bool, on_wait: Callable[[], None] | None) -> int | None:
    """The folder's own directory, open and flocked (None if it is not a folder yet, or cannot be
    locked). Taken after the lock beside it, so no two processes wait on each other. Held elsewhere (a
    writer that reached the folder through another mount): FolderInUse naming the holder, from the lock
    file beside the folder as that one sees it, which this process may not see; or wait for it."""
    import fcntl

    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        if not wait:
            os.close(fd)
            raise FolderInUse(f"{_named(folder)} is in use by another process that reached it by another "
                              "path (a bind mount or a container volume): one process at a time may write a "
                              "folder. Wait for that one to finish (or stop it), or choose another --out."
                              ) from None
        if on_wait is not None:
            on_wait()
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        return None
    return fd


def _acquire(path: Path, folder: str | Path, wait: bool, on_wait: Callable[[], None] | None
             ) -> IO[str] | None:
    """The lock file at `path`, open and locked; None where the file system has no flock. A file its
    holder removed while this process waited for it (`hold`'s `remove`) is let go and the one now at
    the path locked instead."""
    import fcntl

    waited = False
    while True:
        handle = open(path, "a+")  # returned open: hold closes it
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    raise FolderInUse(f"{_named(folder)} is in use by {holder(path)}: one process at a time "
                                      "may write a folder. Wait for that one to finish (or stop it), or "
                                      "choose another --out.") from None
                if on_wait is not None and not waited:
                    on_wait()
                waited = True
                fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:
            handle.close()
            return None
        except BaseException:
            handle.close()
            raise
        if _still_there(handle, path):
            return handle
        handle.close()


def _still_there(handle: IO[str], path: Path) -> bool:
    """Whether the file at `path` is the one `handle` has open (its holder may have removed it)."""
    try:
        here = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(handle.fileno())
    return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)


def _named(folder: str | Path) -> str:
    """`folder` as given, and the real folder too where a symlink or `..` leads elsewhere."""
    real = os.path.realpath(folder)
    return str(folder) if real == os.path.abspath(folder) else f"{folder} (the folder {real})"
