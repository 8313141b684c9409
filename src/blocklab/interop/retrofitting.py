"""Start a value-path variant from a pretrained baseline (a `value_path="standard"` model).

Every weight the two models share (embeddings, norms, W_Q, W_K, W_V where the variant keeps one,
W_O, MLPs, head) is copied. New parameters start, with ``start="baseline"`` (the default), where
the variant computes exactly what the baseline computed whenever its formula allows:

    identical at the start
      resformer-learnable   lambda_{n,1} = 0, lambda_{n,2} = 1: V'_n = 0 V_1 + 1 V_n = V_n
                            (any ResFormer family member with ``learnable=True``; the ablations
                            ``residual_on="query"/"key"`` too)
      resformer-learnable-plus  lambda = 0, so lambda_{n,1} = lambda softmax(lambda')_n = 0;
                            lambda_{n,2} = 1
      resformer-dense       lambda_{n,n} = 1, lambda_{n,i<n} = 0
      denseformer           DWA weights: 1 on the current block output (its own initialisation)
      value-embed           E_v = 0, so v = x W_V + g(x) * 0
    different at the start (the formula has no baseline point, or fixes its weights)
      resformer, -constant, -sparse   fixed lambdas (1/2, 1/2), (2, 1), (5, 1) in the target layers
      neutreno              fixed lambda = 0.4 (``lambda_=0`` would be the baseline)
      svformer              U_n = A_n V_1: layers n >= 2 lose W_V
      cla                   non-leader layers lose W_K and W_V and reuse the leader's
      cross-layer-attn      softmax over [K_n; K_1] adds keys
      bov                   v = gamma_v E_v[id] in the target layers, E_v = RMSNorm(E) W_V of that
                            layer's *pretrained* W_V (Bank of Values, Eq. 5; shared: the first
                            target layer's), gamma_v = 1; no W_V there any more
      x0-value, v1-value    v = c RMSNorm(x0) W_V, v = c V_1 in the target layers, c = 1

With ``start="paper"`` new parameters keep the variant's own initialisation (lambdas 1/2, nanochat's
random value embeddings ...); BoV tables still come from the pretrained W_V. Options given by the
caller always win over the defaults above.
"""

from __future__ import annotations

from typing import Any

import torch

from blocklab.catalog import baseline_options
from blocklab.model.presets import BLOCK_PRESETS, split_arch
from blocklab.model.value_paths import VALUE_PATHS
from blocklab.runtime import LanguageModel
from blocklab.util.errors import ConfigError

STARTS = ("baseline", "paper")


def _value_path_of(name: str, cfg) -> str:
    """The value path named by ``"resformer"`` or ``"pre-ln+resformer"``; the block must be the model's."""
    block, value_path = split_arch(name) if "+" in name else (None, name)
    if value_path not in VALUE_PATHS or value_path == "standard":
        raise ConfigError(f"retrofit needs a value path, got {name!r}: choose one of "
                          f"{', '.join(repr(v) for v in VALUE_PATHS if v != 'standard')}.")
    if block is not None:
        if block not in BLOCK_PRESETS:
            raise ConfigError(f"unknown block preset {block!r} in {name!r}; "
                              f"known: {', '.join(BLOCK_PRESETS)}.")
        for field, value in BLOCK_PRESETS[block].fields.items():
            if getattr(cfg, field) != value:
                raise ConfigError(f"retrofit keeps the baseline's block, but {block!r} sets {field} = "
                                  f"{value!r} and the model has {getattr(cfg, field)!r}; name only the "
                                  f"value path ({value_path!r}).")
    return value_path


def _value_modules(model: LanguageModel) -> list:
    """The value paths of every layer and the model-level module, which carry the retrofit rules."""
    paths = [block.attn.values for block in model.blocks]
    return paths + ([model.value_shared] if model.value_shared is not None else [])


def retrofit(model: LanguageModel, arch_or_value_path: str, *, start: str = "baseline",
             **options: Any) -> LanguageModel:
    """A new `LanguageModel` with `model`'s block and weights and the value path `arch_or_value_path`.

    `model` is a pretrained baseline (``value_path="standard"``), left unchanged. `options` are
    the value path's ``value_path_options``. See the module docstring for what starts identical.
    """
    cfg = model.cfg
    if cfg.value_path != "standard":
        raise ConfigError(f"retrofit starts from a baseline (value_path='standard'); the model has "
                          f"value_path={cfg.value_path!r}.")
    if start not in STARTS:
        raise ConfigError(f"retrofit start = {start!r} is not allowed: choose one of {', '.join(STARTS)}.")
    value_path = _value_path_of(arch_or_value_path, cfg)
    given = dict(options)
    if start == "baseline":  # the variant's rule in the catalog (blocklab/catalog.py)
        given = baseline_options(cfg.replace(value_path=value_path), given)
    new_cfg = cfg.replace(value_path=value_path, value_path_options=given)

    ref = next(model.parameters())
    with torch.device(ref.device):
        new = LanguageModel(new_cfg)
    new.to(ref.dtype)
    old_state, new_state = model.state_dict(), new.state_dict()
    new.load_state_dict({k: v for k, v in old_state.items() if k in new_state}, strict=False)
    with torch.no_grad():
        baseline = [block.attn.values for block in model.block_list()]
        for module in _value_modules(new):
            module.init_from_baseline(new.tok_emb.weight, baseline)  # BoV tables from the pretrained W_V
            if start == "baseline":
                module.start_at_baseline()
    return new.train(model.training)
