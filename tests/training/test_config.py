"""TrainConfig (training/config.py): a YAML file and dotted overrides, and every field checked by name,
in Python and through `blocklab train` (before any data is prepared; nothing saved is changed); the
crammed-bert recipe."""

from __future__ import annotations

from pathlib import Path

import pytest

import blocklab
from blocklab.cli import main
from blocklab.training import TrainConfig
from blocklab.util.errors import ConfigError
from helpers import digest, small_run_args

small = small_run_args  # `blocklab train` overrides of a run that takes a second


def test_config_yaml_and_dotted_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("arch: sas-p\nmax_steps: 10\noptim:\n  lr: 1.0e-3\nmodel:\n  n_layers: 3\n")
    cfg = TrainConfig.load(path, ["optim.lr=3e-4", "model.d_model=64", "data.tokenizer=byte", "seed=7"])
    assert (cfg.arch, cfg.max_steps, cfg.seed) == ("sas-p", 10, 7)
    assert cfg.optim.lr == 3e-4 and cfg.data.tokenizer == "byte"
    assert cfg.model == {"n_layers": 3, "d_model": 64}
    again = TrainConfig.load(None, cfg.to_dict())  # round trip through the dict form
    assert again.to_dict() == cfg.to_dict()
    model_cfg = cfg.model_config(vocab_size=300)
    assert (model_cfg.n_layers, model_cfg.d_model, model_cfg.vocab_size) == (3, 64, 300)
    assert model_cfg.context_length == cfg.seq_len and model_cfg.causal


@pytest.mark.parametrize("overrides, words", [
    ({}, ["budget", "max_steps"]),
    ({"max_steps": 5, "batch_szie": 3}, ["batch_szie", "batch_size"]),
    ({"max_steps": 5, "batch_size": 6, "grad_accum": 4}, ["batch_size", "grad_accum=4"]),
    ({"max_steps": -1}, ["max_steps", "positive"]),
    ({"max_steps": 5, "arch": "sass"}, ["sass"]),
    ({"max_steps": 5, "model": {"n_layer": 2}}, ["n_layer", "n_layers"]),
    ({"max_steps": 5, "device": "tpu"}, ["device", "'cpu'"]),
    ({"max_steps": 5, "threads": 0}, ["TrainConfig.threads = 0", "positive integer", "OMP_NUM_THREADS"]),
    ({"max_steps": 5, "threads": 1.5}, ["TrainConfig.threads = 1.5", "positive integer"]),
    ({"max_steps": 5, "threads": True}, ["TrainConfig.threads = True", "positive integer"]),
])
def test_bad_train_configs_name_the_field(overrides, words):
    with pytest.raises(ConfigError) as err:
        TrainConfig.load(None, overrides)
    for w in words:
        assert w in str(err.value)


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="key=value"):
        TrainConfig.load(None, ["max_steps"])
    with pytest.raises(ConfigError, match="nested"):
        TrainConfig.load(None, ["max_steps=3", "seed.x=1"])


BAD_TRAIN = [  # (overrides, words the message must hold)
    (["max_steps=0.5"], ["max_steps", "0.5", "integer"]),
    (["max_steps=2.5"], ["max_steps", "2.5", "integer"]),
    (["max_steps=0"], ["max_steps", "positive"]),
    (["max_steps=-3"], ["max_steps", "positive"]),
    (["max_tokens=10.5"], ["max_tokens", "integer"]),
    (["max_time=0"], ["max_time", "positive"]),
    (["max_steps=2", "model.vocab_size=100"], ["model.vocab_size", "100", "258"]),
    (["max_steps=2", "model.context_length=8"], ["seq_len", "context_length=8"]),
    (["max_steps=2", "batch_size=0"], ["batch_size", "positive"]),
    (["max_steps=2", "batch_size=3", "grad_accum=2"], ["batch_size", "grad_accum"]),
    (["max_steps=2", "seq_len=0"], ["seq_len"]),
    (["max_steps=2", "eval_every=-1"], ["eval_every"]),
    (["max_steps=2", "device=tpu"], ["device", "tpu"]),
    (["max_steps=2", "precision=fp8"], ["precision", "fp8"]),
    (["max_steps=2", "parallel=zero3"], ["parallel", "zero3"]),
    (["max_steps=2", "arch=sas-q"], ["sas-q"]),
    (["max_steps=2", "arch=resformr"], ["resformr"]),
    (["max_steps=2", "size=huge"], ["huge"]),
    (["max_steps=2", "model.n_layer=3"], ["n_layer", "n_layers"]),
    (["max_steps=2", "model.d_model=33"], ["d_model"]),
    (["max_steps=2", "optim.lr=-1"], ["lr"]),
    (["max_steps=2", "optim.name=sgdx"], ["sgdx"]),
    (["max_steps=2", "optim.schedule=zigzag"], ["zigzag"]),
    (["max_steps=2", "data.tokenizer=nope.json"], ["nope.json"]),
    (["max_steps=2", "data.objective=rlhf"], ["rlhf"]),
    (["max_steps=2", "bogus=1"], ["bogus"]),
    (["max_steps=2", "retrofit=resformer"], ["retrofit", "init_from"]),
    (["max_steps=2", "noequals"], ["noequals"]),
    ([], ["budget"]),
    (["size=tinny"], ["tinny", "Did you mean tiny"]),  # the misspelt size first, not the missing budget
    # a value path where the block goes, not "unknown architecture 'bov'. Did you mean bov?"
    (["max_steps=2", "arch=bov+bov"], ["'bov+bov' is not allowed", "'bov' is a value path", "pre-ln+bov"]),
    (["max_steps=2", "threads=abc"], ["threads", "'abc'", "positive integer"]),
    (["max_steps=2", "threads=0"], ["threads", "positive integer"]),
    (["max_steps=2", "threads=-2"], ["threads", "positive integer"]),
    (["max_steps=2", "seed=99999999999999999999"], ["seed", "99999999999999999999"]),
    (["max_steps=2", "optim=5"], ["optim", "5"]),
    (["max_steps=2", "data=[1]"], ["data", "[1]"]),
]


@pytest.mark.parametrize("overrides, words", BAD_TRAIN, ids=[" ".join(o) or "none" for o, _ in BAD_TRAIN])
def test_bad_train_input(overrides, words, corpus, finished_run, tmp_path, capsys):
    before = digest(finished_run)
    given = {o.split("=")[0] for o in overrides}
    base = [a for a in small(corpus, tmp_path / "cache") if a.split("=")[0] not in given]
    assert main(["train", *base, *overrides, "--out", str(tmp_path / "new")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("blocklab: error:") and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)
    if "model.vocab_size=100" not in overrides:  # the tokenizer's size is known once the data is prepared
        assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.bin")), \
            "refused after data preparation"
    assert not (tmp_path / "new" / "checkpoints").exists()
    assert digest(finished_run) == before


def test_integral_float_budgets_are_accepted():
    assert TrainConfig(max_tokens=5e6).max_tokens == 5_000_000
    assert isinstance(TrainConfig(max_steps=200.0).max_steps, int)


def test_crammed_bert_recipe(corpus, tmp_path):
    cfg = TrainConfig.load("crammed-bert", ["arch=sas-p"])
    assert (cfg.data.objective, cfg.data.mask_prob, cfg.seq_len) == ("mlm", 0.25, 128)
    assert (tuple(cfg.optim.betas), cfg.optim.eps, cfg.optim.grad_clip) == ((0.9, 0.98), 1e-12, 0.5)
    assert (cfg.optim.schedule, cfg.optim.peak_at, cfg.max_time) == ("one-cycle", 0.75, 86400)
    assert (cfg.optim.weight_decay, cfg.optim.lr) == (0.1, 1e-3)  # App. D.2 "weight decay 0.1"; Cramming lr
    model_cfg = cfg.model_config(32768)
    assert not model_cfg.causal and model_cfg.norm_eps == 1e-12 and model_cfg.n_layers == 16
    # the per-block overrides the recipe documents (App. D.2: peak lr 3e-3 / 2e-3, beta_FF = 0.05)
    text = (Path(blocklab.__file__).parent / "recipes" / "crammed-bert.yaml").read_text()
    for arch, lr in (("sas-p", "3e-3"), ("sas-p-nonorm", "2e-3")):
        overrides = [f"optim.lr={lr}", "model.mlp_branch_gain=0.05"]
        assert " ".join(overrides) in text
        tuned = TrainConfig.load("crammed-bert", [f"arch={arch}", *overrides])
        assert tuned.optim.lr == float(lr) and tuned.model_config(32768).mlp_branch_gain == 0.05
        assert TrainConfig.load("crammed-bert", [f"arch={arch}"]).model_config(32768).mlp_branch_gain == 0.1
    with pytest.raises(ConfigError, match="crammed-bert"):
        TrainConfig.load("no-such-recipe")
