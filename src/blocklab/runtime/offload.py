"""Bank of Values' value tables E_v in host memory, with only the rows a batch has used on the device.

Bank of Values (Sec. 3, "Memory overhead") reads E_v by token id only, so the tables "can be offloaded
to host memory by default, and only the needed entries are prefetched on demand". Here:

- ``model.offload_value_tables()`` moves every E_v of a `bov` / `bov-resformer` model (one per target
  layer, or the one shared table with ``shared=True``) to host memory, pinned when CUDA is available;
  ``model.offload_value_tables(False)`` moves them back to the model's device.
- Each KV cache made afterwards (``model.new_cache``, ``model.generate``) holds a `ValueRows`: one
  compact device table per E_v with one row (a "slot") per distinct token id its batch has used, the
  union over the batch's rows. A forward pass first gives every new id a slot and copies its rows
  from the host (the prompt's unique ids at prefill, the new ids while decoding), on a side CUDA stream
  that the first table layer waits for, so the copy overlaps the layers below the targets. Slots are
  never freed, so the device holds min(distinct ids, |V|) rows per table: never more rows than the
  value cache of those layers would hold positions. Padding positions' ids get slots too (harmless:
  their values are masked).
- The cache stores each position's slot in place of its token id, so the table layers gather from
  the compact tables exactly as they would from E_v: the values, hence logits and tokens, are
  bit-identical to decoding with resident tables.

Offloaded tables serve cached decoding only. A forward pass without a KV cache (training, evaluation)
or with gradients enabled raises `OffloadedTableError`, naming ``offload_value_tables(False)``:
training reads rows of every id in a batch and updates them with an optimiser whose state lives on the
device, so a host table would be copied in full every step (no memory saved, much time lost).

Finding a step's new ids needs those ids on the host: one small device-to-host copy per forward pass,
which makes the host wait for the previous step (no launching ahead). The slot bookkeeping runs
eagerly (`torch.compiler.disable`), so a compiled decoding step breaks its graph there: the default
``fullgraph=True`` step falls back to eager decoding with its warning.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from blocklab.model.value_paths.bank import BankOfValues, SharedValueTable, TableKey

SLOT_DTYPE = torch.int32  # what the cache stores per position in place of the token id


class ValueRows:
    """The device-resident rows of the offloaded value tables for one KV cache (a batch of sequences).

    `tables`: each offloaded E_v (|V|, d) in host memory by key; slot s of every compact table holds
    the row of the s-th distinct token id the batch used. `current` holds the slots of the forward pass
    in progress (B, T), for the table layers' own tokens; the cache stores them for the later passes.
    """

    def __init__(self, tables: dict[TableKey, Tensor], vocab_size: int, device: torch.device | str | None):
        if not tables:
            raise ValueError("ValueRows needs at least one offloaded value table")
        self.host = tables
        self.vocab_size = vocab_size
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._slot_of = torch.full((vocab_size,), -1, dtype=SLOT_DTYPE)  # host: id -> slot (-1: none yet)
        self.count = 0  # slots filled
        self.rows = {k: torch.empty(0, t.shape[1], dtype=t.dtype, device=self.device)
                     for k, t in tables.items()}
        self.current: Tensor | None = None
        cuda = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(self.device) if cuda else None
        self._ready: Any = None  # a CUDA event: the rows of the latest fetch are on the device

    # -- one forward pass ----------------------------------------------------------------------
    @torch.compiler.disable  # host bookkeeping (reads the ids on the host): eager under torch.compile
    def assign(self, token_ids: Tensor, room: int) -> Tensor:
        """Slots (B, T) of `token_ids`, giving each id not seen before a new slot and fetching its rows;
        `room`: how many more ids later passes of this cache can bring (caps the growth of the tables)."""
        ids = token_ids.detach().to("cpu", torch.int64)  # on CUDA: waits for the ids (a sync)
        seen = torch.unique(ids)
        new = seen[self._slot_of[seen] < 0]
        if new.numel():
            self._slot_of[new] = torch.arange(self.count, self.count + new.numel(), dtype=SLOT_DTYPE)
            self._fetch(new, room)
        slots = self._slot_of[ids]
        if self.device.type == "cuda":
            slots = slots.pin_memory().to(self.device, non_blocking=True)
        else:
            slots = slots.to(self.device)
        self.current = slots
        return slots

    def table(self, key: TableKey) -> Tensor:
        """The compact table (slots, d) of `key` on the device, once its latest rows have arrived."""
        self._wait()
        return self.rows[key]

    # -- the rows ------------------------------------------------------------------------------
    def _fetch(self, new: Tensor, room: int) -> None:
        """Copy the host rows of the ids `new` (sorted, none seen before) to slots count .. count + n."""
        n = new.numel()
        end = self.count + n
        if end > self.capacity:
            self._grow(end, room)
        stream = self._stream
        if stream is None:  # CPU: a plain gather into the compact tables
            for key, host in self.host.items():
                torch.index_select(host, 0, new, out=self.rows[key][self.count:end])
            self.count = end
            return
        main = torch.cuda.current_stream(self.device)
        stream.wait_stream(main)  # the tables were allocated (and grown) on the main stream
        with torch.cuda.stream(stream):
            for key, host in self.host.items():
                staging = torch.empty((n, host.shape[1]), dtype=host.dtype, pin_memory=True)
                torch.index_select(host, 0, new, out=staging)
                # the pinned block is not reused before this copy completes (the host allocator records it)
                self.rows[key][self.count:end].copy_(staging, non_blocking=True)
        self._ready = torch.cuda.Event()
        self._ready.record(stream)
        self.count = end

    def _grow(self, needed: int, room: int) -> None:
        """Room for `needed` slots: exactly at the first pass, then a quarter more at least, and at least 64
        rows more (a copy of the rows every few new ids, not every one), never past |V| or what the cache
        can still bring (`room`)."""
        self._wait()  # the old rows are complete before they are copied
        # the first pass (a prefill) allocates exactly its ids
        grown_by = max(needed, self.capacity * 5 // 4, self.capacity + 64) if self.capacity else needed
        capacity = min(self.vocab_size, grown_by, needed + room)
        for key, old in self.rows.items():
            grown = torch.empty(capacity, old.shape[1], dtype=old.dtype, device=self.device)
            grown[:self.count] = old[:self.count]
            self.rows[key] = grown

    def _wait(self) -> None:
        if self._ready is not None:
            torch.cuda.current_stream(self.device).wait_event(self._ready)
            self._ready = None

    # -- memory ----------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return next(iter(self.rows.values())).shape[0]

    @property
    def device_bytes(self) -> int:
        """Bytes of the compact tables on the device (their storage, `capacity` slots each)."""
        return sum(t.untyped_storage().nbytes() for t in self.rows.values())

    @property
    def used_bytes(self) -> int:
        """Bytes of the filled slots (`count` rows per table): what `device_bytes` equals after a prefill,
        and at most a quarter (or 64 rows) less than it while decoding grows the tables."""
        return sum(self.count * t.shape[1] * t.element_size() for t in self.rows.values())

    @property
    def host_bytes(self) -> int:
        """Bytes of the host tables and the id -> slot map."""
        return sum(t.untyped_storage().nbytes() for t in self.host.values()) + self._slot_of.nbytes


# -- the model's side ------------------------------------------------------------------------------
def table_owners(model: nn.Module) -> Iterator[tuple[TableKey, nn.Module]]:
    """Every module that owns an offloadable table, with its key: a Bank of Values target layer with a
    table of its own (its layer index), or the shared table's module (None)."""
    for module in model.modules():
        if isinstance(module, (BankOfValues, SharedValueTable)) and "value_table" in module._parameters:
            yield module.table_key, module


def offload_tables(model: nn.Module, device: torch.device, offload: bool = True) -> None:
    """Move every Bank of Values table of `model` to host memory (pinned when CUDA is available) and
    mark its module offloaded, or (`offload` False) back to `device`, the model's device."""
    owners = list(table_owners(model))
    if not owners:
        cfg = getattr(model, "cfg", None)
        path = getattr(cfg, "value_path", "?")
        raise ValueError(f"offload_value_tables: value_path={path!r} has no Bank of Values tables; "
                         "offloading is for value_path 'bov' and 'bov-resformer' (with or without "
                         "shared=True).")
    for _, module in owners:
        table = module.value_table
        assert isinstance(table, nn.Parameter)
        if offload:
            host = table.data.to("cpu")
            table.data = host.pin_memory() if torch.cuda.is_available() else host
        else:
            table.data = table.data.to(device)
        setattr(module, "offloaded", offload)  # noqa: B010 (nn.Module types attributes as tensors)


def host_tables(model: nn.Module) -> dict[TableKey, Tensor] | None:
    """The offloaded tables of `model` by key (what a new KV cache's `ValueRows` reads), or None."""
    tables = {}
    for key, module in table_owners(model):
        table = module.value_table
        if module.offloaded and isinstance(table, Tensor):
            tables[key] = table.detach()
    return tables or None
