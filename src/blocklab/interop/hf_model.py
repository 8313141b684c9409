"""Every blocklab model as a Hugging Face model: a `Transformer` behind transformers' own classes.

`BlocklabConfig` (``model_type = "blocklab"``) holds a blocklab `ModelConfig` as a dict;
`BlocklabForCausalLM` (a `PreTrainedModel` with `GenerationMixin`) and `BlocklabForMaskedLM` (for
encoders, ``causal=False``) hold the `Transformer` under ``model``, so its weights keep blocklab's
names behind a ``model.`` prefix. Importing this module registers the three with `AutoConfig`,
`AutoModelForCausalLM` and `AutoModelForMaskedLM`; an export (`write_remote_code_export`) carries
an ``auto_map`` and two one-line modules that import them, so that
``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` loads it wherever blocklab
is installed. Nothing here re-implements the model: it computes exactly `Transformer.forward`.

HF `generate` runs its own loop, but the cache it carries from step to step is blocklab's
`KVCache` (`BlocklabCache`), laid out by the value paths: SVFormer keeps one V, Bank of Values
keeps token ids instead of deep values, CLA one K and V per group. The model takes token ids only
(Bank of Values looks its values up by token id, so `inputs_embeds` cannot stand in for them), and
an attention mask only where it changes nothing in a causal model: all ones or right padding.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    GenerationMixin,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.modeling_outputs import CausalLMOutputWithPast, MaskedLMOutput

from blocklab.config import ModelConfig
from blocklab.interop.export_files import auto_map, write_modules
from blocklab.model import Transformer
from blocklab.model.cache import KVCache

MODEL_TYPE = "blocklab"
# transformers 5 calls the cache `cache`, 4.x `past_key_values`: in the model's outputs and inputs
CACHE_NAME = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class BlocklabConfig(PretrainedConfig):
    """An HF config around a blocklab `ModelConfig` (stored whole under ``blocklab``).

    The usual HF size fields (``vocab_size``, ``hidden_size``, ``num_hidden_layers``,
    ``num_attention_heads``, ``max_position_embeddings``) mirror it for tools that read them.
    """

    model_type = MODEL_TYPE

    def __init__(self, blocklab: dict[str, Any] | None = None, **kwargs: Any):
        self.blocklab = dict(blocklab or {})
        if self.blocklab:
            cfg = self.model_config
            kwargs.update(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
                          num_attention_heads=cfg.n_heads, max_position_embeddings=cfg.context_length,
                          tie_word_embeddings=cfg.tie_embeddings, is_decoder=cfg.causal)
        super().__init__(**kwargs)

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

    def ready(self, model: Transformer, batch_size: int) -> KVCache:
        if self.kv is None:
            self.kv = model.new_cache(batch_size, self.max_len or model.cfg.context_length)
        return self.kv


def _check_attention_mask(mask: Tensor | None, causal: bool) -> None:
    """A mask is accepted where it changes no logit that counts: all ones, or (causal) right padding."""
    if mask is None or bool(mask.all()):
        return
    if causal and mask.dim() == 2 and bool((mask[:, 1:] <= mask[:, :-1]).all()):
        return  # right padding: no real token sees a pad, the pads' own logits are ignored
    if causal:
        raise ValueError("this attention_mask pads before real tokens, which a blocklab model would attend "
                         "to: it takes all ones or right padding (which changes no real token's logits). "
                         "Give prompts of one length per batch, or pad on the right.")
    raise ValueError("a blocklab encoder takes no padding mask (every token sees every other): give "
                     "sequences of one length, with an attention_mask of all ones.")


def _shifted_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Next-token cross-entropy: position t predicts label t + 1; -100 labels are ignored."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)


class BlocklabPreTrainedModel(PreTrainedModel):
    """What both HF heads share: the config class, weight names under ``model.``, no HF init."""

    config_class = BlocklabConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]

    def __init__(self, config: BlocklabConfig):
        super().__init__(config)
        self.model = Transformer(config.model_config)
        self.post_init()

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        """transformers' save_pretrained (after PEFT's merge_and_unload, say), plus the auto_map and the
        two modules that let ``trust_remote_code=True`` load the folder again (HF itself copies them
        only for a class it loaded from a module file of its own)."""
        self.config.auto_map = auto_map(self.config.model_config.causal)
        super().save_pretrained(save_directory, *args, **kwargs)
        write_modules(Path(save_directory))

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Nothing: `Transformer` initialises itself as its paper says, and loading fills the rest."""

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.model.tok_emb

    def set_input_embeddings(self, value: torch.nn.Embedding) -> None:
        self.model.tok_emb = value

    def get_output_embeddings(self) -> torch.nn.Linear | None:
        return self.model.head  # None when tied: the logits read the embedding itself

    def lora_target_modules(self) -> list[str]:
        """The names of the plain linear maps in the blocks (``q``, ``k``, ``w_v``, ``proj``, ``fc``,
        ``out``, as the variant has them), for ``peft.LoraConfig(target_modules=...)``: identity and
        reparameterised maps (SAS, SAS-P) are no `nn.Linear`, and PEFT adapts only those."""
        return sorted({name.rsplit(".", 1)[-1] for name, module in self.model.blocks.named_modules()
                       if type(module) is torch.nn.Linear})

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
                **kwargs: Any) -> CausalLMOutputWithPast:  # noqa: ARG002
        """Logits (B, T, vocab) of `input_ids`, or of the last `logits_to_keep` positions (generate asks
        for 1); with a `BlocklabCache` (``cache``, or ``past_key_values`` in transformers 4.x), of tokens
        after the cached ones. Other HF arguments (position_ids, use_cache ...) change nothing: the
        positions follow from the cache."""
        ids = self._check_ids(input_ids, inputs_embeds)
        cache = cache if cache is not None else past_key_values
        kv = cache.ready(self.model, ids.shape[0]) if isinstance(cache, BlocklabCache) else None
        if kv is None or kv.length == 0:  # decoding steps only append ones to the mask checked here
            _check_attention_mask(attention_mask, causal=True)
        hidden = self.model.hidden_states(ids, kv)
        logits = self.model.logits(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)
        loss = None if labels is None else _shifted_loss(logits, labels)
        return CausalLMOutputWithPast(loss=loss, logits=logits,
                                      **{CACHE_NAME: cache if kv is not None else None})

    def prepare_inputs_for_generation(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                                      cache: Any = None, past_key_values: Any = None,
                                      **kwargs: Any) -> dict[str, Any]:  # noqa: ARG002
        """The tokens not yet in the cache, and the cache (a new, empty `BlocklabCache` at the start)."""
        cache = cache if cache is not None else past_key_values
        if not isinstance(cache, BlocklabCache):
            cache = BlocklabCache()
        return {"input_ids": input_ids[:, cache.get_seq_length():], "attention_mask": attention_mask,
                CACHE_NAME: cache}

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
                **kwargs: Any) -> MaskedLMOutput:  # noqa: ARG002 (other HF arguments change nothing)
        ids = self._check_ids(input_ids, inputs_embeds)
        _check_attention_mask(attention_mask, causal=False)
        logits = self.model(ids)
        loss = None if labels is None else F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                                                           ignore_index=-100)
        return MaskedLMOutput(loss=loss, logits=logits)


def hf_model(model: Transformer) -> BlocklabPreTrainedModel:
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
