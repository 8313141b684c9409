"""One writer per folder: a run's folder (`train`, a launcher's run) or a comparison's `--out`.

The writer holds an exclusive `flock` on `.<name>.lock` beside the folder. Beside, not inside, so that
clearing a folder (a run stopped before its first checkpoint starts afresh) never drops a lock that is
held; and `flock`, because the OS releases it when its holder exits however it ends, kill -9
included, so a lock is never stale. The holder writes its pid and command line into the file, so a
process turned away can say who has the folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from blocklab.errors import ConfigError


class FolderInUse(ConfigError):
    """Another process holds the folder: the message names it (pid, command, since when)."""


def lock_path(folder: str | Path) -> Path:
    """`.<name>.lock` beside `folder` (made absolute first, so that "." has a name)."""
    folder = Path(os.path.abspath(folder))
    return folder.with_name(f".{folder.name}.lock")


def holder(path: Path) -> str:
    """Who holds the lock at `path`, in words, from what the holder wrote into it."""
    try:
        info = json.loads(path.read_text())
        return (f"process {info['pid']} (`{info['command']}`, running since "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(info['since']))})")
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"  # it has the lock but has not written its name yet


@contextlib.contextmanager
def hold(folder: str | Path, wait: bool = False, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold `folder`'s lock for the block. Held elsewhere: wait for it with `wait` (calling `on_wait`
    once first), else raise FolderInUse naming the holder. Where `fcntl` is missing (Windows) there
    is no lock."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    path = lock_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                raise FolderInUse(
                    f"{folder} is in use by {holder(path)}: one process at a time may write a run folder. "
                    "Wait for that one to finish (or stop it), or choose another --out.") from None
            if on_wait is not None:
                on_wait()
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:  # a file system without flock (some network mounts): no lock to be had
            yield
            return
        handle.seek(0)
        handle.truncate()
        command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
        handle.write(json.dumps({"pid": os.getpid(), "command": command, "since": time.time()}))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
