"""Value residual learning (Zhou et al., ACL 2025): ResFormer and SVFormer.

    ResFormer:  U_n = A_n (lambda_{n,2} V_n + lambda_{n,1} V_1),  n >= 2      (Eqs. 7, 9-10 of the
                paper's variants; Identity-ResFormer is lambda_1 = lambda_2 = 1/2)
    + NeuTRENO: U_n = A_n V'_n + mu (V_1 - V'_n)   with V'_n the mixed value (option ``neutreno`` = mu;
                the Value Residual code's ResFormer + NeuTRENO uses mu = 0.2)
    Learned mix: V'_n = m V_n + (1 - m) V_1,  m = sigmoid(x W_m + b_m) per token and KV head
                (x-transformers' `learned_value_residual_mix`)
    Dense:      V'_n = lambda_{n,n} V_n + sum_{i<n} lambda_{n,i} V_i
    SVFormer:   U_n = A_n V_1                                                (Eq. 10)

V_i are the raw projected values H_{i-1} W^V_i. Layer indices in code are 0-based: the paper's
V_1 is layer 0's value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, ClassVar, Literal

import torch
from torch import Tensor, nn

from blocklab.model.carry import Carry
from blocklab.model.gains import Gain
from blocklab.model.value_paths.base import LayerRole, LayerValues, SharedModule, ValuePath, carried
from blocklab.model.value_paths.options import LayerSpec, ValuePathOptions, target_layers
from blocklab.util.errors import ConfigError

if TYPE_CHECKING:
    from blocklab.model.fields import ModelFields


@dataclass
class SourceState:
    """A ResFormer's own cross-layer state (`Carry.path_state`); the source's values are the carry's
    `first_values`, which other families read too."""

    heads: Tensor | None = None  # the source layer's Q or K heads (residual_on "query" or "key")
    weights: Tensor | None = None  # ResFormer Plus: lambda_{n,1} of every mixing layer


def source_state(carry: Carry) -> SourceState:
    state = carry.path_state
    return state if isinstance(state, SourceState) else SourceState()


@dataclass(frozen=True)
class ResFormerOptions(ValuePathOptions):
    """Identity-ResFormer's settings; the other ResFormers change the defaults."""

    lambda1: float = 0.5
    """lambda_1, the weight of the source value V_s (its initial value when learnable)."""
    lambda2: float = 0.5
    """lambda_2, the weight of the layer's own value V_n."""
    learnable: bool = False
    """per-layer trainable lambdas."""
    layers: LayerSpec = "all"
    """the target layers (`target_layers`); only those after the source mix."""
    source: int = 0
    """0-based index of the source layer: 0 is V_1, 1 is V_2."""
    residual_on: Literal["value", "query", "key"] = "value"
    """what is mixed: the values, or the queries or keys instead (the ablation of Fig. 9)."""
    neutreno: float = 0.0
    """mu in [0, 1): mu > 0 adds NeuTRENO's token-wise mu (V_1 - V'_n) to the mixing layers' output."""

    def __post_init__(self) -> None:
        super().__post_init__()
        mu = self.neutreno
        if not 0 <= mu < 1:
            raise ConfigError(f"value_path_options['neutreno'] = {mu!r} is not allowed: NeuTRENO's weight "
                              "mu lies in [0, 1) (0: off; the Value Residual code uses 0.2 with ResFormer).")
        if mu and self.residual_on != "value":
            raise ConfigError(f"value_path_options['neutreno'] = {mu!r} is not allowed with residual_on="
                              f"{self.residual_on!r}: NeuTRENO corrects the values, so it needs residual_on="
                              "'value'.")


@dataclass(frozen=True)
class LearnedMixOptions(ResFormerOptions):
    """The learned-mix ResFormer reads ``layers``, ``source`` and ``neutreno``; its gate replaces the
    lambdas and it mixes values only, so the rest keep Identity-ResFormer's defaults."""

    def __post_init__(self) -> None:
        super().__post_init__()
        default = ResFormerOptions()
        fixed = {k: getattr(self, k) for k in ("residual_on", "lambda1", "lambda2", "learnable")
                 if getattr(self, k) != getattr(default, k)}
        if fixed:
            raise ConfigError(f"value_path_options {fixed} is not allowed for resformer-mix: its gate m "
                              "replaces the lambdas and it mixes values only; its options are layers, source "
                              "and neutreno.")


class ValueResidual(ValuePath):
    """V'_n = lambda_1 V_s + lambda_2 V_n in the target layers after the source layer s (options:
    `ResFormerOptions`; Constant-, Sparse- and Learnable-ResFormer are its registry entries with other
    defaults). With ``residual_on`` "query" or "key" the heads mix instead (`mix_heads`)."""

    options: ClassVar[type[ResFormerOptions]] = ResFormerOptions
    opts: ResFormerOptions
    adaptive = False  # True: lambda_{n,1} comes from the model-level `AdaptiveSourceWeights`

    def __init__(self, cfg: ModelFields, layer: int, opts: ResFormerOptions):
        super().__init__(cfg, layer, opts)
        self.mixes = layer in mixing_layers(opts, cfg.n_layers)
        self.mixes_heads = opts.residual_on != "value" and (self.mixes or layer == opts.source)
        if self.mixes:
            if not self.adaptive:
                self.lambda1 = Gain(opts.lambda1, opts.learnable)
            self.lambda2 = Gain(opts.lambda2, opts.learnable)
        self.mix_index = mixing_layers(opts, cfg.n_layers).index(layer) if self.mixes else -1

    @classmethod
    def role(cls, cfg: ModelFields, opts: ResFormerOptions, layer: int) -> LayerRole:
        return LayerRole(layer, layer, first_values=layer == opts.source and opts.residual_on == "value")

    def source_term(self, source: Tensor, carry: Carry) -> Tensor:
        """lambda_{n,1} times the source's values (or heads)."""
        weights = source_state(carry).weights
        return self.lambda1(source) if weights is None else weights[self.mix_index] * source

    def layer_values(self, x: Tensor, carry: Carry) -> tuple[LayerValues, Carry]:
        v = self.value_projection(x)
        if not self.mixes or self.opts.residual_on != "value":
            return LayerValues(v), carry
        v1 = carried(carry.first_values)
        mixed = self.mix(x, v1, v, carry)
        # NeuTRENO's token-wise correction: token-local, so a KV cache needs nothing more
        offset = self.opts.neutreno * (v1 - mixed) if self.opts.neutreno else None
        return LayerValues(mixed, offset=offset), carry

    def mix(self, x: Tensor, v1: Tensor, v: Tensor, carry: Carry) -> Tensor:
        """V'_n from the source value V_1 and this layer's V_n (and its input x)."""
        return self.source_term(v1, carry) + self.lambda2(v)

    def mix_heads(self, q: Tensor, k: Tensor, carry: Carry) -> tuple[Tensor, Tensor, Carry]:
        """The query- or key-residual ablation (Fig. 9): the source keeps its heads, later layers mix."""
        query = self.opts.residual_on == "query"
        if not self.mixes:  # the source layer
            return q, k, carry.update(path_state=replace(source_state(carry), heads=q if query else k))
        mixed = self.source_term(carried(source_state(carry).heads), carry) + self.lambda2(q if query else k)
        return (mixed, k, carry) if query else (q, mixed, carry)

    @classmethod
    def validate(cls, cfg: ModelFields, opts: ResFormerOptions) -> None:
        if not 0 <= opts.source < cfg.n_layers - 1:
            raise ConfigError(f"value_path_options['source'] = {opts.source!r} is not allowed: it is the "
                              f"0-based source layer and must lie in [0, {cfg.n_layers - 1}).")
        targets = target_layers(opts.layers, cfg.n_layers)
        if max(targets) <= opts.source:  # only layers after the source mix, so nothing would change
            raise ConfigError(
                f"value_path_options['layers'] = {opts.layers!r} has no layer after source={opts.source}: "
                f"only layers > source receive the source's {opts.residual_on}, so value_path="
                f"{cfg.value_path!r} would be the standard Transformer; name at least one layer in "
                f"({opts.source}, {cfg.n_layers}).")


def mixing_layers(opts: ResFormerOptions, n_layers: int) -> list[int]:
    """The layers that mix in the source's values: the target layers after the source."""
    return sorted(i for i in target_layers(opts.layers, n_layers) if i > opts.source)


class LearnedMixResFormer(ValueResidual):
    """V'_n = m V_n + (1 - m) V_1 per head, m = sigmoid(x W_m + b_m), one gate per token and KV head
    from the layer's attention input x (x-transformers' `learned_value_residual_mix`, its default
    value-residual form; it reads one gate per attention head, blocklab's values have KV heads).
    W_m and b_m take the model's init (N(0, init_std), b = 0), so m starts near 1/2: Identity-
    ResFormer. Options: ``layers``, ``source``, ``neutreno`` (`LearnedMixOptions`); no lambdas.
    """

    options = LearnedMixOptions

    def __init__(self, cfg: ModelFields, layer: int, opts: ResFormerOptions):
        super().__init__(cfg, layer, opts)
        self.n_kv_heads, self.init_std = cfg.attention_shape.n_kv_heads, cfg.init_std
        if self.mixes:
            self.gate = nn.Linear(cfg.d_model, self.n_kv_heads, bias=True)

    def mix(self, x: Tensor, v1: Tensor, v: Tensor, carry: Carry) -> Tensor:
        b, t, width = v.shape
        m = torch.sigmoid(self.gate(x))[..., None]  # (B, T, n_kv_heads, 1)
        heads = v.view(b, t, self.n_kv_heads, -1)
        v1 = v1.view_as(heads)
        # not torch.lerp: under autocast V_1 (a bf16 projection) and V_n (SAS's identity values, the
        # float32 stream) can differ in dtype, and lerp does not promote
        return (v1 + m * (heads - v1)).view(b, t, width)

    @torch.no_grad()
    def init_weights(self, token_embedding: Tensor) -> None:
        super().init_weights(token_embedding)
        if self.mixes:  # W_m ~ N(0, init_std), b_m = 0: m starts near 1/2
            nn.init.normal_(self.gate.weight, std=self.init_std)
            nn.init.zeros_(self.gate.bias)


class AdaptiveSourceWeights(SharedModule):
    """lambda_{n,1} = lambda * softmax(lambda')_n over the mixing layers (ResFormer Plus).

    Our reading of the paper's adaptive initialisation: lambda starts at the layer count N and the
    logits at lambda'_n = log(n) (n the 1-based layer number), so softmax(lambda')_n is
    proportional to n and deeper layers start with more V_1; the weights average N / (N - 1).
    """

    def __init__(self, layers: list[int], n_layers: int):
        super().__init__()
        self.index = {layer: i for i, layer in enumerate(layers)}
        self.scale = Gain(float(n_layers), trainable=True)
        self.logits = Gain([math.log(layer + 1) for layer in layers], trainable=True)

    def before_blocks(self, carry: Carry) -> Carry:
        weights = self.scale.param * torch.softmax(self.logits.param, dim=0)
        return carry.update(path_state=replace(source_state(carry), weights=weights))

    @torch.no_grad()
    def start_at_baseline(self) -> None:
        self.scale.param.zero_()  # lambda = 0: no V_1 anywhere


class LearnableResFormerPlus(ValueResidual):
    """Learnable-ResFormer whose lambda_{n,1} come from the model-level `AdaptiveSourceWeights`
    (through the carry); lambda_{n,2} stay per layer."""

    adaptive = True

    @classmethod
    def make_shared(cls, cfg: ModelFields, opts: ResFormerOptions) -> SharedModule:
        return AdaptiveSourceWeights(mixing_layers(opts, cfg.n_layers), cfg.n_layers)


class DenseResFormer(ValuePath):
    """V'_n = lambda_{n,n} V_n + sum_{i<n} lambda_{n,i} V_i, all lambdas learned per layer.

    Initialised as Identity-ResFormer (lambda_{n,n} = lambda_{n,1} = 1/2, the rest 0).
    """

    def __init__(self, cfg: ModelFields, layer: int, opts: ValuePathOptions):
        super().__init__(cfg, layer, opts)
        if layer > 0:
            init = [0.5] + [0.0] * (layer - 1) + [0.5]  # weights on V_1 .. V_{n-1}, V_n
            self.lambdas = Gain(init, trainable=True)

    def layer_values(self, x: Tensor, carry: Carry) -> tuple[LayerValues, Carry]:
        v = self.value_projection(x)
        raw = (*(carry.path_state or ()), v)  # its state: the raw V of every layer so far
        carry = carry.update(path_state=raw)
        if self.layer > 0:
            w = self.lambdas.param
            v = w[0] * raw[0]
            for i in range(1, len(raw)):
                v = v + w[i] * raw[i]
        return LayerValues(v), carry

    @torch.no_grad()
    def start_at_baseline(self) -> None:
        if self.layer > 0:  # lambda_{n,n} = 1, every earlier lambda 0: V'_n = V_n
            self.lambdas.param.zero_()
            self.lambdas.param[-1] = 1.0


@dataclass(frozen=True)
class SVFormerOptions(ValuePathOptions):
    anchors: list[int] = field(default_factory=list)
    """layers that compute their own V and replace the shared value for the layers after them (Fig. 17)."""


class SVFormer(ValuePath):
    """U_n = A_n V_1 (Eq. 10): only the first layer (and optional anchor layers) project values;
    each other layer reads (and the KV cache keeps once) the latest projecting layer's."""

    options: ClassVar[type[SVFormerOptions]] = SVFormerOptions
    opts: SVFormerOptions

    @classmethod
    def role(cls, cfg: ModelFields, opts: SVFormerOptions, layer: int) -> LayerRole:
        anchor = max(a for a in (0, *opts.anchors) if a <= layer)
        return LayerRole(layer, anchor, first_values=anchor == layer)

    def layer_values(self, x: Tensor, carry: Carry) -> tuple[LayerValues, Carry]:
        if self.w_v is not None:  # a projecting layer
            return LayerValues(self.value_projection(x)), carry
        return LayerValues(carried(carry.first_values)), carry

    @classmethod
    def validate(cls, cfg: ModelFields, opts: SVFormerOptions) -> None:
        anchors = opts.anchors
        if not all(isinstance(a, int) and not isinstance(a, bool) and 0 < a < cfg.n_layers for a in anchors):
            raise ConfigError(f"value_path_options['anchors'] = {anchors!r} is not allowed: "
                              f"give layer indices in [1, {cfg.n_layers}).")

