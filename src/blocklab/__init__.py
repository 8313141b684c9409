"""blocklab: the simplified-block and value-path Transformer variants, side by side.

The names below load on first use (PEP 562), so that `blocklab --help`, `--version` and the
command line's argument parsing start without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "ConfigError": "blocklab.util.errors",
    "ModelConfig": "blocklab.model.config",
    "LanguageModel": "blocklab.runtime",
    "Transformer": "blocklab.model",
    "count_parameters": "blocklab.accounting",
    "flops_per_token": "blocklab.accounting",
    "list_presets": "blocklab.model.presets",
}
_SUBMODULES = {"analysis", "compare", "data", "eval", "finetune", "interop", "model", "runtime", "training"}

if TYPE_CHECKING:
    from blocklab import interop, runtime
    from blocklab.accounting import count_parameters, flops_per_token
    from blocklab.model import Transformer
    from blocklab.model.config import ModelConfig
    from blocklab.model.presets import list_presets
    from blocklab.runtime import LanguageModel
    from blocklab.util.errors import ConfigError


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"blocklab.{name}")
    raise AttributeError(f"module 'blocklab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | _SUBMODULES)


def train(*args: Any, **kwargs: Any) -> Any:
    """Train one model; see `blocklab.training.train`."""
    from blocklab.training import train as _train

    return _train(*args, **kwargs)


__all__ = ["ConfigError", "LanguageModel", "ModelConfig", "Transformer", "__version__", "count_parameters",
           "flops_per_token", "interop", "list_presets", "runtime", "train"]
