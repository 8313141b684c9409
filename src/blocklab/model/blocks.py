"""Block layouts with skip and branch gains (Simplifying Transformer Blocks).

    pre-ln:   X' = a_SA X + b_SA MHA(N1(X));   out = a_FF X' + b_FF MLP(N2(X'))     Eq. (1)
    post-ln:  X' = N1(a_SA X + b_SA MHA(X));   out = N2(a_FF X' + b_FF MLP(X'))     Vaswani et al.
    parallel: out = a_comb X + b_FF MLP(N1(X)) + b_SA MHA(N1(X))                   Eq. (7)

A skip whose gain is 0 is absent (SAS removes the attention skip, SAS-P both). In the parallel
layout a_comb is `mlp_skip_gain`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor, nn

from blocklab.model.attention import Attention
from blocklab.model.carry import Carry
from blocklab.model.gains import Gain
from blocklab.model.mlp import MLP
from blocklab.model.norms import norm_of
from blocklab.model.trunk import ResidualScalars

if TYPE_CHECKING:
    from blocklab.model.config import ModelConfig


def _skip(init: float, trainable: bool) -> Gain | None:
    return Gain(init, trainable) if init != 0 else None


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layout = cfg.block_layout
        has_norm = cfg.norm_layers == "all" or layer == 0
        norm = cfg.norm if has_norm else "none"
        trainable = cfg.trainable_block_gains
        self.norm1 = norm_of(cfg.norm_shape, norm)
        second = norm if cfg.norm_layers == "all" else "none"
        self.norm2 = norm_of(cfg.norm_shape, second) if self.layout != "parallel" else None
        self.attn = Attention(cfg, layer)
        self.mlp = MLP(cfg.mlp_shape)
        self.attn_skip = _skip(cfg.attn_skip_gain, trainable)
        self.attn_branch = Gain(cfg.attn_branch_gain, trainable)
        self.mlp_skip = _skip(cfg.mlp_skip_gain, trainable)
        self.mlp_branch = Gain(cfg.mlp_branch_gain, trainable)
        self.dropout = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity()
        self.residual = ResidualScalars(layer, cfg.n_layers) if cfg.residual_scalars else None

    def forward(self, x: Tensor, carry: Carry) -> tuple[Tensor, Carry]:
        if self.residual is not None:  # nanochat: x <- lambda_r x + lambda_0 x0
            x = self.residual(x, carry.x0)
        if self.layout == "parallel":  # Eq. (7)
            h = self.norm1(x)
            a, carry = self.attn(h, carry)
            out = self.mlp_branch(self.dropout(self.mlp(h))) + self.attn_branch(self.dropout(a))
            return _add_skip(out, self.mlp_skip, x), carry
        norm2 = self.norm2
        assert norm2 is not None  # every layout but parallel has a second norm
        if self.layout == "pre-ln":  # Eq. (1)
            a, carry = self.attn(self.norm1(x), carry)
            h = _add_skip(self.attn_branch(self.dropout(a)), self.attn_skip, x)
            m = self.mlp_branch(self.dropout(self.mlp(norm2(h))))
            return _add_skip(m, self.mlp_skip, h), carry
        a, carry = self.attn(x, carry)  # post-ln
        h = self.norm1(_add_skip(self.attn_branch(self.dropout(a)), self.attn_skip, x))
        m = self.mlp_branch(self.dropout(self.mlp(h)))
        return norm2(_add_skip(m, self.mlp_skip, h)), carry


def _add_skip(branch: Tensor, skip: Gain | None, x: Tensor) -> Tensor:
    """branch + skip(x); a skip whose gain is 0 is absent (None)."""
    return branch if skip is None else branch + skip(x)
