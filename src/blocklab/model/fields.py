"""`ModelFields`: the flat fields that describe every model blocklab builds, the views of them each
component reads, and the rules between the fields alone.

The fields are grouped by the paper concept they control (sizes, components, block layout,
attention-matrix form, value/projection form, value path). This is the bottom of the model's config:
every component reads its fields from here (a block and a value path take a `ModelFields`; a norm its
`norm_shape`). Sizes with a default (None) are read resolved, one name per concept, through
`attention_shape` and `mlp_shape`; the norms read `norm_shape`, which the norm owns with its rules
(model/norms.py).

A `ModelFields` checks, on construction, each field against its annotated type
(`blocklab.util.configbase.check_types`) and the rules between fields below (`check_field_rules`).
The model's config, `blocklab.model.config.ModelConfig`, is this class with the rules of the
components that need their classes (the block layout's and the value path's) and the named presets;
it is what everyone builds, and what the error messages name.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from blocklab.model.norms import Norm, NormShape, RMSNormEps
from blocklab.model.trunk import SMEAR_CHANNELS
from blocklab.util.configbase import ConfigBase, check_types, config_dataclass, field_error

# The choices of the choice fields: mypy checks them where the code reads a field, and `check_types`
# reads the allowed values from these same types.
NormLayers = Literal["all", "first"]
Positions = Literal["learned", "sinusoidal", "rope", "none"]
MLPAct = Literal["relu", "gelu", "gelu_tanh", "relu2", "leaky_relu", "swiglu", "geglu"]  # gelu_tanh: GPT-2
InitScheme = Literal["normal", "nanochat"]
BlockLayout = str  # a name of model/block.py's `BLOCK_LAYOUTS`: "pre-ln", "post-ln", "parallel"
AttnMatrix = Literal["softmax", "skipinit", "shaped"]
LinearForm = Literal["linear", "identity", "reparam"]
ReparamInit = Literal["identity", "orthogonal"]
ReparamTie = Literal["none", "all-tied", "ll-tied"]


@dataclass(frozen=True)
class AttentionShape:
    """The attention's sizes with every default resolved (`ModelConfig.attention_shape`): what the
    projections, the value paths and the KV cache are built from."""

    d_model: int
    n_heads: int  # query heads
    n_kv_heads: int  # key and value heads: n_heads, or fewer for grouped-query attention
    head_dim: int  # width of one head

    @property
    def q_dim(self) -> int:
        """The width of all query heads (the input of the output projection W^O)."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """The width of K and of V: what a layer's value projection gives and the cache keeps."""
        return self.n_kv_heads * self.head_dim


@dataclass(frozen=True)
class MLPShape:
    """The MLP's sizes and form with every default resolved (`ModelConfig.mlp_shape`)."""

    d_model: int
    hidden: int  # the hidden width (for GLU MLPs the gated width)
    act: MLPAct
    bias: bool
    leaky_relu_slope: float  # for act="leaky_relu"


@config_dataclass
class ModelFields(ConfigBase):
    # -- sizes ---------------------------------------------------------------------------------
    vocab_size: int = 50257
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    # the three below: None is the default size; components read them resolved, through
    # `attention_shape` and `mlp_shape`
    n_kv_heads: int | None = None  # None: n_heads; fewer gives grouped-query attention
    head_dim: int | None = None  # None: d_model // n_heads
    mlp_hidden: int | None = None  # None: 4 * d_model (for GLU MLPs: the gated width)
    context_length: int = 1024
    # -- task ----------------------------------------------------------------------------------
    causal: bool = True  # False: bidirectional encoder (masked LM)
    # -- components ----------------------------------------------------------------------------
    norm: Norm = "layernorm"
    norm_eps: float | None = 1e-5  # None: the dtype's machine epsilon (RMSNorm only; nanochat)
    rmsnorm_eps: RMSNormEps = "inside"  # inside: x / sqrt(ms + eps) (torch); outside: x / (sqrt(ms) + eps)
    norm_layers: NormLayers = "all"  # "first": only block 0 keeps its input norm (SAS-P without norms)
    final_norm: bool = True
    qk_norm: bool = False  # parameter-free RMSNorm on queries and keys (nanochat)
    positions: Positions = "learned"
    rope_base: float = 10000.0
    mlp_act: MLPAct = "gelu"
    leaky_relu_slope: float = 0.0  # only for mlp_act="leaky_relu" (the skipless-MLP ablation)
    tie_embeddings: bool = True
    bias: bool = False
    qk_bias: bool = False  # biases on the Q and K projections only (Simplifying's code)
    window_size: int | None = None  # keys a sliding-window ("S") layer sees, itself included
    window_pattern: str = "L"  # tiled over layers, e.g. "SSSL"; the last layer is always "L"
    logit_softcap: float | None = None  # softcap * tanh(z / softcap) on the logits (nanochat)
    init_std: float = 0.02
    embed_init_std: float | None = None  # None: init_std; the token embedding's N(0, std) init
    embed_scale: float = 1.0  # x = embed_scale * E[id] (+ positions); Vaswani et al.: sqrt(d_model)
    dropout: float = 0.0
    # -- nanochat's trunk (the Bank of Values set-up; model/trunk.py, model/init_schemes.py) --------
    norm_affine: bool = True  # False: no learnable scale or shift in any norm (nanochat)
    embed_norm: bool = False  # x0 = Norm(embedding) before the first block (Bank of Values Sec. 2)
    attn_logit_scale: float = 1.0  # logits s q.k / sqrt(d_h); nanochat: q and k x 1.2 each, 1.44
    smear: bool = False  # x_t += lambda_s sigmoid(W_s x_t[:24]) x_{t-1} on the embeddings
    residual_scalars: bool = False  # x <- lambda_r,i x + lambda_0,i x0 before block i
    backout: bool = False  # x <- x - lambda_b x_{L/2} before the final norm
    init_scheme: InitScheme = "normal"  # normal: N(0, init_std) weights; nanochat: nanochat's init
    # -- block layout and skip/branch gains (Simplifying Transformer Blocks, Eqs. 1 and 7) -------
    block_layout: BlockLayout = "pre-ln"
    attn_skip_gain: float = 1.0  # alpha_SA; 0 removes the attention skip
    attn_branch_gain: float = 1.0  # beta_SA
    mlp_skip_gain: float = 1.0  # alpha_FF (alpha_comb in the parallel layout); 0 removes it
    mlp_branch_gain: float = 1.0  # beta_FF
    trainable_block_gains: bool = False
    # -- attention-matrix form (Eqs. 2, 4, 5) -------------------------------------------------
    attn_matrix: AttnMatrix = "softmax"  # softmax: A; skipinit: aI + bA; shaped: aI + bA - gC
    attn_alpha: float = 1.0
    attn_beta: float = 1.0
    attn_gamma: float = 1.0
    trainable_attn_gains: bool = False
    headwise_gains: bool = True  # one alpha, beta, gamma per head (else one per layer)
    query_init_std: float | None = None  # None: init_std; 0 zeros W_Q so that A = C at init
    # -- value and projection form (Eq. 6) ----------------------------------------------------
    value_form: LinearForm = "linear"  # linear | identity | reparam (W = a*W_init + b*dW)
    first_value_form: LinearForm | None = None  # None: value_form (SAS keeps a trainable W_V in layer 0)
    proj_form: LinearForm = "linear"
    reparam_init: ReparamInit = "orthogonal"  # W_init: identity or random orthogonal (a frozen buffer)
    reparam_tie: ReparamTie = "none"  # none | all-tied (W_P,init = W_V,init^T) | ll-tied (Fig. 14)
    value_skip_gain: float = 1.0  # alpha_V
    value_resid_gain: float = 1.0  # beta_V
    proj_skip_gain: float = 1.0  # alpha_P
    proj_resid_gain: float = 1.0  # beta_P
    trainable_reparam_gains: bool = False
    # -- value path (Value Residual Learning, Bank of Values) ----------------------------------
    value_path: str = "standard"  # a name of the value-path registry (model/value_paths/__init__.py)
    value_path_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_field_rules(self)

    # -- the components' resolved sizes -----------------------------------------------------------
    @property
    def attention_shape(self) -> AttentionShape:
        return AttentionShape(self.d_model, self.n_heads, self.n_kv_heads or self.n_heads,
                              self.head_dim or self.d_model // self.n_heads)

    @property
    def norm_shape(self) -> NormShape:
        return NormShape(self.norm, self.d_model, self.norm_eps, self.rmsnorm_eps == "outside", self.bias,
                         self.norm_affine)

    @property
    def mlp_shape(self) -> MLPShape:
        return MLPShape(self.d_model, self.mlp_hidden or 4 * self.d_model, self.mlp_act, self.bias,
                        self.leaky_relu_slope)

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of `layer`, or None for full context (the last layer is always full)."""
        if self.window_size is None or layer == self.n_layers - 1:
            return None
        kind = self.window_pattern[layer % len(self.window_pattern)]
        return self.window_size if kind == "S" else None

    def value_form_of(self, layer: int) -> LinearForm:
        return self.first_value_form if (layer == 0 and self.first_value_form) else self.value_form


# -- the checks: each failure names the field, the value and what is allowed ------------------------
def _fail(name: str, value: Any, allowed: str) -> None:
    """The ConfigError for field `name`, under the name users build: ``ModelConfig.<name> = ...``."""
    raise field_error("ModelConfig", name, value, allowed)


def _positive(cfg: ModelFields, name: str, optional: bool = False) -> None:
    value = getattr(cfg, name)
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        _fail(name, value, "it must be a positive integer" + (" or None." if optional else "."))


def check_field_rules(cfg: ModelFields) -> None:
    """Every check of the fields alone; the block layout's and the value path's are `ModelConfig`'s."""
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "context_length"):
        _positive(cfg, name)
    for name in ("n_kv_heads", "head_dim", "mlp_hidden", "window_size"):
        _positive(cfg, name, optional=True)
    check_types(cfg)  # each field's annotated type; a choice field's `Literal` names its choices
    if cfg.qk_bias and cfg.bias:
        _fail("qk_bias", cfg.qk_bias, "it gives Q and K alone a bias, and bias=True already gives every "
              "linear map one; set one of the two.")

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
    cfg.norm_shape.check()  # the norm's own rules (model/norms.py)
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
    # a NaN or infinite gain, eps or std would poison every step (mypy sees no dataclass through
    # config_dataclass)
    for f in dataclasses.fields(cfg):  # type: ignore[arg-type]
        value = getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            _fail(f.name, value, "it must be a finite number.")
    _check_windows(cfg)
    _check_layout_and_forms(cfg)


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
    """The value and projection forms (identity and reparameterised maps); a block layout's own rules
    are its class's (`Block.check`, model/block.py)."""
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
