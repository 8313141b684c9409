"""Launching the independent runs of compare, its sweep and reproduce: one at a time, several at once
on this machine, or as jobs of a cluster scheduler.

Every launcher takes the same list of (entry, TrainConfig) and trains, through `store.train_run`, the
runs the run store does not hold finished yet; what a run computes depends on its config alone, so the
launcher changes how long a command takes and nothing else. A run that fails is recorded against its
log and the others go on (`Launch.failed`).

- `LocalLauncher(jobs=1)`: in this process, one after another.
- `LocalLauncher(jobs=N)`: N worker processes at once (`launch.local`), the CPU threads split between
  them and one GPU each, round-robin.
- `SlurmLauncher(settings)`: one job per run through submitit (`launch.slurm`), waiting for them or not.
"""

from __future__ import annotations

from typing import Any

from blocklab.launch.plan import Launch, RunsFailed, RunsPending, parse_jobs, resolve_jobs

__all__ = ["Launch", "LocalLauncher", "RunsFailed", "RunsPending", "parse_jobs", "resolve_jobs",
           "train_runs"]


def train_runs(configs: list[tuple[Any, Any]], launcher=None, log=print) -> Launch:
    """Train every (entry, TrainConfig) with `launcher` (default: one at a time in this process). The
    trackers' packages are checked first (`trackers.require_installed`); a finished run reused gives its
    trackers the rows they lack (`trackers.catch_up`)."""
    from blocklab.launch.local import LocalLauncher
    from blocklab.training import trackers

    trackers.require_installed(list(dict.fromkeys(n for _, c in configs for n in trackers.tracker_names(c))))
    launch = (launcher or LocalLauncher()).train(configs, log)
    for outcome in launch.outcomes:
        if outcome.status == "reused":
            trackers.catch_up(outcome.cfg)
    return launch


def __getattr__(name: str) -> Any:  # the launchers import torch: only when asked for
    if name == "LocalLauncher":
        from blocklab.launch.local import LocalLauncher

        return LocalLauncher
    if name == "Outcome":
        from blocklab.launch.store import Outcome

        return Outcome
    raise AttributeError(f"module 'blocklab.launch' has no attribute {name!r}")
