"""Value paths (ResFormer, SVFormer, NeuTRENO, DenseFormer, CLA, cross-layer attention, Bank of Values).

Every variant's model output is compared with `value_reference.reference_logits`, a naive float64
forward written from the papers' equations, after all parameters (lambdas, gamma_v, DWA weights,
tables, weights) have been moved away from their initial values. The other tests check structural
claims: BoV values depend on token ids only, the parameters each variant removes or adds, causality,
batch independence, gradients, the initial equivalences the papers state, and config errors.
"""

from __future__ import annotations

import math

import pytest
import torch

import blocklab
from blocklab import ConfigError
from blocklab.model.value_paths import VALUE_PATHS, target_layers, value_layers
from blocklab.model.value_paths.bank import init_table_from_embedding
from value_reference import reference_logits

VOCAB, D, H = 29, 16, 4
SMALL = dict(n_layers=4, d_model=D, n_heads=H, vocab_size=VOCAB, context_length=10, mlp_hidden=24,
             positions="learned")


def make_cfg(arch: str = "pre-ln", options: dict | None = None, **overrides) -> blocklab.ModelConfig:
    return blocklab.ModelConfig.from_preset(arch, size="tiny", value_path_options=options or {},
                                           **{**SMALL, **overrides})


def perturb_(model: torch.nn.Module, seed: int, gains: bool = True) -> None:
    """Move every parameter away from its initial value (gains by ~0.3, matrices and tables by ~0.15)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_gain = name.endswith("gain")
            if is_gain and not gains:
                continue
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
            p.add_((0.3 if is_gain else 0.15) * noise)


def build(arch: str = "pre-ln", options: dict | None = None, seed: int = 0, perturb: bool = True,
          **overrides) -> blocklab.LanguageModel:
    torch.manual_seed(seed)
    model = blocklab.LanguageModel(make_cfg(arch, options, **overrides)).double()
    if perturb:
        perturb_(model, seed + 1)
    return model


def random_ids(b: int, t: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def tolerance(cfg) -> float:
    # float32 pieces of the model (sinusoidal angles, the prefix sums of C V) limit agreement to ~1e-7;
    # test_float64_model_has_float64_precision checks those separately.
    return 1e-10 if cfg.positions != "sinusoidal" and cfg.attn_matrix != "shaped" else 1e-6


def capture_values(model, ids) -> dict[int, torch.Tensor]:
    """The value tensor (B, T, kv_dim) each layer's value path hands to attention."""
    values: dict[int, torch.Tensor] = {}
    hooks = [block.attn.values.register_forward_hook(
        lambda mod, args, out, i=i: values.__setitem__(i, out[0].v.detach()))
        for i, block in enumerate(model.blocks)]
    try:
        model(ids)
    finally:
        for h in hooks:
            h.remove()
    return values


def params_under(model, prefix: str) -> list[str]:
    return [n for n, _ in model.named_parameters() if n.startswith(prefix)]


# -- 1. every variant equals the float64 reference (with perturbed, non-initial parameters) ---------
GQA = dict(n_kv_heads=2)
ROPE = dict(positions="rope", rope_base=50.0)  # a small base so that the rotations matter at T = 9
CASES = [
    ("pre-ln", {}, {}),
    ("pre-ln+resformer", {}, {}),
    ("pre-ln+resformer", dict(lambda1=0.7, lambda2=1.3), dict(norm="layernorm", mlp_act="gelu")),
    ("pre-ln+resformer", {}, GQA),
    ("pre-ln+resformer", dict(source=1, layers="every-2", learnable=True), {}),
    ("pre-ln+resformer", dict(residual_on="query", learnable=True), {}),
    ("pre-ln+resformer", dict(residual_on="key", learnable=True), GQA),
    ("pre-ln+resformer", dict(layers=[2]), dict(positions="sinusoidal", tie_embeddings=False)),
    ("pre-ln+resformer-constant", {}, {}),
    ("pre-ln+resformer-sparse", {}, dict(n_layers=5)),
    ("pre-ln+resformer-sparse", dict(layers="last-2", lambda1=3.0), {}),
    ("pre-ln+resformer-learnable", {}, dict(norm="layernorm")),
    ("pre-ln+resformer-learnable-plus", {}, dict(n_layers=5)),
    ("pre-ln+resformer-learnable-plus", dict(layers="last-2"), GQA),
    ("pre-ln+resformer-dense", {}, {}),
    ("pre-ln+svformer", {}, {}),
    ("pre-ln+svformer", {}, dict(GQA, mlp_act="gelu")),
    ("pre-ln+svformer", dict(anchors=[2]), dict(n_layers=5)),
    ("pre-ln+neutreno", {}, {}),
    ("pre-ln+neutreno", dict(lambda_=0.7), GQA),
    ("parallel+neutreno", {}, {}),
    ("pre-ln+denseformer", {}, {}),
    ("pre-ln+denseformer", dict(dilation=2, period=2), dict(n_layers=5)),
    ("pre-ln+denseformer", dict(dilation=3), {}),
    ("pre-ln+cla", {}, {}),
    ("pre-ln+cla", dict(group=3), GQA),
    ("pre-ln+cross-layer-attn", {}, {}),
    ("pre-ln+cross-layer-attn", {}, GQA),
    ("pre-ln+bov", {}, dict(n_layers=3)),
    ("pre-ln+bov", {}, dict(GQA, n_layers=6)),
    ("pre-ln+bov", dict(learnable=False, coef=1.7, layers=[1, 3]), {}),
    ("pre-ln+bov", dict(shared=True), dict(n_layers=6)),
    ("pre-ln+bov", dict(shared=True), dict(GQA, norm="layernorm")),
    ("pre-ln+bov-resformer", {}, dict(n_layers=6)),
    ("pre-ln+bov-resformer", dict(layers=[2], learnable=False, coef=0.6), GQA),
    ("sas-p+bov-resformer", dict(shared=True), dict(n_layers=5)),
    ("pre-ln+x0-value", {}, {}),
    ("pre-ln+x0-value", dict(layers="every-2"), GQA),
    ("pre-ln+v1-value", {}, {}),
    ("pre-ln+v1-value", dict(layers="every-2", learnable=False, coef=0.6), GQA),
    ("pre-ln+value-embed", {}, {}),
    ("pre-ln+value-embed", dict(gate_channels=5, layers="last-third"), GQA),
    ("pre-ln+value-embed", dict(gate="lambda"), {}),
    ("pre-ln+value-embed", dict(shared_tables=2), dict(GQA, n_layers=5)),
    ("pre-ln+value-embed", dict(shared_tables=1, gate="lambda"), ROPE),
    ("pre-ln+resformer-mix", {}, {}),
    ("pre-ln+v-scale", {}, {}),
    ("pre-ln+v-scale", dict(layers="every-2", learnable=False, coef=0.7), GQA),
    ("pre-ln+x0-value", dict(add=True), {}),
    ("pre-ln+x0-value", dict(x0="stream"), dict(positions="sinusoidal")),
    ("pre-ln+x0-value", dict(x0="stream", add=True, learnable=True), dict(positions="learned")),
    ("pre-ln+x0-value", dict(add=True, learnable=False, layers="every-2"), dict(GQA, **ROPE)),
    ("pre-ln+resformer-mix", dict(layers="every-2", neutreno=0.3), dict(GQA, **ROPE)),
    ("sas-p+resformer-mix", {}, {}),
    ("pre-ln+resformer", dict(neutreno=0.2), {}),
    ("pre-ln+resformer-learnable", dict(neutreno=0.2), GQA),
    ("sas-p", {}, {}),
    ("sas-p+bov", {}, {}),
    ("sas-p+bov", dict(shared=True), dict(n_layers=6)),
    ("sas-p+resformer", {}, {}),
    ("sas-p+resformer-learnable", {}, {}),
    ("sas-p+svformer", {}, {}),
    ("sas-p-nonorm+bov", {}, {}),
    ("sas+resformer", {}, {}),
    # RoPE on the mixed Q / K (and on the keys that CLA and cross-layer attention reuse)
    ("pre-ln+resformer", {}, ROPE),
    ("pre-ln+resformer", dict(residual_on="query", learnable=True), ROPE),
    ("pre-ln+resformer", dict(residual_on="key", learnable=True), dict(ROPE, **GQA)),
    ("pre-ln+resformer", dict(residual_on="query", source=1, layers=[0, 2, 3]), ROPE),
    ("pre-ln+cla", {}, ROPE),
    ("pre-ln+cla", dict(group=3), dict(ROPE, **GQA)),
    ("pre-ln+cross-layer-attn", {}, ROPE),
    ("pre-ln+cross-layer-attn", {}, dict(ROPE, **GQA)),
    ("pre-ln+svformer", {}, ROPE),
    ("pre-ln+svformer", dict(anchors=[2]), dict(ROPE, **GQA)),
    # grouped-query attention
    ("pre-ln+resformer", dict(residual_on="query", learnable=True), GQA),
    ("pre-ln+resformer", dict(source=1, layers="every-2", learnable=True), GQA),
    ("pre-ln+resformer-dense", {}, GQA),
    ("pre-ln+svformer", dict(anchors=[2]), dict(GQA, n_layers=5)),
    ("pre-ln+bov", dict(learnable=False, coef=1.7, layers=[1, 3]), GQA),
    # v1-value over "all" layers: every layer after layer 0 (BoV Table 1, "V1, All")
    ("pre-ln+v1-value", dict(layers="all"), dict(GQA, n_layers=5)),
]


def _case_id(case) -> str:
    arch, opts, over = case
    extra = ",".join(f"{k}={v}" for k, v in {**opts, **over}.items())
    return f"{arch}[{extra}]" if extra else arch


@pytest.mark.parametrize("arch, options, overrides", CASES, ids=[_case_id(c) for c in CASES])
def test_matches_float64_reference(arch, options, overrides):
    model = build(arch, options, seed=len(arch), **overrides)
    ids = random_ids(2, 9, seed=3)
    with torch.no_grad():
        out = model(ids)
    ref = reference_logits(model, ids)
    torch.testing.assert_close(out, ref, rtol=0, atol=tolerance(model.cfg))


def test_reference_cases_cover_every_value_path():
    covered = {(a.partition("+")[2] or "standard") for a, _, _ in CASES}
    assert covered == set(VALUE_PATHS)


@pytest.mark.parametrize("arch, overrides", [
    ("pre-ln+resformer", dict(positions="sinusoidal")),
    ("sas-p+bov", {}),
])
def test_float64_model_has_float64_precision(arch, overrides):
    """A model cast to float64 should compute in float64 (as torch.autograd.gradcheck needs).

    Fails where src computes pieces in float32 regardless of the model's dtype: the sinusoidal
    angles (positions.sinusoidal_positions) and the prefix sums of C V (ops.masked_mean, shaped attention).
    """
    model = build(arch, **overrides)
    ids = random_ids(2, 9)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), reference_logits(model, ids), rtol=0, atol=1e-10)


@pytest.mark.parametrize("arch", ["sas+resformer-mix", "sas-p+resformer-mix", "pre-ln+resformer-mix"])
def test_mixed_dtypes_under_bf16_autocast(arch):
    """Under autocast, V_1 (layer 0's bf16 projection) meets V_n in float32 where the values are
    the identity (SAS): the mix must promote, not fail (torch.lerp did, found on a GPU). Against the
    float64 reference, within bf16's error."""
    model = build(arch).float()
    ids = random_ids(2, 9)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(ids).double()
    ref = reference_logits(model.double(), ids)
    assert ((out - ref).norm() / ref.norm()).item() < 3e-2


# -- 2. initial values and the equivalences the papers state at initialisation -------------------
def _share_weights(src: torch.nn.Module, dst: torch.nn.Module, allowed_missing: tuple[str, ...]) -> None:
    """Copy every parameter and buffer of `src` into `dst` by name; `dst` may only lack `allowed_missing`."""
    missing, unexpected = dst.load_state_dict(src.state_dict(), strict=False)
    assert not unexpected, unexpected
    assert all(name.endswith(allowed_missing) for name in missing), missing


@pytest.mark.parametrize("variant, counterpart, new", [
    ("resformer-learnable", "resformer", ("lambda1.gain", "lambda2.gain")),
    ("resformer-dense", "resformer", ("lambdas.gain",)),
    ("denseformer", "pre-ln", tuple(f"dwa.{i}.gain" for i in range(12))),
])
def test_learned_weights_start_at_the_fixed_variant(variant, counterpart, new):
    """Learnable-ResFormer and Dense-ResFormer start as Identity-ResFormer; DenseFormer as the baseline."""
    base = build(counterpart)  # perturbed weights, fixed variant
    model = build(f"pre-ln+{variant}", perturb=False)
    assert any(n.endswith(new) for n, _ in model.named_parameters())
    _share_weights(base, model, new)
    ids = random_ids(2, 9)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), base(ids), rtol=0, atol=1e-12)
        perturb_(model, seed=5)  # the learned weights matter once they move
        _share_weights(base, model, new)
        assert (model(ids) - base(ids)).abs().max() > 1e-4


def test_learnable_plus_initialisation():
    """lambda = N, lambda'_n = log(n) (1-based), lambda_2 = 0.5: lambda_{n,1} = N n / sum(n) over n >= 2."""
    n_layers = 5
    model = build("pre-ln+resformer-learnable-plus", perturb=False, n_layers=n_layers)
    params = dict(model.named_parameters())
    scale, logits = params["value_shared.scale.gain"], params["value_shared.logits.gain"]
    torch.testing.assert_close(scale, torch.full_like(scale, float(n_layers)))
    ns = torch.arange(2, n_layers + 1, dtype=torch.float64)  # the mixing layers, 1-based
    torch.testing.assert_close(logits, torch.log(ns))
    torch.testing.assert_close(scale * torch.softmax(logits, 0), n_layers * ns / ns.sum())
    for i in range(1, n_layers):
        torch.testing.assert_close(params[f"blocks.{i}.attn.values.lambda2.gain"],
                                   torch.tensor([0.5], dtype=torch.float64))


def test_default_gains_initialisation():
    """gamma_v starts at 1 (BoV); DWA weights start at the identity; Dense-ResFormer at 1/2, 0.., 1/2."""
    bov = dict(build("pre-ln+bov", perturb=False, n_layers=6).named_parameters())
    coefs = [f"blocks.{i}.attn.values.coef.gain" for i in (4, 5)]
    assert [n for n in bov if n.endswith("coef.gain")] == coefs
    assert all(bov[f"blocks.{i}.attn.values.coef.gain"].item() == 1.0 for i in (4, 5))
    dwa = dict(build("pre-ln+denseformer", perturb=False).named_parameters())
    assert dwa["value_shared.dwa.2.gain"].tolist() == [0.0, 0.0, 0.0, 1.0]
    dense = dict(build("pre-ln+resformer-dense", perturb=False).named_parameters())
    assert dense["blocks.3.attn.values.lambdas.gain"].tolist() == [0.5, 0.0, 0.0, 0.5]


# -- 3. Bank of Values ---------------------------------------------------------------------------
def test_bov_values_depend_only_on_token_ids():
    model = build("pre-ln+bov", n_layers=6)  # targets: layers 4, 5
    ids_a = random_ids(1, 10, seed=1)
    ids_a[0, 8] = ids_a[0, 2]  # a repeated token
    ids_b = ids_a.clone()
    ids_b[0, :5] = (ids_a[0, :5] + 7) % VOCAB  # a different earlier context
    va, vb = capture_values(model, ids_a), capture_values(model, ids_b)
    params = dict(model.named_parameters())
    for i in (4, 5):
        torch.testing.assert_close(va[i][:, 5:], vb[i][:, 5:], rtol=0, atol=0)
        torch.testing.assert_close(va[i][0, 8], va[i][0, 2], rtol=0, atol=0)
        gamma = params[f"blocks.{i}.attn.values.coef.gain"]
        table = params[f"blocks.{i}.attn.values.value_table"]
        torch.testing.assert_close(va[i], gamma.detach() * table.detach()[ids_a], rtol=0, atol=1e-15)
    # the standard layers' values do depend on the context (so the check above can fail)
    assert (va[3][:, 5:] - vb[3][:, 5:]).abs().max() > 1e-3
    assert (va[3][0, 8] - va[3][0, 2]).abs().max() > 1e-3


def test_bov_shared_table_is_one_table_used_by_every_target():
    model = build("pre-ln+bov", dict(shared=True), n_layers=6, **GQA)
    tables = [n for n, _ in model.named_parameters() if n.endswith("value_table")]
    assert tables == ["value_shared.value_table"]
    params = dict(model.named_parameters())
    table = params["value_shared.value_table"].detach()
    assert table.shape == (VOCAB, model.cfg.attention_shape.kv_dim)
    ids = random_ids(2, 9)
    values = capture_values(model, ids)
    for i in (4, 5):
        assert params_under(model, f"blocks.{i}.attn.values.") == [f"blocks.{i}.attn.values.coef.gain"]
        gamma = params[f"blocks.{i}.attn.values.coef.gain"].detach()
        torch.testing.assert_close(values[i], gamma * table[ids], rtol=0, atol=1e-15)


@pytest.mark.parametrize("perturb", [False, True])
@pytest.mark.parametrize("overrides", [{}, dict(n_layers=6, **GQA)])
def test_bov_first_forward_equals_x0_value(perturb, overrides):
    """With E_v = RMSNorm(emb) W_V of x0-value's W_V and equal other weights, BoV == x0-value."""
    torch.manual_seed(1)
    x0 = blocklab.LanguageModel(make_cfg("pre-ln+x0-value", **overrides))
    if perturb:
        perturb_(x0, seed=2)
    bov = blocklab.LanguageModel(make_cfg("pre-ln+bov", **overrides))
    cfg = bov.cfg
    targets = target_layers("last-third", cfg.n_layers)
    dead = {f"blocks.{i}.attn.values.w_v.weight" for i in targets}  # x0-value's W_V in the targets
    state = {k: v for k, v in x0.state_dict().items() if k not in dead}
    assert len(state) == len(x0.state_dict()) - len(targets)
    missing, unexpected = bov.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("value_table") for k in missing), (missing, unexpected)
    for i in sorted(targets):
        init_table_from_embedding(bov.blocks[i].attn.values.value_table, bov.tok_emb.weight, cfg, i,
                                  w_v=x0.blocks[i].attn.values.w_v)
    ids = random_ids(2, 9)
    with torch.no_grad():
        out_bov, out_x0 = bov(ids), x0(ids)
        torch.testing.assert_close(out_bov, out_x0, rtol=0, atol=1e-5)
        # a table from another W_V gives another model (so the comparison above can fail)
        i = min(targets)
        init_table_from_embedding(bov.blocks[i].attn.values.value_table, bov.tok_emb.weight, cfg, i)
        assert (bov(ids) - out_x0).abs().max() > 1e-3 * out_x0.abs().max()


@pytest.mark.parametrize("options", [{}, dict(shared=True)])
def test_bov_default_table_init_is_rmsnorm_embedding_times_fresh_w_v(options):
    """The default init ties E_v = RMSNorm(emb) W^T with W a freshly initialised value map (std init_std)."""
    torch.manual_seed(0)
    model = blocklab.LanguageModel(make_cfg("pre-ln+bov", options, n_layers=6, vocab_size=40, **GQA))
    cfg = model.cfg
    emb = model.tok_emb.weight.detach().double()
    eps = torch.finfo(model.tok_emb.weight.dtype).eps
    r = emb / torch.sqrt((emb * emb).mean(-1, keepdim=True) + eps)  # parameter-free RMSNorm
    tables = {n: p.detach().double() for n, p in model.named_parameters() if n.endswith("value_table")}
    assert len(tables) == (1 if options else 2)
    ws = []
    for name, table in tables.items():
        assert table.shape == (cfg.vocab_size, cfg.attention_shape.kv_dim)
        w = torch.linalg.lstsq(r, table).solution  # (d, kv_dim): table = r W
        assert (r @ w - table).norm() < 1e-5 * table.norm(), name  # vocab 40 > d 16: a real constraint
        assert 0.5 * cfg.init_std < w.std() < 2 * cfg.init_std, name
        ws.append(w)
    if len(ws) == 2:  # each target layer gets its own fresh W_V
        assert (ws[0] - ws[1]).abs().max() > cfg.init_std


def test_bov_shared_with_no_target_layers_is_a_config_error():
    """An empty `layers` would be the standard Transformer plus an unused table: a ConfigError says so."""
    _assert_config_error("names no layer", "pre-ln+bov", dict(shared=True, layers=[]))


# -- 4. parameters that a variant removes ----------------------------------------------------------
def test_svformer_layers_after_the_first_have_no_value_projection():
    model = build("pre-ln+svformer", n_layers=5, **GQA)
    assert params_under(model, "blocks.0.attn.values.") == ["blocks.0.attn.values.w_v.weight"]
    for i in range(1, 5):
        assert params_under(model, f"blocks.{i}.attn.values.") == []
    anchored = build("pre-ln+svformer", dict(anchors=[2]), n_layers=5)
    assert [i for i in range(5) if params_under(anchored, f"blocks.{i}.attn.values.")] == [0, 2]


@pytest.mark.parametrize("options, targets", [({}, {4, 5}), (dict(layers=[0, 3]), {0, 3})])
def test_bov_target_layers_have_no_value_projection(options, targets):
    model = build("pre-ln+bov", options, n_layers=6)
    for i in range(6):
        names = params_under(model, f"blocks.{i}.attn.values.")
        if i in targets:
            assert sorted(names) == [f"blocks.{i}.attn.values.{n}" for n in ("coef.gain", "value_table")]
        else:
            assert names == [f"blocks.{i}.attn.values.w_v.weight"]


def test_cla_followers_have_no_keys_or_values():
    model = build("pre-ln+cla", dict(group=3), n_layers=5)
    for i in range(5):
        owns = i % 3 == 0
        names = set(params_under(model, f"blocks.{i}.attn."))
        assert (f"blocks.{i}.attn.k.weight" in names) == owns
        assert (f"blocks.{i}.attn.values.w_v.weight" in names) == owns
        assert f"blocks.{i}.attn.q.weight" in names and f"blocks.{i}.attn.proj.weight" in names


# -- 5. causality, batch independence and gradients for every value path -------------------------
PATH_ARCHS = [f"pre-ln+{vp}" for vp in VALUE_PATHS] + ["sas-p+bov", "sas-p+resformer", "sas-p+svformer"]


def _path_model(arch: str) -> blocklab.LanguageModel:
    return build(arch, seed=7, **({} if arch.startswith("sas") else GQA))


@pytest.mark.parametrize("arch", PATH_ARCHS)
def test_causal_and_batch_independent(arch):
    model = _path_model(arch)
    ids = random_ids(3, 10, seed=4)
    t = 6
    changed = ids.clone()
    changed[0, t] = (ids[0, t] + 1) % VOCAB
    with torch.no_grad():
        out, out_changed = model(ids), model(changed)
        torch.testing.assert_close(out_changed[:, :t], out[:, :t], rtol=0, atol=1e-12)
        torch.testing.assert_close(out_changed[1:], out[1:], rtol=0, atol=1e-12)
        assert (out_changed[0, t:] - out[0, t:]).abs().max() > 1e-6  # token t does matter
        for i in range(3):
            torch.testing.assert_close(model(ids[i:i + 1])[0], out[i], rtol=0, atol=1e-12)
        torch.testing.assert_close(model(ids.flip(0)), out.flip(0), rtol=0, atol=1e-12)


EXPECTED_TRAINABLE = {
    "resformer-learnable": ("lambda1.gain", "lambda2.gain"),
    "resformer-learnable-plus": ("value_shared.scale.gain", "value_shared.logits.gain", "lambda2.gain"),
    "resformer-dense": ("lambdas.gain",),
    "denseformer": ("dwa.1.gain",),
    "bov": ("value_table", "coef.gain"),
    "x0-value": ("coef.gain",),
    "v1-value": ("coef.gain",),
    "value-embed": ("value_table", "gate.weight"),
}


@pytest.mark.parametrize("arch", PATH_ARCHS + ["pre-ln+bov+shared"])
def test_gradients_reach_every_parameter(arch):
    shared = arch.endswith("+shared")
    arch = arch.removesuffix("+shared")
    gqa = {} if arch.startswith("sas") else GQA
    model = build(arch, dict(shared=True) if shared else None, seed=7, **gqa)
    ids = random_ids(2, 9, seed=5)
    logits = model(ids)
    weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(0), dtype=logits.dtype)
    (logits * weights).sum().backward()
    named = dict(model.named_parameters())
    for suffix in EXPECTED_TRAINABLE.get(arch.partition("+")[2], ()):
        assert any(n.endswith(suffix) for n in named), f"{arch} has no trainable {suffix}"
    if shared:
        assert "value_shared.value_table" in named
    no_grad = [n for n, p in named.items() if p.requires_grad and (p.grad is None or not p.grad.any())]
    assert not no_grad, f"no gradient reaches {no_grad}"


# -- 6. parameter and FLOP accounting ------------------------------------------------------------
def _counts(arch: str, options: dict | None = None, **overrides):
    model = blocklab.LanguageModel(make_cfg(arch, options, **overrides))
    return blocklab.count_parameters(model), blocklab.flops_per_token(model), model.cfg


@pytest.mark.parametrize("variant, added", [
    ("resformer", lambda L: 0),
    ("resformer-constant", lambda L: 0),
    ("resformer-sparse", lambda L: 0),
    ("resformer-learnable", lambda L: 2 * (L - 1)),  # lambda_{n,1}, lambda_{n,2} per layer n >= 2
    ("resformer-learnable-plus", lambda L: 2 * (L - 1) + 1),  # lambda, lambda'_n, lambda_{n,2}
    ("resformer-dense", lambda L: sum(n + 1 for n in range(1, L))),  # lambda_{n,1..n}
])
@pytest.mark.parametrize("overrides", [{}, dict(n_layers=6, **GQA)])
def test_resformer_adds_only_scalars(variant, added, overrides):
    base, base_flops, cfg = _counts("pre-ln", **overrides)
    res, res_flops, _ = _counts(f"pre-ln+{variant}", **overrides)
    assert res.total - base.total == added(cfg.n_layers)
    assert res.non_embedding - base.non_embedding == added(cfg.n_layers)
    assert (res.embedding, res.value_tables) == (base.embedding, 0)
    assert res_flops == base_flops


@pytest.mark.parametrize("overrides", [{}, dict(n_layers=6, **GQA)])
def test_svformer_removes_the_later_value_projections(overrides):
    base, base_flops, cfg = _counts("pre-ln", **overrides)
    sv, sv_flops, _ = _counts("pre-ln+svformer", **overrides)
    removed = (cfg.n_layers - 1) * cfg.d_model * cfg.attention_shape.kv_dim
    assert base.total - sv.total == removed
    assert base.non_embedding - sv.non_embedding == removed
    assert base_flops - sv_flops == 6 * removed


@pytest.mark.parametrize("options", [{}, dict(shared=True)])
@pytest.mark.parametrize("overrides", [{}, dict(n_layers=6, **GQA), dict(n_layers=9)])
def test_bov_trades_value_projections_for_tables(options, overrides):
    base, base_flops, cfg = _counts("pre-ln", **overrides)
    bov, bov_flops, _ = _counts("pre-ln+bov", options, **overrides)
    n_targets = cfg.n_layers - (2 * cfg.n_layers) // 3
    kv_dim = cfg.attention_shape.kv_dim
    n_tables = 1 if options else n_targets
    assert bov.value_tables == n_tables * cfg.vocab_size * kv_dim
    assert bov.embedding == base.embedding
    # each target drops W_V (d x d_kv) and gains one scalar gamma_v
    assert base.non_embedding - bov.non_embedding == n_targets * (cfg.d_model * kv_dim - 1)
    assert bov.total == base.total - n_targets * (cfg.d_model * kv_dim - 1) + bov.value_tables
    assert bov_flops < base_flops
    assert base_flops - bov_flops == 6 * n_targets * cfg.d_model * kv_dim


@pytest.mark.parametrize("group, n_layers", [(2, 4), (3, 4), (2, 5)])
def test_cla_removes_the_followers_keys_and_values(group, n_layers):
    base, base_flops, cfg = _counts("pre-ln", n_layers=n_layers, **GQA)
    cla, cla_flops, _ = _counts("pre-ln+cla", dict(group=group), n_layers=n_layers, **GQA)
    followers = sum(1 for i in range(n_layers) if i % group)
    removed = followers * 2 * cfg.d_model * cfg.attention_shape.kv_dim
    assert base.total - cla.total == removed
    assert base_flops - cla_flops == 6 * removed


def test_cross_layer_attention_doubles_the_attention_flops_after_the_first_layer():
    base, base_flops, cfg = _counts("pre-ln")
    cross, cross_flops, _ = _counts("pre-ln+cross-layer-attn")
    assert cross.total == base.total
    t = cfg.context_length
    assert cross_flops - base_flops == (cfg.n_layers - 1) * 12 * cfg.attention_shape.q_dim * t


# -- 7. target layers and config errors ------------------------------------------------------------
@pytest.mark.parametrize("spec, n_layers, expected", [
    ("all", 4, {0, 1, 2, 3}),
    ("last-third", 3, {2}),
    ("last-third", 4, {2, 3}),
    ("last-third", 12, set(range(8, 12))),
    ("last-third", 24, set(range(16, 24))),
    ("every-2", 12, {1, 3, 5, 7, 9, 11}),
    ("every-2", 5, {0, 2, 4}),
    ("last-3", 8, {5, 6, 7}),
    ("last-3", 2, {0, 1}),
    ([0, 2], 4, {0, 2}),
])
def test_target_layers(spec, n_layers, expected):
    assert target_layers(spec, n_layers) == expected


def _assert_config_error(match: str, arch: str, options: dict | None = None, **overrides) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        make_cfg(arch, options, **overrides)
    assert len(str(info.value)) > 30  # a message that says what is allowed


@pytest.mark.parametrize("arch", ["sas+cross-layer-attn", "sas-p+cross-layer-attn",
                                  "shaped+cross-layer-attn"])
def test_cross_layer_attention_needs_softmax_attention(arch):
    _assert_config_error("cross-layer-attn", arch)


def test_unknown_value_path():
    _assert_config_error("nope", "pre-ln+nope")
    with pytest.raises(ConfigError, match="resformer"):  # the message lists the known value paths
        blocklab.ModelConfig(**SMALL, value_path="resformr")


@pytest.mark.parametrize("arch, options", [
    ("pre-ln+resformer", dict(lambda3=1.0)),
    ("pre-ln+bov", dict(lambda1=1.0)),
    ("pre-ln+svformer", dict(layers="all")),
    ("pre-ln", dict(layers="all")),
])
def test_unknown_option_key(arch, options):
    _assert_config_error(next(iter(options)), arch, options)


@pytest.mark.parametrize("arch", ["pre-ln+resformer", "pre-ln+bov", "pre-ln+x0-value", "pre-ln+value-embed",
                                  "pre-ln+resformer-learnable-plus"])
@pytest.mark.parametrize("layers", ["last-x", "first-third", [0, 4], [-1], 3, None, "every-3",
                                    [True], [1, False], [], "last-0"])
def test_bad_layers_spec(arch, layers):
    _assert_config_error("layers", arch, dict(layers=layers))


@pytest.mark.parametrize("layers", [[0], [0, 2], "last-4"])
def test_v1_value_cannot_target_layer_0(layers):
    _assert_config_error("layer 0", "pre-ln+v1-value", dict(layers=layers))


def test_v1_value_all_means_every_layer_after_the_first():
    """BoV Table 1 row "V1, All" (11 targets of 12 layers): layers >= 1 take v = c V_1 and have no W_V."""
    n_layers = 5
    model = build("pre-ln+v1-value", dict(layers="all"), n_layers=n_layers, **GQA)
    assert params_under(model, "blocks.0.attn.values.") == ["blocks.0.attn.values.w_v.weight"]
    for i in range(1, n_layers):
        assert params_under(model, f"blocks.{i}.attn.values.") == [f"blocks.{i}.attn.values.coef.gain"]
    values = capture_values(model, random_ids(2, 9))
    params = dict(model.named_parameters())
    for i in range(1, n_layers):
        coef = params[f"blocks.{i}.attn.values.coef.gain"].detach()
        assert abs(coef.item() - 1.0) > 1e-3  # perturbed, so the check below can tell c from 1
        torch.testing.assert_close(values[i], coef * values[0], rtol=0, atol=1e-15)


@pytest.mark.parametrize("layers", ["all", [0, 3]])
def test_bov_resformer_keeps_layer_0_as_the_source_of_v1(layers):
    _assert_config_error("layer 0 is the source of V_1", "pre-ln+bov-resformer", dict(layers=layers))


@pytest.mark.parametrize("arch, options, match", [
    ("pre-ln+resformer", dict(layers=[0]), "no layer after source=0"),
    ("pre-ln+resformer", dict(source=1, layers=[0, 1]), "no layer after source=1"),
    ("pre-ln+resformer", dict(residual_on="query", layers=[0]), "no layer after source=0"),
    ("pre-ln+resformer-sparse", dict(source=2, layers=[1, 2]), "no layer after source=2"),
    ("pre-ln+resformer-learnable-plus", dict(layers=[0]), "no layer after source=0"),
    ("pre-ln+resformer-learnable-plus", dict(layers=[]), "names no layer"),
    ("pre-ln+bov", dict(layers=[]), "names no layer"),
    ("pre-ln+bov", dict(layers="last-0", shared=True), "names no layer"),
    ("pre-ln+x0-value", dict(layers=[]), "names no layer"),
    ("pre-ln+v1-value", dict(layers=[]), "names no layer"),
    ("pre-ln+value-embed", dict(layers="last-0"), "names no layer"),
])
def test_value_paths_that_would_change_nothing_are_config_errors(arch, options, match):
    """No target layer (or none after the ResFormer source) would silently give the standard model."""
    _assert_config_error(match, arch, options)
    with pytest.raises(ConfigError, match="layers"):  # the message names the option to change
        make_cfg(arch, options)


@pytest.mark.parametrize("arch, options", [
    ("pre-ln+resformer", dict(layers=[1])),
    ("pre-ln+resformer", dict(source=1, layers=[0, 1, 2])),
    ("pre-ln+bov", dict(layers=[0], shared=True)),
    ("pre-ln+value-embed", dict(layers="last-1")),
])
def test_one_target_layer_after_the_source_is_enough(arch, options):
    model = blocklab.LanguageModel(make_cfg(arch, options))
    assert model(random_ids(1, 5)).shape == (1, 5, VOCAB)


@pytest.mark.parametrize("group", [1, 0, 5, 1.5])
def test_cla_group_must_be_between_2_and_n_layers(group):
    _assert_config_error("group", "pre-ln+cla", dict(group=group))


@pytest.mark.parametrize("arch, options, match", [
    ("pre-ln+resformer", dict(source=3), "source"),
    ("pre-ln+resformer", dict(residual_on="hidden"), "residual_on"),
    ("pre-ln+svformer", dict(anchors=[0]), "anchors"),
    ("pre-ln+denseformer", dict(dilation=0), "dilation"),
    ("pre-ln+denseformer", dict(period=-1), "period"),
    ("pre-ln+value-embed", dict(gate_channels=D + 1), "gate_channels"),  # more than x has
    ("pre-ln+svformer", dict(anchors=[True]), "anchors"),
    ("pre-ln+value-embed", dict(gate="tanh"), "'nanochat', 'lambda'"),
    ("pre-ln+value-embed", dict(shared_tables=3), "2N <= n_layers = 4"),
    ("pre-ln+value-embed", dict(shared_tables=True), "shared_tables"),
    ("pre-ln+resformer", dict(neutreno=1.5), r"\[0, 1\)"),
    ("pre-ln+resformer", dict(neutreno=0.2, residual_on="query"), "residual_on='value'"),
    ("pre-ln+resformer-mix", dict(lambda1=0.3), "layers, source"),
])
def test_bad_option_values(arch, options, match):
    _assert_config_error(match, arch, options)


def _field_docstrings(options: type) -> set[str]:
    """The fields of `options` and its bases that are followed by a docstring line where declared."""
    import ast
    import inspect

    documented = set()
    for cls in options.__mro__[:-1]:
        body = ast.parse(inspect.getsource(cls).lstrip()).body[0].body
        for stmt, after in zip(body, body[1:], strict=False):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                documented.add(stmt.target.id)
    return documented


@pytest.mark.parametrize("name", list(VALUE_PATHS))
def test_each_value_path_has_typed_documented_options(name):
    """A value path's options are a frozen dataclass: every field typed, with a default that passes
    its own checks, and a docstring line where it is first declared."""
    import dataclasses
    import typing

    options = VALUE_PATHS[name].module.options
    assert dataclasses.is_dataclass(options) and options.__dataclass_params__.frozen
    hints = typing.get_type_hints(options)
    defaults = options()  # every field has a default, and the defaults are valid
    fields = dataclasses.fields(options)
    assert all(f.name in hints for f in fields)
    assert {f.name for f in fields} <= _field_docstrings(options)
    with pytest.raises(dataclasses.FrozenInstanceError):
        defaults.x = 1


def test_options_check_their_own_values_without_a_config():
    from blocklab.model.value_paths.resformer import ResFormerOptions

    assert ResFormerOptions(lambda1=1, neutreno=0.2).lambda1 == 1  # an int passes for a float
    with pytest.raises(ConfigError, match=r"'neutreno'\] = 1.5 is not allowed.*\[0, 1\)"):
        ResFormerOptions(neutreno=1.5)
    with pytest.raises(ConfigError, match=r"'learnable'\] = 1 is not allowed: it must be True or False"):
        ResFormerOptions(learnable=1)
    with pytest.raises(ConfigError, match="one of 'value', 'query', 'key'"):
        ResFormerOptions(residual_on="hidden")


def test_value_embed_gate_reads_up_to_d_model_channels():
    """gate_channels = d_model is allowed; the default 12 shrinks to a narrower d_model."""
    model = build("pre-ln+value-embed", dict(gate_channels=D))
    assert model.blocks[3].attn.values.gate.weight.shape == (model.cfg.attention_shape.n_kv_heads, D)
    narrow = build("pre-ln+value-embed", d_model=8, n_heads=2)
    assert narrow.blocks[3].attn.values.gate.weight.shape == (2, 8)


TIED = dict(value_form="reparam", proj_form="reparam", reparam_init="orthogonal")


@pytest.mark.parametrize("tie", ["all-tied", "ll-tied"])
@pytest.mark.parametrize("arch, options, bare", [
    ("pre-ln+svformer", {}, [1, 2, 3]),
    ("pre-ln+svformer", dict(anchors=[2]), [1, 3]),
    ("pre-ln+cla", {}, [1, 3]),
    ("pre-ln+bov", {}, [2, 3]),
    ("pre-ln+bov", dict(layers=[0, 3], shared=True), [0, 3]),
    ("pre-ln+v1-value", dict(layers="every-2"), [1, 3]),
])
def test_reparam_tie_needs_a_value_projection_in_every_layer(tie, arch, options, bare):
    """Tied inits set W_P,init from each layer's W_V,init (Simplifying Fig. 14); some paths drop W_V."""
    vp = arch.partition("+")[2]
    with pytest.raises(ConfigError) as info:
        make_cfg(arch, options, reparam_tie=tie, **TIED)
    message = str(info.value)
    assert "reparam_tie" in message and repr(vp) in message and f"layers {bare}" in message
    assert "none" in message  # what to do instead


@pytest.mark.parametrize("arch", ["pre-ln", "pre-ln+resformer", "pre-ln+x0-value", "pre-ln+resformer-dense"])
def test_reparam_tie_combines_with_paths_that_keep_every_value_projection(arch):
    model = blocklab.LanguageModel(make_cfg(arch, reparam_tie="all-tied", **TIED))
    assert model(random_ids(1, 5)).shape == (1, 5, VOCAB)


# Which of 4 layers own W^V and W_K, from the papers (0-based; "last-third" of 4 layers is 2 and 3):
# SVFormer projects V in layer 0 and its anchors, CLA in each group's first layer, Bank of Values and
# v1-value in the layers outside their targets; x0-value keeps W^V everywhere (it projects RMSNorm(x0))
ALL = [0, 1, 2, 3]
VALUE_MAPS = {"svformer": [0], "cla": [0, 2], "bov": [0, 1], "bov-resformer": [0, 1], "v1-value": [0, 1]}
OWN_MAPS = {("svformer", "anchors=[2]"): [0, 2], ("cla", "group=3"): [0, 3], ("v1-value", "layers=all"): [0],
            ("bov", "layers=[0, 2],shared=True"): [1, 3]}
KEY_MAPS = {"cla": [0, 2], ("cla", "group=3"): [0, 3]}


@pytest.mark.parametrize("path, options", [(vp, {}) for vp in VALUE_PATHS] + [
    ("svformer", dict(anchors=[2])), ("cla", dict(group=3)),
    ("bov", dict(layers=[0, 2], shared=True)), ("v1-value", dict(layers="all")),
])
def test_the_layers_that_own_w_v_and_w_k_are_the_papers(path, options):
    """The layers with a W^V module, those validation counts (`value_layers`, read for reparam_tie) and
    those with a W_K module, against the hand-written table above."""
    key = (path, ",".join(f"{k}={v}" for k, v in options.items())) if options else path
    cfg = make_cfg(f"pre-ln+{path}", options)
    model = blocklab.LanguageModel(cfg)
    built = [i for i, b in enumerate(model.blocks) if getattr(b.attn.values, "w_v", None) is not None]
    expected = OWN_MAPS.get(key, VALUE_MAPS.get(path, ALL)) if options else VALUE_MAPS.get(path, ALL)
    assert built == expected and value_layers(cfg) == expected
    assert [i for i, b in enumerate(model.blocks) if b.attn.k is not None] == KEY_MAPS.get(key, ALL)


def test_list_presets_names_every_value_path():
    assert set(blocklab.list_presets()["value_paths"]) == set(VALUE_PATHS)


def test_compile_blocks_compiles_every_layer_of_a_12_layer_dense_resformer():
    """Dense-ResFormer's earlier values grow per layer, so the blocks' shared forward needs one compiled
    version per layer: 12 > dynamo's default limit of 8, past which blocks silently run eagerly.

    fail_on_recompile_limit_hit turns that fallback into an error; the frame counters show every
    block ran as a compiled frame. The eager backend keeps the test fast (the limit is dynamo's).
    """
    model = build("pre-ln+resformer-dense", n_layers=12, seed=2)
    ids = random_ids(2, 9)
    with torch.no_grad():
        expected = model(ids)
    from torch._dynamo.utils import counters

    limits = dict(recompile_limit=8, accumulated_recompile_limit=256, fail_on_recompile_limit_hit=True)
    try:
        with torch._dynamo.config.patch(**limits):  # the defaults, whatever earlier tests set
            plain = build("pre-ln+resformer-dense", n_layers=12, seed=2)
            torch._dynamo.reset()
            for block in plain.blocks:  # what compile_blocks replaces: it hits the limit
                block.compile(backend="eager")
            with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit), torch.no_grad():
                plain(ids)

            torch._dynamo.reset()
            counters.clear()
            model.compile_blocks(backend="eager")
            assert torch._dynamo.config.recompile_limit >= 12 + 4
            with torch.no_grad():
                out = model(ids)
            assert counters["frames"]["total"] == counters["frames"]["ok"] == 12
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("arch, options, match", [
    ("pre-ln+svformer", dict(anchors=2), "anchors"),
    ("pre-ln+value-embed", dict(gate_channels=-1), "gate_channels"),
    ("pre-ln+resformer", dict(lambda1="half"), "lambda1"),
])
def test_malformed_option_values_raise_config_error(arch, options, match):
    """Malformed values must fail at config time with a ConfigError, not a TypeError at build time."""
    try:
        cfg = make_cfg(arch, options)
    except ConfigError as err:
        assert match in str(err)
        return
    except Exception as err:  # any other exception type is the failure
        pytest.fail(f"{type(err).__name__} instead of ConfigError: {err}")
    with pytest.raises(ConfigError):
        blocklab.LanguageModel(cfg)


def test_resformer_sparse_default_is_last_three_layers_with_lambda_5():
    """Sparse-ResFormer (8 layers): only layers 6-8 (1-based) mix, with lambda_1 = 5, lambda_2 = 1."""
    model = build("pre-ln+resformer-sparse", n_layers=8, seed=3)
    values = {}
    hooks = [b.attn.values.w_v.register_forward_hook(
        lambda m, a, out, i=i: values.__setitem__(i, out.detach())) for i, b in enumerate(model.blocks)]
    mixed = capture_values(model, random_ids(1, 9))
    for h in hooks:
        h.remove()
    for i in range(8):
        expected = 5.0 * values[0] + values[i] if i >= 5 else values[i]
        torch.testing.assert_close(mixed[i], expected, rtol=0, atol=1e-13)
    assert not math.isclose(float((values[7] - mixed[7]).abs().max()), 0.0)
