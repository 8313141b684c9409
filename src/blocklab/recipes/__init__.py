"""Shipped training recipes: training configs (``*.yaml``, `blocklab train crammed-bert ...`) and the
main job's optimiser recipe per size and architecture (``main_job_optim.json``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The main job's optimiser settings per size and architecture, with the command that measured them
# (benchmarks/baseline_grid.py): the defaults of every run of compare and reproduce that does not set
# them itself (compare.run_configs).
RECIPE = Path(__file__).resolve().parent / "main_job_optim.json"

# `blocklab compare`'s default config: the TrainConfig fields its runs start from when no CONFIG.yaml is
# given (the file says why each differs from TrainConfig's default).
COMPARE_CONFIG = Path(__file__).resolve().parent / "compare.yaml"


def compare_defaults() -> str:
    """The fields of COMPARE_CONFIG as `blocklab compare --help` shows them: "batch_size=16 ..."."""
    import yaml

    return " ".join(f"{k}={v}" for k, v in (yaml.safe_load(COMPARE_CONFIG.read_text()) or {}).items())


def recipe_table() -> dict[str, Any]:
    """The shipped table: {"command": how it was measured, "sizes": {size: {arch or "default": optim}}}."""
    return json.loads(RECIPE.read_text())


def recipe_optim(arch: str, size: str) -> dict[str, Any]:
    """The optimiser settings (OptimConfig fields) of the main job's recipe for `arch` at `size`: the
    size's "default", then the block preset's entry ("sas-p"), then the value path's on pre-ln ("bov"),
    then the full name's ("sas-p+bov"), each over the one before; {} for a size the table leaves out
    (the OptimConfig defaults apply)."""
    rows = recipe_table()["sizes"].get(size)
    if rows is None:
        return {}
    from blocklab.model.presets import split_arch  # here: the CLI reads COMPARE_CONFIG without torch

    block, value_path = split_arch(arch)
    names = ["default", block]
    if value_path:
        names += [value_path] if block == "pre-ln" else []
        names.append(f"{block}+{value_path}")
    out: dict[str, Any] = {}
    for name in names:
        out.update(rows.get(name, {}))
    return out
