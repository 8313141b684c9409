"""Normalisation layers: LayerNorm, RMSNorm or none."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    from blocklab.config import ModelConfig


def make_norm(kind: str, dim: int, eps: float | None, bias: bool = False, affine: bool = True) -> nn.Module:
    """LayerNorm / RMSNorm, or an identity for ``"none"``.

    affine=False drops the learnable scale (and shift): nanochat's parameter-free RMSNorm. eps=None
    is the dtype's machine epsilon (torch's RMSNorm default, which nanochat uses).
    """
    if kind == "layernorm":
        assert eps is not None, "validation gives LayerNorm a number"
        return nn.LayerNorm(dim, eps=eps, elementwise_affine=affine, bias=bias and affine)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps, elementwise_affine=affine)
    return nn.Identity()


def norm_of(cfg: ModelConfig, kind: str | None = None) -> nn.Module:
    """A norm of `kind` (default: ``cfg.norm``) with the model's eps, bias and affine settings."""
    return make_norm(cfg.norm if kind is None else kind, cfg.d_model, cfg.norm_eps, cfg.bias, cfg.norm_affine)
