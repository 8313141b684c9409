"""The report's statistics: mean and spread over seeds, step times and throughput, one row per
architecture, and the warnings the figures call for (a busy machine, a run left on the plateau).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from blocklab.report.data import kv_cache_bytes_per_token
from blocklab.report.method import plural
from blocklab.statistics.plateau import LATE_EXIT, NEAR_PLATEAU, run_health, spread_warnings

# When the architectures' speed ratios measured during training (one run after another) and in the
# interleaved timing pass differ by more than this fraction, the machine's load changed between runs
# and the report says so.
LOAD_DISAGREEMENT = 0.15


# A coefficient of variation of step times above this, within one run or in the timing pass, says the
# machine was busy while it was measured (on an idle machine it is a few percent).
BUSY_CV = 0.25


def mean_sd(xs: list[float | None]) -> tuple[float, float | None]:
    """(mean, sample standard deviation) of the values given; the deviation is None for one value,
    which has no spread, and both are NaN for none."""
    given = [x for x in xs if x is not None]
    if not given:
        return float("nan"), None
    return statistics.fmean(given), (statistics.stdev(given) if len(given) > 1 else None)


def spread(xs: list[float]) -> dict[str, Any] | None:
    """Median, quartiles, min, max, count and coefficient of variation (sd / mean) of `xs`."""
    xs = sorted(x for x in xs if x is not None and math.isfinite(x))
    if not xs:
        return None
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else (xs[0],) * 3
    mean = statistics.fmean(xs)
    cv = statistics.stdev(xs) / mean if len(xs) > 1 and mean > 0 else None
    return {"median": statistics.median(xs), "q1": q1, "q3": q3, "min": xs[0], "max": xs[-1],
            "n": len(xs), "cv": cv}


def training_step_times(metrics: list[dict[str, Any]]) -> list[float]:
    """Seconds per step during training, one value per logged window of `log_every` steps: the
    difference of the training clock (`wall_time`, steps only: evaluation and checkpoints excluded)
    between consecutive train rows over the steps between them. The first window, which holds the
    first step's one-off allocations (and a compile), is left out when three or more remain."""
    rows = [r for r in metrics if r.get("kind") == "train" and r.get("wall_time") is not None]
    times, prev_step, prev_time = [], 0, 0.0
    for r in rows:
        if r["step"] > prev_step:
            times.append((r["wall_time"] - prev_time) / (r["step"] - prev_step))
        prev_step, prev_time = r["step"], r["wall_time"]
    return times[1:] if len(times) >= 4 else times


def _throughput(runs: list[dict], measured: dict[str, Any] | None, tokens_per_step: int) -> dict[str, Any]:
    """The speed figures of one architecture: the interleaved pass's step times (None without one), the
    in-training step times of every seed pooled, each run's coefficient of variation, and the mean of
    the runs' own tokens/s (summary.json)."""
    per_run = [training_step_times(r["metrics"]) for r in runs]
    in_training = spread([t for times in per_run for t in times])
    if in_training is not None:
        in_training["tokens_per_s"] = spread([tokens_per_step / t for times in per_run for t in times
                                              if t > 0])
        in_training["cv_per_run"] = {f"seed {r['summary']['seed']}": (spread(t) or {}).get("cv")
                                     for r, t in zip(runs, per_run, strict=True)}
    timed = (measured or {}).get("step_s") or []
    interleaved = spread(timed)
    if interleaved is not None:
        interleaved["tokens_per_s"] = spread([tokens_per_step / t for t in timed if t > 0])
    # a resumed run's summary tokens/s mixes the load of its starts: kept, and marked as such
    resumed = {f"seed {r['summary']['seed']}": r["summary"]["resumed_at"] for r in runs
               if r["summary"].get("resumed_at")}
    return {"tokens_per_step": tokens_per_step, "interleaved": interleaved, "in_training": in_training,
            "tokens_per_s_summary": list(mean_sd([r["summary"].get("tokens_per_s") for r in runs])),
            "resumed": resumed}


def architecture_rows(entries, runs_by_label, measured: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    archs = (measured or {}).get("architectures", {})
    rows = []
    for entry in entries:
        runs = runs_by_label[entry.label]
        s0, cfg = runs[0]["summary"], runs[0]["cfg"]
        memory = dict(archs.get(entry.label, {}).get("memory") or {})
        memory["process_peak_mib"] = list(mean_sd([r["summary"].get("peak_memory_mib") for r in runs]))
        memory["process_peak_kind"] = "cuda-allocated" if str(s0["device"]).startswith("cuda") else "rss"
        rows.append({
            "label": entry.label, "arch": entry.arch, "seeds": len(runs), "lr": cfg.optim.lr,
            "params": s0["params"], "flops_per_token": s0["flops_per_token"], "steps": s0["step"],
            "tokens": s0["tokens"],
            "steps_per_seed": [r["summary"]["step"] for r in runs],
            "tokens_per_seed": [r["summary"]["tokens"] for r in runs],
            "val_loss": list(mean_sd([r["summary"]["val_loss"] for r in runs])),
            "val_bpb": list(mean_sd([r["summary"]["val_bpb"] for r in runs])),
            "throughput": _throughput(runs, archs.get(entry.label), cfg.batch_size * cfg.seq_len),
            "memory": memory,
            "kv_bytes_per_token": kv_cache_bytes_per_token(runs[0]["model_config"]), "device": s0["device"],
            "plateau": [{"seed": r["summary"]["seed"], "final": r["summary"]["val_loss"], **run_health(
                [(m["step"], m["val_loss"]) for m in r["metrics"] if m["kind"] == "val"],
                r["summary"].get("unigram_loss"), r["summary"]["step"])} for r in runs],
        })
    return rows


WALL_FROM_TIMING = "training time at the interleaved speed (s): step x median step time"


WALL_FROM_LOGS_WARNING = ("from the runs' own logs, trained {trained}: a change in the machine's load "
                          "between runs shifts this axis")


def wall_clock_source(rows: list[dict], budget_kind: str) -> str | None:
    """Where the wall-clock figure's axis comes from: "interleaved" (each architecture's steps at its
    median step time in the interleaved timing pass, which every load change hits alike), "logs" (the
    runs' own clocks, drawn with a warning on the figure: no timing pass, or a wall-clock budget, whose
    runs' clocks are the budget itself), or None to leave the figure out (the timing pass, or the runs
    without one, saw step times too uneven to mean anything: coefficient of variation above BUSY_CV)."""
    timed = [r["throughput"].get("interleaved") for r in rows]
    if budget_kind != "time" and all(timed):
        return "interleaved" if all((t["cv"] or 0) <= BUSY_CV for t in timed) else None
    in_training = [cv for r in rows for cv in ((r["throughput"].get("in_training") or {}).get("cv_per_run")
                                              or {}).values()]
    return None if any((cv or 0) > BUSY_CV for cv in in_training) else "logs"


def speeds(rows: list[dict], which: str) -> list[float | None]:
    """Each architecture's speed relative to the first (the first's median step time over its own):
    above 1 is faster. `which`: "interleaved" or "in_training"."""
    medians = [(r["throughput"][which] or {}).get("median") for r in rows]
    base = medians[0]
    return [None if m is None or not base else base / m for m in medians]


def baseline_warnings(rows: list[dict]) -> list[str]:
    """Runs that left the unigram plateau late or ended near it, and differences to the first
    architecture no larger than the seed spread: where the comparison measures noise or timing."""
    out = []
    late = [f"`{r['label']}` seed {h['seed']} ("
            + ("never in " if h["exit_step"] is None else f"step {h['exit_step']:,} of ") + f"{r['steps']:,})"
            for r in rows for h in r["plateau"] if h["late"]]
    if late:
        out.append(f"{plural(len(late), 'run')} left the unigram plateau late (after {LATE_EXIT:.0%} of the "
                   f"budget) or never: {', '.join(late)}. Their final losses say more about when they left "
                   "it than about the architecture; look at the validation curves, and try a longer budget "
                   "or another learning rate.")
    near = [f"`{r['label']}` seed {h['seed']} ({h['below']:.2f} nats below)"
            for r in rows for h in r["plateau"] if h["near"]]
    if near:
        out.append(f"{plural(len(near), 'run')} ended within {NEAR_PLATEAU:g} nats of the unigram plateau: "
                   f"{', '.join(near)}. Such a model has learned little beyond token frequencies.")
    noisy = spread_warnings({r["label"]: {h["seed"]: h["final"] for h in r["plateau"]} for r in rows})
    if noisy:
        out.append("The seed spread is as large as the difference: " + "; ".join(noisy) +
                   ". Those differences cannot be told from noise at this number of seeds.")
    return out


def load_warnings(rows: list[dict], budget_kind: str, trained: str = "one after another") -> list[str]:
    """What the step times say about the machine's load: the architectures' speed ratios in training
    (one run after another) against those of the interleaved pass, and the spread of step times within
    each run and in the pass itself."""
    out = []
    first = rows[0]["label"]
    if all(r["throughput"]["interleaved"] for r in rows):
        fast_i, fast_t = speeds(rows, "interleaved"), speeds(rows, "in_training")
        off = [(r["label"], t, i) for r, t, i in zip(rows, fast_t, fast_i, strict=True)
               if t is not None and i and abs(t / i - 1) > LOAD_DISAGREEMENT]
        if off:
            which = "; ".join(f"`{label}` {t:.2f}x in training against {i:.2f}x interleaved"
                              for label, t, i in off)
            out.append(
                f"Speed relative to `{first}` disagrees by more than {LOAD_DISAGREEMENT:.0%} between "
                f"training and the interleaved timing pass ({which}): the machine's load changed while the "
                f"runs trained {trained}. The in-training tokens/s and the wall-clock plot are not "
                "comparable between architectures; the interleaved figures of the throughput table are."
                + (" With a wall-clock budget the number of steps each run got depended on that load too, so "
                   "the losses are not on an equal footing either." if budget_kind == "time" else ""))
        busy = [(r["label"], r["throughput"]["interleaved"]["cv"]) for r in rows
                if (r["throughput"]["interleaved"]["cv"] or 0) > BUSY_CV]
        if busy:
            out.append(f"The timing pass itself saw varying step times (coefficient of variation "
                       f"{', '.join(f'{cv:.2f} for `{label}`' for label, cv in busy)}, above {BUSY_CV}): "
                       "another process was competing for the machine, so even the interleaved figures are "
                       "approximate; rerun on an idle machine, or with `threads=` a share of the cores.")
    runs = [(r["label"], seed, cv) for r in rows for seed, cv in
            ((r["throughput"]["in_training"] or {}).get("cv_per_run") or {}).items() if (cv or 0) > BUSY_CV]
    if runs:
        worst = max(runs, key=lambda x: x[2])
        out.append(f"Step times varied within {plural(len(runs), 'run')} (coefficient of variation up to "
                   f"{worst[2]:.2f}, `{worst[0]}` {worst[1]}; above {BUSY_CV}): the machine was busy while "
                   "they trained, so their in-training tokens/s and wall-clock curves are uncertain.")
    return out
