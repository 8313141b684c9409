"""Several processes under torchrun (training/distributed.py): DDP and FSDP give the losses and learned
scalars of one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import blocklab
from blocklab.training import checkpoint as ckpt
from blocklab.training.metrics import read_metrics
from tests.training.tiny_runs import train_losses, write_word_corpus
from timeouts import patient


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The word corpus of tests/training/tiny_runs.py, written once per module."""
    return write_word_corpus(tmp_path_factory.mktemp("corpus"))


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
