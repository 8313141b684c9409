"""Scalar gains: the alpha and beta weights of Simplifying Transformer Blocks (Eqs. 1, 4-7, 13).

A trainable gain is an `nn.Parameter` whose name ends in ``gain``, so that the trainer can find
every gain (to exempt it from weight decay and to log it) without knowing the architecture.
A fixed gain is a plain float, so a fixed gain of 1 costs nothing.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Gain(nn.Module):
    """Multiplies by a scalar (or per-head vector) that is either fixed or trainable."""

    gain: nn.Parameter | None  # None: a fixed gain, the float `init`

    def __init__(self, init: float | list[float], trainable: bool, size: int = 1):
        super().__init__()
        if isinstance(init, (list, tuple)):  # one initial value per entry
            if not trainable:
                raise ValueError("a fixed Gain takes a single float")
            init, size = [float(i) for i in init], len(init)
        else:
            init = float(init)
        self.init, self.size = init, size
        self.gain = nn.Parameter(torch.empty(size)) if trainable else None
        self.reset_parameters()

    @property
    def value(self) -> Tensor | float:
        return self.gain if self.gain is not None else self._fixed()

    @property
    def param(self) -> nn.Parameter:
        """The trainable gain (for gains that are built trainable)."""
        assert self.gain is not None, "a fixed gain has no parameter"
        return self.gain

    def _fixed(self) -> float:
        """The value of a fixed gain: a list of initial values always makes a trainable one."""
        assert not isinstance(self.init, list)
        return self.init

    def reset_parameters(self) -> None:
        if self.gain is not None:
            with torch.no_grad():
                if isinstance(self.init, list):
                    self.gain.copy_(torch.tensor(self.init))
                else:
                    self.gain.fill_(self.init)

    def forward(self, x: Tensor) -> Tensor:
        if self.gain is None:
            init = self._fixed()
            return x if init == 1.0 else x * init
        return x * self.gain

    def extra_repr(self) -> str:
        return f"init={self.init}, trainable={self.gain is not None}, size={self.size}"


def is_gain(name: str) -> bool:
    """True for the parameters that are scalar gains (named ``*gain``)."""
    return name.rsplit(".", 1)[-1] == "gain"
