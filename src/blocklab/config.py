"""Old home of `ModelConfig`, kept for code that imports it from here: the config now lives with the
model (model/config.py). Importing this module also loads the named presets, so `from_preset` works."""

from __future__ import annotations

import blocklab.presets  # noqa: F401 (registers the named presets with ModelConfig.from_preset)
from blocklab.configbase import check_fields, floats_from_strings
from blocklab.errors import ConfigError
from blocklab.model.config import ModelConfig

__all__ = ["ConfigError", "ModelConfig", "check_fields", "floats_from_strings"]
