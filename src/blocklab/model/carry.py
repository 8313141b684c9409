"""Cross-layer state, passed explicitly from block to block.

Nothing that one layer needs from another hides in a module attribute: each block takes a
`Carry` and returns one, so per-block `torch.compile`, FSDP wrapping and the KV cache see the whole
data flow. Value paths fill in only the fields they use.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from torch import Tensor

if TYPE_CHECKING:
    from blocklab.model.cache import KVCache


@dataclass
class Carry:
    token_ids: Tensor  # (B, T) ids of the tokens in this forward pass
    positions: Tensor  # (T,) absolute positions of those tokens
    x0: Tensor | None = None  # (B, T, d) the input of the first block (DenseFormer's X_0)
    token_embeddings: Tensor | None = None  # (B, T, d) raw token embeddings (Bank of Values' x0)
    first_values: Tensor | None = None  # V of the source layer (V_1), (B, T, kv_dim)
    first_queries: Tensor | None = None  # Q of the source layer (query-residual ablation), heads
    first_keys: Tensor | None = None  # K of the source layer (key-residual ablation), heads
    values: tuple[Tensor, ...] = ()  # raw V of every earlier layer (Dense-ResFormer)
    shared_kv: tuple[Tensor, Tensor] | None = None  # K, V of the group leader (CLA)
    history: tuple[Tensor, ...] = ()  # block outputs X_0 .. X_n (DenseFormer)
    shared: dict[str, Tensor] = field(default_factory=dict)  # tensors from a model-level module
    cache: KVCache | None = None  # set while decoding with a KV cache (model/cache.py)

    def update(self, **changes) -> Carry:
        return replace(self, **changes)
