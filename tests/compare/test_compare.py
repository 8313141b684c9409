"""`blocklab compare` end to end: equal budgets, the report's measured figures, valid PNGs, resume."""

from __future__ import annotations

import json
import math

import pytest
import torch

import blocklab
from blocklab import compare as compare_module
from blocklab import report as report_module
from blocklab.compare import (
    BUDGETS,
    DEFAULT_STEPS,
    GRIDS,
    Entry,
    default_budget,
    entry_model,
    resolve_compare,
    run_configs,
)
from blocklab.recipes import recipe_optim
from blocklab.report import plots as report_plots
from blocklab.runtime.cache import cache_bytes_per_token
from blocklab.training import TrainConfig, loop
from blocklab.training.metrics import read_metrics
from blocklab.util.errors import ConfigError
from helpers import compare_base, saved_figures

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def compare(*args, **kwargs):
    """`blocklab.compare.compare` with one interleaved timing round of two steps, so the tests stay fast."""
    return compare_module.compare(*args, **{"timing_rounds": 1, "timing_steps": 2, **kwargs})


base = compare_base


def section_table(report: str, section: str = "Results") -> str:
    """The markdown table of a section of the report ("## Results": the measured figures)."""
    part = report.split(f"\n## {section}\n")[1].split("\n## ")[0]
    return "\n".join(line for line in part.splitlines() if line.startswith("|"))


def table_rows(report: str, section: str = "Results") -> dict[str, dict[str, str]]:
    """The rows of a section's table, by architecture: {column: cell}."""
    lines = [line for line in section_table(report, section).splitlines() if line.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[1:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(head, cells, strict=True))
    return rows


def number(cell: str) -> tuple[float, float]:
    """(mean, std) of a table cell such as "1,234 ± 5", "0.75M" or "6.7647"."""
    mean, _, std = cell.partition(" ± ")
    return float(mean.rstrip("M").replace(",", "")), float(std or 0)


def mean_std(xs: list[float]) -> tuple[float, float]:
    mean = sum(xs) / len(xs)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


def plateau_by_hand(corpus, cache) -> float:
    """The loss of a unigram model of the training bytes (counts + 1/2) on the first two validation
    batches of 4 windows of 32 bytes, every target scored once."""
    from blocklab.data import Batches, DataConfig, prepare_data

    data = prepare_data(DataConfig(source=str(corpus), tokenizer="byte", cache_dir=str(cache)))
    vocab = data.tokenizer.vocab_size
    counts = [0.5] * vocab
    for t in data.train.tolist():
        counts[t] += 1
    total = sum(counts)
    scored = [t for b in Batches(data, "val", 4, 32).validation(4, 2) for t in b["labels"].flatten().tolist()
              if t >= 0]
    return -sum(math.log(counts[t] / total) for t in scored) / len(scored)


def test_compare_two_architectures_report(corpus, tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    titles, real_suptitle = [], Figure.suptitle
    monkeypatch.setattr(Figure, "suptitle",
                        lambda fig, t, **kw: titles.append(t) or real_suptitle(fig, t, **kw))
    out = tmp_path / "cmp"
    # AdamW, whose state the memory checks count (the tiny recipe's Muon keeps one buffer per matrix)
    report = compare(["pre-ln", "sas-p+bov"], out, seeds=2,
                     base={**base(corpus, tmp_path / "cache"), "optim": {"name": "adamw", "lr": 1e-3}},
                     log=lambda *_: None)
    text = report.read_text()
    rows = table_rows(text)
    assert set(rows) == {"pre-ln", "sas-p+bov"}
    printed = report_module.summary_table(out)  # what `blocklab compare` prints: the table, then the verdict
    assert printed.startswith(section_table(text) + "\n\nverdict (2 seeds per architecture; too few")
    for row in verdict_rows(text):
        assert f". {row['architecture']:<20} {row['val loss']}" in printed
        if row["reading"] != "-":
            assert row["reading"] in printed
    results = json.loads((out / "results.json").read_text())
    assert [r["label"] for r in results["architectures"]] == ["pre-ln", "sas-p+bov"]
    by_label = {r["label"]: r for r in results["architectures"]}
    speed = table_rows(text, "Throughput")
    memory = table_rows(text, "Memory")
    for label in rows:
        runs = [out / "runs" / f"{label}-seed{s}" for s in (0, 1)]
        summaries = [json.loads((r / "summary.json").read_text()) for r in runs]
        assert all(s["step"] == 4 and s["tokens"] == 4 * 4 * 32 for s in summaries)  # equal budgets
        # parameters in the table are those of the trained model
        cfg = blocklab.ModelConfig(**json.loads((runs[0] / "model_config.json").read_text()))
        model = blocklab.LanguageModel(cfg)
        counts = blocklab.count_parameters(model)
        assert rows[label]["params"] == f"{counts.total / 1e6:.3f}M"
        assert rows[label]["non-embedding"] == f"{counts.non_embedding / 1e6:.3f}M"
        # validation loss: mean +- std over the two seeds, read from the runs; results.json keeps the spread
        losses = [s["val_loss"] for s in summaries]
        mean, std = sum(losses) / 2, abs(losses[0] - losses[1]) / math.sqrt(2)
        assert rows[label]["val loss"] == f"{mean:.4f} ± {std:.4f}"
        assert by_label[label]["val_loss"] == pytest.approx([mean, std])
        assert losses[0] != losses[1]  # the seeds really differ
        # every measured column against the runs' summaries, to the table's rounding
        row = {k: number(v) for k, v in rows[label].items()
               if k not in ("architecture", "tokens/s, median (IQR)")}
        assert row["FLOPs/token"][0] == pytest.approx(summaries[0]["flops_per_token"] / 1e6, abs=0.005)
        expected = mean_std([s["val_bpb"] for s in summaries])
        assert row["val bits/byte"] == pytest.approx(expected, abs=0.51e-4)
        # KV cache: the analytic layout, which tests/runtime/test_cache.py proves equal to KVCache.nbytes
        kv = cache_bytes_per_token(cfg)["per_token"]
        assert row["KV cache bytes/token"][0] == pytest.approx(kv, abs=0.5)
        # throughput: the interleaved pass's median and spread of step times, in the table and the JSON
        timed = by_label[label]["throughput"]["interleaved"]
        assert timed["n"] == 2
        assert timed["min"] <= timed["q1"] <= timed["median"] <= timed["q3"] <= timed["max"]
        assert rows[label]["tokens/s, median (IQR)"].startswith(f"{timed['tokens_per_s']['median']:,.0f} (")
        assert speed[label]["step (ms), median"] == f"{timed['median'] * 1e3:,.1f}"
        assert speed[label]["IQR (ms)"] == f"{timed['q1'] * 1e3:,.1f}-{timed['q3'] * 1e3:,.1f}"
        assert speed[label]["min-max (ms)"] == f"{timed['min'] * 1e3:,.1f}-{timed['max'] * 1e3:,.1f}"
        in_training = by_label[label]["throughput"]["in_training"]
        assert set(in_training["cv_per_run"]) == {"seed 0", "seed 1"}
        assert speed[label]["in training: step (ms), median"] == f"{in_training['median'] * 1e3:,.1f}"
        # memory attributed to the model: float32 parameters are 4 bytes each, AdamW keeps two moments
        # and a step count per parameter tensor; the process's peak stays a column of its own
        mem = by_label[label]["memory"]
        params = list(model.parameters())
        assert mem["parameter_bytes"] == 4 * counts.total == mem["gradient_bytes"]
        assert mem["optimizer_state_bytes"] == 2 * 4 * counts.total + 4 * len(params)
        assert mem["activation_bytes"] > 0 and mem["cuda_step_peak_bytes"] is None  # on the CPU
        assert mem["model_total_bytes"] == sum(mem[k] for k in ("parameter_bytes", "gradient_bytes",
                                                                 "optimizer_state_bytes", "activation_bytes"))
        assert memory[label]["parameters (MiB)"] == f"{4 * counts.total / 2**20:,.2f}"
        # the unigram plateau: the scored held-out targets under the training split's byte counts
        plateau = table_rows(text, "Leaving the unigram plateau")[label]
        u = plateau_by_hand(corpus, tmp_path / "cache")
        assert float(plateau["unigram plateau U"]) == pytest.approx(u, abs=5e-4)
        finals = [s["val_loss"] for s in summaries]
        assert plateau["final loss below U"] == ", ".join(f"{u - f:.2f}" for f in finals)
        assert rows[label]["model memory (MiB)"] == f"{mem['model_total_bytes'] / 2**20:,.2f}"
        peak = mean_std([s["peak_memory_mib"] for s in summaries])
        assert number(memory[label]["process peak RSS during the run (MiB)"]) == pytest.approx(peak, abs=0.51)
    # BoV's value tables are counted apart from the embedding, and its cache is smaller
    assert float(rows["sas-p+bov"]["embedding + value tables"][:-1]) > float(rows["pre-ln"]
                                                                           ["embedding + value tables"][:-1])
    results_rows = json.loads((out / "results.json").read_text())["architectures"]
    wall = report_module.wall_clock_source(results_rows, "steps")  # left out when the timing was too noisy
    figures = 5 if wall else 4
    for name in ("val_loss_vs_step", "val_loss_vs_tokens", "relative_loss", "scalars_sas-p_bov",
                 *(["val_loss_vs_wall_time"] if wall else [])):
        png = out / f"{name.replace('-', '_')}.png" if name.startswith("scalars") else out / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_SIGNATURE, name
        assert f"({png.name})" in text
        import matplotlib.image

        assert matplotlib.image.imread(png).ndim == 3
    # the scalars are drawn by blocklab.analysis.plot_scalars (beta_V / alpha_V, per-head gains), seed 0
    assert "Learned scalars over training: sas-p+bov, seed 0" in titles
    assert "first 2 batches of 4 windows of 32 tokens" in text
    last_val = read_metrics(out / "runs" / "pre-ln-seed0" / "metrics.jsonl", "val")[-1]
    assert f"({last_val['val_tokens']:,} target tokens;" in text  # the exact count scored
    assert "measured from the model's own cache" in text
    # uncertainty: the seeds are counted and the bands named; every curve starts at step 0
    assert "2 seeds per architecture" in text and "seed(s)" not in text
    assert "mean ± 1 s.d. over 2 seeds" in text and "bands ±1 s.d. over seeds" in text
    assert "curves start at step 0, the initial model's loss" in text  # a step-0 evaluation is logged
    # the method: every setting that changes results, the machine, the software, how the report came to be
    method = text.split("\n## Method\n")[1]
    for fact in ("**Peak learning rate:** 0.001 for every architecture",
                 "**Optimizer:** AdamW (betas 0.9, 0.95", "**Budget:** equal steps, 4 steps per run",
                 "**Batch:** 4 sequences x 32 tokens", "**Schedule:** linear: linear warmup over 5% of the",
                 "**Tokenizer:** `byte`, vocabulary", f"torch {torch.__version__}",
                 f"blocklab {blocklab.__version__}", "**Command:** `python API`", "for the whole compare",
                 "**Seeds:** 2 seeds per architecture (0, 1)", "3 layers, d_model 32"):
        assert fact in method, fact
    assert "commit `" in method or "no commit" in method
    facts = results["method"]
    assert facts["optimizer"]["name"] == "adamw" and facts["architectures"][0]["lr"] == 1e-3
    assert facts["software"]["torch"] == torch.__version__ and "commit" in facts
    assert facts["command"] == "python API" and facts["wall_time_s"] > 0
    assert facts["budget"] == {"kind": "steps", "max_steps": 4, "text": "4 steps"}
    assert facts["timing"]["rounds"] == 1 and facts["machine"]["logical_cores"]
    # the HTML: markdown rendered (no raw backticks), a heading per section, names left-aligned, captions
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == figures and "sas-p+bov" in page
    assert "`" not in page and "<code>pre-ln</code>" in page and "**" not in page
    for title in ("Verdict", "Results", "Throughput", "Memory", "Figures", "Method"):
        assert f'<h2 id="{report_module.anchor(title)}">{title}</h2>' in page
    assert page.count("<figcaption>") == figures and "lower is better" in page
    assert '<td class="left">sas-p+bov</td>' in page and '<th class="left">architecture</th>' in page


def interrupt_at_step_call(monkeypatch, n: int):
    """Make the n-th training step of this test (counted across runs) raise KeyboardInterrupt, as a
    user's Ctrl-C would; returns the real step function to restore."""
    real_step = loop.Trainer._step
    calls = {"n": 0}

    def step(self):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(loop.Trainer, "_step", step)
    return real_step


def test_interrupted_compare_resumes(corpus, tmp_path, monkeypatch):
    out = tmp_path / "cmp"
    cfg = base(corpus, tmp_path / "cache", steps=6)
    real_step = interrupt_at_step_call(monkeypatch, 6 + 5)  # step 5 of the second run; last checkpoint 4
    with pytest.raises(KeyboardInterrupt):
        compare(["pre-ln", "resformer"], out, base=cfg, log=lambda *_: None)
    first = out / "runs" / "pre-ln-seed0" / "summary.json"
    stamp = first.stat().st_mtime_ns
    monkeypatch.setattr(loop.Trainer, "_step", real_step)
    messages = []
    compare(["pre-ln", "resformer"], out, base=cfg, log=messages.append)
    assert "reused" in messages[0] and "resuming" in messages[1]
    assert first.stat().st_mtime_ns == stamp  # the finished run was not retrained
    steps = [r["step"] for r in read_metrics(out / "runs" / "resformer-seed0" / "metrics.jsonl", "train")
             if "loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]  # one curve, no step repeated or lost
    assert (out / "report.md").is_file()
    # the resumed run's logged tokens/s mixes two starts: marked wherever it appears
    summary = json.loads((out / "runs" / "resformer-seed0" / "summary.json").read_text())
    assert summary["resumed_at"] == [4]
    assert json.loads(first.read_text())["resumed_at"] == []
    assert "tokens/s over 2 starts, resumed at step 4)" in messages[1 + 1]
    throughput = table_rows((out / "report.md").read_text(), "Throughput")
    assert throughput["resformer"]["in training: CV per run"].endswith("(resumed at step 4)")
    assert "resumed" not in throughput["pre-ln"]["in training: CV per run"]


def test_changed_config_is_not_silently_reused(corpus, tmp_path):
    out = tmp_path / "cmp"
    compare(["pre-ln"], out, base=base(corpus, tmp_path / "cache", steps=2), log=lambda *_: None)
    with pytest.raises(ConfigError, match=r"a finished run with a different config \(max_steps: 2 -> 3\)"):
        compare(["pre-ln"], out, base=base(corpus, tmp_path / "cache", steps=3), log=lambda *_: None)


def test_reuse_survives_settings_that_do_not_change_results(corpus, tmp_path):
    out = tmp_path / "cmp"
    cfg = base(corpus, tmp_path / "cache", steps=2)
    compare(["pre-ln"], out, base=cfg, log=lambda *_: None)
    summary = out / "runs" / "pre-ln-seed0" / "summary.json"
    stamp = summary.stat().st_mtime_ns
    messages = []  # progress bars on, as `blocklab compare` without --quiet; other logging and checkpoints
    compare(["pre-ln"], out, base={**cfg, "progress": True, "log_every": 2, "ckpt_every": 5,
                                   "keep_checkpoints": 1}, log=messages.append)
    assert "reused" in messages[0] and summary.stat().st_mtime_ns == stamp
    with pytest.raises(ConfigError, match="eval_every: 2 -> 1"):  # what is recorded changes
        compare(["pre-ln"], out, base={**cfg, "eval_every": 1}, log=lambda *_: None)


def compare_stopped_at_step_4(out, cfg, monkeypatch) -> None:
    """A one-run compare stopped by Ctrl-C during step 4 (its last checkpoint is step 2)."""
    real_step = interrupt_at_step_call(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        compare(["pre-ln"], out, base=cfg, log=lambda *_: None)
    monkeypatch.setattr(loop.Trainer, "_step", real_step)


def test_an_interrupted_run_resumes_only_with_the_same_config(corpus, tmp_path, monkeypatch):
    out, cfg = tmp_path / "cmp", base(corpus, tmp_path / "cache", steps=6)
    compare_stopped_at_step_4(out, cfg, monkeypatch)
    with pytest.raises(ConfigError, match=r"an unfinished run with a different config \(max_steps: 6 -> 8\)"):
        compare(["pre-ln"], out, base={**cfg, "max_steps": 8}, log=lambda *_: None)
    messages = []
    compare(["pre-ln"], out, base={**cfg, "progress": True}, log=messages.append)
    assert "resuming" in messages[0]
    steps = [r["step"] for r in read_metrics(out / "runs" / "pre-ln-seed0" / "metrics.jsonl", "train")
             if "loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_a_run_stopped_mid_append_resumes_past_its_torn_metrics_line(corpus, tmp_path, monkeypatch):
    """A disk filling up (or the power failing) while a run appends to metrics.jsonl leaves its last line
    torn; the compare run again resumes that run past it, and reports."""
    out, cfg = tmp_path / "cmp", base(corpus, tmp_path / "cache", steps=6)
    compare_stopped_at_step_4(out, cfg, monkeypatch)
    metrics = out / "runs" / "pre-ln-seed0" / "metrics.jsonl"
    with metrics.open("a") as f:
        f.write('{"kind": "train", "step": 4, "lo')
    messages = []
    compare(["pre-ln"], out, base=cfg, log=messages.append)
    assert "resuming" in messages[0]
    assert [r["step"] for r in read_metrics(metrics, "train") if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert (out / "report.md").is_file()


def test_a_run_stopped_before_its_first_checkpoint_starts_afresh(corpus, tmp_path, monkeypatch):
    out = tmp_path / "cmp"
    cfg = base(corpus, tmp_path / "cache", steps=3)
    real_step = loop.Trainer._step

    def dies_at_step_2(self):
        if self.state.step == 1:  # step 1 is logged, no checkpoint yet (ckpt_every 2)
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(loop.Trainer, "_step", dies_at_step_2)
    with pytest.raises(KeyboardInterrupt):
        compare(["pre-ln"], out, base=cfg, log=lambda *_: None)
    monkeypatch.setattr(loop.Trainer, "_step", real_step)
    messages = []
    compare(["pre-ln"], out, base=cfg, log=messages.append)
    assert "training" in messages[0]
    steps = [r["step"] for r in read_metrics(out / "runs" / "pre-ln-seed0" / "metrics.jsonl", "train")
             if "loss" in r]
    assert steps == [1, 2, 3]


def test_checkpoints_follow_the_eval_cadence(tmp_path):
    def ckpt_every(**fields):
        return run_configs([Entry.parse("pre-ln")], 1, tmp_path, {"max_steps": 10, **fields})[0][1].ckpt_every

    assert ckpt_every(eval_every=7) == 7
    assert ckpt_every(eval_every=7, ckpt_every=3) == 3  # an explicit cadence is kept
    assert ckpt_every(eval_every=0) == TrainConfig(max_steps=1).ckpt_every  # no periodic evals: the default


def test_equal_flops_gives_a_cheaper_block_more_steps(corpus, tmp_path):
    cfg = base(corpus, tmp_path / "cache")
    del cfg["max_steps"]
    per_step = default_budget("flops", [Entry.parse("pre-ln")], cfg) / DEFAULT_STEPS  # pre-ln's per step
    cfg["max_flops"] = 4.9 * per_step  # 5 steps of pre-ln; sas, 4% cheaper per token, needs 6
    out = tmp_path / "cmp"
    compare(["pre-ln", "sas"], out, base=cfg, log=lambda *_: None)
    summaries = {a: json.loads((out / "runs" / f"{a}-seed0" / "summary.json").read_text())
                 for a in ("pre-ln", "sas")}
    tokens_per_step = 4 * 32
    # the default budget is what the trainer counts for the baseline: DEFAULT_STEPS steps of its FLOPs
    assert per_step == summaries["pre-ln"]["flops_per_token"] * tokens_per_step
    assert summaries["sas"]["flops_per_token"] < summaries["pre-ln"]["flops_per_token"]
    assert summaries["pre-ln"]["step"] == 5 and summaries["sas"]["step"] > 5
    for s in summaries.values():  # equal FLOPs, to within one step's worth
        assert s["flops"] == s["step"] * tokens_per_step * s["flops_per_token"]
        assert cfg["max_flops"] <= s["flops"] < cfg["max_flops"] + s["flops_per_token"] * tokens_per_step


def test_grids_carry_the_papers_budgets_and_build(tmp_path):
    assert {n: g.budget for n, g in GRIDS.items()} == {
        "simplifying-fig5": "time", "simplifying-table1": "time", "resformer-fig7": "steps",
        "bov-table1": "flops"}
    for name, grid in GRIDS.items():
        assert grid.budget in BUDGETS
        run_configs(list(grid.entries), 1, tmp_path, {"max_steps": 1, **grid.train})  # valid TrainConfigs
        for entry in grid.entries:
            cfg = blocklab.ModelConfig.from_preset(entry.arch, "tiny", **entry_model(entry, "tiny"))
            with torch.device("meta"):
                blocklab.LanguageModel(cfg)
        assert grid.description and len({e.label for e in grid.entries}) == len(grid.entries), name
    # Bank of Values Table 1 row 3: V_1 in every layer, where layer 0's own value is V_1
    row3 = next(e for e in GRIDS["bov-table1"].entries if e.label.startswith("3 "))
    for size in ("tiny", "nanochat-d12"):
        cfg = blocklab.ModelConfig.from_preset(row3.arch, size, **entry_model(row3, size))
        with torch.device("meta"):
            model = blocklab.LanguageModel(cfg)
        assert [b.attn.values.target for b in model.blocks] == [False] + [True] * (cfg.n_layers - 1)
    assert "ResFormer + NeuTRENO" in GRIDS["resformer-fig7"].description  # named as not expressible


def test_one_list_of_budgets():
    from blocklab.training import config as train_config

    assert BUDGETS is train_config.BUDGETS and train_config.BUDGET_FIELDS == tuple(BUDGETS.values())
    assert set(BUDGETS.values()) == {f for f in TrainConfig.__dataclass_fields__ if f.startswith("max_")}
    assert TrainConfig(max_steps=3, max_time=9.0).budgets() == {"max_steps": 3, "max_time": 9.0}


def test_resolve_compare_gives_the_cli_defaults():
    entries, fields = resolve_compare(["pre-ln", "sas"], base={"size": "tiny"},
                                      budget={"steps": 3, "time": None})
    assert [e.label for e in entries] == ["pre-ln", "sas"]
    assert "lr" not in fields.get("optim", {}) and fields["max_steps"] == 3  # each run's own: run_configs
    _, fields = resolve_compare(["pre-ln"], base={"size": "tiny"}, lr=5e-4)
    assert fields["optim"]["lr"] == 5e-4 and fields["max_steps"] == DEFAULT_STEPS
    # other sizes keep the TrainConfig rate; an override wins, a max_* override is the budget
    _, fields = resolve_compare(["pre-ln"], base={"size": "nanochat-d12"},
                                overrides=["optim.warmup_fraction=0.1", "max_tokens=100"])
    assert fields["optim"] == {"warmup_fraction": 0.1} and fields["max_tokens"] == 100
    assert "max_steps" not in fields
    setup = json.dumps(GRIDS["resformer-fig7"].train)
    entries, fields = resolve_compare(grid="resformer-fig7", base={"size": "tiny"})
    assert [e.label for e in entries] == [e.label for e in GRIDS["resformer-fig7"].entries]
    assert fields["optim"]["schedule"] == "cosine" and "lr" not in fields["optim"]
    assert fields["max_steps"] == DEFAULT_STEPS and json.dumps(GRIDS["resformer-fig7"].train) == setup
    with pytest.raises(ConfigError, match="give one budget, got --steps, --time"):
        resolve_compare(["pre-ln"], budget={"time": 2.0, "steps": 1})
    with pytest.raises(ConfigError, match="--grid 'nope' is not allowed"):
        resolve_compare(grid="nope")


def test_cli_compare_rejects_two_budgets(capsys):
    from blocklab.cli import main

    assert main(["compare", "--steps", "3", "--time", "5"]) == 2
    assert "one budget" in capsys.readouterr().err
    # a wall-clock grid has no machine-independent default: it names the flag to pass, before training
    assert main(["compare", "--grid", "simplifying-fig5"]) == 2
    assert "--time SECONDS" in capsys.readouterr().err


def test_the_recipe_table_is_layered_most_specific_last(monkeypatch, tmp_path):
    """The size's default, then the block preset's entry, the value path's (on pre-ln) and the full
    name's, each over the one before; a size the table leaves out gives {} (the OptimConfig defaults)."""
    from blocklab import recipes

    table = tmp_path / "recipe.json"
    table.write_text(json.dumps({"command": "x", "sizes": {"tiny": {
        "default": {"lr": 1.0, "name": "muon"}, "sas": {"lr": 2.0}, "sas+bov": {"lr": 3.0},
        "bov": {"lr": 4.0, "muon_lr": 0.5}, "pre-ln": {"lr": 5.0}}}}))
    monkeypatch.setattr(recipes, "RECIPE", table)
    recipe = recipes.recipe_optim
    assert [recipe(a, "tiny")["lr"] for a in ("sas+bov", "sas+resformer", "bov", "pre-ln+bov", "resformer",
                                               "pre-ln", "sas-p")] == [3.0, 2.0, 4.0, 4.0, 5.0, 5.0, 1.0]
    assert recipe("bov", "tiny") == {"lr": 4.0, "name": "muon", "muon_lr": 0.5}
    assert recipe("sas+bov", "tiny") == {"lr": 3.0, "name": "muon"}  # bov's entry is pre-ln's only
    assert recipe("sas", "small") == {}
    # run_configs gives each entry its recipe; a field set in base or in the entry wins
    one = {"size": "tiny", "max_steps": 1}
    configs = run_configs([Entry.parse("sas"), Entry.parse("bov")], 1, tmp_path, one)
    assert [(cfg.optim.lr, cfg.optim.name) for _, cfg in configs] == [(2.0, "muon"), (4.0, "muon")]
    assert configs[1][1].optim.muon_lr == 0.5
    configs = run_configs([Entry.parse("sas")], 1, tmp_path, {**one, "optim": {"lr": 0.25, "name": "adamw"}})
    assert (configs[0][1].optim.lr, configs[0][1].optim.name) == (0.25, "adamw")
    configs = run_configs([Entry("s", "sas", train={"optim": {"lr": 0.125}})], 1, tmp_path, one)
    assert (configs[0][1].optim.lr, configs[0][1].optim.name) == (0.125, "muon")
    configs = run_configs([Entry.parse("sas")], 1, tmp_path, {"size": "small", "max_steps": 1})
    assert configs[0][1].optim == TrainConfig(max_steps=1).optim


def test_the_shipped_recipe_covers_the_main_job():
    from blocklab.cli import DEFAULT_ARCHS
    from blocklab.recipes import recipe_table
    from blocklab.training.optim import OptimConfig

    assert "baseline_grid.py" in recipe_table()["command"]
    for arch in DEFAULT_ARCHS.split(","):
        OptimConfig.from_dict(recipe_optim(arch, "tiny"))  # valid fields and values
        assert 1e-4 <= recipe_optim(arch, "tiny")["lr"] <= 0.1


@pytest.mark.parametrize("flags, expected", [([], recipe_optim("pre-ln", "tiny")["lr"]),
                                             (["optim.lr=5e-4"], 5e-4),
                                             (["optim.lr=5e-4", "optim.lr=2e-3"], 2e-3)])
def test_cli_compare_learning_rate(corpus, tmp_path, flags, expected):
    """The main job trains each architecture at its recipe's rate at size tiny unless an optim.lr
    override (the last one typed) says otherwise; the run's saved config records the rate it
    trained with."""
    from blocklab.cli import main

    tiny = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", f"data.source={corpus}",
            "data.tokenizer=byte", f"data.cache_dir={tmp_path / 'cache'}", "eval_batches=1"]
    out = tmp_path / "cmp"
    assert main(["compare", "--archs", "pre-ln", "--steps", "2", "batch_size=2", "seq_len=16",
                 "eval_every=1", "--quiet", "--out", str(out), *flags, *tiny]) == 0
    saved = TrainConfig.load(out / "runs" / "pre-ln-seed0" / "config.yaml")
    assert saved.optim.lr == expected
    # the report says where the rate came from: the recipe only when the run follows it
    follows = "the main job's recipe for this size and architecture" in (out / "report.md").read_text()
    assert follows == (flags == [])


def test_report_kv_bytes_equal_a_real_cache_without_building_the_model():
    for arch, size in (("pre-ln", "tiny"), ("pre-ln+svformer", "tiny"), ("sas-p+bov", "tiny"),
                       ("pre-ln+bov", "nanochat-d24")):  # d24: 3 GB of weights, were it built for real
        cfg = blocklab.ModelConfig.from_preset(arch, size)
        measured = report_module.kv_cache_bytes_per_token(cfg.to_dict())
        assert measured == cache_bytes_per_token(cfg)["per_token"], arch
        if size == "tiny":  # the same cache, allocated on the CPU
            real = blocklab.LanguageModel(cfg).new_cache(1, cfg.context_length, dtype=torch.bfloat16)
            assert measured == real.nbytes / cfg.context_length
    encoder = blocklab.ModelConfig.from_preset("pre-ln", "tiny", causal=False)
    assert math.isnan(report_module.kv_cache_bytes_per_token(encoder.to_dict()))


def test_wall_clock_curve_reads_the_validation_rows(tmp_path):
    rows = [{"kind": "train", "step": 5, "tokens": 50, "loss": 3.0, "wall_time": 2.5},
            {"kind": "val", "step": 7, "tokens": 70, "val_loss": 2.9, "wall_time": 3.5},  # eval_every 7
            {"kind": "train", "step": 10, "tokens": 100, "loss": 2.8, "wall_time": 5.0},
            {"kind": "val", "step": 14, "tokens": 140, "val_loss": 2.7, "wall_time": 7.25},
            {"kind": "train", "step": 15, "tokens": 150, "loss": 2.6, "wall_time": 8.0},
            {"kind": "val", "step": 15, "tokens": 150, "val_loss": 2.6},  # an older run: the train row's
            {"kind": "val", "step": 21, "tokens": 210, "val_loss": 2.5}]  # ... and none at step 21
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = {"metrics": read_metrics(path)}
    xs, ys = report_plots._val_curves(run, "wall_time")
    assert xs[:3] == [3.5, 7.25, 8.0] and math.isnan(xs[3])
    assert ys == [2.9, 2.7, 2.6, 2.5]
    assert report_plots._val_curves(run, "tokens")[0] == [70, 140, 150, 210]



def _timing_row(label: str, median: float | None, cv: float | None, run_cvs=(0.05,)) -> dict:
    interleaved = None if median is None else {"median": median, "cv": cv}
    return {"label": label, "throughput": {"interleaved": interleaved,
                                           "in_training": {"cv_per_run": {f"seed {i}": c
                                                                          for i, c in enumerate(run_cvs)}}}}


def test_the_wall_clock_figure_takes_the_interleaved_speed_or_warns_or_is_left_out():
    steady = [_timing_row("pre-ln", 0.2, 0.05), _timing_row("sas", 0.1, 0.1)]
    assert report_module.wall_clock_source(steady, "steps") == "interleaved"
    assert report_module.wall_clock_source(steady, "time") == "logs"  # the runs' clocks are the budget
    noisy = [_timing_row("pre-ln", 0.2, 0.05), _timing_row("sas", 0.1, 0.4)]
    assert report_module.wall_clock_source(noisy, "steps") is None
    untimed = [_timing_row("pre-ln", None, None), _timing_row("sas", None, None)]
    assert report_module.wall_clock_source(untimed, "steps") == "logs"
    busy = [_timing_row("pre-ln", None, None), _timing_row("sas", None, None, run_cvs=(0.05, 0.6))]
    assert report_module.wall_clock_source(busy, "steps") is None


def test_the_wall_clock_axis_is_steps_at_the_interleaved_step_time(tmp_path, monkeypatch):
    figures = saved_figures(monkeypatch)
    val = [{"kind": "val", "step": s, "val_loss": 5.0 - s / 10, "tokens": s * 64, "wall_time": s * 9.0}
           for s in (2, 4)]
    runs = {"pre-ln": [{"metrics": val}], "sas": [{"metrics": val}]}
    entries = [Entry.parse(a) for a in runs]
    rows = [_timing_row("pre-ln", 0.25, 0.05), _timing_row("sas", 0.125, 0.05)]
    paths = report_plots._plot_validation(entries, runs, tmp_path, rows, "interleaved")
    wall = figures[2].axes[0]
    lines = {line.get_label(): list(line.get_xdata()) for line in wall.get_lines()}
    assert lines == {"pre-ln": [0.5, 1.0], "sas": [0.25, 0.5]}  # not the logged 18 and 36 s
    assert wall.get_xlabel() == report_module.WALL_FROM_TIMING and paths[2].is_file()
    figures.clear()
    report_plots._plot_validation(entries, runs, tmp_path, rows, "logs", "2 at a time")
    assert "from the runs' own logs, trained 2 at a time" in figures[2].axes[0].get_title()
    assert report_plots._plot_validation(entries, runs, tmp_path, rows, None)[2] is None


def test_an_architecture_keeps_its_colour_in_every_plot(tmp_path, monkeypatch):
    """The relative-loss plot leaves out the baseline; its lines must still match the validation plots'."""
    figures = saved_figures(monkeypatch)
    labels = ["pre-ln", "sas", "bov"]

    def run(offset):
        train = [{"kind": "train", "step": s, "loss": 5.0 + offset - s / 100, "wall_time": s / 10}
                 for s in range(1, 5)]
        val = [{"kind": "val", "step": s, "val_loss": 5.0 + offset, "tokens": s * 64, "wall_time": s / 10}
               for s in (2, 4)]
        return {"metrics": train + val}

    runs = {label: [run(k / 10)] for k, label in enumerate(labels)}
    entries = [Entry.parse(label) for label in labels]
    report_plots._plot_validation(entries, runs, tmp_path)
    report_plots._plot_relative(entries, runs, tmp_path)
    colours = [{line.get_label(): line.get_color() for line in fig.axes[0].get_lines()
                if not line.get_label().startswith("_")} for fig in figures]
    for plot in colours[1:]:
        assert all(plot[label] == colours[0][label] for label in plot), colours
    assert set(colours[-1]) == {"sas", "bov"}  # the relative plot: every entry but the baseline


def test_lr_sweep_keeps_each_architectures_best_rate(corpus, tmp_path):
    out = tmp_path / "cmp"
    cfg = {**base(corpus, tmp_path / "cache", steps=4), "max_steps": 8}
    messages = []
    report = compare(["pre-ln", "resformer"], out, seeds=2, base=cfg, log=messages.append,
                     lr_sweep=[1e-4, 3e-2], sweep_steps=3)
    sweep = json.loads((out / "lr_sweep.json").read_text())
    assert sweep["steps"] == 3
    for label in ("pre-ln", "resformer"):
        losses = {float(r): v for r, v in sweep["val_loss"][label].items()}
        for rate, loss in losses.items():  # each sweep run: seed 0, 3 steps, its own rate
            run = out / "lr-sweep" / "runs" / f"{label}-lr{rate:g}-seed0"
            saved = TrainConfig.load(run / "config.yaml")
            assert (saved.optim.lr, saved.max_steps, saved.seed) == (rate, 3, 0)
            assert json.loads((run / "summary.json").read_text())["val_loss"] == loss
        best = min(losses, key=losses.get)
        for seed in range(2):
            assert TrainConfig.load(out / "runs" / f"{label}-seed{seed}" / "config.yaml").optim.lr == best
    text = report.read_text()
    assert "## Learning-rate sweep" in text and text.count("(chosen)") == 2
    assert "each chosen by a learning-rate sweep over 0.0001, 0.03 (seed 0, 3 steps" in text
    assert json.loads((out / "results.json").read_text())["method"]["lr_sweep"] == {"rates": [1e-4, 3e-2],
                                                                                     "steps": 3}
    again = []
    compare(["pre-ln", "resformer"], out, seeds=2, base=cfg, log=again.append, lr_sweep=[1e-4, 3e-2],
            sweep_steps=3)
    assert not [m for m in again if m.endswith(": training")]
    with pytest.raises(ConfigError, match="positive"):
        compare(["pre-ln"], out, base=cfg, lr_sweep=[-1.0])


def test_report_gives_paired_intervals_and_the_claims_covered(corpus, tmp_path):
    from scipy import stats

    out = tmp_path / "cmp"
    report = compare(["pre-ln", "resformer", "sas"], out, seeds=3, base=base(corpus, tmp_path / "cache"),
                     log=lambda *_: None).read_text()
    loss = {(a, s): json.loads((out / "runs" / f"{a}-seed{s}" / "summary.json").read_text())["val_loss"]
            for a in ("pre-ln", "resformer", "sas") for s in range(3)}
    verdict = report.split("## Verdict")[1].split("\n## ")[0]
    assert report.index("## Verdict") < report.index("## Results"), "the report opens with its verdict"
    ranked = verdict_rows(report)
    order = sorted(("pre-ln", "resformer", "sas"), key=lambda a: sum(loss[a, s] for s in range(3)))
    assert [r["architecture"] for r in ranked] == order and [r["rank"] for r in ranked] == ["1", "2", "3"]
    rows = {r["architecture"]: r for r in ranked}
    assert rows["pre-ln"]["loss - baseline"] == "baseline"
    for arch in ("resformer", "sas"):
        diffs = [loss[arch, s] - loss["pre-ln", s] for s in range(3)]
        low, high = stats.t.interval(0.95, 2, loc=sum(diffs) / 3, scale=stats.sem(diffs))
        assert rows[arch]["95% CI (t)"] == f"[{low:+.4f}, {high:+.4f}]"
        reading = ("lower than pre-ln" if high < 0 else "higher than pre-ln" if low > 0 else
                   "no effect" if -0.02 <= low and high <= 0.02 else "no clear difference")
        assert rows[arch]["reading"].startswith(reading), rows[arch]
    assert "resformer-beats-pre-ln" in verdict
    assert "sas-matches-pre-ln" not in verdict  # needs sas-p too
    assert "**What is held equal.** Every run takes the same steps" in verdict
    # SAS trains beta_SA and alpha_FF, whose product alone matters: its scalar plot's caption says so
    assert report.count("Only the product of two panels matters") == 1
    assert "3 seeds per architecture" in report
    command = "blocklab compare --archs pre-ln,resformer --seeds 1"
    one_seed = compare(["pre-ln", "resformer"], tmp_path / "one", seeds=1,
                       base=base(corpus, tmp_path / "cache"), log=lambda *_: None, command=command,
                       timing_rounds=0).read_text()
    # one seed: ranked all the same, each difference read as "cannot tell" with the seeds that would
    one = {r["architecture"]: r for r in verdict_rows(one_seed)}
    assert one["resformer"]["95% CI (t)"] == "-"
    assert one["resformer"]["reading"].startswith("cannot tell with 1 seed")
    assert "this report cannot tell a difference from seed-to-seed noise" in one_seed
    # one seed: no interval, said in words, and a spread of null (not 0.0) in results.json
    assert "1 seed per architecture" in one_seed and "1 seeds" not in one_seed
    assert "With 1 seed there is no interval" in one_seed and "±" not in section_table(one_seed)
    rows = json.loads((tmp_path / "one" / "results.json").read_text())["architectures"]
    assert all(r["val_loss"][1] is None and r["val_bpb"][1] is None for r in rows)
    assert all(r["memory"]["process_peak_mib"][1] is None for r in rows)
    # the command line as given; without a timing pass only the in-training times are shown, as such
    assert f"**Command:** `{command}`" in one_seed and "no interleaved timing pass" in one_seed
    assert "tokens/s, median (IQR) in training" in section_table(one_seed)
    assert "in training: CV per run" in section_table(one_seed, "Throughput")
    assert "| step (ms), median |" not in section_table(one_seed, "Throughput")
    assert all(r["throughput"]["interleaved"] is None for r in rows)


def verdict_rows(report: str) -> list[dict[str, str]]:
    """The rows of the report's ranked verdict table (the first table under "## Verdict"), in order."""
    part = report.split("\n## Verdict\n")[1].split("\n## ")[0]
    table = next(block for block in part.split("\n\n") if block.lstrip().startswith("| rank"))
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in line.strip("|").split("|")), strict=True))
            for line in lines[1:]]


def test_quiet_compare_prints_one_result_line_per_run(corpus, tmp_path, capsys):
    out = tmp_path / "cmp"
    cfg = base(corpus, tmp_path / "cache", steps=2)  # progress false: `blocklab compare --quiet`
    compare(["pre-ln", "sas"], out, base=cfg)
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0] == "[1/2] pre-ln-seed0: training" and lines[2] == "[2/2] sas-seed0: training"
    for i, (line, arch) in enumerate(zip(lines[1::2], ("pre-ln", "sas"), strict=True), 1):
        summary = json.loads((out / "runs" / f"{arch}-seed0" / "summary.json").read_text())
        assert line.startswith(f"[{i}/2] {arch}-seed0: {arch} seed 0, 2 steps, 256 tokens in ")
        assert f"; val loss {summary['val_loss']:.4f}, val bits/byte {summary['val_bpb']:.4f}; " in line
        assert line.endswith(" s wall time") and "tokens/s)" in line
    assert "compare:" not in captured.err and "tokeniz" not in captured.err  # no bar, no data messages
    compare(["pre-ln", "sas"], out, base=cfg)  # again: both reused, and their results shown
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert all(": finished earlier, reused; " in line and "val loss" in line for line in lines)


def test_compare_progress_is_one_line_over_all_runs(corpus, tmp_path, capsys):
    import re

    out = tmp_path / "cmp"
    cfg = {**base(corpus, tmp_path / "cache", steps=4), "progress": True}
    compare(["pre-ln", "sas"], out, base=cfg)
    captured = capsys.readouterr()
    err = captured.err  # pytest's stderr is not a terminal: plain lines
    assert "\r" not in err
    assert "blocklab: tokenizing files under" in err and "blocklab: tokenized in" in err
    progress = [line for line in err.splitlines() if line.startswith("compare:")]
    assert progress and re.fullmatch(r"compare: 100% \[.*\]", progress[-1])
    assert any("0/2 runs done, pre-ln-seed0: step " in line for line in progress)
    assert " steps [" not in err  # the runs' own bars are off under the compare's line
    assert len([line for line in captured.out.splitlines() if "val loss" in line]) == 2


def test_bov_table1_grid_runs_on_nanochats_trunk_at_cpu_size(corpus, tmp_path):
    """Bank of Values Table 1 at equal FLOPs on the nanochat trunk (the grid's own size, nanochat-tiny,
    narrowed further here): every row trains, spends the same FLOPs within one step's worth, and BoV,
    with no W^V in its target layers, gets at least the baseline's steps (training/budget.py rounds a
    FLOPs budget up to whole steps)."""
    from blocklab.accounting import flops_per_token
    from blocklab.compare import GRIDS

    narrow = {"d_model": 32, "n_layers": 3, "n_heads": 2, "head_dim": 16, "mlp_hidden": 64}
    fields = {**base(corpus, tmp_path / "cache"), "model": narrow, "eval_every": 0, "ckpt_every": 0}
    del fields["size"], fields["max_steps"]  # the grid's size; the budget in FLOPs below
    entries, shared = resolve_compare(grid="bov-table1", base=fields, budget={"flops": 1.0})
    assert shared["size"] == "nanochat-tiny" and shared["optim"]["name"] == GRIDS["bov-table1"].train[
        "optim"]["name"]
    baseline = run_configs(entries[:1], 1, tmp_path, shared)[0][1]
    with torch.device("meta"):
        model = blocklab.LanguageModel(baseline.model_config(256))
    assert model.cfg.smear and model.cfg.init_scheme == "nanochat"  # the trunk, narrowed
    tokens_per_step = baseline.batch_size * baseline.seq_len
    shared["max_flops"] = 3 * tokens_per_step * flops_per_token(model)  # three baseline steps
    out = tmp_path / "grid"
    compare(entries, out, base=shared, log=lambda *_: None)
    steps = {}
    for entry in entries:
        summary = json.loads((out / "runs" / f"{entry.label.replace(' ', '_')}-seed0" / "summary.json")
                             .read_text())
        steps[entry.label] = summary["step"]
        spent = summary["step"] * tokens_per_step * summary["flops_per_token"]
        one_step = tokens_per_step * summary["flops_per_token"]
        assert shared["max_flops"] <= spent < shared["max_flops"] + one_step
    assert steps["1 V"] == 3 and steps["BoV"] >= 3


def test_compare_refuses_a_report_it_did_not_write_and_rewrites_its_own(corpus, tmp_path):
    """A user's report.md and results.json in --out were replaced, exit 0: now refused before
    anything trains, naming them; --overwrite (overwrite=True) replaces them, and a rerun of the same
    comparison rewrites its own report without it."""
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "report.md").write_text("# my notes\n")
    (out / "results.json").write_text('{"mine": 1}\n')
    cfg = base(corpus, tmp_path / "cache", steps=2)
    with pytest.raises(ConfigError, match=r"holds report.md, results.json that blocklab compare did not"):
        compare(["pre-ln"], out, base=cfg, log=lambda *_: None, timing_rounds=0)
    assert (out / "report.md").read_text() == "# my notes\n"
    assert (out / "results.json").read_text() == '{"mine": 1}\n'
    assert not (out / "runs").exists()  # refused before anything trained
    compare(["pre-ln"], out, base=cfg, log=lambda *_: None, timing_rounds=0, overwrite=True)
    assert (out / "report.md").read_text().startswith("# blocklab compare\n")
    stamp = (out / "report.md").stat().st_mtime_ns
    compare(["pre-ln"], out, base=cfg, log=lambda *_: None, timing_rounds=0)  # its own: rewritten
    assert (out / "report.md").stat().st_mtime_ns != stamp
    assert json.loads((out / "results.json").read_text())["format"].startswith("blocklab compare results")


def test_compare_refuses_the_report_of_another_comparison(corpus, tmp_path):
    """`compare --out DIR` where DIR holds another comparison's report (other architectures, or the same
    ones with other settings and --fresh) replaced it, exit 0: now refused before anything trains,
    naming what differs; more seeds of the same comparison, and --overwrite, rewrite it."""
    out = tmp_path / "cmp"
    cfg = base(corpus, tmp_path / "cache", steps=2)
    quiet = dict(log=lambda *_: None, timing_rounds=0)
    compare(["pre-ln", "sas"], out, base=cfg, **quiet)
    first = (out / "results.json").read_text()
    recorded = json.loads(first)["comparison"]
    assert recorded["architectures"] == ["pre-ln", "sas"] and recorded["settings"]["batch_size"] == 4
    with pytest.raises(ConfigError, match=r"holds the report of another comparison \(architectures pre-ln, "
                                          r"sas; this one: bov\)"):
        compare(["bov"], out, base=cfg, **quiet)
    with pytest.raises(ConfigError, match="architectures pre-ln, sas; this one: sas, pre-ln"):
        compare(["sas", "pre-ln"], out, base=cfg, **quiet)  # another baseline: another verdict
    other = {**cfg, "batch_size": 2, "seq_len": 16}
    with pytest.raises(ConfigError, match=r"a finished run with a different config \(batch_size: 4 -> 2"):
        compare(["pre-ln", "sas"], out, base=other, **quiet)  # the saved runs speak first, naming --fresh
    # --fresh retrains the runs, but replaces another comparison's report only with --overwrite
    with pytest.raises(ConfigError, match=r"another comparison \(batch_size: 4 -> 2, seq_len: 32 -> 16\)"):
        compare(["pre-ln", "sas"], out, base=other, fresh=True, **quiet)
    assert (out / "results.json").read_text() == first
    assert sorted(p.name for p in (out / "runs").iterdir() if p.is_dir()) == ["pre-ln-seed0", "sas-seed0"]
    # a results.json written before the comparison was recorded is told by its architectures
    (out / "results.json").write_text(json.dumps({k: v for k, v in json.loads(first).items()
                                                  if k != "comparison"}))
    with pytest.raises(ConfigError, match="architectures pre-ln, sas; this one: bov"):
        compare(["bov"], out, base=cfg, **quiet)
    compare(["pre-ln", "sas"], out, base=cfg, seeds=2, **quiet)  # the same comparison, one more seed
    assert json.loads((out / "results.json").read_text())["comparison"] == recorded
    compare(["bov"], out, base=cfg, overwrite=True, **quiet)
    assert json.loads((out / "results.json").read_text())["comparison"]["architectures"] == ["bov"]


def test_compare_python_api_refuses_no_seeds_or_no_architectures(tmp_path):
    from blocklab.compare import compare

    with pytest.raises(ConfigError, match="seeds = 0"):
        compare(["pre-ln"], tmp_path, seeds=0)
    with pytest.raises(ConfigError, match="at least one architecture"):
        compare([], tmp_path)
