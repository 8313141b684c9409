"""The errors blocklab raises for input it cannot use and for work it cannot go on with. A leaf
module: it imports nothing, so that any module may raise them."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value that blocklab cannot build; the message says what is allowed."""


class TrainingError(RuntimeError):
    """Training cannot go on (a non-finite loss, a run that does not match its checkpoint)."""


class DiskFullError(TrainingError):
    """A write failed for want of space (`blocklab.util.diskfull`); the message names the path, the free
    space, the size the write needed and what to do."""
