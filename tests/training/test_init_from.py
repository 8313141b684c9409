"""A run started from another (training/init_from.py: `init_from`, `retrofit`): continued pretraining of
a retrofitted run and its resume once the source is gone; the source's architecture recorded, and
another named refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from blocklab.cli import main
from blocklab.training import TrainConfig, train
from blocklab.training.metrics import read_metrics
from blocklab.util.errors import ConfigError
from tests.training.tiny_runs import (
    FROM_SOURCE,
    config,
    stopped_during_step_5,
    train_losses,
    write_word_corpus,
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The word corpus of tests/training/tiny_runs.py, written once per module."""
    return write_word_corpus(tmp_path_factory.mktemp("corpus"))


def test_continued_pretraining_of_a_retrofitted_run(corpus, tmp_path):
    from blocklab.training import load_run

    base = train(config(corpus, tmp_path / "base", max_steps=40, eval_every=0, eval_batches=4)).run_dir
    base_val = json.loads((base / "summary.json").read_text())["val_loss"]
    # data.tokenizer "bpe" (train a new one) takes the source's tokenizer.json instead
    data = {"source": str(corpus), "tokenizer": "bpe", "cache_dir": str(tmp_path / "cache"),
            "val_fraction": 0.1}
    cont = config(corpus, tmp_path / "cont", **FROM_SOURCE, init_from=str(base),
                  retrofit="resformer-learnable", max_steps=20, eval_every=5, eval_batches=4, ckpt_every=10,
                  data=data, optim={"lr": 1e-3, "warmup_fraction": 0.0})
    result = train(cont)
    vals = [r["val_loss"] for r in read_metrics(result.run_dir / "metrics.jsonl", "val")]
    # step 0 is the baseline's function (lambda_1 = 0, lambda_2 = 1) on the same validation batches
    assert vals[0] == pytest.approx(base_val, abs=1e-5)
    assert len(vals) == 5 and vals[-1] < vals[0] - 0.01 and min(vals[1:]) < vals[0]
    saved = json.loads((result.run_dir / "model_config.json").read_text())
    assert saved["value_path"] == "resformer-learnable"
    assert saved["value_path_options"] == {"lambda1": 0.0, "lambda2": 1.0}
    assert TrainConfig.load(result.run_dir / "config.yaml").data.tokenizer == str(base / "tokenizer.json")
    run = load_run(result.run_dir)  # the retrofitted config and weights load back
    ids = torch.randint(0, 256, (2, 16))
    torch.testing.assert_close(run.model(ids), result.model.eval()(ids))
    assert (result.run_dir / "tokenizer.json").read_text() == (base / "tokenizer.json").read_text()
    # --resume rebuilds the same retrofitted model and continues from step 20
    more = train(config(corpus, tmp_path / "cont", **FROM_SOURCE, init_from=str(base),
                        retrofit="resformer-learnable", max_steps=24, eval_every=0, eval_batches=4, data=data,
                        optim={"lr": 1e-3, "warmup_fraction": 0.0}), resume=True)
    assert more.summary["step"] == 24

    # an export folder works as a source too, and a different tokenizer is refused
    from blocklab.interop import save_pretrained

    export = save_pretrained(run.model, tmp_path / "export", tokenizer=base / "tokenizer.json")
    other = {**data, "tokenizer": "byte", "eos_token": "<|sep|>"}
    with pytest.raises(ConfigError, match="differs from the tokenizer"):
        train(config(corpus, tmp_path / "bad", **FROM_SOURCE, init_from=str(export), max_steps=1, data=other))
    with pytest.raises(ConfigError, match="value_path='resformer-learnable'"):  # not a baseline any more
        train(config(corpus, tmp_path / "again", **FROM_SOURCE, init_from=str(export), retrofit="bov",
                     max_steps=1, data=data))


@pytest.mark.parametrize("overrides, words", [
    ({"retrofit": "resformer"}, ["retrofit", "init_from"]),
    ({"init_from": "runs/a", "retrofit": "resformr"}, ["'resformr'", "resformer-learnable", "bov"]),
    ({"init_from": "runs/a", "model": {"n_layers": 3}}, ["model", "init_from"]),
])
def test_bad_init_from_and_retrofit(overrides, words):
    with pytest.raises(ConfigError) as err:
        TrainConfig.load(None, {"max_steps": 5, **overrides})
    for w in words:
        assert w in str(err.value)


def test_cli_train_init_from_and_retrofit(corpus, tmp_path):
    from blocklab.cli import main
    from blocklab.training import load_run

    base = train(config(corpus, tmp_path / "base", max_steps=2, eval_every=0)).run_dir
    common = ["max_steps=2", "batch_size=4", "seq_len=32", "progress=false", f"data.source={corpus}",
              f"data.cache_dir={tmp_path / 'cache'}"]
    out = tmp_path / "cli"
    assert main(["train", f"init_from={base}", "retrofit=pre-ln+resformer-learnable", *common,
                 "--out", str(out)]) == 0
    assert load_run(out).model.cfg.value_path == "resformer-learnable"
    assert main(["train", "retrofit=resformer-learnable", *common, "--out", str(tmp_path / "x")]) == 2
    assert main(["train", f"init_from={tmp_path / 'nothing'}", *common, "--out", str(tmp_path / "y")]) == 2


def test_an_init_from_run_resumes_after_its_source_is_gone(corpus, tmp_path, monkeypatch):
    """A run started from another (its BPE tokenizer, retrofitted with ResFormer) and cut off resumes
    from its own checkpoint after the source folder is deleted, to the curve of an uninterrupted run:
    the model config and tokenizer come from the run's folder, the weights from its checkpoint."""
    bpe = {"source": str(corpus), "tokenizer": "bpe", "vocab_size": 300, "cache_dir": str(tmp_path / "cache"),
           "val_fraction": 0.1}
    src = train(config(corpus, tmp_path / "src", max_steps=2, eval_every=0, data=bpe)).run_dir
    base = dict(FROM_SOURCE, max_steps=8, ckpt_every=3, eval_every=4, data=bpe, init_from=str(src),
                retrofit="resformer")
    full = train(config(corpus, tmp_path / "a", **base))
    stopped_during_step_5(config(corpus, tmp_path / "b", **base), monkeypatch)
    shutil.rmtree(src)
    resumed = train(config(corpus, tmp_path / "b", **base), resume=True)
    assert resumed.model.cfg.value_path == "resformer" and resumed.summary["resumed_at"] == [3]
    assert train_losses(resumed.run_dir) == train_losses(full.run_dir)  # bit-identical on CPU
    for p_full, p_res in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p_full, p_res)


def test_init_from_records_the_architecture_trained_and_refuses_another(tmp_path, capsys):
    """`train arch=sas size=small init_from=A` recorded sas/small for A's model, and a SAS-P source was
    labelled pre-ln: an arch or size other than the source's is refused, naming both, and a
    run from a SAS-P source records sas-p and its size in config.yaml and summary.json, also on resume;
    a compare of several architectures from one source is refused."""
    import yaml

    from blocklab.compare import resolve_compare
    from helpers import write_code_corpus

    (tmp_path / "corpus").mkdir()
    corpus = write_code_corpus(tmp_path / "corpus")
    common = [f"data.source={corpus}", "data.tokenizer=byte", f"data.cache_dir={tmp_path / 'cache'}",
              "batch_size=2", "seq_len=16", "progress=false", "eval_every=0", "eval_batches=1"]
    source = tmp_path / "source"
    assert main(["train", *common, "arch=sas-p", "size=tiny", "max_steps=1", "--out", str(source)]) == 0
    run = tmp_path / "run"
    for given in (["arch=sas", "size=small"], ["arch=pre-ln+bov"], ["size=small"]):
        capsys.readouterr()
        assert main(["train", *common, f"init_from={source}", *given, "max_steps=2", "--out", str(run)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("blocklab: error: ") and len(err.strip().splitlines()) == 1
        for name, _, value in (g.partition("=") for g in given):
            assert f"{name} = {value!r}" in err, err
        assert "a 'sas-p' of size 'tiny'" in err and not run.exists()
    assert main(["train", *common, f"init_from={source}", "max_steps=2", "--out", str(run)]) == 0
    assert f"{run}: sas-p seed 0" in capsys.readouterr().out  # the result line
    summary = json.loads((run / "summary.json").read_text())
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert (summary["arch"], summary["size"], config["arch"], config["size"]) == ("sas-p", "tiny") * 2
    assert main(["train", "--resume", "--out", str(run), "max_steps=3"]) == 0  # the recorded names pass
    assert json.loads((run / "summary.json").read_text())["arch"] == "sas-p"
    with pytest.raises(ConfigError, match=r"init_from = .* with 2 architectures is not allowed"):
        resolve_compare(["pre-ln", "sas"], None, {"max_steps": 2}, overrides=[f"init_from={source}"])


def test_init_from_refuses_the_default_architecture_named_explicitly(tmp_path, capsys):
    """`arch=pre-ln` (or `size=tiny`) with init_from of a SAS-P was taken for "not given", since it is
    TrainConfig's default: the run trained the SAS-P and was relabelled. Now a name given, on the command
    line, in a YAML config or through the Python API, is checked against the source like any other;
    left out, the run records the source's."""
    import yaml

    from blocklab.training import TrainConfig, train
    from helpers import write_code_corpus

    (tmp_path / "corpus").mkdir()
    corpus = write_code_corpus(tmp_path / "corpus")
    common = [f"data.source={corpus}", "data.tokenizer=byte", f"data.cache_dir={tmp_path / 'cache'}",
              "batch_size=2", "seq_len=16", "progress=false", "eval_every=0", "eval_batches=1"]
    source = tmp_path / "source"
    assert main(["train", *common, "arch=sas-p", "model.n_layers=2", "max_steps=1", "--out",
                 str(source)]) == 0
    run = tmp_path / "run"
    (tmp_path / "explicit.yaml").write_text("arch: pre-ln\n")
    for given in (["arch=pre-ln"], ["size=tiny"], [str(tmp_path / "explicit.yaml")]):
        capsys.readouterr()
        assert main(["train", *given, *common, f"init_from={source}", "max_steps=2", "--out", str(run)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("blocklab: error: ") and len(err.strip().splitlines()) == 1
        assert ("size = 'tiny'" if given == ["size=tiny"] else "arch = 'pre-ln'") in err, err
        assert "a 'sas-p' of size 'custom'" in err and not run.exists()
    fields = yaml.safe_load((source / "config.yaml").read_text())
    fields = {**{k: v for k, v in fields.items() if k not in ("arch", "size", "model", "out_dir")},
              "init_from": str(source), "max_steps": 2, "out_dir": str(run)}
    with pytest.raises(ConfigError, match="arch = 'pre-ln' with init_from"):
        train(TrainConfig.from_dict({**fields, "arch": "pre-ln"}))
    assert not run.exists()
    assert TrainConfig.from_dict(fields).arch is None  # left out: the source's, once it is read
    assert train(TrainConfig.from_dict(fields)).summary["arch"] == "sas-p"
    assert (TrainConfig(max_steps=1).arch, TrainConfig(max_steps=1).size) == ("pre-ln", "tiny")
