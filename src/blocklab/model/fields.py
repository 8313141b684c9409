"""`ModelFields`: the fields of one flat dataclass that describes every model blocklab builds.

The fields are grouped by the paper concept they control (sizes, components, block layout,
attention-matrix form, value/projection form, value path). This is the bottom of the model's layers:
every component reads its fields from here, and `ModelConfig` (model/config.py) adds the checks, which
need the value-path registry, and the reading and writing of files. Sizes with a default (None) are
read resolved, one name per concept, through `attention_shape` and `mlp_shape`; the norms read
`norm_shape`. Named presets
(`blocklab.presets`) sit above the model: sets of field overrides, never imported from here.

Leaf module: it imports only `blocklab.configbase`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from blocklab.configbase import ConfigBase, config_dataclass

# The choices of the choice fields: mypy checks them where the code reads a field, and validation
# (model/validation.py) reads the allowed values from these same types.
Norm = Literal["layernorm", "rmsnorm", "none"]
NormLayers = Literal["all", "first"]
RMSNormEps = Literal["inside", "outside"]
Positions = Literal["learned", "sinusoidal", "rope", "none"]
MLPAct = Literal["relu", "gelu", "gelu_tanh", "relu2", "leaky_relu", "swiglu", "geglu"]  # gelu_tanh: GPT-2
InitScheme = Literal["normal", "nanochat"]
BlockLayout = Literal["pre-ln", "post-ln", "parallel"]
AttnMatrix = Literal["softmax", "skipinit", "shaped"]
LinearForm = Literal["linear", "identity", "reparam"]
ReparamInit = Literal["identity", "orthogonal"]
ReparamTie = Literal["none", "all-tied", "ll-tied"]
CHOICES = {"norm": Norm, "norm_layers": NormLayers, "rmsnorm_eps": RMSNormEps, "positions": Positions,
           "mlp_act": MLPAct, "init_scheme": InitScheme, "block_layout": BlockLayout,
           "attn_matrix": AttnMatrix, "value_form": LinearForm, "first_value_form": LinearForm,
           "proj_form": LinearForm, "reparam_init": ReparamInit, "reparam_tie": ReparamTie}


@dataclass(frozen=True)
class AttentionShape:
    """The attention's sizes with every default resolved (`ModelFields.attention_shape`): what the
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
    """The MLP's sizes and form with every default resolved (`ModelFields.mlp_shape`)."""

    d_model: int
    hidden: int  # the hidden width (for GLU MLPs the gated width)
    act: MLPAct
    bias: bool
    leaky_relu_slope: float  # for act="leaky_relu"


@dataclass(frozen=True)
class NormShape:
    """The settings every norm of the model shares (`ModelFields.norm_shape`); where a norm sits
    and whether a layer keeps it is the block's and the Transformer's to say."""

    kind: Norm
    d_model: int
    eps: float | None  # None: the dtype's machine epsilon (RMSNorm only)
    eps_outside: bool  # RMSNorm with eps outside the root (the Simplifying code)
    bias: bool
    affine: bool  # a learnable scale (and shift)


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
    value_path: str = "standard"
    value_path_options: dict[str, Any] = field(default_factory=dict)

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
