"""The entries of a comparison (a label, a preset, overrides) and the papers' experiments as named
grids (`blocklab compare --grid`, `--list-grids`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Entry:
    """One architecture in a comparison: a label for the report, a preset name, model overrides and
    TrainConfig overrides of its own (a learning rate chosen by a sweep)."""

    label: str
    arch: str
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Entry:
        return cls(text, text)


@dataclass(frozen=True)
class Grid:
    description: str
    budget: str  # the paper's budget kind, a key of BUDGETS: the default when the user gives none
    entries: tuple[Entry, ...]
    train: dict[str, Any] = field(default_factory=dict)  # TrainConfig overrides of the paper's setup
    size: str = "tiny"  # the size when the user gives none: the paper's model at a CPU width


def _bov_row(label: str, vp: str, layers: str, learnable: bool, **options: Any) -> Entry:
    return Entry(label, f"pre-ln+{vp}", {"value_path_options": {"layers": layers, "learnable": learnable,
                                                                 **options}})


# The Bank of Values code's x0 W_V rows read x0 after the embedding norm and the smear (the trunk's
# stream), not the token's own embedding: they differ once the smear has trained.
_STREAM = {"x0": "stream"}


def _resformer_row(label: str, learnable: bool) -> Entry:
    """V + V_1 in the last third: fixed 1/2 and 1/2, or learned from the baseline (lambda_2 = 1 on
    V, lambda_1 = 0 on V_1), as Bank of Values' learned additive rows start (alpha 1, beta 0)."""
    start = {"lambda1": 0.0, "lambda2": 1.0} if learnable else {}
    return Entry(label, "pre-ln+resformer", {"value_path_options": {"layers": "last-third",
                                                                     "learnable": learnable, **start}})


GRIDS: dict[str, Grid] = {
    "simplifying-fig5": Grid(
        "Simplifying Transformer Blocks Fig. 5: block variants on code at equal wall-clock time",
        "time",
        tuple(Entry.parse(a) for a in ("pre-ln", "parallel", "v-skipinit", "sas", "sas-p", "sas-p-nonorm")),
        {"optim": {"schedule": "linear", "warmup_fraction": 0.05}}),
    "simplifying-table1": Grid(
        "Simplifying Transformer Blocks Table 1: masked-LM encoders (crammed-bert size), pretraining loss "
        "at equal wall-clock time (the paper: 24 hours on one GPU)",
        "time",
        tuple(Entry.parse(a) for a in ("pre-ln", "parallel", "v-skipinit", "sas", "sas-p")),
        {"data": {"objective": "mlm", "mask_prob": 0.25},
         "optim": {"schedule": "one-cycle", "betas": [0.9, 0.98], "eps": 1e-12, "grad_clip": 0.5}}),
    "resformer-fig7": Grid(
        "Value Residual Learning Fig. 7 (right): ResFormer against DenseFormer, NeuTRENO (lambda 0.4) "
        "and ResFormer + NeuTRENO (lambda 0.2, as the paper's code) at equal steps (the paper: 10,000 "
        "steps, warmup 1,200, cosine to 10%)",
        "steps",
        (*(Entry.parse(a) for a in ("pre-ln", "resformer", "denseformer", "neutreno")),
         Entry("resformer+neutreno", "pre-ln+resformer", {"value_path_options": {"neutreno": 0.2}})),
        {"optim": {"schedule": "cosine", "final_lr_fraction": 0.1, "warmup_fraction": 0.12}}),
    "bov-table1": Grid(
        "Bank of Values Table 1 on nanochat's trunk (size nanochat-tiny by default; nanochat-d12 is the "
        "paper's) and nanochat's optimiser recipe: substitutive and additive value sources, target "
        "layers and coefficients (equal FLOPs); labels start with the paper's row",
        "flops",
        (Entry("1 V", "pre-ln"),
         _bov_row("2 V last-third gamma", "v-scale", "last-third", True),
         _bov_row("3 V1 all 1", "v1-value", "all", False),
         _bov_row("4 V1 every-2 gamma", "v1-value", "every-2", True),
         _bov_row("5 V1 last-third 1", "v1-value", "last-third", False),
         _bov_row("6 V1 last-third gamma", "v1-value", "last-third", True),
         _bov_row("7 x0W every-2 gamma", "x0-value", "every-2", True, **_STREAM),
         _bov_row("8 x0W last-third 1", "x0-value", "last-third", False, **_STREAM),
         _bov_row("9 x0W last-third gamma", "x0-value", "last-third", True, **_STREAM),
         _resformer_row("10 V+V1 last-third 0.5", False),
         _resformer_row("11 V+V1 last-third gamma", True),
         Entry("12 V+x0W last-third 0.5", "pre-ln+x0-value",
               {"value_path_options": {"layers": "last-third", "learnable": False, "add": True, **_STREAM}}),
         Entry("13 V+x0W last-third gamma", "pre-ln+x0-value",
               {"value_path_options": {"layers": "last-third", "learnable": True, "add": True, **_STREAM}}),
         Entry("BoV", "pre-ln+bov")),
        {"optim": {"name": "nanochat", "schedule": "wsd"}}, size="nanochat-tiny"),
}
