"""Value paths: how a layer gets its values V.

A value path answers, for one layer: which parameters do I own; given the normed block input and
the `Carry`, what is V (and what do I put into the carry for later layers); what must a cache keep.
Adding a variant means one class here, one registry entry and a test.
"""

from __future__ import annotations

from torch import Tensor, nn

from blocklab.config import ConfigError
from blocklab.model.carry import Carry
from blocklab.model.linear_maps import make_value_map


class StandardValues(nn.Module):
    """V_n = H_{n-1} W_V (Simplifying, Eq. 2); W_V is linear, identity or reparameterised (Eq. 6)."""

    description = "each layer projects its own values, V_n = H_{n-1} W^V_n"

    def __init__(self, cfg, layer: int):
        super().__init__()
        self.w_v = make_value_map(cfg.value_form_of(layer), cfg)

    def forward(self, x: Tensor, carry: Carry) -> tuple[Tensor, Carry]:
        return self.w_v(x), carry


VALUE_PATHS: dict[str, type[nn.Module]] = {"standard": StandardValues}


def make_value_path(cfg, layer: int) -> nn.Module:
    return VALUE_PATHS[cfg.value_path](cfg, layer)


def validate_value_path(cfg) -> None:
    if cfg.value_path not in VALUE_PATHS:
        raise ConfigError(
            f"ModelConfig.value_path = {cfg.value_path!r} is not allowed: choose one of "
            f"{', '.join(map(repr, VALUE_PATHS))}."
        )
