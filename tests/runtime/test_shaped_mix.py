"""The fused kernel of shaped attention's mix (runtime/shaped_mix.py) against the reference it replaces.

`shaped_mix` (eager: the autograd Function `ShapedMix`; compiled: plain ops with the opaque
`blocklab::prefix_sums`) is swapped into a built model in place of the definition's `ops.plain_mix`.
References: `ops.plain_mix` itself, outputs and gradients in float64 away from init; the head-by-head
explicit matrix (alpha I + beta A - gamma C) V of tests/reference.py for both; finite differences
(gradcheck) for its hand-written backward; a loop over positions for the prefix sums. On CUDA,
tests/test_cuda.py runs the fused kernel in float64 and bfloat16 models against float64
(`test_training_step_matches_float64`, `test_compiled_shaped_attention_matches_float64_at_length_1024`).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch.testing import assert_close

import reference as R
from blocklab import LanguageModel, ModelConfig, Transformer
from blocklab.model import ops
from blocklab.runtime import kernels, prefix_sums
from blocklab.runtime.shaped_mix import ShapedMix, shaped_mix, use_shaped_mix
from tests.model.test_ops import F64, FUSED, head_gains, qkv, rand

MIXES = [pytest.param(ops.plain_mix, id="reference"), pytest.param(shaped_mix, id="fused")]


def gains_of(kind: str, n_heads: int, seed: int, trainable: bool = True):
    """Non-trivial alpha, beta, gamma as floats, as (1,) tensors or as per-head (H,) tensors."""
    if kind == "float":
        return 1.3, 0.6, 0.45
    if kind == "one":
        g = (torch.tensor([1.3]), torch.tensor([0.6]), torch.tensor([0.45]))
        g = tuple(x.to(F64) for x in g)
    else:
        g = head_gains(n_heads, seed)
    return tuple(x.clone().requires_grad_(trainable) for x in g)


@pytest.fixture(params=["outer", "inner"], ids=["scan-T-outer", "scan-T-innermost"])
def scan_layout(request):
    """Both layouts of the prefix sums on the CPU: T as a strided axis, or T innermost after a
    transposed copy (the layout CUDA takes)."""
    layout = {"cuda", "cpu"} if request.param == "inner" else {"cuda"}
    with kernels.kernel_choice(scan_t_innermost=frozenset(layout)):
        yield request.param


GRAD_MASKS = [
    pytest.param(7, 7, True, None, id="causal"),
    pytest.param(7, 7, True, 9, id="causal-window-wider-than-context"),
    pytest.param(7, 7, True, 3, id="causal-window3"),
    pytest.param(7, 7, False, None, id="bidirectional"),
    pytest.param(3, 8, True, None, id="q-shorter-causal"),
    pytest.param(3, 8, False, 3, id="q-shorter-bidirectional-window"),
]


@pytest.mark.parametrize("form", ["shaped", "skipinit"])
@pytest.mark.parametrize("n_kv", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("kind", ["float", "one", "headwise"])
@pytest.mark.parametrize("t_q,t_k,causal,window", GRAD_MASKS)
@pytest.mark.parametrize("mix", MIXES)
def test_shaped_attention_gradients_match_float64_reference(t_q, t_k, causal, window, kind, n_kv, form,
                                                           mix, scan_layout):
    """Output and gradients w.r.t. q, k, v, alpha, beta and gamma against the head-by-head explicit
    matrix (alpha I + beta A - gamma C) V of the reference, with random non-trivial gains."""
    q, k, v = (x.requires_grad_(True) for x in qkv(t_q, t_k, n_kv=n_kv, seed=21))
    alpha, beta, gamma = gains_of(kind, 4, seed=22)
    if form == "skipinit":
        gamma = None
    grad_out = rand(2, 4, t_q, 8, seed=23)
    leaves = [x for x in (q, k, v, alpha, beta, gamma) if isinstance(x, torch.Tensor)]

    out = ops.shaped_attention(q, k, v, alpha, beta, gamma, causal, window, mix=mix)
    got = torch.autograd.grad(out, leaves, grad_out)
    allowed = R.mask_matrix(t_q, t_k, causal, window)
    expected_out = R.multihead(q, k, v, allowed, form, alpha, beta, gamma)
    expected = torch.autograd.grad(expected_out, leaves, grad_out)
    assert_close(out, expected_out, **FUSED)
    for name, g, e in zip("q k v alpha beta gamma".split(), got, expected, strict=False):
        assert g.shape == e.shape, name
        assert_close(g, e, **FUSED, msg=name)


GAIN_SHAPES = {"float": None, "scalar-tensor": (), "one": (1,), "headwise": (3,)}


def mix_inputs(kind: str, gamma_none: bool, t: int, seed: int) -> tuple:
    """A V and V (2, 3, t, 4) and gains alpha, beta, gamma away from init (float64), as floats or
    tensors of GAIN_SHAPES[kind] that need gradients; gamma None for Value-SkipInit."""
    a = rand(2, 3, t, 4, seed=seed).requires_grad_(True)
    v = rand(2, 3, t, 4, seed=seed + 1).add_(0.5).requires_grad_(True)
    shape = GAIN_SHAPES[kind]
    if shape is None:
        gains = [1.3, 0.6, 0.45]
    else:
        gains = [(c + 0.3 * rand(math.prod(shape), seed=seed + 2 + i).reshape(shape)).requires_grad_(True)
                 for i, c in enumerate((1.3, 0.6, 0.45))]
    if gamma_none:
        gains[2] = None
    return a, v, gains


@pytest.mark.parametrize("gamma_none", [False, True], ids=["shaped", "skipinit"])
@pytest.mark.parametrize("kind", list(GAIN_SHAPES))
def test_shaped_mix_gradcheck(kind, gamma_none, scan_layout):
    """The hand-written backward of `ShapedMix` against finite differences (float64)."""
    a, v, gains = mix_inputs(kind, gamma_none, 6, seed=31)
    assert torch.autograd.gradcheck(ShapedMix.apply, (a, v, *gains))


@pytest.mark.parametrize("mix", MIXES)
def test_shaped_mix_matches_equation_in_bfloat16_dtypes(mix):
    """Result dtype as eager PyTorch promotes beta A V + alpha V - gamma C V: float gains keep
    bfloat16, (H,) float32 gains give float32; gradients come back in each input's dtype."""
    q, k, v = (x.requires_grad_(True) for x in qkv(16, 16, dtype=torch.bfloat16, seed=41))
    out = ops.shaped_attention(q, k, v, 1.3, 0.6, 0.45, mix=mix)
    assert out.dtype == torch.bfloat16
    alpha, beta, gamma = (x.float().requires_grad_(True) for x in head_gains(4, seed=42))
    out = ops.shaped_attention(q, k, v, alpha, beta, gamma, mix=mix)
    assert out.dtype == torch.float32
    out.sum().backward()
    assert v.grad.dtype == q.grad.dtype == torch.bfloat16 and gamma.grad.dtype == torch.float32
    expected = R.multihead(q.double(), k.double(), v.double(), R.mask_matrix(16, 16, True, None), "shaped",
                           alpha.double(), beta.double(), gamma.double())
    assert (out.double() - expected).abs().max() < 0.05 * expected.abs().max()


def _count_cumsum(fn) -> int:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func._overloadpacket in (torch.ops.aten.cumsum, torch.ops.aten.cumsum_):
                Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


@pytest.mark.parametrize("window", [None, 9], ids=["no-window", "window-wider-than-context"])
def test_causal_full_context_scans_once_each_way(window, scan_layout):
    """Training's case takes the fused kernel: one prefix sum forward and one backward (no flips)."""
    q, k, v = (x.requires_grad_(True) for x in qkv(7, 7, seed=51))
    alpha, beta, gamma = gains_of("headwise", 4, seed=52)
    out = ops.shaped_attention(q, k, v, alpha, beta, gamma, True, window, mix=shaped_mix)
    assert _count_cumsum(lambda: ops.shaped_attention(q, k, v, alpha, beta, gamma, True, window,
                                                      mix=shaped_mix)) == 1
    assert _count_cumsum(lambda: out.backward(torch.ones_like(out))) == 1


def fused_attention(q, k, v, alpha, beta, gamma):
    return ops.shaped_attention(q, k, v, alpha, beta, gamma, mix=shaped_mix)


@pytest.mark.parametrize("plain", [True, False], ids=["plain-ops", "function"])
def test_shaped_attention_compiles_in_one_graph(plain):
    """torch.compile traces the fused kernel without a graph break, as plain ops (what inductor gets
    by default) or as the autograd.Function; forward and gradients equal eager (the Function)."""
    q, k, v = (x.float().requires_grad_(True) for x in qkv(12, 12, seed=61))
    alpha, beta, gamma = (x.float().requires_grad_(True) for x in head_gains(4, seed=62))
    leaves = (q, k, v, alpha, beta, gamma)
    with kernels.kernel_choice(compiled_mix="plain" if plain else "function"):
        compiled = torch.compile(fused_attention, fullgraph=True, backend="aot_eager")
        out = compiled(q, k, v, alpha, beta, gamma)
    got = torch.autograd.grad(out.square().sum(), leaves)
    expected_out = fused_attention(q, k, v, alpha, beta, gamma)
    expected = torch.autograd.grad(expected_out.square().sum(), leaves)
    assert_close(out, expected_out)
    for g, e in zip(got, expected, strict=True):
        assert_close(g, e)


def test_prefix_sums_op_is_the_running_sum_with_its_gradient(scan_layout):
    """The opaque op that compiled graphs call: S_i = sum_{j<=i} x_j against a loop over positions,
    and the gradient sum_{j>=i} g_j against the same loop's autograd, on a strided (B, H, T, D) view
    as split_heads makes; torch.library.opcheck checks its fake tensor (strides) and registration."""
    x = torch.randn(2, 9, 3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(71))
    x = x.transpose(1, 2).requires_grad_(True)  # (B, H, T, D), T strided as after split_heads
    g = torch.randn(2, 3, 9, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(72))
    got = prefix_sums._prefix_sums_op(x, torch.float64)
    loop = torch.stack([x[..., : i + 1, :].sum(dim=-2) for i in range(x.shape[-2])], dim=-2)
    assert_close(got, loop)
    (grad,) = torch.autograd.grad(got, x, g)
    (expected,) = torch.autograd.grad(loop, x, g)
    assert_close(grad, expected)
    torch.library.opcheck(prefix_sums._prefix_sums_op, (x, torch.float64))
    assert prefix_sums._prefix_sums_op(x.float(), torch.float32).dtype == torch.float32


def test_compiled_shaped_attention_calls_the_opaque_scan():
    """Under torch.compile the running mean reaches the compiler as `blocklab::prefix_sums` (which
    inductor calls as it is), not as an aten cumsum it would fuse into a Triton scan kernel."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    q, k, v = qkv(12, 12, seed=73)
    alpha, beta, gamma = head_gains(4, seed=74)
    torch.compile(fused_attention, fullgraph=True, backend=capture)(q, k, v, alpha, beta, gamma)
    targets = {str(node.target) for gm in graphs for node in gm.graph.nodes if node.op == "call_function"}
    assert any("prefix_sums" in t for t in targets), targets
    assert not any("cumsum" in t for t in targets), targets


# -- the kernel against the reference it replaces ------------------------------------------------
@pytest.mark.parametrize("gamma_none", [False, True], ids=["shaped", "skipinit"])
@pytest.mark.parametrize("kind", list(GAIN_SHAPES))
def test_shaped_mix_equals_the_reference_mix(kind, gamma_none, scan_layout):
    """`shaped_mix` against `ops.plain_mix` on the same A V and V (float64, gains away from init):
    the output and the gradients of a, v and every gain tensor."""
    a, v, gains = mix_inputs(kind, gamma_none, 9, seed=81)
    leaves = [a, v, *(g for g in gains if isinstance(g, torch.Tensor))]
    grad_out = rand(2, 3, 9, 4, seed=84)
    out, expected = shaped_mix(a, v, *gains), ops.plain_mix(a, v, *gains)
    assert_close(out, expected, rtol=1e-12, atol=1e-12)
    got = torch.autograd.grad(out, leaves, grad_out)
    want = torch.autograd.grad(expected, leaves, grad_out)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_language_model_swaps_the_kernel_into_the_definition():
    """`Transformer` (the definition) mixes with the reference, `LanguageModel` with the kernel; the two
    give the same logits and gradients (float64, SAS-P: shaped attention)."""
    cfg = ModelConfig.from_preset("sas-p", "tiny", n_layers=2)
    torch.manual_seed(0)
    reference = Transformer(cfg).double()
    fused = LanguageModel(cfg).double()
    fused.load_state_dict(reference.state_dict())
    R.perturb(reference, seed=5)
    fused.load_state_dict(reference.state_dict())
    assert {b.attn.shaped_mix for b in reference.block_list()} == {ops.plain_mix}
    assert {b.attn.shaped_mix for b in fused.block_list()} == {shaped_mix}
    ids = torch.randint(0, 50, (2, 11), generator=torch.Generator().manual_seed(6))
    outs = [m(ids).square().mean() for m in (reference, fused)]
    assert_close(outs[1], outs[0], rtol=1e-12, atol=1e-12)
    for out in outs:
        out.backward()
    for (name, p), q in zip(reference.named_parameters(), fused.parameters(), strict=True):
        assert_close(q.grad, p.grad, rtol=1e-10, atol=1e-12, msg=name)
    plain = copy.deepcopy(fused)
    use_shaped_mix(plain, fused=False)
    assert {b.attn.shaped_mix for b in plain.block_list()} == {ops.plain_mix}
