"""The reproduction report: a verdict per claim with its intervals and plots, as markdown and HTML."""

from __future__ import annotations

import base64
import html
import json
import math
import os
import statistics
from pathlib import Path
from typing import Any

from blocklab import evidence
from blocklab.report.html import html_table
from blocklab.report.markdown import md_table
from blocklab.report.method import follows_recipe, how_runs_trained, optimizer_text, plural
from blocklab.report.stats import spread
from blocklab.reproduce import (
    METRICS,
    PENDING,
    RESOLUTION_NATS,
    TIMING,
    CheckResult,
    ClaimResult,
    Reproduction,
    machine,
    read_campaign,
    unique_runs,
)

RELATION_WORDS = {
    "lower": "< 0",
    "higher": "> 0",
    "within": "within ±{tol}",
    "at_most": "≤ {tol}",
    "equals": "= {expected}",
}


def _relation(result: CheckResult) -> str:
    c = result.check
    return RELATION_WORDS[c.relation].format(tol=f"{c.tolerance:g}", expected=c.expected)


VERDICTS = (*evidence.VERDICTS, PENDING)  # pending: runs not finished (reproduce --partial)


def _cells(result: CheckResult) -> list[str]:
    if result.verdict == PENDING:
        return [result.describe(), "runs not finished", "-", "-", _relation(result), PENDING]
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


HEAD = ["check", "per seed (timing: per round)", "mean", "95% CI (t)", "expected", "verdict"]


def scope(rep: Reproduction, result: ClaimResult) -> str:
    """What a verdict must be read with, the same in the report and on the terminal: the scale's size
    and tokens, the seeds behind its measured checks (fewer than 3 decide nothing), and the scale's own
    caveat (the quick scale's verdicts are not evidence)."""
    s = rep.scale
    parts = [f"size {s.size}" + (f" at {s.model['n_layers']} layers" if "n_layers" in s.model else "")
             + f", {s.steps * s.batch_size * s.seq_len / 1e6:.2g}M tokens"]
    seeds = sorted({k.interval.n for k in result.checks if k.interval is not None
                    and not METRICS[k.check.metric].timed})
    if seeds:
        parts.append(f"{seeds[0]}{'-' + str(seeds[-1]) if len(seeds) > 1 else ''} seeds"
                     + (f": fewer than {evidence.MIN_SEEDS} decide nothing" if seeds[0] < evidence.MIN_SEEDS
                        else ""))
    if result.verdict == PENDING:
        parts.append("runs not finished")
    if s.caveat:
        parts.append(s.caveat)
    return "; ".join(parts)


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
        plt.close(fig)
        return None
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _optimizers(runs: dict[str, list]) -> str:
    """The optimiser settings the runs trained with, as the compare report words them, and whether
    they are the main job's recipe (`recipes.recipe_optim`)."""
    configs = [(entry, cfg) for group in runs.values() for entry, cfg in group]
    if not configs:
        return ""
    kinds = sorted({f"{optimizer_text(cfg)}; peak lr {cfg.optim.lr:g}" for _, cfg in configs})
    recipe = all(follows_recipe(entry.arch, cfg) for entry, cfg in configs)
    return ("Optimiser: " + " | ".join(kinds) + (" (the main job's recipe for the size and each "
            "architecture, recipes/main_job_optim.json)." if recipe else "."))


def _threads(launch: dict[str, Any] | None, info: dict[str, Any]) -> str:
    """How the runs shared the machine: N at a time on T threads each, or torch's default threads."""
    if not launch or (launch["jobs"] == 1 and launch["launcher"] == "local"):
        return f"{info['torch_threads']} torch threads"
    return f"runs trained {how_runs_trained({'launch': launch})}" + (
        f", {plural(launch['threads'], 'thread')} each" if launch.get("threads") else "")


def _interval_text(iv: evidence.Interval) -> str:
    return f"{iv.mean:+.3f}" + ("" if iv.low is None else f" [{iv.low:+.3f}, {iv.high:+.3f}]")


def campaign_text(root: Path | None) -> str | None:
    """What trained the runs, from OUT/<scale>/campaign.jsonl: dates, commits, machine, runs at once
    and threads, wall-clock time and runs trained; None without a log."""
    launches = read_campaign(root) if root is not None else []
    if not launches:
        return None
    dates = sorted(r["date"] for r in launches)
    commits = ", ".join(dict.fromkeys(str(r["commit"]) for r in launches))
    machines = "; ".join(dict.fromkeys(f"{r['cpu']}, {r['cores']} cores, torch {r['torch']}"
                                       for r in launches))
    shares = ", ".join(dict.fromkeys(
        plural(r["jobs"], "run") + " at once" + (f" on {plural(r['threads'], 'thread')} each"
                                                  if r.get("threads") else "")
        for r in launches))
    hours = sum(r["wall_seconds"] for r in launches) / 3600
    trained = sum(r["trained"] for r in launches)
    return (f"{trained} runs trained in {len(launches)} launch(es) that ran to their end "
            f"({dates[0]} to {dates[-1]}; "
            f"{hours:.1f} hours "
            f"of wall clock) at commit {commits}, on {machines}; {shares}.")


def method_text(rep: Reproduction, info: dict[str, Any]) -> str:
    """The scale, the optimiser, the statistics and the verdict rules, and what trained the runs: a
    function of the run data (and, for a store without a campaign log, of this machine)."""
    claim_runs = unique_runs(rep.runs)
    n_runs = len(claim_runs)
    n_sweep = sum(len(s.losses) for s in rep.sweeps.values())
    finished = [json.loads((Path(cfg.out_dir) / "summary.json").read_text()) for _, cfg in claim_runs
                if (Path(cfg.out_dir) / "summary.json").is_file()]
    if rep.out is not None and not finished and not campaign_text(rep.out):
        trained_by = "No run has trained yet."  # a function of the (empty) data, not of this machine
    else:
        trained_by = campaign_text(rep.out) or (
            f"Machine: {info['cpu']}, {info['cores']} cores, {_threads(rep.launch, info)}; "
            f"torch {info['torch']}, "
            f"blocklab {info['blocklab']}{' at ' + info['commit'] if info['commit'] else ''}; "
            f"{info['date']}.")
    if finished and rep.out is not None:
        hours = sum(r["train_time"] for r in finished) / 3600
        trained_by += (f" The store holds {len(finished)} finished claim runs of {n_runs} planned "
                       f"({hours:.1f} hours of training, from their summaries).")
    seeds = sorted({cfg.seed for group in rep.runs.values() for _, cfg in group})
    planned = (f"{n_runs} training runs{f' and {n_sweep} sweep runs' if n_sweep else ''}, seeds 0-{seeds[-1]}"
               if seeds else "No run planned yet (the learning-rate sweep has not finished)")
    optimizers = _optimizers(rep.runs) + " " if rep.runs else ""
    return (
        f"Scale `{rep.scale_name}`: {rep.scale.describe()}. {optimizers}{planned}. "
        "Runs are paired by seed: every architecture of a seed sees the same "
        "batches and is validated on the same held-out windows. For each measured check, the per-seed "
        "differences to the baseline, their mean and a 95% Student t-interval (mean ± t_{0.975,n-1} s/√n, "
        "assuming normal, independent differences)"
        + ("; throughput checks pair the architectures by round of a timing pass after training instead "
           "(Throughput)" if any(METRICS[k.check.metric].timed for r in rep.results for k in r.checks)
           else "")
        + ". Verdict: reproduced when the interval lies on the "
        "claimed side (or inside the tolerance), contradicted when it lies on the other side; *no effect* "
        f"when a loss check's interval holds zero and lies within ±{evidence.NO_EFFECT_NATS} nats (an "
        "effect smaller than any the papers report); inconclusive otherwise or with fewer than "
        f"{evidence.MIN_SEEDS} seeds. Exact quantities (parameters, FLOPs per token, cache bytes) are "
        "compared directly. "
        + (f"A check still inconclusive after {rep.scale.seeds} seeds, with an interval wider than ±"
           f"{RESOLUTION_NATS} nats, got {rep.scale.seeds} more (up to {rep.scale.max_seeds}); two looks at "
           "the data make the 95% nominal, a little optimistic. " if rep.scale.max_seeds else "")
        + trained_by
    )


def sweep_rows(rep: Reproduction) -> tuple[list[str], list[list[str]]]:
    """The learning-rate sweep: each arch's final validation loss per factor, and the chosen rates."""
    factors = sorted({f for s in rep.sweeps.values() for f in s.losses})
    head = ["architecture", *(f"x{f:.3g}" for f in factors), "chosen"]
    rows = []
    for arch, sweep in rep.sweeps.items():
        cells = [f"{sweep.losses[f]:.4f}" if f in sweep.losses else "-" for f in factors]
        best = factors.index(sweep.best)
        cells[best] = f"**{cells[best]}**"
        rows.append([arch, *cells, ", ".join(f"{k} {v:g}" for k, v in sweep.rates.items())])
    return head, rows


COMBINATION_TEXT = (
    "The table no paper has: each paper's change alone and with SAS-P's block (or below Bank of Values' "
    "table layers), at equal FLOPs. Cells are paired differences of final validation loss (nats; mean "
    "[95% CI] over seeds). The interaction is (A+B - A) - (B - pre-ln): what B gains on top of A less "
    "what it gains alone; near zero, the gains add up; positive, they overlap.")
SWEEP_TEXT = ("Each architecture trained seed 0 for {steps} steps at each multiple of its recipe's peak "
              "rates (AdamW's and Muon's together); the table gives the final validation loss, and its runs "
              "train at the best (bold).")


TIMING_HEAD = ["setting", "architecture", "tokens/s, median (IQR) over rounds", "ratio to the first",
               "timed"]


def timing_rows(rep: Reproduction) -> list[list[str]]:
    """The throughput checks' timing passes (OUT/<scale>/<group>/timing.json): per architecture the
    median tokens/s over rounds with its interquartile range, and how the pass ran."""
    from blocklab.reproduce import read_timing

    if rep.out is None:
        return []
    rows = []
    for setting in rep.runs:
        group = rep.out / rep.scale.group(setting)
        if not (group / TIMING).is_file():
            continue
        saved = json.loads((group / TIMING).read_text())
        how = (f"{saved['rounds']} rounds x {saved['steps']} steps, {plural(saved['threads'], 'thread')}; "
               f"{saved['cpu']}, {saved['date']}")
        first = None
        for arch in saved["architectures"]:
            s = spread(list(read_timing(group, arch).values()))
            assert s is not None
            first = first or s["median"]
            rows.append([setting, arch, f"{s['median']:,.0f} ({s['q1']:,.0f}-{s['q3']:,.0f})",
                         f"{s['median'] / first:.3f}", how])
    return rows


TIMING_TEXT = ("Throughput is timed after training, never read from the runs' logs: each architecture's "
               "training step (fresh model, the runs' batch shape and optimisers) in interleaved rounds, "
               "every architecture in turn within a round, so a change in the machine's load hits all "
               "alike. A throughput check pairs the architectures by round.")


COMBINATION_HEAD = ["combination", "A - pre-ln", "B - pre-ln", "A+B - pre-ln", "A+B - A", "A+B - B",
                    "interaction", "verdict"]


def combination_rows(rep: Reproduction) -> list[list[str]]:
    """The table no paper has: for each combination claim, every paired difference of final validation
    loss among pre-ln, A, B and A+B at its setting (mean [95% CI], nats), the interaction
    (A+B - A) - (B - pre-ln), and the claim's verdict."""
    if rep.measured is None:
        return []
    rows = []
    for result in rep.results:
        if "combination" not in result.claim.tags:
            continue
        first, second, interaction = result.checks
        together, a, b = first.check.arch, first.check.baseline, second.check.baseline
        setting = first.check.setting
        if result.verdict == PENDING:
            rows.append([f"A = {a}, B = {b}: {together}", *["-"] * 6, PENDING])
            continue

        def loss(arch: str, _setting: str = setting) -> dict[int, float]:
            return rep.measured.per_seed("val_loss", _setting, arch)

        def diff(x: str, y: str) -> str:
            return _interval_text(evidence.t_interval(evidence.paired_differences(loss(x), loss(y))))

        assert interaction.interval is not None
        rows.append([f"A = {a}, B = {b}: {together}", diff(a, "pre-ln"), diff(b, "pre-ln"),
                     diff(together, "pre-ln"), diff(together, a), diff(together, b),
                     _interval_text(interaction.interval), result.verdict])
    return rows


def write_reproduction(rep: Reproduction, out: str | Path) -> Path:
    """Write OUT/reproduction.md, .html and .json (figures in OUT/<scale>-figures/); returns the .md."""
    from blocklab.claims import PAPERS

    results, scale_name, runs = rep.results, rep.scale_name, rep.runs
    out = Path(out)
    figures = out / f"{scale_name}-figures"
    figures.mkdir(parents=True, exist_ok=True)
    info = machine()
    method = method_text(rep, info)
    summary = [
        [r.claim.id, PAPERS[r.claim.paper].split(" (")[0], r.claim.where, r.claim.statement, r.verdict]
        for r in results
    ]
    counts = {v: sum(r.verdict == v for r in results) for v in VERDICTS if v != PENDING or
              any(r.verdict == PENDING for r in results)}
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
    tables = [("Do the papers' gains add up?", COMBINATION_TEXT, COMBINATION_HEAD, combination_rows(rep)),
              ("Throughput", TIMING_TEXT, TIMING_HEAD, timing_rows(rep))]
    if rep.sweeps:
        tables.append(("Learning rates", SWEEP_TEXT.format(steps=rep.scale.sweep_steps), *sweep_rows(rep)))
    extra_html = ""
    for title, text, head, rows in tables:  # the tables across claims, those with rows
        if rows:
            md += ["", f"## {title}", "", text, ""] + md_table(head, rows)
            extra_html += f"<h2>{title}</h2><p>{html.escape(text)}</p>" + html_table(head, rows)
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
            f"*Scope of this verdict:* {scope(rep, r)}.",
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
            f"{html.escape(c.where)}.</b> {html.escape(c.statement)}</p><p><i>Scope of this verdict:</i> "
            f"{html.escape(scope(rep, r))}.</p><p><i>The paper:</i> "
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
        json.dumps({"scale": scale_name, "description": rep.scale.describe(),
                    # the campaign log where there is one or nothing has trained (so the file is a
                    # function of the data); this machine otherwise (a store from before the log)
                    **({"campaign": read_campaign(rep.out)} if campaign_text(rep.out) or "No run has trained"
                       in method else {"machine": info, "launch": rep.launch}),
                    "sweep": {a: {"losses": {f"{f:.3g}": v for f, v in w.losses.items()}, "rates": w.rates}
                              for a, w in rep.sweeps.items()},
                    "claims": record}, indent=2, default=_jsonable)
    )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>blocklab reproduce</title><style>"
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.4}"
        "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;padding:4px 8px;"
        "text-align:left;vertical-align:top}img{max-width:100%}</style></head><body>"
        f"<h1>blocklab reproduce: {html.escape(scale_name)}</h1><p>{html.escape(method)}</p>"
        f"<h2>Verdicts</h2>{html_table(['claim', 'paper', 'where', 'claim', 'verdict'], summary)}"
        + extra_html
        + "".join(sections_html)
        + "</body></html>"
    )
    (out / "reproduction.html").write_text(page)
    return path


def _jsonable(x: Any) -> Any:
    return None if isinstance(x, float) and math.isnan(x) else str(x)


def _loss_claim(result: ClaimResult) -> bool:
    return any(r.check.metric == "val_loss" for r in result.checks)


def write_summary(reps: list[Reproduction], path: str | Path, command: str, notes: Path | None = None
                  ) -> Path:
    """One page over several scales (benchmarks/REPRODUCTION.md): how it was made and regenerated, the
    verdict of every claim at every scale, the measured checks at a glance, the combination table and
    the learning rates, with links to each scale's own report (OUT/<scale>/reproduction.md, written
    beside it). A function of the run data and `notes` (a markdown file included as it is), so
    regenerating it from the same data gives the same bytes."""
    from blocklab.claims import PAPERS

    path = Path(path)
    names = [rep.scale_name for rep in reps]

    def link(rep: Reproduction) -> str:
        assert rep.out is not None
        return os.path.relpath(rep.out / "reproduction.md", path.parent)

    md = ["# Reproduction of the papers' claims on CPU", "",
          f"Generated from the committed run data by `{command}`; do not edit it by hand (the reading below "
          "comes from the notes file beside the data). Each scale's full report, with per-seed values "
          "and figures, is linked below.", ""]
    md += ["## How it was made", ""]
    for rep in reps:
        md += [f"**[{rep.scale_name}]({link(rep)})**. " + method_text(rep, machine()), ""]
    md += ["## Verdicts", ""]
    for rep in reps:
        counts = {v: sum(r.verdict == v for r in rep.results) for v in VERDICTS}
        loss = [r for r in rep.results if _loss_claim(r)]
        open_loss = sum(r.verdict == "inconclusive" for r in loss)
        waiting = sum(r.verdict == PENDING for r in loss)
        md.append(f"- `{rep.scale_name}`: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n)
                  + f" of {len(rep.results)} claims; {open_loss} of the {len(loss)} loss claims "
                  "inconclusive" + (f", {waiting} pending" if waiting else "") + ".")
    md.append("")
    by_scale = [{r.claim.id: r for r in rep.results} for rep in reps]
    ids = list(dict.fromkeys(r.claim.id for rep in reps for r in rep.results))
    rows = []
    for cid in ids:
        claim = next(results[cid].claim for results in by_scale if cid in results)
        rows.append([cid, PAPERS[claim.paper].split(" (")[0], claim.where, claim.statement,
                     *(results[cid].verdict if cid in results else "-" for results in by_scale)])
    md += md_table(["claim", "paper", "where", "claim", *names], rows)
    md += ["", "## The measured checks", "",
           "Mean paired difference and 95% t-interval over n seeds, and the check's verdict, per scale.", ""]
    rows = []
    for cid in ids:
        per_scale = [results.get(cid) for results in by_scale]
        first = next(r for r in per_scale if r is not None)
        for k, check in enumerate(first.checks):
            if METRICS[check.check.metric].exact:
                continue
            cells = []
            for r in per_scale:
                iv = r.checks[k].interval if r is not None else None
                cells.append("-" if r is None else PENDING if iv is None else
                             f"{_interval_text(iv)} (n={iv.n}) {r.checks[k].verdict}")
            rows.append([cid, check.describe(), _relation(check), *cells])
    md += md_table(["claim", "check", "expected", *names], rows)
    for rep in reps:
        combos = combination_rows(rep)
        if combos:
            md += ["", f"## Do the papers' gains add up? (`{rep.scale_name}`)", "", COMBINATION_TEXT, ""]
            md += md_table(COMBINATION_HEAD, combos)
    for rep in reps:
        timing = timing_rows(rep)
        if timing:
            md += ["", f"## Throughput (`{rep.scale_name}`)", "", TIMING_TEXT, ""]
            md += md_table(TIMING_HEAD, timing)
    for rep in reps:
        if rep.sweeps:
            head, rows = sweep_rows(rep)
            md += ["", f"## Learning rates (`{rep.scale_name}`)", "",
                   SWEEP_TEXT.format(steps=rep.scale.sweep_steps), ""]
            md += md_table(head, rows)
    if notes is not None and notes.is_file():
        md += ["", notes.read_text().strip()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(md) + "\n")
    return path
