"""The head and the cross-entropy together, a chunk of tokens at a time, without the (N, V) logits.

For hidden states x (N, d) after the final norm, the head's weight W (V, d) and targets y (N,):

    z = x W^T                                   (optionally softcapped: z -> c tanh(z / c))
    loss = mean over i with y_i != ignore_index of [ logsumexp_j z_ij - z_{i, y_i} ]

and, with p = softmax(z) row by row, n the number of counted targets and m_i = 1 for a counted row,
0 for an ignored one,

    dloss/dz_ij = m_i (p_ij - [j == y_i]) / n      (times 1 - tanh(z_ij / c)^2 under a softcap)
    dloss/dx = (dloss/dz) W,    dloss/dW = (dloss/dz)^T x.

Memory. `F.cross_entropy(F.linear(x, W).float(), y)` holds the logits of every token at once: (N, V)
in the compute dtype, their float32 copy and its gradient, 1.6 GB of float32 alone for GPT-2's
vocabulary at 8 x 1024 tokens. Here the N tokens are walked in chunks of `chunk_size`: a chunk's
logits are computed, upcast to float32 for the log-softmax, turned into dloss/dz in place and
multiplied straight into dloss/dx (that chunk's rows) and dloss/dW (accumulated in float32). Because
the loss is a scalar, its gradients are known in the forward pass itself: nothing is recomputed, and
backward only scales the stored gradients by grad_output. Peak memory is O(chunk_size x V) for the
logits (plus the O(V x d) weight gradient every method needs) instead of O(N x V).

`pad_to`: the GEMMs run against W padded with zero rows to a multiple of `pad_to`, since CUDA's fast
tensor-core kernels want V % 128 == 0 (GPT-2's 50257 falls on slow ones); the padded columns are
sliced off before the softmax and their gradient is zero, so they never touch the loss.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

# Default chunk: about 2**25 logits (128 MiB in float32) per chunk, rounded down to a power of two and at
# least 64 tokens. A chunk holds its logits in the compute dtype and two float32 buffers (the upcast
# logits, then the log-probabilities that become dloss/dz): c x V x 10 bytes under bf16, 257 MB for
# GPT-2's vocabulary at the default 512 tokens, against several GB for 8 x 1024 tokens unchunked (1.6 GB
# per float32 copy). 512 tokens keep the GEMMs large (M = 512) and the launches few (16 chunks at
# 8 x 1024); each chunk also adds its V x d product into the float32 dW, so far smaller chunks cost
# memory traffic. A 4096-token vocabulary gets 8192 tokens. Tune on a GPU with benchmarks/bench_loss.py.
CHUNK_ELEMENTS = 2**25
MIN_CHUNK = 64


def padded_rows(v: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= v (v rows padded for the tensor-core kernels)."""
    if multiple < 1 or v < 0:
        raise ValueError(f"padded_rows needs v >= 0 and multiple >= 1, got v={v}, multiple={multiple}")
    return -(-v // multiple) * multiple


def default_chunk_size(v: int) -> int:
    """Tokens per chunk for a vocabulary of v: the largest power of two with chunk x v <= CHUNK_ELEMENTS,
    at least MIN_CHUNK."""
    fit = max(CHUNK_ELEMENTS // max(v, 1), 1)
    return max(MIN_CHUNK, 1 << (fit.bit_length() - 1))


def _check(x: Tensor, weight: Tensor, targets: Tensor, softcap: float | None, chunk_size: int | None,
           pad_to: int, ignore_index: int) -> None:
    """ValueError naming what is wrong and what is allowed."""
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(f"linear_cross_entropy needs x of shape (N, d) and weight of shape (V, d), got "
                         f"x {tuple(x.shape)} and weight {tuple(weight.shape)} (flatten the batch first)")
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"x's last dimension ({x.shape[1]}) must equal weight's ({weight.shape[1]}): "
                         f"weight is (V, d) in torch's Linear layout")
    if targets.dim() != 1 or targets.shape[0] != x.shape[0]:
        raise ValueError(f"targets must have shape (N,) = ({x.shape[0]},), got {tuple(targets.shape)}")
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise ValueError(f"targets must be integer class indices (int64), got {targets.dtype}")
    if not (x.is_floating_point() and weight.is_floating_point()):
        raise ValueError(f"x and weight must be floating point, got {x.dtype} and {weight.dtype}")
    if chunk_size is not None and (isinstance(chunk_size, bool) or int(chunk_size) != chunk_size
                                   or chunk_size < 1):
        raise ValueError(f"chunk_size must be an integer >= 1 or None (the default), got {chunk_size!r}")
    if isinstance(pad_to, bool) or int(pad_to) != pad_to or pad_to < 1:
        raise ValueError(f"pad_to must be an integer >= 1 (1: no padding), got {pad_to!r}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be > 0 or None (no cap), got {softcap!r}")
    if targets.device.type == "cpu":  # on a GPU this check would synchronise; the gather asserts there
        v = weight.shape[0]
        bad = (targets != ignore_index) & ((targets < 0) | (targets >= v))
        if bool(bad.any()):
            first = int(targets[bad][0])
            raise ValueError(f"targets must lie in [0, {v}) or equal ignore_index={ignore_index}, "
                             f"got {first}")


def _compute_dtype(x: Tensor, weight: Tensor) -> torch.dtype:
    """The GEMM's dtype: autocast's where autocast is on for x's device, else the inputs' own."""
    device = x.device.type
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    if x.dtype != weight.dtype:
        raise ValueError(f"x and weight must have the same dtype outside autocast, got {x.dtype} and "
                         f"{weight.dtype}")
    return x.dtype


def _no_autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast off inside the op: its GEMMs already run in the dtype chosen by `_compute_dtype`."""
    if torch.amp.is_autocast_available(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def _chunked(x: Tensor, weight: Tensor, targets: Tensor, softcap: float | None, ignore_index: int,
             chunk_size: int, pad_to: int, dtype: torch.dtype, need_x: bool, need_w: bool
             ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The loss and, where asked, dloss/dx (x's dtype) and dloss/dW (weight's dtype), chunk by chunk."""
    n, v = x.shape[0], weight.shape[0]
    acc = torch.promote_types(dtype, torch.float32)  # log-sum-exp and accumulation: float32 at least
    vp = padded_rows(v, pad_to)
    w = weight.to(dtype)
    if vp > v:  # one copy, cast and padded at once
        w = weight.new_zeros(vp, weight.shape[1], dtype=dtype)
        w[:v] = weight
    xs = x.to(dtype)
    targets = targets.long()
    valid = targets != ignore_index
    safe = torch.where(valid, targets, 0)
    count = valid.sum().to(acc)
    scale = valid.to(acc) / count.clamp(min=1)  # m_i / n: zero gradient when every target is ignored
    total = torch.zeros((), dtype=acc, device=x.device)
    grad_x = torch.empty_like(x) if need_x else None
    grad_w = torch.zeros(vp, w.shape[1], dtype=acc, device=x.device) if need_w else None
    rows = torch.arange(min(chunk_size, n), device=x.device)
    for start in range(0, n, chunk_size):
        end = min(start + chunk_size, n)
        xc, yc = xs[start:end], safe[start:end]
        zp = xc @ w.T  # (c, vp) in the compute dtype; the padded columns are exactly 0
        z = zp[:, :v].to(acc)  # a view of zp when the compute dtype is already float32 or wider
        tanh = None
        if softcap is not None:
            tanh = z.div_(softcap).tanh_()
            z = tanh * softcap
        logp = torch.log_softmax(z, dim=1)  # z - logsumexp(z), fused
        del z
        total -= torch.where(valid[start:end], logp.gather(1, yc[:, None]).squeeze(1), 0).sum()
        if not (need_x or need_w):
            del logp, tanh, zp  # before the next chunk's buffers: one chunk's buffers at a time
            continue
        g = logp.exp_().mul_(scale[start:end, None])  # m_i p_ij / n, in place
        g[rows[: end - start], yc] -= scale[start:end]
        if tanh is not None:
            g = tanh.square_().neg_().add_(1).mul_(g)  # times dcap(z)/dz = 1 - tanh^2
        del logp, tanh
        if g.data_ptr() == zp.data_ptr():  # g is zp[:, :v] itself
            grad_z = zp
        elif g.dtype == dtype and vp == v:
            grad_z = g
        else:  # dloss/dz into zp's buffer, in the compute dtype and padded, for the GEMMs
            grad_z = zp
            grad_z[:, :v].copy_(g)
        # zp[:, v:] still holds the padded logits, x . 0 = 0: they add nothing to dx and only to dW's
        # padded rows, which are sliced off
        del g, zp
        if grad_x is not None:
            grad_x[start:end] = grad_z @ w
        if grad_w is not None and grad_z.dtype == acc:
            grad_w.addmm_(grad_z.T, xc)
        elif grad_w is not None:  # a low-precision product per chunk, summed in float32
            grad_w += grad_z.T @ xc
        del grad_z
    loss = total / count  # nan when every target is ignored, as F.cross_entropy gives
    return loss, grad_x, None if grad_w is None else grad_w[:v].to(weight.dtype)


class _LinearCrossEntropy(torch.autograd.Function):
    """The loss in forward with its gradients; backward scales them by grad_output."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, targets: Tensor, softcap: float | None,
                ignore_index: int, chunk_size: int, pad_to: int, dtype: torch.dtype) -> Tensor:
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        with _no_autocast(x.device):
            loss, grad_x, grad_w = _chunked(x, weight, targets, softcap, ignore_index, chunk_size, pad_to,
                                            dtype, need_x, need_w)
        ctx.save_for_backward(grad_x, grad_w)  # freed by backward unless the graph is retained
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        """Scales the stored gradients in place: no second V x d copy at the moment of the step's peak
        memory. A second backward through a retained graph therefore fails autograd's version check
        (a RuntimeError, never a wrong gradient); recompute the loss instead."""
        grad_x, grad_w = ctx.saved_tensors
        gx = None if grad_x is None else grad_x.mul_(grad_out.to(grad_x.dtype))
        gw = None if grad_w is None else grad_w.mul_(grad_out.to(grad_w.dtype))
        return gx, gw, None, None, None, None, None, None


# torch.compiler.disable, with torch._dynamo imported at the first call rather than at import time (importing
# dynamo costs about a second, which an eager run of blocklab never pays otherwise)
_dynamo_disable = getattr(torch, "_disable_dynamo", torch.compiler.disable)


@_dynamo_disable
def linear_cross_entropy(x: Tensor, weight: Tensor, targets: Tensor, *, softcap: float | None = None,
                         ignore_index: int = -100, chunk_size: int | None = None, pad_to: int = 1) -> Tensor:
    """Mean cross-entropy of the head's logits z = x W^T (softcapped if asked) against targets.

    Equal in value and gradients to `F.cross_entropy(z.float(), targets, ignore_index=ignore_index)`
    with z = `F.linear(x, weight)` (nan when every target is ignored, with zero gradients, as there),
    but never holding the (N, V) logits: see the module docstring. x: (N, d); weight: (V, d);
    targets: (N,) in [0, V) or ignore_index. The GEMM runs in autocast's dtype under autocast (CPU or
    CUDA), else in the inputs' dtype; the loss is float32 (float64 for float64 inputs) and each gradient
    has its input's dtype. Without grad mode, or when neither x nor weight requires grad, no gradient
    work is done. chunk_size: tokens per chunk (default: `default_chunk_size(V)`); pad_to: GEMM against
    weight padded with zero rows to a multiple of it (128 for CUDA's fast kernels; 1: none).

    Marked for dynamo to skip (`torch.compiler.disable`, imported lazily): inside a compiled region it is a
    graph break and runs eagerly; its chunk loop, custom autograd and CPU target check are not traced.
    """
    _check(x, weight, targets, softcap, chunk_size, pad_to, ignore_index)
    dtype = _compute_dtype(x, weight)
    chunk = int(chunk_size) if chunk_size is not None else default_chunk_size(padded_rows(weight.shape[0],
                                                                                           pad_to))
    cap = None if softcap is None else float(softcap)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        out = _LinearCrossEntropy.apply(x, weight, targets, cap, ignore_index, chunk, int(pad_to), dtype)
        return out
    with _no_autocast(x.device):
        loss, _, _ = _chunked(x, weight, targets, cap, ignore_index, chunk, int(pad_to), dtype, False, False)
    return loss
