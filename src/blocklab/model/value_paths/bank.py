"""Bank of Values (He, Liu et al. 2026) and its substitutive and additive relatives.

    BoV:         v_p = gamma_v * E_v[token id]              in the target layers   (Eq. 5)
    x0-value:    v_p = c * RMSNorm(x0_p) W^V                 (Table 1); with add=True
                 v_p = a x_p W^V + b RMSNorm(x0_p) W^V        (Table 1's "V + x0 W_V" rows)
    v1-value:    v_p = c * V_1                               (Table 1)
    v-scale:     v_p = c * x_p W^V                           (Table 1's "V gamma" control)
    bov-resformer: BoV in the target layers, Identity-ResFormer's v_n = 1/2 (x_n W^V_n + V_1) in the
                 layers between the first and the targets (a composition of the two papers)

(value-embed, the additive table of nanochat and modded-nanogpt, is value_embed.py.)

x0 is the raw token embedding, RMSNorm is parameter-free. Target layers default to the last third
(layer index >= floor(2L/3)). BoV's target layers have no value projection at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.model.carry import Carry
from blocklab.model.gains import Gain
from blocklab.model.linear_maps import ReparamLinear, init_projection_, make_value_map
from blocklab.model.value_paths.base import (
    LayerRole,
    LayerValues,
    SharedModule,
    ValuePath,
    carried,
    value_map,
    value_map_of,
)
from blocklab.model.value_paths.options import LayerSpec, ValuePathOptions, target_layers
from blocklab.util.errors import ConfigError

if TYPE_CHECKING:
    from blocklab.model.fields import ModelFields

TableKey = int | None  # a target layer's own table (its index), or None: the table all targets share


class DeviceRows(Protocol):
    """The device rows of offloaded tables that a KV cache holds (runtime/offload.py's `ValueRows`):
    slot s of each compact table is the row of the s-th distinct token id its batch used."""

    current: Tensor | None  # (B, T) the slots of the tokens of the forward pass in progress

    def table(self, key: TableKey) -> Tensor:
        """The compact table (slots, d) of `key` on the device."""
        ...


class OffloadedTableError(RuntimeError):
    """A forward pass that needs a value table on the device met an offloaded one."""


def offload_error(what: str) -> OffloadedTableError:
    return OffloadedTableError(
        f"{what}, but the Bank of Values tables are offloaded to host memory "
        "(model.offload_value_tables()): they serve cached decoding without gradients only "
        "(model.generate, or model(ids, cache=model.new_cache(...)) under torch.no_grad()). Call "
        "model.offload_value_tables(False) to bring them back to the device for training or a forward pass "
        "without a KV cache.")


def value_rows_of(carry: Carry) -> DeviceRows | None:
    """The device rows of the carry's KV cache, when its model's tables are offloaded."""
    return getattr(carry.cache, "value_rows", None)


def _rms(x: Tensor) -> Tensor:
    return F.rms_norm(x, (x.shape[-1],))


@dataclass(frozen=True)
class BankOptions(ValuePathOptions):
    """The settings every variant of this module shares."""

    layers: LayerSpec = "last-third"
    """the target layers, where the new value source replaces (or joins) x W^V."""
    coef: float = 1.0
    """the coefficient c (gamma_v for BoV) at initialisation."""
    learnable: bool = True
    """whether the coefficients are learned."""


@dataclass(frozen=True)
class BankOfValuesOptions(BankOptions):
    shared: bool = False
    """one table for every target layer (initialised from the first target layer)."""


@dataclass(frozen=True)
class X0ValueOptions(BankOptions):
    add: bool = False
    """keep the layer's own values and add the x0 values, v = a x W^V + b RMSNorm(x0) W^V."""
    x0: Literal["embedding", "stream"] = "embedding"
    """which x0: the token's own embedding, or the trunk's x0 after the embedding norm and smear."""

    def __post_init__(self) -> None:
        if self.x0 not in ("embedding", "stream"):  # before the type check: its message says why
            raise ConfigError(f"value_path_options['x0'] = {self.x0!r} is not allowed: choose 'embedding' "
                              "(the token's own embedding) or 'stream' (the trunk's x0 after the embedding "
                              "norm and smear, as the Bank of Values code).")
        super().__post_init__()


class _Substitutive(ValuePath):
    """Shared plumbing: standard values outside the target layers, a coefficient inside them."""

    options: ClassVar[type[BankOptions]] = BankOptions
    opts: BankOptions

    def __init__(self, cfg: ModelFields, layer: int, opts: BankOptions):
        super().__init__(cfg, layer, opts)
        self.target = layer in self.targets(cfg, opts)
        if self.target:
            self.coef = Gain(opts.coef, opts.learnable)

    @classmethod
    def targets(cls, cfg: ModelFields, opts: BankOptions) -> frozenset[int]:
        return target_layers(opts.layers, cfg.n_layers)

    @classmethod
    def validate(cls, cfg: ModelFields, opts: BankOptions) -> None:
        cls.targets(cfg, opts)


class BankOfValues(_Substitutive):
    """v_p = gamma_v * E_v[token id] in the target layers (gamma_v = `coef`, learnable, init 1).

    E_v is initialised to RMSNorm(embedding) W^V with a freshly initialised W^V of that layer, so
    the first forward pass equals the x0-value variant. Option ``shared``: one table for every
    target layer (initialised from the first target layer). A KV cache keeps the token ids of the
    target layers, not their V (Bank of Values Sec. 4, "Inference").
    """

    offloaded = False  # E_v lives in host memory (`offload_value_tables`, runtime/offload.py)
    options: ClassVar[type[BankOfValuesOptions]] = BankOfValuesOptions
    opts: BankOfValuesOptions

    def __init__(self, cfg: ModelFields, layer: int, opts: BankOfValuesOptions):
        super().__init__(cfg, layer, opts)
        self.cfg = cfg
        if self.target and not opts.shared:
            self.value_table = nn.Parameter(torch.empty(cfg.vocab_size, cfg.attention_shape.kv_dim))

    @classmethod
    def role(cls, cfg: ModelFields, opts: BankOfValuesOptions, layer: int) -> LayerRole:
        return LayerRole(layer, None if layer in cls.targets(cfg, opts) else layer)

    def table(self, carry: Carry) -> Tensor:
        table = carry.path_state if self.opts.shared else self.value_table
        assert table is not None, "the shared table's module fills the carry before the first block"
        return table

    @property
    def table_key(self) -> TableKey:
        """Which offloaded table this layer reads (runtime/offload.py): its own (its index), or None."""
        return None if self.opts.shared else self.layer

    def layer_values(self, x: Tensor, carry: Carry) -> tuple[LayerValues, Carry]:
        if self.w_v is not None:
            return LayerValues(self.value_projection(x)), carry
        rows = value_rows_of(carry)
        if rows is not None:  # offloaded tables: the current tokens' slots in the compact rows
            assert rows.current is not None, "the cache assigns slots when the forward pass begins"
            return LayerValues(self.coef(F.embedding(rows.current, self.rows_table(rows, carry)))), carry
        if self.offloaded:
            raise offload_error("a forward pass without a KV cache (or with one made before offloading) "
                                f"reached Bank of Values layer {self.layer}")
        return LayerValues(self.coef(F.embedding(carry.token_ids, self.table(carry)))), carry

    def values_from_cache(self, source: Tensor, carry: Carry) -> Tensor:
        if not self.target:
            return source
        rows = value_rows_of(carry)
        if rows is not None:  # the cache holds slots of the compact rows in place of token ids
            return self.coef(F.embedding(source, self.rows_table(rows, carry)))
        return self.coef(F.embedding(source, self.table(carry)))

    def rows_table(self, rows: DeviceRows, carry: Carry) -> Tensor:
        """This layer's compact device table; refuses gradients, which could not reach the host table."""
        if torch.is_grad_enabled() and self.table(carry).requires_grad:
            raise offload_error(f"Bank of Values layer {self.layer} ran with gradients enabled")
        return rows.table(self.table_key)

    def init_weights(self, token_embedding: Tensor) -> None:
        super().init_weights(token_embedding)  # gamma_v
        if self.target and not self.opts.shared:
            init_table_from_embedding(self.value_table, token_embedding, self.cfg, self.layer)

    def init_from_baseline(self, token_embedding: Tensor, baseline: Sequence[ValuePath]) -> None:
        """E_v = RMSNorm(E) W_V with this layer's *pretrained* W_V (Bank of Values Eq. 5)."""
        if self.target and not self.opts.shared:
            init_table_from_embedding(self.value_table, token_embedding, self.cfg, self.layer,
                                      w_v=value_map(baseline[self.layer]))

    @classmethod
    def make_shared(cls, cfg: ModelFields, opts: BankOfValuesOptions) -> SharedModule | None:
        if not opts.shared:
            return None
        return SharedValueTable(cfg, min(cls.targets(cfg, opts)))  # validation made the targets non-empty


class ResFormerBank(BankOfValues):
    """Bank of Values in the target layers with Identity-ResFormer's value residual below them:

        v_n = gamma_v E_v[token id]          n in the target layers          (Bank of Values Eq. 5)
        v_n = 1/2 (x_n W^V_n + V_1)          0 < n, n below the targets       (Value Residual Eq. 7)

    with V_1 = x_0 W^V_0, the first layer's values. The target layers take no V_1: in a model whose
    positions are rotary, V_1 depends on the token id alone, so gamma E_v[id] + lambda V_1 is again
    a table lookup and the mix adds nothing a table cannot learn.
    """

    @classmethod
    def role(cls, cfg: ModelFields, opts: BankOfValuesOptions, layer: int) -> LayerRole:
        return replace(super().role(cfg, opts, layer), first_values=layer == 0)

    def layer_values(self, x: Tensor, carry: Carry) -> tuple[LayerValues, Carry]:
        if self.target or self.layer == 0:
            return super().layer_values(x, carry)
        v = self.value_projection(x)
        return LayerValues(0.5 * (v + carried(carry.first_values))), carry

    @classmethod
    def validate(cls, cfg: ModelFields, opts: BankOptions) -> None:
        if 0 in cls.targets(cfg, opts):
            raise ConfigError(f"value_path_options['layers'] = {opts.layers!r} is not "
                              "allowed for bov-resformer: layer 0 is the source of V_1, so the table layers "
                              f"must lie in [1, {cfg.n_layers}).")


@torch.no_grad()
def init_table_from_embedding(table: Tensor, embedding: Tensor, cfg: ModelFields, layer: int,
                              w_v: nn.Module | None = None) -> None:
    """E_v <- RMSNorm(embedding) W^V, with W^V a fresh value map of `layer` unless one is given."""
    if w_v is None:
        w_v = make_value_map(cfg.value_form_of(layer), cfg).to(embedding.device, embedding.dtype)
        if isinstance(w_v, nn.Linear):  # as the model initialises a W^V (nanochat's law under its scheme)
            init_projection_(w_v.weight, cfg)
        elif isinstance(w_v, ReparamLinear):
            w_v.reset_parameters()
    wide = embedding.to(torch.promote_types(embedding.dtype, torch.float32))
    table.copy_(w_v(_rms(wide).to(embedding.dtype)))


class SharedValueTable(SharedModule):
    """One BoV table used by every target layer, initialised from the first target layer."""

    def __init__(self, cfg: ModelFields, first_target: int):
        super().__init__()
        self.cfg, self.first_target = cfg, first_target
        self.value_table = nn.Parameter(torch.empty(cfg.vocab_size, cfg.attention_shape.kv_dim))

    offloaded = False  # the table lives in host memory (`offload_value_tables`, runtime/offload.py)
    table_key: TableKey = None  # the offloaded table every target layer reads

    def before_blocks(self, carry: Carry) -> Carry:
        if self.offloaded and value_rows_of(carry) is None:
            raise offload_error("a forward pass without a KV cache (or with one made before offloading) "
                                "reached the shared Bank of Values table")
        return carry.update(path_state=self.value_table)  # the value path's state: the shared table

    def init_weights(self, token_embedding: Tensor) -> None:
        init_table_from_embedding(self.value_table, token_embedding, self.cfg, self.first_target)

    def init_from_baseline(self, token_embedding: Tensor, baseline: Sequence[ValuePath]) -> None:
        init_table_from_embedding(self.value_table, token_embedding, self.cfg, self.first_target,
                                  w_v=value_map(baseline[self.first_target]))


class X0Value(_Substitutive):
    """v_p = c RMSNorm(x0_p) W^V in the target layers, with W^V the layer's. Option ``add``: keep the
    layer's own values and add the x0 values, v_p = a x_p W^V + b RMSNorm(x0_p) W^V (Bank of Values
    Table 1's "V + x0 W_V" rows): a = b = 1/2 fixed, or with ``learnable`` a and b per layer starting
    at a = 1, b = 0 (the baseline), as the paper's learned additive variants do.

    Option ``x0``, which x0: ``"embedding"``, the token's own embedding (a function of the token id,
    so the cache keeps ids, as for BoV), or ``"stream"``, the trunk's x0 after the embedding norm and
    nanochat's smear, as the Bank of Values code reads it. The two agree until the smear (which
    starts at zero) is trained; the stream's x0 mixes in the previous token, so the cache keeps values.
    """

    options: ClassVar[type[X0ValueOptions]] = X0ValueOptions
    opts: X0ValueOptions

    def __init__(self, cfg: ModelFields, layer: int, opts: X0ValueOptions):
        super().__init__(cfg, layer, opts)
        self.adds = self.target and opts.add
        if self.adds:  # a, b replace the coefficient c
            self.main = Gain(1.0 if opts.learnable else 0.5, opts.learnable)
            self.coef = Gain(0.0 if opts.learnable else 0.5, opts.learnable)

    @classmethod
    def role(cls, cfg: ModelFields, opts: X0ValueOptions, layer: int) -> LayerRole:
        # a target layer whose v is a function of the token id: the cache keeps ids and recomputes v
        by_id = layer in cls.targets(cfg, opts) and not opts.add and opts.x0 == "embedding"
        return LayerRole(layer, None if by_id else layer, value_map=True)  # W^V in every layer

    def layer_values(self, x: Tensor, carry: Carry) -> tuple[LayerValues, Carry]:
        if not self.target:
            return LayerValues(self.value_projection(x)), carry
        v = self.x0_values(carried(carry.token_embeddings if self.opts.x0 == "embedding" else carry.x0))
        if self.adds:
            v = self.main(self.value_projection(x)) + v
        return LayerValues(v), carry

    def input_value_map(self) -> nn.Module | None:
        """A substitutive target layer keeps W^V only for RMSNorm(x0) W^V: it reads no x W^V."""
        return super().input_value_map() if self.adds or not self.target else None

    def x0_values(self, token_embeddings: Tensor) -> Tensor:
        return self.coef(value_map_of(self)(_rms(token_embeddings)))

    def values_from_cache(self, source: Tensor, carry: Carry) -> Tensor:
        if self.value_layer is not None:  # cached values (the stream's x0 or an added x W^V)
            return source
        # one value map per cached token and step: the memory of BoV at the compute of a projection
        return self.x0_values(F.embedding(source, carried(carry.embedding_table)))


class V1Value(_Substitutive):
    """v_p = c V_1 in the target layers (Bank of Values Table 1, the "V1" rows), no W_V there; the
    KV cache keeps V_1 once (layer 0's values).

    Layer 0 produces V_1, so it can never be a target: ``layers="all"`` means every layer but
    layer 0 (layers >= 1), as in Table 1's row "V1, All" (11 target layers of 12) and nanochat's
    `gpt_base_v_from_v1_every_layer`. An explicit list or ``last-K`` that names layer 0 is an error.
    """

    @classmethod
    def role(cls, cfg: ModelFields, opts: BankOptions, layer: int) -> LayerRole:
        return LayerRole(layer, 0 if layer in cls.targets(cfg, opts) else layer, first_values=layer == 0)

    def layer_values(self, x: Tensor, carry: Carry) -> tuple[LayerValues, Carry]:
        if self.target:
            return LayerValues(self.coef(carried(carry.first_values))), carry
        return LayerValues(self.value_projection(x)), carry

    def values_from_cache(self, source: Tensor, carry: Carry) -> Tensor:
        return self.coef(source) if self.target else source

    @classmethod
    def targets(cls, cfg: ModelFields, opts: BankOptions) -> frozenset[int]:
        if opts.layers == "all":  # every layer after the source of V_1
            return target_layers(list(range(1, cfg.n_layers)), cfg.n_layers)
        return target_layers(opts.layers, cfg.n_layers)

    @classmethod
    def validate(cls, cfg: ModelFields, opts: BankOptions) -> None:
        if 0 in cls.targets(cfg, opts):
            raise ConfigError("value_path='v1-value' cannot target layer 0: it is the source of V_1; "
                              "choose value_path_options['layers'] without 0 ('all' means layers >= 1).")


class VScale(_Substitutive):
    """v_p = c x_p W^V in the target layers: the layer's own values times a coefficient (learnable,
    init 1), Bank of Values Table 1's "V gamma" row, the control that separates what a learned
    scale alone does from what the new value sources do."""

    def layer_values(self, x: Tensor, carry: Carry) -> tuple[LayerValues, Carry]:
        v = self.value_projection(x)
        return LayerValues(self.coef(v) if self.target else v), carry

