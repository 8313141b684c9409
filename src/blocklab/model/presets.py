"""Architecture and size presets: names for sets of `ModelConfig` field overrides.

An architecture name is a block preset, optionally joined with a value path by ``+``:
``"sas-p"``, ``"pre-ln+resformer"``. A bare value-path name means ``pre-ln+<value path>``.

The presets belong to the model's definition, as a model's named flavours do in torchtitan: they are
plain data over the value-path registry's names, and `ModelConfig.from_preset` (model/config.py, above
this module) reads `resolve`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from blocklab.model.value_paths import VALUE_PATHS
from blocklab.util.errors import ConfigError


@dataclass(frozen=True)
class Preset:
    description: str
    fields: dict[str, Any]
    reference: str = ""


# Shared by the skipless presets: SAS attention sub-block, Eqs. (12)/(13) of Simplifying.
_SAS = dict(
    attn_skip_gain=0.0,
    attn_matrix="shaped",
    attn_alpha=1.0, attn_beta=1.0, attn_gamma=1.0,
    trainable_attn_gains=True,
    headwise_gains=True,
    query_init_std=0.0,
    value_form="identity",
    first_value_form="reparam",
    reparam_init="identity",
    value_skip_gain=1.0, value_resid_gain=1.0,
    trainable_reparam_gains=True,
    proj_form="identity",
    mlp_skip_gain=1.0, mlp_branch_gain=0.1,
    trainable_block_gains=True,
)

BLOCK_PRESETS: dict[str, Preset] = {
    "pre-ln": Preset("Pre-LN block, alpha = beta = 1", {}, "Simplifying Eq. (1)"),
    "post-ln": Preset("the original Post-LN Transformer block",
                      dict(block_layout="post-ln", final_norm=False), "Vaswani et al. 2017"),
    "parallel": Preset("parallel attention and MLP (GPT-J), one skip",
                       dict(block_layout="parallel", attn_skip_gain=0.0), "Simplifying Eq. (7)"),
    "v-skipinit": Preset(
        "no attention skip; attention matrix alpha I + beta A (alpha=1, beta=0 at init)",
        dict(attn_skip_gain=0.0, attn_matrix="skipinit", attn_alpha=1.0, attn_beta=0.0,
             trainable_attn_gains=True, mlp_branch_gain=0.1, trainable_block_gains=True),
        "Simplifying Eq. (4); He et al. 2023"),
    "shaped": Preset(
        "Pre-LN with shaped attention alpha I + beta A - gamma C",
        dict(attn_matrix="shaped", trainable_attn_gains=True, query_init_std=0.0),
        "Simplifying Eq. (5); Noci et al. 2023"),
    "sas": Preset("skipless simplified attention sub-block (SAS), sequential", dict(_SAS),
                  "Simplifying Eqs. (12)-(13), Fig. 9"),
    "sas-p": Preset("SAS in parallel form with no skips (SAS-P)",
                    dict(_SAS, block_layout="parallel", mlp_skip_gain=0.0),
                    "Simplifying Fig. 10"),
    "sas-p-nonorm": Preset(
        "SAS-P without norms (layer 0 keeps its input norm; the final norm stays)",
        dict(_SAS, block_layout="parallel", mlp_skip_gain=0.0, norm_layers="first"),
        "Simplifying Sec. 4.4"),
}

_CODEPARROT = dict(d_model=768, n_heads=12, mlp_act="relu", mlp_hidden=3072, norm="rmsnorm",
                   positions="sinusoidal", context_length=128, vocab_size=50257, tie_embeddings=True)
_LLAMA = dict(mlp_act="swiglu", positions="rope", rope_base=10000.0, norm="rmsnorm",
              tie_embeddings=False, vocab_size=50277, context_length=2048)
# nanochat's shape. Its short window (512, 0) is 512 keys to the left plus the token itself; our
# window_size counts the token, so 513.
_NANOCHAT_SHAPE = dict(vocab_size=32768, head_dim=128, mlp_act="relu2", positions="rope",
                       rope_base=100000.0, norm="rmsnorm", qk_norm=True, tie_embeddings=False,
                       context_length=2048, window_size=513, window_pattern="SSSL", logit_softcap=15.0)
# nanochat's trunk as Bank of Values trains it (its `gpt_base`): parameter-free RMSNorm with the
# dtype's eps, a normed embedding, the smear, q and k x 1.2 after QK-norm, nanochat's init. Upstream
# nanochat's GPT adds per-layer residual scalars, a backout and value embeddings (README).
_NANOCHAT = dict(_NANOCHAT_SHAPE, norm_affine=False, norm_eps=None, embed_norm=True, smear=True,
                 attn_logit_scale=1.2 ** 2, init_scheme="nanochat")

# Our CPU sizes: the codeparrot shape (ReLU MLP, RMSNorm, tied embeddings) with rotary positions.
# Sinusoidal positions added unscaled (RMS 0.71) to N(0, 0.02) token embeddings drown the token's
# identity, and a 400-step run sat on the unigram plateau for 150 steps and ended 1.3 nats behind RoPE
# (benchmarks/baseline_grid.py; docs/design.md, "The CPU sizes' recipe").
_CPU = dict(_CODEPARROT, positions="rope")

SIZE_PRESETS: dict[str, Preset] = {
    "tiny": Preset("4 layers, d 128, 4 heads, RoPE, context 128, vocab 4096: trains in minutes on a CPU",
                   dict(_CPU, n_layers=4, d_model=128, n_heads=4, mlp_hidden=512, vocab_size=4096)),
    "small": Preset("6 layers, d 256, 4 heads, RoPE, context 256, vocab 8192: a mid size for CPU benchmarks",
                    dict(_CPU, n_layers=6, d_model=256, n_heads=4, mlp_hidden=1024,
                         vocab_size=8192, context_length=256)),
    "codeparrot-18l": Preset("18 layers, d 768, ReLU MLP 3072, RMSNorm, sinusoidal, context 128 "
                             "(Pre-LN ~167M, SAS ~146M); the SAS code's Q/K biases and RMSNorm eps outside "
                             "the root", dict(_CODEPARROT, n_layers=18, qk_bias=True, rmsnorm_eps="outside"),
                             "Simplifying Sec. 4"),
    "resformer-82m": Preset("Llama-like 8 layers, d 512, 8 heads, SwiGLU 1792 (82M)",
                            dict(_LLAMA, n_layers=8, d_model=512, n_heads=8, mlp_hidden=1792),
                            "Value Residual Learning Table 4"),
    "resformer-180m": Preset("Llama-like 12 layers, d 768, 12 heads, SwiGLU 2688 (180M)",
                             dict(_LLAMA, n_layers=12, d_model=768, n_heads=12, mlp_hidden=2688),
                             "Value Residual Learning Table 4"),
    "resformer-468m": Preset("Llama-like 24 layers, d 1024, 16 heads, SwiGLU 3584 (468M)",
                             dict(_LLAMA, n_layers=24, d_model=1024, n_heads=16, mlp_hidden=3584),
                             "Value Residual Learning Table 4"),
    "nanochat-d12": Preset("nanochat's model (Bank of Values' trunk): 12 layers, d 768, 6 heads of 128, "
                           "ReLU^2, SSSL windows, smear, nanochat init (135.3M)",
                           dict(_NANOCHAT, n_layers=12, d_model=768, n_heads=6),
                           "Bank of Values Table 8"),
    "nanochat-d24": Preset("nanochat's model (Bank of Values' trunk): 24 layers, d 1536, 12 heads of 128 "
                           "(780.1M)", dict(_NANOCHAT, n_layers=24, d_model=1536, n_heads=12),
                           "Bank of Values Table 8"),
    "nanochat-tiny": Preset("nanochat's trunk at CPU size: 4 layers, d 128, 4 heads of 32, context 128, "
                            "no windows", dict(_NANOCHAT, n_layers=4, d_model=128, n_heads=4, head_dim=32,
                                               mlp_hidden=512, vocab_size=4096, context_length=128,
                                               window_size=None, window_pattern="L")),
    "nanochat-shape-d12": Preset("nanochat's d12 shape with blocklab's default trunk (learned norms, "
                                 "N(0, 0.02) init, no smear): nanochat-d12 without nanochat's trunk",
                                 dict(_NANOCHAT_SHAPE, n_layers=12, d_model=768, n_heads=6)),
    "crammed-bert": Preset("encoder: 16 layers, d 768, 12 heads, GEGLU MLP, LayerNorm eps 1e-12, "
                           "vocab 32768, context 128", dict(
                               n_layers=16, d_model=768, n_heads=12, mlp_act="geglu", mlp_hidden=1536,
                               norm="layernorm", norm_eps=1e-12, vocab_size=32768, context_length=128,
                               positions="sinusoidal", causal=False, tie_embeddings=True),
                           "Geiping & Goldstein 2023; Simplifying Sec. 5"),
}


def _unknown(kind: str, name: str, known: list[str], hint: str = "") -> ConfigError:
    close = difflib.get_close_matches(name, known, n=3)
    suggestion = f" Did you mean {', '.join(close)}?" if close else ""
    return ConfigError(f"unknown {kind} {name!r}.{suggestion} Known: {', '.join(known)}.{hint} "
                       "`blocklab presets` lists them with descriptions.")


def split_arch(arch: str) -> tuple[str, str | None]:
    """``"sas-p+bov"`` -> ("sas-p", "bov"); ``"resformer"`` -> ("pre-ln", "resformer")."""
    block, _, value_path = arch.partition("+")
    if not value_path and block not in BLOCK_PRESETS and block in VALUE_PATHS:
        return "pre-ln", block
    return block, value_path or None


def resolve(arch: str, size: str) -> dict[str, Any]:
    """The field overrides of a size preset followed by an architecture preset."""
    if size not in SIZE_PRESETS:
        raise _unknown("size preset", size, list(SIZE_PRESETS))
    block, value_path = split_arch(arch)
    if block in VALUE_PATHS and value_path is not None:  # "bov+bov": a value path where a block goes
        raise ConfigError(f"architecture {arch!r} is not allowed: {block!r} is a value path, and the part "
                          f"before + must be a block preset ({', '.join(BLOCK_PRESETS)}), e.g. "
                          f"pre-ln+{value_path}.")
    if block not in BLOCK_PRESETS:
        paths = [p for p in VALUE_PATHS if p != "standard"]
        raise _unknown("architecture", block, [*BLOCK_PRESETS, *paths],
                       " An architecture is a block preset, a value path (on pre-ln) or both joined by "
                       "+, e.g. sas-p+bov.")
    if value_path is not None and value_path not in VALUE_PATHS:
        raise _unknown("value path", value_path, list(VALUE_PATHS), f" (in {arch!r})")
    fields = dict(SIZE_PRESETS[size].fields)
    fields.update(BLOCK_PRESETS[block].fields)
    if value_path is not None:
        fields["value_path"] = value_path
    return fields


def list_presets() -> dict[str, dict[str, str]]:
    """Every architecture, value-path and size preset with a one-line description."""
    return {
        "architectures": {k: f"{p.description} [{p.reference}]" for k, p in BLOCK_PRESETS.items()},
        "value_paths": {k: cls.description for k, cls in VALUE_PATHS.items()},
        "sizes": {k: p.description for k, p in SIZE_PRESETS.items()},
    }

