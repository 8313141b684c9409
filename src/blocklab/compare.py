"""`blocklab compare`: train architectures side by side on one budget, then write a report.

Every run shares the data, the tokenizer, the batch order (batches are a pure function of seed and
step) and the budget; only the architecture differs. Equal steps (hence equal tokens) by default;
equal FLOPs or equal wall-clock on request, so that a cheaper block gets more steps. Finished runs
are reused and an interrupted one resumes from its checkpoint.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from blocklab.config import ConfigError
from blocklab.training import TrainConfig, train
from blocklab.training.checkpoint import latest_checkpoint

BUDGETS = {"steps": "max_steps", "tokens": "max_tokens", "flops": "max_flops", "time": "max_time"}


@dataclass(frozen=True)
class Entry:
    """One architecture in a comparison: a label for the report, a preset name, model overrides."""

    label: str
    arch: str
    model: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Entry:
        return cls(text, text)


@dataclass(frozen=True)
class Grid:
    description: str
    entries: tuple[Entry, ...]
    train: dict[str, Any] = field(default_factory=dict)  # TrainConfig overrides of the paper's setup


def _bov_row(label: str, vp: str, layers: str, learnable: bool) -> Entry:
    return Entry(label, f"pre-ln+{vp}", {"value_path_options": {"layers": layers, "learnable": learnable}})


GRIDS: dict[str, Grid] = {
    "simplifying-fig5": Grid(
        "Simplifying Transformer Blocks Fig. 5: block variants on code at equal wall-clock time",
        tuple(Entry.parse(a) for a in ("pre-ln", "parallel", "v-skipinit", "sas", "sas-p", "sas-p-nonorm")),
        {"optim": {"schedule": "linear", "warmup_fraction": 0.05}}),
    "simplifying-table1": Grid(
        "Simplifying Transformer Blocks Table 1: masked-LM encoders (crammed-bert size), pretraining loss",
        tuple(Entry.parse(a) for a in ("pre-ln", "parallel", "sas", "sas-p")),
        {"data": {"objective": "mlm", "mask_prob": 0.25},
         "optim": {"schedule": "one-cycle", "betas": [0.9, 0.98], "eps": 1e-12, "grad_clip": 0.5}}),
    "resformer-fig7": Grid(
        "Value Residual Learning Fig. 7 (right): ResFormer against DenseFormer and NeuTRENO",
        tuple(Entry.parse(a) for a in ("pre-ln", "resformer", "denseformer", "neutreno",
                                         "resformer-learnable-plus")),
        {"optim": {"schedule": "cosine", "final_lr_fraction": 0.1}}),
    "bov-table1": Grid(
        "Bank of Values Table 1: substitutive value sources, target layers and coefficients (Muon, "
        "equal FLOPs)",
        (Entry("baseline", "pre-ln"),
         _bov_row("V1 last-third 1", "v1-value", "last-third", False),
         _bov_row("V1 last-third gamma", "v1-value", "last-third", True),
         _bov_row("x0W every-2 gamma", "x0-value", "every-2", True),
         _bov_row("x0W last-third 1", "x0-value", "last-third", False),
         _bov_row("x0W last-third gamma", "x0-value", "last-third", True),
         Entry("BoV", "pre-ln+bov")),
        {"optim": {"name": "muon", "schedule": "wsd"}}),
}


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) and key in ("data", "optim",
                                                                                          "model") else value
    return out


def run_configs(entries: list[Entry], seeds: int, out: Path, base: dict[str, Any]
                ) -> list[tuple[Entry, TrainConfig]]:
    """One TrainConfig per (entry, seed); everything but the architecture and seed comes from `base`."""
    configs = []
    for entry in entries:
        for seed in range(seeds):
            fields = _merge(base, {"arch": entry.arch, "seed": seed,
                                   "model": {**base.get("model", {}), **entry.model},
                                   "out_dir": str(out / "runs" / f"{_slug(entry.label)}-seed{seed}")})
            configs.append((entry, TrainConfig.from_dict(fields)))
    return configs


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-+." else "_" for c in label)


def _finished(cfg: TrainConfig) -> bool:
    run = Path(cfg.out_dir)
    if not (run / "summary.json").is_file():
        return False
    saved = yaml.safe_load((run / "config.yaml").read_text())
    if saved != yaml.safe_load(cfg.to_yaml()):
        raise ConfigError(f"{run} holds a finished run with a different config; use another --out, or "
                          "--fresh to retrain it.")
    return True


def compare(entries: list[Entry | str], out: str | Path, seeds: int = 1,
            base: dict[str, Any] | None = None, fresh: bool = False, log=print) -> Path:
    """Train every entry (unless already finished) and write `out/report.md` and `out/report.html`."""
    from blocklab.report import write_report

    entries = [Entry.parse(e) if isinstance(e, str) else e for e in entries]
    labels = [e.label for e in entries]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"compare got the same architecture twice: {labels}")
    out = Path(out)
    if fresh and out.exists():
        shutil.rmtree(out / "runs", ignore_errors=True)
    configs = run_configs(entries, seeds, out, base or {})
    for i, (_, cfg) in enumerate(configs, 1):
        name = Path(cfg.out_dir).name
        if _finished(cfg):
            log(f"[{i}/{len(configs)}] {name}: finished earlier, reused")
            continue
        resume = latest_checkpoint(cfg.out_dir) is not None
        log(f"[{i}/{len(configs)}] {name}: {'resuming' if resume else 'training'}")
        train(cfg, resume=resume)
    return write_report(configs, out)
