"""`ModelConfig`: the model's config, as everyone builds it, checked whole on construction, with its
named presets and its reading and writing of JSON and YAML.

A `ModelConfig` is the flat fields of `ModelFields` (model/fields.py: the fields, the views the
components read and the rules of the fields alone); on construction it calls each component's rules,
imported from the module that owns them, in this order:

    check_field_rules        sizes, each field's type, standard deviations, finite numbers  model/fields.py
    check_attention          head sizes, grouped-query heads, biases, logit scale, windows  model/attention.py
    position_shape.check     the sizes rotary and sinusoidal positions need, their base    model/positions.py
    norm_shape.check         the norm's kind, eps and affine settings                      model/norms.py
    mlp_shape.check          the activation's settings                                     model/mlp.py
    check_trunk              nanochat's trunk: smear, backout, its init                    model/trunk.py
    check_linear_forms       identity and reparameterised value and projection maps  model/linear_maps.py
    check_block_layout       `block_layout` names a layout, and that layout's `check`      model/block.py
    check_value_path         `value_path`, its options, and what it needs of the sizes     model/value_paths/

`from_preset` reads the named presets (model/presets.py). This module sits above the components it
checks: they read `ModelFields`, never this module, so nothing needs to register itself here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from blocklab.model import presets
from blocklab.model.attention import check_attention
from blocklab.model.block import check_block_layout
from blocklab.model.fields import ModelFields, check_field_rules
from blocklab.model.linear_maps import check_linear_forms
from blocklab.model.trunk import check_trunk
from blocklab.model.value_paths import check_value_path
from blocklab.util.configbase import check_fields, config_dataclass


@config_dataclass
class ModelConfig(ModelFields):
    """Every model blocklab builds: the fields of `ModelFields`, checked with every component's rules."""

    def __post_init__(self) -> None:
        check_field_rules(self)
        check_attention(self)
        self.position_shape.check()
        self.norm_shape.check()
        self.mlp_shape.check()
        check_trunk(self)
        check_linear_forms(self)
        check_block_layout(self)
        check_value_path(self)

    @classmethod
    def from_preset(cls, arch: str = "pre-ln", size: str = "tiny", **overrides: Any) -> ModelConfig:
        """Defaults, then the size preset, then the architecture preset, then `overrides`.

        `arch` is a block preset, optionally joined with a value path: ``"sas-p"``,
        ``"pre-ln+resformer"``.
        """
        fields = presets.resolve(arch, size)
        check_fields(cls, overrides)
        fields.update(overrides)
        return cls(**fields)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        """Read a config written as JSON or YAML (by extension)."""
        text = Path(path).read_text()
        if str(path).endswith((".yaml", ".yml")):
            from blocklab.util import yamltext

            return cls.from_dict(yamltext.load(text) or {})
        return cls.from_dict(json.loads(text))
