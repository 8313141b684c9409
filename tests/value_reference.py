"""A naive float64 reference forward for blocklab's value paths, written from the papers' equations.

Nothing here calls blocklab's model code, its `ops` or its value-path classes. Masks are built with
explicit loops, every attention matrix is an explicit T x T matrix per head, and norms, positions,
softmax and the MLP are written out. The reference reads the *parameters* of a blocklab model by
name and the *meaning* of the config from the papers:

    A_n        = softmax(Q_n K_n^T / sqrt(d) + M)                            Value Residual Eq. (1)
    standard   U_n = A_n V_n,          V_n = H_{n-1} W^V_n
    ResFormer  U_n = A_n (lambda_{n,2} V_n + lambda_{n,1} V_1)               Eq. (7) and variants
               Plus: lambda_{n,1} = lambda * softmax(lambda')_n over the mixing layers
               learned mix (x-transformers): V'_n = m V_n + (1 - m) V_1, m = sigmoid(x W^T + b) per
               token and KV head; + NeuTRENO: U_n = A_n V'_n + mu (V_1 - V'_n) (Value Residual code)
    Dense      V'_n = lambda_{n,n} V_n + sum_{i<n} lambda_{n,i} V_i
    SVFormer   U_n = A_n V_1                                                 Eq. (10)
    NeuTRENO   U_n = (A_n - lambda I) V_n + lambda V_1                       Eq. (8)
    cross-attn U_n = softmax(Q_n [K_n; K_1]^T / sqrt(d)) [V_n; V_1]          Eq. (2)
    DenseFormer x <- sum_j alpha_{i,j} X_j after block i  (Pagliardini et al.)
    CLA        followers reuse the group leader's K and V (Brandon et al.)
    BoV        v_p = gamma_v E_v[i_p] in the target layers                   BoV Eq. (5)
    x0-value   v_p = c RMSNorm(e_p) W^V ; v1-value  v_p = c V_1              BoV Table 1
               x0-value add: v_p = a x_p W^V + b RMSNorm(e_p) W^V ; v-scale  v_p = c x_p W^V
    value-emb  v = x W^V + 3 sigmoid(x[:12] W_g) E_v[id]   (per KV head, nanochat), or
               v = lambda_0 x W^V + lambda_1 E_v[id] (modded-nanogpt); U-net layout: table i in layers
               i and L - N + i
    SAS(-P)    (alpha_h I + beta_h A_h - gamma_h C) V_h, C = softmax(0 + M)  Simplifying Eqs. (5), (13)
    RoPE       q_p <- R(p) q_p, k_p <- R(p) k_p per head, applied to the Q and K that enter A_n,
               i.e. after the query/key residual Q'_n = lambda_{n,1} Q_1 + lambda_{n,2} Q_n (Fig. 9)
               and to the keys CLA followers and cross-layer attention reuse (RoFormer Eq. 34)

Layer indices are 0-based: the paper's V_1 is layer 0's value. Conventions fixed by parameter
shapes: torch's (out, in) weight layout (y = x W^T), heads are contiguous column blocks, grouped
query head h reads KV head h // (H / H_kv), sinusoidal positions are [sin | cos] with frequencies
10000^(-i / (d/2)). RoPE uses the half-split layout: it rotates the pairs (x_i, x_{i + D/2}).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

DTYPE = torch.float64

# The option defaults of every value path, written from the papers (not read from blocklab).
_RESFORMER = dict(lambda1=0.5, lambda2=0.5, learnable=False, layers="all", source=0, residual_on="value",
                  neutreno=0.0)
_SUBSTITUTIVE = dict(layers="last-third", coef=1.0, learnable=True)
DEFAULTS: dict[str, dict] = {
    "standard": {},
    "resformer": _RESFORMER,
    "resformer-constant": dict(_RESFORMER, lambda1=2.0, lambda2=1.0),
    "resformer-sparse": dict(_RESFORMER, lambda1=5.0, lambda2=1.0, layers="last-3"),
    "resformer-learnable": dict(_RESFORMER, learnable=True),
    "resformer-learnable-plus": dict(_RESFORMER, learnable=True),
    "resformer-mix": _RESFORMER,
    "resformer-dense": {},
    "svformer": dict(anchors=[]),
    "neutreno": dict(lambda_=0.4),
    "denseformer": dict(dilation=1, period=1),
    "cla": dict(group=2),
    "cross-layer-attn": {},
    "bov": dict(_SUBSTITUTIVE, shared=False),
    "bov-resformer": dict(_SUBSTITUTIVE, shared=False),
    "x0-value": dict(_SUBSTITUTIVE, add=False, x0="embedding"),
    "v-scale": dict(_SUBSTITUTIVE),
    "v1-value": dict(_SUBSTITUTIVE),
    "value-embed": dict(layers="every-2", gate_channels=12, gate="nanochat", shared_tables=0),
}
RESFORMERS = ("resformer", "resformer-constant", "resformer-sparse", "resformer-learnable",
              "resformer-learnable-plus", "resformer-mix")


def layer_set(spec, n_layers: int) -> set[int]:
    """0-based layer indices named by a `layers` option."""
    if spec == "all":
        return set(range(n_layers))
    if spec == "last-third":
        return {i for i in range(n_layers) if i >= (2 * n_layers) // 3}
    if spec == "every-2":  # every second layer, the last one included
        return set(range(n_layers - 1, -1, -2))
    if isinstance(spec, str) and spec.startswith("last-"):
        k = int(spec[len("last-"):])
        return {i for i in range(n_layers) if i >= n_layers - k}
    return set(spec)


def options(cfg) -> dict:
    return {**DEFAULTS[cfg.value_path], **cfg.value_path_options}


def mixing_layers(cfg) -> list[int]:
    """The layers where a ResFormer mixes in the source value (after the source, in `layers`)."""
    o = options(cfg)
    return sorted(i for i in layer_set(o["layers"], cfg.n_layers) if i > o["source"])


class Params:
    """The model's parameters and buffers by name, in float64; records which ones were read."""

    def __init__(self, model):
        self.p = {n: t.detach().to(DTYPE) for n, t in model.named_parameters()}
        self.b = {n: t.detach().to(DTYPE) for n, t in model.named_buffers()}
        self.used: set[str] = set()

    def __call__(self, name: str) -> Tensor:
        self.used.add(name)
        return self.p[name]

    def get(self, name: str) -> Tensor | None:
        return self(name) if name in self.p else None

    def buffer(self, name: str) -> Tensor:
        return self.b[name]

    def gain(self, prefix: str, fixed: float, trainable: bool) -> Tensor:
        """A scalar (or per-head) gain: the trainable parameter `prefix.gain`, else the fixed value."""
        if trainable:
            return self(f"{prefix}.gain")
        assert f"{prefix}.gain" not in self.p, f"{prefix} should be a fixed gain"
        return torch.tensor([float(fixed)], dtype=DTYPE)

    def unused(self) -> set[str]:
        return set(self.p) - self.used


# -- elementary pieces ---------------------------------------------------------------------------
def causal_mask(t: int, causal: bool) -> Tensor:
    m = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):
        for j in range(t):
            m[i, j] = (j <= i) or not causal
    return m


def softmax_rows(logits: Tensor, mask: Tensor) -> Tensor:
    z = logits.masked_fill(~mask, -math.inf)
    z = z - z.max(dim=-1, keepdim=True).values
    e = torch.exp(z)
    return e / e.sum(dim=-1, keepdim=True)


def rms(x: Tensor, eps: float) -> Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def norm(kind: str, x: Tensor, params: Params, prefix: str, eps: float) -> Tensor:
    if kind == "none":
        return x
    w = params(f"{prefix}.weight")
    b = params.get(f"{prefix}.bias")
    if kind == "rmsnorm":
        y = rms(x, eps) * w
    else:
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        y = (x - mu) / torch.sqrt(var + eps) * w
    return y if b is None else y + b


def linear(x: Tensor, params: Params, prefix: str) -> Tensor:
    y = x @ params(f"{prefix}.weight").T
    b = params.get(f"{prefix}.bias")
    return y if b is None else y + b


def sinusoidal(t: int, d: int) -> Tensor:
    half = d // 2
    pe = torch.zeros(t, d, dtype=DTYPE)
    for p in range(t):
        for i in range(half):
            angle = p * 10000.0 ** (-i / half)
            pe[p, i], pe[p, half + i] = math.sin(angle), math.cos(angle)
    return pe


def rope(x: Tensor, base: float) -> Tensor:
    """R(p) x_p for one head x (B, T, D): the pair (x_i, x_{i + D/2}) at position p turns by the
    angle p * base^(-i / (D/2)) (RoFormer Eq. 34, half-split layout)."""
    half = x.shape[-1] // 2
    out = torch.empty_like(x)
    for p in range(x.shape[-2]):
        for i in range(half):
            angle = p * base ** (-i / half)
            c, s = math.cos(angle), math.sin(angle)
            a, b = x[..., p, i], x[..., p, half + i]
            out[..., p, i] = a * c - b * s
            out[..., p, half + i] = a * s + b * c
    return out


def gelu(x: Tensor) -> Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def mlp(cfg, x: Tensor, params: Params, prefix: str) -> Tensor:
    h = linear(x, params, f"{prefix}.fc")
    if cfg.mlp_act == "relu":
        h = torch.clamp(h, min=0.0)
    elif cfg.mlp_act == "gelu":
        h = gelu(h)
    else:
        raise NotImplementedError(cfg.mlp_act)
    return linear(h, params, f"{prefix}.out")


def square_map(cfg, x: Tensor, params: Params, prefix: str, form: str, alpha: float, beta: float) -> Tensor:
    """A value / projection map: linear, identity, or W = alpha W_init + beta dW (Simplifying Eq. 6)."""
    if form == "linear":
        return linear(x, params, prefix)
    if form == "identity":
        return x
    t = cfg.trainable_reparam_gains
    w = (params.gain(f"{prefix}.skip", alpha, t) * params.buffer(f"{prefix}.w_init")
         + params.gain(f"{prefix}.resid", beta, t) * params(f"{prefix}.delta"))
    return x @ w.T


# -- the model ------------------------------------------------------------------------------------
def reference_logits(model, ids: Tensor, check_all_used: bool = True) -> Tensor:
    """Logits (B, T, vocab) of `model` on `ids`, recomputed from scratch in float64."""
    cfg = model.cfg
    assert cfg.positions in ("learned", "sinusoidal", "none", "rope") and not cfg.qk_norm
    assert cfg.window_size is None and cfg.block_layout in ("pre-ln", "parallel") and cfg.dropout == 0
    params = Params(model)
    o = options(cfg)
    b, t = ids.shape
    emb = params("tok_emb.weight")
    e = emb[ids]  # (B, T, d), the raw token embeddings
    x = e
    if cfg.positions == "learned":
        x = x + params("pos_emb.weight")[:t]
    elif cfg.positions == "sinusoidal":
        x = x + sinusoidal(t, cfg.d_model)
    state: dict = dict(e=e, x0=x, ids=ids, mask=causal_mask(t, cfg.causal), raw_values=[], history=[x])
    if cfg.value_path == "resformer-learnable-plus":
        weights = params("value_shared.scale.gain") * torch.softmax(params("value_shared.logits.gain"), 0)
        state["plus"] = dict(zip(mixing_layers(cfg), weights, strict=True))
    if cfg.value_path in ("bov", "bov-resformer") and o["shared"]:
        state["shared_table"] = params("value_shared.value_table")

    for n in range(cfg.n_layers):
        x = block(cfg, n, x, params, state, o)
        if cfg.value_path == "denseformer":
            x = dense_average(n, x, params, state, o)

    x = norm(cfg.norm if cfg.final_norm else "none", x, params, "norm", cfg.norm_eps)
    head = emb if cfg.tie_embeddings else params("head.weight")
    logits = x @ head.T
    if cfg.logit_softcap is not None:
        logits = cfg.logit_softcap * torch.tanh(logits / cfg.logit_softcap)
    if check_all_used:
        assert not params.unused(), f"parameters the reference never read: {sorted(params.unused())}"
    return logits


def dense_average(n: int, x: Tensor, params: Params, state: dict, o: dict) -> Tensor:
    """DenseFormer DWA after block n: sum_j alpha_{n,j} X_j, j in 0..n+1 with j = n+1 mod dilation."""
    state["history"].append(x)  # the raw output X_{n+1}
    k, p = o["dilation"], o["period"]
    if (n + 1) % p:
        return x
    sources = [j for j in range(n + 2) if j % k == (n + 1) % k]
    w = params(f"value_shared.dwa.{n}.gain")
    assert w.numel() == len(sources)
    return sum(w[i] * state["history"][j] for i, j in enumerate(sources))


def block(cfg, n: int, x: Tensor, params: Params, state: dict, o: dict) -> Tensor:
    pre = f"blocks.{n}"
    kind = cfg.norm if (cfg.norm_layers == "all" or n == 0) else "none"
    tg = cfg.trainable_block_gains

    def gain(name, init):
        return None if init == 0 else params.gain(f"{pre}.{name}", init, tg)

    a_sa, b_sa = gain("attn_skip", cfg.attn_skip_gain), gain("attn_branch", cfg.attn_branch_gain)
    a_ff, b_ff = gain("mlp_skip", cfg.mlp_skip_gain), gain("mlp_branch", cfg.mlp_branch_gain)
    if cfg.block_layout == "parallel":  # out = a_comb X + b_FF MLP(N1(X)) + b_SA MHA(N1(X))   Eq. (7)
        h = norm(kind, x, params, f"{pre}.norm1", cfg.norm_eps)
        out = b_ff * mlp(cfg, h, params, f"{pre}.mlp") + b_sa * attention(cfg, n, h, params, state, o)
        return out if a_ff is None else out + a_ff * x
    # pre-ln: X' = a_SA X + b_SA MHA(N1(X));  out = a_FF X' + b_FF MLP(N2(X'))              Eq. (1)
    h = b_sa * attention(cfg, n, norm(kind, x, params, f"{pre}.norm1", cfg.norm_eps), params, state, o)
    if a_sa is not None:
        h = h + a_sa * x
    kind2 = cfg.norm if cfg.norm_layers == "all" else "none"
    out = b_ff * mlp(cfg, norm(kind2, h, params, f"{pre}.norm2", cfg.norm_eps), params, f"{pre}.mlp")
    return out if a_ff is None else out + a_ff * h


def heads(x: Tensor, n_heads: int, d: int) -> list[Tensor]:
    """Split (B, T, n_heads * d) into n_heads column blocks of width d."""
    return [x[..., h * d:(h + 1) * d] for h in range(n_heads)]


def attention(cfg, n: int, x: Tensor, params: Params, state: dict, o: dict) -> Tensor:
    """Multi-head attention of layer n on its normed input x (B, T, d) -> (B, T, d)."""
    pre, vp = f"blocks.{n}.attn", cfg.value_path
    n_h, n_kv, d_h = cfg.n_heads, cfg.n_kv_heads or cfg.n_heads, cfg.head_dim or cfg.d_model // cfg.n_heads
    group = n_h // n_kv
    b, t, _ = x.shape
    mask = state["mask"]

    q = linear(x, params, f"{pre}.q")  # (B, T, H d_h)
    # -- keys: CLA followers reuse the leader's keys --------------------------------------------
    if vp == "cla" and n % o["group"]:
        k, v = state["cla"]
    else:
        k = linear(x, params, f"{pre}.k")  # (B, T, H_kv d_h)
        v = None

    # -- values: the value-path equation --------------------------------------------------------
    form = cfg.first_value_form if (n == 0 and cfg.first_value_form) else cfg.value_form

    def project() -> Tensor:
        return square_map(cfg, x, params, f"{pre}.values.w_v", form, cfg.value_skip_gain,
                          cfg.value_resid_gain)

    correction = None
    cross = None
    if vp == "standard" or vp == "denseformer":
        v = project()
    elif vp in RESFORMERS:
        v = project()
        own = {"value": v, "query": q, "key": k}[o["residual_on"]]
        if n == o["source"]:
            state["first"] = own
        elif n in mixing_layers(cfg):
            lt = o["learnable"]
            if vp == "resformer-mix":  # one gate per token and KV head, on the layer's input x
                w_m, b_m = params(f"{pre}.values.gate.weight"), params(f"{pre}.values.gate.bias")
                m = torch.sigmoid(x @ w_m.T + b_m)  # (B, T, H_kv)
                mixed = torch.cat([m[..., j:j + 1] * vn + (1 - m[..., j:j + 1]) * v1 for j, (vn, v1) in
                                   enumerate(zip(heads(own, n_kv, d_h), heads(state["first"], n_kv, d_h),
                                                 strict=True))], -1)
            else:
                if vp == "resformer-learnable-plus":
                    lam1 = state["plus"][n]
                else:
                    lam1 = params.gain(f"{pre}.values.lambda1", o["lambda1"], lt)
                lam2 = params.gain(f"{pre}.values.lambda2", o["lambda2"], lt)
                mixed = lam1 * state["first"] + lam2 * own
            if o["neutreno"]:  # U_n = A_n V'_n + mu (V_1 - V'_n), token-wise
                correction = o["neutreno"] * (state["first"] - mixed)
            if o["residual_on"] == "value":
                v = mixed
            elif o["residual_on"] == "query":
                q = mixed
            else:
                k = mixed
    elif vp == "resformer-dense":
        raw = project()
        state["raw_values"].append(raw)
        v = raw
        if n > 0:
            w = params(f"{pre}.values.lambdas.gain")  # weights on V_1 .. V_n
            assert w.numel() == n + 1
            v = sum(w[i] * vi for i, vi in enumerate(state["raw_values"]))
    elif vp == "svformer":
        if n == 0 or n in o["anchors"]:
            state["anchor"] = project()
        v = state["anchor"]
    elif vp == "neutreno":
        v = project()
        if n == 0:
            state["v1"] = v
        else:  # U_n = A_n V_n + lambda (V_1 - V_n), token-wise, per head
            correction = o["lambda_"] * (state["v1"] - v)
    elif vp == "cla":
        if n % o["group"] == 0:
            v = project()
            state["cla"] = (k, v)
    elif vp == "cross-layer-attn":
        v = project()
        if n == 0:
            state["kv1"] = (k, v)
        else:
            cross = state["kv1"]
    elif vp in ("bov", "bov-resformer", "x0-value", "v1-value", "v-scale"):
        targets = layer_set(o["layers"], cfg.n_layers)
        if vp == "v1-value" and o["layers"] == "all":  # layer 0 is V_1's source: Table 1's "V1, All"
            targets = set(range(1, cfg.n_layers))
        target = n in targets
        # the x0 of the x0 W_V rows: the raw token embedding, or the stream after the embedding
        x0_source = state["x0"] if o.get("x0") == "stream" else state["e"]
        if not target:
            v = project()
            if n == 0:
                state["v1"] = v
            elif vp == "bov-resformer":  # Identity-ResFormer below the table layers
                v = 0.5 * (v + state["v1"])
        elif vp == "x0-value" and o["add"]:  # a, b: learned from (1, 0), or fixed at (1/2, 1/2)
            lt = o["learnable"]
            a = params.gain(f"{pre}.values.main", 1.0 if lt else 0.5, lt)
            b = params.gain(f"{pre}.values.coef", 0.0 if lt else 0.5, lt)
            x0 = rms(x0_source, torch.finfo(DTYPE).eps)
            v = a * project() + b * project_from(cfg, x0, params, pre, form)
        elif vp == "v-scale":
            v = params.gain(f"{pre}.values.coef", o["coef"], o["learnable"]) * project()
        else:
            c = params.gain(f"{pre}.values.coef", o["coef"], o["learnable"])
            if vp in ("bov", "bov-resformer"):
                table = state["shared_table"] if o["shared"] else params(f"{pre}.values.value_table")
                v = c * table[state["ids"]]
            elif vp == "x0-value":  # parameter-free RMSNorm of x0
                v = c * project_from(cfg, rms(x0_source, torch.finfo(DTYPE).eps), params, pre, form)
            else:
                v = c * state["v1"]
    elif vp == "value-embed":
        v = project()
        big_n, L = o["shared_tables"], cfg.n_layers
        if big_n:  # U-net: table i in layer i and in layer L - N + i
            index = n if n < big_n else (n - (L - big_n) if n >= L - big_n else None)
            name = None if index is None else f"value_shared.tables.{index}.value_table"
        else:
            name = f"{pre}.values.value_table" if n in layer_set(o["layers"], L) else None
        if o["gate"] == "lambda":
            v = params(f"{pre}.values.lambda0.gain") * v
        if name is not None:
            table = params(name)[state["ids"]]  # (B, T, H_kv d_h)
            if o["gate"] == "lambda":
                v = v + params(f"{pre}.values.lambda1.gain") * table
            else:
                ch = min(o["gate_channels"], cfg.d_model)
                g = 3.0 * torch.sigmoid(x[..., :ch] @ params(f"{pre}.values.gate.weight").T)  # (B, T, H_kv)
                v = v + torch.cat([g[..., j:j + 1] * e for j, e in enumerate(heads(table, n_kv, d_h))], -1)
    else:
        raise NotImplementedError(vp)

    # -- per-head attention with explicit matrices ----------------------------------------------
    qs, ks, vs = heads(q, n_h, d_h), heads(k, n_kv, d_h), heads(v, n_kv, d_h)

    def position(hs: list[Tensor]) -> list[Tensor]:  # RoPE on the Q and K that enter A_n
        return [rope(h, cfg.rope_base) for h in hs] if cfg.positions == "rope" else hs

    qs, ks = position(qs), position(ks)
    eye = torch.eye(t, dtype=DTYPE)
    centre = mask.to(DTYPE) / mask.to(DTYPE).sum(-1, keepdim=True)  # C = softmax(0 + M)
    if cfg.attn_matrix != "softmax":
        ta = cfg.trainable_attn_gains

        def head_gain(name, init):  # one gain per head (Eq. 13) or one per layer
            g = params.gain(f"{pre}.{name}", init, ta)
            assert g.numel() == (n_h if (ta and cfg.headwise_gains) else 1)
            return g.expand(n_h)

        alpha, beta = head_gain("alpha", cfg.attn_alpha), head_gain("beta", cfg.attn_beta)
        gamma = head_gain("gamma", cfg.attn_gamma) if cfg.attn_matrix == "shaped" else None
    outs = []
    for h in range(n_h):
        g = h // group
        logits = qs[h] @ ks[g].transpose(-1, -2) / math.sqrt(d_h)  # (B, T, T)
        if cross is not None:  # Eq. (2): attend over [K_n; K_1] and [V_n; V_1] under [M, M]
            k1, v1 = position(heads(cross[0], n_kv, d_h))[g], heads(cross[1], n_kv, d_h)[g]
            logits = torch.cat((logits, qs[h] @ k1.transpose(-1, -2) / math.sqrt(d_h)), -1)
            a = softmax_rows(logits, torch.cat((mask, mask), -1))
            outs.append(a @ torch.cat((vs[g], v1), -2))
            continue
        a = softmax_rows(logits, mask)
        if cfg.attn_matrix != "softmax":
            a = alpha[h] * eye + beta[h] * a
            if gamma is not None:
                a = a - gamma[h] * centre
        y = a @ vs[g]
        if correction is not None:
            y = y + heads(correction, n_kv, d_h)[g]
        outs.append(y)
    y = torch.cat(outs, -1)
    return square_map(cfg, y, params, f"{pre}.proj", cfg.proj_form, cfg.proj_skip_gain, cfg.proj_resid_gain)


def project_from(cfg, x: Tensor, params: Params, pre: str, form: str) -> Tensor:
    return square_map(cfg, x, params, f"{pre}.values.w_v", form, cfg.value_skip_gain, cfg.value_resid_gain)
