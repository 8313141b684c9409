"""Import Hugging Face GPT-2 and Llama causal LMs as blocklab baselines with the same logits.

Both are Pre-LN blocks, Eq. (1) of Simplifying Transformer Blocks with alpha = beta = 1:

    X' = X + MHA(N1(X)),   out = X' + MLP(N2(X')),   logits = N(X_L) W_head^T

    GPT-2: learned positions, LayerNorm (with bias), MLP W_2 GELU_tanh(W_1 x), biases everywhere,
           tied head. HF's Conv1D computes y = x W + b, so its weight is (in, out): the transpose
           of torch's nn.Linear layout; c_attn packs [W_Q | W_K | W_V] along the output axis.
    Llama: RoPE (half-split, HF's rotate_half, frequencies theta^(-2i/D) = `positions.rotary`), RMSNorm
           w * x / sqrt(mean(x^2) + eps), SwiGLU MLP W_down (silu(W_gate x) * W_up x), grouped-query
           attention, optional biases, untied head by default.

Attention uses the scale 1/sqrt(d_head) in both (blocklab's default). Anything blocklab cannot
reproduce exactly (rope scaling, another activation, per-layer attention scaling ...) raises a
`ConfigError` naming the HF config field. Dropout is not carried over (pass ``dropout=...``).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from blocklab.interop import hf_files
from blocklab.model.config import ModelConfig
from blocklab.runtime import LanguageModel
from blocklab.util.errors import ConfigError

# HF activation name -> blocklab mlp_act, for GPT-2's plain MLP
_GPT2_ACTS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
              "relu2": "relu2"}


def _unsupported(model_type: str, field: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"cannot import a {model_type} checkpoint with {field} = {value!r}: blocklab "
                       f"supports {allowed}.")


# -- configs ------------------------------------------------------------------------------------
def _gpt2_fields(c) -> dict[str, Any]:
    act = c.activation_function
    if act not in _GPT2_ACTS:
        raise _unsupported("gpt2", "activation_function", act, f"one of {', '.join(map(repr, _GPT2_ACTS))}")
    if not getattr(c, "scale_attn_weights", True):
        raise _unsupported("gpt2", "scale_attn_weights", False, "True (scores divided by sqrt(d_head))")
    if getattr(c, "scale_attn_by_inverse_layer_idx", False):
        raise _unsupported("gpt2", "scale_attn_by_inverse_layer_idx", True, "False")
    if getattr(c, "add_cross_attention", False):
        raise _unsupported("gpt2", "add_cross_attention", True, "False (decoder-only models)")
    # reorder_and_upcast_attn only changes the precision of the scores, not what they are
    return dict(vocab_size=c.vocab_size, d_model=c.n_embd, n_layers=c.n_layer, n_heads=c.n_head,
                mlp_hidden=c.n_inner or 4 * c.n_embd, context_length=c.n_positions, norm="layernorm",
                norm_eps=float(c.layer_norm_epsilon), positions="learned", mlp_act=_GPT2_ACTS[act],
                bias=True, tie_embeddings=bool(getattr(c, "tie_word_embeddings", True)),
                init_std=float(c.initializer_range))


def _rope_theta(c) -> float:
    """theta of plain RoPE; transformers 5 keeps it in `rope_parameters`, 4.x in `rope_theta`."""
    params = getattr(c, "rope_parameters", None)
    if params is None:
        scaling = getattr(c, "rope_scaling", None)
        if scaling:
            raise _unsupported("llama", "rope_scaling", scaling, "None (plain RoPE)")
        return float(c.rope_theta)
    if "rope_theta" not in params:  # one dict per attention type (not a Llama layout)
        raise _unsupported("llama", "rope_parameters", params, "one set of plain RoPE parameters")
    kind = params.get("rope_type", "default")
    if kind != "default":
        raise _unsupported("llama", "rope_parameters['rope_type'] (rope scaling)", kind,
                           "'default' (plain RoPE)")
    return float(params["rope_theta"])


def _llama_fields(c) -> dict[str, Any]:
    if c.hidden_act != "silu":
        raise _unsupported("llama", "hidden_act", c.hidden_act, "'silu' (a SwiGLU MLP)")
    attn_bias, mlp_bias = bool(c.attention_bias), bool(getattr(c, "mlp_bias", False))
    if attn_bias != mlp_bias:
        raise _unsupported("llama", "attention_bias / mlp_bias", (attn_bias, mlp_bias),
                           "equal values (one `bias` switch for every linear map)")
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = c.num_key_value_heads or c.num_attention_heads
    return dict(vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                n_heads=c.num_attention_heads,
                n_kv_heads=None if kv_heads == c.num_attention_heads else kv_heads,
                head_dim=None if head_dim * c.num_attention_heads == c.hidden_size else head_dim,
                mlp_hidden=c.intermediate_size, context_length=c.max_position_embeddings,
                norm="rmsnorm", norm_eps=float(c.rms_norm_eps), positions="rope",
                rope_base=_rope_theta(c), mlp_act="swiglu", bias=attn_bias,
                tie_embeddings=bool(c.tie_word_embeddings), init_std=float(c.initializer_range))


_CONFIGS: dict[str, Callable[[Any], dict[str, Any]]] = {"gpt2": _gpt2_fields, "llama": _llama_fields}


def config_from_hf(hf_config, **overrides: Any) -> ModelConfig:
    """The blocklab Pre-LN `ModelConfig` of an HF `GPT2Config` or `LlamaConfig` (plus `overrides`)."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in _CONFIGS:
        raise ConfigError(f"cannot import an HF config with model_type = {model_type!r}: blocklab "
                          f"imports {', '.join(map(repr, _CONFIGS))}.")
    return ModelConfig(**{**_CONFIGS[model_type](hf_config), **overrides})


# -- weights ------------------------------------------------------------------------------------
class _Weights:
    """Takes HF tensors by name, so that an HF weight that nothing reads is an error, not a silent loss."""

    def __init__(self, state: dict[str, Tensor]):
        self.state, self.used = state, set()

    def __call__(self, name: str) -> Tensor:
        self.used.add(name)
        return self.state[name]

    def check_all_used(self, model_type: str) -> None:
        left = sorted(set(self.state) - self.used)
        if left:
            raise ConfigError(f"the {model_type} checkpoint has weights blocklab would drop: "
                              f"{', '.join(left[:8])}{' ...' if len(left) > 8 else ''}")


# blocklab name -> GPT-2 name within a block, and whether the weight is a Conv1D (stored transposed)
_GPT2_BLOCK = {"norm1": ("ln_1", False), "attn.proj": ("attn.c_proj", True), "norm2": ("ln_2", False),
               "mlp.fc": ("mlp.c_fc", True), "mlp.out": ("mlp.c_proj", True)}


def _gpt2_weights(w: _Weights, cfg: ModelConfig) -> dict[str, Tensor]:
    out = {"tok_emb.weight": w("transformer.wte.weight"), "pos_emb.weight": w("transformer.wpe.weight"),
           "norm.weight": w("transformer.ln_f.weight"), "norm.bias": w("transformer.ln_f.bias")}
    head = w("lm_head.weight")  # read either way: when tied it is wte itself
    if not cfg.tie_embeddings:
        out["head.weight"] = head
    for i in range(cfg.n_layers):
        h, b = f"transformer.h.{i}.", f"blocks.{i}."
        # Conv1D: y = x W + b with W (in, out), so nn.Linear's (out, in) weight is W^T
        for ours, (theirs, conv) in _GPT2_BLOCK.items():
            weight = w(h + theirs + ".weight")
            out[b + ours + ".weight"] = weight.t() if conv else weight
            out[b + ours + ".bias"] = w(h + theirs + ".bias")
        # c_attn packs [W_Q | W_K | W_V] along its output axis
        qkv, qkv_bias = w(h + "attn.c_attn.weight").t().chunk(3), w(h + "attn.c_attn.bias").chunk(3)
        for ours, weight, bias in zip(("attn.q", "attn.k", "attn.values.w_v"), qkv, qkv_bias, strict=True):
            out[b + ours + ".weight"], out[b + ours + ".bias"] = weight, bias
    return out


# blocklab name -> Llama name within a layer, for the tensors that map one to one (the gated MLP's
# fc holds [up; gate] in one matrix: silu(x W_gate) * (x W_up), split and joined by the callers)
LLAMA_NORMS = {"norm1": "input_layernorm", "norm2": "post_attention_layernorm"}
LLAMA_LINEARS = {"attn.q": "self_attn.q_proj", "attn.k": "self_attn.k_proj",
                 "attn.values.w_v": "self_attn.v_proj", "attn.proj": "self_attn.o_proj",
                 "mlp.out": "mlp.down_proj"}


def _llama_weights(w: _Weights, cfg: ModelConfig) -> dict[str, Tensor]:
    out = {"tok_emb.weight": w("model.embed_tokens.weight"), "norm.weight": w("model.norm.weight")}
    head = w("lm_head.weight") if "lm_head.weight" in w.state else None  # may be left out when tied
    if not cfg.tie_embeddings:
        out["head.weight"] = head
    suffixes = ("weight", "bias") if cfg.bias else ("weight",)
    for i in range(cfg.n_layers):
        h, b = f"model.layers.{i}.", f"blocks.{i}."
        for ours, theirs in LLAMA_NORMS.items():
            out[b + ours + ".weight"] = w(h + theirs + ".weight")
        for s in suffixes:
            for ours, theirs in LLAMA_LINEARS.items():
                out[b + ours + "." + s] = w(h + theirs + "." + s)
            out[b + "mlp.fc." + s] = torch.cat((w(h + "mlp.up_proj." + s), w(h + "mlp.gate_proj." + s)))
    return out


_WEIGHTS = {"gpt2": _gpt2_weights, "llama": _llama_weights}
_CLASSES = "GPT2LMHeadModel or LlamaForCausalLM"


def _check_folder(path: Path) -> None:
    """A blocklab-format export has no `model_type`: say how to load it instead of transformers' error.
    Then the checks that make a damaged or unusable checkpoint one error line (`hf_files`)."""

    try:
        data = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return  # transformers says what is missing
    if isinstance(data, dict) and "blocklab_format_version" in data:
        raise ConfigError(f"{path} is a blocklab export (format='blocklab'), not a Hugging Face checkpoint: "
                          f"load it with blocklab.interop.load_pretrained({str(path)!r}); "
                          "save_pretrained(model, folder, format='hf') writes one transformers can load.")
    if isinstance(data, dict):
        hf_files.check_config(path, data)
    hf_files.check_weight_files(path)


def _read_config(path: Path):
    """transformers' config of the folder; its validators' errors (a value the model cannot have) as
    one ConfigError naming config.json."""
    from transformers import AutoConfig

    invalid: tuple[type[Exception], ...] = (ValueError,)
    try:  # huggingface_hub >= 1.0 validates configs as strict dataclasses
        from huggingface_hub.errors import StrictDataclassError

        invalid += (StrictDataclassError,)
    except ImportError:
        pass
    try:
        return AutoConfig.from_pretrained(path, local_files_only=True)
    except invalid as err:
        lines = [line.strip().removeprefix("ValueError: ") for line in str(err).splitlines() if line.strip()]
        raise ConfigError(f"{path / 'config.json'} is not a config transformers accepts "
                          f"({lines[-1] if lines else type(err).__name__}): restore it from the checkpoint's "
                          "source.") from None


def _saved_dtype() -> dict[str, str]:
    """`from_pretrained` keyword that loads a folder in the dtype it was saved in, not float32 (the
    default before transformers 5): `dtype` since 4.56, `torch_dtype` before."""
    import transformers
    from packaging.version import Version

    old = Version(transformers.__version__) < Version("4.56")
    return {"torch_dtype" if old else "dtype": "auto"}


@contextlib.contextmanager
def _load_report_silenced():
    """transformers' warnings at error level while it loads: its load report (a table of missing,
    unexpected and mismatched weights) would come before blocklab's one error line saying the same."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def _load_hf(model_or_path) -> nn.Module:
    if isinstance(model_or_path, (str, os.PathLike)):
        path = Path(model_or_path)
        if not path.is_dir():
            raise FileNotFoundError(f"{path} is not a folder: from_hf reads a local folder written by "
                                    "save_pretrained (download hub checkpoints first).")
        _check_folder(path)
        try:
            from transformers import AutoModelForCausalLM
        except ImportError as e:  # an optional dependency
            raise ImportError("from_hf needs transformers: pip install 'blocklab[hf]'") from e
        from blocklab.interop import hf_model  # registers model_type "blocklab": no remote code runs

        config = _read_config(path)
        blocklab_type = isinstance(config, hf_model.BlocklabConfig)
        cls = hf_model.model_class(config) if blocklab_type else AutoModelForCausalLM
        # a weight of another shape is reported in `info` (and refused below), not raised as a RuntimeError
        with _load_report_silenced():  # _check_loading_info says what it would, in one line
            model, info = cls.from_pretrained(path, local_files_only=True, output_loading_info=True,
                                              ignore_mismatched_sizes=True, **_saved_dtype())
        info["mismatched_keys"] = _with_shapes(path, model, info.get("mismatched_keys") or [])
        _check_loading_info(path, config.model_type, info)
        return model
    if not (isinstance(model_or_path, nn.Module) and hasattr(model_or_path, "config")):
        raise TypeError(f"from_hf takes an HF {_CLASSES} or a folder path, "
                        f"got {type(model_or_path).__name__}")
    return model_or_path


def _with_shapes(path: Path, model: nn.Module, keys: list) -> list:
    """Mismatched weights as (name, shape in the file, shape the config gives): transformers 5 reports
    them so, 4.x by name alone, whose shapes are read here from the safetensors headers and the model."""
    if all(isinstance(k, tuple) for k in keys):
        return keys
    in_files = hf_files.tensor_shapes(path)
    state = model.state_dict()
    return [(k, in_files[k], list(state[k].shape)) if isinstance(k, str) and k in in_files and k in state
            else k for k in keys]


def _key_text(key) -> str:
    """A loading-info key: a name, or (name, checkpoint shape, model shape) for a mismatched one."""
    if isinstance(key, tuple) and len(key) == 3:
        name, theirs, ours = key
        return f"{name} ({'x'.join(map(str, theirs))} in the file, {'x'.join(map(str, ours))} by the config)"
    return str(key)


def _names(keys) -> str:
    keys = sorted(map(_key_text, keys))
    return ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")


def _check_loading_info(path: Path, model_type: str, info: dict[str, Any]) -> None:
    """Refuse a checkpoint whose files lack weights the model has (transformers fills those at random,
    with a log line at most), hold weights it has no place for (dropped), or weights of another shape,
    naming them: a model read from a checkpoint is that checkpoint's, whole."""
    problems = [f"{what}: {_names(info[key])}" for key, what in (
        ("missing_keys", "missing weights, which would be filled at random"),
        ("unexpected_keys", "weights the model has no place for, which would be dropped"),
        ("mismatched_keys", "weights of another shape than the config gives"),
        ("conversion_errors", "weights transformers could not convert"),
        ("error_msgs", "errors while loading"))
        if info.get(key)]
    if problems:
        raise ConfigError(f"cannot read the {model_type} checkpoint {str(path)!r}: {'; '.join(problems)}. "
                          "Its weight files do not match its config.json: restore them from the checkpoint's "
                          "source.")


def _built(cfg: ModelConfig, state: dict[str, Tensor], like: Tensor) -> LanguageModel:
    """A `LanguageModel` of `cfg` holding copies of `state`, in the dtype and on the device of `like`."""
    with torch.device("meta"):  # built in the weights' own dtype: float64 is never rounded via float32
        model = LanguageModel(cfg)
    model = model.to_empty(device=like.device).to(like.dtype)
    model.init_weights()  # the buffers; every parameter is then loaded
    model.load_state_dict(state, strict=True)  # copies, so the two models never share storage
    return model


def from_hf(model_or_path, **overrides: Any) -> LanguageModel:
    """A blocklab `LanguageModel` with the weights of an HF GPT-2 or Llama causal LM, or of any blocklab
    model behind HF's classes (`BlocklabForCausalLM` / `BlocklabForMaskedLM`).

    `model_or_path` is such a model in memory or a local folder written by its ``save_pretrained``
    (or blocklab's ``save_pretrained(..., format="hf")``). The result has the HF weights' dtype and
    device and gives the same logits; `overrides` set other `ModelConfig` fields (e.g. ``dropout``).
    """
    hf = _load_hf(model_or_path)
    if hf.config.model_type == "blocklab":  # a blocklab model behind HF's classes (interop/hf_model.py)
        return _built(hf.model.cfg.replace(**overrides), hf.model.state_dict(), hf.model.tok_emb.weight)
    if hf.get_output_embeddings() is None:
        raise TypeError(f"{type(hf).__name__} has no LM head: pass the causal-LM class ({_CLASSES}).")
    cfg = config_from_hf(hf.config, **overrides)
    weights = _Weights(hf.state_dict())
    state = _WEIGHTS[hf.config.model_type](weights, cfg)
    weights.check_all_used(hf.config.model_type)
    return _built(cfg, state, next(hf.parameters()))
