"""Training a ladder: every run at once through a launcher (`blocklab.launch`: local workers or Slurm),
or a piece at a time within a budget of minutes (one lent GPU call), resuming what was cut off."""

from __future__ import annotations

import time
from pathlib import Path

from blocklab.scaling.ladders import Ladder, plan


def train_ladder(
    archs: list[str],
    ladder: Ladder,
    name: str,
    out: str | Path,
    seeds: int | None = None,
    launcher=None,
    log=print,
):
    """Train (or reuse) every run of `ladder` for `archs` under OUT/<name> with `launcher` (default: one
    at a time here); raises RunsPending when a launcher that does not wait left runs queued, and
    RunsFailed when some failed."""
    from blocklab.launch import RunsFailed, train_runs

    runs = plan(archs, ladder, Path(out) / name, seeds)
    log(
        f"ladder {name}: {len(runs)} runs ({len(archs)} architectures x {len(ladder.rungs)} rungs x "
        f"{seeds or ladder.seeds} seeds) in {Path(out) / name}"
    )
    launch = train_runs([(e, cfg) for _, e, cfg in runs], launcher, log)
    launch.raise_if_pending("scaling", "fit the ladder")
    if launch.failed:
        raise RunsFailed(launch.failed)
    return launch


def train_piece(
    archs: list[str],
    ladder: Ladder,
    name: str,
    out: str | Path,
    minutes: float,
    seeds: int | None = None,
    export: Path | None = None,
    log=print,
    clock=time.monotonic,
) -> tuple[list[str], int]:
    """Train the ladder's next unfinished runs for about `minutes`, one after another, starting a run
    only while its estimated time fits (`reproduce.estimate.Estimator`, from this store's finished runs
    on this device or a prior); each finished run loses its checkpoints and gets its record of what
    trained it (`reproduce.pieces`), and `export` (a tarball of the small files) is rewritten after
    each. Returns the runs trained and how many are left."""
    from blocklab.launch import RunsFailed
    from blocklab.reproduce.estimate import Estimator
    from blocklab.reproduce.pieces import (
        BudgetLauncher,
        drop_orphans,
        export_store,
        finish_run,
        record_run,
        run_device,
    )

    if not 0 < minutes < float("inf"):  # NaN fails this too
        from blocklab.util.errors import ConfigError

        raise ConfigError(f"--minutes {minutes} is not allowed: give a positive number of minutes")
    root = Path(out) / name
    runs = plan(archs, ladder, root, seeds)
    device = run_device(ladder.train.get("device", "auto"))
    estimate = Estimator(root, device)
    log(f"piece: {minutes:g} min on {device}; run times estimated at {estimate.source}")
    drop_orphans(root, log)
    start = clock()

    def after(cfg, started: float) -> None:
        finish_run(cfg, {})  # no metric read from weights: its checkpoints go
        record_run(cfg, clock() - started, device)
        estimate.refresh()
        if export is not None:
            export_store(root, export)

    launcher = BudgetLauncher(start + 60 * minutes, estimate.seconds, after, clock)
    launch = launcher.train([(e, cfg) for _, e, cfg in runs], log)
    if export is not None and root.is_dir():
        export_store(root, export)
    if launch.failed:
        raise RunsFailed(launch.failed)
    left = sum(not (Path(cfg.out_dir) / "summary.json").is_file() for *_, cfg in runs)
    return launcher.trained, left
