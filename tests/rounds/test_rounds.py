"""Seeds until decided (blocklab.rounds): the loop's stops (decided, --max-seeds, --max-hours) with a
fake trainer and clock, its intervals' coverage when it stops as it does, each command's round with
fake runs, the flags' refusals, and one real toy ladder end to end."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from blocklab.cli import main as cli
from blocklab.rounds import Budget, Pending, pending, until_decided
from blocklab.rounds.commands import _row_pending, note_in_report, scaling_rounds
from blocklab.scaling.ladders import LADDERS, Ladder, Rung, plan
from blocklab.statistics import evidence, sequential
from blocklab.util.errors import ConfigError
from tests.helpers import write_code_corpus, write_law_run


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_rounds(undecided_until: int, seconds_per_seed: float, clock: FakeClock):
    """A trainer whose new seeds take `seconds_per_seed` each on `clock`, and a judge that leaves one claim
    undecided below `undecided_until` seeds."""
    trained: list[int] = []

    def train(n: int) -> int:
        new = n - (trained[-1] if trained else 0)
        clock.now += seconds_per_seed * new
        trained.append(n)
        return 2 * new  # two runs a seed

    def judge() -> list[Pending]:
        assert sequential.active()  # the verdicts read the sequence
        return [] if trained[-1] >= undecided_until else [Pending("claim-a", undecided_until)]

    return train, judge, trained


def test_the_rounds_add_one_seed_at_a_time_and_stop_once_decided():
    clock = FakeClock()
    train, judge, trained = fake_rounds(6, 60.0, clock)
    outcome = until_decided(3, train, judge, Budget(max_seeds=10), clock=clock, log=lambda *_: None)
    assert trained == [3, 4, 5, 6] and outcome.stopped == "decided" and outcome.seeds == 6
    assert outcome.headline() == "decided at 6 seeds"
    assert not sequential.active()  # only inside the rounds


def test_max_seeds_ends_the_rounds_and_says_what_more_would_tell():
    clock = FakeClock()
    train, judge, trained = fake_rounds(9, 60.0, clock)
    outcome = until_decided(2, train, judge, Budget(max_seeds=5), clock=clock, log=lambda *_: None)
    assert trained == [3, 4, 5]  # the first look at the fewest seeds a verdict reads
    assert outcome.headline() == ("budget ended at 5 seeds (--max-seeds 5 reached): inconclusive; "
                                  "claim-a: about 4 more seeds would tell")


def test_max_hours_starts_a_round_only_while_its_measured_time_fits():
    clock = FakeClock()
    train, judge, trained = fake_rounds(50, 600.0, clock)  # 10 minutes a seed
    # 3 seeds: 30 min; then 10 min a round: 40, 50, 60 min; a fourth round would end at 70 > 65
    outcome = until_decided(3, train, judge, Budget(max_hours=65 / 60), clock=clock, log=lambda *_: None)
    assert trained == [3, 4, 5, 6] and outcome.stopped == "max hours"
    assert "the next round, about 10.0 min, does not fit in the 5.0 min left" in outcome.headline()


def test_time_spent_before_the_rounds_counts_against_max_hours():
    """A learning-rate sweep trained before the rounds (`began`: when the call began): 40 of the 65
    minutes are gone, so after the first look (30 min) a 10-minute round no longer fits."""
    clock = FakeClock()
    clock.now = 40 * 60.0
    train, judge, trained = fake_rounds(50, 600.0, clock)
    outcome = until_decided(3, train, judge, Budget(max_hours=65 / 60), clock=clock, log=lambda *_: None,
                            began=0.0)
    assert trained == [3] and outcome.stopped == "max hours"
    assert "the next round, about 10.0 min, does not fit in the 0.0 min left" in outcome.headline()


def test_a_round_that_reused_every_run_is_no_measure_and_the_estimate_is_used():
    clock = FakeClock()
    calls = []

    def train(n: int) -> int:
        return 0  # every run reused, no time passes

    def estimate(n: int) -> float:
        calls.append(n)
        return 7200.0  # two hours a seed: no round fits in one hour

    outcome = until_decided(3, train, lambda: [Pending("c", None, "why")], Budget(max_hours=1.0), estimate,
                            clock=clock, log=lambda *_: None)
    assert calls == [4] and outcome.seeds == 3 and outcome.stopped == "max hours"
    assert outcome.headline().endswith("inconclusive; c: why")


@pytest.mark.parametrize("kwargs, message", [
    ({}, "needs a budget"), ({"max_seeds": 2}, "--max-seeds 2 is not allowed"),
    ({"max_hours": 0.0}, "positive number of hours"), ({"max_hours": math.nan}, "positive number of hours"),
    ({"max_seeds": True}, "--max-seeds True is not allowed")])
def test_a_budget_is_refused_in_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Budget(**kwargs)


def test_the_loop_covers_the_truth_when_it_stops_as_it_does():
    """The driver itself, judged on simulated paired differences: its final sequential interval covers the
    true mean in at least 95% of 2,000 experiments (the standard error is 0.005)."""
    rng = np.random.default_rng(5)
    covered = draws = 2000
    for _ in range(draws):
        truth = 0.02 * rng.standard_normal()
        diffs = rng.normal(truth, 0.02, 20)
        state = {}

        def train(n: int, state=state) -> int:
            state["n"] = n
            return 1

        def judge(state=state, diffs=diffs) -> list[Pending]:
            iv = evidence.t_interval(diffs[: state["n"]])  # the sequence: inside the rounds
            state["iv"] = iv
            verdict = evidence.verdict(iv, "lower", equivalence=evidence.NO_EFFECT_NATS)
            return [] if verdict != "inconclusive" else [pending("d", iv, evidence.NO_EFFECT_NATS)]

        until_decided(3, train, judge, Budget(max_seeds=20), log=lambda *_: None)
        iv = state["iv"]
        assert iv.method == "sequential"
        covered -= not iv.low <= truth <= iv.high
    assert covered / draws >= 0.94, covered / draws


def test_pending_reads_the_seeds_the_sequence_would_need():
    iv = sequential.interval([0.031, 0.012, 0.027, 0.019])
    p = pending("x", iv)
    assert p.seeds == sequential.seeds_to_decide(iv.mean, float(np.std(iv.values, ddof=1)), None, 5)
    assert p.seeds == 5 and p.text(4) == "x: about 1 more seed would tell"
    assert Pending("y", 9).text(4) == "y: about 5 more seeds would tell"


def test_a_compare_row_is_decided_by_its_sequence():
    decided = {"label": "sas", "diff": {"mean": -0.05, "low": -0.08, "high": -0.02, "n": 4}}
    open_row = {"label": "bov", "diff": {"mean": -0.01, "low": -0.04, "high": 0.02, "n": 4}}
    assert _row_pending({"label": "pre-ln", "diff": None}) is None and _row_pending(decided) is None
    p = _row_pending(open_row)
    assert p is not None and p.name == "bov" and p.seeds is not None and p.seeds > 4


def test_the_note_opens_the_report_and_its_record_is_written(tmp_path):
    (tmp_path / "r.md").write_text("# Title\n\n## Verdicts\n")
    (tmp_path / "r.html").write_text("<html><h1>Title</h1><h2>Verdicts</h2></html>")
    clock = FakeClock()
    train, judge, _ = fake_rounds(4, 1.0, clock)
    outcome = until_decided(3, train, judge, Budget(max_seeds=6), clock=clock, log=lambda *_: None)
    note_in_report(tmp_path / "r.md", outcome)
    md = (tmp_path / "r.md").read_text()
    assert md.startswith("# Title\n\n**Seeds until decided (at most 6 seeds): decided at 4 seeds.")
    assert "confidence sequence" in md and md.endswith("## Verdicts\n")
    assert "<h1>Title</h1><p><strong>Seeds until decided" in (tmp_path / "r.html").read_text()
    record = json.loads((tmp_path / "until_decided.json").read_text())
    assert record["stopped"] == "decided" and [look["seeds"] for look in record["looks"]] == [3, 4]
    assert [(look["trained"], look["seconds"]) for look in record["looks"]] == [(6, 3.0), (2, 1.0)]


def test_a_rerun_that_replays_the_rounds_keeps_what_the_first_call_trained(tmp_path):
    """Every run reused on the second call: its looks train nothing and take no time, and the record keeps
    the first call's runs and seconds; a look the second call trained itself is its own."""
    report = tmp_path / "r.md"
    clock = FakeClock()
    train, judge, _ = fake_rounds(5, 60.0, clock)
    report.write_text("# Title\n")
    note_in_report(report, until_decided(3, train, judge, Budget(max_seeds=4), clock=clock,
                                         log=lambda *_: None))
    first = json.loads((tmp_path / "until_decided.json").read_text())["looks"]
    assert [(look["seeds"], look["trained"], look["seconds"]) for look in first] == [(3, 6, 180.0),
                                                                                     (4, 2, 60.0)]
    replay = [3, 4]  # seeds 0-3 are finished: the second call trains seed 4 only

    def again(n: int) -> int:
        new = max(0, n - replay[-1])
        clock.now += 60.0 * new
        replay.append(max(n, replay[-1]))
        return 2 * new

    def judge_again() -> list[Pending]:
        return [] if replay[-1] >= 5 else [Pending("claim-a", 5)]

    report.write_text("# Title\n")
    note_in_report(report, until_decided(3, again, judge_again, Budget(max_seeds=6), clock=clock,
                                         log=lambda *_: None))
    looks = json.loads((tmp_path / "until_decided.json").read_text())["looks"]
    assert [(look["seeds"], look["trained"], look["seconds"]) for look in looks] == [
        (3, 6, 180.0), (4, 2, 60.0), (5, 2, 60.0)]


# -- scaling's rounds with fake runs -----------------------------------------------------------------------
def fake_train_ladder(saving: float, sd: float, rng: random.Random):
    """Writes the runs `train_ladder` would (summary.json and a validation curve), from a known law: X
    reaches the baseline's loss with `saving` fewer parameters, each seed with shared and own noise."""
    shared: dict[int, float] = {}

    def train(archs, ladder, name, out, seeds=None, launcher=None, log=print):
        for rung, entry, cfg in plan(archs, ladder, Path(out) / name, seeds):
            run = Path(cfg.out_dir)
            if (run / "summary.json").is_file():
                continue
            n = 2e5 * 2 ** [r.name for r in ladder.rungs].index(rung.name)
            scale = 1 / (1 - saving) if entry.arch != archs[0] else 1.0
            offset = shared.setdefault(cfg.seed, rng.gauss(0, sd))
            loss = 6 * (n * scale) ** -0.08 + offset + rng.gauss(0, sd)
            write_law_run(run, n, scale, offset, loss)
    return train


def test_scaling_rounds_add_whole_ladder_seeds_until_the_headlines_decide(tmp_path, monkeypatch):
    import blocklab.scaling.orchestrate as orchestrate

    monkeypatch.setattr(orchestrate, "train_ladder", fake_train_ladder(0.10, 0.01, random.Random(1)))
    ladder = replace(LADDERS["toy"], rungs=tuple(Rung(f"r{k}", {}) for k in range(4)))
    result, outcome = scaling_rounds(["pre-ln", "resformer"], ladder, "ladder-x", tmp_path,
                                     Budget(max_seeds=12), log=lambda *_: None)
    seeds = [look.seeds for look in outcome.looks]
    assert seeds == list(range(3, seeds[-1] + 1))
    assert result.seeds == list(range(outcome.seeds))  # whole ladders: every rung of every arch
    runs = sorted(p.parent.name for p in tmp_path.rglob("summary.json"))
    assert len(runs) == 2 * 4 * outcome.seeds
    verdicts = {h.claim.id: h.verdict for h in result.headlines}
    if outcome.stopped == "decided":
        assert "inconclusive" not in verdicts.values()
    else:
        assert outcome.seeds == 12 and "inconclusive" in verdicts.values()
    iv = next(h.interval for h in result.headlines if h.interval is not None)
    assert iv.method == "sequential"
    # again on the same store: every run reused, the same looks, each reading seeds 0..n-1 only
    again, replayed = scaling_rounds(["pre-ln", "resformer"], ladder, "ladder-x", tmp_path,
                                     Budget(max_seeds=12), log=lambda *_: None)
    assert [look.seeds for look in replayed.looks] == seeds and replayed.headline() == outcome.headline()
    assert [look.trained for look in replayed.looks] == [0] * len(seeds)
    first, _ = scaling_rounds(["pre-ln", "resformer"], ladder, "ladder-x", tmp_path, Budget(max_seeds=3),
                              log=lambda *_: None)
    assert first.seeds == [0, 1, 2]


def test_scaling_rounds_wait_only_for_the_claims_named(tmp_path, monkeypatch):
    import blocklab.scaling.orchestrate as orchestrate

    monkeypatch.setattr(orchestrate, "train_ladder", fake_train_ladder(0.10, 0.01, random.Random(2)))
    ladder = replace(LADDERS["toy"], rungs=tuple(Rung(f"r{k}", {}) for k in range(4)))
    both = scaling_rounds(["pre-ln", "resformer"], ladder, "a", tmp_path, Budget(max_seeds=4),
                          log=lambda *_: None)[1]
    named = scaling_rounds(["pre-ln", "resformer"], ladder, "a", tmp_path, Budget(max_seeds=4),
                           claims=["no-such-claim"], log=lambda *_: None)[1]
    assert named.stopped == "decided" and named.seeds == 3  # nothing it waits for is undecided
    assert both.seeds >= named.seeds


@pytest.mark.parametrize("command, extra, message", [
    ("scaling", ["--until-decided", "--max-seeds", "4", "--no-train"], "leave out --no-train"),
    ("scaling", ["--claims", "resformer-less-data"], "add --until-decided"),
    ("reproduce", ["--until-decided", "--max-seeds", "4", "--scale", "quick,cpu"], "give one --scale"),
    ("compare", ["--until-decided", "--max-seeds", "4", "--fresh"], "leave out --fresh"),
    ("compare", ["--max-hours", "1"], "--max-hours is a budget of --until-decided"),
])
def test_the_commands_refuse_what_the_rounds_cannot_do_in_one_line(tmp_path, capsys, command, extra, message):
    out = ["--out", str(tmp_path / "s")]
    code = cli([command, *out, *(["--ladder", "toy"] if command == "scaling" else []), *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().split("\n")) == 1
    assert not (tmp_path / "s").exists()


def toy(corpus: Path, cache: Path) -> Ladder:
    return replace(LADDERS["toy"], steps=6, eval_every=2, train={
        "eval_batches": 2, "data": {"source": str(corpus), "tokenizer": "byte", "cache_dir": str(cache)}})


@pytest.mark.slow  # a real toy ladder: 3-4 seeds x 3 rungs x 2 archs, 4.4 min on a busy 2-core machine
def test_a_real_toy_ladder_until_decided(tmp_path, monkeypatch, capsys):
    (tmp_path / "corpus").mkdir()
    corpus = write_code_corpus(tmp_path / "corpus")
    monkeypatch.setitem(LADDERS, "toy", toy(corpus, tmp_path / "cache"))
    out = tmp_path / "store"
    args = ["scaling", "--ladder", "toy", "--archs", "pre-ln,resformer", "--out", str(out), "--until-decided",
            "--max-seeds", "4", "--threads", "1"]
    assert cli(args) == 0
    printed = capsys.readouterr().out
    root = out / "ladder-toy"
    folder = root / "until-decided"  # its own folder: the fixed-seed report in root is another's
    record = json.loads((folder / "until_decided.json").read_text())
    assert record["looks"][0]["seeds"] == 3 and record["seeds"] in (3, 4)
    assert len(list(root.glob("*/runs/*/summary.json"))) == 2 * 3 * record["seeds"]
    md = (folder / "scaling.md").read_text()
    assert record["headline"] in md and "confidence sequence" in md and "until decided: " in printed
    assert not (root / "scaling.md").exists()
    assert cli(args) == 0  # again: every run reused, the same looks and report
    assert (folder / "scaling.md").read_text() == md


# -- reproduce's and compare's rounds with fake runs ------------------------------------------------------
def test_reproduce_rounds_give_each_round_one_more_seed_and_switch_off_its_own_adding(tmp_path, monkeypatch):
    import blocklab.reproduce as reproduce_module
    from blocklab.reproduce.judge import CheckResult, ClaimResult
    from blocklab.reproduce.metrics import METRICS
    from blocklab.rounds.commands import reproduce_rounds
    from blocklab.statistics.claims import CLAIMS

    claim = next(c for c in CLAIMS if len(c.checks) == 1 and c.checks[0].metric == "val_loss"
                 and c.checks[0].relation == "lower" and not c.checks[0].minus)
    check = claim.checks[0]
    diffs = np.random.default_rng(0).normal(-0.03, 0.02, 30)
    asked = []

    def fake_reproduce(claims, scale, out, train=True, log=print, launcher=None, name=None, tracking=None):
        asked.append((scale.seeds, scale.max_seeds, name))
        for seed in range(scale.seeds):  # the finished runs a real call leaves
            run = Path(out) / name / "g" / "runs" / f"a-seed{seed}"
            run.mkdir(parents=True, exist_ok=True)
            (run / "summary.json").write_text("{}")
        iv = evidence.t_interval(diffs[: scale.seeds])
        verdict = evidence.verdict(iv, check.relation, check.tolerance,
                                   equivalence=METRICS[check.metric].equivalence)
        return type("Rep", (), {"results": [ClaimResult(claim, [CheckResult(check, verdict, iv)])]})()

    monkeypatch.setattr(reproduce_module, "reproduce", fake_reproduce)
    rep, outcome = reproduce_rounds([claim], "cpu", tmp_path, Budget(max_seeds=30), log=lambda *_: None)
    first = reproduce_module.SCALES["cpu"].seeds
    assert [a[0] for a in asked] == list(range(first, outcome.seeds + 1))
    assert {a[1] for a in asked} == {None} and {a[2] for a in asked} == {"cpu"}
    assert outcome.stopped == "decided" and rep.results[0].verdict == "reproduced"
    assert rep.results[0].checks[0].interval.method == "sequential"
    assert [look.trained for look in outcome.looks] == [first] + [1] * (len(asked) - 1)


def test_compare_rounds_read_the_verdict_of_each_round(tmp_path, monkeypatch):
    import blocklab.compare as compare_module
    from blocklab.rounds.commands import compare_rounds

    diffs = np.random.default_rng(1).normal(-0.04, 0.02, 30)
    asked = []

    def fake_compare(entries, out, seeds=1, log=print, **kwargs):
        asked.append(seeds)
        iv = evidence.t_interval(diffs[:seeds])
        rows = [{"label": "pre-ln", "diff": None},
                {"label": "sas", "diff": {"mean": iv.mean, "low": iv.low, "high": iv.high, "n": iv.n}}]
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "results.json").write_text(json.dumps({"verdict": {"rows": rows}}))
        (Path(out) / "report.md").write_text("# report\n")
        return Path(out) / "report.md"

    monkeypatch.setattr(compare_module, "compare", fake_compare)
    report, outcome = compare_rounds(["pre-ln", "sas"], tmp_path, Budget(max_seeds=30), 2,
                                     log=lambda *_: None)
    assert asked == list(range(3, outcome.seeds + 1)) and outcome.stopped == "decided"
    d = json.loads((tmp_path / "results.json").read_text())["verdict"]["rows"][1]["diff"]
    assert d["high"] < 0  # decided: lower than the baseline, read on the sequence
    assert d["high"] - d["low"] > 2 * evidence.t_quantile(0.975, d["n"] - 1) * np.std(
        diffs[: d["n"]], ddof=1) / math.sqrt(d["n"])


def test_a_rounds_estimate_spreads_its_runs_over_the_launchers_jobs():
    """--max-hours' first estimate (before a round has been timed) divides the round's runs over what
    trains at once: 6 runs of 10 minutes take an hour one at a time, 20 minutes three at a time, and
    never less than the longest run; Slurm (no jobs) is counted one at a time."""
    from blocklab.launch.local import LocalLauncher
    from blocklab.rounds.commands import round_seconds, runs_at_once

    costs = [600.0] * 6
    assert round_seconds(costs, 1) == 3600.0
    assert round_seconds(costs, 3) == 1200.0
    assert round_seconds([100.0, 100.0, 1000.0], 3) == 1000.0  # the longest run bounds it
    assert round_seconds([], 2) == 0.0
    three = LocalLauncher()
    three.jobs = 3
    assert runs_at_once(three, 6) == 3 and runs_at_once(three, 0) == 1
    assert runs_at_once(None, 6) == 1 and runs_at_once(object(), 6) == 1
