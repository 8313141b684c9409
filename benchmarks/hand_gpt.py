"""A hand-written nanoGPT-style GPT-2: the plain-PyTorch reference of the training benchmarks.

One fused QKV `nn.Linear`, `F.scaled_dot_product_attention(is_causal=True)`, LayerNorm with bias,
GELU with GPT-2's tanh approximation, an MLP of 4 d (or `mlp_hidden`), learned positions, the head
tied to the token embedding and GPT-2's init (weights N(0, 0.02), the two residual output
projections N(0, 0.02 / sqrt(2 L)), biases 0). Per block, with x (B, T, d):

    x <- x + W_o SDPA_causal(split_heads(W_qkv LN_1(x)))
    x <- x + W_2 gelu_tanh(W_1 LN_2(x))

and logits = LN_f(x) E^T. `hf_state_dict` lays its weights out as HF `GPT2LMHeadModel`'s, so
`blocklab.interop.from_hf` builds the blocklab model of the same function (tests/test_bench_smoke.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class HandBlock(nn.Module):
    """One Pre-LN GPT-2 block: causal self-attention, then the GELU MLP, each on its own skip."""

    def __init__(self, d_model: int, n_heads: int, mlp_hidden: int, eps: float):
        super().__init__()
        self.n_heads = n_heads
        self.ln_1 = nn.LayerNorm(d_model, eps=eps)
        self.c_attn = nn.Linear(d_model, 3 * d_model)  # [W_Q; W_K; W_V] in one matrix
        self.c_proj = nn.Linear(d_model, d_model)
        self.ln_2 = nn.LayerNorm(d_model, eps=eps)
        self.c_fc = nn.Linear(d_model, mlp_hidden)
        self.mlp_proj = nn.Linear(mlp_hidden, d_model)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).view(b, t, 3, self.n_heads, d // self.n_heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class HandGPT(nn.Module):
    """GPT-2 of a given shape; forward(ids (B, T)) -> logits (B, T, vocab_size)."""

    def __init__(self, vocab_size: int, d_model: int, n_layers: int, n_heads: int, context_length: int,
                 mlp_hidden: int | None = None, eps: float = 1e-5):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be a multiple of n_heads={n_heads}")
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(context_length, d_model)
        self.blocks = nn.ModuleList(HandBlock(d_model, n_heads, mlp_hidden or 4 * d_model, eps)
                                    for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model, eps=eps)
        self.apply(self._init)
        for block in self.blocks:  # GPT-2: residual outputs scaled by 1 / sqrt(2 L)
            for proj in (block.c_proj, block.mlp_proj):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * n_layers))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # the tied head


def hf_state_dict(model: HandGPT) -> dict[str, Tensor]:
    """The weights under HF `GPT2LMHeadModel`'s names (its Conv1D stores W as (in, out): W^T here)."""
    out = {"transformer.wte.weight": model.wte.weight, "transformer.wpe.weight": model.wpe.weight,
           "transformer.ln_f.weight": model.ln_f.weight, "transformer.ln_f.bias": model.ln_f.bias,
           "lm_head.weight": model.wte.weight}
    names = {"ln_1": "ln_1", "ln_2": "ln_2", "c_attn": "attn.c_attn", "c_proj": "attn.c_proj",
             "c_fc": "mlp.c_fc", "mlp_proj": "mlp.c_proj"}
    for i, block in enumerate(model.blocks):
        for ours, theirs in names.items():
            module = getattr(block, ours)
            linear = isinstance(module, nn.Linear)
            out[f"transformer.h.{i}.{theirs}.weight"] = module.weight.t() if linear else module.weight
            out[f"transformer.h.{i}.{theirs}.bias"] = module.bias
    return {k: v.detach().clone() for k, v in out.items()}
