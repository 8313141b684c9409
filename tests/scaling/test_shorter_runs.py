"""Shorter runs of a ladder's largest rung (`shorter_runs: [...]`, `blocklab.scaling.shorter_runs`) for the
data equivalence, against a fake trainer whose run of t tokens ends at a loss linear in ln t, with
resformer at 1.25 x pre-ln's tokens (a saving of 20%, closed form), and whose evaluations on the way sit
above the shorter runs' final losses, as under a decaying schedule: the plan, the reading (the closed
form, where the mid-run reading misses it), the report, the rounds, and the file's mistakes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from blocklab.cli import main as cli
from blocklab.scaling.ladder_files import read_ladder_file
from blocklab.scaling.ladders import plan
from tests.helpers import one_error_line
from tests.scaling.fake_ladder_runs import fake_ladder_runs, ladder_command

ARCHS = ["pre-ln", "resformer"]
FRACTIONS = [0.25, 0.5, 0.75]
STEPS = 20
PARAMS = {"d32-l2": 30_000, "d64-l2": 80_000, "d96-l3": 200_000}
SPEED = {"pre-ln": 1.0, "resformer": 1.25}  # resformer's run of t tokens ends where pre-ln's of 1.25 t does
SLOPE = 0.1  # nats per e-fold of tokens
MID_RUN = 0.3  # an evaluation at step s of S sits MID_RUN (1 - s/S) above the loss a run of s steps ends at


def offset(arch: str, seed: int) -> float:
    """resformer's own per-seed offset: pre-ln's none, so each seed's saving has a closed form."""
    return 0.002 * seed if arch == "resformer" else 0.0


def final_loss(arch: str, n: int, tokens: float, seed: int) -> float:
    return 9 * n ** -0.1 + 2.0 - SLOPE * math.log(SPEED[arch] * tokens) + offset(arch, seed)


def closed_form_log_ratio(seed: int) -> float:
    """ln(T / T_X): resformer reaches pre-ln's L(T) at T_X = T e^(offset / SLOPE) / 1.25."""
    return math.log(SPEED["resformer"]) - offset("resformer", seed) / SLOPE


def ladder_file(tmp_path: Path, **changes) -> Path:
    data = {"rungs": [{"d_model": 32, "n_layers": 2, "n_heads": 1, "mlp_hidden": 128},
                      {"d_model": 64, "n_layers": 2, "n_heads": 2, "mlp_hidden": 256},
                      {"d_model": 96, "n_layers": 3, "n_heads": 3, "mlp_hidden": 384}],
            "steps": STEPS, "batch_size": 2, "seq_len": 16, "eval_every": 5, "seeds": 3, "archs": ARCHS,
            "shorter_runs": FRACTIONS, **changes}
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def trained(monkeypatch) -> list[str]:
    """Training faked (`fake_ladder_runs`): a run of S steps evaluates at its final loss for that many
    tokens plus MID_RUN (1 - s/S), and ends at `final_loss` of its S steps' tokens; half a second a step."""

    def run_of(cfg):
        n = PARAMS[next(p.name for p in Path(cfg.out_dir).parents if p.name in PARAMS)]
        per_step = cfg.batch_size * cfg.seq_len
        return n, lambda s: (final_loss(cfg.arch, n, s * per_step, cfg.seed)
                             + MID_RUN * (1 - s / cfg.max_steps)), 0.5

    return fake_ladder_runs(monkeypatch, run_of)


command = ladder_command


def test_the_plan_adds_each_seeds_shorter_runs_of_the_largest_rung_at_its_fractions_of_the_steps(tmp_path):
    ladder = read_ladder_file(ladder_file(tmp_path))
    runs = plan(ARCHS, ladder, tmp_path / "s", 2)
    shorter = [cfg for _, _, cfg in runs if "/shorter/" in cfg.out_dir]
    assert len(runs) == 2 * 2 * 3 + 2 * 2 * 3  # seeds x archs x (rungs + fractions)
    assert sorted({cfg.max_steps for cfg in shorter}) == [5, 10, 15]
    for cfg in shorter:
        assert Path(cfg.out_dir).parts[-4:-2] == ("d96-l3", "shorter")
        assert Path(cfg.out_dir).name == f"{cfg.arch}-steps{cfg.max_steps}-seed{cfg.seed}"
        assert cfg.model["d_model"] == 96 and cfg.batch_size == 2 and cfg.seq_len == 16
    full = {(cfg.arch, cfg.seed): cfg for _, _, cfg in runs if "/d96-l3/runs/" in cfg.out_dir}
    for cfg in shorter:  # the same run but for its steps: same peak rate, same data
        twin = full[(cfg.arch, cfg.seed)]
        assert cfg.optim.lr == twin.optim.lr and cfg.data == twin.data
    # seed-major: a seed's shorter runs follow its largest rung's runs, before the next seed's
    seeds = [cfg.seed for *_, cfg in runs]
    assert seeds == sorted(seeds)
    # a ladder without them plans exactly the runs it planned before
    plain = read_ladder_file(_without(tmp_path))
    assert [cfg.out_dir for *_, cfg in plan(ARCHS, plain, tmp_path / "s", 2)] == [
        cfg.out_dir for *_, cfg in runs if "/shorter/" not in cfg.out_dir]


def _without(tmp_path: Path) -> Path:
    path = ladder_file(tmp_path)
    data = yaml.safe_load(path.read_text())
    del data["shorter_runs"]
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(data))
    return plain


def test_the_data_equivalence_reads_the_shorter_runs_final_losses_the_closed_form(tmp_path, trained, capsys):
    out = tmp_path / "s"
    assert cli(command(ladder_file(tmp_path), out)) == 0
    assert "36 runs (2 architectures x 3 rungs x 3 seeds, and 3 shorter runs of d96-l3 x 2 architectures x " \
           "3 seeds)" in capsys.readouterr().out
    assert len(trained) == 3 * 2 * 3 + 3 * 2 * 3
    record = json.loads((out / "ladder-short" / "scaling.json").read_text())
    [eq] = [d for d in record["data"] if d["arch"] == "resformer"]
    assert eq["interval"]["values"] == pytest.approx([closed_form_log_ratio(s) for s in range(3)], abs=1e-9)
    report = (out / "ladder-short" / "scaling.md").read_text().replace("\n", " ")
    assert "read off shorter runs: each architecture also trained d96-l3 for 0.25, 0.5, 0.75 of its steps " \
           "(5, 10, 15 steps)" in report
    assert "a saving above 75%" in report and "d96-l3/shorter/runs/" in report
    assert "36 runs used: seeds 0, 1, 2 of each of 2 architectures at each of 3 rungs (3 per rung and " \
           "architecture), and 18 shorter runs of d96-l3 (the same seeds)" in report
    # the training time counts them: 18 ladder runs of 20 steps and 6 each of 5, 10 and 15, at 0.5 s a step
    assert record["method"]["training_seconds"] == 0.5 * (18 * 20 + 6 * (5 + 10 + 15))


def test_without_shorter_runs_the_mid_run_reading_misses_the_closed_form(tmp_path, trained):
    """The same fake read off the full runs' evaluations on the way (which sit above a shorter run's end):
    the number shorter runs exist to correct, so the test above can fail."""
    out = tmp_path / "s"
    assert cli(command(_without(tmp_path), out)) == 0
    record = json.loads((out / "ladder-plain" / "scaling.json").read_text())
    [eq] = [d for d in record["data"] if d["arch"] == "resformer"]
    wrong = [abs(v - closed_form_log_ratio(s)) for s, v in enumerate(eq["interval"]["values"])]
    assert min(wrong) > 0.02
    report = (out / "ladder-plain" / "scaling.md").read_text().replace("\n", " ")
    assert "not the loss of a run trained for that many tokens" in report
    assert "a ladder file's `shorter_runs` (e.g. [0.25, 0.5, 0.75]) trains them" in report


def test_a_seed_is_whole_only_with_its_shorter_runs_and_a_round_trains_them(tmp_path, trained):
    out = tmp_path / "s"
    path = ladder_file(tmp_path)
    assert cli(command(path, out, "--until-decided", "--max-seeds", "4")) == 0
    shorter = [run for run in trained if "/shorter/" in run]
    assert {Path(r).name.rpartition("-seed")[2] for r in shorter} == {"0", "1", "2", "3"}
    assert len(shorter) == 4 * 2 * 3
    # a finished seed whose shorter run is gone is not whole: the report reads the others
    gone = out / "ladder-short" / "d96-l3" / "shorter" / "runs" / "resformer-steps10-seed3"
    (gone / "summary.json").unlink()
    from blocklab.scaling.judge import read_ladder

    data = read_ladder(out / "ladder-short", read_ladder_file(path), ARCHS, "ladder-short")
    assert data.seeds() == [0, 1, 2]
    assert data.below(2).seeds() == [0, 1]


@pytest.mark.parametrize(("value", "message"), [
    ([], "shorter_runs = [] is not allowed: give a list of fractions of the largest rung's steps"),
    (0.5, "shorter_runs = 0.5 is not allowed: give a list of fractions"),
    ([0.5, 1], "shorter_runs fraction 1 is not allowed: every fraction lies strictly between 0 and 1"),
    ([0, 0.5], "shorter_runs fraction 0 is not allowed"),
    ([0.5, True], "shorter_runs fraction True is not allowed"),
    ([0.5, 0.5], "a shorter_runs fraction is given twice in [0.5, 0.5]: give distinct fractions"),
    ([0.5, 0.52], "shorter_runs: two fractions give the same 10 steps of rung d96-l3's 20: give fractions "
                  "farther apart"),
    ([0.01], "shorter_runs: fraction 0.01 of rung d96-l3's 20 steps gives 0 steps: a shorter run trains "
             "between 1 and 19 steps"),
])
def test_a_ladder_files_shorter_runs_mistake_is_one_line_naming_it(tmp_path, capsys, value, message):
    path = ladder_file(tmp_path, shorter_runs=value)
    assert cli(command(path, tmp_path / "s")) == 2
    line = one_error_line(capsys)
    assert message in line and str(path) in line
