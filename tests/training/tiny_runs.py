"""The tiny training runs the tests of tests/training/ share: a corpus of words with some structure to
learn, the config of a run of a few steps on it, its training losses, and a run stopped by Ctrl-C."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from blocklab.training import TrainConfig, loop, train
from blocklab.training.metrics import read_metrics

TINY_MODEL = {"d_model": 32, "n_layers": 2, "n_heads": 2}


def write_word_corpus(root: Path) -> Path:
    """A small deterministic corpus of 'files' with some structure to learn, written under `root`."""
    words = ["def", "return", "self", "value", "import", "class", "for", "in", "range", "if", "else"]
    g = torch.Generator().manual_seed(0)
    for i in range(40):
        idx = torch.randint(len(words), (400,), generator=g).tolist()
        lines = [" ".join(words[j] for j in idx[k:k + 8]) for k in range(0, 400, 8)]
        (root / f"f{i:02d}.py").write_text("\n".join(lines) + "\n")
    return root


def write_code_corpus(root: Path) -> Path:
    """30 small Python files of assignments, written under `root` (what `train_four_steps` reads)."""
    for i in range(30):
        (root / f"f{i}.py").write_text("".join(f"value_{j % 9} = {i} + {j}\n" for j in range(60)))
    return root


def train_four_steps(corpus: Path, root: Path) -> Path:
    """`blocklab train` of four steps on `corpus` (bytes, helpers.small_run_args), with a validation
    line and a checkpoint every two, into root/run; the run's folder."""
    from blocklab.cli import main
    from helpers import small_run_args

    out = root / "run"
    assert main(["train", *small_run_args(corpus, root / "cache"), "max_steps=4", "eval_every=2",
                 "ckpt_every=2", "--out", str(out)]) == 0
    return out


def config(corpus: Path, tmp_path: Path, **overrides) -> TrainConfig:
    fields = dict(arch="pre-ln", size="tiny", model=dict(TINY_MODEL), batch_size=4, seq_len=32,
                  max_steps=6, eval_every=3, eval_batches=2, log_every=1, ckpt_every=0, progress=False,
                  out_dir=str(tmp_path / "run"),
                  data={"source": str(corpus), "tokenizer": "byte", "cache_dir": str(tmp_path / "cache"),
                        "val_fraction": 0.1},
                  optim={"lr": 3e-3, "warmup_fraction": 0.0})
    fields.update(overrides)
    return TrainConfig.from_dict(fields)


# with init_from the source fixes the model: no model overrides, arch and size left to it
FROM_SOURCE = dict(model={}, arch=None, size=None)


def train_losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(run_dir / "metrics.jsonl", "train") if "loss" in r]


def stopped_during_step_5(cfg, monkeypatch) -> None:
    """Train `cfg` until a Ctrl-C during step 5 (with ckpt_every=3, the last checkpoint is step 3)."""
    real_step = loop.Trainer._step

    def interrupted(self):
        if self.state.step == 4:
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(loop.Trainer, "_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(cfg)
    monkeypatch.setattr(loop.Trainer, "_step", real_step)
