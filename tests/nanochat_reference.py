"""A float64 reference of nanochat's GPT forward pass, written from the facts of its public code
(karpathy/nanochat `nanochat/gpt.py`, and `gpt_base.py` of the Bank of Values branch), in nanochat's
own parameter names. It shares nothing with blocklab: explicit T x T attention, its own rotary
(by -theta, half-split), its own windows (FA3's (w, 0): w keys to the left plus the token itself).

    x = rmsnorm(wte[idx]);  x_t += lambda_s sigmoid(W_s x_t[:24]) x_{t-1}  (t >= 1);  x0 = x
    block i:  x = lambda_r,i x + lambda_0,i x0                      (upstream GPT only)
              v = c_v(n) + 3 sigmoid(W_g n[:12]) ve_i[idx]           (value-embed layers only)
              v = gamma_i c_v(rmsnorm(x0))   (Bank of Values' v_from_x0 layers; x0 after the smear)
              q, k = 1.2 rmsnorm(rope(c_q(n))), 1.2 rmsnorm(rope(c_k(n)))   with n = rmsnorm(x)
              x = x + c_proj(softmax(q k^T / sqrt(d) + window mask) v)
              x = x + mlp.c_proj(relu(mlp.c_fc(rmsnorm(x)))^2)
    x = x - lambda_b x_{L//2} (upstream GPT only);  logits = 15 tanh(lm_head(rmsnorm(x)) / 15)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def random_nanochat_weights(n_layer: int, d: int, head_dim: int, n_kv_head: int, vocab: int,
                            upstream: bool, seed: int = 0) -> dict[str, Tensor]:
    """Random float64 weights of every nanochat parameter, none at its initial value."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 1.0) -> Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    n_head, padded = d // head_dim, -(-vocab // 64) * 64
    s = d ** -0.5
    w = {"transformer.wte.weight": rand(padded, d), "lm_head.weight": rand(padded, d, scale=0.05),
         "smear_gate.weight": rand(1, 24, scale=0.5), "smear_lambda": rand(1, scale=0.5)}
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        w[p + "attn.c_q.weight"] = rand(n_head * head_dim, d, scale=s)
        w[p + "attn.c_k.weight"] = rand(n_kv_head * head_dim, d, scale=s)
        w[p + "attn.c_v.weight"] = rand(n_kv_head * head_dim, d, scale=s)
        w[p + "attn.c_proj.weight"] = rand(d, n_head * head_dim, scale=s)
        w[p + "mlp.c_fc.weight"] = rand(4 * d, d, scale=s)
        w[p + "mlp.c_proj.weight"] = rand(d, 4 * d, scale=0.5 * s)
        if upstream and i % 2 == (n_layer - 1) % 2:
            w[f"value_embeds.{i}.weight"] = rand(padded, n_kv_head * head_dim)
            w[p + "attn.ve_gate.weight"] = rand(n_kv_head, 12, scale=0.5)
    if upstream:
        w["resid_lambdas"] = 1 + rand(n_layer, scale=0.2)
        w["x0_lambdas"] = rand(n_layer, scale=0.2)
        w["backout_lambda"] = rand(1, scale=0.3)
    return w


def _rms(x: Tensor) -> Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps)


def _rope(x: Tensor, base: float) -> Tensor:
    """(B, T, H, D) rotated by -theta_t per pair (i, i + D/2), as nanochat's apply_rotary_emb."""
    t, dim = x.shape[1], x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv  # (T, D/2)
    cos, sin = ang.cos()[None, :, None], ang.sin()[None, :, None]
    x1, x2 = x[..., : dim // 2], x[..., dim // 2:]
    return torch.cat((x1 * cos + x2 * sin, -x1 * sin + x2 * cos), dim=-1)


def nanochat_logits(w: dict[str, Tensor], idx: Tensor, n_layer: int, head_dim: int, vocab: int,
                    windows: list[int], x0_gammas: dict[int, float] | None = None,
                    x0_before_smear: bool = False) -> Tensor:
    """Logits (B, T, vocab). windows[i]: keys to the left layer i sees besides the token itself.
    x0_gammas: layer -> gamma of the layers whose values come from x0 (v_from_x0); x0_before_smear
    reads that x0 before the smear instead (not what the Bank of Values code does)."""
    b, t = idx.shape
    x = _rms(w["transformer.wte.weight"][idx])
    before = x
    gate = w["smear_lambda"] * torch.sigmoid(x[:, 1:, :24] @ w["smear_gate.weight"].T)
    x = torch.cat((x[:, :1], x[:, 1:] + gate * x[:, :-1]), dim=1)
    x0, saved = x, None
    value_source = _rms(before if x0_before_smear else x0)
    pos = torch.arange(t)
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        if "resid_lambdas" in w:
            x = w["resid_lambdas"][i] * x + w["x0_lambdas"][i] * x0
        n = _rms(x)
        q = (n @ w[p + "attn.c_q.weight"].T).view(b, t, -1, head_dim)
        k = (n @ w[p + "attn.c_k.weight"].T).view(b, t, -1, head_dim)
        v = (n @ w[p + "attn.c_v.weight"].T).view(b, t, -1, head_dim)
        if x0_gammas and i in x0_gammas:
            v = x0_gammas[i] * (value_source @ w[p + "attn.c_v.weight"].T).view(b, t, -1, head_dim)
        if f"value_embeds.{i}.weight" in w:
            ve = w[f"value_embeds.{i}.weight"][idx].view(b, t, -1, head_dim)
            g = 3 * torch.sigmoid(n[..., :12] @ w[p + "attn.ve_gate.weight"].T)  # (B, T, kv heads)
            v = v + g[..., None] * ve
        q, k = 1.2 * _rms(_rope(q, 100000.0)), 1.2 * _rms(_rope(k, 100000.0))
        rep = q.shape[2] // k.shape[2]  # grouped-query attention: each KV head serves `rep` query heads
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
        allowed = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] <= windows[i])
        scores = scores.masked_fill(~allowed, float("-inf"))
        y = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, t, -1)
        x = x + y @ w[p + "attn.c_proj.weight"].T
        h = torch.relu(_rms(x) @ w[p + "mlp.c_fc.weight"].T).square()
        x = x + h @ w[p + "mlp.c_proj.weight"].T
        if i == n_layer // 2:
            saved = x
    if "backout_lambda" in w:
        x = x - w["backout_lambda"] * saved
    logits = _rms(x) @ w["lm_head.weight"].T
    return 15 * torch.tanh(logits[..., :vocab] / 15)
