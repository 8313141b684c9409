"""The ladder report's folder and the runs it reads: files of the user's refused by name (issue 57 items
9 and 15), runs whose record is broken named in one line (items 13 and 14); and the statistics a
reviewer would object to (issue 56 item 6)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tests.test_scaling import synthetic_ladder

from blocklab.cli import main as cli
from blocklab.scaling.judge import judge_ladder, read_ladder
from blocklab.scaling.ladders import LADDERS
from blocklab.scaling.report import write_scaling_report
from blocklab.util.errors import ConfigError


def _result(seeds: int = 3):
    return judge_ladder(synthetic_ladder(random.Random(1), 0.1, 0.1, seeds))


def test_the_report_refuses_the_users_files_by_name_and_overwrite_replaces_only_those(tmp_path):
    out = tmp_path / "rep"
    out.mkdir()
    (out / "scaling.md").write_text("my thesis chapter\n")
    (out / "loss_vs_params_all.png").write_bytes(b"my figure")
    (out / "other.txt").write_text("kept")
    with pytest.raises(ConfigError, match=r"holds scaling.md, loss_vs_params_all.png, not blocklab scaling"):
        write_scaling_report(_result(), out)
    assert (out / "scaling.md").read_text() == "my thesis chapter\n"
    assert sorted(p.name for p in out.iterdir()) == ["loss_vs_params_all.png", "other.txt", "scaling.md"]
    write_scaling_report(_result(), out, overwrite=True)
    assert (out / "scaling.md").read_text().startswith("# Scaling ladder synthetic")
    assert (out / "other.txt").read_text() == "kept"
    write_scaling_report(_result(), out)  # its own: rewritten without --overwrite
    (out / "scaling.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"scaling.json \(changed since blocklab wrote it\)"):
        write_scaling_report(_result(), out)


def test_a_report_folder_written_before_the_record_is_told_by_its_marks(tmp_path):
    """The committed ladder reports have no record beside them: their title marks them, and the figures
    their markdown links are blocklab's too."""
    write_scaling_report(_result(), tmp_path)
    (tmp_path / ".blocklab-wrote.json").unlink()
    write_scaling_report(_result(), tmp_path)
    (tmp_path / ".blocklab-wrote.json").unlink()
    (tmp_path / "scaling.md").write_text("# notes\n")
    with pytest.raises(ConfigError, match=r"scaling.md, loss_vs_params_all.png, loss_vs_params_non_emb"):
        write_scaling_report(_result(), tmp_path)


@pytest.mark.parametrize("where", ["file", "under a file"])
def test_report_into_a_file_is_one_line_before_anything_trains(tmp_path, capsys, where):
    """issue 57 item 15: `scaling --report FILE` said "[Errno 17] File exists" after training."""
    (tmp_path / "thesis.txt").write_text("mine")
    report = tmp_path / "thesis.txt" / ("sub" if where == "under a file" else "")
    code = cli(["scaling", "--ladder", "toy", "--out", str(tmp_path / "s"), "--report", str(report)])
    err = capsys.readouterr().err
    assert code == 2 and "is a file: give a folder" in err and "Errno" not in err
    assert not (tmp_path / "s").exists() and (tmp_path / "thesis.txt").read_text() == "mine"


def test_the_command_refuses_the_users_report_before_anything_trains(tmp_path, capsys):
    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / "scaling.html").write_text("<p>mine</p>")
    out, report = str(tmp_path / "s"), str(tmp_path / "rep")
    code = cli(["scaling", "--ladder", "toy", "--out", out, "--report", report])
    assert code == 2 and "scaling.html, not blocklab scaling's own" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def _fake_run(root: Path, rung: str, name: str, summary: dict, metrics: str) -> Path:
    run = root / rung / "runs" / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"params": {"total": 5, "non_embedding": 3}, "step": 2,
                                                  **summary}))
    (run / "metrics.jsonl").write_text(metrics)
    return run


ROW = json.dumps({"kind": "val", "step": 2, "tokens": 10, "val_loss": 3.0}) + "\n"


def test_a_finished_run_with_an_empty_curve_is_named(tmp_path):
    """issue 57 item 13: an empty metrics.jsonl was an IndexError in fit.data_ratio."""
    run = _fake_run(tmp_path, "d32-l2", "pre-ln-seed0", {"val_loss": 3.0}, "")
    with pytest.raises(ConfigError, match=f"{run}/metrics.jsonl has no validation row"):
        read_ladder(tmp_path, LADDERS["toy"], ["pre-ln"], "x")


@pytest.mark.parametrize("value", ["NaN", "Infinity", "null", '"3.0"'])
def test_a_summary_without_a_finite_loss_is_named(tmp_path, value):
    """issue 57 item 14: `val_loss: NaN` was "ValueError: t_interval got a NaN"."""
    run = _fake_run(tmp_path, "d32-l2", "pre-ln-seed0", {}, ROW)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps(summary)[:-1] + f', "val_loss": {value}}}')
    with pytest.raises(ConfigError, match=f"{run}/summary.json gives val_loss .*not a finite loss"):
        read_ladder(tmp_path, LADDERS["toy"], ["pre-ln"], "x")
