"""The parts of nanochat's trunk around the blocks (karpathy/nanochat `gpt.py`), which Bank of Values
trains its models on (He et al. 2026, Sec. 2 and Table 8).

    embedding norm:    x = RMSNorm(E[token])                                 (`embed_norm`)
    smear:             x_t <- x_t + lambda_s sigmoid(W_s x_t[:24]) x_{t-1},  t >= 1   (`Smear`)
    residual scalars:  x <- lambda_r,i x + lambda_0,i x0   before block i    (`ResidualScalars`)
    backout:           x <- x - lambda_b x_{L/2}   before the final norm      (`Backout`)

x0 is the stream after the smear. Each scalar is a trainable `Gain`, so the trainer finds it like
every other gain; the nanochat optimiser recipe picks each out by its module name (``smear.``,
``resid_lambda``, ``x0_lambda``, ``backout.``). The per-layer scalars live in their block, not in
one model-level vector as in nanochat, so that an FSDP-sharded block owns every parameter it uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from blocklab.model.gains import Gain

if TYPE_CHECKING:
    from blocklab.model.fields import ModelFields

SMEAR_CHANNELS = 24  # the gate reads this many leading channels of the embedding


def check_trunk(cfg: ModelFields) -> None:
    """The trunk's rules (a ConfigError naming the field and what is allowed)."""
    if cfg.smear and cfg.d_model < SMEAR_CHANNELS:
        cfg.fail("smear", cfg.smear, f"the smear gate reads the first {SMEAR_CHANNELS} channels: it needs "
                 f"d_model >= {SMEAR_CHANNELS} (d_model={cfg.d_model}).")
    if cfg.smear and not cfg.causal:
        cfg.fail("smear", cfg.smear, "it mixes in the previous token, which only a causal model reads in "
                 "order; set causal=True or smear=False.")
    if cfg.backout and cfg.n_layers < 2:
        cfg.fail("backout", cfg.backout, "it subtracts the output of block n_layers // 2, which needs "
                 "n_layers >= 2.")
    if cfg.init_scheme == "nanochat" and cfg.tie_embeddings:
        cfg.fail("init_scheme", cfg.init_scheme, "nanochat's init gives the embedding std 0.8 and the head "
                 "std 0.001, which one tied matrix cannot have; set tie_embeddings=False.")


class Smear(nn.Module):
    """x_t <- x_t + lambda_s sigmoid(W_s x_t[:24]) x_{t-1}: a cheap bigram signal on the embeddings.

    lambda_s starts at 0, so the smear is the identity at initialisation. While decoding with a KV
    cache, `previous` is the embedding of the token before the first new one (None at position 0).
    """

    def __init__(self, d_model: int):
        super().__init__()
        del d_model  # the gate reads only the leading channels; validation checks d_model >= 24
        self.gate = nn.Linear(SMEAR_CHANNELS, 1, bias=False)
        self.strength = Gain(0.0, trainable=True)  # lambda_s

    def forward(self, x: Tensor, previous: Tensor | None = None, keep: Tensor | None = None) -> Tensor:
        """keep: (B, T) bool, False where the previous token is padding (a padded batch): no mixing."""
        gate = self.strength(torch.sigmoid(self.gate(x[..., :SMEAR_CHANNELS])))  # (B, T, 1)
        if keep is not None:
            gate = gate * keep[..., None]
        if previous is None:  # the first position has no predecessor
            return torch.cat((x[:, :1], x[:, 1:] + gate[:, 1:] * x[:, :-1]), dim=1)
        return x + gate * torch.cat((previous, x[:, :-1]), dim=1)


class ResidualScalars(nn.Module):
    """x <- lambda_r x + lambda_0 x0 before a block, with nanochat's depth-dependent initialisation

        lambda_r,i = 1.15 - 0.10 i / (L - 1),   lambda_0,i = 0.20 - 0.15 i / (L - 1)

    (stronger residual and more of the embedding in early layers)."""

    def __init__(self, layer: int, n_layers: int):
        super().__init__()
        depth = layer / max(n_layers - 1, 1)
        self.resid_lambda = Gain(1.15 - 0.10 * depth, trainable=True)
        self.x0_lambda = Gain(0.20 - 0.15 * depth, trainable=True)

    def forward(self, x: Tensor, x0: Tensor) -> Tensor:
        return self.resid_lambda(x) + self.x0_lambda(x0)


class Backout(nn.Module):
    """x <- x - lambda_b x_{L/2}: subtract the output of block L // 2 (0-based) before the final
    norm, removing low-level features from what the head reads; lambda_b starts at 0.2."""

    def __init__(self, n_layers: int):
        super().__init__()
        self.layer = n_layers // 2  # the block whose output is subtracted
        self.strength = Gain(0.2, trainable=True)  # lambda_b

    def forward(self, x: Tensor, saved: Tensor) -> Tensor:
        return x - self.strength(saved)
