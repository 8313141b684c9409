"""A KV cache that keeps, for each layer, only what that layer's attention will read again.

The layout follows from each layer's `LayerRole` (its `key_layer`, `value_layer` and `reads_layer`,
model/value_paths/base.py), never from the value path's name:

    standard, ResFormer family, NeuTRENO, DenseFormer,   K and V per layer (the V attention uses:
    value-embed, cross-layer attention                     ResFormer's mixed V, value-embed's V + g E)
    grouped-query attention                               K and V with n_kv_heads heads
    CLA (Brandon et al. 2024)                             K and V of each group's first layer only
    SVFormer (Value Residual Eq. 10, Sec. 3.5)            K per layer, V once (V_1, and once per anchor)
    v1-value (Bank of Values Table 1)                     K per layer, V of the non-target layers
    Bank of Values (Eq. 5), x0-value                      K per layer, V of the non-target layers and
                                                          one buffer of token ids shared by all layers

So SVFormer holds (L + 1) / (2L) of the standard K + V bytes, and Bank of Values saves
Delta_KV = (L/3) d (T - |V|) values per sequence once its tables are counted (Bank of Values Eq. 6).

Value paths whose mixing is token-local need nothing beyond their own V: ResFormer's
V'_n = lambda_1 V_1 + lambda_2 V_n and Dense-ResFormer's V'_n = sum_i lambda_{n,i} V_i mix the values
of one position, so V'_n of a past position is computed once, when that token is processed, and
cached like any V; V_1 (and every earlier V_i) is needed only for the current tokens, which the
`Carry` holds. NeuTRENO's correction lambda (V_1 - V_n) and DenseFormer's average over block
outputs are token-local too.

Sliding-window layers keep a ring of their last `window` positions (the window of the newest query,
itself included; the queries of a new chunk also see the chunk). A tensor read by several layers
(CLA's shared K and V, SVFormer's V_1, the first layer's K and V under cross-layer attention, the
token ids) keeps the widest span among its readers, so a windowed layer whose V_1 a full-context
layer reads keeps every position.

Shaped attention decodes alpha v per token, and its centering term C V (the mean of the values a
query sees) from a running float32 sum of the layer's values (B, H_kv, 1, D) that the cache keeps
for each full-context shaped layer (`value_sums`): a step adds its own values and divides, with no
pass over the cached ones. A sliding-window layer takes the mean over the values of its window,
which it reads for A V anyway (`ops.masked_mean_of_last`).

The cache is for inference: it stores detached tensors. Under autograd the current chunk's keys
and values keep their gradients (the cached past is a constant).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from blocklab.model import ops
from blocklab.model.carry import Seen
from blocklab.model.value_paths import (
    SharedModule,
    ValuePath,
    is_value_table,
    make_shared_module,
    make_value_path,
)
from blocklab.runtime.offload import TableKey, ValueRows
from blocklab.runtime.padding import PaddingState
from blocklab.util.errors import ConfigError

if TYPE_CHECKING:
    from blocklab.model.config import ModelConfig

TOKEN_ID_DTYPE = torch.int32  # 4 bytes per cached token id (F.embedding takes int32 indices)


def _first_position(past: int, span: int | None) -> int:
    """The oldest position a query at `past` (or later) can see through a window of `span` keys."""
    return 0 if span is None else max(0, past - span + 1)


def _widest(windows: list[int | None]) -> int | None:
    """The span a store needs to serve readers with these windows (None: every position)."""
    spans = [w for w in windows if w is not None]
    return None if len(spans) < len(windows) else max(spans)


@dataclass(frozen=True)
class CacheLayout:
    """Which tensors the cache stores and how many recent positions each keeps (None: all).

    `key_spans[j]` / `value_spans[j]`: the keys / values of layer j; `id_span`: the token ids,
    stored when some layer computes its values from them (`has_ids`); `summed_layers`: the layers
    whose centering term reads a running sum of their values; `routes[i]`: layer i's `key_layer`,
    `value_layer` and `reads_layer`, copied from its value path's `LayerRole`; `caches_values[i]`:
    whether layer i stores the values it computes (its value path's `caches_values`), else it reads
    them from `value_layer`'s store or the token ids.
    """

    windows: tuple[int | None, ...]
    routes: tuple[tuple[int, int | None, int | None], ...]
    caches_values: tuple[bool, ...]
    key_spans: dict[int, int | None]
    value_spans: dict[int, int | None]
    has_ids: bool
    id_span: int | None
    summed_layers: tuple[int, ...]  # full-context shaped layers: a running sum for their C V

    @classmethod
    def from_paths(cls, cfg: ModelConfig, paths: Sequence[ValuePath]) -> CacheLayout:
        windows = tuple(cfg.layer_window(i) for i in range(cfg.n_layers))
        key_readers: dict[int, list] = {}
        value_readers: dict[int, list] = {}
        id_readers = []
        for layer, path in enumerate(paths):
            w = windows[layer]
            key_readers.setdefault(path.key_layer, []).append(w)
            if path.value_layer is None:
                id_readers.append(w)
            else:
                value_readers.setdefault(path.value_layer, []).append(w)
            if path.reads_layer is not None:
                key_readers.setdefault(path.reads_layer, []).append(w)
                value_readers.setdefault(path.reads_layer, []).append(w)
        return cls(windows=windows,
                   routes=tuple((p.key_layer, p.value_layer, p.reads_layer) for p in paths),
                   caches_values=tuple(p.caches_values for p in paths),
                   key_spans={j: _widest(r) for j, r in sorted(key_readers.items())},
                   value_spans={j: _widest(r) for j, r in sorted(value_readers.items())},
                   has_ids=bool(id_readers), id_span=_widest(id_readers) if id_readers else None,
                   summed_layers=tuple(i for i, w in enumerate(windows)
                                       if cfg.attn_matrix == "shaped" and w is None))


def _check_causal(cfg: ModelConfig) -> None:
    if not cfg.causal:
        raise ConfigError("ModelConfig.causal = False: a bidirectional encoder attends to later tokens, "
                          "so it cannot decode with a KV cache; use a causal model.")


def _value_paths(cfg: ModelConfig) -> tuple[list[ValuePath], SharedModule | None]:
    """The value paths of `cfg`, built on the meta device (no memory): they describe the layout."""
    with torch.device("meta"):
        return [make_value_path(cfg, i) for i in range(cfg.n_layers)], make_shared_module(cfg)


def cache_bytes_per_token(cfg: ModelConfig, dtype_bytes: int = 2, context: int | None = None) -> dict:
    """The analytic cache layout of `cfg` for one sequence of `context` positions.

    Keys and values take kv_dim * dtype_bytes per position; a store keeps `context` positions, or
    min(span, context) for a sliding-window span; token ids take 4 bytes (int32) per position.
    Returns a dict with, for one sequence of `context` positions (default: cfg.context_length):

    - ``layers``: per layer ``kind`` ("K+V", "K", "V" or "-": what it stores itself), the
      positions its keys and values keep (``key_entries``, ``value_entries``: a sliding-window
      layer keeps its window unless a full-context layer reads them) and ``key_bytes``, ``value_bytes``;
    - ``kinds``: how many layers of each kind;
    - ``key_bytes``, ``value_bytes``, ``token_id_bytes``, ``value_sum_bytes`` (shaped attention's
      running sums: kv_dim values per full-context layer, in at least float32, whatever the
      context) and ``total_bytes`` (their sum, which equals ``KVCache.nbytes`` for batch 1 and
      max_len = context);
    - ``per_token``: total_bytes / context;
    - ``value_table_bytes``: the token-indexed value tables (Bank of Values' E_v, value embeddings)
      at dtype_bytes, parameters rather than cache, which decide Bank of Values' breakeven
      (Eq. 6: it saves memory once context > vocab_size).
    """
    _check_causal(cfg)
    context = cfg.context_length if context is None else context
    if not isinstance(context, int) or context < 1:
        raise ValueError(f"context = {context!r} is not allowed: give a positive number of positions.")
    paths, shared = _value_paths(cfg)
    layout = CacheLayout.from_paths(cfg, paths)
    kv_dim = cfg.attention_shape.kv_dim
    width = kv_dim * dtype_bytes

    def entries(span: int | None) -> int:
        return context if span is None else min(span, context)

    layers: list[dict[str, Any]] = []
    for i in range(cfg.n_layers):
        k = entries(layout.key_spans[i]) if i in layout.key_spans else 0
        v = entries(layout.value_spans[i]) if i in layout.value_spans else 0
        kind = "K+V" if k and v else "K" if k else "V" if v else "-"
        layers.append(dict(layer=i, kind=kind, key_entries=k, value_entries=v, key_bytes=k * width,
                           value_bytes=v * width))
    ids = entries(layout.id_span) * TOKEN_ID_DTYPE.itemsize if layout.has_ids else 0
    keys, values = sum(x["key_bytes"] for x in layers), sum(x["value_bytes"] for x in layers)
    modules = [*paths, shared] if shared is not None else paths
    tables = sum(p.numel() for m in modules for n, p in m.named_parameters() if is_value_table(n))
    sums = len(layout.summed_layers) * kv_dim * max(dtype_bytes, 4)
    total = keys + values + ids + sums
    return dict(context=context, dtype_bytes=dtype_bytes, layers=layers,
                kinds=dict(Counter(x["kind"] for x in layers)), key_bytes=keys, value_bytes=values,
                token_id_bytes=ids, value_sum_bytes=sums, total_bytes=total, per_token=total / context,
                value_table_bytes=tables * dtype_bytes)


def table_layers(cfg: ModelConfig) -> tuple[int, int]:
    """(layers that read values by token id, distinct value tables they read): Bank of Values' target
    layers and its tables (one per target layer, or one shared)."""
    paths, shared = _value_paths(cfg)
    readers = sum(1 for p in paths if p.value_layer is None)
    modules = [*paths, shared] if shared is not None else paths
    tables = sum(1 for m in modules for n, _ in m.named_parameters() if is_value_table(n))
    return readers, tables


class _Store:
    """The cached past of one tensor (B, time, ...): every position, or a ring of the last `span`."""

    def __init__(self, batch: int, max_len: int, span: int | None, features: tuple[int, ...],
                 dtype: torch.dtype, device: torch.device | str | None):
        self.span = span  # the most recent positions its readers need (None: all)
        self.capacity = max_len if span is None else min(span, max_len)
        self.ring = self.capacity < max_len
        self.data = torch.zeros(batch, self.capacity, *features, dtype=dtype, device=device)

    def update(self, new: Tensor, past: int, start: int) -> Tensor:
        """Store `new` (positions past .. past+T-1); return positions start .. past+T-1."""
        t = new.shape[1]
        data = self.data
        grad = new.requires_grad
        stored = new.detach() if grad else new  # the cache holds no graph
        if stored.dtype != data.dtype:
            stored = stored.to(data.dtype)
        if not self.ring:
            data[:, past:past + t] = stored
            if grad:  # keep the current tokens' graph; the past is a constant
                return torch.cat((data[:, start:past].to(new.dtype), new), dim=1)
            seen = data[:, start:past + t]  # a view
            return seen if seen.dtype == new.dtype else seen.to(new.dtype)
        present = new if grad else stored.to(new.dtype)
        device = data.device
        # read the past before writing: a long chunk overwrites slots its own first queries still see
        older = data.index_select(1, torch.arange(start, past, device=device) % self.capacity)
        keep = min(t, self.capacity)
        slots = torch.arange(past + t - keep, past + t, device=device) % self.capacity
        data.index_copy_(1, slots, stored[:, t - keep:])
        return torch.cat((older.to(new.dtype), present), dim=1)


class KVCache:
    """Keys, values and token ids of past positions for a batch of sequences, laid out by `CacheLayout`.

    Make one with ``model.new_cache(batch_size, max_len)``; each ``model(ids, cache=cache)`` runs
    the new tokens at the positions after the cached ones and appends them. ``nbytes`` is the
    memory the cache holds (every tensor's storage, allocated for max_len positions: the figure
    `cache_bytes_per_token` predicts); ``bytes_used`` counts only the filled positions.
    """

    def __init__(self, cfg: ModelConfig, paths: Sequence[ValuePath], batch_size: int, max_len: int,
                 dtype: torch.dtype, device: torch.device | str | None = None,
                 value_tables: dict[TableKey, Tensor] | None = None):
        _check_causal(cfg)
        for name, value in (("batch_size", batch_size), ("max_len", max_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} = {value!r} is not allowed: it must be a positive integer.")
        if max_len > cfg.context_length:
            raise ValueError(f"max_len = {max_len} exceeds the model's context_length = "
                             f"{cfg.context_length}: the model has no positions beyond it.")
        self.cfg, self.batch_size, self.max_len, self.dtype = cfg, batch_size, max_len, dtype
        self.layout = CacheLayout.from_paths(cfg, paths)
        self.length = 0  # positions cached so far
        shape = cfg.attention_shape
        self.head_dim = shape.head_dim  # values are stored (B, T, kv_dim) and split into heads to read
        heads = (shape.n_kv_heads, shape.head_dim)
        self.keys = {j: _Store(batch_size, max_len, s, heads, dtype, device)
                     for j, s in self.layout.key_spans.items()}
        self.values = {j: _Store(batch_size, max_len, s, (shape.kv_dim,), dtype, device)
                       for j, s in self.layout.value_spans.items()}
        self.token_ids = (_Store(batch_size, max_len, self.layout.id_span, (), TOKEN_ID_DTYPE, device)
                          if self.layout.has_ids else None)
        sum_dtype = torch.promote_types(dtype, torch.float32)
        self.value_sums = {j: torch.zeros(batch_size, *heads[:1], 1, heads[1], dtype=sum_dtype, device=device)
                           for j in self.layout.summed_layers}
        self._positions = torch.arange(max_len, device=device)  # sliced by `begin`: no arange per step
        # the last token of every row, cached and pending (nanochat's smear reads the previous token)
        self._last_ids = (torch.zeros(2, batch_size, 1, dtype=TOKEN_ID_DTYPE, device=device)
                          if cfg.smear else None)
        # a padded batch (model/masking.py): which positions are real, set at the first padded pass
        self.padding: PaddingState | None = None
        self._real: Tensor | None = None  # (B, max_len) bool, False at padding
        self._chunk: int | None = None  # tokens of the forward pass in progress
        self._present: dict[tuple[str, int | None], tuple[int, Tensor]] = {}
        self._broken = False
        # offloaded Bank of Values tables (runtime/offload.py): the rows this batch used, on the device;
        # then `token_ids` stores each position's slot in those rows in place of its token id
        self.value_rows: ValueRows | None = None
        if value_tables is not None:
            if not self.layout.has_ids:
                raise ValueError("value_tables are given, but no layer of this model reads its values by "
                                 "token id")
            self.value_rows = ValueRows(value_tables, cfg.vocab_size, device)

    # -- memory --------------------------------------------------------------------------------
    def tensors(self) -> dict[str, Tensor]:
        """Every tensor the cache holds, by name (``keys.3``, ``values.0``, ``token_ids``,
        ``value_sums.5``)."""
        out = {f"keys.{j}": s.data for j, s in self.keys.items()}
        out.update({f"values.{j}": s.data for j, s in self.values.items()})
        if self.token_ids is not None:
            out["token_ids"] = self.token_ids.data
        out.update({f"value_sums.{j}": t for j, t in self.value_sums.items()})
        if self._real is not None:  # a padded batch's flags: one byte per position
            out["real_positions"] = self._real
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of storage the cache holds (allocated for max_len positions)."""
        return sum(t.untyped_storage().nbytes() for t in self.tensors().values())

    @property
    def value_row_bytes(self) -> int:
        """Device bytes of the offloaded value tables' rows this cache holds (runtime/offload.py; 0 when the
        tables are resident). Not in `nbytes`, which counts the cache's own tensors."""
        return 0 if self.value_rows is None else self.value_rows.device_bytes

    @property
    def bytes_used(self) -> int:
        """Bytes of the positions filled so far (a ring counts at most its capacity)."""
        stores = [*self.keys.values(), *self.values.values()]
        stores += [self.token_ids] if self.token_ids is not None else []
        return sum(min(self.length, s.capacity) * s.data[:, :1].numel() * s.data.element_size()
                   for s in stores)

    # -- beam search -----------------------------------------------------------------------------
    def reorder(self, rows: Tensor) -> None:
        """Row i of the batch becomes the former row ``rows[i]``, in every tensor the cache holds per row
        (keys, values, token ids or their offloaded slots, value sums, the last token ids, padding):
        beam search continues each kept beam from the one it extends. In place, between forward passes;
        the offloaded Bank of Values rows are the whole batch's, so the slots stay valid."""
        if self._chunk is not None:
            raise RuntimeError("reorder runs between forward passes, not during one")
        rows = torch.as_tensor(rows)
        if rows.dim() != 1 or rows.shape[0] != self.batch_size or rows.dtype.is_floating_point:
            raise ValueError(f"reorder takes one integer row index per row of the batch ({self.batch_size}), "
                             f"got a {rows.dtype} tensor of shape {tuple(rows.shape)}")
        if rows.numel() and not (0 <= int(rows.min()) and int(rows.max()) < self.batch_size):
            raise ValueError(f"reorder's row indices must lie in [0, {self.batch_size}), got "
                             f"{rows.min().item()} .. {rows.max().item()}")
        stores = [*self.keys.values(), *self.values.values()]
        stores += [self.token_ids] if self.token_ids is not None else []
        # only the filled positions (a store, ring or not, fills slots 0 .. length - 1 first)
        per_row = [s.data[:, :min(self.length, s.capacity)] for s in stores]
        per_row += list(self.value_sums.values())
        per_row += [self._real[:, :self.length]] if self._real is not None else []
        for tensor in per_row:
            tensor.copy_(tensor.index_select(0, rows.to(tensor.device)))
        if self._last_ids is not None:  # (pending/cached, B, 1)
            self._last_ids.copy_(self._last_ids.index_select(1, rows.to(self._last_ids.device)))
        if self.padding is not None:
            self.padding.reorder(rows.to(self.padding.real.device))

    # -- one forward pass ----------------------------------------------------------------------
    def begin(self, token_ids: Tensor, real: Tensor | None = None) -> Tensor:
        """Start a forward pass over `token_ids` (B, T); returns their absolute positions (T,), or with
        padding (`real` (B, T), False at padding, in this pass or an earlier one) each row's own (B, T)."""
        if self._broken:
            raise RuntimeError("this KV cache was left incomplete by a failed forward pass; make a new one "
                               "with model.new_cache(...).")
        b, t = token_ids.shape
        if b != self.batch_size:
            raise ValueError(f"input_ids has batch size {b}, but the cache was made for batch_size = "
                             f"{self.batch_size}.")
        if t < 1:
            raise ValueError("input_ids has no tokens: a cached forward pass needs at least one.")
        if self.length + t > self.max_len:
            raise ValueError(f"{self.length} cached + {t} new positions exceed the cache's max_len = "
                             f"{self.max_len}; make the cache with a larger max_len (at most context_length "
                             f"= {self.cfg.context_length}).")
        self._chunk, self._present = t, {}
        if self.token_ids is not None:
            rows = self.value_rows
            room = b * (self.max_len - self.length - t)  # ids the later passes can still bring
            stored = token_ids if rows is None else rows.assign(token_ids, room)
            self._write("token_ids", None, self.token_ids, stored)
        if self._last_ids is not None:
            self._last_ids[1].copy_(token_ids[:, -1:])
        if real is not None or self.padding is not None:
            return self._padded_positions(token_ids, real)
        positions = self._positions
        if positions.device != token_ids.device:
            return torch.arange(self.length, self.length + t, device=token_ids.device)
        return positions[self.length:self.length + t]

    def _padded_positions(self, token_ids: Tensor, real: Tensor | None) -> Tensor:
        """Record which new positions are real and return each row's positions (model/masking.py)."""
        b, t = token_ids.shape
        device = token_ids.device
        if self.padding is None:  # the first padded pass: every cached position was real
            self.padding = PaddingState(b, device)
            self.padding.real += self.length
            self._real = torch.zeros(b, self.max_len, dtype=torch.bool, device=device)
            self._real[:, :self.length] = True
        assert self._real is not None
        positions = self.padding.advance(real, t)
        self._real[:, self.length:self.length + t] = True if real is None else real
        return positions

    def key_valid(self) -> Tensor | None:
        """(B, P) False at padding, for every position up to the newest of the pass in progress (a
        layer's keys are the last T_k of them); None when no pass over this cache had padding."""
        if self._real is None:
            return None
        return self._real[:, :self.length + self._chunk_length()]

    def end(self) -> None:
        """Finish the forward pass: the new positions count as cached."""
        self.length += self._chunk_length()
        self._chunk, self._present = None, {}
        if self._last_ids is not None:
            self._last_ids[0].copy_(self._last_ids[1])

    def last_token_ids(self) -> Tensor:
        """(B, 1) the last cached token of every row (for a model with a smear, after a first pass)."""
        if self._last_ids is None or self.length == 0:
            raise RuntimeError("this cache keeps the last token ids only for a model with smear=True, "
                               "after its first forward pass")
        return self._last_ids[0]

    def abort(self) -> None:
        """A forward pass failed part-way: some layers hold the new positions, others do not."""
        self._broken = True
        self._chunk, self._present = None, {}

    def progress(self) -> tuple[int, bool, bool]:
        """(positions cached, a pass in progress, broken): equal before and after a call that ran no
        forward pass (a decoding step that failed to compile before running anything)."""
        return self.length, self._chunk is not None, self._broken

    def update(self, layer: int, k: Tensor, v: Tensor) -> Seen:
        """Store layer `layer`'s new keys (B, H_kv, T, D) and values (B, T, kv_dim) as the layout says,
        and return what its queries may see (`Seen`): every visible key, the cached source of its
        values, another layer's keys and values it reads, and its running value sum."""
        key_layer, value_layer, reads = self.layout.routes[layer]
        start = _first_position(self.length, self.layout.windows[layer])
        if key_layer == layer:  # its own keys: what it stores is what it reads
            keys = self._write("keys", layer, self.keys[layer], k.transpose(1, 2), start)
        else:
            keys = self._read("keys", key_layer, start)
        keys = keys.transpose(1, 2)
        if self.layout.caches_values[layer]:
            source = self._write("values", layer, self.values[layer], v, start)
        else:
            source = self._read("token_ids" if value_layer is None else "values", value_layer, start)
        other = None
        if reads is not None:  # the other layer's keys and values at the positions this layer sees
            first = self.length + self._chunk_length() - keys.shape[-2]
            other = (self._read("keys", reads, first).transpose(1, 2),
                     ops.split_heads(self._read("values", reads, first), self.head_dim))
        return Seen(keys, source, other, self._add_to_sum(layer, v) if self.value_sums else None)

    def _chunk_length(self) -> int:
        assert self._chunk is not None, "update() and end() run after begin()"
        return self._chunk

    def _add_to_sum(self, layer: int, v: Tensor) -> Tensor | None:
        """The running sum (B, H_kv, 1, D) of `layer`'s values before this pass, for shaped
        attention's centering term, after adding this pass's values `v` (B, T, kv_dim) as stored."""
        sums = self.value_sums.get(layer)
        if sums is None:
            return None
        before = sums.clone()
        stored = ops.split_heads(v.detach().to(self.dtype), self.head_dim)
        sums += stored.sum(dim=-2, keepdim=True, dtype=sums.dtype)
        return before

    def _write(self, kind: str, layer: int | None, store: _Store, new: Tensor,
               start: int | None = None) -> Tensor:
        """Store `new` and keep what the store's widest reader sees for the later layers; returns the
        positions from `start` on (for the writing layer itself), or all it keeps (start None)."""
        first = _first_position(self.length, store.span)  # what its widest reader sees
        seen = store.update(new, self.length, first)
        self._present[kind, layer] = (first, seen)
        if start is None or start == first:
            return seen
        if start < first:
            raise AssertionError(f"the cached {kind} of layer {layer} start at {first}, not {start}")
        return seen[:, start - first:]

    def _read(self, kind: str, layer: int | None, start: int) -> Tensor:
        if (kind, layer) not in self._present:
            raise AssertionError(f"the {kind} of layer {layer} are read before that layer wrote them")
        first, tensor = self._present[kind, layer]
        if start < first:
            raise AssertionError(f"the cached {kind} of layer {layer} start at {first}, not {start}")
        return tensor[:, start - first:]
