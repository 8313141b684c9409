"""A run's metrics.jsonl (training/metrics.py): one reader with clear errors, the validation rows and
their bits per byte, and every line a resume reads checked for the fields it needs. Rows lost after
they were written: tests/training/test_lost_metrics.py."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

from blocklab.cli import main
from blocklab.training import train
from blocklab.training.metrics import read_metrics, resume_gap
from blocklab.util.errors import ConfigError
from helpers import digest, one_error_line, small_run_args
from tests.training.tiny_runs import config, train_four_steps, write_code_corpus

small = small_run_args


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_code_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def finished_run(corpus, tmp_path_factory) -> Path:
    """Four steps with a validation line and a checkpoint every two."""
    return train_four_steps(corpus, tmp_path_factory.mktemp("run"))


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
