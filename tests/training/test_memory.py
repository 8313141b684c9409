"""Training refusals: a resume checks every metrics.jsonl line for the fields it
reads, and a model whose weights, gradients and optimizer state cannot fit in memory is refused from its
config, before it is built. Each refusal is one `blocklab: error:` line and changes no saved file."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from blocklab import LanguageModel, ModelConfig
from blocklab.cli import main
from blocklab.training import TrainConfig, build, memory, train
from blocklab.training.metrics import read_metrics, resume_gap
from blocklab.training.optim import OptimConfig, build_optimizers
from blocklab.util.errors import ConfigError
from helpers import small_run_args

small = small_run_args


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    for i in range(30):
        (root / f"f{i}.py").write_text("".join(f"value_{j % 9} = {i} + {j}\n" for j in range(60)))
    return root


@pytest.fixture(scope="module")
def finished_run(corpus, tmp_path_factory) -> Path:
    """Four steps with a validation line and a checkpoint every two."""
    root = tmp_path_factory.mktemp("run")
    out = root / "run"
    assert main(["train", *small(corpus, root / "cache"), "max_steps=4", "eval_every=2", "ckpt_every=2",
                 "--out", str(out)]) == 0
    return out


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("blocklab: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# -- item 3: every metrics line checked on resume ---------------------------------------------------------
BAD_LINES = [  # (a line that is valid JSON, what the message says of it)
    ('{"kind": "val"}', "has no 'step'"),  # the reproduction
    ('{"step": 3, "loss": 5.0}', "has no 'kind'"),
    ('{"kind": "eval", "step": 3}', "has kind 'eval' where 'train' or 'val' is needed"),
    ('{"kind": "train", "step": "3"}', "has step '3' where an integer >= 0 is needed"),
    ('{"kind": "train", "step": -1}', "has step -1 where an integer >= 0 is needed"),
    ('{"kind": "train", "step": true}', "has step True where an integer >= 0 is needed"),
    ('{"kind": "val", "step": 2, "val_bpb": null}', "is a validation line without 'val_loss'"),
    ('{"kind": "val", "step": 2, "val_loss": 2.5}', "is a validation line without 'val_bpb'"),
    ('{"kind": "val", "step": 2, "val_loss": "low", "val_bpb": 1.0}', "has val_loss 'low'"),
]


@pytest.mark.parametrize("line, words", BAD_LINES, ids=[b for b, _ in BAD_LINES])
def test_resume_names_a_metrics_line_without_what_it_reads(line, words, finished_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    metrics = run / "metrics.jsonl"
    with metrics.open("a") as f:
        f.write(line + "\n")
    last = len(metrics.read_text().splitlines())
    before = digest(run)
    capsys.readouterr()
    assert main(["train", "--resume", "--out", str(run), "max_steps=6"]) == 2
    err = one_error_line(capsys)
    assert err.startswith(f"blocklab: error: {metrics}:{last} {words}"), err
    assert "repair or delete that line" in err
    assert digest(run) == before  # config.yaml (the new budget) included: nothing written yet


def test_a_line_before_the_end_is_named_too_and_deleting_it_lets_the_resume_go_on(finished_run, tmp_path,
                                                                                 capsys):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    metrics = run / "metrics.jsonl"
    whole = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join([whole[0], '{"kind": "val"}\n', *whole[1:]]))
    before = digest(run)
    with pytest.raises(ConfigError, match=rf"{metrics}:2 has no 'step'"):  # the Python API alike
        train(out_dir=str(run), resume=True, max_steps=6)
    assert digest(run) == before
    metrics.write_text("".join(whole))  # the repair the message asks for
    capsys.readouterr()
    assert main(["train", "--resume", "--out", str(run), "max_steps=6"]) == 0
    rows = read_metrics(metrics)
    steps = [r["step"] for r in rows if r["kind"] == "train"]
    assert steps == sorted(set(steps)) and steps[-1] == 6  # one curve, on to the new budget
    assert [r["step"] for r in rows if r["kind"] == "val"] == [0, 2, 4, 6]


def test_every_line_the_trainer_writes_holds_what_a_resume_reads(finished_run):
    rows = read_metrics(finished_run / "metrics.jsonl")
    assert {r["kind"] for r in rows} == {"train", "val"}
    assert [resume_gap(r) for r in rows] == [""] * len(rows)
    assert resume_gap({"kind": "val", "step": 4, "val_loss": 2.0, "val_bpb": None}) == ""  # masked LM
    # the plain reader stays lenient: reports and plots read hand-made files that hold fewer fields
    path = finished_run.parent / "few.jsonl"
    path.write_text('{"kind": "val", "step": 1}\n')
    assert read_metrics(path, "val") == [{"kind": "val", "step": 1}]


# -- item 4b: a model that cannot fit is refused from its config ------------------------------------------
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


def test_init_from_records_the_architecture_trained_and_refuses_another(tmp_path, capsys):
    """`train arch=sas size=small init_from=A` recorded sas/small for A's model, and a SAS-P source was
    labelled pre-ln: an arch or size other than the source's is refused, naming both, and a
    run from a SAS-P source records sas-p and its size in config.yaml and summary.json, also on resume;
    a compare of several architectures from one source is refused."""
    import yaml

    from blocklab.compare import resolve_compare
    from helpers import write_code_corpus

    (tmp_path / "corpus").mkdir()
    corpus = write_code_corpus(tmp_path / "corpus")
    common = [f"data.source={corpus}", "data.tokenizer=byte", f"data.cache_dir={tmp_path / 'cache'}",
              "batch_size=2", "seq_len=16", "progress=false", "eval_every=0", "eval_batches=1"]
    source = tmp_path / "source"
    assert main(["train", *common, "arch=sas-p", "size=tiny", "max_steps=1", "--out", str(source)]) == 0
    run = tmp_path / "run"
    for given in (["arch=sas", "size=small"], ["arch=pre-ln+bov"], ["size=small"]):
        capsys.readouterr()
        assert main(["train", *common, f"init_from={source}", *given, "max_steps=2", "--out", str(run)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("blocklab: error: ") and len(err.strip().splitlines()) == 1
        for name, _, value in (g.partition("=") for g in given):
            assert f"{name} = {value!r}" in err, err
        assert "a 'sas-p' of size 'tiny'" in err and not run.exists()
    assert main(["train", *common, f"init_from={source}", "max_steps=2", "--out", str(run)]) == 0
    assert f"{run}: sas-p seed 0" in capsys.readouterr().out  # the result line
    summary = json.loads((run / "summary.json").read_text())
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert (summary["arch"], summary["size"], config["arch"], config["size"]) == ("sas-p", "tiny") * 2
    assert main(["train", "--resume", "--out", str(run), "max_steps=3"]) == 0  # the recorded names pass
    assert json.loads((run / "summary.json").read_text())["arch"] == "sas-p"
    with pytest.raises(ConfigError, match=r"init_from = .* with 2 architectures is not allowed"):
        resolve_compare(["pre-ln", "sas"], None, {"max_steps": 2}, overrides=[f"init_from={source}"])


def test_init_from_refuses_the_default_architecture_named_explicitly(tmp_path, capsys):
    """`arch=pre-ln` (or `size=tiny`) with init_from of a SAS-P was taken for "not given", since it is
    TrainConfig's default: the run trained the SAS-P and was relabelled. Now a name given, on the command
    line, in a YAML config or through the Python API, is checked against the source like any other;
    left out, the run records the source's."""
    import yaml

    from blocklab.training import TrainConfig, train
    from helpers import write_code_corpus

    (tmp_path / "corpus").mkdir()
    corpus = write_code_corpus(tmp_path / "corpus")
    common = [f"data.source={corpus}", "data.tokenizer=byte", f"data.cache_dir={tmp_path / 'cache'}",
              "batch_size=2", "seq_len=16", "progress=false", "eval_every=0", "eval_batches=1"]
    source = tmp_path / "source"
    assert main(["train", *common, "arch=sas-p", "model.n_layers=2", "max_steps=1", "--out",
                 str(source)]) == 0
    run = tmp_path / "run"
    (tmp_path / "explicit.yaml").write_text("arch: pre-ln\n")
    for given in (["arch=pre-ln"], ["size=tiny"], [str(tmp_path / "explicit.yaml")]):
        capsys.readouterr()
        assert main(["train", *given, *common, f"init_from={source}", "max_steps=2", "--out", str(run)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("blocklab: error: ") and len(err.strip().splitlines()) == 1
        assert ("size = 'tiny'" if given == ["size=tiny"] else "arch = 'pre-ln'") in err, err
        assert "a 'sas-p' of size 'custom'" in err and not run.exists()
    fields = yaml.safe_load((source / "config.yaml").read_text())
    fields = {**{k: v for k, v in fields.items() if k not in ("arch", "size", "model", "out_dir")},
              "init_from": str(source), "max_steps": 2, "out_dir": str(run)}
    with pytest.raises(ConfigError, match="arch = 'pre-ln' with init_from"):
        train(TrainConfig.from_dict({**fields, "arch": "pre-ln"}))
    assert not run.exists()
    assert TrainConfig.from_dict(fields).arch is None  # left out: the source's, once it is read
    assert train(TrainConfig.from_dict(fields)).summary["arch"] == "sas-p"
    assert (TrainConfig(max_steps=1).arch, TrainConfig(max_steps=1).size) == ("pre-ln", "tiny")
