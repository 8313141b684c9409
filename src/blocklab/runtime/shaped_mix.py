"""Shaped attention's mix as one fused kernel, swapped into a built model in place of the reference.

The model mixes Eq. (5)'s terms with plain ops, beta A V + alpha V - gamma C V (`ops.plain_mix`, the
reference: a dozen passes over the values with autograd's backward). `shaped_mix` computes the same
for the same calls: eager, it is the autograd Function `ShapedMix`, with a hand-written backward of a
few passes; under torch.compile it is what `KernelChoice.compiled_mix` names ("plain": the reference's
ops with the prefix sums as the opaque `blocklab::prefix_sums`, so inductor derives and fuses the
backward; "function": `ShapedMix` itself). `use_shaped_mix(model)` sets it as every attention layer's
`shaped_mix`; `LanguageModel` does so when it is built. Tested equal to the reference in
tests/runtime/test_shaped_mix.py (the CPU) and tests/test_cuda.py (CUDA).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from blocklab.model.attention import Attention
from blocklab.model.ops import GainValue, gain4, plain_mix
from blocklab.runtime import kernels
from blocklab.runtime.prefix_sums import prefix_sums, scaled_prefix_sums


def shaped_mix(a: Tensor, v: Tensor, alpha: GainValue, beta: GainValue, gamma: GainValue | None) -> Tensor:
    """`ops.plain_mix`'s beta a + alpha v - gamma C V as the fused kernel (see the module docstring)."""
    if torch.compiler.is_compiling() and kernels.KERNELS.compiled_mix == "plain":
        return plain_mix(a, v, alpha, beta, gamma, scan=prefix_sums)
    return ShapedMix.apply(a, v, alpha, beta, gamma)


def use_shaped_mix(model: nn.Module, fused: bool = True) -> None:
    """Every attention layer of `model` mixes with `shaped_mix` (`fused`), or with the reference."""
    for module in model.modules():
        if isinstance(module, Attention):
            module.shaped_mix = shaped_mix if fused else plain_mix


def _mix_dtype(a: Tensor, v: Tensor, gains: tuple[GainValue | None, ...]) -> torch.dtype:
    """The dtype of beta a + alpha v - gamma C V as eager PyTorch promotes it: a gain tensor of one
    or more dimensions takes part, a float or 0-dim tensor does not (same category of dtype)."""
    dtype = torch.promote_types(a.dtype, v.dtype)
    for gain in gains:
        if isinstance(gain, Tensor) and gain.dim() > 0:
            dtype = torch.promote_types(dtype, gain.dtype)
    return dtype


def _head_sums(x: Tensor, gain: Tensor) -> Tensor:
    """sum of x (B, H, T, ..) over all but the head axis, shaped like `gain` ((H,), (1,) or ())."""
    if gain.numel() > 1:
        return x.sum(dim=[d for d in range(x.dim()) if d != 1]).to(gain.dtype)
    return x.sum().reshape(gain.shape).to(gain.dtype)


class ShapedMix(torch.autograd.Function):
    """beta a + alpha v - gamma C V for a causal, full-context block (C V the running mean of v), or
    beta a + alpha v under any mask when gamma is None (Eq. 4); a = A V from SDPA, v (B, H, T, D)
    the values of the same T positions, gains floats or (), (1,), (H,) tensors. Once
    differentiable (no second derivatives).

    Forward: out = beta a; out += alpha v; out += S * coef with S = cumsum(v) (float32 at least,
    one call) and coef_t = -gamma / t (a (H, T, 1) tensor: the division folded into the gain).
    Backward, for the incoming gradient g:
        da = beta g;   dv = alpha g - gamma * revcumsum(g / n) = (alpha + coef) g + G_T - G,
    with G = cumsum(g coef) and G_T its last row (a reversed cumulative sum without flips), and per
    head dbeta = sum g a, dalpha = sum g v, dgamma = -sum_t (1/t) sum_{b,d} g S.
    """

    @staticmethod
    def forward(ctx, a: Tensor, v: Tensor, alpha: GainValue, beta: GainValue,
                gamma: GainValue | None) -> Tensor:
        dtype = _mix_dtype(a, v, (alpha, beta, gamma))
        acc = torch.promote_types(v.dtype, torch.float32)
        alpha4, beta4, gamma4 = gain4(alpha), gain4(beta), None if gamma is None else gain4(gamma)
        out = a * beta4
        if out.dtype != dtype:
            out = out.to(dtype)
        if isinstance(alpha4, Tensor):
            out.addcmul_(v, alpha4)
        else:
            out.add_(v, alpha=alpha4)
        sums, coef, neg_inv = None, None, None
        if gamma4 is not None:
            sums = prefix_sums(v, acc)
            t = v.shape[-2]
            neg_inv = torch.arange(-1, -t - 1, -1, device=v.device, dtype=acc).reciprocal_()[:, None]
            coef = gamma4 * neg_inv  # -gamma / n_t: (1, H | 1, T, 1) or (T, 1)
            out.addcmul_(sums, coef)
        ctx.floats = tuple(None if isinstance(x, Tensor) else x for x in (alpha, beta))
        ctx.dtypes = (a.dtype, v.dtype)
        grads = ctx.needs_input_grad
        tensors = tuple(x if isinstance(x, Tensor) else None for x in (alpha, beta, gamma))
        ctx.save_for_backward(a if grads[3] else None, v if grads[2] else None,
                              sums if grads[4] else None, coef, neg_inv, *tensors)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor):
        a, v, sums, coef, neg_inv, alpha_t, beta_t, gamma = ctx.saved_tensors
        alpha = alpha_t if alpha_t is not None else ctx.floats[0]
        beta = beta_t if beta_t is not None else ctx.floats[1]
        alpha4, beta4 = gain4(alpha), gain4(beta)
        need = ctx.needs_input_grad
        da = dv = dalpha = dbeta = dgamma = None
        if need[0]:
            da = (g * beta4).to(ctx.dtypes[0])
        if need[1]:
            if coef is None:
                dv = g * alpha4
            else:
                cums = scaled_prefix_sums(g, coef)
                dv = torch.addcmul(cums[..., -1:, :], g, alpha4 + coef).sub_(cums)
            dv = dv.to(ctx.dtypes[1])
        if need[2]:
            dalpha = _head_sums(g * v, alpha)
        if need[3]:
            dbeta = _head_sums(g * a, beta)
        if need[4]:
            per_step = (g * sums).sum(dim=(0, 3) if gamma.numel() > 1 else (0, 1, 3))  # (H, T) or (T,)
            dgamma = (per_step @ neg_inv[:, 0]).reshape(gamma.shape).to(gamma.dtype)
        return da, dv, dalpha, dbeta, dgamma
