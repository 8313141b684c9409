"""The reproduction report's tables: each check's cells, the combinations, throughput from the
timing pass, the learning-rate sweep.
"""

from __future__ import annotations

import json

from blocklab.report.method import plural
from blocklab.report.stats import spread
from blocklab.reproduce import (
    PENDING,
    TIMING,
    CheckResult,
    Reproduction,
)
from blocklab.statistics import evidence

RELATION_WORDS = {
    "lower": "< 0",
    "higher": "> 0",
    "within": "within ±{tol}",
    "at_most": "≤ {tol}",
    "equals": "= {expected}",
}


def relation_text(result: CheckResult) -> str:
    c = result.check
    return RELATION_WORDS[c.relation].format(tol=f"{c.tolerance:g}", expected=c.expected)


VERDICTS = (*evidence.VERDICTS, PENDING)  # pending: runs not finished (reproduce --partial)


def check_cells(result: CheckResult) -> list[str]:
    if result.verdict == PENDING:
        return [result.describe(), "runs not finished", "-", "-", relation_text(result), PENDING]
    if result.interval is not None:
        iv = result.interval
        seeds = ", ".join(f"{v:+.4f}" for v in iv.values)
        ci = "-" if iv.low is None else f"[{iv.low:+.4f}, {iv.high:+.4f}]"
        return [result.describe(), seeds, f"{iv.mean:+.4f}", ci, relation_text(result), result.verdict]
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
        relation_text(result),
        result.verdict,
    ]


HEAD = ["check", "per seed (timing: per round)", "mean", "95% CI (t)", "expected", "verdict"]


def interval_text(iv: evidence.Interval) -> str:
    return f"{iv.mean:+.3f}" + ("" if iv.low is None else f" [{iv.low:+.3f}, {iv.high:+.3f}]")


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
            return interval_text(evidence.t_interval(evidence.paired_differences(loss(x), loss(y))))

        assert interaction.interval is not None
        rows.append([f"A = {a}, B = {b}: {together}", diff(a, "pre-ln"), diff(b, "pre-ln"),
                     diff(together, "pre-ln"), diff(together, a), diff(together, b),
                     interval_text(interaction.interval), result.verdict])
    return rows
