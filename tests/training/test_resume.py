"""Chaos: kill -9 training at random moments (checkpoints are written every step, so many kills land
inside a write) and resume until done; the loss curve must equal an uninterrupted run's bit for bit.
And kill -9 a run while it tokenises: the next run must find a whole token cache.

Slow (a few seconds a trial): `python -m pytest -m slow tests/test_kill_and_resume.py`; BLOCKLAB_CHAOS_TRIALS
sets the number of trials (default 10).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from blocklab.training.metrics import read_metrics
from timeouts import patient

pytestmark = pytest.mark.slow


def _args(corpus: Path, cache: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "blocklab.cli", "train", f"data.source={corpus}", "data.tokenizer=byte",
            f"data.cache_dir={cache}", "model.d_model=32", "model.n_layers=2", "model.n_heads=2",
            "batch_size=4", "seq_len=32", "max_steps=40", "log_every=1", "ckpt_every=1", "eval_every=10",
            "eval_batches=2", "keep_checkpoints=2", "progress=false", "--out", str(out)]


def _losses(run: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_metrics(run / "metrics.jsonl", "train") if "loss" in r]


def _last_step(run: Path) -> int:
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return -1
    return max((int(line.split('"step": ')[1].split(",")[0]) for line in lines if '"step": ' in line),
               default=-1)


def test_random_kills_resume_bit_for_bit(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(30):
        (corpus / f"f{i}.py").write_text("".join(f"v{j % 13} = {i} - {j}\n" for j in range(80)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    clean = tmp_path / "clean"
    subprocess.run(_args(corpus, tmp_path / "cache", clean), check=True, env=env, capture_output=True)
    reference = _losses(clean)
    trials = int(os.environ.get("BLOCKLAB_CHAOS_TRIALS", "10"))
    rng = random.Random(0)
    kills = 0
    for trial in range(trials):
        out = tmp_path / f"trial{trial}"
        while not (out / "summary.json").is_file():
            resume = any((out / "checkpoints").glob("step_*/state.json"))  # else afresh, as a user would
            args = _args(corpus, tmp_path / "cache", out)  # overrides before --out: argparse takes one run
            cmd = args[:-2] + (["--resume"] if resume else ["overwrite=true"]) + args[-2:]
            steps_before = _last_step(out)
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            deadline = time.monotonic() + patient(120)
            while proc.poll() is None and _last_step(out) <= steps_before and time.monotonic() < deadline:
                time.sleep(0.02)  # wait for a step past the resume point, so every attempt makes progress
            try:  # then a random moment: inside a step, a log write or a checkpoint write
                proc.wait(timeout=rng.uniform(0.0, 0.6))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                kills += 1
            else:
                assert proc.returncode == 0, proc.stderr.read().decode()[-2000:]
        assert _losses(out) == reference, f"trial {trial}: the resumed curve differs"
        assert not list((out / "checkpoints").glob(".tmp-*")), "a partial write was left behind"
    print(f"chaos: {trials} trials, {kills} kills, all resumed bit for bit")


def test_kill_during_tokenisation_leaves_a_cache_that_trains(tmp_path):
    """kill -9 `blocklab train` while it tokenises (its temporary shard folder exists), then run again:
    the run finishes, the dead process's leftovers are gone and the cached arrays equal a clean cache's."""
    import numpy as np

    from blocklab.data import DataConfig, prepare_data

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(40):  # 16 MB: a few seconds of tokenising, with a 4 MB chunk written at a time
        lines = (f"v{j % 97} = {i} * {j} - {j % 13}\n" for j in range(20_000))
        (corpus / f"f{i}.py").write_text("".join(lines))
    cache, out = tmp_path / "cache", tmp_path / "run"
    args = [sys.executable, "-m", "blocklab.cli", "train", f"data.source={corpus}", "data.tokenizer=byte",
            f"data.cache_dir={cache}", "model.d_model=32", "model.n_layers=2", "model.n_heads=2",
            "batch_size=4", "seq_len=32", "max_steps=3", "eval_every=3", "eval_batches=1",
            "progress=false", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + patient(120)
    while proc.poll() is None and time.monotonic() < deadline and not list(cache.glob("shards/.tmp-*")):
        time.sleep(0.005)
    time.sleep(0.2)  # into the tokenising
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed while tokenising"
    shards = cache / "shards"
    assert [p.name.startswith(".tmp-") for p in shards.iterdir()] == [True], "killed before the rename"
    done = subprocess.run(args[:-2] + ["overwrite=true", *args[-2:]], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "summary.json").is_file()
    assert not [p for p in shards.iterdir() if p.name.startswith(".")], "the killed run's leftovers stay"
    cfg = DataConfig(source=str(corpus), tokenizer="byte", cache_dir=str(cache))
    ours, clean = prepare_data(cfg), prepare_data(cfg.replace(cache_dir=str(tmp_path / "clean")))
    assert not ours.stats["tokenised"] and ours.path.name == clean.path.name
    assert np.array_equal(ours.train, clean.train) and np.array_equal(ours.val, clean.val)
