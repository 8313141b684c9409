"""The training loop (training/loop.py) on tiny runs: the run's folder and a model that learns,
non-finite losses and gradients stopped, autocast, compile's warm-up, TensorBoard, peak memory,
skipped files, gradient accumulation, a masked-LM encoder, `blocklab train`, threads, and what a run
prints in a log file."""

from __future__ import annotations

import gc
import importlib.util
import json
import math
import re
import sys
import warnings
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import pytest
import torch

import blocklab
from blocklab.training import TrainingError, loop, train
from blocklab.training import checkpoint as ckpt
from blocklab.training.metrics import read_metrics
from blocklab.training.step import autocast_for
from blocklab.util.errors import ConfigError
from tests.training.tiny_runs import config, train_losses, write_word_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The word corpus of tests/training/tiny_runs.py, written once per module."""
    return write_word_corpus(tmp_path_factory.mktemp("corpus"))


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
