"""Initialisation schemes beyond the default N(0, init_std) (``ModelConfig.init_scheme``).

nanochat (karpathy/nanochat `GPT.init_weights`; the Bank of Values models, Table 8), with
s = sqrt(3 / d_model), the bound of a uniform law whose std is 1 / sqrt(d_model):

    token embedding   N(0, 0.8^2)            head (untied)    N(0, 0.001^2)
    W_Q, W_K, W_V     U(-s, s)               W_O              0
    MLP in            U(-0.4 s, 0.4 s)       MLP out          0
    smear gate W_s    U(0, 0.02)             (the trunk's scalars keep their own inits, model/trunk.py)

With zero output projections every block starts as the identity on the residual stream. The Q, K, V
rule is here (value paths with their own W^V read it); the whole-model pass is `nanochat_init` in
model/transformer.py.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from torch import Tensor, nn

if TYPE_CHECKING:
    from blocklab.model.fields import ModelFields


def init_projection_(weight: Tensor, cfg: ModelFields) -> None:
    """A Q, K or V projection's weight under the config's scheme: N(0, init_std), or nanochat's U(-s, s)."""
    if cfg.init_scheme == "nanochat":
        s = math.sqrt(3.0 / cfg.d_model)
        nn.init.uniform_(weight, -s, s)
    else:
        nn.init.normal_(weight, std=cfg.init_std)
