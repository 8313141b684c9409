"""Value paths: how each layer gets its values (see `base.ValuePath` for the interface).

Registry: name -> `Registered`, the module class that computes the values, its one-line description
(its equation) and its option defaults. A new variant is one class in a module here (or none, when it
only changes another's defaults), one entry below and a test; what tooling reads about it (paper, plot
titles, optimizer roles, grid and retrofit rules) is its entry in the catalog (blocklab/catalog.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from blocklab.model.value_paths.bank import (
    BankOfValues,
    ResFormerBank,
    V1Value,
    VScale,
    X0Value,
)
from blocklab.model.value_paths.base import (
    LayerRole,
    LayerValues,
    SharedModule,
    ValuePath,
    is_value_table,
)
from blocklab.model.value_paths.baselines import (
    CrossLayerAttention,
    CrossLayerKV,
    DenseFormer,
    NeuTRENO,
)
from blocklab.model.value_paths.options import ValuePathOptions, read_options, target_layers
from blocklab.model.value_paths.resformer import (
    DenseResFormer,
    LearnableResFormerPlus,
    LearnedMixResFormer,
    ResFormerOptions,
    SVFormer,
    ValueResidual,
)
from blocklab.model.value_paths.value_embed import ValueEmbed
from blocklab.util.errors import ConfigError

if TYPE_CHECKING:
    from blocklab.model.fields import ModelFields


@dataclass(frozen=True)
class Registered:
    """A value path's registry entry: what the model needs to build it.

    module: the class that computes its values; description: one line, its equation; defaults: option
    values that differ from its options class's (Constant-ResFormer is ResFormer with lambda_1 = 2,
    lambda_2 = 1). What tooling reads about it (paper, plot titles, optimizer roles, grid and
    retrofit rules) is its entry in the catalog above the model (blocklab/catalog.py).
    """

    module: type[ValuePath]
    description: str
    defaults: dict[str, Any] = field(default_factory=dict)

    def options(self, cfg: ModelFields) -> Any:
        """The options of `cfg`'s value path, built from these defaults and the config, checked."""
        return read_options(self.module.options, cfg.value_path_options, self.defaults, cfg.value_path)


VALUE_PATHS: dict[str, Registered] = {
    "standard": Registered(ValuePath, "each layer projects its own values, V_n = H_{n-1} W^V_n"),
    # -- Value Residual Learning (Zhou et al.) and the baselines it compares against -----------------
    "resformer": Registered(ValueResidual, "Identity-ResFormer: U_n = 1/2 A_n (V_n + V_1) for n >= 2"),
    "resformer-constant": Registered(ValueResidual, "Constant-ResFormer: U_n = A_n (V_n + lambda V_1), "
                                     "lambda = 2", dict(lambda1=2.0, lambda2=1.0)),
    "resformer-sparse": Registered(ValueResidual, "Sparse-ResFormer: V_n + lambda V_1 only in chosen layers "
                                   "(last 3, lambda = 5)", dict(lambda1=5.0, lambda2=1.0, layers="last-3")),
    "resformer-learnable": Registered(ValueResidual, "Learnable-ResFormer: lambda_{n,1} V_1 + lambda_{n,2} "
                                      "V_n, both learned per layer", dict(learnable=True)),
    "resformer-mix": Registered(LearnedMixResFormer, "learned-mix ResFormer: V'_n = m V_n + (1 - m) V_1, "
                                "m = sigmoid(W x + b) per token, head"),
    "resformer-learnable-plus": Registered(
        LearnableResFormerPlus, "Learnable-ResFormer Plus: lambda_{n,1} = lambda softmax(lambda')_n with an "
        "adaptive initialisation that gives deeper layers more V_1", {"learnable": True}),
    "resformer-dense": Registered(DenseResFormer, "Dense-ResFormer: V_n = lambda_{n,n} H_{n-1} W^V_n + "
                                  "sum_{i<n} lambda_{n,i} V_i"),
    "svformer": Registered(SVFormer, "SVFormer: every layer attends over the first layer's values, "
                           "U_n = A_n V_1"),
    "neutreno": Registered(NeuTRENO, "NeuTRENO: U_n = (A_n - lambda I) V_n + lambda V_1, lambda = 0.4"),
    "denseformer": Registered(DenseFormer, "DenseFormer: depth-weighted averaging of block outputs, "
                              "identity at init"),
    "cla": Registered(CrossLayerKV, "CLA: K and V shared by consecutive groups of k layers (default 2)"),
    "cross-layer-attn": Registered(CrossLayerAttention, "cross-layer attention (Eq. 2): attend over the "
                                   "concatenated K, V of layer 1"),
    # -- Bank of Values and its relatives -----------------------------------------------------------
    "bov": Registered(BankOfValues, "Bank of Values: deep layers look values up by token id, "
                      "v = gamma_v E_v[id]"),
    "bov-resformer": Registered(ResFormerBank, "Bank of Values in the last third, Identity-ResFormer's "
                                "(V_n + V_1) / 2 below it"),
    "x0-value": Registered(X0Value, "x0-value (BoV Table 1): v = c RMSNorm(x0) W^V in the target layers"),
    "v1-value": Registered(V1Value, "v1-value (BoV Table 1): v = c V_1 in the target layers"),
    "v-scale": Registered(VScale, "v-scale (BoV Table 1 control): v = c x W^V in the target layers"),
    "value-embed": Registered(ValueEmbed, "value embeddings: V + gate * E_v[token id] on every second "
                              "layer (nanochat)"),
}


def _entry(cfg: ModelFields) -> Registered:
    if cfg.value_path not in VALUE_PATHS:
        raise ConfigError(
            f"ModelConfig.value_path = {cfg.value_path!r} is not allowed: choose one of "
            f"{', '.join(map(repr, VALUE_PATHS))}."
        )
    return VALUE_PATHS[cfg.value_path]


def make_value_path(cfg: ModelFields, layer: int) -> ValuePath:
    entry = _entry(cfg)
    return entry.module(cfg, layer, entry.options(cfg))


def make_shared_module(cfg: ModelFields) -> SharedModule | None:
    entry = _entry(cfg)
    return entry.module.make_shared(cfg, entry.options(cfg))


def value_layers(cfg: ModelFields) -> list[int]:
    """The layers that own a value projection W^V."""
    entry = _entry(cfg)
    opts = entry.options(cfg)
    return [i for i in range(cfg.n_layers) if entry.module.has_value_map(cfg, opts, i)]


def validate_value_path(cfg: ModelFields) -> None:
    """The value path's name, its options (their types and values) and its checks that need the sizes."""
    entry = _entry(cfg)
    entry.module.validate(cfg, entry.options(cfg))


def check_value_path(cfg: ModelFields) -> None:
    """What `ModelConfig` checks through the registry: the value path, and that tied reparameterised
    inits find a W^V in every layer."""
    validate_value_path(cfg)
    if cfg.reparam_tie != "none":  # after the value path's options are known to be valid
        bare = sorted(set(range(cfg.n_layers)) - set(value_layers(cfg)))
        if bare:
            raise ConfigError(f"ModelConfig.reparam_tie = {cfg.reparam_tie!r} is not allowed: it ties "
                              f"W_P,init to the layers' W_V,init, but value_path={cfg.value_path!r} has no "
                              f"W_V in layers {bare} (0-based); use reparam_tie='none' with this value path.")


__all__ = ["VALUE_PATHS", "LayerRole", "LayerValues", "Registered", "ResFormerOptions", "SharedModule",
           "ValuePath", "ValuePathOptions", "check_value_path", "is_value_table", "make_shared_module",
           "make_value_path", "target_layers", "validate_value_path", "value_layers"]
