"""A block's attention (Simplifying Transformer Blocks' attention-matrix forms; Value Residual
Learning's and Bank of Values' values come from the value path):

    softmax:  A                            Eq. (2)
    skipinit: alpha I + beta A             Eq. (4), Value-SkipInit (He et al., 2023)
    shaped:   alpha I + beta A - gamma C   Eq. (5), shaped attention (Noci et al., 2023)

with A = softmax(s q.k / sqrt(d_h)) under the causal (and sliding-window) mask, C the uniform causal
matrix, and head-wise alpha_h, beta_h, gamma_h (Eq. 13) when `headwise_gains` is set.

One forward pass (`Attention.forward`): Q and K heads (`queries_keys`; a CLA follower takes its
group's keys from the carry) -> the value path gives V (and another layer's keys and values, an output
offset) as data -> every key and value the queries may see (`visible`: with a KV cache, the cache
stores what this layer keeps and returns them; in a padded batch, which keys are real) -> `attend`
runs the attention through `blocklab.model.ops` -> the projection W^O.

Each projection runs on its own here, and shaped attention mixes its terms with plain ops
(`ops.plain_mix`): this is the reference; blocklab.runtime swaps the fast versions into a built model.

The attention owns its rules (`check_attention`): its sizes (read resolved through
`ModelConfig.attention_shape`), its biases, its logit scale and its sliding windows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.model import ops
from blocklab.model.carry import Carry
from blocklab.model.gains import Gain
from blocklab.model.linear_maps import make_proj_map
from blocklab.model.positions import rotary
from blocklab.model.value_paths import make_value_path
from blocklab.model.value_paths.base import LayerValues, carried

if TYPE_CHECKING:
    from blocklab.model.fields import ModelFields


def check_attention(cfg: ModelFields) -> None:
    """The attention's rules on the config (a ConfigError naming the field and what is allowed)."""
    if cfg.qk_bias and cfg.bias:
        cfg.fail("qk_bias", cfg.qk_bias, "it gives Q and K alone a bias, and bias=True already gives every "
                 "linear map one; set one of the two.")
    if cfg.head_dim is None and cfg.d_model % cfg.n_heads:
        cfg.fail("d_model", cfg.d_model, f"it must be divisible by n_heads={cfg.n_heads} (or set head_dim "
                 "explicitly).")
    kv_heads = cfg.attention_shape.n_kv_heads
    if kv_heads > cfg.n_heads or cfg.n_heads % kv_heads:
        cfg.fail("n_kv_heads", cfg.n_kv_heads, f"it must divide n_heads={cfg.n_heads} (grouped-query "
                 "attention).")
    if cfg.attn_logit_scale <= 0:
        cfg.fail("attn_logit_scale", cfg.attn_logit_scale, "it must be > 0 (1 is the usual 1/sqrt(d_h)).")
    _check_windows(cfg)


def _check_windows(cfg: ModelFields) -> None:
    """Sliding windows: the pattern, and a window size exactly when some layer uses it."""
    if not cfg.window_pattern or set(cfg.window_pattern) - {"S", "L"}:
        cfg.fail("window_pattern", cfg.window_pattern,
                 "use a non-empty string of 'S' (sliding window) and 'L' (full context), e.g. 'SSSL'.")
    if "S" in cfg.window_pattern and cfg.window_size is None:
        cfg.fail("window_size", None,
                 f"window_pattern={cfg.window_pattern!r} has 'S' layers; set window_size.")
    if cfg.window_size is not None and "S" not in cfg.window_pattern:
        cfg.fail("window_size", cfg.window_size, f"no layer would use it: window_pattern="
                 f"{cfg.window_pattern!r} has no 'S' (sliding-window) layers; set a pattern such as 'SSSL', "
                 "or window_size=None.")
    if cfg.window_size is not None and cfg.window_size > cfg.context_length:
        cfg.fail("window_size", cfg.window_size,
                 f"a window cannot be larger than the context (context_length={cfg.context_length}).")


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
            x = rotary(x, positions, self.rope_base)
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


