"""Value paths: how each layer gets its values (see `base.ValuePath` for the interface).

Registry: name -> `Registered`, the module class that computes the values (and says what the cache
keeps) with what the rest of blocklab reads about it. A new variant is one class in a module here,
one entry below and a test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from blocklab.errors import ConfigError
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
    LayerValues,
    SharedModule,
    StandardValues,
    ValuePath,
    ValuePathOptions,
    is_value_table,
    resolve_options,
    target_layers,
)
from blocklab.model.value_paths.baselines import (
    DENSEFORMER_TITLES,
    CrossLayerAttention,
    CrossLayerKV,
    DenseFormer,
    NeuTRENO,
)
from blocklab.model.value_paths.resformer import (
    DENSE_TITLES,
    RESFORMER_TITLES,
    ConstantResFormer,
    DenseResFormer,
    LearnableResFormer,
    LearnableResFormerPlus,
    LearnedMixResFormer,
    SparseResFormer,
    SVFormer,
    ValueResidual,
    resformer_baseline_options,
)
from blocklab.model.value_paths.value_embed import ValueEmbed

if TYPE_CHECKING:
    from blocklab.model.fields import ModelFields

GridRule = Callable[[dict[str, Any], int], dict[str, Any]]
BaselineRule = Callable[[type[ValuePath], "ModelFields", dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Registered:
    """A value path's registry entry: its module class and what tooling reads about it.

    scalar_titles: learned scalar (parameter name) -> its title in plots (analysis/scalars.py);
    grid_rule: how a comparison grid's options read at a given depth (compare.py);
    baseline_rule: the options under which it starts where a pretrained baseline is (retrofitting).
    """

    module: type[ValuePath]
    scalar_titles: dict[str, str] = field(default_factory=dict)
    grid_rule: GridRule | None = None
    baseline_rule: BaselineRule | None = None

    @property
    def description(self) -> str:
        return self.module.description

    def grid_options(self, options: dict[str, Any], n_layers: int) -> dict[str, Any]:
        """`options` as a comparison grid means them for a model of `n_layers`."""
        return options if self.grid_rule is None else self.grid_rule(options, n_layers)

    def baseline_options(self, cfg: ModelFields, given: dict[str, Any]) -> dict[str, Any]:
        """Options under which this variant starts where the baseline is (the caller's `given` win)."""
        return given if self.baseline_rule is None else self.baseline_rule(self.module, cfg, given)


def _resformer(module: type[ValuePath]) -> Registered:
    return Registered(module, RESFORMER_TITLES, baseline_rule=resformer_baseline_options)


VALUE_PATHS: dict[str, Registered] = {
    "standard": Registered(StandardValues),
    "resformer": _resformer(ValueResidual),
    "resformer-constant": _resformer(ConstantResFormer),
    "resformer-sparse": _resformer(SparseResFormer),
    "resformer-learnable": _resformer(LearnableResFormer),
    "resformer-mix": _resformer(LearnedMixResFormer),
    "resformer-learnable-plus": _resformer(LearnableResFormerPlus),
    "resformer-dense": Registered(DenseResFormer, DENSE_TITLES),
    "svformer": Registered(SVFormer),
    "neutreno": Registered(NeuTRENO),
    "denseformer": Registered(DenseFormer, DENSEFORMER_TITLES),
    "cla": Registered(CrossLayerKV),
    "cross-layer-attn": Registered(CrossLayerAttention),
    "bov": Registered(BankOfValues, BANK_TITLES),
    "bov-resformer": Registered(ResFormerBank, BANK_TITLES),
    "x0-value": Registered(X0Value, BANK_TITLES),
    "v1-value": Registered(V1Value, BANK_TITLES, grid_rule=v1_grid_options),
    "v-scale": Registered(VScale, BANK_TITLES),
    "value-embed": Registered(ValueEmbed),
}


def value_path_class(cfg: ModelFields) -> type[ValuePath]:
    return VALUE_PATHS[cfg.value_path].module


def make_value_path(cfg: ModelFields, layer: int) -> ValuePath:
    return value_path_class(cfg)(cfg, layer)


def make_shared_module(cfg: ModelFields) -> SharedModule | None:
    return value_path_class(cfg).make_shared(cfg)


def validate_value_path(cfg: ModelFields) -> None:
    if cfg.value_path not in VALUE_PATHS:
        raise ConfigError(
            f"ModelConfig.value_path = {cfg.value_path!r} is not allowed: choose one of "
            f"{', '.join(map(repr, VALUE_PATHS))}."
        )
    cls = value_path_class(cfg)
    resolve_options(cls.options, cfg)
    cls.validate(cfg)


__all__ = ["VALUE_PATHS", "LayerValues", "Registered", "SharedModule", "ValuePath", "ValuePathOptions",
           "is_value_table",
           "make_shared_module", "make_value_path", "target_layers", "validate_value_path",
           "value_path_class"]
