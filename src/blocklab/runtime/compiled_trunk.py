"""The forward pass compiled as one `torch.compile` graph (`LanguageModel.compile_model`), with a fallback.

Whole-model compilation lets inductor fuse across blocks (norms, gains and residual adds around the
GEMMs) and is what ``compile=true`` trains with. An inductor failure on one architecture should cost
speed, not the run: the first call that fails with a dynamo or inductor error
(`compiled_step.compile_errors`; an error that the inputs cause at run time, such as an id past the
vocabulary, keeps its own type) warns once, naming the error, switches the model to `compile_blocks`
and runs that call again. AOTAutograd compiles the backward graph lazily, at the first
``loss.backward()``, outside any `try` here; the compiled calls run with functorch's
`force_non_lazy_backward_lowering`, which compiles it with the forward graph, so that its failure
falls back too.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable
from typing import Any, cast

import torch
import torch._functorch.config as functorch_config
from torch import Tensor, nn

from blocklab.model.fields import ModelFields
from blocklab.runtime import kernels
from blocklab.runtime.compiled_step import compile_errors, describe_compile_error, own_code
from blocklab.util.errors import ConfigError


def check_compile_trusted(cfg: ModelFields, device: torch.device | str) -> None:
    """Refuse to compile a model of config `cfg` on a device where its compiled gradients are known to
    be wrong (`kernels.KernelChoice.compiled_shaped`): a loud error, not a silently wrong run."""
    device_type = torch.device(device).type
    if cfg.attn_matrix != "shaped" or device_type in kernels.KERNELS.compiled_shaped:
        return
    raise ConfigError(
        f"torch.compile of shaped attention (attn_matrix='shaped': SAS, SAS-P) on {device_type} is "
        "refused: on an H200 with torch 2.11 its compiled gradients at sequence 1024 were far from the "
        "eager ones (relative error 0.82 for SAS-P against eager's 0.04, both from float64; "
        "benchmarks/RESULTS.md, 2026-11-28). Train it with compile=false (eager), or on the CPU.")


@functools.cache
def _has_backward_switch() -> bool:
    return "force_non_lazy_backward_lowering" in functorch_config.get_config_copy()


def _backward_with_forward() -> contextlib.AbstractContextManager:
    """AOTAutograd compiling the backward graph with the forward one, where this torch has the switch."""
    if not _has_backward_switch():
        return contextlib.nullcontext()
    return functorch_config.patch(force_non_lazy_backward_lowering=True)


class CompiledTrunk:
    """``trunk(input_ids)``: `eager(input_ids)` (the model's final hidden states (B, T, d) without a cache),
    compiled; on a compiler failure it calls `fall_back(**compile_kwargs)` (the model's `compile_blocks`)
    once and runs `eager` from then on."""

    def __init__(self, model: nn.Module, eager: Callable[[Tensor], Tensor],
                 fall_back: Callable[..., None], compile_kwargs: dict[str, Any]):
        self.owner, self.cfg = id(model), cast(ModelFields, model.cfg)
        self.checked = ""  # the device type check_compile_trusted last passed
        self.compile_kwargs = compile_kwargs
        self._run, self._fall_back_to = eager, fall_back
        # its own copy of the code: dynamo keeps compiled versions (at most 8) per code object, and the
        # models of one process (a benchmark, a test suite) must not share that limit
        self._compiled = torch.compile(own_code(self._eager), **compile_kwargs)
        self.fallback: str | None = None  # the error that made the model fall back to per-block compile

    def is_current(self, model: nn.Module) -> bool:
        """False for a deep copy of the model it was compiled for (it would run the original's weights)."""
        return self.owner == id(model)

    def _eager(self, input_ids: Tensor) -> Tensor:
        return self._run(input_ids)

    def __call__(self, input_ids: Tensor) -> Tensor:
        if input_ids.device.type != self.checked:
            check_compile_trusted(self.cfg, input_ids.device)
            self.checked = input_ids.device.type
        if self.fallback is not None:
            return self._eager(input_ids)
        try:
            with _backward_with_forward():
                return self._compiled(input_ids)
        except compile_errors() as err:
            self._fall_back(err)
            return self._eager(input_ids)

    def _fall_back(self, err: BaseException) -> None:
        self.fallback = describe_compile_error(err)
        warnings.warn(f"torch.compile of the whole model failed for this architecture "
                      f"({self.fallback[:300]}); falling back to compiling each block (compile_blocks).",
                      RuntimeWarning, stacklevel=3)
        self._fall_back_to(**self.compile_kwargs)
