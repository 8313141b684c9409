"""Cross-layer state, passed explicitly from block to block.

Nothing that one layer needs from another hides in a module attribute: each block takes a
`Carry` and returns one, so per-block `torch.compile`, FSDP wrapping and the KV cache see the whole
data flow. A value path fills in only the fields it uses; what only one family reads is its own
`path_state`, typed in its module.
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
    """What attention asks of a KV cache (runtime/cache.py's `KVCache`): the model names only this, so
    it sits below the cache, which reads the value paths."""

    def update(self, layer: int, k: Tensor, v: Tensor) -> Seen:
        """Store this layer's new keys and values; return everything its queries may see."""
        ...


class DecodingCache(LayerCache, Protocol):
    """What the Transformer asks of a KV cache around one forward pass (runtime/cache.py's `KVCache`)."""

    cfg: Any  # the ModelConfig the cache was made for
    length: int  # positions cached before this forward pass
    padding: Any  # the per-row padding state of a padded batch, or None

    def begin(self, input_ids: Tensor, real: Tensor | None) -> Tensor:
        """Start a forward pass of `input_ids` (real: (B, T) False at padding); return their positions."""
        ...

    def key_valid(self) -> Tensor | None:
        """(B, P) False at padding, for every position up to the newest token; None: no padding."""
        ...

    def last_token_ids(self) -> Tensor:
        """(B, 1) the newest cached token's id (nanochat's smear reads it)."""
        ...

    def end(self) -> None:
        """The forward pass is done: its tokens count as cached."""
        ...

    def abort(self) -> None:
        """The forward pass failed: forget what it began to store."""
        ...


@dataclass
class Carry:
    """What every block reads besides x. The fields here are what more than one value-path family
    reads; a family's own cross-layer state is one value in `path_state`, of a type its module states."""

    # -- set by the Transformer before the first block ---------------------------------------------
    token_ids: Tensor  # (B, T) ids of the tokens in this forward pass
    positions: Tensor  # (T,) absolute positions of those tokens, or (B, T) in a padded batch
    x0: Tensor | None = None  # (B, T, d) the input of the first block (DenseFormer's X_0, x0-value)
    token_embeddings: Tensor | None = None  # (B, T, d) raw token embeddings (Bank of Values' x0)
    embedding_table: Tensor | None = None  # (vocab, d) the token embedding (x0-value maps cached ids)
    cache: LayerCache | None = None  # set while decoding with a KV cache (runtime/cache.py)
    # a padded batch: (B, P) False at padding, for every position up to the newest token (the cached
    # ones too), so a layer's keys, the last T_k positions, are masked by its last T_k columns; then
    # `positions` is (B, T), each row counting its own real tokens. None: no padding
    key_valid: Tensor | None = None
    # -- set by a layer for the layers after it ---------------------------------------------------
    # V of the source layer (V_1), (B, T, kv_dim): ResFormer, SVFormer, NeuTRENO, v1-value, bov-resformer,
    # cross-layer attention; written by `ValuePath.forward` in the layer whose role says so
    first_values: Tensor | None = None
    # (B, H_kv, T, D) the keys (after RoPE) of the last layer whose keys others attend over: a CLA group's
    # first layer, cross-layer attention's layer 0; written by that layer's attention (model/attention.py)
    shared_keys: Tensor | None = None
    # -- the value path's own state, set by its layers or its model-level module -------------------
    # (None until it sets one): e.g. DenseFormer's block outputs, CLA's shared V, BoV's shared table
    path_state: Any = None

    def update(self, **changes: Any) -> Carry:
        """A new carry with `changes` (the old one is left as it was)."""
        return replace(self, **changes)
