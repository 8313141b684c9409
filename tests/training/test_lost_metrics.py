"""A run's metrics.jsonl that lost lines after they were written is never read as if whole.

A finished run: its summary.json names the step it finished at, and the trainer writes the validation
row of that step before the summary, so a curve without it was cut short afterwards. Every reader of a
run's curve (`read_metrics`: scaling's fits and data equivalence, reproduce's pages, compare's report,
plot) and every launcher that would reuse the run (`launch.store.check_reusable`) refuses it by name.
A checkpoint: its state.json records how many rows of each kind the file held at its step, and a
resume that finds fewer refuses before it changes any file (the lost rows cannot be made again).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from blocklab.cli import main
from blocklab.training import TrainConfig
from blocklab.training.metrics import read_metrics
from blocklab.util.errors import ConfigError
from helpers import small_run_args

REPO = Path(__file__).resolve().parents[2]


def cut(path: Path, lines: int) -> None:
    """`head -n LINES` of `path`, in place."""
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:lines]))


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def run6(corpus, tmp_path_factory):
    """A finished run of 6 steps: validation rows at steps 0, 2, 4 and 6, checkpoints at 4 and 6."""
    root = tmp_path_factory.mktemp("run6")
    out = root / "run"
    args = [*small_run_args(corpus, root / "cache"), "max_steps=6", "eval_every=2", "ckpt_every=2"]
    assert main(["train", *args, "--out", str(out)]) == 0
    return out


def test_a_finished_curve_cut_short_is_refused_by_every_reader(run6, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(run6, run)
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl", "val")] == [0, 2, 4, 6]
    cut(run / "metrics.jsonl", 4)
    with pytest.raises(ConfigError, match=r"metrics.jsonl ends at step 4, without the validation at step 6"):
        read_metrics(run / "metrics.jsonl", "val")
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl", "val", whole=False)] == [0, 2, 4]
    capsys.readouterr()
    assert main(["plot", str(run), "--out", str(tmp_path / "plot")]) == 2
    err = capsys.readouterr().err
    assert f"remove {run} and rerun" in err and not (tmp_path / "plot").exists()
    # a launcher (compare, reproduce, scaling) refuses to reuse it before anything trains
    from blocklab.launch.store import check_reusable

    cfg = TrainConfig.from_dict({**TrainConfig.load(run / "config.yaml").to_dict(), "out_dir": str(run)})
    with pytest.raises(ConfigError, match="lines were lost"):
        check_reusable(cfg)
    (run / "metrics.jsonl").unlink()
    with pytest.raises(ConfigError, match="holds no row"):
        check_reusable(cfg)
    (run / "summary.json").unlink()  # unfinished: its curve simply ends earlier
    assert check_reusable(cfg) == "resume"


def test_scaling_no_train_refuses_a_ladder_run_whose_curve_lost_lines(tmp_path, capsys):
    """The issue's repro on the committed cpu ladder: `head -n 4` of d96-l3's resformer-seed1 moved
    resformer-less-data from +7.1% to -18.7% without a word."""
    store = tmp_path / "store"
    shutil.copytree(REPO / "benchmarks" / "reproduction-data" / "ladder-cpu", store / "ladder-cpu")
    run = store / "ladder-cpu" / "d96-l3" / "runs" / "resformer-seed1"
    cut(run / "metrics.jsonl", 4)
    before = files(store)
    capsys.readouterr()
    assert main(["scaling", "--ladder", "cpu", "--out", str(store), "--no-train"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"{run / 'metrics.jsonl'} ends at step 20" in err
    assert files(store) == before


def _resumable(run6: Path, tmp_path: Path) -> Path:
    """run6 as a run cut off after its last checkpoint: no summary.json."""
    run = tmp_path / "run"
    shutil.copytree(run6, run)
    (run / "summary.json").unlink()
    return run


def test_a_resume_refuses_rows_lost_before_its_checkpoint(run6, tmp_path, capsys):
    """`head -n 3` of metrics.jsonl, checkpoints/step_000006 kept, summary.json deleted: the resume
    exited 0 with the rows of steps 4 and 6 gone for good."""
    run = _resumable(run6, tmp_path)
    state = json.loads((run / "checkpoints" / "step_000006" / "state.json").read_text())
    rows = read_metrics(run / "metrics.jsonl", whole=False)
    assert state["metrics_rows"] == {"train": sum(r["kind"] == "train" for r in rows), "val": 4}
    cut(run / "metrics.jsonl", 3)
    before = files(run)
    capsys.readouterr()
    assert main(["train", "--resume", "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "2 of its 4 validation rows up to step 6" in err and "(it ends at step 2)" in err
    assert str(run / "checkpoints" / "step_000006" / "state.json") in err
    assert files(run) == before


def test_a_checkpoint_without_the_record_still_resumes(run6, tmp_path):
    """Checkpoints saved before `metrics_rows` was recorded resume as before."""
    run = _resumable(run6, tmp_path)
    for path in (run / "checkpoints").glob("step_*/state.json"):
        meta = json.loads(path.read_text())
        del meta["metrics_rows"]
        path.write_text(json.dumps(meta))
    cut(run / "metrics.jsonl", 3)
    assert main(["train", "--resume", "--out", str(run)]) == 0
    assert json.loads((run / "summary.json").read_text())["step"] == 6


def test_a_resume_with_every_row_goes_on_and_records_the_rows_again(run6, tmp_path):
    """Rows written after the checkpoint (a run killed before its next one) are not missing ones."""
    run = _resumable(run6, tmp_path)
    shutil.rmtree(run / "checkpoints" / "step_000006")  # resumes from step 4; the file holds rows to 6
    assert main(["train", "--resume", "--out", str(run)]) == 0
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows if r["kind"] == "val"] == [0, 2, 4, 6]
    state = json.loads((run / "checkpoints" / "step_000006" / "state.json").read_text())
    assert state["metrics_rows"] == {"train": sum(r["kind"] == "train" for r in rows), "val": 4}
