"""Initialisation schemes beyond the default N(0, init_std) (``ModelConfig.init_scheme``).

nanochat (karpathy/nanochat `GPT.init_weights`; the Bank of Values models, Table 8), with
s = sqrt(3 / d_model), the bound of a uniform law whose std is 1 / sqrt(d_model):

    token embedding   N(0, 0.8^2)            head (untied)    N(0, 0.001^2)
    W_Q, W_K, W_V     U(-s, s)               W_O              0
    MLP in            U(-0.4 s, 0.4 s)       MLP out          0
    smear gate W_s    U(0, 0.02)             (the trunk's scalars keep their own inits, model/trunk.py)

With zero output projections every block starts as the identity on the residual stream.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from blocklab.config import ModelConfig
    from blocklab.model.transformer import Transformer


def init_projection_(weight: Tensor, cfg: ModelConfig) -> None:
    """A Q, K or V projection's weight under the config's scheme: N(0, init_std), or nanochat's U(-s, s)."""
    if cfg.init_scheme == "nanochat":
        s = math.sqrt(3.0 / cfg.d_model)
        nn.init.uniform_(weight, -s, s)
    else:
        nn.init.normal_(weight, std=cfg.init_std)


def _linear(module: object) -> nn.Linear | None:
    """The module if it is a plain trainable linear map (identity and reparameterised maps keep theirs)."""
    return module if isinstance(module, nn.Linear) else None


@torch.no_grad()
def nanochat_init(model: Transformer) -> None:
    """Overwrite the default init with nanochat's (module docstring); value-path tables and gates keep
    the inits their paths give them, and Bank of Values tables are built afterwards from these W^V."""
    s = math.sqrt(3.0 / model.cfg.d_model)
    nn.init.normal_(model.tok_emb.weight, std=0.8)
    if model.head is not None:
        nn.init.normal_(model.head.weight, std=0.001)
    if model.smear is not None:
        nn.init.uniform_(model.smear.gate.weight, 0.0, 0.02)
    for block in model.block_list():
        attn = block.attn
        w_v = getattr(attn.values, "w_v", None)
        for module in (attn.q, attn.k, w_v):
            linear = _linear(module)
            if linear is not None:
                init_projection_(linear.weight, model.cfg)
        proj = _linear(attn.proj)
        if proj is not None:
            nn.init.zeros_(proj.weight)
        nn.init.uniform_(block.mlp.fc.weight, -0.4 * s, 0.4 * s)
        nn.init.zeros_(block.mlp.out.weight)
