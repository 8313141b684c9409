"""Batches: packed fixed-length windows for causal LM and masked LM, a pure function of the step.

The token stream of a split (documents joined by the separator) is cut into windows that start
every `seq_len` tokens. A causal-LM window holds seq_len + 1 tokens (inputs and next-token
labels, so consecutive windows share one token and every token is a target once per epoch); a
masked-LM window holds seq_len tokens.

Training order: sample g = step * batch_size + row of the global batch is window
``perm_e[g mod n]`` of epoch e = g div n, where perm_e is a permutation drawn from
``(seed, e)``. Masked positions are drawn from ``(seed, step, row)``. A batch is therefore a pure
function of (seed, step, rank, world_size): resuming at step s gives the batch an uninterrupted
run would have seen, and rank r of W gets rows [r B/W, (r+1) B/W) of the same global batch.

Masked LM (Devlin et al., 2019; Crammed BERT, Geiping & Goldstein, 2023): each non-special token
is chosen with probability `mask_prob` (0.25 in Crammed BERT); a chosen token becomes the mask
token with probability 0.8, a uniformly random non-special token with probability 0.1, and stays
as it is otherwise. Labels are the original token at chosen positions and -100 elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch

from blocklab.data.config import OBJECTIVES
from blocklab.data.prepare import PreparedData
from blocklab.util.errors import ConfigError

IGNORE = -100  # label value that torch.nn.functional.cross_entropy ignores by default
_SHUFFLE, _MASK, _VAL_MASK = 0, 1, 2  # separate random streams for the three uses


def bits_per_byte(loss: float, bytes_per_token: float) -> float:
    """Bits per UTF-8 byte from a mean loss in nats per token: bpb = loss / ln 2 / bytes_per_token.

    Tokenizer-independent, so runs with different vocabularies compare (`bytes_per_token` comes
    from `PreparedData.bytes_per_token[split]`; the separators count as tokens, as they are
    targets too).
    """
    if not bytes_per_token > 0:
        raise ValueError(f"bytes_per_token must be positive, got {bytes_per_token!r}.")
    return loss / math.log(2) / bytes_per_token


def _check_int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ConfigError(f"{name} = {value!r} is not allowed: it must be an integer >= {low}.")
    return int(value)


def check_batch_fits(batch_size: int, seq_len: int, window: int, n_windows: int, n_tokens: int,
                     split: str) -> None:
    """Refuse a training batch of more windows than the split holds: it would repeat windows within one
    step, and drawing it allocates per row (a batch_size of 10^8 on a small corpus ran for minutes
    at gigabytes before this check). Called once the split's size is known, before any allocation."""
    if batch_size > n_windows:
        name = {"train": "training", "val": "validation"}.get(split, split)
        label = ", plus the token the last one predicts" if window > seq_len else ""
        raise ConfigError(
            f"batch_size = {batch_size:,} is more than the {name} split holds: its {n_tokens:,} tokens make "
            f"{n_windows:,} windows of {window:,} tokens (seq_len = {seq_len:,}{label}), and a batch takes "
            f"batch_size different windows. Allowed: batch_size <= {n_windows:,} at this seq_len on this "
            "data; or a shorter seq_len, or more data.")


class Batches:
    """Training batches (`get`) and a sequential validation pass (`validation`) over one split."""

    def __init__(self, data: PreparedData, split: str = "train", batch_size: int = 32, seq_len: int = 128,
                 seed: int = 0, objective: str | None = None) -> None:
        self.tokens = data.split(split)
        self.split = split
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.seq_len = _check_int("seq_len", seq_len, 1)
        self.seed = _check_int("seed", seed, 0)
        self.objective = objective or data.config.objective
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"objective = {self.objective!r} is not allowed: choose 'clm' or 'mlm'.")
        self.causal = self.objective == "clm"
        self.window = seq_len + 1 if self.causal else seq_len
        n = len(self.tokens)
        self.n_windows = (n - 1) // seq_len if self.causal else n // seq_len
        if n == 0:
            raise ConfigError(f"the {split} split is empty (val_fraction = {data.config.val_fraction}).")
        if self.n_windows < 1:
            raise ConfigError(f"the {split} split holds {n} tokens, fewer than one window of {self.window} "
                              f"(seq_len = {seq_len}); use a shorter seq_len or more data.")
        if split == "train":  # here, before anything is allocated per batch (validation batches are cut)
            check_batch_fits(self.batch_size, self.seq_len, self.window, self.n_windows, n, split)
        cfg, tok = data.config, data.tokenizer
        self.mask_prob, self.mask_token_frac, self.random_token_frac = (
            cfg.mask_prob, cfg.mask_token_frac, cfg.random_token_frac)
        self.mask_id = tok.mask_id
        if not self.causal and self.mask_id is None:
            raise ConfigError("masked LM needs a mask token, and the tokenizer has none.")
        self.special_ids = np.asarray(tok.special_ids, dtype=np.int64)
        self.regular_ids = np.setdiff1d(np.arange(tok.vocab_size), self.special_ids)
        self._perms: dict[int, np.ndarray] = {}

    @property
    def steps_per_epoch(self) -> int:
        return self.n_windows // self.batch_size

    # -- training ----------------------------------------------------------------------------------

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) >= 2:  # a batch spans at most two epochs when B <= n_windows
                self._perms.pop(next(iter(self._perms)))
            rng = np.random.default_rng([self.seed, _SHUFFLE, epoch])
            self._perms[epoch] = rng.permutation(self.n_windows)
        return self._perms[epoch]

    def window_starts(self, step: int) -> np.ndarray:
        """Token offsets of the windows of the global batch of `step` (all ranks)."""
        if self.batch_size > self.n_windows:  # a validation split's `get` (training ones refused up front)
            check_batch_fits(self.batch_size, self.seq_len, self.window, self.n_windows, len(self.tokens),
                             self.split)
        g = step * self.batch_size + np.arange(self.batch_size)
        epochs, pos = np.divmod(g, self.n_windows)
        starts = np.empty(self.batch_size, dtype=np.int64)
        for e in np.unique(epochs):
            rows = epochs == e
            starts[rows] = self._perm(int(e))[pos[rows]]
        return starts * self.seq_len

    def get(self, step: int, rank: int = 0, world_size: int = 1) -> dict[str, torch.Tensor]:
        """Rows [rank B/W, (rank+1) B/W) of the global batch of `step`: input_ids and labels, (B/W, T)."""
        step = _check_int("step", step, 0)
        world_size = _check_int("world_size", world_size, 1)
        rank = _check_int("rank", rank, 0)
        if rank >= world_size or self.batch_size % world_size:
            raise ConfigError(f"rank = {rank}, world_size = {world_size} is not allowed: need rank < "
                              f"world_size and world_size dividing batch_size = {self.batch_size}.")
        per_rank = self.batch_size // world_size
        rows = np.arange(rank * per_rank, (rank + 1) * per_rank)
        starts = self.window_starts(step)[rows]
        windows = np.stack([self.tokens[s:s + self.window] for s in starts]).astype(np.int64)
        if self.causal:
            return _tensors(windows[:, :-1], windows[:, 1:])
        rngs = [np.random.default_rng([self.seed, _MASK, step, int(r)]) for r in rows]
        return _tensors(*self._mask(windows, rngs, np.zeros(len(rows), dtype=np.int64)))

    # -- masked LM ---------------------------------------------------------------------------------

    def _mask(self, windows: np.ndarray, rngs: list[np.random.Generator],
              first_new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Masked inputs and labels; positions before `first_new[i]` of row i are never chosen."""
        inputs, labels = windows.copy(), np.full_like(windows, IGNORE)
        width = windows.shape[1]
        for i, rng in enumerate(rngs):
            # Draw every array at full width, so the stream does not depend on the tokens.
            drawn = rng.random(width) < self.mask_prob
            kind = rng.random(width)
            random_ids = self.regular_ids[rng.integers(len(self.regular_ids), size=width)]
            chosen = np.logical_and(drawn, ~np.isin(windows[i], self.special_ids))
            chosen[: first_new[i]] = False
            to_mask = chosen & (kind < self.mask_token_frac)
            to_random = chosen & (kind >= self.mask_token_frac) & \
                (kind < self.mask_token_frac + self.random_token_frac)
            inputs[i, to_mask] = self.mask_id
            inputs[i, to_random] = random_ids[to_random]
            labels[i, chosen] = windows[i, chosen]
        return inputs, labels

    # -- validation --------------------------------------------------------------------------------

    def validation_windows(self) -> tuple[np.ndarray, np.ndarray]:
        """Window starts in order, and per window the number of leading positions already scored.

        Full windows start every seq_len tokens; if tokens remain, one last window ends at the
        end of the split and scores only the positions no earlier window scored, so the pass
        scores every token of the split (CLM: every token after the first) exactly once.
        """
        n, t = len(self.tokens), self.seq_len
        starts = list(range(0, self.n_windows * t, t))
        first_new = [0] * len(starts)
        covered = self.n_windows * t  # CLM: targets 1..covered; MLM: positions 0..covered-1
        end = covered + 1 if self.causal else covered
        if end < n:
            start = n - self.window
            starts.append(start)
            first_new.append(covered - start)
        return np.asarray(starts, dtype=np.int64), np.asarray(first_new, dtype=np.int64)

    def validation(self, batch_size: int | None = None, max_batches: int | None = None, rank: int = 0,
                   world_size: int = 1) -> Iterator[dict[str, torch.Tensor]]:
        """Sequential batches over the split (the last may be smaller); same batches on every call.

        With `world_size` > 1, rank r takes batches r, r + W, r + 2W, ... of the same sequence.
        """
        batch_size = _check_int("batch_size", batch_size or self.batch_size, 1)
        world_size = _check_int("world_size", world_size, 1)
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank = {rank!r} is not allowed: it must lie in [0, world_size = "
                              f"{world_size}).")
        starts, first_new = self.validation_windows()
        n_batches = math.ceil(len(starts) / batch_size)
        if max_batches is not None:
            n_batches = min(n_batches, _check_int("max_batches", max_batches, 1))
        for b in range(rank, n_batches, world_size):
            idx = np.arange(b * batch_size, min((b + 1) * batch_size, len(starts)))
            windows = np.stack([self.tokens[s:s + self.window] for s in starts[idx]]).astype(np.int64)
            if self.causal:
                labels = windows[:, 1:].copy()
                for row, k in enumerate(first_new[idx]):
                    labels[row, :k] = IGNORE
                yield _tensors(windows[:, :-1], labels)
            else:
                rngs = [np.random.default_rng([self.seed, _VAL_MASK, int(i)]) for i in idx]
                yield _tensors(*self._mask(windows, rngs, first_new[idx]))


def _tensors(inputs: np.ndarray, labels: np.ndarray) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.from_numpy(np.ascontiguousarray(inputs, dtype=np.int64)),
            "labels": torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))}
