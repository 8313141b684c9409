"""Scaling ladders (blocklab.scaling): the laws against scipy and a closed form, the paper's own Table 5,
the equivalences by hand, the interval's coverage on ladders drawn from a known law, and the command
end to end on a toy ladder."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy import optimize, stats

from blocklab.cli import main as cli
from blocklab.scaling.fit import (
    PowerLaw,
    Saturating,
    check_fit,
    data_equivalence,
    f_cdf,
    fit_power_law,
    fit_saturating,
    parameter_equivalence,
    tokens_to_reach,
)
from blocklab.scaling.judge import LadderData, Point, judge_ladder, read_ladder
from blocklab.scaling.ladders import LADDERS, Ladder, Rung, plan
from blocklab.scaling.orchestrate import train_ladder, train_piece
from blocklab.statistics import evidence
from blocklab.statistics.claims import HEADLINES
from tests.helpers import write_code_corpus
from timeouts import patient

# Value Residual Learning, Table 5: the validation loss averaged over SlimPajama's domains (last column).
SIZES = [82e6, 180e6, 468e6]
TRANSFORMER = [2.7389, 2.5015, 2.2806]
RESFORMER = [2.7117, 2.4692, 2.2537]


def test_table_5_gives_the_papers_ten_percent_fewer_parameters():
    """Both rows fitted with L = a N^b and read as the N' at which the Transformer reaches ResFormer's loss
    at N: 9.8%, 10.4% and 11.3% fewer parameters at 82M, 180M and 468M; the paper says 10.4%."""
    base, res = fit_power_law(SIZES, TRANSFORMER), fit_power_law(SIZES, RESFORMER)
    got = [parameter_equivalence(base, res, n) for n in SIZES]
    assert got == pytest.approx([0.0976, 0.1044, 0.1125], abs=5e-4)
    # the closed form: N' / N = (a_r / a_t)^(1/b_t) N^(b_r / b_t - 1)
    n = 180e6
    closed = (res.a / base.a) ** (1 / base.b) * n ** (res.b / base.b - 1)
    assert parameter_equivalence(base, res, n) == pytest.approx(1 - 1 / closed, rel=1e-12)


def test_the_power_law_is_scipys_least_squares_line_in_log_log():
    rng = np.random.default_rng(0)
    n = np.geomspace(1e5, 1e8, 6)
    loss = 20 * n**-0.12 * np.exp(rng.normal(0, 0.01, n.size))
    law = fit_power_law(n.tolist(), loss.tolist())
    ref = stats.linregress(np.log(n), np.log(loss))
    assert law.b == pytest.approx(ref.slope, rel=1e-10)
    assert math.log(law.a) == pytest.approx(ref.intercept, rel=1e-10)
    assert law.inverse(law(3e6)) == pytest.approx(3e6, rel=1e-10)


def test_the_saturating_law_recovers_a_known_law_and_is_no_worse_than_scipys_fit():
    n = np.geomspace(1e5, 1e8, 6)
    exact = fit_saturating(n.tolist(), (1.8 + 40 * n**-0.3).tolist())
    assert (exact.e, exact.a, exact.alpha) == pytest.approx((1.8, 40, 0.3), rel=1e-4)
    rng = np.random.default_rng(1)
    for _ in range(5):
        loss = 1.8 + 40 * n**-0.3 + rng.normal(0, 0.01, n.size)
        ours = fit_saturating(n.tolist(), loss.tolist())
        ref, _ = optimize.curve_fit(
            lambda x, e, a, al: e + a * x**-al, n, loss, p0=(1.5, 30, 0.25), maxfev=20000
        )
        sse = sum((ours(x) - y) ** 2 for x, y in zip(n, loss, strict=True))
        sse_ref = float(np.sum((ref[0] + ref[1] * n ** -ref[2] - loss) ** 2))
        assert sse <= sse_ref * (1 + 1e-6) + 1e-12
    assert Saturating(2.0, 10.0, 0.5).inverse(1.9) == math.inf  # below E: no size reaches it


@pytest.mark.parametrize("d1, d2", [(1, 4), (3, 10), (2, 12), (5, 30)])
def test_the_f_distribution_is_scipys(d1, d2):
    for x in (0.01, 0.5, 1.0, 2.3, 7.0, 40.0):
        assert f_cdf(x, d1, d2) == pytest.approx(stats.f.cdf(x, d1, d2), abs=1e-10)


def test_the_lack_of_fit_test_refuses_a_bent_ladder_and_rejects_a_true_law_about_1_percent_of_the_time():
    rng = random.Random(2)
    sizes = [1e5 * 2**k for k in range(5)]
    sd, seeds = 0.01, 3
    refused = 0
    draws = 600
    for _ in range(draws):
        runs = [[3 * n**-0.05 + rng.gauss(0, sd) for n in sizes] for _ in range(seeds)]
        means = [sum(col) / seeds for col in zip(*runs, strict=True)]
        var = sum((r[i] - means[i]) ** 2 for r in runs for i in range(5)) / (5 * (seeds - 1))
        refused += not check_fit(
            fit_power_law(sizes, means), sizes, means, var, seeds, 5 * (seeds - 1)
        ).describes
    assert refused / draws < 0.03  # REFUSE_P = 0.01; 600 draws: sd of the rate 0.4%
    bent = [3 * n**-0.05 + (0.08 if k == 2 else 0.0) for k, n in enumerate(sizes)]  # a bump at one rung
    check = check_fit(fit_power_law(sizes, bent), sizes, bent, sd**2, seeds, 10)
    hand = (sum(r * r for r in check.residuals) / 3) / (sd**2 / seeds)
    assert check.f == pytest.approx(hand) and check.p == pytest.approx(stats.f.sf(hand, 3, 10), rel=1e-6)
    assert not check.describes and check.p < 1e-4
    untestable = check_fit(fit_saturating(sizes[:3], bent[:3]), sizes[:3], bent[:3], sd**2, seeds, 6)
    assert untestable.p is None and not untestable.describes


def test_a_curve_is_read_between_evaluations_linearly_in_log_tokens():
    tokens, losses = [0, 100, 200, 400], [9.0, 5.0, 4.0, 3.0]
    assert tokens_to_reach(tokens, losses, 3.5) == pytest.approx(math.exp(math.log(200) + 0.5 * math.log(2)))
    assert tokens_to_reach(tokens, losses, 5.0) == 100
    assert tokens_to_reach(tokens, losses, 2.0) is None
    # X reaches the baseline's final 3.0 at 282.8 of 400 tokens: 29.3% fewer
    faster = [9.0, 4.0, 3.5, 2.5]
    assert data_equivalence(tokens, losses, tokens, faster) == pytest.approx(1 - 200 * math.sqrt(2) / 400)
    # X ends at 3.5 without reaching 3.0: the baseline reaches 3.5 at 282.8, so X needs 400/282.8 x
    slower = [9.0, 5.5, 4.5, 3.5]
    assert data_equivalence(tokens, losses, tokens, slower) == pytest.approx(1 - 400 / (200 * math.sqrt(2)))


# -- ladders drawn from a known law -----------------------------------------------------------------------
def synthetic_ladder(
    rng: random.Random, saving: float, data_saving: float, seeds: int, sd: float = 0.01
) -> LadderData:
    """Pre-LN follows L = 6 N^-0.08 and X the same law at N / (1 - saving): X reaches the baseline's loss
    with `saving` fewer parameters everywhere. The largest rung's curves follow L = 2.6 + 30 T^-0.35, X's
    at T / (1 - data_saving). Each seed adds a shared offset (paired seeds) and independent noise."""
    ladder = Ladder("synthetic", "tiny", tuple(Rung(f"r{k}", {}) for k in range(5)), 1, 1, 1, "none")
    sizes = [2e5 * 2**k for k in range(5)]
    tokens = [0.0] + [1e5 * k for k in range(1, 9)]
    points: dict = {}
    for s in range(seeds):
        shared = rng.gauss(0, sd)
        for arch, scale, tscale in (
            ("pre-ln", 1.0, 1.0),
            ("resformer", 1 / (1 - saving), 1 / (1 - data_saving)),
        ):
            for k, n in enumerate(sizes):
                loss = 6 * (n * scale) ** -0.08 + shared + rng.gauss(0, sd)
                curve = [
                    2.6 + 30 * max(t * tscale, 1.0) ** -0.35 + shared + rng.gauss(0, sd / 4) for t in tokens
                ]
                params = {"total": int(n), "non_embedding": int(n * 0.6)}
                points.setdefault((arch, f"r{k}"), {})[s] = Point(params, loss, tokens, curve)
    return LadderData("synthetic", ladder, ["pre-ln", "resformer"], points)


@pytest.mark.parametrize("seeds", [2, 3, 5])  # every seed count the command gives an interval at
def test_the_interval_covers_the_true_equivalence_in_about_95_percent_of_ladders(seeds):
    rng = random.Random(seeds)
    truth, data_truth = 0.10, 0.136
    draws, covered, hull_covered, data_covered = 300, 0, 0, 0
    for _ in range(draws):
        result = judge_ladder(synthetic_ladder(rng, truth, data_truth, seeds))
        eq = result.parameters[("resformer", "all")]
        if "power law" in eq.by_law:  # the true law's own interval (refused in ~2% of draws: a miss)
            iv = evidence.t_interval(eq.by_law["power law"])
            assert iv.low is not None and iv.high is not None
            covered += iv.low <= -math.log(1 - truth) <= iv.high
        # the report's interval: the hull over every admitted law, wider where the saturating law is too
        # (none where a seed's saturating fit puts X below the baseline's floor: counted a miss)
        hull = eq.interval
        hull_covered += bool(hull and hull.low is not None and hull.high is not None
                             and hull.low <= -math.log(1 - truth) <= hull.high)
        div = result.data_eq["resformer"].interval
        assert div is not None and div.low is not None and div.high is not None
        data_covered += div.low <= -math.log(1 - data_truth) <= div.high
    # 300 draws: a true 95% gives 0.92-0.98 in 97% of test runs
    assert 0.91 <= covered / draws <= 0.985, covered / draws
    assert hull_covered / draws >= 0.91, (hull_covered / draws, covered / draws)
    assert 0.91 <= data_covered / draws <= 0.985, data_covered / draws


def test_a_clear_saving_is_reproduced_and_the_paper_number_inside_is_reported():
    result = judge_ladder(synthetic_ladder(random.Random(7), 0.10, 0.136, seeds=5, sd=0.002))
    by_id = {h.claim.id: h for h in result.headlines}
    assert set(by_id) == {"resformer-fewer-parameters", "resformer-less-data"}
    assert by_id["resformer-fewer-parameters"].verdict == "reproduced"
    assert by_id["resformer-fewer-parameters"].paper_inside is True  # 10.4% against a true 10%
    assert by_id["resformer-less-data"].verdict == "reproduced"
    flat = judge_ladder(synthetic_ladder(random.Random(8), 0.0, 0.0, seeds=5, sd=0.0005))
    assert {h.claim.id: h.verdict for h in flat.headlines}["resformer-fewer-parameters"] == "no effect"


def test_a_ladder_no_law_describes_is_inconclusive_and_says_why():
    data = synthetic_ladder(random.Random(3), 0.1, 0.1, seeds=3, sd=0.001)
    for seed in range(3):  # a bump at the middle rung of both architectures: neither law describes it
        for arch in ("pre-ln", "resformer"):
            data.points[(arch, "r2")][seed].val_loss += 0.2
    result = judge_ladder(data)
    h = {h.claim.id: h for h in result.headlines}["resformer-fewer-parameters"]
    assert (
        h.verdict == "inconclusive" and "residuals beyond the seed noise" in h.text and "more rungs" in h.more
    )


def test_every_headline_names_its_paper_value_and_direction():
    for h in HEADLINES:
        assert h.direction in ("fewer", "more", "lower") and h.measure in (
            "parameters",
            "data",
            "gain across sizes",
        )
        if h.paper_value is not None:
            assert (h.paper_value > 0) == (h.direction == "fewer")


# -- the ladders and the command ----------------------------------------------------------------------------
def test_the_cpu_ladder_grows_width_and_depth_together_on_the_same_tokens():
    ladder = LADDERS["cpu"]
    runs = plan(list(ladder.archs), ladder, Path("/tmp/unused"))
    assert len(runs) == 5 * 5 * 3
    shapes = [(r.model["d_model"], r.model["n_layers"]) for r in ladder.rungs]
    assert shapes == [(64, 2), (96, 3), (128, 4), (160, 5), (192, 6)]
    tokens = {cfg.max_steps * cfg.batch_size * cfg.seq_len for *_, cfg in runs}
    assert tokens == {ladder.tokens} == {819_200}
    rates = {(cfg.arch, cfg.optim.lr) for *_, cfg in runs}
    assert len(rates) == len(ladder.archs)  # one rate per architecture, the same at every rung
    assert [cfg.seed for *_, cfg in runs[:25]] == [0] * 25  # whole seeds first
    gpu = LADDERS["gpu-resformer"]
    assert [r.name for r in gpu.rungs] == ["82m", "180m", "320m", "468m"]
    assert {cfg.optim.lr for *_, cfg in plan(list(gpu.archs), gpu, Path("/tmp/unused"))} == {6e-4}


def toy(corpus: Path, cache: Path) -> Ladder:
    return replace(
        LADDERS["toy"],
        steps=6,
        eval_every=2,
        seeds=2,
        train={
            "eval_batches": 2,
            "data": {"source": str(corpus), "tokenizer": "byte", "cache_dir": str(cache)},
        },
    )


@pytest.mark.slow  # 12-20 s of training in subprocesses: CI's slow tier runs it
def test_the_command_trains_resumes_and_rebuilds_the_report_from_the_runs(tmp_path, monkeypatch, capsys):
    (tmp_path / "corpus").mkdir()
    corpus = write_code_corpus(tmp_path / "corpus")
    monkeypatch.setitem(LADDERS, "toy", toy(corpus, tmp_path / "cache"))
    out = tmp_path / "store"
    args = ["scaling", "--ladder", "toy", "--archs", "pre-ln,resformer", "--out", str(out)]
    assert cli([*args, "--jobs", "2", "--threads", "1"]) == 0
    root = out / "ladder-toy"
    assert len(list(root.glob("*/runs/*/summary.json"))) == 2 * 3 * 2
    first = {p: p.read_bytes() for p in (root / "scaling.md", root / "scaling.json")}
    record = json.loads(first[root / "scaling.json"])
    assert [h["id"] for h in record["headlines"]] == ["resformer-fewer-parameters", "resformer-less-data"]
    assert (root / "loss_vs_params_all.png").is_file() and "<img" in (root / "scaling.html").read_text()
    assert cli(args) == 0  # again: every run reused (checked below), the same report
    assert cli([*args, "--no-train"]) == 0
    for path, content in first.items():
        assert path.read_bytes() == content
    # the runs are the ones `train_ladder` plans, and a second call trains nothing
    launch = train_ladder(["pre-ln", "resformer"], LADDERS["toy"], "ladder-toy", out)
    assert all(o.status == "reused" for o in launch.outcomes)


def test_a_piece_trains_within_its_minutes_and_leaves_the_rest(tmp_path):
    (tmp_path / "corpus").mkdir()
    corpus = write_code_corpus(tmp_path / "corpus")
    ladder = toy(corpus, tmp_path / "cache")
    clock = iter(range(0, 10_000, 7)).__next__  # each call 7 s later: a few runs fit in one minute
    trained, left = train_piece(
        ["pre-ln", "resformer"],
        ladder,
        "ladder-toy",
        tmp_path / "s",
        1.0,
        export=tmp_path / "piece.tgz",
        clock=clock,
    )
    assert 0 < len(trained) < 12 and left == 12 - len(trained)
    for run in trained:
        assert not (Path(run) / "checkpoints").exists() and (Path(run) / "trained_on.json").is_file()
    assert (tmp_path / "piece.tgz").is_file()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--ladder", "nonsense"], "ladder 'nonsense' is not allowed"),
        (["--archs", "pre-ln"], "two or more architectures"),
        (["--archs", "pre-ln,nonsense"], "nonsense"),
        (["--archs", "pre-ln,pre-ln"], "named twice"),
        (["--minutes", "nan"], "positive number of minutes"),
        (["--minutes", "0"], "positive number of minutes"),
        (["--minutes", "-5"], "positive number of minutes"),
        (["--seeds", "0"], "--seeds 0 is not allowed"),
        (["--no-train"], "no seed has finished every rung"),
    ],
)
def test_bad_input_is_one_error_line(tmp_path, capsys, extra, message):
    code = cli(["scaling", "--ladder", "toy", "--out", str(tmp_path / "s"), *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_read_ladder_pairs_runs_by_seed_and_skips_unfinished_ones(tmp_path):
    ladder = replace(LADDERS["toy"], rungs=(Rung("a", {}), Rung("b", {})))
    for rung, seed, finished in (("a", 0, True), ("a", 1, True), ("b", 0, True), ("b", 1, False)):
        run = tmp_path / rung / "runs" / f"pre-ln-seed{seed}"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text(json.dumps({"kind": "val", "tokens": 10, "val_loss": 3.0}) + "\n")
        if finished:
            (run / "summary.json").write_text(
                json.dumps({"params": {"total": 5, "non_embedding": 3}, "val_loss": 3.0})
            )
    data = read_ladder(tmp_path, ladder, ["pre-ln"], "x")
    assert data.seeds() == [0] and sorted(data.points[("pre-ln", "a")]) == [0, 1]
    assert PowerLaw(2.0, -0.1).inverse(PowerLaw(2.0, -0.1)(1e6)) == pytest.approx(1e6)


@pytest.mark.slow  # 20-35 s of compiling or a subprocess: CI's slow tier runs it
def test_gpu_session_trains_a_piece_of_a_ladder(tmp_path):
    """benchmarks/gpu_session.sh with LADDER: `blocklab scaling --minutes` in the ladder's store, its
    tarball in OUT, its log in OUT/logs.tgz (the other steps skipped)."""
    import os
    import subprocess
    import sys
    import tarfile

    out = tmp_path / "OUT"
    out.mkdir()
    env = {
        **os.environ,
        "OUT": str(out),
        "SKIP_BENCH": "1",
        "SKIP_CHECKS": "1",
        "LADDER": "toy",
        "LADDER_MIN": "0.5",
        "LADDER_OUT": str(tmp_path / "store"),
        "LOGS": str(tmp_path / "logs"),
        "PYTHON": sys.executable,
        "PYTHONPATH": str(Path(__file__).parents[2] / "src"),
    }
    done = subprocess.run(
        ["bash", "benchmarks/gpu_session.sh"],
        cwd=Path(__file__).parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=patient(300),
    )
    assert done.returncode == 0, done.stderr
    assert "== ladder: exit 0" in done.stdout, done.stdout
    with tarfile.open(out / "logs.tgz") as packed:
        log = packed.extractfile("./ladder.log").read().decode()
    assert "piece:" in log and "left" in log, log
    with tarfile.open(out / "ladder-toy.tgz") as packed:
        names = packed.getnames()
    assert all(n.startswith("ladder-toy/") for n in names) and any(n.endswith("summary.json") for n in names)


@pytest.mark.slow  # about 30 s: one Slurm-style job per run through submitit's local executor
def test_a_ladder_trains_through_the_slurm_launcher_as_in_this_process(tmp_path):
    pytest.importorskip("submitit")
    from blocklab.launch.slurm import SlurmLauncher, SlurmSettings

    (tmp_path / "corpus").mkdir()
    ladder = replace(toy(write_code_corpus(tmp_path / "corpus"), tmp_path / "cache"), seeds=1)
    settings = SlurmSettings(cluster="local", poll_s=0.2, time_min=10, folder=str(tmp_path / "slurm"))
    train_ladder(
        ["pre-ln", "resformer"], ladder, "l", tmp_path / "slurm-store", launcher=SlurmLauncher(settings)
    )
    train_ladder(["pre-ln", "resformer"], ladder, "l", tmp_path / "here")
    for summary in sorted((tmp_path / "here" / "l").glob("*/runs/*/summary.json")):
        twin = tmp_path / "slurm-store" / "l" / summary.relative_to(tmp_path / "here" / "l")
        assert json.loads(twin.read_text())["val_loss"] == json.loads(summary.read_text())["val_loss"]


def test_a_loss_below_the_baselines_floor_is_inconclusive_and_named(tmp_path):
    """X's saturating law ends below the baseline's floor E: no size of the baseline reaches X's loss, so
    the saving has no finite value; the verdict says so rather than failing, and the report renders."""
    from blocklab.scaling.report import write_scaling_report

    rng = random.Random(4)
    ladder = Ladder("floor", "tiny", tuple(Rung(f"r{k}", {}) for k in range(5)), 1, 1, 1, "none")
    sizes = [1e5 * 2**k for k in range(5)]
    tokens = [0.0, 1e5, 2e5]
    points: dict = {}
    for s in range(3):
        for arch, floor in (("pre-ln", 3.0), ("resformer", 2.0)):
            for k, n in enumerate(sizes):
                loss = floor + 300 * n**-0.5 + rng.gauss(0, 0.001)
                points.setdefault((arch, f"r{k}"), {})[s] = Point({"total": int(n), "non_embedding": int(n)},
                                                                  loss, tokens, [9.0, loss + 0.5, loss])
    result = judge_ladder(LadderData("floor", ladder, ["pre-ln", "resformer"], points))
    eq = result.parameters[("resformer", "all")]
    assert eq.law == "saturating law" and eq.interval is None and "below the floor E" in eq.why
    h = {h.claim.id: h for h in result.headlines}["resformer-fewer-parameters"]
    assert h.verdict == "inconclusive" and "no size of pre-ln reaches it" in h.text
    report = write_scaling_report(result, tmp_path).read_text()
    assert "beyond the baseline's reach" in report
