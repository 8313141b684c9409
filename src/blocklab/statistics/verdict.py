"""Who wins, and how surely: the verdict that opens every compare report.

The architectures ranked by final validation loss, each with its difference to the baseline (the
first architecture) paired by seed, with a 95% t-interval (`blocklab.statistics.evidence`). A difference is
told from noise only when its interval excludes zero with 3 or more seeds. With fewer, the verdict
says so and how many seeds would tell a difference of the size seen: the smallest n with

    t_{0.975, n-1} * s_d / sqrt(n) < |mean difference|

where s_d is the seed-to-seed standard deviation of paired differences measured on the committed
runs at this size (`recipes/seed_spread.json`, written by benchmarks/seed_spread.py), or this
comparison's own when it has 2 or more seeds. Then every claim of the papers (`blocklab.statistics.claims`)
whose architectures are all present, and what the comparison holds equal.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from blocklab.statistics import evidence

SEED_SPREAD = Path(__file__).parents[1] / "recipes" / "seed_spread.json"
# Beyond this many seeds the verdict says "more than" instead of a number.
MOST_SEEDS = 100


def reference_spread(size: str, steps: int | None) -> dict[str, Any] | None:
    """The measured paired-difference spread at `size` whose step count is nearest `steps` (on a log
    scale: 150 steps reads the 120-step figure rather than the 400-step one), or None."""
    entries = json.loads(SEED_SPREAD.read_text())["sizes"].get(size) or []
    if not entries:
        return None
    if not steps:
        return entries[-1]
    return min(entries, key=lambda e: abs(math.log(e["steps"] / steps)))


def seeds_needed(difference: float, sd: float) -> int | None:
    """The fewest seeds (3 or more) whose 95% t-interval half-width, at paired spread `sd`, is below
    |difference|; None beyond MOST_SEEDS (or for a zero difference). Inside `sequential.in_use()` (seeds
    added until decided) the confidence sequence's half-width instead."""
    from blocklab.statistics import sequential

    if sequential.active():
        return sequential.seeds_to_decide(difference, sd) if difference else None
    for n in range(evidence.MIN_SEEDS, MOST_SEEDS + 1):
        if evidence.t_quantile(0.5 + evidence.CONFIDENCE / 2, n - 1) * sd / math.sqrt(n) < abs(difference):
            return n
    return None


def _per_seed(runs: list[dict], key: str = "val_loss") -> dict[int, float]:
    return {r["summary"]["seed"]: r["summary"][key] for r in runs}


def _mean_bpb(runs: list[dict]) -> float | None:
    """The mean bits per byte of `runs`; None when a run has none (a masked LM, or scored tokens that
    hold no text bytes: every one special or unknown), since a mean of some seeds is not comparable."""
    bpbs = list(_per_seed(runs, "val_bpb").values())
    return None if any(b is None for b in bpbs) else sum(bpbs) / len(bpbs)


def _bpb_diff(runs: list[dict], base: list[dict]) -> evidence.Interval | None:
    if _mean_bpb(runs) is None or _mean_bpb(base) is None:
        return None
    return evidence.t_interval(_paired(runs, base, "val_bpb"))


def _interval_text(iv: evidence.Interval, digits: int = 4) -> str:
    return "-" if iv.low is None else f"[{iv.low:+.{digits}f}, {iv.high:+.{digits}f}]"


def _by_seed(runs: list[dict], base: list[dict], key: str = "val_loss") -> dict[int, float]:
    """{seed: difference} over the seeds both have (none: a run added from elsewhere with its own)."""
    a, b = _per_seed(runs, key), _per_seed(base, key)
    return {s: a[s] - b[s] for s in sorted(set(a) & set(b))}


def _paired(runs: list[dict], base: list[dict], key: str = "val_loss") -> list[float]:
    return list(_by_seed(runs, base, key).values())


def pooled_paired_sd(entries, runs_by_label) -> float | None:
    """This comparison's own seed spread of paired differences to the baseline, pooled over the
    architectures (None with fewer than 2 seeds)."""
    base = runs_by_label[entries[0].label]
    groups = [_paired(runs_by_label[e.label], base) for e in entries[1:]]
    groups = [g for g in groups if len(g) >= 2]
    df = sum(len(g) - 1 for g in groups)
    if not df:
        return None
    ss = sum(sum((x - sum(g) / len(g)) ** 2 for x in g) for g in groups)
    return math.sqrt(ss / df)


def ranking(entries, runs_by_label, size: str) -> dict[str, Any]:
    """The ranked verdict as data: per architecture its mean loss and bits per byte, its paired
    difference to the baseline with a t-interval, the reading, and the spread used to read it."""
    base_label = entries[0].label
    steps = runs_by_label[base_label][0]["summary"]["step"]
    own = pooled_paired_sd(entries, runs_by_label)
    ref = reference_spread(size, steps)
    sd, sd_source = ((own, "this comparison's seeds") if own is not None else
                     (ref["paired_sd"], f"{ref['source']}, size {size} at {ref['steps']} steps")
                     if ref else (None, None))
    rows = []
    for e in entries:
        runs = runs_by_label[e.label]
        losses = list(_per_seed(runs).values())
        row: dict[str, Any] = {"label": e.label, "seeds": len(runs), "val_loss": sum(losses) / len(losses),
                               "val_bpb": _mean_bpb(runs)}
        row["baseline"] = e.label == base_label
        d = _paired(runs, runs_by_label[base_label])
        if not row["baseline"] and d:
            iv = evidence.t_interval(d)
            row.update(diff=iv, diff_bpb=_bpb_diff(runs, runs_by_label[base_label]),
                       reading=_reading(iv, sd, base_label))
        elif not row["baseline"]:
            row["reading"] = f"no seed in common with {base_label}: not paired, so not compared"
        rows.append(row)
    rows.sort(key=lambda r: r["val_loss"])
    return {"rows": rows, "baseline": base_label, "paired_sd": sd, "paired_sd_source": sd_source}


def _reading(iv: evidence.Interval, sd: float | None, base: str) -> str:
    """What one difference to the baseline says: lower or higher with the interval, no effect, or
    cannot tell (and how many seeds would)."""
    if iv.n >= evidence.MIN_SEEDS:
        lower = evidence.verdict(iv, "lower", equivalence=evidence.NO_EFFECT_NATS)
        if lower == "reproduced":
            return f"lower than {base}"
        if lower == "contradicted":
            return f"higher than {base}"
        if lower == "no effect":
            return f"no effect (interval within ±{evidence.NO_EFFECT_NATS} nats)"
    if sd is None:
        return f"cannot tell with {iv.n} seed(s); no measured seed spread for this size: try --seeds 3"
    beyond = " (beyond the seed spread)" if abs(iv.mean) > sd else " (within the seed spread)"
    n = seeds_needed(iv.mean, sd)
    more = f"about {n} seeds would tell one this size" if n else f"more than {MOST_SEEDS} seeds"
    if iv.n >= evidence.MIN_SEEDS:
        return f"no clear difference{beyond}; {more}" if n and n > iv.n else f"no clear difference{beyond}"
    return f"cannot tell with {iv.n} seed{'s' if iv.n != 1 else ''}{beyond}; {more}"


VERDICT_HEAD = ["rank", "architecture", "val loss", "bits/byte", "loss - baseline", "95% CI (t)",
                "bits/byte - baseline", "reading"]


def _number(x: float | None, sign: str = "") -> str:
    return "-" if x is None else f"{x:{sign}.4f}"


def verdict_table(ranked: dict[str, Any]) -> list[list[str]]:
    body = []
    for k, r in enumerate(ranked["rows"], 1):
        if "diff" not in r:
            body.append([str(k), r["label"], f"{r['val_loss']:.4f}", _number(r["val_bpb"]),
                         "baseline" if r["baseline"] else "-", "-", "-", r.get("reading") or "-"])
            continue
        iv, iv_bpb = r["diff"], r["diff_bpb"]
        body.append([str(k), r["label"], f"{r['val_loss']:.4f}", _number(r["val_bpb"]), f"{iv.mean:+.4f}",
                     _interval_text(iv), _number(iv_bpb and iv_bpb.mean, "+"), r["reading"]])
    return body


def as_data(ranked: dict[str, Any]) -> dict[str, Any]:
    """The ranking for results.json (intervals as mean, low, high, n)."""
    def interval(iv: evidence.Interval | None) -> dict[str, Any] | None:
        return None if iv is None else {"mean": iv.mean, "low": iv.low, "high": iv.high, "n": iv.n}

    return {**{k: ranked[k] for k in ("baseline", "paired_sd", "paired_sd_source")},
            "rows": [{"label": r["label"], "seeds": r["seeds"], "val_loss": r["val_loss"],
                      "val_bpb": r["val_bpb"], "diff": interval(r.get("diff")),
                      "diff_bpb": interval(r.get("diff_bpb")), "reading": r.get("reading")}
                     for r in ranked["rows"]]}


def terminal_lines(data: dict[str, Any]) -> list[str]:
    """The verdict as the terminal prints it after a compare (from results.json's "verdict"), with the
    report's caveats: the seeds, and what each difference can and cannot say."""
    rows = data["rows"]
    n = min(r["seeds"] for r in rows)
    head = (f"verdict ({n} seed{'s' if n != 1 else ''} per architecture"
            + ("; too few to tell a difference from noise" if n < evidence.MIN_SEEDS else "") + "):")
    lines = [head]
    for k, r in enumerate(rows, 1):
        d = r["diff"]
        if d is None:
            lines.append(f"  {k}. {r['label']:<20} {r['val_loss']:.4f}  {r['reading'] or 'baseline'}")
            continue
        ci = "" if d["low"] is None else f" [{d['low']:+.4f}, {d['high']:+.4f}]"
        lines.append(f"  {k}. {r['label']:<20} {r['val_loss']:.4f}  {d['mean']:+.4f}{ci}  {r['reading']}")
    return lines


def verdict_text(ranked: dict[str, Any]) -> str:
    rows = ranked["rows"]
    n = min(r["seeds"] for r in rows)
    spread = ("" if ranked["paired_sd"] is None else
              f" The seed-to-seed standard deviation of paired differences is {ranked['paired_sd']:.3f} nats "
              f"({ranked['paired_sd_source']}).")
    if n >= evidence.MIN_SEEDS:
        how = (f"Each difference is paired by seed ({n} seeds: the same batches and held-out windows) with "
               "a 95% Student t-interval; 'lower' or 'higher' only where the interval excludes zero, "
               f"'no effect' where it holds zero within ±{evidence.NO_EFFECT_NATS} nats.")
    else:
        two = (" (with two, Student's t quantile is 12.7: the interval is about 18 standard deviations "
               "wide)") if n == 2 else ""
        which = "single runs" if n == 1 else "means of two"
        how = (f"With {n} seed{'s' if n != 1 else ''} per architecture this report cannot tell a difference "
               f"from seed-to-seed noise: the ranking below is of {which}{two}. The reading says how "
               "many seeds would tell a difference of the size seen; `--seeds N` trains them (finished runs "
               "are reused).")
    bpb = "bits per byte beside it" if all(r["val_bpb"] is not None for r in rows) else (
        "bits per byte are not available for every run, '-' where missing: a masked LM, or held-out tokens "
        "that hold no text bytes (every one special or unknown to the tokenizer)")
    return (f"Architectures ranked by final validation loss (nats per token; {bpb}), "
            f"lowest first, against the baseline `{ranked['baseline']}`. {how}{spread}")


# -- the claims the runs cover ------------------------------------------------------------------------
def claim_rows(entries, runs_by_label, setting: str | None) -> list[list[str]]:
    """Every claim (`statistics.claims`) with a validation-loss check whose architectures are all among
    the entries (by preset name): each such check's paired difference, interval and verdict. A check
    made at another budget kind than these runs' (Bank of Values compares at equal FLOPs) is measured
    here anyway and says so; one that needs other runs (a longer sequence) says which command has them."""
    from blocklab.statistics.claims import CLAIMS

    by_arch = {e.arch: runs_by_label[e.label] for e in entries if e.label == e.arch}
    rows = []
    for claim in CLAIMS:
        checks = [c for c in claim.checks if c.metric == "val_loss"]
        if not checks or not all(set(c.archs) <= by_arch.keys() for c in checks):
            continue
        verdicts = []
        for c in checks:
            expected = c.relation + (f" {c.tolerance:g}" if c.tolerance else "")
            what = f"{c.arch} - {c.baseline}" + (f" - ({c.minus[0]} - {c.minus[1]})" if c.minus else "")
            if c.minus_setting:
                rows.append([claim.id, what, expected, "-", "-",
                             f"needs runs at the {c.minus_setting} setting: blocklab reproduce"])
                verdicts.append("inconclusive")
                continue
            by_seed = _by_seed(by_arch[c.arch], by_arch[c.baseline])
            if c.minus:
                minus = _by_seed(by_arch[c.minus[0]], by_arch[c.minus[1]])
                by_seed = {seed: v - minus[seed] for seed, v in by_seed.items() if seed in minus}
            if not by_seed:
                rows.append([claim.id, what, expected, "-", "-", "no seed in common: not paired"])
                verdicts.append("inconclusive")
                continue
            iv = evidence.t_interval(list(by_seed.values()))
            verdict = evidence.verdict(iv, c.relation, c.tolerance, equivalence=evidence.NO_EFFECT_NATS)
            verdicts.append(verdict)
            caveats = []
            if setting is not None and c.setting != setting:
                caveats.append(f"these runs are at equal {BUDGET_WORDS.get(setting, setting)}, the paper "
                               f"compares at equal {BUDGET_WORDS.get(c.setting, c.setting)}")
            if iv.n < evidence.MIN_SEEDS:
                caveats.append(f"{iv.n} seed{'s' if iv.n != 1 else ''}: {evidence.MIN_SEEDS} or more decide")
            caveat = f" ({'; '.join(caveats)})" if caveats else ""
            rows.append([claim.id, what, expected, f"{iv.mean:+.4f}", _interval_text(iv), verdict + caveat])
        others = len(claim.checks) - len(checks)
        if len(checks) > 1 or others:
            rows.append([claim.id, "loss checks together" + (
                f" ({others} other checks: blocklab reproduce)" if others else ""), "", "", "",
                evidence.combine(verdicts)])
    return rows


CLAIMS_HEAD = ["claim", "check", "expected", "mean", "95% CI (t)", "verdict"]
BUDGET_WORDS = {"flops": "FLOPs", "steps": "steps", "tokens": "tokens", "time": "wall-clock time"}


def held_equal_text(rows: list[dict], kind: str) -> str:
    """What the comparison holds equal, and what it lets differ: steps, tokens, FLOPs, parameters with
    and without the value tables (rows: compare's results rows)."""
    base = rows[0]
    flops = ", ".join(f"`{r['label']}` {r['flops_per_token'] / base['flops_per_token']:.2f}x"
                      for r in rows[1:])
    params = ", ".join(
        f"`{r['label']}` {r['params']['total'] / base['params']['total']:.2f}x"
        + (f" ({(r['params']['total'] - r['params']['value_tables']) / base['params']['total']:.2f}x without "
           "its value tables)" if r["params"]["value_tables"] else "")
        for r in rows[1:])
    equal = {
        "steps": "Every run takes the same steps on the same batches, so the same tokens; FLOPs differ with "
                 "each block's FLOPs per token",
        "tokens": "Every run sees the same tokens; FLOPs differ with each block's FLOPs per token",
        "flops": "Every run spends the same training FLOPs, so a cheaper block takes more steps and tokens",
        "time": "Every run trains for the same seconds, so a faster block takes more steps and tokens; the "
                "result depends on this machine and its load",
    }.get(kind, "The runs share one budget")
    text = (f"{equal}. FLOPs per token against `{base['label']}`: {flops}. Parameters: {params}." if rows[1:]
            else f"{equal}.")
    if any(r["params"]["value_tables"] for r in rows):
        text += (" Value tables (Bank of Values' E_v) are read by token id, one row per token, like the "
                 "embedding: they add parameters but no FLOPs, which is why the paper compares at equal "
                 "FLOPs and counts them with the embeddings.")
    return text
