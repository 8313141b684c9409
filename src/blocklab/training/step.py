"""One training step: forward, loss, backward, clip, optimiser step. The trainer (`loop.Trainer`) and
compare's throughput probe (`compare.timing.StepProbe`) both call `train_step`, so the step the report
times is the step the runs took."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import Tensor, nn


def autocast_for(precision: str, device: torch.device):
    """bf16 autocast on CUDA by default; float32 on CPU, where bf16 without hardware support is slow."""
    use_bf16 = precision == "bfloat16" or (
        precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported())
    return torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()


def lm_loss(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """Mean cross-entropy over the labelled positions (next tokens, or masked tokens; -100 ignored),
    from the model's final hidden states chunk by chunk (`LanguageModel.forward` with labels): no float32
    logits of the whole batch."""
    return model(batch["input_ids"], labels=batch["labels"])


def compile_for_training(model: nn.Module, how: bool | str) -> None:
    """`TrainConfig.compile`: True or "model" compiles the forward pass as one graph
    (`LanguageModel.compile_model`, per block if inductor fails), "blocks" each block
    (`LanguageModel.compile_blocks`), False nothing."""
    if how is True or how == "model":
        model.compile_model()  # type: ignore[operator]
    elif how == "blocks":
        model.compile_blocks()  # type: ignore[operator]


def train_step(model: nn.Module, micro_batches: Iterable[dict[str, Tensor]], optimizers, *, accum: int,
               autocast, grad_clip: float | None, loss_fn: Callable = lm_loss,
               reduce: Callable[[Tensor], Tensor] = lambda t: t,
               stop: Callable[[str], Exception] | None = None,
               watch: AbstractContextManager | None = None) -> tuple[float, float]:
    """One optimiser step over the `accum` micro-batches of a global batch; returns (loss, grad norm).

    Each micro-batch's loss is scaled by 1/accum and backpropagated; under DDP the gradients are
    all-reduced on the last micro-batch only (`no_sync` before it). The summed loss is read back
    (`reduce`: its mean across processes), the gradient norm clipped at `grad_clip` (None or 0:
    measured, not clipped), then every optimiser steps and drops its gradients. `stop(message)` gives
    the error raised on a non-finite loss or gradient norm, before the update (None: no check);
    `watch` (a `memory.SavedTensorTracker`) wraps the first micro-batch's forward.
    """
    loss_sum: Tensor | None = None
    for micro, batch in enumerate(micro_batches):
        if loss_sum is None:
            loss_sum = torch.zeros((), device=batch["input_ids"].device)
        sync = micro == accum - 1 or not hasattr(model, "no_sync")
        watching = watch if watch is not None and micro == 0 else nullcontext()
        with (nullcontext() if sync else model.no_sync()), watching, autocast:
            loss = loss_fn(model, batch) / accum
        loss.backward()
        loss_sum += loss.detach()
    assert loss_sum is not None, "train_step needs at least one micro-batch"
    loss_value = reduce(loss_sum).item()
    if stop is not None and not math.isfinite(loss_value):
        raise stop(f"the training loss became {loss_value}")
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip else float("inf")))
    if stop is not None and not math.isfinite(grad_norm):  # a finite loss can still give inf/nan gradients
        raise stop(f"the gradient norm became {grad_norm} (the loss was {loss_value:.4g})")
    for opt in optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)
    return loss_value, grad_norm
