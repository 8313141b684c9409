"""Sub-block properties at initialisation, the Eq. (6) reparameterisation and its tied inits.

Simplifying Transformer Blocks: with W_Q = 0 the attention matrix is C, so beta = gamma leaves
alpha I = I, and with identity values and projections the SAS attention sub-block is the identity
map at initialisation (Sec. 4.1-4.3). The last-layer-tied and all-tied orthogonal inits (App.,
Fig. 14) make W_V,init W_P,init = I per layer (all-tied) or over the whole stack (ll-tied).
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import reference as R
from blocklab import LanguageModel
from blocklab.model.carry import Carry
from helpers import MASKS, TOL, T, make_cfg, make_model, tokens

F64 = torch.float64


def attn_input(model, seed=0):
    x = torch.randn(2, T, model.cfg.d_model, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return x * 3.0 + 0.5, Carry(token_ids=tokens(), positions=torch.arange(T))


def set_explicit(model, explicit):
    for block in model.blocks:
        block.attn.explicit = explicit


# -- the SAS attention sub-block is the identity at init ------------------------------------------
@pytest.mark.parametrize("explicit", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("arch", ["sas", "sas-p", "sas-p-nonorm"])
def test_sas_attention_is_identity_at_init(arch, mask, explicit):
    model = make_model(arch, perturbed=False, **MASKS[mask])
    set_explicit(model, explicit)
    x, carry = attn_input(model)
    with torch.no_grad():
        for i, block in enumerate(model.blocks):
            out, _ = block.attn(x, carry)
            assert_close(out, x, **TOL, msg=f"layer {i}")
            normed = block.norm1(x)
            out, _ = block.attn(normed, carry)
            assert_close(out, normed, **TOL, msg=f"layer {i}, normed input")


@pytest.mark.parametrize("mask", list(MASKS))
def test_sas_p_block_at_init_is_normed_input_plus_scaled_mlp(mask):
    """SAS-P at init: out = N1(x) + beta_FF MLP(N1(x)), beta_FF = 0.1, with no skip of x."""
    model = make_model("sas-p", perturbed=False, **MASKS[mask])
    x, carry = attn_input(model, seed=1)
    with torch.no_grad():
        block = model.blocks[0]
        out, _ = block(x, carry)
        normed = block.norm1(x)
        assert_close(out, normed + 0.1 * block.mlp(normed), **TOL)


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("arch", ["shaped", "v-skipinit"])
def test_attention_matrix_is_identity_at_init(arch, mask):
    """shaped (W_Q = 0, beta = gamma) and Value-SkipInit (beta = 0): A = alpha I = I at init,
    so the sub-block is x W_V^T W_P^T; the MHA output mixes no tokens."""
    model = make_model(arch, perturbed=False, **MASKS[mask])
    x, carry = attn_input(model, seed=2)
    sd = model.state_dict()
    with torch.no_grad():
        for i, block in enumerate(model.blocks):
            out, _ = block.attn(x, carry)
            w_v, w_p = sd[f"blocks.{i}.attn.values.w_v.weight"], sd[f"blocks.{i}.attn.proj.weight"]
            assert_close(out, x @ w_v.T @ w_p.T, **TOL, msg=f"layer {i}")


def test_sas_init_values_follow_the_paper():
    """Eqs. (12)-(13) and App. D: per-head alpha = beta = gamma = 1, W_Q = 0, beta_FF = 0.1."""
    model = make_model("sas", perturbed=False)
    h = model.cfg.n_heads
    for i, block in enumerate(model.blocks):
        attn = block.attn
        for name in ("alpha", "beta", "gamma"):
            gain = getattr(attn, name).gain
            assert gain.requires_grad and torch.equal(gain, torch.ones(h, dtype=F64)), (i, name)
        assert torch.count_nonzero(attn.q.weight) == 0
        assert torch.count_nonzero(attn.k.weight) > 0
        assert block.mlp_branch.gain.item() == pytest.approx(0.1)
        assert block.mlp_skip.gain.item() == 1.0
        assert block.attn_skip is None  # no attention skip
        own = {n for n, _ in attn.named_parameters()}
        if i == 0:  # layer 0 keeps a trainable W_V = alpha_V I + beta_V dW with dW = 0
            w_v = attn.values.w_v
            assert torch.equal(w_v.w_init, torch.eye(model.cfg.d_model, dtype=F64))
            assert torch.count_nonzero(w_v.delta) == 0
        else:  # only query and key weights and the per-head gains remain
            assert own == {"q.weight", "k.weight", "alpha.gain", "beta.gain", "gamma.gain"}


def test_v_skipinit_init_values_follow_the_paper():
    """Eq. (4): trainable alpha, beta initialised to 1 and 0."""
    model = make_model("v-skipinit", perturbed=False)
    for block in model.blocks:
        assert torch.equal(block.attn.alpha.gain, torch.ones(4, dtype=F64))
        assert torch.equal(block.attn.beta.gain, torch.zeros(4, dtype=F64))
        assert block.attn.gamma is None
        assert block.attn_skip is None


# -- sliding windows limit what a layer sees --------------------------------------------------------
@pytest.mark.parametrize("causal", [True, False])
def test_windowed_layer_does_not_see_outside_its_window(causal):
    model = make_model("pre-ln", window_size=4, window_pattern="SL", causal=causal)
    x, carry = attn_input(model, seed=3)
    changed = x.clone()
    changed[:, 0] += 5.0
    with torch.no_grad():
        windowed = model.blocks[0].attn  # layer 0 is "S"
        full = model.blocks[2].attn  # the last layer is always full context
        diff_w = (windowed(changed, carry)[0] - windowed(x, carry)[0]).abs().amax(dim=(0, 2))
        diff_f = (full(changed, carry)[0] - full(x, carry)[0]).abs().amax(dim=(0, 2))
    assert torch.all(diff_w[:4] > 1e-6) and torch.all(diff_w[4:] == 0)
    assert torch.all(diff_f > 1e-6)


# -- Eq. (6) reparameterisation and its tied initialisations ---------------------------------------
def tied_model(tie, arch="pre-ln", seed=0):
    torch.manual_seed(seed)
    cfg = make_cfg(arch, n_layers=4, value_form="reparam", first_value_form="reparam", proj_form="reparam",
                   reparam_init="orthogonal", reparam_tie=tie, trainable_reparam_gains=True)
    return LanguageModel(cfg).double()


def paper_inits(model, i):
    """W_V,init and W_P,init of layer i in the paper's right-multiplying layout (X W)."""
    sd = model.state_dict()
    return (sd[f"blocks.{i}.attn.values.w_v.w_init"].T, sd[f"blocks.{i}.attn.proj.w_init"].T)


def is_identity(m):
    return torch.allclose(m, torch.eye(m.shape[0], dtype=m.dtype), atol=1e-5)  # float32 init


@pytest.mark.parametrize("tie", ["none", "all-tied", "ll-tied"])
def test_reparam_inits_are_random_orthogonal(tie):
    model = tied_model(tie)
    seen = []
    for i in range(4):
        for w in paper_inits(model, i):
            assert is_identity(w.T @ w)
            assert not is_identity(w)
            assert all(not torch.allclose(w, s) for s in seen)
            seen.append(w)


def test_all_tied_makes_every_value_projection_product_identity():
    model = tied_model("all-tied")
    x, carry = attn_input(model, seed=4)
    for i, block in enumerate(model.blocks):
        w_v, w_p = paper_inits(model, i)
        assert is_identity(w_v @ w_p), f"layer {i}"
        with torch.no_grad():  # the same through the modules: W = alpha W_init + beta dW, dW = 0
            assert_close(block.attn.proj(block.attn.values.w_v(x)), x, **TOL)


def test_ll_tied_makes_the_product_over_all_layers_identity():
    model = tied_model("ll-tied")
    product = torch.eye(model.cfg.d_model, dtype=F64)
    for i in range(4):
        w_v, w_p = paper_inits(model, i)
        if i < 3:
            assert not is_identity(w_v @ w_p)  # only the stack as a whole is tied
        product = product @ w_v @ w_p
    assert is_identity(product)
    x, _ = attn_input(model, seed=5)
    y = x
    with torch.no_grad():
        for block in model.blocks:
            y = block.attn.proj(block.attn.values.w_v(y))
    assert_close(y, x, **TOL)


def test_untied_reparam_products_are_not_identity():
    model = tied_model("none")
    product = torch.eye(model.cfg.d_model, dtype=F64)
    for i in range(4):
        w_v, w_p = paper_inits(model, i)
        assert not is_identity(w_v @ w_p)
        product = product @ w_v @ w_p
    assert not is_identity(product)


def test_reparam_weight_is_alpha_w_init_plus_beta_delta():
    """Eq. (6) on the module: after perturbing alpha, beta and dW the map is x (a W_init + b dW)^T."""
    model = make_model("pre-ln", value_form="reparam", proj_form="reparam", reparam_init="orthogonal",
                       trainable_reparam_gains=True)
    w_v = model.blocks[1].attn.values.w_v
    a, b = w_v.skip.gain.item(), w_v.resid.gain.item()
    assert a != pytest.approx(1.0) and b != pytest.approx(1.0)
    assert torch.count_nonzero(w_v.delta) > 0
    x, _ = attn_input(model, seed=6)
    with torch.no_grad():
        assert_close(w_v(x), x @ (a * w_v.w_init + b * w_v.delta).T, rtol=1e-12, atol=1e-12)


def test_reference_reads_every_parameter_of_a_perturbed_model():
    """Guard for the reference itself: it uses every state_dict entry of each preset."""
    for arch in ("pre-ln", "post-ln", "parallel", "v-skipinit", "shaped", "sas", "sas-p", "sas-p-nonorm"):
        model = make_model(arch)
        R.forward(model, tokens(t=4), check_all_used=True)
