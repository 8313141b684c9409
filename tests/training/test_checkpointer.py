"""A run's checkpoints (training/checkpointer.py) on their own: saved with the record a resume checks,
restored to the weights, optimizer state and random streams saved, and a resume refused when the
model or the tokenizer differs. The files' format and atomic writes are
tests/training/test_checkpoint.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from blocklab.training import TrainConfig
from blocklab.training import checkpoint as ckpt
from blocklab.training.checkpointer import Checkpointer
from blocklab.training.distributed import DistEnv
from blocklab.util.errors import TrainingError
from helpers import make_model

TOKENIZER = "ab" * 32  # a tokenizer's hash


def parts(seed: int = 0, **model):
    shape = {"vocab_size": 40, "d_model": 16, "n_layers": 2, "n_heads": 2, **model}
    net = make_model("pre-ln", seed=seed, **shape)
    return net, [torch.optim.AdamW(net.parameters(), lr=1e-2)]


def checkpointer(run: Path, net, optimizers, resume_from: Path | None = None, tokenizer: str = TOKENIZER,
                 **fields) -> Checkpointer:
    cfg = TrainConfig.from_dict({"max_steps": 6, "ckpt_every": 3, "keep_checkpoints": 2, "out_dir": str(run),
                                 **fields})
    return Checkpointer(cfg, run, resume_from, net, optimizers, DistEnv(), net.cfg, tokenizer)


def one_step(net, optimizers) -> None:
    net(torch.arange(8)[None] % 40, labels=torch.arange(8)[None] % 40).backward()
    for opt in optimizers:
        opt.step()
        opt.zero_grad()


def test_a_saved_state_restores_weights_optimizer_and_random_streams(tmp_path):
    net, optimizers = parts()
    one_step(net, optimizers)
    state = ckpt.TrainState(step=3, tokens=24, train_time=1.5)
    checkpointer(tmp_path, net, optimizers).save(state, {"train": 4, "val": 2})
    saved = {k: v.clone() for k, v in net.state_dict().items()}
    moments = optimizers[0].state_dict()["state"][0]["exp_avg"].clone()
    drawn = torch.rand(4)  # the stream right after the save

    other, other_opts = parts(seed=1)  # another model: weights, moments and stream to be replaced
    one_step(other, other_opts)
    one_step(other, other_opts)
    path = tmp_path / "checkpoints" / "step_000003"
    restored = checkpointer(tmp_path, other, other_opts, resume_from=path).restore()
    assert (restored.step, restored.tokens, restored.train_time) == (3, 24, 1.5)
    assert all(torch.equal(v, saved[k]) for k, v in other.state_dict().items())
    assert torch.equal(other_opts[0].state_dict()["state"][0]["exp_avg"], moments)
    assert torch.equal(torch.rand(4), drawn)

    meta = json.loads((path / "state.json").read_text())  # what a resume checks against
    assert meta["metrics_rows"] == {"train": 4, "val": 2} and meta["tokenizer_hash"] == TOKENIZER
    assert meta["model_config"]["d_model"] == 16 and meta["train_config"]["ckpt_every"] == 3


def test_only_the_last_checkpoints_are_kept(tmp_path):
    net, optimizers = parts()
    saver = checkpointer(tmp_path, net, optimizers, keep_checkpoints=2)
    for step in (3, 6, 9):
        saver.save(ckpt.TrainState(step=step), None)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step_000006", "step_000009"]
    assert json.loads((tmp_path / "checkpoints" / "step_000009" / "state.json").read_text())["metrics_rows"] \
        is None  # a rank that keeps no metrics


def test_the_periodic_checkpoints_fall_every_ckpt_every_steps(tmp_path):
    net, optimizers = parts()
    assert [s for s in range(1, 10) if checkpointer(tmp_path, net, optimizers).due(s)] == [3, 6, 9]
    assert not any(checkpointer(tmp_path, net, optimizers, ckpt_every=0).due(s) for s in range(1, 10))


def test_a_resume_is_refused_when_the_tokenizer_or_the_model_differs(tmp_path):
    net, optimizers = parts()
    checkpointer(tmp_path, net, optimizers).save(ckpt.TrainState(step=3), {"train": 3, "val": 1})
    path = tmp_path / "checkpoints" / "step_000003"
    checkpointer(tmp_path, net, optimizers, resume_from=path).check_resume()  # the same: goes on
    checkpointer(tmp_path, net, optimizers).check_resume()  # nothing to resume from: nothing to check
    with pytest.raises(TrainingError, match="the tokenizer differs"):
        checkpointer(tmp_path, net, optimizers, resume_from=path, tokenizer="cd" * 32).check_resume()
    wider, wider_opts = parts(mlp_hidden=48)
    with pytest.raises(TrainingError, match=r"'mlp_hidden': \(64, 48\)"):
        checkpointer(tmp_path, wider, wider_opts, resume_from=path).check_resume()


def test_a_checkpoint_that_does_not_fit_the_model_is_refused_plainly(tmp_path):
    net, optimizers = parts()
    checkpointer(tmp_path, net, optimizers).save(ckpt.TrainState(step=3), None)
    deeper, deeper_opts = parts(n_layers=3)
    path = tmp_path / "checkpoints" / "step_000003"
    with pytest.raises(TrainingError, match="cannot resume from .*step_000003"):
        checkpointer(tmp_path, deeper, deeper_opts, resume_from=path).restore()
