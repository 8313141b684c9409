"""The trainer: config, budget, checkpoints, the loop, resume, bad input, multi-process."""

from __future__ import annotations

import gc
import importlib.util
import io
import json
import math
import os
import pickle
import re
import shutil
import subprocess
import sys
import warnings
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import pytest
import torch

import blocklab
from blocklab.training import TrainConfig, TrainingError, build, loop, train
from blocklab.training import checkpoint as ckpt
from blocklab.training.budget import Budget
from blocklab.training.metrics import read_metrics
from blocklab.training.step import autocast_for
from blocklab.util import progress
from blocklab.util.errors import ConfigError
from timeouts import patient

TINY_MODEL = {"d_model": 32, "n_layers": 2, "n_heads": 2}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A small deterministic corpus of 'files' with some structure to learn."""
    root = tmp_path_factory.mktemp("corpus")
    words = ["def", "return", "self", "value", "import", "class", "for", "in", "range", "if", "else"]
    g = torch.Generator().manual_seed(0)
    for i in range(40):
        idx = torch.randint(len(words), (400,), generator=g).tolist()
        lines = [" ".join(words[j] for j in idx[k:k + 8]) for k in range(0, 400, 8)]
        (root / f"f{i:02d}.py").write_text("\n".join(lines) + "\n")
    return root


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


# -- config ---------------------------------------------------------------------------------------------
def test_config_yaml_and_dotted_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("arch: sas-p\nmax_steps: 10\noptim:\n  lr: 1.0e-3\nmodel:\n  n_layers: 3\n")
    cfg = TrainConfig.load(path, ["optim.lr=3e-4", "model.d_model=64", "data.tokenizer=byte", "seed=7"])
    assert (cfg.arch, cfg.max_steps, cfg.seed) == ("sas-p", 10, 7)
    assert cfg.optim.lr == 3e-4 and cfg.data.tokenizer == "byte"
    assert cfg.model == {"n_layers": 3, "d_model": 64}
    again = TrainConfig.load(None, cfg.to_dict())  # round trip through the dict form
    assert again.to_dict() == cfg.to_dict()
    model_cfg = cfg.model_config(vocab_size=300)
    assert (model_cfg.n_layers, model_cfg.d_model, model_cfg.vocab_size) == (3, 64, 300)
    assert model_cfg.context_length == cfg.seq_len and model_cfg.causal


@pytest.mark.parametrize("overrides, words", [
    ({}, ["budget", "max_steps"]),
    ({"max_steps": 5, "batch_szie": 3}, ["batch_szie", "batch_size"]),
    ({"max_steps": 5, "batch_size": 6, "grad_accum": 4}, ["batch_size", "grad_accum=4"]),
    ({"max_steps": -1}, ["max_steps", "positive"]),
    ({"max_steps": 5, "arch": "sass"}, ["sass"]),
    ({"max_steps": 5, "model": {"n_layer": 2}}, ["n_layer", "n_layers"]),
    ({"max_steps": 5, "device": "tpu"}, ["device", "'cpu'"]),
    ({"max_steps": 5, "threads": 0}, ["TrainConfig.threads = 0", "positive integer", "OMP_NUM_THREADS"]),
    ({"max_steps": 5, "threads": 1.5}, ["TrainConfig.threads = 1.5", "positive integer"]),
    ({"max_steps": 5, "threads": True}, ["TrainConfig.threads = True", "positive integer"]),
])
def test_bad_train_configs_name_the_field(overrides, words):
    with pytest.raises(ConfigError) as err:
        TrainConfig.load(None, overrides)
    for w in words:
        assert w in str(err.value)


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="key=value"):
        TrainConfig.load(None, ["max_steps"])
    with pytest.raises(ConfigError, match="nested"):
        TrainConfig.load(None, ["max_steps=3", "seed.x=1"])


# -- budget ---------------------------------------------------------------------------------------------
def test_budget_maps_tokens_and_flops_to_steps():
    cfg = TrainConfig(max_tokens=1000, max_flops=1e9)
    b = Budget(cfg, tokens_per_step=128, flops_per_token=1e6)
    assert b.total_steps == min(math.ceil(1000 / 128), math.ceil(1e9 / 1.28e8)) == 8
    assert b.progress(ckpt.TrainState(step=4)) == 0.5 and b.done(ckpt.TrainState(step=8))
    timed = Budget(TrainConfig(max_time=10.0), 128, 1e6)
    assert timed.total_steps is None
    assert timed.progress(ckpt.TrainState(step=99, train_time=2.5)) == 0.25


# -- checkpoints ----------------------------------------------------------------------------------------
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
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
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


def test_read_metrics_is_one_reader_with_clear_errors(tmp_path):
    from blocklab.analysis import scalars

    assert scalars.read_metrics is read_metrics
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "train", "step": 1}\n\n{"kind": "val", "step": 1}\n')
    assert [r["kind"] for r in read_metrics(path)] == ["train", "val"]
    assert read_metrics(path, "val") == [{"kind": "val", "step": 1}]
    whole = path.read_bytes()
    path.write_bytes(whole + b"\0" * 64)  # a power cut's tail: zeros, no newline, not even JSON
    assert [r["kind"] for r in read_metrics(path)] == ["train", "val"]
    path.write_bytes(whole + b"{truncated\n")  # a torn last line holds no record: passed over
    assert [r["kind"] for r in read_metrics(path)] == ["train", "val"]
    for whole_json in (b"[1,2]\n", b"7"):  # valid JSON is never a cut-off object: refused, not dropped
        path.write_bytes(whole + whole_json)
        with pytest.raises(ValueError, match=rf"{re.escape(str(path))}:4 is not a JSON object \(it is a"):
            read_metrics(path)
    path.write_bytes(whole + b"{truncated\n")
    path.write_text(path.read_text() + '{"kind": "val", "step": 2}\n')  # but not before the end
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}:4 is not a JSON object"):
        read_metrics(path)
    with pytest.raises(FileNotFoundError, match="no metrics file at"):
        read_metrics(tmp_path / "missing.jsonl")


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


# -- the loop -------------------------------------------------------------------------------------------
def test_training_run_writes_its_directory_and_learns(corpus, tmp_path):
    cfg = config(corpus, tmp_path, arch="sas", max_steps=30, eval_every=10, ckpt_every=10)
    result = train(cfg)
    run = result.run_dir
    for name in ("config.yaml", "model_config.json", "tokenizer.json", "data_manifest.json", "metrics.jsonl",
                 "summary.json"):
        assert (run / name).is_file(), name
    rows = read_metrics(run / "metrics.jsonl")
    trains = [r for r in rows if r["kind"] == "train" and "loss" in r]
    vals = [r for r in rows if r["kind"] == "val"]
    assert [r["step"] for r in trains] == list(range(1, 31))
    assert [r["step"] for r in vals] == [0, 10, 20, 30]  # step 0: the initial model
    assert trains[-1]["tokens"] == 30 * 4 * 32
    # SAS logs its learned shaped-attention gains per head, and they moved away from 1
    first = rows[0]["scalars"]["blocks.1.attn.alpha"]
    last = trains[-1]["scalars"]["blocks.1.attn.alpha"]
    assert first == [1.0, 1.0] and last != first
    assert vals[-1]["val_loss"] < math.log(256) - 1.0  # well below the uniform byte loss
    summary = json.loads((run / "summary.json").read_text())
    assert summary["step"] == 30 and summary["val_loss"] == vals[-1]["val_loss"]
    # bits per byte uses the bytes of the tokens scored (exact check: test_bits_per_byte_...); over
    # these windows they are close to the split's average bytes per token
    split_bpt = json.loads((run / "data_manifest.json").read_text())["splits"]["val"]["bytes_per_token"]
    assert summary["val_bpb"] == pytest.approx(vals[-1]["val_loss"] / math.log(2) / split_bpt, rel=1e-2)
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step_000020", "step_000030"]
    # the final checkpoint reloads into a model with the same outputs
    model = blocklab.Transformer(blocklab.ModelConfig(**json.loads((run / "model_config.json").read_text())))
    ckpt.load_weights(ckpt.latest_checkpoint(run), model)
    ids = torch.randint(0, 256, (2, 16))
    torch.testing.assert_close(model(ids), result.model.cpu()(ids))


def test_validation_rows_and_bits_per_byte_of_the_scored_tokens(tmp_path):
    from blocklab.data import prepare_data

    # short documents first, then long ones: the first windows hold many more separators than the split
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(60):
        (docs / f"d{i:02d}.txt").write_text("ab" if i < 30 else "ab c" * 40)
    data = {"source": str(docs), "tokenizer": "byte", "cache_dir": str(tmp_path / "cache"),
            "val_fraction": 0.3}
    cfg = config(docs, tmp_path, seq_len=8, max_steps=4, eval_every=2, eval_batches=2, data=data)
    result = train(cfg)
    rows = read_metrics(result.run_dir / "metrics.jsonl")
    vals = [r for r in rows if r["kind"] == "val"]
    trains = {r["step"]: r for r in rows if r["kind"] == "train"}
    assert [r["step"] for r in vals] == [0, 2, 4]
    assert vals[0]["tokens"] == 0 and vals[0].get("wall_time", 0) == 0  # the initial model, before training
    for row in vals[1:]:  # each validation row carries the training tokens and wall time of its step
        assert row["tokens"] == trains[row["step"]]["tokens"] == row["step"] * 4 * 8
        assert row["wall_time"] == trains[row["step"]]["wall_time"] > 0

    # by hand: 2 batches of 4 windows of 8 targets score tokens 1..64 of the validation stream; with
    # the byte tokenizer every target is one byte, except the separators, which stand for no text
    val = prepare_data(cfg.data).val
    targets = val[1:2 * 4 * 8 + 1]
    assert len(val) > len(targets) + 1
    n_bytes = int((targets != 256).sum())
    expected = vals[-1]["val_loss"] * len(targets) / math.log(2) / n_bytes
    assert (vals[-1]["val_tokens"], vals[-1]["val_bytes"]) == (len(targets), n_bytes)
    assert vals[-1]["val_bpb"] == pytest.approx(expected, rel=1e-9)
    assert result.summary["val_bpb"] == vals[-1]["val_bpb"]
    manifest = json.loads((result.run_dir / "data_manifest.json").read_text())
    split_bpt = manifest["splits"]["val"]["bytes_per_token"]
    assert abs(n_bytes / len(targets) - split_bpt) > 0.05  # the split's average would be wrong here


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


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(corpus, tmp_path, monkeypatch):
    real = loop.lm_loss
    calls = {"n": 0}

    def poisoned(model, batch):
        calls["n"] += 1
        loss = real(model, batch)
        return loss * float("nan") if calls["n"] == 4 else loss

    monkeypatch.setattr(loop, "lm_loss", poisoned)
    with pytest.raises(TrainingError, match="nan") as err:
        train(config(corpus, tmp_path, max_steps=6, ckpt_every=2, eval_every=0))
    assert "step_000002" in str(err.value)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "run")] == ["step_000002"]


def test_non_finite_gradient_stops_before_the_update(corpus, tmp_path, monkeypatch):
    real = loop.lm_loss
    calls = {"n": 0}

    def inf_gradient(model, batch):  # a finite loss whose backward pass gives inf at step 3
        calls["n"] += 1
        loss = real(model, batch)
        if calls["n"] == 3:
            loss.register_hook(lambda grad: torch.full_like(grad, float("inf")))
        return loss

    monkeypatch.setattr(loop, "lm_loss", inf_gradient)
    with pytest.raises(TrainingError, match="gradient norm became (inf|nan) .* at step 3") as err:
        train(config(corpus, tmp_path, max_steps=6, ckpt_every=1, eval_every=0))
    assert "step_000002" in str(err.value)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "run")] == ["step_000001", "step_000002"]
    weights = ckpt.load_weights_file(ckpt.latest_checkpoint(tmp_path / "run") / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_autocast_policy():
    cpu = torch.device("cpu")
    assert isinstance(autocast_for("auto", cpu), nullcontext)  # CPU bf16 without hardware is slow
    assert isinstance(autocast_for("float32", cpu), nullcontext)
    forced = autocast_for("bfloat16", cpu)
    assert (forced.device, forced.fast_dtype) == ("cpu", torch.bfloat16)
    with warnings.catch_warnings():  # without CUDA, torch warns that it disables a CUDA autocast
        warnings.simplefilter("ignore")
        cuda = torch.device("cuda", 0)
        with mock.patch.object(torch.cuda, "is_bf16_supported", return_value=True):
            on = autocast_for("auto", cuda)
            assert (on.device, on.fast_dtype) == ("cuda", torch.bfloat16)
            assert isinstance(autocast_for("float32", cuda), nullcontext)
        with mock.patch.object(torch.cuda, "is_bf16_supported", return_value=False):
            assert isinstance(autocast_for("auto", cuda), nullcontext)  # no bf16 hardware


def test_compiled_run_keeps_the_warm_up_out_of_tokens_per_s(corpus, tmp_path, monkeypatch):
    calls = []
    real = blocklab.LanguageModel.compile_model
    # the whole forward pass as one graph (LanguageModel.compile_model); aot_eager: dynamo's and
    # AOTAutograd's graphs without inductor's minute of code generation on this CPU
    monkeypatch.setattr(blocklab.LanguageModel, "compile_model",
                        lambda self, **kw: calls.append(kw) or real(self, backend="aot_eager"))
    result = train(config(corpus, tmp_path, max_steps=3, eval_every=0, compile=True))
    assert calls == [{}]
    s = result.summary
    assert s["step"] == 3 and math.isfinite(s["val_loss"])
    assert s["warmup_tokens"] == 4 * 32 and 0 < s["warmup_time"] < s["train_time"]
    assert s["tokens_per_s"] == pytest.approx((3 - 1) * 4 * 32 / (s["train_time"] - s["warmup_time"]))
    rows = [r for r in read_metrics(result.run_dir / "metrics.jsonl", "train") if "loss" in r]
    assert "tokens_per_s" not in rows[0] and all(r["tokens_per_s"] > 0 for r in rows[1:])


def test_line_progress_writes_each_tenth_however_fast_the_updates():
    """A line per 10% of the total even when the updates come faster than tqdm's display interval
    (tiny runs in a compare did, and their step lines went missing)."""
    stream = io.StringIO()
    bar = progress.LineProgress(total=10, file=stream, desc="x")
    for _ in range(10):
        bar.update(1)
    bar.close()
    lines = stream.getvalue().splitlines()
    percents = [line.split("%")[0].split(":")[-1].strip() for line in lines]
    assert percents == [str(10 * i) for i in range(1, 11)]


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


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed")
def test_tensorboard_writes_event_files(corpus, tmp_path):
    run = train(config(corpus, tmp_path, max_steps=2, tensorboard=True)).run_dir
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))


def test_tensorboard_without_the_package_is_a_config_error(corpus, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard now fails
    cfg = config(corpus, tmp_path, tensorboard=True)  # a saved run's config reads without the package
    with pytest.raises(ConfigError, match="tensorboard"):  # when the run starts, before any data is prepared
        train(cfg)
    assert not Path(cfg.data.cache_dir).exists()


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="per-run peak RSS needs Linux /proc")
def test_peak_memory_is_per_run(corpus, tmp_path):
    big = train(config(corpus, tmp_path / "big", max_steps=1, eval_every=0, batch_size=16, seq_len=64,
                       model={"d_model": 512, "n_layers": 2, "n_heads": 4})).summary["peak_memory_mib"]
    gc.collect()
    small = train(config(corpus, tmp_path / "small", max_steps=1, eval_every=0)).summary["peak_memory_mib"]
    assert small < big - 20  # the big run's ~100 MB of weights, gradients and Adam state are not counted


def test_skipped_files_are_reported_once(corpus, tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    for path in sorted(corpus.iterdir())[:20]:
        (docs / path.name).write_bytes(path.read_bytes())
    for i in range(3):
        (docs / f"bad{i}.bin").write_bytes(b"\xff\xfe\x00\x81 not utf-8 \xe9")
    data = {"source": str(docs), "tokenizer": "byte", "cache_dir": str(tmp_path / "cache"),
            "val_fraction": 0.2}
    train(config(docs, tmp_path, max_steps=1, data=data))
    err = capsys.readouterr().err
    assert err.count("blocklab: skipped") == 1  # named: which files, and where all are listed
    assert "skipped 3 files that are not UTF-8 text (binary or another encoding): bad0.bin, bad1.bin, " in err


def test_grad_accumulation_matches_one_big_batch(corpus, tmp_path):
    one = train(config(corpus, tmp_path / "one", max_steps=3, eval_every=0))
    acc = train(config(corpus, tmp_path / "acc", max_steps=3, eval_every=0, grad_accum=2))
    assert train_losses(acc.run_dir) == pytest.approx(train_losses(one.run_dir), abs=1e-5)


def test_muon_and_a_token_budget(corpus, tmp_path):
    cfg = config(corpus, tmp_path, max_steps=None, max_tokens=5 * 4 * 32, eval_every=0,
                 optim={"name": "muon", "lr": 3e-3})
    result = train(cfg)
    assert result.summary["step"] == 5
    losses = train_losses(result.run_dir)
    assert losses[-1] < losses[0]


def test_masked_lm_encoder_trains(corpus, tmp_path):
    cfg = config(corpus, tmp_path, max_steps=4, eval_every=0,
                 data={"source": str(corpus), "tokenizer": "byte", "cache_dir": str(tmp_path / "cache"),
                       "objective": "mlm"})
    result = train(cfg)
    assert not result.model.cfg.causal and result.summary["val_bpb"] is None
    assert math.isfinite(result.summary["val_loss"])


def test_cli_train(corpus, tmp_path):
    from blocklab.cli import main

    out = tmp_path / "cli"
    code = main(["train", "arch=sas-p", "max_steps=2", "batch_size=2", "seq_len=16", "progress=false",
                 f"data.source={corpus}", "data.tokenizer=byte", f"data.cache_dir={tmp_path / 'cache'}",
                 "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "--out", str(out)])
    assert code == 0 and (out / "summary.json").is_file()
    assert main(["train", "max_steps=2", "optim.lr=-1", "--out", str(tmp_path / "bad")]) == 2


# -- multi-process --------------------------------------------------------------------------------------
def _torchrun(n: int, args: list[str], cwd: Path, stderr: bool = False) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
           "-m", "blocklab.cli", "train", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:  # a collective entered by one rank only hangs: fail the test instead of stalling CI
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=patient(180))
    except subprocess.TimeoutExpired as err:
        raise AssertionError(f"torchrun with {n} processes hung: {(err.stderr or b'')[-2000:]!r}") from None
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr if stderr else proc.stdout


_SLOW = pytest.mark.slow  # ~12 s each: the default suite keeps DDP and one FSDP run of cross-layer state


@pytest.mark.parametrize("arch, parallel", [
    ("pre-ln", "ddp"), ("sas-p+bov-resformer", "fsdp"),
    *(pytest.param(arch, parallel, marks=_SLOW) for arch, parallel in [
        ("pre-ln", "fsdp"), ("sas-p", "ddp"), ("sas-p", "fsdp"), ("sas-p+resformer-learnable", "fsdp"),
        ("bov", "fsdp"), ("denseformer", "fsdp"), ("svformer", "fsdp")])])
def test_two_processes_match_one(corpus, tmp_path, arch, parallel):
    """Learned gains (SAS-P's alpha/beta/gamma, ResFormer's lambdas) are logged every step: under FSDP
    gathering them is a collective that every rank must enter (it hung when only rank 0 did)."""
    common = ["max_steps=3", "batch_size=4", "seq_len=16", "eval_every=2", "eval_batches=4", "log_every=1",
              "progress=false", f"arch={arch}",
              f"data.source={corpus}", "data.tokenizer=byte", f"data.cache_dir={tmp_path / 'cache'}",
              "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "optim.warmup_fraction=0",
              f"parallel={parallel}"]
    _torchrun(1, [*common, f"out_dir={tmp_path / 'one'}"], tmp_path)
    printed = _torchrun(2, [*common, f"out_dir={tmp_path / 'two'}"], tmp_path)
    assert printed.count("val loss") == 1, printed  # rank 0 alone prints the summary line
    assert train_losses(tmp_path / "two") == pytest.approx(train_losses(tmp_path / "one"), abs=2e-5)
    # the learned gains are logged in full (gathered), equal to one process's
    two_scalars, one_scalars = (read_metrics(tmp_path / name / "metrics.jsonl", "train")[-1]["scalars"]
                                for name in ("two", "one"))
    assert two_scalars.keys() == one_scalars.keys()
    assert bool(one_scalars) == (arch not in ("pre-ln", "svformer"))  # SAS gains, lambdas, gamma_v, DWA
    for name, values in one_scalars.items():
        assert two_scalars[name] == pytest.approx(values, abs=1e-4), name
    # validation scores the same windows whatever the number of processes (capped by eval_batches)
    one, two = (read_metrics(tmp_path / name / "metrics.jsonl", "val") for name in ("one", "two"))
    assert [(r["step"], r["val_tokens"]) for r in one] == [(0, 4 * 4 * 16), (2, 4 * 4 * 16), (3, 4 * 4 * 16)]
    assert [(r["step"], r["val_tokens"], r["val_bytes"]) for r in two] == \
        [(r["step"], r["val_tokens"], r["val_bytes"]) for r in one]
    for r1, r2 in zip(one, two, strict=True):
        assert r2["val_loss"] == pytest.approx(r1["val_loss"], abs=2e-5)
        assert r2["val_bpb"] == pytest.approx(r1["val_bpb"], abs=2e-5)
    # the 2-process checkpoint holds the full (unsharded) model
    cfg = blocklab.ModelConfig(**json.loads((tmp_path / "two" / "model_config.json").read_text()))
    ckpt.load_weights(ckpt.latest_checkpoint(tmp_path / "two"), blocklab.LanguageModel(cfg))


def test_two_fsdp_processes_train_nanochats_trunk_as_one(corpus, tmp_path):
    """The trunk's model-level parts (smear, backout) sit in FSDP's root unit and the per-layer scalars
    in their blocks; with nanochat's optimiser recipe (Muon included) two processes give one's losses.
    The learned scalars are only compared loosely: AdamW with eps 1e-10 turns the float noise of a
    near-zero gradient into a full-size step of either sign. backout.strength's gradient is exactly zero
    in exact arithmetic here (float64: ~3e-19; float32: +-1e-10 of rounding, whose sign depends on the
    summation order of the loss), so it is checked for presence only."""
    common = ["max_steps=3", "batch_size=4", "seq_len=16", "eval_every=2", "eval_batches=4", "log_every=1",
              "progress=false", "arch=pre-ln", "size=nanochat-tiny", f"data.source={corpus}",
              "data.tokenizer=byte", f"data.cache_dir={tmp_path / 'cache'}", "model.d_model=32",
              "model.n_layers=2", "model.n_heads=2", "model.head_dim=16", "model.residual_scalars=true",
              "model.backout=true", "optim.name=nanochat", "parallel=fsdp"]
    _torchrun(1, [*common, f"out_dir={tmp_path / 'one'}"], tmp_path)
    _torchrun(2, [*common, f"out_dir={tmp_path / 'two'}"], tmp_path)
    assert train_losses(tmp_path / "two") == pytest.approx(train_losses(tmp_path / "one"), abs=2e-5)
    one, two = (read_metrics(tmp_path / name / "metrics.jsonl", "train")[-1]["scalars"]
                for name in ("one", "two"))
    assert set(one) == set(two) == {"smear.strength", "backout.strength", *(
        f"blocks.{i}.residual.{s}_lambda" for i in range(2) for s in ("resid", "x0"))}
    for name, values in one.items():
        if name != "backout.strength":
            assert two[name] == pytest.approx(values, abs=0.05), name


def test_load_run_gives_the_trained_model_and_tokenizer(corpus, tmp_path):
    from blocklab.training import load_run

    result = train(config(corpus, tmp_path, max_steps=2))
    run = load_run(result.run_dir)
    ids = torch.tensor([run.tokenizer.encode("def value")])
    torch.testing.assert_close(run.model(ids), result.model.eval()(ids))
    assert run.tokenizer.decode(ids[0].tolist()) == "def value" and run.config.max_steps == 2
    with pytest.raises(FileNotFoundError, match="not a blocklab run"):
        load_run(tmp_path)


def test_continued_pretraining_of_a_retrofitted_run(corpus, tmp_path):
    from blocklab.training import load_run

    base = train(config(corpus, tmp_path / "base", max_steps=40, eval_every=0, eval_batches=4)).run_dir
    base_val = json.loads((base / "summary.json").read_text())["val_loss"]
    # data.tokenizer "bpe" (train a new one) takes the source's tokenizer.json instead
    data = {"source": str(corpus), "tokenizer": "bpe", "cache_dir": str(tmp_path / "cache"),
            "val_fraction": 0.1}
    cont = config(corpus, tmp_path / "cont", **FROM_SOURCE, init_from=str(base),
                  retrofit="resformer-learnable", max_steps=20, eval_every=5, eval_batches=4, ckpt_every=10,
                  data=data, optim={"lr": 1e-3, "warmup_fraction": 0.0})
    result = train(cont)
    vals = [r["val_loss"] for r in read_metrics(result.run_dir / "metrics.jsonl", "val")]
    # step 0 is the baseline's function (lambda_1 = 0, lambda_2 = 1) on the same validation batches
    assert vals[0] == pytest.approx(base_val, abs=1e-5)
    assert len(vals) == 5 and vals[-1] < vals[0] - 0.01 and min(vals[1:]) < vals[0]
    saved = json.loads((result.run_dir / "model_config.json").read_text())
    assert saved["value_path"] == "resformer-learnable"
    assert saved["value_path_options"] == {"lambda1": 0.0, "lambda2": 1.0}
    assert TrainConfig.load(result.run_dir / "config.yaml").data.tokenizer == str(base / "tokenizer.json")
    run = load_run(result.run_dir)  # the retrofitted config and weights load back
    ids = torch.randint(0, 256, (2, 16))
    torch.testing.assert_close(run.model(ids), result.model.eval()(ids))
    assert (result.run_dir / "tokenizer.json").read_text() == (base / "tokenizer.json").read_text()
    # --resume rebuilds the same retrofitted model and continues from step 20
    more = train(config(corpus, tmp_path / "cont", **FROM_SOURCE, init_from=str(base),
                        retrofit="resformer-learnable", max_steps=24, eval_every=0, eval_batches=4, data=data,
                        optim={"lr": 1e-3, "warmup_fraction": 0.0}), resume=True)
    assert more.summary["step"] == 24

    # an export folder works as a source too, and a different tokenizer is refused
    from blocklab.interop import save_pretrained

    export = save_pretrained(run.model, tmp_path / "export", tokenizer=base / "tokenizer.json")
    other = {**data, "tokenizer": "byte", "eos_token": "<|sep|>"}
    with pytest.raises(ConfigError, match="differs from the tokenizer"):
        train(config(corpus, tmp_path / "bad", **FROM_SOURCE, init_from=str(export), max_steps=1, data=other))
    with pytest.raises(ConfigError, match="value_path='resformer-learnable'"):  # not a baseline any more
        train(config(corpus, tmp_path / "again", **FROM_SOURCE, init_from=str(export), retrofit="bov",
                     max_steps=1, data=data))


@pytest.mark.parametrize("overrides, words", [
    ({"retrofit": "resformer"}, ["retrofit", "init_from"]),
    ({"init_from": "runs/a", "retrofit": "resformr"}, ["'resformr'", "resformer-learnable", "bov"]),
    ({"init_from": "runs/a", "model": {"n_layers": 3}}, ["model", "init_from"]),
])
def test_bad_init_from_and_retrofit(overrides, words):
    with pytest.raises(ConfigError) as err:
        TrainConfig.load(None, {"max_steps": 5, **overrides})
    for w in words:
        assert w in str(err.value)


def test_cli_train_init_from_and_retrofit(corpus, tmp_path):
    from blocklab.cli import main
    from blocklab.training import load_run

    base = train(config(corpus, tmp_path / "base", max_steps=2, eval_every=0)).run_dir
    common = ["max_steps=2", "batch_size=4", "seq_len=32", "progress=false", f"data.source={corpus}",
              f"data.cache_dir={tmp_path / 'cache'}"]
    out = tmp_path / "cli"
    assert main(["train", f"init_from={base}", "retrofit=pre-ln+resformer-learnable", *common,
                 "--out", str(out)]) == 0
    assert load_run(out).model.cfg.value_path == "resformer-learnable"
    assert main(["train", "retrofit=resformer-learnable", *common, "--out", str(tmp_path / "x")]) == 2
    assert main(["train", f"init_from={tmp_path / 'nothing'}", *common, "--out", str(tmp_path / "y")]) == 2


def test_an_init_from_run_resumes_after_its_source_is_gone(corpus, tmp_path, monkeypatch):
    """A run started from another (its BPE tokenizer, retrofitted with ResFormer) and cut off resumes
    from its own checkpoint after the source folder is deleted, to the curve of an uninterrupted run:
    the model config and tokenizer come from the run's folder, the weights from its checkpoint."""
    bpe = {"source": str(corpus), "tokenizer": "bpe", "vocab_size": 300, "cache_dir": str(tmp_path / "cache"),
           "val_fraction": 0.1}
    src = train(config(corpus, tmp_path / "src", max_steps=2, eval_every=0, data=bpe)).run_dir
    base = dict(FROM_SOURCE, max_steps=8, ckpt_every=3, eval_every=4, data=bpe, init_from=str(src),
                retrofit="resformer")
    full = train(config(corpus, tmp_path / "a", **base))
    stopped_during_step_5(config(corpus, tmp_path / "b", **base), monkeypatch)
    shutil.rmtree(src)
    resumed = train(config(corpus, tmp_path / "b", **base), resume=True)
    assert resumed.model.cfg.value_path == "resformer" and resumed.summary["resumed_at"] == [3]
    assert train_losses(resumed.run_dir) == train_losses(full.run_dir)  # bit-identical on CPU
    for p_full, p_res in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p_full, p_res)


def test_crammed_bert_recipe(corpus, tmp_path):
    cfg = TrainConfig.load("crammed-bert", ["arch=sas-p"])
    assert (cfg.data.objective, cfg.data.mask_prob, cfg.seq_len) == ("mlm", 0.25, 128)
    assert (tuple(cfg.optim.betas), cfg.optim.eps, cfg.optim.grad_clip) == ((0.9, 0.98), 1e-12, 0.5)
    assert (cfg.optim.schedule, cfg.optim.peak_at, cfg.max_time) == ("one-cycle", 0.75, 86400)
    assert (cfg.optim.weight_decay, cfg.optim.lr) == (0.1, 1e-3)  # App. D.2 "weight decay 0.1"; Cramming lr
    model_cfg = cfg.model_config(32768)
    assert not model_cfg.causal and model_cfg.norm_eps == 1e-12 and model_cfg.n_layers == 16
    # the per-block overrides the recipe documents (App. D.2: peak lr 3e-3 / 2e-3, beta_FF = 0.05)
    text = (Path(blocklab.__file__).parent / "recipes" / "crammed-bert.yaml").read_text()
    for arch, lr in (("sas-p", "3e-3"), ("sas-p-nonorm", "2e-3")):
        overrides = [f"optim.lr={lr}", "model.mlp_branch_gain=0.05"]
        assert " ".join(overrides) in text
        tuned = TrainConfig.load("crammed-bert", [f"arch={arch}", *overrides])
        assert tuned.optim.lr == float(lr) and tuned.model_config(32768).mlp_branch_gain == 0.05
        assert TrainConfig.load("crammed-bert", [f"arch={arch}"]).model_config(32768).mlp_branch_gain == 0.1
    with pytest.raises(ConfigError, match="crammed-bert"):
        TrainConfig.load("no-such-recipe")


def test_cli_export_and_diagnose_a_run(corpus, tmp_path):
    from blocklab.cli import main
    from blocklab.interop import load_pretrained

    a = train(config(corpus, tmp_path / "a", arch="sas", max_steps=3)).run_dir
    b = train(config(corpus, tmp_path / "b", arch="pre-ln+resformer", max_steps=3)).run_dir
    assert main(["export", "--run", str(a), "--out", str(tmp_path / "export")]) == 0
    ids = torch.randint(0, 256, (1, 12))
    model = load_pretrained(tmp_path / "export")
    torch.testing.assert_close(model(ids), blocklab.training.load_run(a).model(ids))
    assert (tmp_path / "export" / "tokenizer.json").read_text() == (a / "tokenizer.json").read_text()

    assert main(["diagnose", "--run", str(a), "--batches", "1"]) == 0
    results = json.loads((a / "diagnostics" / "diagnostics.json").read_text())
    assert {"entropy", "value_norm", "hidden_norm", "similarity", "spectrum"} <= set(results)
    assert (a / "diagnostics" / "entropy.png").read_bytes()[:4] == b"\x89PNG"
    assert (a / "diagnostics" / "scalars.png").is_file()  # SAS has learned scalars in metrics.jsonl
    out = tmp_path / "overlay"
    assert main(["diagnose", "--compare", str(a), str(b), "--out", str(out), "--batches", "1"]) == 0
    assert any(p.suffix == ".png" for p in out.iterdir())


# -- progress, result lines and threads -----------------------------------------------------------------
def test_threads_hold_for_the_run_and_the_count_before_comes_back(corpus, tmp_path, monkeypatch):
    before = torch.get_num_threads()
    seen = []
    real_step = loop.Trainer._step
    monkeypatch.setattr(loop.Trainer, "_step",
                        lambda self: seen.append(torch.get_num_threads()) or real_step(self))
    try:
        train(config(corpus, tmp_path / "two", max_steps=2, eval_every=0, threads=before + 1))
        assert seen == [before + 1] * 2 and torch.get_num_threads() == before
        train(config(corpus, tmp_path / "default", max_steps=1, eval_every=0))  # None: left as it is
        assert seen[-1] == before and torch.get_num_threads() == before
        missing = {"source": str(tmp_path / "missing"), "tokenizer": "byte"}
        with pytest.raises(ConfigError, match="no such file"):  # a run that fails to start gives it back too
            train(config(corpus, tmp_path / "bad", data=missing, threads=before + 1))
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)


def test_format_summary_is_the_result_line_of_train_and_compare():
    summary = {"arch": "sas-p", "seed": 1, "step": 400, "tokens": 819200, "train_time": 95.2,
               "tokens_per_s": 8623.4, "val_loss": 4.12345, "val_bpb": 1.23456}
    assert progress.format_summary(summary) == ("sas-p seed 1, 400 steps, 819,200 tokens in 1 min 35 s "
                                            "(8,623 tokens/s); val loss 4.1235, val bits/byte 1.2346")
    result = loop.RunResult(Path("runs/x"), None, {**summary, "val_bpb": None, "tokens_per_s": None})
    assert progress.format_summary(result, wall_time=9.81) == ("sas-p seed 1, 400 steps, 819,200 tokens in "
                                                               "1 min 35 s; val loss 4.1235; 9.8 s wall time")
    assert progress.format_summary({}) == ""  # an unreadable summary.json gives no line, not an error
    assert [progress.format_duration(t) for t in (0.04, 59.9, 60, 3599, 7300)] == [
        "0.0 s", "59.9 s", "1 min 00 s", "59 min 59 s", "2 h 02 min"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_in_a_log_file_is_plain_lines_without_carriage_returns():
    assert progress.progress_mode(_Terminal()) == "bar" and progress.progress_mode(io.StringIO()) == "lines"
    outputs = {}
    for stream in (_Terminal(), io.StringIO()):
        bar = progress.progress_bar(40, stream=stream, mininterval=0, miniters=1,
                                line_format="{percentage:3.0f}% {n_fmt}/{total_fmt} steps{postfix}")
        for step in range(40):
            bar.set_postfix(loss=step, refresh=False)
            bar.update(1)
        bar.close()
        outputs[progress.progress_mode(stream)] = stream.getvalue()
    assert "\r" in outputs["bar"]  # a terminal: tqdm redraws its bar
    assert "\r" not in outputs["lines"]  # a file: one line per tenth, none for the steps between
    expected = [f"{10 * k:3d}% {4 * k}/40 steps, loss={4 * k - 1}" for k in range(1, 11)]
    assert outputs["lines"].splitlines() == expected
    silent = io.StringIO()
    bar = progress.progress_bar(10, enabled=False, stream=silent)
    bar.update(10)
    bar.close()
    assert silent.getvalue() == ""


def test_train_progress_and_data_messages_in_a_log_file(corpus, tmp_path, capsys):
    data = {"source": str(corpus), "tokenizer": "bpe", "vocab_size": 300,
            "cache_dir": str(tmp_path / "cache"), "val_fraction": 0.1}
    train(config(corpus, tmp_path / "a", max_steps=20, eval_every=0, progress=True, data=data))
    err = capsys.readouterr().err  # pytest's stderr is not a terminal
    assert "\r" not in err
    assert "training a 300-token BPE tokenizer on the training split of files under" in err
    assert re.search(r"tokenizer trained in \d+\.\d s on [\d.]+ M characters \(\d+ documents\)", err)
    assert re.search(r"tokenized in \d+\.\d s: [\d,]+ training and [\d,]+ validation tokens", err)
    assert re.search(r"^100% 20/20 steps \[.*loss=", err, re.M)
    train(config(corpus, tmp_path / "b", max_steps=1, eval_every=0, progress=False, data=data))
    train(config(corpus, tmp_path / "c", max_steps=1, eval_every=0, progress=True, data=data))
    assert "token" not in capsys.readouterr().err  # quiet, then cached: nothing to say about the data


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_processes_match_one_with_the_model_compiled(corpus, tmp_path, parallel):
    """compile=true (the forward pass as one inductor graph) under torchrun, for SAS-P (learned gains):
    two processes give one's losses and gains, and neither falls back to per-block compile."""
    common = ["max_steps=3", "batch_size=4", "seq_len=16", "eval_every=2", "eval_batches=4", "log_every=1",
              "progress=false", "arch=sas-p", "compile=true",
              f"data.source={corpus}", "data.tokenizer=byte", f"data.cache_dir={tmp_path / 'cache'}",
              "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "optim.warmup_fraction=0",
              f"parallel={parallel}"]
    outputs = [_torchrun(n, [*common, f"out_dir={tmp_path / name}"], tmp_path, stderr=True)
               for n, name in ((1, "one"), (2, "two"))]
    assert not any("falling back to compiling each block" in out for out in outputs), outputs
    assert train_losses(tmp_path / "two") == pytest.approx(train_losses(tmp_path / "one"), abs=2e-5)
    one, two = (read_metrics(tmp_path / name / "metrics.jsonl", "train")[-1]["scalars"]
                for name in ("one", "two"))
    assert one and one.keys() == two.keys()
    for name, values in one.items():
        assert two[name] == pytest.approx(values, abs=1e-4), name
