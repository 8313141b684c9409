"""nanochat's trunk (model/trunk.py, init_schemes.py, the nanochat-d12 presets) and its weight
converter (interop/nanochat.py), against the float64 reference in tests/nanochat_reference.py."""

from __future__ import annotations

import math

import pytest
import torch

from blocklab import LanguageModel, ModelConfig
from blocklab.interop.nanochat import config_from_nanochat, from_nanochat, state_dict_from_nanochat
from blocklab.model.trunk import Backout, ResidualScalars, Smear
from blocklab.util.errors import ConfigError
from tests.nanochat_reference import nanochat_logits, random_nanochat_weights

SMALL = dict(n_layer=4, d=64, head_dim=16, n_kv_head=2, vocab=100)
WINDOW = 8  # keys to the left of the token in "S" layers (blocklab's window_size counts the token: 9)


def _converted(upstream: bool, seed: int = 0) -> tuple[dict, LanguageModel]:
    w = random_nanochat_weights(**SMALL, upstream=upstream, seed=seed)
    model = from_nanochat(w, vocab_size=SMALL["vocab"], sequence_len=64, head_dim=SMALL["head_dim"],
                          window_pattern="SSL", window_size=WINDOW + 1)
    return w, model


def _windows(n_layer: int) -> list[int]:  # "SSL" tiled, the last layer long
    return [WINDOW if "SSL"[i % 3] == "S" and i < n_layer - 1 else 10**9 for i in range(n_layer)]


@pytest.mark.parametrize("upstream", [False, True], ids=["gpt_base", "upstream-gpt"])
def test_logits_equal_the_nanochat_reference_for_the_same_weights(upstream):
    w, model = _converted(upstream)
    assert model.tok_emb.weight.dtype == torch.float64
    idx = torch.randint(0, SMALL["vocab"], (2, 24), generator=torch.Generator().manual_seed(1))
    expected = nanochat_logits(w, idx, SMALL["n_layer"], SMALL["head_dim"], SMALL["vocab"],
                               _windows(SMALL["n_layer"]))
    assert model.cfg.residual_scalars is upstream and model.cfg.backout is upstream
    assert (model.cfg.value_path == "value-embed") is upstream
    torch.testing.assert_close(model(idx), expected, atol=1e-10, rtol=0)


def test_the_rotation_convention_is_converted():
    """Without negating the second half of each head, nanochat's -theta rotation gives other logits."""
    w, model = _converted(upstream=False)
    idx = torch.randint(0, SMALL["vocab"], (1, 16), generator=torch.Generator().manual_seed(2))
    state = state_dict_from_nanochat(w, model.cfg)
    for i in range(SMALL["n_layer"]):  # undo the flip
        for name in ("q", "k"):
            state[f"blocks.{i}.attn.{name}.weight"] = w[f"transformer.h.{i}.attn.c_{name}.weight"]
    model.load_state_dict(state)
    expected = nanochat_logits(w, idx, SMALL["n_layer"], SMALL["head_dim"], SMALL["vocab"],
                               _windows(SMALL["n_layer"]))
    assert (model(idx) - expected).abs().max() > 1e-3


@pytest.mark.parametrize("upstream", [False, True], ids=["gpt_base", "upstream-gpt"])
def test_cached_decoding_equals_the_full_forward(upstream):
    """The smear reads the previous token from the cache; the residual scalars and backout are token-local."""
    _, model = _converted(upstream, seed=3)
    idx = torch.randint(0, SMALL["vocab"], (2, 20), generator=torch.Generator().manual_seed(4))
    full = model(idx)
    cache = model.new_cache(2, 20)
    parts = [model(idx[:, :7], cache=cache)] + [model(idx[:, t:t + 1], cache=cache) for t in range(7, 12)]
    parts.append(model(idx[:, 12:], cache=cache))
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-10, rtol=0)


@pytest.mark.parametrize("x0", ["stream", "embedding"])
def test_x0_values_read_x0_where_the_option_says_with_a_trained_smear(x0):
    """Bank of Values' x0 W_V rows: v = gamma RMSNorm(x0) W_V with x0 after the smear (the official
    code, x0="stream") or before it (x0="embedding"). The reference's smear strength is 0.5 times a
    normal draw (not its initial 0), so the two differ, and each matches its own reference."""
    w, base = _converted(upstream=False, seed=5)
    gammas = {2: 1.7, 3: -0.6}  # last-third of 4 layers
    model = LanguageModel(base.cfg.replace(value_path="x0-value", value_path_options={
        "layers": "last-third", "learnable": True, "x0": x0})).double()
    state = base.state_dict()
    for layer, gamma in gammas.items():
        state[f"blocks.{layer}.attn.values.coef.gain"] = torch.tensor([gamma], dtype=torch.float64)
    model.load_state_dict(state)
    assert abs(float(model.smear.strength.gain)) > 0.1
    idx = torch.randint(0, SMALL["vocab"], (2, 24), generator=torch.Generator().manual_seed(6))
    args = (w, idx, SMALL["n_layer"], SMALL["head_dim"], SMALL["vocab"], _windows(SMALL["n_layer"]))
    official = nanochat_logits(*args, x0_gammas=gammas)
    before = nanochat_logits(*args, x0_gammas=gammas, x0_before_smear=True)
    assert (official - before).abs().max() > 1e-3  # the order matters once the smear is trained
    torch.testing.assert_close(model(idx), official if x0 == "stream" else before, atol=1e-10, rtol=0)
    # decoding with a cache: the stream's x0 mixes in the previous token, so the cache keeps values
    assert model.block(2).attn.values.caches_values is (x0 == "stream")
    cache = model.new_cache(2, 24)
    parts = [model(idx[:, :9], cache=cache)] + [model(idx[:, t:t + 1], cache=cache) for t in range(9, 24)]
    torch.testing.assert_close(torch.cat(parts, dim=1), model(idx), atol=1e-10, rtol=0)


def test_bov_table1_grid_reads_x0_after_the_smear_as_the_official_code():
    from blocklab.compare import GRIDS

    rows = {e.label: e for e in GRIDS["bov-table1"].entries}
    x0_rows = [e for e in rows.values() if e.arch == "pre-ln+x0-value"]
    assert len(x0_rows) == 5 and all(e.model["value_path_options"]["x0"] == "stream" for e in x0_rows)


def test_x0_option_rejects_other_sources():
    with pytest.raises(ConfigError, match="'x0'.*'embedding'.*'stream'"):
        LanguageModel(ModelConfig.from_preset("pre-ln+x0-value", "nanochat-tiny",
                                            value_path_options={"x0": "after-smear"}))


def test_nanochat_presets_count_the_papers_parameters():
    """Bank of Values Table 6/8: 135.3M and 780.1M, nanochat's gpt_base: embedding + untied head +
    12 d^2 per layer (Q, K, V, O and a 4x MLP) + the smear's 24 + 1, no norm parameters."""
    for size, layers, d, paper in (("nanochat-d12", 12, 768, 135.3e6), ("nanochat-d24", 24, 1536, 780.1e6)):
        with torch.device("meta"):
            model = LanguageModel(ModelConfig.from_preset("pre-ln", size))
        count = sum(p.numel() for p in model.parameters())
        assert count == 2 * 32768 * d + layers * 12 * d * d + 25
        assert round(count / 1e5) == round(paper / 1e5)


def test_smear_equals_its_equation_position_by_position():
    torch.manual_seed(0)
    smear = Smear(32).double()
    with torch.no_grad():
        smear.gate.weight.normal_()
        smear.strength.param.fill_(0.7)
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    out = smear(x)
    for t in range(5):
        g = 0.7 * torch.sigmoid(x[:, t, :24] @ smear.gate.weight.T)
        expected = x[:, t] + (g * x[:, t - 1] if t else 0)
        torch.testing.assert_close(out[:, t], expected, atol=1e-12, rtol=0)
    prev = torch.randn(2, 1, 32, dtype=torch.float64)  # decoding: the token before the first new one
    g0 = 0.7 * torch.sigmoid(x[:, :1, :24] @ smear.gate.weight.T)
    torch.testing.assert_close(smear(x, prev)[:, :1], x[:, :1] + g0 * prev, atol=1e-12, rtol=0)


def test_trunk_scalars_start_at_nanochats_values():
    first, last = ResidualScalars(0, 12), ResidualScalars(11, 12)
    assert first.resid_lambda.param.item() == pytest.approx(1.15)
    assert last.resid_lambda.param.item() == pytest.approx(1.05)
    assert first.x0_lambda.param.item() == pytest.approx(0.20)
    assert last.x0_lambda.param.item() == pytest.approx(0.05)
    assert ResidualScalars(6, 12).x0_lambda.param.item() == pytest.approx(0.20 - 0.15 * 6 / 11)
    backout = Backout(12)
    assert backout.layer == 6 and backout.strength.param.item() == pytest.approx(0.2)
    assert Smear(24).strength.param.item() == 0.0  # the smear is off at init


def test_nanochat_init_follows_nanochats_laws():
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("pre-ln", "nanochat-tiny", d_model=256, n_heads=2, head_dim=128,
                                  mlp_hidden=1024)
    model = LanguageModel(cfg)
    s = math.sqrt(3 / 256)
    assert model.tok_emb.weight.std().item() == pytest.approx(0.8, rel=0.02)
    assert model.head.weight.std().item() == pytest.approx(0.001, rel=0.02)
    for block in model.block_list():
        for w in (block.attn.q.weight, block.attn.k.weight, block.attn.values.w_v.weight):
            assert w.abs().max() <= s and w.std().item() == pytest.approx(s / math.sqrt(3), rel=0.05)
        assert block.mlp.fc.weight.abs().max() <= 0.4 * s
        assert not block.attn.proj.weight.any() and not block.mlp.out.weight.any()
    assert 0 <= model.smear.gate.weight.min() and model.smear.gate.weight.max() <= 0.02
    assert not [n for n, _ in model.named_parameters() if "norm" in n]  # parameter-free norms


def test_attention_logit_scale_multiplies_the_scores():
    """softmax(s q.k / sqrt(d)) against a plain float64 attention with the scale written out."""
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("pre-ln", "tiny", attn_logit_scale=1.44, n_layers=1, positions="none")
    model = LanguageModel(cfg).double()
    attn = model.block(0).attn
    x = torch.randn(1, 6, cfg.d_model, dtype=torch.float64)
    from blocklab.model.carry import Carry

    y, _ = attn(x, Carry(token_ids=torch.zeros(1, 6, dtype=torch.long), positions=torch.arange(6)))
    h, d = cfg.n_heads, cfg.attention_shape.head_dim
    q = (x @ attn.q.weight.T).view(1, 6, h, d).transpose(1, 2)
    k = (x @ attn.k.weight.T).view(1, 6, h, d).transpose(1, 2)
    v = (x @ attn.values.w_v.weight.T).view(1, 6, h, d).transpose(1, 2)
    scores = 1.44 * q @ k.transpose(-1, -2) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    expected = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, 6, -1) @ attn.proj.weight.T
    torch.testing.assert_close(y, expected, atol=1e-12, rtol=0)


def test_embedding_norm_and_parameter_free_norms():
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("pre-ln", "tiny", norm="rmsnorm", norm_eps=None, norm_affine=False,
                                  embed_norm=True, positions="none")
    model = LanguageModel(cfg).double()
    ids = torch.randint(0, cfg.vocab_size, (1, 5))
    e = model.tok_emb.weight[ids]
    expected = e / torch.sqrt(e.pow(2).mean(-1, keepdim=True) + torch.finfo(torch.float64).eps)
    torch.testing.assert_close(model.embed(e, torch.arange(5)), expected, atol=1e-12, rtol=0)
    assert not any("norm" in n for n, _ in model.named_parameters())


@pytest.mark.parametrize("fields, words", [
    (dict(smear=True, d_model=16, n_heads=4), "d_model >= 24"),
    (dict(init_scheme="nanochat", tie_embeddings=True), "tie_embeddings=False"),
    (dict(init_scheme="xavier"), "'normal', 'nanochat'"),
    (dict(attn_logit_scale=0.0), "> 0"),
    (dict(norm_eps=None, norm="layernorm"), "RMSNorm"),
])
def test_trunk_fields_reject_bad_values(fields, words):
    with pytest.raises(ConfigError, match=words):
        ModelConfig.from_preset("pre-ln", "tiny", **fields)


def test_config_from_nanochat_reads_the_shapes():
    w = random_nanochat_weights(**SMALL, upstream=False)
    cfg = config_from_nanochat(w, vocab_size=100, sequence_len=64, head_dim=16)
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.attention_shape.n_kv_heads,
            cfg.mlp_shape.hidden) == (4, 64, 4, 2, 256)
    assert cfg.window_pattern == "L"  # a 64-token context: nanochat's quarter window rounds up to all of it
    with pytest.raises(ConfigError, match="not a nanochat state dict"):
        config_from_nanochat({"tok_emb.weight": torch.zeros(2, 2)})


@pytest.mark.parametrize("value_path", ["resformer-learnable", "denseformer", "value-embed", "bov"])
def test_retrofit_keeps_the_trunk(value_path):
    """A value path retrofitted onto a trained-looking nanochat-trunk baseline keeps every trunk weight
    (smear, residual scalars, backout); the paths that start at the baseline keep its logits."""
    from blocklab.interop import retrofit

    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("pre-ln", "nanochat-tiny", residual_scalars=True, backout=True, n_layers=3)
    baseline = LanguageModel(cfg).double()
    with torch.no_grad():
        for p in baseline.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model = retrofit(baseline, value_path)
    state = model.state_dict()
    trunk = [k for k in baseline.state_dict() if k.startswith(("smear.", "backout.")) or ".residual." in k]
    assert len(trunk) == 2 + 1 + 2 * 3
    assert all(torch.equal(state[k], baseline.state_dict()[k]) for k in trunk)
    if value_path != "bov":
        ids = torch.randint(0, cfg.vocab_size, (2, 12))
        torch.testing.assert_close(model(ids), baseline(ids), atol=1e-10, rtol=0)


def test_params_counts_the_trunk():
    from blocklab.report import params_rows

    rows = params_rows(["pre-ln", "pre-ln+bov"], ["nanochat-d12"])
    assert rows[0]["total"] == 2 * 32768 * 768 + 12 * 12 * 768 * 768 + 25
    assert rows[0]["embedding"] == 32768 * 768
    # BoV: no W_V in the last third (layers 8-11), one 32768 x 768 table each instead
    assert rows[1]["value_tables"] == 4 * 32768 * 768
    assert rows[1]["total"] == rows[0]["total"] - 4 * 768 * 768 + 4 * 32768 * 768 + 4  # + gamma_v


def test_a_d12_state_dict_gives_the_nanochat_d12_preset():
    """nanochat's d12 shapes (meta tensors: no memory) map to exactly the nanochat-d12 preset."""
    w = random_nanochat_weights(n_layer=2, d=64, head_dim=16, n_kv_head=4, vocab=100, upstream=False)
    shapes = {"transformer.wte.weight": (32768, 768), "lm_head.weight": (32768, 768)}
    for i in range(12):
        for name, shape in (("attn.c_q", (768, 768)), ("attn.c_k", (768, 768)), ("attn.c_v", (768, 768)),
                            ("attn.c_proj", (768, 768)), ("mlp.c_fc", (3072, 768)),
                            ("mlp.c_proj", (768, 3072))):
            shapes[f"transformer.h.{i}.{name}.weight"] = shape
    state = {k: torch.empty(s, device="meta") for k, s in shapes.items()}
    state.update({k: torch.empty(w[k].shape, device="meta") for k in ("smear_gate.weight", "smear_lambda")})
    assert config_from_nanochat(state) == ModelConfig.from_preset("pre-ln", "nanochat-d12")


def test_nanochat_d12_gives_the_reference_logits():
    """At the full d12 size (the paper's 135.3M model): random weights in nanochat's names through
    from_nanochat give the float64 reference's logits. The model runs in float32 (half the memory;
    the small models above are checked in float64 at 1e-10); 16 tokens, inside every window."""
    w = random_nanochat_weights(n_layer=12, d=768, head_dim=128, n_kv_head=6, vocab=32768, upstream=False,
                                seed=7)
    idx = torch.randint(0, 32768, (1, 16), generator=torch.Generator().manual_seed(8))
    expected = nanochat_logits(w, idx, 12, 128, 32768, [10**9] * 12)
    model = from_nanochat(w, dtype=torch.float32)
    del w
    assert model.cfg == ModelConfig.from_preset("pre-ln", "nanochat-d12")
    assert sum(p.numel() for p in model.parameters()) == 135_266_329
    assert expected.abs().max() > 1.0  # logits far from zero: the comparison has teeth
    torch.testing.assert_close(model(idx).double(), expected, atol=2e-4, rtol=0)
