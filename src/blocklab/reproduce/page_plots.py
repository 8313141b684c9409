"""The reproduction report's figures: each claim's paired differences with their intervals, and its
validation curves.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from blocklab.reproduce import (
    CheckResult,
    ClaimResult,
)
from blocklab.util.figures import agg_figure


def differences_figure(result: ClaimResult, path: Path) -> Path | None:
    """Per-seed differences (dots) and the t-interval (bar) of each measured check."""
    measured = [r for r in result.checks if r.interval is not None]
    if not measured:
        return None
    from matplotlib.ticker import MaxNLocator

    fig, ax = agg_figure(6.4, 0.9 + 0.55 * len(measured))
    for row, r in enumerate(reversed(measured)):
        iv = r.interval
        ax.scatter(iv.values, [row] * iv.n, color="C0", s=18, zorder=3)
        if iv.low is not None:
            ax.plot([iv.low, iv.high], [row, row], color="C3", linewidth=3, alpha=0.7)
        ax.scatter([iv.mean], [row], color="C3", marker="|", s=200, zorder=4)
        if r.check.tolerance:
            for t in {"within": (-r.check.tolerance, r.check.tolerance)}.get(
                r.check.relation, (r.check.tolerance,)
            ):
                ax.plot([t, t], [row - 0.3, row + 0.3], color="grey", linestyle=":")
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.xaxis.set_major_locator(MaxNLocator(6))
    ax.set_yticks(range(len(measured)), [_short(r) for r in reversed(measured)], fontsize=8)
    ax.set_xlabel("difference (dots: seeds; bar: 95% t-interval)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _short(r: CheckResult) -> str:
    c = r.check
    return (
        f"{c.metric}: {c.arch}"
        + (f" - {c.baseline}" if c.baseline else "")
        + (f" ({c.setting})" if c.setting != "steps" or c.minus_setting else "")
    )


def curves_figure(result: ClaimResult, runs: dict, path: Path) -> Path | None:
    """Validation loss against step for the archs of the claim's loss checks, mean over seeds, with
    the seeds' range as a band."""
    from blocklab.training.metrics import read_metrics

    checks = [r.check for r in result.checks if r.check.metric in ("val_loss", "val_bpb")]
    if not checks:
        return None
    settings = list(dict.fromkeys(s for c in checks for s in (c.setting, c.minus_setting) if s))
    fig, axes = agg_figure(6.4 * len(settings), 4.2, 1, len(settings), squeeze=False)
    drawn = False
    for ax, setting in zip(axes[0], settings, strict=True):
        archs = list(dict.fromkeys(a for c in checks for a in (c.baseline, c.arch) if a))
        for k, arch in enumerate(archs):
            curves = [
                [(r["step"], r["val_loss"]) for r in read_metrics(Path(cfg.out_dir) / "metrics.jsonl", "val")]
                for e, cfg in runs.get(setting, [])
                if e.label == arch and (Path(cfg.out_dir) / "metrics.jsonl").is_file()
            ]
            if not curves:
                continue
            drawn = True
            n = min(len(c) for c in curves)
            steps = [curves[0][i][0] for i in range(n)]
            ys = [[c[i][1] for c in curves] for i in range(n)]
            ax.plot(
                steps, [statistics.fmean(y) for y in ys], marker="o", markersize=3, label=arch, color=f"C{k}"
            )
            ax.fill_between(steps, [min(y) for y in ys], [max(y) for y in ys], color=f"C{k}", alpha=0.15)
        ax.set_title(f"setting: {setting}", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel("validation loss (nats/token)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if not drawn:  # no run of the claim has finished (reproduce --partial)
        return None
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path
