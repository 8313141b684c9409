"""Checks run on every `ModelConfig`: each failure names the field, the value and what is allowed.

It sits above the model's components (the value-path checks read their registry) and below
`ModelConfig` (model/config.py), which runs `validate` on construction; it reads the fields through
`ModelFields` (model/fields.py).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, get_args

from blocklab.errors import ConfigError
from blocklab.model.fields import CHOICES
from blocklab.model.trunk import SMEAR_CHANNELS
from blocklab.model.value_paths import validate_value_path, value_path_class

if TYPE_CHECKING:
    from blocklab.model.fields import ModelFields

def _fail(name: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"ModelConfig.{name} = {value!r} is not allowed: {allowed}")


def _choice(cfg: ModelFields, name: str) -> None:
    """A choice field holds one of the values of its `Literal` type (model/fields.py)."""
    value, choices = getattr(cfg, name), get_args(CHOICES[name])
    if value not in choices:
        _fail(name, value, f"choose one of {', '.join(map(repr, choices))}.")


def _positive(cfg: ModelFields, name: str, optional: bool = False) -> None:
    value = getattr(cfg, name)
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        _fail(name, value, "it must be a positive integer" + (" or None." if optional else "."))


_TYPES = {"int": ((int,), "an integer"), "float": ((int, float), "a number"),
          "bool": ((bool,), "True or False"), "str": ((str,), "a string"),
          "dict[str, Any]": ((dict,), "a dict")}


def _fields(cfg: ModelFields) -> tuple[dataclasses.Field, ...]:
    # mypy sees no dataclass through config_dataclass
    return dataclasses.fields(cfg)  # type: ignore[arg-type]


def _check_types(cfg: ModelFields) -> None:
    """Each field holds a value of its annotated type (ints pass for floats, bools never pass for numbers)."""
    for f in _fields(cfg):
        kind, _, optional = f.type.partition(" | ")
        kind = "str" if f.name in CHOICES else kind  # a Literal of strings (checked by `_choice`)
        value = getattr(cfg, f.name)
        if value is None and optional == "None":
            continue
        wanted, words = _TYPES[kind]
        if not isinstance(value, wanted) or (isinstance(value, bool) and bool not in wanted):
            _fail(f.name, value, f"it must be {words}" + (" or None." if optional else "."))


def _check_trunk(cfg: ModelFields) -> None:
    """nanochat's trunk fields (model/trunk.py)."""
    if cfg.attn_logit_scale <= 0:
        _fail("attn_logit_scale", cfg.attn_logit_scale, "it must be > 0 (1 is the usual 1/sqrt(d_h)).")
    if cfg.smear and cfg.d_model < SMEAR_CHANNELS:
        _fail("smear", cfg.smear, f"the smear gate reads the first {SMEAR_CHANNELS} channels: it needs "
              f"d_model >= {SMEAR_CHANNELS} (d_model={cfg.d_model}).")
    if cfg.smear and not cfg.causal:
        _fail("smear", cfg.smear, "it mixes in the previous token, which only a causal model reads in order; "
              "set causal=True or smear=False.")
    if cfg.backout and cfg.n_layers < 2:
        _fail("backout", cfg.backout, "it subtracts the output of block n_layers // 2, which needs "
              "n_layers >= 2.")
    if cfg.init_scheme == "nanochat" and cfg.tie_embeddings:
        _fail("init_scheme", cfg.init_scheme, "nanochat's init gives the embedding std 0.8 and the head "
              "std 0.001, which one tied matrix cannot have; set tie_embeddings=False.")


def validate(cfg: ModelFields) -> None:
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "context_length"):
        _positive(cfg, name)
    for name in ("n_kv_heads", "head_dim", "mlp_hidden", "window_size"):
        _positive(cfg, name, optional=True)
    _check_types(cfg)
    for name in CHOICES:
        if not (name == "first_value_form" and cfg.first_value_form is None):
            _choice(cfg, name)
    if cfg.qk_bias and cfg.bias:
        _fail("qk_bias", cfg.qk_bias, "it gives Q and K alone a bias, and bias=True already gives every "
              "linear map one; set one of the two.")
    if cfg.rmsnorm_eps == "outside" and (cfg.norm != "rmsnorm" or cfg.norm_eps is None):
        _fail("rmsnorm_eps", cfg.rmsnorm_eps, "eps outside the root applies to norm='rmsnorm' with a "
              "numeric norm_eps.")

    if cfg.head_dim is None and cfg.d_model % cfg.n_heads:
        _fail("d_model", cfg.d_model,
              f"it must be divisible by n_heads={cfg.n_heads} (or set head_dim explicitly).")
    shape = cfg.attention_shape
    if shape.n_kv_heads > cfg.n_heads or cfg.n_heads % shape.n_kv_heads:
        _fail("n_kv_heads", cfg.n_kv_heads,
              f"it must divide n_heads={cfg.n_heads} (grouped-query attention).")
    if cfg.positions == "rope" and shape.head_dim % 2:
        _fail("head_dim", shape.head_dim, "rotary positions need an even head size.")
    if cfg.positions == "sinusoidal" and cfg.d_model % 2:
        _fail("d_model", cfg.d_model, "sinusoidal positions need an even d_model.")
    if cfg.norm_eps is None and cfg.norm == "layernorm":
        _fail("norm_eps", None, "None (the dtype's epsilon) is for RMSNorm; LayerNorm needs a number "
              "such as 1e-5.")
    if cfg.norm_eps is not None and cfg.norm_eps <= 0:
        _fail("norm_eps", cfg.norm_eps, "it must be > 0 (or None for RMSNorm: the dtype's epsilon).")
    _check_trunk(cfg)
    if cfg.embed_init_std is not None and cfg.init_scheme != "normal":
        _fail("embed_init_std", cfg.embed_init_std, f"init_scheme={cfg.init_scheme!r} sets the embedding's "
              "own init; embed_init_std applies to init_scheme='normal' (or leave it None).")
    if not cfg.embed_scale > 0 or cfg.embed_scale == float("inf"):
        _fail("embed_scale", cfg.embed_scale, "it must be a finite number > 0 (1 is plain; Vaswani et al. "
              "use sqrt(d_model)).")
    for name in ("init_std", "query_init_std", "embed_init_std"):
        if getattr(cfg, name) is not None and getattr(cfg, name) < 0:
            _fail(name, getattr(cfg, name), "a standard deviation must be >= 0.")
    if cfg.rope_base <= 0:
        _fail("rope_base", cfg.rope_base, "the rotary base must be > 0 (10000 is usual).")
    if not 0.0 <= cfg.dropout < 1.0:
        _fail("dropout", cfg.dropout, "it must lie in [0, 1).")
    if cfg.logit_softcap is not None and cfg.logit_softcap <= 0:
        _fail("logit_softcap", cfg.logit_softcap, "it must be > 0 or None.")
    if cfg.leaky_relu_slope < 0:
        _fail("leaky_relu_slope", cfg.leaky_relu_slope, "the negative-side slope must be >= 0 (0 is ReLU).")
    for f in _fields(cfg):  # a NaN or infinite gain, eps or std would poison every step
        value = getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            _fail(f.name, value, "it must be a finite number.")
    _check_windows(cfg)
    _check_layout_and_forms(cfg)
    validate_value_path(cfg)
    if cfg.reparam_tie != "none":  # after the value path's options are known to be valid
        bare = [i for i in range(cfg.n_layers) if not value_path_class(cfg).has_value_map(cfg, i)]
        if bare:
            _fail("reparam_tie", cfg.reparam_tie,
                  f"it ties W_P,init to the layers' W_V,init, but value_path={cfg.value_path!r} has no W_V "
                  f"in layers {bare} (0-based); use reparam_tie='none' with this value path.")


def _check_windows(cfg: ModelFields) -> None:
    """Sliding windows: the pattern, and a window size exactly when some layer uses it."""
    if not cfg.window_pattern or set(cfg.window_pattern) - {"S", "L"}:
        _fail("window_pattern", cfg.window_pattern,
              "use a non-empty string of 'S' (sliding window) and 'L' (full context), e.g. 'SSSL'.")
    if "S" in cfg.window_pattern and cfg.window_size is None:
        _fail("window_size", None, f"window_pattern={cfg.window_pattern!r} has 'S' layers; set window_size.")
    if cfg.window_size is not None and "S" not in cfg.window_pattern:
        _fail("window_size", cfg.window_size, f"no layer would use it: window_pattern={cfg.window_pattern!r} "
              "has no 'S' (sliding-window) layers; set a pattern such as 'SSSL', or window_size=None.")
    if cfg.window_size is not None and cfg.window_size > cfg.context_length:
        _fail("window_size", cfg.window_size,
              f"a window cannot be larger than the context (context_length={cfg.context_length}).")


def _check_layout_and_forms(cfg: ModelFields) -> None:
    """Block layouts, and the value and projection forms (identity and reparameterised maps)."""
    if cfg.block_layout == "parallel" and cfg.attn_skip_gain != 0:
        _fail("attn_skip_gain", cfg.attn_skip_gain,
              "a parallel block has a single skip, alpha_comb = mlp_skip_gain (Eq. 7); set attn_skip_gain=0.")
    if cfg.block_layout == "post-ln" and cfg.norm == "none":
        _fail("norm", cfg.norm, "a post-LN block needs a norm ('layernorm' or 'rmsnorm').")

    shape = cfg.attention_shape
    square = shape.q_dim == cfg.d_model
    forms = {"value_form": cfg.value_form, "first_value_form": cfg.first_value_form,
             "proj_form": cfg.proj_form}
    for name, form in forms.items():
        if form in ("identity", "reparam"):
            if not square:
                _fail(name, form, "identity and reparameterised maps need n_heads * head_dim == d_model.")
            if name != "proj_form" and shape.n_kv_heads != shape.n_heads:
                _fail(name, form, "identity or reparameterised values need n_kv_heads == n_heads "
                      "(a grouped-query value is narrower than d_model).")
    if cfg.reparam_tie != "none":
        every_value = {cfg.value_form, cfg.first_value_form or cfg.value_form}
        if every_value != {"reparam"} or cfg.proj_form != "reparam" or cfg.reparam_init != "orthogonal":
            _fail("reparam_tie", cfg.reparam_tie,
                  "tied initialisations need value_form, first_value_form and proj_form all 'reparam' "
                  "with reparam_init='orthogonal'.")
