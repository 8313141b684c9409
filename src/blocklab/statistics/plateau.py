"""The unigram plateau: where a language model sits before it uses any context.

A model that has learned only how often each token occurs in its training data scores, on the
held-out tokens, the cross-entropy U of those tokens under the training split's unigram frequencies
(`unigram_loss`); early training often rests near U for a while before the loss falls below it. A
comparison made while runs are still near U measures when each run happened to leave the plateau, not
its architecture, so the compare report marks runs by the first validation step at which their loss
fell below U - `PLATEAU_MARGIN`.

Why U and not the entropy of the held-out split's own frequencies: the split is by file, so the
held-out tokens' frequencies differ from the training ones, and a model can only learn the latter. On
the embedded corpus (BPE 4096) the held-out split's own entropy is 6.13 nats while U is 6.59 on the
scored tokens, which is where the runs sit (6.6); exits measured against the entropy came about 150
steps after the curves visibly left the plateau (docs/design.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

PLATEAU_MARGIN = 0.1  # nats below the plateau's loss that count as having left the plateau


def unigram_loss(train_tokens: np.ndarray, labels: Iterator[np.ndarray], vocab_size: int) -> float:
    """The mean cross-entropy (nats) of the `labels` (batches of target ids; -100 is not scored) under
    the unigram frequencies of `train_tokens`, add-1/2 smoothed so that an unseen token costs a finite
    amount: the validation loss of a model that knows only the training split's token counts."""
    counts = np.bincount(np.asarray(train_tokens), minlength=vocab_size).astype(np.float64) + 0.5
    log_p = np.log(counts / counts.sum())
    total, n = 0.0, 0
    for batch in labels:
        ids = np.asarray(batch).ravel()
        ids = ids[ids >= 0]
        total -= float(log_p[ids].sum())
        n += ids.size
    return total / max(n, 1)


def run_plateau(data: Any, val_batches: Any, batch_size: int, eval_batches: int | None) -> float:
    """U of a run: `unigram_loss` of the training split of `data` (a PreparedData) on the targets its
    validation scores (`val_batches.validation(batch_size, eval_batches)`, a data.Batches)."""
    labels = (b["labels"].numpy() for b in val_batches.validation(batch_size, eval_batches))
    return unigram_loss(data.train, labels, data.tokenizer.vocab_size)


def plateau_exit(curve: Iterable[tuple[int, float]], plateau: float, margin: float = PLATEAU_MARGIN
                 ) -> int | None:
    """The first step of `curve` ((step, validation loss) pairs in step order) whose loss is below
    `plateau` - `margin` (the `unigram_loss`), or None if the run never got there."""
    for step, loss in curve:
        if loss < plateau - margin:
            return step
    return None


# How far below the plateau a final loss must be for the report not to warn that the run ended near it,
# and how late (a fraction of the run's steps) leaving it counts as late: such a run's final loss says
# more about when it left the plateau than about its architecture.
NEAR_PLATEAU = 0.5
LATE_EXIT = 0.5


def run_health(curve: list[tuple[int, float]], plateau: float | None, final_step: int) -> dict[str, Any]:
    """One run's plateau facts: the plateau's loss (`unigram_loss`), the step it left the plateau
    (None: never, or the plateau is unknown), its final loss below the plateau, and whether that exit
    was late or the final loss is near the plateau."""
    if plateau is None or not curve:
        return {"plateau": plateau, "exit_step": None, "below": None, "late": False, "near": False}
    exit_step = plateau_exit(curve, plateau)
    below = plateau - curve[-1][1]
    return {"plateau": plateau, "exit_step": exit_step, "below": below,
            "late": exit_step is None or exit_step > LATE_EXIT * final_step,
            "near": below < NEAR_PLATEAU}


def spread_warnings(finals: dict[str, dict[int, float]]) -> list[str]:
    """`finals`: label -> {seed: final validation loss}, the first label the reference. One line for
    each label whose mean difference to the reference, paired by seed, is no larger than the standard
    deviation of those per-seed differences (needs two shared seeds): that difference is within the
    noise. Paired, because every architecture of a seed sees the same batches and held-out windows,
    so what the seed changes for both cancels; unpaired seed spreads would call a steady gap noise."""
    import statistics

    labels = list(finals)
    ref = finals[labels[0]]
    out = []
    for label in labels[1:]:
        diffs = [finals[label][seed] - ref[seed] for seed in finals[label] if seed in ref]
        if len(diffs) < 2:
            continue
        mean, noise = statistics.fmean(diffs), statistics.stdev(diffs)
        if abs(mean) <= noise:
            out.append(f"`{label}` - `{labels[0]}` = {mean:+.4f} nats, no larger than the standard "
                       f"deviation of its per-seed differences ({noise:.4f})")
    return out
