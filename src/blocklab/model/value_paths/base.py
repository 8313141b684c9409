"""The value-path interface and the helpers its strategies share.

A value path answers, for one layer, with data rather than callbacks:
1. which parameters do I own (a value projection, a table, lambdas, nothing)? (`__init__`)
2. given the normed block input, the queries and keys and the `Carry`, what are V (and, for the
   baselines that change them, Q, K, keys and values of another layer, an output correction), and
   what do I put into the carry for later layers? (`forward` returns `LayerValues` and the carry)
3. what must a KV cache keep? (`key_layer`, `value_layer`, `reads_layers`; and `values_from_cache`
   maps what it kept to this layer's values)
4. its rules: option checks that need the model's sizes (`validate`; its options dataclass checks
   its own values), whether a layer owns W^V (`has_value_map`), and how its new parameters start
   from a pretrained baseline (`start_at_baseline`, `init_from_baseline`).
5. optionally, whether its values read exactly x W^V of the block's normed input (`input_value_map`):
   then the block may compute x W^V in one GEMM with W_Q, W_K (and the parallel layout's first MLP
   matrix) and hand it over as `forward(..., projected=...)`; `value_projection` reads it.

What the rest of blocklab reads about a value path (the titles of its learned scalars in plots, how a
comparison grid's options read at a given depth, the options under which it starts at a pretrained
baseline) is in its registry entry (`Registered`, model/value_paths/__init__.py), not on the class.

`Attention` (model/block.py) runs the attention itself, always through `blocklab.ops`. State
that belongs to the whole model (a shared table, depth weights) lives in a `SharedModule` that the
Transformer runs before the first block and after each block. Strategies override only what they
need; everything else is the standard Transformer. `options` is a strategy's settings: a frozen
dataclass of typed fields with defaults (set through `ModelConfig.value_path_options`, a plain dict in
saved configs) that checks its own values; `resolve_options` builds it from a config.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from torch import Tensor, nn

from blocklab.errors import ConfigError
from blocklab.model.carry import Carry
from blocklab.model.linear_maps import make_value_map, plain_linear

if TYPE_CHECKING:
    from blocklab.model.fields import ModelFields

# Target layers: "all", "last-third", "every-2", "last-K" or a list of layer indices (`target_layers`)
LayerSpec = str | list[int]
VALUE_TABLE = "value_table"  # the parameter name of every token-indexed value table (own optimizer group)


def carried(value: Tensor | None) -> Tensor:
    """A carry field an earlier layer fills (V_1, K_1, x0 ...), read by a later one: the layers run in
    order, so it is always there by then."""
    assert value is not None, "an earlier layer fills this field of the carry"
    return value


def is_value_table(name: str) -> bool:
    """Whether the parameter `name` (e.g. ``blocks.9.attn.values.value_table``) is a value table."""
    return name.rsplit(".", 1)[-1] == VALUE_TABLE


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
        hints = _type_hints(type(self))
        for f in fields(self):
            _check_type(f.name, getattr(self, f.name), hints[f.name])


Options = TypeVar("Options", bound=ValuePathOptions)


def resolve_options(options: type[Options], cfg: ModelFields) -> Options:
    """The options of `cfg`'s value path (whose options class is `options`), checked."""
    given = cfg.value_path_options
    allowed = [f.name for f in fields(options)]
    unknown = set(given) - set(allowed)
    if unknown:
        raise ConfigError(
            f"value_path_options has {', '.join(sorted(unknown))!s}, which value_path="
            f"{cfg.value_path!r} does not take; its options are: {', '.join(sorted(allowed)) or 'none'}."
        )
    try:
        return options(**given)
    except ConfigError as err:
        raise ConfigError(f"value_path={cfg.value_path!r}: {err}") from None


_HINTS: dict[type[ValuePathOptions], dict[str, Any]] = {}  # per options class: its fields' types


def _type_hints(options: type[ValuePathOptions]) -> dict[str, Any]:
    if options not in _HINTS:
        _HINTS[options] = typing.get_type_hints(options)
    return _HINTS[options]


def _check_type(name: str, value: Any, hint: Any) -> None:
    """`value` is of type `hint` (ints pass for floats, bools only for bools); unions such as
    `LayerSpec` are left to the checks that read them (`target_layers`)."""
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        ok, kind = value in choices, "one of " + ", ".join(map(repr, choices))
    elif hint is bool:
        ok, kind = isinstance(value, bool), "true or false"
    elif hint in (int, float):
        wanted = int if hint is int else (int, float)
        ok, kind = isinstance(value, wanted) and not isinstance(value, bool), hint.__name__
    elif hint is list or typing.get_origin(hint) is list:
        ok, kind = isinstance(value, (list, tuple)), "a list"
    elif isinstance(hint, type):
        ok, kind = isinstance(value, hint), hint.__name__
    else:
        return
    if not ok:
        raise ConfigError(f"value_path_options[{name!r}] = {value!r} is not allowed: it must be {kind}.")


@dataclass
class LayerValues:
    """What a value path gives its attention layer for the current tokens."""

    q: Tensor  # (B, H, T, D) queries
    k: Tensor  # (B, H_kv, T, D) keys
    v: Tensor  # (B, T, kv_dim) values
    # keys and values (B, H_kv, T, D) of another layer, attended alongside (cross-layer attention);
    # while decoding the cache supplies them for every visible position instead
    other_kv: tuple[Tensor, Tensor] | None = None
    offset: Tensor | None = None  # (B, T, kv_dim) added to the attention output (NeuTRENO)


class ValuePath(nn.Module):
    """The standard Transformer value path: V_n = H_{n-1} W^V_n (Simplifying, Eq. 2).

    W^V is linear, the identity or reparameterised (Eq. 6), as `value_form` says.
    """

    description: ClassVar[str] = "each layer projects its own values, V_n = H_{n-1} W^V_n"
    options: ClassVar[type[ValuePathOptions]] = ValuePathOptions
    opts: ValuePathOptions  # this layer's resolved options (a subclass narrows the type)
    owns_keys = True  # False: this layer has no W_K and reuses another layer's keys (CLA)
    caches_values = True  # False: the cache keeps no V for this layer
    key_sets = 1  # how many sets of T keys a query attends over (FLOPs accounting)
    # True: wherever this path has a value map `w_v`, `forward` reads exactly w_v(x) of its input x
    # (through `value_projection`), so the block may fuse it (`input_value_map`)
    fuses_values: ClassVar[bool] = False

    def __init__(self, cfg: ModelFields, layer: int):
        super().__init__()
        self.layer = layer
        self.opts = resolve_options(self.options, cfg)
        # What the KV cache (model/cache.py) keeps, stated as data flow so that it needs no names:
        # key_layer: the layer whose cached keys this layer attends over (itself unless it owns none);
        # value_layer: the layer whose cached values `values_from_cache` maps to this layer's values
        #   (itself when it caches values; None: the values are a function of the token ids);
        # reads_layers: at most one further layer whose cached keys and values it also attends over.
        self.key_layer: int = layer
        self.value_layer: int | None = layer
        self.reads_layers: tuple[int, ...] = ()

    @staticmethod
    def make_value_map(cfg: ModelFields, layer: int) -> nn.Module:
        return make_value_map(cfg.value_form_of(layer), cfg)

    def forward(self, x: Tensor, q: Tensor, k: Tensor | None, carry: Carry,
                projected: Tensor | None = None) -> tuple[LayerValues, Carry]:
        """This layer's values (and Q, K) for the current tokens, and the carry for later layers.

        x: the normed block input (B, T, d); q, k: (B, H, T, D) heads after QK-norm and RoPE (k is
        None in a layer that owns no keys); projected: x W^V (B, T, kv_dim) computed by the block in
        one GEMM with the other maps of x, passed only when `input_value_map` names a map.
        """
        raise NotImplementedError

    def input_value_map(self) -> nn.Linear | None:
        """The W^V whose output on the block's input x this layer's `forward` reads, when it is a plain
        `nn.Linear` and the path declares `fuses_values`; None: nothing to fuse (no W^V in this layer,
        identity or reparameterised W^V, values from elsewhere). A path whose forward in some layers
        holds a W^V but does not read w_v(x) overrides this (x0-value's substitutive targets)."""
        return plain_linear(getattr(self, "w_v", None)) if self.fuses_values else None

    def value_projection(self, x: Tensor, projected: Tensor | None) -> Tensor:
        """x W^V: the block's fused `projected` when given, else this layer's own map on x."""
        return projected if projected is not None else value_map_of(self)(x)

    def values_from_cache(self, source: Tensor, carry: Carry) -> Tensor:  # noqa: ARG002 (the interface)
        """This layer's values (B, T, kv_dim) at the cached positions, from what the cache holds.

        `source` is the cached values of `value_layer` (B, T, kv_dim), or the token ids (B, T) when
        `value_layer` is None. It must agree with `forward` on the current tokens. The default is
        the identity: the layer attends over the values it (or `value_layer`) cached.
        """
        return source

    # -- starting from a pretrained baseline (interop/retrofitting.py) -----------------------------
    def start_at_baseline(self) -> None:
        """Set new parameters so that this layer computes what the baseline computed."""

    def init_from_baseline(self, token_embedding: Tensor, baseline: Sequence[ValuePath]) -> None:
        """Initialise from the pretrained baseline's weights (Bank of Values' tables from its W^V);
        `baseline` holds the baseline's value path of every layer."""

    def init_from_model(self, token_embedding: Tensor) -> None:
        """Initialisation that needs other parts of the model: the token embedding E (BoV's tables)."""

    # -- rules read by the rest of blocklab ----------------------------------------------------------
    @classmethod
    def make_shared(cls, cfg: ModelFields) -> SharedModule | None:  # noqa: ARG003
        """The model-level module of this value path, if it has one."""
        return None

    @classmethod
    def validate(cls, cfg: ModelFields) -> None:
        """Raise ConfigError for combinations that make no sense."""

    @classmethod
    def has_value_map(cls, cfg: ModelFields, layer: int) -> bool:  # noqa: ARG003
        """Whether `layer` owns a value projection W^V (False: SVFormer, CLA followers, BoV targets).

        Read by validation: tied reparameterised inits need W_V in every layer.
        """
        return True


class SharedModule(nn.Module):
    """The model-level module of a value path: parameters read by every layer (a shared table,
    adaptive weights, depth weights). The Transformer runs `before_blocks` once per forward pass
    and `after_block` after every block, outside the blocks, so per-block FSDP and compile hold."""

    def before_blocks(self, carry: Carry) -> Carry:
        return carry

    def after_block(self, layer: int, x: Tensor, carry: Carry) -> tuple[Tensor, Carry]:  # noqa: ARG002
        return x, carry

    def start_at_baseline(self) -> None:
        """See `ValuePath.start_at_baseline`."""

    def init_from_baseline(self, token_embedding: Tensor, baseline: Sequence[ValuePath]) -> None:
        """See `ValuePath.init_from_baseline`."""

    def init_from_model(self, token_embedding: Tensor) -> None:
        """See `ValuePath.init_from_model`."""

    def upgrade_state_dict(self, state_dict: dict[str, Any], prefix: str) -> None:
        """Rename, in place, the keys of weights saved under an older layout (`prefix`: the model's)."""


def value_map(path: ValuePath) -> nn.Module | None:
    """The value projection W^V that `path` keeps as ``w_v`` (None in a layer that owns none)."""
    w_v = path.w_v  # set by each strategy, so typed only as nn.Module.__getattr__ types attributes
    assert w_v is None or isinstance(w_v, nn.Module)
    return w_v


def value_map_of(path: ValuePath) -> nn.Module:
    """The value projection W^V of a layer that has one."""
    w_v = value_map(path)
    assert w_v is not None, "only a layer with a value map computes x W^V"
    return w_v


class StandardValues(ValuePath):
    fuses_values = True

    def __init__(self, cfg: ModelFields, layer: int):
        super().__init__(cfg, layer)
        self.w_v = self.make_value_map(cfg, layer)

    def forward(self, x: Tensor, q: Tensor, k: Tensor | None, carry: Carry,
                projected: Tensor | None = None) -> tuple[LayerValues, Carry]:
        assert k is not None
        return LayerValues(q, k, self.value_projection(x, projected)), carry
