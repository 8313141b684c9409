"""blocklab: the simplified-block and value-path Transformer variants, side by side."""

from blocklab import ops
from blocklab.accounting import count_parameters, flops_per_token
from blocklab.config import ConfigError, ModelConfig
from blocklab.model import Transformer
from blocklab.presets import list_presets

__version__ = "0.1.0"


def train(*args, **kwargs):
    """Train one model; see `blocklab.training.train` (imported lazily: the trainer pulls in tokenizers)."""
    from blocklab.training import train as _train

    return _train(*args, **kwargs)


__all__ = ["ConfigError", "ModelConfig", "Transformer", "count_parameters", "flops_per_token",
           "list_presets", "ops", "train"]
