"""The steps that build a training run (training/build.py), each on its own: the run's start, where it
computes, its data, its model, its metrics; and the run's files (`rundir.write_run_files`). The whole
run they make together is tests/training/test_loop.py's."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

from blocklab import LanguageModel
from blocklab.cli import main
from blocklab.data import byte_tokenizer
from blocklab.training import TrainConfig, build, rundir
from blocklab.training.distributed import DistEnv
from blocklab.util.errors import ConfigError
from helpers import make_model, small_run_args


def cfg_of(corpus: Path, tmp_path: Path, *overrides: str) -> TrainConfig:
    """A run of bytes of `corpus`, d 32 x 2 layers, batches of 2 x 16 tokens, into tmp_path/run."""
    return TrainConfig.load(None, [*small_run_args(corpus, tmp_path / "cache"), "max_steps=2",
                                   f"out_dir={tmp_path / 'run'}", *overrides])


def cpu(world_size: int = 1, rank: int = 0) -> build.Placement:
    return build.Placement(DistEnv(rank, world_size), torch.device("cpu"), nullcontext())


# -- start_run ------------------------------------------------------------------------------------------
def test_a_new_run_starts_from_nothing_and_a_resume_from_its_last_checkpoint(corpus, tmp_path):
    cfg = cfg_of(corpus, tmp_path, "max_steps=5", "ckpt_every=2", "eval_every=0")
    start = build.start_run(cfg, resume=False)
    assert (start.run_dir, start.checkpoint, start.source) == (tmp_path / "run", None, None)
    assert start.cfg is cfg and not (tmp_path / "run").exists()  # checked, nothing written
    assert build.start_run(cfg, resume=True).checkpoint is None  # a resume with nothing saved: step 0
    assert main(["train", *small_run_args(corpus, tmp_path / "cache"), "max_steps=5", "ckpt_every=2",
                 "eval_every=0", "keep_checkpoints=5", "--out", str(tmp_path / "run")]) == 0
    # saved at steps 2, 4 and the last, 5: a resume goes on from the last
    assert build.start_run(cfg, resume=True).checkpoint == tmp_path / "run" / "checkpoints" / "step_000005"
    with pytest.raises(ConfigError, match="already holds a run"):  # a new run never writes over it
        build.start_run(cfg, resume=False)
    changed = cfg.replace(seed=1)
    with pytest.raises(ConfigError, match="seed"):  # a resume may change only RESUMABLE fields
        build.start_run(changed, resume=True)


# -- place ----------------------------------------------------------------------------------------------
def test_place_seeds_torch_and_picks_the_cpu(corpus, tmp_path):
    cfg = cfg_of(corpus, tmp_path, "seed=7", "device=cpu", "precision=float32")
    where = build.place(cfg, None)
    drawn = torch.rand(3)
    torch.manual_seed(7)
    assert torch.equal(drawn, torch.rand(3))  # the run's stream starts from its seed
    assert where.device == torch.device("cpu") and (where.env.rank, where.env.world_size) == (0, 1)
    assert isinstance(where.autocast, nullcontext)
    forced = build.place(cfg.replace(precision="bfloat16"), None).autocast
    assert (forced.device, forced.fast_dtype) == ("cpu", torch.bfloat16)


def test_place_refuses_a_batch_that_does_not_split_over_the_processes(corpus, tmp_path, monkeypatch):
    """(TrainConfig refuses a batch that grad_accum does not divide; the processes are known here.)"""
    monkeypatch.setattr(build.distributed, "setup", lambda device: DistEnv(0, 3))  # torchrun, 3 processes
    with pytest.raises(ConfigError, match=r"divisible by processes x grad_accum = 6"):
        build.place(cfg_of(corpus, tmp_path, "batch_size=4", "grad_accum=2"), None)
    assert build.place(cfg_of(corpus, tmp_path, "batch_size=12", "grad_accum=2"), None).env.world_size == 3


def test_place_checks_the_memory_of_a_new_model_but_not_of_a_source_in_memory(corpus, tmp_path):
    huge = cfg_of(corpus, tmp_path, "model.vocab_size=2000000000")
    with pytest.raises(ConfigError, match="does not fit in memory"):
        build.place(huge, None)
    build.place(huge, (object(), None))  # init_from: the model exists already, it is not estimated


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without CUDA")
def test_a_cuda_device_without_cuda_is_refused():
    with pytest.raises(ConfigError, match="no CUDA device is available"):
        build.resolve_device("cuda", DistEnv())
    assert build.resolve_device("auto", DistEnv()) == torch.device("cpu")


# -- build_data -----------------------------------------------------------------------------------------
def test_the_data_gives_the_same_batches_for_a_seed_and_the_bytes_of_each_token(corpus, tmp_path):
    cfg = cfg_of(corpus, tmp_path, "seed=3")
    data = build.build_data(cfg, cpu(), tmp_path / "run")
    again = build.build_data(cfg, cpu(), tmp_path / "run")
    other = build.build_data(cfg.replace(seed=4), cpu(), tmp_path / "run")
    batch = data.train.get(5)
    assert batch["input_ids"].shape == (2, 16) and data.tokenizer.vocab_size == 258
    assert torch.equal(batch["input_ids"], again.train.get(5)["input_ids"])  # a pure function of (seed, step)
    assert not torch.equal(batch["input_ids"], other.train.get(5)["input_ids"])
    text = "".join(p.read_text() for p in sorted(corpus.iterdir()))
    pieces = bytes(i if i < 256 else 0 for i in batch["input_ids"][0].tolist()).split(b"\0")
    assert all(piece in text.encode() for piece in pieces)  # byte ids, end-of-text (256) between files
    assert data.token_bytes[:256].tolist() == [1] * 256  # every byte token stands for one UTF-8 byte
    assert not (tmp_path / "run").exists()


# -- build_model ----------------------------------------------------------------------------------------
def test_the_model_is_drawn_from_the_seed_whatever_was_drawn_before(corpus, tmp_path):
    cfg = cfg_of(corpus, tmp_path, "seed=5")
    tokenizer = byte_tokenizer()
    torch.rand(1000)  # what data preparation might draw
    built = build.build_model(cfg, None, tokenizer, cpu())
    torch.manual_seed(5)
    expected = LanguageModel(cfg.model_config(tokenizer.vocab_size))
    got, want = built.model.state_dict(), expected.state_dict()
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert built.wrapped is built.model  # one process: nothing wraps it
    assert built.config.vocab_size == 258 and built.config.d_model == 32
    assert built.counts.total == sum(p.numel() for p in expected.parameters())
    assert built.flops_per_token > 6 * built.counts.non_embedding  # 6N for the weights, plus attention


def test_the_model_compiles_as_the_config_asks(corpus, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(LanguageModel, "compile_blocks", lambda self: calls.append("blocks"))
    monkeypatch.setattr(LanguageModel, "compile_model", lambda self: calls.append("model"))
    for how in ("blocks", "model", "false"):
        build.build_model(cfg_of(corpus, tmp_path, f"compile={how}"), None, byte_tokenizer(), cpu())
    assert calls == ["blocks", "model"]


def test_a_source_model_is_trained_as_it_is(corpus, tmp_path):
    source = make_model("pre-ln", vocab_size=258, d_model=32, n_layers=2, n_heads=2, context_length=16)
    before = {k: v.clone() for k, v in source.state_dict().items()}
    cfg = TrainConfig.load(None, [f"data.source={corpus}", "data.tokenizer=byte", "seq_len=16", "max_steps=2",
                                  f"data.cache_dir={tmp_path / 'cache'}", f"init_from={tmp_path}"])
    built = build.build_model(cfg, (source, None), byte_tokenizer(), cpu())
    assert built.model is source and built.config is source.cfg
    assert all(torch.equal(v, before[k]) for k, v in built.model.state_dict().items())  # not drawn again


# -- open_metrics ---------------------------------------------------------------------------------------
def test_metrics_are_kept_by_rank_0_alone_and_a_torn_line_is_dropped_and_said(corpus, tmp_path, capsys):
    cfg = cfg_of(corpus, tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    assert build.open_metrics(cfg, run, None, DistEnv(1, 2)) is None
    assert not (run / "metrics.jsonl").exists()
    rows = [{"kind": "train", "step": s, "tokens": 32 * s, "loss": 5.0 - s, "wall_time": 0.1 * s}
            for s in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"kind": "tr')
    logger = build.open_metrics(cfg, run, 2, DistEnv())
    assert logger is not None and logger.trackers == []  # logger=none: metrics.jsonl alone
    assert "dropped a torn last line (12 bytes)" in capsys.readouterr().err
    assert [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] == rows[:2]
    logger.close()
    build.open_metrics(cfg, run, None, DistEnv())  # a new run: an empty file
    assert (run / "metrics.jsonl").read_text() == ""


# -- the run's files ------------------------------------------------------------------------------------
def test_a_new_run_writes_its_files_and_a_resume_only_its_config(corpus, tmp_path):
    cfg = cfg_of(corpus, tmp_path, "max_steps=3")
    run = tmp_path / "run"
    data = build.build_data(cfg, cpu(), run).prepared
    model_cfg = cfg.model_config(258)
    rundir.write_run_files(run, cfg, model_cfg, data, resume=False, checkpoint=None)
    assert TrainConfig.load(run / "config.yaml") == cfg
    assert json.loads((run / "model_config.json").read_text())["vocab_size"] == 258
    manifest = json.loads((run / "data_manifest.json").read_text())
    assert manifest["tokenizer_hash"] == data.tokenizer.hash
    assert (run / "tokenizer.json").is_file()
    (run / "checkpoints" / ".tmp-step_000002").mkdir(parents=True)  # a save killed midway
    (run / "model_config.json").write_text("{}")
    longer = cfg.replace(max_steps=6)
    rundir.write_run_files(run, longer, model_cfg, data, resume=True, checkpoint=run / "checkpoints" / "x")
    assert TrainConfig.load(run / "config.yaml").max_steps == 6
    assert (run / "model_config.json").read_text() == "{}"  # the run's own, from its first start
    assert not (run / "checkpoints" / ".tmp-step_000002").exists()


def test_overwrite_replaces_the_run_and_keeps_other_files(corpus, tmp_path):
    cfg = cfg_of(corpus, tmp_path, "overwrite=true")
    run = tmp_path / "run"
    run.mkdir()
    for name in ("metrics.jsonl", "summary.json", "notes.txt"):
        (run / name).write_text("old")
    rundir.write_run_files(run, cfg, cfg.model_config(258), build.build_data(cfg, cpu(), run).prepared,
                           resume=False, checkpoint=None)
    assert not (run / "metrics.jsonl").exists() and not (run / "summary.json").exists()
    assert (run / "notes.txt").read_text() == "old" and (run / "config.yaml").is_file()
