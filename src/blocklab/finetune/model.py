"""A sequence classification / regression head on a pretrained blocklab encoder.

Inputs (Crammed BERT's layout, with the run's separator token standing in for [CLS] and [SEP]):

    [SEP] sentence_1 [SEP]                        one sentence
    [SEP] sentence_1 [SEP] sentence_2 [SEP]       a pair

truncated longest-sentence-first to `max_length` tokens (the shorter sentence keeps up to half
of the room, the longer one the rest), then padded with [SEP] to exactly
`max_length`. blocklab's encoder has no padding mask, so padding is attended to; padding every
example to one length makes its prediction independent of the batch it sits in, and matches
pretraining, which always sees full windows of documents joined by the separator.

Head (Geiping & Goldstein, 2023, as used by Simplifying Transformer Blocks, Sec. 5): with h the
final-norm output of the encoder and pool(h) its first token (the default; the [SEP] in front),
the mean over the real (unpadded) tokens, or, for a causal decoder, its last real token,

    logits = W_2 dropout(tanh(W_1 pool(h) + b_1)) + b_2,

W_2 with one output per class, or one for regression.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from blocklab.util.errors import ConfigError

POOLINGS = ("first", "mean", "last")


def final_hidden_states(model: nn.Module, input_ids: Tensor) -> Tensor:
    """The output of the final norm (B, T, d): what the LM head of a `Transformer` reads."""
    if hasattr(model, "hidden_states"):
        return model.norm(model.hidden_states(input_ids))
    captured: list[Tensor] = []  # older models: read the final norm's output with a hook
    handle = model.norm.register_forward_hook(lambda _module, _args, out: captured.append(out))
    try:
        model(input_ids)
    finally:
        handle.remove()
    return captured[0]


def pool(hidden: Tensor, lengths: Tensor, pooling: str) -> Tensor:
    """(B, T, d) -> (B, d): the first token, the mean of the first `lengths` tokens, or the last of them."""
    if pooling == "first":
        return hidden[:, 0]
    if pooling == "last":
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), lengths - 1]
    if pooling == "mean":
        mask = torch.arange(hidden.shape[1], device=hidden.device)[None, :] < lengths[:, None]
        return (hidden * mask[..., None]).sum(1) / lengths[:, None].to(hidden.dtype)
    raise ConfigError(f"pooling = {pooling!r} is not allowed: choose one of {', '.join(POOLINGS)}.")


class SequenceClassifier(nn.Module):
    """`encoder` (a blocklab `Transformer`) + the pooled head of the module docstring.

    ``forward(input_ids, lengths)`` gives (B, num_labels) logits, or (B,) values when
    ``num_labels == 1`` (regression).
    """

    def __init__(self, encoder: nn.Module, num_labels: int, pooling: str = "first", dropout: float = 0.1):
        super().__init__()
        if pooling not in POOLINGS:
            raise ConfigError(f"pooling = {pooling!r} is not allowed: choose one of {', '.join(POOLINGS)}.")
        if encoder.cfg.causal and pooling == "first":
            raise ConfigError("pooling = 'first' is not allowed with a causal model: its first token sees "
                              "nothing else. Use 'last' or 'mean'.")
        d = encoder.cfg.d_model
        self.encoder, self.pooling, self.num_labels = encoder, pooling, num_labels
        self.dense = nn.Linear(d, d)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(d, num_labels)
        for layer in (self.dense, self.out):  # the encoder's init scale for the new weights
            nn.init.normal_(layer.weight, std=encoder.cfg.init_std)
            nn.init.zeros_(layer.bias)

    def forward(self, input_ids: Tensor, lengths: Tensor) -> Tensor:
        pooled = pool(final_hidden_states(self.encoder, input_ids), lengths, self.pooling)
        logits = self.out(self.dropout(torch.tanh(self.dense(pooled))))
        return logits.squeeze(-1) if self.num_labels == 1 else logits


def encode_example(tokenizer, texts: tuple[str, ...], max_length: int) -> tuple[list[int], int]:
    """(ids padded to `max_length`, number of real tokens) in the layout of the module docstring."""
    sep = tokenizer.eos_id
    parts = [tokenizer.encode(text) for text in texts]
    budget = max_length - len(parts) - 1  # room left after the separators
    if budget < len(parts):
        raise ConfigError(f"max_length = {max_length} is too short for {len(parts)} sentence(s) and their "
                          "separators.")
    if sum(map(len, parts)) > budget:  # longest first: the shorter keeps up to half the room
        if len(parts) == 1:
            parts[0] = parts[0][:budget]
        else:
            short = 0 if len(parts[0]) < len(parts[1]) else 1
            keep = min(len(parts[short]), budget // 2)
            parts[short], parts[1 - short] = parts[short][:keep], parts[1 - short][:budget - keep]
    ids = [sep]
    for part in parts:
        ids += part + [sep]
    return ids + [sep] * (max_length - len(ids)), len(ids)
