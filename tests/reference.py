"""A naive float64 reference for the blocklab model core, written from the papers' equations.

Nothing here calls blocklab's model code or its `ops`: masks are built with explicit loops, the
attention matrices (Simplifying Transformer Blocks, Eqs. 2, 4, 5, 13) are explicit T x T
matrices, and softmax, norms, positions and the MLP are written out. The reference reads the
*parameters* of a blocklab model by name (its state_dict) and reads the *meaning* of every
`ModelConfig` field from the papers:

    pre-ln    X' = a_SA X + b_SA MHA(N1(X));  out = a_FF X' + b_FF MLP(N2(X'))       Eq. (1)
    post-ln   X' = N1(a_SA X + b_SA MHA(X));  out = N2(a_FF X' + b_FF MLP(X'))      Vaswani et al.
    parallel  out = a_comb X + b_FF MLP(N1(X)) + b_SA MHA(N1(X)), a_comb = mlp_skip_gain   Eq. (7)
    MHA(X)    = Concat_h(A~_h X W_V,h) W_P                                           Eqs. (2), (3)
    A~_h      = A_h | a_h I + b_h A_h | a_h I + b_h A_h - g_h C                     Eqs. (4), (5), (13)
    C         = softmax(0 + M), the attention matrix of zero logits under the same mask M
    W         = a W_init + b dW  (values / projections)                             Eq. (6)

Layout conventions that the papers leave open (they are fixed by the parameter shapes):
torch's (out, in) weight layout, y = x W^T; heads are contiguous column blocks (Eq. 12:
X = Concat(X_1, ..., X_H)); with grouped-query attention query head h uses key/value head
h // (H / H_kv); a gated MLP's input projection holds the linear half first and the gate half
second, out = act(x W_gate) * (x W_lin); sinusoidal positions and RoPE use the half-split layout
[sin | cos] / (x_i, x_{i + D/2}) with frequencies base^(-i / (D/2)).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

DTYPE = torch.float64


# -- masks and attention matrices ---------------------------------------------------------------
def mask_matrix(t_q: int, t_k: int, causal: bool, window: int | None) -> Tensor:
    """Boolean (T_q, T_k): may query i (at position T_k - T_q + i) attend to key j?"""
    allowed = torch.zeros(t_q, t_k, dtype=torch.bool)
    for i in range(t_q):
        p = t_k - t_q + i
        for j in range(t_k):
            ok = True
            if causal and j > p:
                ok = False
            if window is not None:
                if causal and not (p - window < j):
                    ok = False
                if not causal and not (abs(p - j) < window):
                    ok = False
            allowed[i, j] = ok
    return allowed


def softmax(logits: Tensor, allowed: Tensor) -> Tensor:
    """Row softmax of `logits` over the allowed entries; disallowed entries are exactly 0."""
    z = logits.masked_fill(~allowed, float("-inf"))
    z = z - z.max(dim=-1, keepdim=True).values
    e = torch.exp(z)
    return e / e.sum(dim=-1, keepdim=True)


def centering_matrix(allowed: Tensor) -> Tensor:
    """C: the attention matrix of all-zero logits under the mask (uniform over allowed keys)."""
    return softmax(torch.zeros(allowed.shape, dtype=DTYPE), allowed)


def offset_identity(t_q: int, t_k: int) -> Tensor:
    """I with query i matched to the key at its own position T_k - T_q + i."""
    eye = torch.zeros(t_q, t_k, dtype=DTYPE)
    for i in range(t_q):
        eye[i, t_k - t_q + i] = 1.0
    return eye


def head_gain(gain, h: int):
    """A scalar gain, or entry h of a per-head gain vector (a size-1 vector is shared)."""
    if isinstance(gain, Tensor):
        return gain[h] if gain.numel() > 1 else gain.reshape(())
    return gain


def attention_matrix(q: Tensor, k: Tensor, allowed: Tensor, form: str, alpha=None, beta=None,
                     gamma=None, h: int = 0) -> Tensor:
    """The matrix one head applies to its values: q (.., T_q, D), k (.., T_k, D)."""
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    probs = softmax(logits, allowed)
    if form == "softmax":
        return probs
    eye = offset_identity(q.shape[-2], k.shape[-2])
    out = head_gain(alpha, h) * eye + head_gain(beta, h) * probs
    if form == "shaped":
        out = out - head_gain(gamma, h) * centering_matrix(allowed)
    return out


def multihead(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, form: str, alpha=None, beta=None,
              gamma=None) -> Tensor:
    """(B, H, T_q, D) queries, (B, H_kv, T_k, D) keys/values -> (B, H, T_q, D), head by head."""
    n_heads, n_kv = q.shape[1], k.shape[1]
    outs = []
    for h in range(n_heads):
        g = h // (n_heads // n_kv)
        a = attention_matrix(q[:, h], k[:, g], allowed, form, alpha, beta, gamma, h)
        outs.append(a @ v[:, g])
    return torch.stack(outs, dim=1)


# -- positions, norms, MLP ------------------------------------------------------------------------
def sinusoidal(n_pos: int, dim: int) -> Tensor:
    """pe[p, i] = sin(p w_i), pe[p, D/2 + i] = cos(p w_i), w_i = 10000^(-i / (D/2))."""
    half = dim // 2
    pe = torch.zeros(n_pos, dim, dtype=DTYPE)
    for p in range(n_pos):
        for i in range(half):
            w = 10000.0 ** (-i / half)
            pe[p, i] = math.sin(p * w)
            pe[p, half + i] = math.cos(p * w)
    return pe


def rope(x: Tensor, positions: Tensor, base: float) -> Tensor:
    """Rotate each pair (x_i, x_{i + D/2}) at position p by the angle p * base^(-i / (D/2))."""
    half = x.shape[-1] // 2
    out = x.clone()
    for t, p in enumerate(positions.tolist()):
        for i in range(half):
            theta = p * base ** (-i / half)
            c, s = math.cos(theta), math.sin(theta)
            a, b = x[..., t, i], x[..., t, half + i]
            out[..., t, i] = a * c - b * s
            out[..., t, half + i] = a * s + b * c
    return out


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    y = x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float) -> Tensor:
    mu = x.mean(dim=-1, keepdim=True)
    var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)
    y = (x - mu) / torch.sqrt(var + eps) * weight
    return y if bias is None else y + bias


def gelu(x: Tensor) -> Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def silu(x: Tensor) -> Tensor:
    return x / (1.0 + torch.exp(-x))


def activation(h: Tensor, act: str, slope: float) -> Tensor:
    if act in ("swiglu", "geglu"):
        lin, gate = h[..., : h.shape[-1] // 2], h[..., h.shape[-1] // 2:]
        return (silu(gate) if act == "swiglu" else gelu(gate)) * lin
    if act == "relu":
        return torch.where(h > 0, h, torch.zeros_like(h))
    if act == "relu2":
        return torch.where(h > 0, h * h, torch.zeros_like(h))
    if act == "leaky_relu":
        return torch.where(h > 0, h, slope * h)
    if act == "gelu":
        return gelu(h)
    raise ValueError(act)


# -- the whole model ------------------------------------------------------------------------------
class Params:
    """float64 copies of a model's state_dict; remembers which entries the reference used."""

    def __init__(self, model: torch.nn.Module):
        self.tensors = {k: v.detach().to(DTYPE).clone() for k, v in model.state_dict().items()}
        self.used: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def __getitem__(self, key: str) -> Tensor:
        self.used.add(key)
        return self.tensors[key]

    def get(self, key: str) -> Tensor | None:
        return self[key] if key in self.tensors else None

    def gain(self, key: str, init: float, trainable: bool, size: int = 1):
        """A gain: the trained parameter `key` (`size` entries) when trainable, else its fixed init."""
        if trainable and init != 0.0 or key in self.tensors:  # a trainable gain initialised at 0
            value = self[key]
            assert value.numel() == size, f"{key} has {value.numel()} entries, the config says {size}"
            return value
        return init

    def unused(self) -> set[str]:
        return set(self.tensors) - self.used


def linear(p: Params, prefix: str, x: Tensor) -> Tensor:
    y = x @ p[f"{prefix}.weight"].T
    b = p.get(f"{prefix}.bias")
    return y if b is None else y + b


def reparam_weight(p: Params, prefix: str, alpha: float, beta: float, trainable: bool) -> Tensor:
    """Eq. (6): W = alpha * W_init + beta * dW."""
    a = p.gain(f"{prefix}.skip.gain", alpha, trainable)
    b = p.gain(f"{prefix}.resid.gain", beta, trainable)
    return a * p[f"{prefix}.w_init"] + b * p[f"{prefix}.delta"]


def value_or_proj(cfg, p: Params, prefix: str, form: str, x: Tensor, which: str) -> Tensor:
    if form == "identity":
        return x
    if form == "linear":
        return linear(p, prefix, x)
    assert form == "reparam", form
    if which == "value":
        w = reparam_weight(p, prefix, cfg.value_skip_gain, cfg.value_resid_gain, cfg.trainable_reparam_gains)
    else:
        w = reparam_weight(p, prefix, cfg.proj_skip_gain, cfg.proj_resid_gain, cfg.trainable_reparam_gains)
    return x @ w.T


def norm(cfg, p: Params, prefix: str, kind: str, x: Tensor) -> Tensor:
    if kind == "none":
        return x
    if kind == "rmsnorm":
        return rms_norm(x, p[f"{prefix}.weight"], cfg.norm_eps)
    return layer_norm(x, p[f"{prefix}.weight"], p.get(f"{prefix}.bias"), cfg.norm_eps)


def layer_window(cfg, layer: int) -> int | None:
    """Windowed iff the tiled pattern says 'S' at this layer, except the last layer (full)."""
    if cfg.window_size is None or layer == cfg.n_layers - 1:
        return None
    return cfg.window_size if cfg.window_pattern[layer % len(cfg.window_pattern)] == "S" else None


def sizes(cfg) -> tuple[int, int, int]:
    n_heads = cfg.n_heads
    n_kv = cfg.n_kv_heads or n_heads
    head_dim = cfg.head_dim or cfg.d_model // n_heads
    return n_heads, n_kv, head_dim


def split_heads(x: Tensor, n: int, d: int) -> Tensor:
    """(B, T, n*d) -> (B, n, T, d): head h is the column block h*d : (h+1)*d."""
    return torch.stack([x[..., h * d:(h + 1) * d] for h in range(n)], dim=1)


def attention_sublayer(cfg, p: Params, layer: int, x: Tensor, positions: Tensor) -> Tensor:
    """MHA(x) of one layer, Eqs. (2)-(6) and (12)-(13)."""
    pre = f"blocks.{layer}.attn"
    n_heads, n_kv, d = sizes(cfg)
    q = split_heads(linear(p, f"{pre}.q", x), n_heads, d)
    k = split_heads(linear(p, f"{pre}.k", x), n_kv, d)
    v_form = cfg.first_value_form if (layer == 0 and cfg.first_value_form) else cfg.value_form
    v = split_heads(value_or_proj(cfg, p, f"{pre}.values.w_v", v_form, x, "value"), n_kv, d)
    if cfg.qk_norm:
        eps = torch.finfo(DTYPE).eps
        q, k = rms_norm(q, None, eps), rms_norm(k, None, eps)
    if cfg.positions == "rope":
        q, k = rope(q, positions, cfg.rope_base), rope(k, positions, cfg.rope_base)
    t = x.shape[1]
    allowed = mask_matrix(t, t, cfg.causal, layer_window(cfg, layer))
    alpha = beta = gamma = None
    if cfg.attn_matrix != "softmax":
        size = n_heads if cfg.headwise_gains else 1  # Eq. (13): one alpha_h, beta_h, gamma_h per head
        alpha = p.gain(f"{pre}.alpha.gain", cfg.attn_alpha, cfg.trainable_attn_gains, size)
        beta = p.gain(f"{pre}.beta.gain", cfg.attn_beta, cfg.trainable_attn_gains, size)
        if cfg.attn_matrix == "shaped":
            gamma = p.gain(f"{pre}.gamma.gain", cfg.attn_gamma, cfg.trainable_attn_gains, size)
    y = multihead(q, k, v, allowed, cfg.attn_matrix, alpha, beta, gamma)
    y = torch.cat([y[:, h] for h in range(n_heads)], dim=-1)  # Concat over heads
    return value_or_proj(cfg, p, f"{pre}.proj", cfg.proj_form, y, "proj")


def mlp(cfg, p: Params, layer: int, x: Tensor) -> Tensor:
    pre = f"blocks.{layer}.mlp"
    return linear(p, f"{pre}.out", activation(linear(p, f"{pre}.fc", x), cfg.mlp_act, cfg.leaky_relu_slope))


def block(cfg, p: Params, layer: int, x: Tensor, positions: Tensor) -> Tensor:
    pre = f"blocks.{layer}"
    tr = cfg.trainable_block_gains
    a_sa = p.gain(f"{pre}.attn_skip.gain", cfg.attn_skip_gain, tr)
    b_sa = p.gain(f"{pre}.attn_branch.gain", cfg.attn_branch_gain, tr)
    a_ff = p.gain(f"{pre}.mlp_skip.gain", cfg.mlp_skip_gain, tr)
    b_ff = p.gain(f"{pre}.mlp_branch.gain", cfg.mlp_branch_gain, tr)
    kind1 = cfg.norm if (cfg.norm_layers == "all" or layer == 0) else "none"
    kind2 = cfg.norm if cfg.norm_layers == "all" else "none"

    def n1(z):
        return norm(cfg, p, f"{pre}.norm1", kind1, z)

    def n2(z):
        return norm(cfg, p, f"{pre}.norm2", kind2, z)

    if cfg.block_layout == "pre-ln":
        h = a_sa * x + b_sa * attention_sublayer(cfg, p, layer, n1(x), positions)
        return a_ff * h + b_ff * mlp(cfg, p, layer, n2(h))
    if cfg.block_layout == "post-ln":
        h = n1(a_sa * x + b_sa * attention_sublayer(cfg, p, layer, x, positions))
        return n2(a_ff * h + b_ff * mlp(cfg, p, layer, h))
    assert cfg.block_layout == "parallel"
    xn = n1(x)
    return a_ff * x + b_ff * mlp(cfg, p, layer, xn) + b_sa * attention_sublayer(cfg, p, layer, xn, positions)


def embed(cfg, p: Params, ids: Tensor) -> Tensor:
    t = ids.shape[1]
    x = cfg.embed_scale * p["tok_emb.weight"][ids]
    if cfg.positions == "learned":
        x = x + p["pos_emb.weight"][:t]
    elif cfg.positions == "sinusoidal":
        x = x + sinusoidal(t, cfg.d_model)
    return x


def forward(model: torch.nn.Module, ids: Tensor, check_all_used: bool = True) -> Tensor:
    """Logits (B, T, vocab) of `model` (its cfg and its parameters), computed in float64 here."""
    cfg = model.cfg
    p = Params(model)
    positions = torch.arange(ids.shape[1])
    x = embed(cfg, p, ids)
    for layer in range(cfg.n_layers):
        x = block(cfg, p, layer, x, positions)
    x = norm(cfg, p, "norm", cfg.norm if cfg.final_norm else "none", x)
    w_out = p["tok_emb.weight"] if cfg.tie_embeddings else p["head.weight"]
    logits = x @ w_out.T
    if cfg.logit_softcap is not None:
        logits = cfg.logit_softcap * torch.tanh(logits / cfg.logit_softcap)
    if check_all_used:
        assert not p.unused(), f"model entries the paper's equations do not use: {sorted(p.unused())}"
    return logits


# -- helpers shared by the tests ------------------------------------------------------------------
@torch.no_grad()
def perturb(model: torch.nn.Module, seed: int = 0, scale: float = 1.0) -> torch.nn.Module:
    """Move every trainable parameter well away from its initial value (W_Q = 0, dW = 0, gains)."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=gen, dtype=torch.float64).to(param.dtype)
        if name in ("tok_emb.weight", "pos_emb.weight"):
            std = 1.0
        elif param.dim() >= 2:
            std = 1.0 / math.sqrt(param.shape[-1])
        else:  # gains, norm scales, biases
            std = 0.3
        param.add_(noise * std * scale)
    return model
