"""Value and projection maps: a trainable linear layer, the identity, or the reparameterisation

    W = alpha * W_init + beta * dW                                (Simplifying, Eq. 6)

with W_init a frozen identity or random orthogonal matrix (a buffer, so it is saved and loaded
with the weights) and dW trainable and zero at initialisation.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blocklab.model.gains import Gain

if TYPE_CHECKING:
    from blocklab.model.fields import ModelFields


def check_linear_forms(cfg: ModelFields) -> None:
    """The value and projection forms' rules: identity and reparameterised maps are square, and tied
    initialisations tie reparameterised maps (a ConfigError naming the field and what is allowed)."""
    shape = cfg.attention_shape
    forms = {"value_form": cfg.value_form, "first_value_form": cfg.first_value_form,
             "proj_form": cfg.proj_form}
    for name, form in forms.items():
        if form in ("identity", "reparam"):
            if shape.q_dim != cfg.d_model:
                cfg.fail(name, form, "identity and reparameterised maps need n_heads * head_dim == d_model.")
            if name != "proj_form" and shape.n_kv_heads != shape.n_heads:
                cfg.fail(name, form, "identity or reparameterised values need n_kv_heads == n_heads "
                         "(a grouped-query value is narrower than d_model).")
    if cfg.reparam_tie != "none":
        every_value = {cfg.value_form, cfg.first_value_form or cfg.value_form}
        if every_value != {"reparam"} or cfg.proj_form != "reparam" or cfg.reparam_init != "orthogonal":
            cfg.fail("reparam_tie", cfg.reparam_tie,
                     "tied initialisations need value_form, first_value_form and proj_form all 'reparam' "
                     "with reparam_init='orthogonal'.")


class ReparamLinear(nn.Module):
    """y = x W^T with W = alpha * W_init + beta * dW (weights in torch's (out, in) layout)."""

    w_init: Tensor  # a buffer (registered in __init__)

    def __init__(self, dim: int, init: str, alpha: float, beta: float, trainable_gains: bool):
        super().__init__()
        self.init_kind = init
        self.register_buffer("w_init", torch.empty(dim, dim))
        self.delta = nn.Parameter(torch.empty(dim, dim))
        self.skip = Gain(alpha, trainable_gains)  # alpha
        self.resid = Gain(beta, trainable_gains)  # beta

    def reset_parameters(self) -> None:
        with torch.no_grad():
            if self.init_kind == "identity":
                self.w_init.copy_(torch.eye(self.w_init.shape[0]))
            else:
                nn.init.orthogonal_(self.w_init)
            self.delta.zero_()
        self.skip.reset_parameters()
        self.resid.reset_parameters()

    def weight(self) -> Tensor:
        return self.skip(self.w_init) + self.resid(self.delta)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight())


def make_linear_map(form: str, d_in: int, d_out: int, bias: bool) -> nn.Module:
    """A trainable linear map or the identity."""
    if form == "linear":
        return nn.Linear(d_in, d_out, bias=bias)
    if form == "identity":
        return nn.Identity()
    raise AssertionError(f"{form} maps are built by make_value_map / make_proj_map")


def make_value_map(form: str, cfg: ModelFields) -> nn.Module:
    if form == "reparam":
        return ReparamLinear(cfg.d_model, cfg.reparam_init, cfg.value_skip_gain,
                             cfg.value_resid_gain, cfg.trainable_reparam_gains)
    return make_linear_map(form, cfg.d_model, cfg.attention_shape.kv_dim, cfg.bias)


def make_proj_map(cfg: ModelFields) -> nn.Module:
    if cfg.proj_form == "reparam":
        return ReparamLinear(cfg.d_model, cfg.reparam_init, cfg.proj_skip_gain,
                             cfg.proj_resid_gain, cfg.trainable_reparam_gains)
    return make_linear_map(cfg.proj_form, cfg.attention_shape.q_dim, cfg.d_model, cfg.bias)


def tie_reparam_inits(values: list[ReparamLinear], projs: list[ReparamLinear], mode: str) -> None:
    """Tied orthogonal W_init of Simplifying App. (Fig. 14), in torch's (out, in) layout.

    all-tied: W_P,init = W_V,init^T in every layer, so each W_V W_P is the identity.
    ll-tied:  only the last layer's W_P,init is tied, so that the product over all layers
              W_V,1 W_P,1 ... W_V,L W_P,L is the identity.
    """
    with torch.no_grad():
        if mode == "all-tied":
            for v, p in zip(values, projs, strict=True):
                p.w_init.copy_(v.w_init.T)
        elif mode == "ll-tied":
            # x -> x A_V1^T A_P1^T ...: the running map M = A_P,l A_V,l ... A_P,1 A_V,1
            m = torch.eye(values[0].w_init.shape[0], dtype=values[0].w_init.dtype)
            for v, p in zip(values[:-1], projs[:-1], strict=True):
                m = p.w_init @ v.w_init @ m
            projs[-1].w_init.copy_((values[-1].w_init @ m).T)


def init_projection_(weight: Tensor, cfg: ModelFields) -> None:
    """A Q, K or V projection's weight under the config's scheme: N(0, init_std), or nanochat's U(-s, s)."""
    if cfg.init_scheme == "nanochat":
        s = math.sqrt(3.0 / cfg.d_model)
        nn.init.uniform_(weight, -s, s)
    else:
        nn.init.normal_(weight, std=cfg.init_std)
