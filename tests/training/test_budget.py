"""The training budget (training/budget.py): steps from a token or FLOP budget, and a wall-clock budget
that drives the schedule and the progress bar."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from blocklab.training import TrainConfig, train
from blocklab.training import checkpoint as ckpt
from blocklab.training.budget import Budget
from blocklab.training.metrics import read_metrics
from tests.training.tiny_runs import config, train_losses, write_word_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The word corpus of tests/training/tiny_runs.py, written once per module."""
    return write_word_corpus(tmp_path_factory.mktemp("corpus"))


def test_budget_maps_tokens_and_flops_to_steps():
    cfg = TrainConfig(max_tokens=1000, max_flops=1e9)
    b = Budget(cfg, tokens_per_step=128, flops_per_token=1e6)
    assert b.total_steps == min(math.ceil(1000 / 128), math.ceil(1e9 / 1.28e8)) == 8
    assert b.progress(ckpt.TrainState(step=4)) == 0.5 and b.done(ckpt.TrainState(step=8))
    timed = Budget(TrainConfig(max_time=10.0), 128, 1e6)
    assert timed.total_steps is None
    assert timed.progress(ckpt.TrainState(step=99, train_time=2.5)) == 0.25


def test_wall_clock_budget_drives_the_schedule_and_the_progress_bar(corpus, tmp_path, capsys):
    max_time = 1.5
    cfg = config(corpus, tmp_path, max_steps=None, max_time=max_time, eval_every=0, progress=True,
                 optim={"lr": 3e-3, "warmup_fraction": 0.0, "schedule": "linear"})
    result = train(cfg)
    rows = [r for r in read_metrics(result.run_dir / "metrics.jsonl", "train") if "loss" in r]
    assert len(rows) >= 3 and rows[-1]["wall_time"] >= max_time > rows[-2]["wall_time"]
    # each step's lr follows the training time used before it: lr = lr0 * (1 - t / max_time)
    for before, row in zip(rows, rows[1:], strict=False):
        assert row["lr"] == pytest.approx(3e-3 * (1 - before["wall_time"] / max_time), rel=1e-9)
    assert rows[-1]["lr"] < 0.5 * 3e-3 and rows[-1]["lr"] < rows[0]["lr"]  # near the end value, 0
    assert re.search(r"\d\.\d/1\.5 s \[", capsys.readouterr().err)  # the bar counts seconds: it has an ETA


def test_muon_and_a_token_budget(corpus, tmp_path):
    cfg = config(corpus, tmp_path, max_steps=None, max_tokens=5 * 4 * 32, eval_every=0,
                 optim={"name": "muon", "lr": 3e-3})
    result = train(cfg)
    assert result.summary["step"] == 5
    losses = train_losses(result.run_dir)
    assert losses[-1] < losses[0]
