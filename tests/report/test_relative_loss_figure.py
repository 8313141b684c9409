"""The relative-loss figure (relative_loss.png) ends where the report's verdict says: its last point per
architecture is the verdict's "loss - baseline" and its error bar the verdict's 95% interval.

The runs are written by hand (metrics.jsonl, summary.json, model_config.json) so the test controls the
losses: the training-loss gap starts large and shrinks, the shape that made the old figure (an EMA of
training loss, beta 0.9 over 15 logged steps) end about three times too far from zero.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from blocklab import ModelConfig
from blocklab.compare import Entry
from blocklab.report import plots as report_plots
from blocklab.report import write_report
from blocklab.statistics import evidence
from blocklab.training import TrainConfig
from helpers import saved_figures

STEPS, LOG_EVERY, EVAL_EVERY = 150, 10, 50
# final validation gap to the baseline per seed (nats): small, and different per seed
FINAL_GAP = {"resformer": (-0.031, -0.024, -0.033), "svformer": (-0.090, -0.079, -0.084),
             "bov": (-0.072, -0.081, -0.080)}
EARLY_GAP = {"resformer": -0.6, "svformer": -0.7, "bov": -0.5}  # the training-loss gap at step 10


def _loss(step: int, seed: int) -> float:
    """The baseline's loss at `step`: falling from 6 nats, a little different per seed."""
    return 3.0 + 3.0 * 0.98 ** step + 0.01 * seed


def _gap(label: str, step: int, seed: int) -> float:
    """An architecture's gap to the baseline: EARLY_GAP at the start, shrinking to its final gap."""
    if label == "pre-ln" or step == 0:  # at initialisation every block predicts about uniformly
        return 0.0
    final = FINAL_GAP[label][seed]
    return final + (EARLY_GAP[label] - final) * 0.95 ** (step - LOG_EVERY)


def _write_run(root: Path, label: str, seed: int, steps: int = STEPS) -> TrainConfig:
    """One finished run's files as the trainer writes them, with the losses of `_loss` and `_gap`."""
    run = root / f"{label}-seed{seed}"
    run.mkdir(parents=True)
    model = ModelConfig.from_preset("pre-ln", "tiny", n_layers=1, d_model=16, n_heads=2, vocab_size=32,
                                    context_length=8)
    (run / "model_config.json").write_text(model.to_json())
    logged = range(LOG_EVERY, steps + 1, LOG_EVERY)
    rows = [{"kind": "train", "step": s, "tokens": 16 * s, "loss": _loss(s, seed) + _gap(label, s, seed),
             "lr": 1e-3, "grad_norm": 1.0, "wall_time": 0.01 * s} for s in logged]
    evals = sorted(set(range(0, steps, EVAL_EVERY)) | {steps})
    rows += [{"kind": "val", "step": s, "tokens": 16 * s, "wall_time": 0.01 * s,
              "val_loss": _loss(s, seed) + 0.2 + _gap(label, s, seed), "val_bpb": 1.0, "val_tokens": 64,
              "val_bytes": 64} for s in evals]
    rows.sort(key=lambda r: (r["step"], r["kind"] == "val"))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    final = rows[-1]
    summary = {"arch": label, "size": "tiny", "seed": seed,
               "params": {"total": 1000, "embedding": 512, "value_tables": 0, "non_embedding": 488},
               "flops_per_token": 6000, "step": steps, "tokens": 16 * steps, "train_time": 0.01 * steps,
               "tokens_per_s": 1600.0, "peak_memory_mib": 100.0, "device": "cpu",
               "val_loss": final["val_loss"], "val_bpb": final["val_bpb"], "unigram_loss": 5.5}
    (run / "summary.json").write_text(json.dumps(summary))
    return TrainConfig(arch="pre-ln", size="tiny", max_steps=steps, batch_size=2, seq_len=8, seed=seed,
                       eval_every=EVAL_EVERY, log_every=LOG_EVERY, out_dir=str(run))


def _verdict(report: str) -> dict[str, dict[str, str]]:
    """The verdict table's rows by architecture: {column: cell}."""
    section = report.split("## Verdict", 1)[1].split("\n\n| ", 1)[1]  # its first table
    lines = ("| " + section.split("\n\n", 1)[0]).splitlines()
    lines = [line for line in lines if line.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return {cells[1]: dict(zip(head, cells, strict=True))
            for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[1:])}


def _old_ema_end(label: str, seeds: range) -> float:
    """Where the old figure ended: EMA (beta 0.9) of the mean training loss, minus the baseline's."""
    def ema_end(name: str) -> float:
        avg = None
        for s in range(LOG_EVERY, STEPS + 1, LOG_EVERY):
            v = statistics.fmean(_loss(s, seed) + _gap(name, s, seed) for seed in seeds)
            avg = v if avg is None else 0.9 * avg + 0.1 * v
        assert avg is not None
        return avg

    return ema_end(label) - ema_end("pre-ln")


def test_the_relative_loss_figure_ends_at_the_verdicts_differences(tmp_path, monkeypatch):
    figures = saved_figures(monkeypatch)
    seeds = range(3)
    labels = ["pre-ln", *FINAL_GAP]
    runs = [(entry, _write_run(tmp_path / "runs", entry.label, seed))
            for entry in map(Entry.parse, labels) for seed in seeds]
    out = tmp_path / "report"
    text = write_report(runs, out).read_text()
    verdict = _verdict(text)
    # the figure as drawn: the only one whose lines are every architecture but the baseline
    relative = [fig for fig in figures
                if {line.get_label() for line in fig.axes[0].get_lines()
                    if not line.get_label().startswith("_")} == set(FINAL_GAP)]
    assert len(relative) == 1
    drawn = {line.get_label(): line for line in relative[0].axes[0].get_lines()}
    stated = {label: float(verdict[label]["loss - baseline"]) for label in FINAL_GAP}
    for label in FINAL_GAP:
        by_hand = statistics.fmean(_gap(label, STEPS, seed) for seed in seeds)  # as the runs were written
        assert stated[label] == pytest.approx(by_hand, abs=1e-4)
        # this is the case the old figure got wrong: its EMA ended far from the stated difference
        assert abs(_old_ema_end(label, seeds) - stated[label]) > 0.05
        assert drawn[label].get_ydata()[-1] == pytest.approx(stated[label], abs=0.01)
        assert drawn[label].get_xdata()[-1] == STEPS
    # the numbers drawn are written beside the figure, with the verdict's intervals
    data = json.loads((out / "relative_loss.json").read_text())
    assert data["baseline"] == "pre-ln" and relative[0].axes[0].get_ylabel() == data["quantity"]
    assert data["quantity"].startswith("validation loss - pre-ln's")
    for label in FINAL_GAP:
        series = data["architectures"][label]
        assert series[-1]["mean"] == pytest.approx(stated[label], abs=5e-5)  # the table has 4 decimals
        low, high = (float(x) for x in verdict[label]["95% CI (t)"].strip("[]").split(","))
        assert (series[-1]["low"], series[-1]["high"]) == (pytest.approx(low, abs=5e-5),
                                                           pytest.approx(high, abs=5e-5))
        assert series[-1]["n"] == 3
        # every evaluation is drawn: steps 0, 50, 100 and the final 150
        assert [p["step"] for p in series] == [0, 50, 100, 150]
        assert list(drawn[label].get_ydata()) == pytest.approx([p["mean"] for p in series])
    assert "relative_loss.json" in text and "Nothing is smoothed" in text


def test_runs_that_end_at_different_steps_pair_their_final_evaluations(tmp_path):
    """Equal-FLOPs budgets: a cheaper block takes more steps. The earlier points compare equal steps
    below the first run's end; the last compares the final losses, as the verdict does."""
    base = [_read(_write_run(tmp_path, "pre-ln", seed, steps=150)) for seed in (0, 1)]
    other = [_read(_write_run(tmp_path, "bov", seed, steps=170)) for seed in (0, 1)]
    series = report_plots.relative_series(other, base)
    assert [p["step"] for p in series] == [0, 50, 100, 170]  # 150 is the baseline's end, not shared
    finals = [o["summary"]["val_loss"] - b["summary"]["val_loss"] for o, b in zip(other, base, strict=True)]
    iv = evidence.t_interval(finals)
    last = series[-1]
    assert (last["mean"], last["low"], last["high"]) == pytest.approx((iv.mean, iv.low, iv.high))
    at_50 = [_gap("bov", 50, seed) for seed in (0, 1)]
    assert series[1]["mean"] == pytest.approx(statistics.fmean(at_50))
    # a run with no seed in common with the baseline is not compared, as in the verdict
    assert report_plots.relative_series(other[1:], base[:1]) == []


def _read(cfg: TrainConfig) -> dict:
    run = Path(cfg.out_dir)
    return {"summary": json.loads((run / "summary.json").read_text()),
            "metrics": [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]}
