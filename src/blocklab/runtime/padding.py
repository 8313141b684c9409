"""The per-row padding state of a KV cache that spans several forward passes: the rule of
model/masking.py (padding may surround a row's real tokens, never split them) checked across passes,
each row's positions counted over its real tokens only, and which cached positions are real (the keys
attention may see)."""

from __future__ import annotations

import torch
from torch import Tensor

from blocklab.model.masking import check_rows, row_positions


class PaddingState:
    """Per row of a batch decoded over several forward passes: real tokens so far, whether the row has
    had padding after real tokens ("closed": a later real token would split its real tokens), and
    which of the cache's `max_len` positions are real (`flags`, False at padding). Made at a cache's
    first padded pass, when its `cached` positions were all real."""

    def __init__(self, batch: int, max_len: int, cached: int, device: torch.device | str | None):
        self.real = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.real += cached
        self.closed = torch.zeros(batch, dtype=torch.bool, device=device)
        self.any_closed = False  # read on the host: a decoding step of real tokens checks nothing else
        self.flags = torch.zeros(batch, max_len, dtype=torch.bool, device=device)
        self.flags[:, :cached] = True

    def advance(self, valid: Tensor | None, start: int, t: int) -> Tensor:
        """The `t` new tokens at cache positions start .. start + t - 1, with flags `valid` (B, T) (None:
        all real): checked against the rule, counted and their flags recorded; returns their positions
        (B, T)."""
        positions = self._count(valid, t)
        self.flags[:, start:start + t] = True if valid is None else valid
        return positions

    def _count(self, valid: Tensor | None, t: int) -> Tensor:
        """Check the flags (B, T) of `t` new tokens against the rule (None: all real) and count them;
        returns their positions (B, T)."""
        if valid is None:  # a decoding step: no device reads, so that it compiles as one graph
            if self.any_closed:
                check_rows(torch.ones_like(self.closed[:, None].expand(-1, t)), None, self.closed)
            positions = self.real + torch.arange(t, device=self.real.device)
            self.real += t
            return positions
        check_rows(valid, self.real.squeeze(1) > 0, self.closed)
        positions = row_positions(valid, self.real)
        seen_real = (torch.cumsum(valid, dim=1) + self.real) > 0
        self.closed |= (~valid & seen_real).any(dim=1)
        self.any_closed = bool(self.closed.any())
        self.real += valid.sum(dim=1, keepdim=True)
        return positions

    def reorder(self, rows: Tensor, filled: int) -> None:
        """Row i becomes the former row ``rows[i]`` (`KVCache.reorder`), in the first `filled` positions'
        flags too."""
        flags = self.flags[:, :filled]
        flags.copy_(flags.index_select(0, rows))
        self.real = self.real.index_select(0, rows)
        self.closed = self.closed.index_select(0, rows)
        self.any_closed = bool(self.closed.any())
