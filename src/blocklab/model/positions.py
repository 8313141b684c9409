"""Where a token sits, told to the model one of four ways (`ModelConfig.positions`):

    learned:     x = E[token] + P[position]         a trained table P (`Transformer.pos_emb`)
    sinusoidal:  x = E[token] + PE(position),       PE(p)_i = sin(p w_i), PE(p)_{i + d/2} = cos(p w_i)
                                                    w_i = 10000^(-i / (d/2))          Vaswani et al. (2017)
    rope:        q, k <- R(p) q, R(p) k             rotations of the half-split pairs (x_i, x_{i+D/2})
                                                    by p theta_i, theta_i = base^(-i/(D/2))  Su et al. (2021)
    none:        nothing (a causal model can still infer positions)

The positions own their config, `PositionShape` (`ModelConfig.position_shape`), with its rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from blocklab.util.configbase import field_error

Positions = Literal["learned", "sinusoidal", "rope", "none"]


@dataclass(frozen=True)
class PositionShape:
    """The kind of positions and the sizes it acts on, resolved (`ModelConfig.position_shape`)."""

    kind: Positions
    d_model: int  # what learned and sinusoidal positions are added to
    head_dim: int  # what rotary positions rotate
    rope_base: float

    def check(self) -> None:
        """The sizes each kind needs, and a usable rotary base (a ConfigError naming the field)."""
        if self.kind == "rope" and self.head_dim % 2:
            raise field_error("ModelConfig", "head_dim", self.head_dim, "rotary positions need an even head "
                              "size.")
        if self.kind == "sinusoidal" and self.d_model % 2:
            raise field_error("ModelConfig", "d_model", self.d_model, "sinusoidal positions need an even "
                              "d_model.")
        if self.rope_base <= 0:
            raise field_error("ModelConfig", "rope_base", self.rope_base, "the rotary base must be > 0 "
                              "(10000 is usual).")


def _angles(positions: Tensor, half: int, base: float, dtype: torch.dtype) -> Tensor:
    """position * base^(-i/half) for i < half, in `dtype` (at least float32: positions reach 1e5);
    positions (T,) or (B, T) give (T, half) or (B, T, half)."""
    inv_freq = base ** (-torch.arange(half, device=positions.device, dtype=dtype) / half)
    return positions.to(dtype)[..., None] * inv_freq


def rotary(x: Tensor, positions: Tensor, base: float = 10000.0) -> Tensor:
    """Rotary position embedding (Su et al., 2021) on the last dim of x (B, H, T, D), half-split;
    `positions` (T,), or (B, T) where each row has its own (a padded batch)."""
    half = x.shape[-1] // 2
    angles = _angles(positions, half, base, torch.promote_types(x.dtype, torch.float32))
    if angles.dim() == 3:  # per row: broadcast over the heads
        angles = angles[:, None]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def sinusoidal_positions(positions: Tensor, dim: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Fixed sine/cosine position encodings (Vaswani et al., 2017), shape (T, dim) (or (B, T, dim))."""
    angles = _angles(positions, dim // 2, 10000.0, torch.promote_types(dtype, torch.float32))
    return torch.cat((angles.sin(), angles.cos()), dim=-1).to(dtype)
