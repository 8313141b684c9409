"""The gpu-mid campaign: its scale, the budgeted pieces (`blocklab.reproduce.budgeted_launch`,
`benchmarks/gpu_campaign.py next`), their estimates, the export a GPU call sends back, and the
reproduction page's scale column, end to end at a toy size on the CPU."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from scipy import stats

from blocklab import ModelConfig
from blocklab.cli import main as cli
from blocklab.launch.store import Outcome
from blocklab.reproduce import SCALES, needed_archs, plan, sweep_plan, unique_runs
from blocklab.reproduce.budgeted_launch import BudgetLauncher
from blocklab.reproduce.estimate import PRIOR, TRAINED_ON, Estimator, run_steps
from blocklab.reproduce.page_scales import NOT_YET_RUN, reading, verdict_rows
from blocklab.runtime import LanguageModel
from blocklab.statistics.claims import select
from blocklab.statistics.evidence import t_interval, welch_interval
from blocklab.training import TrainConfig
from tests.helpers import write_code_corpus

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_campaign  # noqa: E402
from timeouts import patient  # noqa: E402

CLAIMS = "resformer-beats-pre-ln,resformer-deep-entropy"  # two archs: a sweep of 6 runs, 6 claim runs


def test_gpu_mid_is_the_cpu_recipe_at_29m_parameters_and_4_passes_over_the_corpus():
    scale = SCALES["gpu-mid"]
    d, layers, vocab = 512, 8, 8192
    cfg = ModelConfig.from_preset("pre-ln", scale.size, **scale.model, vocab_size=vocab, context_length=512)
    with torch.device("meta"):
        params = sum(p.numel() for p in LanguageModel(cfg).parameters())
    # by hand: tied embedding, per layer Q, K, V, O (4 d^2), a ReLU MLP of 4d (8 d^2) and two norms
    assert params == vocab * d + layers * (12 * d * d + 2 * d) + d == 29_368_832
    assert (cfg.mlp_act, cfg.positions, cfg.norm, cfg.tie_embeddings) == ("relu", "rope", "rmsnorm", True)
    tokens = scale.steps * scale.batch_size * scale.seq_len
    assert tokens == 9_830_400
    from blocklab.data import DataConfig, prepare_data

    train_tokens = len(prepare_data(DataConfig(vocab_size=8192)).train)
    assert 3.9 < tokens / train_tokens < 4.1  # "4 passes over the embedded corpus"
    # every architecture of every claim builds at this shape, the 4x longer sequence included
    claims = select()
    for setting, archs in needed_archs(claims).items():
        seq = 4 * scale.seq_len if setting == "seq-long" else scale.seq_len
        for arch in archs:
            with torch.device("meta"):
                LanguageModel(ModelConfig.from_preset(arch, scale.size, **scale.model, vocab_size=vocab,
                                                    context_length=seq))
    # the plan: 16 architectures swept at 3 rates, 21 (setting, arch) pairs at 3 seeds
    out = Path("unused") / "gpu-mid"
    archs = list(dict.fromkeys(a for group in needed_archs(claims).values() for a in group))
    assert len(sweep_plan(archs, scale, out)) == 16 * 3
    runs = unique_runs(plan(claims, scale, out))
    assert len(runs) == 21 * 3 and {cfg.ckpt_every for _, cfg in runs} == {200}


def _configs(tmp_path: Path, n: int) -> list[tuple[None, TrainConfig]]:
    return [(None, TrainConfig(max_steps=1, out_dir=str(tmp_path / "runs" / f"r{k}"), progress=False))
            for k in range(n)]


def test_budget_launcher_stops_at_the_first_run_that_does_not_fit(tmp_path, monkeypatch):
    """Runs start in order while the estimate of the next fits in what is left; the first that does
    not and every later one are pending, even a shorter one (the sweep comes first)."""
    import blocklab.launch.store as store

    now = [0.0]
    took = {"r0": 3.0, "r1": 4.0, "r2": 1.0, "r3": 0.5}

    def fake_train(cfg, progress=None):  # noqa: ARG001
        now[0] += took[Path(cfg.out_dir).name]
        return Outcome(cfg, "trained")

    monkeypatch.setattr(store, "train_run", fake_train)
    estimates = {"r0": 3.0, "r1": 3.0, "r2": 3.0, "r3": 0.5}
    finished = []
    launcher = BudgetLauncher(8.0, lambda cfg: estimates[Path(cfg.out_dir).name],
                              after=lambda cfg, started: finished.append((Path(cfg.out_dir).name, started)),
                              clock=lambda: now[0])
    logs = []
    launch = launcher.train(_configs(tmp_path, 4), logs.append)
    # r0 at 0 (3 <= 8), r1 at 3 (3 <= 5, took 4), r2 at 7: 3 > 1 left, so r2 and r3 wait
    assert finished == [("r0", 0.0), ("r1", 3.0)]
    assert [Path(p).name for p in launch.pending] == ["r2", "r3"]
    assert [o.status for o in launch.outcomes] == ["trained", "trained"]
    assert launcher.out_of_time and any("2 run(s) of this launch left" in line for line in logs)
    with pytest.raises(Exception, match="not finished yet"):
        launch.raise_if_pending("reproduce", "judge the claims")


def test_estimator_measures_the_store_and_counts_a_cut_off_runs_checkpoint(tmp_path):
    from blocklab.accounting import flops_per_token
    from blocklab.data import prepare_data

    (tmp_path / "corpus").mkdir()
    data = {"source": str(write_code_corpus(tmp_path / "corpus")), "tokenizer": "byte",
            "cache_dir": str(tmp_path / "c")}
    cfg = TrainConfig(max_steps=10, batch_size=2, seq_len=16, out_dir=str(tmp_path / "g" / "runs" / "new"),
                      model={"d_model": 32, "n_layers": 2, "n_heads": 2}, data=data, progress=False)
    steps, fpt = run_steps(cfg)
    with torch.device("meta"):
        model = LanguageModel(cfg.model_config(prepare_data(cfg.data).tokenizer.vocab_size))
    assert fpt == flops_per_token(model) and steps == 10
    # an equal-FLOPs budget: the steps it buys, rounded up
    assert run_steps(replace(cfg, max_steps=None, max_flops=fpt * 32 * 6.5))[0] == 7
    prior = Estimator(tmp_path, "NVIDIA H100 80GB HBM3")
    rate, overhead = PRIOR["gpu"]
    assert prior.seconds(cfg) == pytest.approx(overhead + 10 * 32 * fpt / rate)
    # two finished runs on this GPU: rate = sum of FLOPs / sum of training seconds, overhead = median of
    # wall - training seconds; a resumed run and one from another GPU do not count
    for name, flops, train, wall, device, resumed in [("a", 4e12, 2.0, 5.0, "NVIDIA H100 80GB HBM3", []),
                                                      ("b", 8e12, 6.0, 7.0, "NVIDIA H100 80GB HBM3", []),
                                                      ("c", 1e12, 9.0, 99.0, "NVIDIA H100 80GB HBM3", [5]),
                                                      ("d", 1e12, 9.0, 99.0, "NVIDIA H200", [])]:
        run = tmp_path / "g" / "runs" / name
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"flops": flops, "train_time": train}))
        record = {"device": device, "wall_seconds": wall, "resumed_at": resumed}
        (run / TRAINED_ON).write_text(json.dumps(record))
    measured = Estimator(tmp_path, "NVIDIA H100 80GB HBM3")
    assert measured.rate == pytest.approx(12e12 / 8.0) and measured.overhead == pytest.approx(2.0)
    assert "measured on 2 finished run(s)" in measured.source
    # a cut-off run: what follows its newest checkpoint (step 4 of 10)
    (Path(cfg.out_dir) / "checkpoints" / "step_000004").mkdir(parents=True)
    (Path(cfg.out_dir) / "checkpoints" / "step_000004" / "state.json").write_text("{}")
    assert measured.seconds(cfg) == pytest.approx(2.0 + 6 * 32 * fpt / (12e12 / 8.0))
    # another GPU: the runs of any GPU, here a and b and d
    other = Estimator(tmp_path, "NVIDIA A100")
    assert other.rate == pytest.approx(13e12 / 17.0)


def test_a_cut_off_run_that_lost_its_config_starts_again(tmp_path):
    """A copy of the tree that refreshed the committed files may leave a cut-off run's checkpoints (ignored
    by git) without its config.yaml: such a run cannot resume, so the piece removes it; a run with its
    config, or finished, stays."""
    from blocklab.reproduce.budgeted_launch import drop_orphans

    runs = tmp_path / "gpu-mid" / "small-steps" / "runs"
    for name, files in [("lost", ["checkpoints/step_000200/state.json"]),
                        ("cut", ["config.yaml", "checkpoints/step_000200/state.json"]),
                        ("done", ["summary.json"])]:
        for f in files:
            (runs / name / f).parent.mkdir(parents=True, exist_ok=True)
            (runs / name / f).write_text("{}")
    assert drop_orphans(tmp_path / "gpu-mid", lambda *_: None) == [runs / "lost"]
    assert sorted(p.name for p in runs.iterdir()) == ["cut", "done"]


def test_welch_interval_and_reading_against_scipy():
    rng = np.random.default_rng(1)
    a, b = rng.normal(-0.05, 0.01, 5), rng.normal(-0.01, 0.02, 10)
    diff, low, high = welch_interval(list(a), list(b))
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert (diff, low, high) == pytest.approx((a.mean() - b.mean(), ci.low, ci.high), rel=1e-6)
    small, large = t_interval(list(b)), t_interval(list(a))
    grows = reading([("cpu", small), ("gpu-mid", large)])
    assert grows.startswith("From `cpu` to `gpu-mid` it grows: change ")
    assert "it shrinks" in reading([("cpu", large), ("gpu-mid", small)])
    assert "changes sign" in reading([("cpu", t_interval([-x for x in b])), ("gpu-mid", large)])
    assert "no change is shown" in reading([("cpu", large), ("gpu-mid", t_interval(list(a + 0.001)))])
    assert reading([("cpu", large)]) == "Measured at `cpu` only so far."


def _toy(tmp_path: Path, monkeypatch):
    """gpu-mid at gpu_campaign.py's toy size on the CPU, in place of the real one."""
    (tmp_path / "corpus").mkdir()
    corpus = write_code_corpus(tmp_path / "corpus")
    scale = gpu_campaign.smoke_scale(SCALES["gpu-mid"], argparse.Namespace(data=corpus, device="cpu"))
    data = {**scale.train["data"], "cache_dir": str(tmp_path / "c")}
    scale = replace(scale, train={**scale.train, "data": data})
    monkeypatch.setitem(SCALES, "gpu-mid", scale)
    return scale


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_campaign_in_pieces_end_to_end(tmp_path, monkeypatch, capsys):
    """Sweep, claims' runs, more seeds, in pieces: a piece too short trains nothing, a cut-off run resumes
    from its checkpoint in the next piece, every finished run says what trained it and keeps no
    weights, the export unpacked into another store gives the page its gpu-mid column, and the page
    is rebuilt byte for byte."""
    from blocklab.training import checkpoint

    scale = _toy(tmp_path, monkeypatch)
    out, tgz = tmp_path / "store", tmp_path / "OUT" / "gpu-mid.tgz"
    args = ["--out", str(out), "--claims", CLAIMS, "--export", str(tgz)]
    root = out / "gpu-mid"

    # 1. a piece shorter than any run: nothing trains, the page says "not yet run"
    lines = gpu_campaign.main(["next", "--minutes", "0.0001", *args])
    assert lines[0].startswith("piece: trained 0 runs")
    assert any(line.startswith("remaining: 12 runs") for line in lines)
    assert not list(out.rglob("summary.json"))
    from blocklab.reproduce import reproduce

    empty = reproduce(select(CLAIMS.split(",")), "gpu-mid", out, train=False, partial=True)
    assert [row[-1] for row in verdict_rows([empty])] == [NOT_YET_RUN, NOT_YET_RUN]

    # 2. a piece cut off (as a call's time limit would) after the first checkpoint of resformer-seed1
    cut = root / "small-steps" / "runs" / "resformer-seed1"
    save = checkpoint.save_checkpoint

    def save_then_stop(run_dir, *a, **kw):
        path = save(run_dir, *a, **kw)
        if Path(run_dir) == cut:
            raise KeyboardInterrupt
        return path

    monkeypatch.setattr(checkpoint, "save_checkpoint", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        gpu_campaign.main(["next", "--minutes", "30", *args])
    monkeypatch.setattr(checkpoint, "save_checkpoint", save)
    assert not (cut / "summary.json").is_file() and checkpoint.latest_checkpoint(cut).name == "step_000002"
    done = sorted(p.parent for p in root.rglob("summary.json"))
    assert len(done) == 6 + 3 + 1  # the sweep, pre-ln's 3 seeds and resformer-seed0
    with tarfile.open(tgz) as tar:  # the export holds the finished runs only
        exported = {Path(n).parent for n in tar.getnames() if n.endswith("summary.json")}
    assert exported == {Path("gpu-mid") / p.relative_to(root) for p in done}
    partial = reproduce(select(CLAIMS.split(",")), "gpu-mid", out, train=False, partial=True)
    assert [row[-1] for row in verdict_rows([partial])] == [f"partial: {len(done)} of 12 runs"] * 2
    capsys.readouterr()

    # 3. the next piece resumes it at step 2 and finishes the campaign
    lines = gpu_campaign.main(["next", "--minutes", "30", *args])
    printed = capsys.readouterr().out
    assert "resformer-seed1: resuming" in printed
    assert _summary(cut)["resumed_at"] == [2]
    assert json.loads((cut / TRAINED_ON).read_text())["resumed_at"] == [2]
    assert lines[-2].startswith("remaining: nothing") and not list(out.rglob("checkpoints"))
    verdicts = {line.split(": ")[1]: line.split(": ")[2] for line in lines if line.startswith("gpu-mid: ")}
    assert set(verdicts) == set(CLAIMS.split(","))

    # the sweep chose per architecture: its runs train at the recipe's rates times the best factor
    for arch in ("pre-ln", "resformer"):
        losses = {f: _summary(root / "small-lr-sweep" / "runs" / f"{arch}-lrx{f:.3g}-seed0")["val_loss"]
                  for f in scale.lr_sweep}
        best = min(losses, key=losses.get)
        config = root / "small-steps" / "runs" / f"{arch}-seed0" / "config.yaml"
        optim = yaml.safe_load(config.read_text())["optim"]
        expected = (float(f"{0.03 * best:.3g}"), float(f"{0.06 * best:.3g}"))  # the tiny/small recipe
        assert (optim["lr"], optim["muon_lr"]) == pytest.approx(expected)

    # every finished run: what trained it, and its entropy kept before its weights went
    git = shutil.which("git") and subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                                 capture_output=True, text=True).stdout.strip()
    for run in (p.parent for p in root.rglob("summary.json")):
        record = json.loads((run / TRAINED_ON).read_text())
        assert record["device"] == "cpu" and record["wall_seconds"] > 0
        assert record["commit"] is None or not git or record["commit"].split("+")[0] == git
        if run.parent.parent.name == "small-steps":
            assert "deep_entropy" in json.loads((run / "reproduce_metrics.json").read_text())
    seeds = len(list((root / "small-steps" / "runs").glob("resformer-seed*")))
    assert seeds in (3, 4)  # 3, and one more if the first 3 left it undecided (toy max_seeds 4)
    if seeds == 4:
        assert json.loads((root / "seeds.json").read_text())["steps"]["resformer"] == 4

    # 4. the export unpacked into another store beside a second scale: the page's scale column
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with tarfile.open(tgz) as tar:
        tar.extractall(fresh, filter="data")
    small = replace(scale, trains_on="cpu", max_seeds=None)
    monkeypatch.setitem(SCALES, "toy-cpu", small)
    # its sweep too: the runs copied below were trained at the rates it chose, which a store's check of
    # each finished run's config (reproduce --no-train) reads from it
    for sweep in (fresh / "gpu-mid").glob("*lr-sweep*"):
        shutil.copytree(sweep, fresh / "toy-cpu" / sweep.name)
    for k in range(3):  # the same runs, resformer 0.1 nats worse: a paired difference shifted by 0.1
        for arch in ("pre-ln", "resformer"):
            src = fresh / "gpu-mid" / "small-steps" / "runs" / f"{arch}-seed{k}"
            dst = fresh / "toy-cpu" / "small-steps" / "runs" / src.name
            shutil.copytree(src, dst)
            if arch == "resformer":
                summary = {**_summary(dst), "val_loss": _summary(dst)["val_loss"] + 0.1}
                (dst / "summary.json").write_text(json.dumps(summary))
    page = fresh / "REPRODUCTION.md"
    command = ["reproduce", "--scale", "toy-cpu,gpu-mid", "--no-train", "--partial", "--claims", CLAIMS,
               "--out", str(fresh), "--report", str(page)]
    assert cli(command) == 0
    first = page.read_bytes()
    assert cli(command) == 0
    # the same page again, but for the minute it was written in (the Method's date), which a loaded
    # machine's two calls can straddle
    stamp = re.compile(rb"\d{4}-\d\d-\d\d \d\d:\d\d UTC")
    assert stamp.sub(b"DATE", page.read_bytes()) == stamp.sub(b"DATE", first) and stamp.search(first)
    text = first.decode()
    row = next(line for line in text.splitlines() if line.startswith("| resformer-beats-pre-ln | Value"))
    assert row.endswith(f"| {verdicts['resformer-beats-pre-ln']} |")
    assert "# Reproduction of the papers' claims on CPU and GPU" in text
    assert "## Does it hold as models grow?" in text

    def diffs(store: Path, n: int) -> list[float]:
        runs = store / "small-steps" / "runs"
        def loss(arch: str, k: int) -> float:
            return _summary(runs / f"{arch}-seed{k}")["val_loss"]

        return [loss("resformer", k) - loss("pre-ln", k) for k in range(n)]

    a, b = diffs(fresh / "gpu-mid", seeds), diffs(fresh / "toy-cpu", 3)
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    change = f"change {np.mean(a) - np.mean(b):+.3f} [{ci.low:+.3f}, {ci.high:+.3f}] (Welch)"
    growth = next(line for line in text.splitlines() if line.startswith("- **resformer-beats-pre-ln**"))
    assert "From `toy-cpu` to `gpu-mid`" in growth and change in growth
    which = text.split("## Which GPU trained which runs (`gpu-mid`)")[1]
    n_runs = len(list((fresh / "gpu-mid").rglob("summary.json")))
    commit = json.loads(next((fresh / "gpu-mid").rglob(TRAINED_ON)).read_text())["commit"]
    assert f"| cpu | {commit} |" in which
    assert f"| 6 | {n_runs - 6} |" in which


def test_gpu_session_runs_a_campaign_step(tmp_path):
    """benchmarks/gpu_session.sh with CAMPAIGN_MIN and the other steps skipped: the campaign step runs
    `gpu_campaign.py next` on the real gpu-mid scale within its minutes (on this CPU no run fits in a
    minute) and prints what remains. A minute, not less: the step's limit is the minutes plus 40 s, and
    a loaded CI machine can take more than 40 s to import torch and read the store."""
    out = tmp_path / "OUT"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "SKIP_BENCH": "1", "SKIP_CHECKS": "1", "CAMPAIGN_MIN": "1",
           "CAMPAIGN_OUT": str(tmp_path / "store"), "COMMIT": "abc1234", "LOGS": str(tmp_path / "logs"),
           "PYTHON": sys.executable}
    done = subprocess.run(["bash", "benchmarks/gpu_session.sh"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=patient(300))
    assert done.returncode == 0, done.stderr
    with tarfile.open(out / "logs.tgz") as packed:  # what the device tool brings back
        log = packed.extractfile("./campaign.log").read().decode()
    assert "piece: trained 0 runs" in log and "remaining: 111 runs" in log, log
    assert "== campaign: exit 0" in done.stdout and "learning-rate sweep: 48 runs" in done.stdout


@pytest.mark.slow  # about 20 s: CI's slow tier runs it (.ci/run)
def test_campaign_smoke_trains_every_claim(tmp_path):
    """`gpu_campaign.py next --smoke` over every claim: the sweep of 16 architectures, 63 claim runs,
    the timing pass and a round of more seeds (129 toy runs, 15 s on an idle 2-core machine), so that
    no claim's path fails on a GPU call for a typo."""
    (tmp_path / "corpus").mkdir()
    corpus = write_code_corpus(tmp_path / "corpus")
    lines = gpu_campaign.main(["next", "--smoke", "--device", "cpu", "--minutes", "60", "--out",
                               str(tmp_path / "s"), "--data", str(corpus)])
    verdicts = [line for line in lines if line.startswith("gpu-mid: ")]
    assert len(verdicts) == len(select()) and lines[-1].startswith("remaining: nothing")


@pytest.mark.parametrize("option", [["--minutes", "nan"], ["--minutes", "0"], ["--minutes", "-5"],
                                    ["--minutes", "inf"], ["--minutes", "5", "--scale", "nonsense"],
                                    ["--minutes", "5", "--claims", "nonsense"],
                                    ["--minutes", "5", "--device", "nonsense"],
                                    ["--minutes", "5", "--export", "FILE/gpu-mid.tgz"],
                                    ["--minutes", "5", "--export", "/proc/blocklab-nope/gpu-mid.tgz"]])
def test_next_refuses_a_bad_option_before_anything_trains(option, tmp_path, monkeypatch, capsys):
    """Each bad option: exit status 2 and one line naming it and what is allowed, before any run trains
    (a budget of nan once ran everything; 0 and -5 exited 0 having done nothing; an export under /proc,
    writable to root by its permissions, where no folder can be made, was found after a run trained)."""
    from blocklab.reproduce import budgeted_launch

    monkeypatch.setattr(budgeted_launch, "run_piece", lambda *a, **k: pytest.fail("a run started"))
    (tmp_path / "FILE").write_text("a file, not a folder")
    option = [str(tmp_path / o) if o.startswith("FILE") else o for o in option]
    with pytest.raises(SystemExit) as stop:
        gpu_campaign.main(["next", *option, "--out", str(tmp_path / "store")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("gpu_campaign.py: error: ")
    assert f"{option[-2]} " in err and "Traceback" not in err
    assert not (tmp_path / "store").exists()


@pytest.fixture
def no_bench(monkeypatch):
    """bench_gpu as a module whose main fails the test: nothing may measure."""
    import types

    fake = types.ModuleType("bench_gpu")
    fake.main = lambda *a, **k: pytest.fail("bench_gpu.py ran")
    monkeypatch.setitem(sys.modules, "bench_gpu", fake)


@pytest.mark.parametrize("budget", ["nan", "inf", "0", "-5"])
def test_mfu_refuses_a_budget_that_is_not_a_positive_number(budget, no_bench, capsys):
    """--budget-s nan ran the MFU table with no budget at all."""
    with pytest.raises(SystemExit) as stop:
        gpu_campaign.main(["mfu", "--budget-s", budget])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpu_campaign.py: error: --budget-s {float(budget):g} is not allowed: ")
    assert len(err.strip().splitlines()) == 1 and "positive number of seconds" in err


@pytest.mark.parametrize("piece", ["mfu", "resformer", "all"])
def test_a_dry_run_measures_trains_and_writes_nothing(piece, no_bench, tmp_path, monkeypatch, capsys):
    """`mfu --dry-run` ran bench_gpu.py and, without --results, wrote the committed results/gpu.json."""
    import blocklab.reproduce

    monkeypatch.setattr(blocklab.reproduce, "reproduce", lambda *a, **k: pytest.fail("a piece trained"))
    committed = ROOT / "benchmarks" / "results" / "gpu.json"
    before = committed.read_bytes()
    store = tmp_path / "store"
    lines = gpu_campaign.main([piece, "--dry-run", "--device", "cpu", "--out", str(store)])
    assert committed.read_bytes() == before and not store.exists()
    assert lines and all("dry run: nothing" in line for line in lines)
    if piece != "resformer":
        assert f"--out {committed}" in lines[0] and lines[0].startswith("mfu: would run python ")
