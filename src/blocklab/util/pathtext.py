"""Paths and values that are not valid text: refused up front, naming the argument.

On Linux a file name is bytes, and Python hands a name that is not valid UTF-8 (a Latin-1 ``é``, the
byte 0xe9) over as a str with a lone surrogate in it (``'\\udce9'``, PEP 383). Such a str opens the
file, but cannot be written as UTF-8: blocklab records its paths in config.yaml, metrics, logs and
reports, which would fail part-way (or YAML would refuse to read the value at all). So a command
refuses one before it reads or writes anything, with the argument's name and the path as bytes.
"""

from __future__ import annotations

import os
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
