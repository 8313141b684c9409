"""Prefix sums along the sequence axis: S[..., i, :] = sum_{j <= i} x[..., j, :], the running sums
behind shaped attention's centering term C V (C_ij = 1/i for j <= i, Simplifying Transformer Blocks
Eq. 5) and its backward (a reversed sum). Which layout the scan runs in is `kernels.KERNELS`' choice;
under torch.compile the scan is one opaque op that inductor calls as it is."""

from __future__ import annotations

import torch
from torch import Tensor

from blocklab.runtime import kernels


def _scan_innermost(x: Tensor) -> bool:
    return x.device.type in kernels.KERNELS.scan_t_innermost


def prefix_sums(x: Tensor, acc: torch.dtype) -> Tensor:
    """S[..., i, :] = sum_{j <= i} x[..., j, :] in dtype `acc`: one cumsum (after one transposing,
    casting copy where `kernels.KERNELS` says so; the result is then a transposed view). Under
    torch.compile the same kernels as one opaque op (`blocklab::prefix_sums`) that inductor calls and
    never fuses: inductor's Triton code for a scan longer than 128 fused with a broadcast gain (its
    split scan) fails to generate (TypeError in codegen, pytorch/pytorch#180221; seen at sequence
    1024 on an H100 and an H200 with torch 2.11)."""
    if torch.compiler.is_compiling():
        return _prefix_sums_op(x, acc)
    return _eager_prefix_sums(x, acc)


def _eager_prefix_sums(x: Tensor, acc: torch.dtype) -> Tensor:
    if _scan_innermost(x):
        xt = x.transpose(-1, -2).to(acc, memory_format=torch.contiguous_format, copy=True)
        return xt.cumsum_(-1).transpose(-1, -2)
    return torch.cumsum(x, dim=-2, dtype=acc, out=x.new_empty(x.shape, dtype=acc))


@torch.library.custom_op("blocklab::prefix_sums", mutates_args=())
def _prefix_sums_op(x: Tensor, acc: torch.dtype) -> Tensor:
    return _eager_prefix_sums(x, acc)


@_prefix_sums_op.register_fake
def _(x: Tensor, acc: torch.dtype) -> Tensor:  # the layout _eager_prefix_sums returns
    if _scan_innermost(x):
        return x.new_empty((*x.shape[:-2], x.shape[-1], x.shape[-2]), dtype=acc).transpose(-1, -2)
    return x.new_empty(x.shape, dtype=acc)


def _prefix_sums_setup(ctx, inputs: tuple, output: Tensor) -> None:  # noqa: ARG001 (torch's signature)
    ctx.dtype = inputs[0].dtype


def _prefix_sums_backward(ctx, g: Tensor) -> tuple[Tensor, None]:
    """dx_i = sum_{j >= i} g_j = G_T - G_i + g_i with G = prefix_sums(g): one scan, no flips."""
    sums = _prefix_sums_op(g, g.dtype)
    return (sums[..., -1:, :] - sums + g).to(ctx.dtype), None


_prefix_sums_op.register_autograd(_prefix_sums_backward, setup_context=_prefix_sums_setup)


def scaled_prefix_sums(g: Tensor, coef: Tensor) -> Tensor:
    """prefix_sums(g * coef) where coef (.., T, 1) is already in the accumulation dtype; the
    product is written straight into the scan's layout."""
    if _scan_innermost(g):
        shape = (*g.shape[:-2], g.shape[-1], g.shape[-2])
        buf = torch.empty(shape, dtype=coef.dtype, device=g.device)
        torch.mul(g.transpose(-1, -2), coef.transpose(-1, -2), out=buf)
        return buf.cumsum_(-1).transpose(-1, -2)
    return torch.mul(g, coef).cumsum_(-2)
