"""The KV cache (runtime/cache.py) and generation (runtime/generate.py).

References: the model's own full-sequence forward pass without a cache (decoding must reproduce it),
byte counts of each layout written here by hand from the papers (SVFormer keeps (L+1)/(2L) of the
K + V bytes, Value Residual Sec. 3.5; Bank of Values saves (L/3) d (T - |V|) values, its Eq. 6), and
argmax decoding by repeated full forward passes. Every parameter (weights, gains, lambdas, value
tables, DWA weights) is moved away from its initial value first: many variants are the identity at
initialisation. Float32, tiny models.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from blocklab import ConfigError, LanguageModel, ModelConfig
from blocklab.model import ops
from blocklab.model.presets import BLOCK_PRESETS
from blocklab.model.value_paths import VALUE_PATHS
from blocklab.runtime.cache import cache_bytes_per_token
from blocklab.runtime.generate import sample_next

VOCAB = 61
BASE = dict(n_layers=4, d_model=32, n_heads=4, vocab_size=VOCAB, context_length=24, mlp_hidden=48)
SOFTMAX_ONLY = {"cross-layer-attn"}  # value paths that need attn_matrix="softmax"
TOL = 1e-4


def perturb(model: torch.nn.Module, seed: int) -> None:
    """Move every parameter away from its initial value (gains by ~0.3, weights and tables by ~0.15)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
            p.add_((0.3 if name.endswith("gain") else 0.15) * noise)


def make_cfg(arch: str, options: dict | None = None, **overrides) -> ModelConfig:
    return ModelConfig.from_preset(arch, "tiny", value_path_options=options or {}, **{**BASE, **overrides})


def build(arch: str = "pre-ln", options: dict | None = None, seed: int = 0, **overrides) -> LanguageModel:
    torch.manual_seed(seed)
    model = LanguageModel(make_cfg(arch, options, **overrides)).eval()
    perturb(model, seed + 1)
    return model


def ids_of(batch: int, t: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, t), generator=torch.Generator().manual_seed(seed))


def decode_error(model: LanguageModel, ids: torch.Tensor, prompt: int, chunk: int = 1) -> float:
    """Max |logits| difference between one full forward pass and a prefill of `prompt` tokens, one
    chunk of `chunk` tokens (a query block shorter than the keys), then one token per step."""
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(ids.shape[0], ids.shape[1])
        pieces = [model(ids[:, :prompt], cache=cache), model(ids[:, prompt:prompt + chunk], cache=cache)]
        pieces += [model(ids[:, i:i + 1], cache=cache) for i in range(prompt + chunk, ids.shape[1])]
    assert cache.length == ids.shape[1]
    return (torch.cat(pieces, dim=1) - full).abs().max().item()


def archs(blocks) -> list[str]:
    return [f"{b}+{v}" for b in blocks for v in VALUE_PATHS
            if not (v in SOFTMAX_ONLY and BLOCK_PRESETS[b].fields.get("attn_matrix", "softmax") != "softmax")]


# -- 1. decoding with the cache reproduces the full forward pass --------------------------------
@pytest.mark.parametrize("arch", archs(BLOCK_PRESETS))
def test_decoding_matches_full_forward(arch):
    """Every block preset with every value path: batch 2, prefill 5, a chunk of 3, then 5 single tokens."""
    model = build(arch, seed=len(arch))
    assert decode_error(model, ids_of(2, 13, seed=1), prompt=5, chunk=3) <= TOL


WINDOWS = {"SSSL-3-rope": dict(window_size=3, window_pattern="SSSL", positions="rope"),
           "SL-4-learned": dict(window_size=4, window_pattern="SL", positions="learned")}


@pytest.mark.parametrize("window", list(WINDOWS))
@pytest.mark.parametrize("arch", archs(["pre-ln", "shaped"]))
def test_decoding_with_sliding_windows(arch, window):
    """A prompt longer than the window, a chunk longer than one token, then single tokens past it."""
    model = build(arch, seed=3, **WINDOWS[window])
    assert decode_error(model, ids_of(2, 16, seed=2), prompt=7, chunk=2) <= TOL


@pytest.mark.parametrize("arch", archs(["pre-ln", "shaped"]))
def test_decoding_with_grouped_query_attention(arch):
    model = build(arch, seed=4, n_kv_heads=2, positions="rope")
    assert decode_error(model, ids_of(3, 12, seed=3), prompt=4, chunk=3) <= TOL


OPTION_CASES = [
    ("pre-ln+resformer", dict(source=1, layers="every-2", learnable=True), {}),
    ("pre-ln+resformer", dict(residual_on="query", learnable=True), {}),
    ("pre-ln+resformer", dict(residual_on="key", learnable=True), dict(n_kv_heads=2, positions="rope")),
    ("pre-ln+resformer-learnable-plus", dict(layers="last-2"), dict(n_layers=5)),
    ("pre-ln+resformer-dense", {}, dict(n_layers=5, window_size=3, window_pattern="SL")),
    ("pre-ln+svformer", dict(anchors=[2]), dict(n_layers=5, window_size=3, window_pattern="SSL")),
    ("sas-p+svformer", dict(anchors=[1, 3]), dict(n_layers=5)),
    ("pre-ln+neutreno", dict(lambda_=0.7), dict(window_size=3, window_pattern="SL")),
    ("pre-ln+denseformer", dict(dilation=2, period=2), dict(n_layers=5)),
    ("pre-ln+cla", dict(group=3), dict(n_layers=5, window_size=3, window_pattern="SSL")),
    ("pre-ln+cla", {}, dict(window_size=3, window_pattern="SSSL")),
    ("pre-ln+bov", dict(shared=True), dict(n_layers=6, window_size=3, window_pattern="SSL")),
    ("sas-p+bov", dict(learnable=False, coef=1.7, layers=[1, 3]), {}),
    ("pre-ln+x0-value", dict(layers="every-2"), dict(n_kv_heads=2, window_size=4, window_pattern="SL")),
    ("pre-ln+v1-value", dict(layers="every-2", learnable=False, coef=0.6), dict(window_size=3,
                                                                                 window_pattern="SSSL")),
    ("pre-ln+value-embed", dict(gate_channels=5, layers="last-third"), dict(n_kv_heads=1)),
    ("pre-ln+value-embed", dict(shared_tables=2, gate="lambda"), dict(n_layers=5, window_size=3,
                                                                      window_pattern="SL")),
    ("pre-ln+resformer-mix", dict(neutreno=0.3, layers="every-2"), dict(n_kv_heads=2, positions="rope")),
    ("pre-ln+x0-value", dict(add=True, layers="every-2"), dict(window_size=3, window_pattern="SL")),
    ("sas+x0-value", dict(add=True, learnable=False), {}),
    ("pre-ln+x0-value", dict(x0="stream"), dict(positions="sinusoidal", window_size=3, window_pattern="SL")),
    ("pre-ln+bov-resformer", dict(layers=[2, 4]), dict(n_layers=5, window_size=3, window_pattern="SL")),
    ("sas+resformer-learnable", dict(neutreno=0.2), dict(window_size=3, window_pattern="SL")),
    ("pre-ln", {}, dict(positions="none", logit_softcap=3.0, qk_norm=True, bias=True)),
    ("pre-ln", {}, dict(positions="sinusoidal", window_size=1, window_pattern="S")),
    ("post-ln", {}, dict(norm="layernorm", tie_embeddings=False, window_size=2, window_pattern="SL")),
]


@pytest.mark.parametrize("arch, options, overrides", OPTION_CASES,
                         ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(OPTION_CASES)])
def test_decoding_with_value_path_options(arch, options, overrides):
    model = build(arch, options, seed=5, **overrides)
    assert decode_error(model, ids_of(2, 14, seed=4), prompt=6, chunk=3) <= TOL


def test_prompt_of_one_token_and_cache_shorter_than_context():
    model = build("shaped+svformer", seed=6, window_size=2, window_pattern="SL")
    assert decode_error(model, ids_of(1, 9, seed=5), prompt=1, chunk=1) <= TOL


def test_value_path_hooks_see_the_current_tokens_while_decoding():
    """Forward hooks on block.attn.values get (LayerValues, carry) for the new tokens only, equal to the
    full pass's at the same positions (the contract other tools rely on)."""
    model = build("pre-ln+svformer", seed=7, window_size=3, window_pattern="SL")
    ids = ids_of(2, 10, seed=6)
    seen: dict[int, list] = {}
    hooks = [b.attn.values.register_forward_hook(
        lambda mod, args, out, i=i: seen.setdefault(i, []).append(out[0].v.detach()))
        for i, b in enumerate(model.blocks)]
    with torch.no_grad():
        model(ids)
        full = {i: v.pop() for i, v in seen.items()}
        cache = model.new_cache(2, 10)
        model(ids[:, :6], cache=cache)
        model(ids[:, 6:], cache=cache)
    for h in hooks:
        h.remove()
    for i, (prefill, chunk) in seen.items():
        assert prefill.shape[1] == 6 and chunk.shape[1] == 4
        torch.testing.assert_close(torch.cat((prefill, chunk), 1), full[i], rtol=0, atol=1e-5)


def test_gradients_of_a_prefill_equal_the_full_forward_pass():
    """Under autograd the current chunk keeps its graph through the cache."""
    grads = []
    for use_cache in (False, True):
        model = build("sas-p+bov", seed=8, window_size=3, window_pattern="SL")
        ids = ids_of(2, 8, seed=7)
        cache = model.new_cache(2, 8) if use_cache else None
        model(ids, cache=cache).logsumexp(-1).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-5, msg=name)


def test_a_low_precision_cache_stays_close():
    model = build("pre-ln+bov", seed=9)
    ids = ids_of(2, 10, seed=8)
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(2, 10, dtype=torch.bfloat16)
        out = torch.cat([model(ids[:, :4], cache=cache)] + [model(ids[:, i:i + 1], cache=cache)
                                                             for i in range(4, 10)], 1)
    assert all(t.dtype == torch.bfloat16 for n, t in cache.tensors().items() if n != "token_ids")
    assert 0 < (out - full).abs().max() < 0.05 * full.abs().max()


@pytest.mark.parametrize("t_q, t_k, causal, window", [
    (1, 9, True, None), (3, 9, True, None), (9, 9, True, None), (1, 9, True, 4), (4, 9, True, 3),
    (2, 5, True, 7), (1, 9, False, None), (3, 9, False, 2), (4, 4, True, 1)])
def test_decoding_centering_term_equals_masked_mean(t_q, t_k, causal, window):
    """ops.masked_mean_of_last (two reductions) and ops.shaped_attention (GQA heads repeated
    after the mean) against the prefix-sum forms used in training, in float64."""
    g = torch.Generator().manual_seed(t_q * 10 + t_k)
    v = torch.randn(2, 2, t_k, 5, generator=g, dtype=torch.float64)
    torch.testing.assert_close(ops.masked_mean_of_last(v, t_q, causal, window),
                               ops.masked_mean(v, t_q, causal, window), rtol=0, atol=1e-12)
    q = torch.randn(2, 4, t_q, 5, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, t_k, 5, generator=g, dtype=torch.float64)
    alpha, beta = torch.tensor([0.5, 1.0, 1.5, 2.0], dtype=torch.float64), 0.7  # head-wise and scalar
    for gamma in (torch.tensor([0.3, -0.2, 1.1, 0.9], dtype=torch.float64), None):
        torch.testing.assert_close(ops.shaped_attention(q, k, v, alpha, beta, gamma, causal, window),
                                   ops.shaped_attention(q, k, v, alpha, beta, gamma, causal, window),
                                   rtol=0, atol=1e-12)


@pytest.mark.parametrize("t_q, t_k", [(1, 9), (3, 9), (1, 1), (4, 6)])
def test_running_sum_centering_term_equals_the_full_equation(t_q, t_k):
    """ops.shaped_attention with the running sum of the T_k - T_q earlier values (float64)
    against ops.shaped_attention over every key; a window cannot use a running sum."""
    g = torch.Generator().manual_seed(t_q * 10 + t_k)
    q = torch.randn(2, 4, t_q, 5, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, t_k, 5, generator=g, dtype=torch.float64) for _ in range(2))
    alpha, beta, gamma = (torch.rand(4, generator=g, dtype=torch.float64) + 0.2 for _ in range(3))
    past_sum = v[..., :t_k - t_q, :].sum(dim=-2, keepdim=True)
    torch.testing.assert_close(ops.shaped_attention(q, k, v, alpha, beta, gamma, past_sum=past_sum),
                               ops.shaped_attention(q, k, v, alpha, beta, gamma), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="no window"):
        ops.shaped_attention(q, k, v, alpha, beta, gamma, window=3, past_sum=past_sum)


@pytest.mark.parametrize("arch", ["sas-p", "shaped+bov", "sas+svformer"])
def test_shaped_decoding_reads_its_running_sums(arch):
    """Full-context shaped layers keep a running sum of their values; a decoding step reads it (a
    corrupted sum changes the logits) instead of summing the cached values again."""
    model = build(arch, window_size=3, window_pattern="SSSL")
    ids = ids_of(2, 12)
    with torch.no_grad():
        cache = model.new_cache(2, 12)
        model(ids[:, :10], cache=cache)
        assert sorted(cache.value_sums) == [3]  # layers 0-2 are windowed
        before = cache.value_sums[3].clone()
        clean = model(ids[:, 10:11], cache=cache)
        assert not torch.equal(cache.value_sums[3], before)  # the step added its own value
        cache.value_sums[3] += 1.0
        corrupted = model(ids[:, 11:12], cache=cache)
        reference = model(ids)  # the full forward pass
    torch.testing.assert_close(clean, reference[:, 10:11], rtol=0, atol=TOL)
    assert (corrupted - reference[:, 11:12]).abs().max() > 1e-3


# -- 2. what each layout stores, and its bytes ---------------------------------------------------
L6 = dict(n_layers=6)  # Bank of Values' targets are the last third: layers 4 and 5
ALL6 = set(range(6))


@pytest.mark.parametrize("path, options, keys, values, token_ids", [
    ("standard", {}, ALL6, ALL6, False),
    ("resformer", {}, ALL6, ALL6, False),
    ("resformer-dense", {}, ALL6, ALL6, False),
    ("neutreno", {}, ALL6, ALL6, False),
    ("denseformer", {}, ALL6, ALL6, False),
    ("value-embed", {}, ALL6, ALL6, False),
    ("cross-layer-attn", {}, ALL6, ALL6, False),
    ("svformer", {}, ALL6, {0}, False),
    ("svformer", dict(anchors=[3]), ALL6, {0, 3}, False),
    ("cla", {}, {0, 2, 4}, {0, 2, 4}, False),
    ("cla", dict(group=3), {0, 3}, {0, 3}, False),
    ("bov", {}, ALL6, {0, 1, 2, 3}, True),
    ("bov", dict(shared=True), ALL6, {0, 1, 2, 3}, True),
    ("x0-value", {}, ALL6, {0, 1, 2, 3}, True),
    ("x0-value", dict(x0="stream"), ALL6, ALL6, False),
    ("bov-resformer", {}, ALL6, {0, 1, 2, 3}, True),
    ("v1-value", {}, ALL6, {0, 1, 2, 3}, False),
])
def test_layout_keeps_only_what_each_variant_reads(path, options, keys, values, token_ids):
    model = build(f"pre-ln+{path}", options, **L6)
    names = set(model.new_cache(1, 8).tensors())
    assert names == ({f"keys.{i}" for i in keys} | {f"values.{i}" for i in values}
                     | ({"token_ids"} if token_ids else set()))


def kv_bytes(cache) -> int:
    return sum(t.untyped_storage().nbytes() for n, t in cache.tensors().items() if n != "token_ids")


def test_standard_cache_bytes_by_hand():
    cfg = make_cfg("pre-ln", **L6)
    model = LanguageModel(cfg)
    cache = model.new_cache(3, 20)
    assert cache.nbytes == 3 * 20 * 6 * 2 * 32 * 4  # B T L (K, V) d float32
    assert model.new_cache(3, 20, dtype=torch.bfloat16).nbytes == 3 * 20 * 6 * 2 * 32 * 2


@pytest.mark.parametrize("n_layers", [3, 4, 6])
def test_svformer_keeps_l_plus_1_over_2l_of_the_kv_bytes(n_layers):
    """Value Residual Learning Sec. 3.5: SVFormer shares V_1, so K per layer plus V once: (L + 1) / (2L)."""
    base = LanguageModel(make_cfg("pre-ln", n_layers=n_layers)).new_cache(2, 16)
    sv = LanguageModel(make_cfg("pre-ln+svformer", n_layers=n_layers)).new_cache(2, 16)
    assert Fraction(kv_bytes(sv), kv_bytes(base)) == Fraction(n_layers + 1, 2 * n_layers)


@pytest.mark.parametrize("context", [8, VOCAB, 80])
def test_bank_of_values_saves_eq6(context):
    """Bank of Values Eq. (6): Delta_KV = (L/3) d (T - |V|) values per sequence, the tables counted.

    Units: values (elements) of one sequence of T positions, times the bytes per element; the
    token-id buffer (4 bytes per position) that replaces them is left out of Eq. (6) and counted apart.
    Negative below the breakeven T = |V|, zero at it, positive beyond.
    """
    n_layers, d, elem = 6, 32, 4
    base = LanguageModel(make_cfg("pre-ln", n_layers=n_layers, context_length=80))
    bov = LanguageModel(make_cfg("pre-ln+bov", n_layers=n_layers, context_length=80))
    table_params = [p for n, p in bov.named_parameters() if n.endswith("value_table")]
    table_bytes = sum(p.numel() * p.element_size() for p in table_params)
    assert table_bytes == (n_layers // 3) * VOCAB * d * elem
    base_cache, bov_cache = base.new_cache(1, context), bov.new_cache(1, context)
    ids_bytes = bov_cache.tensors()["token_ids"].untyped_storage().nbytes()
    assert ids_bytes == 4 * context
    saved = base_cache.nbytes - (bov_cache.nbytes - ids_bytes) - table_bytes
    assert saved == (n_layers // 3) * d * (context - VOCAB) * elem
    formula = cache_bytes_per_token(bov.cfg, elem, context)
    assert formula["value_table_bytes"] == table_bytes and formula["token_id_bytes"] == ids_bytes


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_grouped_query_cache_ratio(kv_heads):
    base = LanguageModel(make_cfg("pre-ln")).new_cache(2, 16)
    gqa = LanguageModel(make_cfg("pre-ln", n_kv_heads=kv_heads)).new_cache(2, 16)
    assert Fraction(gqa.nbytes, base.nbytes) == Fraction(kv_heads, 4)


@pytest.mark.parametrize("group, n_layers, ratio", [(2, 4, Fraction(1, 2)), (2, 3, Fraction(2, 3)),
                                                    (3, 6, Fraction(1, 3)), (3, 4, Fraction(1, 2))])
def test_cla_cache_ratio(group, n_layers, ratio):
    """CLA keeps one K and V per group of layers: ceil(L / group) of L."""
    base = LanguageModel(make_cfg("pre-ln", n_layers=n_layers)).new_cache(2, 16)
    cla = LanguageModel(make_cfg("pre-ln+cla", dict(group=group), n_layers=n_layers)).new_cache(2, 16)
    assert Fraction(cla.nbytes, base.nbytes) == ratio


def test_shaped_cache_bytes_by_hand():
    """SAS-P with SSSL windows of 3: K and V of 3 positions in layers 0-2, of max_len in layer 3,
    and one float32 running sum (B, kv_dim) for layer 3's centering term, whatever the cache dtype."""
    model = LanguageModel(make_cfg("sas-p", window_size=3, window_pattern="SSSL"))
    for dtype, elem in ((torch.float32, 4), (torch.bfloat16, 2)):
        cache = model.new_cache(2, 20, dtype=dtype)
        assert cache.nbytes == 2 * (3 * 3 + 20) * 2 * 32 * elem + 2 * 32 * 4


def test_window_layers_hold_window_entries():
    """SSSL with window 3: layers 0-2 keep 3 positions, the last layer all max_len."""
    cache = LanguageModel(make_cfg("pre-ln", window_size=3, window_pattern="SSSL")).new_cache(2, 20)
    for i in range(4):
        for kind in ("keys", "values"):
            assert cache.tensors()[f"{kind}.{i}"].shape[1] == (3 if i < 3 else 20)
    assert cache.nbytes == 2 * (3 * 3 + 20) * 2 * 32 * 4


def test_a_store_read_by_a_full_context_layer_keeps_every_position():
    """SVFormer with a windowed layer 0: the last (full-context) layer attends over all of V_1."""
    cache = LanguageModel(make_cfg("pre-ln+svformer", window_size=3, window_pattern="SSSL")).new_cache(2, 20)
    shapes = {n: t.shape[1] for n, t in cache.tensors().items()}
    assert shapes == {"keys.0": 3, "keys.1": 3, "keys.2": 3, "keys.3": 20, "values.0": 20}


LAYOUT_CASES = [dict(), dict(window_size=3, window_pattern="SSSL"), dict(n_kv_heads=2, window_size=5,
                                                                          window_pattern="SL")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", range(len(LAYOUT_CASES)))
@pytest.mark.parametrize("arch", archs(["pre-ln", "shaped"]))
def test_nbytes_equals_the_layout_formula(arch, case, dtype):
    cfg = make_cfg(arch, n_layers=6, **LAYOUT_CASES[case])
    model = LanguageModel(cfg)
    elem = torch.tensor([], dtype=dtype).element_size()
    for batch, max_len in ((1, 24), (3, 7)):
        formula = cache_bytes_per_token(cfg, dtype_bytes=elem, context=max_len)
        assert model.new_cache(batch, max_len, dtype=dtype).nbytes == batch * formula["total_bytes"]
        assert formula["per_token"] == formula["total_bytes"] / max_len


def test_bytes_used_counts_filled_positions():
    model = build("pre-ln+bov", window_size=3, window_pattern="SSSL", **{})
    cache = model.new_cache(2, 20)
    assert cache.bytes_used == 0
    with torch.no_grad():
        model(ids_of(2, 5), cache=cache)
    # keys of layers 0-2 (rings of 3), layer 3 (5 of 20), V of layers 0-1 (rings), 5 token ids
    width = 32 * 4
    assert cache.bytes_used == 2 * (3 * 3 * width + 5 * width + 2 * 3 * width + 5 * 4)


# -- 3. errors -----------------------------------------------------------------------------------
def test_encoder_cannot_use_a_cache():
    model = LanguageModel(make_cfg("pre-ln", causal=False))
    with pytest.raises(ConfigError, match="causal"):
        model.new_cache(1, 8)
    with pytest.raises(ConfigError, match="causal"):
        cache_bytes_per_token(model.cfg)


def test_cache_size_errors():
    model = build()
    with pytest.raises(ValueError, match="context_length"):
        model.new_cache(1, 25)
    with pytest.raises(ValueError, match="max_len"):
        model.new_cache(1, 0)
    cache = model.new_cache(2, 6)
    with torch.no_grad():
        model(ids_of(2, 4), cache=cache)
        with pytest.raises(ValueError, match="max_len = 6"):
            model(ids_of(2, 3), cache=cache)
        with pytest.raises(ValueError, match="batch"):
            model(ids_of(3, 1), cache=cache)
        with pytest.raises(ValueError, match="different ModelConfig"):
            build("pre-ln+bov")(ids_of(2, 1), cache=cache)
        model(ids_of(2, 2), cache=cache)  # the failed calls left the cache as it was
    assert cache.length == 6


def test_a_failed_forward_pass_breaks_the_cache():
    model = build()
    cache = model.new_cache(1, 8)
    hook = model.blocks[2].register_forward_hook(lambda *a: (_ for _ in ()).throw(KeyError("boom")))
    with torch.no_grad(), pytest.raises(KeyError):
        model(ids_of(1, 3), cache=cache)
    hook.remove()
    with torch.no_grad(), pytest.raises(RuntimeError, match="new_cache"):
        model(ids_of(1, 1), cache=cache)


def test_generate_errors():
    model = build()
    prompt = ids_of(1, 4)
    with pytest.raises(ValueError, match="context_length"):
        model.generate(prompt, 22)
    for kwargs, word in [(dict(temperature=-1.0), "temperature"), (dict(top_p=0.0), "top_p"),
                         (dict(top_k=0), "top_k"), (dict(stop_tokens=[VOCAB]), "stop_tokens"),
                         (dict(temperature=float("inf")), "positive finite"),
                         (dict(temperature=float("nan")), "temperature"),
                         (dict(temperature=1.0, top_k=VOCAB + 1), f"vocabulary size \\({VOCAB}\\)")]:
        with pytest.raises(ValueError, match=word):
            model.generate(prompt, 3, **kwargs)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(prompt, 0)
    model.generate(prompt, 3, temperature=1.0, top_k=VOCAB)  # every token: the edge is allowed


# -- 4. generation -------------------------------------------------------------------------------
GEN_ARCHS = [("pre-ln", {}), ("sas-p+bov", {}), ("pre-ln+svformer", dict(window_size=3, window_pattern="SL")),
             ("shaped+cla", dict(positions="rope")), ("pre-ln+x0-value", {})]


def greedy_by_full_forward(model, prompt, n):
    ids = prompt
    with torch.no_grad():
        for _ in range(n):
            ids = torch.cat((ids, model(ids)[:, -1].argmax(-1, keepdim=True)), dim=1)
    return ids


@pytest.mark.parametrize("arch, overrides", GEN_ARCHS, ids=[a for a, _ in GEN_ARCHS])
def test_greedy_equals_argmax_of_full_forward_passes(arch, overrides):
    model = build(arch, seed=10, **overrides).double()
    prompt = ids_of(3, 5, seed=9)
    out = model.generate(prompt, 12)
    assert out.shape == (3, 17)
    assert torch.equal(out, greedy_by_full_forward(model, prompt, 12))


def test_top_k_1_and_tiny_top_p_equal_greedy():
    model = build("sas-p+resformer", seed=11).double()
    prompt = ids_of(2, 4, seed=10)
    greedy = model.generate(prompt, 10)
    assert torch.equal(model.generate(prompt, 10, temperature=1.5, top_k=1, seed=0), greedy)
    assert torch.equal(model.generate(prompt, 10, temperature=1.5, top_p=1e-9, seed=0), greedy)


def test_a_seed_makes_sampling_reproducible():
    model = build("pre-ln+bov", seed=12)
    prompt = ids_of(2, 4, seed=11)
    a = model.generate(prompt, 12, temperature=2.0, seed=7)
    assert torch.equal(a, model.generate(prompt, 12, temperature=2.0, seed=7))
    assert not torch.equal(a, model.generate(prompt, 12, temperature=2.0, seed=8))
    assert torch.equal(a[:, :4], prompt)


def test_stop_tokens_stop_each_row_and_pad():
    model = build("pre-ln+svformer", seed=13)
    prompt = ids_of(2, 4, seed=12)
    free = model.generate(prompt, 12)[:, 4:]
    stop = int(free[0, 2])
    first = [(row == stop).nonzero()[0, 0].item() if (row == stop).any() else None for row in free]
    out = model.generate(prompt, 12, stop_tokens=[stop], pad_token=0)[:, 4:]
    steps = 12 if None in first else max(first) + 1  # generation ends when every row has stopped
    assert out.shape == (2, steps)
    for row, f in enumerate(first):
        if f is None:
            assert torch.equal(out[row], free[row])
        else:
            assert torch.equal(out[row, :f + 1], free[row, :f + 1])
            assert (out[row, f + 1:] == 0).all()
    padded_with_stop = model.generate(prompt, 12, stop_tokens=[stop])[:, 4:]  # default pad: the stop token
    assert (padded_with_stop[0, first[0]:] == stop).all()


def test_generate_continues_after_a_cache():
    model = build("pre-ln+cla", seed=14, window_size=3, window_pattern="SL")
    prompt = ids_of(2, 7, seed=13)
    cache = model.new_cache(2, 20)
    with torch.no_grad():
        model(prompt[:, :4], cache=cache)
    out = model.generate(prompt[:, 4:], 8, cache=cache)
    assert torch.equal(out, model.generate(prompt, 8)[:, 4:])


def test_sample_next_filters():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log().expand(2000, 4)
    g = torch.Generator().manual_seed(0)
    top_p = sample_next(logits, 1.0, top_p=0.7, generator=g)  # keeps {0, 1}: 0.5 < 0.7 <= 0.8
    assert set(top_p.tolist()) == {0, 1}
    assert abs((top_p == 0).float().mean().item() - 0.5 / 0.8) < 0.05
    top_k = sample_next(logits, 1.0, top_k=3, generator=g)
    assert set(top_k.tolist()) == {0, 1, 2}
    assert abs((top_k == 2).float().mean().item() - 0.15 / 0.95) < 0.04
    hot = sample_next(logits, 100.0, generator=g)  # a high temperature flattens the distribution
    assert abs((hot == 3).float().mean().item() - 0.25) < 0.05


# -- decoding calls modules plainly, so hooks see every call -----------------------------------------
def test_hooks_fire_during_generate_and_change_nothing():
    """A module hook, a global hook and a forward pre-hook on a block run while generating."""
    from torch.nn.modules.module import register_module_forward_hook

    model = build("sas-p+resformer", seed=15)
    prompt = ids_of(2, 4, seed=14)
    plain = model.generate(prompt, 6)
    calls = {"fc": 0, "global": 0, "block": 0}

    def count(name):
        def hook(*_):
            calls[name] += 1
        return hook

    handles = [model.block(1).mlp.fc.register_forward_hook(count("fc")),
               model.block(0).register_forward_pre_hook(count("block")),
               register_module_forward_hook(count("global"))]
    try:
        hooked = model.generate(prompt, 6)
    finally:
        for h in handles:
            h.remove()
    assert torch.equal(hooked, plain)
    assert calls["fc"] == 6 and calls["block"] == 6  # the prefill and five fed-back tokens
    assert calls["global"] > 6 * len(model.blocks)  # every submodule call went through __call__
    assert torch.equal(model.generate(prompt, 6), plain)  # and nothing is left behind


def test_unchecked_hidden_states_equal_checked_ones_with_a_cache():
    model = build("pre-ln+bov", seed=16, window_size=3, window_pattern="SL")
    ids = ids_of(2, 9, seed=15)
    with torch.no_grad():
        checked, unchecked = model.new_cache(2, 9), model.new_cache(2, 9)
        for s, e in ((0, 5), (5, 6), (6, 9)):
            torch.testing.assert_close(model.hidden_states(ids[:, s:e], unchecked, checked=False),
                                       model.hidden_states(ids[:, s:e], checked), rtol=0, atol=0)
    assert checked.length == unchecked.length == 9
    with pytest.raises(ValueError, match="exceed"):  # the cache still checks its room
        model.hidden_states(ids[:, :1], unchecked, checked=False)


def test_generate_returns_ordinary_tensors_and_leaves_the_cache_usable_with_autograd():
    """The loop runs in inference mode; its output and a cache passed in still work under autograd."""
    model = build("shaped+svformer", seed=17).train()
    prompt = ids_of(2, 4, seed=16)
    cache = model.new_cache(2, 12)
    out = model.generate(prompt, 5, cache=cache)
    assert not out.is_inference() and model.training and cache.length == 8
    loss = model(out[:, -1:], cache=cache).logsumexp(-1).sum() + model(out).logsumexp(-1).sum()
    loss.backward()  # a cache extended in inference mode, then a step with gradients
    assert cache.length == 9 and model.tok_emb.weight.grad is not None


def test_carry_update_copies_and_checks_the_fields():
    from blocklab.model.carry import Carry

    ids = torch.zeros(1, 2, dtype=torch.long)
    carry = Carry(token_ids=ids, positions=torch.arange(2))
    new = carry.update(first_values=ids, path_state=(ids,))
    assert new is not carry and carry.first_values is None and carry.path_state is None
    assert new.first_values is ids and new.token_ids is ids and new.path_state == (ids,)
    with pytest.raises(TypeError, match="not_a_field"):
        carry.update(not_a_field=1)


@pytest.mark.parametrize("t_k, causal, window, masked", [(7, True, None, False), (7, False, None, False),
                                                          (7, True, 7, False), (7, True, 3, True),
                                                          (7, False, 3, True), (1, True, None, False)])
def test_a_single_query_builds_no_mask_when_it_sees_every_key(t_k, causal, window, masked):
    mask = ops.attention_mask(1, t_k, causal, window)
    assert (mask is not None) == masked
    q, k, v = (torch.randn(2, 4, t, 8, dtype=torch.float64) for t in (1, t_k, t_k))
    full = torch.ones(1, t_k, dtype=torch.bool) if mask is None else mask
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=full)
    torch.testing.assert_close(ops.attention(q, k, v, causal, window), expected)
