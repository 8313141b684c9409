"""Training a ladder: every run at once through a launcher (`blocklab.launch`: local workers or Slurm),
or a piece at a time within a budget of minutes (one lent GPU call), resuming what was cut off."""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from pathlib import Path

from blocklab.scaling.ladders import Ladder, plan
from blocklab.scaling.sweeps import SWEEP_FOLDER, SweepUnfinished, finished, sweep_plan, unfinished_text
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
    at a time here), its learning-rate sweep first when it has one (`train_sweep`); raises RunsPending
    when a launcher that does not wait left runs queued, and RunsFailed when some failed."""
    from blocklab.launch import RunsFailed, train_runs

    if ladder.lr_sweep is not None:
        train_sweep(archs, ladder, Path(out) / name, launcher, log)
    runs = plan(archs, ladder, Path(out) / name, seeds)
    n = seeds or ladder.seeds
    shorter = (f", and {len(ladder.shorter_runs)} shorter runs of {ladder.rungs[-1].name} x {len(archs)} "
               f"architectures x {n} seeds" if ladder.shorter_runs else "")
    log(f"ladder {name}: {len(runs)} runs ({len(archs)} architectures x {len(ladder.rungs)} rungs x {n} seeds"
        f"{shorter}) in {Path(out) / name}")
    launch = train_runs([(e, cfg) for _, e, cfg in runs], launcher, log)
    launch.raise_if_pending("scaling", "fit the ladder")
    if launch.failed:
        raise RunsFailed(launch.failed)
    return launch


def train_sweep(archs: list[str], ladder: Ladder, root: Path, launcher=None, log=print):
    """Train (or reuse) every run of the ladder's learning-rate sweep for `archs` in `root` (OUT/<name>)
    with `launcher`, as the ladder's own runs train (`sweeps.sweep_plan`); RunsPending and RunsFailed as
    `train_ladder` raises them. Returns the launch."""
    from blocklab.launch import RunsFailed, train_runs

    runs = sweep_plan(archs, ladder, root)
    sweep = ladder.lr_sweep
    assert sweep is not None
    log(f"ladder {root.name}: learning-rate sweep, {len(runs)} runs ({len(sweep.factors)} factors x "
        f"{len(archs)} architectures x {len(ladder.rungs)} rungs, {sweep.steps} steps each) in "
        f"{root}/<rung>/{SWEEP_FOLDER}")
    launch = train_runs([(None, run.cfg) for run in runs], launcher, log)
    launch.raise_if_pending("scaling", "choose the learning rates, then train and fit the ladder")
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
    each. A ladder's learning-rate sweep trains first, and its runs count as runs like the others
    (`_train_within`). Returns the runs trained and how many are left."""
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
    device = run_device(ladder.train.get("device", "auto"))
    estimate = Estimator(root, device)
    log(f"piece: {minutes:g} min on {device}; run times estimated at {estimate.source}")
    drop_orphans(root, log)
    for rung in ladder.rungs if ladder.lr_sweep is not None else ():
        drop_orphans(root / rung.name, log)  # the sweep's runs: <rung>/sweep/runs/*
    start = clock()

    def after(cfg, started: float) -> None:
        finish_run(cfg, {})  # no metric read from weights: its checkpoints go
        record_run(cfg, clock() - started, device)
        estimate.refresh()
        if export is not None:
            export_store(root, export)

    launcher = BudgetLauncher(start + 60 * minutes, estimate.seconds, after, clock)
    failed, left = _train_within(archs, ladder, root, seeds, launcher, log)
    if export is not None and root.is_dir():
        export_store(root, export)
    if failed:
        raise RunsFailed(failed)
    return launcher.trained, left


def _train_within(archs: list[str], ladder: Ladder, root: Path, seeds: int | None, launcher, log
                  ) -> tuple[list, int]:
    """A piece's launches with `launcher` (a BudgetLauncher): the learning-rate sweep's runs first, when
    the ladder has one, then, once all of them have finished, the ladder's runs at the rates it chose.
    Returns the runs that failed and how many runs are left (while the sweep is unfinished, every
    unfinished ladder run besides its own)."""

    def unfinished(cfgs) -> int:
        return sum(not (Path(cfg.out_dir) / "summary.json").is_file() for cfg in cfgs)

    failed, left = [], 0
    if ladder.lr_sweep is not None:
        sweep = sweep_plan(archs, ladder, root)
        failed += launcher.train([(None, run.cfg) for run in sweep], log).failed
        left = sum(not finished(run) for run in sweep)
        if left:  # the ladder's rates are not chosen yet; its runs' folders are those of the recipe's
            recipe = plan(archs, replace(ladder, lr_sweep=None), root, seeds)
            return failed, left + unfinished(cfg for *_, cfg in recipe)
    runs = plan(archs, ladder, root, seeds)
    failed += launcher.train([(e, cfg) for _, e, cfg in runs], log).failed
    return failed, left + unfinished(cfg for *_, cfg in runs)


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
    removed. With a learning-rate sweep its runs are checked first, and the ladder's runs against the
    rates it chose once it has finished; before that, --no-train is refused (SweepUnfinished: there is
    nothing to read) and a launch checks them when the sweep has chosen."""
    found = [int(p.name.rpartition("-seed")[2]) for p in root.glob("*/runs/*-seed*")
             if p.name.rpartition("-seed")[2].isdigit()]
    removed = []
    if ladder.lr_sweep is not None:
        sweep = sweep_plan(archs, ladder, root)
        removed += [run for r in sweep if (run := _check_run(r.cfg, fresh, no_train, log)) is not None]
        if not all(finished(r) for r in sweep):
            if no_train:
                raise SweepUnfinished(f"--no-train reads the ladder's runs at the rates its sweep chose, and "
                                      f"{unfinished_text(sweep, [r for r in sweep if not finished(r)])}")
            return removed
    for *_, cfg in plan(archs, ladder, root, max([seeds or ladder.seeds, *(s + 1 for s in found)])):
        run = _check_run(cfg, fresh, no_train, log)
        if run is not None:
            removed.append(run)
    return removed


def _check_run(cfg, fresh: bool, no_train: bool, log) -> Path | None:
    """Check the run `cfg` plans against what its folder holds (`check_store`); the run, when --fresh
    removed it."""
    from blocklab.launch.store import REMEDY
    from blocklab.training.checkpoint import latest_checkpoint
    from blocklab.training.config import NOT_RESULTS, check_saved_config
    from blocklab.util import locks

    run = Path(cfg.out_dir)
    done = (run / "summary.json").is_file()
    if not done and (no_train or latest_checkpoint(run) is None):
        return None  # nothing --no-train reads, or nothing a launch would resume
    what = f"{run} holds {'a finished' if done else 'an unfinished'} run"
    try:
        check_saved_config(run, cfg, NOT_RESULTS, what, NO_TRAIN_REMEDY if no_train else REMEDY)
    except ConfigError as err:
        if not fresh:
            raise
        with locks.hold(run):  # never a run another process is training (FolderInUse names it)
            shutil.rmtree(run)
        log(f"--fresh: {run} removed, to train again ({str(err).partition('(')[2].rpartition(')')[0]})")
        return run
    return None
