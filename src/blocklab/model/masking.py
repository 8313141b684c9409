"""Padded batches: prompts of different lengths in one batch, as an attention mask marks them.

A row of an ``attention_mask`` (1: a real token, 0: padding) is padding, then the row's real tokens,
then padding: left padding, right padding, or both. Three things make each row compute what it
would alone:

- **positions**: a real token's position is the number of real tokens before it in its row, so
  RoPE, learned and sinusoidal positions see each prompt start at 0 (`row_positions`);
- **masked keys**: every attention form sees only the real keys of its row (`ops.padded_mask`):
  softmax attention through SDPA's mask; shaped attention alpha I + beta A - gamma C builds its
  matrix, where A and the centring C both average over real keys only; every query also sees its
  own key, so a padding query is finite (no real token reads it);
- **per-row state**: everything else a value path carries is token-local (ResFormer's and NeuTRENO's
  mix with V_1, SVFormer's shared V_1, Bank of Values' lookups by token id, DenseFormer's averages,
  CLA's shared K and V are all per position), and nanochat's smear skips a previous token that is
  padding.

Sliding windows count positions, which equal a row's own count while its real tokens are contiguous;
hence the rule that padding may surround the real tokens but not split them. With a KV cache the rule
spans every forward pass: once a row has padding after real tokens, it takes no further real token
(runtime/padding.py's `PaddingState`). `generate` (runtime/generate.py and the HF model) turns right
padding into left padding
before decoding, so that new tokens follow each prompt's last real token.
"""

from __future__ import annotations

import torch
from torch import Tensor


def real_tokens(attention_mask: Tensor | None, input_ids: Tensor, past: int = 0) -> Tensor | None:
    """(B, T) bool, False at padding, for the new tokens `input_ids` (B, T), from an attention mask of
    shape (B, T) or, as Hugging Face passes it with a cache, (B, past + T) (its last T columns); None
    when there is no mask. Raises on a mask of another shape or with values other than 0 and 1."""
    if attention_mask is None:
        return None
    b, t = input_ids.shape
    if not isinstance(attention_mask, Tensor) or attention_mask.dim() != 2 or attention_mask.shape[0] != b \
            or attention_mask.shape[1] not in (t, past + t):
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask)
        allowed = f"({b}, {t})" + (f" or ({b}, {past + t}) with the {past} cached positions" if past else "")
        raise ValueError(f"attention_mask must have shape {allowed}: one 0/1 flag per token; got {shape}")
    mask = attention_mask[:, -t:]
    if mask.dtype != torch.bool:
        if bool(((mask != 0) & (mask != 1)).any()):
            raise ValueError("attention_mask must hold 1 for a real token and 0 for padding; got other "
                             "values")
        mask = mask != 0
    return mask.to(input_ids.device)


def row_positions(valid: Tensor, before: Tensor | int = 0) -> Tensor:
    """(B, T) the position of each token in its own row: real tokens counted from `before` (B, 1) real
    tokens already cached; padding takes the position of the last real token before it (or 0)."""
    return (torch.cumsum(valid, dim=1) + before - 1).clamp(min=0)


def previous_is_real(key_valid: Tensor, t: int) -> Tensor:
    """(B, T) whether the token before each of the last `t` positions of `key_valid` (B, P) is real
    (False before position 0): nanochat's smear mixes in a previous token only when it is."""
    before = key_valid[:, -t - 1:-1]
    if before.shape[1] < t:  # the first position has no previous token
        before = torch.cat((torch.zeros_like(key_valid[:, :1]), key_valid[:, :t - 1]), dim=1)
    return before


def check_rows(valid: Tensor, started: Tensor | None = None, closed: Tensor | None = None) -> None:
    """Refuse a row whose padding splits its real tokens (`started`, `closed`: its state from earlier
    passes over a cache)."""
    seen_real = torch.cumsum(valid, dim=1) > 0
    if started is not None:
        seen_real = seen_real | started[:, None]
    gap = torch.cumsum(~valid & seen_real, dim=1) > 0  # padding after a real token, from there on
    if closed is not None:
        gap = gap | closed[:, None]
    bad = valid & gap
    if bool(bad.any()):
        row = int(bad.any(dim=1).nonzero()[0])
        raise ValueError(f"attention_mask row {row} has padding between real tokens: a row must be padding, "
                         "its real tokens, then padding (left or right padding); with a KV cache a row that "
                         "ended in padding takes no more real tokens (pad prompts on the left to continue "
                         "them, as generate does).")
