"""The scaling report: the headline verdicts first, then loss against parameters with the fitted laws,
the equivalences at each rung, the fits and their residuals, and the method last; markdown, one
self-contained HTML page and JSON, as `blocklab compare` writes them (`blocklab.report`)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from blocklab.report import render_html, render_markdown
from blocklab.report.owned import check_owned, record_written
from blocklab.scaling.fit import fit
from blocklab.scaling.judge import (
    READINGS,
    VERDICT_READING,
    LadderData,
    ScalingResult,
    family_level,
    family_verdicts,
    interval_pct,
    shared_law,
)
from blocklab.scaling.laws import READ_BEYOND, beyond_text
from blocklab.scaling.method import method_facts, method_text, sweep_facts, sweep_time_text
from blocklab.scaling.record import result_record
from blocklab.scaling.shorter_runs import SHORTER_FOLDER
from blocklab.scaling.sweeps import EDGE_NOTE, SWEEP_FOLDER
from blocklab.statistics import evidence, sequential
from blocklab.statistics.claims import PAPERS
from blocklab.util.figures import agg_figure


def _fmt_n(n: float) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def plot_ladder(result: ScalingResult, reading: str, path: Path) -> Path:
    """Loss against parameters (log axis): each architecture's mean over seeds at each rung with +-1 seed
    standard deviation, and the law the equivalences read (the power law where none is shared)."""
    data = result.data
    fig, ax = agg_figure(6.4, 4.4)
    for k, arch in enumerate(data.archs):
        f = result.fits[(arch, reading)]
        sds = [
            statistics.stdev([data.points[(arch, r)][s].val_loss for s in result.seeds])
            if len(result.seeds) > 1
            else 0.0
            for r in data.rungs
        ]
        eq = result.parameters.get((arch, reading))
        label = (
            arch
            if eq is None
            else f"{arch}: read {beyond_text(eq.outside)}"
            if eq.outside is not None
            else f"{arch}: {interval_pct(eq.interval)} parameters saved"
            if eq.interval
            else f"{arch}: no law describes it"
            if eq.law is None
            else f"{arch}: beyond {result.baseline}'s reach"
        )
        ax.errorbar(f.sizes, f.means, yerr=sds, fmt="o", color=f"C{k}", markersize=4, capsize=2, label=label)
        law, _ = shared_law([result.fits[(result.baseline, reading)], f])
        curve = fit(law or "power law", f.sizes, f.means)
        lo, hi = math.log(min(f.sizes)) - 0.1, math.log(max(f.sizes)) + 0.1
        xs = [math.exp(lo + (hi - lo) * i / 60) for i in range(61)]
        ax.plot(xs, [curve(x) for x in xs], color=f"C{k}", linewidth=1, linestyle="-" if law else ":")
    ax.set_xscale("log")
    ax.set_xlabel(f"parameters ({reading}; log scale)")
    ax.set_ylabel("final validation loss (nats/token)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def verdict_table(result: ScalingResult) -> tuple[list[str], list[list[str]]]:
    head = ["claim", "verdict", "ours", "the paper", "paper's number in our interval", "what more would tell"]
    rows = []
    for h in result.headlines:
        paper = "-" if h.claim.paper_value is None else f"{100 * h.claim.paper_value:+.1f}%"
        inside = "-" if h.paper_inside is None else ("yes" if h.paper_inside else "no")
        rows.append(
            [
                h.claim.id,
                f"**{h.verdict}**",
                h.text,
                f"{paper}: {h.claim.paper_result}",
                inside,
                h.more or "-",
            ]
        )
    return head, rows


def figure_path(out: Path, reading: str) -> Path:
    return out / f"loss_vs_params_{reading.replace('-', '_')}.png"


def ladder_blocks(result: ScalingResult, figures: Path, level: str = "h2") -> list[tuple]:
    """The report's blocks (`blocklab.report`): verdicts, figures, tables, method."""
    return [
        *verdict_blocks(result, level),
        *figure_blocks(result, figures),
        *equivalence_blocks(result, level),
        *fit_blocks(result, level),
        *method_blocks(result, level),
    ]


def verdict_blocks(result: ScalingResult, level: str) -> list[tuple]:
    base = result.baseline
    blocks: list[tuple] = [(level, "Verdicts")]
    if result.headlines:
        blocks.append(("table", *verdict_table(result)))
    else:
        blocks.append(
            (
                "p",
                f"No headline claim compares these architectures with {base} (see `blocklab "
                "scaling --list`); the equivalences below are measured all the same.",
            )
        )
    blocks.append(
        (
            "p",
            f"Seeds: {', '.join(map(str, result.seeds))} (those that finished every rung for every "
            "architecture). A saving is the fraction of parameters (or tokens) an architecture "
            f"needs less than {base} for the same loss; negative: more. Intervals are "
            f"{INTERVALS[sequential.active()]} over seeds, each seed's ladder fitted on its own.",
        )
    )
    blocks.append(("p", statistics_text(result)))
    return blocks


# what the intervals are: t-intervals, or (a report of seeds added until decided) the confidence sequence
INTERVALS = {False: "95% t-intervals",
             True: "anytime-valid 95% confidence sequences (docs/statistics-sequential.md)"}


def statistics_text(result: ScalingResult) -> str:
    """What the intervals do about the choice of law, readings past the ladder, few seeds and the number
    of claims: the family-wise reading (Bonferroni) with the verdicts that hold at it."""
    text = (
        "The law is chosen on the same points it is read on, so a saving is read under every law that "
        "describes both architectures and its interval is the hull of their intervals: it decides only "
        f"where every admissible law agrees. A reading that needs {result.baseline}'s law more than "
        f"{READ_BEYOND:g}x past its largest rung (or below its smallest) is reported as beyond the ladder, "
        f"not as a number. A verdict needs {evidence.MIN_SEEDS} or more seeds"
        + (f" (these {len(result.seeds)} give intervals, not verdicts)"
           if 1 < len(result.seeds) < evidence.MIN_SEEDS else
           " (one seed tests no law and gives no interval)" if len(result.seeds) == 1 else "")
        + "."
    )
    k = len(result.headlines)
    if k < 2:
        return text
    level = family_level(result)
    family = family_verdicts(result)
    decided = [h.claim.id for h in result.headlines if h.verdict != "inconclusive"]
    holding = [f"{i} {family[i]}" for i in decided if family[i] != "inconclusive"]
    return text + (
        f" Multiplicity: each verdict's interval is 95% on its own; over these {k} claims the chance that "
        f"one or more intervals misses its truth can reach {k} x 5% = {k * 5}%, so the family-wise level is "
        f"not 95%. Read at a family-wise 95% (Bonferroni: every interval at {100 * level:.0f}%), "
        + (f"{len(holding)} of the {len(decided)} decided verdicts hold: {', '.join(holding) or 'none'}."
           if decided else "no verdict is decided either.")
    )


def figure_blocks(result: ScalingResult, figures: Path) -> list[tuple]:
    return [
        (
            "figure",
            plot_ladder(result, reading, figure_path(figures, reading)),
            f"loss against parameters ({reading})",
            f"final validation loss against parameters counted as {READINGS[reading]}: the mean over seeds "
            "at each rung (bars: one seed standard deviation) and the law fitted to the means (solid: the "
            "law the equivalences read, the power law where both laws are read; dotted: the power law, "
            "which does not describe the points); the "
            f"legend gives each architecture's saving against {result.baseline} at the middle of the ladder, "
            "with its 95% interval.",
        )
        for reading in READINGS
    ]


def _equivalence_row(eq, rungs: list[str]) -> list[str]:
    if eq.law is None:
        return [eq.arch, "untestable" if eq.untestable else "refused", *["-"] * len(rungs), eq.why]

    def cell(g: str) -> str:
        if not eq.per_rung[g]:
            return "beyond the baseline's reach"
        factor = eq.outside_per_rung.get(g)
        return beyond_text(factor) if factor is not None else interval_pct(eq.per_rung[g])

    cells = [cell(g) for g in rungs]
    mid = (eq.why if not eq.interval else beyond_text(eq.outside) if eq.outside is not None
           else f"{interval_pct(eq.interval)} at N = {_fmt_n(eq.at or 0)}")
    return [eq.arch, eq.law, *cells, mid]


def equivalence_blocks(result: ScalingResult, level: str) -> list[tuple]:
    data, base = result.data, result.baseline
    blocks: list[tuple] = [(level, "Parameter equivalence at each rung")]
    for reading in READINGS:
        rows = [_equivalence_row(eq, data.rungs) for (_, r), eq in result.parameters.items() if r == reading]
        blocks.append(
            (
                "p",
                f"Parameters counted as {READINGS[reading]}"
                f"{' (the verdicts read these)' if reading == VERDICT_READING else ''}: the fraction "
                f"of parameters each architecture saves against {base} at its own size at each rung.",
            )
        )
        blocks.append(("table", ["architecture", "law", *data.rungs, "middle of the ladder"], rows))
    blocks.append((level, "Data equivalence on the largest rung"))
    blocks.append(("p", data_caveat(result)))
    blocks.append(
        (
            "table",
            ["architecture", "tokens saved to reach the baseline's final loss"],
            [[a, interval_pct(e.interval)] for a, e in result.data_eq.items()],
        )
    )
    blocks.append((level, "Paired loss difference at each rung"))
    blocks.append(
        (
            "table",
            ["architecture", *data.rungs],
            [[a, *[str(g[r]) for r in data.rungs]] for a, g in result.gains.items()],
        )
    )
    return blocks


def fit_blocks(result: ScalingResult, level: str) -> list[tuple]:
    rows = []
    for (arch, reading), f in result.fits.items():
        for form, c in f.checks.items():
            test = "-" if c.p is None else f"F = {c.f:.2f}, p = {c.p:.3g}"
            rows.append(
                [arch, reading, form, c.law.formula(), f"{c.rms:.4f}", test, "yes" if c.describes else "no"]
            )
    head = [
        "architecture",
        "parameters",
        "law",
        "fit",
        "residual RMS (nats)",
        "lack of fit",
        "describes the points",
    ]
    return [
        (level, "The fits"),
        (
            "p",
            "Each law fitted to the mean loss over seeds at each rung. Lack of fit: the residuals' variance "
            "over the variance of a rung's mean (the seed variance pooled over rungs over the seeds), "
            "against Fisher's F; a law with p < 0.01 does not describe the points and is refused "
            "(blocklab/scaling/fit.py).",
        ),
        ("table", head, rows),
    ]


def method_blocks(result: ScalingResult, level: str = "h2") -> list[tuple]:
    ladder = result.data.ladder
    rows = []
    for k, rung in enumerate(ladder.rungs):
        shape = ", ".join(f"{key} {value}" for key, value in rung.model.items())
        sizes = [_fmt_n(result.fits[(a, "all")].sizes[k]) for a in result.data.archs]
        rows.append([rung.name, shape, *sizes])
    papers = sorted({PAPERS[h.claim.paper] for h in result.headlines})
    return [
        (level, "Method"),
        (
            "p",
            f"Ladder `{result.data.name}`: {ladder.description}. {ladder.tokens_line()}. "
            f"Learning rate: {ladder.lr_rule}. "
            + method_text(method_facts(result), result.data.archs, result.data.rungs),
        ),
        ("table", ["rung", "shape", *[f"{a} (all)" for a in result.data.archs]], rows),
        *sweep_blocks(result.data),
        (
            "p",
            "Parameter equivalence (Value Residual Learning, Fig. 6 left): at N, the baseline's law needs N' "
            "parameters for the loss X's law gives at N; X saves 1 - N/N'. Data equivalence (Fig. 6 right): "
            "on the largest rung X reaches the baseline's final loss after T_X of its T tokens, read between "
            "evaluations linearly in log tokens; X saves 1 - T_X/T. Intervals are taken over seeds of "
            "log(N'/N) and log(T/T_X) and read back as fractions; a saving whose interval holds 0 and lies "
            "within +-3% is 'no effect'. " + (f"Papers: {'; '.join(papers)}." if papers else ""),
        ),
    ]


def sweep_blocks(data: LadderData) -> list[tuple]:
    """A ladder's learning-rate sweep (none without one): the rule, its runs, and the rate chosen at each
    rung for each architecture, a choice at the grid's edge flagged (`sweeps.EDGE_NOTE`)."""
    facts = sweep_facts(data)
    if facts is None:
        return []
    grid = ", ".join(f"{f:g}" for f in facts["factors"])
    chosen = {(c["rung"], c["arch"]): c for c in facts["chosen"]}

    def cell(rung: str, arch: str) -> str:
        c = chosen.get((rung, arch))
        if c is None:
            return "-"
        return f"{c['rates']['lr']:.3g} (x{c['factor']:g})" + (", at the edge" if c["at_edge"] else "")

    edges = [f"{c['rung']} {c['arch']}" for c in facts["chosen"] if c["at_edge"]]
    sweep = data.ladder.lr_sweep
    assert sweep is not None
    one = sweep.seeds == 1
    runs = "one run" if one else f"{sweep.seeds} runs"
    ended = "run ended at the lowest" if one else "runs ended at the lowest mean"
    text = (f"Learning-rate sweep: at each rung, each architecture trained {runs} of {facts['steps']} steps "
            f"({sweep.seeds_text()}, otherwise as that rung's runs) at each of {grid} x its recipe rate, and "
            f"that rung's runs of that architecture trained at the factor whose {ended} validation loss: "
            f"{facts['runs']} sweep runs (in <rung>/{SWEEP_FOLDER}/runs/), "
            f"{sweep_time_text(facts)}. The peak rates chosen (the factor; with Muon, its Muon rate by the "
            "same factor):")
    blocks: list[tuple] = [("p", text), ("table", ["rung", *data.archs],
                                          [[r, *[cell(r, a) for a in data.archs]] for r in data.rungs])]
    if edges:
        blocks.append(("p", f"{len(edges)} of the {len(chosen)} choices are {EDGE_NOTE} (the grid's "
                            f"smallest or largest factor won): {', '.join(edges)}."))
    return blocks


REPORT_TITLE = "Scaling ladder"
# the files write_scaling_report writes into a folder, and how each shows that blocklab scaling wrote it
# (None: a figure, blocklab's when the report beside it is and links it); `report.owned`
REPORT_FILES: dict[str, str | None] = {
    "scaling.md": f"# {REPORT_TITLE} ",
    "scaling.html": f"<h1>{REPORT_TITLE} ",
    "scaling.json": '{\n  "ladder": ',
    **{figure_path(Path(), reading).name: None for reading in READINGS},
}


def check_report_folder(out: Path, overwrite: bool = False, flag: str = "--report") -> None:
    """Refuse a report folder that is a file, or that holds a scaling.md, .html, .json or figure blocklab
    scaling did not write (unless `overwrite`): checked before anything trains."""
    check_owned(out, REPORT_FILES, "scaling.md", overwrite, flag, "scaling")


def data_caveat(result: ScalingResult) -> str:
    """What the data equivalence reads: the final losses of the ladder's shorter runs, or else a run's
    mid-run evaluations, which are not shorter runs' losses (said, with how to get those)."""
    ladder = result.data.ladder
    schedule = method_facts(result)["schedule"]
    if ladder.shorter_runs:
        top = ladder.rungs[-1].name
        steps = sorted({k for _, k in result.data.shorter})
        fractions = ", ".join(f"{f:g}" for f in ladder.shorter_runs)
        return (
            f"The tokens to reach a loss are read off shorter runs: each architecture also trained {top} "
            f"for {fractions} of its steps ({', '.join(map(str, steps))} steps), same seed and peak rate, "
            f"each with its own `{schedule or 'recorded'}` schedule over its own steps, so each point is the "
            "final loss of a run trained for that many tokens, as Fig. 6 right's shorter runs. Between two "
            "such runs the tokens are read linearly in log tokens; a saving above "
            f"{1 - min(ladder.shorter_runs):.0%} (X's shortest run already there) cannot be read and stops "
            f"at it. The runs are in {top}/{SHORTER_FOLDER}/runs/."
        )
    under = f"the runs' `{schedule}` schedule" if schedule else "the runs' schedule (not recorded)"
    return (
        f"The tokens to reach a loss are read off one run's evaluations on the way, under {under}: a "
        "mid-run loss is taken part-way through the warmup and decay of a longer run, not the loss of a "
        "run trained for that many tokens with its own warmup and decay; the two differ, in either "
        "direction (docs/scaling.md measures both). So this reads how fast X gets there within the "
        "baseline's run, not Fig. 6 right's shorter runs. True shorter-run losses take shorter runs: a "
        "ladder file's `shorter_runs` (e.g. [0.25, 0.5, 0.75]) trains them, each with its own schedule, "
        "and this reading then uses their final losses (docs/scaling.md). A "
        "warmup-stable-decay schedule (`optim.schedule=wsd`) with a cooldown branched from each "
        "intermediate checkpoint would give them more cheaply; this command does not train cooldowns."
    )


def write_scaling_report(result: ScalingResult, out: Path, command: str = "", overwrite: bool = False,
                         flag: str = "--report") -> Path:
    """OUT/scaling.md, scaling.html and scaling.json, the figures beside them; refuses files there that
    blocklab did not write (`check_report_folder`) and records those it wrote."""
    check_report_folder(out, overwrite, flag)
    out.mkdir(parents=True, exist_ok=True)
    title = f"{REPORT_TITLE} {result.data.name}: {', '.join(result.data.archs)}"
    blocks = ladder_blocks(result, out)
    if command:
        blocks.append(("p", f"Rebuild this report from the runs: `{command}`"))
    md = out / "scaling.md"
    md.write_text(render_markdown(title, blocks))
    (out / "scaling.html").write_text(render_html(title, blocks))
    (out / "scaling.json").write_text(json.dumps(result_record(result), indent=2) + "\n")
    record_written(out, [out / name for name in REPORT_FILES])
    return md
