"""`blocklab reproduce`: train what the chosen claims need, measure them, and give each a verdict.

A scale fixes the model size, the batch, the steps, the seeds and the learning rate. Each check of
a claim (`blocklab.claims`) reads one group of runs, a setting: equal steps, equal FLOPs (the
baseline's FLOPs in the scale's steps), or a 4x longer sequence at the same tokens per step. The
runs of a group live in `OUT/<scale>/<size>-<setting>/runs/<arch>-seed<k>`, the same layout and
configs as `blocklab compare --out OUT/<scale>/<size>-<setting>`, so two claims over the same runs
train them once, an interrupted reproduction resumes, and a compare run there is reused.

Every seed trains every architecture on the same batches and is validated on the same held-out
windows (batches are a pure function of seed and step), so differences are paired by seed
(`blocklab.evidence`).
"""

from __future__ import annotations

import json
import math
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from blocklab import evidence
from blocklab.claims import Check, Claim
from blocklab.compare import Entry, default_budget, merge, run_configs, slug
from blocklab.config import ConfigError, ModelConfig
from blocklab.training import TrainConfig


@dataclass(frozen=True)
class Scale:
    description: str
    size: str
    steps: int
    seeds: int = 3
    batch_size: int = 16
    seq_len: int = 128
    # None: each architecture's rate at this size in recipes/learning_rates.json (compare.run_configs),
    # else the TrainConfig default
    lr: float | None = None
    model: dict[str, Any] = field(default_factory=dict)  # ModelConfig overrides of every run
    eval_every: int = 50
    train: dict[str, Any] = field(default_factory=dict)  # other TrainConfig fields (data, eval_batches...)
    # Seeds are added to an undecided claim, `seeds` at a time, up to this many (None: no more)
    max_seeds: int | None = None
    # The learning-rate sweep: every architecture trains seed 0 at these multiples of its recipe's
    # peak rates (AdamW's and Muon's together) for `sweep_steps` steps, and its runs train at the best
    lr_sweep: tuple[float, ...] = ()
    sweep_steps: int = 200
    leaves_out: tuple[str, ...] = ()  # claims with these tags are not judged at this scale
    # The throughput checks' interleaved timing after training (`time_throughput`): rounds x steps
    timing_rounds: int = 10
    timing_steps: int = 3
    caveat: str = ""  # what every verdict at this scale must be read with (printed beside each one)

    def base(self, setting: str) -> dict[str, Any]:
        """The TrainConfig fields shared by every run of `setting` (the budget included)."""
        if setting not in SETTINGS:
            raise ConfigError(f"setting {setting!r} is not allowed: choose one of {', '.join(SETTINGS)}")
        base: dict[str, Any] = {
            "size": self.size,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "eval_every": self.eval_every,
            "progress": False,
        }
        if self.model:
            base["model"] = dict(self.model)
        if self.lr is not None:
            base["optim"] = {"lr": self.lr}
        base = merge(base, self.train)
        if setting == "seq-long":  # 4x the sequence, a quarter of the sequences: the same tokens per step
            if self.batch_size % 4:
                raise ConfigError(
                    f"the seq-long setting needs a batch size divisible by 4; got {self.batch_size}"
                )
            base.update(seq_len=4 * self.seq_len, batch_size=self.batch_size // 4)
        if setting == "flops":  # what the baseline (pre-ln) spends in `steps` steps
            base["max_flops"] = default_budget("flops", [Entry.parse(FLOPS_BASELINE)], base, self.steps)
        else:
            base["max_steps"] = self.steps
        return base

    def group(self, setting: str) -> str:
        tag = f"seq{4 * self.seq_len}" if setting == "seq-long" else setting
        return f"{self.size}-{tag}"

    def describe(self) -> str:
        """The description with the seeds and the sweep as configured."""
        more = f", up to {self.max_seeds} for an undecided claim" if self.max_seeds else ""
        factors = ", x".join(f"{f:.3g}" for f in self.lr_sweep)
        sweep = (f"; learning rate per architecture from a sweep of x{factors} "
                 f"its recipe's rates ({self.sweep_steps} steps, seed 0)" if self.lr_sweep else "")
        left = f"; not judged here: the {', '.join(self.leaves_out)} claims" if self.leaves_out else ""
        return f"{self.description}, {self.seeds} seeds{more}{sweep}{left}"


SETTINGS = ("steps", "flops", "seq-long")
# The equal-FLOPs budget is what this architecture spends in the scale's steps, so its equal-FLOPs runs
# are its equal-steps runs, step for step (same schedule, same batches): they are read from there,
# not trained twice (`run_group`).
FLOPS_BASELINE = "pre-ln"


def run_group(setting: str, arch: str) -> str:
    """The setting whose runs `arch` reads at `setting`: its own, but the equal-steps runs for the
    equal-FLOPs baseline."""
    return "steps" if setting == "flops" and arch == FLOPS_BASELINE else setting

# The evidence scales: a per-architecture learning-rate sweep at x1/3, x1 and x3 of the recipe's rates
# (the recipe's own grid, benchmarks/baseline_grid.py --grid lr), 5 seeds, and 5 more for a claim
# still undecided after them.
EVIDENCE = dict(seeds=5, max_seeds=10, lr_sweep=(1 / 3, 1.0, 3.0), sweep_steps=200, timing_rounds=20)

SCALES: dict[str, Scale] = {
    "quick": Scale(
        "size tiny (4 layers, d 128), 120 steps of 16 x 128 tokens: about 10 minutes on a 2-core CPU. "
        "Every model leaves the unigram plateau by step 50, but 0.25M tokens is far below the papers' "
        "budgets: a check of the pipeline and of early training, not of the papers' claims; see the cpu "
        "scale (benchmarks/REPRODUCTION.md)",
        "tiny",
        120,
        caveat="a pipeline check in early training, not evidence for or against the claim",
    ),
    "cpu": Scale(
        "size tiny (4 layers, d 128), 400 steps of 16 x 128 tokens (0.8M tokens)", "tiny", 400, **EVIDENCE
    ),
    # the combination claims only at cpu: 22 architectures x 5 seeds at 8 layers would not fit a session
    "cpu-deep": Scale(
        "size tiny at 8 layers (d 128), 400 steps of 16 x 128 tokens (0.8M tokens): room for the depth "
        "effects",
        "tiny",
        400,
        model={"n_layers": 8},
        leaves_out=("combination",),
        **EVIDENCE,
    ),
    "gpu-resformer": Scale(
        "resformer-82m (8 layers, d 512), 2,000 steps of 32 x 512 tokens, lr 1e-3",
        "resformer-82m",
        2000,
        batch_size=32,
        seq_len=512,
        lr=1e-3,
        eval_every=250,
    ),
    "gpu-sas-p": Scale(
        "codeparrot-18l (18 layers, d 768), 2,000 steps of 64 x 128 tokens, lr 1e-3",
        "codeparrot-18l",
        2000,
        batch_size=64,
        seq_len=128,
        lr=1e-3,
        eval_every=250,
    ),
}
# The GPU campaign's short budgets (benchmarks/gpu_campaign.py): each fits one 10-minute call on one
# H100-class GPU, 3 seeds of every architecture one after another.
SCALES["gpu-resformer-short"] = replace(
    SCALES["gpu-resformer"], steps=400, eval_every=100,
    description="resformer-82m (8 layers, d 512), 400 steps of 32 x 512 tokens (6.6M tokens), lr 1e-3")
SCALES["gpu-sas-p-short"] = replace(
    SCALES["gpu-sas-p"], steps=400, eval_every=100,
    description="codeparrot-18l (18 layers, d 768), 400 steps of 64 x 128 tokens (3.3M tokens), lr 1e-3")


# -- metrics ---------------------------------------------------------------------------------------
def _summary(run: Path) -> dict[str, Any]:
    return json.loads((run / "summary.json").read_text())


def _cached(run: Path, name: str, compute: Callable[[], float]) -> float:
    """A metric computed from a finished run's checkpoint, kept in the run directory."""
    path = run / "reproduce_metrics.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    if name not in saved:
        saved[name] = compute()
        path.write_text(json.dumps(saved, indent=2))
    return saved[name]


def deep_entropy(run: Path) -> float:
    """Importance entropy (Value Residual Eq. 11) averaged over the deeper half of the layers, on 4
    batches of 8 held-out windows."""
    from blocklab.analysis import diagnose_run

    def compute() -> float:
        per_layer = diagnose_run(run, batches=4, batch_size=8)["entropy"]["mean"]
        deep = per_layer[len(per_layer) // 2 :]
        return sum(deep) / len(deep)

    return _cached(run, "deep_entropy", compute)


def lambda_v1_slope(run: Path) -> float:
    """Least-squares slope over the layer index n of the final learned lambda_{n,1} (the weight on V_1)."""
    from blocklab.training.metrics import read_metrics

    scalars = [r["scalars"] for r in read_metrics(run / "metrics.jsonl", "train") if r.get("scalars")][-1]
    points = sorted(
        (int(k.split(".")[1]), v[0])
        for k, v in scalars.items()
        if k.startswith("blocks.") and k.endswith(".attn.values.lambda1")
    )
    if len(points) < 2:
        raise ConfigError(f"{run} logged lambda_1 in {len(points)} layer(s); the slope needs two or more")
    xs, ys = zip(*points, strict=True)
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def _params(cfg: ModelConfig) -> float:
    import torch

    from blocklab.accounting import count_parameters
    from blocklab.model import Transformer

    with torch.device("meta"):
        return float(count_parameters(Transformer(cfg)).total)


def _flops(cfg: ModelConfig) -> float:
    import torch

    from blocklab.accounting import flops_per_token
    from blocklab.model import Transformer

    with torch.device("meta"):
        return float(flops_per_token(Transformer(cfg)))


def _kv_bytes(cfg: ModelConfig) -> float:
    from blocklab.model.cache import cache_bytes_per_token

    return float(cache_bytes_per_token(cfg)["per_token"])


def _table_layer_value_bytes(cfg: ModelConfig) -> float:
    """Value-cache bytes of the layers whose value path reads a token-indexed table or x0 (no V cache)."""
    from blocklab.model.cache import cache_bytes_per_token
    from blocklab.model.value_paths import target_layers

    targets = target_layers(cfg.value_path_options.get("layers", "last-third"), cfg.n_layers)
    layers = cache_bytes_per_token(cfg)["layers"]
    return float(sum(layers[i]["value_bytes"] for i in targets))


# Seeds are added to an undecided loss check until its interval's half-width is below this.
RESOLUTION_NATS = 0.01


@dataclass(frozen=True)
class Metric:
    description: str
    exact: bool  # a property of the architecture (no seeds) rather than a measurement of a run
    # exact: ModelConfig -> float; measured: run directory -> float; timed: unused (None)
    compute: Callable[[Any], float] | None
    # the equivalence bound of a "no effect" verdict (evidence.NO_EFFECT_NATS for losses; None: none)
    equivalence: float | None = None
    # an undecided check gets more seeds while its interval's half-width exceeds this (None: always)
    resolution: float | None = None
    # measured per round of the interleaved timing pass after training (`time_throughput`), not per
    # seed from a run's logs: more seeds do not narrow it
    timed: bool = False


METRICS: dict[str, Metric] = {
    "val_loss": Metric("final validation loss (nats/token)", False, lambda run: _summary(run)["val_loss"],
                       evidence.NO_EFFECT_NATS, RESOLUTION_NATS),
    "val_bpb": Metric("final validation bits per byte", False, lambda run: _summary(run)["val_bpb"]),
    "tokens_per_s": Metric("training tokens/s, interleaved timing after training (per round)", False,
                           None, timed=True),
    "deep_entropy": Metric("importance entropy, deeper half of the layers (nats)", False, deep_entropy),
    "lambda_v1_slope": Metric("slope of learned lambda_1 over layers", False, lambda_v1_slope),
    "params": Metric("parameters", True, _params),
    "flops_per_token": Metric("training FLOPs per token", True, _flops),
    "kv_bytes_per_token": Metric("KV-cache bytes per token (bf16)", True, _kv_bytes),
    "table_layer_value_bytes": Metric(
        "value-cache bytes of the table layers", True, _table_layer_value_bytes
    ),
}

FORMULAS: dict[str, Callable[[ModelConfig], float]] = {
    "(L+1)/2L": lambda cfg: (cfg.n_layers + 1) / (2 * cfg.n_layers),
    "0": lambda _cfg: 0.0,
}


# -- planning and measuring ------------------------------------------------------------------------
def _settings(check: Check) -> list[str]:
    return [check.setting] + ([check.minus_setting] if check.minus_setting else [])


def needed_archs(claims: list[Claim]) -> dict[str, list[str]]:
    """The architectures the claims' measured checks read, by setting."""
    needed: dict[str, dict[str, None]] = {}
    for claim in claims:
        for check in claim.checks:
            if not METRICS[check.metric].exact:
                for setting in _settings(check):
                    needed.setdefault(setting, {}).update(dict.fromkeys(check.archs))
    return {setting: list(archs) for setting, archs in needed.items()}


def recipe_rates(arch: str, scale: Scale) -> dict[str, float]:
    """The peak rates `arch` trains with at `scale` without a sweep: AdamW's lr, and Muon's with Muon."""
    optim = run_configs([Entry.parse(arch)], 1, Path("unused"), scale.base("steps"))[0][1].optim
    return {"lr": optim.lr, **({"muon_lr": optim.muon_lr} if optim.name == "muon" else {})}


def scaled_rates(arch: str, scale: Scale, factor: float) -> dict[str, float]:
    return {k: float(f"{v * factor:.3g}") for k, v in recipe_rates(arch, scale).items()}  # 0.03/3 = 0.01


def _entry(arch: str, scale: Scale, factor: float | None) -> Entry:
    """`arch` as the runs of `scale` train it: with its swept rates when a sweep chose `factor`."""
    if factor is None:
        return Entry.parse(arch)
    return Entry(arch, arch, train={"optim": scaled_rates(arch, scale, factor)})


def sweep_plan(archs: list[str], scale: Scale, out: Path) -> list[tuple[str, float, TrainConfig]]:
    """The sweep's runs: seed 0 of every arch at every factor of `scale.lr_sweep`, `scale.sweep_steps`
    steps at equal steps, in OUT/<size>-lr-sweep/runs/<arch>-lrx<factor>-seed0."""
    base = {**scale.base("steps"), "max_steps": scale.sweep_steps}
    tried = [(arch, f, Entry(f"{arch}-lrx{f:.3g}", arch, train={"optim": scaled_rates(arch, scale, f)}))
             for arch in archs for f in scale.lr_sweep]
    configs = run_configs([e for *_, e in tried], 1, out / f"{scale.size}-lr-sweep", base)
    return [(arch, f, cfg) for (arch, f, _), (_, cfg) in zip(tried, configs, strict=True)]


@dataclass
class Sweep:
    """One architecture's sweep: final validation loss per factor (NaN: diverged or failed) and the best."""

    arch: str
    losses: dict[float, float]
    rates: dict[str, float]  # the chosen peak rates

    @property
    def best(self) -> float:
        finite = {f: v for f, v in self.losses.items() if math.isfinite(v)}
        if not finite:
            raise ConfigError(f"every learning-rate sweep run of {self.arch} diverged or failed")
        return min(finite, key=finite.__getitem__)


def read_sweep(plan: list[tuple[str, float, TrainConfig]], scale: Scale, partial: bool = False
               ) -> dict[str, Sweep]:
    """Each arch's sweep from its finished runs. A missing run is an error, as for the claims' runs;
    with `partial`, its arch is left out."""
    sweeps: dict[str, Sweep] = {}
    missing = set()
    for arch, factor, cfg in plan:
        run = Path(cfg.out_dir)
        if not (run / "summary.json").is_file():
            if partial:
                missing.add(arch)
                continue
            raise ConfigError(not_finished(run))
        loss = _summary(run).get("val_loss")
        sweeps.setdefault(arch, Sweep(arch, {}, {})).losses[factor] = float("nan") if loss is None else loss
    for arch in missing:
        sweeps.pop(arch, None)
    for sweep in sweeps.values():
        sweep.rates = scaled_rates(sweep.arch, scale, sweep.best)
    return sweeps


def not_finished(run: Path) -> str:
    return (f"{run} has not finished training: run `blocklab reproduce` without --no-train to train it "
            "(finished runs are reused), or add --partial to judge only the claims whose runs have finished.")


class NotFinished(ConfigError):
    """A run a check reads has not finished (with --partial, its claim reads pending)."""


def finished_seeds(group: Path, arch: str) -> int:
    """How many consecutive seeds of `arch` from 0 have finished in `group` (the committed run data)."""
    n = 0
    while (group / "runs" / f"{slug(arch)}-seed{n}" / "summary.json").is_file():
        n += 1
    return n


def plan(claims: list[Claim], scale: Scale, out: Path, factors: dict[str, float] | None = None,
         seeds: dict[tuple[str, str], int] | None = None) -> dict[str, list[tuple[Entry, TrainConfig]]]:
    """The runs the claims' measured checks need, by setting, as (entry, config) per seed: `seeds` maps
    (setting, arch) to its number of seeds (default `scale.seeds`); `factors` maps an arch to the
    multiple of its recipe's rates that its sweep chose (default: the recipe's)."""
    runs: dict[str, list[tuple[Entry, TrainConfig]]] = {}
    for setting, archs in needed_archs(claims).items():
        runs[setting] = [
            pair
            for arch in archs
            for pair in run_configs([_entry(arch, scale, (factors or {}).get(arch))],
                                    (seeds or {}).get((setting, arch), scale.seeds),
                                    out / scale.group(run_group(setting, arch)),
                                    scale.base(run_group(setting, arch)))
        ]
    return runs


def unique_runs(runs: dict[str, list[tuple[Entry, TrainConfig]]]) -> list[tuple[Entry, TrainConfig]]:
    """Every planned run once (two settings may read one run: `run_group`)."""
    return list({cfg.out_dir: (e, cfg) for group in runs.values() for e, cfg in group}.values())


# The verdict of a claim whose runs have not all finished (`reproduce(..., partial=True)`).
PENDING = "pending"


@dataclass
class CheckResult:
    check: Check
    verdict: str
    interval: evidence.Interval | None = None  # measured checks
    value: float | None = None  # exact checks: the arch's value (or ratio to the baseline)
    reference: float | None = None  # exact checks: the baseline's value or the formula's

    def describe(self) -> str:
        c = self.check
        versus = (f" / {c.baseline} - 1" if c.relative else f" - {c.baseline}") if c.baseline else ""
        minus = f" - ({c.minus[0]} - {c.minus[1]})" if c.minus else ""
        where = f"({c.setting}{' minus ' + c.minus_setting if c.minus_setting else ''})"
        return f"{METRICS[c.metric].description}: {c.arch}{versus}{minus} {where}"

    @property
    def undecided(self) -> bool:
        """Inconclusive with an interval wider than its metric's resolution: more seeds may decide it."""
        if self.verdict != "inconclusive" or self.interval is None or METRICS[self.check.metric].timed:
            return False
        resolution = METRICS[self.check.metric].resolution
        width = self.interval.half_width
        return resolution is None or width is None or width > resolution


class Measurements:
    """Measured metrics of the planned runs, by (setting, arch) -> {seed: value}."""

    def __init__(self, runs: dict[str, list[tuple[Entry, TrainConfig]]]):
        self.runs = {
            (s, e.label, cfg.seed): Path(cfg.out_dir) for s, group in runs.items() for e, cfg in group
        }

    def per_seed(self, metric: str, setting: str, arch: str) -> dict[int, float]:
        """{seed: value}; for a timed metric {round: value} of the group's interleaved timing."""
        out = {}
        for (s, a, seed), run in self.runs.items():
            if (s, a) == (setting, arch):
                if not (run / "summary.json").is_file():
                    raise NotFinished(not_finished(run))
                if METRICS[metric].timed:
                    return read_timing(run.parent.parent, arch)
                compute = METRICS[metric].compute
                assert compute is not None
                value = compute(run)
                if value is None or (isinstance(value, float) and math.isnan(value)):
                    raise ConfigError(f"{run} has no {metric} (did it finish?)")
                out[seed] = float(value)
        return out


def _model_config(scale: Scale, arch: str, setting: str) -> ModelConfig:
    from blocklab.data import prepare_data

    cfg = run_configs([Entry.parse(arch)], 1, Path("unused"), scale.base(setting))[0][1]
    return cfg.model_config(prepare_data(cfg.data).tokenizer.vocab_size)  # cached tokenizer


def _paired(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
    """a[seed] - b[seed] over the seeds both have."""
    return dict(zip(sorted(set(a) & set(b)), evidence.paired_differences(a, b), strict=True))


def evaluate_check(check: Check, scale: Scale, measured: Measurements) -> CheckResult:
    metric = METRICS[check.metric]
    if metric.exact:
        cfg = _model_config(scale, check.arch, check.setting)
        value = metric.compute(cfg)
        if check.relation == "equals":
            if check.baseline is not None:
                value /= metric.compute(_model_config(scale, check.baseline, check.setting))
            reference = FORMULAS[check.expected](cfg)
        else:
            reference = metric.compute(_model_config(scale, check.baseline, check.setting))
        return CheckResult(
            check, evidence.exact_verdict(value, reference, check.relation), value=value, reference=reference
        )

    def diffs(setting: str, arch: str, baseline: str | None) -> dict[int, float]:
        values = measured.per_seed(check.metric, setting, arch)
        if baseline is None:
            return values
        base = measured.per_seed(check.metric, setting, baseline)
        if check.relative:
            return {s: v / base[s] - 1 for s, v in values.items() if s in base}
        return _paired(values, base)

    d = diffs(check.setting, check.arch, check.baseline)
    if check.minus_setting:
        d = _paired(d, diffs(check.minus_setting, check.arch, check.baseline))
    if check.minus:
        d = _paired(d, diffs(check.setting, *check.minus))
    interval = evidence.t_interval([d[s] for s in sorted(d)])
    return CheckResult(check, evidence.verdict(interval, check.relation, check.tolerance,
                                               equivalence=metric.equivalence), interval=interval)


@dataclass
class ClaimResult:
    claim: Claim
    checks: list[CheckResult]

    @property
    def verdict(self) -> str:
        verdicts = [c.verdict for c in self.checks]
        return PENDING if PENDING in verdicts else evidence.combine(verdicts)


@dataclass
class Reproduction:
    results: list[ClaimResult]
    scale: Scale
    scale_name: str
    runs: dict[str, list[tuple[Entry, TrainConfig]]]
    seconds: float  # wall-clock time of the call, training included
    launch: dict[str, Any] | None = None  # how the runs trained ("launcher", "jobs", "threads"); None: not
    sweeps: dict[str, Sweep] = field(default_factory=dict)  # the learning-rate sweep, by arch
    out: Path | None = None  # the run store of this scale, OUT/<scale>
    measured: Measurements | None = None  # the measured metrics of the runs, for tables across claims


def _scale(scale: str | Scale, name: str | None = None) -> tuple[str, Scale]:
    if isinstance(scale, Scale):
        return name or "custom", scale
    if scale not in SCALES:
        raise ConfigError(f"scale {scale!r} is not allowed: choose one of {', '.join(SCALES)}.")
    return scale, SCALES[scale]


def _judge(claims: list[Claim], scale: Scale, measured: Measurements, ready: set[str] | None,
           partial: bool) -> list[ClaimResult]:
    """Each claim's verdict; with `partial`, a claim whose runs have not all finished (or whose archs'
    sweep has not: not in `ready`) reads pending, its exact checks still judged."""
    results = []
    for claim in claims:
        measured_archs = {a for k in claim.checks if not METRICS[k.metric].exact for a in k.archs}
        try:
            if ready is not None and not measured_archs <= ready:
                raise NotFinished("the learning-rate sweep of an architecture has not finished")
            results.append(ClaimResult(claim, [evaluate_check(k, scale, measured) for k in claim.checks]))
        except NotFinished:
            if not partial:
                raise
            results.append(ClaimResult(claim, [
                evaluate_check(k, scale, measured) if METRICS[k.metric].exact else CheckResult(k, PENDING)
                for k in claim.checks]))
    return results


def _more_seeds(results: list[ClaimResult], seeds: dict[tuple[str, str], int], scale: Scale
                ) -> dict[tuple[str, str], int]:
    """The (setting, arch) pairs that get `scale.seeds` more seeds (up to `scale.max_seeds`): those of
    every undecided measured check that has fewer than the most."""
    more: dict[tuple[str, str], int] = {}
    for result in results:
        for r in result.checks:
            most = scale.max_seeds
            if not r.undecided or r.interval is None or not most or r.interval.n >= most:
                continue
            for setting in _settings(r.check):
                for arch in r.check.archs:
                    now = max(seeds[(setting, arch)], more.get((setting, arch), 0))
                    more[(setting, arch)] = max(now, min(r.interval.n + scale.seeds, scale.max_seeds))
    return {k: v for k, v in more.items() if v > seeds[k]}


def reproduce(
    claims: list[Claim],
    scale: str | Scale = "quick",
    out: str | Path = "runs/reproduce",
    train: bool = True,
    log=print,
    launcher=None,
    name: str | None = None,
    partial: bool = False,
) -> Reproduction:
    """Train (or reuse) the runs the claims need at `scale` under `OUT/<scale>/` with `launcher`
    (`blocklab.launch`; default one at a time here) and give each claim its verdict;
    `blocklab.report.reproduction.write_reproduction` writes the report.

    With a sweep (`Scale.lr_sweep`), every architecture's sweep trains first and its runs take the
    best rate. Every (setting, arch) gets `scale.seeds` seeds, or as many as have finished in the
    store; then, while a measured check is undecided (`CheckResult.undecided`) and has fewer than
    `scale.max_seeds` seeds, its architectures get `scale.seeds` more and the claims are judged again.
    Throughput checks read an interleaved timing pass after training (`time_throughput`), never the
    runs' logged tokens/s.
    With `train=False` nothing trains: the verdicts come from the runs in the store, exactly as a
    training call left them; with `partial` too, a claim whose runs have not all finished reads
    pending instead of stopping the call. `name` names a `scale` given as a Scale (its folder;
    default "custom").

    Raises RunsPending when the launcher left runs queued, and RunsFailed when some failed (a claim
    cannot be judged on missing seeds)."""
    import time

    start = time.perf_counter()
    name, scale = _scale(scale, name)
    claims = [c for c in claims if not set(c.tags) & set(scale.leaves_out)]
    if not claims:
        raise ConfigError("no claim selected: see `blocklab reproduce --list`.")
    root = Path(out) / name
    launches: list[dict[str, Any]] = []

    def train_all(configs: list[tuple[Any, TrainConfig]], what: str) -> None:
        from blocklab.launch import RunsFailed, train_runs

        log(f"{what}: {len(configs)} runs")
        launch = train_runs(configs, launcher, log)
        launch.raise_if_pending("reproduce", "judge the claims")
        if launch.failed:
            raise RunsFailed(launch.failed)
        launches.append(launch.describe())
        record_launch(root, launch, time.perf_counter() - began)

    sweeps: dict[str, Sweep] = {}
    needed = needed_archs(claims)
    if scale.lr_sweep:
        swept = sweep_plan(list(dict.fromkeys(a for archs in needed.values() for a in archs)), scale, root)
        if train:
            began = time.perf_counter()
            train_all([(None, cfg) for *_, cfg in swept], "learning-rate sweep")
        sweeps = read_sweep(swept, scale, partial=partial and not train)
    factors = {arch: s.best for arch, s in sweeps.items()} or None
    ready = set(sweeps) if scale.lr_sweep else None  # the archs whose rates are known
    seeds = {(setting, arch): max(scale.seeds,
                                  finished_seeds(root / scale.group(run_group(setting, arch)), arch))
             for setting, archs in needed.items() for arch in archs}
    if ready is not None and not train:  # plan only what the finished sweeps allow
        claims_to_plan = [c for c in claims if {a for k in c.checks for a in k.archs
                                                if not METRICS[k.metric].exact} <= ready]
    else:
        claims_to_plan = claims
    while True:
        runs = plan(claims_to_plan, scale, root, factors, seeds)
        if train:
            began = time.perf_counter()
            for setting, configs in runs.items():
                log(f"{setting}: {len(configs)} runs in {root / scale.group(setting)}")
            train_all(unique_runs(runs), "claims")
            # speed from interleaved rounds on this machine once training is over, not from the logs
            time_throughput(claims_to_plan, scale, root, runs, launches[-1].get("threads"), log)
        measured = Measurements(runs)
        results = _judge(claims, scale, measured, ready, partial and not train)
        more = _more_seeds(results, seeds, scale) if train else {}
        if not more:
            break
        log(f"undecided checks: {len(more)} (setting, arch) pairs get more seeds, up to {max(more.values())}")
        seeds.update(more)
    launched = launches[-1] if launches else None
    return Reproduction(results, scale, name, runs, time.perf_counter() - start, launched, sweeps, root,
                        measured)


# -- throughput from interleaved timing ---------------------------------------------------------------
TIMING = "timing.json"


def timed_archs(claims: list[Claim]) -> dict[str, list[str]]:
    """The architectures whose speed the claims' timed checks compare, by setting."""
    timed: dict[str, dict[str, None]] = {}
    for claim in claims:
        for check in claim.checks:
            if METRICS[check.metric].timed:
                for setting in _settings(check):
                    timed.setdefault(setting, {}).update(dict.fromkeys(check.archs))
    return {setting: list(archs) for setting, archs in timed.items()}


def time_throughput(claims: list[Claim], scale: Scale, root: Path,
                    runs: dict[str, list[tuple[Entry, TrainConfig]]], threads: int | None, log=print) -> None:
    """After training: time the training step of every architecture a throughput check reads again,
    in `scale.timing_rounds` interleaved rounds of `scale.timing_steps` steps
    (`compare.measure_architectures`, as compare's report does), on `threads` threads (the runs'), and
    keep the step times in OUT/<scale>/<group>/timing.json. A run's logged tokens/s depends on what
    else the machine did while it trained (another run, a resumed half); within a round every
    architecture meets the same load. A group already timed for these architectures is not timed
    again, so the verdict stays a function of the committed data."""
    import time

    from blocklab.compare import measure_architectures
    from blocklab.filemodes import atomic_write_text

    for setting, archs in timed_archs(claims).items():
        path = root / scale.group(setting) / TIMING
        if path.is_file() and set(archs) <= set(json.loads(path.read_text())["architectures"]):
            continue
        configs = [next((e, c) for e, c in runs[setting] if e.label == arch and c.seed == 0)
                   for arch in archs]  # seed 0 stands for the architecture
        if threads is not None:
            configs = [(e, replace(cfg, threads=threads)) for e, cfg in configs]
        log(f"{setting}: timing {', '.join(archs)} in {scale.timing_rounds} interleaved rounds of "
            f"{scale.timing_steps} steps")
        start = time.perf_counter()
        measured = measure_architectures(configs, scale.timing_rounds, scale.timing_steps)
        info = machine()
        record = {
            "rounds": scale.timing_rounds, "steps": scale.timing_steps,
            "threads": threads if threads is not None else info["torch_threads"],
            **{k: info[k] for k in ("date", "commit", "cpu", "cores", "torch")},
            "seconds": round(time.perf_counter() - start, 1),
            "architectures": {
                label: {"tokens_per_step": cfg.batch_size * cfg.seq_len,
                        "step_s": measured["architectures"][label]["step_s"]}
                for label, (_, cfg) in zip(archs, configs, strict=True)},
        }
        atomic_write_text(path, json.dumps(record, indent=2))


def read_timing(group: Path, arch: str) -> dict[int, float]:
    """{round: tokens/s} of `arch` in `group`'s timing pass: the tokens of a step over the median of
    the round's step times."""
    import statistics

    path = group / TIMING
    if not path.is_file():
        raise NotFinished(f"{group} has no interleaved timing ({TIMING}) yet: run `blocklab reproduce` "
                          "without --no-train to time it (finished runs are reused).")
    saved = json.loads(path.read_text())
    if arch not in saved["architectures"]:
        raise NotFinished(f"{path} did not time {arch}: run `blocklab reproduce` without --no-train.")
    times, per = saved["architectures"][arch]["step_s"], saved["steps"]
    tokens = saved["architectures"][arch]["tokens_per_step"]
    return {r: tokens / statistics.median(times[r * per:(r + 1) * per]) for r in range(len(times) // per)}


# -- the campaign log: what trained the committed runs, read back by the report -------------------
CAMPAIGN = "campaign.jsonl"


def record_launch(root: Path, launch, seconds: float) -> None:
    """Append one line to OUT/<scale>/campaign.jsonl for a launch that trained something: when, at which
    commit, on what machine and threads, how long, how many runs trained and were reused."""
    trained = sum(o.status == "trained" for o in launch.outcomes)
    if not trained:
        return
    info = machine()
    record = {"date": info["date"], "commit": info["commit"], "cpu": info["cpu"], "cores": info["cores"],
              "torch": info["torch"], **launch.describe(), "wall_seconds": round(seconds, 1),
              "trained": trained, "reused": sum(o.status == "reused" for o in launch.outcomes)}
    root.mkdir(parents=True, exist_ok=True)
    with open(root / CAMPAIGN, "a") as f:
        f.write(json.dumps(record) + "\n")


def read_campaign(root: Path) -> list[dict[str, Any]]:
    path = root / CAMPAIGN
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def machine() -> dict[str, Any]:
    """What ran the runs: CPU, threads, versions, commit and date."""
    import subprocess

    import torch

    import blocklab

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=Path(__file__).parent,
                              timeout=10).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD") or None
        if commit and git("status", "--porcelain", "--untracked-files=no", "--", "."):
            commit += "+changes"  # the package that ran differs from this commit
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "blocklab": blocklab.__version__,
        "python": platform.python_version(),
        "commit": commit,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
