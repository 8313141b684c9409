"""Experiment trackers (training.trackers): what a wandb run holds, read back from the record file wandb
wrote offline (tests/wandb_records.py), against the run's own metrics.jsonl, built here field by field
rather than through the code that sends them."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import blocklab
from blocklab.cli import main
from blocklab.training import TrainConfig, train
from blocklab.training.metrics import read_metrics
from blocklab.util.errors import ConfigError
from helpers import compare_base
from timeouts import patient
from wandb_records import WandbRun, scalar_rows, wandb_runs

needs_wandb = pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed")
TRAIN_FIELDS = ("tokens", "loss", "lr", "grad_norm", "tokens_per_s", "wall_time")
VAL_FIELDS = ("tokens", "wall_time", "val_loss", "val_bpb", "val_tokens", "val_bytes")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def run_config(corpus: Path, tmp_path: Path, **fields) -> TrainConfig:
    """sas-p (learned gains to log), d 32 x 2 layers, 6 steps of 4 x 32 bytes, validation every 3."""
    base = {**compare_base(corpus, tmp_path / "cache", steps=6), "arch": "sas-p", "eval_every": 3,
            "ckpt_every": 2, "model": {"d_model": 32, "n_layers": 2, "n_heads": 2}, "logger": "wandb",
            "out_dir": str(tmp_path / "run")}
    return TrainConfig.from_dict({**base, **fields})


def expected(run_dir: Path) -> dict[tuple[int, str], float]:
    """Every scalar of metrics.jsonl, keyed (step, name) as the trackers name them."""
    out = {}
    for row in read_metrics(run_dir / "metrics.jsonl"):
        for name in TRAIN_FIELDS if row["kind"] == "train" else VAL_FIELDS:
            if row.get(name) is not None:
                out[row["step"], f"{row['kind']}/{name}"] = row[name]
        for gain, values in row.get("scalars", {}).items():
            out.update({(row["step"], f"scalars/{gain}/{i}"): v for i, v in enumerate(values)})
    return out


def logged(runs: list[WandbRun]) -> dict[tuple[int, str], float]:
    """The runs' scalars keyed (step, name); a step logged twice fails."""
    rows = scalar_rows(runs)
    keys = [(step, name) for step, name, _ in rows]
    assert len(keys) == len(set(keys)), "a scalar was logged twice at one step"
    return {(step, name): value for step, name, value in rows}


@needs_wandb
def test_wandb_run_holds_every_scalar_of_metrics_jsonl(corpus, tmp_path):
    cfg = run_config(corpus, tmp_path, wandb_project="blk-test")
    run_dir = train(cfg).run_dir
    [run] = wandb_runs(run_dir / "wandb")  # wandb writes under the run's folder, nothing elsewhere
    assert (run.id, run.project, run.name, run.group) == (
        json.loads((run_dir / "wandb.json").read_text())["id"], "blk-test", "run", "")
    assert run.config["arch"] == "sas-p" and run.config["optim"]["lr"] == cfg.optim.lr
    assert run.config["max_steps"] == 6 and run.exit_code == 0
    want = expected(run_dir)
    assert logged([run]) == want  # the same numbers, exactly, at the same steps
    assert any(name.startswith("scalars/blocks.1.attn.") for _, name in want)  # SAS-P's learned gains
    assert {step for step, name in want if name == "val/val_loss"} == {0, 3, 6}


@needs_wandb
def test_resume_continues_the_same_wandb_run_without_a_step_twice(corpus, tmp_path):
    run_dir = train(run_config(corpus, tmp_path)).run_dir
    first = read_metrics(run_dir / "metrics.jsonl")
    # cut off after step 6 was logged but before its checkpoint: the resume goes on from step 4
    shutil.rmtree(run_dir / "checkpoints" / "step_000006")
    (run_dir / "summary.json").unlink()
    train(run_config(corpus, tmp_path), resume=True)
    train(run_config(corpus, tmp_path, max_steps=8), resume=True)  # and a longer budget
    runs = wandb_runs(run_dir / "wandb")
    assert len(runs) == 3 and len({r.id for r in runs}) == 1  # one wandb run, three sessions
    assert [r.history[-1]["_step"] if r.history else None for r in runs] == [6, None, 8]
    final = expected(run_dir)
    got = logged(runs)
    assert got.keys() == final.keys()
    rerun = {"train/wall_time", "train/tokens_per_s", "val/wall_time"}  # timed again by the resume
    for (step, name), value in got.items():
        if step in (5, 6) and name in rerun:  # what the first attempt sent stays
            assert value == expected_rows(first)[step, name]
        else:  # the resumed steps on CPU give the same losses and gains
            assert value == final[step, name], (step, name)


def expected_rows(rows) -> dict[tuple[int, str], float]:
    return {(r["step"], f"{r['kind']}/{n}"): r[n] for r in rows
            for n in (TRAIN_FIELDS if r["kind"] == "train" else VAL_FIELDS) if r.get(n) is not None}


@needs_wandb
def test_compare_is_one_wandb_group_with_every_scalar_of_its_runs(corpus, tmp_path):
    from blocklab.compare import compare

    out = tmp_path / "cmp"
    base = {**compare_base(corpus, tmp_path / "cache", steps=3), "logger": "wandb"}
    out.mkdir()
    stray = out / "my-sketch.png"  # the user's, not the report's, dated later (a clock ahead, a copy)
    stray.write_bytes(b"\x89PNG")
    os.utime(stray, (time.time() + 3600, time.time() + 3600))
    compare(["pre-ln", "sas-p"], out, base=base, timing_rounds=0, log=lambda *_: None)
    for name in ("pre-ln-seed0", "sas-p-seed0"):
        [run] = wandb_runs(out / "runs" / name / "wandb")
        assert (run.name, run.group, run.job_type) == (name, "cmp", "")
        assert logged([run]) == expected(out / "runs" / name)
    [report] = wandb_runs(out / "wandb")  # the report's figures, one run in the group
    assert (report.name, report.group, report.job_type) == ("report", "cmp", "report")
    images = {k.removesuffix("/_type") for k, v in report.history[0].items() if k.endswith("/_type")}
    assert images == {f"figures/{p.stem}" for p in out.glob("*.png") if p != stray} != set()
    assert {v for k, v in report.history[0].items() if k.endswith("/_type")} == {"image-file"}


@needs_wandb
def test_a_run_compare_reuses_gives_wandb_the_rows_it_lacks(corpus, tmp_path):
    """A run trained without wandb, then reused by a comparison that logs to wandb: its wandb run gets the
    whole curve from metrics.jsonl; reused again, nothing is sent twice."""
    from blocklab.compare import compare

    out, base = tmp_path / "cmp", compare_base(corpus, tmp_path / "cache", steps=2)
    compare(["pre-ln"], out, base=base, timing_rounds=0, log=lambda *_: None)
    run_dir = out / "runs" / "pre-ln-seed0"
    assert not (run_dir / "wandb").exists()
    for _ in range(2):
        compare(["pre-ln"], out, base={**base, "logger": "wandb"}, timing_rounds=0, log=lambda *_: None)
    [run] = wandb_runs(run_dir / "wandb")
    assert logged([run]) == expected(run_dir) != {}


def test_a_tracker_without_its_package_is_refused_before_training(corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    args = ["train", f"data.source={corpus}", "data.tokenizer=byte", f"data.cache_dir={tmp_path / 'cache'}",
            "max_steps=1", "logger=wandb", "--out", str(tmp_path / "run")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("blocklab: error: ") and err.count("\n") == 1
    assert "pip install 'blocklab[wandb]'" in err
    assert not (tmp_path / "cache").exists()  # refused before the data was prepared


def test_logger_names_are_checked_and_kept_out_of_results(corpus, tmp_path):
    from blocklab.training.config import NOT_RESULTS
    from blocklab.training.trackers import tracker_names

    with pytest.raises(ConfigError, match="logger = 'wandbb' is not allowed: choose from 'tensorboard', "):
        run_config(corpus, tmp_path, logger="wandbb")
    cfg = run_config(corpus, tmp_path, logger=["wandb", "none"], tensorboard=True)
    assert tracker_names(cfg) == ("wandb", "tensorboard")
    assert tracker_names(run_config(corpus, tmp_path, logger="none")) == ()
    assert {"logger", "wandb_project", "wandb_group", "tensorboard"} <= NOT_RESULTS


@needs_wandb
@pytest.mark.slow  # ~15 s: torchrun with two processes
def test_only_rank_0_logs_to_wandb_under_torchrun(corpus, tmp_path):
    cfg = run_config(corpus, tmp_path, max_steps=3, eval_every=2)
    args = [f"{k}={json.dumps(v)}" for k, v in cfg.to_dict().items() if k != "out_dir"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
           "blocklab.cli", "train", *args, "--out", str(tmp_path / "two")]
    src = str(Path(blocklab.__file__).resolve().parents[1])  # the blocklab under test, in the subprocesses
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [src, *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=patient(300))
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run] = wandb_runs(tmp_path / "two" / "wandb")
    assert logged([run]) == expected(tmp_path / "two")
    assert not list(tmp_path.glob("wandb"))  # nothing in the working folder


def test_reproduce_gives_every_run_the_trackers_and_its_settings_group(tmp_path):
    from argparse import Namespace

    from blocklab.cli import build_parser
    from blocklab.reproduce.tracking import fields, with_tracking
    from blocklab.training.config import NOT_RESULTS, changed_fields

    args = build_parser().parse_args(["reproduce", "--quick", "--logger", "wandb", "--wandb-project", "p"])
    tracking = fields(args)
    assert tracking == {"logger": ["wandb"], "wandb_project": "p"}
    run = tmp_path / "rep" / "quick" / "tiny-steps" / "runs" / "pre-ln-seed0"
    cfg = TrainConfig(max_steps=2, out_dir=str(run))
    [(_, got)] = with_tracking([(None, cfg)], tracking, tmp_path / "rep")
    assert (got.logger, got.wandb_project, got.wandb_group) == (["wandb"], "p", "rep/quick/tiny-steps")
    assert not changed_fields(cfg, got, NOT_RESULTS)  # runs trained without a tracker are reused
    assert with_tracking([(None, cfg)], fields(Namespace(logger=None, wandb_project=None)), tmp_path) == [
        (None, cfg)]
    with pytest.raises(ConfigError, match="--wandb-project is allowed only with --logger wandb"):
        fields(Namespace(logger=None, wandb_project="p"))
    with pytest.raises(ConfigError, match="--logger 'wandbb' is not allowed"):
        fields(Namespace(logger="wandbb", wandb_project=None))


@needs_wandb
@pytest.mark.parametrize("bad_id", ["bad id/x", "a;b", " "])
def test_a_run_id_wandb_refuses_in_wandb_json_is_named_before_the_resume_changes_anything(bad_id, corpus,
                                                                                          tmp_path, capsys):
    """An edited wandb.json gave wandb's failure with advice to `wandb login`: now one line names the
    file and the id, exit 2, and the run's files are as they were."""
    run_dir = train(run_config(corpus, tmp_path, max_steps=4)).run_dir
    record = json.loads((run_dir / "wandb.json").read_text())
    (run_dir / "wandb.json").write_text(json.dumps({**record, "id": bad_id}))
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and "wandb" not in p.parts}
    capsys.readouterr()
    assert main(["train", "--resume", "--out", str(run_dir), "max_steps=6"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "wandb login" not in err
    assert f"{run_dir / 'wandb.json'} records the wandb run id {bad_id!r}, which wandb refuses" in err
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and "wandb" not in p.parts} == before
