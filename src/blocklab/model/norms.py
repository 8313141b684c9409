"""Normalisation layers: LayerNorm, RMSNorm or none."""

from __future__ import annotations

from torch import nn


def make_norm(kind: str, dim: int, eps: float, bias: bool = False) -> nn.Module:
    """LayerNorm / RMSNorm with a learnable scale, or an identity for ``"none"``."""
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps)
    return nn.Identity()
