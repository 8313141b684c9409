"""Normalisation layers: LayerNorm, RMSNorm or none."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from blocklab.model.fields import Norm, NormShape


class RMSNormEpsOutside(nn.Module):
    """y = w * x / (sqrt(mean(x^2)) + eps): the RMSNorm of the Simplifying Transformer Blocks code,
    eps outside the root. torch's RMSNorm computes w * x / sqrt(mean(x^2) + eps), where eps acts at an
    RMS of sqrt(eps) = 3e-3 rather than 1e-5: with eps 1e-5 the outputs (and input gradients) differ
    by 0.6% at RMS 0.028 (a GPT-2-init residual stream), 4.8% at 0.01 and 0.04% at 0.1
    (benchmarks/rmsnorm_eps.py)."""

    def __init__(self, dim: int, eps: float, affine: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        y = x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps)
        return y if self.weight is None else y * self.weight


def make_norm(kind: str, dim: int, eps: float | None, bias: bool = False, affine: bool = True,
              eps_outside: bool = False) -> nn.Module:
    """LayerNorm / RMSNorm, or an identity for ``"none"``.

    affine=False drops the learnable scale (and shift): nanochat's parameter-free RMSNorm. eps=None
    is the dtype's machine epsilon (torch's RMSNorm default, which nanochat uses). eps_outside: the
    SAS code's RMSNorm (`RMSNormEpsOutside`).
    """
    if kind == "layernorm":
        assert eps is not None, "validation gives LayerNorm a number"
        return nn.LayerNorm(dim, eps=eps, elementwise_affine=affine, bias=bias and affine)
    if kind == "rmsnorm" and eps_outside:
        assert eps is not None, "validation gives eps outside the root a number"
        return RMSNormEpsOutside(dim, eps, affine)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps, elementwise_affine=affine)
    return nn.Identity()


def norm_of(shape: NormShape, kind: Norm | None = None) -> nn.Module:
    """A norm of `kind` (default: the model's, ``shape.kind``) with the model's eps, bias and affine
    settings."""
    return make_norm(shape.kind if kind is None else kind, shape.d_model, shape.eps, shape.bias, shape.affine,
                     shape.eps_outside)
