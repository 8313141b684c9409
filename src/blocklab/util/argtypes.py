"""What the command lines (`blocklab.cli` and each package's cli.py) share: argparse types and the
grammar of the positionals every command that trains takes."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """argparse's type for a count: a positive integer, else a usage error naming the text."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: give a positive integer")
    return value


def config_and_overrides(positionals: list[str]) -> tuple[str | None, list[str]]:
    """The positionals of every experiment command (train, prepare, compare, reproduce): an optional
    YAML config (a file, or a shipped recipe's name) first, then ``key=value`` overrides."""
    overrides = list(positionals)
    config = overrides.pop(0) if overrides and "=" not in overrides[0] else None
    return config, overrides
