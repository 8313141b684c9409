"""blocklab.model.ops against the naive float64 reference (tests/reference.py).

Shaped attention is Simplifying Transformer Blocks Eq. (5), (alpha I + beta A - gamma C) V, with
head-wise scalars (Eq. 13); Value-SkipInit is Eq. (4), alpha I + beta A. Masks are bottom-right
aligned: with T_q < T_k, query i sits at position T_k - T_q + i.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

import reference as R
from blocklab.model import ops, positions

F64 = torch.float64
EXACT = dict(rtol=1e-12, atol=1e-12)
# The fused path takes prefix sums in float32 (see test_float64_inputs_are_computed_in_float64);
# any structural error (wrong mask, window, offset, head or gain) is orders of magnitude larger.
FUSED = dict(rtol=1e-5, atol=1e-5)

# (T_q, T_k, causal, window)
MASKS = [
    pytest.param(7, 7, True, None, id="causal"),
    pytest.param(7, 7, True, 3, id="causal-window3"),
    pytest.param(7, 7, True, 1, id="causal-window1"),
    pytest.param(7, 7, True, 9, id="causal-window-wider-than-context"),
    pytest.param(7, 7, False, None, id="bidirectional"),
    pytest.param(7, 7, False, 2, id="bidirectional-window2"),
    pytest.param(3, 8, True, None, id="q-shorter-causal"),
    pytest.param(3, 8, True, 4, id="q-shorter-window"),
    pytest.param(3, 8, False, None, id="q-shorter-bidirectional"),
    pytest.param(3, 8, False, 3, id="q-shorter-bidirectional-window"),
    pytest.param(1, 6, True, None, id="one-query-causal"),
]


def rand(*shape, seed=0, dtype=F64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64).to(dtype)


def head_gains(n_heads: int, seed: int):
    """Distinct per-head alpha, beta, gamma of shape (H,), away from 1 and from each other."""
    g = rand(3, n_heads, seed=seed)
    return 1.0 + 0.5 * g[0], 0.7 + 0.5 * g[1], 0.4 + 0.5 * g[2]


def qkv(t_q, t_k, n_heads=4, n_kv=4, d=8, batch=2, seed=1, dtype=F64):
    return (1.5 * rand(batch, n_heads, t_q, d, seed=seed, dtype=dtype),
            1.5 * rand(batch, n_kv, t_k, d, seed=seed + 1, dtype=dtype),
            rand(batch, n_kv, t_k, d, seed=seed + 2, dtype=dtype))


def expand(v, n_heads):
    """Key/value head g serves query heads g * rep ... (g + 1) * rep - 1."""
    rep = n_heads // v.shape[1]
    return torch.stack([v[:, h // rep] for h in range(n_heads)], dim=1)


# -- masks ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("t_q,t_k,causal,window", MASKS)
def test_attention_mask_matches_definition(t_q, t_k, causal, window):
    mask = ops.attention_mask(t_q, t_k, causal, window)
    expected = R.mask_matrix(t_q, t_k, causal, window)
    if mask is None:
        assert expected.all()
    else:
        assert torch.equal(mask, expected)


def test_window_semantics_spelled_out():
    # causal query at position p sees p - w < j <= p; bidirectional sees |p - j| < w
    m = ops.attention_mask(6, 6, True, 3)
    assert m[5].tolist() == [False, False, False, True, True, True]
    assert m[1].tolist() == [True, True, False, False, False, False]
    m = ops.attention_mask(6, 6, False, 2)
    assert m[3].tolist() == [False, False, True, True, True, False]
    m = ops.attention_mask(2, 5, True, None)  # bottom-right aligned: queries at positions 3, 4
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


@pytest.mark.parametrize("t_q,t_k,causal,window", MASKS)
def test_centering_matrix_is_softmax_of_zero_logits(t_q, t_k, causal, window):
    c = ops.centering_matrix(t_q, t_k, causal, window, dtype=F64)
    assert_close(c, R.centering_matrix(R.mask_matrix(t_q, t_k, causal, window)), **EXACT)


# -- softmax attention ----------------------------------------------------------------------------
@pytest.mark.parametrize("n_kv", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("t_q,t_k,causal,window", MASKS)
def test_softmax_attention_matches_reference(t_q, t_k, causal, window, n_kv):
    q, k, v = qkv(t_q, t_k, n_kv=n_kv)
    expected = R.multihead(q, k, v, R.mask_matrix(t_q, t_k, causal, window), "softmax")
    assert_close(ops.attention(q, k, v, causal, window), expected, **EXACT)
    probs = ops.attention_probs(q, k, causal, window)
    assert_close(probs @ expand(v, 4), expected, **EXACT)


# -- shaped attention and Value-SkipInit ----------------------------------------------------------
@pytest.mark.parametrize("n_kv", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("gains", ["headwise", "scalar"])
@pytest.mark.parametrize("t_q,t_k,causal,window", MASKS)
def test_shaped_attention_fused_explicit_reference(t_q, t_k, causal, window, gains, n_kv):
    q, k, v = qkv(t_q, t_k, n_kv=n_kv)
    alpha, beta, gamma = head_gains(4, seed=7) if gains == "headwise" else (1.3, 0.6, 0.45)
    allowed = R.mask_matrix(t_q, t_k, causal, window)
    expected = R.multihead(q, k, v, allowed, "shaped", alpha, beta, gamma)

    explicit = ops.shaped_attention_matrix(q, k, alpha, beta, gamma, causal, window)
    assert explicit.shape == (2, 4, t_q, t_k)
    assert_close(explicit @ expand(v, 4), expected, **EXACT)
    fused = ops.shaped_attention(q, k, v, alpha, beta, gamma, causal, window)
    assert_close(fused, expected, **FUSED)
    assert_close(fused, explicit @ expand(v, 4), **FUSED)


WINDOWED = [
    pytest.param(13, 13, True, 3, id="causal-window3"),
    pytest.param(13, 13, True, 1, id="causal-window1"),
    pytest.param(13, 13, False, 2, id="bidirectional-window2"),
    pytest.param(9, 15, True, 4, id="q-shorter-window"),
    pytest.param(9, 15, False, 3, id="q-shorter-bidirectional-window"),
]


@pytest.mark.parametrize("n_kv", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("t_q,t_k,causal,window", WINDOWED)
def test_blocked_sliding_window_attention_matches_reference(t_q, t_k, causal, window, n_kv, monkeypatch):
    """Long windowed inputs run block by block; blocks of 4 queries here, so several blocks and
    windows that straddle block edges are exercised."""
    monkeypatch.setattr(ops, "WINDOW_BLOCK", 4)
    q, k, v = qkv(t_q, t_k, n_kv=n_kv)
    allowed = R.mask_matrix(t_q, t_k, causal, window)
    assert_close(ops.attention(q, k, v, causal, window), R.multihead(q, k, v, allowed, "softmax"), **EXACT)
    alpha, beta, gamma = head_gains(4, seed=3)
    assert_close(ops.shaped_attention(q, k, v, alpha, beta, gamma, causal, window),
                 R.multihead(q, k, v, allowed, "shaped", alpha, beta, gamma), **FUSED)


@pytest.mark.parametrize("causal, window", [(True, None), (False, None), (True, 64), (False, 64)])
def test_fused_shaped_attention_builds_no_t_by_t_tensor(causal, window):
    """Every tensor the fused path creates (seen at the dispatcher) stays far below T x T."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class LargestTensor(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    LargestTensor.largest = max(LargestTensor.largest, t.numel())
            return out

    t = 1024
    q, k, v = qkv(t, t, n_heads=2, n_kv=2, batch=1, dtype=torch.float32)
    with LargestTensor():
        ops.shaped_attention(q, k, v, 1.0, 0.8, 0.5, causal, window)
    assert LargestTensor.largest < t * t // 4


@pytest.mark.parametrize("n_kv", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("t_q,t_k,causal,window", MASKS)
def test_value_skipinit_attention_fused_explicit_reference(t_q, t_k, causal, window, n_kv):
    """gamma=None gives Eq. (4), alpha I + beta A (no centering)."""
    q, k, v = qkv(t_q, t_k, n_kv=n_kv, seed=3)
    alpha, beta, _ = head_gains(4, seed=11)
    expected = R.multihead(q, k, v, R.mask_matrix(t_q, t_k, causal, window), "skipinit", alpha, beta)
    explicit = ops.shaped_attention_matrix(q, k, alpha, beta, None, causal, window)
    assert_close(explicit @ expand(v, 4), expected, **EXACT)
    assert_close(ops.shaped_attention(q, k, v, alpha, beta, None, causal, window), expected, **FUSED)


def test_headwise_gains_act_on_their_own_head():
    """Changing head 2's gamma changes head 2's output only."""
    q, k, v = qkv(5, 5)
    alpha, beta, gamma = head_gains(4, seed=5)
    out = ops.shaped_attention(q, k, v, alpha, beta, gamma)
    gamma2 = gamma.clone()
    gamma2[2] += 0.5
    out2 = ops.shaped_attention(q, k, v, alpha, beta, gamma2)
    diff = (out2 - out).abs().amax(dim=(0, 2, 3))
    assert diff[2] > 1e-3
    assert torch.all(diff[[0, 1, 3]] == 0)


@pytest.mark.parametrize("t_q,t_k,causal,window", MASKS)
def test_shaped_matrix_rows_sum_to_alpha_plus_beta_minus_gamma(t_q, t_k, causal, window):
    q, k, _ = qkv(t_q, t_k)
    alpha, beta, gamma = head_gains(4, seed=2)
    a = ops.shaped_attention_matrix(q, k, alpha, beta, gamma, causal, window)
    expected = (alpha + beta - gamma).reshape(1, 4, 1).expand(2, 4, t_q)
    assert_close(a.sum(-1), expected, **EXACT)


@pytest.mark.parametrize("t_q,t_k,causal,window", MASKS)
def test_zero_queries_with_beta_equal_gamma_give_alpha_identity(t_q, t_k, causal, window):
    """W_Q = 0 makes A = C under any mask, so beta = gamma leaves alpha I (Simplifying Sec. 4.1)."""
    _, k, v = qkv(t_q, t_k)
    q = torch.zeros(2, 4, t_q, 8, dtype=F64)
    alpha = torch.tensor([1.0, 0.5, 2.0, -1.0], dtype=F64)
    beta = gamma = torch.tensor([1.0, 0.3, 2.5, 0.7], dtype=F64)
    out = ops.shaped_attention(q, k, v, alpha, beta, gamma, causal, window)
    assert_close(out, alpha.reshape(1, 4, 1, 1) * v[..., -t_q:, :], **FUSED)
    a = ops.shaped_attention_matrix(q, k, alpha, beta, gamma, causal, window)
    eye = R.offset_identity(t_q, t_k)
    assert_close(a, (alpha.reshape(1, 4, 1, 1) * eye).expand(2, 4, t_q, t_k), **EXACT)


# -- C V without C ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("t_q,t_k,causal,window", MASKS)
def test_masked_mean_equals_centering_matrix_times_v(t_q, t_k, causal, window, dtype):
    v = rand(2, 3, t_k, 5, seed=4, dtype=dtype) + 2.0  # nonzero mean: a plain sum would not pass
    c = R.centering_matrix(R.mask_matrix(t_q, t_k, causal, window))
    out = ops.masked_mean(v, t_q, causal, window)
    assert out.dtype == dtype
    assert_close(out.double(), c @ v.double(), **FUSED)


# -- positions ------------------------------------------------------------------------------------
def test_rotary_matches_reference_and_is_relative():
    x = rand(2, 3, 9, 8, seed=6)
    pos = torch.arange(9)
    assert_close(positions.rotary(x, pos, 100.0), R.rope(x, pos, 100.0), **FUSED)
    # a rotation: norms are kept, and <rope(q, p), rope(k, j)> depends on p - j only
    assert_close(positions.rotary(x, pos).norm(dim=-1), x.norm(dim=-1), **FUSED)
    q, k = rand(8, seed=7), rand(8, seed=8)

    def dot(p, j):
        rq = positions.rotary(q.reshape(1, 1, 1, 8), torch.tensor([p]))
        rk = positions.rotary(k.reshape(1, 1, 1, 8), torch.tensor([j]))
        return (rq * rk).sum().item()

    assert dot(5, 2) == pytest.approx(dot(13, 10), abs=1e-5)
    assert dot(5, 2) != pytest.approx(dot(5, 3), abs=1e-3)


def test_sinusoidal_positions_match_reference():
    pe = positions.sinusoidal_positions(torch.arange(20), 16, F64)
    assert_close(pe, R.sinusoidal(20, 16), **FUSED)
    # pe(p) . pe(j) = sum_i cos((p - j) w_i) depends on p - j only
    assert_close(pe[7] @ pe[3], pe[15] @ pe[11], **FUSED)


# -- float64 in, float64 out ----------------------------------------------------------------------
PRECISION_CASES = {
    "masked_mean": lambda: (
        ops.masked_mean(rand(2, 3, 64, 5, seed=9) + 3.0, 64, True, 7),
        R.centering_matrix(R.mask_matrix(64, 64, True, 7)) @ (rand(2, 3, 64, 5, seed=9) + 3.0),
    ),
    "rotary": lambda: (
        positions.rotary(rand(1, 2, 32, 8, seed=10), torch.arange(32)),
        R.rope(rand(1, 2, 32, 8, seed=10), torch.arange(32), 10000.0),
    ),
    "sinusoidal": lambda: (positions.sinusoidal_positions(torch.arange(32), 16, F64), R.sinusoidal(32, 16)),
}


@pytest.mark.parametrize("op", list(PRECISION_CASES))
def test_float64_inputs_are_computed_in_float64(op):
    """A float64 model (model.double(), gradcheck) must not drop to float32 inside an op.

    Accumulating in float32 is right for bf16/fp16 inputs, but a float64 input has to stay in
    float64 (accumulate in the wider of float32 and the input dtype).
    """
    out, expected = PRECISION_CASES[op]()
    assert out.dtype == F64
    assert_close(out, expected, rtol=1e-12, atol=1e-12)


def test_shaped_attention_low_precision_is_close():
    """bf16 inputs: the fused path stays close to the float64 reference (prefix sums in float32)."""
    q, k, v = qkv(32, 32, dtype=torch.bfloat16, seed=12)
    alpha, beta, gamma = head_gains(4, seed=13)
    out = ops.shaped_attention(q, k, v, alpha.bfloat16(), beta.bfloat16(), gamma.bfloat16(), True, 8)
    expected = R.multihead(q.double(), k.double(), v.double(), R.mask_matrix(32, 32, True, 8), "shaped",
                           alpha.bfloat16().double(), beta.bfloat16().double(), gamma.bfloat16().double())
    err = (out.double() - expected).abs().max().item()
    assert err < 0.05 * expected.abs().max().item()
    assert math.isfinite(err)
