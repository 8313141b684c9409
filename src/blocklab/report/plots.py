"""The report's figures: validation loss against step, tokens and time, validation loss relative to the
baseline (paired by seed, with the verdict's intervals), each architecture's learned scalars, with their
captions.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from blocklab.report.method import budget_kind_of
from blocklab.report.stats import WALL_FROM_LOGS_WARNING, WALL_FROM_TIMING, mean_sd, wall_clock_source
from blocklab.statistics import evidence
from blocklab.util.figures import agg_figure


def _val_curves(run: dict, x: str) -> tuple[list[float], list[float]]:
    """Validation loss against step, tokens or training wall-clock (evaluation time excluded).

    A validation row carries its own wall_time; runs written before it did are looked up in the
    train row of the same step, which exists only where the step is a multiple of log_every (NaN
    elsewhere, and the point is not drawn).
    """
    train_time = {r["step"]: r.get("wall_time", math.nan) for r in run["metrics"] if r["kind"] == "train"}
    vals = [r for r in run["metrics"] if r["kind"] == "val"]
    if x == "wall_time":
        xs = [r["wall_time"] if "wall_time" in r else train_time.get(r["step"], math.nan) for r in vals]
    else:
        xs = [r[x] for r in vals]
    return xs, [r["val_loss"] for r in vals]


def _colour(k: int) -> str:
    """The k-th architecture's colour, the same in every plot (the relative plot leaves out the baseline)."""
    return f"C{k % 10}"


VAL_PLOTS = (("step", "step"), ("tokens", "tokens"), ("wall_time", "training wall-clock (s)"))


def _plot_validation(entries, runs_by_label, out: Path, rows: list[dict] | None = None,
                     wall: str | None = "logs", trained: str = "one after another") -> list[Path | None]:
    """Validation loss against step, tokens and training wall-clock: the mean over seeds, with a band of
    ±1 standard deviation over seeds where there are two or more. The wall-clock axis follows `wall`
    (`wall_clock_source`; None: that figure is left out, its path None)."""
    step_s = {r["label"]: r["throughput"]["interleaved"]["median"] for r in rows or []
              if r["throughput"].get("interleaved")}
    paths: list[Path | None] = []
    for x, xlabel in VAL_PLOTS:
        if x == "wall_time" and wall is None:
            paths.append(None)
            continue
        fig, ax = agg_figure(6.4, 4.2)
        for k, entry in enumerate(entries):
            if x == "wall_time" and wall == "interleaved":
                curves = [_val_curves(run, "step") for run in runs_by_label[entry.label]]
                curves = [([step * step_s[entry.label] for step in xs], ys) for xs, ys in curves]
            else:
                curves = [_val_curves(run, x) for run in runs_by_label[entry.label]]
            n = min(len(c[1]) for c in curves)
            xs = [statistics.fmean(c[0][i] for c in curves) for i in range(n)]
            stats = [mean_sd([c[1][i] for c in curves]) for i in range(n)]
            ys = [m for m, _ in stats]
            ax.plot(xs, ys, marker="o", markersize=3, label=entry.label, color=_colour(k))
            if len(curves) > 1:
                sds = [sd or 0.0 for _, sd in stats]
                ax.fill_between(xs, [y - s for y, s in zip(ys, sds, strict=True)],
                                [y + s for y, s in zip(ys, sds, strict=True)], color=_colour(k), alpha=0.2,
                                linewidth=0)
        ax.set_xlabel(WALL_FROM_TIMING if x == "wall_time" and wall == "interleaved" else xlabel)
        if x == "wall_time" and wall == "logs":  # the caveat travels with the image
            ax.set_title(WALL_FROM_LOGS_WARNING.format(trained=trained), fontsize=8, color="C3", wrap=True)
        ax.set_ylabel("validation loss (nats/token)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"val_loss_vs_{x}.png"
        fig.savefig(path, dpi=110)
        paths.append(path)
    return paths


def _val_by_step(run: dict) -> dict[int, float]:
    """A run's validation loss at each evaluated step; its summary's final loss (what the verdict
    pairs) at its last step, where the run has a summary."""
    out = {r["step"]: r["val_loss"] for r in run["metrics"] if r["kind"] == "val"}
    summary = run.get("summary")
    if summary and summary.get("val_loss") is not None:
        out[summary["step"]] = summary["val_loss"]
    return out


def _by_seed(runs: list[dict]) -> dict[int, dict[int, float]]:
    """{seed: {step: validation loss}}; a run without a summary takes its place in the list as its seed."""
    return {(run.get("summary") or {}).get("seed", k): _val_by_step(run) for k, run in enumerate(runs)}


def _point(step: float, diffs: list[float]) -> dict[str, Any]:
    """One plotted point: the mean of the paired differences at `step`, with their 95% t-interval."""
    iv = evidence.t_interval(diffs)
    return {"step": step, "mean": iv.mean, "low": iv.low, "high": iv.high, "n": iv.n}


def relative_series(runs: list[dict], base: list[dict]) -> list[dict[str, Any]]:
    """Validation loss of `runs` minus that of `base` (the baseline's runs), paired by seed as the
    verdict pairs them: one point per evaluation step that every paired run reached before any of them
    ended, then the final point, each run's final loss minus its baseline seed's (the verdict's "loss -
    baseline"), at the architecture's mean final step (which differs from the baseline's only under an
    equal-FLOPs or wall-clock budget). Each point: step, mean, the 95% t-interval's low and high (None
    with one seed) and n. Empty where no seed is in common (the verdict does not compare those)."""
    mine, theirs = _by_seed(runs), _by_seed(base)
    pairs = [(mine[s], theirs[s]) for s in sorted(set(mine) & set(theirs)) if mine[s] and theirs[s]]
    if not pairs:
        return []
    end = min(min(max(a), max(b)) for a, b in pairs)
    shared = set.intersection(*(set(a) & set(b) for a, b in pairs))
    points = [_point(s, [a[s] - b[s] for a, b in pairs]) for s in sorted(shared) if s < end]
    final = statistics.fmean(max(a) for a, _ in pairs)  # a whole step unless seeds ended apart
    final = int(final) if final.is_integer() else final
    return points + [_point(final, [a[max(a)] - b[max(b)] for a, b in pairs])]


RELATIVE_YLABEL = "validation loss - {base}'s (nats/token), paired by seed"


def _plot_relative(entries, runs_by_label, out: Path) -> Path:
    """Validation loss minus the baseline's (the first entry) against step, paired by seed
    (`relative_series`): the mean over seeds with its 95% t-interval as a band, and the last point, the
    verdict's final difference, with its interval as an error bar. Writes relative_loss.png and the
    plotted numbers as relative_loss.json beside it (so they can be checked against the verdict and
    re-plotted); returns the PNG's path.

    Training loss smoothed with an exponential moving average, as Value Residual Fig. 7 draws it, was
    drawn here before; with a dozen logged points the average still carried the early gaps at the
    last step (about 3x the final differences), so the figure now shows what the report's verdict
    states, at every evaluation."""
    base_label = entries[0].label
    base = runs_by_label[base_label]
    data: dict[str, Any] = {"quantity": RELATIVE_YLABEL.format(base=base_label), "baseline": base_label,
                            "confidence": evidence.CONFIDENCE, "architectures": {}}
    fig, ax = agg_figure(6.4, 4.2)
    for k, entry in enumerate(entries[1:], start=1):
        series = relative_series(runs_by_label[entry.label], base)
        data["architectures"][entry.label] = series
        if series:  # error bars set apart by 1% of the run per architecture, so they do not overlap
            _draw_relative(ax, series, entry.label, _colour(k), dodge=0.01 * (k - len(entries) / 2))
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel(data["quantity"])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "relative_loss.png"
    fig.savefig(path, dpi=110)
    (out / "relative_loss.json").write_text(json.dumps(data, indent=2))
    return path


def _draw_relative(ax, series: list[dict[str, Any]], label: str, colour: str, dodge: float = 0.0) -> None:
    """One architecture's line, its interval band (where there are two or more seeds) and the final
    point's interval as an error bar, drawn `dodge` (a fraction of the last step) to the side."""
    xs, ys = [p["step"] for p in series], [p["mean"] for p in series]
    ax.plot(xs, ys, marker="o", markersize=3, label=label, color=colour)
    banded = [p for p in series if p["low"] is not None]
    if banded:
        ax.fill_between([p["step"] for p in banded], [p["low"] for p in banded], [p["high"] for p in banded],
                        color=colour, alpha=0.15, linewidth=0)
    last = series[-1]
    if last["low"] is not None:
        below, above = last["mean"] - last["low"], last["high"] - last["mean"]
        ax.errorbar([last["step"] * (1 + dodge)], [last["mean"]], yerr=[[below], [above]], color=colour,
                    capsize=4, linewidth=1.2)


def _plot_scalars(label: str, run: dict, out: Path) -> Path | None:
    """The learned scalars of the run's seed 0 (blocklab.analysis.plot_scalars: SAS gains per head,
    beta_V / alpha_V, ResFormer lambdas, BoV gamma_v, DenseFormer weights); None when it has none."""
    from blocklab.analysis import plot_scalars, scalar_series

    if not scalar_series(run["metrics"])["panels"]:
        return None
    path = out / f"scalars_{''.join(c if c.isalnum() else '_' for c in label)}.png"
    plot_scalars(run["dir"] / "metrics.jsonl", path, title=f"Learned scalars over training: {label}, seed 0")
    return path


def gain_product_note(model_cfg: dict[str, Any]) -> str | None:
    """A sentence for a block whose attention-branch gain beta_SA and MLP-skip gain alpha_FF are both
    trained but act only through their product; None for any other block.

    With no attention skip (SAS, V-SkipInit), the sequential Pre-LN layout gives h = beta_SA MHA(.),
    then out = alpha_FF h + beta_FF MLP(N2(h)). The MLP's input norm N2 is blind to the scale of h (up
    to its epsilon), so beta_SA reaches the output only in alpha_FF beta_SA: scaling one by c and the
    other by 1/c changes nothing. tests/report/test_report.py checks it on the built model."""
    mc = model_cfg
    if (mc.get("block_layout") == "pre-ln" and mc.get("attn_skip_gain") == 0
            and mc.get("trainable_block_gains") and mc.get("mlp_skip_gain")
            and mc.get("norm_layers") == "all" and mc.get("norm") != "none"):
        shaped = mc.get("attn_matrix") == "shaped"
        official = (" The official SAS code trains the same two gains; it is a redundancy of the "
                    "parameterisation, not of this implementation." if shaped else "")
        return ("Only the product of two panels matters: beta_SA (attention branch) and alpha_FF (MLP skip) "
                "enter the block's output only as alpha_FF x beta_SA, because the MLP's input norm cancels "
                "the scale beta_SA gives the attention output (scaling one by c and the other by 1/c leaves "
                "the model unchanged, up to the norm's epsilon), so read their product, not either gain "
                "alone." + official)
    return None


def relative_caption(base: str, n_seeds: int) -> str:
    """The relative-loss figure's caption: what is plotted, how it is paired, and where its last point
    is stated in the report."""
    spread = (f"the band is the 95% t-interval over the {n_seeds} paired seeds at each evaluation, and the "
              "last point's error bar is the interval of the verdict's \"95% CI (t)\" column"
              + (" (with two seeds Student's t quantile is 12.7, so it is wide)" if n_seeds == 2 else "")
              if n_seeds > 1 else
              "one seed, so no interval: a gap smaller than the seed-to-seed spread is not a difference")
    return (f"Validation loss minus `{base}`'s (nats per token, the same held-out windows for every run), "
            f"paired by seed and averaged over seeds, at every evaluation; below 0 is better than `{base}`. "
            f"The last point is each architecture's final loss minus `{base}`'s, the verdict's \"loss - "
            f"baseline\"; {spread}. Nothing is smoothed. Under an equal-FLOPs or wall-clock budget the runs "
            "end at different steps: the earlier points compare equal steps, the last compares the final "
            "evaluations, as the verdict does. The plotted numbers are in relative_loss.json.")


def report_figures(entries, runs_by_label, rows, ev: dict[str, Any], out: Path,
                   trained: str = "one after another") -> list[tuple[Path, str, str]]:
    """Every figure with its alt text and a caption saying what it shows and what to look for."""
    n_seeds = rows[0]["seeds"]
    bands = (f"lines are the mean over {n_seeds} seeds, bands ±1 s.d. over seeds" if n_seeds > 1
             else "one seed, so no band: a gap smaller than the seed-to-seed spread is not a difference")
    start = ("curves start at step 0, the initial model's loss" if ev["step0"] else
             f"the first evaluation is at step {ev['first_step']} (no step-0 evaluation is logged), so the "
             "curves start there")
    wall = wall_clock_source(rows, budget_kind_of(runs_by_label[entries[0].label][0]["cfg"]))
    val = _plot_validation(entries, runs_by_label, out, rows, wall, trained)
    by_step, by_tokens, by_time = val  # by_time is None exactly when wall is
    assert by_step is not None and by_tokens is not None
    figs: list[tuple[Path, str, str]] = [
        (by_step, "validation loss against step",
         f"Validation loss (nats per token, the same held-out windows for every run) against training step; "
         f"lower is better; {bands}; {start}."),
        (by_tokens, "validation loss against tokens",
         f"Validation loss against training tokens; lower is better; {bands}. At equal steps this is the "
         "step plot rescaled; at equal FLOPs a cheaper block reaches further right."),
    ]
    if wall == "interleaved" and by_time is not None:
        figs.append((by_time, "validation loss against training time at the interleaved speed",
                     f"Validation loss against the training time each run would take at its architecture's "
                     f"median step time in the interleaved timing pass (step x median step time; evaluation "
                     f"excluded); lower and further left is better; {bands}. The runs' own clocks are not "
                     "used: they trained " + trained + ", and a change in the machine's load between them "
                     "would move this axis."))
    elif wall == "logs" and by_time is not None:
        figs.append((by_time, "validation loss against training wall-clock",
                     f"Validation loss against seconds of training from the runs' own logs (evaluation "
                     f"excluded); lower and further left is better; {bands}. The runs trained {trained}, so "
                     "if the machine's load changed between them this axis is not comparable between "
                     "architectures (the warning on the figure says so): check the throughput section."))
    if len(entries) > 1:
        base = entries[0].label
        figs.append((_plot_relative(entries, runs_by_label, out), f"validation loss relative to {base}",
                     relative_caption(base, n_seeds)))
    for entry in entries:
        run = runs_by_label[entry.label][0]  # seed 0
        path = _plot_scalars(entry.label, run, out)
        if path is None:
            continue
        caption = (f"The learned scalar gains of `{entry.label}` (seed 0) against step: one panel per kind "
                   "of gain, one line per layer (head-wise gains: the mean over heads with a ±1 s.d. band, "
                   "then one line per head). Look at how far each gain moves from its initial value and "
                   "whether the layers differ.")
        note = gain_product_note(run["model_config"])
        if note:
            caption += " " + note
        figs.append((path, f"learned scalars of {entry.label}", caption))
    return figs
