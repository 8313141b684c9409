"""Padded batches (model/masking.py): a row of a padded batch computes what its prompt computes alone.

The reference is the model itself on each prompt alone, unpadded (a path with no mask, no per-row
positions and no per-row cache state), and, for the matrix, Eq. (5) of Simplifying Transformer
Blocks written out for the real keys of one row. Models are float64 with every parameter perturbed
away from its init, so that the identity-at-init variants (SAS, smear, gains at 0) do compute.
"""

from __future__ import annotations

import math

import pytest
import torch

from blocklab.model import ops
from blocklab.model.value_paths import VALUE_PATHS
from helpers import PRESETS, make_cfg, make_model

VOCAB = 50
# one value path of every family (and the options that change the cache) with the block presets
FAMILIES = ["standard", "resformer", "resformer-dense", "resformer-learnable-plus", "svformer", "neutreno",
            "denseformer", "cla", "cross-layer-attn", "bov", "bov-resformer", "x0-value", "v1-value",
            "value-embed", "v-scale"]
SOFTMAX_ONLY = {"cross-layer-attn"}  # Value Residual Eq. (2) is defined for softmax attention


def _cases() -> list[tuple[str, str]]:
    return [(arch, path) for arch in PRESETS for path in FAMILIES
            if path not in SOFTMAX_ONLY or make_cfg(arch).attn_matrix == "softmax"]


def _prompts(lengths: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=gen) for n in lengths]


def _batch(prompts: list[torch.Tensor], side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts padded to one length with a token that is not padding elsewhere (7), and the mask."""
    t = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), t), 7, dtype=torch.long)
    mask = torch.zeros(len(prompts), t, dtype=torch.long)
    for row, p in enumerate(prompts):
        where = slice(t - len(p), t) if side == "left" else slice(0, len(p))
        ids[row, where], mask[row, where] = p, 1
    return ids, mask


def _real(row: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return row[mask.bool()]


def test_every_value_path_family_is_covered():
    assert set(FAMILIES) <= set(VALUE_PATHS)
    families = {p.split("-")[0] for p in VALUE_PATHS}
    assert families <= {p.split("-")[0] for p in FAMILIES}, families - {p.split("-")[0] for p in FAMILIES}


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("arch, path", _cases())
def test_a_padded_row_generates_the_tokens_of_its_prompt_alone(arch, path, side):
    model = make_model(arch, value_path=path).eval()
    prompts = _prompts((7, 3, 5))
    ids, mask = _batch(prompts, side)
    out = model.generate(ids, 6, attention_mask=mask)
    assert torch.equal(out[:, :ids.shape[1]], ids)  # the prompts as given, then the new tokens
    logits = model(ids, attention_mask=mask)
    for row, prompt in enumerate(prompts):
        alone = model.generate(prompt[None], 6)
        assert torch.equal(out[row, ids.shape[1]:], alone[0, len(prompt):]), (row, out[row], alone)
        single = model(prompt[None])[0]
        torch.testing.assert_close(_real(logits[row], mask[row]), single, rtol=1e-10, atol=1e-10)
    assert torch.isfinite(logits).all()  # padding positions attend to themselves: finite
    if side == "left":  # every decoding step's logits through the cache, not only the greedy tokens
        more = torch.randint(0, VOCAB, (3, 5), generator=torch.Generator().manual_seed(2))
        cached = _cached_logits(model, ids, mask, more)
        for row, prompt in enumerate(prompts):
            alone = model(torch.cat((prompt, more[row]))[None])[0, len(prompt) - 1:]
            torch.testing.assert_close(cached[row], alone, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("overrides", [
    dict(window_size=4, window_pattern="SL"),  # a ring of 4 in layer 0, generating past it
    dict(positions="rope", smear=True, qk_norm=True),  # per-row RoPE; the smear skips a padding predecessor
    dict(positions="learned", n_kv_heads=2),
    dict(positions="sinusoidal", value_path="bov", window_size=3, window_pattern="SL"),
], ids=["window", "rope-smear", "learned-gqa", "sinusoidal-bov-window"])
@pytest.mark.parametrize("arch", ["pre-ln", "sas", "sas-p"])
def test_padding_with_windows_positions_smear_and_grouped_query_attention(arch, overrides):
    if arch != "pre-ln" and "n_kv_heads" in overrides:  # identity values have every head
        overrides = {**overrides, "value_form": "linear", "first_value_form": "linear", "proj_form": "linear"}
    model = make_model(arch, **overrides).eval()
    if model.smear is not None:
        assert float(model.smear.strength.value.detach()) != 0.0  # perturbed: the smear mixes
    prompts = _prompts((9, 2, 6), seed=1)
    for side in ("left", "right"):
        ids, mask = _batch(prompts, side)
        out = model.generate(ids, 8, attention_mask=mask)
        for row, prompt in enumerate(prompts):
            alone = model.generate(prompt[None], 8)
            assert torch.equal(out[row, ids.shape[1]:], alone[0, len(prompt):]), (side, row)
    # greedy tokens of a tiny model soon repeat: compare the logits of every decoding step too
    ids, mask = _batch(prompts, "left")
    more = torch.randint(0, VOCAB, (3, 7), generator=torch.Generator().manual_seed(2))  # 9 + 7: the context
    logits = _cached_logits(model, ids, mask, more)
    for row, prompt in enumerate(prompts):
        alone = model(torch.cat((prompt, more[row]))[None])[0, len(prompt) - 1:]
        torch.testing.assert_close(logits[row], alone, rtol=1e-10, atol=1e-10)


def _cached_logits(model, ids: torch.Tensor, mask: torch.Tensor, more: torch.Tensor) -> torch.Tensor:
    """The logits after a padded prompt's last position, then after each token of `more` fed one at a
    time through a KV cache: (B, 1 + n, vocab)."""
    cache = model.new_cache(ids.shape[0], ids.shape[1] + more.shape[1])
    out = [model(ids, cache=cache, attention_mask=mask)[:, -1:]]
    out += [model(more[:, i:i + 1], cache=cache) for i in range(more.shape[1])]
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("arch", ["pre-ln", "sas-p"])
def test_an_encoder_row_padded_on_either_side_sees_only_its_tokens(arch):
    model = make_model(arch, causal=False).eval()
    prompts = _prompts((8, 4))
    for side in ("left", "right"):
        ids, mask = _batch(prompts, side)
        logits = model(ids, attention_mask=mask)
        for row, prompt in enumerate(prompts):
            torch.testing.assert_close(_real(logits[row], mask[row]), model(prompt[None])[0],
                                       rtol=1e-10, atol=1e-10)


def test_a_mask_of_all_ones_changes_nothing():
    model = make_model("sas-p").eval()
    ids = torch.randint(0, VOCAB, (2, 9))
    assert torch.equal(model(ids, attention_mask=torch.ones_like(ids)), model(ids))


def test_prompt_then_chunks_then_tokens_with_a_padded_cache():
    """A padded prompt through a cache in two chunks, then single tokens, equals each row alone."""
    model = make_model("sas-p", value_path="svformer").eval()
    prompts = _prompts((6, 2))
    ids, mask = _batch(prompts, "left")
    cache = model.new_cache(2, 10)
    first = model(ids[:, :3], cache=cache, attention_mask=mask[:, :3])
    second = model(ids[:, 3:], cache=cache, attention_mask=mask)  # HF's way: the whole mask so far
    nxt = torch.tensor([[3], [11]])
    third = model(nxt, cache=cache)  # no mask: real tokens
    logits = torch.cat((first, second, third), dim=1)
    for row, prompt in enumerate(prompts):
        alone = model(torch.cat((prompt, nxt[row]))[None])[0]
        real = torch.cat((mask[row], torch.ones(1, dtype=torch.long))).bool()
        torch.testing.assert_close(logits[row][real], alone, rtol=1e-10, atol=1e-10)


def _eq5_row(q, k, v, real, alpha, beta, gamma):
    """(alpha I + beta A - gamma C) V for one row and head, written out over the real keys only
    (causal): A = softmax over the real keys j <= i, C = their uniform average, I the query's own key.
    A padding query sees its own key too (leading padding sees nothing else)."""
    t = q.shape[0]
    out = torch.zeros_like(v)
    for i in range(t):
        keys = [j for j in range(i + 1) if real[j] or j == i]
        logits = torch.stack([q[i] @ k[j] / math.sqrt(q.shape[-1]) for j in keys])
        a = torch.softmax(logits, dim=0)
        out[i] = alpha * v[i] + sum(beta * a[n] * v[j] - gamma / len(keys) * v[j] for n, j in enumerate(keys))
    return out


def test_the_padded_shaped_matrix_is_eq5_over_the_real_keys():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 1, 6, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    real = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    alpha, beta, gamma = 0.7, 1.3, 0.4
    matrix = ops.shaped_attention_matrix(q, k, alpha, beta, gamma, valid=real)
    for row in range(2):
        expected = _eq5_row(q[row, 0], k[row, 0], v[row, 0], real[row], alpha, beta, gamma)
        torch.testing.assert_close((matrix @ v)[row, 0], expected)
    softmax = ops.attention(q, k, v, valid=real)
    torch.testing.assert_close(softmax, ops.attention_probs(q, k, valid=real) @ v)
    expected = _eq5_row(q[0, 0], k[0, 0], v[0, 0], real[0], 0.0, 1.0, 0.0)
    torch.testing.assert_close(softmax[0, 0], expected)


@pytest.mark.parametrize("mask, message", [
    ([[1, 1, 1, 1], [1, 0, 1, 1]], "padding between real tokens"),
    ([[1, 1, 1, 1], [1, 2, 1, 1]], "1 for a real token and 0 for padding"),
    ([[1, 1, 1]], "attention_mask must have shape"),
])
def test_a_bad_mask_is_refused_with_what_is_allowed(mask, message):
    model = make_model("pre-ln")
    with pytest.raises(ValueError, match=message):
        model(torch.zeros(2, 4, dtype=torch.long), attention_mask=torch.tensor(mask))


def test_generate_refuses_a_row_without_tokens_and_a_cache_refuses_tokens_after_padding():
    model = make_model("pre-ln").eval()
    ids = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="row 1 has no real token"):
        model.generate(ids, 2, attention_mask=torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]]))
    cache = model.new_cache(2, 8)
    model(ids, cache=cache, attention_mask=torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]))  # right padding
    with pytest.raises(ValueError, match="takes no more real tokens"):
        model(ids[:, :1], cache=cache)


def test_a_mask_of_all_ones_keeps_the_cache_unpadded():
    """Hugging Face passes a mask of ones at every step: the cache stays on the unmasked kernels."""
    model = make_model("sas-p").eval()
    ids = torch.randint(0, VOCAB, (2, 5))
    cache = model.new_cache(2, 8)
    model(ids, cache=cache, attention_mask=torch.ones_like(ids))
    model(ids[:, :1], cache=cache, attention_mask=torch.ones(2, 6, dtype=torch.long))
    assert cache.padding is None and cache.key_valid() is None
