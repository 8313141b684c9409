"""`ModelConfig`: the model's fields (model/fields.py), checked on construction (model/validation.py)
and read from and written to JSON and YAML.

Named architecture and size presets sit above the model (`blocklab.presets`): importing that module
registers its resolver here, so `ModelConfig.from_preset` works without the model importing upward.
`blocklab.ModelConfig` and `blocklab.config` load the presets for you.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blocklab.configbase import check_fields, config_dataclass
from blocklab.errors import ConfigError
from blocklab.model.fields import ModelFields
from blocklab.model.validation import validate

# (arch, size) -> field overrides; set by `blocklab.presets` when it is imported (`register_presets`)
_resolve_preset: Callable[[str, str], dict[str, Any]] | None = None


def register_presets(resolve: Callable[[str, str], dict[str, Any]]) -> None:
    """Let `ModelConfig.from_preset` read named presets through `resolve(arch, size)`."""
    global _resolve_preset
    _resolve_preset = resolve


@config_dataclass
class ModelConfig(ModelFields):
    def __post_init__(self) -> None:
        validate(self)

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def from_preset(cls, arch: str = "pre-ln", size: str = "tiny", **overrides: Any) -> ModelConfig:
        """Defaults, then the size preset, then the architecture preset, then `overrides`.

        `arch` is a block preset, optionally joined with a value path: ``"sas-p"``,
        ``"pre-ln+resformer"``.
        """
        if _resolve_preset is None:
            raise ConfigError("ModelConfig.from_preset reads the named presets of blocklab.presets; import "
                              "blocklab.presets (or use blocklab.ModelConfig, which does).")
        fields = _resolve_preset(arch, size)
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
            import yaml

            return cls.from_dict(yaml.safe_load(text) or {})
        return cls.from_dict(json.loads(text))
