"""Open a finished (or interrupted) run directory: its model, tokenizer and config."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from blocklab.config import ModelConfig
from blocklab.data import Tokenizer, load_tokenizer
from blocklab.errors import ConfigError
from blocklab.model import Transformer
from blocklab.training import checkpoint as ckpt
from blocklab.training.config import TrainConfig


@dataclass
class LoadedRun:
    model: Transformer
    tokenizer: Tokenizer
    config: TrainConfig
    checkpoint: Path

    def complete(self, prompt: str, max_new_tokens: int, stop: bool = True, **sampling: Any) -> str:
        """The text the model writes after `prompt`, decoded with the KV cache (`Transformer.generate`;
        `sampling`: temperature, top_k, top_p, seed; greedy by default). With `stop` it ends at the
        tokenizer's end-of-text token, which is not part of the text."""
        prompt_ids = self.tokenizer.encode(prompt)
        if not prompt_ids:
            raise ConfigError("the prompt is empty: give at least one character of text to continue.")
        ids = torch.tensor([prompt_ids], device=next(self.model.parameters()).device)
        stops = [self.tokenizer.eos_id] if stop else None
        out = self.model.generate(ids, max_new_tokens, stop_tokens=stops, **sampling)
        new = out[0, len(prompt_ids):].tolist()
        if stops and new and new[-1] in stops:
            new = new[:-1]
        return self.tokenizer.decode(new)


def load_run(run_dir: str | Path, checkpoint: str | Path | None = None, device: str = "cpu",
             verify: bool = True) -> LoadedRun:
    """The model of a run's latest (or the given) checkpoint in eval mode, with the run's tokenizer.
    With `verify`, the weights, model_config.json and tokenizer.json must match the sha256 the
    checkpoint recorded (blocklab.integrity)."""
    run = Path(run_dir)
    if not (run / "model_config.json").is_file():
        raise FileNotFoundError(f"{str(run)!r} is not a blocklab run directory (no model_config.json); "
                                "give the out_dir of `blocklab train` or a run under a compare's runs/.")
    path = Path(checkpoint) if checkpoint is not None else ckpt.latest_checkpoint(run)
    if path is None:
        raise FileNotFoundError(f"run {str(run)!r} has no checkpoint yet.")
    if verify:
        ckpt.verify_checkpoint(path, run, files=("model.safetensors",))
    model = Transformer(ModelConfig.from_dict(json.loads((run / "model_config.json").read_text())))
    ckpt.load_weights(path, model)
    config = TrainConfig.load(run / "config.yaml") if (run / "config.yaml").is_file() else None
    return LoadedRun(model.to(torch.device(device)).eval(), load_tokenizer(run), config, path)
