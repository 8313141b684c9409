"""The Transformer of `blocklab.model`, made to run: a KV cache, generation, compilation, the chunked
loss with a padded head, and Bank of Values' tables offloaded to host memory.

`LanguageModel` adds no parameter and changes no result of the definition it extends: its state dict,
checkpoints and exports are the `Transformer`'s, and ``LanguageModel(cfg)`` equals ``Transformer(cfg)``
under the same seed. What it adds is how the model runs:

- ``model(ids, labels=labels)``: the mean cross-entropy computed chunk by chunk from the final
  hidden states (runtime/head_loss.py), so that the (B, T, vocab) float32 logits never exist;
- on CUDA the head runs against W padded with zero rows to a multiple of `vocab_pad_multiple`
  (`head_padding`), where a GEMM of GPT-2's 50257 rows falls on slow kernels;
- ``new_cache``, ``generate`` (runtime/generate.py), ``decode_step`` and ``token_step``;
- ``compile_blocks``, ``compile_model`` (runtime/compiled_trunk.py) and ``compile_decoding``
  (runtime/compiled_step.py), compile applied to the built model;
- ``offload_value_tables`` (runtime/offload.py);
- the fast kernels, swapped into the definition when the model is built: the projections that read one
  input as one GEMM (runtime/fused_projections.py, mode "auto") and shaped attention's fused mix
  (runtime/shaped_mix.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from blocklab.model.carry import DecodingCache
from blocklab.model.config import ModelConfig
from blocklab.model.transformer import Transformer
from blocklab.runtime.cache import KVCache
from blocklab.runtime.compiled_step import CompiledStep, Step
from blocklab.runtime.compiled_trunk import CompiledTrunk, check_compile_trusted
from blocklab.runtime.fused_projections import set_fused_projections
from blocklab.runtime.generate import generate as generate_tokens
from blocklab.runtime.head_loss import linear_cross_entropy, padded_rows
from blocklab.runtime.offload import host_tables, offload_tables
from blocklab.runtime.shaped_mix import use_shaped_mix


class LanguageModel(Transformer):
    """`Transformer` with what runs it; see the module docstring. Decoding: ``cache =
    model.new_cache(B, max_len)``, then ``model(ids, cache=cache)`` for the prompt and for each new
    token, or ``model.generate(...)``."""

    # the head's rows are padded to a multiple of this at compute time on CUDA (`head_padding`); the
    # parameters, checkpoints and every count keep the true vocabulary. 1 turns it off.
    vocab_pad_multiple: int = 128

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        set_fused_projections(self, "auto")
        use_shaped_mix(self)
        self._decoding: CompiledStep | None = None  # set by `compile_decoding`
        self._trunk: CompiledTrunk | None = None  # set by `compile_model`

    # -- the forward pass, with the chunked loss ------------------------------------------------------
    def forward(self, input_ids: Tensor, cache: DecodingCache | None = None,
                attention_mask: Tensor | None = None, labels: Tensor | None = None) -> Tensor:
        """The definition's logits; with `labels` (B, T) (the next token at each position, or a masked
        token; -100 ignored), the mean cross-entropy instead, computed chunk by chunk from the final
        hidden states (`head_loss.linear_cross_entropy`)."""
        if labels is None:
            return super().forward(input_ids, cache, attention_mask)
        if cache is not None:
            raise ValueError("labels are for training and evaluation without a KV cache; got both")
        if labels.shape != input_ids.shape:
            raise ValueError(f"labels must have the shape of input_ids {tuple(input_ids.shape)}; got "
                             f"{tuple(labels.shape)}")
        h = self.final_hidden(input_ids, attention_mask=attention_mask)
        weight = self.head_weight()
        return linear_cross_entropy(h.flatten(0, 1), weight, labels.flatten(), softcap=self.cfg.logit_softcap,
                                    pad_to=self.head_padding(weight))

    def final_hidden(self, input_ids: Tensor, cache: DecodingCache | None = None,
                     attention_mask: Tensor | None = None) -> Tensor:
        """The final norm's output; the graph of `compile_model` when there is one, no cache and no
        padding mask."""
        trunk = self._trunk
        if cache is None and trunk is not None and attention_mask is None:
            if not trunk.is_current(self):  # a deep copy: compile for this model
                trunk = self._trunk = self._compiled_trunk(trunk.compile_kwargs)
            return trunk(input_ids)
        return super().final_hidden(input_ids, cache, attention_mask)

    def head_padding(self, weight: Tensor) -> int:
        """The multiple the head's rows are padded to when it runs: `vocab_pad_multiple` on CUDA, 1
        (none) elsewhere."""
        return self.vocab_pad_multiple if weight.device.type == "cuda" else 1

    def head_projection(self, h: Tensor) -> Tensor:
        """The definition's h W^T, run against W padded with zero rows (`head_padding`); the padded
        columns are cut off before anything reads them (the softcap, if any, comes after). Fewer
        positions than that multiple (a decoding step) run against W itself: there the padded copy
        of W would move as many bytes as the product that reads W once."""
        weight = self.head_weight()
        vocab, multiple = weight.shape[0], self.head_padding(weight)
        rows = vocab if multiple == 1 else padded_rows(vocab, multiple)
        if rows == vocab or h.numel() < multiple * h.shape[-1]:
            return F.linear(h, weight)
        return F.linear(h, F.pad(weight, (0, 0, 0, rows - vocab)))[..., :vocab]

    # -- compilation ---------------------------------------------------------------------------
    def compile_blocks(self, **compile_kwargs: Any) -> None:
        """`torch.compile` each block in place (``block.compile(**compile_kwargs)``).

        The blocks of a model share one code object (their layout's `forward`), and dynamo keeps at most
        `recompile_limit` (default 8) compiled versions of it; past that it runs the block eagerly
        with only a warning. Value paths whose carry differs per layer (Dense-ResFormer's earlier
        values, per-layer lambdas of different lengths) need one version per layer, and again per mode
        (static then dynamic sequence length, no-grad evaluation, decoding), so we raise the limit to 4
        per layer plus a margin. `cache_size_limit` is an alias of `recompile_limit` in the torch
        versions we support (>= 2.9).
        """
        import torch._dynamo.config as dynamo

        check_compile_trusted(self.cfg, next(self.parameters()).device)
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
        check_compile_trusted(self.cfg, next(self.parameters()).device)  # the first call checks its inputs'
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
        keeps its folded copy beside the parameters. Both measured against eager decoding and a
        hand-written loop in benchmarks/RESULTS.md.
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

    # -- decoding ------------------------------------------------------------------------------
    def decode_step(self, input_ids: Tensor, cache: KVCache) -> Tensor:
        """Next-token logits (B, vocab) after `input_ids` (B, T) placed after the cached positions,
        without `forward`'s checks of the ids and of the cache's config: for a decoding loop whose ids
        the model itself produced (in range, shape (B, T)) and whose cache it made or checked once
        (`generate` checks the prompt). The cache still checks the batch size and its room."""
        return self.logits(self.hidden_states(input_ids, cache, checked=False)[:, -1])

    def new_cache(self, batch_size: int, max_len: int, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> KVCache:
        """An empty KV cache for `batch_size` sequences of up to `max_len` positions, laid out from
        the value paths (runtime/cache_layout.py); dtype and device default to the model's."""
        weight = self.tok_emb.weight
        paths = [block.attn.values for block in self.block_list()]
        return KVCache(self.cfg, paths, batch_size, max_len, dtype or weight.dtype, device or weight.device,
                       value_tables=host_tables(self))

    def offload_value_tables(self, offload: bool = True) -> None:
        """Keep Bank of Values' tables E_v in host memory (pinned when CUDA is available) and, in each KV
        cache made afterwards, only the rows of the ids its batch used on the device (runtime/offload.py);
        decoding gives the same tokens and logits. ``offload=False`` moves them back to the model's device.
        While offloaded, a forward pass without a KV cache or with gradients raises (training needs them
        on the device). Call it after moving the model (``model.to(...)`` would move the tables too)."""
        offload_tables(self, self.tok_emb.weight.device, offload)

    def generate(self, input_ids: Tensor, max_new_tokens: int, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None,
                 stop_tokens: Sequence[int] | None = None, seed: int | None = None,
                 pad_token: int | None = None, cache: KVCache | None = None,
                 compile: bool | None = None, attention_mask: Tensor | None = None) -> Tensor:
        """Prompt + generated ids (B, T + n), decoding with a KV cache; see `blocklab.runtime.generate`
        (`compile`: the compiled decoding step, by default on CUDA only; `attention_mask`: prompts of
        different lengths, padded)."""
        return generate_tokens(self, input_ids, max_new_tokens, temperature=temperature, top_k=top_k,
                               top_p=top_p, stop_tokens=stop_tokens, seed=seed, pad_token=pad_token,
                               cache=cache, compile=compile, attention_mask=attention_mask)
