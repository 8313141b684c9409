"""Pure functions, one per paper equation. Tensors are (B, H, T, D) unless stated otherwise.

Masks are *bottom-right aligned*: when a query block is shorter than the keys (decoding with a
cache), query i sits at absolute position ``T_k - T_q + i``. Windows count the keys a query sees,
itself included: a causal query at position p sees keys ``p - window < j <= p``; a bidirectional
one sees ``|p - j| < window``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


def _query_positions(t_q: int, t_k: int, device: torch.device | None) -> Tensor:
    return torch.arange(t_k - t_q, t_k, device=device)


def key_bounds(t_q: int, t_k: int, causal: bool, window: int | None,
               device: torch.device | None = None) -> tuple[Tensor, Tensor]:
    """First and last key index (inclusive) that each query may attend to, shape (T_q,)."""
    pos = _query_positions(t_q, t_k, device)
    lo = torch.zeros_like(pos)
    hi = pos.clone() if causal else torch.full_like(pos, t_k - 1)
    if window is not None:
        lo = (pos - window + 1).clamp(min=0)
        if not causal:
            hi = (pos + window - 1).clamp(max=t_k - 1)
    return lo, hi


def attention_mask(t_q: int, t_k: int, causal: bool, window: int | None,
                   device: torch.device | None = None) -> Tensor | None:
    """Boolean (T_q, T_k) mask, True where a query may attend; None when every key is allowed."""
    if (not causal and window is None) or sees_every_key(t_q, t_k, window):
        return None
    lo, hi = key_bounds(t_q, t_k, causal, window, device)
    keys = torch.arange(t_k, device=device)
    return (keys >= lo[:, None]) & (keys <= hi[:, None])


def padded_mask(valid: Tensor, t_q: int, causal: bool, window: int | None) -> Tensor:
    """Boolean (B, 1, T_q, T_k): `attention_mask` restricted to the real keys of each row, ``valid``
    (B, T_k) (False at padding), and every query's own key, so that a padding query with no real key
    to see (left padding) attends to itself: its output stays finite, and no real query reads it.
    The queries are the last T_q keys."""
    t_k = valid.shape[-1]
    mask = valid[:, None, None, :]
    base = attention_mask(t_q, t_k, causal, window, valid.device)
    if base is not None:
        mask = mask & base
    own = torch.eye(t_k, dtype=torch.bool, device=valid.device)[t_k - t_q:]
    return mask | own


def sees_every_key(t_q: int, t_k: int, window: int | None) -> bool:
    """True when a single query, the last of the T_k positions (a decoding step), may attend to every
    key it is given: under a causal mask it sits after them all, and a window of `window` keys reaches
    back to the first. Such a query needs no mask (and builds none: no per-step allocations)."""
    return t_q == 1 and (window is None or t_k <= window)


# Queries per SDPA call under a sliding window (at least the window): memory O(T (block + window)).
WINDOW_BLOCK = 256


def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = True, window: int | None = None,
              scale: float | None = None, valid: Tensor | None = None) -> Tensor:
    """Softmax attention A V with A = softmax(q k^T / sqrt(d) + M) (Simplifying, Eq. 2).

    Runs on PyTorch's fused SDPA; K and V may have fewer heads than Q (grouped-query attention).
    A sliding window never builds a T_q x T_k mask: `windowed_attention` works block by block.
    `valid` (B, T_k), False at padding: M also hides each row's padding keys (`padded_mask`).
    """
    t_q, t_k = q.shape[-2], k.shape[-2]
    gqa = k.shape[-3] != q.shape[-3]
    if valid is not None:  # a padded batch: each row's own mask
        return F.scaled_dot_product_attention(q, k, v, attn_mask=padded_mask(valid, t_q, causal, window),
                                              scale=scale, enable_gqa=gqa)
    if causal and window is None and t_q == t_k:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    if sees_every_key(t_q, t_k, window):  # a decoding step: one query, every key visible, no mask
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa)
    if window is not None and t_q > max(window, WINDOW_BLOCK):
        return windowed_attention(q, k, v, causal, window, scale)
    mask = attention_mask(t_q, t_k, causal, window, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)


def windowed_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, window: int,
                       scale: float | None = None) -> Tensor:
    """Sliding-window softmax attention, one SDPA call per block of `max(window, WINDOW_BLOCK)`
    queries over just the keys their windows reach (`key_bounds`): the same A V as the full mask
    with O(T (block + window)) memory instead of O(T^2)."""
    t_q, t_k = q.shape[-2], k.shape[-2]
    gqa = k.shape[-3] != q.shape[-3]
    lo, hi = key_bounds(t_q, t_k, causal, window)  # on the CPU: slicing by them needs no sync
    block = max(window, WINDOW_BLOCK)
    outs = []
    for s in range(0, t_q, block):
        e = min(s + block, t_q)
        first, last = int(lo[s:e].min()), int(hi[s:e].max()) + 1
        keys = torch.arange(first, last)
        mask = (keys >= lo[s:e, None]) & (keys <= hi[s:e, None])
        outs.append(F.scaled_dot_product_attention(
            q[..., s:e, :], k[..., first:last, :], v[..., first:last, :], attn_mask=mask.to(q.device),
            scale=scale, enable_gqa=gqa))
    return torch.cat(outs, dim=-2)


def masked_mean(v: Tensor, t_q: int, causal: bool = True, window: int | None = None) -> Tensor:
    """C V without forming C: the mean of the values each query may attend to.

    C is the attention matrix of zero query-key logits under the same mask, so C V is a running
    (prefix) mean for a causal mask, a windowed mean for a sliding window and the global mean for
    bidirectional attention. Prefix sums run in at least float32 and the result is cast back.

    The scan runs with T as the innermost axis (after a transposed copy): PyTorch's cumsum over an
    outer axis is known to be slow on CUDA (pytorch/pytorch#122170). The causal, full-context case
    (training) is the running mean itself and skips the two gathers of the general case.
    """
    t_k = v.shape[-2]
    acc = torch.promote_types(v.dtype, torch.float32)
    sums = torch.cumsum(v.to(acc).transpose(-1, -2).contiguous(), dim=-1)  # (B, H, D, T)
    if causal and t_q == t_k and (window is None or window >= t_k):
        count = torch.arange(1, t_k + 1, device=v.device, dtype=acc)
        return (sums / count).transpose(-1, -2).to(v.dtype)
    lo, hi = key_bounds(t_q, t_k, causal, window, v.device)
    prefix = F.pad(sums, (1, 0)).transpose(-1, -2)  # prefix[j] = sum of v[:j], (B, H, T + 1, D)
    total = prefix.index_select(-2, hi + 1) - prefix.index_select(-2, lo)
    count = (hi - lo + 1).to(total.dtype)[:, None]
    return (total / count).to(v.dtype)


def _per_head(gain: Tensor | float) -> Tensor | float:
    if isinstance(gain, Tensor) and gain.numel() > 1:
        return gain.reshape(1, -1, 1, 1)
    return gain


def expand_kv(x: Tensor, n_heads: int) -> Tensor:
    return x if x.shape[-3] == n_heads else x.repeat_interleave(n_heads // x.shape[-3], dim=-3)


def masked_mean_of_last(v: Tensor, t_q: int, causal: bool = True, window: int | None = None) -> Tensor:
    """`masked_mean` (C V) for a block of t_q queries at the end of T_k keys, as in cached decoding.

    Query i averages the keys lo_i .. hi_i, i.e. (S[hi_i + 1] - S[lo_i]) / count with the prefix
    sums S[j] = sum(v[:j]). For the last t_q queries the lo_i and the hi_i + 1 each span at most t_q
    consecutive indices a .. b, where S[j] = sum(v[:a]) + cumsum(v[a:j]): one float32 reduction and
    a cumulative sum over fewer than t_q keys, instead of a prefix sum over all T_k keys. Equal to
    `masked_mean` up to float rounding.
    """
    t_k = v.shape[-2]
    lo, hi = key_bounds(t_q, t_k, causal, window)  # on the CPU: reading their range needs no sync
    acc = torch.promote_types(v.dtype, torch.float32)

    def prefix(at: Tensor) -> Tensor:  # S[at] for indices `at` (T_q,) that lie in a .. b
        a, b = int(at.min()), int(at.max())
        base = v[..., :a, :].sum(dim=-2, keepdim=True, dtype=acc)
        sums = torch.cat((base, base + torch.cumsum(v[..., a:b, :].to(acc), dim=-2)), dim=-2)
        return sums.index_select(-2, (at - a).to(v.device))

    total = prefix(hi + 1) - prefix(lo)
    count = (hi - lo + 1).to(device=v.device, dtype=total.dtype)[:, None]
    return (total / count).to(v.dtype)


def running_mean(past_sum: Tensor, chunk: Tensor, past: int) -> Tensor:
    """C V for a causal, full-context block of queries that follows `past` cached positions.

    Query i (at position past + i) averages every value up to itself:
    (past_sum + sum(chunk[:i + 1])) / (past + i + 1), where `past_sum` (B, H, 1, D) is the running
    sum of the `past` cached values. A decoding step then costs O(T_q), not a pass over the cache.
    """
    acc = past_sum.dtype
    sums = past_sum + torch.cumsum(chunk.to(acc), dim=-2)
    count = torch.arange(past + 1, past + chunk.shape[-2] + 1, device=chunk.device, dtype=acc)[:, None]
    return (sums / count).to(chunk.dtype)


def centered_values(v: Tensor, t_q: int, causal: bool = True, window: int | None = None,
                    past_sum: Tensor | None = None) -> Tensor:
    """C V of Eq. (5) for the last t_q of the T_k keys of v (B, H_kv, T_k, D), without forming C.

    A full block of queries (t_q == T_k) takes `masked_mean`. A shorter block (decoding with a
    cache) takes `running_mean` of `past_sum`, the running sum (B, H_kv, 1, D) of the T_k - t_q
    earlier values, when the layer keeps one (causal, no window), else `masked_mean_of_last`.
    """
    t_k = v.shape[-2]
    if past_sum is not None:
        if not causal or window is not None:
            raise ValueError("past_sum is a running sum over every earlier position: it serves only a "
                             "causal attention with no window.")
        return running_mean(past_sum, v[..., -t_q:, :], t_k - t_q)
    if t_q == t_k:
        return masked_mean(v, t_q, causal, window)
    return masked_mean_of_last(v, t_q, causal, window)


def shaped_attention(q: Tensor, k: Tensor, v: Tensor, alpha: Tensor | float, beta: Tensor | float,
                     gamma: Tensor | float | None, causal: bool = True, window: int | None = None,
                     scale: float | None = None, past_sum: Tensor | None = None,
                     mix: Mix | None = None) -> Tensor:
    """Shaped attention (alpha I + beta A - gamma C) V, Simplifying Transformer Blocks Eq. (5).

    With gamma=None it is the Value-SkipInit matrix alpha I + beta A of Eq. (4). alpha, beta and
    gamma are scalars or have shape (H,) (head-wise scalars, Eq. 13). It never builds a T x T
    matrix: beta SDPA(q, k, v) + alpha v - gamma C V. The queries are the last T_q positions of the
    T_k keys (T_q < T_k while decoding with a cache; `past_sum`: see `centered_values`).

    Value-SkipInit (any mask) and the causal, full-context case of Eq. (5) (training) run SDPA and
    then `mix(A V, V, alpha, beta, gamma)`: `plain_mix` by default, or a kernel that computes the
    same (runtime/shaped_mix.py's, with its own backward). Every other case (windows, bidirectional C,
    decoding) combines the same terms with plain ops, C V on the key/value heads before they are
    repeated for grouped-query attention.
    """
    n_heads, t_q, t_k = q.shape[-3], q.shape[-2], k.shape[-2]
    full_causal = causal and t_q == t_k and past_sum is None and (window is None or window >= t_k)
    if gamma is None or full_causal:
        attn = attention(q, k, v, causal, None if full_causal else window, scale)
        own = v if t_q == t_k else v[..., -t_q:, :]  # a full slice would cost a zero-fill backward
        return (mix or plain_mix)(attn, expand_kv(own, n_heads), alpha, beta, gamma)
    out = _per_head(beta) * attention(q, k, v, causal, window, scale)
    out = out + _per_head(alpha) * expand_kv(v[..., -t_q:, :], n_heads)
    mean = centered_values(v, t_q, causal, window, past_sum)
    return out - _per_head(gamma) * expand_kv(mean, n_heads)


GainValue = Tensor | float


# the mix of Eqs. (4) and (5) from A V and V: (a, v, alpha, beta, gamma) -> beta a + alpha v - gamma C V
Mix = Callable[[Tensor, Tensor, GainValue, GainValue, GainValue | None], Tensor]


def gain4(gain: GainValue) -> GainValue:
    """A gain as it multiplies (B, H, T, D): a float, or a tensor broadcast as (1, H | 1, 1, 1)."""
    return gain.reshape(1, -1, 1, 1) if isinstance(gain, Tensor) else gain


def running_sums(x: Tensor, acc: torch.dtype) -> Tensor:
    """S[..., i, :] = sum_{j <= i} x[..., j, :] along T, in dtype `acc`."""
    return torch.cumsum(x, dim=-2, dtype=acc)


def plain_mix(a: Tensor, v: Tensor, alpha: GainValue, beta: GainValue, gamma: GainValue | None,
              scan: Callable[[Tensor, torch.dtype], Tensor] = running_sums) -> Tensor:
    """beta a + alpha v - gamma C V for a causal, full-context block, where C V is the running mean
    S_t / t of v (S = `scan`(v), in float32 at least), or beta a + alpha v under any mask when gamma
    is None (Eq. 4); a = A V, v (B, H, T, D) the values of the same T positions, gains floats or
    (), (1,), (H,) tensors. Plain differentiable ops: the reference a fused kernel is tested against."""
    out = gain4(beta) * a + gain4(alpha) * v
    if gamma is None:
        return out
    acc = torch.promote_types(v.dtype, torch.float32)
    count = torch.arange(1, v.shape[-2] + 1, device=v.device, dtype=acc)[:, None]
    return out - gain4(gamma) * (scan(v, acc) / count).to(v.dtype)


def cross_layer_attention(q: Tensor, k: Tensor, v: Tensor, other_k: Tensor, other_v: Tensor,
                          causal: bool = True, window: int | None = None,
                          valid: Tensor | None = None) -> Tensor:
    """softmax(Q [K; K_m]^T / sqrt(d)) [V; V_m]: attention over the keys and values of this layer and
    of another layer m at the same positions, each half under the same mask (Value Residual Eq. 2;
    `valid` (B, T_k): a padded batch's real keys, see `padded_mask`).
    """
    t_q, t_k = q.shape[-2], k.shape[-2]
    if valid is None:
        mask = attention_mask(t_q, t_k, causal, window, q.device)
    else:
        mask = padded_mask(valid, t_q, causal, window)
    if mask is not None:
        mask = torch.cat((mask, mask), dim=-1)
    keys, values = torch.cat((k, other_k), dim=-2), torch.cat((v, other_v), dim=-2)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                          enable_gqa=keys.shape[-3] != q.shape[-3])


def split_heads(x: Tensor, head_dim: int) -> Tensor:
    """(B, T, H * head_dim) -> (B, H, T, head_dim)."""
    b, t, _ = x.shape
    return x.view(b, t, -1, head_dim).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, H, T, D) -> (B, T, H * D)."""
    b, _, t, _ = x.shape
    return x.transpose(1, 2).reshape(b, t, -1)


def attention_probs(q: Tensor, k: Tensor, causal: bool = True, window: int | None = None,
                    scale: float | None = None, valid: Tensor | None = None) -> Tensor:
    """The explicit softmax matrix A of Eq. (2), shape (B, H, T_q, T_k); O(T^2) memory. `valid`
    (B, T_k): the real keys of a padded batch (`padded_mask`)."""
    k = expand_kv(k, q.shape[-3])
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = (q @ k.transpose(-1, -2)) * scale
    mask = _mask(q.shape[-2], k.shape[-2], causal, window, q.device, valid)
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    return torch.softmax(logits, dim=-1)


def _mask(t_q: int, t_k: int, causal: bool, window: int | None, device: torch.device | None,
          valid: Tensor | None) -> Tensor | None:
    """`attention_mask`, or `padded_mask` for a padded batch."""
    if valid is None:
        return attention_mask(t_q, t_k, causal, window, device)
    return padded_mask(valid, t_q, causal, window)


def centering_matrix(t_q: int, t_k: int, causal: bool = True, window: int | None = None,
                     device: torch.device | None = None, dtype: torch.dtype = torch.float32,
                     valid: Tensor | None = None) -> Tensor:
    """C of Eq. (5): the attention matrix when all query-key logits are zero, under the mask (with
    `valid` (B, T_k), the padded mask: the mean of each query's real keys), (T_q, T_k) or
    (B, 1, T_q, T_k)."""
    mask = _mask(t_q, t_k, causal, window, device, valid)
    if mask is None:
        return torch.full((t_q, t_k), 1.0 / t_k, device=device, dtype=dtype)
    mask = mask.to(dtype)
    return mask / mask.sum(-1, keepdim=True)


def shaped_attention_matrix(q: Tensor, k: Tensor, alpha: Tensor | float, beta: Tensor | float,
                            gamma: Tensor | float | None, causal: bool = True,
                            window: int | None = None, scale: float | None = None,
                            valid: Tensor | None = None) -> Tensor:
    """The explicit matrix alpha I + beta A - gamma C (B, H, T_q, T_k), for diagnostics and for
    padded batches (`valid` (B, T_k): A and C see each row's real keys only, `padded_mask`).

    I is offset like the mask: query i is the key at position T_k - T_q + i.
    """
    t_q, t_k = q.shape[-2], k.shape[-2]
    probs = attention_probs(q, k, causal, window, scale, valid)
    eye = torch.eye(t_k, device=q.device, dtype=probs.dtype)[t_k - t_q:]
    out = _per_head(beta) * probs + _per_head(alpha) * eye
    if gamma is not None:
        c = centering_matrix(t_q, t_k, causal, window, q.device, probs.dtype, valid)
        out = out - _per_head(gamma) * c
    return out

