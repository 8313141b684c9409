"""A value path's settings (`ModelConfig.value_path_options`) and the layer sets they name.

A value path's options are a frozen dataclass of typed fields with defaults, a docstring line each,
that checks its own values (`ValuePathOptions.__post_init__`). A saved config keeps them as a plain
dict; the registry (model/value_paths/__init__.py) builds the dataclass once, from the registry
entry's defaults and the config's dict (`read_options`), and hands it to the path's class.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeVar

from blocklab.util.configbase import check_types
from blocklab.util.errors import ConfigError

# Target layers: "all", "last-third", "every-2", "last-K" or a list of layer indices (`target_layers`)
LayerSpec = str | list[int]


def target_layers(spec: Any, n_layers: int, name: str = "layers") -> frozenset[int]:
    """Layer indices (0-based) named by `spec`.

    ``"all"``; ``"last-third"`` (i >= floor(2L/3), Bank of Values); ``"every-2"`` (every second
    layer ending with the last, nanochat); ``"last-K"`` (the last K layers); or a list of indices.
    Every value path resolves its target layers here, so this is the one place that rejects an
    empty set (the model would silently stay a standard Transformer) and bools (True == 1).
    """
    allowed = (f"use 'all', 'last-third', 'every-2', 'last-K' (K >= 1) or a non-empty list of layer "
               f"indices in [0, {n_layers}).")
    if spec == "all":
        layers = frozenset(range(n_layers))
    elif spec == "last-third":
        layers = frozenset(range(2 * n_layers // 3, n_layers))
    elif spec == "every-2":
        layers = frozenset(i for i in range(n_layers) if i % 2 == (n_layers - 1) % 2)
    elif isinstance(spec, str) and spec.startswith("last-") and spec[5:].isdigit():
        layers = frozenset(range(max(0, n_layers - int(spec[5:])), n_layers))
    elif isinstance(spec, (list, tuple)) and all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n_layers for i in spec):
        layers = frozenset(spec)
    else:
        raise ConfigError(f"value_path_options[{name!r}] = {spec!r} is not allowed: {allowed}")
    if not layers:
        raise ConfigError(f"value_path_options[{name!r}] = {spec!r} names no layer, so the value path "
                          f"would change nothing: {allowed}")
    return layers


@dataclass(frozen=True)
class ValuePathOptions:
    """A value path's settings (`ModelConfig.value_path_options`); the standard path has none.

    A value path's own subclass declares typed fields with defaults, a docstring line each, and
    extends `__post_init__` with the checks of its values (calling this one first, which checks each
    value against its annotated type). Checks that need the model's sizes are the path's `validate`.
    """

    def __post_init__(self) -> None:
        check_types(self, "value_path_options[{!r}]")  # as ModelConfig checks its fields


Options = TypeVar("Options", bound=ValuePathOptions)


def read_options(options: type[Options], given: dict[str, Any], defaults: dict[str, Any],
                 value_path: str) -> Options:
    """`options` built from a registry entry's `defaults` and a config's `given` dict (which win),
    checked; an unknown key names the options `value_path` takes."""
    allowed = [f.name for f in fields(options)]
    unknown = set(given) - set(allowed)
    if unknown:
        raise ConfigError(
            f"value_path_options has {', '.join(sorted(unknown))!s}, which value_path="
            f"{value_path!r} does not take; its options are: {', '.join(sorted(allowed)) or 'none'}."
        )
    try:
        return options(**{**defaults, **given})
    except ConfigError as err:
        raise ConfigError(f"value_path={value_path!r}: {err}") from None
