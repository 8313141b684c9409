"""A ladder's measurements, its fits and the headline claims' verdicts.

Runs that differ only in architecture share a seed's data order and held-out windows at every rung
(`blocklab.statistics.evidence`), so each seed gives a whole ladder per architecture and an equivalence of its
own: the baseline's law and X's law are fitted to that seed's rungs, and the equivalence is read off
the two. Its interval is the t-interval over seeds, as for the claims of `blocklab reproduce`
(tests/scaling/test_scaling.py draws ladders from a known law plus noise and checks that it covers the true
equivalence in about 95% of draws). It is read under every law that describes the points of both
architectures (`fit.check_fit` on the means over seeds), the interval being the hull of the laws'
intervals (`scaling.laws`: the choice of law is made on the same data), else under none: the claim is
inconclusive and the report says what more would tell (with one seed: that no law could be tested).
A reading that needs the baseline's law far past the ladder is named, not given as a number
(`laws.READ_BEYOND`). `family_verdicts` reads the claims again at a family-wise 95% (Bonferroni).

Parameters are counted two ways: "all" (every parameter, as the papers' model sizes count them:
embeddings and Bank of Values' tables included) and "non-embedding" (the parameters that cost FLOPs:
no embedding and no value table). Verdicts read "all", the papers' reading; the report gives both.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from blocklab.compare import slug
from blocklab.reproduce.planning import Sweep
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
from blocklab.scaling.ladders import Ladder, rung_steps
from blocklab.scaling.laws import READ_BEYOND, beyond_ladder, beyond_text, hull
from blocklab.scaling.shorter_runs import SHORTER_FOLDER, shorter_steps
from blocklab.scaling.shorter_runs import curve as shorter_curve
from blocklab.scaling.shorter_runs import run_name as shorter_name
from blocklab.scaling.sweeps import read_sweeps, sweep_plan
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
ONE_SEED = ("one seed: the laws could not be tested (a lack-of-fit test weighs the residuals against the "
            "seed-to-seed noise, which one seed does not show) and the saving has no interval")


@dataclass
class Point:
    """One finished run of a ladder."""

    params: dict[str, int]
    val_loss: float
    tokens: list[float]  # the validation curve
    losses: list[float]
    run: Path | None = None  # its folder (config.yaml, data_manifest.json, summary.json)
    train_time: float | None = None  # seconds of training, from summary.json

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
    # read_metrics refuses a finished run whose curve ends before its summary's step (lines lost)
    val = [r for r in read_metrics(run / "metrics.jsonl", "val") if r.get("val_loss") is not None]
    train_time = summary.get("train_time")
    return Point(summary["params"], loss, [float(r["tokens"]) for r in val],
                 [float(r["val_loss"]) for r in val], run,
                 float(train_time) if isinstance(train_time, int | float) else None)


@dataclass
class LadderData:
    """The finished runs of a ladder: points[(arch, rung)][seed]."""

    name: str
    ladder: Ladder
    archs: list[str]
    points: dict[tuple[str, str], dict[int, Point]]
    # with a learning-rate sweep, each finished (rung, arch)'s sweep: its losses and chosen rates
    sweeps: dict[tuple[str, str], Sweep] = field(default_factory=dict)
    # with shorter runs of the largest rung, shorter[(arch, steps)][seed] (`scaling.shorter_runs`)
    shorter: dict[tuple[str, int], dict[int, Point]] = field(default_factory=dict)

    @property
    def rungs(self) -> list[str]:
        return [r.name for r in self.ladder.rungs]

    def finished(self, arch: str) -> list[str]:
        """The rungs where `arch` has at least one finished run."""
        return [r for r in self.rungs if self.points.get((arch, r))]

    def seeds(self, archs: list[str] | None = None) -> list[int]:
        """The seeds finished at every rung by every one of `archs` (default all), and at every shorter run
        when the ladder has them: whole ladders."""
        sets = [set(self.points.get((a, r), {})) for a in (archs or self.archs) for r in self.rungs]
        sets += [set(found) for (a, _), found in self.shorter.items() if a in (archs or self.archs)]
        return sorted(set.intersection(*sets)) if sets else []

    def below(self, seeds: int) -> LadderData:
        """These runs of seeds 0..seeds-1 only (a round's look at `seeds` seeds)."""
        def keep(found: dict) -> dict:
            return {k: {s: p for s, p in v.items() if s < seeds} for k, v in found.items()}

        return replace(self, points=keep(self.points), shorter=keep(self.shorter))

    def curve(self, arch: str, seed: int) -> tuple[list[float], list[float]]:
        """`arch`'s loss against tokens on the largest rung at `seed`, as the data equivalence reads it: the
        final losses of its shorter runs and its full run, when the ladder has shorter runs; else the full
        run's validation curve on the way."""
        full = self.points[(arch, self.rungs[-1])][seed]
        if not self.ladder.shorter_runs:
            return full.tokens, full.losses
        runs = [p[seed] for (a, _), p in self.shorter.items() if a == arch]
        return shorter_curve([(p.tokens[-1], p.val_loss) for p in runs], full.tokens[-1], full.val_loss)

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
    sweeps = read_sweeps(sweep_plan(archs, ladder, root), partial=True) if ladder.lr_sweep else {}
    return LadderData(name, ladder, archs, points, sweeps, _read_shorter(root, ladder, archs))


def _read_shorter(root: Path, ladder: Ladder, archs: list[str]) -> dict[tuple[str, int], dict[int, Point]]:
    """The finished shorter runs of the largest rung (none without `shorter_runs`), by (arch, steps)."""
    if not ladder.shorter_runs:
        return {}
    top = ladder.rungs[-1].name
    full = ladder.steps if ladder.steps is not None else rung_steps(ladder)[top][1]
    found: dict[tuple[str, int], dict[int, Point]] = {}
    for k in shorter_steps(ladder.shorter_runs, full, top):
        for arch in archs:
            name = slug(shorter_name(arch, k))
            runs = sorted((root / top / SHORTER_FOLDER / "runs").glob(f"{name}-seed*"))
            points = {int(run.name[len(name) + len("-seed"):]): _read_point(run) for run in runs
                      if run.name[len(name) + len("-seed"):].isdigit()}
            found[(arch, k)] = {s: p for s, p in points.items() if p is not None}
    return found


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
    untestable: bool = False  # one seed: no noise to test a law against
    by_law: dict[str, list[float]] = field(default_factory=dict)  # each admissible law's per-seed values
    outside: float | None = None  # how far past the ladder the verdict's reading needs the baseline's law
    outside_per_rung: dict[str, float | None] = field(default_factory=dict)


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
    laws, why = admissible_laws(fits)
    return (laws[0] if laws else None), why


def admissible_laws(fits: list[ArchFit]) -> tuple[list[str], str]:
    """The laws that describe every fit (`laws` reads the equivalences under each), or none and why."""
    laws = [form for form in FORMS if all(form in f.checks and f.checks[form].describes for f in fits)]
    if laws:
        return laws, ""
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
    return [], "; ".join(parts)


def parameter_equivalences(
    data: LadderData,
    arch: str,
    baseline: str,
    reading: str,
    seeds: list[int],
    fits: dict[tuple[str, str], ArchFit],
) -> Equivalence:
    """X's saving against the baseline under every admissible law (`laws.hull`), at each rung and at the
    middle of the ladder, where the verdict reads it."""
    if len(seeds) < 2:
        return Equivalence(arch, "parameters", reading, None, None, None, why=ONE_SEED, untestable=True)
    laws, why = admissible_laws([fits[(baseline, reading)], fits[(arch, reading)]])
    if not laws:
        return Equivalence(arch, "parameters", reading, None, None, None, why=why)
    base_sizes, sizes = data.sizes(baseline, reading), data.sizes(arch, reading)
    mid = math.exp(statistics.fmean(math.log(n) for n in base_sizes))
    per_seed: dict[str, dict[str, list[float]]] = {r: {law: [] for law in laws} for r in data.rungs}
    at_mid: dict[str, list[float]] = {law: [] for law in laws}
    for law in laws:
        for s in seeds:
            base_law = fit(law, base_sizes, data.losses(baseline, s))
            own = fit(law, sizes, data.losses(arch, s))
            at_mid[law].append(math.log(parameter_ratio(base_law, own, mid)))
            for r, n in zip(data.rungs, sizes, strict=True):
                per_seed[r][law].append(math.log(parameter_ratio(base_law, own, n)))
    reach = ""
    values = [v for vs in at_mid.values() for v in vs]
    if not all(map(math.isfinite, values)):
        beyond = sum(not all(map(math.isfinite, col)) for col in zip(*at_mid.values(), strict=True))
        reach = (f"in {beyond} of {len(seeds)} seeds {arch}'s loss at the "
                 f"middle of the ladder lies below the floor E of {baseline}'s {' and '.join(laws)}: no size "
                 f"of {baseline} reaches it, so the saving has no finite value there")
    return Equivalence(
        arch,
        "parameters",
        reading,
        " and ".join(laws),
        mid,
        hull(at_mid),
        {r: hull(v) for r, v in per_seed.items()},
        why=reach,
        by_law=at_mid,
        outside=beyond_ladder(mid, at_mid, base_sizes),
        outside_per_rung={r: beyond_ladder(n, per_seed[r], base_sizes)
                          for r, n in zip(data.rungs, sizes, strict=True)},
    )


def data_equivalences(data: LadderData, arch: str, baseline: str, seeds: list[int]) -> Equivalence:
    values = [math.log(data_ratio(*data.curve(baseline, s), *data.curve(arch, s))) for s in seeds]
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


def judge_headline(claim: Headline, result: ScalingResult, confidence: float = evidence.CONFIDENCE
                   ) -> HeadlineResult:
    """The claim's verdict from its intervals at `confidence` (the report's 95%, or the family-wise
    reading's higher level: `family_verdicts`)."""
    relation = {"fewer": "higher", "more": "lower", "lower": "lower"}[claim.direction]
    if claim.measure == "gain across sizes":
        return _judge_gain(claim, result, relation, confidence)
    eq = (
        result.data_eq[claim.arch]
        if claim.measure == "data"
        else result.parameters[(claim.arch, VERDICT_READING)]
    )
    if eq.untestable:
        return HeadlineResult(claim, "inconclusive", None, eq.why,
                              f"2 or more seeds test the laws; {evidence.MIN_SEEDS} or more give a verdict")
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
    if eq.outside is not None:
        return HeadlineResult(
            claim, "inconclusive", None,
            f"{claim.arch}'s saving at the middle of the ladder (N = {eq.at:,.0f}) needs {claim.baseline}'s "
            f"{eq.law} {beyond_text(eq.outside)}, more than the {READ_BEYOND:g}x this report reads a law "
            "past its rungs", f"rungs of {claim.baseline} up to the size the reading needs")
    iv = eq.interval
    if confidence != evidence.CONFIDENCE:
        iv = (hull(eq.by_law, confidence) if claim.measure == "parameters"
              else evidence.t_interval(iv.values, confidence)) or iv
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


def _judge_gain(claim: Headline, result: ScalingResult, relation: str, confidence: float) -> HeadlineResult:
    """A gain at both ends of the ladder: two paired loss differences, each judged as a loss check."""
    gains = result.gains[claim.arch]
    ends = [result.data.rungs[0], result.data.rungs[-1]]
    ivs = {r: gains[r] if confidence == evidence.CONFIDENCE
           else evidence.t_interval(gains[r].values, confidence) for r in ends}
    verdicts = [evidence.verdict(ivs[r], relation, equivalence=evidence.NO_EFFECT_NATS) for r in ends]
    text = "; ".join(f"{r}: {ivs[r]} nats" for r in ends)
    verdict = evidence.combine(verdicts)
    more = (
        ""
        if verdict != "inconclusive"
        else "; ".join(
            f"{r}: {_more_text(ivs[r])}" for r, v in zip(ends, verdicts, strict=True) if v == "inconclusive"
        )
    )
    return HeadlineResult(claim, verdict, None, f"paired loss difference to {claim.baseline}, {text}", more)


def family_level(result: ScalingResult) -> float:
    """The confidence each claim's interval needs for a family-wise 95% over the report's claims
    (Bonferroni: 1 - 0.05 / claims)."""
    return 1 - (1 - evidence.CONFIDENCE) / max(len(result.headlines), 1)


def family_verdicts(result: ScalingResult) -> dict[str, str]:
    """Each claim's verdict with every interval at `family_level`: the verdicts that hold together, with
    at most a 5% chance that any one of them rests on an interval that misses its truth."""
    level = family_level(result)
    return {h.claim.id: judge_headline(h.claim, result, level).verdict for h in result.headlines}


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
