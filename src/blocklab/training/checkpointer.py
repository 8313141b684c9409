"""A run's checkpoints, torchtitan's checkpoint manager: the one a resume starts from, checked and
restored, and the states saved every `TrainConfig.ckpt_every` steps and at the end (keeping
`keep_checkpoints`). Each state saved records what a resume checks: the model config, tokenizer and
train config its steps were taken with, and the rows metrics.jsonl held (`rundir.check_resume_metrics`).
The files themselves (their format, atomic writes, pruning, disk-full errors) are training/checkpoint.py;
gathering and loading sharded states is training/distributed.py."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from blocklab.model.config import ModelConfig
from blocklab.training import checkpoint as ckpt
from blocklab.training import distributed
from blocklab.training.config import TrainConfig
from blocklab.util.errors import TrainingError


class Checkpointer:
    """Saves and restores the states of `wrapped` (the model the steps run) and `optimizers`. `resume_from`
    is the checkpoint a resume starts from (None: a new run, or a resume with none saved yet)."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, resume_from: Path | None, wrapped: nn.Module,
                 optimizers: list[torch.optim.Optimizer], env: distributed.DistEnv, model_cfg: ModelConfig,
                 tokenizer_hash: str):
        self.cfg, self.run_dir, self.resume_from = cfg, run_dir, resume_from
        self.wrapped, self.optimizers, self.env = wrapped, optimizers, env
        self.model_cfg, self.tokenizer_hash = model_cfg, tokenizer_hash

    def check_resume(self) -> None:
        """The checkpoint's own record (state.json) of the model config and tokenizer it was trained with,
        against this run's; before the run writes anything."""
        if self.resume_from is None:
            return
        checkpoint = self.resume_from
        _, meta = ckpt.read_state(checkpoint)
        saved_tok = meta.get("tokenizer_hash")
        if saved_tok is not None and saved_tok != self.tokenizer_hash:
            raise TrainingError(f"cannot resume from {str(checkpoint)!r}: the tokenizer differs from the one "
                                f"it was trained with (saved hash {saved_tok[:12]}..., now "
                                f"{self.tokenizer_hash[:12]}...). "
                                "Restore data.tokenizer (or its tokenizer.json), or start a new out_dir.")
        saved_cfg, now = meta.get("model_config"), json.loads(json.dumps(self.model_cfg.to_dict()))
        if saved_cfg is not None and saved_cfg != now:
            diff = {k: (saved_cfg.get(k), v) for k, v in now.items() if saved_cfg.get(k) != v}
            raise TrainingError(f"cannot resume from {str(checkpoint)!r}: the model config differs from the "
                                f"checkpoint's (field: (saved, now)) {diff}. Start a new out_dir or restore "
                                "the config.")

    def restore(self) -> ckpt.TrainState:
        """Load the checkpoint's weights, optimizer states and random streams (verified first: checksums,
        then names and shapes); returns where training stood."""
        path = self.resume_from
        assert path is not None, "restore needs a checkpoint to resume from"
        ckpt.verify_checkpoint(path, self.run_dir)  # weights, optimizer, model config, tokenizer
        try:
            weights = ckpt.load_weights_file(path / "model.safetensors")
            ckpt.check_weights(weights, distributed.unwrap(self.wrapped).state_dict(), path)
            blob = ckpt.load_optimizer_state(path)
            distributed.load_full_states(self.wrapped, self.optimizers, weights, blob["optimizers"])
            ckpt.set_rng_state(blob["rng"])
            state, _ = ckpt.read_state(path)
        except Exception as err:  # any unreadable or mismatched checkpoint: a message, not a traceback
            raise TrainingError(f"cannot resume from {str(path)!r}: {err}") from err
        return state

    def due(self, step: int) -> bool:
        """Whether `step` is one of the periodic checkpoints (`ckpt_every`; 0: only the final one)."""
        return bool(self.cfg.ckpt_every) and step % self.cfg.ckpt_every == 0

    def save(self, state: ckpt.TrainState, metrics_rows: dict[str, int] | None) -> None:
        """Save `state` with the model and optimizers (gathered from every rank; rank 0 writes).
        `metrics_rows`: the rows metrics.jsonl holds by kind (None on ranks that keep no metrics)."""
        weights, optim_states = distributed.full_states(self.wrapped, self.optimizers)
        if self.env.is_main:
            # the config these steps were taken with: a resume checks config.yaml against it; the rows
            # metrics.jsonl holds: a resume checks that none was lost since
            meta = {"model_config": self.model_cfg.to_dict(), "tokenizer_hash": self.tokenizer_hash,
                    "train_config": self.cfg.to_dict(),
                    "metrics_rows": None if metrics_rows is None else dict(metrics_rows)}
            ckpt.save_checkpoint(self.run_dir, weights, optim_states, state, meta, self.cfg.keep_checkpoints)
        distributed.barrier(self.env)

    def resume_hint(self) -> str:
        """How to resume from the last checkpoint saved, for an error that stops the run."""
        return ckpt.resume_hint(self.run_dir)
