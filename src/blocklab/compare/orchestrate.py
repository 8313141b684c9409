"""`compare`: train every entry (reusing finished runs), time them again, write the report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from blocklab.compare.added_runs import added_runs, require_finished
from blocklab.compare.configs import comparison_identity, run_configs
from blocklab.compare.grids import Entry
from blocklab.compare.sweep import sweep_learning_rates, with_best_rates
from blocklab.compare.timing import TIMING_ROUNDS, TIMING_STEPS, measure_architectures
from blocklab.launch import Launch, RunsFailed, train_runs
from blocklab.training import TrainConfig, trackers
from blocklab.util import locks
from blocklab.util.configbase import is_count
from blocklab.util.errors import ConfigError


def compare(entries: list[Entry | str], out: str | Path, seeds: int = 1,
            base: dict[str, Any] | None = None, fresh: bool = False, log=print,
            lr_sweep: list[float] | None = None, sweep_steps: int | None = None,
            command: str | None = None, timing_rounds: int = TIMING_ROUNDS,
            timing_steps: int = TIMING_STEPS, launcher=None, add: list[str | Path] | None = None,
            overwrite: bool = False) -> Path:
    """Train every entry (unless already finished) and write `out/report.md` and `out/report.html`.

    With `lr_sweep`, each entry first trains seed 0 at every rate for `sweep_steps` steps (default a
    quarter of max_steps, else 100); the rate with the lowest held-out loss is then used for all seeds.
    After training, each architecture's step is timed again in `timing_rounds` interleaved rounds of
    `timing_steps` steps (`measure_architectures`; 0 rounds: the report shows the in-training times
    alone) and its memory is measured. `command` is the command line the report records (None:
    "python API"). `launcher` trains the runs (`blocklab.launch`; default one at a time here). `add`
    names finished runs trained elsewhere to bring into the report (`added_runs`, checked against the
    comparison's runs once those have trained; a missing one is refused before anything trains).
    A report.md, report.html or results.json in `out` that compare did not write, or the report of
    another comparison (`comparison_identity`: other architectures or settings), is refused before
    anything trains, unless `overwrite` (`report.check_report_files`).

    Raises RunsPending when a launcher that does not wait left runs queued (the same call later collects
    them), and RunsFailed, after writing the report of the runs that finished, when some failed.
    """
    import time

    from blocklab.report import figures_of, utc_now, write_report

    started, start = utc_now(), time.perf_counter()
    entries = _checked_arguments(entries, seeds, timing_rounds, timing_steps, add, lr_sweep)
    out = Path(out)
    # one comparison at a time in a folder: no run or report of another is touched
    with locks.hold(out, make=True):
        base = base or {}
        identity = comparison_identity(entries, out, base, lr_sweep, add)
        _clear_the_way(out, identity, overwrite, fresh)
        # a wandb group per comparison (training.trackers), unless the caller names one
        base = {"wandb_group": trackers.group_under(out / "runs" / "run", out), **base}
        sweep = sweep_info = None
        failed = []
        if lr_sweep:
            sweep, sweep_info, swept = _sweep(entries, lr_sweep, sweep_steps, out, base, log, launcher)
            failed += swept.failed
            entries = with_best_rates(entries, sweep)
        configs = run_configs(entries, seeds, out, base)
        launch = train_runs(configs, launcher, log)
        launch.raise_if_pending("the comparison", "write the report")
        failed += launch.failed
        finished = [pair for pair, o in zip(launch.configs, launch.outcomes, strict=True)
                    if o.status != "failed"]
        if not finished:
            raise RunsFailed(failed)
        extra = added_runs(add, finished) if add else []
        finished += extra
        measured = _measure(finished, configs, timing_rounds, timing_steps)
        run_info = {"command": command or "python API", "started_utc": started, "started_perf": start,
                    "runs_reused": sum(o.status == "reused" for o in launch.outcomes), "lr_sweep": sweep_info,
                    "launch": launch.describe(),
                    "added": [{"run": c.out_dir, "label": e.label} for e, c in extra], "comparison": identity,
                    "failed": [_failed_info(o, _entry_of(o.cfg, launch.configs)) for o in failed]}
        report = write_report(finished, out, sweep=sweep, measured=measured, run_info=run_info)
        # the figures the report shows, as the group's "report" run, for wandb
        trackers.send_figures(trackers.track_to(configs[0][1]), figures_of(report), out, "report")
        if failed:
            raise RunsFailed(failed, report)
        return report


def _clear_the_way(out: Path, identity: dict[str, Any], overwrite: bool, fresh: bool) -> None:
    """Refuse a report in `out` that is not this comparison's (unless `overwrite`); with `fresh`, remove
    the saved runs, each under its lock."""
    from blocklab.report.write import check_report_files

    # saved runs are checked against their configs one by one (launch.store.check_reusable, naming the
    # run and --fresh): the report's own check of the settings is for when none is there to speak
    runs_speak = not fresh and any((out / "runs").glob("*/config.yaml"))
    check_report_files(out, overwrite, identity, settings=not runs_speak)
    if fresh and (out / "runs").is_dir():
        for run in sorted(p for p in (out / "runs").iterdir() if p.is_dir()):
            with locks.hold(run):  # never a run another process is training (FolderInUse names it)
                shutil.rmtree(run)


def _measure(finished: list, configs: list, timing_rounds: int, timing_steps: int) -> dict[str, Any]:
    """Memory and interleaved timing of every architecture's step after training, and its seconds."""
    import time

    trained_at = time.perf_counter()
    if any(cfg.progress for _, cfg in configs):  # a data message: on stderr, and not with --quiet
        from blocklab.util.progress import say

        say(f"measuring memory and timing every architecture's training step again ({timing_rounds} "
            f"interleaved rounds x {timing_steps} steps) for the report")
    measured = measure_architectures(finished, timing_rounds, timing_steps)
    measured["seconds"] = time.perf_counter() - trained_at
    return measured


def _checked_arguments(entries: list[Entry | str], seeds: int, timing_rounds: int, timing_steps: int,
                       add: list[str | Path] | None, lr_sweep: list[float] | None) -> list[Entry]:
    """`compare`'s arguments checked before anything trains, or anything in `out` is read; the entries,
    strings parsed."""
    if any(isinstance(r, bool) or not isinstance(r, (int, float)) or not r > 0 for r in lr_sweep or []):
        raise ConfigError(f"--lr-sweep rates must be positive numbers; got {lr_sweep}")
    if not is_count(seeds, 1):
        raise ConfigError(f"seeds = {seeds!r} is not allowed: give a positive number of seeds per "
                          "architecture.")
    for name, value, low in (("timing_rounds", timing_rounds, 0), ("timing_steps", timing_steps, 1)):
        if not is_count(value, low):
            raise ConfigError(f"{name} = {value!r} is not allowed: give an integer >= {low}.")
    parsed = [Entry.parse(e) if isinstance(e, str) else e for e in entries]
    if not parsed:
        raise ConfigError("compare needs at least one architecture (see `blocklab presets`).")
    labels = [e.label for e in parsed]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"compare got the same architecture twice: {labels}")
    for path in add or []:
        require_finished(Path(path))
    return parsed


def _sweep(entries: list[Entry], lr_sweep: list[float], sweep_steps: int | None, out: Path,
           base: dict[str, Any], log, launcher
           ) -> tuple[dict[str, dict[float, float]], dict[str, Any], Launch]:
    """The learning-rate sweep before the comparison's runs: its losses (also in lr_sweep.json), what
    the report says of it, and its launch."""
    steps = sweep_steps or (max(1, base["max_steps"] // 4) if base.get("max_steps") else 100)
    log(f"learning-rate sweep: {len(entries)} x {len(lr_sweep)} runs of {steps} steps, seed 0")
    sweep, swept = sweep_learning_rates(entries, sorted(set(lr_sweep)), out / "lr-sweep", base, steps,
                                        log, launcher)
    swept.raise_if_pending("the learning-rate sweep", "write the report")
    (out / "lr_sweep.json").write_text(json.dumps({"steps": steps, "val_loss": sweep}, indent=2))
    return sweep, {"rates": sorted(set(lr_sweep)), "steps": steps}, swept


def _entry_of(cfg: TrainConfig, configs: list[tuple[Entry, TrainConfig]]) -> Entry | None:
    return next((e for e, c in configs if c.out_dir == cfg.out_dir), None)


def _failed_info(outcome, entry: Entry | None) -> dict[str, Any]:
    return {"run": outcome.cfg.out_dir, "label": entry.label if entry else Path(outcome.cfg.out_dir).name,
            "seed": outcome.cfg.seed, "error": outcome.error, "log": str(outcome.log)}
