"""The chunked head + cross-entropy (blocklab.runtime.head_loss) against float64 references: F.cross_entropy
on the full float64 logits, and a hand-written log-sum-exp,

    loss = mean over counted i of [ m_i + log sum_j exp(z_ij - m_i) - z_{i, y_i} ],  m_i = max_j z_ij,

with z = x W^T, softcapped as c tanh(z / c) where asked. Loss value and the gradients of x and W."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode

from blocklab.runtime import head_loss
from blocklab.runtime.head_loss import default_chunk_size, linear_cross_entropy, padded_rows

N, D, V = 11, 16, 37  # V is neither a multiple of 7 nor of 128; logits have a spread of ~4 (x, W ~ N(0, 1))
CLOSE = dict(rtol=1e-5, atol=1e-6)  # float32 op against float64 references
EXACT = dict(rtol=1e-12, atol=1e-12)  # float64 op against float64 references
DEVICE = os.environ.get("BLOCKLAB_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "")
CAP = 5.0  # well inside the logits' range, so the cap bends them (checked in test_softcap_changes_loss)


def inputs(seed: int = 0, dtype: torch.dtype = torch.float32, n: int = N, ignored: tuple[int, ...] = (),
           ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g, dtype=dtype).requires_grad_(True)
    w = torch.randn(V, D, generator=g, dtype=dtype).requires_grad_(True)
    t = torch.randint(0, V, (n,), generator=g)
    t[list(ignored)] = ignore_index
    return x, w, t


def capped(z: torch.Tensor, softcap: float | None) -> torch.Tensor:
    return z if softcap is None else softcap * torch.tanh(z / softcap)


def reference(x, w, t, softcap=None, ignore_index=-100):
    """F.cross_entropy on the full float64 logits: loss, dloss/dx, dloss/dW."""
    xd, wd = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    loss = F.cross_entropy(capped(xd @ wd.T, softcap), t, ignore_index=ignore_index)
    gx, gw = torch.autograd.grad(loss, (xd, wd))
    return loss.detach(), gx, gw


def hand(x, w, t, softcap=None, ignore_index=-100):
    """The equation written out in float64, max-shifted log-sum-exp, loss and gradients by autograd."""
    xd, wd = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    z = capped(xd @ wd.T, softcap)
    m = z.max(dim=1, keepdim=True).values.detach()
    lse = (m + (z - m).exp().sum(dim=1, keepdim=True).log()).squeeze(1)
    counted = t != ignore_index
    idx = torch.arange(len(t))[counted]
    loss = (lse[counted] - z[idx, t[counted]]).sum() / counted.sum()
    gx, gw = torch.autograd.grad(loss, (xd, wd))
    return loss.detach(), gx, gw


def ours(x, w, t, **kw):
    x.grad = w.grad = None
    loss = linear_cross_entropy(x, w, t, **kw)
    loss.backward()
    return loss.detach(), x.grad, w.grad


def assert_matches(got, want, tol):
    for a, b, name in zip(got, want, ("loss", "dx", "dW"), strict=True):
        assert_close(a.double(), b, **tol, equal_nan=True, msg=lambda m, name=name: f"{name}: {m}")


def assert_near(got, want, rel):
    """Relative error in norm, for bf16 GEMMs: their logits carry ~2^-8 relative rounding each."""
    for a, b, name in zip(got, want, ("loss", "dx", "dW"), strict=True):
        err = ((a.double() - b).norm() / b.norm()).item()
        assert err < rel, f"{name}: relative error {err:.2e} >= {rel}"


class CountMatmuls(TorchDispatchMode):
    """Counts the GEMMs that run (one per chunk for the loss, two more per chunk for the gradients)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.addmm_):
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("softcap", [None, CAP], ids=["plain", "softcap"])
@pytest.mark.parametrize("pad_to", [1, 128, 7])
@pytest.mark.parametrize("chunk_size", [1, 3, N, N + 5, None], ids=["c1", "c3", "cN", "c>N", "default"])
def test_matches_float64_cross_entropy(softcap, pad_to, chunk_size):
    x, w, t = inputs(ignored=(4,))
    got = ours(x, w, t, softcap=softcap, pad_to=pad_to, chunk_size=chunk_size)
    assert got[0].dtype == torch.float32 and got[1].dtype == got[2].dtype == torch.float32
    assert_matches(got, reference(x, w, t, softcap), CLOSE)


@pytest.mark.parametrize("softcap", [None, CAP], ids=["plain", "softcap"])
@pytest.mark.parametrize("pad_to", [1, 7])
def test_float64_inputs_match_the_hand_written_formula_exactly(softcap, pad_to):
    x, w, t = inputs(seed=1, dtype=torch.float64, ignored=(0, 5))
    want = hand(x, w, t, softcap)
    assert_matches(ours(x, w, t, softcap=softcap, pad_to=pad_to, chunk_size=4), want, EXACT)
    assert_matches(reference(x, w, t, softcap), want, EXACT)  # the two references agree


def test_softcap_changes_loss():
    """The cap bends these logits, so a softcap that were ignored would fail the tests above."""
    x, w, t = inputs()
    plain, capped_ = reference(x, w, t)[0], reference(x, w, t, CAP)[0]
    assert (plain - capped_).abs() > 0.1


@pytest.mark.parametrize("ignore_index", [-100, -1, 3])
def test_some_targets_ignored(ignore_index):
    x, w, t = inputs(seed=2, ignored=(1, 2, 9), ignore_index=ignore_index)
    got = ours(x, w, t, ignore_index=ignore_index, chunk_size=3, pad_to=7)
    assert_matches(got, reference(x, w, t, ignore_index=ignore_index), CLOSE)
    assert got[1][[1, 2, 9]].abs().max() == 0  # ignored tokens get no gradient


def test_all_targets_ignored_gives_nan_loss_and_zero_gradients_like_cross_entropy():
    x, w, t = inputs(ignored=tuple(range(N)))
    loss, gx, gw = ours(x, w, t, chunk_size=4, pad_to=128)
    want = reference(x, w, t)
    assert torch.isnan(loss) and torch.isnan(want[0])
    assert_close(gx.double(), want[1]) and assert_close(gw.double(), want[2])
    assert gx.abs().max() == 0 and gw.abs().max() == 0


def test_cpu_bf16_autocast_runs_the_gemm_in_bf16_and_returns_each_inputs_dtype():
    x, w, t = inputs(seed=3, ignored=(7,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = ours(x, w, t, softcap=CAP, chunk_size=4, pad_to=128)
        mirror = F.cross_entropy(capped(F.linear(x, w).float(), CAP), t)  # what the model computes today
    assert got[0].dtype == got[1].dtype == got[2].dtype == torch.float32
    assert_near(got, reference(x, w, t, CAP), 2e-2)
    assert_close(got[0], mirror.detach(), rtol=1e-3, atol=1e-3)
    fp32 = linear_cross_entropy(x, w, t, softcap=CAP).detach()
    assert (got[0] - fp32).abs() > 1e-6  # the logits really were rounded to bf16

    xb = x.detach().bfloat16().requires_grad_(True)  # bf16 hidden states, float32 master weight
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, gx, gw = ours(xb, w, t, chunk_size=5)
    assert gx.dtype == torch.bfloat16 and gw.dtype == torch.float32
    assert_near((loss, gx, gw), reference(xb, w, t), 2e-2)


def test_tied_weight_gets_both_gradients():
    """The head's weight is also the embedding: its .grad sums the head's and the lookup's parts."""
    g = torch.Generator().manual_seed(4)
    emb = torch.nn.Parameter(torch.randn(V, D, generator=g))
    mix = torch.randn(D, D, generator=g) / D**0.5
    ids, t = torch.randint(0, V, (N,), generator=g), torch.randint(0, V, (N,), generator=g)

    def hidden(e: torch.Tensor) -> torch.Tensor:
        h = F.embedding(ids, e)
        return F.layer_norm(h + torch.tanh(h @ mix.to(e.dtype)), (D,))

    linear_cross_entropy(hidden(emb), emb, t, softcap=CAP, chunk_size=4, pad_to=128).backward()
    e64 = emb.detach().double().requires_grad_(True)
    F.cross_entropy(capped(hidden(e64) @ e64.T, CAP), t).backward()
    assert_close(emb.grad.double(), e64.grad, **CLOSE)


def test_grad_output_scales_the_gradients_and_a_second_backward_is_refused():
    """backward scales the gradients kept from forward in place, so a retained graph cannot be run
    again: autograd's version check must refuse it rather than give a twice-scaled gradient."""
    x, w, t = inputs(seed=5)
    _, gx, gw = reference(x, w, t)
    loss = 2.5 * linear_cross_entropy(x, w, t, chunk_size=3)
    loss.backward(retain_graph=True)
    assert_close(x.grad.double(), 2.5 * gx, **CLOSE)
    assert_close(w.grad.double(), 2.5 * gw, **CLOSE)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("grads", ["x", "w"])
def test_only_one_input_requires_grad(grads):
    x, w, t = inputs(seed=6)
    want = reference(x, w, t)
    x.requires_grad_(grads == "x")
    w.requires_grad_(grads == "w")
    with CountMatmuls() as mm:
        loss = linear_cross_entropy(x, w, t, chunk_size=4)  # 3 chunks
    loss.backward()
    assert mm.count == 6  # the logits and one gradient GEMM per chunk
    assert_close(loss.double(), want[0], **CLOSE)
    got, other = (x, w) if grads == "x" else (w, x)
    assert_close(got.grad.double(), want[1] if grads == "x" else want[2], **CLOSE)
    assert other.grad is None


def test_no_grad_does_no_gradient_work():
    x, w, t = inputs(seed=7, ignored=(3,))
    want = reference(x, w, t, CAP)[0]
    with CountMatmuls() as mm:
        loss = linear_cross_entropy(x, w, t, softcap=CAP, chunk_size=4)
    assert mm.count == 9 and loss.requires_grad  # 3 chunks x (logits, dx, dW)
    with torch.no_grad(), CountMatmuls() as mm:
        loss = linear_cross_entropy(x, w, t, softcap=CAP, chunk_size=4)
    assert mm.count == 3 and not loss.requires_grad
    assert_close(loss.double(), want, **CLOSE)
    with CountMatmuls() as mm:
        loss = linear_cross_entropy(x.detach(), w.detach(), t, softcap=CAP, chunk_size=4)
    assert mm.count == 3 and not loss.requires_grad


def test_default_chunk_size(monkeypatch):
    assert default_chunk_size(50304) == 512 and default_chunk_size(4096) == 8192
    assert default_chunk_size(2**30) == head_loss.MIN_CHUNK
    monkeypatch.setattr(head_loss, "CHUNK_ELEMENTS", 4 * 128)  # with pad_to=128: 4-token chunks
    monkeypatch.setattr(head_loss, "MIN_CHUNK", 1)
    x, w, t = inputs(seed=8)
    with CountMatmuls() as mm:
        got = ours(x, w, t, pad_to=128)
    assert mm.count == 3 * 3  # ceil(11 / 4) chunks
    assert_matches(got, reference(x, w, t), CLOSE)


def test_padded_rows():
    assert padded_rows(50257, 128) == 50304 and padded_rows(50304, 128) == 50304
    assert padded_rows(37, 7) == 42 and padded_rows(37, 1) == 37 and padded_rows(0, 8) == 0
    with pytest.raises(ValueError, match="multiple >= 1"):
        padded_rows(10, 0)


def test_inside_a_compiled_function_it_runs_eagerly_with_the_same_result():
    x, w, t = inputs(seed=9)
    want = reference(x, w, t, CAP)

    def step(x, w, t):
        return linear_cross_entropy(x * 1.0, w, t, softcap=CAP, chunk_size=4)

    x.grad = w.grad = None
    loss = torch.compile(step, backend="eager")(x, w, t)
    loss.backward()
    assert_matches((loss.detach(), x.grad, w.grad), want, CLOSE)


@pytest.mark.parametrize("change, message", [
    (dict(chunk_size=0), "chunk_size must be an integer >= 1"),
    (dict(chunk_size=2.5), "chunk_size must be an integer >= 1"),
    (dict(pad_to=0), "pad_to must be an integer >= 1"),
    (dict(softcap=0.0), "softcap must be > 0"),
    (dict(x=torch.randn(2, 3, D)), r"x of shape \(N, d\)"),
    (dict(x=torch.randn(N, D + 1)), "must equal weight's"),
    (dict(targets=torch.zeros(N - 1, dtype=torch.long)), r"targets must have shape \(N,\)"),
    (dict(targets=torch.zeros(N)), "integer class indices"),
    (dict(targets=torch.full((N,), V)), r"\[0, 37\) or equal ignore_index=-100, got 37"),
    (dict(targets=torch.full((N,), -2)), "got -2"),
    (dict(x=torch.randn(N, D, dtype=torch.float64)), "same dtype outside autocast"),
])
def test_bad_arguments_are_refused(change, message):
    x, w, t = inputs()
    args = dict(x=x, weight=w, targets=t) | {k: v for k, v in change.items() if k in ("x", "targets")}
    kw = {k: v for k, v in change.items() if k not in ("x", "targets")}
    with pytest.raises(ValueError, match=message):
        linear_cross_entropy(args["x"], args["weight"], args["targets"], **kw)


@pytest.mark.skipif(not DEVICE, reason="needs a CUDA device (or BLOCKLAB_TEST_DEVICE)")
def test_on_the_device_under_bf16_autocast_with_the_padded_head():
    """GPT-2-like proportions at a small size: V = 1000 padded to 1024, float32 master weights."""
    g = torch.Generator().manual_seed(10)
    n, d, v = 300, 64, 1000
    x = torch.randn(n, d, generator=g)
    w = torch.randn(v, d, generator=g) / d**0.5
    t = torch.randint(0, v, (n,), generator=g)
    t[::7] = -100
    want = reference(x, w, t, CAP)
    xd, wd = (a.to(DEVICE).requires_grad_(True) for a in (x, w))
    with torch.autocast(torch.device(DEVICE).type, dtype=torch.bfloat16):
        loss = linear_cross_entropy(xd, wd, t.to(DEVICE), softcap=CAP, chunk_size=128, pad_to=128)
        mirror = F.cross_entropy(capped(F.linear(xd, wd).float(), CAP), t.to(DEVICE))
    loss.backward()
    assert loss.dtype == xd.grad.dtype == wd.grad.dtype == torch.float32
    assert_near((loss.cpu(), xd.grad.cpu(), wd.grad.cpu()), want, 2e-2)
    assert_close(loss, mirror.detach(), rtol=2e-3, atol=2e-3)
