"""Optimisers of the trainer: AdamW with parameter groups, or Muon for hidden matrices plus AdamW.

Every trainable parameter lands in exactly one group, chosen from its name and owning module:

    value_tables  parameters named ``value_table`` (Bank of Values tables, nanochat value
                  embeddings, the shared table under ``value_shared``); decayed if
                  `decay_value_tables`
    embeddings    ``nn.Embedding`` weights (``tok_emb``, ``pos_emb``; the head too when tied);
                  decayed if `decay_embeddings`
    head          the untied output projection ``head.weight``; decayed
    scalars       trainable gains, names ending in ``gain`` (`blocklab.model.gains.is_gain`); no decay
    no_decay      norm weights and biases (and any other parameter with fewer than 2 dimensions)
    muon          (``name="muon"``) 2-D matrices inside ``blocks``: Q, K, V, projections, MLP,
                  the reparameterised dW of Eq. (6), value-embedding gates
    decay         everything else: with AdamW the block matrices; decayed

``name="nanochat"`` is nanochat's recipe (`training/nanochat_recipe.py`): the same Muon group and
AdamW groups with nanochat's learning rates, betas, eps and weight decay, scaled by width and batch as
nanochat scales them; its own lr fields (lr, lr_*, muon_lr) are not read.

Simplifying Transformer Blocks (App. B) decays everything but scalar gains, norms and biases
with AdamW (wd 0.1). Bank of Values (Table 8) follows nanochat: Muon (lr 0.02) for the block
matrices and AdamW for embeddings, head, tables and scalars, each with its own learning rate.

AdamW (Loshchilov & Hutter 2019) with decoupled weight decay, per parameter:

    m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
    p <- p (1 - lr wd) - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

Muon is ``torch.optim.Muon`` (torch >= 2.9): Nesterov momentum, then the Newton-Schulz
orthogonalisation O of the update (5 quintic steps in bf16), then

    p <- p (1 - lr wd) - lr sqrt(max(1, rows / cols)) O

It accepts only 2-D parameters. The scale sqrt(max(1, rows/cols)) is its ``adjust_lr_fn=
"original"`` (Keller Jordan's Muon, also nanochat's); lr 0.02 is tuned for it. The other choice,
``"match_rms_adamw"`` (0.2 sqrt(max(rows, cols)), Moonshot), makes the update RMS match AdamW's
so that AdamW learning rates carry over; set `muon_adjust_lr` to use it. torch's Muon decays with
the unscaled lr. nanochat's own Muon adds Polar-Express coefficients, NorMuon variance reduction
and cautious weight decay, which torch's does not.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from blocklab.model.gains import is_gain
from blocklab.model.value_paths import is_value_table
from blocklab.util.configbase import ConfigBase, config_dataclass, is_count
from blocklab.util.errors import ConfigError

# relative: the modules move together (the trainer package may be renamed)
from . import nanochat_recipe
from .schedules import SCHEDULES

OPTIMIZERS = ("adamw", "muon", "nanochat")
MUON_LR_ADJUST = ("original", "match_rms_adamw")
NORM_TYPES = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)


@config_dataclass
class OptimConfig(ConfigBase):
    name: str = "adamw"  # "adamw" | "muon" (Muon for block matrices, AdamW for the rest) | "nanochat"
    lr: float = 1e-3  # base lr of the AdamW "decay" / "no_decay" groups
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    decay_embeddings: bool = False
    decay_value_tables: bool = False
    lr_embeddings: float | None = None  # None: lr
    lr_head: float | None = None
    lr_value_tables: float | None = None
    lr_scalars: float | None = None
    muon_lr: float = 0.02
    muon_momentum: float = 0.95
    muon_weight_decay: float | None = None  # None: weight_decay
    muon_adjust_lr: str = "original"  # torch.optim.Muon's adjust_lr_fn, see the module docstring
    grad_clip: float | None = 1.0  # max global gradient norm; None or 0: no clipping
    schedule: str = "linear"  # linear | cosine | wsd | one-cycle | constant (schedules.py)
    warmup_fraction: float = 0.05
    warmup_steps: int | None = None  # overrides warmup_fraction when the budget in steps is known
    warmdown_fraction: float = 0.65  # wsd
    peak_at: float = 0.75  # one-cycle
    final_lr_fraction: float | None = None  # None: the schedule's own (linear 0, cosine 0.1, wsd 0.05)

    def __post_init__(self) -> None:
        if isinstance(self.betas, list):  # YAML gives lists
            self.betas = tuple(self.betas)
        _validate(self)


# -- validation ----------------------------------------------------------------------------------
def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_range(cfg: OptimConfig, name: str, low: float, high: float | None = None, *,
                 open_low: bool = False, open_high: bool = False, optional: bool = False) -> None:
    value = getattr(cfg, name)
    if optional and value is None:
        return
    ok = _is_number(value)
    if ok:
        ok = value > low if open_low else value >= low
        if high is not None:
            ok = ok and (value < high if open_high else value <= high)
    if not ok:
        lo = f"{'>' if open_low else '>='} {low}"
        hi = "" if high is None else f" and {'<' if open_high else '<='} {high}"
        cfg.fail(name, value, f"it must be a finite number {lo}{hi}" + (" (or None)." if optional else "."))


def _validate(cfg: OptimConfig) -> None:
    if cfg.name not in OPTIMIZERS:
        cfg.fail("name", cfg.name, f"choose one of {', '.join(map(repr, OPTIMIZERS))}.")
    if cfg.schedule not in SCHEDULES:
        cfg.fail("schedule", cfg.schedule, f"choose one of {', '.join(map(repr, SCHEDULES))}.")
    if cfg.muon_adjust_lr not in MUON_LR_ADJUST:
        cfg.fail("muon_adjust_lr", cfg.muon_adjust_lr,
                 f"choose one of {', '.join(map(repr, MUON_LR_ADJUST))}.")
    for name in ("lr", "muon_lr", "weight_decay"):
        _check_range(cfg, name, 0.0)
    for name in ("lr_embeddings", "lr_head", "lr_value_tables", "lr_scalars", "muon_weight_decay",
                 "grad_clip"):
        _check_range(cfg, name, 0.0, optional=True)
    _check_range(cfg, "eps", 0.0, open_low=True)
    _check_range(cfg, "muon_momentum", 0.0, 1.0, open_high=True)
    for name in ("warmup_fraction", "warmdown_fraction", "peak_at"):
        _check_range(cfg, name, 0.0, 1.0)
    _check_range(cfg, "final_lr_fraction", 0.0, 1.0, optional=True)
    betas = cfg.betas
    if not (isinstance(betas, tuple) and len(betas) == 2
            and all(_is_number(b) and 0.0 <= b < 1.0 for b in betas)):
        cfg.fail("betas", betas, "give two numbers (beta1, beta2), each in [0, 1).")
    steps = cfg.warmup_steps
    if steps is not None and not is_count(steps, 0):
        cfg.fail("warmup_steps", steps, "it must be an integer >= 0 (or None to use warmup_fraction).")
    for name in ("decay_embeddings", "decay_value_tables"):
        if not isinstance(getattr(cfg, name), bool):
            cfg.fail(name, getattr(cfg, name), "it must be true or false.")


# -- parameter groups ----------------------------------------------------------------------------
GROUPS = ("embeddings", "head", "value_tables", "scalars", "no_decay", "decay", "muon")


def _unwrap(model: nn.Module) -> nn.Module:
    """The bare model under torch.compile (``_orig_mod``) or DDP (``module``), so that names match."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            inner = getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def group_of(model: nn.Module, name: str, param: Tensor, muon: bool) -> str:
    """The group of parameter `name` of `model` (see the module docstring)."""
    owner_name, _, leaf = name.rpartition(".")
    owner = model.get_submodule(owner_name)
    if is_value_table(name):
        return "value_tables"
    if isinstance(owner, nn.Embedding):
        return "embeddings"
    if owner is getattr(model, "head", None):
        return "head"
    if is_gain(name):
        return "scalars"
    if isinstance(owner, NORM_TYPES) or leaf == "bias" or param.ndim < 2:
        return "no_decay"
    if muon and param.ndim == 2 and name.startswith("blocks."):
        return "muon"
    return "decay"


def named_groups(model: nn.Module, muon: bool = False, nanochat: bool = False
                 ) -> dict[str, list[tuple[str, Tensor]]]:
    """Group name -> (parameter name, parameter) for every trainable parameter of `model`.

    Frozen parameters (``requires_grad=False``) are left out; buffers (the frozen W_init of
    Eq. 6) are not parameters. Shared (tied) parameters appear once. `nanochat`: the groups of
    nanochat's recipe (`nanochat_recipe.group_names`), Muon included.
    """
    model = _unwrap(model)
    names = nanochat_recipe.group_names() if nanochat else GROUPS
    groups: dict[str, list[tuple[str, Tensor]]] = {g: [] for g in names}
    for name, param in model.named_parameters():
        if param.requires_grad:
            group = group_of(model, name, param, muon or nanochat)
            groups[nanochat_recipe.nanochat_group(name, group) if nanochat else group].append((name, param))
    return groups


def _adamw_settings(cfg: OptimConfig) -> dict[str, tuple[float, float]]:
    """Group name -> (base lr, weight decay) of the AdamW groups."""
    wd = cfg.weight_decay
    return {
        "embeddings": (_or(cfg.lr_embeddings, cfg.lr), wd if cfg.decay_embeddings else 0.0),
        "head": (_or(cfg.lr_head, cfg.lr), wd),
        "value_tables": (_or(cfg.lr_value_tables, cfg.lr), wd if cfg.decay_value_tables else 0.0),
        "scalars": (_or(cfg.lr_scalars, cfg.lr), 0.0),
        "no_decay": (cfg.lr, 0.0),
        "decay": (cfg.lr, wd),
    }


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def build_optimizers(model: nn.Module, cfg: OptimConfig, tokens_per_step: int | None = None
                     ) -> list[torch.optim.Optimizer]:
    """[AdamW] or [Muon, AdamW] over every trainable parameter of `model`, one group per kind.

    Every group carries ``name`` (see `GROUPS`) and ``base_lr``; the trainer sets
    ``group["lr"] = group["base_lr"] * lr_factor(...)`` each step. Empty groups are left out.
    `tokens_per_step` (the global batch in tokens) scales nanochat's learning rates. Build the
    optimisers after any sharding that replaces parameters (FSDP2's ``fully_shard``).
    """
    nanochat = cfg.name == "nanochat"
    use_muon = cfg.name == "muon" or nanochat
    if use_muon and not hasattr(torch.optim, "Muon"):
        raise ConfigError(f"OptimConfig.name = {cfg.name!r} is not allowed with torch {torch.__version__}: "
                          "torch.optim.Muon needs torch >= 2.9. Use name='adamw' or upgrade torch.")
    named = named_groups(model, use_muon, nanochat)
    if nanochat:
        adamw_groups = nanochat_recipe.adamw_groups(named, _unwrap(model).cfg.d_model, tokens_per_step)
        muon_lr, muon_wd = nanochat_recipe.muon_settings(tokens_per_step, cfg.muon_weight_decay)
        muon_momentum = nanochat_recipe.MUON_MOMENTUM
    else:
        adamw_groups = [
            {"params": [p for _, p in named[g]], "name": g, "lr": lr, "base_lr": lr, "weight_decay": wd}
            for g, (lr, wd) in _adamw_settings(cfg).items() if named[g]
        ]
        muon_lr, muon_wd = cfg.muon_lr, _or(cfg.muon_weight_decay, cfg.weight_decay)
        muon_momentum = cfg.muon_momentum
    if not adamw_groups:
        raise ConfigError("the model has no trainable parameters for AdamW; nothing to optimise.")
    optimizers: list[torch.optim.Optimizer] = []
    if use_muon and named["muon"]:
        optimizers.append(torch.optim.Muon(
            [{"params": [p for _, p in named["muon"]], "name": "muon", "base_lr": muon_lr}],
            lr=muon_lr, momentum=muon_momentum, weight_decay=muon_wd, nesterov=True,
            adjust_lr_fn=cfg.muon_adjust_lr))
    # fused / foreach left to torch: it picks the fastest implementation for the device
    optimizers.append(torch.optim.AdamW(adamw_groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                                        weight_decay=cfg.weight_decay))
    return optimizers


def param_groups_summary(optimizers: list[torch.optim.Optimizer]) -> list[dict[str, Any]]:
    """One row per group: optimizer, name, n_params, n_elements, lr, base_lr, weight_decay."""
    return [
        {"optimizer": type(opt).__name__, "name": group.get("name", f"group{i}"),
         "n_params": len(group["params"]), "n_elements": sum(p.numel() for p in group["params"]),
         "lr": float(group["lr"]), "base_lr": float(group.get("base_lr", group["lr"])),
         "weight_decay": float(group["weight_decay"])}
        for opt in optimizers for i, group in enumerate(opt.param_groups)
    ]


def clip_grad_norm(parameters: nn.Module | Iterable[Tensor], max_norm: float | None) -> Tensor:
    """Scale all gradients so that their global 2-norm is at most `max_norm` (None or 0: leave them).

    Returns the total norm before clipping, sqrt(sum_p ||g_p||^2), as a tensor
    (``torch.nn.utils.clip_grad_norm_``). Parameters without a gradient are skipped.
    """
    if isinstance(parameters, nn.Module):
        parameters = parameters.parameters()
    params = [p for p in parameters if p.grad is not None]
    return torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else float("inf"))
