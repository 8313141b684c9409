"""The parts of Hugging Face's `PreTrainedModel` surface that the HF classes of hf_model.py build on
blocklab's `Transformer` without changing it: each from outside the model, with hooks or in place.

    recording              output_hidden_states / output_attentions: forward hooks on the blocks and
                           value paths, read after the pass
    CheckpointedForward    gradient checkpointing: a block's forward through HF's checkpoint function
    resize_value_tables    resize_token_embeddings: the value paths' tables indexed by token id
    check_room             generate: the prompt and new tokens must fit, checked before decoding
    no_code_copy           save_pretrained: no copy of hf_model.py for a class loaded as remote code
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from blocklab.model.block import Block
from blocklab.model.carry import Carry
from blocklab.model.value_paths import is_value_table
from blocklab.runtime import LanguageModel

OUTPUT_FLAGS = ("output_attentions", "output_hidden_states")


# -- output_hidden_states and output_attentions -----------------------------------------------------
@dataclasses.dataclass
class Record:
    """What `recording` saw in one forward pass: each block's input (the embedding output, then each
    block's output as the next block reads it) and each layer's queries and keys."""

    hidden: bool
    attentions: bool
    inputs: list[Tensor] = dataclasses.field(default_factory=list)
    queries_keys: list[tuple[Any, Tensor, Tensor, Tensor | None]] = dataclasses.field(default_factory=list)

    def on_block_input(self, _block: nn.Module, args: tuple[Any, ...]) -> None:
        self.inputs.append(args[0])

    def on_heads(self, attn: nn.Module) -> Callable[..., None]:
        def hook(_module: nn.Module, args: tuple[Tensor, Tensor, Tensor | None], _output: Any) -> None:
            q, k, key_valid = args  # the queries and keys the layer attends with, and the padding mask
            self.queries_keys.append((attn, q, k, key_valid))
        return hook

    def outputs(self, model: LanguageModel, x: Tensor) -> dict[str, Any]:
        """HF's ``hidden_states``: n_layers + 1 tensors (B, T, d), the last with the final norm applied
        (what the head reads), as GPT-2 and Llama give them; ``attentions``: per layer the (B, H, T, T)
        matrix it applies to its values (softmax A, or alpha I + beta A - gamma C for shaped attention).
        The matrices are built after the pass: built inside a checkpointed block they would upset its
        recomputation. Both None unless asked for."""
        hidden = (*self.inputs, model.norm(x)) if self.hidden else None
        attentions = tuple(_matrix(*seen) for seen in self.queries_keys) if self.attentions else None
        return {"hidden_states": hidden, "attentions": attentions}


def _matrix(attn: Any, q: Tensor, k: Tensor, valid: Tensor | None) -> Tensor:
    return attn.attention_matrix(q, k) if valid is None else attn.attention_matrix(q, k, valid)


@contextmanager
def recording(model: LanguageModel, hidden: bool, attentions: bool, cached: bool) -> Iterator[Record]:
    """Hooks on every block (its input) and value path (its queries and keys) while inside."""
    record = Record(hidden, attentions)
    if attentions:
        check_attentions(model, cached)
    handles = []
    try:
        for block in model.block_list():
            if hidden:
                handles.append(block.register_forward_pre_hook(record.on_block_input))
            if attentions:
                handles.append(block.attn.heads.register_forward_hook(record.on_heads(block.attn)))
        yield record
    finally:
        for handle in handles:
            handle.remove()


def check_attentions(model: LanguageModel, cached: bool) -> None:
    """output_attentions needs each layer's whole matrix, of one set of queries and keys."""
    if cached:
        raise ValueError("output_attentions is not available with a KV cache (generate, or a cache passed "
                         "in): the earlier positions' keys are in the cache, not in this pass. Run the model "
                         "on the whole sequence without a cache: model(input_ids, output_attentions=True).")
    layers = [i for i, block in enumerate(model.block_list()) if block.attn.values.attends_other_keys]
    if layers:
        raise ValueError(f"output_attentions is not available for value_path={model.cfg.value_path!r}: "
                         f"layers {layers} attend over their own keys and another layer's (cross-layer "
                         "attention), so no single (T x T) matrix per layer exists. output_hidden_states "
                         "works.")


# -- gradient checkpointing -----------------------------------------------------------------------
class CheckpointedForward:
    """``block.forward`` while gradient checkpointing is on: the block's forward pass (`inner`: the
    class's, or another wrapper such as accelerate's, put back by `remove`) through `func`, so that
    the backward pass recomputes it instead of keeping its activations. Only while the block trains
    with gradients and no KV cache (a recomputation would write the cache again). The block keeps
    its class, parameter names and hooks."""

    def __init__(self, block: Block, inner: Callable[..., Any], func: Callable[..., Any], own: bool):
        self.block, self.inner, self.func, self.own = block, inner, func, own

    def __call__(self, x: Tensor, carry: Carry) -> Any:
        if self.block.training and carry.cache is None and torch.is_grad_enabled():
            return self.func(self.inner, x, carry)
        return self.inner(x, carry)

    @staticmethod
    def install(block: Block, func: Callable[..., Any]) -> None:
        wrapped = CheckpointedForward(block, block.forward, func, "forward" in block.__dict__)
        object.__setattr__(block, "forward", wrapped)

    @staticmethod
    def remove(block: Block) -> None:
        wrapped = block.__dict__.get("forward")
        if isinstance(wrapped, CheckpointedForward):
            if wrapped.own:
                object.__setattr__(block, "forward", wrapped.inner)
            else:
                del block.__dict__["forward"]


def non_reentrant(func: Callable[..., Any]) -> Callable[..., Any]:
    """`func` with ``use_reentrant=False``: a block hands the next its cross-layer state (a `Carry`:
    ResFormer's V_1, Bank of Values' tables ...) besides x, and reentrant checkpointing carries
    gradients only through the tensors a block takes and returns directly (transformers 4.x asks
    for it by default)."""
    if func is checkpoint:
        return functools.partial(checkpoint, use_reentrant=False)
    if isinstance(func, functools.partial) and func.keywords.get("use_reentrant") is not False:
        if func.keywords.get("use_reentrant"):
            warnings.warn("blocklab checkpoints its blocks with use_reentrant=False: a block passes "
                          "tensors to the next in a Carry, whose gradients reentrant checkpointing would "
                          "drop.", stacklevel=4)
        return functools.partial(func.func, *func.args, **{**func.keywords, "use_reentrant": False})
    return func


# -- resize_token_embeddings ----------------------------------------------------------------------
@torch.no_grad()
def resize_value_tables(model: LanguageModel, vocab_size: int, mean_resizing: bool = True) -> None:
    """Every value table indexed by token id (`is_value_table`: Bank of Values' E_v, value embeddings)
    to `vocab_size` rows: the first ones kept, new ones the mean of the old rows (or zeros: the token
    adds no value). In place, so that the parameters stay the same objects."""
    for name, table in model.named_parameters():
        if is_value_table(name) and table.shape[0] != vocab_size:
            old = table.shape[0]
            rows = table[:vocab_size]
            if vocab_size > old:
                fill = table.float().mean(0, keepdim=True).to(table.dtype) if mean_resizing else table[:1] * 0
                rows = torch.cat([table, fill.expand(vocab_size - old, -1)])
            table.data = rows.clone()


@torch.no_grad()
def init_new_rows(model: LanguageModel, old: int) -> None:
    """The embedding's and the head's rows from `old` on, as the model initialises them: N(0, std)."""
    cfg = model.cfg
    std = cfg.init_std if cfg.embed_init_std is None else cfg.embed_init_std
    nn.init.normal_(model.tok_emb.weight[old:], std=std)
    if model.head is not None:
        nn.init.normal_(model.head.weight[old:], std=cfg.init_std)


# -- generate and save_pretrained -------------------------------------------------------------------
def check_room(generation_config: Any, context_length: int, cache_room: int | None) -> None:
    """Before generate decodes: the prompt and the new tokens, less the last (never fed back), must fit
    in the context, or in the cache passed in (`cache_room` positions); else the model would fail part
    way through. HF has resolved max_new_tokens into ``max_length`` (prompt + new tokens) by then."""
    total = getattr(generation_config, "max_length", None)
    if total is None:
        return
    limit, where = (context_length, "context_length") if cache_room is None else \
        (cache_room, "the cache's max_len")
    if total - 1 > limit:
        new = getattr(generation_config, "max_new_tokens", None)
        what = f"max_length {total}" if new is None else f"a {total - new}-token prompt + {new} new tokens"
        raise ValueError(f"generate would feed the model {total - 1} positions ({what}, less the last new "
                         f"token), more than {where} = {limit}: shorten the prompt or generate fewer tokens.")


_UNSET = object()


@contextmanager
def no_code_copy(*classes: type) -> Iterator[None]:
    """HF's ``_auto_class`` cleared on `classes` while inside. A remote-code load sets it on the class
    (blocklab's own, which the export's modules re-export), where save_pretrained reads it
    (`is_remote_code`) and then copies the module that defines the class into the folder."""
    saved = [(cls, cls.__dict__.get("_auto_class", _UNSET)) for cls in classes]
    try:
        for cls, _ in saved:
            setattr(cls, "_auto_class", None)  # noqa: B010
        yield
    finally:
        for cls, value in saved:
            if value is _UNSET:
                delattr(cls, "_auto_class")
            else:
                setattr(cls, "_auto_class", value)  # noqa: B010
