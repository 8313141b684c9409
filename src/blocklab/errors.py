"""The errors blocklab raises for input it cannot use. A leaf module: it imports nothing."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value that blocklab cannot build; the message says what is allowed."""
