"""The run store's rules for one run of compare, a sweep or reproduce, whichever process trains it.

A run lives in its `out_dir`: finished when `summary.json` is there (written last, atomically), else
resumable from its newest checkpoint, else started afresh. Its log (`<out_dir>.log`, beside the run so
that clearing a run that never checkpointed keeps it) records every attempt. While a process trains a
run it holds the run's lock (`.<name>.lock`, beside the run), so that a command started again while
the workers of a killed one are still winding down waits for them instead of training the same run
twice; the lock goes with the process that held it, however that process ends.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blocklab.training.checkpoint import latest_checkpoint
from blocklab.training.config import NOT_RESULTS, TrainConfig, check_saved_config
from blocklab.training.metrics import check_finished_curve
from blocklab.util import locks

REMEDY = "use another --out, or --fresh to retrain it."


def log_path(cfg: TrainConfig) -> Path:
    """Where the run's log is kept: `<out_dir>.log`."""
    run = Path(cfg.out_dir)
    return run.with_name(run.name + ".log")


def read_summary(cfg: TrainConfig) -> dict[str, Any] | None:
    try:
        return json.loads((Path(cfg.out_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def check_reusable(cfg: TrainConfig) -> str:
    """What the store holds for `cfg` ("finished", "resume" or "new"), after checking that a saved run
    matches `cfg` in every field that changes results (a ConfigError names the difference)."""
    run = Path(cfg.out_dir)
    finished = (run / "summary.json").is_file()
    resume = not finished and latest_checkpoint(run) is not None
    if finished or resume:
        check_saved_config(run, cfg, NOT_RESULTS,
                           f"{run} holds {'a finished' if finished else 'an unfinished'} run", REMEDY)
    if finished:  # reused as it is: its curve must be whole, as reports and fits read it
        check_finished_curve(run)
    return "finished" if finished else "resume" if resume else "new"


def run_lock(cfg: TrainConfig, on_wait=None) -> contextlib.AbstractContextManager[None]:
    """Hold the run's lock (`blocklab.util.locks`), waiting (and calling `on_wait` once) while another
    process holds it."""
    return locks.hold(cfg.out_dir, wait=True, on_wait=on_wait, make=True)


def claim(cfg: TrainConfig) -> str:
    """Under the run's lock: what to do with it now ("finished", "resume" or "new"). A run stopped before
    its first checkpoint has nothing to resume, so its directory is emptied for a fresh start (emptied,
    not removed: the folder itself stays the one whose lock this process holds)."""
    state = check_reusable(cfg)
    run = Path(cfg.out_dir)
    if state == "new" and run.is_dir():
        for entry in run.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    return state


@dataclass
class Outcome:
    """How one run of a launch ended: trained (or resumed), reused, or failed with an error and a log."""

    cfg: TrainConfig
    status: str  # "trained", "reused" or "failed"
    seconds: float = 0.0
    error: str | None = None
    log: Path | None = None
    summary: dict[str, Any] | None = None


def prepare_once(cfgs) -> None:
    """Tokenise each data set the runs use once, in the launching process, before its workers or jobs
    start, rather than in each of them at once (each would train the same tokenizer into the shared
    cache). A failure is left for the runs to meet and report, run by run."""
    from blocklab.data import prepare_data

    seen = set()
    for cfg in cfgs:
        key = repr(cfg.data.to_dict())
        if key not in seen:
            seen.add(key)
            with contextlib.suppress(Exception):
                prepare_data(cfg.data, progress=cfg.progress)


def train_claimed(cfg: TrainConfig, resume: bool, progress=None) -> dict[str, Any]:
    """Train (or resume) a run already claimed; its summary."""
    from blocklab.training.config import resolve_config
    from blocklab.training.loop import Trainer

    return Trainer(resolve_config(cfg, None, resume), resume=resume, overall=progress).run().summary


def train_run(cfg: TrainConfig, progress=None, on_wait=None) -> Outcome:
    """The unit every launcher runs: lock the run, reuse it if it finished meanwhile, else train or
    resume it (`progress` is the Trainer's `overall` line). Errors propagate to the caller, who
    records them against the run's log."""
    with run_lock(cfg, on_wait):
        state = claim(cfg)
        if state == "finished":
            return Outcome(cfg, "reused", summary=read_summary(cfg))
        start = time.perf_counter()
        summary = train_claimed(cfg, state == "resume", progress)
        return Outcome(cfg, "trained", time.perf_counter() - start, summary=summary)
