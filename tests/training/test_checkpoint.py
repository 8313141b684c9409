"""A run's checkpoint files (training/checkpoint.py): weights, writes that are atomic and pruned, the
optimizer state loaded without unpickling, a damaged state.json named, partial writes removed. What
the checkpointer saves and restores is tests/training/test_checkpointer.py's."""

from __future__ import annotations

import os
import pickle
import shutil

import pytest
import torch

from blocklab.cli import main
from blocklab.training import checkpoint as ckpt
from blocklab.training.checkpoint import latest_checkpoint, list_checkpoints
from helpers import digest


def test_weights_roundtrip_and_aliases(tmp_path):
    a = torch.randn(3, 4)
    weights = {"x": a, "y": a, "z": torch.arange(5)}
    ckpt.save_weights(weights, tmp_path / "w.safetensors")
    back = ckpt.load_weights_file(tmp_path / "w.safetensors")
    assert set(back) == {"x", "y", "z"} and torch.equal(back["y"], a) and torch.equal(back["z"], weights["z"])


def test_checkpoint_write_is_atomic_and_pruned(tmp_path, monkeypatch):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    for step in (1, 2, 3):
        ckpt.save_checkpoint(tmp_path, model.state_dict(), [opt.state_dict()], ckpt.TrainState(step=step),
                             {}, keep=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step_000002", "step_000003"]

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.torch, "save", crash)
    with pytest.raises(OSError):
        ckpt.save_checkpoint(tmp_path, model.state_dict(), [opt.state_dict()], ckpt.TrainState(step=4), {},
                             keep=2)
    # the failed write left no checkpoint that a resume would pick, and nothing older was pruned
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step_000002", "step_000003"]
    state, _ = ckpt.read_state(ckpt.latest_checkpoint(tmp_path))
    assert state.step == 3


def test_saving_the_same_step_again_keeps_the_old_copy_until_the_new_one_is_in_place(tmp_path, monkeypatch):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    state = ckpt.TrainState(step=3, tokens=30)
    ckpt.save_checkpoint(tmp_path, model.state_dict(), [opt.state_dict()], state, {"v": 1}, keep=2)

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.os, "replace", crash)
    with pytest.raises(OSError):
        ckpt.save_checkpoint(tmp_path, model.state_dict(), [opt.state_dict()], state, {"v": 2}, keep=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step_000003"]
    assert ckpt.read_state(ckpt.latest_checkpoint(tmp_path))[1]["v"] == 1  # the old copy, whole
    ckpt.verify_checkpoint(ckpt.latest_checkpoint(tmp_path))
    monkeypatch.undo()
    ckpt.save_checkpoint(tmp_path, model.state_dict(), [opt.state_dict()], state, {"v": 2}, keep=2)
    assert ckpt.read_state(ckpt.latest_checkpoint(tmp_path))[1]["v"] == 2
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000003"]  # no leftovers


def test_optimizer_state_loads_without_unpickling(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    path = ckpt.save_checkpoint(tmp_path, model.state_dict(), [opt.state_dict()], ckpt.TrainState(step=1),
                                {}, keep=1)
    blob = ckpt.load_optimizer_state(path)  # torch.load(weights_only=True) inside
    fresh = torch.optim.AdamW(model.parameters())
    fresh.load_state_dict(blob["optimizers"][0])
    assert torch.equal(fresh.state[model.weight]["exp_avg"], opt.state[model.weight]["exp_avg"])

    # an optimizer.pt that runs code when unpickled is refused, and the code never runs
    marker = tmp_path / "pwned"

    class Malicious:
        def __reduce__(self):
            return os.mkdir, (str(marker),)

    torch.save({"optimizers": [Malicious()], "rng": {}}, path / "optimizer.pt")
    with pytest.raises(pickle.UnpicklingError, match="mkdir"):
        ckpt.load_optimizer_state(path)
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["truncate", "extend", "not-a-dict"])
def test_damaged_state_json_is_named(damage, corpus, finished_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    state = latest_checkpoint(run) / "state.json"
    text = state.read_text()
    damaged = {"truncate": text[: len(text) // 2], "extend": text + "}}", "not-a-dict": "[1, 2]"}
    state.write_text(damaged[damage])
    before = digest(run)
    assert main(["train", "--resume", "--out", str(run), "max_steps=4"]) == 2
    err = capsys.readouterr().err
    assert str(state) in err and "damaged" in err
    assert digest(run) == before


def test_partial_checkpoint_writes_are_removed_on_the_next_start(corpus, finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    partial = run / "checkpoints" / ".tmp-step_000009-12345"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    assert main(["train", "--resume", "--out", str(run), "max_steps=3"]) == 0
    assert not partial.exists() and [p.name for p in list_checkpoints(run)][-1] == "step_000003"
