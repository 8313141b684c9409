"""nanochat's optimiser recipe (``OptimConfig(name="nanochat")``): Muon for the block matrices, and
AdamW groups with their own learning rates, betas and weight decay, as the Bank of Values branch of
nanochat sets them (`GPTBase.setup_optimizer` and `scripts/base_train.py` defaults; karpathy/nanochat
`GPT.setup_optimizer` for the residual and x0 scalars).

With s_d = (d_model / 768)^-1/2 (width) and s_B = sqrt(B / 2^19) (B tokens per optimiser step):

    group          parameters                                lr                 betas          wd
    head           head.weight                               0.008 s_d s_B      (0.8, 0.96)    0.01
    embeddings     tok_emb (and pos_emb)                     0.3 s_d s_B        (0.8, 0.995)   0.001
    value_tables   BoV tables, value embeddings              0.15 s_d s_B       (0.8, 0.995)   0.01
    smear          smear.*, backout.*                        0.2                (0.8, 0.95)    0
    resid_scalars  blocks.i.residual.resid_lambda.gain,      0.005 s_B          (0.8, 0.95)    0.05
                   BoV's alpha: x0-value's a, ResFormer's lambda_2
    x0_scalars     blocks.i.residual.x0_lambda.gain          0.5 s_B            (0.96, 0.95)   0
    scalars        other gains (gamma_v, ResFormer lambdas)  0.5 s_B            (0.96, 0.95)   0
    no_decay       norm weights, biases (nanochat has none)  0.02 s_B           (0.8, 0.95)    0
    muon           2-D matrices in blocks                    0.02 s_B, momentum 0.95, wd 0.28 s_B

All AdamW groups use eps 1e-10. The no_decay row is blocklab's choice: nanochat's model has no
norm weights or biases. Left out (torch.optim.Muon has none of them): nanochat's Polar-Express
coefficients, NorMuon variance reduction, cautious weight decay, the momentum ramp 0.85 -> 0.97 and
the cosine decay of Muon's weight decay; nanochat also scales Muon's weight decay by D_ref / D (its
d24 run uses 0.0597), which `muon_weight_decay` sets.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from torch import Tensor

from blocklab.catalog import OWN_VALUE_WEIGHT, scalar_role

B_REF = 2 ** 19  # nanochat's reference batch in tokens
D_REF = 768  # the width its AdamW learning rates were tuned at


class GroupSettings(NamedTuple):
    lr: float
    betas: tuple[float, float]
    weight_decay: float
    scaled_by_width: bool = False
    scaled_by_batch: bool = True


SETTINGS: dict[str, GroupSettings] = {
    "head": GroupSettings(0.008, (0.8, 0.96), 0.01, scaled_by_width=True),
    "embeddings": GroupSettings(0.3, (0.8, 0.995), 0.001, scaled_by_width=True),
    "value_tables": GroupSettings(0.15, (0.8, 0.995), 0.01, scaled_by_width=True),
    "smear": GroupSettings(0.2, (0.8, 0.95), 0.0, scaled_by_batch=False),
    "resid_scalars": GroupSettings(0.005, (0.8, 0.95), 0.05),
    "x0_scalars": GroupSettings(0.5, (0.96, 0.95), 0.0),
    "scalars": GroupSettings(0.5, (0.96, 0.95), 0.0),
    "no_decay": GroupSettings(0.02, (0.8, 0.95), 0.0),
}
EPS = 1e-10
MUON_LR, MUON_MOMENTUM, MUON_WEIGHT_DECAY = 0.02, 0.95, 0.28


def nanochat_group(name: str, general: str) -> str:
    """The recipe's group of parameter `name`, given its group under blocklab's default rules."""
    if name.startswith(("smear.", "backout.")):
        return "smear"
    # the weight on a layer's own V (x0-value's a, ResFormer's lambda_2: the catalog's `roles` say which)
    # shares the residual scalars' settings
    if name.endswith(".resid_lambda.gain") or scalar_role(name) == OWN_VALUE_WEIGHT:
        return "resid_scalars"
    if name.endswith(".x0_lambda.gain"):
        return "x0_scalars"
    return "no_decay" if general == "decay" else general  # decay: matrices outside the blocks


def scales(d_model: int, tokens_per_step: int | None) -> tuple[float, float]:
    """(s_d, s_B); s_B is 1 when the tokens per step are not known."""
    s_d = (d_model / D_REF) ** -0.5
    s_b = math.sqrt(tokens_per_step / B_REF) if tokens_per_step else 1.0
    return s_d, s_b


def adamw_groups(named: dict[str, list[tuple[str, Tensor]]], d_model: int,
                 tokens_per_step: int | None) -> list[dict]:
    """AdamW param groups (with ``name`` and ``base_lr``) of the recipe's non-Muon groups."""
    s_d, s_b = scales(d_model, tokens_per_step)
    groups = []
    for group, settings in SETTINGS.items():
        params = [p for _, p in named.get(group, [])]
        if not params:
            continue
        lr = settings.lr * (s_d if settings.scaled_by_width else 1.0)
        lr *= s_b if settings.scaled_by_batch else 1.0
        groups.append({"params": params, "name": group, "lr": lr, "base_lr": lr, "betas": settings.betas,
                       "eps": EPS, "weight_decay": settings.weight_decay})
    return groups


def muon_settings(tokens_per_step: int | None, weight_decay: float | None) -> tuple[float, float]:
    """(lr, weight decay) of the Muon group: 0.02 s_B and 0.28 s_B unless `weight_decay` is given."""
    _, s_b = scales(D_REF, tokens_per_step)
    return MUON_LR * s_b, MUON_WEIGHT_DECAY * s_b if weight_decay is None else weight_decay


def group_names() -> tuple[str, ...]:
    return (*SETTINGS, "muon")
