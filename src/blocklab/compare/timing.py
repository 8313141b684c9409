"""After training: each architecture's memory and training step measured again, in interleaved
rounds, so the report's speed figures do not depend on how the machine's load changed between runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from blocklab.compare.grids import Entry
from blocklab.model.config import ModelConfig
from blocklab.training import TrainConfig

# The throughput table of the report: after all training, each architecture's training step is timed
# again in TIMING_ROUNDS interleaved rounds (every architecture in turn within a round) of TIMING_STEPS
# steps each, after one untimed warm-up step per turn. A change in the machine's load then hits every
# architecture alike, which the per-run figures measured one run after another cannot promise. At
# size tiny this costs a few seconds per architecture.
TIMING_ROUNDS = 5


TIMING_STEPS = 3


class StepProbe:
    """One architecture's training step outside the trainer, for the measurements after training.

    The run's resolved model (its model_config.json) is built afresh with the run's seed, with the
    run's optimisers, precision, gradient accumulation and clipping, on random token batches of the
    run's shape (batch_size x seq_len): the cost of a step depends on the shapes, not on the weights
    nor on which tokens are fed. The step is the trainer's own (`training.step.train_step`): forward and
    backward per micro-batch, the loss read back, the gradient norm clipped, every optimiser stepped.
    """

    def __init__(self, cfg: TrainConfig, device: torch.device):
        from blocklab.runtime import LanguageModel
        from blocklab.training.optim import build_optimizers
        from blocklab.training.step import autocast_for, compile_for_training

        run = Path(cfg.out_dir)
        self.cfg, self.device = cfg, device
        torch.manual_seed(cfg.seed)
        self.model = LanguageModel(ModelConfig.from_dict(json.loads((run / "model_config.json").read_text())))
        self.model.to(device).train()
        compile_for_training(self.model, cfg.compile)
        self.optimizers = build_optimizers(self.model, cfg.optim, cfg.batch_size * cfg.seq_len)
        self.autocast = autocast_for(cfg.precision, device)
        rows = cfg.batch_size // cfg.grad_accum
        generator = torch.Generator().manual_seed(cfg.seed)
        ids = torch.randint(self.model.cfg.vocab_size, (rows, cfg.seq_len), generator=generator)
        labels = ids.clone()
        if cfg.data.objective == "mlm":  # only the masked positions are scored, as in the runs
            masked = torch.rand(ids.shape, generator=generator) < cfg.data.mask_prob
            labels[~masked] = -100
        self.batch = {"input_ids": ids.to(device), "labels": labels.to(device)}
        self.tokens = cfg.batch_size * cfg.seq_len

    def step(self, tracker=None) -> None:
        """One training step (`step.train_step`, the trainer's); `tracker` (a memory.SavedTensorTracker)
        watches the first micro-batch."""
        from blocklab.training.step import train_step

        train_step(self.model, [self.batch] * self.cfg.grad_accum, self.optimizers, accum=self.cfg.grad_accum,
                   autocast=self.autocast, grad_clip=self.cfg.optim.grad_clip, watch=tracker)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()

    def timed_step(self) -> float:
        """Seconds of one training step (the device's queue drained before and after)."""
        import time

        self._sync()
        start = time.perf_counter()
        self.step()
        self._sync()
        return time.perf_counter() - start

    def memory(self) -> dict[str, Any]:
        """The memory this model's training takes, apart from the process: parameters, gradients and
        optimizer state (from the tensors), the activations one step keeps for its backward pass (the
        tensors autograd saves, counted as they are saved: `memory.SavedTensorTracker`) and, on CUDA,
        the allocator's peak during a step above what stays resident between steps. Takes one step, two
        on CUDA. With compiled blocks the activations are not counted (None): the hooks that count them
        do not see inside a compiled graph."""
        from blocklab.training import memory

        tracker = None if self.cfg.compile else memory.SavedTensorTracker(self.model)
        self.step(tracker)
        out: dict[str, Any] = {
            "parameter_bytes": memory.parameter_bytes(self.model),
            "gradient_bytes": memory.gradient_bytes(self.model),
            "optimizer_state_bytes": memory.optimizer_state_bytes(self.optimizers),
            "activation_bytes": None if tracker is None else tracker.bytes,
            "activation_micro_batch": self.cfg.batch_size // self.cfg.grad_accum,
            "cuda_step_peak_bytes": None,
        }
        if self.device.type == "cuda":
            self._sync()
            resident = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.step()
            self._sync()
            out["cuda_step_peak_bytes"] = torch.cuda.max_memory_allocated(self.device) - resident
        out["model_total_bytes"] = sum(out[k] or 0 for k in ("parameter_bytes", "gradient_bytes",
                                                             "optimizer_state_bytes", "activation_bytes"))
        return out


def _probe_device(cfg: TrainConfig) -> torch.device:
    """The device the run trained on (its summary.json), or the CPU when that one is gone."""
    try:
        name = json.loads((Path(cfg.out_dir) / "summary.json").read_text())["device"]
    except (OSError, ValueError, KeyError):
        name = "cpu"
    device = torch.device(name)
    return device if device.type != "cuda" or torch.cuda.is_available() else torch.device("cpu")


def measure_architectures(configs: list[tuple[Entry, TrainConfig]], rounds: int = TIMING_ROUNDS,
                          steps: int = TIMING_STEPS) -> dict[str, Any]:
    """After training: each entry's memory (`StepProbe.memory`) and the times of its training step,
    measured again in `rounds` interleaved rounds of `steps` timed steps (one untimed warm-up step
    first), every entry in turn within a round, the order rotated from round to round, each turn on a
    freshly built model so that only one is held at a time (with compiled blocks, one model per entry is
    kept across rounds instead, so that each compiles once). Seed 0's config stands for the entry.

    Returns {"rounds", "steps", "order", "architectures": {label: {"memory": {...}, "step_s": [...]}}}.
    The probes run with the runs' `threads`, as the trainer does."""
    firsts: dict[str, tuple[Entry, TrainConfig]] = {}
    for entry, cfg in configs:  # each entry's first config (seed 0), in the entries' order
        firsts.setdefault(entry.label, (entry, cfg))
    order = list(firsts.values())
    threads_before = torch.get_num_threads()
    out: dict[str, Any] = {"rounds": rounds, "steps": steps, "order": "rotated each round",
                           "architectures": {}}
    with torch.random.fork_rng(devices=[]):  # the probes seed torch; the caller's random state stays
        try:
            for entry, cfg in order:  # memory: one or two untimed steps each
                if cfg.threads is not None:
                    torch.set_num_threads(cfg.threads)
                probe = StepProbe(cfg, _probe_device(cfg))
                out["architectures"][entry.label] = {"memory": probe.memory(), "step_s": []}
                del probe
            kept: dict[str, StepProbe] = {}
            for r in range(rounds):
                shift = r % len(order)
                for entry, cfg in order[shift:] + order[:shift]:
                    if cfg.threads is not None:
                        torch.set_num_threads(cfg.threads)
                    probe = kept.get(entry.label) or StepProbe(cfg, _probe_device(cfg))
                    if cfg.compile:
                        kept[entry.label] = probe
                    probe.step()  # warm-up: first-touch allocations, the allocator's caches, a compile
                    out["architectures"][entry.label]["step_s"] += [probe.timed_step() for _ in range(steps)]
                    del probe
            kept.clear()
        finally:
            torch.set_num_threads(threads_before)
    return out
