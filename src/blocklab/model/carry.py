"""Cross-layer state, passed explicitly from block to block.

Nothing that one layer needs from another hides in a module attribute: each block takes a
`Carry` and returns one, so per-block `torch.compile`, FSDP wrapping and the KV cache see the whole
data flow. Every field is typed; a value path fills in only the fields it uses.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from torch import Tensor


@dataclass
class Seen:
    """What a layer's queries may see while decoding (`KVCache.update`)."""

    keys: Tensor  # (B, H_kv, T', D): every visible key, the cached past and the current tokens
    value_source: Tensor  # (B, T', kv_dim) cached values, or (B, T') token ids: the path maps them
    other_kv: tuple[Tensor, Tensor] | None  # keys and values (heads) of the layer it also reads
    value_sum: Tensor | None  # the running sum of its earlier values (shaped attention, full context)


class LayerCache(Protocol):
    """What attention asks of a KV cache (model/cache.py's `KVCache`): the carry names only this, so
    it sits below the cache, which reads the value paths."""

    def update(self, layer: int, k: Tensor | None, v: Tensor) -> Seen:
        """Store this layer's new keys and values; return everything its queries may see."""
        ...


@dataclass
class Carry:
    # -- set by the Transformer before the first block ---------------------------------------------
    token_ids: Tensor  # (B, T) ids of the tokens in this forward pass
    positions: Tensor  # (T,) absolute positions of those tokens
    x0: Tensor | None = None  # (B, T, d) the input of the first block (DenseFormer's X_0)
    token_embeddings: Tensor | None = None  # (B, T, d) raw token embeddings (Bank of Values' x0)
    embedding_table: Tensor | None = None  # (vocab, d) the token embedding (x0-value maps cached ids)
    cache: LayerCache | None = None  # set while decoding with a KV cache (model/cache.py)
    # -- set by a value path's model-level module (`SharedModule.before_blocks`) ------------------
    source_weights: Tensor | None = None  # ResFormer Plus: lambda_{n,1} of every mixing layer
    value_table: Tensor | None = None  # Bank of Values with one table for every target layer
    value_tables: tuple[Tensor, ...] = ()  # value embeddings' shared tables (the U-net layout)
    # -- set by a layer for the layers after it ---------------------------------------------------
    first_values: Tensor | None = None  # V of the source layer (V_1), (B, T, kv_dim)
    first_queries: Tensor | None = None  # Q of the source layer (query-residual ablation), heads
    first_keys: Tensor | None = None  # K of the source layer (key-residual ablation, cross-layer attn)
    values: tuple[Tensor, ...] = ()  # raw V of every earlier layer (Dense-ResFormer)
    shared_kv: tuple[Tensor, Tensor] | None = None  # K, V of the group leader (CLA)
    history: tuple[Tensor, ...] = ()  # block outputs X_0 .. X_n (DenseFormer)

    def update(self, **changes: Any) -> Carry:
        """A new carry with `changes` (the old one is left as it was)."""
        return replace(self, **changes)
