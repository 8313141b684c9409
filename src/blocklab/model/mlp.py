"""The MLP of a block: d -> hidden -> d,

    MLP(x) = act(x W_fc) W_out                        ReLU, GELU, GPT-2's tanh GELU, ReLU^2, leaky ReLU
    MLP(x) = (act(x W_gate) * (x W_fc)) W_out         SwiGLU (act = SiLU), GEGLU (GELU)   Shazeer (2020)

It owns its config, `MLPShape` (its sizes and form with the defaults resolved; `ModelConfig.mlp_shape`
builds it from the flat fields), with its rules (`MLPShape.check`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.util.configbase import field_error

MLPAct = Literal["relu", "gelu", "gelu_tanh", "relu2", "leaky_relu", "swiglu", "geglu"]  # gelu_tanh: GPT-2
GATED: dict[str, Callable[[Tensor], Tensor]] = {"swiglu": F.silu, "geglu": F.gelu}


@dataclass(frozen=True)
class MLPShape:
    """The MLP's sizes and form with every default resolved (`ModelConfig.mlp_shape`)."""

    d_model: int
    hidden: int  # the hidden width (for GLU MLPs the gated width)
    act: MLPAct
    bias: bool
    leaky_relu_slope: float  # for act="leaky_relu"

    def check(self) -> None:
        """The MLP's rules, beyond each field's type (a ConfigError naming the `ModelConfig` field)."""
        if self.leaky_relu_slope < 0:
            raise field_error("ModelConfig", "leaky_relu_slope", self.leaky_relu_slope,
                              "the negative-side slope must be >= 0 (0 is ReLU).")


class MLP(nn.Module):
    """ReLU / GELU / ReLU^2 / leaky-ReLU MLP, or a gated SwiGLU / GEGLU MLP (Shazeer, 2020).

    ``gelu_tanh`` is GPT-2's tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    (HF "gelu_new"), kept so that imported GPT-2 checkpoints give the same logits.

    For gated MLPs `shape.hidden` is the gated width: the input projection is d -> 2 * hidden.
    """

    def __init__(self, shape: MLPShape):
        super().__init__()
        self.act, self.slope = shape.act, shape.leaky_relu_slope
        hidden = shape.hidden
        self.fc = nn.Linear(shape.d_model, 2 * hidden if self.act in GATED else hidden, bias=shape.bias)
        self.out = nn.Linear(hidden, shape.d_model, bias=shape.bias)

    def activation(self, h: Tensor) -> Tensor:
        if self.act in GATED:
            h, gate = h.chunk(2, dim=-1)
            return GATED[self.act](gate) * h
        if self.act == "relu":
            return F.relu(h)
        if self.act == "relu2":
            return F.relu(h).square()
        if self.act == "leaky_relu":
            return F.leaky_relu(h, self.slope)
        if self.act == "gelu_tanh":
            return F.gelu(h, approximate="tanh")
        return F.gelu(h)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.activation(self.fc(x)))
