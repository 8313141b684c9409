"""Autoregressive generation with the KV cache: greedy, temperature, top-k and top-p (nucleus) sampling.

Prompts of different lengths share a batch through an `attention_mask` (1: real token, 0: padding),
padded on the left or on the right: each row gives the tokens of its prompt generated alone
(model/masking.py). A row stops at its first stop token, which is kept; later positions of that row
hold `pad_token`. Generation ends when every row has stopped or after `max_new_tokens`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, cast

import torch
from torch import Tensor, nn

from blocklab.model import masking
from blocklab.model.config import ModelConfig
from blocklab.runtime.cache import KVCache
from blocklab.runtime.compiled_step import Step, default_step, wants_compiled


class Decoder(Protocol):
    """What generation reads of a model (`blocklab.runtime.LanguageModel`, whose `generate` calls this
    module, so it is named here by what it offers rather than imported)."""

    cfg: ModelConfig
    training: bool

    def new_cache(self, batch_size: int, max_len: int) -> KVCache: ...
    def hidden_states(self, input_ids: Tensor, cache: KVCache | None = None, checked: bool = True,
                      attention_mask: Tensor | None = None) -> Tensor: ...
    def logits(self, x: Tensor) -> Tensor: ...
    def token_step(self) -> Step: ...
    def decode_step(self, input_ids: Tensor, cache: KVCache) -> Tensor: ...
    def eval(self) -> Decoder: ...
    def train(self, mode: bool = True) -> Decoder: ...


def sample_next(logits: Tensor, temperature: float = 0.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """One token id per row of `logits` (B, vocab).

    temperature 0: argmax (greedy; top_k and top_p do not matter). Otherwise sample from
    softmax(logits / temperature) restricted to the top_k largest logits and then to the smallest
    set of most likely tokens whose probability reaches top_p (Holtzman et al., 2020).
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the more likely ones already reach top_p (the most likely always stays)
        drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def check_request(model: Decoder, input_ids: Tensor, max_new_tokens: int, temperature: float = 0.0,
                  top_k: int | None = None, top_p: float | None = None,
                  stop_tokens: Sequence[int] | None = None, pad_token: int | None = None,
                  cache: KVCache | None = None) -> None:
    """A ValueError naming what a decoding request gets wrong: the ids, the length, a sampling setting, a
    stop or pad token outside the vocabulary, more positions than the context or the cache holds."""
    vocab = model.cfg.vocab_size
    if input_ids.dim() != 2 or input_ids.shape[1] < 1 or input_ids.dtype not in (torch.long, torch.int):
        raise ValueError(f"input_ids must be an integer tensor (batch, time) with at least one token; got "
                         f"{input_ids.dtype} of shape {tuple(input_ids.shape)}.")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens = {max_new_tokens!r} is not allowed: a positive integer.")
    if not 0 <= temperature < math.inf:  # inf would divide every logit to 0: uniform noise, not sampling
        raise ValueError(f"temperature = {temperature!r} is not allowed: 0 (greedy) or a positive finite "
                         "number.")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                              or not 1 <= top_k <= vocab):
        raise ValueError(f"top_k = {top_k!r} is not allowed: an integer from 1 to the vocabulary size "
                         f"({vocab}), or None to sample from every token.")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p = {top_p!r} is not allowed: a probability in (0, 1] or None.")
    bad = [s for s in [*(stop_tokens or ()), *([] if pad_token is None else [pad_token])]
           if isinstance(s, bool) or not (isinstance(s, int) and 0 <= s < vocab)]
    if bad:
        raise ValueError(f"stop_tokens / pad_token {bad} are not token ids in [0, vocab_size={vocab}).")
    past = 0 if cache is None else cache.length
    limit = model.cfg.context_length if cache is None else cache.max_len
    needed = past + input_ids.shape[1] + max_new_tokens - 1  # the last token is never fed back
    if needed > limit:
        where = "context_length" if cache is None else "the cache's max_len"
        raise ValueError(f"{past} cached + {input_ids.shape[1]} prompt + {max_new_tokens} new tokens need "
                         f"{needed} positions, more than {where} = {limit}; shorten the prompt or "
                         "generate fewer tokens.")


def last_logits(model: Decoder, ids: Tensor, cache: KVCache, real: Tensor | None) -> Tensor:
    """Next-token logits (B, vocab) after the prompt, checking its ids and the cache: the head runs on
    the last position only (`real`: the prompt's real tokens, padded on the left)."""
    return model.logits(model.hidden_states(ids, cache, attention_mask=real)[:, -1])


@contextmanager
def decoding(model: Decoder) -> Iterator[None]:
    """Within the block: `model` in eval mode (no dropout) under `torch.inference_mode`; afterwards its
    mode as before, also after an error."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)


def left_padded(input_ids: Tensor, attention_mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """The prompts with every row's real tokens moved to its end (left padding), and their flags (None
    when nothing is padded): new tokens then follow each prompt's last real token. A row must hold at
    least one real token, and padding may not split its real tokens (model/masking.py)."""
    real = masking.real_tokens(attention_mask, input_ids)
    if real is None or bool(real.all()):
        return input_ids, None
    masking.check_rows(real)
    empty = ~real.any(dim=1)
    if bool(empty.any()):
        raise ValueError(f"attention_mask row {int(empty.nonzero()[0])} has no real token: every prompt "
                         "needs at least one to continue.")
    order = torch.sort(real.to(torch.uint8), dim=1, stable=True).indices  # padding first, tokens in order
    return input_ids.gather(1, order), real.gather(1, order)


def generate(model: Decoder, input_ids: Tensor, max_new_tokens: int, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None,
             stop_tokens: Sequence[int] | None = None, seed: int | None = None,
             pad_token: int | None = None, cache: KVCache | None = None,
             compile: bool | None = None, attention_mask: Tensor | None = None) -> Tensor:
    """Continue `input_ids` (B, T) by up to `max_new_tokens` tokens; returns (B, T + n) ids: the
    prompts as given, then the new tokens.

    Runs the prompt once through a fresh KV cache (or after what `cache` already holds, which it
    extends), then one token per step. `attention_mask` (B, T), 1 at real tokens and 0 at padding,
    batches prompts of different lengths, padded on either side: a row gives the tokens of its prompt
    generated alone (the prompts run left-padded, so that new tokens follow each one's last token).
    `seed` makes sampling reproducible (a private generator); a row stops after its first token in
    `stop_tokens`, and is filled with `pad_token` (default: the first stop token) until every row has
    stopped. The model runs in eval mode (no dropout).

    Which step decodes each new token (the prompt's prefill is always eager):

    - a step the model was given by `compile_decoding(...)`, unless ``compile=False``;
    - otherwise, with ``compile=True``, or with ``compile=None`` (the default) on a device type in
      `compiled_step.COMPILED_BY_DEFAULT` (CUDA), the model's decoding step compiled as one graph
      (`compiled_step.default_step`; compiled on the first call, seconds to a minute, then reused). If
      dynamo or inductor cannot compile it, one warning names the error and decoding goes on eagerly;
    - otherwise (``compile=False``; on a CPU by default, where compiling costs seconds per model) the
      eager step `decode_step`.

    The environment variable ``BLOCKLAB_COMPILE_DECODING`` (``1`` / ``0``; unset or ``auto``: by device)
    decides when ``compile`` is None. Greedy tokens are the same on every path up to the kernels'
    rounding (on a CPU the compiled step's are equal in the tests).

    The loop runs under `torch.inference_mode` (no autograd bookkeeping per op); the returned ids are
    an ordinary tensor, and a `cache` passed in stays usable outside inference mode.
    """
    check_request(model, input_ids, max_new_tokens, temperature, top_k, top_p, stop_tokens, pad_token, cache)
    prompts, real = left_padded(input_ids, attention_mask)
    compiled = wants_compiled(input_ids.device, compile)  # checks `compile` and the environment
    b, t = input_ids.shape
    device = input_ids.device
    if cache is None:
        cache = model.new_cache(b, t + max_new_tokens - 1)
    generator = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    stops = torch.tensor(list(stop_tokens or ()), dtype=input_ids.dtype, device=device)
    pad = stops[0] if pad_token is None and len(stops) else pad_token
    with decoding(model):
        step = _pick_step(model, compile, compiled)
        pick = _column_sampler(temperature, top_k, top_p, generator, input_ids.dtype)
        out = _decode(model, step, pick, prompts, real, max_new_tokens, stops, pad, cache)
    with torch.no_grad():  # outside inference mode: the ids can feed a later training step
        return torch.cat([input_ids, *out], dim=1)


def _pick_step(model: Decoder, compile: bool | None, compiled: bool) -> Step:
    """The step that decodes each new token (see `generate`): the model's own compiled step unless
    `compile` is False, else the default compiled step if `compiled`, else the eager `decode_step`."""
    eager = model.decode_step
    own = model.token_step()  # `decode_step` itself unless `compile_decoding` set a compiled step
    if compile is not False and own != eager:
        return own
    return default_step(cast(nn.Module, model), eager) if compiled else eager


def _column_sampler(temperature: float, top_k: int | None, top_p: float | None,
                    generator: torch.Generator | None, dtype: torch.dtype) -> Callable[[Tensor], Tensor]:
    """logits (B, vocab) -> next ids (B, 1) of `dtype`, as `sample_next` draws them; chosen once per
    call so that a step runs no branches. Greedy: argmax with keepdim, no reshaping per step."""
    convert = dtype != torch.long  # argmax and multinomial give int64

    if temperature == 0:
        if not convert:
            return lambda logits: logits.argmax(dim=-1, keepdim=True)
        return lambda logits: logits.argmax(dim=-1, keepdim=True).to(dtype)

    def draw(logits: Tensor) -> Tensor:
        ids = sample_next(logits, temperature, top_k, top_p, generator)[:, None]
        return ids.to(dtype) if convert else ids

    return draw


def _decode(model: Decoder, step: Step, pick: Callable[[Tensor], Tensor], input_ids: Tensor,
            real: Tensor | None, max_new_tokens: int, stops: Tensor, pad: Tensor | int | None,
            cache: KVCache) -> list[Tensor]:
    """The prefill and the decoding steps of `generate`; returns each step's ids (B, 1).

    Per token: the step (sampled ids lie in the vocabulary: no checks), the sampler, and, only with
    stop tokens, the stop bookkeeping and its one device read."""
    logits = last_logits(model, input_ids, cache, real)  # checks the prompt's ids and the cache once
    if len(stops) == 0:
        out = [pick(logits)]
        for _ in range(max_new_tokens - 1):
            out.append(pick(step(out[-1], cache)))
        return out
    assert pad is not None  # the first stop token when no pad_token is given
    done = torch.zeros(input_ids.shape[0], 1, dtype=torch.bool, device=input_ids.device)
    out = []
    for i in range(max_new_tokens):
        column = torch.where(done, pad, pick(logits))
        done = done | torch.isin(column, stops)
        out.append(column)
        if i + 1 == max_new_tokens or bool(done.all()):  # reads a device value: only with stop tokens
            return out
        logits = step(column, cache)
    return out
