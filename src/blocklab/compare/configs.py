"""Which runs a comparison trains: one TrainConfig per entry and seed, over shared fields with
`blocklab compare`'s defaults, on one budget (equal steps by default).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from blocklab.catalog import grid_options
from blocklab.compare.grids import GRIDS, Entry
from blocklab.model.config import ModelConfig
from blocklab.model.presets import split_arch
from blocklab.model.value_paths import VALUE_PATHS
from blocklab.recipes import recipe_optim
from blocklab.training import TrainConfig
from blocklab.training.config import (
    BUDGET_FIELDS,
    BUDGETS,
    DEFAULT_SIZE,
    NOT_RESULTS,
    apply_overrides,
    flat,
)
from blocklab.util.errors import ConfigError

# The default budget: what the first (baseline) architecture spends in 150 steps. With the CPU sizes'
# recipe every block preset leaves the unigram plateau within 50 steps, so the main job spends its
# 10 minutes on 2 seeds of 150 steps (a seed spread and paired differences) rather than 1 of 400
# (at 200 steps one run took 56 s on 2 cores, about 11 minutes in all).
DEFAULT_STEPS = 150


def merge(base: dict, extra: dict) -> dict:
    """`extra` over `base`, merging the data, optim and model sections key by key."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out.get(key, {}), value) if isinstance(value, dict) and key in ("data", "optim",
                                                                                          "model") else value
    return out


def entry_model(entry: Entry, size: str, base_model: dict[str, Any] | None = None) -> dict[str, Any]:
    """The model overrides of `entry` at `size`, with the value path's options read at that depth
    (the catalog's `grid_options`: e.g. v1-value's "all layers" leaves out layer 0, the source of V_1)."""
    model = {**(base_model or {}), **entry.model}
    value_path = split_arch(entry.arch)[1]
    opts = model.get("value_path_options", {})
    if value_path is None or value_path not in VALUE_PATHS or not opts:
        return model
    n_layers = ModelConfig.from_preset(entry.arch, size, **{**model, "value_path_options": {}}).n_layers
    return {**model, "value_path_options": grid_options(value_path, opts, n_layers)}


# A finished or interrupted run is reused across the fields of training.config.NOT_RESULTS (display,
# logging, checkpoints, where it lives) and nothing else; the budget kinds are training.config.BUDGETS.
def run_configs(entries: list[Entry], seeds: int, out: Path, base: dict[str, Any]
                ) -> list[tuple[Entry, TrainConfig]]:
    """One TrainConfig per (entry, seed); everything but the architecture and seed comes from `base`.

    Optimiser fields that neither the entry nor `base` sets come from the main job's recipe for the
    run's architecture and size (`recipe_optim`). Checkpoints follow the eval cadence unless `base`
    sets ckpt_every, so an interrupted run loses at most one eval interval.
    """
    every = base.get("eval_every", TrainConfig.eval_every)
    if "ckpt_every" not in base and every:
        base = {**base, "ckpt_every": every}
    configs = []
    size = base.get("size") or DEFAULT_SIZE
    for entry in entries:
        model = entry_model(entry, size, base.get("model", {}))
        own = merge(merge({"optim": recipe_optim(entry.arch, size)}, base), entry.train)
        for seed in range(seeds):
            fields = merge(own, {
                "arch": entry.arch, "seed": seed, "model": model,
                "out_dir": str(out / "runs" / f"{slug(entry.label)}-seed{seed}")})
            configs.append((entry, TrainConfig.from_dict(fields)))
    return configs


def comparison_identity(entries: list[Entry], out: Path, base: dict[str, Any],
                        lr_sweep: list[float] | None = None, add: list[str | Path] | None = None
                        ) -> dict[str, Any]:
    """What makes a comparison the one a report in `out` was written for (results.json "comparison"):
    its architectures in order, the settings their runs share, a digest of every architecture's
    config (seed, and the fields of NOT_RESULTS aside: another number of seeds is the same
    comparison), the learning-rate sweep's rates and the runs added. As JSON reads it back."""
    ignore = NOT_RESULTS | {"seed"}
    per_label = {e.label: {k: v for k, v in flat(c.to_dict()).items() if k not in ignore}
                 for e, c in run_configs(entries, 1, out, base)}
    first = per_label[entries[0].label]
    shared = {k: v for k, v in first.items() if all(k in p and p[k] == v for p in per_label.values())}
    digest = hashlib.sha256(json.dumps(per_label, sort_keys=True, default=str).encode()).hexdigest()
    identity = {"architectures": [e.label for e in entries], "settings": shared, "config_sha256": digest,
                "lr_sweep": sorted(set(lr_sweep)) if lr_sweep else None,
                "added": [str(Path(a).resolve()) for a in add or []]}
    return json.loads(json.dumps(identity, default=str))


# The fields a comparison gives each run itself, with the option that sets them: an override of one is
# refused (it would be replaced without a word); a YAML config's are replaced (a training config names
# one architecture and one out_dir, as `blocklab compare crammed-bert --archs ...` reads it).
OWN_FIELDS = {"arch": "--archs (or --grid)", "seed": "--seeds", "out_dir": "--out"}


def refuse_own_fields(overrides: list[str] | dict | None, own: dict[str, str], command: str
                      ) -> list[str] | dict | None:
    """`overrides` unchanged, or a ConfigError for the first that sets a field of `own` ({field: what
    sets it instead}): one line naming the field and the option."""
    for key in (overrides.keys() if isinstance(overrides, dict) else
                (o.partition("=")[0].strip() for o in overrides or [])):
        if key in own:
            raise ConfigError(f"the override {key}=... is not allowed: {command} sets {key} of every run "
                              f"itself; use {own[key]}.")
    return overrides


def default_budget(kind: str, entries: list[Entry], base: dict[str, Any], steps: int = DEFAULT_STEPS
                   ) -> float | None:
    """The amount of budget `kind` that the first entry (the baseline) spends in `steps` steps:
    `steps` steps, steps x batch x seq_len tokens, or those tokens times its analytic FLOPs per
    token, so the default follows the size. None for wall-clock time, which depends on the machine."""
    if kind not in BUDGETS:
        raise ConfigError(f"budget {kind!r} is not allowed: choose one of {', '.join(BUDGETS)}.")
    if kind == "time":
        return None
    if kind == "steps":
        return steps
    from blocklab.accounting import flops_per_token
    from blocklab.data import prepare_data
    from blocklab.runtime import LanguageModel

    cfg = run_configs(entries[:1], 1, Path("unused"), {**base, "max_steps": steps})[0][1]
    tokens = steps * cfg.batch_size * cfg.seq_len
    if kind == "tokens":
        return tokens
    vocab = prepare_data(cfg.data, progress=cfg.progress).tokenizer.vocab_size  # the runs reuse it (cached)
    with torch.device("meta"):
        model = LanguageModel(cfg.model_config(vocab))
    return float(tokens * flops_per_token(model))


def resolve_compare(archs: list[str] | None = None, grid: str | None = None,
                    base: dict[str, Any] | None = None, lr: float | None = None,
                    budget: dict[str, float | None] | None = None, overrides: list[str] | dict | None = None
                    ) -> tuple[list[Entry], dict[str, Any]]:
    """The entries and the shared TrainConfig fields of a comparison, with `blocklab compare`'s defaults.

    A `grid` (a key of GRIDS) gives the entries, the paper's setup over `base`, its budget kind and its
    size (when `base` names none); otherwise the entries are `archs` and the kind is steps. The peak
    learning rate is `lr` for every run, else each architecture's from the main job's recipe
    (`recipe_optim`, applied by `run_configs` with the recipe's other optimiser settings); `overrides`
    (``key=value``, an optim.lr=... too) come last. `budget` maps at most one kind of BUDGETS to its
    amount (None: not given); without one, nor a max_* override, the runs get the kind's
    `default_budget`.
    """
    base = dict(base or {})
    kind = "steps"
    if grid is not None:
        if grid not in GRIDS:
            raise ConfigError(f"--grid {grid!r} is not allowed: choose one of {', '.join(GRIDS)}.")
        entries, base, kind = list(GRIDS[grid].entries), merge(base, GRIDS[grid].train), GRIDS[grid].budget
        base.setdefault("size", GRIDS[grid].size)
    else:
        entries = [Entry.parse(a) for a in archs or []]
    if lr is not None:
        apply_overrides(base, {"optim.lr": lr})
    apply_overrides(base, refuse_own_fields(overrides, OWN_FIELDS, "compare"))
    if base.get("init_from") is not None and len(entries) != 1:
        raise ConfigError(f"init_from = {base['init_from']!r} with {len(entries)} architectures is not "
                          "allowed: every run would start from (and be) the same source model, under "
                          "different names. Compare one architecture with init_from (--archs naming the "
                          "source's), or leave init_from out.")
    chosen = {k: v for k, v in (budget or {}).items() if v is not None}
    unknown = sorted(chosen.keys() - BUDGETS.keys())
    if unknown:
        raise ConfigError(f"budget {unknown[0]!r} is not allowed: choose one of {', '.join(BUDGETS)}.")
    if len(chosen) > 1:
        raise ConfigError(f"give one budget, got {', '.join('--' + k for k in BUDGETS if k in chosen)}: the "
                          "runs are equal in exactly one of steps, tokens, FLOPs or wall-clock time.")
    if chosen:
        [(kind, value)] = chosen.items()
        base[BUDGETS[kind]] = value
    elif not any(base.get(f) is not None for f in BUDGET_FIELDS):  # nor a max_*=... override
        # the grid's own budget kind (steps without a grid), as much as the baseline spends in 150 steps
        value = default_budget(kind, entries, base)
        if value is None:
            raise ConfigError(f"--grid {grid} compares at equal wall-clock time, as the paper does, and no "
                              "default fits every machine: give the seconds per run with --time SECONDS, or "
                              f"--steps N for equal steps ({DEFAULT_STEPS} by default).")
        base[BUDGETS[kind]] = value
    return entries, base


def slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-+." else "_" for c in label)
