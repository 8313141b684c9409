"""A finished run read back (training/runs.py): `load_run` gives its model and tokenizer, and
`blocklab export` and `blocklab diagnose` read it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import blocklab
from blocklab.training import train
from tests.training.tiny_runs import config, write_word_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The word corpus of tests/training/tiny_runs.py, written once per module."""
    return write_word_corpus(tmp_path_factory.mktemp("corpus"))


def test_load_run_gives_the_trained_model_and_tokenizer(corpus, tmp_path):
    from blocklab.training import load_run

    result = train(config(corpus, tmp_path, max_steps=2))
    run = load_run(result.run_dir)
    ids = torch.tensor([run.tokenizer.encode("def value")])
    torch.testing.assert_close(run.model(ids), result.model.eval()(ids))
    assert run.tokenizer.decode(ids[0].tolist()) == "def value" and run.config.max_steps == 2
    with pytest.raises(FileNotFoundError, match="not a blocklab run"):
        load_run(tmp_path)


def test_cli_export_and_diagnose_a_run(corpus, tmp_path):
    from blocklab.cli import main
    from blocklab.interop import load_pretrained

    a = train(config(corpus, tmp_path / "a", arch="sas", max_steps=3)).run_dir
    b = train(config(corpus, tmp_path / "b", arch="pre-ln+resformer", max_steps=3)).run_dir
    assert main(["export", "--run", str(a), "--out", str(tmp_path / "export")]) == 0
    ids = torch.randint(0, 256, (1, 12))
    model = load_pretrained(tmp_path / "export")
    torch.testing.assert_close(model(ids), blocklab.training.load_run(a).model(ids))
    assert (tmp_path / "export" / "tokenizer.json").read_text() == (a / "tokenizer.json").read_text()

    assert main(["diagnose", "--run", str(a), "--batches", "1"]) == 0
    results = json.loads((a / "diagnostics" / "diagnostics.json").read_text())
    assert {"entropy", "value_norm", "hidden_norm", "similarity", "spectrum"} <= set(results)
    assert (a / "diagnostics" / "entropy.png").read_bytes()[:4] == b"\x89PNG"
    assert (a / "diagnostics" / "scalars.png").is_file()  # SAS has learned scalars in metrics.jsonl
    out = tmp_path / "overlay"
    assert main(["diagnose", "--compare", str(a), str(b), "--out", str(out), "--batches", "1"]) == 0
    assert any(p.suffix == ".png" for p in out.iterdir())
