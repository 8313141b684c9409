"""Experiment trackers beside metrics.jsonl, chosen by `TrainConfig.logger` in one registry (`TRACKERS`):
TensorBoard and Weights & Biases (MLflow is left out: docs/training.md says why).

metrics.jsonl is the run's own record; a tracker receives each of its rows as it is written
(`MetricsLogger.log`) and shows the same numbers under the same step: every number of a row but its
step, as ``<kind>/<field>`` (``train/loss``, ``val/val_bpb``), and each learned gain per head as
``scalars/<gain>/<i>`` (`scalars_of`). ``logger`` names one tracker or several (``wandb``,
``[wandb, tensorboard]``, ``none``); ``tensorboard=true`` adds TensorBoard, as before there was a
``logger``. A tracker's package is checked before a run starts (`require_installed`), not when a
config is read, so a saved run stays readable on a machine without it.

A new tracker is one `TrackerKind` here: its package, its pip extra and how it opens for a run
(and, optionally, how it shows a report's figures); the trainer, compare and reproduce read only this
registry. Only the process that writes metrics.jsonl (rank 0 under torchrun) opens trackers.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blocklab.training.metrics import Tracker
from blocklab.training.tracking import TRACKER_NAMES, TrackTo, logger_names, scalars_of
from blocklab.util.errors import ConfigError

if TYPE_CHECKING:
    from blocklab.training.config import TrainConfig


# opens a tracker for (run folder, its config, the step a resume starts from or None for a new run)
Opener = Callable[[Path, "TrainConfig", "int | None"], Tracker]
# shows a report's figures: (figure paths, the report's folder, a name for them, where: TrackTo)
FigureSender = Callable[[list[Path], Path, str, "TrackTo"], None]


@dataclass(frozen=True)
class TrackerKind:
    module: str  # the package that must import
    extra: str  # blocklab's pip extra that installs it
    open: Opener
    figures: FigureSender | None = None  # None: the tracker shows no report figures
    # gives a finished run that compare or reproduce reuses the rows its tracker run lacks; None: cannot
    catch_up: Callable[[Path, TrainConfig], None] | None = None
    # checks what a resume reads of the tracker's own record, before the run changes any file; None: nothing
    check_resume: Callable[[Path, TrainConfig], None] | None = None


def _tensorboard(run_dir: Path, cfg: TrainConfig, resume_step: int | None) -> Tracker:  # noqa: ARG001
    return TensorBoardTracker(run_dir)


def _wandb(run_dir: Path, cfg: TrainConfig, resume_step: int | None) -> Tracker:
    from blocklab.training.wandb_tracker import WandbTracker

    return WandbTracker(run_dir, cfg, resume_step)


def _wandb_figures(paths: list[Path], folder: Path, name: str, where: TrackTo) -> None:
    from blocklab.training.wandb_tracker import send_figures

    send_figures(paths, folder, name, where)


def _wandb_catch_up(run_dir: Path, cfg: TrainConfig) -> None:
    from blocklab.training.wandb_tracker import catch_up

    catch_up(run_dir, cfg)


def _wandb_check(run_dir: Path, cfg: TrainConfig) -> None:
    from blocklab.training.wandb_tracker import check_record

    check_record(run_dir, cfg)


TRACKERS: dict[str, TrackerKind] = {
    "tensorboard": TrackerKind("tensorboard", "tensorboard", _tensorboard),
    "wandb": TrackerKind("wandb", "wandb", _wandb, _wandb_figures, _wandb_catch_up, _wandb_check),
}
assert tuple(TRACKERS) == TRACKER_NAMES, "training/tracking.py lists the same trackers"


def tracker_names(cfg: TrainConfig) -> tuple[str, ...]:
    """The trackers a run logs to: `logger`'s, and TensorBoard with tensorboard=true."""
    names = logger_names(cfg.logger)
    assert isinstance(names, list), names  # TrainConfig checked it
    return tuple(dict.fromkeys([*names, *(["tensorboard"] if cfg.tensorboard else [])]))


def track_to(cfg: TrainConfig) -> TrackTo:
    return TrackTo(tracker_names(cfg), cfg.wandb_project, cfg.wandb_group)


def require_installed(names: Sequence[str]) -> None:
    """A ConfigError naming the extra to install when a tracker's package is missing; called before a
    run (or a comparison) starts, so that nothing trains only to fail at the first logged row."""
    for name in names:
        kind = TRACKERS[name]
        try:
            found = importlib.util.find_spec(kind.module) is not None
        except (ImportError, ValueError):  # a module set to None in sys.modules (tests), a broken install
            found = False
        if not found:
            raise ConfigError(f"logger {name!r} needs the {kind.module} package, which is not installed: "
                              f"pip install 'blocklab[{kind.extra}]', or drop {name} from logger.")


def check_resume(run_dir: Path, cfg: TrainConfig) -> None:
    """Each tracker's record of a run about to resume, checked (`TrackerKind.check_resume`)."""
    for name in tracker_names(cfg):
        check = TRACKERS[name].check_resume
        if check is not None:
            check(Path(run_dir), cfg)


def open_trackers(run_dir: Path, cfg: TrainConfig, resume_step: int | None) -> list[Tracker]:
    """The run's trackers, opened; one that fails to open closes those opened before it."""
    opened: list[Tracker] = []
    try:
        for name in tracker_names(cfg):
            opened.append(TRACKERS[name].open(Path(run_dir), cfg, resume_step))
    except BaseException:
        for tracker in opened:
            tracker.close(failed=True)
        raise
    return opened


def catch_up(cfg: TrainConfig) -> None:
    """A finished run reused by compare or reproduce: each tracker that can (`TrackerKind.catch_up`) gets
    the rows it lacks (all of them when the run trained without it), so that every run of a
    comparison is in the tracker whether it trained now or earlier."""
    for name in tracker_names(cfg):
        kind = TRACKERS[name]
        if kind.catch_up is not None:
            kind.catch_up(Path(cfg.out_dir), cfg)


def group_under(run_dir: str | Path, top: str | Path) -> str:
    """A group name for the runs in `run_dir`'s folder: its path from `top`'s parent, without a last
    "runs" (compare's OUT/runs/<run>: "OUT"; reproduce's OUT/<scale>/<setting>/runs/<run>:
    "OUT/<scale>/<setting>")."""
    parts = Path(os.path.relpath(Path(run_dir).resolve().parent, Path(top).resolve().parent)).parts
    return "/".join(parts[:-1] if len(parts) > 1 and parts[-1] == "runs" else parts)


def send_figures(where: TrackTo, paths: list[Path], folder: Path, name: str) -> None:
    """A report's figures (PNG files) to every tracker of `where` that shows figures, as one run `name`
    in `where.group`; nothing when there are none."""
    if not paths:
        return
    require_installed(where.names)
    for tracker in where.names:
        sender = TRACKERS[tracker].figures
        if sender is not None:
            sender(paths, Path(folder), name, where)


class TensorBoardTracker:
    """Event files in the run's tensorboard/ folder (extra `tensorboard`)."""

    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter  # its package checked first (`require_installed`)

        self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def log(self, row: dict[str, Any]) -> None:
        for name, value in scalars_of(row).items():
            self.writer.add_scalar(name, value, row["step"])

    def close(self, failed: bool = False) -> None:  # noqa: ARG002
        self.writer.close()
