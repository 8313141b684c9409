"""What a new user meets in the first hour: the CLI's version, help and hints, dict overrides, file
modes of a run, and what Ctrl-C and --resume say."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import blocklab
from blocklab import ConfigError, ModelConfig
from blocklab.cli import main
from blocklab.training.config import TrainConfig, apply_overrides
from helpers import small_run_args
from timeouts import patient


def test_version_and_help_answer_without_importing_torch():
    code = ("import sys; from blocklab.cli import main\n"
            "for argv in (['--version'], ['--help'], ['train', '--help'], ['import-hf', '--help']):\n"
            "    try: main(argv)\n"
            "    except SystemExit: pass\n"
            "print('torch loaded:', 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=patient(120)).stdout
    assert f"blocklab {blocklab.__version__} (torch " in out
    assert "examples:" in out and "blocklab compare --archs" in out
    assert "usage: blocklab import-hf [-h] --out OUT [--overwrite] DIR" in out
    assert out.rstrip().endswith("torch loaded: False")


@pytest.mark.parametrize("arch, suggestion", [("resformr", "resformer"), ("sas-p+bvo", "bov"),
                                              ("sasp", "sas-p")])
def test_a_misspelled_architecture_suggests_block_presets_and_value_paths(arch, suggestion):
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_preset(arch)
    message = str(err.value)
    assert f"Did you mean {suggestion}" in message
    assert "`blocklab presets`" in message and "list_presets()" not in message
    assert "bov" in message  # value paths are among the known names


def test_dotted_overrides_reach_into_dict_fields():
    data = apply_overrides({}, ["arch=pre-ln+bov", "model.value_path_options.layers=[1, 2]",
                                "model.value_path_options.coef=0.5", "max_steps=3"])
    assert data["model"] == {"value_path_options": {"layers": [1, 2], "coef": 0.5}}
    cfg = TrainConfig.from_dict(data).model_config(vocab_size=64)
    assert cfg.value_path_options == {"layers": [1, 2], "coef": 0.5}
    with pytest.raises(ConfigError, match="is not a dict"):
        apply_overrides({"model": {"n_layers": 2}}, ["model.n_layers.x=3"])


# -- a tiny run on a local corpus ------------------------------------------------------------------------
small = small_run_args


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


def test_every_file_of_a_run_and_an_export_has_the_umask_mode(corpus, tmp_path, capsys):
    old = os.umask(0o022)
    try:
        run = tmp_path / "run"
        assert main(["train", *small(corpus, tmp_path / "cache"), "max_steps=2", "--threads", "1",
                     "--out", str(run)]) == 0
        assert "threads: 1" in (run / "config.yaml").read_text()
        assert main(["export", "--run", str(run), "--out", str(tmp_path / "export")]) == 0
    finally:
        os.umask(old)
    capsys.readouterr()
    for root in (run, tmp_path / "export"):
        modes = _modes(root)
        files = {m for p, m in modes.items() if (root / p).is_file() and p != "."}
        folders = {m for p, m in modes.items() if (root / p).is_dir()}
        assert files == {0o644}, modes  # model.safetensors included (safetensors writes 0600)
        assert folders == {0o755}, modes


def test_ctrl_c_and_resume_say_what_happens(corpus, tmp_path, capsys, monkeypatch):
    import blocklab.training as training

    out = tmp_path / "run"
    args = ["train", *small(corpus, tmp_path / "cache"), "max_steps=4", "eval_every=2", "--out", str(out)]

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:  # Ctrl-C before the first checkpoint
        m.setattr(training, "train", interrupted)
        assert main(args) == 130
    err = capsys.readouterr().err
    assert "has no checkpoint yet, so a rerun starts from step 0" in err and "--resume to continue" not in err

    out.mkdir()  # --resume of a run that holds no checkpoint says it starts again
    (out / "config.yaml").write_text(TrainConfig.from_dict(
        apply_overrides({"out_dir": str(out)}, args[1:-2] + ["max_steps=4", "eval_every=2"])).to_yaml())
    assert main(["train", "--resume", "--out", str(out)]) == 0
    assert "holds no checkpoint yet" in capsys.readouterr().err

    with monkeypatch.context() as m:  # Ctrl-C with a checkpoint: the resume command and its step
        m.setattr(training, "train", interrupted)
        assert main(args) == 130
    assert f"blocklab train --resume --out {out}` continues from step_000004" in capsys.readouterr().err

    assert main(["train", "--resume", "--out", str(out), "max_steps=6"]) == 0  # a larger budget
    err = capsys.readouterr().err
    assert "the budget changes from max_steps=4 to max_steps=6" in err and "schedule is recomputed" in err
