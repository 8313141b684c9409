"""A write that fails for want of disk space, said plainly.

A full disk (or quota) reaches blocklab in three shapes, each measured on a full tmpfs (torch 2.13,
safetensors 0.8):

- an OSError with errno ENOSPC or EDQUOT, from Python's own writes;
- a RuntimeError from torch.save's zip writer, which keeps no errno: "[enforce fail at
  inline_container.cc:672] . unexpected pos 576 vs 534", or "basic_ios::clear: iostream error" for
  a small file (its other text for a failed write, "file write failed", is matched too);
- safetensors' SafetensorError, "Error while serializing: I/O error: No space left on device
  (os error 28)".

`failed_write` tells exactly these apart, and `disk_full` (or `said_plainly` around a write) turns
them into a DiskFullError naming the path, the free space, the size the write needed (for tensors,
`tensor_bytes`) and what to do; anything else propagates as it was, with its traceback.
"""

from __future__ import annotations

import errno
import os
import shutil
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch import Tensor

from blocklab.util.errors import DiskFullError

NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
# torch's and safetensors' texts for a write the OS refused (the first two say why), searched only in
# errors raised by the writes it is asked about: a RuntimeError elsewhere is never taken for one
FAILED_WRITE = ("No space left on device", "Disk quota exceeded", "unexpected pos", "file write failed",
                "iostream error")


def failed_write(err: BaseException) -> str | None:
    """Why `err` is a write the disk refused ("No space left on device", or torch's own text), or
    None when it is some other error."""
    if isinstance(err, DiskFullError):  # already said plainly, by a write inside this one
        return None
    if isinstance(err, OSError):
        return os.strerror(err.errno) if err.errno is not None and err.errno in NO_SPACE else None
    if not (isinstance(err, RuntimeError) or type(err).__name__ == "SafetensorError"):
        return None
    text = str(err).strip()
    said = next((m for m in FAILED_WRITE[:2] if m in text), None)
    if said is not None:
        return said
    if any(marker in text for marker in FAILED_WRITE[2:]):  # torch does not say why
        return f"the write failed ({text}), most likely for want of space"
    return None


def free_bytes(path: str | Path) -> int | None:
    """Bytes free to this user on the file system that holds `path` (or its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def plain_size(n: float) -> str:
    """1536 -> "1.5 KiB"."""
    units = ("bytes", "KiB", "MiB", "GiB", "TiB")
    k = 0
    while n >= 1024 and k < len(units) - 1:
        n, k = n / 1024, k + 1
    return f"{n:.0f} bytes" if k == 0 else f"{n:.1f} {units[k]}"


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in `obj` (nested dicts, lists and tuples), a tensor under several names
    counted once: about what a checkpoint of them takes on disk."""
    seen, total, todo = set(), 0, [obj]
    while todo:
        item = todo.pop()
        if isinstance(item, Tensor):
            key = (item.data_ptr(), tuple(item.shape), item.dtype)
            if key not in seen or item.device.type == "meta":  # meta tensors have no address to share
                seen.add(key)
                total += item.numel() * item.element_size()
        elif isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
    return total


def disk_full(err: BaseException, what: str, path: str | Path, needed: int | None,
              then: str) -> DiskFullError:
    """The DiskFullError to raise (``from err``) for `err`, a write of `what` at `path` that the disk
    refused (`failed_write`). Call it after removing what the failed write left, so that the free space
    it reports is what a retry would find; `needed` is the write's size (an estimate), `then` what to
    do once there is room."""
    # torch's failed zip writer stays open in the finished frames of the traceback: a deleted file whose
    # space the file system keeps until it is closed (measured: a whole partial optimizer.pt). Clearing
    # those frames' locals closes it, so that the space comes back now, not when `err` is dropped.
    cause: BaseException | None = err
    while cause is not None:
        traceback.clear_frames(cause.__traceback__)  # frames still running are left as they are
        cause = cause.__cause__ or cause.__context__
    free = free_bytes(path)
    if needed is not None and free is not None and free >= needed:
        # the estimate counts the data, not the file system's own blocks nor what else was written at
        # the time: the write needed more than is free, so never "X free, needs about Y < X"
        need = f"it needs more than that (its data alone is about {plain_size(needed)})"
    else:
        need = f"it needs about {plain_size(needed)}" if needed is not None else None
    room = [f"{plain_size(free)} free there" if free is not None else None, need]
    room_text = ", and ".join(r for r in room if r)
    return DiskFullError(f"could not write {what} {path}: {failed_write(err) or err}"
                         + (f"; {room_text}" if room_text else "") + f". {then}")


@contextmanager
def said_plainly(what: str, path: str | Path, needed: int | None,
                 then: str | Callable[[], str]) -> Iterator[None]:
    """Run a write, turning a refusal for want of space into a DiskFullError (see `disk_full`);
    `then` may be a function, called only then."""
    try:
        yield
    except Exception as err:
        if failed_write(err) is None:
            raise
        raise disk_full(err, what, path, needed, then() if callable(then) else then) from err
