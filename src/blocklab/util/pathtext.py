"""Paths and values that are not valid text: refused up front, naming the argument; and paths that
are not what a command needs (`refused_path`, `what_is_there`), said in words.

On Linux a file name is bytes, and Python hands a name that is not valid UTF-8 (a Latin-1 ``é``, the
byte 0xe9) over as a str with a lone surrogate in it (``'\\udce9'``, PEP 383). Such a str opens the
file, but cannot be written as UTF-8: blocklab records its paths in config.yaml, metrics, logs and
reports, which would fail part-way (or YAML would refuse to read the value at all). So a command
refuses one before it reads or writes anything, with the argument's name and the path as bytes.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from typing import Any

from blocklab.util.errors import ConfigError


def is_text(value: str) -> bool:
    """Whether `value` can be written as UTF-8 (no lone surrogate from an undecodable byte)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(value: str) -> str:
    """`value` as the user typed it: valid characters as they are, the undecodable bytes as \\xNN."""
    try:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate that stands for no byte (made in Python, not read from a path)
        return value.encode("utf-8", "backslashreplace").decode("ascii")


def not_text(name: str, value: str) -> ConfigError:
    """The error for argument `name` whose `value` is not valid text."""
    return ConfigError(f"{name} '{shown(value)}' is not valid UTF-8 text: blocklab writes its paths into "
                       "config.yaml, logs and reports, which are UTF-8, so it takes only names that are. "
                       "Rename the file or folder (or copy it) to a name in UTF-8, and give that.")


def require_text(pairs: Iterable[tuple[str, Any]]) -> None:
    """Refuse the first (name, value) whose value (a str or a path), or one in a list of them, is not
    valid text."""
    for name, value in pairs:
        for item in value if isinstance(value, (list, tuple)) else [value]:
            text = os.fspath(item) if isinstance(item, os.PathLike) else item
            if isinstance(text, str) and not is_text(text):
                raise not_text(name, text)


# a path the user chose that this user cannot write: input to change (exit 2), not the machine failing
NO_PERMISSION = "this user has no permission there"
REFUSED_PATH = {errno.EROFS: "the file system that holds it is read-only", errno.EACCES: NO_PERMISSION,
                errno.EPERM: NO_PERMISSION}


def refused_path(err: OSError) -> str | None:
    """An OSError on a path the user can change (a read-only disk, no permission) as one line naming the
    path, the problem and what to do; None for any other OSError."""
    if err.errno not in REFUSED_PATH or err.filename is None:
        return None
    path = os.fsdecode(err.filename)
    why = f"{REFUSED_PATH[err.errno]} ({os.strerror(err.errno)})"
    return f"cannot write {shown(path)!r}: {why}. Give a path (such as --out) where this user can write."


def what_is_there(path: str | os.PathLike[str]) -> str:
    """Why `path` is neither a regular file nor a folder, in words: "no such file or directory", or what
    it is instead ("a character device", "a named pipe", "a socket", "a block device")."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "no such file or directory"
    kinds = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"))
    kind = next((name for test, name in kinds if test(mode)), "not a regular file")
    return f"it is {kind}, not a regular file or a directory"
