"""The training budget: steps, tokens, analytic FLOPs or wall-clock, whichever ends first.

Steps, tokens and FLOPs all map to a number of steps (tokens per step and FLOPs per token are
fixed), so their progress is deterministic and a resumed run follows the same schedule. A
wall-clock budget makes progress the fraction of training time used.
"""

from __future__ import annotations

import math

from blocklab.training.checkpoint import TrainState


class Budget:
    def __init__(self, cfg, tokens_per_step: int, flops_per_token: float):
        limits = []
        if cfg.max_steps is not None:
            limits.append(int(cfg.max_steps))
        if cfg.max_tokens is not None:
            limits.append(math.ceil(cfg.max_tokens / tokens_per_step))
        if cfg.max_flops is not None:
            limits.append(math.ceil(cfg.max_flops / (flops_per_token * tokens_per_step)))
        self.total_steps: int | None = min(limits) if limits else None
        self.max_time: float | None = cfg.max_time

    def progress(self, state: TrainState) -> float:
        """Fraction of the budget used, in [0, 1]."""
        parts = []
        if self.total_steps is not None:
            parts.append(state.step / self.total_steps)
        if self.max_time is not None:
            parts.append(state.train_time / self.max_time)
        return min(1.0, max(parts))

    def done(self, state: TrainState) -> bool:
        return self.progress(state) >= 1.0
