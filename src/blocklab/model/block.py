"""One Transformer block, top to bottom: its layout with skip and branch gains, its attention, its MLP.

Block layouts (Simplifying Transformer Blocks), one class each, whose `forward` is the equation:

    pre-ln:   X' = a_SA X + b_SA MHA(N1(X));   out = a_FF X' + b_FF MLP(N2(X'))     Eq. (1)   PreLNBlock
    post-ln:  X' = N1(a_SA X + b_SA MHA(X));   out = N2(a_FF X' + b_FF MLP(X'))     Vaswani   PostLNBlock
    parallel: out = a_comb X + b_FF MLP(N1(X)) + b_SA MHA(N1(X))                   Eq. (7)   ParallelBlock

A skip whose gain is 0 is absent (SAS removes the attention skip, SAS-P both). In the parallel
layout a_comb is `mlp_skip_gain`.

Attention (`Attention`): Q/K projections, a value path, an attention-matrix form, a projection.
Attention-matrix forms (Simplifying Transformer Blocks):
    softmax:  A                       Eq. (2)
    skipinit: alpha I + beta A        Eq. (4), Value-SkipInit (He et al., 2023)
    shaped:   alpha I + beta A - gamma C   Eq. (5), shaped attention (Noci et al., 2023)
with head-wise alpha_h, beta_h, gamma_h (Eq. 13) when `headwise_gains` is set.

One forward pass (`Attention.forward`): Q and K heads (`queries_keys`; a CLA follower takes its
group's keys from the carry) -> the value path gives V (and another layer's keys and values, an output
offset) as data -> every key and value the queries may see (`visible`: with a KV cache, the cache
stores what this layer keeps and returns them; in a padded batch, which keys are real) -> `attend`
runs the attention through `blocklab.model.ops` -> the projection W^O.

MLP (`MLP`): d -> hidden -> d with one of the usual activations, or a gated one.

Each projection runs on its own here (x W_Q, x W_K, x W^V in the value path, x W_fc in the MLP), and
shaped attention mixes its terms with plain ops (`ops.plain_mix`): this is the reference. The fast
versions are applied to a built model from outside (blocklab.runtime: `fused_projections` runs the
maps that read one input as one GEMM, `shaped_mix` swaps in a fused kernel for the mix).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.model import ops
from blocklab.model.carry import Carry
from blocklab.model.gains import Gain
from blocklab.model.linear_maps import make_proj_map
from blocklab.model.norms import norm_of
from blocklab.model.trunk import ResidualScalars
from blocklab.model.value_paths import make_value_path
from blocklab.model.value_paths.base import LayerValues, carried
from blocklab.util.errors import ConfigError

if TYPE_CHECKING:
    from blocklab.model.fields import MLPShape, ModelFields


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


# ----------------------------------------------------------------------------------------------
Gains = tuple[Tensor | float, Tensor | float, Tensor | float | None]  # alpha, beta, gamma (shaped only)
# what a layer's queries may see: keys, values (heads), another layer's keys and values, the running sum
# of earlier values, which keys are real (padding)
Visible = tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None, Tensor | None, Tensor | None]


class Attention(nn.Module):
    """One attention layer; `forward` in the paper's order: queries and keys, the value path's values,
    every key and value the queries may see (the current tokens', or the KV cache's), the attention
    matrix's form applied to them, the projection W^O."""

    def __init__(self, cfg: ModelFields, layer: int):
        super().__init__()
        self.layer = layer
        shape = cfg.attention_shape
        self.n_heads, self.n_kv_heads, self.head_dim = shape.n_heads, shape.n_kv_heads, shape.head_dim
        self.causal, self.window = cfg.causal, cfg.layer_window(layer)
        self.rope_base = cfg.rope_base if cfg.positions == "rope" else None
        self.qk_norm, self.form = cfg.qk_norm, cfg.attn_matrix
        self.logit_scale = cfg.attn_logit_scale  # s in softmax(s q.k / sqrt(d_h)); on q (nanochat: 1.2^2)
        self.explicit = False  # True: build the T x T matrix (diagnostics); False: fused kernels
        # beta A V + alpha V - gamma C V from A V and V (Eqs. 4, 5): the reference `ops.plain_mix`, for
        # which runtime/shaped_mix.py swaps in a fused kernel on a built model
        self.shaped_mix: ops.Mix = ops.plain_mix
        self.values = make_value_path(cfg, layer)
        self.heads = Heads()
        qk_bias = cfg.bias or cfg.qk_bias  # Simplifying's code: biases on Q and K only
        self.q = nn.Linear(shape.d_model, shape.q_dim, bias=qk_bias)
        self.k = nn.Linear(shape.d_model, shape.kv_dim, bias=qk_bias) if self.values.owns_keys else None
        self.proj = make_proj_map(cfg)
        # identity values (SAS, SAS-P) are the block's input itself: attention reads them as a contiguous
        # (B, H, T, D) copy, so that no compiler writes the norm's output into the transposed layout of
        # `ops.split_heads` (inductor's Triton code generation fails on that buffer)
        self.contiguous_values = isinstance(getattr(self.values, "w_v", None), nn.Identity)
        if self.form != "softmax":
            heads = cfg.n_heads if cfg.headwise_gains else 1
            trainable = cfg.trainable_attn_gains
            self.alpha = Gain(cfg.attn_alpha, trainable, heads)
            self.beta = Gain(cfg.attn_beta, trainable, heads)
            self.gamma = Gain(cfg.attn_gamma, trainable, heads) if self.form == "shaped" else None

    def matrix_gains(self) -> Gains:
        gamma = self.gamma.value if self.gamma is not None else None
        return self.alpha.value, self.beta.value, gamma

    def attend(self, q: Tensor, k: Tensor, v: Tensor, other_kv: tuple[Tensor, Tensor] | None = None,
               past_sum: Tensor | None = None, valid: Tensor | None = None) -> Tensor:
        """This layer's attention over (B, H, T, D) heads; the queries are the last T_q positions.

        other_kv: keys and values of another layer attended alongside (cross-layer attention);
        past_sum: the cache's running sum of earlier values, for shaped attention's C V;
        valid: (B, T_k) False at the padding of a padded batch (`ops.padded_mask`): softmax attention
        masks it in SDPA, shaped attention builds its matrix, whose A and C see real keys only.
        """
        if other_kv is not None:
            return ops.cross_layer_attention(q, k, v, *other_kv, self.causal, self.window, valid)
        if self.explicit or (valid is not None and self.form != "softmax"):
            return self.attention_matrix(q, k, valid) @ ops.expand_kv(v, self.n_heads)
        if self.form == "softmax":
            return ops.attention(q, k, v, self.causal, self.window, valid=valid)
        return ops.shaped_attention(q, k, v, *self.matrix_gains(), self.causal, self.window,
                                    past_sum=past_sum, mix=self.shaped_mix)

    def attention_matrix(self, q: Tensor, k: Tensor, valid: Tensor | None = None) -> Tensor:
        """The full (B, H, T_q, T_k) matrix this layer applies to its values (`valid`: see `attend`)."""
        if self.form == "softmax":
            return ops.attention_probs(q, k, self.causal, self.window, valid=valid)
        return ops.shaped_attention_matrix(q, k, *self.matrix_gains(), self.causal, self.window,
                                           valid=valid)

    def _position(self, x: Tensor, positions: Tensor) -> Tensor:
        if self.qk_norm:
            x = F.rms_norm(x, (x.shape[-1],))
        if self.rope_base is not None:
            x = ops.rotary(x, positions, self.rope_base)
        return x

    def queries_keys(self, x: Tensor, carry: Carry) -> tuple[Tensor, Tensor, Carry]:
        """Q and K heads (B, H, T, D) after QK-norm and RoPE. A CLA follower (no W_K) takes its group's
        first layer's keys from the carry, and a layer whose keys others attend over puts them there;
        ResFormer's query or key residual changes them (`ValuePath.mix_heads`); `heads` shows them to
        forward hooks."""
        q = self._position(ops.split_heads(self.q(x), self.head_dim), carry.positions)
        if self.logit_scale != 1.0:  # after QK-norm, which would undo it
            q = q * self.logit_scale
        path = self.values
        if self.k is None:  # a CLA follower attends over its group's first layer's keys
            k = carried(carry.shared_keys)
        else:
            k = self._position(ops.split_heads(self.k(x), self.head_dim), carry.positions)
            if path.shares_keys:
                carry = carry.update(shared_keys=k)
        if path.mixes_heads:
            q, k, carry = path.mix_heads(q, k, carry)
        q, k = self.heads(q, k, carry.key_valid)
        return q, k, carry

    def visible(self, k: Tensor, out: LayerValues, carry: Carry) -> Visible:
        """Every key and value (heads) the queries may see: the current tokens' own, or while decoding
        the cached past and the current tokens, after the cache stored what this layer keeps; with
        the keys and values of another layer it attends over, shaped attention's running sum of
        earlier values (only from a cache) and, in a padded batch, which of the keys are real (the
        last T_k columns of `key_valid`: the keys are the last T_k positions)."""
        cache = carry.cache
        if cache is None:
            keys, values = k, ops.split_heads(out.v, self.head_dim)
            if self.contiguous_values:
                values = values.contiguous()
            other_kv, past_sum = out.other_kv, None
        else:
            seen = cache.update(self.layer, k, out.v)
            keys, other_kv, past_sum = seen.keys, seen.other_kv, seen.value_sum
            values = ops.split_heads(self.values.values_from_cache(seen.value_source, carry), self.head_dim)
        valid = carry.key_valid
        if valid is not None:
            valid = valid[:, valid.shape[1] - keys.shape[-2]:]
        return keys, values, other_kv, past_sum, valid

    def forward(self, x: Tensor, carry: Carry) -> tuple[Tensor, Carry]:
        """MHA(x) for the current tokens x (B, T, d), and the carry for later layers."""
        q, k, carry = self.queries_keys(x, carry)
        out, carry = self.values(x, carry)  # V of the current tokens (another layer's K and V, an offset)
        y = self.attend(q, *self.visible(k, out, carry))
        if out.offset is not None:  # an output correction (NeuTRENO)
            y = y + ops.expand_kv(ops.split_heads(out.offset, self.head_dim), self.n_heads)
        return self.proj(ops.merge_heads(y)), carry


class Heads(nn.Module):
    """The queries and keys a layer attends with, passed through unchanged: as a module, so that a
    forward hook sees them (diagnostics, HF's ``output_attentions``) with the padding mask."""

    def forward(self, q: Tensor, k: Tensor, key_valid: Tensor | None) -> tuple[Tensor, Tensor]:  # noqa: ARG002
        return q, k


# ----------------------------------------------------------------------------------------------
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
