"""The claim registry, the reproduction plan, and `blocklab reproduce` end to end on a tiny scale."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from scipy import stats

from blocklab import ModelConfig
from blocklab.accounting import flops_per_token
from blocklab.cli import main
from blocklab.reproduce import FORMULAS, METRICS, SCALES, SETTINGS, Scale, plan, reproduce
from blocklab.reproduce.page import write_reproduction
from blocklab.runtime import LanguageModel
from blocklab.statistics.claims import CLAIMS, PAPERS, select
from blocklab.statistics.evidence import RELATIONS
from blocklab.training.config import NOT_RESULTS, changed_fields
from blocklab.training.metrics import read_metrics
from blocklab.util.errors import ConfigError


def test_every_claim_is_well_formed_and_its_architectures_build():
    assert len({c.id for c in CLAIMS}) == len(CLAIMS)
    assert select(quick=True), "the quick reproduction needs claims"
    for claim in CLAIMS:
        assert claim.paper in PAPERS and claim.statement and claim.paper_result and claim.checks
        for check in claim.checks:
            assert check.metric in METRICS and check.relation in RELATIONS, check
            assert check.setting in SETTINGS and check.minus_setting in (None, *SETTINGS), check
            if check.relation == "equals":
                assert check.expected in FORMULAS, check
            else:
                assert (check.baseline is None) == (check.metric == "lambda_v1_slope"), check
            if METRICS[check.metric].exact:
                assert check.relation in ("lower", "higher", "equals"), check
        for arch in claim.archs:
            for scale in ("cpu", "cpu-deep"):
                fields = {**SCALES[scale].model, "vocab_size": 4096}
                with torch.device("meta"):
                    LanguageModel(ModelConfig.from_preset(arch, SCALES[scale].size, **fields))


def test_select_by_id_and_paper_and_bad_names():
    assert [c.id for c in select(["svformer-kv-cache"])] == ["svformer-kv-cache"]
    assert {c.paper for c in select(papers=["bank-of-values"])} == {"bank-of-values"}
    with pytest.raises(ConfigError, match="Did you mean svformer-kv-cache"):
        select(["svformer-kv-cach"])
    with pytest.raises(ConfigError, match="unknown paper"):
        select(papers=["attention-is-all"])


def test_settings_keep_tokens_per_step_and_equal_flops(tmp_path):
    scale = SCALES["cpu"]
    steps, long = scale.base("steps"), scale.base("seq-long")
    assert steps["batch_size"] * steps["seq_len"] == long["batch_size"] * long["seq_len"]
    assert long["seq_len"] == 4 * steps["seq_len"] and long["max_steps"] == steps["max_steps"]
    flops = scale.base("flops")["max_flops"]
    with torch.device("meta"):  # by hand: pre-ln's FLOPs per token x tokens of `steps` steps
        fpt = flops_per_token(
            LanguageModel(ModelConfig.from_preset("pre-ln", "tiny", vocab_size=4096, context_length=128))
        )
    assert flops == pytest.approx(fpt * scale.steps * scale.batch_size * scale.seq_len, rel=1e-12)
    with pytest.raises(ConfigError, match="setting"):
        scale.base("wall-clock")


def test_reproduce_plans_the_runs_blocklab_compare_makes(tmp_path, monkeypatch):
    """One run store: `blocklab compare --out OUT/cpu/tiny-steps --seeds 5 --steps 400` trains exactly
    the runs `blocklab reproduce --scale cpu --out OUT` plans at the recipe's rates (a sweep's choice
    is an optim override on top), so neither trains them twice."""
    from blocklab import compare as compare_module

    captured = {}

    def fake_compare(entries, out, seeds, base, fresh, **_):
        captured.update(entries=entries, out=out, seeds=seeds, base=base)
        raise SystemExit(0)

    monkeypatch.setattr(compare_module, "compare", fake_compare)
    out = tmp_path / "rep"
    with pytest.raises(SystemExit):
        main(
            [
                "compare",
                "--archs",
                "pre-ln,resformer",
                "--seeds",
                "5",
                "--steps",
                "400",
                "--out",
                str(out / "cpu" / "tiny-steps"),
                "--quiet",
            ]
        )
    from_cli = compare_module.run_configs(
        captured["entries"], captured["seeds"], Path(captured["out"]), captured["base"]
    )
    planned = plan(select(["resformer-beats-pre-ln"]), SCALES["cpu"], out / "cpu")["steps"]
    assert len(planned) == len(from_cli) == 10
    for (_, a), (_, b) in zip(planned, from_cli, strict=True):
        assert a.out_dir == b.out_dir
        assert not changed_fields(a, b, NOT_RESULTS)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    words = ["def", "return", "self", "value", "import", "class", "for", "in", "range", "if", "else"]
    for i in range(40):
        idx = rng.integers(len(words), size=300)
        (root / f"f{i}.py").write_text(
            "\n".join(" ".join(words[j] for j in idx[k : k + 6]) for k in range(0, 300, 6))
        )
    return root


def tiny_scale(corpus, cache) -> Scale:
    return Scale(
        "test scale",
        "tiny",
        5,
        seeds=3,
        batch_size=4,
        seq_len=32,
        lr=3e-3,
        eval_every=5,
        timing_rounds=4,
        model={"d_model": 32, "n_layers": 4, "n_heads": 2},
        train={
            "eval_batches": 2,
            "log_every": 1,
            "data": {"source": str(corpus), "tokenizer": "byte", "cache_dir": str(cache)},
        },
    )


def test_reproduce_end_to_end(corpus, tmp_path):
    scale = tiny_scale(corpus, tmp_path / "cache")
    chosen = select(
        ["resformer-beats-pre-ln", "svformer-kv-cache", "learned-lambda-deeper", "sas-p-throughput"]
    )
    out = tmp_path / "rep"
    rep = reproduce(chosen, scale, out, log=lambda *_: None)
    results = {r.claim.id: r for r in rep.results}

    # the loss check against an independent computation from the runs' summaries, and scipy's interval
    runs = out / "custom" / "tiny-steps" / "runs"

    def summary(name, seed):
        return json.loads((runs / f"{name}-seed{seed}" / "summary.json").read_text())

    diffs = [summary("resformer", s)["val_loss"] - summary("pre-ln", s)["val_loss"] for s in range(3)]
    check = results["resformer-beats-pre-ln"].checks[0]
    assert check.interval.values == pytest.approx(diffs, rel=1e-12)
    low, high = stats.t.interval(0.95, 2, loc=np.mean(diffs), scale=stats.sem(diffs))
    assert (check.interval.low, check.interval.high) == pytest.approx((low, high), rel=1e-9)
    expected = "reproduced" if high < 0 else "contradicted" if low > 0 else (
        "no effect" if -0.02 <= low and high <= 0.02 else "inconclusive")
    assert check.verdict == expected

    # throughput: a ratio per round of the interleaved timing pass after training, never the logs
    timing = json.loads((runs.parent / "timing.json").read_text())
    assert timing["rounds"] == scale.timing_rounds and timing["steps"] == scale.timing_steps

    def round_medians(arch):
        times = timing["architectures"][arch]["step_s"]
        assert len(times) == scale.timing_rounds * scale.timing_steps
        return [float(np.median(times[r * scale.timing_steps:(r + 1) * scale.timing_steps]))
                for r in range(scale.timing_rounds)]

    ratios = [p / s - 1 for s, p in zip(round_medians("sas-p"), round_medians("pre-ln"), strict=True)]
    throughput = results["sas-p-throughput"].checks[0]
    assert throughput.interval.values == pytest.approx(ratios, rel=1e-9)
    logged = [summary("sas-p", s)["tokens_per_s"] / summary("pre-ln", s)["tokens_per_s"] - 1
              for s in range(3)]
    assert throughput.interval.values[:3] != pytest.approx(logged)

    # SVFormer's cache by hand: pre-ln keeps K and V in all L layers, SVFormer K in all and V once
    kv = results["svformer-kv-cache"].checks[0]
    assert kv.value == pytest.approx((4 + 1) / (2 * 4)) and kv.verdict == "reproduced"

    # the lambda slope against numpy's least-squares fit of the last logged lambda_1 per layer
    lam_run = runs / "resformer-learnable-seed1"
    last = [r for r in read_metrics(lam_run / "metrics.jsonl", "train")][-1]["scalars"]
    layers = sorted(int(k.split(".")[1]) for k in last if k.endswith("attn.values.lambda1"))
    ys = [last[f"blocks.{n}.attn.values.lambda1"][0] for n in layers]
    slope = results["learned-lambda-deeper"].checks[0].interval.values[1]
    assert slope == pytest.approx(np.polyfit(layers, ys, 1)[0], rel=1e-9, abs=1e-12)
    assert len(set(ys)) > 1, "trained lambdas should have moved away from their init"

    # the report: a verdict per claim, intervals, figures
    md = write_reproduction(rep, out).read_text()
    # the optimiser the runs trained with: the tiny recipe's Muon, with the scale's own AdamW rate, so
    # not the main job's recipe
    assert "Optimiser: Muon for the block matrices (lr 0.06" in md and "peak lr 0.003." in md
    for r in rep.results:
        assert f"## {r.claim.id}: {r.verdict}" in md
    assert f"[{check.interval.low:+.4f}, {check.interval.high:+.4f}]" in md
    assert "t-interval" in md and (out / "reproduction.html").is_file()
    saved = json.loads((out / "reproduction.json").read_text())
    assert [c["verdict"] for c in saved["claims"]] == [r.verdict for r in rep.results]
    for png in (out / "custom-figures").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # a second call trains nothing: every run is reused from the store
    messages = []
    again = reproduce(chosen, scale, out, log=messages.append)
    trained = [m for m in messages if m.endswith(": training")]
    assert not trained and any("reused" in m for m in messages)
    assert not any("timing" in m for m in messages), "a group timed once is not timed again"
    assert [r.verdict for r in again.results] == [r.verdict for r in rep.results]
    # a run's logged speed never feeds the claim: not even a resumed run's, whose summary mixes starts
    sas_p0 = runs / "sas-p-seed0" / "summary.json"
    resumed = {**json.loads(sas_p0.read_text()), "tokens_per_s": 657.0, "resumed_at": [3]}
    sas_p0.write_text(json.dumps(resumed))
    read_back = reproduce(chosen, scale, out, train=False, log=lambda *_: None)
    assert {r.claim.id: r.checks[0].interval.values for r in read_back.results if r.checks[0].interval} == {
        r.claim.id: r.checks[0].interval.values for r in rep.results if r.checks[0].interval}
    assert "## Throughput" in md and "4 rounds x 3 steps" in md


def test_deep_entropy_reads_the_deeper_half(corpus, tmp_path, monkeypatch):
    from blocklab import reproduce as reproduce_module
    from blocklab.analysis import run as run_module

    monkeypatch.setattr(
        run_module,
        "diagnose_run",
        lambda run, batches, batch_size: {"entropy": {"mean": [9.0, 9.0, 1.0, 2.0, 6.0]}},
    )
    monkeypatch.setattr("blocklab.analysis.diagnose_run", run_module.diagnose_run)
    (tmp_path / "run").mkdir()
    assert reproduce_module.deep_entropy(tmp_path / "run") == pytest.approx(3.0)  # layers 2, 3, 4
    saved = json.loads((tmp_path / "run" / "reproduce_metrics.json").read_text())
    assert saved == {"deep_entropy": 3.0}


def test_a_finished_run_of_small_files_reads_a_weight_metric_as_not_yet_measured(tmp_path):
    """A store of small files (summary.json, no checkpoint): a metric read from the weights is NotFinished
    (so --partial reads its claim pending) until reproduce_metrics.json keeps it; a loss reads as ever."""
    from blocklab.compare import Entry
    from blocklab.reproduce import Measurements, NotFinished
    from blocklab.training import TrainConfig

    run = tmp_path / "runs" / "resformer-seed0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"val_loss": 4.25}))
    cfg = TrainConfig.from_dict({"arch": "resformer", "out_dir": str(run), "max_steps": 10})
    measured = Measurements({"steps": [(Entry.parse("resformer"), cfg)]})
    assert measured.per_seed("val_loss", "steps", "resformer") == {0: 4.25}
    with pytest.raises(NotFinished, match="its deep_entropy is read from its weights, and the run keeps "
                                          "neither the value"):
        measured.per_seed("deep_entropy", "steps", "resformer")
    (run / "reproduce_metrics.json").write_text(json.dumps({"deep_entropy": 2.5}))
    assert measured.per_seed("deep_entropy", "steps", "resformer") == {0: 2.5}


def test_cli_reproduce_lists_and_rejects(capsys):
    assert main(["reproduce", "--list", "--paper", "simplifying"]) == 0
    printed = capsys.readouterr().out
    assert "sas-matches-pre-ln" in printed and "resformer-beats" not in printed and "scales:" in printed
    assert main(["reproduce", "--claims", "resformer-beats-pre-l"]) == 2
    assert "Did you mean resformer-beats-pre-ln" in capsys.readouterr().err
    assert main(["reproduce", "--claims", "svformer-kv-cache", "--scale", "huge"]) == 2
    assert "scale 'huge' is not allowed" in capsys.readouterr().err


def test_no_train_names_the_missing_run(corpus, tmp_path):
    with pytest.raises(ConfigError, match="has not finished training.*without --no-train"):
        reproduce(
            select(["resformer-beats-pre-ln"]),
            tiny_scale(corpus, tmp_path / "c"),
            tmp_path / "none",
            train=False,
        )


def test_cli_quick_runs_the_quick_claims(corpus, tmp_path, monkeypatch, capsys):
    from blocklab import reproduce as reproduce_module

    caveat = reproduce_module.SCALES["quick"].caveat
    scale = replace(tiny_scale(corpus, tmp_path / "cache"), caveat=caveat)
    monkeypatch.setitem(reproduce_module.SCALES, "quick", scale)
    out = tmp_path / "rep"
    assert main(["reproduce", "--quick", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    md = (out / "reproduction.md").read_text()
    for claim in select(quick=True):
        assert f"## {claim.id}: " in md and claim.id in printed
        # the terminal's verdict line carries the scope the report gives it, the quick caveat included
        line = next(line for line in printed.splitlines() if f" {claim.id} " in line)
        scope = line.split("(", 1)[1].rstrip(")")
        assert f"*Scope of this verdict:* {scope}." in md
        assert caveat in scope and "size tiny at 4 layers, d 32, 0.00064M tokens" in scope
        if claim.id == "resformer-beats-pre-ln":
            assert "3 seeds" in scope
    assert not (set(c.id for c in CLAIMS) - set(c.id for c in select(quick=True))) & set(
        line.split(": ")[0][3:] for line in md.splitlines() if line.startswith("## "))


@pytest.mark.slow
def test_real_quick_reproduction(tmp_path):
    """The real `blocklab reproduce --quick` on the embedded corpus (about 10 minutes on 2 cores)."""
    out = tmp_path / "rep"
    assert main(["reproduce", "--quick", "--out", str(out)]) == 0
    saved = json.loads((out / "reproduction.json").read_text())
    assert [c["claim"] for c in saved["claims"]] == [c.id for c in select(quick=True)]
    quick = SCALES["quick"]
    for claim in saved["claims"]:
        for check in claim["checks"]:
            assert check["verdict"] in ("reproduced", "contradicted", "no effect", "inconclusive")
            if "values" in check:  # one per seed; a throughput check's, one per round of its timing pass
                n = quick.timing_rounds if check["metric"] == "tokens_per_s" else quick.seeds
                assert len(check["values"]) == n and check["low"] <= check["mean"] <= check["high"]


def test_sweep_combination_seeds_and_exact_regeneration(corpus, tmp_path, monkeypatch):
    """A scale with a learning-rate sweep, a combination claim and two scales through the CLI: each arch
    trains at the rates of its lowest sweep loss, the interaction check is (A+B - A) - (B - pre-ln) from
    the runs' summaries, every launch is logged, and `--no-train` rebuilds the reports byte for byte."""
    from dataclasses import replace

    from blocklab import reproduce as reproduce_module

    base = replace(tiny_scale(corpus, tmp_path / "cache"), steps=3, eval_every=3, lr=None,
                   model={"d_model": 32, "n_layers": 3, "n_heads": 2}, lr_sweep=(0.5, 1.0), sweep_steps=2)
    monkeypatch.setitem(reproduce_module.SCALES, "t3", base)
    monkeypatch.setitem(reproduce_module.SCALES, "t4", replace(base, model={**base.model, "n_layers": 4}))
    out = tmp_path / "rep"
    cli = ["reproduce", "--scale", "t3,t4", "--claims", "sas-p-with-resformer", "--out", str(out)]
    assert main([*cli, "--jobs", "1"]) == 0

    root = out / "t3"
    sweep = root / "tiny-lr-sweep" / "runs"

    def group(arch):  # the equal-FLOPs budget is pre-ln's in the scale's steps: its runs are the steps runs
        return root / ("tiny-steps" if arch == "pre-ln" else "tiny-flops")

    assert not (root / "tiny-flops" / "runs" / "pre-ln-seed0").exists(), "pre-ln trained twice"
    for arch in ("pre-ln", "sas-p", "resformer", "sas-p+resformer"):
        losses = {f: json.loads((sweep / f"{arch}-lrx{f:g}-seed0" / "summary.json").read_text())["val_loss"]
                  for f in (0.5, 1.0)}
        best = min(losses, key=losses.get)
        # the recipe's tiny rates (recipes/main_job_optim.json) times the chosen factor
        for f in (0.5, 1.0):
            optim = yaml.safe_load((sweep / f"{arch}-lrx{f:g}-seed0" / "config.yaml").read_text())["optim"]
            assert (optim["lr"], optim["muon_lr"]) == pytest.approx((0.03 * f, 0.06 * f))
        run = group(arch) / "runs" / f"{arch}-seed0"
        optim = yaml.safe_load((run / "config.yaml").read_text())["optim"]
        assert (optim["lr"], optim["muon_lr"]) == pytest.approx((0.03 * best, 0.06 * best))

    def loss(arch, seed):
        return json.loads((group(arch) / "runs" / f"{arch}-seed{seed}" / "summary.json").read_text())[
            "val_loss"]

    saved = json.loads((root / "reproduction.json").read_text())
    interaction = saved["claims"][0]["checks"][2]
    by_hand = [(loss("sas-p+resformer", s) - loss("sas-p", s)) - (loss("resformer", s) - loss("pre-ln", s))
               for s in range(len(interaction["values"]))]
    assert interaction["values"] == pytest.approx(by_hand, rel=1e-9, abs=1e-12)
    assert set(saved["sweep"]) == {"pre-ln", "sas-p", "resformer", "sas-p+resformer"}

    launches = [json.loads(line) for line in (root / "campaign.jsonl").read_text().splitlines()]
    assert [r["trained"] for r in launches][:2] == [8, 12]  # the sweep, then 3 seeds of 4 archs
    summary = out / "REPRODUCTION.md"
    text = summary.read_text()
    assert "--no-train" in text and "Do the papers' gains add up? (`t4`)" in text
    assert "t3/reproduction.md" in text and "runs trained in" in text
    before = {p: p.read_bytes() for p in (summary, root / "reproduction.md", root / "reproduction.json")}
    (out / "notes.md").write_text("## Reading it\n\nHand-written notes, kept with the data.\n")
    assert main([*cli, "--no-train"]) == 0
    after = summary.read_text()
    assert after.endswith("Hand-written notes, kept with the data.\n") and after.startswith(text.rstrip("\n"))
    for path, content in before.items():
        if path != summary:
            assert path.read_bytes() == content, path

    # a campaign under way: without one run, --no-train stops and names --partial; with it, the claim
    # that reads the run is pending in the reports while the rest are judged
    (root / "tiny-flops" / "runs" / "sas-p-seed2" / "summary.json").unlink()
    assert main([*cli, "--no-train"]) == 2
    assert main([*cli, "--no-train", "--partial"]) == 0
    saved = json.loads((root / "reproduction.json").read_text())
    assert [c["verdict"] for c in saved["claims"]] == ["pending"]
    page = summary.read_text()
    # the page's scale column says how far the runs have got: the sweep's 8 and 12 claim runs, one missing
    assert "--partial" in page and "| partial: 19 of 20 runs |" in page and "1 pending of 1 claims" in page
    assert "19 of the 20 runs planned so far have finished" in page
    assert json.loads((out / "t4" / "reproduction.json").read_text())["claims"][0]["verdict"] != "pending"


def test_added_seeds_of_the_shared_baseline_are_judged_as_no_train_judges_them(corpus, tmp_path, monkeypatch):
    """The equal-FLOPs baseline reads the equal-steps runs (`run_group`). When undecided checks give
    pre-ln more seeds at `steps` and the combination's other archs more at `flops`, the training call
    judges the interaction on every seed trained, as `--no-train` on the store it leaves does: the two
    reports are the same bytes. (The training call once judged the flops checks on the baseline's
    first seeds only, while `--no-train` read them all.)"""
    from blocklab import reproduce as reproduce_module
    from blocklab.reproduce import orchestrate

    scale = replace(tiny_scale(corpus, tmp_path / "cache"), steps=3, eval_every=3, timing_rounds=0,
                    model={"d_model": 32, "n_layers": 2, "n_heads": 2}, seeds=2, max_seeds=3)
    monkeypatch.setitem(reproduce_module.SCALES, "t2", scale)
    calls = []

    def one_round_more(results, seeds, scale):  # stands in for undecided checks, once
        calls.append(dict(seeds))
        if len(calls) > 1:
            return {}
        combination = ("sas-p", "resformer", "sas-p+resformer")
        return {("steps", "pre-ln"): 3, **{("flops", a): 3 for a in combination}}

    monkeypatch.setattr(orchestrate, "more_seeds", one_round_more)
    out = tmp_path / "rep"
    cli = ["reproduce", "--scale", "t2", "--claims", "resformer-beats-pre-ln,sas-p-with-resformer",
           "--out", str(out)]
    assert main([*cli, "--jobs", "1"]) == 0
    root = out / "t2"
    assert calls[1][("flops", "pre-ln")] == 3, "pre-ln's seeds added at steps count at flops too"
    assert (root / "tiny-steps" / "runs" / "pre-ln-seed2" / "summary.json").is_file()

    def loss(group, arch, seed):
        run = root / group / "runs" / f"{arch}-seed{seed}"
        return json.loads((run / "summary.json").read_text())["val_loss"]

    saved = json.loads((out / "reproduction.json").read_text())  # one scale: its report in OUT
    combo = next(c for c in saved["claims"] if c["claim"] == "sas-p-with-resformer")
    by_hand = [(loss("tiny-flops", "sas-p+resformer", s) - loss("tiny-flops", "sas-p", s))
               - (loss("tiny-flops", "resformer", s) - loss("tiny-steps", "pre-ln", s)) for s in range(3)]
    assert combo["checks"][2]["values"] == pytest.approx(by_hand, rel=1e-9, abs=1e-12)
    before = {p: p.read_bytes() for p in (out / "reproduction.md", out / "reproduction.json")}
    assert main([*cli, "--no-train"]) == 0
    for path, content in before.items():
        assert path.read_bytes() == content, path


def test_undecided_checks_get_more_seeds_up_to_the_most():
    from dataclasses import replace

    from blocklab.reproduce import CheckResult, ClaimResult, more_seeds
    from blocklab.statistics.claims import Check, Claim
    from blocklab.statistics.evidence import t_interval

    scale = Scale("s", "tiny", 5, seeds=5, max_seeds=10)

    def result(arch, values, verdict):
        check = Check("val_loss", arch, "pre-ln", "lower")
        return ClaimResult(Claim(arch, "value-residual", "-", "-", "-", "steps", (check,)),
                           [CheckResult(check, verdict, t_interval(values))])

    wide = result("resformer", [0.1, -0.2, 0.15, -0.1, 0.05], "inconclusive")  # half-width > 0.01
    narrow = result("svformer", [0.001, -0.002, 0.0015, -0.001, 0.0005], "inconclusive")  # below 0.01
    decided = result("sas", [-0.3, -0.31, -0.29, -0.3, -0.32], "reproduced")
    seeds = {("steps", a): 5 for a in ("pre-ln", "resformer", "svformer", "sas")}
    assert more_seeds([wide, narrow, decided], seeds, scale) == {("steps", "resformer"): 10,
                                                                  ("steps", "pre-ln"): 10}
    at_most = {**seeds, ("steps", "resformer"): 10, ("steps", "pre-ln"): 10}
    ten = result("resformer", [0.1, -0.2] * 5, "inconclusive")
    assert more_seeds([ten], at_most, scale) == {}  # max_seeds reached
    assert more_seeds([wide], seeds, replace(scale, max_seeds=None)) == {}


def test_campaign_text_names_the_gpu_that_trained(tmp_path):
    """The method paragraph says what trained the runs: a launch on a GPU names the card (read from
    campaign.jsonl), one on the CPU names none."""
    from blocklab.reproduce.page import campaign_text

    base = {"date": "2026-11-26 05:46 UTC", "commit": "abc1234", "cpu": "Xeon", "cores": 16,
            "torch": "2.11.0", "launcher": "local", "jobs": 1, "threads": None, "wall_seconds": 3600.0,
            "trained": 6, "reused": 0}
    lines = [dict(base, gpu="NVIDIA H200"), dict(base, cpu="EPYC", cores=2, torch="2.13.0")]
    (tmp_path / "campaign.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    text = campaign_text(tmp_path)
    assert "on Xeon, 16 cores, NVIDIA H200, torch 2.11.0; EPYC, 2 cores, torch 2.13.0;" in text
    assert text.startswith("12 runs trained in 2 launch(es)") and "2.0 hours" in text
