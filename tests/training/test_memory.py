"""The memory check (training/memory.py): a model whose weights, gradients and optimizer state cannot fit
is refused from its config, before the data is prepared or the model built, in one `blocklab: error:`
line that changes no saved file; the estimate against the tensors a real step leaves."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from blocklab import LanguageModel, ModelConfig
from blocklab.cli import main
from blocklab.training import TrainConfig, build, memory
from blocklab.training.optim import OptimConfig, build_optimizers
from blocklab.util.errors import ConfigError
from helpers import digest, one_error_line, small_run_args
from tests.training.tiny_runs import train_four_steps, write_code_corpus

small = small_run_args


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_code_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def finished_run(corpus, tmp_path_factory) -> Path:
    """Four steps with a validation line and a checkpoint every two."""
    return train_four_steps(corpus, tmp_path_factory.mktemp("run"))


@pytest.mark.parametrize("arch", ["pre-ln", "sas-p", "bov"])
@pytest.mark.parametrize("optim", ["adamw", "muon"])
def test_training_bytes_are_the_tensors_a_step_leaves(arch, optim):
    """The estimate from the config against the tensors themselves after a real step: parameters and
    buffers (sas-p's frozen W_init), gradients, and what AdamW / Muon keep in their state."""
    cfg = ModelConfig.from_preset(arch, "tiny", vocab_size=300, d_model=32, n_layers=2, n_heads=2,
                                  context_length=16)
    rng = torch.get_rng_state()
    est = memory.training_bytes(cfg, OptimConfig(name=optim))
    assert torch.equal(torch.get_rng_state(), rng)  # the real model's initialisation is unchanged
    torch.manual_seed(0)
    model = LanguageModel(cfg)
    optimizers = build_optimizers(model, OptimConfig(name=optim), 32)
    x = torch.randint(0, 300, (2, 16))
    model(x, labels=x).backward()
    for opt in optimizers:
        opt.step()
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert est.parameters == sum(p.numel() for p in model.parameters())
    assert est.weights == memory.parameter_bytes(model) + buffers
    assert est.gradients == memory.gradient_bytes(model) == sum(
        p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    assert est.optimizer == memory.optimizer_state_bytes(optimizers)
    assert memory.training_bytes(cfg, OptimConfig(name=optim), shards=2).optimizer == -(-est.optimizer // 2)


def test_a_vocabulary_of_two_billion_is_refused_before_the_data_and_the_model(corpus, finished_run, tmp_path,
                                                                              capsys, monkeypatch):
    """The issue's reproduction: refused from the config, with the numbers, before the data is prepared
    and before any tensor of the model exists."""
    def no_model(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr(build, "LanguageModel", no_model)
    before = digest(finished_run)
    assert main(["train", *small(corpus, tmp_path / "cache"), "max_steps=2", "model.vocab_size=2000000000",
                 "--out", str(tmp_path / "new")]) == 2
    err = one_error_line(capsys)
    # by hand: the token table (tied to the head in the tiny preset) grows by (2e9 - 258) rows of d_model 32
    cfg = ModelConfig.from_preset("pre-ln", "tiny", vocab_size=258, d_model=32, n_layers=2, n_heads=2,
                                  context_length=16)
    rows = 2_000_000_000 - 258
    expected = sum(p.numel() for p in LanguageModel(cfg).parameters()) + rows * 32 * (1 if cfg.tie_embeddings
                                                                                     else 2)
    assert f"has {expected:,} parameters" in err, err
    for words in ("does not fit in memory", "model.vocab_size=2000000000", "available", "Allowed here: about",
                  "BLOCKLAB_MEMORY_CHECK=off"):
        assert words in err, (words, err)
    assert not (tmp_path / "new").exists() and not (tmp_path / "cache").exists()
    assert digest(finished_run) == before


def fake_meminfo(tmp_path: Path, monkeypatch, available: int) -> None:
    """/proc/meminfo as a machine with `available` bytes free (rounded to kB as the kernel gives it)."""
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       {2 * available // 1024 + 1} kB\nMemFree:        1 kB\n"
                    f"MemAvailable:   {available // 1024} kB\nSwapFree:       0 kB\n"
                    "HugePages_Total:       0\n")
    monkeypatch.setattr(memory, "MEMINFO", path)


def test_the_limit_is_the_estimate_and_the_check_uses_the_tokenizers_vocabulary(corpus, tmp_path, capsys,
                                                                               monkeypatch):
    """Just enough memory trains, one kB less is refused; the check before the data (vocabulary unknown)
    passes a model the exact check after it refuses, still before the model is built."""
    cfg = TrainConfig.load(None, [*small(corpus, tmp_path / "cache"), "max_steps=1"])
    need = memory.training_bytes(cfg.model_config(258), cfg.optim).total  # byte tokenizer: 258 ids
    assert memory.training_bytes(cfg.model_config(1), cfg.optim).total < need - 2048
    args = ["train", *small(corpus, tmp_path / "cache"), "max_steps=1", "eval_every=0", "--out"]
    fake_meminfo(tmp_path, monkeypatch, -(-need // 1024) * 1024)
    assert main([*args, str(tmp_path / "fits")]) == 0
    capsys.readouterr()
    built = []
    monkeypatch.setattr(build, "LanguageModel", lambda *a, **k: built.append(a))
    fake_meminfo(tmp_path, monkeypatch, (need - 1) // 1024 * 1024)
    assert main([*args, str(tmp_path / "short")]) == 2
    err = one_error_line(capsys)
    assert "does not fit in memory" in err and "MemAvailable + SwapFree in /proc/meminfo" in err
    assert built == [] and not (tmp_path / "short").exists()
    monkeypatch.setenv("BLOCKLAB_MEMORY_CHECK", "off")  # the documented way past a wrong estimate
    monkeypatch.setattr(build, "LanguageModel", LanguageModel)
    assert main([*args, str(tmp_path / "forced")]) == 0


def test_available_memory_on_each_device(tmp_path, monkeypatch):
    fake_meminfo(tmp_path, monkeypatch, 3 * 2**30)
    (tmp_path / "meminfo").write_text((tmp_path / "meminfo").read_text().replace("SwapFree:       0 kB",
                                                                                   "SwapFree:       1024 kB"))
    assert memory.available_bytes(torch.device("cpu")) == (3 * 2**30 + 2**20,
                                                           "MemAvailable + SwapFree in /proc/meminfo")
    monkeypatch.setattr(memory, "MEMINFO", tmp_path / "missing")  # not Linux: free pages from sysconf
    pages = {"SC_AVPHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(memory.os, "sysconf", lambda name: pages[name])
    assert memory.available_bytes(torch.device("cpu"))[0] == 4_096_000
    # CUDA: the device's free memory and what torch holds cached but unused (an earlier run's)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (5 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 2**30)
    assert memory.available_bytes(torch.device("cuda", 0))[0] == 7 * 2**30
    assert memory.available_bytes(torch.device("mps")) is None  # unknown: no check, no refusal


def test_processes_of_one_machine_share_its_memory(tmp_path, monkeypatch):
    cfg = TrainConfig.load(None, ["max_steps=1", "model.d_model=32", "model.n_layers=2", "model.n_heads=2"])
    model_cfg = cfg.model_config(258)
    need = memory.training_bytes(model_cfg, cfg.optim).total
    fake_meminfo(tmp_path, monkeypatch, -(-need // 1024) * 1024)
    memory.check_training_fits(cfg, model_cfg, torch.device("cpu"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="per process, x 2 processes on this machine"):
        memory.check_training_fits(cfg, model_cfg, torch.device("cpu"), world_size=2)
    sharded = cfg.replace(parallel="fsdp")  # FSDP splits gradients and optimizer state, not the weights
    split = memory.training_bytes(model_cfg, cfg.optim, shards=2)
    whole = memory.training_bytes(model_cfg, cfg.optim)
    assert split.weights == whole.weights and split.optimizer == -(-whole.optimizer // 2)
    fake_meminfo(tmp_path, monkeypatch, -(-2 * split.total // 1024) * 1024)
    memory.check_training_fits(sharded, model_cfg, torch.device("cpu"), world_size=2)
