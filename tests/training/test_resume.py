"""Resuming a run (`train --resume`) and starting one in a folder: the curve of an uninterrupted run,
bit for bit on the CPU (also after kill -9 at random moments, while checkpoints are written every
step); only the changes a resume allows; a different model, tokenizer or hand-edited config.yaml
refused; a folder holding another run or the user's files left as it was.

The kills are slow (a few seconds a trial): `python -m pytest -m slow tests/training/test_resume.py`;
BLOCKLAB_CHAOS_TRIALS sets the number of trials (default 10)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from blocklab.cli import main
from blocklab.training import TrainConfig, TrainingError, build, train
from blocklab.training import checkpoint as ckpt
from blocklab.training.metrics import read_metrics
from blocklab.util.errors import ConfigError
from tests.training.tiny_runs import (
    TINY_MODEL,
    config,
    stopped_during_step_5,
    train_losses,
    write_word_corpus,
)
from timeouts import patient


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The word corpus of tests/training/tiny_runs.py, written once per module."""
    return write_word_corpus(tmp_path_factory.mktemp("corpus"))


def test_resume_message_and_readme_list_exactly_resumable(tmp_path):
    from blocklab.training.config import RESUMABLE, check_resumable, resume_rule

    run = tmp_path / "run"
    run.mkdir()
    saved = TrainConfig(max_steps=2, out_dir=str(run))
    (run / "config.yaml").write_text(saved.to_yaml())
    # every field of RESUMABLE may change at once
    check_resumable(saved.replace(max_steps=4, max_tokens=10**6, max_flops=1e15, max_time=60.0, eval_every=1,
                                  log_every=1, ckpt_every=1, keep_checkpoints=1, progress=False, threads=1,
                                  out_dir=str(tmp_path / "moved"), overwrite=True,
                                  data=saved.data.replace(cache_dir=str(tmp_path / "cache"))), run)
    with pytest.raises(ConfigError) as err:
        check_resumable(saved.replace(batch_size=8), run)
    message = str(err.value)
    assert "batch_size: 16 -> 8" in message and resume_rule() in message
    listed = re.search(r"may change only (.*?);", message)[1].split(", ")
    assert len(listed) == len(RESUMABLE) and set(listed) == RESUMABLE
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = re.search(r"only the fields of `training.config.RESUMABLE` may change:(.*?), so a", readme,
                        re.S)
    assert set(re.findall(r"`([^`]+)`", section[1])) == RESUMABLE


def test_resume_and_compare_share_one_saved_config_check(tmp_path):
    """training.config.check_saved_config checks a saved run for both, with their own ignored fields:
    a change in a field neither ignores is named alike; a resume may extend the budget, a reuse not."""
    from blocklab.compare import Entry
    from blocklab.launch import train_runs
    from blocklab.training.config import NOT_RESULTS, RESUMABLE, check_resumable

    run = tmp_path / "run"
    run.mkdir()
    saved = TrainConfig(max_steps=2, out_dir=str(run))
    (run / "config.yaml").write_text(saved.to_yaml())
    (run / "summary.json").write_text("{}")  # a finished run, which compare reuses without training

    def resume(cfg):
        check_resumable(cfg, run)

    def reuse(cfg):
        train_runs([(Entry.parse("pre-ln"), cfg)], log=lambda *_: None)

    for check in (resume, reuse):
        with pytest.raises(ConfigError, match=r"with a different config \(seq_len: 128 -> 64\)"):
            check(saved.replace(seq_len=64))
        check(saved.replace(log_every=5, progress=False))  # in NOT_RESULTS: both go on
    resume(saved.replace(max_steps=4))
    with pytest.raises(ConfigError, match=r"a finished run with a different config \(max_steps: 2 -> 4\)"):
        reuse(saved.replace(max_steps=4))
    assert NOT_RESULTS < RESUMABLE


def test_resume_continues_the_same_loss_curve(corpus, tmp_path, monkeypatch):
    base = dict(max_steps=8, ckpt_every=3, eval_every=4, model={**TINY_MODEL, "dropout": 0.1})
    full = train(config(corpus, tmp_path / "a", **base))

    stopped_during_step_5(config(corpus, tmp_path / "b", **base), monkeypatch)
    resumed = train(config(corpus, tmp_path / "b", **base), resume=True)
    assert train_losses(resumed.run_dir) == train_losses(full.run_dir)  # bit-identical on CPU
    for p_full, p_res in zip(full.model.parameters(), resumed.model.parameters(), strict=False):
        assert torch.equal(p_full, p_res)


def test_resume_cuts_a_torn_last_metrics_line(corpus, tmp_path, monkeypatch, capsys):
    """A disk filling up or the power failing while metrics.jsonl is appended to leaves its last line
    torn; the checkpoint is intact, so the resume drops that line, says so and goes on to the curve of
    an uninterrupted run."""
    base = dict(max_steps=8, ckpt_every=3, eval_every=4)
    full = train(config(corpus, tmp_path / "a", **base))
    stopped_during_step_5(config(corpus, tmp_path / "b", **base), monkeypatch)
    metrics = tmp_path / "b" / "run" / "metrics.jsonl"
    torn = '{"kind": "train", "step": 9, "lo'
    with metrics.open("a") as f:
        f.write(torn)
    capsys.readouterr()
    resumed = train(config(corpus, tmp_path / "b", **base), resume=True)
    assert f"{metrics}: dropped a torn last line ({len(torn)} bytes)" in capsys.readouterr().err
    assert train_losses(resumed.run_dir) == train_losses(full.run_dir)  # bit-identical on CPU
    vals = [(r["step"], r["val_loss"]) for r in read_metrics(full.run_dir / "metrics.jsonl", "val")]
    assert [(r["step"], r["val_loss"]) for r in read_metrics(metrics, "val")] == vals
    assert metrics.read_text().endswith("}\n") and not list(metrics.parent.glob(".tmp-*"))


def test_resume_refuses_a_metrics_line_damaged_before_the_end(corpus, tmp_path, capsys):
    from blocklab.cli import main

    run = train(config(corpus, tmp_path, max_steps=2)).run_dir
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    lines[1] = lines[1][:20] + "\n"  # not a torn write, which only ever cuts the end
    metrics.write_text("".join(lines))
    capsys.readouterr()
    assert main(["train", "--resume", "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"blocklab: error: {metrics}:2 is not a JSON object") and "delete that line" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert metrics.read_text() == "".join(lines)  # left as it was, for the user to repair


def test_resume_rejects_a_different_model(corpus, tmp_path, capsys):
    from blocklab.cli import main

    run = train(config(corpus, tmp_path, max_steps=2)).run_dir
    with pytest.raises(ConfigError, match=r"model.n_layers: 2 -> 3"):  # a changed config: refused up front
        train(config(corpus, tmp_path, max_steps=4, model={**TINY_MODEL, "n_layers": 3}), resume=True)
    # config.yaml edited by hand: the checkpoint's own state.json still names the model it holds
    saved = (run / "config.yaml").read_text()
    assert "n_layers: 2" in saved
    (run / "config.yaml").write_text(saved.replace("n_layers: 2", "n_layers: 3"))
    with pytest.raises(ConfigError, match=r"differs from the config the checkpoint was trained with "
                                          r"\(model.n_layers: 2 -> 3\)"):
        train(out_dir=str(run), resume=True)
    # state.json edited too: the weights do not fit, and the load failure is a TrainingError
    state = ckpt.latest_checkpoint(run) / "state.json"
    meta = json.loads(state.read_text())
    meta["train_config"]["model"]["n_layers"] = 3
    with pytest.raises(TrainingError, match=r"differs from the checkpoint's .*'n_layers': \(2, 3\)"):
        state.write_text(json.dumps(meta))
        train(out_dir=str(run), resume=True)
    meta["model_config"]["n_layers"] = 3
    state.write_text(json.dumps(meta))
    with pytest.raises(TrainingError, match=r"does not match the model: missing \['blocks.2"):
        train(out_dir=str(run), resume=True)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:  # exit status 1 with a message, not a traceback
        main(["train", "--resume", "--out", str(run)])
    err = capsys.readouterr().err
    assert exit_.value.code == 1
    assert "does not match the model" in err and "Traceback" not in err


def test_resume_rejects_a_different_tokenizer(corpus, tmp_path):
    from blocklab.data import byte_tokenizer

    tok = byte_tokenizer().save(tmp_path / "tok")
    data = {"source": str(corpus), "tokenizer": str(tok), "cache_dir": str(tmp_path / "cache"),
            "val_fraction": 0.1}
    run = train(config(corpus, tmp_path, max_steps=2, data=data)).run_dir
    byte_tokenizer(mask_token="<|other|>").save(tmp_path / "tok")  # the same path, another tokenizer
    with pytest.raises(TrainingError, match="the tokenizer differs from the one it was trained with"):
        train(config(corpus, tmp_path, max_steps=4, data=data), resume=True)
    assert ckpt.latest_checkpoint(run).name == "step_000002"  # nothing saved was touched


@pytest.mark.parametrize("edit, field", [(("optim", "lr", 0.02), "optim.lr"), ((None, "seed", 7), "seed"),
                                         ((None, "batch_size", 4), "batch_size")])
def test_resume_refuses_a_hand_edited_config_yaml(tmp_path, capsys, edit, field):
    """lr, seed or batch size edited in config.yaml by hand changed the run on --resume, exit 0,
    while the same change as an override was refused: the checkpoint records the config it was trained
    with and a resume is checked against it. An edit of a field a resume may change (log_every) passes."""
    import yaml

    from helpers import small_run_args, write_code_corpus

    (tmp_path / "corpus").mkdir()
    corpus = write_code_corpus(tmp_path / "corpus")
    run = tmp_path / "run"
    assert main(["train", *small_run_args(corpus, tmp_path / "cache"), "max_steps=2", "--out", str(run)]) == 0
    before = sorted((p.name, p.stat().st_mtime_ns) for p in run.rglob("*"))
    data = yaml.safe_load((run / "config.yaml").read_text())
    section, name, value = edit
    fields = data[section] if section else data
    trained, fields[name] = fields[name], value
    (run / "config.yaml").write_text(yaml.safe_dump(data))
    capsys.readouterr()
    assert main(["train", "--resume", "--out", str(run), "max_steps=4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("blocklab: error: ") and len(err.strip().splitlines()) == 1
    assert "differs from the config the checkpoint was trained with" in err and f"{field}: " in err
    assert f"-> {value!r}" in err
    after = sorted((p.name, p.stat().st_mtime_ns) for p in run.rglob("*"))
    # nothing written by the refused resume (config.yaml is the hand-edited one)
    assert [b for b in before if b[0] != "config.yaml"] == [a for a in after if a[0] != "config.yaml"]
    fields[name] = trained  # back to what it was trained with
    data["log_every"] = 1  # a field a resume may change
    (run / "config.yaml").write_text(yaml.safe_dump(data))
    assert main(["train", "--resume", "--out", str(run), "max_steps=4"]) == 0
    assert json.loads((run / "summary.json").read_text())["step"] == 4


def test_resume_takes_the_saved_config_and_allows_only_safe_changes(corpus, tmp_path, capsys):
    from blocklab.cli import main

    run = train(config(corpus, tmp_path, max_steps=4, eval_every=2)).run_dir
    rows = (run / "metrics.jsonl").read_text()
    # a finished run resumed as it is: no second final validation row, no new checkpoint
    assert main(["train", "--resume", "--out", str(run)]) == 0
    assert (run / "metrics.jsonl").read_text() == rows
    # settings that would change the steps already taken are refused, by name
    for override, name in (("batch_size=8", "batch_size: 4 -> 8"),
                           ("optim.lr=0.01", "optim.lr: 0.003 -> 0.01"),
                           (f"data.source={tmp_path}", "data.source")):
        capsys.readouterr()
        assert main(["train", "--resume", "--out", str(run), "max_steps=6", override]) == 2
        err = capsys.readouterr().err
        assert name in err and "Traceback" not in err
    with pytest.raises(ConfigError, match="seq_len: 32 -> 16"):
        train(out_dir=str(run), resume=True, seq_len=16)
    # the budget and the cadence may change: the run goes on from its checkpoint with the saved config
    assert main(["train", "--resume", "--out", str(run), "max_steps=6", "log_every=2", "progress=false"]) == 0
    saved = TrainConfig.load(run / "config.yaml")
    assert (saved.max_steps, saved.log_every, saved.batch_size) == (6, 2, 4)  # config.yaml rewritten
    more = train(out_dir=str(run), resume=True, max_steps=7)  # the Python API, likewise
    assert more.summary["step"] == 7
    trains = [r["step"] for r in read_metrics(run / "metrics.jsonl", "train") if "loss" in r]
    assert trains == [1, 2, 3, 4, 6, 7]
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl", "val")] == [0, 2, 4, 6, 7]


def test_resume_of_an_empty_or_missing_dir(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for d in ("empty", "missing"):
        assert main(["train", "--resume", "--out", str(tmp_path / d)]) == 2
        err = capsys.readouterr().err
        assert "holds no run to continue" in err and d in err and "budget" not in err


def test_new_run_refuses_a_directory_holding_a_run(corpus, tmp_path, monkeypatch):
    run = train(config(corpus, tmp_path, max_steps=4)).run_dir
    metrics = (run / "metrics.jsonl").read_text()

    def no_data(cfg):
        raise AssertionError("the directory is checked before data preparation")

    monkeypatch.setattr(build, "prepare_data", no_data)
    for fields in (dict(max_steps=2), dict(max_steps=2, eval_every=1)):
        with pytest.raises(ConfigError) as err:
            train(config(corpus, tmp_path, **fields))
        for word in (str(run), "--resume", "another out_dir", "overwrite=true"):
            assert word in str(err.value)
    assert (run / "metrics.jsonl").read_text() == metrics  # nothing saved was lost
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step_000004"]
    monkeypatch.undo()
    # overwrite=true replaces the old run: its higher-step checkpoint no longer shadows the new one
    (run / "diagnostics").mkdir()
    (run / "notes.txt").write_text("mine")
    result = train(config(corpus, tmp_path, max_steps=2, overwrite=True))
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step_000002"]
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl", "train")] == [0, 1, 2]
    assert result.summary["step"] == 2 and not (run / "diagnostics").exists()
    assert (run / "notes.txt").read_text() == "mine"  # only the run's own files are removed


def test_train_into_a_folder_that_is_not_a_run_keeps_the_users_files(tmp_path, capsys):
    """A folder that is not a run keeps its config.yaml, tokenizer.json and summary.json (they used to be
    replaced, exit 0): refused naming them, unless overwrite=true, which replaces only those (notes.txt
    stays)."""
    from helpers import small_run_args, write_code_corpus

    (tmp_path / "corpus").mkdir()
    corpus = write_code_corpus(tmp_path / "corpus")
    out = tmp_path / "mine"
    out.mkdir()
    mine = {"config.yaml": "my: settings\n", "tokenizer.json": "{}", "summary.json": "[]", "notes.txt": "hi"}
    for name, text in mine.items():
        (out / name).write_text(text)
    args = ["train", *small_run_args(corpus, tmp_path / "cache"), "max_steps=2", "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("blocklab: error: ") and "is not a blocklab run" in err and "overwrite=true" in err
    assert "config.yaml, tokenizer.json, summary.json" in err
    assert {p.name: p.read_text() for p in out.iterdir()} == mine  # nothing touched
    assert main([*args, "overwrite=true"]) == 0
    assert (out / "notes.txt").read_text() == "hi"
    assert json.loads((out / "summary.json").read_text())["step"] == 2


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


@pytest.mark.slow
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
