"""The reproduction page: a verdict per claim with its intervals and plots, as markdown and HTML."""

from __future__ import annotations

import base64
import html
import json
import math
import os
from pathlib import Path
from typing import Any

from blocklab.report.html import html_table
from blocklab.report.markdown import md_table
from blocklab.report.method import follows_recipe, how_runs_trained, optimizer_text, plural
from blocklab.reproduce import (
    METRICS,
    PENDING,
    RESOLUTION_NATS,
    ClaimResult,
    Reproduction,
    machine,
    page_prose,
    page_scales,
    read_campaign,
    unique_runs,
)
from blocklab.reproduce.page_plots import curves_figure, differences_figure
from blocklab.reproduce.page_tables import (
    COMBINATION_HEAD,
    COMBINATION_TEXT,
    HEAD,
    SWEEP_TEXT,
    TIMING_HEAD,
    TIMING_TEXT,
    VERDICTS,
    check_cells,
    combination_rows,
    sweep_rows,
    timing_rows,
)
from blocklab.statistics import evidence


def scope(rep: Reproduction, result: ClaimResult) -> str:
    """What a verdict must be read with, the same in the report and on the terminal: the scale's size
    and tokens, the seeds behind its measured checks (fewer than 3 decide nothing), and the scale's own
    caveat (the quick scale's verdicts are not evidence)."""
    s = rep.scale
    parts = [f"size {s.size}" + (f" at {s.model['n_layers']} layers" if "n_layers" in s.model else "")
             + (f", d {s.model['d_model']}" if "d_model" in s.model else "")
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


def _hardware(info: dict[str, Any]) -> str:
    """'CPU, N cores' and the GPU where one trained (campaign.jsonl lines before the GPU field have none)."""
    return f"{info['cpu']}, {info['cores']} cores" + (f", {info['gpu']}" if info.get("gpu") else "")


def campaign_text(root: Path | None) -> str | None:
    """What trained the runs, from OUT/<scale>/campaign.jsonl: dates, commits, machine, runs at once
    and threads, wall-clock time and runs trained; None without a log."""
    launches = read_campaign(root) if root is not None else []
    if not launches:
        return None
    dates = sorted(r["date"] for r in launches)
    commits = ", ".join(dict.fromkeys(str(r["commit"]) for r in launches))
    machines = "; ".join(dict.fromkeys(f"{_hardware(r)}, torch {r['torch']}" for r in launches))
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
            f"Machine: {_hardware(info)}, {_threads(rep.launch, info)}; "
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


def write_reproduction(rep: Reproduction, out: str | Path) -> Path:
    """Write OUT/reproduction.md, .html and .json (figures in OUT/<scale>-figures/); returns the .md."""
    from blocklab.statistics.claims import PAPERS

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
              ("Throughput", TIMING_TEXT, TIMING_HEAD, timing_rows(rep)),
              ("Which GPU trained which runs", page_scales.TRAINED_ON_TEXT, page_scales.RUN_HEAD,
               page_scales.run_rows(rep))]
    if rep.sweeps:
        tables.append(("Learning rates", SWEEP_TEXT.format(steps=rep.scale.sweep_steps), *sweep_rows(rep)))
    extra_html = ""
    for title, text, head, rows in tables:  # the tables across claims, those with rows
        if rows:
            md += ["", f"## {title}", "", text, ""] + md_table(head, rows)
            extra_html += f"<h2>{title}</h2><p>{html.escape(text)}</p>" + html_table(head, rows)
    sections_html = []
    for r in results:
        c = r.claim
        images = [p for p in (differences_figure(r, figures / f"{c.id}-differences.png"),
                              curves_figure(r, runs, figures / f"{c.id}-curves.png")) if p is not None]
        md += _claim_markdown(rep, r, images)
        sections_html.append(_claim_html(rep, r, images))
    record = [_claim_record(r) for r in results]
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


def _claim_markdown(rep: Reproduction, r: ClaimResult, images: list[Path]) -> list[str]:
    """A claim's section of reproduction.md: the claim, the scope of its verdict, the paper's result,
    the checks measured here and the figures (in the folder beside the page)."""
    from blocklab.statistics.claims import PAPERS

    c = r.claim
    md = ["", f"## {c.id}: {r.verdict}", "", f"**{PAPERS[c.paper]}, {c.where}.** {c.statement}", "",
          f"*Scope of this verdict:* {scope(rep, r)}.", "", f"*The paper:* {c.paper_result}.", "",
          "*Here:*", ""]
    md += md_table(HEAD, [check_cells(k) for k in r.checks])
    if c.notes:
        md += ["", f"Note: {c.notes}"]
    return md + [""] + [f"![{p.stem}]({p.parent.name}/{p.name})" for p in images]


def _claim_html(rep: Reproduction, r: ClaimResult, images: list[Path]) -> str:
    """The same section for reproduction.html, the figures embedded."""
    from blocklab.statistics.claims import PAPERS

    c = r.claim
    imgs = "".join(
        f'<figure><img alt="{html.escape(p.stem)}" src="data:image/png;base64,'
        f'{base64.b64encode(p.read_bytes()).decode()}"></figure>'
        for p in images
    )
    return (
        f"<h2>{html.escape(c.id)}: {html.escape(r.verdict)}</h2><p><b>{html.escape(PAPERS[c.paper])}, "
        f"{html.escape(c.where)}.</b> {html.escape(c.statement)}</p><p><i>Scope of this verdict:</i> "
        f"{html.escape(scope(rep, r))}.</p><p><i>The paper:</i> "
        f"{html.escape(c.paper_result)}.</p>{html_table(HEAD, [check_cells(k) for k in r.checks])}"
        + (f"<p>Note: {html.escape(c.notes)}</p>" if c.notes else "")
        + imgs
    )


def _claim_record(r: ClaimResult) -> dict[str, Any]:
    """A claim in reproduction.json: its verdict and every check's figures."""
    return {
        "claim": r.claim.id,
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


def _jsonable(x: Any) -> Any:
    return None if isinstance(x, float) and math.isnan(x) else str(x)


def write_summary(reps: list[Reproduction], path: str | Path, command: str, notes: Path | None = None,
                  extra: list[str] | None = None) -> Path:
    """One page over several scales (benchmarks/REPRODUCTION.md): how it was made and regenerated, the
    verdict of every claim at every scale (a campaign under way says how far its runs have got), the
    measured checks at a glance and as models grow, what trained a GPU scale's runs, the combination
    table and the learning rates, the `cpu` claims' verdicts on English text (`page_prose`, when the
    page has the `cpu` scale), with links to each scale's own report (OUT/<scale>/reproduction.md,
    written beside it). A function of the run data and `notes` (a markdown file included as it is),
    so regenerating it from the same data gives the same bytes. `extra`: markdown lines of a section of
    the page's own (the papers' headline numbers, `blocklab.headlines.page.headline_section`), placed
    after the checks as models grow."""
    path = Path(path)
    names = [rep.scale_name for rep in reps]

    def link(rep: Reproduction) -> str:
        assert rep.out is not None
        return os.path.relpath(rep.out / "reproduction.md", path.parent)

    where = "CPU and GPU" if any(rep.scale.trains_on == "gpu" for rep in reps) else "CPU"
    md = [f"# Reproduction of the papers' claims on {where}", "",
          f"Generated from the committed run data by `{command}`; do not edit it by hand (the reading below "
          "comes from the notes file beside the data). Each scale's full report, with per-seed values "
          "and figures, is linked below.", ""]
    md += ["## How it was made", ""]
    for rep in reps:
        md += [f"**[{rep.scale_name}]({link(rep)})**. " + method_text(rep, machine()), ""]
    md += ["## Verdicts", ""]
    md += [page_scales.count_line(rep) for rep in reps]
    md.append("")
    head, rows = ["claim", "paper", "where", "claim", *names], page_scales.verdict_rows(reps)
    on_prose = page_prose.code_rep(reps) is not None  # the cpu claims judged again on English text
    if on_prose:
        cells = page_prose.prose_cells(reps, page_prose.read_prose_store(reps), [row[0] for row in rows])
        head, rows = [*head, page_prose.COLUMN], [[*row, cell] for row, cell in zip(rows, cells, strict=True)]
    md += md_table(head, rows)
    if on_prose:
        md += ["", page_prose.column_text(reps, path)]
    md += ["", "## The measured checks", "",
           "Mean paired difference and 95% t-interval over n seeds, and the check's verdict, per scale.", ""]
    md += md_table(["claim", "check", "expected", *names], page_scales.check_rows(reps))
    if len(reps) > 1:
        md += ["", "## Does it hold as models grow?", "", *page_scales.growth_lines(reps)]
    if extra:
        md += ["", *extra]
    for rep in reps:
        if rep.scale.trains_on == "gpu":
            md += ["", f"## Which GPU trained which runs (`{rep.scale_name}`)", "",
                   *page_scales.trained_on_lines(rep)]
    for rep in reps:
        combos = combination_rows(rep)
        if any(row[-1] != PENDING for row in combos):  # a scale not yet run has no table to show
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
