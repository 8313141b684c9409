"""The page's "on prose" column: the claims decided at the `cpu` scale, judged again on English text.

Every verdict of the `cpu` scale rests on one corpus, Python code. Scale `cpu-prose` trains the same
claims, with the same sizes, budgets, seeds and learning-rate sweep, on the embedded English corpus
(`data.source=shakespeare`); its store is OUT/cpu-prose, beside OUT/cpu. For each claim `cpu` decided
(reproduced, contradicted or no effect) the column gives the verdict there and whether each check's
difference falls on the same side of zero on both corpora: a measured check's side is where its 95%
interval lies (above zero, below zero, or holding it), an exact check's the side of its value against
its reference.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from blocklab.reproduce.judge import PENDING, CheckResult, ClaimResult, Reproduction
from blocklab.reproduce.orchestrate import reproduce
from blocklab.reproduce.page_scales import NOT_YET_RUN, status
from blocklab.statistics.evidence import Interval

CODE_SCALE, PROSE_SCALE = "cpu", "cpu-prose"
COLUMN = "on prose"
DECIDED = ("reproduced", "contradicted", "no effect")
SAME, OPPOSITE, ONE_SIDED = "same sign", "opposite sign", "sign shown on one corpus only"


def code_rep(reps: list[Reproduction]) -> Reproduction | None:
    """The page's `cpu` scale, whose decided claims the column judges again; None: not on the page."""
    return next((rep for rep in reps if rep.scale_name == CODE_SCALE), None)


def read_prose_store(reps: list[Reproduction]) -> Reproduction | None:
    """The `cpu` claims' verdicts in OUT/cpu-prose, read as `--no-train --partial` reads a store (nothing
    trains, unfinished claims read pending); None when the page has no `cpu` scale or the store no folder."""
    code = code_rep(reps)
    if code is None or code.out is None or not (code.out.parent / PROSE_SCALE).is_dir():
        return None
    return reproduce([r.claim for r in code.results], PROSE_SCALE, code.out.parent, train=False, partial=True,
                     log=lambda *_: None)


def interval_side(iv: Interval) -> str | None:
    """'+', '-' or '0': where a 95% interval lies against zero ('0': it holds zero); None: no interval
    (one seed)."""
    if iv.low is None or iv.high is None:
        return None
    return "+" if iv.low > 0 else "-" if iv.high < 0 else "0"


def side(result: CheckResult) -> str | None:
    """'+', '-' or '0': where a check's difference lies against zero ('0': its interval holds zero, or an
    exact value equals its reference); None: nothing to read (pending, or an interval of one seed)."""
    if result.interval is not None:
        return interval_side(result.interval)
    if result.value is None or result.reference is None:
        return None
    if math.isclose(result.value, result.reference, rel_tol=1e-9, abs_tol=1e-12):
        return "0"
    return "+" if result.value > result.reference else "-"


def agreement(code: ClaimResult, prose: ClaimResult) -> str:
    """Whether every check's difference lies on the same side of zero on both corpora (SAME), some on
    opposite sides (OPPOSITE), or some off zero on one corpus and holding it on the other (ONE_SIDED)."""
    return sign_agreement([(side(a), side(b)) for a, b in zip(code.checks, prose.checks, strict=True)])


def sign_agreement(pairs: list[tuple[str | None, str | None]]) -> str:
    """The agreement of (code, prose) sides ('+', '-', '0'; None: not measured): SAME, OPPOSITE or
    ONE_SIDED as `agreement` reads them; the headline numbers' column (`headlines.prose`) reads it too."""
    if any(a is None or b is None for a, b in pairs):
        return "sign not measured"
    if any({a, b} == {"+", "-"} for a, b in pairs):
        return OPPOSITE
    return SAME if all(a == b for a, b in pairs) else ONE_SIDED


def prose_cells(reps: list[Reproduction], prose: Reproduction | None, ids: list[str]) -> list[str]:
    """The column's cell for each claim of `ids`: "-" for a claim `cpu` did not decide (or does not
    judge); NOT_YET_RUN without a store; else the prose verdict (or how far its runs have got) and,
    once judged, the agreement of signs."""
    code = code_rep(reps)
    decided = {r.claim.id: r for r in code.results if r.verdict in DECIDED} if code is not None else {}
    judged = {r.claim.id: r for r in prose.results} if prose is not None else {}
    cells = []
    for cid in ids:
        if cid not in decided:
            cells.append("-")
        elif prose is None or cid not in judged:
            cells.append(NOT_YET_RUN)
        elif judged[cid].verdict == PENDING:
            cells.append(status(prose, judged[cid]))
        else:
            cells.append(f"{judged[cid].verdict}; {agreement(decided[cid], judged[cid])}")
    return cells


def column_text(reps: list[Reproduction], page: Path) -> str:
    """What the column shows, and where its runs are: a link to the store's report relative to the page
    once it has one, the store's folder before."""
    code = code_rep(reps)
    assert code is not None and code.out is not None
    store = code.out.parent / PROSE_SCALE
    where = (f"[its report]({os.path.relpath(store / 'reproduction.md', page.parent)})"
             if (store / "reproduction.md").is_file() else f"runs in `{os.path.relpath(store, page.parent)}`")
    train = f"blocklab reproduce --scale {PROSE_SCALE} --out {store.parent} --report {store}"  # as typed
    return (f"*{COLUMN.capitalize()}*: each claim decided at `{CODE_SCALE}` (reproduced, contradicted or no "
            "effect), judged again on English text instead of Python code: the embedded corpus "
            "`shakespeare` (Shakespeare's plays and poems, its own BPE at the same settings), the same "
            f"sizes, budgets, seeds and learning-rate sweep (scale `{PROSE_SCALE}`, {where}; `{train}` "
            f"trains it). Beside the verdict there: *{SAME}* when every check's 95% interval lies on the "
            f"same side of zero on both corpora (or holds zero on both), *{OPPOSITE}* when one lies above "
            f"zero on one corpus and below on the other, *{ONE_SIDED}* otherwise; \"-\": not decided at "
            f"`{CODE_SCALE}`.")
