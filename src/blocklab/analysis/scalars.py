"""The learned scalars of a run over training, read from its `metrics.jsonl`.

The trainer logs every trainable gain under its parameter name without ``.gain`` (train records,
``"scalars": {name: [floats]}``). Here they are grouped into panels, one line per layer, as the
papers plot them:

- shaped attention alpha, beta, gamma per head (Simplifying Figs. 16-18: mean over heads with a
  band of one standard deviation, and a second panel with one line per layer and head);
- beta_FF and the other block gains (Fig. 19);
- the "residual-skip" ratios beta_V / alpha_V and beta_P / alpha_P of the Eq. (6)
  reparameterisation (Simplifying Fig. 4, which shows they go to 0 except in the first layer);
- ResFormer lambda_1, lambda_2 per layer, Bank of Values gamma_v, DenseFormer weights and any
  other scalar, one line per entry.
"""

from __future__ import annotations

import math
import re
from typing import Any

from blocklab.catalog import scalar_titles
from blocklab.training.metrics import read_metrics as read_metrics  # the one reader, re-exported here

HEADWISE = {"attn.alpha", "attn.beta", "attn.gamma"}
RATIOS = {"attn.values.w_v": "beta_V / alpha_V (value reparam, Simplifying Fig. 4)",
          "attn.proj": "beta_P / alpha_P (projection reparam, Simplifying Fig. 4)"}
TITLES = {"attn.alpha": "shaped attention alpha (on I)", "attn.beta": "shaped attention beta (on A)",
          "attn.gamma": "shaped attention gamma (on C)", "mlp_branch": "beta_FF (MLP branch)",
          "mlp_skip": "alpha_FF (MLP skip)", "attn_branch": "beta_SA (attention branch)",
          "attn_skip": "alpha_SA (attention skip)"}


def titles() -> dict[str, str]:
    """Panel title by parameter name within a block: the block's gains' and the value paths' learned
    scalars', which the catalog names (blocklab/catalog.py)."""
    return {**{f"attn.values.{name}": title for name, title in scalar_titles().items()}, **TITLES}


_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)")
_SHARED = re.compile(r"value_shared\.(\w+)\.(\d+)")  # per-layer weights of a model-level module


def _mean_std(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def scalar_series(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Group the scalars of the train records into panels.

    Returns {"steps": [...], "panels": {title: {"lines": {label: [...]}, "bands": {label: [...]}}}}
    with one value per step (NaN where a record lacks the scalar); "bands" holds the standard
    deviation over heads of the head-wise gains, whose "..., per head" panels have a line "L{i}.h{j}"
    for head j of layer i.
    """
    rows = [r for r in records if r.get("kind", "train") == "train" and r.get("scalars")]
    steps = [r["step"] for r in rows]
    names = sorted({name for r in rows for name in r["scalars"]})
    nan = float("nan")

    def values(name: str) -> list[list[float]]:
        return [[float(x) for x in r["scalars"][name]] if name in r["scalars"] else [] for r in rows]

    panels: dict[str, dict[str, dict[str, list[float]]]] = {}
    panel_titles = titles()

    def add(title: str, label: str, line: list[float], band: list[float] | None = None) -> None:
        panel = panels.setdefault(title, {"lines": {}, "bands": {}})
        panel["lines"][label] = line
        if band is not None:
            panel["bands"][label] = band

    for name in names:
        match, shared = _BLOCK.fullmatch(name), _SHARED.fullmatch(name)
        if match:
            layer, suffix = f"L{match[1]}", match[2]
        elif shared:  # plotted with the value path's per-layer scalars of the same name
            layer, suffix = f"L{shared[2]}", f"attn.values.{shared[1]}"
        else:
            layer, suffix = "", name
        owner = suffix.rsplit(".", 1)[0]
        if owner in RATIOS and suffix.endswith((".skip", ".resid")):
            if suffix.endswith(".skip"):  # one ratio line from the (skip, resid) pair
                resid = values(name[: -len("skip")] + "resid")
                ratio = [r[0] / s[0] if r and s and s[0] != 0 else nan for r, s in zip(resid, values(name),
                                                                                       strict=True)]
                add(RATIOS[owner], layer, ratio)
            continue
        title = panel_titles.get(suffix, suffix)
        series = values(name)
        if suffix in HEADWISE:
            stats = [_mean_std(v) if v else (nan, nan) for v in series]
            add(title, layer, [m for m, _ in stats], [s for _, s in stats])
            for h in range(max((len(v) for v in series), default=0)):
                add(f"{title}, per head", f"{layer}.h{h}", [v[h] if h < len(v) else nan for v in series])
            continue
        width = max((len(v) for v in series), default=0)
        for j in range(width):  # vectors that are not per head: one line per entry
            entry = f"[{j}]" if width > 1 else ""
            add(title, (layer + entry) or name, [v[j] if j < len(v) else nan for v in series])
    return {"steps": steps, "panels": panels}
