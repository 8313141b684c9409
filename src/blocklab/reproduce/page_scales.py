"""The page over several scales (benchmarks/REPRODUCTION.md), by scale: each claim's verdict with how far
a campaign under way has got ("not yet run", "partial: k of n runs"), its measured checks side by side
as models grow, and which GPU and commit trained the runs of a GPU scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from blocklab.reproduce.estimate import TRAINED_ON, read_trained_on
from blocklab.reproduce.judge import PENDING, ClaimResult, Reproduction, scale_model_config
from blocklab.reproduce.metrics import METRICS
from blocklab.reproduce.orchestrate import starting_seeds
from blocklab.reproduce.page_tables import VERDICTS, interval_text, relation_text
from blocklab.reproduce.planning import SWEEP, needed_archs, plan, sweep_plan, unique_runs
from blocklab.reproduce.scales import FLOPS_BASELINE
from blocklab.statistics import evidence
from blocklab.statistics.claims import Claim

NOT_YET_RUN = "not yet run"


def planned_runs(rep: Reproduction, claims: Sequence[Claim]) -> list[Path]:
    """Every run the claims' measured checks read at the scale, as planned so far: the sweep's runs of
    their architectures and their runs at the seeds planned (`starting_seeds`)."""
    needed = needed_archs(list(claims))
    if rep.out is None or not needed:
        return []
    archs = list(dict.fromkeys(a for group in needed.values() for a in group))
    sweep = ([Path(cfg.out_dir) for *_, cfg in sweep_plan(archs, rep.scale, rep.out)]
             if rep.scale.lr_sweep else [])
    seeds = starting_seeds(needed, rep.scale, rep.out)
    runs = [Path(cfg.out_dir) for _, cfg in unique_runs(plan(list(claims), rep.scale, rep.out, None, seeds))]
    return list(dict.fromkeys(sweep + runs))


def _finished(runs: list[Path]) -> int:
    return sum((run / "summary.json").is_file() for run in runs)


def status(rep: Reproduction, result: ClaimResult) -> str:
    """A claim's verdict at a scale; a pending one says how far its runs have got."""
    if result.verdict != PENDING:
        return result.verdict
    runs = planned_runs(rep, [result.claim])
    done = _finished(runs)
    if not done:
        return NOT_YET_RUN
    return PENDING if done == len(runs) else f"partial: {done} of {len(runs)} runs"


def count_line(rep: Reproduction) -> str:
    """The verdicts of a scale counted, its loss claims left open, and with a campaign under way how
    many of its planned runs have finished."""
    counts = {v: sum(r.verdict == v for r in rep.results) for v in VERDICTS}
    loss = [r for r in rep.results if any(k.check.metric == "val_loss" for k in r.checks)]
    open_loss = sum(r.verdict == "inconclusive" for r in loss)
    waiting = sum(r.verdict == PENDING for r in loss)
    line = (f"- `{rep.scale_name}`: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n)
            + f" of {len(rep.results)} claims; {open_loss} of the {len(loss)} loss claims inconclusive"
            + (f", {waiting} pending" if waiting else ""))
    if counts[PENDING]:
        runs = planned_runs(rep, [r.claim for r in rep.results])
        line += f"; {_finished(runs)} of the {len(runs)} runs planned so far have finished"
    return line + "."


def verdict_rows(reps: list[Reproduction]) -> list[list[str]]:
    """One row per claim: paper, where, statement and its status at each scale ("-": not judged there)."""
    from blocklab.statistics.claims import PAPERS

    by_scale = [{r.claim.id: r for r in rep.results} for rep in reps]
    ids = list(dict.fromkeys(r.claim.id for rep in reps for r in rep.results))
    rows = []
    for cid in ids:
        claim = next(results[cid].claim for results in by_scale if cid in results)
        rows.append([cid, PAPERS[claim.paper].split(" (")[0], claim.where, claim.statement,
                     *(status(rep, results[cid]) if cid in results else "-"
                       for rep, results in zip(reps, by_scale, strict=True))])
    return rows


def _measured(result: ClaimResult) -> list[int]:
    """The indices of a claim's checks measured per seed (not exact, not timed)."""
    return [k for k, r in enumerate(result.checks)
            if not METRICS[r.check.metric].exact and not METRICS[r.check.metric].timed]


def check_rows(reps: list[Reproduction]) -> list[list[str]]:
    """One row per measured check: its mean paired difference, interval and verdict at each scale."""
    by_scale = [{r.claim.id: r for r in rep.results} for rep in reps]
    ids = list(dict.fromkeys(r.claim.id for rep in reps for r in rep.results))
    rows = []
    for cid in ids:
        per_scale = [results.get(cid) for results in by_scale]
        first = next(r for r in per_scale if r is not None)
        for k, check in enumerate(first.checks):
            if METRICS[check.check.metric].exact:
                continue
            cells = []
            for rep, r in zip(reps, per_scale, strict=True):
                iv = r.checks[k].interval if r is not None else None
                cells.append("-" if r is None else status(rep, r) if iv is None else
                             f"{interval_text(iv)} (n={iv.n}) {r.checks[k].verdict}")
            rows.append([cid, check.describe(), relation_text(check), *cells])
    return rows


def reading(measured: list[tuple[str, evidence.Interval]]) -> str:
    """How a check's paired difference changes from the first scale that measured it to the last."""
    if not measured:
        return "No scale has measured it yet."
    if len(measured) == 1:
        return f"Measured at `{measured[0][0]}` only so far."
    (a, x), (b, y) = measured[0], measured[-1]
    change, low, high = evidence.welch_interval(y.values, x.values)
    text = f"change {change:+.3f} [{low:+.3f}, {high:+.3f}] (Welch)"
    if low <= 0 <= high:
        return f"From `{a}` to `{b}` no change is shown: {text}."
    word = ("its mean changes sign" if x.mean * y.mean < 0 else
            "it grows" if abs(y.mean) > abs(x.mean) else "it shrinks")
    return f"From `{a}` to `{b}` {word}: {text}."


def scale_size(rep: Reproduction) -> str:
    """The baseline's parameters and the tokens of a run at the scale."""
    params = METRICS["params"].compute(scale_model_config(rep.scale, FLOPS_BASELINE, "steps"))
    s = rep.scale
    tokens = s.steps * s.batch_size * s.seq_len
    return f"{params / 1e6:.3g}M parameters ({FLOPS_BASELINE}), {tokens / 1e6:.2g}M tokens"


GROWTH_TEXT = ("Each measured check's paired difference at every scale that judges it (mean and 95% "
               "t-interval over its seeds), smallest scale first, and how it changes from the first scale "
               "that measured it to the last: the change of the means with a Welch interval (the scales' "
               "seeds are independent of each other); one whose interval holds zero reads \"no change is "
               "shown\". The scales differ in width, depth and tokens at once, so a change says how the "
               "effect moves with the whole scale, not with one of them.")


def growth_lines(reps: list[Reproduction]) -> list[str]:
    """One line per measured check of every claim: its difference at each scale and the reading."""
    sizes = [f"`{rep.scale_name}`: {scale_size(rep)}" for rep in reps]
    lines = [GROWTH_TEXT, "", "Scales: " + "; ".join(sizes) + ".", ""]
    by_scale = [{r.claim.id: r for r in rep.results} for rep in reps]
    for cid in dict.fromkeys(r.claim.id for rep in reps for r in rep.results):
        judged = [(rep, results[cid]) for rep, results in zip(reps, by_scale, strict=True) if cid in results]
        for k in _measured(judged[0][1]):
            check = judged[0][1].checks[k]
            cells, measured = [], []
            for rep, r in judged:
                iv = r.checks[k].interval
                if iv is None or iv.low is None:
                    cells.append(f"`{rep.scale_name}` {status(rep, r)}")
                    continue
                cells.append(f"`{rep.scale_name}` {interval_text(iv)} (n={iv.n})")
                measured.append((rep.scale_name, iv))
            lines.append(f"- **{cid}**, {check.describe()}, expected {relation_text(check)}: "
                         + " · ".join(cells) + ". " + reading(measured))
    return lines


TRAINED_ON_TEXT = ("What trained each run of a scale trained a piece at a time (`benchmarks/gpu_campaign.py "
                   "next`), from the runs' own records (trained_on.json): the GPU, the commit of the code, "
                   "the dates, the runs and their wall-clock minutes (start, validations and the metrics "
                   "read from the weights included). A run resumed from a checkpoint counts where it ended.")
TRAINED_ON_HEAD = ["GPU", "commit", "dates", "sweep runs", "claim runs", "minutes", "resumed"]


def trained_on(rep: Reproduction) -> list[tuple[Path, dict]]:
    """Every finished run of the scale's store with its record, in path order."""
    if rep.out is None or not rep.out.is_dir():
        return []
    found = [(p.parent, read_trained_on(p.parent)) for p in sorted(rep.out.rglob(TRAINED_ON))]
    return [(run, r) for run, r in found if r is not None and (run / "summary.json").is_file()]


def trained_on_rows(rep: Reproduction) -> list[list[str]]:
    """One row per GPU and commit: the dates, sweep and claim runs, minutes and resumed runs."""
    groups: dict[tuple[str, str], list[tuple[Path, dict]]] = {}
    for run, record in trained_on(rep):
        groups.setdefault((record["device"], str(record["commit"])), []).append((run, record))
    rows = []
    for (device, commit), runs in groups.items():
        dates = sorted(r["date"] for _, r in runs)
        sweep = sum(run.parent.parent.name.endswith(f"-{SWEEP}") for run, _ in runs)
        minutes = sum(r["wall_seconds"] for _, r in runs) / 60
        rows.append([device, commit, dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}",
                     str(sweep), str(len(runs) - sweep), f"{minutes:.1f}",
                     str(sum(bool(r["resumed_at"]) for _, r in runs))])
    return rows


def trained_on_lines(rep: Reproduction) -> list[str]:
    """The summary page's section on what trained a GPU scale's runs, or that none has yet."""
    from blocklab.report.markdown import md_table

    rows = trained_on_rows(rep)
    if not rows:
        planned = planned_runs(rep, [r.claim for r in rep.results])
        return [f"Not yet run: no GPU has trained any of the {len(planned)} runs planned so far "
                f"(`python benchmarks/gpu_campaign.py status` estimates their GPU minutes)."]
    return [TRAINED_ON_TEXT, "", *md_table(TRAINED_ON_HEAD, rows)]


RUN_HEAD = ["run", "GPU", "commit", "date", "seconds", "resumed at step"]


def run_rows(rep: Reproduction) -> list[list[str]]:
    """The scale's own report: every finished run with what trained it."""
    runs = trained_on(rep)
    assert rep.out is not None or not runs
    return [[str(run.relative_to(rep.out)), r["device"], str(r["commit"]), r["date"],
             f"{r['wall_seconds']:.0f}", ", ".join(map(str, r["resumed_at"])) or "-"] for run, r in runs]
