"""The reproduction report: a verdict per claim with its intervals and plots, as markdown and HTML."""

from __future__ import annotations

import base64
import html
import json
import math
import os
import platform
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from blocklab import evidence
from blocklab.report import html_table, md_table
from blocklab.reproduce import CheckResult, ClaimResult, Reproduction

RELATION_WORDS = {
    "lower": "< 0",
    "higher": "> 0",
    "within": "within ±{tol}",
    "at_most": "≤ {tol}",
    "equals": "= {expected}",
}


def machine() -> dict[str, Any]:
    """What ran the runs: CPU, threads, versions, commit and date."""
    import subprocess

    import torch

    import blocklab

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                cwd=Path(__file__).parent,
                timeout=10,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "blocklab": blocklab.__version__,
        "python": platform.python_version(),
        "commit": commit,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _relation(result: CheckResult) -> str:
    c = result.check
    return RELATION_WORDS[c.relation].format(tol=f"{c.tolerance:g}", expected=c.expected)


def _cells(result: CheckResult) -> list[str]:
    if result.interval is not None:
        iv = result.interval
        seeds = ", ".join(f"{v:+.4f}" for v in iv.values)
        ci = "-" if iv.low is None else f"[{iv.low:+.4f}, {iv.high:+.4f}]"
        return [result.describe(), seeds, f"{iv.mean:+.4f}", ci, _relation(result), result.verdict]
    value = f"{result.value:,.6g}"
    ref = f"{result.reference:,.6g}"
    what = (
        "ratio to " + result.check.baseline
        if result.check.relation == "equals" and result.check.baseline
        else "value"
    )
    return [
        result.describe(),
        f"{what} {value} (reference {ref})",
        "exact",
        "-",
        _relation(result),
        result.verdict,
    ]


HEAD = ["check", "per seed", "mean", "95% CI (t)", "expected", "verdict"]


def _forest(result: ClaimResult, path: Path) -> Path | None:
    """Per-seed differences (dots) and the t-interval (bar) of each measured check."""
    measured = [r for r in result.checks if r.interval is not None]
    if not measured:
        return None
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6.4, 0.9 + 0.55 * len(measured)))
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
    plt.close(fig)
    return path


def _short(r: CheckResult) -> str:
    c = r.check
    return (
        f"{c.metric}: {c.arch}"
        + (f" - {c.baseline}" if c.baseline else "")
        + (f" ({c.setting})" if c.setting != "steps" or c.minus_setting else "")
    )


def _curves(result: ClaimResult, runs: dict, path: Path) -> Path | None:
    """Validation loss against step for the archs of the claim's loss checks, mean over seeds, with
    the seeds' range as a band."""
    from blocklab.training.metrics import read_metrics

    checks = [r.check for r in result.checks if r.check.metric in ("val_loss", "val_bpb")]
    if not checks:
        return None
    import matplotlib.pyplot as plt

    settings = list(dict.fromkeys(s for c in checks for s in (c.setting, c.minus_setting) if s))
    fig, axes = plt.subplots(1, len(settings), figsize=(6.4 * len(settings), 4.2), squeeze=False)
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
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _optimizers(runs: dict[str, list]) -> str:
    """The optimiser settings the runs trained with, as the compare report words them, and whether
    they are the main job's recipe (`recipes.recipe_optim`)."""
    from blocklab.report import follows_recipe, optimizer_text

    configs = [(entry, cfg) for group in runs.values() for entry, cfg in group]
    kinds = sorted({f"{optimizer_text(cfg)}; peak lr {cfg.optim.lr:g}" for _, cfg in configs})
    recipe = all(follows_recipe(entry.arch, cfg) for entry, cfg in configs)
    return ("Optimiser: " + " | ".join(kinds) + (" (the main job's recipe for the size and each "
            "architecture, recipes/main_job_optim.json)." if recipe else "."))


def _threads(launch: dict[str, Any] | None, info: dict[str, Any]) -> str:
    """How the runs shared the machine: N at a time on T threads each, or torch's default threads."""
    from blocklab.report import how_runs_trained, plural

    if not launch or (launch["jobs"] == 1 and launch["launcher"] == "local"):
        return f"{info['torch_threads']} torch threads"
    return f"runs trained {how_runs_trained({'launch': launch})}" + (
        f", {plural(launch['threads'], 'thread')} each" if launch.get("threads") else "")


def write_reproduction(rep: Reproduction, out: str | Path) -> Path:
    """Write OUT/reproduction.md, .html and .json (figures in OUT/<scale>-figures/); returns the .md."""
    from blocklab.claims import PAPERS

    results, scale, scale_name, runs, wall_seconds = (
        rep.results,
        rep.scale,
        rep.scale_name,
        rep.runs,
        rep.seconds,
    )
    out = Path(out)
    figures = out / f"{scale_name}-figures"
    figures.mkdir(parents=True, exist_ok=True)
    info = machine()
    n_runs = sum(len(v) for v in runs.values())
    method = (
        f"Scale `{scale_name}`: {scale.description}. {_optimizers(runs)} "
        f"{n_runs} training runs. Runs are paired by seed: every architecture of a seed sees the same "
        "batches and is validated on the same held-out windows. For each measured check, the per-seed "
        "differences to the baseline, their mean and a 95% Student t-interval (mean ± t_{0.975,n-1} s/√n, "
        "assuming normal, independent differences). Verdict: reproduced when the interval lies on the "
        "claimed side (or inside the tolerance), contradicted when it lies on the other side, "
        f"inconclusive otherwise or with fewer than {evidence.MIN_SEEDS} seeds. Exact quantities "
        "(parameters, FLOPs per token, cache bytes) are compared directly. "
        f"Machine: {info['cpu']}, {info['cores']} cores, {_threads(rep.launch, info)}; "
        f"torch {info['torch']}, blocklab {info['blocklab']}"
        f"{' at ' + info['commit'] if info['commit'] else ''}; {info['date']}"
        f"{f'; reproduce took {wall_seconds / 60:.1f} min' if wall_seconds else ''}."
    )
    summary = [
        [r.claim.id, PAPERS[r.claim.paper].split(" (")[0], r.claim.where, r.claim.statement, r.verdict]
        for r in results
    ]
    counts = {v: sum(r.verdict == v for r in results) for v in evidence.VERDICTS}
    md = [
        f"# blocklab reproduce: {scale_name}",
        "",
        method,
        "",
        "## Verdicts",
        "",
        ", ".join(f"{n} {v}" for v, n in counts.items()) + ".",
        "",
    ]
    md += md_table(["claim", "paper", "where", "claim", "verdict"], summary)
    sections_html = []
    record = []
    for r in results:
        c = r.claim
        rows = [_cells(k) for k in r.checks]
        images = [
            p
            for p in (
                _forest(r, figures / f"{c.id}-differences.png"),
                _curves(r, runs, figures / f"{c.id}-curves.png"),
            )
            if p is not None
        ]
        md += [
            "",
            f"## {c.id}: {r.verdict}",
            "",
            f"**{PAPERS[c.paper]}, {c.where}.** {c.statement}",
            "",
            f"*The paper:* {c.paper_result}.",
            "",
            "*Here:*",
            "",
        ]
        md += md_table(HEAD, rows)
        if c.notes:
            md += ["", f"Note: {c.notes}"]
        md += [""] + [f"![{p.stem}]({figures.name}/{p.name})" for p in images]
        imgs = "".join(
            f'<figure><img alt="{html.escape(p.stem)}" src="data:image/png;base64,'
            f'{base64.b64encode(p.read_bytes()).decode()}"></figure>'
            for p in images
        )
        sections_html.append(
            f"<h2>{html.escape(c.id)}: {html.escape(r.verdict)}</h2><p><b>{html.escape(PAPERS[c.paper])}, "
            f"{html.escape(c.where)}.</b> {html.escape(c.statement)}</p><p><i>The paper:</i> "
            f"{html.escape(c.paper_result)}.</p>{html_table(HEAD, rows)}"
            + (f"<p>Note: {html.escape(c.notes)}</p>" if c.notes else "")
            + imgs
        )
        record.append(
            {
                "claim": c.id,
                "verdict": r.verdict,
                "checks": [
                    {
                        "metric": k.check.metric,
                        "arch": k.check.arch,
                        "baseline": k.check.baseline,
                        "setting": k.check.setting,
                        "minus_setting": k.check.minus_setting,
                        "relation": k.check.relation,
                        "tolerance": k.check.tolerance,
                        "verdict": k.verdict,
                        **(
                            {
                                "values": list(k.interval.values),
                                "mean": k.interval.mean,
                                "low": k.interval.low,
                                "high": k.interval.high,
                            }
                            if k.interval
                            else {"value": k.value, "reference": k.reference}
                        ),
                    }
                    for k in r.checks
                ],
            }
        )
    path = out / "reproduction.md"
    path.write_text("\n".join(md) + "\n")
    (out / "reproduction.json").write_text(
        json.dumps({"scale": scale_name, "machine": info, "launch": rep.launch, "claims": record}, indent=2,
                   default=_jsonable)
    )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>blocklab reproduce</title><style>"
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.4}"
        "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;padding:4px 8px;"
        "text-align:left;vertical-align:top}img{max-width:100%}</style></head><body>"
        f"<h1>blocklab reproduce: {html.escape(scale_name)}</h1><p>{html.escape(method)}</p>"
        f"<h2>Verdicts</h2>{html_table(['claim', 'paper', 'where', 'claim', 'verdict'], summary)}"
        + "".join(sections_html)
        + "</body></html>"
    )
    (out / "reproduction.html").write_text(page)
    return path


def _jsonable(x: Any) -> Any:
    return None if isinstance(x, float) and math.isnan(x) else str(x)
