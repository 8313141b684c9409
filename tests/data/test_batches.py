"""Batches of the training and validation splits (data/batches.py), and bits per byte.

References are independent of the code under test:
batch contents by hand, masking rates against binomial standard deviations."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from blocklab.data import Batches, bits_per_byte, prepare_data
from blocklab.util.errors import ConfigError
from tests.data.data_reference import EOS, MASK, byte_cfg, write_files


def test_bits_per_byte_closed_form():
    assert bits_per_byte(math.log(256), 1.0) == pytest.approx(8.0)  # uniform over bytes: 8 bits
    assert bits_per_byte(3 * math.log(2), 1.5) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="positive"):
        bits_per_byte(1.0, float("nan"))


def test_clm_labels_are_inputs_shifted_by_one(tmp_path: Path, cache: Path):
    root = write_files(tmp_path / "d", {"a.txt": "0123456789"})
    data = prepare_data(byte_cfg(root, cache, val_fraction=0.0))
    batches = Batches(data, "train", batch_size=2, seq_len=4, seed=0)  # 11 tokens -> windows at 0 and 4
    b = batches.get(0)
    rows = sorted(zip(b["input_ids"].tolist(), b["labels"].tolist(), strict=True))
    assert rows == [([48, 49, 50, 51], [49, 50, 51, 52]), ([52, 53, 54, 55], [53, 54, 55, 56])]
    assert b["input_ids"].dtype == torch.long and b["labels"].dtype == torch.long


def test_batches_are_pure_and_ranks_split_the_global_batch(code_dir: Path, cache: Path):
    for objective in ("clm", "mlm"):
        data = prepare_data(byte_cfg(code_dir, cache, val_fraction=0.3, objective=objective))
        a = Batches(data, "train", batch_size=8, seq_len=16, seed=3)
        for step in (0, 1, 5, a.steps_per_epoch + 2):  # the last one is in the second epoch
            whole = a.get(step)
            fresh = Batches(data, "train", batch_size=8, seq_len=16, seed=3).get(step)  # a resumed run
            for key in ("input_ids", "labels"):
                assert torch.equal(whole[key], fresh[key])
                for world in (2, 4):
                    parts = [a.get(step, rank, world)[key] for rank in range(world)]
                    assert torch.equal(torch.cat(parts), whole[key])
        other_seed = Batches(data, "train", batch_size=8, seq_len=16, seed=4).get(0)
        assert not torch.equal(other_seed["input_ids"], a.get(0)["input_ids"])
    with pytest.raises(ConfigError, match="world_size dividing"):
        a.get(0, rank=0, world_size=3)


def test_epoch_shuffle_visits_every_window_once(code_dir: Path, cache: Path):
    data = prepare_data(byte_cfg(code_dir, cache, val_fraction=0.3))
    b = Batches(data, "train", batch_size=5, seq_len=8, seed=0)
    n = b.n_windows - b.n_windows % 5  # whole steps of the first epoch
    starts = np.concatenate([b.window_starts(s) for s in range(n // 5)])
    assert len(set(starts.tolist())) == n and all(s % 8 == 0 for s in starts)
    assert starts.tolist() != sorted(starts.tolist())  # shuffled
    all_starts = np.concatenate([b.window_starts(s) for s in range(b.n_windows)])
    second_epoch = all_starts[b.n_windows:2 * b.n_windows]
    assert sorted(second_epoch.tolist()) == list(range(0, 8 * b.n_windows, 8))


def test_mlm_masking_rates(tmp_path: Path, cache: Path):
    rng = random.Random(0)
    text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz \n") for _ in range(40_000))
    data = prepare_data(byte_cfg(write_files(tmp_path / "d", {"a.txt": text}), cache, val_fraction=0.0,
                                 objective="mlm"))
    b = Batches(data, "train", batch_size=64, seq_len=32, seed=0)
    batches = [b.get(step) for step in range(40)]
    inputs = torch.cat([x["input_ids"] for x in batches]).flatten()
    labels = torch.cat([x["labels"] for x in batches]).flatten()
    windows = torch.from_numpy(np.stack([np.asarray(data.train[s:s + 32], dtype=np.int64)
                                         for step in range(40) for s in b.window_starts(step)])).flatten()
    chosen = labels != -100
    assert torch.equal(labels[chosen], windows[chosen])  # labels are the original tokens
    assert torch.equal(inputs[~chosen], windows[~chosen])  # unchosen tokens are untouched
    assert not chosen[windows == EOS].any()  # separators are never masked

    def near(count: int, n: int, p: float) -> None:
        assert abs(count / n - p) < 5 * math.sqrt(p * (1 - p) / n), (count / n, p)

    candidates = int((windows != EOS).sum())
    n_chosen = int(chosen.sum())
    near(n_chosen, candidates, 0.25)
    to_mask = int((inputs[chosen] == MASK).sum())
    unchanged = int((inputs[chosen] == windows[chosen]).sum())
    near(to_mask, n_chosen, 0.8)
    near(unchanged, n_chosen, 0.1 + 0.1 / 256)  # a random token equals the original 1 time in 256
    near(n_chosen - to_mask - unchanged, n_chosen, 0.1 * 255 / 256)
    assert ((inputs[chosen] == MASK) | (inputs[chosen] < 256)).all()
    assert not (inputs == EOS).logical_and(windows != EOS).any()  # random tokens are never specials


def test_validation_covers_the_split(code_dir: Path, cache: Path):
    data = prepare_data(byte_cfg(code_dir, cache, val_fraction=0.3))
    val = data.val.tolist()
    b = Batches(data, "val", batch_size=8, seq_len=16, seed=0)
    assert (len(val) - 1) % 16 != 0  # so the tail window is exercised
    passes = [list(b.validation(3)) for _ in range(2)]
    for x, y in zip(*passes, strict=True):
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["labels"], y["labels"])
    targets = torch.cat([x["labels"].flatten() for x in passes[0]])
    assert targets[targets != -100].tolist() == val[1:]  # every target once, in order
    assert sum(1 for _ in b.validation(3, max_batches=2)) == 2
    ranks = [list(b.validation(3, rank=r, world_size=2)) for r in range(2)]
    assert len(ranks[0]) + len(ranks[1]) == len(passes[0])
    # Masked LM: each position is scored by exactly one window.
    mlm = Batches(data, "val", batch_size=8, seq_len=16, seed=0, objective="mlm")
    starts, first_new = mlm.validation_windows()
    scored = np.concatenate([np.arange(s + k, s + 16) for s, k in zip(starts, first_new, strict=True)])
    assert scored.tolist() == list(range(len(val)))
    labels = torch.cat([x["labels"] for x in mlm.validation(4)])
    assert (labels[-1, : first_new[-1]] == -100).all() and (labels != -100).any()
