"""`blocklab compare`: train architectures side by side on one budget, then write a report.

Every run shares the data, the tokenizer, the batch order (batches are a pure function of seed and
step) and the budget; only the architecture differs. Equal steps (hence equal tokens) by default;
equal FLOPs or equal wall-clock on request, so that a cheaper block gets more steps. Finished runs
are reused and an interrupted one resumes from its checkpoint.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import yaml

from blocklab.config import ConfigError, ModelConfig
from blocklab.presets import split_arch
from blocklab.training import TrainConfig, train
from blocklab.training.checkpoint import latest_checkpoint
from blocklab.training.config import changed_fields

BUDGETS = {"steps": "max_steps", "tokens": "max_tokens", "flops": "max_flops", "time": "max_time"}
DEFAULT_STEPS = 400  # the default budget: what the first (baseline) architecture spends in 400 steps
# The main job's peak learning rate at size "tiny" (blocklab compare without --lr). Measured on the
# embedded corpus, batches of 16 x 128 tokens: at 1e-3 (the paper's rate at 18 layers and batch 128)
# every architecture but BoV still sat on the unigram plateau after 300 steps (val loss 6.59); at
# 1e-2 pre-ln left it but SAS and SAS-P had not after 400; at 3e-3 all of them had by 400 steps.
# Other sizes keep 1e-3.
TINY_LR = 3e-3

# TrainConfig fields that change how a run is watched or stored, not what it computes, so a finished
# or interrupted run is reused across them. Training is a pure function of the config minus these:
# progress bars and TensorBoard only display; log_every only decides which train rows are written
# (the loss and weights at every step are the same); ckpt_every and keep_checkpoints only decide
# which states are saved (a resumed run equals an uninterrupted one); data.cache_dir is where the same
# shards are cached; out_dir is where the run lives (a compare directory may be moved) and overwrite
# whether a new run may replace one there. Everything else counts, eval_every and eval_batches
# included: they decide which validation losses are recorded.
NOT_RESULTS = frozenset({"progress", "tensorboard", "log_every", "ckpt_every", "keep_checkpoints",
                         "data.cache_dir", "out_dir", "overwrite"})


@dataclass(frozen=True)
class Entry:
    """One architecture in a comparison: a label for the report, a preset name, model overrides and
    TrainConfig overrides of its own (a learning rate chosen by a sweep)."""

    label: str
    arch: str
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Entry:
        return cls(text, text)


@dataclass(frozen=True)
class Grid:
    description: str
    budget: str  # the paper's budget kind, a key of BUDGETS: the default when the user gives none
    entries: tuple[Entry, ...]
    train: dict[str, Any] = field(default_factory=dict)  # TrainConfig overrides of the paper's setup


def _bov_row(label: str, vp: str, layers: str, learnable: bool) -> Entry:
    return Entry(label, f"pre-ln+{vp}", {"value_path_options": {"layers": layers, "learnable": learnable}})


def _resformer_row(label: str, learnable: bool) -> Entry:
    return Entry(label, "pre-ln+resformer", {"value_path_options": {"layers": "last-third",
                                                                     "learnable": learnable}})


GRIDS: dict[str, Grid] = {
    "simplifying-fig5": Grid(
        "Simplifying Transformer Blocks Fig. 5: block variants on code at equal wall-clock time",
        "time",
        tuple(Entry.parse(a) for a in ("pre-ln", "parallel", "v-skipinit", "sas", "sas-p", "sas-p-nonorm")),
        {"optim": {"schedule": "linear", "warmup_fraction": 0.05}}),
    "simplifying-table1": Grid(
        "Simplifying Transformer Blocks Table 1: masked-LM encoders (crammed-bert size), pretraining loss "
        "at equal wall-clock time (the paper: 24 hours on one GPU)",
        "time",
        tuple(Entry.parse(a) for a in ("pre-ln", "parallel", "v-skipinit", "sas", "sas-p")),
        {"data": {"objective": "mlm", "mask_prob": 0.25},
         "optim": {"schedule": "one-cycle", "betas": [0.9, 0.98], "eps": 1e-12, "grad_clip": 0.5}}),
    "resformer-fig7": Grid(
        "Value Residual Learning Fig. 7 (right): ResFormer against DenseFormer and NeuTRENO (lambda 0.4) "
        "at equal steps (the paper: 10,000 steps, warmup 1,200, cosine to 10%). Not expressible: the "
        "paper's ResFormer + NeuTRENO (lambda 0.2), as a model has one value path and NeuTRENO has no "
        "V_1 mix",
        "steps",
        tuple(Entry.parse(a) for a in ("pre-ln", "resformer", "denseformer", "neutreno")),
        {"optim": {"schedule": "cosine", "final_lr_fraction": 0.1, "warmup_fraction": 0.12}}),
    "bov-table1": Grid(
        "Bank of Values Table 1: substitutive and additive value sources, target layers and "
        "coefficients (Muon, equal FLOPs); labels start with the paper's row. Not expressible: row 2 "
        "(a learnable gamma on the layer's own V alone: ResFormer's lambda_2 is learnable only with "
        "lambda_1) and rows 12-13 (V + x0 W_V: x0-value substitutes V, it does not add to it)",
        "flops",
        (Entry("1 V", "pre-ln"),
         _bov_row("3 V1 all 1", "v1-value", "all", False),
         _bov_row("4 V1 every-2 gamma", "v1-value", "every-2", True),
         _bov_row("5 V1 last-third 1", "v1-value", "last-third", False),
         _bov_row("6 V1 last-third gamma", "v1-value", "last-third", True),
         _bov_row("7 x0W every-2 gamma", "x0-value", "every-2", True),
         _bov_row("8 x0W last-third 1", "x0-value", "last-third", False),
         _bov_row("9 x0W last-third gamma", "x0-value", "last-third", True),
         _resformer_row("10 V+V1 last-third 0.5", False),
         _resformer_row("11 V+V1 last-third gamma", True),
         Entry("BoV", "pre-ln+bov")),
        {"optim": {"name": "muon", "schedule": "wsd"}}),
}


def merge(base: dict, extra: dict) -> dict:
    """`extra` over `base`, merging the data, optim and model sections key by key."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out.get(key, {}), value) if isinstance(value, dict) and key in ("data", "optim",
                                                                                          "model") else value
    return out


def entry_model(entry: Entry, size: str, base_model: dict[str, Any] | None = None) -> dict[str, Any]:
    """The model overrides of `entry` at `size`.

    v1-value cannot target layer 0, the source of V_1; there V_1 is the layer's own value, so Bank of
    Values Table 1's "all 12 layers" (row 3), or every-2 on an odd depth, means the same targets
    without layer 0.
    """
    model = {**(base_model or {}), **entry.model}
    opts = model.get("value_path_options", {})
    if split_arch(entry.arch)[1] != "v1-value" or "layers" not in opts:
        return model
    from blocklab.model.value_paths import target_layers

    n_layers = ModelConfig.from_preset(entry.arch, size, **{**model, "value_path_options": {}}).n_layers
    targets = target_layers(opts["layers"], n_layers)
    if 0 in targets:
        model["value_path_options"] = {**opts, "layers": sorted(targets - {0})}
    return model


def run_configs(entries: list[Entry], seeds: int, out: Path, base: dict[str, Any]
                ) -> list[tuple[Entry, TrainConfig]]:
    """One TrainConfig per (entry, seed); everything but the architecture and seed comes from `base`.

    Checkpoints follow the eval cadence unless `base` sets ckpt_every, so an interrupted run loses
    at most one eval interval.
    """
    every = base.get("eval_every", TrainConfig.eval_every)
    if "ckpt_every" not in base and every:
        base = {**base, "ckpt_every": every}
    configs = []
    for entry in entries:
        model = entry_model(entry, base.get("size", TrainConfig.size), base.get("model", {}))
        for seed in range(seeds):
            fields = merge(merge(base, entry.train), {
                "arch": entry.arch, "seed": seed, "model": model,
                "out_dir": str(out / "runs" / f"{_slug(entry.label)}-seed{seed}")})
            configs.append((entry, TrainConfig.from_dict(fields)))
    return configs


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
    from blocklab.model import Transformer

    cfg = run_configs(entries[:1], 1, Path("unused"), {**base, "max_steps": steps})[0][1]
    tokens = steps * cfg.batch_size * cfg.seq_len
    if kind == "tokens":
        return tokens
    vocab = prepare_data(cfg.data).tokenizer.vocab_size  # cached: the runs prepare the same data
    with torch.device("meta"):
        model = Transformer(cfg.model_config(vocab))
    return float(tokens * flops_per_token(model))


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-+." else "_" for c in label)


def _check_saved_config(cfg: TrainConfig, what: str) -> None:
    """Refuse to reuse or resume a run whose saved config differs in a field that changes results."""
    run = Path(cfg.out_dir)
    try:  # through TrainConfig, so that a field added since the run was saved takes its default
        saved = TrainConfig.from_dict(yaml.safe_load((run / "config.yaml").read_text()))
    except (ConfigError, OSError, TypeError, yaml.YAMLError) as err:
        raise ConfigError(f"{run} holds {what} run whose config.yaml cannot be read ({err}); use another "
                          "--out, or --fresh to retrain it.") from None
    changes = changed_fields(saved, cfg, NOT_RESULTS)
    if changes:
        raise ConfigError(f"{run} holds {what} run with a different config ({changes}); use another --out, "
                          "or --fresh to retrain it.")


def train_all(configs: list[tuple[Entry, TrainConfig]], log=print) -> None:
    """Train every config in order: a finished run is reused and an unfinished one resumed, each after
    checking that its saved config matches (a run store shared by compare and reproduce)."""
    for i, (_, cfg) in enumerate(configs, 1):
        run = Path(cfg.out_dir)
        finished = (run / "summary.json").is_file()
        resume = not finished and latest_checkpoint(run) is not None
        if finished or resume:
            _check_saved_config(cfg, "a finished" if finished else "an unfinished")
        elif run.exists():  # stopped before its first checkpoint: nothing to resume, so start afresh
            shutil.rmtree(run)
        name = run.name
        if finished:
            log(f"[{i}/{len(configs)}] {name}: finished earlier, reused")
            continue
        log(f"[{i}/{len(configs)}] {name}: {'resuming' if resume else 'training'}")
        train(cfg, resume=resume)


def sweep_learning_rates(entries: list[Entry], rates: list[float], out: Path, base: dict[str, Any],
                         steps: int, log=print) -> dict[str, dict[float, float]]:
    """Train seed 0 of every entry at every rate for `steps` steps (in `out/runs/<label>-lr<rate>-seed0`,
    reused like any run) and return each entry's final validation loss per rate."""
    short = {k: v for k, v in base.items() if k not in BUDGETS.values()} | {"max_steps": steps}
    tried = [(e, rate, Entry(f"{e.label}-lr{rate:g}", e.arch, e.model,
                             merge(e.train, {"optim": {"lr": rate}})))
             for e in entries for rate in rates]
    configs = run_configs([t for _, _, t in tried], 1, out, short)
    train_all(configs, log)
    losses: dict[str, dict[float, float]] = {e.label: {} for e in entries}
    for (entry, rate, _), (_, cfg) in zip(tried, configs, strict=True):
        losses[entry.label][rate] = json.loads((Path(cfg.out_dir) / "summary.json").read_text())["val_loss"]
    return losses


def with_best_rates(entries: list[Entry], sweep: dict[str, dict[float, float]]) -> list[Entry]:
    """Each entry with the learning rate of its lowest held-out loss in `sweep`."""
    return [replace(e, train=merge(e.train, {"optim": {"lr": min(sweep[e.label], key=sweep[e.label].get)}}))
            for e in entries]


def compare(entries: list[Entry | str], out: str | Path, seeds: int = 1,
            base: dict[str, Any] | None = None, fresh: bool = False, log=print,
            lr_sweep: list[float] | None = None, sweep_steps: int | None = None) -> Path:
    """Train every entry (unless already finished) and write `out/report.md` and `out/report.html`.

    With `lr_sweep`, each entry first trains seed 0 at every rate for `sweep_steps` steps (default a
    quarter of max_steps, else 100); the rate with the lowest held-out loss is then used for all seeds.
    """
    from blocklab.report import write_report

    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ConfigError(f"seeds = {seeds!r} is not allowed: give a positive number of seeds per "
                          "architecture.")
    entries = [Entry.parse(e) if isinstance(e, str) else e for e in entries]
    if not entries:
        raise ConfigError("compare needs at least one architecture (see `blocklab presets`).")
    labels = [e.label for e in entries]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"compare got the same architecture twice: {labels}")
    out = Path(out)
    if fresh and out.exists():
        shutil.rmtree(out / "runs", ignore_errors=True)
    base = base or {}
    sweep = None
    if lr_sweep:
        if any(not isinstance(r, (int, float)) or not r > 0 for r in lr_sweep):
            raise ConfigError(f"--lr-sweep rates must be positive numbers; got {lr_sweep}")
        steps = sweep_steps or (max(1, base["max_steps"] // 4) if base.get("max_steps") else 100)
        log(f"learning-rate sweep: {len(entries)} x {len(lr_sweep)} runs of {steps} steps, seed 0")
        sweep = sweep_learning_rates(entries, sorted(set(lr_sweep)), out / "lr-sweep", base, steps, log)
        (out / "lr_sweep.json").write_text(json.dumps({"steps": steps, "val_loss": sweep}, indent=2))
        entries = with_best_rates(entries, sweep)
    configs = run_configs(entries, seeds, out, base)
    train_all(configs, log)
    return write_report(configs, out, sweep=sweep)
