"""The MLP sub-block: d -> hidden -> d with one of the usual activations."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from blocklab.model.fields import MLPShape

GATED: dict[str, Callable[[Tensor], Tensor]] = {"swiglu": F.silu, "geglu": F.gelu}


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
