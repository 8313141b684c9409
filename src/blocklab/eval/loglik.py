"""Log-likelihoods of continuations under a causal language model: the one primitive that the
zero-shot multiple-choice scorer and the lm-evaluation-harness adapter share.

For a context c and a continuation y = (y_1 .. y_n) (token ids), the model reads c + y without
its last token and

    log p(y | c) = sum_i log softmax(logits at the position before y_i)[y_i],

greedy when every y_i is the argmax at its position. When c + y is longer than the context
length L + 1, the context is cut from the left so that the last L tokens are read (as
lm-evaluation-harness does).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from blocklab.util.errors import ConfigError


def model_device(model: nn.Module) -> torch.device:
    tensor = next(iter(model.parameters()), None)
    if tensor is None:
        tensor = next(iter(model.buffers()), None)
    return tensor.device if tensor is not None else torch.device("cpu")


def check_causal(model: nn.Module, what: str) -> None:
    cfg = getattr(model, "cfg", None)
    if cfg is not None and not getattr(cfg, "causal", True):
        raise ConfigError(f"{what} needs a causal language model; this model is a bidirectional encoder "
                          "(causal=False, trained with data.objective=mlm). Use `blocklab finetune` for it.")


@torch.no_grad()
def score_continuations(model: nn.Module, requests: Sequence[tuple[Sequence[int], Sequence[int]]],
                        batch_size: int = 16, max_length: int | None = None) -> list[tuple[float, bool]]:
    """(log p(continuation | context), is_greedy) for each (context ids, continuation ids).

    `model(ids)` must give (B, T, vocab) logits of a causal model; `max_length` defaults to its
    ``cfg.context_length``. The context needs at least one token (prepend the separator for an
    empty one). Rows are batched longest first and right-padded: with a causal mask, padding after
    a row's last token cannot change the logits that score it.
    """
    check_causal(model, "scoring continuations")
    if max_length is None:
        max_length = model.cfg.context_length
    rows = []
    for i, (context, continuation) in enumerate(requests):
        if not continuation or not context:
            raise ValueError(f"request {i}: the context and the continuation need at least one token "
                             f"each; got {len(context)} and {len(continuation)}.")
        if len(continuation) > max_length:
            raise ValueError(f"request {i}: a continuation of {len(continuation)} tokens does not fit the "
                             f"context length {max_length}.")
        rows.append(list(context)[-(max_length + 1 - len(continuation)):] + list(continuation))
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
    device = model_device(model)
    was_training = model.training
    model.eval()
    results: list[tuple[float, bool] | None] = [None] * len(rows)
    try:
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            width = max(len(rows[i]) - 1 for i in chunk)
            inputs = torch.zeros(len(chunk), width, dtype=torch.long)
            for r, i in enumerate(chunk):
                inputs[r, :len(rows[i]) - 1] = torch.tensor(rows[i][:-1])
            logits = model(inputs.to(device))
            # at least float32 (bf16 log-probabilities are too coarse); float64 models stay float64
            logprobs = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
            for r, i in enumerate(chunk):
                n, end = len(requests[i][1]), len(rows[i]) - 1
                scores = logprobs[r, end - n:end]
                target = torch.tensor(rows[i][-n:], device=scores.device)
                total = scores.gather(-1, target[:, None]).sum().item()
                results[i] = (total, bool((scores.argmax(-1) == target).all()))
    finally:
        model.train(was_training)
    return results  # type: ignore[return-value]
