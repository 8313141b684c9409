"""`blocklab plot RUN [RUN ...]`: the learning curves of any runs, overlaid, without a compare.

Each run directory's `metrics.jsonl` gives its validation loss and bits per byte at every evaluation,
against four axes: step, tokens, training FLOPs (tokens x the model's analytic FLOPs per token) and
training wall-clock (the run's own clock, evaluation excluded). A finished run or one still training
both plot (the latter up to its last evaluation). Writes one PNG per axis (loss above, bits per byte
below) and plot.md / plot.html with a table of the runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from blocklab.util.errors import ConfigError
from blocklab.util.figures import agg_figure

AXES = (("step", "step"), ("tokens", "tokens"), ("flops", "training FLOPs"),
        ("wall_time", "training wall-clock from the run's log (s)"))
TITLE = "blocklab plot"
# the files plot_runs writes, and how each shows that blocklab plot wrote it (`blocklab.report.owned`)
PLOT_FILES: dict[str, str | None] = {"plot.md": f"# {TITLE}\n", "plot.html": f"<h1>{TITLE}</h1>",
                                     **{f"loss_vs_{key}.png": None for key, _ in AXES}}


def _flops_per_token(run: Path) -> float:
    """From summary.json, else the run's model built on the meta device (a run still training)."""
    summary = run / "summary.json"
    if summary.is_file():
        return float(json.loads(summary.read_text())["flops_per_token"])
    import torch

    from blocklab.accounting import flops_per_token
    from blocklab.model.config import ModelConfig
    from blocklab.runtime import LanguageModel

    with torch.device("meta"):
        model = LanguageModel(ModelConfig.from_dict(json.loads((run / "model_config.json").read_text())))
    return float(flops_per_token(model))


def load_run(path: str | Path) -> dict[str, Any]:
    """A run's validation curve and facts; a clear error for a folder that is not a run."""
    from blocklab.training.metrics import read_metrics

    run = Path(path)
    if not (run / "metrics.jsonl").is_file():
        raise ConfigError(f"{run} is not a run directory: it has no metrics.jsonl (give the --out folder of "
                          "`blocklab train`, or a compare's runs/<arch>-seed<k>).")
    try:
        rows = read_metrics(run / "metrics.jsonl", "val")
    except ValueError as err:
        raise ConfigError(f"cannot plot {run}: {err}") from None
    if not rows:
        raise ConfigError(f"{run} has no validation row yet: nothing to plot (its first evaluation is at "
                          "step eval_every).")
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else None
    config = {}
    if (run / "config.yaml").is_file():
        from blocklab.training.config import read_yaml

        config = read_yaml(run / "config.yaml")
    per_token = _flops_per_token(run)
    return {"dir": run, "summary": summary, "arch": config.get("arch", "?"), "seed": config.get("seed"),
            "curve": [{"step": r["step"], "tokens": r["tokens"], "flops": r["tokens"] * per_token,
                       "wall_time": r.get("wall_time"), "val_loss": r["val_loss"],
                       "val_bpb": r.get("val_bpb")} for r in rows]}


def labels(runs: list[dict[str, Any]]) -> list[str]:
    """A short unique name per run: its folder, with as many parent folders as it takes."""
    depth = 1
    while True:
        names = ["/".join(r["dir"].resolve().parts[-depth:]) for r in runs]
        if len(set(names)) == len(names) or depth > 8:
            return names
        depth += 1


def plot_runs(paths: list[str | Path], out: str | Path, overwrite: bool = False) -> Path:
    """Overlay the runs' curves; writes OUT/loss_vs_<axis>.png, OUT/plot.md and OUT/plot.html and
    returns plot.md. Files of those names in OUT that blocklab did not write are refused by name unless
    `overwrite` (`blocklab.report.owned`)."""
    from blocklab.report import render_html, render_markdown
    from blocklab.report.owned import check_owned, record_written

    if not paths:
        raise ConfigError("blocklab plot needs at least one run directory.")
    check_owned(Path(out), PLOT_FILES, "plot.md", overwrite, "--out", "plot")
    runs = [load_run(p) for p in paths]
    names = labels(runs)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    intro = (f"Validation loss and bits per byte of {len(runs)} run(s), overlaid: each run's own held-out "
             "windows (the same ones only where the runs share data, tokenizer, batch shape and "
             "eval_batches).")
    blocks: list[tuple] = [("p", intro)]
    head = ["run", "architecture", "seed", "steps", "tokens", "final val loss", "val bits/byte", "state"]
    table = []
    for name, r in zip(names, runs, strict=True):
        last = r["curve"][-1]
        s = r["summary"]
        state = "finished" if s else "not finished (last evaluation)"
        if s and s.get("resumed_at"):
            state += f", resumed at step {', '.join(map(str, s['resumed_at']))}"
        bpb = "-" if last["val_bpb"] is None else f"{last['val_bpb']:.4f}"
        table.append([name, r["arch"], str(r["seed"]), f"{last['step']:,}", f"{last['tokens']:,}",
                      f"{last['val_loss']:.4f}", bpb, state])
    blocks += [("table", head, table)]
    for key, axis in AXES:
        fig, (loss_ax, bpb_ax) = agg_figure(6.4, 6.4, 2, 1, sharex=True)
        for k, (name, r) in enumerate(zip(names, runs, strict=True)):
            points = [p for p in r["curve"] if p[key] is not None]
            xs = [p[key] for p in points]
            loss_ax.plot(xs, [p["val_loss"] for p in points], marker="o", markersize=3, label=name,
                         color=f"C{k % 10}")
            bpb = [(x, p["val_bpb"]) for x, p in zip(xs, points, strict=True) if p["val_bpb"] is not None]
            if bpb:
                bpb_ax.plot(*zip(*bpb, strict=True), marker="o", markersize=3, color=f"C{k % 10}")
        loss_ax.set_ylabel("validation loss (nats/token)")
        bpb_ax.set_ylabel("validation bits/byte")
        bpb_ax.set_xlabel(axis)
        for ax in (loss_ax, bpb_ax):
            ax.grid(alpha=0.3)
        loss_ax.legend(fontsize=7)
        if key == "wall_time":
            loss_ax.set_title("each run's own clock: runs on other machines or under other load differ",
                              fontsize=8, color="C3")
        fig.tight_layout()
        path = out / f"loss_vs_{key}.png"
        fig.savefig(path, dpi=110)
        blocks.append(("figure", path, f"validation loss against {axis}",
                       f"Validation loss (top) and bits per byte (bottom) against {axis}; lower is better."))
    (out / "plot.md").write_text(render_markdown(TITLE, blocks))
    (out / "plot.html").write_text(render_html(TITLE, blocks))
    record_written(out, [out / name for name in PLOT_FILES])
    return out / "plot.md"
