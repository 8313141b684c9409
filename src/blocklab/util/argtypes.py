"""argparse types shared by the command lines (`blocklab.cli` and each package's cli.py)."""

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
