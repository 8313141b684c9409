"""The standard value path, V_n = H_{n-1} W^V_n, and what every value path answers.

A value path answers, for one layer, with data rather than callbacks:
1. which parameters do I own (a value projection W^V, a table, lambdas, nothing)? (`__init__`)
2. given the normed block input and the `Carry`, what are V (and, for the baselines that need them,
   another layer's keys and values, an output correction), and what do I put into the carry for
   later layers? (`layer_values`; `forward` adds V_1 to the carry in the layers that produce it)
3. where do this layer's keys and values come from (`LayerRole`, from the class's `role`): the
   attention and the KV cache read it, and derive everything else from it.
4. its rules: checks that need the model's sizes (`validate`; its options dataclass checks its own
   values), and how its new parameters start (`init_weights`) or start from a pretrained baseline
   (`start_at_baseline`, `init_from_baseline`).

Queries and keys are the attention's (model/attention.py): the one ablation that changes them,
ResFormer's query or key residual, answers `mix_heads`. What the rest of blocklab reads about a
value path is its registry entry (`Registered`, model/value_paths/__init__.py: its equation, its
options' defaults) and its catalog entry above the model (blocklab/catalog.py: its paper, the titles
of its learned scalars, its parameters' optimizer roles).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor, nn

from blocklab.model.carry import Carry
from blocklab.model.gains import Gain
from blocklab.model.linear_maps import make_value_map
from blocklab.model.value_paths.options import ValuePathOptions

if TYPE_CHECKING:
    from blocklab.model.fields import ModelFields


@dataclass
class LayerValues:
    """What a value path gives its attention layer for the current tokens."""

    v: Tensor  # (B, T, kv_dim) values
    # keys and values (B, H_kv, T, D) of another layer, attended alongside (cross-layer attention);
    # while decoding the cache supplies them for every visible position instead
    other_kv: tuple[Tensor, Tensor] | None = None
    offset: Tensor | None = None  # (B, T, kv_dim) added to the attention output (NeuTRENO)


@dataclass(frozen=True)
class LayerRole:
    """Where one layer's keys and values come from, stated once per value path (`ValuePath.role`).

    key_layer: the layer whose keys this layer attends over (itself, or its CLA group's first layer);
    value_layer: the layer whose values it reads (itself; SVFormer's V_1; None: a function of the
        token ids, so a KV cache keeps the ids);
    reads_layer: a further layer whose keys and values it attends over too (cross-layer attention);
    first_values: whether its values are V_1 (`Carry.first_values`) for the layers after it;
    value_map: whether it owns a value projection W^V (by default: whenever it reads its own values).
    """

    key_layer: int
    value_layer: int | None
    reads_layer: int | None = None
    first_values: bool = False
    value_map: bool | None = None  # None: value_layer == the layer itself


class ValuePath(nn.Module):
    """The standard Transformer value path, V_n = H_{n-1} W^V_n (Simplifying, Eq. 2), and the base of
    every other: W^V is linear, the identity or reparameterised (Eq. 6), as `value_form` says.

    `opts` is this layer's options, built by the registry; `role` says where its keys and values
    come from. A subclass overrides `layer_values` (and `role`, `validate`, ... as it needs).
    """

    options: ClassVar[type[ValuePathOptions]] = ValuePathOptions
    opts: ValuePathOptions
    # True: `layer_values` reads x W^V of its input x through `value_projection` (`input_value_map`),
    # so a runtime may compute it in one GEMM with W_Q, W_K (runtime/fused_projections.py); a path that
    # calls its W^V otherwise sets False
    fuses_values: ClassVar[bool] = True
    mixes_heads = False  # True: `mix_heads` changes this layer's queries or keys (ResFormer's ablation)

    def __init__(self, cfg: ModelFields, layer: int, opts: ValuePathOptions):
        super().__init__()
        self.layer, self.opts = layer, opts
        roles = [self.role(cfg, opts, i) for i in range(cfg.n_layers)]
        self.key_layer, self.value_layer = roles[layer].key_layer, roles[layer].value_layer
        self.reads_layer = roles[layer].reads_layer
        self.writes_first_values = roles[layer].first_values
        # another layer attends over this layer's keys: the attention puts them into the carry
        self.shares_keys = any(j != layer and layer in (r.key_layer, r.reads_layer)
                               for j, r in enumerate(roles))
        has_map = self.has_value_map(cfg, opts, layer)
        self.w_v = make_value_map(cfg.value_form_of(layer), cfg) if has_map else None

    @classmethod
    def role(cls, cfg: ModelFields, opts: Any, layer: int) -> LayerRole:
        """Where `layer`'s keys and values come from: by default its own."""
        return LayerRole(key_layer=layer, value_layer=layer)

    @classmethod
    def has_value_map(cls, cfg: ModelFields, opts: Any, layer: int) -> bool:
        """Whether `layer` owns a value projection W^V (False: SVFormer, CLA followers, BoV targets)."""
        role = cls.role(cfg, opts, layer)
        return role.value_layer == layer if role.value_map is None else role.value_map

    @property
    def owns_keys(self) -> bool:
        """Whether this layer has a W_K (a CLA follower reuses its group's first layer's keys)."""
        return self.key_layer == self.layer

    @property
    def caches_values(self) -> bool:
        """Whether a KV cache keeps this layer's V."""
        return self.value_layer == self.layer

    @property
    def key_sets(self) -> int:
        """How many sets of T keys a query attends over (FLOPs accounting)."""
        return 1 if self.reads_layer is None else 2

    @property
    def attends_other_keys(self) -> bool:
        """Whether a query attends over another layer's keys besides its own (cross-layer attention's
        [K_n; K_1]): the matrix of its own queries and keys is then only part of what it applies."""
        return self.key_sets > 1

    # -- the forward pass ----------------------------------------------------------------------
    def forward(self, x: Tensor, carry: Carry) -> tuple[LayerValues, Carry]:
        """This layer's values for the current tokens and the carry for later layers.

        x: the normed block input (B, T, d). A layer whose `role` says it produces V_1 puts its values
        into the carry here, the one place that does.
        """
        values, carry = self.layer_values(x, carry)
        if self.writes_first_values:
            carry = carry.update(first_values=values.v)
        return values, carry

    def layer_values(self, x: Tensor, carry: Carry) -> tuple[LayerValues, Carry]:
        """V = x W^V: the standard path. Subclasses override this."""
        return LayerValues(self.value_projection(x)), carry

    def value_projection(self, x: Tensor) -> Tensor:
        """x W^V: this layer's value map on x, the attention's input."""
        return value_map_of(self)(x)

    def input_value_map(self) -> nn.Module | None:
        """The W^V (``w_v``) whose output on the attention's input x `layer_values` reads, when the path
        declares `fuses_values`; None: no W^V in this layer, or its values come from elsewhere."""
        return value_map(self) if self.fuses_values else None

    def mix_heads(self, q: Tensor, k: Tensor, carry: Carry) -> tuple[Tensor, Tensor, Carry]:
        """Queries and keys (B, H, T, D) after QK-norm and RoPE, changed; only when `mixes_heads`."""
        return q, k, carry

    def values_from_cache(self, source: Tensor, carry: Carry) -> Tensor:
        """This layer's values (B, T, kv_dim) at the cached positions, from what the cache holds.

        `source` is the cached values of `value_layer` (B, T, kv_dim), or the token ids (B, T) when
        `value_layer` is None. It must agree with `layer_values` on the current tokens. The default
        is the identity: the layer attends over the values it (or `value_layer`) cached.
        """
        return source

    # -- initialisation ------------------------------------------------------------------------
    def init_weights(self, token_embedding: Tensor) -> None:
        """Initialise every tensor this path owns except W^V, which the model's scheme sets with W_Q
        and W_K (model/init_schemes.py): by default its learned scalars (`Gain`s: lambdas, gamma_v)
        start at their initial values. A path with tables or gates sets them too; `token_embedding` E
        is there for Bank of Values' tables."""
        reset_gains(self)

    def start_at_baseline(self) -> None:
        """Set new parameters so that this layer computes what the baseline computed."""

    def init_from_baseline(self, token_embedding: Tensor, baseline: Sequence[ValuePath]) -> None:
        """Initialise from the pretrained baseline's weights (Bank of Values' tables from its W^V);
        `baseline` holds the baseline's value path of every layer."""

    # -- rules read by the rest of blocklab --------------------------------------------------------
    @classmethod
    def make_shared(cls, cfg: ModelFields, opts: Any) -> SharedModule | None:
        """The model-level module of this value path, if it has one."""
        return None

    @classmethod
    def validate(cls, cfg: ModelFields, opts: Any) -> None:
        """Raise ConfigError for combinations that make no sense (checks that need the model's sizes)."""


class SharedModule(nn.Module):
    """The model-level module of a value path: parameters read by every layer (a shared table,
    adaptive weights, depth weights). The Transformer runs `before_blocks` once per forward pass
    and `after_block` after every block, outside the blocks, so per-block FSDP and compile hold."""

    def before_blocks(self, carry: Carry) -> Carry:
        return carry

    def after_block(self, layer: int, x: Tensor, carry: Carry) -> tuple[Tensor, Carry]:
        return x, carry

    def init_weights(self, token_embedding: Tensor) -> None:
        """See `ValuePath.init_weights`."""
        reset_gains(self)

    def start_at_baseline(self) -> None:
        """See `ValuePath.start_at_baseline`."""

    def init_from_baseline(self, token_embedding: Tensor, baseline: Sequence[ValuePath]) -> None:
        """See `ValuePath.init_from_baseline`."""


# -- helpers the value paths share -----------------------------------------------------------------
VALUE_TABLE = "value_table"  # the parameter name of every token-indexed value table (own optimizer group)


def is_value_table(name: str) -> bool:
    """Whether the parameter `name` (e.g. ``blocks.9.attn.values.value_table``) is a value table."""
    return name.rsplit(".", 1)[-1] == VALUE_TABLE


def reset_gains(module: nn.Module) -> None:
    """Every `Gain` of `module` back at its initial value, except those of its W^V (a reparameterised
    map's own gains), which the model's scheme sets with the map."""
    w_v = getattr(module, "w_v", None)
    skip = set(w_v.modules()) if isinstance(w_v, nn.Module) else set()
    for gain in module.modules():
        if isinstance(gain, Gain) and gain not in skip:
            gain.reset_parameters()


def carried(value: Tensor | None) -> Tensor:
    """A carry field an earlier layer fills (V_1, K_1, x0 ...), read by a later one: the layers run in
    order, so it is always there by then."""
    assert value is not None, "an earlier layer fills this field of the carry"
    return value


def value_map(path: ValuePath) -> nn.Module | None:
    """The value projection W^V that `path` keeps as ``w_v`` (None in a layer that owns none)."""
    w_v = path.w_v  # set in `ValuePath.__init__`, so typed only as nn.Module.__getattr__ types attributes
    assert w_v is None or isinstance(w_v, nn.Module)
    return w_v


def value_map_of(path: ValuePath) -> nn.Module:
    """The value projection W^V of a layer that has one."""
    w_v = value_map(path)
    assert w_v is not None, "only a layer with a value map computes x W^V"
    return w_v
