"""The trainer: config, budget, checkpoints, the loop, resume, bad input, multi-process."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import blocklab
from blocklab.config import ConfigError
from blocklab.training import TrainConfig, TrainingError, loop, train
from blocklab.training import checkpoint as ckpt
from blocklab.training.budget import Budget
from blocklab.training.metrics import read_metrics

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
    assert [r["step"] for r in vals] == [10, 20, 30]
    assert trains[-1]["tokens"] == 30 * 4 * 32
    # SAS logs its learned shaped-attention gains per head, and they moved away from 1
    first = rows[0]["scalars"]["blocks.1.attn.alpha"]
    last = trains[-1]["scalars"]["blocks.1.attn.alpha"]
    assert first == [1.0, 1.0] and last != first
    assert vals[-1]["val_loss"] < math.log(256) - 1.0  # well below the uniform byte loss
    summary = json.loads((run / "summary.json").read_text())
    assert summary["step"] == 30 and summary["val_loss"] == vals[-1]["val_loss"]
    assert summary["val_bpb"] == pytest.approx(vals[-1]["val_loss"] / math.log(2) /
                                               json.loads((run / "data_manifest.json").read_text())
                                               ["bytes_per_token"]["val"], rel=1e-6) \
        if "bytes_per_token" in json.loads((run / "data_manifest.json").read_text()) else True
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step_000020", "step_000030"]
    # the final checkpoint reloads into a model with the same outputs
    model = blocklab.Transformer(blocklab.ModelConfig(**json.loads((run / "model_config.json").read_text())))
    ckpt.load_weights(ckpt.latest_checkpoint(run), model)
    ids = torch.randint(0, 256, (2, 16))
    torch.testing.assert_close(model(ids), result.model.cpu()(ids))


def test_resume_continues_the_same_loss_curve(corpus, tmp_path, monkeypatch):
    base = dict(max_steps=8, ckpt_every=3, eval_every=4, model={**TINY_MODEL, "dropout": 0.1})
    full = train(config(corpus, tmp_path / "a", **base))

    calls = {"n": 0}
    real_step = loop.Trainer._step

    def interrupted(self):
        calls["n"] += 1
        if calls["n"] == 5:  # dies during step 5; the last checkpoint is step 3
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(loop.Trainer, "_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(config(corpus, tmp_path / "b", **base))
    monkeypatch.setattr(loop.Trainer, "_step", real_step)
    resumed = train(config(corpus, tmp_path / "b", **base), resume=True)
    assert train_losses(resumed.run_dir) == train_losses(full.run_dir)  # bit-identical on CPU
    for p_full, p_res in zip(full.model.parameters(), resumed.model.parameters(), strict=False):
        assert torch.equal(p_full, p_res)


def test_resume_rejects_a_different_model(corpus, tmp_path):
    train(config(corpus, tmp_path, max_steps=2))
    with pytest.raises(TrainingError, match="n_layers"):
        train(config(corpus, tmp_path, max_steps=4, model={**TINY_MODEL, "n_layers": 3}), resume=True)


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
def _torchrun(n: int, args: list[str], cwd: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
           "-m", "blocklab.cli", "train", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_processes_match_one(corpus, tmp_path, parallel):
    common = ["max_steps=3", "batch_size=4", "seq_len=16", "eval_every=0", "log_every=1", "progress=false",
              f"data.source={corpus}", "data.tokenizer=byte", f"data.cache_dir={tmp_path / 'cache'}",
              "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "optim.warmup_fraction=0",
              f"parallel={parallel}"]
    _torchrun(1, [*common, f"out_dir={tmp_path / 'one'}"], tmp_path)
    _torchrun(2, [*common, f"out_dir={tmp_path / 'two'}"], tmp_path)
    assert train_losses(tmp_path / "two") == pytest.approx(train_losses(tmp_path / "one"), abs=2e-5)
    # the 2-process checkpoint holds the full (unsharded) model
    cfg = blocklab.ModelConfig(**json.loads((tmp_path / "two" / "model_config.json").read_text()))
    ckpt.load_weights(ckpt.latest_checkpoint(tmp_path / "two"), blocklab.Transformer(cfg))


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
    cont = config(corpus, tmp_path / "cont", model={}, init_from=str(base), retrofit="resformer-learnable",
                  max_steps=20, eval_every=5, eval_batches=4, ckpt_every=10, data=data,
                  optim={"lr": 1e-3, "warmup_fraction": 0.0})
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
    more = train(config(corpus, tmp_path / "cont", model={}, init_from=str(base),
                        retrofit="resformer-learnable", max_steps=24, eval_every=0, eval_batches=4, data=data,
                        optim={"lr": 1e-3, "warmup_fraction": 0.0}), resume=True)
    assert more.summary["step"] == 24

    # an export folder works as a source too, and a different tokenizer is refused
    from blocklab.interop import save_pretrained

    export = save_pretrained(run.model, tmp_path / "export", tokenizer=base / "tokenizer.json")
    other = {**data, "tokenizer": "byte", "eos_token": "<|sep|>"}
    with pytest.raises(ConfigError, match="differs from the tokenizer"):
        train(config(corpus, tmp_path / "bad", model={}, init_from=str(export), max_steps=1, data=other))
    with pytest.raises(ConfigError, match="value_path='resformer-learnable'"):  # not a baseline any more
        train(config(corpus, tmp_path / "again", model={}, init_from=str(export), retrofit="bov",
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
