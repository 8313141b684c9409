"""Training: config, data position, optimisers and schedules, checkpoints, the loop."""

from blocklab.training.config import TrainConfig
from blocklab.training.loop import RunResult, Trainer, TrainingError, train

__all__ = ["RunResult", "TrainConfig", "Trainer", "TrainingError", "train"]
