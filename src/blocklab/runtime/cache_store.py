"""One tensor of the KV cache (keys, values or token ids of one store, `CacheLayout`): the past of
every position, or, when its readers see only a window of `span` positions, a ring of the last `span`
that a new position overwrites the oldest slot of."""

from __future__ import annotations

import torch
from torch import Tensor


class Store:
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
