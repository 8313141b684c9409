"""The compare report's parts that need no training: the HTML rendering of its markdown, the spread and
load-warning arithmetic, the memory attributed to a model, the interleaved timing order, the git commit
and the SAS gain-product caption (checked on the built model). tests/compare/test_compare.py runs the
whole report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from blocklab import ModelConfig, report
from blocklab import compare as compare_module
from blocklab.compare import Entry
from blocklab.report import stats as report_stats
from blocklab.report import tables as report_tables
from blocklab.runtime import LanguageModel
from blocklab.training import TrainConfig, memory
from blocklab.training.optim import OptimConfig, build_optimizers


def test_inline_markdown_becomes_html():
    text = "a `x<y` and **bold** [Method](#method) & <b>"
    assert report.inline_html(text) == ('a <code>x&lt;y</code> and <strong>bold</strong> '
                                        '<a href="#method">Method</a> &amp; &lt;b&gt;')
    assert "`" not in report.inline_html("**Command:** `blocklab compare --archs pre-ln`")


def test_tables_align_names_left_and_numbers_right():
    head, rows = ["architecture", "val loss", "CI"], [["pre-ln", "6.1234 ± 0.01", "[+0.1, +0.2]"],
                                                    ["sas", "-", "[-0.1, +0.2]"]]
    assert report.alignments(head, rows) == ["left", "right", "left"]
    md = report.md_table(head, rows, report.alignments(head, rows))
    assert md[1] == "|:---|---:|:---|"
    assert report.md_table(head, rows)[1] == "|---|---|---|"  # the reproduction report's tables
    page = report.html_table(head, rows, report.alignments(head, rows))
    assert '<td class="left">pre-ln</td>' in page and '<td class="right">6.1234 ± 0.01</td>' in page


def test_one_value_has_no_spread():
    assert report.mean_sd([2.0]) == (2.0, None)
    mean, sd = report.mean_sd([1.0, 3.0, None])
    assert mean == 2.0 and sd == pytest.approx(math.sqrt(2))
    assert report_tables._fmt((2.0, None), 2) == "2.00" and report_tables._fmt((2.0, 0.5), 2) == "2.00 ± 0.50"
    s = report.spread([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (s["median"], s["q1"], s["q3"], s["min"], s["max"], s["n"]) == (3.0, 2.0, 4.0, 1.0, 5.0, 5)
    assert report.spread([7.0])["cv"] is None and report.spread([]) is None


def test_step_times_come_from_the_training_clock():
    rows = [{"kind": "train", "step": 0, "tokens": 0, "scalars": {}}]  # the step-0 row has no clock
    rows += [{"kind": "train", "step": s, "wall_time": 0.1 * s + (0.5 if s >= 10 else 0.0)} for s in (5, 10)]
    rows += [{"kind": "val", "step": 10, "wall_time": 1.5, "val_loss": 3.0}]
    rows += [{"kind": "train", "step": s, "wall_time": 1.5 + 0.2 * (s - 10)} for s in (15, 20, 25)]
    times = report.training_step_times(rows)  # windows of 5 steps; the first (warm-up) one left out
    assert times == pytest.approx([0.2, 0.2, 0.2, 0.2])
    assert report.training_step_times(rows[:3]) == pytest.approx([0.1, 0.2])  # too few to leave one out


def _row(label: str, trained: list[float], timed: list[float] | None) -> dict:
    runs = [{"summary": {"seed": 0, "tokens_per_s": 1.0}, "metrics": [
        {"kind": "train", "step": i + 1, "wall_time": sum(trained[:i + 1])} for i in range(len(trained))]}]
    return {"label": label, "throughput": report_stats._throughput(runs, timed and {"step_s": timed}, 100)}


def test_a_neighbours_load_is_caught_by_the_interleaved_timing():
    steady = [0.1] * 8
    # in training, "b" ran while the machine was idle and "a" while it was busy: b looks 4x faster
    busy = [_row("a", [0.4] * 8, steady), _row("b", [0.1] * 8, [0.1, 0.1, 0.11, 0.1, 0.1, 0.1, 0.1, 0.1])]
    warnings = report.load_warnings(busy, "steps")
    assert len(warnings) == 1 and "4.00x in training against 1.00x interleaved" in warnings[0]
    assert "wall-clock budget" in report.load_warnings(busy, "time")[0]
    head, body = report.throughput_table(busy)
    assert head[:6] == ["architecture", "step (ms), median", "IQR (ms)", "min-max (ms)", "tokens/s, median",
                        "speed vs a"]
    assert body[1][5] == "1.00x" and body[1][-1] == "4.00x"
    assert report.load_warnings([_row("a", steady, steady), _row("b", steady, steady)], "steps") == []
    # a run whose own step times jump about, and a timing pass that does too
    jumpy = [0.1, 0.3] * 4
    warnings = report.load_warnings([_row("a", jumpy, jumpy), _row("b", jumpy, jumpy)], "steps")
    assert any("timing pass itself" in w for w in warnings) and any("within 2 runs" in w for w in warnings)


def test_memory_is_counted_from_the_tensors():
    cfg = ModelConfig.from_preset("pre-ln", "tiny", n_layers=2, d_model=32, n_heads=2, vocab_size=64,
                                  context_length=16)
    model = LanguageModel(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert memory.parameter_bytes(model) == 4 * n == memory.gradient_bytes(model)
    adamw = build_optimizers(model, OptimConfig())
    muon = build_optimizers(LanguageModel(cfg), OptimConfig(name="muon"))
    for opts in (adamw, muon):
        for opt in opts:
            for group in opt.param_groups:
                for p in group["params"]:
                    p.grad = torch.ones_like(p)
            opt.step()
    tensors = len(list(model.parameters()))
    assert memory.optimizer_state_bytes(adamw) == 2 * 4 * n + 4 * tensors  # two moments, a step count
    matrices = sum(p.numel() for p in muon[0].param_groups[0]["params"])  # Muon: one momentum buffer
    assert memory.optimizer_state_bytes(muon) < memory.optimizer_state_bytes(adamw)
    assert memory.optimizer_state_bytes(muon[:1]) == 4 * matrices
    # activations: what autograd saves, parameters left out: x @ W saves x (and W, a parameter)
    layer = nn.Linear(64, 32, bias=False)
    x = torch.randn(8, 64, requires_grad=True)
    with memory.SavedTensorTracker(layer) as tracker:
        layer(x).sum().backward()
    assert tracker.bytes == x.numel() * 4


def _fake_run(tmp_path: Path, label: str) -> TrainConfig:
    run = tmp_path / label
    run.mkdir()
    cfg = ModelConfig.from_preset("pre-ln", "tiny", n_layers=1, d_model=16, n_heads=2, vocab_size=32,
                                  context_length=8)
    (run / "model_config.json").write_text(cfg.to_json())
    return TrainConfig(max_steps=1, batch_size=2, seq_len=8, out_dir=str(run))


def test_the_timing_pass_interleaves_the_architectures(tmp_path, monkeypatch):
    order = []

    class Probe(compare_module.StepProbe):
        def timed_step(self) -> float:
            order.append(Path(self.cfg.out_dir).name)
            return super().timed_step()

    monkeypatch.setattr(compare_module.timing, "StepProbe", Probe)  # what measure_architectures builds
    entries = [Entry.parse(a) for a in ("a", "b", "c")]
    configs = [(e, _fake_run(tmp_path, e.label)) for e in entries]
    state = torch.random.get_rng_state()
    measured = compare_module.measure_architectures(configs, rounds=3, steps=2)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's random state is kept
    # every architecture in turn within a round, the starting one rotated from round to round
    assert order == [x for x in "aabbcc"] + [x for x in "bbccaa"] + [x for x in "ccaabb"]
    for label in "abc":
        arch = measured["architectures"][label]
        assert len(arch["step_s"]) == 6 and all(t > 0 for t in arch["step_s"])
        assert arch["memory"]["parameter_bytes"] > 0 and arch["memory"]["activation_bytes"] > 0
    none = compare_module.measure_architectures(configs[:1], rounds=0)
    assert none["architectures"]["a"]["step_s"] == [] and "memory" in none["architectures"]["a"]


def test_the_commit_is_read_without_failing(tmp_path):
    assert report.git_commit(tmp_path) == (None, None)  # not a checkout
    assert report.git_commit(tmp_path / "lib" / "site-packages" / "blocklab") == (None, None)
    commit, dirty = report.git_commit()
    assert commit is None or (isinstance(commit, str) and isinstance(dirty, bool))


def test_budgets_and_plurals_are_written_plainly():
    assert report.budget_text(TrainConfig(max_steps=400)) == "400 steps"
    assert report.budget_text(TrainConfig(max_flops=2e12)) == "2.0e12 FLOPs"
    assert report.budget_text(TrainConfig(max_tokens=819200)) == "819,200 tokens"
    assert report.budget_text(TrainConfig(max_time=300.0)) == "300 s of training"
    assert report.plural(1, "seed") == "1 seed" and report.plural(3, "seed") == "3 seeds"


@pytest.mark.parametrize("arch", ["sas", "pre-ln", "sas-p"])
def test_sas_gains_act_only_through_their_product(arch):
    """The caption's claim, on the built model: with no attention skip and a norm before the MLP, scaling
    beta_SA (attention branch) by c and alpha_FF (MLP skip) by 1/c leaves the logits unchanged."""
    cfg = ModelConfig.from_preset(arch, "tiny", n_layers=2, d_model=32, n_heads=2, vocab_size=64,
                                  context_length=16)
    note = report.gain_product_note(json.loads(cfg.to_json()))
    assert (note is not None) == (arch == "sas")
    if note is None:
        return
    assert "official SAS code" in note
    torch.manual_seed(0)
    model = LanguageModel(cfg).eval()
    ids = torch.randint(64, (2, 16))
    with torch.no_grad():
        for block in model.blocks:  # away from the initial values first
            block.attn_branch.gain.mul_(1.7)
            block.mlp_skip.gain.mul_(0.8)
        before = model(ids)
        for block in model.blocks:
            block.attn_branch.gain.mul_(3.0)
            block.mlp_skip.gain.div_(3.0)
        after = model(ids)
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-5)


def test_method_text_resolves_sizes_left_to_their_defaults():
    """A model saved with mlp_hidden and head_dim None reads as the sizes it has (4 d, d / H)."""
    from blocklab.report.method import _shape

    mc = ModelConfig.from_preset("pre-ln", "tiny", mlp_hidden=None, head_dim=None).to_dict()
    assert mc["mlp_hidden"] is None and mc["head_dim"] is None
    text = _shape(mc)
    assert "4 heads of 32" in text and "MLP 512 (relu)" in text and "None" not in text
