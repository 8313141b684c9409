"""Learning-rate schedules as pure functions of training progress.

The trainer measures ``progress = used / budget`` in [0, 1] in whatever unit the budget is set
(steps, tokens, FLOPs, wall-clock seconds) and sets every group's learning rate to

    lr = base_lr * lr_factor(cfg, progress, step, total_steps)

so one schedule follows any budget, and two models trained on equal budgets see the same
schedule. With p the progress, w the end of warmup (in progress units) and f the final fraction:

    warmup    r(p) = p / w                      (w = cfg.warmup_fraction)
              r    = (step + 1) / warmup_steps  (when cfg.warmup_steps is set and total_steps is
                                                 known; then w = warmup_steps / total_steps)
    linear    s(p) = f + (1 - f) (1 - t),  t = (p - w) / (1 - w)             Simplifying Sec. 4
    cosine    s(p) = f + (1 - f) (1 + cos(pi t)) / 2                         Value Residual Table 4
    wsd       s(p) = f + (1 - f) (1 - t'), t' = (p - (1 - d)) / d            nanochat, Bank of Values
    one-cycle r(p) = p / peak_at, s(p) = f + (1 - f) (1 - t), w = peak_at    Cramming (Geiping 2023)
    constant  s(p) = 1

    lr_factor = min(r, s), with t, t' clipped to [0, 1].

Taking the minimum of the warmup ramp and the body lets a warmup overlap a warmdown (wsd with a
long warmup) without a jump. The fraction-based ramp is 0 at progress 0 (the Hugging Face
``warmup_ratio`` convention of the Simplifying code); the step-based ramp starts at
1 / warmup_steps so that the first update is not wasted (nanochat's ``(it + 1) / warmup``).
"""

from __future__ import annotations

import math
from collections.abc import Callable


def _fraction_done(p: float, start: float) -> float:
    """How far p is through the interval [start, 1], clipped to [0, 1] (0 when the interval is empty)."""
    if start >= 1.0:
        return 0.0
    return min(1.0, max(0.0, (p - start) / (1.0 - start)))


def linear(p: float, w: float, f: float, _cfg) -> float:
    """Linear decay from 1 at the end of warmup to f at the end of the budget.

    Simplifying Transformer Blocks (Sec. 4 and App. B): 5% linear warmup, then linear decay
    (Hugging Face ``polynomial`` with power 1), which beat cosine decay in their Fig. 11.
    """
    return f + (1.0 - f) * (1.0 - _fraction_done(p, w))


def cosine(p: float, w: float, f: float, _cfg) -> float:
    """Half a cosine from 1 at the end of warmup to f (default 0.1) at the end of the budget.

    Value Residual Learning (Sec. 4.1 and Table 4): warmup to 6e-4 (Table 4: 120 steps; the text
    says 1,200), then cosine decay to 6e-5, i.e. 10% of the peak.
    """
    return f + (1.0 - f) * 0.5 * (1.0 + math.cos(math.pi * _fraction_done(p, w)))


def wsd(p: float, _w: float, f: float, cfg) -> float:
    """Warmup-stable-decay: constant 1, then a linear warmdown over the last `warmdown_fraction` d.

    nanochat's ``base_train`` and Bank of Values (Table 8): warmup 40 steps, warmdown over the
    last 65% of the budget to 0.05 of the peak.
    """
    return f + (1.0 - f) * (1.0 - _fraction_done(p, 1.0 - cfg.warmdown_fraction))


def constant(_p: float, _w: float, _f: float, _cfg) -> float:
    """1 after warmup; `final_lr_fraction` has no effect."""
    return 1.0


# name -> the schedule's body s(p, w, f, cfg), called positionally; one-cycle is `linear` with its
# warmup ending at `peak_at` (the rise to the peak is its warmup), see `lr_factor`.
SCHEDULES: dict[str, Callable[[float, float, float, object], float]] = {
    "linear": linear,
    "cosine": cosine,
    "wsd": wsd,
    "one-cycle": linear,
    "constant": constant,
}

# the final fraction f of each schedule when `final_lr_fraction` is None
FINAL_LR_FRACTION = {"linear": 0.0, "cosine": 0.1, "wsd": 0.05, "one-cycle": 0.0, "constant": 1.0}


def warmup(cfg, progress: float, step: int, total_steps: int | None) -> tuple[float, float]:
    """(ramp r, warmup end w in progress units) of the warmup ``cfg`` describes."""
    if cfg.schedule == "one-cycle":  # Cramming: linear rise to the peak at `peak_at` of the budget
        w = cfg.peak_at
    elif cfg.warmup_steps is not None and total_steps:
        if cfg.warmup_steps == 0:
            return 1.0, 0.0
        return min(1.0, (step + 1) / cfg.warmup_steps), min(1.0, cfg.warmup_steps / total_steps)
    else:
        w = cfg.warmup_fraction
    return (1.0 if w <= 0 else min(1.0, progress / w)), w


def lr_factor(cfg, progress: float, step: int, total_steps: int | None) -> float:
    """The multiplier of every group's ``base_lr`` at `progress` (fraction of the budget used).

    `cfg` is an `OptimConfig` (schedule, warmup_fraction, warmup_steps, warmdown_fraction, peak_at,
    final_lr_fraction). `step` is the number of updates done so far and `total_steps` the
    budget in steps, or None when it is not known in steps (a wall-clock budget); then the
    warmup is `warmup_fraction` of the budget. Progress outside [0, 1] is clipped.
    """
    if not math.isfinite(progress):
        raise ValueError(f"progress must be a finite fraction of the budget; got {progress!r}.")
    p = min(1.0, max(0.0, float(progress)))
    f = cfg.final_lr_fraction if cfg.final_lr_fraction is not None else FINAL_LR_FRACTION[cfg.schedule]
    ramp, w = warmup(cfg, p, step, total_steps)
    return min(ramp, SCHEDULES[cfg.schedule](p, w, f, cfg))
