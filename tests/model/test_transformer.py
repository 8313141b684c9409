"""The whole Transformer against the float64 reference, and model-level properties.

Every comparison runs with parameters moved away from their initial values (reference.perturb):
at init W_Q = 0, dW = 0 and beta = gamma make many terms vanish, which would hide errors in them.
"""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import blocklab
import reference as R
from blocklab import LanguageModel
from helpers import MASKS, PRESETS, TOL, T, make_cfg, make_model, tokens


def logits_of(model, ids):
    with torch.no_grad():
        return model(ids)


# -- every block preset under every mask ----------------------------------------------------------
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("arch", PRESETS)
def test_preset_matches_reference(arch, mask):
    model = make_model(arch, **MASKS[mask])
    ids = tokens()
    expected = R.forward(model, ids)
    assert expected.abs().max() > 1.0  # a non-trivial output
    assert_close(logits_of(model, ids), expected, **TOL)


# -- components and options -----------------------------------------------------------------------
VARIANTS = {
    # positions
    "learned": ("pre-ln", dict(positions="learned")),
    "sinusoidal": ("pre-ln", dict(positions="sinusoidal")),
    "rope": ("pre-ln", dict(positions="rope", rope_base=500.0)),
    "no-positions": ("pre-ln", dict(positions="none")),
    "sas-learned": ("sas", dict(positions="learned")),
    "sas-rope": ("sas", dict(positions="rope", rope_base=500.0)),
    "sas-p-rope-bidirectional": ("sas-p", dict(positions="rope", causal=False)),
    # norms
    "layernorm": ("pre-ln", dict(norm="layernorm", norm_eps=1e-3)),
    "rmsnorm": ("pre-ln", dict(norm="rmsnorm", norm_eps=1e-3)),
    "layernorm-bias": ("pre-ln", dict(norm="layernorm", bias=True)),
    "post-ln-layernorm": ("post-ln", dict(norm="layernorm")),
    "post-ln-rmsnorm-bias": ("post-ln", dict(norm="rmsnorm", bias=True)),
    "parallel-layernorm": ("parallel", dict(norm="layernorm")),
    "sas-layernorm": ("sas", dict(norm="layernorm")),
    "norm-layers-first": ("pre-ln", dict(norm_layers="first")),
    "sas-norm-layers-first": ("sas", dict(norm_layers="first")),
    "no-final-norm": ("pre-ln", dict(final_norm=False)),
    # MLP activations
    "relu": ("pre-ln", dict(mlp_act="relu")),
    "gelu": ("pre-ln", dict(mlp_act="gelu")),
    "swiglu": ("pre-ln", dict(mlp_act="swiglu")),
    "geglu": ("pre-ln", dict(mlp_act="geglu")),
    "relu2": ("pre-ln", dict(mlp_act="relu2")),
    "leaky_relu": ("pre-ln", dict(mlp_act="leaky_relu", leaky_relu_slope=0.2)),
    "sas-p-swiglu": ("sas-p", dict(mlp_act="swiglu")),
    # attention heads
    "gqa": ("pre-ln", dict(n_kv_heads=2)),
    "mqa": ("pre-ln", dict(n_kv_heads=1)),
    "gqa-rope-window": ("pre-ln", dict(n_kv_heads=2, positions="rope", window_size=5, window_pattern="S")),
    "shaped-gqa": ("shaped", dict(n_kv_heads=2)),
    "v-skipinit-gqa": ("v-skipinit", dict(n_kv_heads=2)),
    "head-dim-16": ("pre-ln", dict(head_dim=16)),
    "sas-layerwise-gains": ("sas", dict(headwise_gains=False)),
    "qk-norm": ("pre-ln", dict(qk_norm=True)),
    "qk-norm-rope": ("pre-ln", dict(qk_norm=True, positions="rope")),
    "sas-qk-norm": ("sas", dict(qk_norm=True)),
    # embeddings and head
    "untied": ("pre-ln", dict(tie_embeddings=False)),
    "embed-scale-sinusoidal": ("pre-ln", dict(embed_scale=128 ** 0.5, positions="sinusoidal")),
    "embed-scale-untied-rope": ("sas-p", dict(embed_scale=3.0, tie_embeddings=False, positions="rope")),
    "sas-untied": ("sas", dict(tie_embeddings=False)),
    "softcap": ("pre-ln", dict(logit_softcap=3.0)),
    "sas-p-softcap": ("sas-p", dict(logit_softcap=3.0)),
    # block gains
    "trainable-block-gains": ("pre-ln", dict(trainable_block_gains=True, mlp_branch_gain=0.5,
                                             attn_branch_gain=0.7, attn_skip_gain=0.9)),
    "fixed-block-gains": ("pre-ln", dict(attn_skip_gain=0.8, attn_branch_gain=0.6, mlp_skip_gain=1.2,
                                         mlp_branch_gain=0.3)),
    "parallel-comb-gain": ("parallel", dict(mlp_skip_gain=0.7, trainable_block_gains=True)),
    "fixed-attn-gains": ("shaped", dict(trainable_attn_gains=False, attn_alpha=0.8, attn_beta=1.3,
                                        attn_gamma=0.4)),
    # Eq. (6) reparameterisation of values and projections
    "reparam-orthogonal": ("pre-ln", dict(value_form="reparam", proj_form="reparam",
                                          reparam_init="orthogonal", trainable_reparam_gains=True)),
    "reparam-fixed-gains": ("pre-ln", dict(value_form="reparam", proj_form="reparam",
                                           reparam_init="orthogonal", value_skip_gain=0.9,
                                           value_resid_gain=0.3, proj_skip_gain=1.1, proj_resid_gain=0.2)),
    "reparam-identity": ("shaped", dict(value_form="reparam", proj_form="reparam", reparam_init="identity",
                                        value_resid_gain=0.5, proj_resid_gain=0.25)),
    "reparam-all-tied": ("v-skipinit", dict(value_form="reparam", proj_form="reparam",
                                            reparam_init="orthogonal", reparam_tie="all-tied")),
    "reparam-ll-tied": ("sas", dict(value_form="reparam", first_value_form="reparam", proj_form="reparam",
                                    reparam_init="orthogonal", reparam_tie="ll-tied")),
    "identity-values-linear-proj": ("pre-ln", dict(value_form="identity", proj_form="linear")),
    # nanochat-like: ReLU^2, RoPE, QK norm, SSSL windows, softcap, untied, GQA
    "nanochat-like": ("pre-ln", dict(n_layers=4, mlp_act="relu2", positions="rope", qk_norm=True,
                                     window_size=4, window_pattern="SSSL", logit_softcap=15.0,
                                     tie_embeddings=False, norm="rmsnorm", n_kv_heads=2)),
    # crammed-BERT-like encoder: GEGLU, LayerNorm, bidirectional
    "encoder-like": ("sas-p", dict(mlp_act="geglu", norm="layernorm", causal=False)),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_matches_reference(variant):
    arch, overrides = VARIANTS[variant]
    model = make_model(arch, **overrides)
    ids = tokens(seed=1)
    assert_close(logits_of(model, ids), R.forward(model, ids), **TOL)


def test_reference_tolerance_is_meaningful():
    """A small change to one head's gamma moves the logits far beyond the comparison tolerance."""
    model = make_model("sas")
    ids = tokens()
    before = R.forward(model, ids)
    with torch.no_grad():
        model.blocks[1].attn.gamma.gain[2] += 0.01
    assert (logits_of(model, ids) - before).abs().max() > 1e3 * TOL["atol"]


def test_float32_model_matches_reference():
    model = make_model("sas-p", window_size=4, window_pattern="SL").float()
    ids = tokens()
    assert_close(logits_of(model, ids).double(), R.forward(model, ids), rtol=1e-3, atol=1e-3)


# -- fused kernels vs explicit T x T matrices ------------------------------------------------------
def set_explicit(model, explicit: bool):
    for block in model.blocks:
        block.attn.explicit = explicit


@pytest.mark.parametrize("perturbed", [False, True], ids=["init", "perturbed"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("arch", ["sas", "sas-p", "shaped", "v-skipinit", "pre-ln"])
def test_fused_and_explicit_paths_agree(arch, mask, perturbed):
    model = make_model(arch, perturbed=perturbed, **MASKS[mask])
    ids = tokens()
    fused = logits_of(model, ids)
    set_explicit(model, True)
    explicit = logits_of(model, ids)
    assert_close(fused, explicit, **TOL)
    if perturbed:
        assert_close(explicit, R.forward(model, ids), **TOL)


# -- causality and batch independence --------------------------------------------------------------
@pytest.mark.parametrize("mask", ["causal", "window"])
@pytest.mark.parametrize("arch", PRESETS)
def test_causal_model_ignores_the_future(arch, mask):
    model = make_model(arch, **MASKS[mask])
    ids = tokens(batch=2)
    base = logits_of(model, ids)
    for t in (0, 5, T - 1):
        changed = ids.clone()
        changed[:, t] = (changed[:, t] + 7) % 50
        out = logits_of(model, changed)
        assert_close(out[:, :t], base[:, :t], rtol=0, atol=1e-10)
        assert (out[:, t] - base[:, t]).abs().max() > 1e-3  # the changed token itself matters
        if t < T - 1:
            assert (out[:, t + 1:] - base[:, t + 1:]).abs().max() > 1e-3


@pytest.mark.parametrize("arch", ["pre-ln", "sas", "sas-p"])
def test_bidirectional_model_sees_the_future(arch):
    model = make_model(arch, causal=False)
    ids = tokens()
    changed = ids.clone()
    changed[:, 10] = (changed[:, 10] + 3) % 50
    diff = (logits_of(model, changed) - logits_of(model, ids)).abs().amax(dim=(0, 2))
    assert torch.all(diff[:10] > 1e-4)


@pytest.mark.parametrize("arch", PRESETS)
def test_batch_rows_are_independent(arch):
    model = make_model(arch, window_size=4, window_pattern="SL")
    ids = tokens(batch=3, seed=2)
    base = logits_of(model, ids)
    for row in range(3):
        assert_close(logits_of(model, ids[row:row + 1])[0], base[row], rtol=0, atol=1e-10)
    changed = ids.clone()
    changed[1] = tokens(batch=1, seed=3)[0]
    out = logits_of(model, changed)
    assert_close(out[[0, 2]], base[[0, 2]], rtol=0, atol=1e-10)
    assert (out[1] - base[1]).abs().max() > 1e-3


def test_forward_rejects_sequences_longer_than_the_context():
    model = make_model("pre-ln")
    with pytest.raises(ValueError, match="context_length"):
        model(tokens(t=T + 1))


# -- gradients ------------------------------------------------------------------------------------
GRAD_CASES = {arch: (arch, {}) for arch in PRESETS} | {
    "sas-window": ("sas", MASKS["window"]),
    "sas-p-bidirectional": ("sas-p", MASKS["bidirectional"]),
    "reparam-ll-tied": VARIANTS["reparam-ll-tied"],
    "reparam-all-tied": VARIANTS["reparam-all-tied"],
    "nanochat-like": VARIANTS["nanochat-like"],
    "encoder-like": VARIANTS["encoder-like"],
    "layernorm-bias": VARIANTS["layernorm-bias"],
    "trainable-block-gains": VARIANTS["trainable-block-gains"],
}


@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_every_trainable_parameter_gets_a_gradient(case):
    arch, overrides = GRAD_CASES[case]
    model = make_model(arch, **overrides)
    ids = tokens(batch=4, seed=5)
    loss = F.cross_entropy(model(ids).flatten(0, 1), tokens(batch=4, seed=6).flatten())
    loss.backward()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert trainable
    for name, p in trainable:
        assert p.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().max() > 0, f"{name} got an all-zero gradient"


def test_frozen_reparam_init_is_a_buffer_not_a_parameter():
    model = make_model("sas", value_form="reparam", proj_form="reparam", reparam_init="orthogonal")
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    inits = [n for n in buffers if n.endswith("w_init")]
    assert len(inits) == 2 * model.cfg.n_layers
    assert not any(n.endswith("w_init") for n in params)
    assert all(n.replace("w_init", "delta") in params for n in inits)


# -- parameter counts and FLOPs of the size presets ------------------------------------------------
PARAM_COUNTS = [
    ("pre-ln", "codeparrot-18l", 167e6),  # Simplifying Sec. 4.2: 167M vs 146M for 18 blocks
    ("sas", "codeparrot-18l", 146e6),
    ("sas-p", "codeparrot-18l", 146e6),
    ("pre-ln", "resformer-82m", 82e6),  # Value Residual Learning Table 4
    ("pre-ln", "resformer-180m", 180e6),
    ("pre-ln", "resformer-468m", 468e6),
    ("pre-ln", "nanochat-d12", 135.3e6),  # Bank of Values Table 8
    ("pre-ln", "nanochat-d24", 780.1e6),
]


def meta_model(arch, size, **overrides):
    from blocklab import ModelConfig

    with torch.device("meta"):
        return LanguageModel(ModelConfig.from_preset(arch, size, **overrides))


@pytest.mark.parametrize("arch,size,expected", PARAM_COUNTS)
def test_size_preset_parameter_counts(arch, size, expected):
    from blocklab import count_parameters

    total = count_parameters(meta_model(arch, size)).total
    assert total == pytest.approx(expected, rel=0.01)


def test_parameter_count_is_the_sum_over_parameters():
    from blocklab import count_parameters

    model = make_model("sas", tie_embeddings=False, positions="learned")
    counts = count_parameters(model)
    assert counts.total == sum(p.numel() for p in model.parameters())
    assert counts.embedding == model.tok_emb.weight.numel() + model.pos_emb.weight.numel()
    assert counts.non_embedding == counts.total - counts.embedding


def test_sas_removes_value_and_projection_weights():
    """SAS keeps only W_Q, W_K (and layer 0's reparameterised W_V): d^2 per layer fewer each."""
    from blocklab import count_parameters

    d, layers = 768, 18
    pre_ln = count_parameters(meta_model("pre-ln", "codeparrot-18l")).total
    sas = count_parameters(meta_model("sas", "codeparrot-18l")).total
    removed = pre_ln - sas
    # W_V in layers 1..17 and W_P in all 18 layers are gone; gains add a few scalars back
    assert abs(removed - (2 * layers - 1) * d * d) < 10_000


def test_nanochat_d12_flops_per_token():
    from blocklab import flops_per_token

    assert flops_per_token(meta_model("pre-ln", "nanochat-d12")) == pytest.approx(7.60e8, rel=0.01)


def test_flops_per_token_by_hand():
    """6 N_matmul (the output head counted, tied or not) + 12 H d_head T_eff per layer."""
    from blocklab import flops_per_token

    d, layers, vocab, t = 768, 18, 50257, 128
    attn = layers * 12 * d * t
    pre_ln = 6 * (layers * 12 * d * d + vocab * d) + attn  # Q, K, V, P (4 d^2) + MLP (8 d^2)
    sas = 6 * (layers * 10 * d * d + d * d + vocab * d) + attn  # Q, K, MLP; layer 0's W_V once
    assert flops_per_token(meta_model("pre-ln", "codeparrot-18l")) == pre_ln
    assert flops_per_token(meta_model("sas", "codeparrot-18l")) == sas
    # nanochat-d12: d 768, 6 heads of 128, untied head of 32768, SSSL windows of 512 keys before each
    # token plus the token itself, at T = 2048
    d, t, vocab = 768, 2048, 32768
    windows = [513 if (i % 4 != 3 and i != 11) else t for i in range(12)]
    expected = 6 * (12 * 12 * d * d + vocab * d) + sum(12 * d * w for w in windows)
    assert flops_per_token(meta_model("pre-ln", "nanochat-d12")) == expected


# -- meta-device construction and checkpoints ------------------------------------------------------
@pytest.mark.parametrize("arch,overrides", [
    ("sas", {}),
    ("sas-p", dict(window_size=4, window_pattern="SL")),
    ("pre-ln", dict(value_form="reparam", proj_form="reparam", reparam_init="orthogonal",
                    reparam_tie="ll-tied", trainable_reparam_gains=True)),
    ("pre-ln", dict(norm="layernorm", bias=True, tie_embeddings=False, positions="learned")),
])
def test_meta_build_then_init_weights_gives_a_working_model(arch, overrides):
    cfg = make_cfg(arch, **overrides)
    with torch.device("meta"):
        model = LanguageModel(cfg)
    assert all(p.is_meta for p in model.parameters())
    model.to_empty(device="cpu")
    with torch.no_grad():  # garbage that init_weights must overwrite everywhere
        for t in list(model.parameters()) + list(model.buffers()):
            t.fill_(float("nan"))
    model.init_weights()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        assert torch.isfinite(t).all(), f"{name} was not initialised"
    logits = logits_of(model, tokens())
    assert torch.isfinite(logits).all()
    # it is the same model as an eagerly built one: same structure and the same init statistics
    eager = LanguageModel(cfg)
    assert [n for n, _ in eager.named_parameters()] == [n for n, _ in model.named_parameters()]
    for (name, a), b in zip(model.named_parameters(), eager.parameters(), strict=True):
        if a.dim() >= 2 and a.numel() >= 256 and b.std() > 0:
            assert a.std().item() == pytest.approx(b.std().item(), rel=0.25), name
        elif a.dim() == 1:
            assert torch.equal(a, b), name  # norm scales, biases and gains are deterministic


@pytest.mark.parametrize("arch,overrides", [
    ("pre-ln", dict(value_form="reparam", proj_form="reparam", reparam_init="orthogonal")),
    ("sas", dict(value_form="reparam", first_value_form="reparam", proj_form="reparam",
                 reparam_init="orthogonal", reparam_tie="all-tied")),
])
def test_state_dict_round_trip_keeps_the_frozen_reparam_init(arch, overrides):
    source = make_model(arch, seed=0, **overrides)
    ids = tokens()
    expected = logits_of(source, ids)
    buf = io.BytesIO()
    torch.save(source.state_dict(), buf)
    assert any(k.endswith("w_init") for k in source.state_dict())

    target = make_model(arch, seed=1, perturbed=False, **overrides)
    assert (logits_of(target, ids) - expected).abs().max() > 1e-3  # different before loading
    buf.seek(0)
    target.load_state_dict(torch.load(buf))
    assert torch.equal(logits_of(target, ids), expected)


def test_transformer_names_bad_token_ids():
    model = blocklab.Transformer(blocklab.ModelConfig.from_preset("pre-ln", "tiny", vocab_size=50, d_model=32,
                                                                  n_heads=2, n_layers=1))
    for ids, words in ((torch.tensor([[1, 50]]), ["[0, vocab_size=50)", "50"]),
                       (torch.tensor([[-1, 3]]), ["[0, vocab_size=50)", "-1"]),
                       (torch.rand(1, 3), ["integer", "float32"]),
                       (torch.tensor([1, 2]), ["(batch, time)", "(2,)"]),
                       ([[1, 2]], ["tensor", "list"])):
        with pytest.raises(ValueError) as err:
            model(ids)
        assert all(w in str(err.value) for w in words), (ids, err.value)
    assert model(torch.tensor([[0, 49]])).shape == (1, 2, 50)
