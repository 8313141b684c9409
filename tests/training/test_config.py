"""Bad input gets a clear error naming the culprit, before any expensive work, and changes no saved file."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import torch

import blocklab
from blocklab.cli import main
from blocklab.training import TrainConfig
from blocklab.training.checkpoint import latest_checkpoint, list_checkpoints
from blocklab.util.errors import ConfigError
from helpers import small_run_args

small = small_run_args  # `blocklab train` overrides of a run that takes a second


@pytest.fixture(scope="module")
def finished_run(corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    out = root / "run"
    assert main(["train", *small(corpus, root / "cache"), "max_steps=2", "--out", str(out)]) == 0
    return out


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


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


def test_yaml_nested_thousands_deep_is_one_error_line(tmp_path, capsys):
    """A config file or an override nested 5,000 deep was a RecursionError traceback."""
    deep = "[" * 5000 + "]" * 5000
    (tmp_path / "deep.yaml").write_text(f"max_steps: 2\nmodel: {{x: {deep}}}\n")
    for argv, named in ((["train", str(tmp_path / "deep.yaml")], "deep.yaml"),
                        (["train", "max_steps=2", f"model.x={deep}"], "override model.x")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("blocklab: error: ") and len(err.strip().splitlines()) == 1, err[:300]
        assert named in err and "nested too deeply" in err


def test_bad_yaml_names_the_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_steps: 2\nmodel: [1, 2\n")
    assert main(["train", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "not valid YAML" in err and "line" in err
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    assert main(["train", str(tmp_path / "list.yaml")]) == 2
    assert "mapping" in capsys.readouterr().err


@pytest.mark.parametrize("text, key, lines", [
    ("arch: pre-ln\nmax_steps: 2\narch: sas\n", "arch", (1, 3)),
    ("max_steps: 2\noptim:\n  lr: 1e-3\n  name: adamw\n  lr: 3e-3\n", "lr", (3, 5)),
    ("max_steps: 2\nmodel: {value_path_options: {anchors: [1], anchors: [2]}}\n", "anchors", (2, 2)),
])
def test_a_key_given_twice_in_a_yaml_config_is_refused_with_both_lines(text, key, lines, tmp_path, capsys):
    """PyYAML keeps the last of two equal keys: `arch: pre-ln` then `arch: sas` trained SAS silently."""
    (tmp_path / "twice.yaml").write_text(text)
    assert main(["train", str(tmp_path / "twice.yaml"), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "twice.yaml" in err
    assert f"gives {key!r} twice, at line {lines[0]} and line {lines[1]}" in err
    assert not (tmp_path / "run").exists()


def test_a_merge_key_is_no_repeat():
    from blocklab.util import yamltext

    text = "base: &b {lr: 1, name: adamw}\noptim:\n  <<: *b\n  lr: 2\n"
    assert yamltext.load(text) == {"base": {"lr": 1, "name": "adamw"}, "optim": {"lr": 2, "name": "adamw"}}


def test_resume_of_an_empty_or_missing_dir(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for d in ("empty", "missing"):
        assert main(["train", "--resume", "--out", str(tmp_path / d)]) == 2
        err = capsys.readouterr().err
        assert "holds no run to continue" in err and d in err and "budget" not in err


@pytest.mark.parametrize("damage", ["truncate", "extend", "not-a-dict"])
def test_damaged_state_json_is_named(damage, corpus, finished_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    state = latest_checkpoint(run) / "state.json"
    text = state.read_text()
    damaged = {"truncate": text[: len(text) // 2], "extend": text + "}}", "not-a-dict": "[1, 2]"}
    state.write_text(damaged[damage])
    before = digest(run)
    assert main(["train", "--resume", "--out", str(run), "max_steps=4"]) == 2
    err = capsys.readouterr().err
    assert str(state) in err and "damaged" in err
    assert digest(run) == before


def test_partial_checkpoint_writes_are_removed_on_the_next_start(corpus, finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    partial = run / "checkpoints" / ".tmp-step_000009-12345"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    assert main(["train", "--resume", "--out", str(run), "max_steps=3"]) == 0
    assert not partial.exists() and [p.name for p in list_checkpoints(run)][-1] == "step_000003"


def test_compare_and_export_refuse_bad_input(finished_run, tmp_path, capsys):
    for args, words in ((["compare", "--seeds", "0"], ["--seeds", "'0'"]),
                        (["compare", "--seeds", "two"], ["--seeds", "'two'"]),
                        (["compare", "--lr-sweep", "1e-3,fast", "--steps", "1"], ["--lr-sweep", "fast"]),
                        (["export", "--run", str(tmp_path / "nope"), "--out", str(tmp_path / "e")],
                         ["nope", "not a blocklab run"])):
        try:
            code = main(args)
        except SystemExit as stop:  # argparse's own errors exit 2 from parse_args
            code = stop.code
        assert code == 2, args
        err = capsys.readouterr().err
        assert "Traceback" not in err and all(w in err for w in words), (args, err)
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    assert main(["export", "--run", str(finished_run), "--out", str(full)]) == 2
    assert "notes.txt" in capsys.readouterr().err and (full / "notes.txt").read_text() == "mine"


def test_compare_python_api_refuses_no_seeds_or_no_architectures(tmp_path):
    from blocklab.compare import compare

    with pytest.raises(ConfigError, match="seeds = 0"):
        compare(["pre-ln"], tmp_path, seeds=0)
    with pytest.raises(ConfigError, match="at least one architecture"):
        compare([], tmp_path)


def test_transformer_names_bad_token_ids():
    model = blocklab.Transformer(blocklab.ModelConfig.from_preset("pre-ln", "tiny", vocab_size=50, d_model=32,
                                                                  n_heads=2, n_layers=1))
    for ids, words in ((torch.tensor([[1, 50]]), ["[0, vocab_size=50)", "50"]),
                       (torch.tensor([[-1, 3]]), ["[0, vocab_size=50)", "-1"]),
                       (torch.rand(1, 3), ["integer", "float32"]),
                       (torch.tensor([1, 2]), ["(batch, time)", "(2,)"]),
                       ([[1, 2]], ["tensor", "list"])):
        with pytest.raises(ValueError) as err:
            model(ids)
        assert all(w in str(err.value) for w in words), (ids, err.value)
    assert model(torch.tensor([[0, 49]])).shape == (1, 2, 50)


def test_integral_float_budgets_are_accepted():
    assert TrainConfig(max_tokens=5e6).max_tokens == 5_000_000
    assert isinstance(TrainConfig(max_steps=200.0).max_steps, int)


def test_a_damaged_export_is_named_without_a_traceback(corpus, finished_run, tmp_path, capsys):
    """An export whose model.safetensors is not safetensors, without the sha256 that would catch it
    first (an export edited by hand, or an older one): one line naming the file, exit 2."""
    import json

    export = tmp_path / "export"
    assert main(["export", "--run", str(finished_run), "--out", str(export)]) == 0
    config = json.loads((export / "config.json").read_text())
    config.pop("blocklab_sha256"), config.pop("blocklab_config_sha256")  # as an older export
    (export / "config.json").write_text(json.dumps(config))
    (export / "model.safetensors").write_text("not safetensors\n")
    capsys.readouterr()
    args = [f"data.source={corpus}", "data.tokenizer=byte", f"data.cache_dir={tmp_path / 'cache'}",
            f"init_from={export}", "max_steps=1", "batch_size=2", "seq_len=16", "progress=false"]
    code = main(["train", *args, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"{export / 'model.safetensors'} is not a readable safetensors file" in err
    (export / "config.json").write_text("{torn")
    assert main(["train", *args, "--out", str(tmp_path / "run2")]) == 2
    assert f"{export / 'config.json'} is not valid JSON" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "int64", "nonsense"])
def test_an_export_of_a_dtype_blocklab_cannot_compute_in_is_refused(dtype, corpus, finished_run, tmp_path,
                                                                   capsys):
    """config.json's dtype float8_e4m3fn rounded the float32 weights to float8 and trained on, exit 0;
    int64 and a name torch lacks were tracebacks. Now one line naming the dtypes."""
    import json

    export = tmp_path / "export"
    assert main(["export", "--run", str(finished_run), "--out", str(export)]) == 0
    config = json.loads((export / "config.json").read_text())
    assert config["dtype"] == "float32"
    config.pop("blocklab_config_sha256")  # an export written before config.json recorded its fields
    (export / "config.json").write_text(json.dumps({**config, "dtype": dtype}))
    capsys.readouterr()
    args = [f"data.source={corpus}", "data.tokenizer=byte", f"data.cache_dir={tmp_path / 'cache'}",
            f"init_from={export}", "max_steps=1", "batch_size=2", "seq_len=16", "progress=false"]
    assert main(["train", *args, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err == (f"blocklab: error: {export / 'config.json'} has dtype = {dtype!r}, which blocklab cannot "
                   "compute in: a saved model's dtype must be one of float32, bfloat16, float16, float64.\n")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_an_internal_error_shows_its_traceback_and_asks_for_a_report(monkeypatch, capsys):
    import blocklab.cli as cli

    def broken(_args):
        raise RuntimeError("an invariant broke")

    monkeypatch.setattr(cli, "cmd_presets", broken)
    code = main(["presets"])
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback" in err and "RuntimeError: an invariant broke" in err
    assert "blocklab: internal error" in err and "Please report it" in err and "blocklab presets" in err


@pytest.mark.parametrize("error, code, line", [
    ((30, "Read-only file system", "/ro/runs"), 2,
     "cannot write '/ro/runs': the file system that holds it is read-only (Read-only file system). "
     "Give a path (such as --out) where this user can write."),
    ((13, "Permission denied", "/readonly/runs"), 2,
     "cannot write '/readonly/runs': this user has no permission there (Permission denied). "
     "Give a path (such as --out) where this user can write."),
    ((5, "Input/output error", "/disk/runs"), 1, "[Errno 5] Input/output error: '/disk/runs'"),
])
def test_an_error_of_the_machine_is_one_line(error, code, line, monkeypatch, capsys):
    """A read-only --out was a raw "[Errno 30] Read-only file system: ..." line, exit 1: now it names the
    path, the problem and what to do, exit 2 (a path to change); other errors of the machine stay as
    they were, exit 1."""
    import blocklab.cli as cli

    def refused(_args):
        raise OSError(*error)

    monkeypatch.setattr(cli, "cmd_presets", refused)
    assert main(["presets"]) == code
    assert capsys.readouterr().err == f"blocklab: error: {line}\n"


def test_a_read_only_out_is_named_before_anything_is_written(tmp_path, capsys):
    """A real read-only file system (a tmpfs mounted ro, as root) or a folder this user may not write
    (as another user): the lock beside --out is the first thing written, and its OSError is said
    plainly, exit 2."""
    import os
    import subprocess

    ro = tmp_path / "ro"
    ro.mkdir()
    root = os.geteuid() == 0
    if root:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)],
                                 capture_output=True)
        if mounted.returncode:
            pytest.skip("cannot mount a tmpfs here (a restricted container)")
    else:
        ro.chmod(0o555)
    try:
        assert main(["train", "--out", str(ro / "run"), "max_steps=1"]) == 2
    finally:
        subprocess.run(["umount", str(ro)], check=True) if root else ro.chmod(0o755)
    err = capsys.readouterr().err
    why = "the file system that holds it is read-only" if root else "this user has no permission there"
    said = f"{why} ({os.strerror(30 if root else 13)})"
    assert err == (f"blocklab: error: cannot write '{ro}/.run.lock': {said}. Give a path (such as --out) "
                   "where this user can write.\n")
