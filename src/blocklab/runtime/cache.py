"""The KV cache: the keys, values and token ids of past positions, laid out per layer as `CacheLayout`
says (runtime/cache_layout.py: only what each layer's attention will read again), and the protocol a
forward pass follows over it (model/carry.py's `DecodingCache`): `begin` the pass (its positions),
`update` each layer in turn (store its new keys and values, return what its queries may see as a
`Seen`), then `end` it (the new positions count as cached), or `abort` it when it failed part-way.

Each tensor is a `Store` (runtime/cache_store.py: every position, or a ring of a window's last
positions); a padded batch keeps its per-row state in a `PaddingState` (runtime/padding.py), and
offloaded Bank of Values tables their rows in `ValueRows` (runtime/offload.py).

Shaped attention decodes alpha v per token, and its centering term C V (the mean of the values a
query sees) from a running float32 sum of the layer's values (B, H_kv, 1, D) that the cache keeps
for each full-context shaped layer (`value_sums`): a step adds its own values and divides, with no
pass over the cached ones. A sliding-window layer takes the mean over the values of its window,
which it reads for A V anyway (`ops.masked_mean_of_last`).

The cache is for inference: it stores detached tensors. Under autograd the current chunk's keys
and values keep their gradients (the cached past is a constant).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from blocklab.model import ops
from blocklab.model.carry import Seen
from blocklab.model.value_paths import ValuePath
from blocklab.runtime.cache_layout import (
    TOKEN_ID_DTYPE,
    CacheLayout,
    cache_bytes_per_token,
    check_causal,
    first_position,
)
from blocklab.runtime.cache_store import Store
from blocklab.runtime.offload import TableKey, ValueRows
from blocklab.runtime.padding import PaddingState

if TYPE_CHECKING:
    from blocklab.model.config import ModelConfig


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
        check_causal(cfg)
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
        self.keys = {j: Store(batch_size, max_len, s, heads, dtype, device)
                     for j, s in self.layout.key_spans.items()}
        self.values = {j: Store(batch_size, max_len, s, (shape.kv_dim,), dtype, device)
                       for j, s in self.layout.value_spans.items()}
        self.token_ids = (Store(batch_size, max_len, self.layout.id_span, (), TOKEN_ID_DTYPE, device)
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
        if self.padding is not None:  # a padded batch's flags: one byte per position
            out["real_positions"] = self.padding.flags
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
        for tensor in per_row:
            tensor.copy_(tensor.index_select(0, rows.to(tensor.device)))
        if self._last_ids is not None:  # (pending/cached, B, 1)
            self._last_ids.copy_(self._last_ids.index_select(1, rows.to(self._last_ids.device)))
        if self.padding is not None:
            self.padding.reorder(rows.to(self.padding.real.device), self.length)

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
            if self.padding is None:  # the first padded pass: every cached position was real
                self.padding = PaddingState(b, self.max_len, self.length, token_ids.device)
            return self.padding.advance(real, self.length, t)
        positions = self._positions
        if positions.device != token_ids.device:
            return torch.arange(self.length, self.length + t, device=token_ids.device)
        return positions[self.length:self.length + t]

    def key_valid(self) -> Tensor | None:
        """(B, P) False at padding, for every position up to the newest of the pass in progress (a
        layer's keys are the last T_k of them); None when no pass over this cache had padding."""
        if self.padding is None:
            return None
        return self.padding.flags[:, :self.length + self._chunk_length()]

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
        start = first_position(self.length, self.layout.windows[layer])
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

    def _write(self, kind: str, layer: int | None, store: Store, new: Tensor,
               start: int | None = None) -> Tensor:
        """Store `new` and keep what the store's widest reader sees for the later layers; returns the
        positions from `start` on (for the writing layer itself), or all it keeps (start None)."""
        first = first_position(self.length, store.span)  # what its widest reader sees
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


__all__ = ["KVCache", "cache_bytes_per_token"]  # cache_bytes_per_token: its public home (docs/cache.md)
