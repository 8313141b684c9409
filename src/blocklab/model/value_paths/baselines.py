"""The baselines of Value Residual Learning: NeuTRENO, DenseFormer, CLA and cross-layer attention."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor, nn

from blocklab import ops
from blocklab.errors import ConfigError
from blocklab.model.carry import Carry
from blocklab.model.gains import Gain
from blocklab.model.value_paths.base import (
    LayerValues,
    SharedModule,
    ValuePath,
    ValuePathOptions,
    carried,
    resolve_options,
)

if TYPE_CHECKING:
    from blocklab.model.fields import ModelFields


@dataclass(frozen=True)
class NeuTRENOOptions(ValuePathOptions):
    lambda_: float = 0.4
    """lambda, the weight of the correction lambda (V_1 - V_n)."""


class NeuTRENO(ValuePath):
    """U_n = (A_n - lambda I) V_n + lambda V_1 for n >= 2 (Nguyen et al. 2023; Value Residual Eq. 8).

    A token-wise correction lambda (V_1 - V_n) added to the attention output of each head.
    """

    description = "NeuTRENO: U_n = (A_n - lambda I) V_n + lambda V_1, lambda = 0.4"
    fuses_values = True
    options: ClassVar[type[NeuTRENOOptions]] = NeuTRENOOptions
    opts: NeuTRENOOptions

    def __init__(self, cfg: ModelFields, layer: int):
        super().__init__(cfg, layer)
        self.w_v = self.make_value_map(cfg, layer)

    def forward(self, x: Tensor, q: Tensor, k: Tensor | None, carry: Carry,
                projected: Tensor | None = None) -> tuple[LayerValues, Carry]:
        assert k is not None
        v = self.value_projection(x, projected)
        if self.layer == 0:
            return LayerValues(q, k, v), carry.update(first_values=v)
        offset = self.opts.lambda_ * (carried(carry.first_values) - v)
        return LayerValues(q, k, v, offset=offset), carry


@dataclass(frozen=True)
class DenseFormerOptions(ValuePathOptions):
    dilation: int = 1
    """average the outputs j with j = (i + 1) mod dilation."""
    period: int = 1
    """average after every period-th block."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("dilation", "period"):
            if getattr(self, name) < 1:
                raise ConfigError(f"value_path_options[{name!r}] = {getattr(self, name)!r} is not allowed: "
                                  "it must be a positive integer.")


class DenseFormer(ValuePath):
    """Depth-weighted averaging (Pagliardini et al. 2024): after block i, when (i+1) % period == 0,

        x <- sum_j alpha_{i,j} X_j   over j in {0 .. i+1} with j = (i+1) mod dilation,

    where X_0 is the input of the first block and X_{j} the raw output of block j-1. The weights
    start at 1 on the current output and 0 elsewhere, so at initialisation it is the identity.
    The values are the standard ones; the weights live in the model-level `DepthWeights`.
    """

    description = "DenseFormer: depth-weighted averaging of block outputs, identity at init"
    fuses_values = True
    options: ClassVar[type[DenseFormerOptions]] = DenseFormerOptions

    def __init__(self, cfg: ModelFields, layer: int):
        super().__init__(cfg, layer)
        self.w_v = self.make_value_map(cfg, layer)

    def forward(self, x: Tensor, q: Tensor, k: Tensor | None, carry: Carry,
                projected: Tensor | None = None) -> tuple[LayerValues, Carry]:
        assert k is not None
        return LayerValues(q, k, self.value_projection(x, projected)), carry

    @classmethod
    def make_shared(cls, cfg: ModelFields) -> SharedModule:
        o = resolve_options(cls.options, cfg)
        return DepthWeights(cfg.n_layers, o.dilation, o.period)


_OLD_DWA = re.compile(r"blocks\.(\d+)\.attn\.values\.dwa\.gain$")


class DepthWeights(SharedModule):
    """DenseFormer's weights alpha_{i,j}, one `Gain` per averaging block i (``dwa.<i>.gain``); they sit
    outside the blocks because each reads the outputs of every earlier block."""

    def __init__(self, n_layers: int, dilation: int, period: int):
        super().__init__()
        self.sources = {i: [j for j in range(i + 2) if j % dilation == (i + 1) % dilation]
                        for i in range(n_layers) if (i + 1) % period == 0}
        self.dwa = nn.ModuleDict({str(i): Gain([0.0] * (len(s) - 1) + [1.0], trainable=True)
                                  for i, s in self.sources.items()})

    def weights(self, layer: int) -> Tensor:
        """alpha_{layer, j} over the sources j of the averaging block after `layer`."""
        gain = self.dwa[str(layer)]
        assert isinstance(gain, Gain)
        return gain.param

    def after_block(self, layer: int, x: Tensor, carry: Carry) -> tuple[Tensor, Carry]:
        history = (*(carry.path_state or (carried(carry.x0),)), x)  # its state: X_0 .. X_{layer+1}
        carry = carry.update(path_state=history)
        if layer in self.sources:
            weights = self.weights(layer)
            x = weights[0] * history[self.sources[layer][0]]
            for w, j in zip(weights[1:], self.sources[layer][1:], strict=True):
                x = x + w * history[j]
        return x, carry

    def upgrade_state_dict(self, state_dict: dict[str, Any], prefix: str) -> None:
        """Runs written before the weights moved out of the blocks named them
        ``blocks.<i>.attn.values.dwa.gain``; read those as ``value_shared.dwa.<i>.gain``."""
        for key in [k for k in state_dict if k.startswith(prefix)]:
            match = _OLD_DWA.fullmatch(key[len(prefix):])
            if match:
                state_dict[f"{prefix}value_shared.dwa.{match[1]}.gain"] = state_dict.pop(key)


@dataclass(frozen=True)
class CrossLayerKVOptions(ValuePathOptions):
    group: int = 2
    """how many consecutive layers share one K and V, 2 to n_layers."""


class CrossLayerKV(ValuePath):
    """CLA (Brandon et al. 2024): layers in consecutive groups of `group` share one K and V.

    The first layer of each group owns W_K and W_V; the others have only W_Q and W_O and reuse
    its keys (after RoPE) and values.
    """

    description = "CLA: K and V shared by consecutive groups of k layers (default 2)"
    fuses_values = True
    options: ClassVar[type[CrossLayerKVOptions]] = CrossLayerKVOptions
    opts: CrossLayerKVOptions

    def __init__(self, cfg: ModelFields, layer: int):
        super().__init__(cfg, layer)
        self.leader = self.has_value_map(cfg, layer)
        self.owns_keys = self.caches_values = self.leader
        self.key_layer = self.value_layer = layer - layer % self.opts.group  # one cache entry per group
        self.w_v = self.make_value_map(cfg, layer) if self.leader else None

    def forward(self, x: Tensor, q: Tensor, k: Tensor | None, carry: Carry,
                projected: Tensor | None = None) -> tuple[LayerValues, Carry]:
        if self.w_v is not None:
            assert k is not None
            v = self.value_projection(x, projected)
            return LayerValues(q, k, v), carry.update(path_state=(k, v))  # its state: the leader's K, V
        k, v = _given_pair(carry.path_state)
        return LayerValues(q, k, v), carry

    @classmethod
    def validate(cls, cfg: ModelFields) -> None:
        group = resolve_options(cls.options, cfg).group
        if not (isinstance(group, int) and 2 <= group <= cfg.n_layers):
            raise ConfigError(f"value_path_options['group'] = {group!r} is not allowed: a CLA group "
                              f"holds 2 to n_layers={cfg.n_layers} layers.")

    @classmethod
    def has_value_map(cls, cfg: ModelFields, layer: int) -> bool:
        return layer % resolve_options(cls.options, cfg).group == 0  # the group's leader


def _given_pair(pair: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor]:
    assert pair is not None, "the layer that owns the keys and values runs first and fills the carry"
    return pair


class CrossLayerAttention(ValuePath):
    """The exact cross-layer attention of Value Residual Learning Eq. (2), kept as a reference:

        U_n = softmax(Q_n [K_n; K_m]^T / sqrt(d)) [V_n; V_m],   m = the first layer,

    each half under the same mask (`ops.cross_layer_attention`). It costs about twice the attention
    of Eq. (1). While decoding, the cache supplies layer 0's keys and values (`reads_layers`).
    """

    description = "cross-layer attention (Eq. 2): attend over the concatenated K, V of layer 1"
    fuses_values = True

    def __init__(self, cfg: ModelFields, layer: int):
        super().__init__(cfg, layer)
        self.w_v = self.make_value_map(cfg, layer)
        self.head_dim = cfg.attention_shape.head_dim
        self.key_sets = 1 if layer == 0 else 2
        self.reads_layers = () if layer == 0 else (0,)

    def forward(self, x: Tensor, q: Tensor, k: Tensor | None, carry: Carry,
                projected: Tensor | None = None) -> tuple[LayerValues, Carry]:
        assert k is not None
        v = self.value_projection(x, projected)
        if self.layer == 0:
            return LayerValues(q, k, v), carry.update(path_state=(k, v))  # its state: layer 0's K, V
        first_k, first_v = _given_pair(carry.path_state)
        return LayerValues(q, k, v, other_kv=(first_k, ops.split_heads(first_v, self.head_dim))), carry

    @classmethod
    def validate(cls, cfg: ModelFields) -> None:
        if cfg.attn_matrix != "softmax":
            raise ConfigError(f"value_path='cross-layer-attn' needs attn_matrix='softmax' (got "
                              f"{cfg.attn_matrix!r}): Eq. (2) is defined for plain softmax attention.")


DENSEFORMER_TITLES = {"dwa": "DenseFormer weights"}  # for the registry
