"""Seeds until decided: train a round, judge, and add a seed while a selected claim is undecided and the
budget (`--max-seeds`, `--max-hours`) allows another round.

Every verdict of a round reads the anytime-valid confidence sequence (`blocklab.statistics.sequential`)
in place of the t-interval, so that looking after every round and stopping once every claim is decided
leaves each interval at least 95% sure to hold the truth (docs/statistics-sequential.md). The driver
here knows nothing of training: each command (`rounds.commands`: scaling, reproduce, compare) gives it
a function that trains (or reuses) its runs up to n seeds and one that judges them, returning what is
still undecided. One module per job:
- this one: the flags, the budget and the loop;
- commands: a round of each command, and what it leaves undecided.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from blocklab.statistics import evidence, sequential
from blocklab.util.errors import ConfigError


def add_until_decided_arguments(parser: argparse.ArgumentParser) -> None:
    """--until-decided, --max-seeds and --max-hours, on the parser of a command that judges claims."""
    parser.add_argument("--until-decided", action="store_true",
                        help="add seeds in rounds, one seed of every run the verdicts read at a time, until "
                        "every selected claim is decided or the budget ends; every interval is then an "
                        "anytime-valid 95%% confidence sequence (docs/statistics-sequential.md). Needs "
                        "--max-seeds, --max-hours or both")
    parser.add_argument("--max-seeds", type=int, metavar="N",
                        help="with --until-decided: stop at N seeds (3 or more)")
    parser.add_argument("--max-hours", type=float, metavar="H",
                        help="with --until-decided: start another round only while its estimated time fits "
                        "in H hours from the start of the call (the first round always trains)")


@dataclass(frozen=True)
class Budget:
    """How far seeds may be added: at most `max_seeds`, within `max_hours` of the call (None: no bound)."""

    max_seeds: int | None = None
    max_hours: float | None = None

    def __post_init__(self) -> None:
        if self.max_seeds is None and self.max_hours is None:
            raise ConfigError("--until-decided needs a budget: give --max-seeds N, --max-hours H or both")
        least = evidence.MIN_SEEDS
        if self.max_seeds is not None and (isinstance(self.max_seeds, bool) or self.max_seeds < least):
            raise ConfigError(f"--max-seeds {self.max_seeds} is not allowed: give {least} or more (the "
                              "fewest seeds a verdict reads)")
        if self.max_hours is not None and not 0 < self.max_hours < math.inf:  # NaN fails this too
            raise ConfigError(f"--max-hours {self.max_hours} is not allowed: give a positive number of hours")

    def describe(self) -> str:
        parts = ([f"at most {self.max_seeds} seeds"] if self.max_seeds is not None else []) + (
            [f"{self.max_hours:g} hours"] if self.max_hours is not None else [])
        return " and ".join(parts)


def budget_from_args(args: argparse.Namespace) -> Budget | None:
    """The budget of `--until-decided` (None without it); a budget flag without it is refused."""
    if not getattr(args, "until_decided", False):
        for flag in ("max_seeds", "max_hours"):
            if getattr(args, flag, None) is not None:
                raise ConfigError(f"--{flag.replace('_', '-')} is a budget of --until-decided: add "
                                  "--until-decided, or leave it out")
        return None
    return Budget(args.max_seeds, args.max_hours)


@dataclass(frozen=True)
class Pending:
    """A claim still undecided at a look: its name, and how many seeds in all would decide one of its
    size at its spread (None: more than `sequential.MOST_SEEDS`, or not a matter of seeds: `why`)."""

    name: str
    seeds: int | None = None
    why: str = ""

    def text(self, now: int) -> str:
        if self.seeds is not None:
            more = max(self.seeds - now, 1)
            return f"{self.name}: about {more} more seed{'s' if more != 1 else ''} would tell"
        return f"{self.name}: {self.why or f'more than {sequential.MOST_SEEDS} seeds at this spread'}"


def pending(name: str, interval: evidence.Interval | None, equivalence: float | None = None,
            why: str = "") -> Pending:
    """An undecided claim read off its interval: the seeds its confidence sequence would need, at this
    mean and spread, to exclude zero or lie within +-`equivalence`."""
    if interval is None or interval.n < 2:
        return Pending(name, None, why or "no interval to read yet")
    import statistics

    sd = statistics.stdev(interval.values)
    return Pending(name, sequential.seeds_to_decide(interval.mean, sd, equivalence, interval.n + 1), why)


@dataclass
class Look:
    seeds: int
    undecided: list[Pending]
    seconds: float  # the round's wall clock, training and judging
    trained: int  # runs the round trained (0: all reused)


@dataclass
class Outcome:
    """The rounds as they went, and why they stopped: "decided", "max seeds" or "max hours"."""

    budget: Budget
    looks: list[Look] = field(default_factory=list)
    stopped: str = ""
    next_round: float | None = None  # with "max hours": the estimated seconds of the round that did not fit
    left: float | None = None  # ... and the seconds the budget had left

    @property
    def seeds(self) -> int:
        return self.looks[-1].seeds

    def ending(self) -> str:
        """How the rounds stopped, the claims left out: "decided at n seeds", or "budget ended at n seeds"
        and which budget, in words."""
        n = self.seeds
        if self.stopped == "decided":
            return f"decided at {n} seeds"
        why = (f"--max-seeds {self.budget.max_seeds} reached" if self.stopped == "max seeds" else
               f"--max-hours {self.budget.max_hours:g}: the next round, about {_minutes(self.next_round)}, "
               f"does not fit in the {_minutes(self.left)} left")
        return f"budget ended at {n} seeds ({why})"

    def headline(self) -> str:
        if self.stopped == "decided":
            return self.ending()
        undecided = self.looks[-1].undecided
        return f"{self.ending()}: inconclusive; " + "; ".join(p.text(self.seeds) for p in undecided)

    def lines(self) -> list[str]:
        rounds = ", ".join(f"{look.seeds} ({len(look.undecided)} undecided)" for look in self.looks)
        return [f"until decided: {self.headline()}",
                f"  looks at seeds {rounds}; intervals: {sequential.NAME}"]

    def text(self) -> str:
        """A paragraph for a report."""
        looks = ", ".join(str(look.seeds) for look in self.looks)
        return (f"Seeds until decided ({self.budget.describe()}): {self.headline()}. Looks after each round "
                f"at {looks} seeds. Every interval in this report is an {sequential.NAME}, not a "
                "t-interval: it holds the truth with at least 95% whenever the rounds stopped, since it "
                "holds at every seed count at once (docs/statistics-sequential.md).")

    def record(self) -> dict[str, Any]:
        return {"method": sequential.NAME, "budget": {"max_seeds": self.budget.max_seeds,
                                                       "max_hours": self.budget.max_hours},
                "stopped": self.stopped, "seeds": self.seeds, "headline": self.headline(),
                "ended": self.ending(),
                "looks": [{"seeds": look.seeds, "seconds": look.seconds, "trained": look.trained,
                           "undecided": [p.text(look.seeds) for p in look.undecided]} for look in self.looks]}


def _minutes(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds / 60:.1f} min"


def until_decided(start: int, train: Callable[[int], int], judge: Callable[[], list[Pending]],
                  budget: Budget, estimate: Callable[[int], float] | None = None,
                  clock: Callable[[], float] = time.monotonic, log=print, began: float | None = None
                  ) -> Outcome:
    """Train (or reuse) `start` seeds, then one more at a time, judging after each round, until `judge`
    leaves nothing undecided or the budget ends. `train(n)` trains seeds 0..n-1 and returns how many runs
    it trained; `judge()` returns the claims still undecided. Both run inside `sequential.in_use()`, so
    every verdict and report of a round reads the confidence sequence. The next round's time is the last
    round's time per seed added when that round trained something, else `estimate(n)` (the seconds the
    runs of seed n - 1 take), else unknown: the round starts, and its time is measured. `began`: the
    clock when the call began, if before (what it trained before the rounds, a learning-rate sweep,
    counts against `max_hours` too)."""
    began = clock() if began is None else began
    outcome = Outcome(budget)
    n = max(start, evidence.MIN_SEEDS)
    if budget.max_seeds is not None:
        n = min(n, budget.max_seeds)
    per_seed: float | None = None
    previous = 0
    while True:
        round_began = clock()
        with sequential.in_use():  # reports written while training read the sequence too
            trained = train(n)
            undecided = judge()
        took = clock() - round_began
        outcome.looks.append(Look(n, undecided, took, trained))
        if trained:
            per_seed = took / max(n - previous, 1)
        log(f"round at {n} seeds: {len(undecided)} undecided ({took / 60:.1f} min)")
        previous = n
        if not undecided:
            outcome.stopped = "decided"
            return outcome
        if budget.max_seeds is not None and n >= budget.max_seeds:
            outcome.stopped = "max seeds"
            return outcome
        if budget.max_hours is not None:
            cost = per_seed if per_seed is not None else estimate(n + 1) if estimate else None
            left = 3600 * budget.max_hours - (clock() - began)
            if cost is not None and cost > left or left <= 0:
                outcome.stopped, outcome.next_round, outcome.left = "max hours", cost, max(left, 0.0)
                return outcome
        n += 1
