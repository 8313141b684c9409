"""Fused projections: the linear maps of a built model that read one input run as one GEMM.

The model computes each projection on its own (x W_Q, x W_K, x W^V in the value path, x W_fc in the
MLP): that is the reference. `set_fused_projections(model, mode)` is applied to a built model and
makes the maps that read the attention's input x run as one GEMM,

    [x W_1^T + b_1, ..., x W_n^T + b_n] = x [W_1; ...; W_n]^T + [b_1; ...; b_n]     (`fused_linear`)

W_Q, W_K and W_V (when the value path reads exactly x W^V, `ValuePath.input_value_map`) in every
layout, and in the parallel layout also the MLP's W_fc, which reads the same N1(X). It does so by a
module swap and a hook, and changes no parameter:

- each of those maps that is exactly an `nn.Linear` (`plain_linear`) becomes a `FusedLinear`, which
  holds the same `weight` and `bias` (names, state dicts, checkpoints, HF export and FSDP's per-block
  sharding are unchanged) and runs as an `nn.Linear` unless it was handed its output;
- a forward pre-hook on each `Attention` (`ProjectionFusion`) runs the one GEMM on the attention's
  input and hands each map its part, which the map returns when it is called on that same tensor.
  A wrapped map (a PEFT LoRA layer, a subclass) or a reparameterised or identity one runs as itself.

Modes: "auto" fuses outside decoding (no KV cache) on the devices of `KernelChoice.fused_projections`,
where it was measured to pay (benchmarks/bench_fused_projections.py); "on" fuses always, also while
decoding; "off" runs each map on its own. `LanguageModel` applies "auto" when it is built. The results
agree to rounding (tests/runtime/test_fused_projections.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.model.attention import Attention
from blocklab.model.block import Block
from blocklab.runtime import kernels

FuseMode = Literal["auto", "on", "off"]
FUSE_MODES: tuple[FuseMode, ...] = ("auto", "on", "off")


def fused_linear(x: Tensor, maps: Sequence[nn.Linear]) -> list[Tensor]:
    """[x W_1^T + b_1, ..., x W_n^T + b_n] as one GEMM, y = x [W_1; ...; W_n]^T + [b_1; ...; b_n],
    split along the last dim.

    The maps stay the parameters' owners: their weights are concatenated at every call (torch.cat's
    backward is a split, so each gradient lands in its own parameter). A map without a bias adds
    zeros there. All maps must read inputs of one width; one map is a plain F.linear (no copy).
    """
    if len(maps) == 1:
        return [F.linear(x, maps[0].weight, maps[0].bias)]
    weight = torch.cat([m.weight for m in maps])
    bias = None
    if any(m.bias is not None for m in maps):
        bias = torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in maps])
    return list(F.linear(x, weight, bias).split([m.out_features for m in maps], dim=-1))


def plain_linear(module: object) -> nn.Linear | None:
    """`module` if it is exactly an `nn.Linear` (y = x W^T + b), else None.

    Identity and reparameterised maps are not, and neither is a subclass or a wrapper (a PEFT LoRA
    layer, a quantised linear) whose forward may do more than x W^T + b: those run as themselves.
    """
    return module if type(module) is nn.Linear else None


class FusedLinear(nn.Linear):
    """An `nn.Linear` that returns the output it was handed (`hand`) when called on the input it was
    handed it for, once; on any other input it is x W^T + b. It takes over a plain map's parameters."""

    def __init__(self, linear: nn.Linear):
        nn.Module.__init__(self)  # nn.Linear's own __init__ would allocate new parameters
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.register_parameter("bias", linear.bias)
        self.training = linear.training
        self.handed: tuple[Tensor, Tensor] | None = None

    def hand(self, x: Tensor, out: Tensor) -> None:
        self.handed = (x, out)

    def forward(self, x: Tensor) -> Tensor:
        handed = self.handed
        if handed is not None and handed[0] is x:
            self.handed = None
            return handed[1]
        return F.linear(x, self.weight, self.bias)


def fusable(module: object) -> FusedLinear | None:
    return module if type(module) is FusedLinear else None


class ProjectionFusion:
    """The forward pre-hook of one `Attention`: the maps that read its input x as one GEMM, in this
    order: W_Q, W_K (when the layer owns keys), W_V (when the value path reads exactly x W^V) and,
    in a parallel block, the MLP's W_fc (`mlp`). No fusion when W_Q or W_K (or a parallel block's
    W_fc) is not a `FusedLinear`, or when fewer than two maps (none besides W_fc) are left."""

    def __init__(self, mode: FuseMode, mlp: nn.Module | None):
        self.mode, self.mlp = mode, mlp

    def fuses(self, x: Tensor, carry: Any) -> bool:
        if self.mode == "auto":  # while decoding the weights' copy would cost more than the GEMMs it joins
            return carry.cache is None and x.device.type in kernels.KERNELS.fused_projections
        return self.mode == "on"

    def maps(self, attn: Attention) -> list[FusedLinear]:
        q, k = fusable(attn.q), fusable(attn.k)
        if q is None or (attn.k is not None and k is None):
            return []
        v = fusable(attn.values.input_value_map())
        maps = [m for m in (q, k, v) if m is not None]
        if self.mlp is None:
            return maps if len(maps) >= 2 else []
        fc = fusable(self.mlp.fc)
        return [*maps, fc] if fc is not None else []

    def __call__(self, attn: Attention, args: tuple[Any, ...]) -> None:
        x, carry = args[:2]
        maps = self.maps(attn) if self.fuses(x, carry) else []
        if maps:
            for m, out in zip(maps, fused_linear(x, maps), strict=True):
                m.hand(x, out)


def set_fused_projections(model: nn.Module, mode: FuseMode) -> None:
    """Fuse the projections of every block of `model` in `mode` ("auto", "on" or "off"; see the module
    docstring). The first call swaps the plain maps for `FusedLinear`s and hooks each attention; a
    later one changes the mode. The results agree to rounding."""
    if mode not in FUSE_MODES:
        raise ValueError(f"fused projections mode {mode!r} is not allowed: choose one of "
                         f"{', '.join(map(repr, FUSE_MODES))}.")
    for block in model.modules():
        if isinstance(block, Block):
            fusion = projection_fusion(block.attn)
            if fusion is None:
                _fuse(block, mode)
            else:
                fusion.mode = mode


def projection_fusion(attn: Attention) -> ProjectionFusion | None:
    """The attention's `ProjectionFusion` hook, if `set_fused_projections` installed one."""
    return next((h for h in attn._forward_pre_hooks.values() if isinstance(h, ProjectionFusion)), None)


def _fuse(block: Block, mode: FuseMode) -> None:
    """Swap the maps a `ProjectionFusion` may join for `FusedLinear`s and hook the attention."""
    attn, parallel = block.attn, block.layout == "parallel"
    maps: list[tuple[nn.Module, str]] = [(attn, "q"), (attn, "k")]
    if attn.values.input_value_map() is not None:
        maps.append((attn.values, "w_v"))
    if parallel:
        maps.append((block.mlp, "fc"))
    for owner, name in maps:
        linear = plain_linear(getattr(owner, name))
        if linear is not None:
            setattr(owner, name, FusedLinear(linear))
    attn.register_forward_pre_hook(ProjectionFusion(mode, block.mlp if parallel else None))
