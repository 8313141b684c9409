"""Weights saved by older versions (blocklab at 13306be) load into today's model and give the logits they
gave then: the padded head, fused projections, the chunked loss and the one-Function shaped attention
change how the model computes, not what (tests/fixtures/format-v1-state-dicts-13306be/: tiny perturbed
models, their configs and the logits the old code computed on fixed ids, written by that commit's code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from blocklab import LanguageModel, ModelConfig
from blocklab.runtime.fused_projections import set_fused_projections

# format-v1-state-dicts-da7d2a6/ (blocklab at da7d2a6, before the model-core refactor): every value path,
# the block presets, CLA with GQA and RoPE, ResFormer's query and key residuals, the U-net value
# embeddings, BoV's shared table, additive x0-value; written by its README-make.py.txt at that commit
DATA = Path(__file__).parents[1] / "fixtures"
NAMES = sorted(f"{p.parent.name}/{p.name.removesuffix('.json')}"
               for p in DATA.glob("format-v1-state-dicts-*/*.json"))


def load_old(name: str) -> tuple[LanguageModel, torch.Tensor, torch.Tensor]:
    model = LanguageModel(ModelConfig.from_dict(json.loads((DATA / f"{name}.json").read_text())))
    model.load_state_dict(load_file(DATA / f"{name}.safetensors"), strict=True)
    saved = load_file(DATA / f"{name}.logits.safetensors")
    return model.eval(), saved["ids"], saved["logits"]


def test_every_saved_model_is_here():
    old = [n.split("/")[1] for n in NAMES if n.startswith("format-v1-state-dicts-13306be/")]
    assert old == ["parallel_resformer", "pre-ln", "pre-ln_bov", "sas-p", "sas_svformer"]
    from blocklab.model.value_paths import VALUE_PATHS
    new = {n.split("/")[1] for n in NAMES if n.startswith("format-v1-state-dicts-da7d2a6/")}
    assert {"pre-ln" if v == "standard" else f"pre-ln_{v}" for v in VALUE_PATHS} <= new
    assert {"sas", "sas-p", "parallel", "shaped", "sas-p_resformer", "pre-ln_cla-gqa"} <= new


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("fused", ["off", "on"])
def test_old_weights_give_the_old_logits(name, fused):
    model, ids, logits = load_old(name)
    set_fused_projections(model, fused)
    with torch.no_grad():
        assert torch.allclose(model(ids), logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_old_weights_give_the_old_loss(name):
    model, ids, logits = load_old(name)
    labels = torch.roll(ids, -1, dims=1)
    with torch.no_grad():
        loss = model(ids, labels=labels)
    expected = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    assert torch.allclose(loss, expected, rtol=1e-5, atol=1e-6)
