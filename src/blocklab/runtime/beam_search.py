"""Beam search with blocklab's own KV cache, with Hugging Face's rules (`generate(num_beams=...)`).

Each prompt keeps `num_beams` running hypotheses in rows of one cache (prompt b's beams are rows
b*K .. b*K + K-1). A step scores every (beam, token) continuation by its summed log-probability
(log_softmax of the logits in float32, as HF computes it), keeps the best max(2, 1 + stop tokens) * K
candidates, and then:

- **finished**: a candidate that ends in a stop token, or that reaches `max_new_tokens`, and ranks in
  the first K, joins the prompt's finished hypotheses with the score sum / length ** length_penalty
  (length: its new tokens, the stop token included); the best K finished ones are kept;
- **running**: the best K candidates that did not end continue; the cache's rows are reordered by
  the beam each one extends (`KVCache.reorder`: keys, values, Bank of Values' token ids or their
  offloaded slots, padding), and the new tokens run as one decoding step.

A prompt is done when it holds K finished hypotheses and, by HF's default heuristic
(``early_stopping=False``), the best running sum divided by the current length ** length_penalty
cannot beat the worst finished score; ``early_stopping=True`` stops at K finished, ``"never"`` bounds
the running score at `max_new_tokens` when length_penalty > 0. The search ends when every prompt is done
or at `max_new_tokens`. The result is each prompt's best `num_return_sequences` finished hypotheses,
best first, padded with `pad_token` after their stop token to the longest one.

The cache gives the logits a search without a cache would (tests/runtime/test_beam_search.py checks it against
a search that reruns the whole sequence every step, and against HF's `generate` of an exported GPT-2).
Decoding runs eagerly (`decode_step`), under `torch.inference_mode`, in eval mode.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from blocklab.runtime.cache import KVCache
from blocklab.runtime.generate import Decoder, check_request, decoding, last_logits, left_padded

NEVER = -1.0e9  # HF's score for what may not be chosen (a running beam that ended, a slot still empty)
EarlyStopping = bool | Literal["never"]


@dataclass(frozen=True)
class BeamSearchOutput:
    """`sequences` (B * num_return_sequences, T + n): each prompt as given, then its hypotheses' new
    tokens, best first; `scores` (B * num_return_sequences,) float32: their summed log-probabilities
    divided by their length ** length_penalty (HF's ``sequences_scores``)."""

    sequences: Tensor
    scores: Tensor


@dataclass
class _Beams:
    """The search's state for B prompts of K beams each; new tokens only (the prompt is every beam's)."""

    running: Tensor  # (B, K, n) the running hypotheses' new tokens, `fill` after them
    running_scores: Tensor  # (B, K) float32 summed log-probabilities, best first
    finished: Tensor  # (B, K, n) the finished hypotheses' new tokens
    finished_scores: Tensor  # (B, K) length-penalised scores, best first (NEVER: an empty slot)
    finished_lengths: Tensor  # (B, K) their number of new tokens
    is_finished: Tensor  # (B, K) whether a slot holds a finished hypothesis
    improvable: Tensor  # (B, 1) whether a prompt's running beams may still beat its finished ones

    @classmethod
    def start(cls, b: int, k: int, n: int, fill: int, dtype: torch.dtype, device: torch.device) -> _Beams:
        tokens = torch.full((b, k, n), fill, dtype=dtype, device=device)
        scores = torch.zeros(b, k, dtype=torch.float32, device=device)
        scores[:, 1:] = NEVER  # the beams are equal at first: only beam 0's continuations count
        return cls(running=tokens, running_scores=scores, finished=tokens.clone(),
                   finished_scores=torch.full((b, k), NEVER, dtype=torch.float32, device=device),
                   finished_lengths=torch.zeros(b, k, dtype=torch.long, device=device),
                   is_finished=torch.zeros(b, k, dtype=torch.bool, device=device),
                   improvable=torch.ones(b, 1, dtype=torch.bool, device=device))


def _take(tensor: Tensor, index: Tensor) -> Tensor:
    """tensor (B, N, ...) at index (B, M) along dim 1: (B, M, ...)."""
    return tensor.gather(1, index.view(*index.shape, *([1] * (tensor.dim() - 2))).expand(
        *index.shape, *tensor.shape[2:]))


@dataclass(frozen=True)
class _Rules:
    num_beams: int
    max_new_tokens: int
    stops: Tensor  # the stop tokens' ids (may be empty)
    length_penalty: float
    early_stopping: EarlyStopping

    @property
    def candidates(self) -> int:
        """How many continuations a step keeps: enough that K beams can run even when the K best end."""
        return max(2, 1 + len(self.stops)) * self.num_beams


def _advance(beams: _Beams, log_probs: Tensor, i: int, rules: _Rules) -> tuple[Tensor, bool]:
    """Step i (the i-th new token, from 0) of the search: `log_probs` (B*K, vocab) of each running beam's
    next token. Updates `beams`; returns the parent of each new running beam (B, K), and whether the
    search goes on."""
    k = rules.num_beams
    b, vocab = beams.running.shape[0], log_probs.shape[-1]
    total = (log_probs.view(b, k, vocab) + beams.running_scores[:, :, None]).view(b, k * vocab)
    scores, flat = torch.topk(total, rules.candidates)
    parents, tokens = flat // vocab, flat % vocab
    grown = _take(beams.running, parents)  # a new tensor
    grown[:, :, i] = tokens.to(grown.dtype)
    ended = torch.isin(tokens, rules.stops) | (i + 1 == rules.max_new_tokens)
    alive = scores + ended.to(torch.float32) * NEVER
    keep = torch.topk(alive, k).indices
    beams.running, beams.running_scores = _take(grown, keep), _take(alive, keep)
    _finish(beams, grown, scores, ended, i, rules)
    _update_improvable(beams, i + 1, rules)
    early_done = rules.early_stopping is True and bool(beams.is_finished.all())
    going = bool(beams.improvable.any()) and not early_done and not bool(ended.all())
    return _take(parents, keep), going


def _finish(beams: _Beams, grown: Tensor, scores: Tensor, ended: Tensor, i: int, rules: _Rules) -> None:
    """Move the candidates that ended among the first K into the finished hypotheses, keeping the best K
    (none once a prompt cannot improve, or, with early_stopping=True, once it holds K)."""
    k = rules.num_beams
    now = ended.clone()
    now[:, k:] = False  # the candidates past the K best only keep the search running
    penalised = scores / ((i + 1) ** rules.length_penalty)
    full = beams.is_finished.all(dim=1, keepdim=True) & (rules.early_stopping is True)
    penalised = penalised + full.to(torch.float32) * NEVER
    penalised = penalised + (~beams.improvable).to(torch.float32) * NEVER
    penalised = penalised + (~now).to(torch.float32) * NEVER
    lengths = torch.full_like(scores, i + 1, dtype=torch.long)
    merged_scores = torch.cat((beams.finished_scores, penalised), dim=1)
    best = torch.topk(merged_scores, k).indices
    beams.finished = _take(torch.cat((beams.finished, grown), dim=1), best)
    beams.finished_scores = _take(merged_scores, best)
    beams.finished_lengths = _take(torch.cat((beams.finished_lengths, lengths), dim=1), best)
    beams.is_finished = _take(torch.cat((beams.is_finished, now), dim=1), best)


def _update_improvable(beams: _Beams, length: int, rules: _Rules) -> None:
    """HF's early-stop heuristic: a prompt stays open while some slot is not finished, or its best running
    score (at `length` new tokens; at max_new_tokens with early_stopping="never" and length_penalty > 0)
    beats its worst finished one. Once closed, a prompt stays closed."""
    if rules.early_stopping == "never" and rules.length_penalty > 0:
        length = rules.max_new_tokens
    best_running = beams.running_scores[:, :1] / (length ** rules.length_penalty)
    worst = beams.finished_scores.min(dim=1, keepdim=True).values
    worst_finished = torch.where(beams.is_finished, worst, torch.full_like(worst, NEVER))
    beams.improvable = beams.improvable & (best_running > worst_finished).any(dim=1, keepdim=True)


def _check_beams(num_beams: int, num_return_sequences: int, length_penalty: float,
                 early_stopping: EarlyStopping) -> None:
    if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(f"num_beams = {num_beams!r} is not allowed: a positive integer.")
    if isinstance(num_return_sequences, bool) or not isinstance(num_return_sequences, int) \
            or not 1 <= num_return_sequences <= num_beams:
        raise ValueError(f"num_return_sequences = {num_return_sequences!r} is not allowed: an integer from 1 "
                         f"to num_beams = {num_beams}.")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) \
            or not math.isfinite(length_penalty):
        raise ValueError(f"length_penalty = {length_penalty!r} is not allowed: a finite number.")
    if early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping = {early_stopping!r} is not allowed: True, False or \"never\".")


def beam_search(model: Decoder, input_ids: Tensor, num_beams: int, max_new_tokens: int,
                stop_tokens: Sequence[int] | None = None, pad_token: int | None = None,
                length_penalty: float = 1.0, early_stopping: EarlyStopping = False,
                num_return_sequences: int = 1, attention_mask: Tensor | None = None) -> BeamSearchOutput:
    """Beam search of `num_beams` beams over up to `max_new_tokens` new tokens for each prompt of
    `input_ids` (B, T), decoding with one KV cache of B * num_beams rows (see the module's text).

    `stop_tokens` end a hypothesis (HF's eos_token_id; kept in it); `pad_token` (default: the first
    stop token, else 0) fills a hypothesis after its stop token. `length_penalty` and `early_stopping`
    mean what they do in HF's `generate`, with its defaults. `attention_mask` (B, T), 1 at real tokens
    and 0 at padding, batches prompts of different lengths (padded on either side): each prompt's
    beams are those of the prompt alone. Returns its `num_return_sequences` best hypotheses per prompt."""
    check_request(model, input_ids, max_new_tokens, stop_tokens=stop_tokens, pad_token=pad_token)
    _check_beams(num_beams, num_return_sequences, length_penalty, early_stopping)
    prompts, real = left_padded(input_ids, attention_mask)
    device, (b, t) = input_ids.device, input_ids.shape
    stops = torch.tensor(list(stop_tokens or ()), dtype=torch.long, device=device)
    fill = pad_token if pad_token is not None else int(stops[0]) if len(stops) else 0
    rules = _Rules(num_beams, max_new_tokens, stops, float(length_penalty), early_stopping)
    beams = _Beams.start(b, num_beams, max_new_tokens, fill, input_ids.dtype, device)
    cache = model.new_cache(b * num_beams, t + max_new_tokens - 1)
    with decoding(model):
        _search(model, beams, cache, prompts, real, rules)
    r = num_return_sequences
    longest = int(beams.finished_lengths[:, :r].max())
    new = beams.finished[:, :r, :longest].reshape(b * r, longest)
    with torch.no_grad():  # outside inference mode, as `generate` returns its ids
        sequences = torch.cat([input_ids.repeat_interleave(r, dim=0), new.clone()], dim=1)
        return BeamSearchOutput(sequences, beams.finished_scores[:, :r].reshape(b * r).clone())


def _search(model: Decoder, beams: _Beams, cache: KVCache, prompts: Tensor, real: Tensor | None,
            rules: _Rules) -> None:
    """The prefill of every beam's prompt, then one reorder and one decoding step per new token."""
    k = rules.num_beams
    b = prompts.shape[0]
    rows = prompts.repeat_interleave(k, dim=0)
    flags = None if real is None else real.repeat_interleave(k, dim=0)
    logits = last_logits(model, rows, cache, flags)
    first_row = (torch.arange(b, device=prompts.device) * k)[:, None]
    for i in range(rules.max_new_tokens):
        log_probs = torch.log_softmax(logits.to(torch.float32), dim=-1)
        parents, going = _advance(beams, log_probs, i, rules)
        if not going:
            return
        cache.reorder((parents + first_row).reshape(-1))
        logits = model.decode_step(beams.running[:, :, i].reshape(b * k, 1), cache)
