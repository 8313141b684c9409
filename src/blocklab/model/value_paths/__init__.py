"""Value paths: how each layer gets its values (see `base.ValuePath` for the interface).

Registry: name -> strategy class. A new variant is one class in a module here, one entry below and
a test.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from blocklab.errors import ConfigError
from blocklab.model.value_paths.bank import (
    BankOfValues,
    ResFormerBank,
    V1Value,
    ValueEmbed,
    VScale,
    X0Value,
)
from blocklab.model.value_paths.base import (
    LayerValues,
    SharedModule,
    StandardValues,
    ValuePath,
    is_value_table,
    resolve_options,
    target_layers,
)
from blocklab.model.value_paths.baselines import CrossLayerAttention, CrossLayerKV, DenseFormer, NeuTRENO
from blocklab.model.value_paths.resformer import (
    ConstantResFormer,
    DenseResFormer,
    LearnableResFormer,
    LearnableResFormerPlus,
    LearnedMixResFormer,
    SparseResFormer,
    SVFormer,
    ValueResidual,
)

if TYPE_CHECKING:
    from blocklab.model.fields import ModelFields

VALUE_PATHS: dict[str, type[ValuePath]] = {
    "standard": StandardValues,
    "resformer": ValueResidual,
    "resformer-constant": ConstantResFormer,
    "resformer-sparse": SparseResFormer,
    "resformer-learnable": LearnableResFormer,
    "resformer-mix": LearnedMixResFormer,
    "resformer-learnable-plus": LearnableResFormerPlus,
    "resformer-dense": DenseResFormer,
    "svformer": SVFormer,
    "neutreno": NeuTRENO,
    "denseformer": DenseFormer,
    "cla": CrossLayerKV,
    "cross-layer-attn": CrossLayerAttention,
    "bov": BankOfValues,
    "bov-resformer": ResFormerBank,
    "x0-value": X0Value,
    "v1-value": V1Value,
    "v-scale": VScale,
    "value-embed": ValueEmbed,
}


def make_value_path(cfg: ModelFields, layer: int) -> ValuePath:
    return VALUE_PATHS[cfg.value_path](cfg, layer)


def make_shared_module(cfg: ModelFields) -> SharedModule | None:
    return VALUE_PATHS[cfg.value_path].make_shared(cfg)


def validate_value_path(cfg: ModelFields) -> None:
    if cfg.value_path not in VALUE_PATHS:
        raise ConfigError(
            f"ModelConfig.value_path = {cfg.value_path!r} is not allowed: choose one of "
            f"{', '.join(map(repr, VALUE_PATHS))}."
        )
    cls = VALUE_PATHS[cfg.value_path]
    resolve_options(cls, cfg)
    cls.validate(cfg)


__all__ = ["VALUE_PATHS", "LayerValues", "SharedModule", "ValuePath", "is_value_table", "make_shared_module",
           "make_value_path", "target_layers", "validate_value_path"]
