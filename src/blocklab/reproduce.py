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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blocklab import evidence
from blocklab.claims import Check, Claim
from blocklab.compare import Entry, default_budget, merge, run_configs
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
            base["max_flops"] = default_budget("flops", [Entry.parse("pre-ln")], base, self.steps)
        else:
            base["max_steps"] = self.steps
        return base

    def group(self, setting: str) -> str:
        tag = f"seq{4 * self.seq_len}" if setting == "seq-long" else setting
        return f"{self.size}-{tag}"


SETTINGS = ("steps", "flops", "seq-long")

SCALES: dict[str, Scale] = {
    "quick": Scale(
        "size tiny (4 layers, d 128), 120 steps of 16 x 128 tokens, 3 seeds: about 10 minutes on a "
        "2-core CPU. Every model leaves the unigram plateau by step 50, but 0.25M tokens is far below "
        "the papers' budgets: a check of the pipeline and of early training, not of the papers' claims; "
        "see the cpu scale (benchmarks/REPRODUCTION.md)",
        "tiny",
        120,
    ),
    "cpu": Scale(
        "size tiny (4 layers, d 128), 400 steps of 16 x 128 tokens (0.8M tokens), 3 seeds", "tiny", 400
    ),
    "cpu-deep": Scale(
        "size tiny at 8 layers (d 128), 400 steps of 16 x 128 tokens, 3 seeds: depth effects",
        "tiny",
        400,
        model={"n_layers": 8},
    ),
    "gpu-resformer": Scale(
        "resformer-82m (8 layers, d 512), 2,000 steps of 32 x 512 tokens, 3 seeds, lr 1e-3",
        "resformer-82m",
        2000,
        batch_size=32,
        seq_len=512,
        lr=1e-3,
        eval_every=250,
    ),
    "gpu-sas-p": Scale(
        "codeparrot-18l (18 layers, d 768), 2,000 steps of 64 x 128 tokens, 3 seeds, lr 1e-3",
        "codeparrot-18l",
        2000,
        batch_size=64,
        seq_len=128,
        lr=1e-3,
        eval_every=250,
    ),
}


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


@dataclass(frozen=True)
class Metric:
    description: str
    exact: bool  # a property of the architecture (no seeds) rather than a measurement of a run
    compute: Callable[[Any], float]  # exact: ModelConfig -> float; measured: run directory -> float


METRICS: dict[str, Metric] = {
    "val_loss": Metric("final validation loss (nats/token)", False, lambda run: _summary(run)["val_loss"]),
    "val_bpb": Metric("final validation bits per byte", False, lambda run: _summary(run)["val_bpb"]),
    "tokens_per_s": Metric("training tokens/s", False, lambda run: _summary(run)["tokens_per_s"]),
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


def plan(claims: list[Claim], scale: Scale, out: Path) -> dict[str, list[tuple[Entry, TrainConfig]]]:
    """The runs the claims' measured checks need, by setting, as (entry, config) per seed."""
    needed: dict[str, dict[str, None]] = {}
    for claim in claims:
        for check in claim.checks:
            if METRICS[check.metric].exact:
                continue
            for setting in _settings(check):
                archs = needed.setdefault(setting, {})
                archs.update({a: None for a in (check.baseline, check.arch) if a is not None})
    return {
        setting: run_configs(
            [Entry.parse(a) for a in archs], scale.seeds, out / scale.group(setting), scale.base(setting)
        )
        for setting, archs in needed.items()
    }


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
        where = f"({c.setting}{' minus ' + c.minus_setting if c.minus_setting else ''})"
        return f"{METRICS[c.metric].description}: {c.arch}{versus} {where}"


class Measurements:
    """Measured metrics of the planned runs, by (setting, arch) -> {seed: value}."""

    def __init__(self, runs: dict[str, list[tuple[Entry, TrainConfig]]]):
        self.runs = {
            (s, e.label, cfg.seed): Path(cfg.out_dir) for s, group in runs.items() for e, cfg in group
        }

    def per_seed(self, metric: str, setting: str, arch: str) -> dict[int, float]:
        out = {}
        for (s, a, seed), run in self.runs.items():
            if (s, a) == (setting, arch):
                if not (run / "summary.json").is_file():
                    raise ConfigError(
                        f"{run} has not finished training: run `blocklab reproduce` without "
                        "--no-train to train it (finished runs are reused)."
                    )
                value = METRICS[metric].compute(run)
                if value is None or (isinstance(value, float) and math.isnan(value)):
                    raise ConfigError(f"{run} has no {metric} (did it finish?)")
                out[seed] = float(value)
        return out


def _model_config(scale: Scale, arch: str, setting: str) -> ModelConfig:
    from blocklab.data import prepare_data

    cfg = run_configs([Entry.parse(arch)], 1, Path("unused"), scale.base(setting))[0][1]
    return cfg.model_config(prepare_data(cfg.data).tokenizer.vocab_size)  # cached tokenizer


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

    def diffs(setting: str) -> dict[int, float]:
        values = measured.per_seed(check.metric, setting, check.arch)
        if check.baseline is None:
            return values
        base = measured.per_seed(check.metric, setting, check.baseline)
        if check.relative:
            values = {s: v / base[s] for s, v in values.items() if s in base}
            base = {s: 1.0 for s in values}
        return dict(
            zip(sorted(set(values) & set(base)), evidence.paired_differences(values, base), strict=True)
        )

    d = diffs(check.setting)
    if check.minus_setting:
        d = dict(
            zip(
                sorted(set(d) & set(diffs(check.minus_setting))),
                evidence.paired_differences(d, diffs(check.minus_setting)),
                strict=True,
            )
        )
    interval = evidence.t_interval([d[s] for s in sorted(d)])
    return CheckResult(check, evidence.verdict(interval, check.relation, check.tolerance), interval=interval)


@dataclass
class ClaimResult:
    claim: Claim
    checks: list[CheckResult]

    @property
    def verdict(self) -> str:
        return evidence.combine([c.verdict for c in self.checks])


@dataclass
class Reproduction:
    results: list[ClaimResult]
    scale: Scale
    scale_name: str
    runs: dict[str, list[tuple[Entry, TrainConfig]]]
    seconds: float  # wall-clock time of the call, training included
    launch: dict[str, Any] | None = None  # how the runs trained ("launcher", "jobs", "threads"); None: not


def reproduce(
    claims: list[Claim],
    scale: str | Scale = "quick",
    out: str | Path = "runs/reproduce",
    train: bool = True,
    log=print,
    launcher=None,
) -> Reproduction:
    """Train (or reuse) the runs the claims need at `scale` under `OUT/<scale>/` with `launcher`
    (`blocklab.launch`; default one at a time here), all settings' runs in one launch, and give each
    claim its verdict; `blocklab.reproduction_report.write_reproduction` writes the report.

    Raises RunsPending when the launcher left runs queued, and RunsFailed when some failed (a claim
    cannot be judged on missing seeds)."""
    import time

    start = time.perf_counter()
    if isinstance(scale, str):
        if scale not in SCALES:
            raise ConfigError(f"scale {scale!r} is not allowed: choose one of {', '.join(SCALES)}.")
        name, scale = scale, SCALES[scale]
    else:
        name = "custom"
    if not claims:
        raise ConfigError("no claim selected: see `blocklab reproduce --list`.")
    out = Path(out)
    runs = plan(claims, scale, out / name)
    launched = None
    if train:
        from blocklab.launch import RunsFailed, train_runs

        for setting, configs in runs.items():
            log(f"{setting}: {len(configs)} runs in {out / name / scale.group(setting)}")
        launch = train_runs([pair for configs in runs.values() for pair in configs], launcher, log)
        launch.raise_if_pending("reproduce", "judge the claims")
        if launch.failed:
            raise RunsFailed(launch.failed)
        launched = launch.describe()
    measured = Measurements(runs)
    results = [ClaimResult(c, [evaluate_check(k, scale, measured) for k in c.checks]) for c in claims]
    return Reproduction(results, scale, name, runs, time.perf_counter() - start, launched)
