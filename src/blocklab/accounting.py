"""Parameter counts, analytic FLOPs per token, and the device and host bytes of Bank of Values with its
tables offloaded (`offload_bytes`).

Parameters are split into embedding (token and learned-position tables), value tables (token-
indexed value banks of the value-path family) and non-embedding (everything else, an untied
output head included). FLOPs per token follow the nanochat/Kaplan convention for one training
step (forward + backward):

    6 * N_matmul + sum over layers of 12 * H * d_head * T_eff

with N_matmul the weights used in matrix multiplications (the output head included even when
tied; embedding and value-table lookups, norms, biases, scalar gains and nanochat's 24-weight smear
gate excluded, as Bank of Values' FLOPs count does; a
reparameterised W = a W_init + b dW counts once, as one d x d matmul) and T_eff the keys a query
sees in that layer: min(window, T) at sequence length T (context_length by default), times the
number of key sets it attends over (2 for the exact cross-layer attention of Value Residual Eq. 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import nn

from blocklab.model.linear_maps import ReparamLinear
from blocklab.model.value_paths import is_value_table
from blocklab.runtime.cache_layout import cache_bytes_per_token, table_layers
from blocklab.runtime.offload import SLOT_DTYPE

if TYPE_CHECKING:
    from blocklab.model.config import ModelConfig


@dataclass
class ParameterCounts:
    total: int
    embedding: int
    value_tables: int

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding - self.value_tables


def count_parameters(model: nn.Module) -> ParameterCounts:
    total = embedding = tables = 0
    for name, p in model.named_parameters():
        n = p.numel()
        total += n
        if name.startswith(("tok_emb.", "pos_emb.")):
            embedding += n
        elif is_value_table(name):
            tables += n
    return ParameterCounts(total, embedding, tables)


def matmul_weights(model: nn.Module) -> int:
    """Weights used in matrix multiplications per token (see module docstring)."""
    n = 0
    for name, module in model.named_modules():
        if name.startswith("smear."):
            continue
        if isinstance(module, nn.Linear):
            n += module.weight.numel()
        elif isinstance(module, ReparamLinear):
            n += module.delta.numel()
    cfg = model.cfg
    if cfg.tie_embeddings:
        n += cfg.vocab_size * cfg.d_model
    return n


def flops_per_token(model: nn.Module, seq_len: int | None = None) -> int:
    """Analytic training FLOPs per token (forward + backward) at sequence length `seq_len`."""
    cfg = model.cfg
    t = seq_len or cfg.context_length
    attn = 0
    for layer, block in enumerate(model.blocks):
        window = cfg.layer_window(layer)
        keys = (min(window, t) if window else t) * block.attn.values.key_sets
        attn += 12 * cfg.attention_shape.q_dim * keys
    return 6 * matmul_weights(model) + attn


def offload_bytes(cfg: ModelConfig, context: int, unique_ids: int | None = None, batch: int = 1,
                  dtype_bytes: int = 2) -> dict:
    """Device and host bytes of Bank of Values with its tables resident and offloaded (runtime/offload.py),
    against the standard model's cache, for `batch` sequences of `context` positions.

    `unique_ids`: distinct token ids the batch used (default: every position distinct, at most |V|,
    the worst case); an offloaded table keeps min(unique_ids, |V|) rows of kv_dim on the device. Returns:

    - ``cache_bytes``: this model's KV cache (K, V of the non-target layers, token ids), as
      `cache_bytes_per_token` counts it;
    - ``standard_cache_bytes``: the cache of the same model with standard values (K and V every layer);
    - ``table_bytes``: every table, where resident tables live (the device) and offloaded ones (the host);
    - ``row_bytes``: the offloaded tables' rows on the device; ``slot_map_bytes``: the host's id -> slot map;
    - ``resident_device_bytes`` = cache + tables, ``offloaded_device_bytes`` = cache + rows,
      ``offloaded_host_bytes`` = tables + slot map;
    - ``eq6_saved_bytes``: Bank of Values Eq. 6, (L/3) d (T - |V|) per sequence (the value cache of the
      target layers less the tables, token ids not counted; one shared table counts once), times batch;
    - ``saved_resident_bytes`` / ``saved_offloaded_bytes``: standard cache less the resident / offloaded
      device bytes (token ids counted): positive where Bank of Values holds fewer device bytes.
    """
    vocab, kv_dim = cfg.vocab_size, cfg.attention_shape.kv_dim
    readers, tables = table_layers(cfg)
    if tables == 0:
        raise ValueError(f"value_path={cfg.value_path!r} has no value tables to offload: use 'bov' or "
                         "'bov-resformer'.")
    total = batch * context
    unique = min(total, vocab) if unique_ids is None else unique_ids
    if not 0 <= unique <= min(total, vocab):
        raise ValueError(f"unique_ids = {unique_ids!r} is not allowed: between 0 and min(batch x context, "
                         f"vocab_size) = {min(total, vocab)}.")
    standard = cfg.replace(value_path="standard", value_path_options={})
    cache, std_cache = (batch * cache_bytes_per_token(c, dtype_bytes, context)["total_bytes"]
                        for c in (cfg, standard))
    table, rows = (tables * n * kv_dim * dtype_bytes for n in (vocab, unique))
    slot_map = vocab * SLOT_DTYPE.itemsize
    eq6 = batch * (readers * kv_dim * context * dtype_bytes) - table
    return dict(context=context, batch=batch, unique_ids=unique, dtype_bytes=dtype_bytes,
                table_layers=readers, tables=tables, cache_bytes=cache, standard_cache_bytes=std_cache,
                table_bytes=table, row_bytes=rows, slot_map_bytes=slot_map,
                resident_device_bytes=cache + table,
                offloaded_device_bytes=cache + rows, offloaded_host_bytes=table + slot_map,
                eq6_saved_bytes=eq6, saved_resident_bytes=std_cache - cache - table,
                saved_offloaded_bytes=std_cache - cache - rows)
