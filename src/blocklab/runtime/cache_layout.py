"""The layout of the KV cache: which tensors it stores for each layer and how many recent positions
each keeps, decided from each layer's `LayerRole` (its `key_layer`, `value_layer` and `reads_layer`,
model/value_paths/base.py), never from the value path's name; and what that layout costs in bytes
(`cache_bytes_per_token`), with no model built. `KVCache` (runtime/cache.py) allocates what it says.

    standard, ResFormer family, NeuTRENO, DenseFormer,   K and V per layer (the V attention uses:
    value-embed, cross-layer attention                     ResFormer's mixed V, value-embed's V + g E)
    grouped-query attention                               K and V with n_kv_heads heads
    CLA (Brandon et al. 2024)                             K and V of each group's first layer only
    SVFormer (Value Residual Eq. 10, Sec. 3.5)            K per layer, V once (V_1, and once per anchor)
    v1-value (Bank of Values Table 1)                     K per layer, V of the non-target layers
    Bank of Values (Eq. 5), x0-value                      K per layer, V of the non-target layers and
                                                          one buffer of token ids shared by all layers

So SVFormer holds (L + 1) / (2L) of the standard K + V bytes, and Bank of Values saves
Delta_KV = (L/3) d (T - |V|) values per sequence once its tables are counted (Bank of Values Eq. 6).

Value paths whose mixing is token-local need nothing beyond their own V: ResFormer's
V'_n = lambda_1 V_1 + lambda_2 V_n and Dense-ResFormer's V'_n = sum_i lambda_{n,i} V_i mix the values
of one position, so V'_n of a past position is computed once, when that token is processed, and
cached like any V; V_1 (and every earlier V_i) is needed only for the current tokens, which the
`Carry` holds. NeuTRENO's correction lambda (V_1 - V_n) and DenseFormer's average over block
outputs are token-local too.

Sliding-window layers keep a ring of their last `window` positions (the window of the newest query,
itself included; the queries of a new chunk also see the chunk). A tensor read by several layers
(CLA's shared K and V, SVFormer's V_1, the first layer's K and V under cross-layer attention, the
token ids) keeps the widest span among its readers, so a windowed layer whose V_1 a full-context
layer reads keeps every position. Each full-context layer of shaped attention also keeps a running
sum of its values (`summed_layers`; runtime/cache.py says why).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from blocklab.model.value_paths import (
    SharedModule,
    ValuePath,
    is_value_table,
    make_shared_module,
    make_value_path,
)
from blocklab.util.errors import ConfigError

if TYPE_CHECKING:
    from blocklab.model.config import ModelConfig

TOKEN_ID_DTYPE = torch.int32  # 4 bytes per cached token id (F.embedding takes int32 indices)


def first_position(past: int, span: int | None) -> int:
    """The oldest position a query at `past` (or later) can see through a window of `span` keys."""
    return 0 if span is None else max(0, past - span + 1)


def _widest(windows: list[int | None]) -> int | None:
    """The span a store needs to serve readers with these windows (None: every position)."""
    spans = [w for w in windows if w is not None]
    return None if len(spans) < len(windows) else max(spans)


@dataclass(frozen=True)
class CacheLayout:
    """Which tensors the cache stores and how many recent positions each keeps (None: all).

    `key_spans[j]` / `value_spans[j]`: the keys / values of layer j; `id_span`: the token ids,
    stored when some layer computes its values from them (`has_ids`); `summed_layers`: the layers
    whose centering term reads a running sum of their values; `routes[i]`: layer i's `key_layer`,
    `value_layer` and `reads_layer`, copied from its value path's `LayerRole`; `caches_values[i]`:
    whether layer i stores the values it computes (its value path's `caches_values`), else it reads
    them from `value_layer`'s store or the token ids.
    """

    windows: tuple[int | None, ...]
    routes: tuple[tuple[int, int | None, int | None], ...]
    caches_values: tuple[bool, ...]
    key_spans: dict[int, int | None]
    value_spans: dict[int, int | None]
    has_ids: bool
    id_span: int | None
    summed_layers: tuple[int, ...]  # full-context shaped layers: a running sum for their C V

    @classmethod
    def from_paths(cls, cfg: ModelConfig, paths: Sequence[ValuePath]) -> CacheLayout:
        windows = tuple(cfg.layer_window(i) for i in range(cfg.n_layers))
        key_readers: dict[int, list] = {}
        value_readers: dict[int, list] = {}
        id_readers = []
        for layer, path in enumerate(paths):
            w = windows[layer]
            key_readers.setdefault(path.key_layer, []).append(w)
            if path.value_layer is None:
                id_readers.append(w)
            else:
                value_readers.setdefault(path.value_layer, []).append(w)
            if path.reads_layer is not None:
                key_readers.setdefault(path.reads_layer, []).append(w)
                value_readers.setdefault(path.reads_layer, []).append(w)
        return cls(windows=windows,
                   routes=tuple((p.key_layer, p.value_layer, p.reads_layer) for p in paths),
                   caches_values=tuple(p.caches_values for p in paths),
                   key_spans={j: _widest(r) for j, r in sorted(key_readers.items())},
                   value_spans={j: _widest(r) for j, r in sorted(value_readers.items())},
                   has_ids=bool(id_readers), id_span=_widest(id_readers) if id_readers else None,
                   summed_layers=tuple(i for i, w in enumerate(windows)
                                       if cfg.attn_matrix == "shaped" and w is None))


def check_causal(cfg: ModelConfig) -> None:
    if not cfg.causal:
        raise ConfigError("ModelConfig.causal = False: a bidirectional encoder attends to later tokens, "
                          "so it cannot decode with a KV cache; use a causal model.")


def _value_paths(cfg: ModelConfig) -> tuple[list[ValuePath], SharedModule | None]:
    """The value paths of `cfg`, built on the meta device (no memory): they describe the layout."""
    with torch.device("meta"):
        return [make_value_path(cfg, i) for i in range(cfg.n_layers)], make_shared_module(cfg)


def cache_bytes_per_token(cfg: ModelConfig, dtype_bytes: int = 2, context: int | None = None) -> dict:
    """The analytic cache layout of `cfg` for one sequence of `context` positions.

    Keys and values take kv_dim * dtype_bytes per position; a store keeps `context` positions, or
    min(span, context) for a sliding-window span; token ids take 4 bytes (int32) per position.
    Returns a dict with, for one sequence of `context` positions (default: cfg.context_length):

    - ``layers``: per layer ``kind`` ("K+V", "K", "V" or "-": what it stores itself), the
      positions its keys and values keep (``key_entries``, ``value_entries``: a sliding-window
      layer keeps its window unless a full-context layer reads them) and ``key_bytes``, ``value_bytes``;
    - ``kinds``: how many layers of each kind;
    - ``key_bytes``, ``value_bytes``, ``token_id_bytes``, ``value_sum_bytes`` (shaped attention's
      running sums: kv_dim values per full-context layer, in at least float32, whatever the
      context) and ``total_bytes`` (their sum, which equals ``KVCache.nbytes`` for batch 1 and
      max_len = context);
    - ``per_token``: total_bytes / context;
    - ``value_table_bytes``: the token-indexed value tables (Bank of Values' E_v, value embeddings)
      at dtype_bytes, parameters rather than cache, which decide Bank of Values' breakeven
      (Eq. 6: it saves memory once context > vocab_size).
    """
    check_causal(cfg)
    context = cfg.context_length if context is None else context
    if not isinstance(context, int) or context < 1:
        raise ValueError(f"context = {context!r} is not allowed: give a positive number of positions.")
    paths, shared = _value_paths(cfg)
    layout = CacheLayout.from_paths(cfg, paths)
    kv_dim = cfg.attention_shape.kv_dim
    width = kv_dim * dtype_bytes

    def entries(span: int | None) -> int:
        return context if span is None else min(span, context)

    layers: list[dict[str, Any]] = []
    for i in range(cfg.n_layers):
        k = entries(layout.key_spans[i]) if i in layout.key_spans else 0
        v = entries(layout.value_spans[i]) if i in layout.value_spans else 0
        kind = "K+V" if k and v else "K" if k else "V" if v else "-"
        layers.append(dict(layer=i, kind=kind, key_entries=k, value_entries=v, key_bytes=k * width,
                           value_bytes=v * width))
    ids = entries(layout.id_span) * TOKEN_ID_DTYPE.itemsize if layout.has_ids else 0
    keys, values = sum(x["key_bytes"] for x in layers), sum(x["value_bytes"] for x in layers)
    modules = [*paths, shared] if shared is not None else paths
    tables = sum(p.numel() for m in modules for n, p in m.named_parameters() if is_value_table(n))
    sums = len(layout.summed_layers) * kv_dim * max(dtype_bytes, 4)
    total = keys + values + ids + sums
    return dict(context=context, dtype_bytes=dtype_bytes, layers=layers,
                kinds=dict(Counter(x["kind"] for x in layers)), key_bytes=keys, value_bytes=values,
                token_id_bytes=ids, value_sum_bytes=sums, total_bytes=total, per_token=total / context,
                value_table_bytes=tables * dtype_bytes)


def table_layers(cfg: ModelConfig) -> tuple[int, int]:
    """(layers that read values by token id, distinct value tables they read): Bank of Values' target
    layers and its tables (one per target layer, or one shared)."""
    paths, shared = _value_paths(cfg)
    readers = sum(1 for p in paths if p.value_layer is None)
    modules = [*paths, shared] if shared is not None else paths
    tables = sum(1 for m in modules for n, _ in m.named_parameters() if is_value_table(n))
    return readers, tables
