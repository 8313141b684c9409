"""One base for blocklab's configuration dataclasses (model, data, optimiser, training, fine-tuning).

Every config reads and writes plain dicts the same way, and every unknown key, whether passed as a
keyword, in a dict or in a YAML file, is a `ConfigError` that names the class and the closest fields.
`check_types` checks each field's value against its annotated type, the one way blocklab does so:

    @config_dataclass
    class DataConfig(ConfigBase):
        source: str = "python-stdlib"
        ...

Leaf module: it imports only `blocklab.util.errors`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from blocklab.util.errors import ConfigError

C = TypeVar("C", bound="ConfigBase")


def is_count(value: Any, low: int = 0) -> bool:
    """Whether `value` is an int of at least `low` (steps, seeds, threads ...); a bool is not a count."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


# (does a value pass, what the message says it must be): the rule of one annotated type
Rule = tuple[Callable[[Any], bool], str]


def _class_rule(kind: type) -> Rule:
    if kind is bool:
        return (lambda v: isinstance(v, bool)), "it must be True or False"
    if kind is int:
        return (lambda v: isinstance(v, int) and not isinstance(v, bool)), "it must be an integer"
    if kind is float:
        return (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)), "it must be a number"
    if kind in (list, tuple):  # JSON and YAML read a tuple back as a list
        return (lambda v: isinstance(v, (list, tuple))), "it must be a list"
    names: dict[type, str] = {str: "a string", dict: "a dict"}
    words = names.get(kind, f"of type {kind.__name__}")
    return (lambda v: isinstance(v, kind)), f"it must be {words}"


def type_rule(hint: Any) -> Rule | None:
    """How `check_type` checks a value of the type `hint`; None: a type it leaves to later checks.

    A `Literal` holds one of its choices; bool, int, float, str, dict and list (also `list[int]` ...)
    their own type, where ints pass for floats and bools never pass for numbers (True == 1); `X | None`
    is None or an X. Other unions (e.g. ``str | list[int]``) and `Any` are left to the checks that read
    them.
    """
    origin = typing.get_origin(hint)
    if hint is Any:  # a class since Python 3.11, which isinstance refuses
        return None
    if origin is Literal:
        choices = typing.get_args(hint)
        return ((lambda v: any(v == c and isinstance(v, bool) == isinstance(c, bool) for c in choices)),
                f"choose one of {', '.join(map(repr, choices))}")
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        rule = type_rule(args[0]) if len(args) == 1 else None
        if rule is None:
            return None
        test, words = rule
        return (lambda v: v is None or test(v)), f"{words} or None"
    kind = origin or hint
    return _class_rule(kind) if isinstance(kind, type) else None


def check_type(label: str, value: Any, hint: Any) -> None:
    """Raise ConfigError unless `value` is of the type `hint` (see `type_rule`). `label` names the
    setting in the message: ``"ModelConfig.d_model"``, ``"value_path_options['layers']"``."""
    _apply(type_rule(hint), label, value)


def _apply(rule: Rule | None, label: str, value: Any) -> None:
    if rule is not None and not rule[0](value):
        raise ConfigError(f"{label} = {value!r} is not allowed: {rule[1]}.")


_RULES: dict[type, list[tuple[str, Rule | None]]] = {}  # per dataclass: its fields' rules, in order


def _field_rules(cls: type) -> list[tuple[str, Rule | None]]:
    if cls not in _RULES:
        hints = typing.get_type_hints(cls)
        _RULES[cls] = [(f.name, type_rule(hints[f.name])) for f in dataclasses.fields(cls)]
    return _RULES[cls]


def check_types(obj: Any, label: str = "") -> None:
    """`check_type` on every field of the dataclass instance `obj`, in field order, against its
    annotation. `label` names a field in the message, with ``{}`` for the field's name: by default
    ``"<class name>.{}"`` (``"ModelConfig.{}"``); a value path's options: ``"value_path_options[{!r}]"``."""
    label = label or f"{type(obj).__name__}.{{}}"
    for name, rule in _field_rules(type(obj)):
        _apply(rule, label.format(name), getattr(obj, name))


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


def field_error(owner: str, name: str, value: Any, allowed: str) -> ConfigError:
    """The error for field `name` of the config `owner` (``"ModelConfig"``): its value and what is allowed."""
    return ConfigError(f"{owner}.{name} = {value!r} is not allowed: {allowed}")


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
        raise field_error(cls.__name__, name, value, allowed)
