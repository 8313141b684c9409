"""Value embeddings (nanochat, modded-nanogpt): a token-indexed table added to the values.

    value-embed: v_p = x_p W^V + g(x_p) * E_v[token id]      (nanochat), or
                 v_p = lambda_0 x_p W^V + lambda_1 E_v[id]   (modded-nanogpt)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.model.carry import Carry
from blocklab.model.gains import Gain
from blocklab.model.value_paths.base import LayerValues, SharedModule, ValuePath, reset_gains
from blocklab.model.value_paths.options import LayerSpec, ValuePathOptions, target_layers
from blocklab.util.errors import ConfigError

if TYPE_CHECKING:
    from blocklab.model.fields import ModelFields


@dataclass(frozen=True)
class ValueEmbedOptions(ValuePathOptions):
    layers: LayerSpec = "every-2"
    """the layers with a table (every second one ending with the last: nanochat)."""
    gate_channels: int = 12
    """how many leading channels of x the nanochat gate reads, 1 to d_model (12 shrinks to d_model)."""
    gate: Literal["nanochat", "lambda"] = "nanochat"
    """nanochat's gate g(x) per KV head, or modded-nanogpt's per-layer scalars lambda_0, lambda_1."""
    shared_tables: int = 0
    """N > 0: modded-nanogpt's U-net layout of N tables, each in layer i and L - N + i."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gate_channels < 1:
            raise ConfigError(f"value_path_options['gate_channels'] = {self.gate_channels!r} is not "
                              "allowed: the gate reads at least one channel (nanochat uses 12).")


class ValueEmbed(ValuePath):
    """Value embeddings: a token-indexed table E added to the values of chosen layers.

        gate "nanochat":  v = x W^V + g * E[token id],  g = 3 sigmoid(W_g x[..., :12]) per KV head
                          (in (0, 3), about 1.5 at initialisation with W_g ~ U(0, 0.02))
        gate "lambda":    v = lambda_0 x W^V + lambda_1 E[token id],  per-layer scalars, init 1/2
                          (modded-nanogpt; layers without a table keep v = lambda_0 x W^V)

    Layout: by default each layer of ``layers`` (every second one ending with the last: nanochat)
    owns one table. ``shared_tables=N`` is modded-nanogpt's U-net layout (its 2025-02-01 record):
    N tables, table i used by layer i and by layer L - N + i, held by the model-level
    `ValueEmbedTables` (``layers`` is then not used). Tables start N(0, 1/d). Options:
    `ValueEmbedOptions`.
    """

    options: ClassVar[type[ValueEmbedOptions]] = ValueEmbedOptions
    opts: ValueEmbedOptions

    def __init__(self, cfg: ModelFields, layer: int, opts: ValueEmbedOptions):
        super().__init__(cfg, layer, opts)
        o = opts
        shape = cfg.attention_shape
        self.n_kv_heads, self.head_dim, self.d_model = shape.n_kv_heads, shape.head_dim, cfg.d_model
        shared = o.shared_tables
        self.table_index = _unet_table(layer, shared, cfg.n_layers) if shared else None
        self.target = (self.table_index is not None if shared
                       else layer in target_layers(o.layers, cfg.n_layers))
        if self.target and not shared:
            self.value_table = nn.Parameter(torch.empty(cfg.vocab_size, shape.kv_dim))
        if o.gate == "lambda":
            self.lambda0 = Gain(0.5, trainable=True)
            self.lambda1 = Gain(0.5, trainable=True) if self.target else None
        elif self.target:  # the default 12 shrinks to a narrower model; a given value is checked
            self.channels = min(o.gate_channels, cfg.d_model)
            self.gate = nn.Linear(self.channels, shape.n_kv_heads, bias=False)

    def table(self, carry: Carry) -> Tensor:
        if self.table_index is None:
            return self.value_table
        return carry.path_state[self.table_index]

    def layer_values(self, x: Tensor, carry: Carry) -> tuple[LayerValues, Carry]:
        v = self.value_projection(x)
        lam = self.opts.gate == "lambda"
        if lam:
            v = self.lambda0(v)
        if self.target:
            e = F.embedding(carry.token_ids, self.table(carry))
            if lam:
                assert self.lambda1 is not None
                v = v + self.lambda1(e)
            else:
                b, t, _ = v.shape
                g = 3 * torch.sigmoid(self.gate(x[..., : self.channels]))  # (B, T, n_kv_heads)
                v = v + (g[..., None] * e.view(b, t, self.n_kv_heads, self.head_dim)).view(b, t, -1)
        return LayerValues(v), carry

    @torch.no_grad()
    def init_weights(self, token_embedding: Tensor) -> None:
        reset_gains(self)  # lambda_0, lambda_1
        if self.target and self.table_index is None:
            nn.init.normal_(self.value_table, std=self.d_model ** -0.5)
        if self.target and self.opts.gate == "nanochat":
            nn.init.uniform_(self.gate.weight, 0.0, 0.02)

    @torch.no_grad()
    def start_at_baseline(self) -> None:
        if self.target and self.table_index is None:  # E_v = 0: v = x W_V + g(x) * 0
            self.value_table.zero_()
        if self.opts.gate == "lambda":  # lambda_0 = 1 (and the tables 0): v = x W_V
            self.lambda0.param.fill_(1.0)

    @classmethod
    def make_shared(cls, cfg: ModelFields, opts: ValueEmbedOptions) -> SharedModule | None:
        n = opts.shared_tables
        return ValueEmbedTables(n, cfg.vocab_size, cfg.attention_shape.kv_dim, cfg.d_model) if n else None

    @classmethod
    def validate(cls, cfg: ModelFields, opts: ValueEmbedOptions) -> None:
        target_layers(opts.layers, cfg.n_layers)
        n = opts.shared_tables
        if not 0 <= 2 * n <= cfg.n_layers:
            raise ConfigError(f"value_path_options['shared_tables'] = {n!r} is not allowed: 0 gives each "
                              "target layer its own table; N > 0 shares N tables between the first N and "
                              f"the last N layers, so 2N <= n_layers = {cfg.n_layers}.")
        given = cfg.value_path_options.get("gate_channels")
        if given is not None and given > cfg.d_model:  # would silently read only d_model channels
            raise ConfigError(f"value_path_options['gate_channels'] = {given!r} is not allowed: the gate "
                              f"reads the first channels of x, so it must be <= d_model={cfg.d_model}.")


def _unet_table(layer: int, n: int, n_layers: int) -> int | None:
    """modded-nanogpt's U-net layout: table i in layer i and layer L - n + i, none in between."""
    if layer < n:
        return layer
    if layer >= n_layers - n:
        return layer - (n_layers - n)
    return None


class ValueEmbedTables(SharedModule):
    """The N value-embedding tables of the U-net layout (`ValueEmbed` option ``shared_tables``):
    each is read by two layers, so they live outside the blocks."""

    def __init__(self, n: int, vocab_size: int, kv_dim: int, d_model: int):
        super().__init__()
        self.d_model = d_model  # the tables start N(0, 1/d_model)
        self.tables = nn.ModuleList(_Table(vocab_size, kv_dim) for _ in range(n))

    def table_list(self) -> list[nn.Parameter]:
        return [t.value_table for t in self.tables if isinstance(t, _Table)]

    def before_blocks(self, carry: Carry) -> Carry:
        return carry.update(path_state=tuple(self.table_list()))  # the value path's state: the tables

    @torch.no_grad()
    def init_weights(self, token_embedding: Tensor) -> None:
        for table in self.table_list():
            nn.init.normal_(table, std=self.d_model ** -0.5)

    @torch.no_grad()
    def start_at_baseline(self) -> None:
        for table in self.table_list():
            table.zero_()


class _Table(nn.Module):
    def __init__(self, vocab: int, width: int):
        super().__init__()
        self.value_table = nn.Parameter(torch.empty(vocab, width))
