"""The initialisation schemes (``ModelConfig.init_scheme``): one function each, which names every tensor
of the model it sets, once. `Transformer.init_weights` picks one.

normal (the default), `init_normal`:

    token embedding   N(0, embed_init_std^2), or N(0, init_std^2) when it is None
    W_Q               N(0, query_init_std^2), or N(0, init_std^2) when it is None (0 zeros it)
    every other matrix (learned positions, W_K, W^V, W_O, MLP in and out, the smear gate W_s, an untied
    head)             N(0, init_std^2)

nanochat (karpathy/nanochat `GPT.init_weights`; the Bank of Values models, Table 8), `init_nanochat`,
with s = sqrt(3 / d_model), the bound of a uniform law whose std is 1 / sqrt(d_model):

    token embedding   N(0, 0.8^2)            head (untied)    N(0, 0.001^2)
    W_Q, W_K, W_V     U(-s, s)               W_O              0
    MLP in            U(-0.4 s, 0.4 s)       MLP out          0
    smear gate W_s    U(0, 0.02)             learned positions N(0, init_std^2) (nanochat has none)

W_Q ignores query_init_std under nanochat. With zero output projections every block starts as the
identity on the residual stream.

Under both: every bias 0; norms' scales 1 and shifts 0; every `Gain` (skip and branch gains, the
attention matrix's alpha, beta, gamma, the trunk's residual scalars, smear and backout strengths) its
own initial value. A W^V or W_O that is the identity has no tensor; a reparameterised one
(`ReparamLinear`, Simplifying Eq. 6) starts at its own init under both schemes: W_init the identity or
random orthogonal, dW = 0, its gains; with ``reparam_tie`` the ties of Simplifying's appendix
(`tie_reparam_inits`) then set W_O's W_init from W_V's. Last, each value path initialises every
tensor it owns other than W^V (tables, gates, lambdas; its `init_weights` hook, which reads the token
embedding: Bank of Values builds its tables from it), then the model-level module of a value path. A
value path that draws a W^V of its own (the fresh W^V behind Bank of Values' tables) draws it with
`init_projection_` (model/linear_maps.py), the scheme's law for W^V.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor, nn

from blocklab.model.linear_maps import ReparamLinear, tie_reparam_inits

if TYPE_CHECKING:
    from blocklab.model.block import Block
    from blocklab.model.config import ModelConfig
    from blocklab.model.trunk import Backout, Smear
    from blocklab.model.value_paths.base import SharedModule


class Transformer(Protocol):
    """What a scheme reads of the model (model/transformer.py's `Transformer`, which imports this module)."""

    @property
    def cfg(self) -> ModelConfig: ...
    @property
    def tok_emb(self) -> nn.Embedding: ...
    @property
    def pos_emb(self) -> nn.Embedding | None: ...
    @property
    def embed_norm(self) -> nn.Module | None: ...
    @property
    def smear(self) -> Smear | None: ...
    @property
    def backout(self) -> Backout | None: ...
    @property
    def norm(self) -> nn.Module: ...
    @property
    def head(self) -> nn.Linear | None: ...
    @property
    def value_shared(self) -> SharedModule | None: ...
    def block_list(self) -> list[Block]: ...


Law = Callable[[Tensor], object]  # draws a weight in place (nn.init.normal_ with its std, ...)


def normal(std: float) -> Law:
    return lambda w: nn.init.normal_(w, std=std)


def uniform(low: float, high: float) -> Law:
    return lambda w: nn.init.uniform_(w, low, high)


zeros: Law = nn.init.zeros_


@dataclass(frozen=True)
class BlockLaws:
    """The laws of a block's matrices under one scheme (`_init_block`); their biases start at 0."""

    q: Law
    k: Law
    v: Law  # a trainable W^V; identity and reparameterised ones keep their own
    o: Law  # a trainable W_O (likewise)
    fc: Law  # the MLP's first matrix
    out: Law  # the MLP's second matrix


@torch.no_grad()
def init_normal(model: Transformer) -> None:
    """The default scheme: N(0, init_std) matrices (the module docstring's table)."""
    cfg = model.cfg
    std = cfg.init_std
    nn.init.normal_(model.tok_emb.weight, std=std if cfg.embed_init_std is None else cfg.embed_init_std)
    if model.pos_emb is not None:
        nn.init.normal_(model.pos_emb.weight, std=std)
    _reset_norm(model.embed_norm)
    if model.smear is not None:
        nn.init.normal_(model.smear.gate.weight, std=std)
        model.smear.strength.reset_parameters()
    q_std = std if cfg.query_init_std is None else cfg.query_init_std
    laws = BlockLaws(q=normal(q_std), k=normal(std), v=normal(std), o=normal(std), fc=normal(std),
                     out=normal(std))
    for block in model.block_list():
        _init_block(block, laws)
    if model.backout is not None:
        model.backout.strength.reset_parameters()
    _reset_norm(model.norm)
    if model.head is not None:
        nn.init.normal_(model.head.weight, std=std)
    _tie_reparam_inits(model)
    _init_value_paths(model)


@torch.no_grad()
def init_nanochat(model: Transformer) -> None:
    """nanochat's scheme (the module docstring's table)."""
    cfg = model.cfg
    s = math.sqrt(3.0 / cfg.d_model)
    nn.init.normal_(model.tok_emb.weight, std=0.8)
    if model.pos_emb is not None:
        nn.init.normal_(model.pos_emb.weight, std=cfg.init_std)
    _reset_norm(model.embed_norm)
    if model.smear is not None:
        nn.init.uniform_(model.smear.gate.weight, 0.0, 0.02)
        model.smear.strength.reset_parameters()
    laws = BlockLaws(q=uniform(-s, s), k=uniform(-s, s), v=uniform(-s, s), o=zeros,
                     fc=uniform(-0.4 * s, 0.4 * s), out=zeros)
    for block in model.block_list():
        _init_block(block, laws)
    if model.backout is not None:
        model.backout.strength.reset_parameters()
    _reset_norm(model.norm)
    if model.head is not None:  # validation unties it under this scheme
        nn.init.normal_(model.head.weight, std=0.001)
    _tie_reparam_inits(model)
    _init_value_paths(model)


def _init_block(block: Block, laws: BlockLaws) -> None:
    """Every tensor of one block except its value path's own (`_init_value_paths`)."""
    _reset_norm(block.norm1)
    if block.has_second_norm:  # the parallel layout has one norm
        _reset_norm(block.norm2)
    for gain in (block.attn_skip, block.attn_branch, block.mlp_skip, block.mlp_branch):
        if gain is not None:  # a skip whose gain is 0 is absent
            gain.reset_parameters()
    if block.residual is not None:  # nanochat's lambda_r, lambda_0
        block.residual.resid_lambda.reset_parameters()
        block.residual.x0_lambda.reset_parameters()
    attn = block.attn
    _linear(attn.q, laws.q)
    if attn.k is not None:  # None in a layer that reuses another layer's keys (CLA)
        _linear(attn.k, laws.k)
    _value_or_output_map(getattr(attn.values, "w_v", None), laws.v)  # None: this layer owns no W^V
    _value_or_output_map(attn.proj, laws.o)
    if attn.form != "softmax":  # alpha I + beta A (- gamma C)
        attn.alpha.reset_parameters()
        attn.beta.reset_parameters()
        if attn.gamma is not None:  # shaped attention only
            attn.gamma.reset_parameters()
    _linear(block.mlp.fc, laws.fc)
    _linear(block.mlp.out, laws.out)


def _linear(linear: nn.Linear, law: Law) -> None:
    law(linear.weight)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)


def _value_or_output_map(module: nn.Module | None, law: Law) -> None:
    """W^V or W_O in any of its forms (model/linear_maps.py): a trainable map's weight follows `law`;
    a reparameterised map starts at its own init; the identity (and an absent W^V) has no tensor."""
    if isinstance(module, ReparamLinear):
        module.reset_parameters()
    elif isinstance(module, nn.Linear):
        _linear(module, law)
    elif not (module is None or isinstance(module, nn.Identity)):
        raise TypeError(f"no initialisation for a value or output map of type {type(module).__name__}")


def _reset_norm(norm: nn.Module | None) -> None:
    """A norm's scale 1 and shift 0 (RMSNorm, LayerNorm, the SAS code's RMSNorm); parameter-free norms
    and the identity ("none") have none."""
    reset = getattr(norm, "reset_parameters", None)
    if reset is not None:
        reset()


def _tie_reparam_inits(model: Transformer) -> None:
    """``reparam_tie`` (Simplifying App., Fig. 14): W_O's W_init from W_V's, after each map's own init;
    validation makes W_V and W_O reparameterised in every layer."""
    mode = model.cfg.reparam_tie
    if mode == "none":
        return
    blocks = model.block_list()
    values = [_reparam(getattr(b.attn.values, "w_v", None)) for b in blocks]
    tie_reparam_inits(values, [_reparam(b.attn.proj) for b in blocks], mode)


def _reparam(module: object) -> ReparamLinear:
    assert isinstance(module, ReparamLinear), "tied inits need reparameterised W_V and W_O in every layer"
    return module


def _init_value_paths(model: Transformer) -> None:
    """Each value path's own tensors (every one but W^V), then the model-level module of the value path:
    last, because Bank of Values builds its tables from the token embedding."""
    embedding = model.tok_emb.weight
    for block in model.block_list():
        block.attn.values.init_weights(embedding)
    if model.value_shared is not None:
        model.value_shared.init_weights(embedding)
