"""What a check measures on a run: the final losses, the model's size and cost, diagnostics read
from its checkpoint, each with its resolution and formula.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blocklab.model.config import ModelConfig
from blocklab.statistics import evidence
from blocklab.util.errors import ConfigError


def run_summary(run: Path) -> dict[str, Any]:
    return json.loads((run / "summary.json").read_text())


def _cached(run: Path, name: str, compute: Callable[[], float]) -> float:
    """A metric computed from a finished run's checkpoint, kept in the run directory."""
    path = run / "reproduce_metrics.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    if name not in saved:
        saved[name] = compute()
        path.write_text(json.dumps(saved, indent=2))
    return saved[name]


def readable_from_weights(run: Path, name: str) -> bool:
    """Whether metric `name` of a finished run can be read: kept in its reproduce_metrics.json, or its
    checkpoint there to compute it from (a store of small files keeps neither until it is measured)."""
    from blocklab.training.checkpoint import latest_checkpoint

    path = run / "reproduce_metrics.json"
    if path.is_file() and name in json.loads(path.read_text()):
        return True
    return latest_checkpoint(run) is not None


def deep_entropy(run: Path) -> float:
    """Importance entropy (Value Residual Eq. 11) averaged over the deeper half of the layers, on 4
    batches of 8 held-out windows."""
    from blocklab.analysis import diagnose_run

    def compute() -> float:
        per_layer = diagnose_run(run, batches=4, batch_size=8)["entropy"]["mean"]
        deep = per_layer[len(per_layer) // 2 :]
        return sum(deep) / len(deep)

    return _cached(run, "deep_entropy", compute)


def lambda_v1_slope(run: Path) -> float:
    """Least-squares slope over the layer index n of the final learned lambda_{n,1} (the weight on V_1)."""
    from blocklab.training.metrics import read_metrics

    scalars = [r["scalars"] for r in read_metrics(run / "metrics.jsonl", "train") if r.get("scalars")][-1]
    points = sorted(
        (int(k.split(".")[1]), v[0])
        for k, v in scalars.items()
        if k.startswith("blocks.") and k.endswith(".attn.values.lambda1")
    )
    if len(points) < 2:
        raise ConfigError(f"{run} logged lambda_1 in {len(points)} layer(s); the slope needs two or more")
    xs, ys = zip(*points, strict=True)
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def _params(cfg: ModelConfig) -> float:
    import torch

    from blocklab.accounting import count_parameters
    from blocklab.runtime import LanguageModel

    with torch.device("meta"):
        return float(count_parameters(LanguageModel(cfg)).total)


def _flops(cfg: ModelConfig) -> float:
    import torch

    from blocklab.accounting import flops_per_token
    from blocklab.runtime import LanguageModel

    with torch.device("meta"):
        return float(flops_per_token(LanguageModel(cfg)))


def _kv_bytes(cfg: ModelConfig) -> float:
    from blocklab.runtime.cache_layout import cache_bytes_per_token

    return float(cache_bytes_per_token(cfg)["per_token"])


def _table_layer_value_bytes(cfg: ModelConfig) -> float:
    """Value-cache bytes of the layers whose value path reads a token-indexed table or x0 (no V cache)."""
    from blocklab.model.value_paths import target_layers
    from blocklab.runtime.cache_layout import cache_bytes_per_token

    targets = target_layers(cfg.value_path_options.get("layers", "last-third"), cfg.n_layers)
    layers = cache_bytes_per_token(cfg)["layers"]
    return float(sum(layers[i]["value_bytes"] for i in targets))


# Seeds are added to an undecided loss check until its interval's half-width is below this.
RESOLUTION_NATS = 0.01


@dataclass(frozen=True)
class Metric:
    description: str
    exact: bool  # a property of the architecture (no seeds) rather than a measurement of a run
    # exact: ModelConfig -> float; measured: run directory -> float; timed: unused (None)
    compute: Callable[[Any], float] | None
    # the equivalence bound of a "no effect" verdict (evidence.NO_EFFECT_NATS for losses; None: none)
    equivalence: float | None = None
    # an undecided check gets more seeds while its interval's half-width exceeds this (None: always)
    resolution: float | None = None
    # measured per round of the interleaved timing pass after training (`time_throughput`), not per
    # seed from a run's logs: more seeds do not narrow it
    timed: bool = False
    # measured from the run's weights (its last checkpoint), then kept in reproduce_metrics.json: a run
    # whose weights are deleted once it finishes (the GPU campaign's) computes it first
    from_weights: bool = False


METRICS: dict[str, Metric] = {
    "val_loss": Metric("final validation loss (nats/token)", False, lambda run: run_summary(run)["val_loss"],
                       evidence.NO_EFFECT_NATS, RESOLUTION_NATS),
    "val_bpb": Metric("final validation bits per byte", False, lambda run: run_summary(run)["val_bpb"]),
    "tokens_per_s": Metric("training tokens/s, interleaved timing after training (per round)", False,
                           None, timed=True),
    "deep_entropy": Metric("importance entropy, deeper half of the layers (nats)", False, deep_entropy,
                           from_weights=True),
    "lambda_v1_slope": Metric("slope of learned lambda_1 over layers", False, lambda_v1_slope),
    "params": Metric("parameters", True, _params),
    "flops_per_token": Metric("training FLOPs per token", True, _flops),
    "kv_bytes_per_token": Metric("KV-cache bytes per token (bf16)", True, _kv_bytes),
    "table_layer_value_bytes": Metric(
        "value-cache bytes of the table layers", True, _table_layer_value_bytes
    ),
}


FORMULAS: dict[str, Callable[[ModelConfig], float]] = {
    "(L+1)/2L": lambda cfg: (cfg.n_layers + 1) / (2 * cfg.n_layers),
    "0": lambda _cfg: 0.0,
}
