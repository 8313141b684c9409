"""Optimiser groups, AdamW / Muon steps, learning-rate schedules and OptimConfig checks.

References: hand-written parameter lists per group, a float64 AdamW written from Loshchilov &
Hutter's update (decoupled weight decay), a float64 Newton-Schulz iteration written from Keller
Jordan's Muon post, and schedule values computed by hand from each schedule's formula.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from blocklab import ConfigError, LanguageModel, ModelConfig
from blocklab.model.gains import Gain
from blocklab.model.presets import BLOCK_PRESETS
from blocklab.model.value_paths import VALUE_PATHS
from blocklab.training import TrainConfig
from blocklab.training.optim import (
    GROUPS,
    OptimConfig,
    build_optimizers,
    clip_grad_norm,
    named_groups,
    param_groups_summary,
)
from blocklab.training.schedules import SCHEDULES, lr_factor

TINY = dict(n_layers=3, d_model=32, n_heads=2, vocab_size=64, context_length=16, mlp_hidden=64)


def make_model(arch: str, seed: int = 0, **overrides) -> LanguageModel:
    torch.manual_seed(seed)
    return LanguageModel(ModelConfig.from_preset(arch, "tiny", **{**TINY, **overrides}))


def group_names(optimizers) -> dict[str, list[str]]:
    """Group name -> sorted parameter names, read back from the built optimisers."""
    return {g["name"]: g["params"] for opt in optimizers for g in opt.param_groups}


def names_by_group(model: nn.Module, optimizers) -> dict[str, list[str]]:
    name_of = {id(p): n for n, p in model.named_parameters()}
    return {g: sorted(name_of[id(p)] for p in ps) for g, ps in group_names(optimizers).items()}


def per_layer(n: int, *suffixes: str) -> list[str]:
    return [f"blocks.{i}.{s}" for i in range(n) for s in suffixes]


# -- group membership against hand-made lists ---------------------------------------------------------
# SAS + Bank of Values, 3 layers, biases, LayerNorm, learned positions, untied head.
# Layer 0 keeps a reparameterised W_V (dW and its two gains), layer 1 has the identity as W_V
# (no parameters), layer 2 (>= floor(2L/3)) looks values up in its table, scaled by coef.gain.
SAS_BOV = dict(
    embeddings=["pos_emb.weight", "tok_emb.weight"],
    head=["head.weight"],
    value_tables=["blocks.2.attn.values.value_table"],
    scalars=["blocks.0.attn.values.w_v.resid.gain", "blocks.0.attn.values.w_v.skip.gain",
             "blocks.2.attn.values.coef.gain"]
    + per_layer(3, "attn.alpha.gain", "attn.beta.gain", "attn.gamma.gain", "attn_branch.gain",
                "mlp_skip.gain", "mlp_branch.gain"),
    no_decay=["norm.bias", "norm.weight"]
    + per_layer(3, "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "attn.q.bias",
                "attn.k.bias", "mlp.fc.bias", "mlp.out.bias"),
    matrices=["blocks.0.attn.values.w_v.delta"]
    + per_layer(3, "attn.q.weight", "attn.k.weight", "mlp.fc.weight", "mlp.out.weight"),
)
# Pre-LN + nanochat value embeddings (layers 0 and 2 of 3), tied head: no head group.
PRE_LN_VE = dict(
    embeddings=["pos_emb.weight", "tok_emb.weight"],
    value_tables=["blocks.0.attn.values.value_table", "blocks.2.attn.values.value_table"],
    no_decay=["norm.bias", "norm.weight"]
    + per_layer(3, "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "attn.values.w_v.bias",
                "attn.q.bias", "attn.k.bias", "attn.proj.bias", "mlp.fc.bias", "mlp.out.bias"),
    matrices=["blocks.0.attn.values.gate.weight", "blocks.2.attn.values.gate.weight"]
    + per_layer(3, "attn.values.w_v.weight", "attn.q.weight", "attn.k.weight", "attn.proj.weight",
                "mlp.fc.weight", "mlp.out.weight"),
)
HAND = {
    "sas+bov": (dict(tie_embeddings=False), SAS_BOV),
    "pre-ln+value-embed": (dict(tie_embeddings=True), PRE_LN_VE),
}


@pytest.mark.parametrize("arch", list(HAND))
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_groups_match_hand_lists(arch, optimizer):
    overrides, expected = HAND[arch]
    model = make_model(arch, bias=True, norm="layernorm", positions="learned", **overrides)
    got = names_by_group(model, build_optimizers(model, OptimConfig(name=optimizer)))
    matrices = "muon" if optimizer == "muon" else "decay"
    want = {(matrices if g == "matrices" else g): sorted(names) for g, names in expected.items()}
    assert got == want


def test_shared_value_table_is_a_value_table():
    model = make_model("pre-ln+bov", value_path_options={"shared": True})
    got = names_by_group(model, build_optimizers(model, OptimConfig()))
    assert got["value_tables"] == ["value_shared.value_table"]
    assert got["scalars"] == ["blocks.2.attn.values.coef.gain"]


def _block_presets_and_value_paths():
    for arch in BLOCK_PRESETS:
        for value_path in VALUE_PATHS:
            yield f"{arch}+{value_path}", {}
    yield "pre-ln+bov", {"shared": True}
    yield "sas-p+resformer-dense", {}


def test_every_parameter_in_exactly_one_group_for_every_preset_and_value_path():
    built = 0
    for arch, options in _block_presets_and_value_paths():
        try:
            model = make_model(arch, n_layers=3, d_model=16, mlp_hidden=32, vocab_size=32, bias=True,
                               tie_embeddings=False, value_path_options=options)
        except ConfigError as err:  # cross-layer attention needs plain softmax attention
            assert "cross-layer-attn" in arch and "attn_matrix='softmax'" in str(err)
            continue
        built += 1
        params = {id(p): n for n, p in model.named_parameters()}
        buffers = {id(b) for _, b in model.named_buffers()}
        for name in ("adamw", "muon"):
            optimizers = build_optimizers(model, OptimConfig(name=name))
            seen = [id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]]
            assert sorted(seen) == sorted(params), f"{arch} {name}: missing or repeated parameters"
            assert not buffers & set(seen), f"{arch}: a buffer (W_init) landed in an optimizer"
            for opt in optimizers:
                for g in opt.param_groups:
                    assert g["name"] in GROUPS and g["params"] and "base_lr" in g
        # Muon takes exactly the 2-D block matrices: no tables, embeddings, head, gains or norms
        muon = build_optimizers(model, OptimConfig(name="muon"))[0]
        assert isinstance(muon, torch.optim.Muon)
        got = sorted(params[id(p)] for p in muon.param_groups[0]["params"])
        want = sorted(n for n, p in model.named_parameters()
                      if n.startswith("blocks.") and p.ndim == 2 and not n.endswith("value_table"))
        assert got == want, arch
    assert built == len(BLOCK_PRESETS) * len(VALUE_PATHS) - 5 + 2  # 5 shaped/skipinit + CLA pairs


def test_frozen_parameters_are_left_out():
    model = make_model("pre-ln")
    model.blocks[0].mlp.fc.weight.requires_grad_(False)
    seen = {id(p) for opt in build_optimizers(model, OptimConfig()) for g in opt.param_groups
            for p in g["params"]}
    assert id(model.blocks[0].mlp.fc.weight) not in seen
    assert id(model.blocks[1].mlp.fc.weight) in seen


class Wrapper(nn.Module):
    """Stands in for DistributedDataParallel (``.module``) or torch.compile's OptimizedModule
    (``._orig_mod``), without the seconds that importing the compiler costs."""

    def __init__(self, module: nn.Module, attribute: str):
        super().__init__()
        setattr(self, attribute, module)


def test_groups_see_through_compile_and_ddp_wrappers():
    model = make_model("sas+bov", tie_embeddings=False)
    plain = {g: [n for n, _ in ps] for g, ps in named_groups(model, muon=True).items()}
    assert plain["head"] == ["head.weight"] and plain["muon"]
    for wrapped in (Wrapper(model, "module"), Wrapper(model, "_orig_mod"),
                    Wrapper(Wrapper(model, "_orig_mod"), "module")):
        assert {g: [n for n, _ in ps] for g, ps in named_groups(wrapped, muon=True).items()} == plain


def test_reparam_w_init_buffer_is_not_optimised():
    model = make_model("sas")  # layer 0's W_V = alpha W_init + beta dW with W_init a frozen buffer
    w_init = model.blocks[0].attn.values.w_v.w_init
    assert not isinstance(w_init, nn.Parameter)
    seen = {id(p) for opt in build_optimizers(model, OptimConfig()) for g in opt.param_groups
            for p in g["params"]}
    assert id(w_init) not in seen and id(model.blocks[0].attn.values.w_v.delta) in seen


# -- decay flags and learning rates ---------------------------------------------------------------------
@pytest.mark.parametrize("decay_embeddings", [False, True])
@pytest.mark.parametrize("decay_value_tables", [False, True])
def test_decay_flags_and_per_group_lrs(decay_embeddings, decay_value_tables):
    model = make_model("sas+bov", tie_embeddings=False, bias=True)
    cfg = OptimConfig(lr=1e-3, weight_decay=0.2, decay_embeddings=decay_embeddings,
                      decay_value_tables=decay_value_tables, lr_embeddings=2e-3, lr_head=3e-3,
                      lr_value_tables=4e-3, lr_scalars=5e-3)
    (adamw,) = build_optimizers(model, cfg)
    groups = {g["name"]: g for g in adamw.param_groups}
    want = {  # name: (lr, weight decay)
        "embeddings": (2e-3, 0.2 if decay_embeddings else 0.0),
        "head": (3e-3, 0.2),
        "value_tables": (4e-3, 0.2 if decay_value_tables else 0.0),
        "scalars": (5e-3, 0.0),
        "no_decay": (1e-3, 0.0),
        "decay": (1e-3, 0.2),
    }
    assert {n: (g["lr"], g["weight_decay"]) for n, g in groups.items()} == want
    assert all(g["base_lr"] == g["lr"] and g["betas"] == (0.9, 0.95) for g in groups.values())


def test_group_lrs_default_to_lr_and_muon_settings():
    model = make_model("pre-ln+bov", tie_embeddings=False)
    cfg = OptimConfig(name="muon", lr=7e-4, weight_decay=0.05, muon_lr=0.03, muon_momentum=0.9,
                      muon_weight_decay=0.28)
    muon, adamw = build_optimizers(model, cfg)
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    (g,) = muon.param_groups
    assert (g["name"], g["lr"], g["base_lr"], g["momentum"], g["weight_decay"], g["nesterov"],
            g["adjust_lr_fn"]) == ("muon", 0.03, 0.03, 0.9, 0.28, True, "original")
    assert {x["name"]: x["lr"] for x in adamw.param_groups} == {
        "embeddings": 7e-4, "head": 7e-4, "value_tables": 7e-4, "scalars": 7e-4, "no_decay": 7e-4}
    # muon_weight_decay None: Muon decays with weight_decay
    muon, _ = build_optimizers(model, cfg.replace(muon_weight_decay=None))
    assert muon.param_groups[0]["weight_decay"] == 0.05


def test_param_groups_summary_counts():
    model = make_model("sas+bov", tie_embeddings=False, bias=True, norm="layernorm", positions="learned")
    rows = param_groups_summary(build_optimizers(model, OptimConfig(name="muon", lr_head=2e-3)))
    by_name = {r["name"]: r for r in rows}
    d, v, hidden, ctx = 32, 64, 64, 16
    assert by_name["embeddings"]["n_elements"] == v * d + ctx * d
    assert by_name["head"] == dict(optimizer="AdamW", name="head", n_params=1, n_elements=v * d,
                                   lr=2e-3, base_lr=2e-3, weight_decay=0.1)
    assert by_name["value_tables"]["n_elements"] == v * d
    # per layer: q, k (d x d), MLP (hidden x d twice); layer 0 also dW (d x d)
    assert by_name["muon"]["n_params"] == 3 * 4 + 1
    assert by_name["muon"]["n_elements"] == 3 * (2 * d * d + 2 * hidden * d) + d * d
    assert by_name["muon"]["optimizer"] == "Muon"
    # 3 layers x (alpha, beta, gamma per head (2 heads) + 3 block gains) + 2 reparam gains + coef
    assert by_name["scalars"]["n_elements"] == 3 * (3 * 2 + 3) + 2 + 1
    assert sum(r["n_elements"] for r in rows) == sum(p.numel() for p in model.parameters())


def test_muon_unavailable_is_a_config_error(monkeypatch):
    monkeypatch.delattr(torch.optim, "Muon")
    with pytest.raises(ConfigError, match=r"OptimConfig\.name = 'muon'.*torch >= 2\.9"):
        build_optimizers(make_model("pre-ln"), OptimConfig(name="muon"))


# -- one optimiser step against float64 references ------------------------------------------------------
class Toy(nn.Module):
    """One block matrix with a bias, and one trainable scalar gain."""

    def __init__(self, rows: int = 3, cols: int = 4):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(cols, rows, bias=True)])
        self.scale = Gain(0.5, trainable=True)


def adamw_reference(p0, grads, lrs, wd, betas, eps):
    """AdamW (Loshchilov & Hutter 2019, Alg. 2) in float64: decoupled decay, bias-corrected moments."""
    b1, b2 = betas
    p, m, v = p0.double().clone(), torch.zeros_like(p0, dtype=torch.float64), 0 * p0.double()
    for t, (g, lr) in enumerate(zip(grads, lrs, strict=True), start=1):
        g = g.double()
        p = p * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        p = p - lr * m_hat / (v_hat.sqrt() + eps)
    return p


def test_adamw_steps_match_float64_reference_for_decayed_and_undecayed_groups():
    torch.manual_seed(0)
    model = Toy().double()
    with torch.no_grad():
        model.scale.gain.fill_(0.7)
    cfg = OptimConfig(lr=0.1, lr_scalars=0.05, weight_decay=0.5, betas=(0.8, 0.9), eps=1e-6)
    (opt,) = build_optimizers(model, cfg)
    params = {"decay": model.blocks[0].weight, "no_decay": model.blocks[0].bias,
              "scalars": model.scale.gain}
    assert {n: [id(p) for p in g] for n, g in group_names([opt]).items()} == {
        n: [id(p)] for n, p in params.items()}
    start = {n: p.detach().clone() for n, p in params.items()}
    gen = torch.Generator().manual_seed(1)
    grads = {n: [torch.randn(p.shape, generator=gen, dtype=torch.float64) for _ in range(3)]
             for n, p in params.items()}
    factors = [0.5, 1.0, 0.25]  # the trainer rescales each group's lr from its base_lr every step
    for step, factor in enumerate(factors):
        for g in opt.param_groups:
            g["lr"] = g["base_lr"] * factor
        for n, p in params.items():
            p.grad = grads[n][step].clone()
        opt.step()
    for name, wd, base_lr in [("decay", 0.5, 0.1), ("no_decay", 0.0, 0.1), ("scalars", 0.0, 0.05)]:
        lrs = [base_lr * f for f in factors]
        want = adamw_reference(start[name], grads[name], lrs, wd, (0.8, 0.9), 1e-6)
        torch.testing.assert_close(params[name].detach(), want, rtol=1e-12, atol=1e-12)
        if wd:  # the decay is visible at this size: the reference without it is far off
            assert not torch.allclose(want, adamw_reference(start[name], grads[name], lrs, 0.0,
                                                            (0.8, 0.9), 1e-6), atol=1e-3)


def newton_schulz_reference(g, steps=5, coeffs=(3.4445, -4.7750, 2.0315)):
    """Keller Jordan's quintic Newton-Schulz in float64: X0 = G / ||G||_F, X <- aX + (bA + cA^2) X,
    A = X X^T, iterated on the wide orientation. Close to the polar factor U V^T of G = U S V^T."""
    a, b, c = coeffs
    x = g.double()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / x.norm()
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


@pytest.mark.parametrize("adjust, scale", [("original", math.sqrt(2.0)),
                                           ("match_rms_adamw", 0.2 * math.sqrt(8.0))])
def test_muon_step_is_orthogonalised_scaled_and_decayed(adjust, scale):
    torch.manual_seed(0)
    model = Toy(rows=8, cols=4)  # a tall 8 x 4 block matrix: "original" scales by sqrt(8 / 4)
    cfg = OptimConfig(name="muon", muon_lr=0.01, muon_weight_decay=0.5, muon_adjust_lr=adjust)
    muon, adamw = build_optimizers(model, cfg)
    w = model.blocks[0].weight
    assert muon.param_groups[0]["params"] == [w]
    w0 = w.detach().double().clone()
    g = torch.randn(8, 4, generator=torch.Generator().manual_seed(2))
    w.grad = g.clone()
    muon.step()
    update = (w0 * (1 - 0.01 * 0.5) - w.detach().double()) / (0.01 * scale)
    want = newton_schulz_reference(g)  # first step: the Nesterov momentum is a multiple of g
    err = (update - want).norm() / want.norm()
    assert err < 0.03, f"relative error {err:.3g} (torch runs Newton-Schulz in bfloat16)"
    # the orthogonalised update has singular values near 1, far from those of the raw gradient
    s = torch.linalg.svdvals(update)
    assert s.min() > 0.5 and s.max() < 1.5


# -- schedules ----------------------------------------------------------------------------------------
COS_QUARTER = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4))
SCHEDULE_POINTS = [
    # (config, progress, step, total_steps, expected), values worked out by hand
    (dict(schedule="linear", warmup_fraction=0.1), 0.0, 0, None, 0.0),  # start
    (dict(schedule="linear", warmup_fraction=0.1), 0.05, 5, None, 0.5),  # mid warmup
    (dict(schedule="linear", warmup_fraction=0.1), 0.1, 10, None, 1.0),  # end of warmup
    (dict(schedule="linear", warmup_fraction=0.1), 0.55, 55, None, 0.5),  # middle of the decay
    (dict(schedule="linear", warmup_fraction=0.1), 1.0, 100, None, 0.0),  # end
    (dict(schedule="linear", warmup_fraction=0.1, final_lr_fraction=0.2), 0.55, 0, None, 0.6),
    (dict(schedule="linear", warmup_fraction=0.0), 0.0, 0, None, 1.0),
    (dict(schedule="linear", warmup_fraction=0.1), 1.7, 170, None, 0.0),  # past the budget: clipped
    (dict(schedule="linear", warmup_fraction=0.1), -0.2, 0, None, 0.0),
    # step-based warmup (the budget in steps is known): (step + 1) / warmup_steps
    (dict(schedule="linear", warmup_steps=10), 0.0, 0, 100, 0.1),
    (dict(schedule="linear", warmup_steps=10), 0.04, 4, 100, 0.5),
    (dict(schedule="linear", warmup_steps=10), 0.09, 9, 100, 1.0),
    (dict(schedule="linear", warmup_steps=10), 0.55, 55, 100, 0.5),
    (dict(schedule="linear", warmup_steps=0), 0.0, 0, 100, 1.0),
    # ResFormer: warmup steps, then cosine to 10%
    (dict(schedule="cosine", warmup_steps=10), 0.0, 0, 100, 0.1),
    (dict(schedule="cosine", warmup_steps=10), 0.1, 10, 100, 1.0),
    (dict(schedule="cosine", warmup_steps=10), 0.325, 32, 100, COS_QUARTER),
    (dict(schedule="cosine", warmup_steps=10), 0.55, 55, 100, 0.55),
    (dict(schedule="cosine", warmup_steps=10), 1.0, 100, 100, 0.1),
    (dict(schedule="cosine", warmup_steps=10), 0.025, 7, None, 0.5),  # no step budget: 5% fraction
    (dict(schedule="cosine", warmup_steps=10, final_lr_fraction=0.0), 1.0, 100, 100, 0.0),
    # nanochat WSD: 5% warmup, flat, linear warmdown over the last 65% to 0.05
    (dict(schedule="wsd"), 0.025, 0, None, 0.5),
    (dict(schedule="wsd"), 0.05, 0, None, 1.0),
    (dict(schedule="wsd"), 0.35, 0, None, 1.0),  # warmdown starts
    (dict(schedule="wsd"), 0.675, 0, None, 0.525),  # half-way through the warmdown
    (dict(schedule="wsd"), 1.0, 0, None, 0.05),
    (dict(schedule="wsd", warmup_steps=40), 0.0, 0, 1000, 1 / 40),
    (dict(schedule="wsd", warmdown_fraction=0.5, final_lr_fraction=0.0), 0.75, 0, None, 0.5),
    # a warmup that overlaps the warmdown: the lower of the two
    (dict(schedule="wsd", warmup_fraction=0.5, warmdown_fraction=0.8), 0.3, 0, None, 0.6),
    (dict(schedule="wsd", warmup_fraction=0.5, warmdown_fraction=0.8), 0.6, 0, None, 0.525),
    # Cramming one-cycle: up to the peak at 75%, down to 0
    (dict(schedule="one-cycle"), 0.0, 0, None, 0.0),
    (dict(schedule="one-cycle"), 0.375, 0, None, 0.5),
    (dict(schedule="one-cycle"), 0.75, 0, None, 1.0),
    (dict(schedule="one-cycle"), 0.875, 0, None, 0.5),
    (dict(schedule="one-cycle"), 1.0, 0, None, 0.0),
    (dict(schedule="one-cycle", peak_at=0.5, final_lr_fraction=0.1), 0.25, 0, None, 0.5),
    (dict(schedule="one-cycle", peak_at=0.5, final_lr_fraction=0.1), 0.75, 0, None, 0.55),
    (dict(schedule="one-cycle", warmup_steps=1), 0.0, 0, 100, 0.0),  # its rise is its warmup
    # constant after warmup
    (dict(schedule="constant"), 0.025, 0, None, 0.5),
    (dict(schedule="constant"), 0.5, 0, None, 1.0),
    (dict(schedule="constant", final_lr_fraction=0.3), 1.0, 0, None, 1.0),
]


@pytest.mark.parametrize("fields, progress, step, total, expected", SCHEDULE_POINTS)
def test_schedule_values(fields, progress, step, total, expected):
    assert lr_factor(OptimConfig(**fields), progress, step, total) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_schedules_stay_in_unit_interval_and_end_at_final_fraction(schedule):
    cfg = OptimConfig(schedule=schedule, final_lr_fraction=0.02)
    values = [lr_factor(cfg, i / 200, i, 200) for i in range(201)]
    assert all(0.0 <= v <= 1.0 for v in values)
    assert max(values) == pytest.approx(1.0)
    assert values[-1] == pytest.approx(1.0 if schedule == "constant" else 0.02)


def test_lr_factor_rejects_non_finite_progress():
    with pytest.raises(ValueError, match="progress"):
        lr_factor(OptimConfig(), float("nan"), 0, None)


# -- OptimConfig ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value", [
    ("schedule", "cosin"), ("schedule", "step"), ("name", "sgd"), ("lr", -1e-3), ("lr", float("nan")),
    ("lr", True), ("lr_head", -1.0), ("lr_scalars", "fast"), ("muon_lr", -0.02), ("weight_decay", -0.1),
    ("eps", 0.0), ("betas", (0.9, 1.0)), ("betas", (-0.1, 0.9)), ("betas", [0.9]), ("betas", 0.9),
    ("warmup_fraction", 1.5), ("warmup_fraction", -0.01), ("warmdown_fraction", 2.0), ("peak_at", -1.0),
    ("final_lr_fraction", 1.5), ("warmup_steps", 2.5), ("warmup_steps", -1), ("muon_momentum", 1.0),
    ("muon_adjust_lr", "none"), ("grad_clip", -1.0), ("decay_embeddings", "yes"),
])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ConfigError, match=rf"OptimConfig\.{field} = .* is not allowed"):
        OptimConfig(**{field: value})


def test_config_error_lists_allowed_schedules():
    with pytest.raises(ConfigError, match="'linear', 'cosine', 'wsd', 'one-cycle', 'constant'"):
        OptimConfig(schedule="cosin")


def test_config_round_trip_through_dict_and_yaml():
    cfg = OptimConfig(name="muon", lr=3e-4, betas=(0.8, 0.99), lr_head=0.008, warmup_steps=40,
                      schedule="wsd", final_lr_fraction=0.05, decay_value_tables=True)
    assert OptimConfig.from_dict(cfg.to_dict()) == cfg
    text = yaml.safe_dump(cfg.to_dict())
    assert OptimConfig.from_dict(yaml.safe_load(text)) == cfg
    # YAML 1.1 reads 3e-4 as a string, and betas as a list
    loaded = OptimConfig.from_dict(yaml.safe_load("lr: 3e-4\neps: 1e-10\nbetas: [0.9, 0.98]\n"))
    assert (loaded.lr, loaded.eps, loaded.betas) == (3e-4, 1e-10, (0.9, 0.98))


def test_unknown_field_is_named_with_a_suggestion():
    with pytest.raises(ConfigError, match="unknown OptimConfig field 'warmup_frac'.*warmup_fraction"):
        OptimConfig.from_dict({"warmup_frac": 0.1})


# -- gradient clipping ---------------------------------------------------------------------------------
@pytest.mark.parametrize("max_norm", [None, 0.5, 100.0])
def test_clip_grad_norm_against_hand_norm(max_norm):
    model = Toy().double()
    gen = torch.Generator().manual_seed(3)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64)
    model.blocks[0].bias.grad = None  # parameters without a gradient are skipped
    before = [p.grad.clone() if p.grad is not None else None for p in model.parameters()]
    total = math.sqrt(sum(float((g**2).sum()) for g in before if g is not None))
    norm = clip_grad_norm(model, max_norm)
    assert float(norm) == pytest.approx(total, rel=1e-12)
    scale = 1.0 if max_norm is None or total <= max_norm else max_norm / total
    for p, g in zip(model.parameters(), before, strict=True):
        if g is None:
            assert p.grad is None
        else:
            torch.testing.assert_close(p.grad, g * scale, rtol=1e-5, atol=0)


# -- a short training run ------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["pre-ln", "sas-p+bov"])
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_loss_falls_over_30_steps(arch, optimizer):
    model = make_model(arch, n_layers=2, d_model=32, mlp_hidden=64, vocab_size=48, seed=1)
    data = torch.randint(0, 48, (8, 17), generator=torch.Generator().manual_seed(0))
    cfg = OptimConfig(name=optimizer, lr=1e-2, muon_lr=0.02, schedule="linear", warmup_steps=3)
    optimizers = build_optimizers(model, cfg)
    losses = []
    for step in range(30):
        factor = lr_factor(cfg, step / 30, step, 30)
        for opt in optimizers:
            for g in opt.param_groups:
                g["lr"] = g["base_lr"] * factor
        logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), data[:, 1:].flatten())
        loss.backward()
        clip_grad_norm(model, cfg.grad_clip)
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert math.isfinite(losses[-1])
    assert losses[-1] < 0.8 * losses[0], losses  # ln(48) = 3.87 -> about 1.6 to 2.7


# -- nanochat's recipe (training/nanochat_recipe.py) ---------------------------------------------
def _nanochat_model(d_model: int = 256, **fields) -> LanguageModel:
    cfg = ModelConfig.from_preset("pre-ln+bov", "nanochat-tiny", d_model=d_model, n_heads=2,
                                  head_dim=d_model // 2, mlp_hidden=2 * d_model, residual_scalars=True,
                                  backout=True, qk_bias=True, **fields)
    return LanguageModel(cfg)


def _groups(optimizers) -> dict[str, dict]:
    return {g["name"]: g for opt in optimizers for g in opt.param_groups}


@pytest.mark.parametrize("d_model, tokens", [(768, 2 ** 19), (256, 2 ** 17), (1536, None)])
def test_nanochat_recipe_groups_by_hand(d_model, tokens):
    """Each group's lr, betas, eps and weight decay, computed by hand from nanochat's numbers."""
    model = _nanochat_model(d_model)
    optimizers = build_optimizers(model, OptimConfig(name="nanochat"), tokens)
    assert [type(o).__name__ for o in optimizers] == ["Muon", "AdamW"]
    s_d = math.sqrt(768 / d_model)
    s_b = math.sqrt(tokens / 2 ** 19) if tokens else 1.0
    expected = {  # name: (lr, betas, weight decay)
        "head": (0.008 * s_d * s_b, (0.8, 0.96), 0.01),
        "embeddings": (0.3 * s_d * s_b, (0.8, 0.995), 0.001),
        "value_tables": (0.15 * s_d * s_b, (0.8, 0.995), 0.01),
        "smear": (0.2, (0.8, 0.95), 0.0),
        "resid_scalars": (0.005 * s_b, (0.8, 0.95), 0.05),
        "x0_scalars": (0.5 * s_b, (0.96, 0.95), 0.0),
        "scalars": (0.5 * s_b, (0.96, 0.95), 0.0),
        "no_decay": (0.02 * s_b, (0.8, 0.95), 0.0),
    }
    groups = _groups(optimizers)
    for name, (lr, betas, wd) in expected.items():
        g = groups[name]
        assert (g["lr"], g["base_lr"], g["eps"], g["weight_decay"]) == pytest.approx((lr, lr, 1e-10, wd))
        assert g["betas"] == betas, name
    assert groups["muon"]["lr"] == pytest.approx(0.02 * s_b)
    assert groups["muon"]["weight_decay"] == pytest.approx(0.28 * s_b)
    assert groups["muon"]["momentum"] == 0.95
    # every trainable parameter in exactly one group, in the group its name says
    seen = [id(p) for g in groups.values() for p in g["params"]]
    assert sorted(seen) == sorted(id(p) for p in model.parameters() if p.requires_grad)
    names = {id(p): n for n, p in model.named_parameters()}
    by_group = {k: {names[id(p)] for p in g["params"]} for k, g in groups.items()}
    assert by_group["smear"] == {"smear.gate.weight", "smear.strength.gain", "backout.strength.gain"}
    assert by_group["x0_scalars"] == {f"blocks.{i}.residual.x0_lambda.gain" for i in range(4)}
    # BoV's gamma_v in its target layers, the last third: floor(2 L / 3) = 2 onwards
    assert by_group["scalars"] == {f"blocks.{i}.attn.values.coef.gain" for i in (2, 3)}
    assert by_group["no_decay"] == {f"blocks.{i}.attn.{m}.bias" for i in range(4) for m in "qk"}
    assert all(n.startswith("blocks.") and model.get_parameter(n).ndim == 2 for n in by_group["muon"])
    assert by_group["head"] == {"head.weight"} and by_group["embeddings"] == {"tok_emb.weight"}


def test_nanochat_recipe_adamw_step_is_nanochats_update():
    """One AdamW step of the x0 group against the update written out in float64 (betas 0.96/0.95,
    eps 1e-10, no decay) and one of the resid group (decay 0.05), away from initialisation."""
    torch.manual_seed(0)
    model = _nanochat_model(64).double()
    [_, adamw] = build_optimizers(model, OptimConfig(name="nanochat"), 2 ** 19)
    p_x0 = model.get_parameter("blocks.1.residual.x0_lambda.gain")
    p_r = model.get_parameter("blocks.1.residual.resid_lambda.gain")
    before = {n: p.detach().clone() for n, p in (("x0", p_x0), ("r", p_r))}
    g_x0, g_r = torch.tensor([0.3], dtype=torch.float64), torch.tensor([-0.7], dtype=torch.float64)
    p_x0.grad, p_r.grad = g_x0.clone(), g_r.clone()
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    adamw.step()

    def by_hand(p0, g, lr, b1, b2, wd):
        m, v = (1 - b1) * g, (1 - b2) * g * g
        return p0 * (1 - lr * wd) - lr * (m / (1 - b1)) / ((v / (1 - b2)).sqrt() + 1e-10)

    expected_x0 = by_hand(before["x0"], g_x0, 0.5, 0.96, 0.95, 0.0)
    expected_r = by_hand(before["r"], g_r, 0.005, 0.8, 0.95, 0.05)
    torch.testing.assert_close(p_x0.detach(), expected_x0, atol=1e-12, rtol=0)
    torch.testing.assert_close(p_r.detach(), expected_r, atol=1e-12, rtol=0)


def test_nanochat_recipe_muon_weight_decay_override_and_validation():
    model = _nanochat_model(64)
    [muon, _] = build_optimizers(model, OptimConfig(name="nanochat", muon_weight_decay=0.0597))
    assert muon.param_groups[0]["weight_decay"] == 0.0597
    with pytest.raises(ConfigError, match="'adamw', 'muon', 'nanochat'"):
        OptimConfig(name="nanochats")
    cfg = TrainConfig.from_dict({"optim": {"name": "nanochat"}, "max_steps": 1})
    assert TrainConfig.from_dict(cfg.to_dict()).optim.name == "nanochat"
