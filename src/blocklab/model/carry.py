"""Cross-layer state, passed explicitly from block to block.

Nothing that one layer needs from another hides in a module attribute: each block takes a
`Carry` and returns one, so per-block `torch.compile`, FSDP wrapping and the KV cache see the whole
data flow.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import Tensor


@dataclass
class Carry:
    token_ids: Tensor  # (B, T) ids of the tokens in this forward pass
    positions: Tensor  # (T,) absolute positions of those tokens
    first_values: Tensor | None = None  # V_1 of the first layer, (B, T, kv_dim), once computed

    def update(self, **changes) -> Carry:
        return replace(self, **changes)
