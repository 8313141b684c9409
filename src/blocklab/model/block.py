"""One Transformer block, top to bottom: its layout with skip and branch gains, its attention, its MLP.

Block layouts (Simplifying Transformer Blocks), one class each, whose `forward` is the equation:

    pre-ln:   X' = a_SA X + b_SA MHA(N1(X));   out = a_FF X' + b_FF MLP(N2(X'))     Eq. (1)   PreLNBlock
    post-ln:  X' = N1(a_SA X + b_SA MHA(X));   out = N2(a_FF X' + b_FF MLP(X'))     Vaswani   PostLNBlock
    parallel: out = a_comb X + b_FF MLP(N1(X)) + b_SA MHA(N1(X))                   Eq. (7)   ParallelBlock

A skip whose gain is 0 is absent (SAS removes the attention skip, SAS-P both). In the parallel
layout a_comb is `mlp_skip_gain`.

The attention (model/attention.py: its matrix forms, Eqs. 2, 4, 5, and its value path) and the MLP
(model/mlp.py) are their own modules, each with its rules; a layout owns its own (`Block.check`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from torch import Tensor, nn

from blocklab.model.attention import Attention
from blocklab.model.carry import Carry
from blocklab.model.gains import Gain
from blocklab.model.mlp import MLP
from blocklab.model.norms import norm_of
from blocklab.model.trunk import ResidualScalars
from blocklab.util.errors import ConfigError

if TYPE_CHECKING:
    from blocklab.model.fields import ModelFields


def _skip(init: float, trainable: bool) -> Gain | None:
    return Gain(init, trainable) if init != 0 else None


class Block(nn.Module):
    """What every layout has: its norms, the attention and the MLP, skips and branch gains. A layout is a
    subclass whose `forward` is its equation (`BLOCK_LAYOUTS`); `make_block` builds the config's."""

    layout: ClassVar[str]
    has_second_norm: ClassVar[bool] = True  # N2 before the MLP (pre-ln) or after it (post-ln)
    norm2: nn.Module  # a layout with `has_second_norm` only

    @classmethod
    def check(cls, cfg: ModelFields) -> None:
        """The layout's own rules on the config's other fields (a ConfigError naming the field); none here."""

    def __init__(self, cfg: ModelFields, layer: int):
        super().__init__()
        has_norm = cfg.norm_layers == "all" or layer == 0
        norm = cfg.norm if has_norm else "none"
        trainable = cfg.trainable_block_gains
        self.norm1 = norm_of(cfg.norm_shape, norm)
        if self.has_second_norm:
            self.norm2 = norm_of(cfg.norm_shape, norm if cfg.norm_layers == "all" else "none")
        self.attn = Attention(cfg, layer)
        self.mlp = MLP(cfg.mlp_shape)
        self.attn_skip = _skip(cfg.attn_skip_gain, trainable)
        self.attn_branch = Gain(cfg.attn_branch_gain, trainable)
        self.mlp_skip = _skip(cfg.mlp_skip_gain, trainable)
        self.mlp_branch = Gain(cfg.mlp_branch_gain, trainable)
        self.dropout = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity()
        self.residual = ResidualScalars(layer, cfg.n_layers) if cfg.residual_scalars else None

    def mix_x0(self, x: Tensor, carry: Carry) -> Tensor:
        """nanochat's residual scalars, x <- lambda_r x + lambda_0 x0, when the config has them."""
        return x if self.residual is None else self.residual(x, carry.x0)


class PreLNBlock(Block):
    """X' = a_SA X + b_SA MHA(N1(X));   out = a_FF X' + b_FF MLP(N2(X'))      Simplifying Eq. (1)"""

    layout = "pre-ln"

    def forward(self, x: Tensor, carry: Carry) -> tuple[Tensor, Carry]:
        x = self.mix_x0(x, carry)
        a, carry = self.attn(self.norm1(x), carry)
        h = add_skip(self.attn_branch(self.dropout(a)), self.attn_skip, x)
        m = self.mlp_branch(self.dropout(self.mlp(self.norm2(h))))
        return add_skip(m, self.mlp_skip, h), carry


class PostLNBlock(Block):
    """X' = N1(a_SA X + b_SA MHA(X));   out = N2(a_FF X' + b_FF MLP(X'))      Vaswani et al. (2017)"""

    layout = "post-ln"

    @classmethod
    def check(cls, cfg: ModelFields) -> None:
        if cfg.norm == "none":
            cfg.fail("norm", cfg.norm, "a post-LN block needs a norm ('layernorm' or 'rmsnorm').")

    def forward(self, x: Tensor, carry: Carry) -> tuple[Tensor, Carry]:
        x = self.mix_x0(x, carry)
        a, carry = self.attn(x, carry)
        h = self.norm1(add_skip(self.attn_branch(self.dropout(a)), self.attn_skip, x))
        m = self.mlp_branch(self.dropout(self.mlp(h)))
        return self.norm2(add_skip(m, self.mlp_skip, h)), carry


class ParallelBlock(Block):
    """out = a_comb X + b_FF MLP(N1(X)) + b_SA MHA(N1(X))      Simplifying Eq. (7); a_comb is the MLP skip."""

    layout = "parallel"
    has_second_norm = False

    @classmethod
    def check(cls, cfg: ModelFields) -> None:
        if cfg.attn_skip_gain != 0:
            cfg.fail("attn_skip_gain", cfg.attn_skip_gain, "a parallel block has a single skip, alpha_comb = "
                     "mlp_skip_gain (Eq. 7); set attn_skip_gain=0.")

    def forward(self, x: Tensor, carry: Carry) -> tuple[Tensor, Carry]:
        x = self.mix_x0(x, carry)
        h = self.norm1(x)
        a, carry = self.attn(h, carry)
        m = self.mlp(h)
        out = self.mlp_branch(self.dropout(m)) + self.attn_branch(self.dropout(a))
        return add_skip(out, self.mlp_skip, x), carry


# the block layouts by their `block_layout` name; a new layout is a subclass of `Block` and an entry here
BLOCK_LAYOUTS: dict[str, type[Block]] = {cls.layout: cls for cls in (PreLNBlock, PostLNBlock, ParallelBlock)}


def make_block(cfg: ModelFields, layer: int) -> Block:
    """Block `layer` of the layout `cfg.block_layout`."""
    return BLOCK_LAYOUTS[cfg.block_layout](cfg, layer)


def check_block_layout(cfg: ModelFields) -> None:
    """The layout is one of `BLOCK_LAYOUTS`, and the config keeps its rules (`Block.check`): what
    `ModelConfig` checks of the block on construction."""
    if cfg.block_layout not in BLOCK_LAYOUTS:
        raise ConfigError(f"block_layout = {cfg.block_layout!r} is not allowed: choose one of "
                          f"{', '.join(map(repr, BLOCK_LAYOUTS))}.")
    BLOCK_LAYOUTS[cfg.block_layout].check(cfg)


def add_skip(branch: Tensor, skip: Gain | None, x: Tensor) -> Tensor:
    """branch + skip(x); a skip whose gain is 0 is absent (None)."""
    return branch if skip is None else branch + skip(x)
