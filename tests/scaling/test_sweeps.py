"""A ladder's short learning-rate sweep per rung (`lr: {sweep: [...], steps: N}`, `blocklab.scaling.sweeps`),
against a fake trainer whose final loss is a quadratic in log(lr) with a known optimum per rung and
architecture: the factor chosen, the rates the ladder's runs train at, the edge flag, reuse, --no-train
before the sweep has finished, a piece in lent minutes, the rounds, and the ladder file's mistakes."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from blocklab.cli import main as cli
from blocklab.launch import store
from blocklab.recipes import recipe_optim
from blocklab.scaling.ladder_files import read_ladder_file
from blocklab.scaling.ladders import LADDERS
from blocklab.scaling.rungs import LrSweep
from tests.helpers import one_error_line, write_code_corpus
from tests.scaling.fake_ladder_runs import fake_ladder_runs, ladder_command

ARCHS = ["pre-ln", "sas-p"]
GRID = [0.333, 1, 3]
# the factor of its recipe rate at which each (rung, arch) trains best, and the grid's factor nearest it
# in log(lr), which the sweep must choose: two optima inside the grid, two past its ends
OPTIMUM = {("d32-l2", "pre-ln"): 1.3, ("d32-l2", "sas-p"): 0.15, ("d64-l2", "pre-ln"): 6.0,
           ("d64-l2", "sas-p"): 0.8, ("d96-l3", "pre-ln"): 0.5, ("d96-l3", "sas-p"): 2.0}
CHOSEN = {("d32-l2", "pre-ln"): 1, ("d32-l2", "sas-p"): 0.333, ("d64-l2", "pre-ln"): 3,
          ("d64-l2", "sas-p"): 1, ("d96-l3", "pre-ln"): 0.333, ("d96-l3", "sas-p"): 3}
EDGE = {key for key, f in CHOSEN.items() if f in (min(GRID), max(GRID))}
PARAMS = {"d32-l2": 30_000, "d64-l2": 80_000, "d96-l3": 200_000}


def recipe_lr(arch: str) -> float:
    return recipe_optim(arch, "tiny")["lr"]


def ladder_file(tmp_path: Path, **changes) -> Path:
    """A sweep ladder of three rungs (the toy ladder's shapes), two architectures and two seeds."""
    data = {"rungs": [{"d_model": 32, "n_layers": 2, "n_heads": 1, "mlp_hidden": 128},
                      {"d_model": 64, "n_layers": 2, "n_heads": 2, "mlp_hidden": 256},
                      {"d_model": 96, "n_layers": 3, "n_heads": 3, "mlp_hidden": 384}],
            "steps": 20, "batch_size": 2, "seq_len": 16, "eval_every": 10, "seeds": 2, "archs": ARCHS,
            "lr": {"sweep": GRID, "steps": 5}, **changes}
    path = tmp_path / "swept.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def trained(monkeypatch) -> list[str]:
    """Training faked (`fake_ladder_runs`): a run's final loss a power law in the rung's parameters plus
    0.05 ln(lr / lr*)^2 (lr* its (rung, arch)'s OPTIMUM x its recipe rate) plus a seed's small offset, its
    evaluations on the way 1/step above it, a quarter of a second a step; returns the out_dirs trained."""

    def run_of(cfg):
        rung = next(p.name for p in Path(cfg.out_dir).parents if p.name in PARAMS)
        best = OPTIMUM[(rung, cfg.arch)] * recipe_lr(cfg.arch)
        n = PARAMS[rung]
        noise = 0.002 * cfg.seed + 0.001 * ((7 * cfg.seed + len(cfg.arch) + n // 10_000) % 5)
        loss = 9 * n ** -0.1 + 0.05 * math.log(cfg.optim.lr / best) ** 2 + noise
        return n, lambda s: loss if s == cfg.max_steps else loss + 1 / s, 0.25  # a 5-step sweep run 1.25 s

    return fake_ladder_runs(monkeypatch, run_of)


command = ladder_command


def test_the_sweep_chooses_each_rungs_best_factor_and_the_ladder_trains_at_exactly_that_rate(
        tmp_path, trained, capsys):
    out = tmp_path / "s"
    assert cli(command(ladder_file(tmp_path), out)) == 0
    root = out / "ladder-swept"
    sweep_runs = sorted(root.glob("*/sweep/runs/*/summary.json"))
    assert len(sweep_runs) == 3 * 2 * 3  # rungs x archs x factors, seed 0, 5 steps each
    for run in sweep_runs:
        config = yaml.safe_load((run.parent / "config.yaml").read_text())
        assert (config["seed"], config["max_steps"], config["batch_size"], config["seq_len"]) == (0, 5, 2, 16)
    assert len(trained) == 18 + 12 and len(set(trained)) == 30  # the sweep first, then the ladder
    assert all("/sweep/" in run for run in trained[:18]) and not any("/sweep/" in r for r in trained[18:])
    # each ladder run at exactly its (rung, arch)'s chosen factor x its recipe rates (Muon's: both)
    ladder_runs = sorted(root.glob("*/runs/*/config.yaml"))
    assert len(ladder_runs) == 3 * 2 * 2
    for path in ladder_runs:
        config = yaml.safe_load(path.read_text())
        factor = CHOSEN[(path.parents[2].name, config["arch"])]
        recipe = recipe_optim(config["arch"], "tiny")
        assert config["optim"]["lr"] == factor * recipe["lr"]
        assert config["optim"]["muon_lr"] == factor * recipe["muon_lr"]
        assert config["max_steps"] == 20
    record = json.loads((root / "scaling.json").read_text())["method"]["lr_sweep"]
    assert record["runs"] == 18 and record["factors"] == GRID and record["steps"] == 5
    assert {(c["rung"], c["arch"]): c["factor"] for c in record["chosen"]} == CHOSEN
    assert {(c["rung"], c["arch"]) for c in record["chosen"] if c["at_edge"]} == EDGE
    report = (root / "scaling.md").read_text()
    assert "Learning rate: a short sweep per rung" in report and "18 sweep runs" in report
    # the sweep's training time is its own (18 x 1.25 s), apart from the 12 ladder runs' (12 x 5 s)
    assert record["training_seconds"] == 18 * 1.25 and record["training_recorded"] == 18
    assert "sweep runs (in <rung>/sweep/runs/), 22 seconds of training from their summary.json, not counted" \
        in report.replace("\n", " ")
    assert "Training time, from the runs' summary.json: 60 seconds summed over the runs used;" in report
    edge_line = next(line for line in report.splitlines() if "a wider grid might choose otherwise" in line)
    assert edge_line.startswith(f"{len(EDGE)} of the 6 choices are at the edge: a wider grid might choose "
                                "otherwise")
    assert all(f"{rung} {arch}" in edge_line for rung, arch in EDGE)
    assert "d32-l2 pre-ln" not in edge_line and "d64-l2 sas-p" not in edge_line
    lines = report.splitlines()
    table = lines[lines.index("| rung | pre-ln | sas-p |"):]  # the sweep's: rung, then each arch's choice
    row = next(line for line in table if line.startswith("| d64-l2 |"))
    assert f"{3 * recipe_lr('pre-ln'):.3g} (x3), at the edge" in row and "(x1) |" in row
    # again: every sweep run and ladder run reused, nothing trained, the same report
    trained.clear()
    capsys.readouterr()
    assert cli(command(ladder_file(tmp_path), out)) == 0
    assert trained == []
    printed = capsys.readouterr().out
    assert printed.count("finished earlier, reused") == 18 + 12
    assert cli(command(ladder_file(tmp_path), out, "--no-train")) == 0 and trained == []
    assert (root / "scaling.md").read_text() == report


def test_no_train_before_the_sweep_has_finished_is_refused_naming_what_is_left(tmp_path, trained, capsys):
    path, out = ladder_file(tmp_path), tmp_path / "s"
    assert cli(command(path, out, "--no-train")) == 2
    err = one_error_line(capsys)
    assert "--no-train reads the ladder's runs at the rates its sweep chose" in err
    assert "has not finished: 18 of its 18 runs have no summary.json" in err and "leave out --no-train" in err
    from blocklab.scaling.orchestrate import train_sweep

    ladder = replace(read_ladder_file(path), rungs=read_ladder_file(path).rungs[:1])  # the first rung's
    train_sweep(ARCHS, ladder, out / "ladder-swept", log=lambda *_: None)
    assert len(trained) == 6
    assert cli(command(path, out, "--no-train")) == 2
    err = one_error_line(capsys)
    assert "has not finished: 12 of its 18 runs" in err and "d64-l2/sweep/runs/pre-ln-x0.333-seed0" in err
    assert not (out / "ladder-swept" / "scaling.md").exists() and not list(out.glob("*/*/runs"))


def test_a_run_trained_at_another_rate_than_the_sweep_chose_is_refused_and_fresh_retrains_it(
        tmp_path, trained, capsys):
    path, out = ladder_file(tmp_path, seeds=1), tmp_path / "s"
    assert cli(command(path, out)) == 0
    run = out / "ladder-swept" / "d32-l2" / "runs" / "pre-ln-seed0"
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["optim"]["lr"] = 3 * recipe_lr("pre-ln")  # the sweep chose x1 here
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    capsys.readouterr()
    assert cli(command(path, out, "--no-train")) == 2
    assert f"{run} holds a finished run with a different config (optim.lr: " in one_error_line(capsys)
    trained.clear()
    assert cli(command(path, out, "--fresh")) == 0
    assert trained == [str(run)]
    assert yaml.safe_load((run / "config.yaml").read_text())["optim"]["lr"] == recipe_lr("pre-ln")


def test_a_piece_trains_the_sweep_first_and_counts_its_runs_as_runs_to_train(tmp_path, trained):
    from blocklab.scaling.orchestrate import train_piece

    (tmp_path / "corpus").mkdir()
    data = {"source": str(write_code_corpus(tmp_path / "corpus")), "tokenizer": "byte",
            "cache_dir": str(tmp_path / "cache")}
    ladder = read_ladder_file(ladder_file(tmp_path, seeds=1, train={"data": data}))
    clock = iter(range(0, 100_000, 7)).__next__  # each call 7 s later: a few runs fit in a minute
    first, left = train_piece(ARCHS, ladder, "ladder-swept", tmp_path / "s", 1.0, clock=clock,
                              log=lambda *_: None)
    assert 0 < len(first) < 18 and all("/sweep/" in run for run in first)
    assert left == 18 - len(first) + 6  # the sweep's runs left, and every ladder run
    second, left = train_piece(ARCHS, ladder, "ladder-swept", tmp_path / "s", 1e4, log=lambda *_: None)
    assert left == 0 and len(second) == 18 - len(first) + 6 and trained == first + second
    assert all("/sweep/" not in run for run in second[-6:])
    for run in second[-6:]:
        config = yaml.safe_load((Path(run) / "config.yaml").read_text())
        factor = CHOSEN[(Path(run).parents[1].name, config["arch"])]
        assert config["optim"]["lr"] == factor * recipe_lr(config["arch"])
        assert (Path(run) / "trained_on.json").is_file() and not (Path(run) / "checkpoints").exists()


def test_the_pages_plan_of_a_ladder_not_yet_run_counts_the_sweeps_runs(tmp_path, trained):
    from blocklab.headlines.page import ladder_plan_line
    from blocklab.scaling.orchestrate import train_sweep

    (tmp_path / "corpus").mkdir()
    data = {"source": str(write_code_corpus(tmp_path / "corpus")), "tokenizer": "byte",
            "cache_dir": str(tmp_path / "cache")}
    ladder = read_ladder_file(ladder_file(tmp_path, train={"data": data}))
    root = tmp_path / "s" / "ladder-swept"
    line = ladder_plan_line(root, ladder, ARCHS)
    assert "not yet run" in line and "30 runs (2 architectures x 3 rungs x 2 seeds, and 18 of the " \
        "learning-rate sweep), 30 left" in line
    train_sweep(ARCHS, ladder, root, log=lambda *_: None)
    assert "18 of 30 runs finished" in ladder_plan_line(root, ladder, ARCHS)


def test_the_rounds_train_the_sweep_once_before_the_first_round(tmp_path, trained):
    from blocklab.rounds import Budget
    from blocklab.rounds.commands import scaling_rounds

    ladder = read_ladder_file(ladder_file(tmp_path))
    result, outcome = scaling_rounds(ARCHS, ladder, "ladder-swept", tmp_path, Budget(max_seeds=4),
                                     log=lambda *_: None)
    assert all("/sweep/" in run for run in trained[:18]) and not any("/sweep/" in r for r in trained[18:])
    assert [look.trained for look in outcome.looks][0] == 3 * 2 * 3  # the first round: 3 seeds, no sweep
    assert {k: s.best for k, s in result.data.sweeps.items()} == CHOSEN
    trained.clear()
    _, again = scaling_rounds(ARCHS, ladder, "ladder-swept", tmp_path, Budget(max_seeds=4),
                              log=lambda *_: None)
    assert trained == [] and [look.trained for look in again.looks] == [0] * len(outcome.looks)


def test_a_sweep_of_two_seeds_chooses_by_their_mean_loss_where_one_seed_would_choose_otherwise(
        tmp_path, trained, monkeypatch):
    """Seed-to-seed noise that favours x3 at seed 0 and disfavours it at seed 1 (d32-l2, pre-ln, whose
    optimum 1.3 makes x1 best): the sweep's first seed alone chooses x3, the mean of two chooses x1."""
    inner = store.train_claimed

    def noisy(cfg, resume, progress=None):
        summary = inner(cfg, resume, progress)
        run = Path(cfg.out_dir)
        if "/d32-l2/sweep/" in cfg.out_dir and cfg.arch == "pre-ln" and "-x3-" in run.name:
            summary["val_loss"] += -0.05 if cfg.seed == 0 else 0.05
            (run / "summary.json").write_text(json.dumps(summary))
        return summary

    monkeypatch.setattr(store, "train_claimed", noisy)
    for seeds, chosen in ((1, 3), (2, 1)):
        out = tmp_path / f"seeds{seeds}"
        out.mkdir()
        path = ladder_file(out, lr={"sweep": GRID, "steps": 5, "seeds": seeds})
        assert cli(command(path, out / "s")) == 0
        record = json.loads((out / "s" / "ladder-swept" / "scaling.json").read_text())["method"]["lr_sweep"]
        by_key = {(c["rung"], c["arch"]): c for c in record["chosen"]}
        assert by_key[("d32-l2", "pre-ln")]["factor"] == chosen
        assert record["runs"] == 18 * seeds and record["seeds"] == seeds
        assert {k: c["factor"] for k, c in by_key.items() if k != ("d32-l2", "pre-ln")} == {
            k: f for k, f in CHOSEN.items() if k != ("d32-l2", "pre-ln")}
    runs = sorted(p.parent.name for p in (tmp_path / "seeds2" / "s" / "ladder-swept" / "d32-l2" / "sweep")
                  .glob("runs/*/summary.json"))
    assert runs == sorted(f"{a}-x{f:g}-seed{s}" for a in ARCHS for f in GRID for s in (0, 1))
    report = (tmp_path / "seeds2" / "s" / "ladder-swept" / "scaling.md").read_text().replace("\n", " ")
    assert "each architecture trained 2 runs of 5 steps (seeds 0-1, otherwise as that rung's runs)" in report
    assert "whose runs ended at the lowest mean validation loss: 36 sweep runs" in report
    assert "whose 5-step runs (seeds 0-1) end at the lowest mean validation loss" in report


BAD = [
    ({"sweep": [1], "steps": 5}, "lr: sweep = [1] is not allowed: give a list of two or more factors"),
    ({"sweep": "1, 3", "steps": 5}, "lr: sweep = '1, 3' is not allowed: give a list of two or more"),
    ({"sweep": [0.5, -1], "steps": 5}, "lr: sweep factor -1 is not allowed: every factor is a positive"),
    ({"sweep": [0.5, True], "steps": 5}, "lr: sweep factor True is not allowed"),
    ({"sweep": [1, 3, 1.0], "steps": 5}, "lr: sweep factor 1 is given twice: give distinct factors"),
    ({"sweep": [1, 3]}, "lr has no steps: a sweep gives its factors"),
    ({"steps": 5}, "lr has no sweep: a sweep gives its factors"),
    ({"sweep": [1, 3], "steps": 0}, "lr: steps = 0 is not allowed: give an integer >= 1"),
    ({"sweep": [1, 3], "steps": 2.5}, "lr: steps = 2.5 is not allowed: give an integer >= 1"),
    ({"sweep": [1, 3], "steps": 21}, "lr: steps = 21 is not allowed: a sweep run is a short run, no longer "
                                     "than the ladder's 20 steps; give at most 20"),
    ({"sweep": [1, 3], "steps": 5, "seed": -1}, "lr: seed = -1 is not allowed: give an integer >= 0"),
    ({"sweep": [1, 3], "steps": 5, "seeds": 0}, "lr: seeds = 0 is not allowed: give an integer >= 1"),
    ({"sweep": [1, 3], "steps": 5, "stepz": 4}, "lr: key 'stepz' is not allowed: the keys are sweep, steps, "
                                                "seed, seeds"),
]


def test_each_mistake_in_a_sweep_is_one_line_naming_the_file_and_the_key(tmp_path, capsys):
    for k, (lr, message) in enumerate(BAD):
        (tmp_path / str(k)).mkdir()
        path = ladder_file(tmp_path / str(k), lr=lr)
        assert cli(command(path, tmp_path / "s", "--no-train")) == 2
        err = one_error_line(capsys)
        assert message in err and str(path) in err, (lr, err)
    assert not (tmp_path / "s").exists()
    ok = read_ladder_file(ladder_file(tmp_path, lr={"sweep": [3, 0.5], "steps": 20, "seed": 2}))
    assert ok.lr_sweep == LrSweep((3.0, 0.5), 20, 2) and ok.lr is None
    assert ok.lr_rule.startswith("a short sweep per rung") and "3 and 0.5" in ok.lr_rule


def test_the_docs_sweep_line_is_a_sweep_a_user_can_copy(tmp_path):
    text = (Path(__file__).resolve().parents[2] / "docs" / "scaling.md").read_text()
    line = re.search(r"sweep per rung chooses.*?```yaml\n(.*?)```", text, re.S).group(1)
    ladder = read_ladder_file(ladder_file(tmp_path, steps=400, **yaml.safe_load(line)))
    assert ladder.lr_sweep == LrSweep((0.333, 1.0, 3.0), 100, 0)


def toy_sweep_ladder(corpus: Path, cache: Path):
    """The toy ladder's shapes, a step budget of seconds and a sweep of two factors of three steps."""
    return replace(LADDERS["toy"], steps=6, eval_every=3, seeds=1, lr_sweep=LrSweep((0.5, 2.0), 3),
                   lr_rule=LrSweep((0.5, 2.0), 3).describe(),
                   train={"eval_batches": 1,
                          "data": {"source": str(corpus), "tokenizer": "byte", "cache_dir": str(cache)}})


# 12 sweep runs and 6 ladder runs really trained: about 7 s on a busy 2-core machine
def test_a_real_toy_ladder_with_a_sweep_trains_chooses_and_reports(tmp_path, monkeypatch, capsys):
    (tmp_path / "corpus").mkdir()
    corpus = write_code_corpus(tmp_path / "corpus")
    monkeypatch.setitem(LADDERS, "toy", toy_sweep_ladder(corpus, tmp_path / "cache"))
    out = tmp_path / "store"
    args = ["scaling", "--ladder", "toy", "--archs", "pre-ln,resformer", "--out", str(out), "--jobs", "1",
            "--threads", "1"]
    assert cli(args) == 0
    root = out / "ladder-toy"
    assert len(list(root.glob("*/sweep/runs/*/summary.json"))) == 3 * 2 * 2
    record = json.loads((root / "scaling.json").read_text())["method"]["lr_sweep"]
    assert len(record["chosen"]) == 6 and all(c["at_edge"] for c in record["chosen"])  # two factors: ends
    for c in record["chosen"]:
        run = root / c["rung"] / "runs" / f"{c['arch']}-seed0"
        config = yaml.safe_load((run / "config.yaml").read_text())
        losses = {float(f): v for f, v in c["losses"].items()}
        assert c["factor"] == min(losses, key=losses.get)
        assert config["optim"]["lr"] == c["factor"] * recipe_lr(c["arch"])
    capsys.readouterr()
    assert cli([*args, "--no-train"]) == 0
