"""The baselines of Value Residual Learning: NeuTRENO, DenseFormer, CLA and cross-layer attention."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from torch import Tensor, nn

from blocklab.model import ops
from blocklab.model.carry import Carry
from blocklab.model.gains import Gain
from blocklab.model.value_paths.base import LayerRole, LayerValues, SharedModule, ValuePath, carried
from blocklab.model.value_paths.options import ValuePathOptions
from blocklab.util.errors import ConfigError

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

    options: ClassVar[type[NeuTRENOOptions]] = NeuTRENOOptions
    opts: NeuTRENOOptions

    @classmethod
    def role(cls, cfg: ModelFields, opts: NeuTRENOOptions, layer: int) -> LayerRole:
        return LayerRole(layer, layer, first_values=layer == 0)

    def layer_values(self, x: Tensor, carry: Carry) -> tuple[LayerValues, Carry]:
        v = self.value_projection(x)
        if self.layer == 0:
            return LayerValues(v), carry
        return LayerValues(v, offset=self.opts.lambda_ * (carried(carry.first_values) - v)), carry


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

    options: ClassVar[type[DenseFormerOptions]] = DenseFormerOptions

    @classmethod
    def make_shared(cls, cfg: ModelFields, opts: DenseFormerOptions) -> SharedModule:
        return DepthWeights(cfg.n_layers, opts.dilation, opts.period)


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


@dataclass(frozen=True)
class CrossLayerKVOptions(ValuePathOptions):
    group: int = 2
    """how many consecutive layers share one K and V, 2 to n_layers."""


class CrossLayerKV(ValuePath):
    """CLA (Brandon et al. 2024): layers in consecutive groups of `group` share one K and V.

    The first layer of each group owns W_K and W_V; the others have only W_Q and W_O and attend over
    its keys (after RoPE; the attention passes them on) and values (this path's carry state).
    """

    options: ClassVar[type[CrossLayerKVOptions]] = CrossLayerKVOptions
    opts: CrossLayerKVOptions

    @classmethod
    def role(cls, cfg: ModelFields, opts: CrossLayerKVOptions, layer: int) -> LayerRole:
        leader = layer - layer % opts.group  # one cache entry per group
        return LayerRole(key_layer=leader, value_layer=leader)

    def layer_values(self, x: Tensor, carry: Carry) -> tuple[LayerValues, Carry]:
        if self.w_v is not None:  # the group's first layer: its V is this path's state
            v = self.value_projection(x)
            return LayerValues(v), carry.update(path_state=v)
        return LayerValues(carried(carry.path_state)), carry

    @classmethod
    def validate(cls, cfg: ModelFields, opts: CrossLayerKVOptions) -> None:
        group = opts.group
        if not (isinstance(group, int) and 2 <= group <= cfg.n_layers):
            raise ConfigError(f"value_path_options['group'] = {group!r} is not allowed: a CLA group "
                              f"holds 2 to n_layers={cfg.n_layers} layers.")


class CrossLayerAttention(ValuePath):
    """The exact cross-layer attention of Value Residual Learning Eq. (2), kept as a reference:

        U_n = softmax(Q_n [K_n; K_m]^T / sqrt(d)) [V_n; V_m],   m = the first layer,

    each half under the same mask (`ops.cross_layer_attention`). It costs about twice the attention
    of Eq. (1). Layer 0's keys come through the carry (the attention shares them) and its values are
    V_1; while decoding, the cache supplies both (`reads_layer`).
    """

    def __init__(self, cfg: ModelFields, layer: int, opts: ValuePathOptions):
        super().__init__(cfg, layer, opts)
        self.head_dim = cfg.attention_shape.head_dim

    @classmethod
    def role(cls, cfg: ModelFields, opts: ValuePathOptions, layer: int) -> LayerRole:
        return LayerRole(layer, layer, reads_layer=None if layer == 0 else 0, first_values=layer == 0)

    def layer_values(self, x: Tensor, carry: Carry) -> tuple[LayerValues, Carry]:
        v = self.value_projection(x)
        if self.layer == 0:
            return LayerValues(v), carry
        first = (carried(carry.shared_keys), ops.split_heads(carried(carry.first_values), self.head_dim))
        return LayerValues(v, other_kv=first), carry

    @classmethod
    def validate(cls, cfg: ModelFields, opts: ValuePathOptions) -> None:
        if cfg.attn_matrix != "softmax":
            raise ConfigError(f"value_path='cross-layer-attn' needs attn_matrix='softmax' (got "
                              f"{cfg.attn_matrix!r}): Eq. (2) is defined for plain softmax attention.")
