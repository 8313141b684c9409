"""One base for blocklab's configuration dataclasses (model, data, optimiser, training, fine-tuning).

Every config reads and writes plain dicts the same way, and every unknown key, whether passed as a
keyword, in a dict or in a YAML file, is a `ConfigError` that names the class and the closest fields:

    @config_dataclass
    class DataConfig(ConfigBase):
        source: str = "python-stdlib"
        ...

Leaf module: it imports only `blocklab.errors`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from typing import Any, TypeVar

from blocklab.errors import ConfigError

C = TypeVar("C", bound="ConfigBase")


def is_count(value: Any, low: int = 0) -> bool:
    """Whether `value` is an int of at least `low` (steps, seeds, threads ...); a bool is not a count."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def check_fields(cls: type, data: Any) -> None:
    """Raise ConfigError for a key that is not a field of the dataclass `cls`, suggesting close names."""
    if not isinstance(data, dict):
        raise ConfigError(f"a {cls.__name__} is read from a mapping of field names to values; got "
                          f"{type(data).__name__}")
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"unknown {cls.__name__} field {key!r}.{hint} "
                              f"Known fields: {', '.join(names)}.")


def floats_from_strings(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """PyYAML (YAML 1.1) reads `1e-5` as a string; read such strings in `cls`'s float fields as floats."""
    out = dict(data)
    for f in dataclasses.fields(cls):
        value = out.get(f.name)
        if str(f.type).startswith("float") and isinstance(value, str):
            try:
                out[f.name] = float(value)
            except ValueError:
                pass  # the class's own checks name the field
    return out


def config_dataclass(cls: type[C]) -> type[C]:
    """`@dataclass`, with unknown keywords to the constructor raising ConfigError (not TypeError)."""
    cls = dataclasses.dataclass(cls)
    init = cls.__init__

    @functools.wraps(init)
    def checked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        check_fields(cls, kwargs)
        init(self, *args, **kwargs)

    cls.__init__ = checked_init  # type: ignore[method-assign]
    return cls


def _plain(value: Any) -> Any:
    """Tuples as lists and nested configs as dicts: what JSON and YAML hold."""
    if isinstance(value, ConfigBase):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class ConfigBase:
    """from_dict / to_dict / replace and a `fail` that names the class, for a `@config_dataclass`."""

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any]) -> C:
        """Build from plain data (a JSON or YAML mapping); unknown keys are a ConfigError."""
        check_fields(cls, data)
        return cls(**floats_from_strings(cls, data))

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain data (lists for tuples, dicts for nested configs): from_dict's inverse."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    def replace(self: C, **changes: Any) -> C:
        """A copy with `changes` applied and checked like any new config."""
        check_fields(type(self), changes)
        return dataclasses.replace(self, **floats_from_strings(type(self), changes))  # type: ignore[type-var]

    @classmethod
    def fail(cls, name: str, value: Any, allowed: str) -> None:
        """Raise the ConfigError for field `name`: its class, its value and what is allowed."""
        raise ConfigError(f"{cls.__name__}.{name} = {value!r} is not allowed: {allowed}")
