"""Simplifying Transformer Blocks' own set-up: biases on Q and K only, and its RMSNorm with eps
outside the root (both in the `codeparrot-18l` preset), against hand computations in float64."""

from __future__ import annotations

import pytest
import torch

from blocklab import LanguageModel, ModelConfig
from blocklab.model.norms import RMSNormEpsOutside, make_norm
from blocklab.util.errors import ConfigError


def test_qk_bias_gives_q_and_k_alone_a_bias_that_trains():
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig.from_preset("pre-ln", "tiny", qk_bias=True, n_layers=2)).double()
    biased = sorted(n for n, p in model.named_parameters() if n.endswith(".bias"))
    assert biased == [f"blocks.{i}.attn.{m}.bias" for i in range(2) for m in ("k", "q")]
    q = model.block(1).attn.q
    assert not q.bias.any()  # zero at initialisation
    with torch.no_grad():
        q.bias.normal_()
    x = torch.randn(2, 5, model.cfg.d_model, dtype=torch.float64)
    torch.testing.assert_close(q(x), x @ q.weight.T + q.bias, atol=1e-12, rtol=0)
    model(torch.randint(0, model.cfg.vocab_size, (2, 9))).logsumexp(-1).mean().backward()
    assert all(model.get_parameter(n).grad.abs().sum() > 0 for n in biased)


@pytest.mark.parametrize("affine", [True, False])
def test_rmsnorm_eps_outside_the_root(affine):
    torch.manual_seed(0)
    norm = make_norm("rmsnorm", 16, 1e-5, affine=affine, eps_outside=True).double()
    assert isinstance(norm, RMSNormEpsOutside)
    if affine:
        with torch.no_grad():
            norm.weight.normal_()
    w = norm.weight if affine else torch.ones(16, dtype=torch.float64)
    for rms in (1e-3, 0.028, 1.0):  # where the two placements differ, and where they agree
        x = torch.randn(3, 16, dtype=torch.float64) * rms
        by_hand = torch.stack([w * row / (row.pow(2).mean().sqrt() + 1e-5) for row in x])
        torch.testing.assert_close(norm(x), by_hand, atol=1e-12, rtol=0)
    torch_form = make_norm("rmsnorm", 16, 1e-5).double()  # eps inside: still torch's RMSNorm
    assert isinstance(torch_form, torch.nn.RMSNorm)
    x = torch.randn(3, 16, dtype=torch.float64) * 1e-3
    assert (norm(x) / w - torch_form(x)).abs().max() > 0.5  # far apart at RMS 1e-3


def test_codeparrot_18l_uses_the_sas_codes_setup():
    cfg = ModelConfig.from_preset("sas", "codeparrot-18l")
    assert cfg.qk_bias and cfg.rmsnorm_eps == "outside"
    with torch.device("meta"):
        pre_ln = LanguageModel(ModelConfig.from_preset("pre-ln", "codeparrot-18l"))
    d, layers, vocab = 768, 18, 50257
    # 12 d^2 per layer, the Q/K biases, two norms per layer and the final one, the tied embedding
    expected = layers * (12 * d * d + 2 * d + 2 * d) + d + vocab * d
    assert sum(p.numel() for p in pre_ln.parameters()) == expected
    assert ModelConfig.from_preset("pre-ln", "tiny").rmsnorm_eps == "inside"  # the defaults keep torch's


@pytest.mark.parametrize("fields, words", [
    (dict(qk_bias=True, bias=True), "set one of the two"),
    (dict(rmsnorm_eps="around"), "'inside', 'outside'"),
    (dict(rmsnorm_eps="outside", norm="layernorm"), "norm='rmsnorm'"),
])
def test_bad_setup_fields(fields, words):
    with pytest.raises(ConfigError, match=words):
        ModelConfig.from_preset("pre-ln", "tiny", **fields)
