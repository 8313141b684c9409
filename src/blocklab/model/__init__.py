from blocklab.model.carry import Carry
from blocklab.model.config import ModelConfig
from blocklab.model.transformer import Transformer

__all__ = ["Carry", "ModelConfig", "Transformer"]
