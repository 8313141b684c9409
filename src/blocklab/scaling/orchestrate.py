"""Training a ladder: every run at once through a launcher (`blocklab.launch`: local workers or Slurm),
or a piece at a time within a budget of minutes (one lent GPU call), resuming what was cut off."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from blocklab.scaling.ladders import Ladder, plan
from blocklab.util.errors import ConfigError

NO_TRAIN_REMEDY = "retrain it with --fresh (leaving out --no-train), or use another --out"


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
    trained it (`reproduce.budgeted_launch`), and `export` (a tarball of the small files) is rewritten after
    each. Returns the runs trained and how many are left."""
    from blocklab.launch import RunsFailed
    from blocklab.reproduce.budgeted_launch import (
        BudgetLauncher,
        drop_orphans,
        export_store,
        finish_run,
        record_run,
        run_device,
    )
    from blocklab.reproduce.estimate import Estimator

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


def check_store(
    archs: list[str], ladder: Ladder, root: Path, seeds: int | None = None, fresh: bool = False,
    no_train: bool = False, log=print,
) -> list[Path]:
    """Check every run the store holds for this ladder (finished, or resumable from a checkpoint; every
    seed found, not only the seeds asked for, since the report reads them all) against the config this
    ladder gives it: a run trained with another config (another learning rate, another corpus) is
    refused before anything trains or is read, naming the run and the fields
    (`training.config.check_saved_config`, as compare and reproduce refuse it). With `fresh`, each such
    run is removed instead (under its lock), to be trained again; the others are kept. Returns the runs
    removed."""
    from blocklab.launch.store import REMEDY
    from blocklab.training.checkpoint import latest_checkpoint
    from blocklab.training.config import NOT_RESULTS, check_saved_config
    from blocklab.util import locks

    found = [int(p.name.rpartition("-seed")[2]) for p in root.glob("*/runs/*-seed*")
             if p.name.rpartition("-seed")[2].isdigit()]
    removed = []
    for *_, cfg in plan(archs, ladder, root, max([seeds or ladder.seeds, *(s + 1 for s in found)])):
        run = Path(cfg.out_dir)
        finished = (run / "summary.json").is_file()
        if not finished and (no_train or latest_checkpoint(run) is None):
            continue  # nothing --no-train reads, or nothing a launch would resume
        what = f"{run} holds {'a finished' if finished else 'an unfinished'} run"
        try:
            check_saved_config(run, cfg, NOT_RESULTS, what, NO_TRAIN_REMEDY if no_train else REMEDY)
        except ConfigError as err:
            if not fresh:
                raise
            with locks.hold(run):  # never a run another process is training (FolderInUse names it)
                shutil.rmtree(run)
            log(f"--fresh: {run} removed, to train again ({str(err).partition('(')[2].rpartition(')')[0]})")
            removed.append(run)
    return removed
