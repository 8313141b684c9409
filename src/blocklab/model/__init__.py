from blocklab.model.carry import Carry
from blocklab.model.transformer import Transformer

__all__ = ["Carry", "Transformer"]
