"""The value-path interface and the helpers its strategies share.

A value path answers, for one layer:
1. which parameters do I own (a value projection, a table, lambdas, nothing)?
2. given the normed block input, the queries and keys and the `Carry`, what are V (and, for the
   baselines that change them, Q and K), and what do I put into the carry for later layers?
3. what must a KV cache keep (`key_layer`, `value_layer`, `reads_layers`, `values_from_cache`)?

Strategies override only the hooks they need; everything else defaults to the standard
Transformer. `options` lists a strategy's settings (set through `ModelConfig.value_path_options`)
with their defaults.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from blocklab.config import ConfigError
from blocklab.model.carry import Carry
from blocklab.model.linear_maps import make_value_map


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


class ValuePath(nn.Module):
    """The standard Transformer value path: V_n = H_{n-1} W^V_n (Simplifying, Eq. 2).

    W^V is linear, the identity or reparameterised (Eq. 6), as `value_form` says.
    """

    description = "each layer projects its own values, V_n = H_{n-1} W^V_n"
    options: dict[str, Any] = {}
    owns_keys = True  # False: this layer has no W_K and reuses another layer's keys (CLA)
    caches_values = True  # False: the cache keeps no V for this layer
    key_sets = 1  # how many sets of T keys a query attends over (FLOPs accounting)

    def __init__(self, cfg, layer: int):
        super().__init__()
        self.layer = layer
        self.opts = resolve_options(type(self), cfg)
        # What the KV cache (model/cache.py) keeps, stated as data flow so that it needs no names:
        # key_layer: the layer whose cached keys this layer attends over (itself unless it owns none);
        # value_layer: the layer whose cached values `values_from_cache` maps to this layer's values
        #   (itself when it caches values; None: the values are a function of the token ids);
        # reads_layers: further layers whose cached keys and values `attend` reads.
        self.key_layer: int = layer
        self.value_layer: int | None = layer
        self.reads_layers: tuple[int, ...] = ()

    @staticmethod
    def make_value_map(cfg, layer: int) -> nn.Module:
        return make_value_map(cfg.value_form_of(layer), cfg)

    def forward(self, x: Tensor, q: Tensor, k: Tensor, carry: Carry
                ) -> tuple[Tensor, Tensor, Tensor, Carry]:
        """Return (q, k, v, carry): q, k as (B, H, T, D) heads, v as (B, T, kv_dim)."""
        raise NotImplementedError

    def attend(self, attn: nn.Module, q: Tensor, k: Tensor, v: Tensor, carry: Carry) -> Tensor:
        """Attention over (B, H, T, D) heads; a strategy may change which keys and values it sees."""
        return attn.attend(q, k, v, carry.cache)

    def values_from_cache(self, source: Tensor, carry: Carry) -> Tensor:
        """This layer's values (B, T, kv_dim) at the cached positions, from what the cache holds.

        `source` is the cached values of `value_layer` (B, T, kv_dim), or the token ids (B, T) when
        `value_layer` is None. It must agree with `forward` on the current tokens. The default is
        the identity: the layer attends over the values it (or `value_layer`) cached.
        """
        return source

    def correct(self, y: Tensor, v: Tensor, carry: Carry) -> Tensor:
        """A token-wise correction of the attention output y (B, H, T, D) (NeuTRENO)."""
        return y

    def after_block(self, x: Tensor, carry: Carry) -> tuple[Tensor, Carry]:
        """Act on the block output (DenseFormer)."""
        return x, carry

    def init_from_model(self, model: nn.Module) -> None:
        """Initialisation that needs other parts of the model (Bank of Values' tables)."""

    @classmethod
    def make_shared(cls, cfg) -> nn.Module | None:
        """A model-level module whose forward(carry) -> carry runs before the first block."""
        return None

    @classmethod
    def validate(cls, cfg) -> None:
        """Raise ConfigError for combinations that make no sense."""

    @classmethod
    def has_value_map(cls, cfg, layer: int) -> bool:
        """Whether `layer` owns a value projection W^V (False: SVFormer, CLA followers, BoV targets).

        Read by validation: tied reparameterised inits need W_V in every layer.
        """
        return True


class StandardValues(ValuePath):
    def __init__(self, cfg, layer: int):
        super().__init__(cfg, layer)
        self.w_v = self.make_value_map(cfg, layer)

    def forward(self, x, q, k, carry):
        return q, k, self.w_v(x), carry


def resolve_options(cls: type[ValuePath], cfg) -> dict[str, Any]:
    given = dict(cfg.value_path_options)
    unknown = set(given) - set(cls.options)
    if unknown:
        allowed = ", ".join(sorted(cls.options)) or "none"
        raise ConfigError(
            f"value_path_options has {', '.join(sorted(unknown))!s}, which value_path="
            f"{cfg.value_path!r} does not take; its options are: {allowed}."
        )
    for name, value in given.items():
        _check_option_type(cfg, name, value, cls.options[name])
    return {**cls.options, **given}


def _check_option_type(cfg, name: str, value: Any, default: Any) -> None:
    """An option takes values of its default's type (ints pass for floats; `layers` is checked later)."""
    if name == "layers" or default is None:
        return
    if isinstance(default, bool):
        ok, kind = isinstance(value, bool), "true or false"
    elif isinstance(default, (int, float)):
        wanted = int if isinstance(default, int) else (int, float)
        ok, kind = isinstance(value, wanted) and not isinstance(value, bool), type(default).__name__
    elif isinstance(default, list):
        ok, kind = isinstance(value, (list, tuple)), "a list"
    else:
        ok, kind = isinstance(value, type(default)), type(default).__name__
    if not ok:
        raise ConfigError(f"value_path_options[{name!r}] = {value!r} is not allowed for value_path="
                          f"{cfg.value_path!r}: it must be {kind}.")
