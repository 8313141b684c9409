"""The converter of old layouts (interop/upgrade.py): every loader reads weights saved under older names,
to the logits of the model that saved them; a plain `load_state_dict` of them fails naming the converter.

The old names are written here by hand from today's (DenseFormer's depth weights lived in the blocks,
``blocks.<i>.attn.values.dwa.gain``, until issue 12), independently of the converter's own patterns.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from blocklab import LanguageModel, ModelConfig
from blocklab.interop import from_hf, load_pretrained, save_pretrained, upgrade_state_dict
from blocklab.training import checkpoint as ckpt

SMALL = dict(n_layers=4, d_model=32, n_heads=2, mlp_hidden=64, vocab_size=96, context_length=16)


def perturbed(arch: str, seed: int) -> LanguageModel:
    """A tiny model whose every parameter moved off its initialisation (DenseFormer starts as identity)."""
    torch.manual_seed(seed)
    model = LanguageModel(ModelConfig.from_preset(arch, "tiny", **SMALL)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def old_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` as blocklab wrote it before issue 12 (any prefix kept)."""
    old = {re.sub(r"value_shared\.dwa\.(\d+)\.gain$", r"blocks.\1.attn.values.dwa.gain", k): v
           for k, v in state.items()}
    assert any(".attn.values.dwa.gain" in k for k in old) and not any("value_shared" in k for k in old)
    return old


IDS = torch.randint(0, 96, (2, 11), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def dense() -> LanguageModel:
    return perturbed("pre-ln+denseformer", seed=4)


def test_a_plain_load_of_old_names_fails_naming_the_converter_which_reads_them(dense):
    old = old_names(dense.state_dict())
    fresh = perturbed("pre-ln+denseformer", seed=9)
    with pytest.raises(RuntimeError, match=r"(?s)Unexpected key.*blocklab\.interop\.upgrade_state_dict"):
        fresh.load_state_dict(old)
    with pytest.raises(RuntimeError, match="size mismatch") as err:  # other errors stay torch's own
        fresh.load_state_dict({**dense.state_dict(), "tok_emb.weight": torch.zeros(3, 3)})
    assert "upgrade_state_dict" not in str(err.value)
    fresh.load_state_dict(upgrade_state_dict(old))  # strict: every tensor placed
    with torch.no_grad():
        assert torch.equal(fresh(IDS), dense(IDS))


@pytest.mark.parametrize("arch", ["pre-ln", "sas-p+bov", "pre-ln+denseformer", "pre-ln+resformer-dense"])
def test_todays_names_pass_unchanged(arch):
    state = perturbed(arch, seed=1).state_dict()
    upgraded = upgrade_state_dict(state)
    assert list(upgraded) == list(state) and all(upgraded[k] is state[k] for k in state)


def _rewrite(file: Path, rename) -> None:
    with safe_open(str(file), framework="pt") as f:
        metadata = f.metadata()
    save_file(rename(load_file(file)), str(file), metadata=metadata)


def test_a_model_folder_of_old_names_loads(dense, tmp_path):
    folder = save_pretrained(dense, tmp_path / "export")
    _rewrite(folder / "model.safetensors", old_names)
    with torch.no_grad():  # the rewrite changed the weights' sha256 the folder records
        assert torch.equal(load_pretrained(folder, verify=False)(IDS), dense(IDS))


def test_a_training_checkpoint_of_old_names_loads(dense, tmp_path):
    save_file(old_names(dense.state_dict()), str(tmp_path / "model.safetensors"))
    fresh = perturbed("pre-ln+denseformer", seed=9)
    ckpt.load_weights(tmp_path, fresh)
    with torch.no_grad():
        assert torch.equal(fresh(IDS), dense(IDS))


def test_a_hugging_face_export_of_old_names_loads(dense, tmp_path):
    """Through the Auto class (transformers' own loading, with the converter's renames) and from_hf."""
    transformers = pytest.importorskip("transformers")
    import blocklab.interop.hf_model  # noqa: F401 (registers model_type "blocklab")

    folder = save_pretrained(dense, tmp_path / "hf", format="hf")
    assert json.loads((folder / "config.json").read_text())["model_type"] == "blocklab"
    _rewrite(folder / "model.safetensors", old_names)
    hf, report = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert not any(report.values()), report
    with torch.no_grad():
        want = dense(IDS)
        assert torch.equal(hf.eval()(IDS).logits, want)
        assert torch.equal(from_hf(folder)(IDS), want)
