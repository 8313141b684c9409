"""The attention sub-block: Q/K projections, a value path, an attention-matrix form, a projection.

Attention-matrix forms (Simplifying Transformer Blocks):
    softmax:  A                       Eq. (2)
    skipinit: alpha I + beta A        Eq. (4), Value-SkipInit (He et al., 2023)
    shaped:   alpha I + beta A - gamma C   Eq. (5), shaped attention (Noci et al., 2023)
with head-wise alpha_h, beta_h, gamma_h (Eq. 13) when `headwise_gains` is set.

One forward pass: Q and K heads -> the value path gives V (and any change to Q, K, another layer's
keys and values, an output offset) as data -> with a KV cache, the cache stores what this layer
keeps and returns every visible key and value -> `attend` runs the attention through `blocklab.ops`
-> the projection W^O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.nn.functional as F
from torch import Tensor, nn

from blocklab import ops
from blocklab.model.carry import Carry
from blocklab.model.gains import Gain
from blocklab.model.linear_maps import make_proj_map
from blocklab.model.value_paths import make_value_path

if TYPE_CHECKING:
    from blocklab.model.config import ModelConfig

Gains = tuple[Tensor | float, Tensor | float, Tensor | float | None]  # alpha, beta, gamma (shaped only)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        shape = cfg.attention_shape
        self.n_heads, self.n_kv_heads, self.head_dim = shape.n_heads, shape.n_kv_heads, shape.head_dim
        self.causal, self.window = cfg.causal, cfg.layer_window(layer)
        self.rope_base = cfg.rope_base if cfg.positions == "rope" else None
        self.qk_norm, self.form = cfg.qk_norm, cfg.attn_matrix
        self.logit_scale = cfg.attn_logit_scale  # s in softmax(s q.k / sqrt(d_h)); on q (nanochat: 1.2^2)
        self.explicit = False  # True: build the T x T matrix (diagnostics); False: fused kernels
        self.values = make_value_path(cfg, layer)
        qk_bias = cfg.bias or cfg.qk_bias  # Simplifying's code: biases on Q and K only
        self.q = nn.Linear(shape.d_model, shape.q_dim, bias=qk_bias)
        self.k = nn.Linear(shape.d_model, shape.kv_dim, bias=qk_bias) if self.values.owns_keys else None
        self.proj = make_proj_map(cfg)
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
               past_sum: Tensor | None = None) -> Tensor:
        """This layer's attention over (B, H, T, D) heads; the queries are the last T_q positions.

        other_kv: keys and values of another layer attended alongside (cross-layer attention);
        past_sum: the cache's running sum of earlier values, for shaped attention's C V.
        """
        if other_kv is not None:
            return ops.cross_layer_attention(q, k, v, *other_kv, self.causal, self.window)
        if self.explicit:
            return self.attention_matrix(q, k) @ ops.expand_kv(v, self.n_heads)
        if self.form == "softmax":
            return ops.attention(q, k, v, self.causal, self.window)
        return ops.shaped_attention(q, k, v, *self.matrix_gains(), self.causal, self.window,
                                    past_sum=past_sum)

    def attention_matrix(self, q: Tensor, k: Tensor) -> Tensor:
        """The full (B, H, T_q, T_k) matrix this layer applies to its values."""
        if self.form == "softmax":
            return ops.attention_probs(q, k, self.causal, self.window)
        return ops.shaped_attention_matrix(q, k, *self.matrix_gains(), self.causal, self.window)

    def _position(self, x: Tensor, positions: Tensor) -> Tensor:
        if self.qk_norm:
            x = F.rms_norm(x, (x.shape[-1],))
        if self.rope_base is not None:
            x = ops.rotary(x, positions, self.rope_base)
        return x

    def queries_keys(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor | None]:
        """Q and K heads after QK-norm and RoPE; K is None when the value path supplies it (CLA)."""
        plain = not self.qk_norm and self.rope_base is None  # nothing to apply: no calls per token
        q = ops.split_heads(self.q(x), self.head_dim)
        if not plain:
            q = self._position(q, positions)
        if self.logit_scale != 1.0:  # after QK-norm, which would undo it
            q = q * self.logit_scale
        k_map = self.k
        if k_map is None:
            return q, None
        k = ops.split_heads(k_map(x), self.head_dim)
        return q, k if plain else self._position(k, positions)

    def forward(self, x: Tensor, carry: Carry) -> tuple[Tensor, Carry]:
        q, k = self.queries_keys(x, carry.positions)
        path = self.values
        out, carry = path(x, q, k, carry)  # for the current tokens only
        cache = carry.cache
        if cache is None:
            keys, values = out.k, ops.split_heads(out.v, self.head_dim)
            other_kv, past_sum = out.other_kv, None
        else:  # the cached past and the current tokens: every key and value these queries may see
            seen = cache.update(self.layer, out.k, out.v)
            values = ops.split_heads(path.values_from_cache(seen.value_source, carry), self.head_dim)
            keys, other_kv, past_sum = seen.keys, seen.other_kv, seen.value_sum
        y = self.attend(out.q, keys, values, other_kv, past_sum)
        if out.offset is not None:
            y = y + ops.expand_kv(ops.split_heads(out.offset, self.head_dim), self.n_heads)
        return self.proj(ops.merge_heads(y)), carry
