"""Parameter counts and analytic FLOPs per token.

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

from torch import nn

from blocklab.model.linear_maps import ReparamLinear
from blocklab.model.value_paths import is_value_table


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
