"""Every blocklab model as a Hugging Face model: a `Transformer` behind transformers' own classes.

`BlocklabConfig` (``model_type = "blocklab"``) holds a blocklab `ModelConfig` as a dict;
`BlocklabForCausalLM` (a `PreTrainedModel` with `GenerationMixin`) and `BlocklabForMaskedLM` (for
encoders, ``causal=False``) hold the `Transformer` under ``model``, so its weights keep blocklab's
names behind a ``model.`` prefix, less the two parts that transformers 4.x renames while loading
(``beta`` and ``gamma``: `export_names`). Importing this module registers the three with `AutoConfig`,
`AutoModelForCausalLM` and `AutoModelForMaskedLM`; an export (`write_remote_code_export`) carries
an ``auto_map`` and two one-line modules that import them, so that
``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` loads it wherever blocklab
is installed. Nothing here re-implements the model: it computes exactly `Transformer.forward`.

HF `generate` runs its own loop, but the cache it carries from step to step is blocklab's
`KVCache` (`BlocklabCache`), laid out by the value paths: SVFormer keeps one V, Bank of Values
keeps token ids instead of deep values, CLA one K and V per group. The model takes token ids only
(Bank of Values looks its values up by token id, so `inputs_embeds` cannot stand in for them), and
an attention mask that pads a row on the left, on the right or both (model/masking.py): each row
computes what it would alone. `generate` runs right-padded prompts left-padded, so that new tokens
follow each prompt's last real token, and returns the prompts as given.

The rest of the `PreTrainedModel` surface works as HF's own models: `resize_token_embeddings` (also
the value paths' token-indexed tables and the blocklab config), `gradient_checkpointing_enable`
(each block recomputed in the backward pass), ``output_hidden_states`` / ``output_attentions``,
``attn_implementation`` "sdpa" (the default: blocklab's fused kernels) or "eager" (each layer builds
its explicit matrix), an up-front length check in `generate`, and `save_pretrained` that writes the
export's own auto_map and modules.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    GenerationMixin,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.modeling_outputs import CausalLMOutputWithPast, MaskedLMOutput

from blocklab.interop.export_files import auto_map, write_modules
from blocklab.interop.export_names import (
    alias_export_names,
    blocklab_name,
    check_export_names,
    export_name,
    renamed_in_place,
)
from blocklab.interop.hf_surface import (
    OUTPUT_FLAGS,
    CheckpointedForward,
    check_room,
    init_new_rows,
    no_code_copy,
    non_reentrant,
    recording,
    resize_value_tables,
)
from blocklab.interop.upgrade import hf_load_kwargs
from blocklab.model.config import ModelConfig
from blocklab.runtime import LanguageModel
from blocklab.runtime.cache import KVCache
from blocklab.runtime.generate import left_padded

MODEL_TYPE = "blocklab"
# transformers 5 calls the cache `cache`, 4.x `past_key_values`: in the model's outputs and inputs
CACHE_NAME = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class BlocklabConfig(PretrainedConfig):
    """An HF config around a blocklab `ModelConfig` (stored whole under ``blocklab``).

    The usual HF size fields (``vocab_size``, ``hidden_size``, ``num_hidden_layers``,
    ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``intermediate_size``,
    ``max_position_embeddings``) mirror it for tools that read them; ``use_cache`` defaults to True
    and the special token ids to None (an export sets them from its tokenizer).
    """

    model_type = MODEL_TYPE

    def __init__(self, blocklab: dict[str, Any] | None = None, **kwargs: Any):
        self.blocklab = dict(blocklab or {})
        if self.blocklab:
            cfg = self.model_config
            shape = cfg.attention_shape
            kwargs.update(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
                          num_attention_heads=cfg.n_heads, num_key_value_heads=shape.n_kv_heads,
                          head_dim=shape.head_dim, intermediate_size=cfg.mlp_shape.hidden,
                          max_position_embeddings=cfg.context_length, tie_word_embeddings=cfg.tie_embeddings,
                          is_decoder=cfg.causal)
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            kwargs.setdefault(name, None)
        use_cache = kwargs.pop("use_cache", True)  # transformers 5 drops it from kwargs as a generation field
        super().__init__(**kwargs)
        self.use_cache = use_cache

    @property
    def model_config(self) -> ModelConfig:
        """The blocklab `ModelConfig` (checked as on any load: a bad field names itself)."""
        return ModelConfig.from_dict(self.blocklab)


class BlocklabCache:
    """blocklab's `KVCache` in HF's generation loop.

    Made empty by `prepare_inputs_for_generation` and allocated at the first forward pass, for that
    pass's batch and `max_len` positions (None: the model's context_length), so that HF's batch
    expansion (``num_return_sequences``) is seen. ``kv`` is the blocklab cache; its ``nbytes`` is
    what the variant's layout holds.
    """

    is_compileable = False  # HF's generate asks before it tries to compile the decoding step
    is_linear = ()  # no HF cache layers: generate leaves slicing the inputs to the model

    def __init__(self, max_len: int | None = None):
        self.max_len = max_len
        self.kv: KVCache | None = None

    def get_seq_length(self, layer_idx: int = 0) -> int:  # noqa: ARG002 (HF's Cache API)
        """Positions cached so far (every layer has the same)."""
        return 0 if self.kv is None else self.kv.length

    @property
    def nbytes(self) -> int:
        return 0 if self.kv is None else self.kv.nbytes

    def reorder_cache(self, beam_idx: Tensor) -> None:
        """Beam search (transformers 4.x and 5): row i continues the former row ``beam_idx[i]``."""
        if self.kv is not None:
            self.kv.reorder(beam_idx)

    def room(self) -> int | None:
        """The positions it holds at most (None: the model's context, once allocated)."""
        return self.kv.max_len if self.kv is not None else self.max_len

    def ready(self, model: LanguageModel, batch_size: int) -> KVCache:
        if self.kv is None:
            self.kv = model.new_cache(batch_size, self.max_len or model.cfg.context_length)
        return self.kv


def _to_export_names(module: nn.Module, state: dict[str, Tensor], prefix: str, local_metadata: Any) -> None:  # noqa: ARG001
    renamed_in_place(state, prefix, export_name)


def _to_blocklab_names(module: nn.Module, state: dict[str, Tensor], prefix: str, *args: Any) -> None:  # noqa: ARG001
    renamed_in_place(state, prefix, blocklab_name)


def _shifted_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Next-token cross-entropy: position t predicts label t + 1; -100 labels are ignored."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)


class BlocklabPreTrainedModel(PreTrainedModel):
    """What both HF heads share: the config class, weight names under ``model.``, no HF init."""

    config_class = BlocklabConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    supports_gradient_checkpointing = True  # `_set_gradient_checkpointing`
    _supports_sdpa = True  # "sdpa": blocklab's fused kernels (the default); "eager": explicit matrices

    def __init__(self, config: BlocklabConfig):
        super().__init__(config)
        self.model = LanguageModel(config.model_config)
        # every tensor goes by its export name here (interop/export_names.py): in state_dict (what
        # save_pretrained writes and loading expects), load_state_dict and get_submodule
        self.register_state_dict_post_hook(_to_export_names)
        self.register_load_state_dict_pre_hook(_to_blocklab_names)
        alias_export_names(self.model)  # transformers 4.45's meta-device load walks attributes by them
        self.post_init()

    def get_submodule(self, target: str) -> nn.Module:
        """The submodule at `target`, an export name (transformers 5 loads each tensor through it)."""
        return super().get_submodule(blocklab_name(target))

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any) -> Any:
        """transformers' from_pretrained; the weights of an export of an older layout (blocklab's own names
        before the export names, DenseFormer's old names) load under today's (`upgrade.hf_load_kwargs`)."""
        if kwargs.get("state_dict") is None and kwargs.get("key_mapping") is None:
            kwargs.update(hf_load_kwargs(pretrained_model_name_or_path))
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        """transformers' save_pretrained (after PEFT's merge_and_unload, say), plus the auto_map and the
        two modules that let ``trust_remote_code=True`` load the folder again, as the export wrote them.

        For a class loaded as remote code (its ``_auto_class`` set) HF would also copy the module that
        defines it, this file, and point the auto_map at that copy: switched off while saving."""
        self.config.auto_map = auto_map(self.config.model_config.causal)
        check_export_names(self.state_dict())
        with no_code_copy(type(self), type(self.config)):
            super().save_pretrained(save_directory, *args, **kwargs)
        write_modules(Path(save_directory))

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Nothing: `Transformer` initialises itself as its paper says, and loading fills the rest."""

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.model.tok_emb

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.tok_emb = value

    def get_output_embeddings(self) -> torch.nn.Linear | None:
        return self.model.head  # None when tied: the logits read the embedding itself

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.model.head = value

    def _resize_token_embeddings(self, new_num_tokens: int | None = None,
                                 pad_to_multiple_of: int | None = None,
                                 mean_resizing: bool = True) -> nn.Embedding:
        """HF's resize of the token embedding and of an untied head (the first rows kept), then what HF
        does not know of: the value paths' tables indexed by token id (`resize_value_tables`) and
        vocab_size in the blocklab config, which the model checks its ids against and saves.

        New rows: with `mean_resizing` (HF's default) the mean of the old rows (the embedding and
        head: HF's draw around it); without it (or under transformers < 4.46, whose resize has no
        `mean_resizing`), N(0, init_std) for the embedding and the head, as the model initialises
        them, and zeros for the value tables (the token adds no value)."""
        old = self.model.tok_emb.weight.shape[0]
        resize = super()._resize_token_embeddings
        if "mean_resizing" in inspect.signature(resize).parameters:
            embeddings = resize(new_num_tokens, pad_to_multiple_of, mean_resizing)
        else:
            embeddings, mean_resizing = resize(new_num_tokens, pad_to_multiple_of), False
        new = embeddings.weight.shape[0]
        if new != old:
            resize_value_tables(self.model, new, mean_resizing)
            if not mean_resizing:
                init_new_rows(self.model, old)
            self._set_vocab_size(new)
        return embeddings

    def _set_vocab_size(self, vocab_size: int) -> None:
        """The model's `ModelConfig` (held by the Transformer and any module that kept it) and the HF
        config's copy of it, with `vocab_size` changed."""
        old = self.model.cfg
        cfg = dataclasses.replace(old, vocab_size=vocab_size)
        for module in self.model.modules():
            if getattr(module, "cfg", None) is old:
                setattr(module, "cfg", cfg)  # noqa: B010 (no typed attribute on nn.Module)
        self.config.blocklab = cfg.to_dict()
        self.config.vocab_size = vocab_size

    def _set_gradient_checkpointing(self, enable: bool = True,
                                    gradient_checkpointing_func: Callable[..., Any] = checkpoint,
                                    every_n_layers: int = 1) -> None:
        """What HF's gradient_checkpointing_enable / _disable call: every `every_n_layers`-th block
        recomputes its forward pass in the backward pass while it trains (`CheckpointedForward`)."""
        func = non_reentrant(gradient_checkpointing_func)
        self.gradient_checkpointing, self._gradient_checkpointing_func = enable, func
        for i, block in enumerate(self.model.block_list()):
            CheckpointedForward.remove(block)
            if enable and i % every_n_layers == 0:
                CheckpointedForward.install(block, func)

    def _trunk(self, ids: Tensor, kv: KVCache | None, output_hidden_states: bool | None,
               output_attentions: bool | None, **trunk_kwargs: Any) -> tuple[Tensor, dict[str, Any]]:
        """The Transformer's `hidden_states` (the last block's output, before the final norm), and the
        ``hidden_states`` and ``attentions`` of HF's outputs, None unless asked for (here or in the
        config), recorded by hooks while it runs (`hf_surface.recording`)."""
        self._sync_attention_form()
        config = self.config
        hidden = config.output_hidden_states if output_hidden_states is None else output_hidden_states
        attentions = getattr(config, "output_attentions", False) if output_attentions is None \
            else output_attentions
        with recording(self.model, bool(hidden), bool(attentions), kv is not None) as record:
            x = self.model.hidden_states(ids, kv, **trunk_kwargs)
        return x, record.outputs(self.model, x)

    def _sync_attention_form(self) -> None:
        """``attn_implementation="eager"`` makes every layer build its explicit (T x T) matrix
        (`Attention.explicit`); "sdpa" leaves blocklab's fused kernels. Read at each forward pass, so
        that HF's set_attn_implementation takes effect; flags are only touched when it changes."""
        eager = getattr(self.config, "_attn_implementation", None) == "eager"
        if eager != getattr(self, "_eager", False):
            for block in self.model.block_list():
                block.attn.explicit = eager
            self._eager = eager

    def lora_target_modules(self) -> list[str]:
        """The names of the plain linear maps in the blocks (``q``, ``k``, ``w_v``, ``proj``, ``fc``,
        ``out``, as the variant has them), for ``peft.LoraConfig(target_modules=...)``: identity and
        reparameterised maps (SAS, SAS-P) are no `nn.Linear`, and PEFT adapts only those (a fused
        projection's `FusedLinear`, runtime/fused_projections.py, is one)."""
        return sorted({name.rsplit(".", 1)[-1] for name, module in self.model.blocks.named_modules()
                       if isinstance(module, torch.nn.Linear)})

    @staticmethod
    def _check_ids(input_ids: Tensor | None, inputs_embeds: Tensor | None) -> Tensor:
        if inputs_embeds is not None or input_ids is None:
            raise ValueError("blocklab models take input_ids only, not inputs_embeds: value paths such as "
                             "Bank of Values look their values up by token id.")
        return input_ids


class BlocklabForCausalLM(BlocklabPreTrainedModel, GenerationMixin):
    """A causal blocklab `Transformer` for transformers: logits, loss from ``labels``, and `generate`
    decoding with blocklab's own KV cache."""

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                labels: Tensor | None = None, cache: Any = None, past_key_values: Any = None,
                inputs_embeds: Tensor | None = None, logits_to_keep: int = 0,
                output_attentions: bool | None = None, output_hidden_states: bool | None = None,
                **kwargs: Any) -> CausalLMOutputWithPast:  # noqa: ARG002
        """Logits (B, T, vocab) of `input_ids`, or of the last `logits_to_keep` positions (generate asks
        for 1); with a `BlocklabCache` (``cache``, or ``past_key_values`` in transformers 4.x), of tokens
        after the cached ones. Other HF arguments (position_ids, use_cache ...) change nothing: the
        positions follow from the cache. ``output_hidden_states`` / ``output_attentions``: `_trunk`."""
        ids = self._check_ids(input_ids, inputs_embeds)
        cache = cache if cache is not None else past_key_values
        kv = cache.ready(self.model, ids.shape[0]) if isinstance(cache, BlocklabCache) else None
        if kv is not None and kv.length > 0:  # generate's decoding steps only append ones to the mask:
            attention_mask = None  # the cache knows its padding, and reading the mask would sync per token
        hidden, seen = self._trunk(ids, kv, output_hidden_states, output_attentions,
                                   attention_mask=attention_mask)
        logits = self.model.logits(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)
        loss = None if labels is None else _shifted_loss(logits, labels)
        return CausalLMOutputWithPast(loss=loss, logits=logits,
                                      **{CACHE_NAME: cache if kv is not None else None}, **seen)

    def generate(self, inputs: Tensor | None = None, *args: Any, **kwargs: Any) -> Any:
        """HF's `generate`, with prompts padded on the right (or both sides) run left-padded: HF appends
        new tokens after the last column, so a right-padded row would continue from padding. The
        returned sequences start with the prompts as given."""
        ids = inputs if inputs is not None else kwargs.get("input_ids")
        mask = kwargs.get("attention_mask")
        if not isinstance(ids, Tensor) or ids.dim() != 2 or mask is None:
            return super().generate(inputs, *args, **kwargs)
        left, real = left_padded(ids, mask)
        if real is None or torch.equal(real, mask.bool()):  # nothing padded, or padded on the left
            return super().generate(inputs, *args, **kwargs)
        kwargs["attention_mask"] = real.to(mask.dtype)
        if inputs is not None:
            out = super().generate(left, *args, **kwargs)
        else:
            out = super().generate(*args, **{**kwargs, "input_ids": left})
        sequences = out if isinstance(out, Tensor) else out.sequences
        sequences[:, :ids.shape[1]] = ids
        return out

    def _get_initial_cache_position(self, *args: Any, **kwargs: Any) -> Any:
        """The prefill's positions. transformers 4.45 (whose method takes `input_ids` first) reads a cache
        that is not its own `Cache` as tuples of tensors (``cache[0][0]``): it is given none, and the
        positions our cache already holds are dropped here, as it drops a cache's past length."""
        old = next(iter(inspect.signature(super()._get_initial_cache_position).parameters)) == "input_ids"
        model_kwargs = kwargs["model_kwargs"] if "model_kwargs" in kwargs else args[-1]
        cache = model_kwargs.get(CACHE_NAME)
        if not old or not isinstance(cache, BlocklabCache):
            return super()._get_initial_cache_position(*args, **kwargs)
        model_kwargs[CACHE_NAME] = None
        try:
            model_kwargs = super()._get_initial_cache_position(*args, **kwargs)
        finally:
            model_kwargs[CACHE_NAME] = cache
        model_kwargs["cache_position"] = model_kwargs["cache_position"][cache.get_seq_length():]
        return model_kwargs

    def prepare_inputs_for_generation(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                                      cache: Any = None, past_key_values: Any = None,
                                      **kwargs: Any) -> dict[str, Any]:
        """The tokens not yet in the cache, and the cache (a new, empty `BlocklabCache` at the start;
        none with ``use_cache=False``: every step runs the whole sequence); of the other model kwargs
        only what the forward pass reads (``output_hidden_states`` ...)."""
        cache = cache if cache is not None else past_key_values
        if kwargs.get("use_cache") is False:
            return {"input_ids": input_ids, "attention_mask": attention_mask,
                    **{k: v for k, v in kwargs.items() if k in OUTPUT_FLAGS}}
        if not isinstance(cache, BlocklabCache):
            cache = BlocklabCache()
        return {"input_ids": input_ids[:, cache.get_seq_length():], "attention_mask": attention_mask,
                CACHE_NAME: cache, **{k: v for k, v in kwargs.items() if k in OUTPUT_FLAGS}}

    def _prepare_cache_for_generation(self, generation_config: Any, model_kwargs: dict[str, Any], *args: Any,
                                      **kwargs: Any) -> Any:
        """HF's last step before decoding (it makes no cache here: `_supports_default_dynamic_cache`),
        where every length is known: the positions generate will feed must fit (`hf_surface.check_room`)."""
        cache = model_kwargs.get(CACHE_NAME)
        check_room(generation_config, self.model.cfg.context_length,
                   cache.room() if isinstance(cache, BlocklabCache) else None)
        return super()._prepare_cache_for_generation(  # type: ignore[misc]
            generation_config, model_kwargs, *args, **kwargs)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # generate must not make HF's DynamicCache: the model brings its own cache

    def new_cache(self, max_len: int | None = None) -> BlocklabCache:
        """An empty cache to pass to `generate` (``cache=`` in transformers 5, ``past_key_values=`` in
        4.x), for `max_len` positions rather than the model's whole context."""
        return BlocklabCache(max_len)


class BlocklabForMaskedLM(BlocklabPreTrainedModel):
    """A blocklab encoder (``causal=False``) for transformers: logits at every position, and the loss
    of the positions whose ``labels`` are not -100."""

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                labels: Tensor | None = None, inputs_embeds: Tensor | None = None,
                output_attentions: bool | None = None, output_hidden_states: bool | None = None,
                **kwargs: Any) -> MaskedLMOutput:  # noqa: ARG002 (other HF arguments change nothing)
        ids = self._check_ids(input_ids, inputs_embeds)
        hidden, seen = self._trunk(ids, None, output_hidden_states, output_attentions,
                                   attention_mask=attention_mask)
        logits = self.model.logits(hidden)
        loss = None if labels is None else F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                                                           ignore_index=-100)
        return MaskedLMOutput(loss=loss, logits=logits, **seen)


def hf_model(model: LanguageModel) -> BlocklabPreTrainedModel:
    """`model` behind the HF class that fits it (its parameters shared, not copied)."""
    config = BlocklabConfig(blocklab=model.cfg.to_dict())
    cls = model_class(config)
    with torch.device("meta"):  # its own Transformer is replaced at once: allocate nothing for it
        wrapper = cls(config)
    wrapper.model = model
    return wrapper


def model_class(config: BlocklabConfig) -> type[BlocklabPreTrainedModel]:
    """The HF class of a blocklab config: causal LM or masked LM (an encoder)."""
    return BlocklabForCausalLM if config.model_config.causal else BlocklabForMaskedLM


def _register() -> None:
    # exist_ok: this module may be imported again as an export's remote code re-exports it
    AutoConfig.register(MODEL_TYPE, BlocklabConfig, exist_ok=True)
    AutoModelForCausalLM.register(BlocklabConfig, BlocklabForCausalLM, exist_ok=True)
    AutoModelForMaskedLM.register(BlocklabConfig, BlocklabForMaskedLM, exist_ok=True)


_register()
