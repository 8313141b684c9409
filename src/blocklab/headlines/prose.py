"""The headline table's "on prose" column: the `cpu` ladder's headline numbers read again on English text.

Every headline number of the `cpu` ladder rests on one corpus, Python code. The same ladder trained on
the embedded English corpus (`data.source=shakespeare`: the same rungs, tokens, learning rates and seeds)
lives in its own store, OUT/prose/ladder-cpu, so that neither store's runs, report or until-decided
record is mistaken for the other's. For each headline claim the column gives the verdict there, read
as `blocklab scaling --no-train` reads that store (every whole seed, 95% t-intervals), and whether its
sign agrees with the code ladder's, by the claims table's rule and words (`reproduce.page_prose`): an
equivalence's side is where its 95% interval lies (above zero, below zero, or holding it), Bank of
Values' two paired loss differences each a side of their own. While the claim's two architectures have
not finished every rung at the ladder's seeds the cell says how far they have got, as the claims table
does for a scale under way.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from blocklab.reproduce.page_prose import COLUMN, ONE_SIDED, OPPOSITE, SAME, interval_side, sign_agreement
from blocklab.reproduce.page_scales import NOT_YET_RUN
from blocklab.scaling.judge import HeadlineResult, LadderData, ScalingResult, judge_ladder, read_ladder

LADDER = "cpu"  # the ladder whose table has the column
FOLDER = "prose"  # OUT/prose/ladder-cpu: the store of the ladder on prose
FIELDS = ["data.source=shakespeare"]  # the overrides it is trained with
# the architectures the command below trains (Bank of Values' claim waits for --archs to add bov)
ARCHS = ("pre-ln", "resformer", "svformer", "sas-p")

__all__ = ["COLUMN", "LADDER", "column_text", "prose_cells"]


def prose_root(store: Path) -> Path:
    return store / FOLDER / f"ladder-{LADDER}"


def train_command(store: Path) -> str:
    """The command that trains the prose store (it reuses finished runs, so it also resumes)."""
    from blocklab.util.commands import pasteable

    return pasteable("blocklab", "scaling", "--ladder", LADDER, "--archs", ",".join(ARCHS),
                     "--out", store / FOLDER, *FIELDS)


def read_prose(store: Path) -> LadderData | None:
    """The prose store's finished runs (None: no store), after refusing a run trained with another config
    than the ladder with FIELDS (another corpus, say), as `scaling --no-train` refuses it."""
    from blocklab.scaling.ladders import LADDERS
    from blocklab.scaling.orchestrate import check_store
    from blocklab.scaling.overrides import with_user_fields
    from blocklab.training.config import apply_overrides

    root = prose_root(store)
    if not root.is_dir():
        return None
    ladder = with_user_fields(LADDERS[LADDER], LADDER, apply_overrides({}, FIELDS))
    archs = list(ladder.archs)
    check_store(archs, ladder, root, no_train=True)
    return read_ladder(root, ladder, archs, root.name)


def finished(data: LadderData, archs: list[str]) -> int:
    """The runs of `archs` finished in the store at the ladder's own seeds (every rung)."""
    return sum(s < data.ladder.seeds for a in archs for r in data.rungs for s in data.points.get((a, r), {}))


def judged(data: LadderData) -> ScalingResult | None:
    """The prose store judged on the baseline and every architecture whose runs at the ladder's seeds have
    all finished (each claim reads only its two architectures' fits); None: no such pair yet."""
    whole = len(data.rungs) * data.ladder.seeds
    archs = [a for a in data.archs if finished(data, [a]) == whole]
    if not archs or archs[0] != data.archs[0] or len(archs) < 2:
        return None
    return judge_ladder(replace(data, archs=archs))


def sides(h: HeadlineResult, result: ScalingResult) -> list[str | None]:
    """Where a headline claim's intervals lie against zero: its equivalence's, or Bank of Values' paired
    loss differences at the smallest and the largest rung."""
    if h.claim.measure == "gain across sizes":
        gains = result.gains[h.claim.arch]
        return [interval_side(gains[r]) for r in (result.data.rungs[0], result.data.rungs[-1])]
    return [None if h.interval is None else interval_side(h.interval)]


def prose_cells(code: ScalingResult, store: Path) -> list[str]:
    """The column's cell for each headline claim of the code ladder `code`: NOT_YET_RUN while the prose
    store has no run of the claim's two architectures, "partial: k of n runs" while some are missing, or
    that the claim's architecture is not trained on prose when it is not among the shipped command's
    (`ARCHS`) and has no run there, else the verdict there and the agreement of signs."""
    data = read_prose(store)
    prose = judged(data) if data is not None else None
    verdicts = {h.claim.id: h for h in prose.headlines} if prose is not None else {}
    cells = []
    for h in code.headlines:
        archs = [h.claim.baseline, h.claim.arch]
        done = finished(data, archs) if data is not None else 0
        total = len(archs) * len(code.data.rungs) * code.data.ladder.seeds
        if not done:
            cells.append(NOT_YET_RUN)
        elif h.claim.arch not in ARCHS and not finished(data, [h.claim.arch]):
            cells.append(f"not trained: {h.claim.arch} is not in the prose ladder's --archs")
        elif done < total or prose is None or h.claim.id not in verdicts:
            cells.append(f"partial: {done} of {total} runs")
        else:
            there = verdicts[h.claim.id]
            pairs = list(zip(sides(h, code), sides(there, prose), strict=True))
            cells.append(f"{there.verdict}; {sign_agreement(pairs)}")
    return cells


def column_text(store: Path, page_dir: Path) -> str:
    """What the column shows, where its runs are (a link to the prose store's report once it has one)
    and the command that trains them."""
    root = prose_root(store)
    where = (f"[its report]({os.path.relpath(root / 'scaling.md', page_dir)})"
             if (root / "scaling.md").is_file() else f"runs in `{os.path.relpath(root, page_dir)}`")
    return (
        f"*{COLUMN.capitalize()}*: each headline number read again on the `{LADDER}` ladder trained on "
        "English text instead of Python code: the embedded corpus `shakespeare` (Shakespeare's plays and "
        "poems, its own BPE at the same settings), the same rungs, tokens, learning rates and seeds "
        f"({where}; `{train_command(store)}` trains it; Bank of Values' claim waits for bov in "
        f"`--archs`). Beside the verdict there: *{SAME}* when every interval of the claim lies on the same "
        f"side of zero on both corpora (or holds zero on both), *{OPPOSITE}* when one lies above zero on one "
        f"corpus and below on the other, *{ONE_SIDED}* otherwise; \"{NOT_YET_RUN}\" or \"partial: k of n "
        "runs\" while the claim's two architectures have not finished every rung at the ladder's seeds."
    )
