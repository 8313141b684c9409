"""A ladder's measurements, its fits and the headline claims' verdicts.

Runs that differ only in architecture share a seed's data order and held-out windows at every rung
(`blocklab.statistics.evidence`), so each seed gives a whole ladder per architecture and an equivalence of its
own: the baseline's law and X's law are fitted to that seed's rungs, and the equivalence is read off
the two. Its interval is the t-interval over seeds, as for the claims of `blocklab reproduce`
(tests/test_scaling.py draws ladders from a known law plus noise and checks that it covers the true
equivalence in about 95% of draws). The law is the power law where it describes the points of both
architectures (`fit.check_fit` on the means over seeds), else the saturating law where that does,
else none: the claim is inconclusive and the report says what more would tell.

Parameters are counted two ways: "all" (every parameter, as the papers' model sizes count them:
embeddings and Bank of Values' tables included) and "non-embedding" (the parameters that cost FLOPs:
no embedding and no value table). Verdicts read "all", the papers' reading; the report gives both.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blocklab.compare import slug
from blocklab.scaling.fit import (
    FitCheck,
    PowerLaw,
    Saturating,
    check_fit,
    data_ratio,
    fit,
    parameter_ratio,
    saving,
)
from blocklab.scaling.ladders import Ladder
from blocklab.statistics import evidence
from blocklab.statistics.claims import HEADLINES, Headline
from blocklab.util.errors import ConfigError

READINGS = {
    "all": "every parameter (embeddings and value tables included), as the papers count",
    "non-embedding": "the parameters that cost FLOPs (no embedding, no value table)",
}
VERDICT_READING = "all"
# A saving whose interval holds zero and lies within +-3% of the parameters or tokens (a log ratio within
# +-0.03) is "no effect": it rules out the papers' 10-15%.
NO_EFFECT_LOG = 0.03
FORMS = (PowerLaw.name, Saturating.name)


@dataclass
class Point:
    """One finished run of a ladder."""

    params: dict[str, int]
    val_loss: float
    tokens: list[float]  # the validation curve
    losses: list[float]

    def size(self, reading: str) -> float:
        p = self.params
        return float(p["total"] if reading == "all" else p["non_embedding"])


def _read_point(run: Path) -> Point | None:
    """A finished run's parameters, final loss and validation curve (None: not finished)."""
    from blocklab.training.metrics import read_metrics

    path = run / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    loss = float(summary["val_loss"]) if isinstance(summary.get("val_loss"), int | float) else math.nan
    if not math.isfinite(loss):
        raise ConfigError(f"{path} gives val_loss {summary.get('val_loss')!r}, not a finite loss: the run "
                          f"{run} cannot enter a fit; train it again (delete {run}) or leave its seed out")
    val = [r for r in read_metrics(run / "metrics.jsonl", "val") if r.get("val_loss") is not None]
    if not val:
        raise ConfigError(f"{run}/metrics.jsonl has no validation row, yet {path} says the run finished: "
                          f"its curve is lost, so the data equivalence cannot read it; train it again "
                          f"(delete {run})")
    return Point(summary["params"], loss, [float(r["tokens"]) for r in val],
                 [float(r["val_loss"]) for r in val])


@dataclass
class LadderData:
    """The finished runs of a ladder: points[(arch, rung)][seed]."""

    name: str
    ladder: Ladder
    archs: list[str]
    points: dict[tuple[str, str], dict[int, Point]]

    @property
    def rungs(self) -> list[str]:
        return [r.name for r in self.ladder.rungs]

    def finished(self, arch: str) -> list[str]:
        """The rungs where `arch` has at least one finished run."""
        return [r for r in self.rungs if self.points.get((arch, r))]

    def seeds(self, archs: list[str] | None = None) -> list[int]:
        """The seeds finished at every rung by every one of `archs` (default all): whole ladders."""
        sets = [set(self.points.get((a, r), {})) for a in (archs or self.archs) for r in self.rungs]
        return sorted(set.intersection(*sets)) if sets else []

    def sizes(self, arch: str, reading: str) -> list[float]:
        return [next(iter(self.points[(arch, r)].values())).size(reading) for r in self.rungs]

    def losses(self, arch: str, seed: int) -> list[float]:
        return [self.points[(arch, r)][seed].val_loss for r in self.rungs]

    def means(self, arch: str, seeds: list[int]) -> list[float]:
        return [statistics.fmean(self.points[(arch, r)][s].val_loss for s in seeds) for r in self.rungs]

    def seed_variance(self, arch: str, seeds: list[int]) -> tuple[float | None, int]:
        """The seed variance of final loss pooled over the rungs, and its degrees of freedom."""
        if len(seeds) < 2:
            return None, 0
        ss = 0.0
        for r in self.rungs:
            values = [self.points[(arch, r)][s].val_loss for s in seeds]
            mean = statistics.fmean(values)
            ss += sum((v - mean) ** 2 for v in values)
        df = len(self.rungs) * (len(seeds) - 1)
        return ss / df, df


def read_ladder(root: Path, ladder: Ladder, archs: list[str], name: str) -> LadderData:
    points: dict[tuple[str, str], dict[int, Point]] = {}
    for rung in ladder.rungs:
        for arch in archs:
            found = {}
            for run in sorted((root / rung.name / "runs").glob(f"{slug(arch)}-seed*")):
                seed = run.name[len(slug(arch)) + len("-seed") :]
                point = _read_point(run) if run.is_dir() and seed.isdigit() else None
                if point is not None:
                    found[int(seed)] = point
            points[(arch, rung.name)] = found
    return LadderData(name, ladder, archs, points)


@dataclass
class ArchFit:
    """Both laws fitted to one architecture's mean losses over the whole-ladder seeds, per reading."""

    arch: str
    reading: str
    sizes: list[float]
    means: list[float]
    checks: dict[str, FitCheck]


@dataclass
class Equivalence:
    """X against the baseline: intervals over seeds of log(baseline's amount / X's) at each rung (for
    parameters) and at the point the verdict reads, and the law used (None: refused, with `why`);
    `saving` reads them as the fraction X saves."""

    arch: str
    measure: str
    reading: str | None
    law: str | None
    at: float | None  # the N where the verdict reads a parameter equivalence (None for data)
    interval: evidence.Interval | None
    per_rung: dict[str, evidence.Interval | None] = field(default_factory=dict)  # None: beyond reach
    why: str = ""


@dataclass
class HeadlineResult:
    claim: Headline
    verdict: str
    interval: evidence.Interval | None
    text: str  # what was measured, in words
    more: str = ""  # what more would tell, for an inconclusive verdict
    paper_inside: bool | None = None  # the paper's number inside our interval


@dataclass
class ScalingResult:
    data: LadderData
    baseline: str
    seeds: list[int]
    fits: dict[tuple[str, str], ArchFit]  # (arch, reading)
    parameters: dict[tuple[str, str], Equivalence]  # (arch, reading)
    data_eq: dict[str, Equivalence]
    gains: dict[str, dict[str, evidence.Interval]]  # arch: rung: paired loss difference to the baseline
    headlines: list[HeadlineResult]


def arch_fit(data: LadderData, arch: str, reading: str, seeds: list[int]) -> ArchFit:
    sizes, means = data.sizes(arch, reading), data.means(arch, seeds)
    variance, df = data.seed_variance(arch, seeds)
    checks = {}
    for form in FORMS:
        try:
            law = fit(form, sizes, means)
        except ValueError:
            continue
        checks[form] = check_fit(law, sizes, means, variance, len(seeds), df)
    return ArchFit(arch, reading, sizes, means, checks)


def shared_law(fits: list[ArchFit]) -> tuple[str | None, str]:
    """The first law (power law, then saturating) that describes every fit, or None and why not."""
    for form in FORMS:
        if all(form in f.checks and f.checks[form].describes for f in fits):
            return form, ""
    parts = []
    for f in fits:
        for form in FORMS:
            c = f.checks.get(form)
            if c is None:
                parts.append(f"{f.arch}: no {form} fit")
            elif c.p is None:
                parts.append(f"{f.arch}'s {form} cannot be tested (as many constants as rungs, or one seed)")
            elif not c.describes:
                parts.append(
                    f"{f.arch}'s {form} leaves residuals beyond the seed noise (F = {c.f:.1f}, p = {c.p:.2g})"
                )
    return None, "; ".join(parts)


def parameter_equivalences(
    data: LadderData,
    arch: str,
    baseline: str,
    reading: str,
    seeds: list[int],
    fits: dict[tuple[str, str], ArchFit],
) -> Equivalence:
    law, why = shared_law([fits[(baseline, reading)], fits[(arch, reading)]])
    if law is None:
        return Equivalence(arch, "parameters", reading, None, None, None, why=why)
    base_sizes, sizes = data.sizes(baseline, reading), data.sizes(arch, reading)
    mid = math.exp(statistics.fmean(math.log(n) for n in base_sizes))
    per_seed: dict[str, list[float]] = {r: [] for r in data.rungs}
    at_mid = []
    for s in seeds:
        base_law, own = fit(law, base_sizes, data.losses(baseline, s)), fit(law, sizes, data.losses(arch, s))
        at_mid.append(math.log(parameter_ratio(base_law, own, mid)))
        for r, n in zip(data.rungs, sizes, strict=True):
            per_seed[r].append(math.log(parameter_ratio(base_law, own, n)))
    reach = ""
    if not all(map(math.isfinite, at_mid)):
        beyond = sum(not math.isfinite(v) for v in at_mid)
        reach = (f"in {beyond} of {len(at_mid)} seeds {arch}'s loss at the "
                 f"middle of the ladder lies below the floor E of {baseline}'s {law}: no size of {baseline} "
                 "reaches it, so the saving has no finite value there")
    return Equivalence(
        arch,
        "parameters",
        reading,
        law,
        mid,
        _finite_interval(at_mid),
        {r: _finite_interval(v) for r, v in per_seed.items()},
        why=reach,
    )


def _finite_interval(values: list[float]) -> evidence.Interval | None:
    """The t-interval of `values`; None where one is infinite (beyond the baseline's reach)."""
    return evidence.t_interval(values) if all(map(math.isfinite, values)) else None


def data_equivalences(data: LadderData, arch: str, baseline: str, seeds: list[int]) -> Equivalence:
    top = data.rungs[-1]
    values = []
    for s in seeds:
        b, x = data.points[(baseline, top)][s], data.points[(arch, top)][s]
        values.append(math.log(data_ratio(b.tokens, b.losses, x.tokens, x.losses)))
    return Equivalence(arch, "data", None, None, None, evidence.t_interval(values))


def paired_gains(
    data: LadderData, arch: str, baseline: str, seeds: list[int]
) -> dict[str, evidence.Interval]:
    return {
        r: evidence.t_interval(
            [data.points[(arch, r)][s].val_loss - data.points[(baseline, r)][s].val_loss for s in seeds]
        )
        for r in data.rungs
    }


def _more_text(iv: evidence.Interval) -> str:
    from blocklab.statistics.verdict import seeds_needed

    if iv.n < 2:
        return f"{evidence.MIN_SEEDS} or more seeds"
    sd = statistics.stdev(iv.values)
    n = seeds_needed(iv.mean, sd) if sd > 0 else None
    if n is None:
        return "an effect this small needs more than 100 seeds at this spread"
    return f"about {n} seeds would tell an effect of this size at this spread ({iv.n} now)"


def _pct(log_ratio: float) -> str:
    return f"{100 * saving(math.exp(log_ratio)):+.1f}%"


def interval_pct(iv: evidence.Interval | None) -> str:
    """An interval of log ratios as the fractions saved: mean [low, high]."""
    if iv is None:
        return "-"
    if iv.low is None or iv.high is None:
        return f"{_pct(iv.mean)} (n={iv.n})"
    return f"{_pct(iv.mean)} [{_pct(iv.low)}, {_pct(iv.high)}]"


def judge_headline(claim: Headline, result: ScalingResult) -> HeadlineResult:
    relation = {"fewer": "higher", "more": "lower", "lower": "lower"}[claim.direction]
    if claim.measure == "gain across sizes":
        gains = result.gains[claim.arch]
        ends = [result.data.rungs[0], result.data.rungs[-1]]
        verdicts = [evidence.verdict(gains[r], relation, equivalence=evidence.NO_EFFECT_NATS) for r in ends]
        text = "; ".join(f"{r}: {gains[r]} nats" for r in ends)
        verdict = evidence.combine(verdicts)
        more = (
            ""
            if verdict != "inconclusive"
            else "; ".join(
                f"{r}: {_more_text(gains[r])}"
                for r, v in zip(ends, verdicts, strict=True)
                if v == "inconclusive"
            )
        )
        return HeadlineResult(
            claim, verdict, None, f"paired loss difference to {claim.baseline}, {text}", more
        )
    eq = (
        result.data_eq[claim.arch]
        if claim.measure == "data"
        else result.parameters[(claim.arch, VERDICT_READING)]
    )
    if eq.interval is None and eq.law is not None:  # beyond the baseline's reach in some seed
        return HeadlineResult(claim, "inconclusive", None, eq.why,
                              "a ladder whose baseline reaches the loss: more tokens a run, or larger rungs")
    if eq.interval is None:
        return HeadlineResult(
            claim,
            "inconclusive",
            None,
            f"no law describes the ladder: {eq.why}",
            "more rungs (sizes), or more seeds if the noise estimate is what is missing",
        )
    iv = eq.interval
    verdict = evidence.verdict(iv, relation, equivalence=NO_EFFECT_LOG)
    if claim.measure == "data":
        text = (
            f"{claim.arch} needs {interval_pct(iv)} fewer tokens than {claim.baseline} to reach its final "
            f"loss on the largest rung ({result.data.rungs[-1]})"
        )
    else:
        text = (
            f"{claim.arch} reaches {claim.baseline}'s loss with {interval_pct(iv)} fewer parameters "
            f"({eq.law}, read at N = {eq.at:,.0f}, the middle of the ladder)"
        )
    paper = None if claim.paper_value is None else -math.log(1 - claim.paper_value)
    inside = None if paper is None or iv.low is None or iv.high is None else iv.low <= paper <= iv.high
    return HeadlineResult(
        claim, verdict, iv, text, _more_text(iv) if verdict == "inconclusive" else "", inside
    )


def judge_ladder(data: LadderData, baseline: str | None = None) -> ScalingResult:
    """Fits, equivalences and the verdicts of the headline claims whose architectures the ladder has,
    on the seeds every architecture finished at every rung."""
    baseline = baseline or data.archs[0]
    seeds = data.seeds()
    if not seeds:
        raise ValueError(f"no seed has finished every rung for every architecture in {data.name}")
    fits = {(a, reading): arch_fit(data, a, reading, seeds) for a in data.archs for reading in READINGS}
    others = [a for a in data.archs if a != baseline]
    params = {
        (a, reading): parameter_equivalences(data, a, baseline, reading, seeds, fits)
        for a in others
        for reading in READINGS
    }
    data_eq = {a: data_equivalences(data, a, baseline, seeds) for a in others}
    gains = {a: paired_gains(data, a, baseline, seeds) for a in others}
    result = ScalingResult(data, baseline, seeds, fits, params, data_eq, gains, [])
    result.headlines = [
        judge_headline(h, result) for h in HEADLINES if h.baseline == baseline and h.arch in others
    ]
    return result


def result_record(result: ScalingResult) -> dict[str, Any]:
    """The numbers of a judged ladder as JSON."""

    def iv(i: evidence.Interval | None) -> dict[str, Any] | None:
        return None if i is None else {"values": list(i.values), "mean": i.mean, "low": i.low, "high": i.high}

    return {
        "ladder": result.data.name,
        "baseline": result.baseline,
        "seeds": result.seeds,
        "rungs": result.data.rungs,
        "fits": [
            {
                "arch": f.arch,
                "reading": f.reading,
                "sizes": f.sizes,
                "means": f.means,
                "laws": {
                    form: {
                        "formula": c.law.formula(),
                        "residuals": list(c.residuals),
                        "f": c.f,
                        "p": c.p,
                        "describes": c.describes,
                    }
                    for form, c in f.checks.items()
                },
            }
            for f in result.fits.values()
        ],
        "parameters": [
            {
                "arch": e.arch,
                "reading": e.reading,
                "law": e.law,
                "at": e.at,
                "interval": iv(e.interval),
                "per_rung": {r: iv(v) for r, v in e.per_rung.items()},
                "why": e.why,
            }
            for e in result.parameters.values()
        ],
        "data": [{"arch": e.arch, "interval": iv(e.interval)} for e in result.data_eq.values()],
        "gains": {a: {r: iv(v) for r, v in g.items()} for a, g in result.gains.items()},
        "headlines": [
            {
                "id": h.claim.id,
                "verdict": h.verdict,
                "interval": iv(h.interval),
                "text": h.text,
                "more": h.more,
                "paper_value": h.claim.paper_value,
                "paper_inside": h.paper_inside,
            }
            for h in result.headlines
        ],
    }
