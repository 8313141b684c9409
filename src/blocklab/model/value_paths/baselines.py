"""The baselines of Value Residual Learning: NeuTRENO, DenseFormer, CLA and cross-layer attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from blocklab import ops
from blocklab.config import ConfigError
from blocklab.model.gains import Gain
from blocklab.model.value_paths.base import ValuePath, resolve_options


def _heads(v: Tensor, head_dim: int) -> Tensor:
    b, t, _ = v.shape
    return v.view(b, t, -1, head_dim).transpose(1, 2)


class NeuTRENO(ValuePath):
    """U_n = (A_n - lambda I) V_n + lambda V_1 for n >= 2 (Nguyen et al. 2023; Value Residual Eq. 8).

    A token-wise correction lambda (V_1 - V_n) added to the attention output of each head.
    """

    description = "NeuTRENO: U_n = (A_n - lambda I) V_n + lambda V_1, lambda = 0.4"
    options = dict(lambda_=0.4)

    def __init__(self, cfg, layer: int):
        super().__init__(cfg, layer)
        self.w_v = self.make_value_map(cfg, layer)
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_size

    def forward(self, x, q, k, carry):
        v = self.w_v(x)
        if self.layer == 0:
            carry = carry.update(first_values=v)
        return q, k, v, carry

    def correct(self, y, v, carry):
        if self.layer == 0:
            return y
        delta = _heads(carry.first_values - v, self.head_dim)
        t = y.shape[-2]
        return y + self.opts["lambda_"] * ops.expand_kv(delta, self.n_heads)[..., -t:, :]


class DenseFormer(ValuePath):
    """Depth-weighted averaging (Pagliardini et al. 2024): after block i, when (i+1) % period == 0,

        x <- sum_j alpha_{i,j} X_j   over j in {0 .. i+1} with j = (i+1) mod dilation,

    where X_0 is the input of the first block and X_{j} the raw output of block j-1. The weights
    start at 1 on the current output and 0 elsewhere, so at initialisation it is the identity.
    """

    description = "DenseFormer: depth-weighted averaging of block outputs, identity at init"
    options = dict(dilation=1, period=1)

    def __init__(self, cfg, layer: int):
        super().__init__(cfg, layer)
        self.w_v = self.make_value_map(cfg, layer)
        d, p = self.opts["dilation"], self.opts["period"]
        self.averages = (layer + 1) % p == 0
        self.sources = [j for j in range(layer + 2) if j % d == (layer + 1) % d]
        if self.averages:
            self.dwa = Gain([0.0] * (len(self.sources) - 1) + [1.0], trainable=True)

    def forward(self, x, q, k, carry):
        return q, k, self.w_v(x), carry

    def after_block(self, x, carry):
        history = (*(carry.history or (carry.x0,)), x)
        carry = carry.update(history=history)
        if self.averages:
            x = sum(w * history[j] for w, j in zip(self.dwa.gain, self.sources, strict=True))
        return x, carry

    @classmethod
    def validate(cls, cfg) -> None:
        o = resolve_options(cls, cfg)
        for name in ("dilation", "period"):
            if not (isinstance(o[name], int) and o[name] >= 1):
                raise ConfigError(f"value_path_options[{name!r}] = {o[name]!r} is not allowed: "
                                  "it must be a positive integer.")


class CrossLayerKV(ValuePath):
    """CLA (Brandon et al. 2024): layers in consecutive groups of `group` share one K and V.

    The first layer of each group owns W_K and W_V; the others have only W_Q and W_O and reuse
    its keys (after RoPE) and values.
    """

    description = "CLA: K and V shared by consecutive groups of k layers (default 2)"
    options = dict(group=2)

    def __init__(self, cfg, layer: int):
        super().__init__(cfg, layer)
        self.leader = self.has_value_map(cfg, layer)
        self.owns_keys = self.caches_values = self.leader
        self.key_layer = self.value_layer = layer - layer % self.opts["group"]  # one cache entry per group
        self.w_v = self.make_value_map(cfg, layer) if self.leader else None

    def forward(self, x, q, k, carry):
        if self.leader:
            v = self.w_v(x)
            return q, k, v, carry.update(shared_kv=(k, v))
        k, v = carry.shared_kv
        return q, k, v, carry

    @classmethod
    def validate(cls, cfg) -> None:
        group = resolve_options(cls, cfg)["group"]
        if not (isinstance(group, int) and 2 <= group <= cfg.n_layers):
            raise ConfigError(f"value_path_options['group'] = {group!r} is not allowed: a CLA group "
                              f"holds 2 to n_layers={cfg.n_layers} layers.")

    @classmethod
    def has_value_map(cls, cfg, layer: int) -> bool:
        return layer % resolve_options(cls, cfg)["group"] == 0  # the group's leader


class CrossLayerAttention(ValuePath):
    """The exact cross-layer attention of Value Residual Learning Eq. (2), kept as a reference:

        U_n = softmax(Q_n [K_n; K_m]^T / sqrt(d)) [V_n; V_m],   m = the first layer,

    each half under the same mask. It costs about twice the attention of Eq. (1).
    """

    description = "cross-layer attention (Eq. 2): attend over the concatenated K, V of layer 1"

    def __init__(self, cfg, layer: int):
        super().__init__(cfg, layer)
        self.w_v = self.make_value_map(cfg, layer)
        self.head_dim = cfg.head_size
        self.key_sets = 1 if layer == 0 else 2
        self.reads_layers = () if layer == 0 else (0,)

    def forward(self, x, q, k, carry):
        v = self.w_v(x)
        if self.layer == 0:
            carry = carry.update(first_keys=k, first_values=v)
        return q, k, v, carry

    def attend(self, attn, q, k, v, carry):
        if self.layer == 0:
            return attn.attend(q, k, v, carry.cache)
        if carry.cache is None:
            first_k, first_v = carry.first_keys, _heads(carry.first_values, self.head_dim)
        else:  # layer 0's cached keys and values at the positions this layer sees
            first_k, first_v = carry.cache.read_layer(0, k.shape[-2])
        keys = torch.cat((k, first_k), dim=-2)
        values = torch.cat((v, first_v), dim=-2)
        t_q, t_k = q.shape[-2], k.shape[-2]
        mask = ops.attention_mask(t_q, t_k, attn.causal, attn.window, q.device)
        if mask is not None:
            mask = torch.cat((mask, mask), dim=-1)
        gqa = keys.shape[-3] != q.shape[-3]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=gqa)

    @classmethod
    def validate(cls, cfg) -> None:
        if cfg.attn_matrix != "softmax":
            raise ConfigError(f"value_path='cross-layer-attn' needs attn_matrix='softmax' (got "
                              f"{cfg.attn_matrix!r}): Eq. (2) is defined for plain softmax attention.")
