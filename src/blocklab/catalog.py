"""The catalog: what tooling reads about each variant, keyed by its name. It sits above the model.

The model's registry (`VALUE_PATHS`, model/value_paths/__init__.py) says what a value path *is*: its
module class, its equation in one line and its option defaults. What the rest of blocklab reads about
it is here, one `Variant` per value path:

    paper          the paper that proposes it or compares against it      interop/model_card.py
    scalar_titles  learned scalar (parameter name) -> title in plots      analysis/scalars.py
    roles          learned scalar -> optimizer role (`OWN_VALUE_WEIGHT`)  training/nanochat_recipe.py
    grid_rule      how a comparison grid's options read at a depth        compare/configs.py
    baseline_rule  the options under which it starts at a baseline        interop/retrofitting.py

and the papers of the block presets (`block_paper`, from a preset's ``reference``). A value path with
no entry here works everywhere: it has no paper, its scalars plot under their parameter names, they
train in the default optimizer groups, and grids and retrofits take its options as given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from blocklab.model.config import ModelConfig
from blocklab.model.presets import BLOCK_PRESETS
from blocklab.model.value_paths import VALUE_PATHS, target_layers

SIMPLIFYING = "He & Hofmann, *Simplifying Transformer Blocks*, ICLR 2024 (arXiv:2311.01906)"
VASWANI = "Vaswani et al., *Attention Is All You Need*, NeurIPS 2017 (arXiv:1706.03762)"
VALUE_RESIDUAL = ("Zhou et al., *Value Residual Learning for Alleviating Attention Concentration in "
                  "Transformers*, ACL 2025 (arXiv:2410.17897)")
BANK_OF_VALUES = ("*Do Value Vectors in Deep Layers Need Context from the Residual Stream?* "
                  "(arXiv:2606.02780)")
# optimizer role of a learned scalar: the weight on a layer's own values (ResFormer's lambda_2, x0-value's
# a), which nanochat's recipe trains with its residual scalars (training/nanochat_recipe.py)
OWN_VALUE_WEIGHT = "own-value weight"

GridRule = Callable[[dict[str, Any], int], dict[str, Any]]
BaselineRule = Callable[[Any, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Variant:
    """What tooling reads about one value path (see the module docstring for who reads which)."""

    paper: str | None = None
    scalar_titles: dict[str, str] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    grid_rule: GridRule | None = None
    baseline_rule: BaselineRule | None = None


# -- the rules some variants have ------------------------------------------------------------------
def resformer_baseline_options(options: Any, given: dict[str, Any]) -> dict[str, Any]:
    """The options under which a ResFormer (`options`: its resolved `ResFormerOptions`) starts where the
    baseline is (`given` win): learnable lambdas start at lambda_1 = 0, lambda_2 = 1, so
    V'_n = 0 V_1 + 1 V_n = V_n."""
    return {"lambda1": 0.0, "lambda2": 1.0, **given} if options.learnable else given


def v1_grid_options(options: dict[str, Any], n_layers: int) -> dict[str, Any]:
    """v1-value in a comparison grid: layer 0 is the source of V_1, where V_1 is the layer's own value,
    so a row that names it (Bank of Values Table 1's "all 12 layers", every-2 on an odd depth) means
    the rest."""
    if "layers" not in options:
        return options
    layers = target_layers(options["layers"], n_layers)
    return {**options, "layers": sorted(layers - {0})} if 0 in layers else options


RESFORMER_TITLES = {"lambda1": "ResFormer lambda_1 (weight on V_1)",
                    "lambda2": "ResFormer lambda_2 (weight on V_n)"}
BANK_TITLES = {"coef": "Bank of Values gamma_v"}
_RESFORMER = Variant(VALUE_RESIDUAL, RESFORMER_TITLES, {"lambda2": OWN_VALUE_WEIGHT},
                     baseline_rule=resformer_baseline_options)

VARIANTS: dict[str, Variant] = {
    # -- Value Residual Learning (Zhou et al.) and the baselines it compares against -----------------
    "resformer": _RESFORMER,
    "resformer-constant": _RESFORMER,
    "resformer-sparse": _RESFORMER,
    "resformer-learnable": _RESFORMER,
    "resformer-mix": Variant(VALUE_RESIDUAL, RESFORMER_TITLES, baseline_rule=resformer_baseline_options),
    "resformer-learnable-plus": _RESFORMER,
    "resformer-dense": Variant(VALUE_RESIDUAL, {"lambdas": "Dense-ResFormer lambdas"}),
    "svformer": Variant(VALUE_RESIDUAL),
    "neutreno": Variant(VALUE_RESIDUAL),
    "denseformer": Variant(VALUE_RESIDUAL, {"dwa": "DenseFormer weights"}),
    "cla": Variant(VALUE_RESIDUAL),
    "cross-layer-attn": Variant(VALUE_RESIDUAL),
    # -- Bank of Values and its relatives -----------------------------------------------------------
    "bov": Variant(BANK_OF_VALUES, BANK_TITLES),
    "bov-resformer": Variant(BANK_OF_VALUES, BANK_TITLES),
    "x0-value": Variant(BANK_OF_VALUES, BANK_TITLES, {"main": OWN_VALUE_WEIGHT}),
    "v1-value": Variant(BANK_OF_VALUES, BANK_TITLES, grid_rule=v1_grid_options),
    "v-scale": Variant(BANK_OF_VALUES, BANK_TITLES),
    "value-embed": Variant(BANK_OF_VALUES),
}


def variant(value_path: str) -> Variant:
    """The catalog entry of `value_path`; an empty one for a value path the catalog does not list."""
    return VARIANTS.get(value_path, Variant())


# -- what the readers ask --------------------------------------------------------------------------
def block_paper(block: str) -> str | None:
    """The paper of the block preset `block`, with the equation or figure its reference names."""
    reference = BLOCK_PRESETS[block].reference
    if reference.startswith("Simplifying"):
        return f"{SIMPLIFYING}, {reference.removeprefix('Simplifying ')}"
    return VASWANI if reference.startswith("Vaswani") else reference or None


def grid_options(value_path: str, options: dict[str, Any], n_layers: int) -> dict[str, Any]:
    """`options` of `value_path` as a comparison grid means them for a model of `n_layers`."""
    rule = variant(value_path).grid_rule
    return options if rule is None else rule(options, n_layers)


def baseline_options(cfg: ModelConfig, given: dict[str, Any]) -> dict[str, Any]:
    """Options under which `cfg`'s value path starts where a pretrained baseline is (`given` win)."""
    rule = variant(cfg.value_path).baseline_rule
    if rule is None:
        return given
    return rule(VALUE_PATHS[cfg.value_path].options(cfg.replace(value_path_options=given)), given)


def scalar_titles() -> dict[str, str]:
    """Learned scalar (its parameter name within a value path, e.g. ``lambda1``) -> its plot title."""
    titles: dict[str, str] = {}
    for entry in VARIANTS.values():
        for name, title in entry.scalar_titles.items():
            titles.setdefault(name, title)
    return titles


def scalar_role(name: str) -> str | None:
    """The optimizer role some value path gives the learned scalar `name` (a parameter name such as
    ``blocks.3.attn.values.lambda2.gain``), or None."""
    parts = name.split(".")
    if len(parts) < 3 or parts[-1] != "gain" or parts[-3] != "values":
        return None
    roles = {role for entry in VARIANTS.values() for short, role in entry.roles.items() if short == parts[-2]}
    return roles.pop() if len(roles) == 1 else None
