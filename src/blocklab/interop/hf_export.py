"""Export a blocklab baseline as a Hugging Face GPT-2 or Llama checkpoint: the inverse of `hf.py`.

For a model that fits, `save_pretrained(model, folder, format="hf")` writes a folder that
``transformers.AutoModelForCausalLM.from_pretrained(folder)`` loads with the same logits and no
blocklab installed; any other model gets the remote-code export (hf_remote.py). Only a
plain Pre-LN baseline fits (Eq. (1) of Simplifying Transformer Blocks, alpha = beta = 1, softmax
attention, the standard value path); the norm picks the target:

    GPT-2 (GPT2LMHeadModel):  LayerNorm, learned positions, MLP act in gelu_tanh | gelu | relu | relu2,
                              multi-head attention with d_head = d_model / n_heads. GPT-2 has
                              biases everywhere: a model with bias=False gets zero biases.
    Llama (LlamaForCausalLM): RMSNorm, RoPE, SwiGLU MLP, grouped-query attention, any head_dim,
                              biases on every linear map or on none.

The folder holds config.json, model.safetensors, generation_config.json (bos, eos and pad ids) and a
README.md model card (model_card.py) and, with a tokenizer, tokenizer.json and tokenizer_config.json:
transformers' generic fast tokenizer, with the end-of-text token as bos, eos and (unless the tokenizer
has a pad token of its own) pad, padding on the left.

`hf_target` refuses every other config (the simplified blocks, value paths, QK-norm, windows,
softcapping ...) with a `ConfigError` naming each field that neither HF model can express, since a
native checkpoint that loads but computes something else would be worse than none. Dropout is not
exported (HF dropouts are 0), as `from_hf` does not import it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from blocklab.interop.export_files import (
    CARD_NAME,
    CONFIG_NAME,
    TOKENIZER_CLASS,
    TOKENIZER_NAME,
    WEIGHTS_NAME,
    SpecialTokens,
    export_metadata,
)
from blocklab.interop.hf import LLAMA_LINEARS, LLAMA_NORMS, _Weights
from blocklab.model.config import ModelConfig
from blocklab.util.errors import ConfigError

TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
ARCHITECTURES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}
# blocklab mlp_act -> GPT-2 activation_function computing exactly the same function
GPT2_ACTS = {"gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu", "relu": "relu", "relu2": "relu2"}
_KEEP = ('save_pretrained(..., format="hf") writes such a model as remote code that imports blocklab '
         '(interop/hf_remote.py); format="blocklab" keeps every field')


def require_transformers():
    try:
        import transformers
    except ImportError as e:  # an optional dependency
        raise ImportError('save_pretrained(..., format="hf") needs transformers: pip install "blocklab[hf]"'
                          ) from e
    return transformers


# -- which HF model can express a config --------------------------------------------------------
def _mismatch(field: str, value: Any, needs: str) -> str:
    return f"{field} = {value!r} (needs {needs})"


def _common_mismatches(cfg: ModelConfig) -> list[str]:
    """The fields that neither GPT-2 nor Llama can express: both are plain causal Pre-LN blocks."""
    wanted = {"causal": True, "block_layout": "pre-ln", "norm_layers": "all", "final_norm": True,
              "attn_skip_gain": 1.0, "attn_branch_gain": 1.0, "mlp_skip_gain": 1.0, "mlp_branch_gain": 1.0,
              "trainable_block_gains": False, "attn_matrix": "softmax", "value_form": "linear",
              "proj_form": "linear", "value_path": "standard", "qk_norm": False, "logit_softcap": None,
              "norm_affine": True, "embed_norm": False, "attn_logit_scale": 1.0, "smear": False,
              "residual_scalars": False, "backout": False, "qk_bias": False, "rmsnorm_eps": "inside",
              "embed_scale": 1.0}
    out = [_mismatch(f, getattr(cfg, f), repr(v)) for f, v in wanted.items() if getattr(cfg, f) != v]
    if cfg.norm_eps is None:
        out.append(_mismatch("norm_eps", None, "a number"))
    if cfg.first_value_form not in (None, "linear"):
        out.append(_mismatch("first_value_form", cfg.first_value_form, "None or 'linear'"))
    if any(cfg.layer_window(i) is not None for i in range(cfg.n_layers)):
        out.append(_mismatch("window_size", cfg.window_size, "None: full attention in every layer") +
                   f" with window_pattern = {cfg.window_pattern!r}")
    return out


def _field_mismatches(cfg: ModelConfig, needs: dict[str, tuple[Any, ...]]) -> list[str]:
    """`needs`: field -> the values the target accepts."""
    return [_mismatch(f, getattr(cfg, f), " or ".join(map(repr, allowed)))
            for f, allowed in needs.items() if getattr(cfg, f) not in allowed]


def _gpt2_mismatches(cfg: ModelConfig) -> list[str]:
    out = _field_mismatches(cfg, {"norm": ("layernorm",), "positions": ("learned",),
                                  "mlp_act": tuple(GPT2_ACTS)})
    shape = cfg.attention_shape
    if shape.n_kv_heads != shape.n_heads:
        out.append(_mismatch("n_kv_heads", cfg.n_kv_heads, f"None or n_heads = {cfg.n_heads}"))
    if shape.q_dim != cfg.d_model:
        out.append(_mismatch("head_dim", cfg.head_dim, "None or d_model / n_heads"))
    return out


def _llama_mismatches(cfg: ModelConfig) -> list[str]:
    out = _field_mismatches(cfg, {"norm": ("rmsnorm",), "positions": ("rope",), "mlp_act": ("swiglu",)})
    if cfg.d_model % cfg.n_heads:  # transformers validates hidden_size % num_attention_heads
        out.append(_mismatch("d_model", cfg.d_model, f"a multiple of n_heads = {cfg.n_heads}"))
    return out


def native_target(cfg: ModelConfig) -> str | None:
    """``"gpt2"`` or ``"llama"`` when one of them computes exactly what `cfg` does, else None."""
    try:
        return hf_target(cfg)
    except ConfigError:
        return None


def hf_target(cfg: ModelConfig) -> str:
    """``"gpt2"`` or ``"llama"``: the HF model that computes exactly what `cfg` does, else ConfigError."""
    common, gpt2, llama = _common_mismatches(cfg), _gpt2_mismatches(cfg), _llama_mismatches(cfg)
    if not common and not gpt2:
        return "gpt2"
    if not common and not llama:
        return "llama"
    parts = [f"for both, {'; '.join(common)}"] if common else []
    parts += [f"as GPT-2, {'; '.join(gpt2)}", f"as Llama, {'; '.join(llama)}"]
    raise ConfigError("no native Hugging Face model computes this one: GPT-2 and Llama hold only plain "
                      f"Pre-LN models: {' | '.join(parts)}. {_KEEP}.")


# -- config ------------------------------------------------------------------------------------
def hf_config_of(cfg: ModelConfig, dtype: torch.dtype = torch.float32, eos_token_id: int | None = None,
                 pad_token_id: int | None = None, bos_token_id: int | None = None):
    """The `GPT2Config` or `LlamaConfig` (with `architectures` set) of a model built from `cfg`.

    `bos_token_id` defaults to `eos_token_id` (GPT-2's convention); None leaves a token unset rather
    than pointing at HF's defaults, which are ids of other vocabularies.
    """
    target = hf_target(cfg)
    transformers = require_transformers()
    attention, mlp = cfg.attention_shape, cfg.mlp_shape
    shared = dict(vocab_size=cfg.vocab_size, tie_word_embeddings=cfg.tie_embeddings,
                  initializer_range=cfg.init_std, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                  bos_token_id=eos_token_id if bos_token_id is None else bos_token_id,
                  torch_dtype=str(dtype).removeprefix("torch."))
    if target == "gpt2":
        hf = transformers.GPT2Config(
            n_positions=cfg.context_length, n_embd=cfg.d_model, n_layer=cfg.n_layers, n_head=cfg.n_heads,
            n_inner=mlp.hidden, activation_function=GPT2_ACTS[cfg.mlp_act],
            layer_norm_epsilon=cfg.norm_eps, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **shared)
    else:
        # rope_theta: transformers 5 moves it into rope_parameters, 4.x keeps it as it is
        hf = transformers.LlamaConfig(
            hidden_size=cfg.d_model, intermediate_size=mlp.hidden, num_hidden_layers=cfg.n_layers,
            num_attention_heads=cfg.n_heads, num_key_value_heads=attention.n_kv_heads,
            head_dim=attention.head_dim,
            hidden_act="silu", max_position_embeddings=cfg.context_length, rms_norm_eps=cfg.norm_eps,
            rope_theta=cfg.rope_base, attention_bias=cfg.bias, mlp_bias=cfg.bias, attention_dropout=0.0,
            **shared)
    hf.architectures = [ARCHITECTURES[target]]
    return hf


# -- weights -----------------------------------------------------------------------------------
class _Taken(_Weights):
    """Reads blocklab tensors by name, so that a weight the export would leave behind is an error."""

    def bias(self, name: str, like: Tensor) -> Tensor:
        """The bias `name`, or zeros when the model has none (GPT-2 always has biases)."""
        return self(name) if name in self.state else like.new_zeros(like.shape[0])

    def check_all_used(self, model_type: str = "Hugging Face export") -> None:
        left = sorted(set(self.state) - self.used)
        if left:
            raise ConfigError(f"the {model_type} would drop these weights: {', '.join(left[:8])}"
                              f"{' ...' if len(left) > 8 else ''}. {_KEEP}.")


def _gpt2_state(w: _Taken, cfg: ModelConfig) -> dict[str, Tensor]:
    out = {"transformer.wte.weight": w("tok_emb.weight"), "transformer.wpe.weight": w("pos_emb.weight"),
           "transformer.ln_f.weight": w("norm.weight")}
    out["transformer.ln_f.bias"] = w.bias("norm.bias", out["transformer.ln_f.weight"])
    for i in range(cfg.n_layers):
        b, h = f"blocks.{i}.", f"transformer.h.{i}."
        for ours, theirs in (("norm1", "ln_1"), ("norm2", "ln_2")):
            out[h + theirs + ".weight"] = weight = w(b + ours + ".weight")
            out[h + theirs + ".bias"] = w.bias(b + ours + ".bias", weight)
        # Conv1D computes x W + b with W stored (in, out): the transpose of nn.Linear's weight
        qkv = [(w(b + n + ".weight"), b + n + ".bias") for n in ("attn.q", "attn.k", "attn.values.w_v")]
        out[h + "attn.c_attn.weight"] = torch.cat([weight for weight, _ in qkv]).t()
        out[h + "attn.c_attn.bias"] = torch.cat([w.bias(name, weight) for weight, name in qkv])
        for ours, theirs in (("attn.proj", "attn.c_proj"), ("mlp.fc", "mlp.c_fc"), ("mlp.out", "mlp.c_proj")):
            weight = w(b + ours + ".weight")
            out[h + theirs + ".weight"] = weight.t()
            out[h + theirs + ".bias"] = w.bias(b + ours + ".bias", weight)
    return out


def _llama_state(w: _Taken, cfg: ModelConfig) -> dict[str, Tensor]:
    out = {"model.embed_tokens.weight": w("tok_emb.weight"), "model.norm.weight": w("norm.weight")}
    suffixes = ("weight", "bias") if cfg.bias else ("weight",)
    for i in range(cfg.n_layers):
        b, h = f"blocks.{i}.", f"model.layers.{i}."
        for ours, theirs in LLAMA_NORMS.items():
            out[h + theirs + ".weight"] = w(b + ours + ".weight")
        for s in suffixes:
            for ours, theirs in LLAMA_LINEARS.items():
                out[h + theirs + "." + s] = w(b + ours + "." + s)
            out[h + "mlp.up_proj." + s], out[h + "mlp.gate_proj." + s] = w(b + "mlp.fc." + s).chunk(2)
    return out


def hf_state_dict(model) -> dict[str, Tensor]:
    """The weights of a blocklab `Transformer` under HF GPT-2 / Llama names, as contiguous copies.

    A tied head is left out (HF ties ``lm_head.weight`` to the embedding when it loads).
    """
    cfg = model.cfg
    target = hf_target(cfg)
    w = _Taken(model.state_dict())
    out = (_gpt2_state if target == "gpt2" else _llama_state)(w, cfg)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = w("head.weight")
    w.check_all_used()
    return {name: t.detach().clone().contiguous() for name, t in out.items()}


# -- files -------------------------------------------------------------------------------------
# Names a tokenizer gives its padding token; one of them in the vocabulary is the pad token, else the
# end-of-text token pads (GPT-2's convention: pads are masked out, so which id they carry never matters).
KNOWN_PAD = ("<|pad|>", "<pad>", "[PAD]")
# what every exported model reads: no token_type_ids (blocklab, GPT-2 and Llama have no segments)
MODEL_INPUTS = ("input_ids", "attention_mask")


def special_tokens(tokenizer_file: Path) -> SpecialTokens:
    """The separator, pad and mask tokens of a tokenizer.json, found under the names blocklab's own
    loader tries (`KNOWN_EOS`, `KNOWN_MASK`) and `KNOWN_PAD`; the separator pads when no pad exists."""
    from tokenizers import Tokenizer

    from blocklab.data.tokenizer import KNOWN_EOS, KNOWN_MASK

    tok = Tokenizer.from_file(str(tokenizer_file))

    def first(names: tuple[str, ...]) -> tuple[str, int] | None:
        found = ((name, tok.token_to_id(name)) for name in names)
        return next(((name, i) for name, i in found if i is not None), None)

    eos = first(KNOWN_EOS)
    return SpecialTokens(eos=eos, pad=first(KNOWN_PAD) or eos, mask=first(KNOWN_MASK))


def write_tokenizer_config(folder: Path, context_length: int, causal: bool = True) -> SpecialTokens:
    """tokenizer_config.json beside the folder's tokenizer.json, if it has one; returns its special
    tokens (none without a tokenizer).

    The config names transformers' generic fast tokenizer, so that loading it runs no code of ours;
    it pads on the left for a causal model (generation continues each row from its last real token)
    and on the right for an encoder; it encodes a special token's text in a prompt as plain text,
    as blocklab's tokenizer does in training (`split_special_tokens`); and it names the model's
    inputs, ids and mask (`MODEL_INPUTS`): the generic tokenizer otherwise also returns
    ``token_type_ids``, which `generate` refuses (remote code, Llama) or adds to the embeddings
    (GPT-2) in transformers 4.x.
    """
    tokenizer_file = folder / TOKENIZER_NAME
    if not tokenizer_file.is_file():
        return SpecialTokens()
    specials = special_tokens(tokenizer_file)
    # without tokenizer_class, AutoTokenizer would pick a tokenizer class from config.json's model_type
    tok_config: dict[str, Any] = {"tokenizer_class": TOKENIZER_CLASS,
                                  "model_input_names": list(MODEL_INPUTS),
                                  "model_max_length": context_length,
                                  "padding_side": "left" if causal else "right",
                                  "split_special_tokens": True, "clean_up_tokenization_spaces": False}
    if specials.eos:
        tok_config.update(bos_token=specials.eos[0], eos_token=specials.eos[0])
    if specials.pad:
        tok_config["pad_token"] = specials.pad[0]
    if specials.mask and not causal:
        tok_config["mask_token"] = specials.mask[0]
    (folder / TOKENIZER_CONFIG_NAME).write_text(json.dumps(tok_config, indent=2) + "\n")
    return specials


def write_generation_config(folder: Path, specials: SpecialTokens) -> None:
    """generation_config.json of a causal export: its bos, eos and pad ids (as known), so that
    `generate` stops at the end-of-text token and pads a batch without a warning."""
    transformers = require_transformers()
    ids = {name: value for name, value in specials.ids().items() if value is not None}
    transformers.GenerationConfig(**ids).save_pretrained(folder)


def write_hf(model, folder: Path, dtype: torch.dtype, run: Path | None = None) -> None:
    """Write config.json, generation_config.json, model.safetensors and the README model card (and
    tokenizer_config.json next to a tokenizer.json already in `folder`) so that transformers' Auto
    classes load the folder as GPT-2 or Llama, with no blocklab installed."""
    from blocklab.interop.model_card import model_card

    specials = write_tokenizer_config(folder, model.cfg.context_length)
    hf = hf_config_of(model.cfg, dtype, **specials.ids())
    save_file(hf_state_dict(model), str(folder / WEIGHTS_NAME), metadata=export_metadata("hf"))
    config = hf.to_dict()
    if "rope_parameters" in config:  # for transformers 4.x readers, which look for rope_theta alone
        config.setdefault("rope_theta", model.cfg.rope_base)
    (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    write_generation_config(folder, specials)
    (folder / CARD_NAME).write_text(model_card(model, run, native=hf_target(model.cfg), specials=specials))
