"""`diagnose`: the per-layer statistics of Value Residual Learning (Sec. 4.1.3-4.1.4, App. A.1-A.2),
averaged over the sequences of a few held-out batches, as a JSON-able dict.

Every statistic is computed per sequence and then averaged over sequences, as the paper averages
over 1,000 sampled sequences. Entropy and importance use the softmax A of each head (for shaped
attention too: Eq. 11 needs a distribution); per-head values are then averaged over heads.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from blocklab.analysis import stats
from blocklab.analysis.capture import LayerTrace, diagnostic_mode, trace
from blocklab.model import ops

FORMAT = "blocklab.diagnostics/1"


def _indices(given: Sequence[int] | None, n: int, what: str) -> list[int] | None:
    """Validate layer or head indices (negative ones count from the end) and make them non-negative."""
    if given is None:
        return None
    if isinstance(given, int):
        given = [given]
    bad = [i for i in given if not isinstance(i, int) or isinstance(i, bool) or not -n <= i < n]
    if bad or not given:
        raise ValueError(f"{what} = {list(given)!r} is not allowed: give a non-empty list of indices "
                         f"in [0, {n}) (negative ones count from the end)")
    return sorted({i % n for i in given})


def _as_ids(batch: Any, vocab_size: int | None, device: torch.device) -> Tensor:
    """A LongTensor (B, T) from a batch; (inputs, targets) pairs give their inputs."""
    if isinstance(batch, (tuple, list)) and batch:
        batch = batch[0]
    if not isinstance(batch, Tensor) or batch.dim() != 2 or batch.dtype != torch.long:
        desc = f"a tensor of shape {tuple(batch.shape)} and dtype {batch.dtype}" if isinstance(
            batch, Tensor) else type(batch).__name__
        raise ValueError(f"each batch must be a LongTensor of token ids (B, T); got {desc}")
    if batch.shape[1] < 2:
        raise ValueError(f"batches need at least 2 tokens per sequence; got shape {tuple(batch.shape)}")
    if batch.numel() and (batch.min() < 0 or (vocab_size is not None and batch.max() >= vocab_size)):
        raise ValueError(f"token ids must lie in [0, {vocab_size}); got ids from {int(batch.min())} "
                         f"to {int(batch.max())}")
    return batch.to(device)


class _Sums:
    """Running sums over sequences of every per-layer statistic."""

    def __init__(self, n_layers: int, map_layers: list[int], heads: list[int] | None, map_tokens: int,
                 shaped: bool):
        self.n_layers, self.map_layers, self.heads = n_layers, map_layers, heads
        self.map_tokens, self.shaped = map_tokens, shaped
        self.sequences, self.seq_len = 0, None
        self.sums: dict[str, list[Tensor | float]] = {}

    def _add(self, key: str, layer: int, value: Tensor) -> None:
        row = self.sums.setdefault(key, [0.0] * self.n_layers)
        row[layer] = row[layer] + value.to(torch.float64).cpu()

    def _map(self, a: Tensor) -> Tensor:
        """Sum over sequences of the top-left block of A, for the chosen heads or the head mean."""
        n = self.map_tokens
        a = a[..., :n, :n]
        a = a.mean(dim=1, keepdim=True, dtype=torch.float64) if self.heads is None else a[:, self.heads]
        return a.sum(dim=0, dtype=torch.float64)

    def add(self, traces: list[LayerTrace]) -> None:
        b, t = traces[0].hidden.shape[:2]
        if self.seq_len is not None and t != self.seq_len:
            raise ValueError(f"every batch must have the same sequence length; got {t} after {self.seq_len}")
        self.seq_len = t
        self.sequences += b
        for i, tr in enumerate(traces):
            probs = tr.probs  # built once per layer and freed before the next
            self._add("entropy", i, stats.importance_entropy(probs).sum(0))  # (H,)
            self._add("importance", i, stats.token_importance(probs).mean(1).sum(0))  # (T,)
            self._add("value_norm", i, stats.token_norms(tr.v).sum(0))
            self._add("hidden_norm", i, stats.token_norms(tr.hidden).sum(0))
            self._add("similarity", i, stats.token_similarity(tr.hidden).sum(0))
            eig = stats.value_spectrum(tr.v)
            self._add("eigenvalues", i, eig.sum(0))
            self._add("normalized", i, stats.normalized_spectrum(eig).sum(0))
            if i in self.map_layers:
                self._add("map_softmax", i, self._map(probs))
                if self.shaped:
                    self._add("map_matrix", i, self._map(tr.matrix))

    def mean(self, key: str, layer: int) -> Tensor:
        return self.sums[key][layer] / self.sequences


def _position_stats(per_position: list[Tensor]) -> dict[str, list]:
    return {"first_token": [float(p[0]) for p in per_position],
            "other_tokens": [float(p[1:].mean()) for p in per_position],
            "per_position": [p.tolist() for p in per_position]}


def _maps(sums: _Sums, form: str) -> list[dict[str, Any]]:
    out = []
    kinds = ["softmax"] + (["matrix"] if sums.shaped else [])
    head_labels = ["mean"] if sums.heads is None else sums.heads
    for layer in sums.map_layers:
        for kind in kinds:
            maps = sums.mean(f"map_{kind}", layer)
            for label, m in zip(head_labels, maps, strict=True):
                out.append({"layer": layer, "head": label, "kind": kind, "form": form,
                            "size": m.shape[-1], "values": m.round(decimals=6).tolist()})
    return out


def _uniform_entropy(attn: nn.Module, t: int) -> float:
    """Eq. (11) for uniform attention over the keys the mask allows (the matrix C of Simplifying
    Eq. 5): under a causal mask early tokens are seen by more queries, so this lies below log T."""
    return float(stats.importance_entropy(ops.centering_matrix(t, t, attn.causal, attn.window)))


def uniform_importance(attn: nn.Module, t: int) -> dict[str, float]:
    """The token importance a' (Eq. 11) of the first token, and the mean of the others, under uniform
    attention over the keys the mask allows: the level that does not yet mean a sink.

    Causal, no window: query i (1-based) gives 1/i to each of keys 1..i, so a_j = (1/T) sum_{i=j}^T 1/i
    = (H_T - H_{j-1}) / T with H_n = sum_{k<=n} 1/k. The a_j already sum to 1 (each row does), so
    a'_1 = H_T / T (about (ln T + 0.577) / T) and the other tokens average (1 - H_T / T) / (T - 1).
    Bidirectional: 1/T for every token. A sliding window is computed from its mask matrix C.
    """
    a = stats.token_importance(ops.centering_matrix(t, t, attn.causal, attn.window, dtype=torch.float64))
    return {"first_token": float(a[0]), "other_tokens": float(a[1:].mean())}


def diagnose(model: nn.Module, batches: Iterable, layers: Sequence[int] | None = None,
             heads: Sequence[int] | None = None, max_batches: int | None = 4,
             map_tokens: int = 64) -> dict[str, Any]:
    """Look inside `model` on held-out `batches` as Value Residual Learning does; returns a JSON-able dict.

    batches: LongTensors of token ids (B, T), all with the same T (or (inputs, targets) pairs).
    layers: the layers whose attention maps are kept (default: all; statistics cover every layer).
    heads: the heads whose maps are kept (default: the mean over heads).
    max_batches: how many batches to read (None: all). map_tokens: maps keep the first
    `map_tokens` queries and keys.

    Keys of the result, each a list over layers unless noted:
    ``entropy`` {mean, per_head, max, uniform_attention}: importance entropy, Eq. (11); max = log T,
    uniform_attention = the entropy of uniform attention under each layer's mask;
    ``importance``, ``value_norm``, ``hidden_norm`` {first_token, other_tokens, per_position}:
    token importance a', ||v||_2 and ||h||_2 (Fig. 2, Fig. 19), and for importance also
    ``uniform_attention`` {first_token, other_tokens}: a' under uniform attention under each
    layer's mask (`uniform_importance`: H_T / T for the first token under a causal mask);
    ``similarity``: Eq. (13) of the
    block outputs; ``spectrum`` {eigenvalues, normalized, max}: Eq. (12) of the values;
    ``attention_maps``: a list of {layer, head, kind, form, size, values} averaged over sequences,
    kind "softmax" (A) or "matrix" (alpha I + beta A [- gamma C]); ``meta`` and ``notes``.

    The model runs in eval mode under no_grad with explicit attention matrices; its flags are
    restored afterwards, also on error.
    """
    _check_arguments(model, max_batches, map_tokens)
    sums = _read_batches(model, batches, layers, heads, max_batches, map_tokens)
    return _diagnostics(model, sums)


def _check_arguments(model: nn.Module, max_batches: int | None, map_tokens: int) -> None:
    """`diagnose` refuses a model that is not a blocklab Transformer, and a bad batch or map count."""
    if not hasattr(model, "blocks") or len(model.blocks) == 0:
        raise ValueError("diagnose needs a blocklab Transformer (a model with a non-empty `blocks` list)")
    if max_batches is not None and (not isinstance(max_batches, int) or max_batches < 1):
        raise ValueError(f"max_batches = {max_batches!r} is not allowed: give a positive integer or None")
    if not isinstance(map_tokens, int) or map_tokens < 1:
        raise ValueError(f"map_tokens = {map_tokens!r} is not allowed: give a positive integer")


def _read_batches(model: nn.Module, batches: Iterable, layers: Sequence[int] | None,
                  heads: Sequence[int] | None, max_batches: int | None, map_tokens: int) -> _Sums:
    """The sums over the first `max_batches` batches of every statistic (`trace`), and of the maps of
    `layers` and `heads`, the model in `diagnostic_mode`."""
    cfg = getattr(model, "cfg", None)
    first = model.blocks[0].attn
    n_layers = len(model.blocks)
    map_layers = _indices(layers, n_layers, "layers")
    map_layers = list(range(n_layers)) if map_layers is None else map_layers
    heads = _indices(heads, first.n_heads, "heads")
    device = next(model.parameters()).device
    sums = _Sums(n_layers, map_layers, heads, map_tokens, shaped=first.form != "softmax")
    with diagnostic_mode(model):
        for batch in itertools.islice(batches, max_batches):
            sums.add(trace(model, _as_ids(batch, getattr(cfg, "vocab_size", None), device)))
    if sums.sequences == 0:
        raise ValueError("diagnose got no batches: give at least one LongTensor (B, T) of token ids")
    return sums


def _diagnostics(model: nn.Module, sums: _Sums) -> dict[str, Any]:
    """`diagnose`'s result: each statistic's mean over the sequences read, per layer, with the model's
    description (`meta`) and notes."""
    cfg = getattr(model, "cfg", None)
    first = model.blocks[0].attn
    n_layers, n_heads, form = len(model.blocks), first.n_heads, first.form
    layer_ids = range(n_layers)
    uniform = [uniform_importance(b.attn, sums.seq_len) for b in model.blocks]
    per_head = [sums.mean("entropy", i) for i in layer_ids]
    eigenvalues = [sums.mean("eigenvalues", i) for i in layer_ids]
    notes = [f"layer {i}: its value path attends over extra keys ({type(b.attn.values).__name__}); the "
             "maps and entropy use the layer's own queries and keys only"
             for i, b in enumerate(model.block_list()) if b.attn.values.attends_other_keys]
    return {
        "meta": {"format": FORMAT, "n_layers": n_layers, "n_heads": n_heads, "attn_matrix": form,
                 "causal": first.causal, "sequences": sums.sequences, "seq_len": sums.seq_len,
                 "value_path": getattr(cfg, "value_path", None),
                 "config": cfg.to_dict() if cfg is not None else None},
        "entropy": {"mean": [float(h.mean()) for h in per_head], "per_head": [h.tolist() for h in per_head],
                    "max": math.log(sums.seq_len),
                    "uniform_attention": [_uniform_entropy(b.attn, sums.seq_len) for b in model.blocks]},
        "importance": {**_position_stats([sums.mean("importance", i) for i in layer_ids]),
                       "uniform_attention": {k: [u[k] for u in uniform] for k in uniform[0]}},
        "value_norm": _position_stats([sums.mean("value_norm", i) for i in layer_ids]),
        "hidden_norm": _position_stats([sums.mean("hidden_norm", i) for i in layer_ids]),
        "similarity": [float(sums.mean("similarity", i)) for i in layer_ids],
        "spectrum": {"eigenvalues": [e.tolist() for e in eigenvalues],
                     "normalized": [sums.mean("normalized", i).tolist() for i in layer_ids],
                     "max": [float(e[0]) for e in eigenvalues]},
        "attention_maps": _maps(sums, form),
        "notes": notes,
    }
