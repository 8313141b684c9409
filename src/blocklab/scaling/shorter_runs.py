"""Shorter runs of a ladder's largest rung (a ladder file's `shorter_runs: [0.25, 0.5, 0.75]`), for the data
equivalence (Value Residual Learning, Fig. 6 right): how many tokens X needs to reach the baseline's final
loss.

Without them that is read off X's own run on the way: a mid-run loss, taken part-way through a longer
run's warmup and decay, which is not the loss of a run trained for that many tokens with its own (the two
differ in either direction: docs/scaling.md measures both on one ladder). With them, each architecture
also trains the largest rung for f x its steps, for each fraction f, with everything else as that rung's
runs (same seed, so the same first batches; same peak rate; its own schedule over its own steps). Each
architecture's curve for a seed is then

    (f_1 T, L(f_1 T)), ..., (f_k T, L(f_k T)), (T, L(T)),    L(t): the final loss of a run of t tokens,

and T_X is where X's curve reaches the baseline's L(T), read linearly in log tokens between the points
(`fit.tokens_to_reach`). A saving larger than 1 - min(f) cannot be read: X's shortest run already reached
the loss, and the reading stops there.

The runs live in `OUT/<ladder>/<largest rung>/shorter/runs/<arch>-steps<k>-seed<s>`, in the run store's
layout, so a finished one is reused and an interrupted one resumes; `ladders.plan` plans them with the
seed's other runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from blocklab.compare import Entry, merge, run_configs
from blocklab.training import TrainConfig
from blocklab.util.errors import ConfigError

SHORTER_FOLDER = "shorter"  # OUT/<ladder>/<largest rung>/shorter/runs/<arch>-steps<k>-seed<s>


def shorter_steps(fractions: tuple[float, ...], full: int, rung: str) -> list[int]:
    """The steps of the shorter runs: round(f x `full`) for each fraction, in increasing order; refused
    when one rounds to 0 or to `full`, or two round to the same steps."""
    steps = [round(f * full) for f in sorted(fractions)]
    for f, k in zip(sorted(fractions), steps, strict=True):
        if not 0 < k < full:
            raise ConfigError(f"shorter_runs: fraction {f:g} of rung {rung}'s {full} steps gives {k} "
                              f"steps: a shorter run trains between 1 and {full - 1} steps; give fractions "
                              f"whose runs are shorter than {full} steps and at least one step long")
    if len(set(steps)) < len(steps):
        twice = next(k for k in steps if steps.count(k) > 1)
        raise ConfigError(f"shorter_runs: two fractions give the same {twice} steps of rung {rung}'s "
                          f"{full}: give fractions farther apart")
    return steps


def run_name(arch_label: str, steps: int) -> str:
    return f"{arch_label}-steps{steps}"


def shorter_configs(entries: list[Entry], seeds: int, top: Path, fields: dict[str, Any],
                    fractions: tuple[float, ...], rung: str) -> dict[int, list[tuple[Entry, TrainConfig]]]:
    """Each shorter run of the largest rung, by its steps: every entry (an architecture at its rates) at
    every seed, `fields` (that rung's) with max_steps f x its steps, in `top`/shorter."""
    full = fields["max_steps"]
    return {k: run_configs([Entry(run_name(e.label, k), e.arch, e.model, e.train) for e in entries], seeds,
                           top / SHORTER_FOLDER, merge(fields, {"max_steps": k}))
            for k in shorter_steps(fractions, full, rung)}


def check_fractions(value: Any, where: str) -> tuple[float, ...]:
    """A ladder file's `shorter_runs`: a list of one or more distinct fractions strictly between 0 and 1."""
    example = "e.g. shorter_runs: [0.25, 0.5, 0.75]"
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: shorter_runs = {value!r} is not allowed: give a list of fractions of "
                          f"the largest rung's steps, {example}")
    for f in value:
        if isinstance(f, bool) or not isinstance(f, int | float) or not 0 < f < 1:
            raise ConfigError(f"{where}: shorter_runs fraction {f!r} is not allowed: every fraction lies "
                              f"strictly between 0 and 1 (a run shorter than the rung's), {example}")
    if len({float(f) for f in value}) < len(value):
        raise ConfigError(f"{where}: a shorter_runs fraction is given twice in {value!r}: give distinct "
                          "fractions")
    return tuple(sorted(float(f) for f in value))


def curve(shorter: list[tuple[float, float]], full_tokens: float, full_loss: float
          ) -> tuple[list[float], list[float]]:
    """One architecture's loss-against-tokens curve for one seed from its shorter runs' (tokens, final
    loss) and its full run's: the points `fit.data_ratio` reads, in increasing tokens."""
    points = sorted(shorter) + [(full_tokens, full_loss)]
    return [t for t, _ in points], [v for _, v in points]
