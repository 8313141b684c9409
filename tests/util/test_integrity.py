"""Checksummed runs and exports: a changed file is refused by name, not loaded as the trained model."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from blocklab.cli import main
from blocklab.interop import load_pretrained, save_pretrained
from blocklab.training import load_run
from blocklab.training.checkpoint import latest_checkpoint
from blocklab.util.integrity import IntegrityError, sha256


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity")
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(30):
        (corpus / f"f{i}.py").write_text("".join(f"name_{j % 7} = {i} * {j}\n" for j in range(60)))
    out = root / "run"
    assert main(["train", f"data.source={corpus}", "data.tokenizer=byte", f"data.cache_dir={root / 'cache'}",
                 "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "batch_size=2", "seq_len=16",
                 "progress=false", "max_steps=2", "--out", str(out)]) == 0
    return out


def copy(run, tmp_path):
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def flip_byte(path, at=-5):
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_checkpoint_records_the_sha256_of_its_files_and_the_run(run):
    meta = json.loads((latest_checkpoint(run) / "state.json").read_text())
    ck = latest_checkpoint(run)
    assert meta["sha256"] == {"model.safetensors": sha256(ck / "model.safetensors"),
                              "optimizer.pt": sha256(ck / "optimizer.pt")}
    assert meta["run_sha256"] == {"model_config.json": sha256(run / "model_config.json"),
                                  "tokenizer.json": sha256(run / "tokenizer.json")}


@pytest.mark.parametrize("target", ["model.safetensors", "optimizer.pt", "model_config.json",
                                    "tokenizer.json"])
def test_resume_refuses_a_changed_file_by_name(target, run, tmp_path, capsys):
    r = copy(run, tmp_path)
    path = (latest_checkpoint(r) / target) if target.endswith((".safetensors", ".pt")) else r / target
    if target == "model_config.json":  # an edit that still parses: ReLU weights read as GELU
        cfg = json.loads(path.read_text())
        cfg["mlp_act"] = "gelu" if cfg["mlp_act"] != "gelu" else "relu"
        path.write_text(json.dumps(cfg))
    elif target == "tokenizer.json":
        path.write_text(path.read_text().replace('"type"', '"type" ', 1))
    else:
        flip_byte(path)
    assert main(["train", "--resume", "--out", str(r), "max_steps=4"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "changed since it was saved" in err
    if target != "optimizer.pt":  # loading a model reads the weights, the config and the tokenizer
        with pytest.raises(IntegrityError, match=target):
            load_run(r)
        assert main(["generate", "--run", str(r), "--prompt", "name", "--max-new-tokens", "2"]) == 2
        assert target in capsys.readouterr().err
    else:
        load_run(r)


def test_a_deleted_state_json_is_reported_not_skipped(run, tmp_path):
    r = copy(run, tmp_path)
    newest = latest_checkpoint(r)
    (newest / "state.json").unlink()
    with pytest.raises(IntegrityError, match=f"{newest.name} has no state.json"):
        latest_checkpoint(r)
    with pytest.raises(IntegrityError):
        load_run(r)


def test_unrecorded_checkpoints_still_load_and_verify_false_escapes(run, tmp_path):
    r = copy(run, tmp_path)
    state = latest_checkpoint(r) / "state.json"
    meta = json.loads(state.read_text())
    del meta["sha256"], meta["run_sha256"]  # as written before the records existed
    state.write_text(json.dumps(meta))
    flip_byte(latest_checkpoint(r) / "model.safetensors", at=-1)
    load_run(r)
    r2 = copy(run, tmp_path / "b")
    flip_byte(latest_checkpoint(r2) / "model.safetensors", at=-1)
    load_run(r2, verify=False)


def test_export_records_and_verifies(run, tmp_path):
    loaded = load_run(run)
    folder = save_pretrained(loaded.model, tmp_path / "export", tokenizer=run / "tokenizer.json")
    config = json.loads((folder / "config.json").read_text())
    sums = config["blocklab_sha256"]
    recorded = config.pop("blocklab_config_sha256")
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"))  # keys sorted, no spaces
    assert recorded == hashlib.sha256(canonical.encode()).hexdigest()
    assert sums == {"model.safetensors": sha256(folder / "model.safetensors"),
                    "tokenizer.json": sha256(folder / "tokenizer.json")}
    load_pretrained(folder)
    flip_byte(folder / "model.safetensors", at=-1)
    with pytest.raises(IntegrityError, match="model.safetensors"):
        load_pretrained(folder)
    load_pretrained(folder, verify=False)


def test_an_edited_export_config_is_refused_and_an_old_export_still_loads(run, tmp_path, capsys):
    """config.json's n_heads edited 4 -> 2 (2 -> 1 here) loaded silently with its logits off, while an
    edit of the weights was refused: the fields are covered now, and exports written before still load."""
    import torch

    from blocklab.interop.checkpoint import CONFIG_SHA_KEY

    folder = save_pretrained(load_run(run).model, tmp_path / "export", tokenizer=run / "tokenizer.json")
    config = json.loads((folder / "config.json").read_text())
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        reference = load_pretrained(folder)(ids)
    assert config["n_heads"] == 2
    (folder / "config.json").write_text(json.dumps({**config, "n_heads": 1}, indent=2))
    with pytest.raises(IntegrityError, match="config.json has changed since it was saved"):
        load_pretrained(folder)
    capsys.readouterr()
    assert main(["generate", "--run", str(folder), "--prompt", "x = 1"]) == 2
    assert "config.json has changed since it was saved" in capsys.readouterr().err
    with torch.no_grad():  # what the record guards against: same weights, other logits
        assert not torch.allclose(load_pretrained(folder, verify=False)(ids), reference)
    # the same fields in another layout (sorted keys, no indent) are the same config
    (folder / "config.json").write_text(json.dumps(config, sort_keys=True))
    load_pretrained(folder)
    # as exports were written before the record: no blocklab_config_sha256, so no check of the fields
    del config[CONFIG_SHA_KEY]
    (folder / "config.json").write_text(json.dumps({**config, "n_heads": 2}, indent=2))
    with torch.no_grad():
        assert torch.equal(load_pretrained(folder)(ids), reference)
