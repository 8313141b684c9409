"""The learning-rate sweep (`--lr-sweep`): seed 0 of every entry at every rate on a short budget,
then each entry at the rate of its lowest held-out loss.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from blocklab.compare.configs import merge, run_configs
from blocklab.compare.grids import Entry
from blocklab.launch import Launch, train_runs
from blocklab.launch.store import read_summary
from blocklab.training.config import BUDGET_FIELDS
from blocklab.util.errors import ConfigError


def sweep_learning_rates(entries: list[Entry], rates: list[float], out: Path, base: dict[str, Any],
                         steps: int, log=print, launcher=None
                         ) -> tuple[dict[str, dict[float, float]], Launch]:
    """Train seed 0 of every entry at every rate for `steps` steps (in `out/runs/<label>-lr<rate>-seed0`,
    reused like any run, with `launcher`): each entry's final validation loss per rate (a failed run's
    rate left out), and the launch."""
    short = {k: v for k, v in base.items() if k not in BUDGET_FIELDS} | {"max_steps": steps}
    tried = [(e, rate, Entry(f"{e.label}-lr{rate:g}", e.arch, e.model,
                             merge(e.train, {"optim": {"lr": rate}})))
             for e in entries for rate in rates]
    launch = train_runs(run_configs([t for _, _, t in tried], 1, out, short), launcher, log)
    losses: dict[str, dict[float, float]] = {e.label: {} for e in entries}
    for (entry, rate, _), outcome in zip(tried, launch.outcomes, strict=True):
        if outcome.status != "failed":
            losses[entry.label][rate] = read_summary(outcome.cfg)["val_loss"]
    return losses, launch


def with_best_rates(entries: list[Entry], sweep: dict[str, dict[float, float]]) -> list[Entry]:
    """Each entry with the learning rate of its lowest held-out loss in `sweep`."""
    empty = [label for label, losses in sweep.items() if not losses]
    if empty:
        raise ConfigError(f"every learning-rate sweep run of {', '.join(empty)} failed, so no rate can be "
                          "chosen: see the runs' logs beside them in lr-sweep/runs/.")
    return [replace(e, train=merge(e.train, {"optim": {"lr": min(sweep[e.label], key=sweep[e.label].get)}}))
            for e in entries]
