"""`blocklab compare`: train architectures side by side on one budget, then write a report.

Every run shares the data, the tokenizer, the batch order (batches are a pure function of seed and
step) and the budget; only the architecture differs. Equal steps (hence equal tokens) by default;
equal FLOPs or equal wall-clock on request, so that a cheaper block gets more steps. Finished runs
are reused and an interrupted one resumes from its checkpoint. After training, every architecture's
memory is measured and its training step timed again in interleaved rounds (`measure_architectures`),
so that the report's speed figures do not depend on how the machine's load changed from run to run
(docs/report.md).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from blocklab import locks
from blocklab.config import ModelConfig
from blocklab.errors import ConfigError
from blocklab.launch import Launch, RunsFailed, train_runs
from blocklab.launch.store import read_summary
from blocklab.model.value_paths import VALUE_PATHS
from blocklab.presets import split_arch
from blocklab.recipes import recipe_optim
from blocklab.training import TrainConfig
from blocklab.training.config import BUDGET_FIELDS, BUDGETS, apply_overrides

# The default budget: what the first (baseline) architecture spends in 150 steps. With the CPU sizes'
# recipe every block preset leaves the unigram plateau within 50 steps, so the main job spends its
# 10 minutes on 2 seeds of 150 steps (a seed spread and paired differences) rather than 1 of 400
# (at 200 steps one run took 56 s on 2 cores, about 11 minutes in all).
DEFAULT_STEPS = 150
# The throughput table of the report: after all training, each architecture's training step is timed
# again in TIMING_ROUNDS interleaved rounds (every architecture in turn within a round) of TIMING_STEPS
# steps each, after one untimed warm-up step per turn. A change in the machine's load then hits every
# architecture alike, which the per-run figures measured one run after another cannot promise. At
# size tiny this costs a few seconds per architecture.
TIMING_ROUNDS = 5
TIMING_STEPS = 3
# A finished or interrupted run is reused across the fields of training.config.NOT_RESULTS (display,
# logging, checkpoints, where it lives) and nothing else; the budget kinds are training.config.BUDGETS.


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
    size: str = "tiny"  # the size when the user gives none: the paper's model at a CPU width


def _bov_row(label: str, vp: str, layers: str, learnable: bool, **options: Any) -> Entry:
    return Entry(label, f"pre-ln+{vp}", {"value_path_options": {"layers": layers, "learnable": learnable,
                                                                 **options}})


# The Bank of Values code's x0 W_V rows read x0 after the embedding norm and the smear (the trunk's
# stream), not the token's own embedding: they differ once the smear has trained.
_STREAM = {"x0": "stream"}


def _resformer_row(label: str, learnable: bool) -> Entry:
    """V + V_1 in the last third: fixed 1/2 and 1/2, or learned from the baseline (lambda_2 = 1 on
    V, lambda_1 = 0 on V_1), as Bank of Values' learned additive rows start (alpha 1, beta 0)."""
    start = {"lambda1": 0.0, "lambda2": 1.0} if learnable else {}
    return Entry(label, "pre-ln+resformer", {"value_path_options": {"layers": "last-third",
                                                                     "learnable": learnable, **start}})


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
        "Value Residual Learning Fig. 7 (right): ResFormer against DenseFormer, NeuTRENO (lambda 0.4) "
        "and ResFormer + NeuTRENO (lambda 0.2, as the paper's code) at equal steps (the paper: 10,000 "
        "steps, warmup 1,200, cosine to 10%)",
        "steps",
        (*(Entry.parse(a) for a in ("pre-ln", "resformer", "denseformer", "neutreno")),
         Entry("resformer+neutreno", "pre-ln+resformer", {"value_path_options": {"neutreno": 0.2}})),
        {"optim": {"schedule": "cosine", "final_lr_fraction": 0.1, "warmup_fraction": 0.12}}),
    "bov-table1": Grid(
        "Bank of Values Table 1 on nanochat's trunk (size nanochat-tiny by default; nanochat-d12 is the "
        "paper's) and nanochat's optimiser recipe: substitutive and additive value sources, target "
        "layers and coefficients (equal FLOPs); labels start with the paper's row",
        "flops",
        (Entry("1 V", "pre-ln"),
         _bov_row("2 V last-third gamma", "v-scale", "last-third", True),
         _bov_row("3 V1 all 1", "v1-value", "all", False),
         _bov_row("4 V1 every-2 gamma", "v1-value", "every-2", True),
         _bov_row("5 V1 last-third 1", "v1-value", "last-third", False),
         _bov_row("6 V1 last-third gamma", "v1-value", "last-third", True),
         _bov_row("7 x0W every-2 gamma", "x0-value", "every-2", True, **_STREAM),
         _bov_row("8 x0W last-third 1", "x0-value", "last-third", False, **_STREAM),
         _bov_row("9 x0W last-third gamma", "x0-value", "last-third", True, **_STREAM),
         _resformer_row("10 V+V1 last-third 0.5", False),
         _resformer_row("11 V+V1 last-third gamma", True),
         Entry("12 V+x0W last-third 0.5", "pre-ln+x0-value",
               {"value_path_options": {"layers": "last-third", "learnable": False, "add": True, **_STREAM}}),
         Entry("13 V+x0W last-third gamma", "pre-ln+x0-value",
               {"value_path_options": {"layers": "last-third", "learnable": True, "add": True, **_STREAM}}),
         Entry("BoV", "pre-ln+bov")),
        {"optim": {"name": "nanochat", "schedule": "wsd"}}, size="nanochat-tiny"),
}


def merge(base: dict, extra: dict) -> dict:
    """`extra` over `base`, merging the data, optim and model sections key by key."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out.get(key, {}), value) if isinstance(value, dict) and key in ("data", "optim",
                                                                                          "model") else value
    return out


def entry_model(entry: Entry, size: str, base_model: dict[str, Any] | None = None) -> dict[str, Any]:
    """The model overrides of `entry` at `size`, with the value path's options read at that depth
    (`ValuePath.grid_options`: e.g. v1-value's "all layers" leaves out layer 0, the source of V_1)."""
    model = {**(base_model or {}), **entry.model}
    value_path = split_arch(entry.arch)[1]
    opts = model.get("value_path_options", {})
    if value_path is None or value_path not in VALUE_PATHS or not opts:
        return model
    n_layers = ModelConfig.from_preset(entry.arch, size, **{**model, "value_path_options": {}}).n_layers
    return {**model, "value_path_options": VALUE_PATHS[value_path].grid_options(opts, n_layers)}


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
    size = base.get("size", TrainConfig.size)
    for entry in entries:
        model = entry_model(entry, size, base.get("model", {}))
        own = merge(merge({"optim": recipe_optim(entry.arch, size)}, base), entry.train)
        for seed in range(seeds):
            fields = merge(own, {
                "arch": entry.arch, "seed": seed, "model": model,
                "out_dir": str(out / "runs" / f"{slug(entry.label)}-seed{seed}")})
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
    vocab = prepare_data(cfg.data, progress=cfg.progress).tokenizer.vocab_size  # the runs reuse it (cached)
    with torch.device("meta"):
        model = Transformer(cfg.model_config(vocab))
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
    apply_overrides(base, overrides)
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


def sweep_learning_rates(entries: list[Entry], rates: list[float], out: Path, base: dict[str, Any],
                         steps: int, log=print, launcher=None
                         ) -> tuple[dict[str, dict[float, float]], Launch]:
    """Train seed 0 of every entry at every rate for `steps` steps (in `out/runs/<label>-lr<rate>-seed0`,
    reused like any run, with `launcher`): each entry's final validation loss per rate (a failed run's
    rate left out), and the launch."""
    short = {k: v for k, v in base.items() if k not in BUDGET_FIELDS} | {"max_steps": steps}
    tried = [(e, rate, Entry(f"{e.label}-lr{rate:g}", e.arch, e.model,
                             merge(e.train, {"optim": {"lr": rate}})))
             for e in entries for rate in rates]
    launch = train_runs(run_configs([t for _, _, t in tried], 1, out, short), launcher, log)
    losses: dict[str, dict[float, float]] = {e.label: {} for e in entries}
    for (entry, rate, _), outcome in zip(tried, launch.outcomes, strict=True):
        if outcome.status != "failed":
            losses[entry.label][rate] = read_summary(outcome.cfg)["val_loss"]
    return losses, launch


def with_best_rates(entries: list[Entry], sweep: dict[str, dict[float, float]]) -> list[Entry]:
    """Each entry with the learning rate of its lowest held-out loss in `sweep`."""
    empty = [label for label, losses in sweep.items() if not losses]
    if empty:
        raise ConfigError(f"every learning-rate sweep run of {', '.join(empty)} failed, so no rate can be "
                          "chosen: see the runs' logs beside them in lr-sweep/runs/.")
    return [replace(e, train=merge(e.train, {"optim": {"lr": min(sweep[e.label], key=sweep[e.label].get)}}))
            for e in entries]


class StepProbe:
    """One architecture's training step outside the trainer, for the measurements after training.

    The run's resolved model (its model_config.json) is built afresh with the run's seed, with the
    run's optimisers, precision, gradient accumulation and clipping, on random token batches of the
    run's shape (batch_size x seq_len): the cost of a step depends on the shapes, not on the weights
    nor on which tokens are fed. The step is the trainer's own (`training.step.train_step`): forward and
    backward per micro-batch, the loss read back, the gradient norm clipped, every optimiser stepped.
    """

    def __init__(self, cfg: TrainConfig, device: torch.device):
        from blocklab.model import Transformer
        from blocklab.training.optim import build_optimizers
        from blocklab.training.step import autocast_for

        run = Path(cfg.out_dir)
        self.cfg, self.device = cfg, device
        torch.manual_seed(cfg.seed)
        self.model = Transformer(ModelConfig.from_dict(json.loads((run / "model_config.json").read_text())))
        self.model.to(device).train()
        if cfg.compile:
            self.model.compile_blocks()
        self.optimizers = build_optimizers(self.model, cfg.optim, cfg.batch_size * cfg.seq_len)
        self.autocast = autocast_for(cfg.precision, device)
        rows = cfg.batch_size // cfg.grad_accum
        generator = torch.Generator().manual_seed(cfg.seed)
        ids = torch.randint(self.model.cfg.vocab_size, (rows, cfg.seq_len), generator=generator)
        labels = ids.clone()
        if cfg.data.objective == "mlm":  # only the masked positions are scored, as in the runs
            masked = torch.rand(ids.shape, generator=generator) < cfg.data.mask_prob
            labels[~masked] = -100
        self.batch = {"input_ids": ids.to(device), "labels": labels.to(device)}
        self.tokens = cfg.batch_size * cfg.seq_len

    def step(self, tracker=None) -> None:
        """One training step (`step.train_step`, the trainer's); `tracker` (a memory.SavedTensorTracker)
        watches the first micro-batch."""
        from blocklab.training.step import train_step

        train_step(self.model, [self.batch] * self.cfg.grad_accum, self.optimizers, accum=self.cfg.grad_accum,
                   autocast=self.autocast, grad_clip=self.cfg.optim.grad_clip, watch=tracker)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()

    def timed_step(self) -> float:
        """Seconds of one training step (the device's queue drained before and after)."""
        import time

        self._sync()
        start = time.perf_counter()
        self.step()
        self._sync()
        return time.perf_counter() - start

    def memory(self) -> dict[str, Any]:
        """The memory this model's training takes, apart from the process: parameters, gradients and
        optimizer state (from the tensors), the activations one step keeps for its backward pass (the
        tensors autograd saves, counted as they are saved: `memory.SavedTensorTracker`) and, on CUDA,
        the allocator's peak during a step above what stays resident between steps. Takes one step, two
        on CUDA. With compiled blocks the activations are not counted (None): the hooks that count them
        do not see inside a compiled graph."""
        from blocklab.training import memory

        tracker = None if self.cfg.compile else memory.SavedTensorTracker(self.model)
        self.step(tracker)
        out: dict[str, Any] = {
            "parameter_bytes": memory.parameter_bytes(self.model),
            "gradient_bytes": memory.gradient_bytes(self.model),
            "optimizer_state_bytes": memory.optimizer_state_bytes(self.optimizers),
            "activation_bytes": None if tracker is None else tracker.bytes,
            "activation_micro_batch": self.cfg.batch_size // self.cfg.grad_accum,
            "cuda_step_peak_bytes": None,
        }
        if self.device.type == "cuda":
            self._sync()
            resident = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.step()
            self._sync()
            out["cuda_step_peak_bytes"] = torch.cuda.max_memory_allocated(self.device) - resident
        out["model_total_bytes"] = sum(out[k] or 0 for k in ("parameter_bytes", "gradient_bytes",
                                                             "optimizer_state_bytes", "activation_bytes"))
        return out


def _probe_device(cfg: TrainConfig) -> torch.device:
    """The device the run trained on (its summary.json), or the CPU when that one is gone."""
    try:
        name = json.loads((Path(cfg.out_dir) / "summary.json").read_text())["device"]
    except (OSError, ValueError, KeyError):
        name = "cpu"
    device = torch.device(name)
    return device if device.type != "cuda" or torch.cuda.is_available() else torch.device("cpu")


def measure_architectures(configs: list[tuple[Entry, TrainConfig]], rounds: int = TIMING_ROUNDS,
                          steps: int = TIMING_STEPS) -> dict[str, Any]:
    """After training: each entry's memory (`StepProbe.memory`) and the times of its training step,
    measured again in `rounds` interleaved rounds of `steps` timed steps (one untimed warm-up step
    first), every entry in turn within a round, the order rotated from round to round, each turn on a
    freshly built model so that only one is held at a time (with compiled blocks, one model per entry is
    kept across rounds instead, so that each compiles once). Seed 0's config stands for the entry.

    Returns {"rounds", "steps", "order", "architectures": {label: {"memory": {...}, "step_s": [...]}}}.
    The probes run with the runs' `threads`, as the trainer does."""
    firsts: dict[str, tuple[Entry, TrainConfig]] = {}
    for entry, cfg in configs:  # each entry's first config (seed 0), in the entries' order
        firsts.setdefault(entry.label, (entry, cfg))
    order = list(firsts.values())
    threads_before = torch.get_num_threads()
    out: dict[str, Any] = {"rounds": rounds, "steps": steps, "order": "rotated each round",
                           "architectures": {}}
    with torch.random.fork_rng(devices=[]):  # the probes seed torch; the caller's random state stays
        try:
            for entry, cfg in order:  # memory: one or two untimed steps each
                if cfg.threads is not None:
                    torch.set_num_threads(cfg.threads)
                probe = StepProbe(cfg, _probe_device(cfg))
                out["architectures"][entry.label] = {"memory": probe.memory(), "step_s": []}
                del probe
            kept: dict[str, StepProbe] = {}
            for r in range(rounds):
                shift = r % len(order)
                for entry, cfg in order[shift:] + order[:shift]:
                    if cfg.threads is not None:
                        torch.set_num_threads(cfg.threads)
                    probe = kept.get(entry.label) or StepProbe(cfg, _probe_device(cfg))
                    if cfg.compile:
                        kept[entry.label] = probe
                    probe.step()  # warm-up: first-touch allocations, the allocator's caches, a compile
                    out["architectures"][entry.label]["step_s"] += [probe.timed_step() for _ in range(steps)]
                    del probe
            kept.clear()
        finally:
            torch.set_num_threads(threads_before)
    return out


def compare(entries: list[Entry | str], out: str | Path, seeds: int = 1,
            base: dict[str, Any] | None = None, fresh: bool = False, log=print,
            lr_sweep: list[float] | None = None, sweep_steps: int | None = None,
            command: str | None = None, timing_rounds: int = TIMING_ROUNDS,
            timing_steps: int = TIMING_STEPS, launcher=None, add: list[str | Path] | None = None) -> Path:
    """Train every entry (unless already finished) and write `out/report.md` and `out/report.html`.

    With `lr_sweep`, each entry first trains seed 0 at every rate for `sweep_steps` steps (default a
    quarter of max_steps, else 100); the rate with the lowest held-out loss is then used for all seeds.
    After training, each architecture's step is timed again in `timing_rounds` interleaved rounds of
    `timing_steps` steps (`measure_architectures`; 0 rounds: the report shows the in-training times
    alone) and its memory is measured. `command` is the command line the report records (None:
    "python API"). `launcher` trains the runs (`blocklab.launch`; default one at a time here). `add`
    names finished runs trained elsewhere to bring into the report (`added_runs`, checked against the
    comparison's runs once those have trained; a missing one is refused before anything trains).

    Raises RunsPending when a launcher that does not wait left runs queued (the same call later collects
    them), and RunsFailed, after writing the report of the runs that finished, when some failed.
    """
    import time

    from blocklab.report import utc_now, write_report

    started, start = utc_now(), time.perf_counter()
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ConfigError(f"seeds = {seeds!r} is not allowed: give a positive number of seeds per "
                          "architecture.")
    for name, value, low in (("timing_rounds", timing_rounds, 0), ("timing_steps", timing_steps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{name} = {value!r} is not allowed: give an integer >= {low}.")
    entries = [Entry.parse(e) if isinstance(e, str) else e for e in entries]
    if not entries:
        raise ConfigError("compare needs at least one architecture (see `blocklab presets`).")
    labels = [e.label for e in entries]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"compare got the same architecture twice: {labels}")
    for path in add or []:
        _require_finished(Path(path))
    out = Path(out)
    with locks.hold(out):  # one comparison at a time in a folder: no run or report of another is touched
        if fresh and (out / "runs").is_dir():
            for run in sorted(p for p in (out / "runs").iterdir() if p.is_dir()):
                with locks.hold(run):  # never a run another process is training (FolderInUse names it)
                    shutil.rmtree(run)
        base = base or {}
        sweep = sweep_info = None
        failed = []
        if lr_sweep:
            if any(not isinstance(r, (int, float)) or not r > 0 for r in lr_sweep):
                raise ConfigError(f"--lr-sweep rates must be positive numbers; got {lr_sweep}")
            steps = sweep_steps or (max(1, base["max_steps"] // 4) if base.get("max_steps") else 100)
            log(f"learning-rate sweep: {len(entries)} x {len(lr_sweep)} runs of {steps} steps, seed 0")
            sweep, swept = sweep_learning_rates(entries, sorted(set(lr_sweep)), out / "lr-sweep", base, steps,
                                                log, launcher)
            swept.raise_if_pending("the learning-rate sweep", "write the report")
            failed += swept.failed
            (out / "lr_sweep.json").write_text(json.dumps({"steps": steps, "val_loss": sweep}, indent=2))
            sweep_info = {"rates": sorted(set(lr_sweep)), "steps": steps}
            entries = with_best_rates(entries, sweep)
        configs = run_configs(entries, seeds, out, base)
        launch = train_runs(configs, launcher, log)
        launch.raise_if_pending("the comparison", "write the report")
        failed += launch.failed
        finished = [pair for pair, o in zip(launch.configs, launch.outcomes, strict=True)
                    if o.status != "failed"]
        if not finished:
            raise RunsFailed(failed)
        extra = added_runs(add, finished) if add else []
        finished += extra
        trained_at = time.perf_counter()
        if any(cfg.progress for _, cfg in configs):  # a data message: on stderr, and not with --quiet
            from blocklab.training.progress import say

            say(f"measuring memory and timing every architecture's training step again ({timing_rounds} "
                f"interleaved rounds x {timing_steps} steps) for the report")
        measured = measure_architectures(finished, timing_rounds, timing_steps)
        measured["seconds"] = time.perf_counter() - trained_at
        run_info = {"command": command or "python API", "started_utc": started, "started_perf": start,
                    "runs_reused": sum(o.status == "reused" for o in launch.outcomes), "lr_sweep": sweep_info,
                    "launch": launch.describe(),
                    "added": [{"run": c.out_dir, "label": e.label} for e, c in extra],
                    "failed": [_failed_info(o, _entry_of(o.cfg, launch.configs)) for o in failed]}
        report = write_report(finished, out, sweep=sweep, measured=measured, run_info=run_info)
        if failed:
            raise RunsFailed(failed, report)
        return report


# What an added run must share with the comparison's runs for its losses to be read against theirs:
# the held-out windows are a function of the data, the tokenizer and these fields.
WINDOW_FIELDS = ("batch_size", "seq_len", "eval_batches", "data.objective", "data.mask_prob")


def _manifest(run: Path) -> dict[str, Any]:
    try:
        return json.loads((run / "data_manifest.json").read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"--add {run}: its data_manifest.json cannot be read ({err}), so it cannot be "
                          "checked against this comparison's data.") from None


def data_differences(ours: Path, theirs: Path) -> list[str]:
    """How run `theirs` differs from run `ours` in what fixes the held-out windows: the data (the
    source's fingerprint, its settings, the validation split), the tokenizer, and WINDOW_FIELDS."""
    from blocklab.training.config import flat, read_yaml

    a, b = _manifest(ours), _manifest(theirs)
    out = []
    if a["source"].get("fingerprint") != b["source"].get("fingerprint"):
        out.append(f"data source ({a['source'].get('description')} against {b['source'].get('description')})")
    settings = sorted(k for k in a["settings"].keys() | b["settings"].keys()
                      if a["settings"].get(k) != b["settings"].get(k))
    out += [f"data.{k} ({a['settings'].get(k)!r} against {b['settings'].get(k)!r})" for k in settings]
    if a["tokenizer"]["hash"] != b["tokenizer"]["hash"]:
        out.append("tokenizer (tokenizer.json differs)")
    if a["splits"]["val"] != b["splits"]["val"]:
        out.append("validation split (its documents or tokens differ)")
    ca, cb = flat(read_yaml(ours / "config.yaml")), flat(read_yaml(theirs / "config.yaml"))
    out += [f"{k} ({ca.get(k)!r} against {cb.get(k)!r})" for k in WINDOW_FIELDS if ca.get(k) != cb.get(k)]
    return out


def _require_finished(run: Path) -> None:
    if not (run / "summary.json").is_file():
        raise ConfigError(f"--add {run}: not a finished run (no summary.json); give a run directory "
                          "that `blocklab train` or a compare finished.")


def added_runs(paths: list[str | Path], configs: list[tuple[Entry, TrainConfig]]
               ) -> list[tuple[Entry, TrainConfig]]:
    """Runs trained elsewhere (`blocklab train`, another compare, another machine) brought into this
    comparison's report. Each must be finished and share the data, tokenizer and held-out windows of the
    comparison's runs (`data_differences`; refused with the differences named otherwise). A run whose
    config matches one of the entries' apart from its seed (and where it lives) joins that entry as
    another seed; any other run (a longer budget, another rate) is an entry of its own, labelled with
    its folder."""
    from blocklab.training.config import NOT_RESULTS, changed_fields, read_yaml

    ours = Path(configs[0][1].out_dir)
    added: list[tuple[Entry, TrainConfig]] = []
    for path in paths:
        run = Path(path)
        _require_finished(run)
        differences = data_differences(ours, run)
        if differences:
            raise ConfigError(f"--add {run} cannot join this report: it differs from {ours} in "
                              f"{'; '.join(differences)}. Only runs on the same data, tokenizer and held-out "
                              "windows can be compared with these.")
        cfg = TrainConfig.from_dict({**read_yaml(run / "config.yaml"), "out_dir": str(run)})
        joined = next((e for e, c in configs if e.arch == cfg.arch and not changed_fields(
            c, cfg, NOT_RESULTS | {"seed"})), None)
        entry = joined or Entry(f"{cfg.arch} ({run.name})", cfg.arch)
        taken = [c.seed for e, c in configs + added if e.label == entry.label]
        if cfg.seed in taken:
            raise ConfigError(f"--add {run}: `{entry.label}` already has a run of seed {cfg.seed}; add "
                              "another seed, or a run that differs in more than its seed.")
        added.append((entry, cfg))
    return added


def _entry_of(cfg: TrainConfig, configs: list[tuple[Entry, TrainConfig]]) -> Entry | None:
    return next((e for e, c in configs if c.out_dir == cfg.out_dir), None)


def _failed_info(outcome, entry: Entry | None) -> dict[str, Any]:
    return {"run": outcome.cfg.out_dir, "label": entry.label if entry else Path(outcome.cfg.out_dir).name,
            "seed": outcome.cfg.seed, "error": outcome.error, "log": str(outcome.log)}

