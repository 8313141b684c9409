"""Training: config, data position, optimisers and schedules, checkpoints, the loop."""

from blocklab.training.config import TrainConfig
from blocklab.training.loop import RunResult, Trainer, TrainingError, train
from blocklab.training.runs import LoadedRun, load_run

__all__ = ["LoadedRun", "RunResult", "TrainConfig", "Trainer", "TrainingError", "load_run", "train"]
