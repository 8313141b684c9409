"""Normalisation layers: LayerNorm, RMSNorm or none, and their settings (`NormShape`) with its rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from blocklab.util.configbase import field_error

Norm = Literal["layernorm", "rmsnorm", "none"]
RMSNormEps = Literal["inside", "outside"]  # inside: x / sqrt(ms + eps) (torch); outside: x / (sqrt(ms) + eps)


@dataclass(frozen=True)
class NormShape:
    """The settings every norm of the model shares (`ModelConfig.norm_shape`); where a norm sits
    and whether a layer keeps it is the block's and the Transformer's to say."""

    kind: Norm
    d_model: int
    eps: float | None  # None: the dtype's machine epsilon (RMSNorm only)
    eps_outside: bool  # RMSNorm with eps outside the root (the Simplifying code)
    bias: bool
    affine: bool  # a learnable scale (and shift)

    def check(self) -> None:
        """The norm's rules, each error named by the `ModelConfig` field it comes from."""
        if self.eps_outside and (self.kind != "rmsnorm" or self.eps is None):
            raise field_error("ModelConfig", "rmsnorm_eps", "outside", "eps outside the root applies to "
                              "norm='rmsnorm' with a numeric norm_eps.")
        if self.eps is None and self.kind == "layernorm":
            raise field_error("ModelConfig", "norm_eps", None, "None (the dtype's epsilon) is for RMSNorm; "
                              "LayerNorm needs a number such as 1e-5.")
        if self.eps is not None and self.eps <= 0:
            raise field_error("ModelConfig", "norm_eps", self.eps, "it must be > 0 (or None for RMSNorm: the "
                              "dtype's epsilon).")


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
