"""`ModelFields`: the flat fields that describe every model blocklab builds, the views of them each
component reads, and the rules of the fields alone.

The fields are grouped by the paper concept they control (sizes, components, block layout,
attention-matrix form, value/projection form, value path); users set them flat (``d_model=256``, in
YAML, JSON and on the command line). Each component reads its own config as a view with the defaults
resolved, which it owns with its rules: `attention_shape` (sizes, for the attention, the value paths
and the KV cache), `position_shape` (model/positions.py), `norm_shape` (model/norms.py) and
`mlp_shape` (model/mlp.py); a block layout and a value path read the fields they need from a
`ModelFields`.

A `ModelFields` checks, on construction, each field against its annotated type
(`blocklab.util.configbase.check_types`) and the rules of the fields alone (`check_field_rules`). The
model's config, `blocklab.model.config.ModelConfig`, is this class with every component's rules and
the named presets; it is what everyone builds, and what the error messages name.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from blocklab.model.mlp import MLPAct, MLPShape
from blocklab.model.norms import Norm, NormShape, RMSNormEps
from blocklab.model.positions import Positions, PositionShape
from blocklab.util.configbase import ConfigBase, check_types, config_dataclass, field_error

# The choices of the choice fields: mypy checks them where the code reads a field, and `check_types`
# reads the allowed values from these same types.
NormLayers = Literal["all", "first"]
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
    def position_shape(self) -> PositionShape:
        return PositionShape(self.positions, self.d_model, self.attention_shape.head_dim, self.rope_base)

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
    """The rules of the fields alone: sizes, types, standard deviations, finite numbers. What a
    component reads is checked by that component's own rules, which `ModelConfig` calls after these."""
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "context_length"):
        _positive(cfg, name)
    for name in ("n_kv_heads", "head_dim", "mlp_hidden", "window_size"):
        _positive(cfg, name, optional=True)
    check_types(cfg)  # each field's annotated type; a choice field's `Literal` names its choices
    if cfg.embed_init_std is not None and cfg.init_scheme != "normal":
        _fail("embed_init_std", cfg.embed_init_std, f"init_scheme={cfg.init_scheme!r} sets the embedding's "
              "own init; embed_init_std applies to init_scheme='normal' (or leave it None).")
    if not cfg.embed_scale > 0 or cfg.embed_scale == float("inf"):
        _fail("embed_scale", cfg.embed_scale, "it must be a finite number > 0 (1 is plain; Vaswani et al. "
              "use sqrt(d_model)).")
    for name in ("init_std", "query_init_std", "embed_init_std"):
        if getattr(cfg, name) is not None and getattr(cfg, name) < 0:
            _fail(name, getattr(cfg, name), "a standard deviation must be >= 0.")
    if not 0.0 <= cfg.dropout < 1.0:
        _fail("dropout", cfg.dropout, "it must lie in [0, 1).")
    if cfg.logit_softcap is not None and cfg.logit_softcap <= 0:
        _fail("logit_softcap", cfg.logit_softcap, "it must be > 0 or None.")
    # a NaN or infinite gain, eps or std would poison every step (mypy sees no dataclass through
    # config_dataclass)
    for f in dataclasses.fields(cfg):  # type: ignore[arg-type]
        value = getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            _fail(f.name, value, "it must be a finite number.")
