"""A blocklab export read back (interop/checkpoint.py, export_files.py): a damaged file or a dtype
blocklab cannot compute in is one line naming the file, not a traceback."""

from __future__ import annotations

import pytest

from blocklab.cli import main


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
