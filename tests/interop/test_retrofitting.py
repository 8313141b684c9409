"""Retrofitting a value path onto a trained baseline (interop/retrofitting.py): the variants whose formula
has the baseline as a starting point start at its loss, the others near it, and all train on; Bank of
Values' tables come from the pretrained values (its Eq. 5).

References: the baseline's own loss on held-out data; hand computations of Bank of Values' table
initialisation; the HF model a retrofitted import was made from.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from blocklab import ConfigError, LanguageModel, ModelConfig
from blocklab.interop import from_hf, retrofit
from tests.interop.test_hf import CONTEXT, TOL, gpt2, max_diff  # skips this file without transformers too

# Two interleaved Markov chains: x_{t+1} is one of 2 successors of x_{t-1}, independent of x_t. A model
# must attend to the token two back: without attention the best loss is about log 16, with it log 2.
SEQ, BATCH, RETRO_VOCAB = 32, 16, 16
RETRO = dict(n_layers=3, d_model=48, n_heads=4, n_kv_heads=2, vocab_size=RETRO_VOCAB, context_length=SEQ,
             mlp_hidden=96, norm="rmsnorm", positions="rope", mlp_act="swiglu", tie_embeddings=False)


def skip_bigram_batches(n: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1234)  # the same chain for training and held-out data
    successors = torch.stack([torch.randperm(RETRO_VOCAB, generator=g)[:2] for _ in range(RETRO_VOCAB)])
    g.manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.empty(BATCH, SEQ + 1, dtype=torch.long)
        x[:, :2] = torch.randint(0, RETRO_VOCAB, (BATCH, 2), generator=g)
        for t in range(1, SEQ):
            x[:, t + 1] = successors[x[:, t - 1], torch.randint(0, 2, (BATCH,), generator=g)]
        out.append(x)
    return out


def loss(model: LanguageModel, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


@torch.no_grad()
def held_out_loss(model: LanguageModel, data) -> float:
    model.eval()
    return sum(loss(model, b).item() for b in data) / len(data)


def train(model: LanguageModel, data, steps: int, lr: float) -> LanguageModel:
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for step in range(steps):
        opt.zero_grad()
        loss(model, data[step % len(data)]).backward()
        opt.step()
    return model


@pytest.fixture(scope="module")
def pretrained():
    torch.manual_seed(0)
    baseline = LanguageModel(ModelConfig(**RETRO))
    train(baseline, skip_bigram_batches(40, seed=1), steps=40, lr=1e-2)
    held_out = skip_bigram_batches(2, seed=2)
    fresh = held_out_loss(LanguageModel(ModelConfig(**RETRO)), held_out)
    return baseline, held_out, held_out_loss(baseline, held_out), fresh


IDENTICAL = {  # variants whose formula has the baseline as a starting point: (value path, options)
    "resformer-learnable": ("resformer-learnable", {}),
    "resformer-learnable-plus": ("resformer-learnable-plus", {}),
    "resformer-dense": ("resformer-dense", {}),
    "denseformer": ("denseformer", {}),
    "value-embed": ("value-embed", {}),
    "value-embed-unet-lambda": ("value-embed", dict(shared_tables=1, gate="lambda")),
    "v-scale": ("v-scale", {}),
    "x0-value-add-learnable": ("x0-value", dict(add=True)),
    "resformer-sparse-learnable": ("resformer-sparse", dict(learnable=True)),
    "resformer-query-learnable": ("resformer", dict(learnable=True, residual_on="query")),
}
DIFFERENT = {  # variants whose formula replaces or fixes something the baseline has
    name: (name, {}) for name in ("resformer", "resformer-constant", "resformer-sparse", "resformer-mix",
                                  "neutreno",
                                  "svformer", "cla", "cross-layer-attn", "bov", "x0-value", "v1-value")
}
DIFFERENT["bov-shared"] = ("bov", dict(shared=True))


def test_retrofit_pretrained_baseline_learned(pretrained):
    _, _, base, fresh = pretrained
    assert abs(fresh - math.log(RETRO_VOCAB)) < 0.3
    assert base < math.log(RETRO_VOCAB) - 1.0  # it uses attention: x_t alone says nothing about x_{t+1}


@pytest.mark.parametrize("name", IDENTICAL)
def test_retrofit_starts_at_the_baseline_and_trains(name, pretrained):
    baseline, held_out, base, _ = pretrained
    before = {k: v.clone() for k, v in baseline.state_dict().items()}
    value_path, options = IDENTICAL[name]
    model = retrofit(baseline, value_path, **options)
    assert model.cfg.value_path == value_path
    start = held_out_loss(model, held_out)
    assert abs(start - base) < 1e-6
    train(model, skip_bigram_batches(10, seed=3), steps=10, lr=1e-3)
    assert held_out_loss(model, held_out) < start - 1e-3
    assert all(torch.equal(before[k], v) for k, v in baseline.state_dict().items())  # baseline untouched


@pytest.mark.parametrize("name", DIFFERENT)
def test_retrofit_starts_near_the_baseline_and_trains(name, pretrained):
    baseline, held_out, base, fresh = pretrained
    value_path, options = DIFFERENT[name]
    model = retrofit(baseline, value_path, **options)
    state = model.state_dict()
    shared = [k for k in baseline.state_dict() if k in state]
    assert all(torch.equal(state[k], baseline.state_dict()[k]) for k in shared)
    start = held_out_loss(model, held_out)
    assert start < base + 0.5 * (fresh - base)  # keeps most of what pretraining learned
    train(model, skip_bigram_batches(10, seed=3), steps=10, lr=1e-3)
    assert held_out_loss(model, held_out) < start - 1e-3


def test_retrofit_bov_tables_come_from_the_pretrained_values(pretrained):
    """E_v[i] = RMSNorm(E[i]) W_V^T of each target layer's pretrained W_V (Bank of Values, Eq. 5)."""
    baseline, *_ = pretrained
    emb = baseline.tok_emb.weight.double()
    rms = emb / emb.pow(2).mean(-1, keepdim=True).add(torch.finfo(torch.float32).eps).sqrt()
    model = retrofit(baseline, "bov")
    targets = [i for i, b in enumerate(model.blocks) if b.attn.values.target]
    assert targets == [2]  # the last third of 3 layers
    for i in targets:
        expect = rms @ baseline.blocks[i].attn.values.w_v.weight.double().T
        torch.testing.assert_close(model.blocks[i].attn.values.value_table.double(), expect,
                                   rtol=1e-5, atol=1e-6)
        assert model.blocks[i].attn.values.w_v is None
    shared = retrofit(baseline, "bov", layers=[1, 2], shared=True)
    expect = rms @ baseline.blocks[1].attn.values.w_v.weight.double().T
    torch.testing.assert_close(shared.value_shared.value_table.double(), expect, rtol=1e-5, atol=1e-6)


def test_retrofit_paper_start_differs(pretrained):
    baseline, held_out, base, _ = pretrained
    paper = retrofit(baseline, "resformer-learnable", start="paper")  # lambdas 1/2, 1/2
    assert paper.blocks[1].attn.values.lambda1.gain.item() == 0.5
    assert abs(held_out_loss(paper, held_out) - base) > 1e-3
    given = retrofit(baseline, "resformer-learnable", lambda1=0.25)  # the caller's option wins
    assert given.blocks[1].attn.values.lambda1.gain.item() == 0.25
    assert given.blocks[1].attn.values.lambda2.gain.item() == 1.0


def test_retrofit_of_an_hf_import_keeps_hf_logits():
    hf = gpt2()
    model = retrofit(from_hf(hf), "pre-ln+resformer-learnable")
    assert max_diff(model, hf, lengths=(CONTEXT,)) <= TOL


def test_retrofit_errors(pretrained):
    baseline, *_ = pretrained
    with pytest.raises(ConfigError, match="value path"):
        retrofit(baseline, "sas")
    with pytest.raises(ConfigError, match="attn_skip_gain"):
        retrofit(baseline, "sas+resformer")
    with pytest.raises(ConfigError, match="start"):
        retrofit(baseline, "resformer", start="scratch")
    with pytest.raises(ConfigError, match="lamda1"):
        retrofit(baseline, "resformer", lamda1=0.3)
    with pytest.raises(ConfigError, match="baseline"):
        retrofit(retrofit(baseline, "resformer"), "svformer")
