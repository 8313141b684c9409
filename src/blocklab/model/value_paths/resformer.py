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
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from blocklab.errors import ConfigError
from blocklab.model.carry import Carry
from blocklab.model.gains import Gain
from blocklab.model.value_paths.base import (
    LayerSpec,
    LayerValues,
    SharedModule,
    ValuePath,
    ValuePathOptions,
    carried,
    resolve_options,
    target_layers,
)

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
class ConstantResFormerOptions(ResFormerOptions):
    """Constant-ResFormer: lambda_1 = 2, lambda_2 = 1."""

    lambda1: float = 2.0
    lambda2: float = 1.0


@dataclass(frozen=True)
class SparseResFormerOptions(ResFormerOptions):
    """Sparse-ResFormer: lambda_1 = 5, lambda_2 = 1 in the last three layers."""

    lambda1: float = 5.0
    lambda2: float = 1.0
    layers: LayerSpec = "last-3"


@dataclass(frozen=True)
class LearnableResFormerOptions(ResFormerOptions):
    """Learnable-ResFormer: both lambdas learned per layer."""

    learnable: bool = True


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
    `ResFormerOptions`)."""

    description = "Identity-ResFormer: U_n = 1/2 A_n (V_n + V_1) for n >= 2"
    fuses_values = True
    options: ClassVar[type[ResFormerOptions]] = ResFormerOptions
    opts: ResFormerOptions

    def __init__(self, cfg: ModelFields, layer: int):
        super().__init__(cfg, layer)
        o = self.opts
        self.w_v = self.make_value_map(cfg, layer)
        self.is_source = layer == o.source
        self.mixes = layer > o.source and layer in target_layers(o.layers, cfg.n_layers)
        if self.mixes:
            self.lambda1 = self.make_lambda1(cfg, layer)
            self.lambda2 = Gain(o.lambda2, o.learnable)

    def make_lambda1(self, cfg: ModelFields, layer: int) -> nn.Module:  # noqa: ARG002 (overridden)
        return Gain(self.opts.lambda1, self.opts.learnable)

    def source_weight(self, first: Tensor, carry: Carry) -> Tensor:  # noqa: ARG002 (overridden)
        return self.lambda1(first)

    def forward(self, x: Tensor, q: Tensor, k: Tensor | None, carry: Carry,
                projected: Tensor | None = None) -> tuple[LayerValues, Carry]:
        assert k is not None
        v = self.value_projection(x, projected)
        on = self.opts.residual_on
        offset = None
        if self.is_source:
            if on == "value":
                carry = carry.update(first_values=v)
            else:  # the query- or key-residual ablation keeps the source's heads as its own state
                heads = q if on == "query" else k
                carry = carry.update(path_state=replace(source_state(carry), heads=heads))
        elif self.mixes:
            if on == "value":
                v1 = carried(carry.first_values)
                v = self.mix(x, v1, v, carry)
                if self.opts.neutreno:  # token-local, so a KV cache needs nothing more
                    offset = self.opts.neutreno * (v1 - v)
            elif on == "query":
                q = self.source_weight(carried(source_state(carry).heads), carry) + self.lambda2(q)
            else:
                k = self.source_weight(carried(source_state(carry).heads), carry) + self.lambda2(k)
        return LayerValues(q, k, v, offset=offset), carry

    def mix(self, x: Tensor, v1: Tensor, v: Tensor, carry: Carry) -> Tensor:  # noqa: ARG002 (overridden)
        """V'_n from the source value V_1 and this layer's V_n (and its input x)."""
        return self.source_weight(v1, carry) + self.lambda2(v)

    @classmethod
    def validate(cls, cfg: ModelFields) -> None:
        o = resolve_options(cls.options, cfg)
        if not 0 <= o.source < cfg.n_layers - 1:
            raise ConfigError(f"value_path_options['source'] = {o.source!r} is not allowed: it is the "
                              f"0-based source layer and must lie in [0, {cfg.n_layers - 1}).")
        targets = target_layers(o.layers, cfg.n_layers)
        if max(targets) <= o.source:  # only layers after the source mix, so nothing would change
            raise ConfigError(
                f"value_path_options['layers'] = {o.layers!r} has no layer after source={o.source}: "
                f"only layers > source receive the source's {o.residual_on}, so value_path="
                f"{cfg.value_path!r} would be the standard Transformer; name at least one layer in "
                f"({o.source}, {cfg.n_layers}).")


class ConstantResFormer(ValueResidual):
    description = "Constant-ResFormer: U_n = A_n (V_n + lambda V_1), lambda = 2"
    options = ConstantResFormerOptions


class SparseResFormer(ValueResidual):
    description = "Sparse-ResFormer: V_n + lambda V_1 only in chosen layers (last 3, lambda = 5)"
    options = SparseResFormerOptions


class LearnableResFormer(ValueResidual):
    description = "Learnable-ResFormer: lambda_{n,1} V_1 + lambda_{n,2} V_n, both learned per layer"
    options = LearnableResFormerOptions


class LearnedMixResFormer(ValueResidual):
    """V'_n = m V_n + (1 - m) V_1 per head, m = sigmoid(x W_m + b_m), one gate per token and KV head
    from the layer's attention input x (x-transformers' `learned_value_residual_mix`, its default
    value-residual form; it reads one gate per attention head, blocklab's values have KV heads).
    W_m and b_m take the model's init (N(0, init_std), b = 0), so m starts near 1/2: Identity-
    ResFormer. Options: ``layers``, ``source``, ``neutreno`` (`LearnedMixOptions`); no lambdas.
    """

    description = "learned-mix ResFormer: V'_n = m V_n + (1 - m) V_1, m = sigmoid(W x + b) per token, head"
    options = LearnedMixOptions

    def __init__(self, cfg: ModelFields, layer: int):
        super().__init__(cfg, layer)
        self.n_kv_heads = cfg.attention_shape.n_kv_heads
        if self.mixes:
            self.gate = nn.Linear(cfg.d_model, self.n_kv_heads, bias=True)

    def mix(self, x: Tensor, v1: Tensor, v: Tensor, carry: Carry) -> Tensor:  # noqa: ARG002 (the interface)
        b, t, width = v.shape
        m = torch.sigmoid(self.gate(x))[..., None]  # (B, T, n_kv_heads, 1)
        heads = v.view(b, t, self.n_kv_heads, -1)
        v1 = v1.view_as(heads)
        # not torch.lerp: under autocast V_1 (a bf16 projection) and V_n (SAS's identity values, the
        # float32 stream) can differ in dtype, and lerp does not promote
        return (v1 + m * (heads - v1)).view(b, t, width)


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


class LearnableResFormerPlus(LearnableResFormer):
    description = ("Learnable-ResFormer Plus: lambda_{n,1} = lambda softmax(lambda')_n with an "
                   "adaptive initialisation that gives deeper layers more V_1")

    def __init__(self, cfg: ModelFields, layer: int):
        super().__init__(cfg, layer)
        self._mix_index = _mixing_layers(self.opts, cfg).index(layer) if self.mixes else -1

    def make_lambda1(self, cfg: ModelFields, layer: int) -> nn.Module:  # noqa: ARG002 (an override)
        return nn.Identity()  # the weight comes from the shared module through the carry

    def source_weight(self, first: Tensor, carry: Carry) -> Tensor:
        weights = source_state(carry).weights
        assert weights is not None, "the shared module fills the weights before the first block"
        return weights[self._mix_index] * first

    @classmethod
    def make_shared(cls, cfg: ModelFields) -> SharedModule:
        opts = resolve_options(cls.options, cfg)
        return AdaptiveSourceWeights(_mixing_layers(opts, cfg), cfg.n_layers)


def _mixing_layers(opts: ResFormerOptions, cfg: ModelFields) -> list[int]:
    return sorted(i for i in target_layers(opts.layers, cfg.n_layers) if i > opts.source)


class DenseResFormer(ValuePath):
    """V'_n = lambda_{n,n} V_n + sum_{i<n} lambda_{n,i} V_i, all lambdas learned per layer.

    Initialised as Identity-ResFormer (lambda_{n,n} = lambda_{n,1} = 1/2, the rest 0).
    """

    description = "Dense-ResFormer: V_n = lambda_{n,n} H_{n-1} W^V_n + sum_{i<n} lambda_{n,i} V_i"
    fuses_values = True

    def __init__(self, cfg: ModelFields, layer: int):
        super().__init__(cfg, layer)
        self.w_v = self.make_value_map(cfg, layer)
        if layer > 0:
            init = [0.5] + [0.0] * (layer - 1) + [0.5]  # weights on V_1 .. V_{n-1}, V_n
            self.lambdas = Gain(init, trainable=True)

    def forward(self, x: Tensor, q: Tensor, k: Tensor | None, carry: Carry,
                projected: Tensor | None = None) -> tuple[LayerValues, Carry]:
        assert k is not None
        v = self.value_projection(x, projected)
        raw = (*(carry.path_state or ()), v)  # its state: the raw V of every layer so far
        carry = carry.update(path_state=raw)
        if self.layer > 0:
            w = self.lambdas.param
            v = w[0] * raw[0]
            for i in range(1, len(raw)):
                v = v + w[i] * raw[i]
        return LayerValues(q, k, v), carry

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
    """U_n = A_n V_1 (Eq. 10): only the first layer (and optional anchor layers) project values."""

    description = "SVFormer: every layer attends over the first layer's values, U_n = A_n V_1"
    fuses_values = True
    options: ClassVar[type[SVFormerOptions]] = SVFormerOptions
    opts: SVFormerOptions

    def __init__(self, cfg: ModelFields, layer: int):
        super().__init__(cfg, layer)
        self.projects = self.has_value_map(cfg, layer)
        self.caches_values = self.projects
        # the cache keeps V once per projecting layer; the others read the latest one's
        self.value_layer = max(a for a in (0, *self.opts.anchors) if a <= layer)
        self.w_v = self.make_value_map(cfg, layer) if self.projects else None

    def forward(self, x: Tensor, q: Tensor, k: Tensor | None, carry: Carry,
                projected: Tensor | None = None) -> tuple[LayerValues, Carry]:
        assert k is not None
        if self.w_v is not None:  # a projecting layer
            v = self.value_projection(x, projected)
            return LayerValues(q, k, v), carry.update(first_values=v)
        return LayerValues(q, k, carried(carry.first_values)), carry

    @classmethod
    def validate(cls, cfg: ModelFields) -> None:
        anchors = resolve_options(cls.options, cfg).anchors
        if not all(isinstance(a, int) and not isinstance(a, bool) and 0 < a < cfg.n_layers for a in anchors):
            raise ConfigError(f"value_path_options['anchors'] = {anchors!r} is not allowed: "
                              f"give layer indices in [1, {cfg.n_layers}).")

    @classmethod
    def has_value_map(cls, cfg: ModelFields, layer: int) -> bool:
        return layer == 0 or layer in resolve_options(cls.options, cfg).anchors


# -- for the registry (model/value_paths/__init__.py) ----------------------------------------------
RESFORMER_TITLES = {"lambda1": "ResFormer lambda_1 (weight on V_1)",
                    "lambda2": "ResFormer lambda_2 (weight on V_n)"}
DENSE_TITLES = {"lambdas": "Dense-ResFormer lambdas"}


def resformer_baseline_options(cls: type[ValuePath], cfg: ModelFields,
                               given: dict[str, Any]) -> dict[str, Any]:
    """The options under which a ResFormer (`cls`) starts where the baseline is (`given` win):
    learnable lambdas start at lambda_1 = 0, lambda_2 = 1, so V'_n = 0 V_1 + 1 V_n = V_n."""
    options = resolve_options(cls.options, cfg.replace(value_path_options=given))
    learnable = isinstance(options, ResFormerOptions) and options.learnable
    return {"lambda1": 0.0, "lambda2": 1.0, **given} if learnable else given
