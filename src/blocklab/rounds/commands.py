"""A round of each command that judges claims, for `rounds.until_decided`: what one more seed trains,
and what the judged runs leave undecided.

- scaling: one more seed of every rung of every architecture of the ladder (`scaling.ladders.plan`;
  a ladder's learning-rate sweep trains once, before the first round); undecided: the headline claims
  still inconclusive;
- reproduce: one more seed of every run the selected claims read (`reproduce` at a scale whose seeds
  are n, its own adding of seeds switched off); undecided: the checks `CheckResult.undecided` names;
- compare: one more seed per architecture; undecided: an architecture whose difference to the
  baseline is neither lower, higher nor no effect.

Finished runs are reused, so a round trains only its new seed, and a call cut off resumes. After the
last round the report says how the rounds ended (`note_in_report`), beside until_decided.json.
"""

from __future__ import annotations

import html
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from blocklab.rounds import Budget, Outcome, Pending, pending, until_decided
from blocklab.statistics import evidence, sequential

RECORD = "until_decided.json"
# where `scaling --until-decided` writes its report unless --report says: OUT/ladder-<name>/until-decided/,
# apart from the fixed-seed report in OUT/ladder-<name>/ (which reads t-intervals and the page rewrites)
SCALING_FOLDER = "until-decided"


def finished_runs(root: Path) -> int:
    """The finished runs under `root` (a run store): the runs a round trained are the difference."""
    return sum(1 for _ in root.rglob("summary.json")) if root.is_dir() else 0


def note_in_report(report: Path, outcome: Outcome, about: dict[str, Any] | None = None) -> None:
    """The rounds' outcome as the report's first paragraph, under its title, in report.md and the .html
    beside it, and as until_decided.json in its folder (with `about`: what the call judged, for a reader
    that rebuilds its last look, as the reproduction page does for `scaling`)."""
    from blocklab.report import owned

    text = outcome.text()
    lines = report.read_text().split("\n")
    at = next((k for k, line in enumerate(lines) if line.startswith("# ")), -1) + 1
    report.write_text("\n".join([*lines[:at], "", f"**{text}**", *lines[at:]]))
    page = report.with_suffix(".html")
    if page.is_file():
        body = page.read_text()
        end = body.find("</h1>")
        if end >= 0:
            end += len("</h1>")
            page.write_text(body[:end] + f"<p><strong>{html.escape(text)}</strong></p>" + body[end:])
    record = {**outcome.record(), **(about or {})}
    record["looks"] = kept_training(record["looks"], report.parent / RECORD)
    (report.parent / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    if (report.parent / owned.RECORD).is_file():  # still blocklab's own: a rerun rewrites them, not refuses
        owned.record_written(report.parent, [p for p in (report, page) if p.is_file()])


def kept_training(looks: list[dict[str, Any]], earlier: Path) -> list[dict[str, Any]]:
    """`looks` with what the call that wrote `earlier` (a record in the same folder) measured kept: a look at
    n seeds that now trained nothing, every run reused, keeps the earlier look's `trained` and `seconds`,
    so a rerun that replays the rounds neither erases what they cost nor rewrites the record."""
    try:
        before = json.loads(earlier.read_text()).get("looks") or []
    except (OSError, ValueError, AttributeError):
        return looks
    trained = {look.get("seeds"): look for look in before
               if isinstance(look, dict) and {"trained", "seconds"} <= set(look)}
    return [{**look, **{k: trained[look["seeds"]][k] for k in ("trained", "seconds")}}
            if not look["trained"] and look["seeds"] in trained else look for look in looks]


# -- scaling ---------------------------------------------------------------------------------------------
def headline_pending(h, result) -> Pending:
    """A headline claim still inconclusive, as `Pending`: the seeds its confidence sequence would need."""
    from blocklab.scaling.judge import NO_EFFECT_LOG

    if h.interval is not None:
        return pending(h.claim.id, h.interval, NO_EFFECT_LOG)
    if h.claim.measure == "gain across sizes":  # each end of the ladder decides on its own
        gains = result.gains[h.claim.arch]
        ends = [pending(h.claim.id, gains[r], evidence.NO_EFFECT_NATS) for r in (result.data.rungs[0],
                                                                                result.data.rungs[-1])]
        counts = [p.seeds for p in ends]
        return Pending(h.claim.id, None if None in counts else max(c for c in counts if c is not None))
    return Pending(h.claim.id, None, f"not a matter of seeds alone: {h.more or h.text}")


def look_data(root: Path, ladder, archs: list[str], name: str, seeds: int):
    """The runs a round's look at `seeds` seeds reads: seeds 0..seeds-1 of those in `root`, whatever else the
    store holds (so a rerun replays the looks, and a reader rebuilds the last one: `headlines.page`)."""
    from blocklab.scaling.judge import read_ladder

    return read_ladder(root, ladder, archs, name).below(seeds)


def scaling_rounds(archs: list[str], ladder, name: str, out: str | Path, budget: Budget,
                   seeds: int | None = None, launcher=None, claims: list[str] | None = None, log=print):
    """Seeds of `ladder` added until its headline claims (those named in `claims`; default all) are
    decided; returns the last judged ScalingResult and the Outcome."""
    from blocklab.reproduce.estimate import Estimator
    from blocklab.scaling.judge import judge_ladder
    from blocklab.scaling.ladders import plan
    from blocklab.scaling.orchestrate import train_ladder, train_sweep

    root = Path(out) / name
    state: dict[str, Any] = {}
    began = time.monotonic()
    if ladder.lr_sweep is not None:  # trained once, before the first round; its time within --max-hours
        train_sweep(archs, ladder, root, launcher, log)

    def train(n: int) -> int:
        before = finished_runs(root)
        train_ladder(archs, ladder, name, out, n, launcher, log)
        state["seeds"] = n
        return finished_runs(root) - before

    def judge() -> list[Pending]:
        result = judge_ladder(look_data(root, ladder, archs, name, state["seeds"]))
        state["result"] = result
        return [headline_pending(h, result) for h in result.headlines
                if h.verdict == "inconclusive" and (claims is None or h.claim.id in claims)]

    def estimate(n: int) -> float:
        device = "cpu" if ladder.trains_on == "cpu" else "gpu"
        seconds = Estimator(root, device).seconds
        costs = [seconds(cfg) for *_, cfg in plan(archs, ladder, root, n) if cfg.seed == n - 1]
        return round_seconds(costs, runs_at_once(launcher, len(costs)))

    outcome = until_decided(seeds or ladder.seeds, train, judge, budget, estimate, log=log, began=began)
    return state["result"], outcome


def runs_at_once(launcher, runs: int) -> int:
    """How many of `runs` the launcher trains at once: a local launcher's --jobs (resolved as it resolves
    them); one where that is unknown (no launcher, or Slurm, whose queue decides)."""
    jobs = getattr(launcher, "jobs", None)
    if jobs is None or not runs:
        return 1
    from blocklab.launch.plan import resolve_jobs

    return resolve_jobs(jobs, runs, getattr(launcher, "threads", None))


def round_seconds(costs: list[float], workers: int) -> float:
    """The wall time of runs costing `costs` seconds each on `workers` at once: their sum spread over the
    workers, and never less than the longest run."""
    return max(sum(costs) / max(workers, 1), max(costs, default=0.0))


# -- reproduce -------------------------------------------------------------------------------------------
def _check_pending(claim_id: str, r) -> Pending:
    from blocklab.reproduce.metrics import METRICS

    metric = METRICS[r.check.metric]
    return pending(f"{claim_id} ({r.check.arch} - {r.check.baseline})", r.interval, metric.equivalence)


def reproduce_rounds(claims, scale: str, out: str | Path, budget: Budget, launcher=None,
                     tracking: dict[str, Any] | None = None, log=print,
                     overrides: dict[str, Any] | None = None):
    """Seeds of the selected claims' runs at `scale` added until no measured check is undecided;
    returns the last Reproduction and the Outcome. `overrides`: TrainConfig fields of every run, as
    `reproduce` takes them."""
    from blocklab.reproduce import SCALES, needed_archs, reproduce
    from blocklab.reproduce.orchestrate import scale_claims, starting_seeds
    from blocklab.util.errors import ConfigError

    if scale not in SCALES:
        raise ConfigError(f"scale {scale!r} is not allowed: choose one of {', '.join(SCALES)}.")
    from blocklab.reproduce.scales import with_overrides

    # the overrides on every run (once, here), and the rounds add the seeds, one at a time
    base = replace(with_overrides(SCALES[scale], overrides), max_seeds=None)
    root = Path(out) / scale
    state: dict[str, Any] = {}

    def train(n: int) -> int:
        before = finished_runs(root)
        state["rep"] = reproduce(claims, replace(base, seeds=n), out, train=True, log=log, launcher=launcher,
                                 name=scale, tracking=tracking)
        return finished_runs(root) - before

    def judge() -> list[Pending]:
        return [_check_pending(result.claim.id, r) for result in state["rep"].results for r in result.checks
                if r.undecided]

    # a store may hold (or an earlier call have planned) more seeds already: the first look reads them
    planned = starting_seeds(needed_archs(scale_claims(claims, base)), base, root)
    outcome = until_decided(max([base.seeds, *planned.values()]), train, judge, budget, log=log)
    return state["rep"], outcome


# -- compare ---------------------------------------------------------------------------------------------
def _row_pending(row: dict[str, Any]) -> Pending | None:
    """None when the architecture's difference to the baseline is decided: its interval (results.json's
    verdict row) excludes zero or lies within +-NO_EFFECT_NATS, with MIN_SEEDS seeds or more."""
    d = row.get("diff")
    if d is None:
        return None  # the baseline
    if d["low"] is None or d["n"] < evidence.MIN_SEEDS:
        return Pending(row["label"], None, f"{d['n']} seeds: {evidence.MIN_SEEDS} or more decide")
    half = (d["high"] - d["low"]) / 2
    if sequential.decides(half, d["mean"], evidence.NO_EFFECT_NATS):
        return None
    sd = half * d["n"] ** 0.5 / sequential.quantile(d["n"])
    more = sequential.seeds_to_decide(d["mean"], sd, evidence.NO_EFFECT_NATS, d["n"] + 1)
    return Pending(row["label"], more)


def compare_rounds(entries, out: str | Path, budget: Budget, seeds: int, log=print, **kwargs):
    """Seeds of every architecture added until each one's difference to the baseline is decided;
    returns the report's path and the Outcome. `kwargs` go to `compare` unchanged."""
    from blocklab.compare import compare

    out = Path(out)
    state: dict[str, Any] = {}

    def train(n: int) -> int:
        before = finished_runs(out / "runs")
        state["report"] = compare(entries, out, seeds=n, log=log, **kwargs)
        return finished_runs(out / "runs") - before

    def judge() -> list[Pending]:
        rows = json.loads((out / "results.json").read_text())["verdict"]["rows"]
        return [p for p in map(_row_pending, rows) if p is not None]

    outcome = until_decided(seeds, train, judge, budget, log=log)
    return state["report"], outcome



# -- the commands' calls ---------------------------------------------------------------------------------
def reproduce_command(args, claims, scales: list[str], launcher, tracked, budget: Budget,
                      overrides: dict[str, Any] | None = None) -> None:
    """`blocklab reproduce --until-decided`: one scale, its claims' seeds added in rounds, the report."""
    from blocklab.reproduce.page import scope, write_reproduction
    from blocklab.util.errors import ConfigError

    if len(scales) != 1 or args.no_train or args.partial:
        raise ConfigError("--until-decided trains one scale's seeds in rounds: give one --scale, without "
                          "--no-train or --partial")
    rep, outcome = reproduce_rounds(claims, scales[0], args.out, budget, launcher, tracked,
                                    overrides=overrides)
    with sequential.in_use():
        path = write_reproduction(rep, args.report or args.out)
    note_in_report(path, outcome)
    print(f"report: {path} (and {path.with_suffix('.html')})")
    for r in rep.results:
        print(f"  {rep.scale_name:<10} {r.verdict:<13} {r.claim.id:<30} ({scope(rep, r)})")
    print("\n".join(outcome.lines()))


def compare_command(entries, out: str, budget: Budget, seeds: int, fresh: bool, **kwargs) -> Path:
    """`blocklab compare --until-decided`: seeds added in rounds, the report of the last round."""
    from blocklab.util.errors import ConfigError

    if fresh:
        raise ConfigError("--until-decided reuses each round's runs in the next: leave out --fresh")
    report, outcome = compare_rounds(entries, out, budget, seeds, **kwargs)
    note_in_report(report, outcome)
    print("\n".join(outcome.lines()))
    return report
