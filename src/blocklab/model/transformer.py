"""Embeddings -> blocks -> final norm -> head, with cross-layer state passed explicitly."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.model import masking
from blocklab.model.block import Block, make_block
from blocklab.model.carry import Carry, DecodingCache
from blocklab.model.init_schemes import init_nanochat, init_normal
from blocklab.model.norms import norm_of
from blocklab.model.positions import sinusoidal_positions
from blocklab.model.trunk import Backout, Smear
from blocklab.model.value_paths import make_shared_module

if TYPE_CHECKING:
    from blocklab.model.config import ModelConfig


class Transformer(nn.Module):
    """A causal decoder (``cfg.causal``) or a bidirectional encoder built from one `ModelConfig`.

    ``model(input_ids)`` maps a LongTensor (B, T) to logits (B, T, vocab). Build it on the meta
    device with ``with torch.device("meta"): Transformer(cfg)``, then ``to_empty(device=...)`` and
    ``init_weights()``. This class is the definition only: what runs it (the KV cache, generation,
    compilation, the chunked loss, offloaded tables) is `blocklab.runtime.LanguageModel`, a subclass.
    A forward pass takes any cache with the methods of `DecodingCache` (model/carry.py).
    """

    blocks: nn.ModuleList  # of `Block`; `block(i)` and `block_list()` hand them out typed

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context_length, cfg.d_model) if cfg.positions == "learned" else None
        self.embed_norm = norm_of(cfg.norm_shape) if cfg.embed_norm else None
        self.smear = Smear(cfg.d_model) if cfg.smear else None
        self.blocks = nn.ModuleList(make_block(cfg, i) for i in range(cfg.n_layers))
        self.value_shared = make_shared_module(cfg)  # model-level module of a value path, if any
        self.backout = Backout(cfg.n_layers) if cfg.backout else None
        self.norm = norm_of(cfg.norm_shape, None if cfg.final_norm else "none")
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if self.tok_emb.weight.device.type != "meta":
            self.init_weights()

    # -- initialisation ------------------------------------------------------------------------
    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise every parameter and buffer under ``cfg.init_scheme`` (model/init_schemes.py), also
        after building on the meta device."""
        {"normal": init_normal, "nanochat": init_nanochat}[self.cfg.init_scheme](self)

    # -- typed access to the blocks --------------------------------------------------------------
    def block(self, layer: int) -> Block:
        """Block `layer` (an `nn.ModuleList` hands out plain modules)."""
        block = self.blocks[layer]
        assert isinstance(block, Block)
        return block

    def block_list(self) -> list[Block]:
        """Every block, first to last."""
        return [self.block(i) for i in range(len(self.blocks))]

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
                        ) -> Any:
        """nn.Module's. The model reads today's names only: when names do not match, the error says how
        to read the weights of an older blocklab (every loader of blocklab does so itself)."""
        try:
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        except RuntimeError as err:
            if "Missing key" not in str(err) and "Unexpected key" not in str(err):
                raise
            raise RuntimeError(f"{err}\nWeights saved by an older blocklab hold older names: load "
                               "blocklab.interop.upgrade_state_dict(state_dict) instead.") from None

    # -- the forward pass ------------------------------------------------------------------------
    def forward(self, input_ids: Tensor, cache: DecodingCache | None = None,
                attention_mask: Tensor | None = None) -> Tensor:
        """Logits (B, T, vocab); with a `cache`, of tokens placed after the cached positions.
        `attention_mask`: 1 at real tokens, 0 at padding (a padded batch, model/masking.py)."""
        return self.head_logits(self.final_hidden(input_ids, cache, attention_mask))

    def final_hidden(self, input_ids: Tensor, cache: DecodingCache | None = None,
                     attention_mask: Tensor | None = None) -> Tensor:
        """The final norm's output (B, T, d), what the head reads."""
        return self.norm(self.hidden_states(input_ids, cache, attention_mask=attention_mask))

    def hidden_states(self, input_ids: Tensor, cache: DecodingCache | None = None, checked: bool = True,
                      attention_mask: Tensor | None = None) -> Tensor:
        """The last block's output (B, T, d), less the backout if any, before the final norm and head.

        `attention_mask` (B, T), or (B, cached + T) as Hugging Face passes it: 1 at real tokens, 0 at
        padding; each row then computes what it would alone (model/masking.py)."""
        if checked:
            self._check_inputs(input_ids, cache)
        real = None if attention_mask is None else masking.real_tokens(
            attention_mask, input_ids, 0 if cache is None else cache.length)
        if real is not None and (cache is None or cache.padding is None) and bool(real.all()):
            real = None  # nothing padded (so far): the unmasked kernels
        if cache is not None:
            positions = cache.begin(input_ids, real)  # after the cached ones; per row when padded
            key_valid = cache.key_valid()
        elif real is not None:
            masking.check_rows(real)
            positions, key_valid = masking.row_positions(real), real
        else:
            positions, key_valid = torch.arange(input_ids.shape[1], device=input_ids.device), None
        tokens = self.tok_emb(input_ids)
        x = self.embed(tokens, positions)
        if self.smear is not None:
            x = self._smear(self.smear, x, positions, cache, key_valid)
        carry = Carry(token_ids=input_ids, positions=positions, x0=x, token_embeddings=tokens,
                      embedding_table=self.tok_emb.weight, cache=cache, key_valid=key_valid)
        shared = self.value_shared
        if shared is not None:
            carry = shared.before_blocks(carry)
        backout, saved = self.backout, x
        try:
            for layer, block in enumerate(self.blocks):
                x, carry = block(x, carry)
                if shared is not None:  # outside the block: reads the outputs of earlier blocks
                    x, carry = shared.after_block(layer, x, carry)
                if backout is not None and layer == backout.layer:
                    saved = x
        except BaseException:
            if cache is not None:
                cache.abort()
            raise
        if cache is not None:
            cache.end()
        return x if backout is None else backout(x, saved)

    def _check_inputs(self, input_ids: Tensor, cache: DecodingCache | None) -> None:
        """Token ids of shape (B, T) in the vocabulary, within the context, and a cache of this config."""
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            shape = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be a tensor of shape (batch, time); got {shape}")
        if input_ids.dtype not in (torch.long, torch.int32):
            raise ValueError(f"input_ids must hold integer token ids (torch.long); got {input_ids.dtype}")
        # on CUDA the check would cost a sync; under torch.compile it would break the graph
        if input_ids.device.type == "cpu" and input_ids.numel() and not torch.compiler.is_compiling():
            bounds = torch.aminmax(input_ids)  # one pass over the ids
            low, high = int(bounds.min), int(bounds.max)
            if low < 0 or high >= self.cfg.vocab_size:
                raise ValueError(f"input_ids must lie in [0, vocab_size={self.cfg.vocab_size}); got ids from "
                                 f"{low} to {high}")
        t = input_ids.shape[1]
        if cache is None and t > self.cfg.context_length:
            raise ValueError(f"sequence length {t} exceeds context_length={self.cfg.context_length}")
        # the same object needs no field-by-field comparison
        if cache is not None and cache.cfg is not self.cfg and cache.cfg != self.cfg:
            raise ValueError("this KV cache was made for a model with a different ModelConfig; make "
                             "one with model.new_cache(...).")

    # -- the pieces of the forward pass ---------------------------------------------------------
    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """Token embeddings (times `embed_scale`) plus position embeddings, then the embedding norm if
        any (no smear)."""
        x = tokens if self.cfg.embed_scale == 1.0 else tokens * self.cfg.embed_scale
        if self.pos_emb is not None:
            x = x + self.pos_emb(positions)
        elif self.cfg.positions == "sinusoidal":
            x = x + sinusoidal_positions(positions, self.cfg.d_model, x.dtype)
        return x if self.embed_norm is None else self.embed_norm(x)

    def _smear(self, smear: Smear, x: Tensor, positions: Tensor, cache: DecodingCache | None,
               key_valid: Tensor | None) -> Tensor:
        """The smear over the new tokens; while decoding its first token mixes in the cached last one.
        In a padded batch a token mixes in its predecessor only when that is a real token."""
        previous = None
        if cache is not None and cache.length > 0:
            last = (positions[..., :1] - 1).clamp(min=0)
            previous = self.embed(self.tok_emb(cache.last_token_ids()), last)
        keep = None if key_valid is None else masking.previous_is_real(key_valid, x.shape[1])
        return smear(x, previous, keep)

    def logits(self, x: Tensor) -> Tensor:
        """Logits (..., vocab) of the last block's output `x` (final norm, head, softcap)."""
        return self.head_logits(self.norm(x))

    def head_weight(self) -> Tensor:
        """The head (vocab, d): its own matrix, or the token embedding when they are tied."""
        return self.head.weight if self.head is not None else self.tok_emb.weight

    def head_projection(self, h: Tensor) -> Tensor:
        """z = h W^T (..., vocab), W the head (`head_weight`)."""
        return F.linear(h, self.head_weight())

    def head_logits(self, h: Tensor) -> Tensor:
        """Logits (..., vocab) of final hidden states `h`: z = h W^T (`head_projection`), then
        ``cap tanh(z / cap)`` with a `logit_softcap`."""
        logits = self.head_projection(h)
        if self.cfg.logit_softcap is not None:
            cap = self.cfg.logit_softcap
            logits = cap * torch.tanh(logits / cap)
        return logits
