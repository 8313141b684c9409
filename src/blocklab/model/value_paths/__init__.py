"""Value paths: how each layer gets its values (see `base.ValuePath` for the interface).

Registry: name -> `Registered`, the module class that computes the values with everything the rest
of blocklab reads about the variant: its paper, description, option defaults, the titles of its
learned scalars in plots and their optimizer roles. A new variant is one class in a module here (or
none, when it only changes another's defaults), one entry below and a test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from blocklab.model.config import register_checks
from blocklab.model.value_paths.bank import (
    BANK_TITLES,
    BankOfValues,
    ResFormerBank,
    V1Value,
    VScale,
    X0Value,
    v1_grid_options,
)
from blocklab.model.value_paths.base import (
    LayerRole,
    LayerValues,
    SharedModule,
    ValuePath,
    is_value_table,
)
from blocklab.model.value_paths.baselines import (
    DENSEFORMER_TITLES,
    CrossLayerAttention,
    CrossLayerKV,
    DenseFormer,
    NeuTRENO,
)
from blocklab.model.value_paths.options import ValuePathOptions, read_options, target_layers
from blocklab.model.value_paths.resformer import (
    DENSE_TITLES,
    RESFORMER_TITLES,
    DenseResFormer,
    LearnableResFormerPlus,
    LearnedMixResFormer,
    ResFormerOptions,
    SVFormer,
    ValueResidual,
    resformer_baseline_options,
)
from blocklab.model.value_paths.value_embed import ValueEmbed
from blocklab.util.errors import ConfigError

if TYPE_CHECKING:
    from blocklab.model.config import ModelConfig

VALUE_RESIDUAL = ("Zhou et al., *Value Residual Learning for Alleviating Attention Concentration in "
                  "Transformers*, ACL 2025 (arXiv:2410.17897)")
BANK_OF_VALUES = ("*Do Value Vectors in Deep Layers Need Context from the Residual Stream?* "
                  "(arXiv:2606.02780)")
# optimizer role of a learned scalar: the weight on a layer's own values (ResFormer's lambda_2, x0-value's
# a), which nanochat's recipe trains with its residual scalars (training/nanochat_recipe.py)
OWN_VALUE_WEIGHT = "own-value weight"

GridRule = Callable[[dict[str, Any], int], dict[str, Any]]
BaselineRule = Callable[[Any, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Registered:
    """A value path's registry entry: its module class and what the rest of blocklab reads about it.

    description: one line, its equation; paper: the paper that proposes it or compares against it
    (model cards); defaults: option values that differ from its options class's (Constant-ResFormer is
    ResFormer with lambda_1 = 2, lambda_2 = 1); scalar_titles: learned scalar (parameter name) -> its
    title in plots (analysis/scalars.py); roles: learned scalar -> its optimizer role
    (`OWN_VALUE_WEIGHT`); grid_rule: how a comparison grid's options read at a given depth
    (compare/configs.py); baseline_rule: the options under which it starts where a pretrained
    baseline is (interop/retrofitting.py).
    """

    module: type[ValuePath]
    description: str
    paper: str | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    scalar_titles: dict[str, str] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    grid_rule: GridRule | None = None
    baseline_rule: BaselineRule | None = None

    def options(self, cfg: ModelConfig) -> Any:
        """The options of `cfg`'s value path, built from these defaults and the config, checked."""
        return read_options(self.module.options, cfg.value_path_options, self.defaults, cfg.value_path)

    def grid_options(self, options: dict[str, Any], n_layers: int) -> dict[str, Any]:
        """`options` as a comparison grid means them for a model of `n_layers`."""
        return options if self.grid_rule is None else self.grid_rule(options, n_layers)

    def baseline_options(self, cfg: ModelConfig, given: dict[str, Any]) -> dict[str, Any]:
        """Options under which this variant starts where the baseline is (the caller's `given` win)."""
        if self.baseline_rule is None:
            return given
        return self.baseline_rule(self.options(cfg.replace(value_path_options=given)), given)


def _resformer(description: str, **defaults: Any) -> Registered:
    return Registered(ValueResidual, description, VALUE_RESIDUAL, defaults, RESFORMER_TITLES,
                      {"lambda2": OWN_VALUE_WEIGHT}, baseline_rule=resformer_baseline_options)


VALUE_PATHS: dict[str, Registered] = {
    "standard": Registered(ValuePath, "each layer projects its own values, V_n = H_{n-1} W^V_n"),
    # -- Value Residual Learning (Zhou et al.) and the baselines it compares against -----------------
    "resformer": _resformer("Identity-ResFormer: U_n = 1/2 A_n (V_n + V_1) for n >= 2"),
    "resformer-constant": _resformer("Constant-ResFormer: U_n = A_n (V_n + lambda V_1), lambda = 2",
                                     lambda1=2.0, lambda2=1.0),
    "resformer-sparse": _resformer("Sparse-ResFormer: V_n + lambda V_1 only in chosen layers (last 3, "
                                   "lambda = 5)", lambda1=5.0, lambda2=1.0, layers="last-3"),
    "resformer-learnable": _resformer("Learnable-ResFormer: lambda_{n,1} V_1 + lambda_{n,2} V_n, both "
                                      "learned per layer", learnable=True),
    "resformer-mix": Registered(LearnedMixResFormer, "learned-mix ResFormer: V'_n = m V_n + (1 - m) V_1, "
                                "m = sigmoid(W x + b) per token, head", VALUE_RESIDUAL,
                                scalar_titles=RESFORMER_TITLES, baseline_rule=resformer_baseline_options),
    "resformer-learnable-plus": Registered(
        LearnableResFormerPlus, "Learnable-ResFormer Plus: lambda_{n,1} = lambda softmax(lambda')_n with an "
        "adaptive initialisation that gives deeper layers more V_1", VALUE_RESIDUAL, {"learnable": True},
        RESFORMER_TITLES, {"lambda2": OWN_VALUE_WEIGHT}, baseline_rule=resformer_baseline_options),
    "resformer-dense": Registered(DenseResFormer, "Dense-ResFormer: V_n = lambda_{n,n} H_{n-1} W^V_n + "
                                  "sum_{i<n} lambda_{n,i} V_i", VALUE_RESIDUAL, scalar_titles=DENSE_TITLES),
    "svformer": Registered(SVFormer, "SVFormer: every layer attends over the first layer's values, "
                           "U_n = A_n V_1", VALUE_RESIDUAL),
    "neutreno": Registered(NeuTRENO, "NeuTRENO: U_n = (A_n - lambda I) V_n + lambda V_1, lambda = 0.4",
                           VALUE_RESIDUAL),
    "denseformer": Registered(DenseFormer, "DenseFormer: depth-weighted averaging of block outputs, "
                              "identity at init", VALUE_RESIDUAL, scalar_titles=DENSEFORMER_TITLES),
    "cla": Registered(CrossLayerKV, "CLA: K and V shared by consecutive groups of k layers (default 2)",
                      VALUE_RESIDUAL),
    "cross-layer-attn": Registered(CrossLayerAttention, "cross-layer attention (Eq. 2): attend over the "
                                   "concatenated K, V of layer 1", VALUE_RESIDUAL),
    # -- Bank of Values and its relatives -----------------------------------------------------------
    "bov": Registered(BankOfValues, "Bank of Values: deep layers look values up by token id, "
                      "v = gamma_v E_v[id]", BANK_OF_VALUES, scalar_titles=BANK_TITLES),
    "bov-resformer": Registered(ResFormerBank, "Bank of Values in the last third, Identity-ResFormer's "
                                "(V_n + V_1) / 2 below it", BANK_OF_VALUES, scalar_titles=BANK_TITLES),
    "x0-value": Registered(X0Value, "x0-value (BoV Table 1): v = c RMSNorm(x0) W^V in the target layers",
                           BANK_OF_VALUES, scalar_titles=BANK_TITLES, roles={"main": OWN_VALUE_WEIGHT}),
    "v1-value": Registered(V1Value, "v1-value (BoV Table 1): v = c V_1 in the target layers", BANK_OF_VALUES,
                           scalar_titles=BANK_TITLES, grid_rule=v1_grid_options),
    "v-scale": Registered(VScale, "v-scale (BoV Table 1 control): v = c x W^V in the target layers",
                          BANK_OF_VALUES, scalar_titles=BANK_TITLES),
    "value-embed": Registered(ValueEmbed, "value embeddings: V + gate * E_v[token id] on every second "
                              "layer (nanochat)", BANK_OF_VALUES),
}


def _entry(cfg: ModelConfig) -> Registered:
    if cfg.value_path not in VALUE_PATHS:
        raise ConfigError(
            f"ModelConfig.value_path = {cfg.value_path!r} is not allowed: choose one of "
            f"{', '.join(map(repr, VALUE_PATHS))}."
        )
    return VALUE_PATHS[cfg.value_path]


def make_value_path(cfg: ModelConfig, layer: int) -> ValuePath:
    entry = _entry(cfg)
    return entry.module(cfg, layer, entry.options(cfg))


def make_shared_module(cfg: ModelConfig) -> SharedModule | None:
    entry = _entry(cfg)
    return entry.module.make_shared(cfg, entry.options(cfg))


def value_layers(cfg: ModelConfig) -> list[int]:
    """The layers that own a value projection W^V."""
    entry = _entry(cfg)
    opts = entry.options(cfg)
    return [i for i in range(cfg.n_layers) if entry.module.has_value_map(cfg, opts, i)]


def validate_value_path(cfg: ModelConfig) -> None:
    """The value path's name, its options (their types and values) and its checks that need the sizes."""
    entry = _entry(cfg)
    entry.module.validate(cfg, entry.options(cfg))


def check_value_path(cfg: ModelConfig) -> None:
    """What `ModelConfig` checks through the registry: the value path, and that tied reparameterised
    inits find a W^V in every layer."""
    validate_value_path(cfg)
    if cfg.reparam_tie != "none":  # after the value path's options are known to be valid
        bare = sorted(set(range(cfg.n_layers)) - set(value_layers(cfg)))
        if bare:
            raise ConfigError(f"ModelConfig.reparam_tie = {cfg.reparam_tie!r} is not allowed: it ties "
                              f"W_P,init to the layers' W_V,init, but value_path={cfg.value_path!r} has no "
                              f"W_V in layers {bare} (0-based); use reparam_tie='none' with this value path.")


def scalar_role(name: str) -> str | None:
    """The optimizer role some value path gives the learned scalar `name` (a parameter name such as
    ``blocks.3.attn.values.lambda2.gain``), or None."""
    parts = name.split(".")
    if len(parts) < 3 or parts[-1] != "gain" or parts[-3] != "values":
        return None
    roles = {role for entry in VALUE_PATHS.values()
             for short, role in entry.roles.items() if short == parts[-2]}
    return roles.pop() if len(roles) == 1 else None


# ModelConfig runs these checks on construction (it imports nothing of the registry)
register_checks(check_value_path)

__all__ = ["BANK_OF_VALUES", "OWN_VALUE_WEIGHT", "VALUE_PATHS", "VALUE_RESIDUAL", "LayerRole",
           "LayerValues", "Registered", "ResFormerOptions", "SharedModule", "ValuePath", "ValuePathOptions",
           "check_value_path", "is_value_table",
           "make_shared_module", "make_value_path", "scalar_role", "target_layers", "validate_value_path",
           "value_layers"]
