"""Load nanochat weights (karpathy/nanochat `GPT`, or the Bank of Values fork's `gpt_base`) into a
blocklab model with the same logits.

The model is the ``nanochat-d12`` family of presets (model/trunk.py, init_schemes.py): a nanochat
state dict gives the depth and widths; the extras of upstream nanochat's GPT turn on the matching
fields when their weights are present (``resid_lambdas`` / ``x0_lambdas``: `residual_scalars`,
``backout_lambda``: `backout`, ``value_embeds``: the `value-embed` path).

Two conventions differ and are converted, not copied:
  * nanochat rotates q and k by -theta (its `apply_rotary_emb`), blocklab by +theta. With P the
    reflection that negates the second half of each head, R(theta) P = P R(-theta), and QK-norm
    commutes with P, so negating the second-half rows of every head of W_Q and W_K gives the same
    attention logits.
  * nanochat pads the vocabulary to a multiple of 64 and crops the logits; the padding rows of the
    embedding and the head are dropped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from blocklab.model.config import ModelConfig
from blocklab.runtime import LanguageModel
from blocklab.util.errors import ConfigError

NANOCHAT_HEAD_DIM = 128  # nanochat's d_model is a multiple of its head size, 128


def _flip_rotation(weight: Tensor, head_dim: int) -> Tensor:
    """Negate the second half of every head's rows of a (heads * head_dim, d) projection."""
    w = weight.clone().view(-1, head_dim, weight.shape[-1])
    w[:, head_dim // 2:] *= -1
    return w.view_as(weight)


def config_from_nanochat(state_dict: Mapping[str, Tensor], vocab_size: int = 32768,
                         sequence_len: int = 2048, window_pattern: str = "SSSL",
                         head_dim: int = NANOCHAT_HEAD_DIM, **overrides: Any) -> ModelConfig:
    """The blocklab config of a nanochat state dict (nanochat's `GPTConfig` fields as arguments:
    its vocab_size, sequence_len and window_pattern are not in the weights)."""
    if "transformer.wte.weight" not in state_dict:
        raise ConfigError("not a nanochat state dict: it has no 'transformer.wte.weight' (keys: "
                          f"{', '.join(sorted(state_dict)[:5])} ...)")
    d_model = state_dict["transformer.wte.weight"].shape[1]
    layers = {int(m.group(1)) for k in state_dict if (m := re.match(r"transformer\.h\.(\d+)\.", k))}
    kv_dim = state_dict["transformer.h.0.attn.c_k.weight"].shape[0]
    short = -(-sequence_len // 4 // 128) * 128  # nanochat's S window: a quarter context, in tiles of 128
    if short >= sequence_len and "window_size" not in overrides:  # its S window is the whole context
        window_pattern = "L"
    n_heads, kv_heads = d_model // head_dim, kv_dim // head_dim
    hidden = state_dict["transformer.h.0.mlp.c_fc.weight"].shape[0]
    fields: dict[str, Any] = dict(  # None where the default says the same (configs compare equal)
        n_layers=len(layers), d_model=d_model, n_heads=n_heads, head_dim=head_dim,
        n_kv_heads=None if kv_heads == n_heads else kv_heads, vocab_size=vocab_size,
        context_length=sequence_len, mlp_hidden=None if hidden == 4 * d_model else hidden,
        window_pattern=window_pattern, window_size=short + 1 if "S" in window_pattern else None,
        residual_scalars="resid_lambdas" in state_dict, backout="backout_lambda" in state_dict)
    if any(k.startswith("value_embeds.") for k in state_dict):
        fields["value_path"] = "value-embed"
    fields.update(overrides)
    return ModelConfig.from_preset("pre-ln", "nanochat-d12", **fields)


def state_dict_from_nanochat(state_dict: Mapping[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """nanochat's weights under blocklab's names (module docstring for the two conversions)."""
    v, d = cfg.vocab_size, cfg.attention_shape.head_dim
    out: dict[str, Tensor] = {"tok_emb.weight": state_dict["transformer.wte.weight"][:v],
                              "head.weight": state_dict["lm_head.weight"][:v]}
    if "smear_gate.weight" in state_dict:
        out["smear.gate.weight"] = state_dict["smear_gate.weight"]
        out["smear.strength.gain"] = state_dict["smear_lambda"].reshape(1)
    if "backout_lambda" in state_dict:
        out["backout.strength.gain"] = state_dict["backout_lambda"].reshape(1)
    for i in range(cfg.n_layers):
        src, dst = f"transformer.h.{i}.", f"blocks.{i}."
        out[dst + "attn.q.weight"] = _flip_rotation(state_dict[src + "attn.c_q.weight"], d)
        out[dst + "attn.k.weight"] = _flip_rotation(state_dict[src + "attn.c_k.weight"], d)
        out[dst + "attn.values.w_v.weight"] = state_dict[src + "attn.c_v.weight"]
        out[dst + "attn.proj.weight"] = state_dict[src + "attn.c_proj.weight"]
        out[dst + "mlp.fc.weight"] = state_dict[src + "mlp.c_fc.weight"]
        out[dst + "mlp.out.weight"] = state_dict[src + "mlp.c_proj.weight"]
        if "resid_lambdas" in state_dict:
            out[dst + "residual.resid_lambda.gain"] = state_dict["resid_lambdas"][i].reshape(1)
            out[dst + "residual.x0_lambda.gain"] = state_dict["x0_lambdas"][i].reshape(1)
        if f"value_embeds.{i}.weight" in state_dict:
            out[dst + "attn.values.value_table"] = state_dict[f"value_embeds.{i}.weight"][:v]
            out[dst + "attn.values.gate.weight"] = state_dict[src + "attn.ve_gate.weight"]
    return out


def from_nanochat(state_dict: Mapping[str, Tensor], dtype: torch.dtype | None = None,
                  **config_fields: Any) -> LanguageModel:
    """A blocklab model with a nanochat state dict's weights (`config_from_nanochat` takes the
    `config_fields`); built in `dtype` (default: the weights' own, e.g. float32 master weights)."""
    state_dict = {k.removeprefix("_orig_mod."): t for k, t in state_dict.items()}  # a compiled model's keys
    cfg = config_from_nanochat(state_dict, **config_fields)
    dtype = dtype or state_dict["transformer.h.0.attn.c_q.weight"].dtype
    with torch.device("meta"):
        model = LanguageModel(cfg)
    model.to_empty(device="cpu").to(dtype)
    model.init_weights()  # buffers and anything the state dict lacks
    weights = state_dict_from_nanochat(state_dict, cfg)
    expected = set(model.state_dict())
    missing, unexpected = expected - set(weights), set(weights) - expected
    if missing or unexpected:
        raise ConfigError(f"the nanochat weights do not fit the model: missing {sorted(missing)[:5]}, "
                          f"unexpected {sorted(unexpected)[:5]}")
    model.load_state_dict({k: t.to(dtype) for k, t in weights.items()})
    return model
