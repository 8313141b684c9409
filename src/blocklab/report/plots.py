"""The report's figures: validation loss against step, tokens and time, training loss relative to the
baseline, each architecture's learned scalars, with their captions.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from blocklab.report.method import budget_kind_of
from blocklab.report.stats import WALL_FROM_LOGS_WARNING, WALL_FROM_TIMING, mean_sd, wall_clock_source


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


def _ema(values: list[float], beta: float = 0.9) -> list[float]:
    out, avg = [], None
    for v in values:
        avg = v if avg is None else beta * avg + (1 - beta) * v
        out.append(avg)
    return out


def _colour(k: int) -> str:
    """The k-th architecture's colour, the same in every plot (the relative plot leaves out the baseline)."""
    return f"C{k % 10}"


VAL_PLOTS = (("step", "step"), ("tokens", "tokens"), ("wall_time", "training wall-clock (s)"))


def _plot_validation(entries, runs_by_label, out: Path, rows: list[dict] | None = None,
                     wall: str | None = "logs", trained: str = "one after another") -> list[Path | None]:
    """Validation loss against step, tokens and training wall-clock: the mean over seeds, with a band of
    ±1 standard deviation over seeds where there are two or more. The wall-clock axis follows `wall`
    (`wall_clock_source`; None: that figure is left out, its path None)."""
    import matplotlib.pyplot as plt

    step_s = {r["label"]: r["throughput"]["interleaved"]["median"] for r in rows or []
              if r["throughput"].get("interleaved")}
    paths: list[Path | None] = []
    for x, xlabel in VAL_PLOTS:
        if x == "wall_time" and wall is None:
            paths.append(None)
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
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
        plt.close(fig)
        paths.append(path)
    return paths


def _plot_relative(entries, runs_by_label, out: Path) -> Path:
    """Smoothed training loss minus the baseline's (the first entry), as in Value Residual Fig. 7."""
    import matplotlib.pyplot as plt

    def curve(label):
        runs = runs_by_label[label]
        per_run = [{r["step"]: r["loss"] for r in run["metrics"] if r["kind"] == "train" and "loss" in r}
                   for run in runs]
        steps = sorted(set.intersection(*(set(p) for p in per_run)))
        return steps, _ema([statistics.fmean(p[s] for p in per_run) for s in steps])

    base_steps, base = curve(entries[0].label)
    base_at = dict(zip(base_steps, base, strict=False))
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for k, entry in enumerate(entries[1:], start=1):
        steps, losses = curve(entry.label)
        pairs = [(s, loss - base_at[s]) for s, loss in zip(steps, losses, strict=False) if s in base_at]
        if pairs:
            ax.plot(*zip(*pairs, strict=False), label=entry.label, color=_colour(k))
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel(f"smoothed training loss - {entries[0].label}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "relative_loss.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
    other by 1/c changes nothing. tests/test_report.py checks it on the built model."""
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
    figs = [
        (val[0], "validation loss against step",
         f"Validation loss (nats per token, the same held-out windows for every run) against training step; "
         f"lower is better; {bands}; {start}."),
        (val[1], "validation loss against tokens",
         f"Validation loss against training tokens; lower is better; {bands}. At equal steps this is the "
         "step plot rescaled; at equal FLOPs a cheaper block reaches further right."),
    ]
    if wall == "interleaved":
        figs.append((val[2], "validation loss against training time at the interleaved speed",
                     f"Validation loss against the training time each run would take at its architecture's "
                     f"median step time in the interleaved timing pass (step x median step time; evaluation "
                     f"excluded); lower and further left is better; {bands}. The runs' own clocks are not "
                     "used: they trained " + trained + ", and a change in the machine's load between them "
                     "would move this axis."))
    elif wall == "logs":
        figs.append((val[2], "validation loss against training wall-clock",
                     f"Validation loss against seconds of training from the runs' own logs (evaluation "
                     f"excluded); lower and further left is better; {bands}. The runs trained {trained}, so "
                     "if the machine's load changed between them this axis is not comparable between "
                     "architectures (the warning on the figure says so): check the throughput section."))
    if len(entries) > 1:
        base = entries[0].label
        figs.append((_plot_relative(entries, runs_by_label, out), f"training loss relative to {base}",
                     f"Training loss minus `{base}`'s at the same step, mean over seeds, smoothed with an "
                     "exponential moving average (0.9) as in Value Residual Learning Fig. 7; below 0 is "
                     "better than the baseline. Training loss is measured on the training batches, which "
                     "every run shares; the smoothing lags the raw curve by about ten logged steps."))
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
