"""Embeddings -> blocks -> final norm -> head, with cross-layer state passed explicitly."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blocklab import ops
from blocklab.model import padding
from blocklab.model.block import Block
from blocklab.model.cache import KVCache
from blocklab.model.carry import Carry
from blocklab.model.compiled_step import CompiledStep, Step
from blocklab.model.compiled_trunk import CompiledTrunk
from blocklab.model.head_loss import linear_cross_entropy, padded_rows
from blocklab.model.init_schemes import init_nanochat, init_normal
from blocklab.model.norms import norm_of
from blocklab.model.offload import host_tables, offload_tables
from blocklab.model.trunk import Backout, Smear
from blocklab.model.value_paths import make_shared_module

if TYPE_CHECKING:
    from blocklab.model.config import ModelConfig


class Transformer(nn.Module):
    """A causal decoder (``cfg.causal``) or a bidirectional encoder built from one `ModelConfig`.

    ``model(input_ids)`` maps a LongTensor (B, T) to logits (B, T, vocab). Build it on the meta
    device with ``with torch.device("meta"): Transformer(cfg)``, then ``to_empty(device=...)`` and
    ``init_weights()``. Decoding: ``cache = model.new_cache(B, max_len)``, then
    ``model(ids, cache=cache)`` for the prompt and for each new token, or ``model.generate(...)``.
    """

    blocks: nn.ModuleList  # of `Block`; `block(i)` and `block_list()` hand them out typed
    # the head's rows are padded to a multiple of this at compute time on CUDA (`head_padding`); the
    # parameters, checkpoints and every count keep the true vocabulary. 1 turns it off.
    vocab_pad_multiple: int = 128

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context_length, cfg.d_model) if cfg.positions == "learned" else None
        self.embed_norm = norm_of(cfg.norm_shape) if cfg.embed_norm else None
        self.smear = Smear(cfg.d_model) if cfg.smear else None
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.value_shared = make_shared_module(cfg)  # model-level module of a value path, if any
        self.backout = Backout(cfg.n_layers) if cfg.backout else None
        self.norm = norm_of(cfg.norm_shape, None if cfg.final_norm else "none")
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._decoding: CompiledStep | None = None  # set by `compile_decoding`
        self._trunk: CompiledTrunk | None = None  # set by `compile_model`
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

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        if self.value_shared is not None:  # weights saved under an older layout of its parameters
            self.value_shared.upgrade_state_dict(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args)

    # -- compilation ---------------------------------------------------------------------------
    def compile_blocks(self, **compile_kwargs: Any) -> None:
        """`torch.compile` each block in place (``block.compile(**compile_kwargs)``).

        All blocks share one code object (Block.forward), and dynamo keeps at most
        `recompile_limit` (default 8) compiled versions of it; past that it runs the block eagerly
        with only a warning. Value paths whose carry differs per layer (Dense-ResFormer's earlier
        values, per-layer lambdas of different lengths) need one version
        per layer, and again per mode (static then dynamic sequence length, no-grad evaluation,
        decoding), so we raise the limit to 4 per layer plus a margin. `cache_size_limit` is an
        alias of `recompile_limit` in the torch versions we support (>= 2.9).
        """
        import torch._dynamo.config as dynamo

        needed = 4 * len(self.blocks) + 8
        dynamo.recompile_limit = max(dynamo.recompile_limit, needed)
        # the total over all versions of one code object, 256 by default
        dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, 2 * needed)
        for block in self.blocks:
            block.compile(**compile_kwargs)

    def compile_model(self, **compile_kwargs: Any) -> None:
        """`torch.compile(**compile_kwargs)` the forward pass without a cache (embeddings, every block,
        the final norm) as one graph: what ``compile=true`` trains and evaluates with. The head and the
        loss stay outside it (`head_loss.linear_cross_entropy` walks the vocabulary in chunks).

        If dynamo or inductor fails on this architecture, the first call warns once, naming the error,
        and the model falls back to `compile_blocks` (one graph per block). The first call with
        gradients also compiles the backward graph (a backward of zeros that leaves ``.grad`` alone),
        so that a failure there falls back too instead of surfacing in ``loss.backward()``.
        Cached decoding is not affected (`compile_decoding` compiles that).
        """
        self._trunk = self._compiled_trunk(compile_kwargs)

    def _compiled_trunk(self, compile_kwargs: dict[str, Any]) -> CompiledTrunk:
        return CompiledTrunk(self, lambda ids: self.norm(self.hidden_states(ids)), self.compile_blocks,
                             compile_kwargs)

    def compile_decoding(self, freeze_weights: bool = False, **compile_kwargs: Any) -> None:
        """`torch.compile(**compile_kwargs)` the decoding step that `generate` runs for every new token
        (`decode_step`: the embedding, every block with its cache writes, the final norm and the head)
        as one graph; the prompt's prefill stays eager.

        The cache's length becomes a dynamic size after the first steps, so one graph serves every
        later step of a batch size. Each call compiles a fresh copy of the step, so models never share
        compiled code or dynamo's recompile limit.

        ``freeze_weights=True`` (inductor only) folds the weights into the compiled step as constants, the
        fastest of our decoding paths on CPU. Folded weights do not follow later changes, so after any
        change (an optimiser step, `load_state_dict`) the next `generate` compiles the step again, which
        takes seconds: freeze a model you serve, not one you sample from between training steps. Inductor
        keeps its folded copy beside the parameters (GPT-2 small: +599 MiB over 472 MiB of weights). Both
        measured against eager decoding and a hand-written loop in benchmarks/RESULTS.md.
        """
        self._decoding = CompiledStep(self, self.decode_step, freeze_weights, compile_kwargs)

    def token_step(self) -> Step:
        """What `generate` runs for each new token, (input_ids, cache) -> next-token logits: `decode_step`,
        or the step `compile_decoding` compiled, first compiled again if it is not current (the model is
        a deep copy, or its frozen weights changed). A decoding loop fetches it once per sequence."""
        decoding = self._decoding
        if decoding is None:
            return self.decode_step
        if not decoding.is_current(self):
            decoding = self._decoding = CompiledStep(self, self.decode_step, decoding.freeze_weights,
                                                     decoding.compile_kwargs)
        return decoding

    # -- the forward pass: `forward` for training and evaluation, `decode_step` for decoding -------
    def forward(self, input_ids: Tensor, cache: KVCache | None = None, labels: Tensor | None = None,
                attention_mask: Tensor | None = None) -> Tensor:
        """Logits (B, T, vocab); with a `cache`, of tokens placed after the cached positions.

        With `labels` (B, T) (the next token at each position, or a masked token; -100 ignored), the
        mean cross-entropy instead, computed chunk by chunk from the final hidden states
        (`head_loss.linear_cross_entropy`): the (B, T, vocab) float32 logits never exist.
        `attention_mask`: 1 at real tokens, 0 at padding (a padded batch, model/padding.py).
        """
        if labels is None:
            return self.head_logits(self.final_hidden(input_ids, cache, attention_mask))
        if cache is not None:
            raise ValueError("labels are for training and evaluation without a KV cache; got both")
        if labels.shape != input_ids.shape:
            raise ValueError(f"labels must have the shape of input_ids {tuple(input_ids.shape)}; got "
                             f"{tuple(labels.shape)}")
        h = self.final_hidden(input_ids, attention_mask=attention_mask)
        weight = self.head_weight()
        return linear_cross_entropy(h.flatten(0, 1), weight, labels.flatten(), softcap=self.cfg.logit_softcap,
                                    pad_to=self.head_padding(weight))

    def final_hidden(self, input_ids: Tensor, cache: KVCache | None = None,
                     attention_mask: Tensor | None = None) -> Tensor:
        """The final norm's output (B, T, d), what the head reads; the compiled graph of
        `compile_model` when there is one, no cache and no padding mask."""
        trunk = self._trunk
        if cache is None and trunk is not None and attention_mask is None:
            if not trunk.is_current(self):  # a deep copy: compile for this model
                trunk = self._trunk = self._compiled_trunk(trunk.compile_kwargs)
            return trunk(input_ids)
        return self.norm(self.hidden_states(input_ids, cache, attention_mask=attention_mask))

    def decode_step(self, input_ids: Tensor, cache: KVCache) -> Tensor:
        """Next-token logits (B, vocab) after `input_ids` (B, T) placed after the cached positions,
        without `forward`'s checks of the ids and of the cache's config: for a decoding loop whose ids
        the model itself produced (in range, shape (B, T)) and whose cache it made or checked once
        (`generate` checks the prompt). The cache still checks the batch size and its room."""
        return self.logits(self.hidden_states(input_ids, cache, checked=False)[:, -1])

    def hidden_states(self, input_ids: Tensor, cache: KVCache | None = None, checked: bool = True,
                      attention_mask: Tensor | None = None) -> Tensor:
        """The last block's output (B, T, d), less the backout if any, before the final norm and head.

        `attention_mask` (B, T), or (B, cached + T) as Hugging Face passes it: 1 at real tokens, 0 at
        padding; each row then computes what it would alone (model/padding.py)."""
        if checked:
            self._check_inputs(input_ids, cache)
        real = None if attention_mask is None else padding.real_tokens(
            attention_mask, input_ids, 0 if cache is None else cache.length)
        if real is not None and (cache is None or cache.padding is None) and bool(real.all()):
            real = None  # nothing padded (so far): the unmasked kernels
        if cache is not None:
            positions = cache.begin(input_ids, real)  # after the cached ones; per row when padded
            key_valid = cache.key_valid()
        elif real is not None:
            padding.check_rows(real)
            positions, key_valid = padding.row_positions(real), real
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

    def _check_inputs(self, input_ids: Tensor, cache: KVCache | None) -> None:
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
            x = x + ops.sinusoidal_positions(positions, self.cfg.d_model, x.dtype)
        return x if self.embed_norm is None else self.embed_norm(x)

    def _smear(self, smear: Smear, x: Tensor, positions: Tensor, cache: KVCache | None,
               key_valid: Tensor | None) -> Tensor:
        """The smear over the new tokens; while decoding its first token mixes in the cached last one.
        In a padded batch a token mixes in its predecessor only when that is a real token."""
        previous = None
        if cache is not None and cache.length > 0:
            last = (positions[..., :1] - 1).clamp(min=0)
            previous = self.embed(self.tok_emb(cache.last_token_ids()), last)
        keep = None if key_valid is None else padding.previous_is_real(key_valid, x.shape[1])
        return smear(x, previous, keep)

    def logits(self, x: Tensor) -> Tensor:
        """Logits (..., vocab) of the last block's output `x` (final norm, head, softcap)."""
        return self.head_logits(self.norm(x))

    def head_weight(self) -> Tensor:
        """The head (vocab, d): its own matrix, or the token embedding when they are tied."""
        return self.head.weight if self.head is not None else self.tok_emb.weight

    def head_padding(self, weight: Tensor) -> int:
        """The multiple the head's rows are padded to when it runs: `vocab_pad_multiple` on CUDA, where a
        GEMM with a vocabulary such as GPT-2's 50257 rows falls on slow kernels, and 1 (none) elsewhere."""
        return self.vocab_pad_multiple if weight.device.type == "cuda" else 1

    def head_logits(self, h: Tensor) -> Tensor:
        """Logits (..., vocab) of final hidden states `h`: z = h W^T, then ``cap tanh(z / cap)`` with a
        `logit_softcap`. The head runs against W padded with zero rows (`head_padding`); the padded
        columns are cut off before anything reads them."""
        weight = self.head_weight()
        vocab, multiple = weight.shape[0], self.head_padding(weight)
        rows = vocab if multiple == 1 else padded_rows(vocab, multiple)
        if rows == vocab:
            logits = F.linear(h, weight)
        else:
            logits = F.linear(h, F.pad(weight, (0, 0, 0, rows - vocab)))[..., :vocab]
        if self.cfg.logit_softcap is not None:
            cap = self.cfg.logit_softcap
            logits = cap * torch.tanh(logits / cap)
        return logits

    # -- decoding ------------------------------------------------------------------------------
    def new_cache(self, batch_size: int, max_len: int, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> KVCache:
        """An empty KV cache for `batch_size` sequences of up to `max_len` positions, laid out from
        the value paths (model/cache.py); dtype and device default to the model's."""
        weight = self.tok_emb.weight
        paths = [block.attn.values for block in self.block_list()]
        return KVCache(self.cfg, paths, batch_size, max_len, dtype or weight.dtype, device or weight.device,
                       value_tables=host_tables(self))

    def offload_value_tables(self, offload: bool = True) -> None:
        """Keep Bank of Values' tables E_v in host memory (pinned when CUDA is available) and, in each KV
        cache made afterwards, only the rows of the ids its batch used on the device (model/offload.py);
        decoding gives the same tokens and logits. ``offload=False`` moves them back to the model's device.
        While offloaded, a forward pass without a KV cache or with gradients raises (training needs them
        on the device). Call it after moving the model (``model.to(...)`` would move the tables too)."""
        offload_tables(self, self.tok_emb.weight.device, offload)

    def generate(self, input_ids: Tensor, max_new_tokens: int, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None,
                 stop_tokens: Sequence[int] | None = None, seed: int | None = None,
                 pad_token: int | None = None, cache: KVCache | None = None,
                 compile: bool | None = None, attention_mask: Tensor | None = None) -> Tensor:
        """Prompt + generated ids (B, T + n), decoding with a KV cache; see `blocklab.model.generate`
        (`compile`: the compiled decoding step, by default on CUDA only; `attention_mask`: prompts of
        different lengths, padded)."""
        from blocklab.model.generate import generate

        return generate(self, input_ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                        stop_tokens=stop_tokens, seed=seed, pad_token=pad_token, cache=cache, compile=compile,
                        attention_mask=attention_mask)

