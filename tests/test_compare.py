"""`blocklab compare` end to end: equal budgets, the report's measured figures, valid PNGs, resume."""

from __future__ import annotations

import json
import math

import pytest
import torch

import blocklab
from blocklab.compare import GRIDS, compare
from blocklab.config import ConfigError
from blocklab.training import loop
from blocklab.training.metrics import read_metrics

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    for i in range(12):
        (root / f"m{i}.py").write_text("".join(f"x{j % 7} = y{(i + j) % 5} + {j}\n" for j in range(120)))
    return root


def base(corpus, cache, steps=4):
    return {"size": "tiny", "batch_size": 4, "seq_len": 32, "max_steps": steps, "eval_every": 2,
            "eval_batches": 2, "log_every": 1, "ckpt_every": 2, "progress": False,
            "model": {"d_model": 32, "n_layers": 3, "n_heads": 2},
            "data": {"source": str(corpus), "tokenizer": "byte", "cache_dir": str(cache)}}


def table_rows(report: str) -> dict[str, list[str]]:
    lines = [line for line in report.splitlines() if line.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[1:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(head, cells, strict=True))
    return rows


def test_compare_two_architectures_report(corpus, tmp_path):
    out = tmp_path / "cmp"
    report = compare(["pre-ln", "sas-p+bov"], out, seeds=2, base=base(corpus, tmp_path / "cache"),
                     log=lambda *_: None)
    text = report.read_text()
    rows = table_rows(text)
    assert set(rows) == {"pre-ln", "sas-p+bov"}
    for label in rows:
        runs = [out / "runs" / f"{label}-seed{s}" for s in (0, 1)]
        summaries = [json.loads((r / "summary.json").read_text()) for r in runs]
        assert all(s["step"] == 4 and s["tokens"] == 4 * 4 * 32 for s in summaries)  # equal budgets
        # parameters in the table are those of the trained model
        cfg = blocklab.ModelConfig(**json.loads((runs[0] / "model_config.json").read_text()))
        counts = blocklab.count_parameters(blocklab.Transformer(cfg))
        assert rows[label]["params"] == f"{counts.total / 1e6:.3f}M"
        assert rows[label]["non-embedding"] == f"{counts.non_embedding / 1e6:.3f}M"
        # validation loss: mean +- std over the two seeds, read from the runs
        losses = [s["val_loss"] for s in summaries]
        mean, std = sum(losses) / 2, abs(losses[0] - losses[1]) / math.sqrt(2)
        assert rows[label]["val loss"] == f"{mean:.4f} ± {std:.4f}"
        assert losses[0] != losses[1]  # the seeds really differ
    # BoV's value tables are counted apart from the embedding, and its cache is smaller
    assert float(rows["sas-p+bov"]["embedding + value tables"][:-1]) > float(rows["pre-ln"]
                                                                           ["embedding + value tables"][:-1])
    for name in ("val_loss_vs_step", "val_loss_vs_tokens", "val_loss_vs_wall_time", "relative_loss",
                 "scalars_sas-p_bov"):
        png = out / f"{name.replace('-', '_')}.png" if name.startswith("scalars") else out / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_SIGNATURE, name
        assert f"({png.name})" in text
        import matplotlib.image

        assert matplotlib.image.imread(png).ndim == 3
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 5 and "sas-p+bov" in page
    results = json.loads((out / "results.json").read_text())
    assert [r["label"] for r in results] == ["pre-ln", "sas-p+bov"]


def test_interrupted_compare_resumes(corpus, tmp_path, monkeypatch):
    out = tmp_path / "cmp"
    cfg = base(corpus, tmp_path / "cache", steps=6)
    real_step = loop.Trainer._step
    calls = {"n": 0}

    def dies_in_second_run(self):
        calls["n"] += 1
        if calls["n"] == 6 + 5:  # step 5 of the second run; its last checkpoint is step 4
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(loop.Trainer, "_step", dies_in_second_run)
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


def test_changed_config_is_not_silently_reused(corpus, tmp_path):
    out = tmp_path / "cmp"
    compare(["pre-ln"], out, base=base(corpus, tmp_path / "cache", steps=2), log=lambda *_: None)
    with pytest.raises(ConfigError, match="different config"):
        compare(["pre-ln"], out, base=base(corpus, tmp_path / "cache", steps=3), log=lambda *_: None)


def test_grids_name_buildable_configs():
    for name, grid in GRIDS.items():
        for entry in grid.entries:
            cfg = blocklab.ModelConfig.from_preset(entry.arch, "tiny", **entry.model)
            with torch.device("meta"):
                blocklab.Transformer(cfg)
        assert grid.description and len({e.label for e in grid.entries}) == len(grid.entries), name


def test_cli_compare_rejects_two_budgets(capsys):
    from blocklab.cli import main

    assert main(["compare", "--steps", "3", "--time", "5"]) == 2
    assert "one budget" in capsys.readouterr().err
