"""Each check's evidence from the measured runs (paired by seed, `blocklab.statistics.evidence`) and each
claim's verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blocklab.compare import Entry, run_configs
from blocklab.model.config import ModelConfig
from blocklab.reproduce.metrics import FORMULAS, METRICS, readable_from_weights
from blocklab.reproduce.planning import NotFinished, Sweep, check_settings, not_finished
from blocklab.reproduce.scales import Scale
from blocklab.reproduce.timing import read_timing
from blocklab.statistics import evidence
from blocklab.statistics.claims import Check, Claim
from blocklab.training import TrainConfig
from blocklab.util.errors import ConfigError

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
                if METRICS[metric].from_weights and not readable_from_weights(run, metric):
                    raise NotFinished(
                        f"{run} has finished, but its {metric} is read from its weights, and the run keeps "
                        "neither the value (reproduce_metrics.json) nor a checkpoint: judge it in the store "
                        "that trained it, or add --partial to judge the claims whose runs can be read.")
                if METRICS[metric].timed:
                    return read_timing(run.parent.parent, arch)
                compute = METRICS[metric].compute
                assert compute is not None
                value = compute(run)
                if value is None or (isinstance(value, float) and math.isnan(value)):
                    raise ConfigError(f"{run} has no {metric} (did it finish?)")
                out[seed] = float(value)
        return out


def scale_model_config(scale: Scale, arch: str, setting: str) -> ModelConfig:
    """The model `arch` trains at `scale` in `setting` (seed-independent)."""
    from blocklab.data import prepare_data

    cfg = run_configs([Entry.parse(arch)], 1, Path("unused"), scale.base(setting))[0][1]
    return cfg.model_config(prepare_data(cfg.data).tokenizer.vocab_size)  # cached tokenizer


def _paired(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
    """a[seed] - b[seed] over the seeds both have."""
    return dict(zip(sorted(set(a) & set(b)), evidence.paired_differences(a, b), strict=True))


def evaluate_check(check: Check, scale: Scale, measured: Measurements) -> CheckResult:
    metric = METRICS[check.metric]
    if metric.exact:
        cfg = scale_model_config(scale, check.arch, check.setting)
        value = metric.compute(cfg)
        if check.relation == "equals":
            if check.baseline is not None:
                value /= metric.compute(scale_model_config(scale, check.baseline, check.setting))
            reference = FORMULAS[check.expected](cfg)
        else:
            reference = metric.compute(scale_model_config(scale, check.baseline, check.setting))
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


def judge_claims(claims: list[Claim], scale: Scale, measured: Measurements, ready: set[str] | None,
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


def more_seeds(results: list[ClaimResult], seeds: dict[tuple[str, str], int], scale: Scale
                ) -> dict[tuple[str, str], int]:
    """The (setting, arch) pairs that get `scale.seeds` more seeds (up to `scale.max_seeds`): those of
    every undecided measured check that has fewer than the most."""
    more: dict[tuple[str, str], int] = {}
    for result in results:
        for r in result.checks:
            most = scale.max_seeds
            if not r.undecided or r.interval is None or not most or r.interval.n >= most:
                continue
            for setting in check_settings(r.check):
                for arch in r.check.archs:
                    now = max(seeds[(setting, arch)], more.get((setting, arch), 0))
                    more[(setting, arch)] = max(now, min(r.interval.n + scale.seeds, scale.max_seeds))
    return {k: v for k, v in more.items() if v > seeds[k]}
