"""Which runs the claims need at a scale: the architectures of each setting, the learning-rate
sweep, the seeds already finished in the store, one TrainConfig per run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from blocklab.compare import Entry, run_configs, slug
from blocklab.model.config import ModelConfig
from blocklab.reproduce.metrics import METRICS, run_summary
from blocklab.reproduce.scales import Scale, run_group
from blocklab.statistics.claims import Check, Claim
from blocklab.training import TrainConfig
from blocklab.training.config import DEFAULT_SIZE, flat
from blocklab.util.errors import ConfigError


def check_settings(check: Check) -> list[str]:
    return [check.setting] + ([check.minus_setting] if check.minus_setting else [])


def needed_archs(claims: list[Claim]) -> dict[str, list[str]]:
    """The architectures the claims' measured checks read, by setting."""
    needed: dict[str, dict[str, None]] = {}
    for claim in claims:
        for check in claim.checks:
            if not METRICS[check.metric].exact:
                for setting in check_settings(check):
                    needed.setdefault(setting, {}).update(dict.fromkeys(check.archs))
    return {setting: list(archs) for setting, archs in needed.items()}


def recipe_rates(arch: str, scale: Scale) -> dict[str, float]:
    """The peak rates `arch` trains with at `scale` without a sweep: AdamW's lr, and Muon's with Muon."""
    optim = run_configs([Entry.parse(arch)], 1, Path("unused"), scale.base("steps"))[0][1].optim
    return {"lr": optim.lr, **({"muon_lr": optim.muon_lr} if optim.name == "muon" else {})}


def scaled_rates(arch: str, scale: Scale, factor: float) -> dict[str, float]:
    return {k: float(f"{v * factor:.3g}") for k, v in recipe_rates(arch, scale).items()}  # 0.03/3 = 0.01


def _entry(arch: str, scale: Scale, factor: float | None) -> Entry:
    """`arch` as the runs of `scale` train it: with its swept rates when a sweep chose `factor`."""
    if factor is None:
        return Entry.parse(arch)
    return Entry(arch, arch, train={"optim": scaled_rates(arch, scale, factor)})


def varied_fields(claims: list[Claim], scale: Scale) -> dict[str, str]:
    """The fields (dotted; the model's as its preset builds it) whose values differ between the
    architectures that one of the claims' measured checks compares, each with the first claim that
    varies it: what the claim's experiment varies itself, so what no override may set."""
    varied: dict[str, str] = {}
    base = scale.base("steps")
    for claim in claims:
        for check in claim.checks:
            if METRICS[check.metric].exact or len(check.archs) < 2:
                continue
            values = [_run_fields(arch, base) for arch in check.archs]
            for key in sorted(set().union(*values)):
                if len({repr(v.get(key)) for v in values}) > 1:
                    varied.setdefault(key, claim.id)
    return varied


def _run_fields(arch: str, base: dict) -> dict:
    """The dotted fields of `arch`'s run over `base`, the model's as built, but for its name and seed."""
    cfg = run_configs([Entry.parse(arch)], 1, Path("unused"), base)[0][1]
    model = ModelConfig.from_preset(arch, cfg.size or DEFAULT_SIZE, **cfg.model).to_dict()
    own = {k: v for k, v in cfg.to_dict().items() if k not in ("arch", "seed", "out_dir", "model")}
    return {**flat(own), **flat(model, "model.")}


def refuse_varied(claims: list[Claim], scale: Scale, fields: dict) -> None:
    """A ConfigError, one line, for the first of the TrainConfig `fields` (nested) that one of the
    claims varies itself (`varied_fields`): an override would make its architectures the same there."""
    if not fields:
        return
    varied = varied_fields(claims, scale)
    for key in flat(fields):
        for name, claim in varied.items():
            if key == name or key.startswith(name + ".") or name.startswith(key + "."):
                raise ConfigError(f"the override {key}=... is not allowed: claim {claim} varies {name} "
                                  "itself (its architectures differ there); leave it out, or leave that "
                                  "claim out (--claims).")


SWEEP = "lr-sweep"  # the sweep's group: OUT/<size>-lr-sweep


def sweep_plan(archs: list[str], scale: Scale, out: Path) -> list[tuple[str, float, TrainConfig]]:
    """The sweep's runs: seed 0 of every arch at every factor of `scale.lr_sweep`, `scale.sweep_steps`
    steps at equal steps, in OUT/<size>-lr-sweep/runs/<arch>-lrx<factor>-seed0."""
    base = {**scale.base("steps"), "max_steps": scale.sweep_steps}
    tried = [(arch, f, Entry(f"{arch}-lrx{f:.3g}", arch, train={"optim": scaled_rates(arch, scale, f)}))
             for arch in archs for f in scale.lr_sweep]
    configs = run_configs([e for *_, e in tried], 1, out / f"{scale.size}-{SWEEP}", base)
    return [(arch, f, cfg) for (arch, f, _), (_, cfg) in zip(tried, configs, strict=True)]


@dataclass
class Sweep:
    """One architecture's sweep: final validation loss per factor (NaN: diverged or failed) and the best."""

    arch: str
    losses: dict[float, float]
    rates: dict[str, float]  # the chosen peak rates
    # each factor's runs' training seconds, where their summary.json records them
    train_seconds: dict[float, list[float]] = field(default_factory=dict)

    @property
    def best(self) -> float:
        finite = {f: v for f, v in self.losses.items() if math.isfinite(v)}
        if not finite:
            raise ConfigError(f"every learning-rate sweep run of {self.arch} diverged or failed")
        return min(finite, key=finite.__getitem__)


def read_sweep(plan: list[tuple[str, float, TrainConfig]], scale: Scale, partial: bool = False
               ) -> dict[str, Sweep]:
    """Each arch's sweep from its finished runs. A missing run is an error, as for the claims' runs;
    with `partial`, its arch is left out."""
    sweeps: dict[str, Sweep] = {}
    missing = set()
    for arch, factor, cfg in plan:
        run = Path(cfg.out_dir)
        if not (run / "summary.json").is_file():
            if partial:
                missing.add(arch)
                continue
            raise ConfigError(not_finished(run))
        loss = run_summary(run).get("val_loss")
        sweeps.setdefault(arch, Sweep(arch, {}, {})).losses[factor] = float("nan") if loss is None else loss
    for arch in missing:
        sweeps.pop(arch, None)
    for sweep in sweeps.values():
        sweep.rates = scaled_rates(sweep.arch, scale, sweep.best)
    return sweeps


def not_finished(run: Path) -> str:
    return (f"{run} has not finished training: run `blocklab reproduce` without --no-train to train it "
            "(finished runs are reused), or add --partial to judge only the claims whose runs have finished.")


class NotFinished(ConfigError):
    """A run a check reads has not finished (with --partial, its claim reads pending)."""


def finished_seeds(group: Path, arch: str) -> int:
    """How many consecutive seeds of `arch` from 0 have finished in `group` (the committed run data)."""
    n = 0
    while (group / "runs" / f"{slug(arch)}-seed{n}" / "summary.json").is_file():
        n += 1
    return n


def plan(claims: list[Claim], scale: Scale, out: Path, factors: dict[str, float] | None = None,
         seeds: dict[tuple[str, str], int] | None = None) -> dict[str, list[tuple[Entry, TrainConfig]]]:
    """The runs the claims' measured checks need, by setting, as (entry, config) per seed: `seeds` maps
    (setting, arch) to its number of seeds (default `scale.seeds`); `factors` maps an arch to the
    multiple of its recipe's rates that its sweep chose (default: the recipe's)."""
    runs: dict[str, list[tuple[Entry, TrainConfig]]] = {}
    for setting, archs in needed_archs(claims).items():
        runs[setting] = [
            pair
            for arch in archs
            for pair in run_configs([_entry(arch, scale, (factors or {}).get(arch))],
                                    (seeds or {}).get((setting, arch), scale.seeds),
                                    out / scale.group(run_group(setting, arch)),
                                    scale.base(run_group(setting, arch)))
        ]
    return runs


def shared_run_seeds(seeds: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """`seeds` with every (setting, arch) pair that reads one run folder (`run_group`: the equal-FLOPs
    baseline reads the equal-steps runs) raised to the most seeds any of those pairs has: a seed trained
    for one setting is judged in the other too, as `--no-train` judges whatever the store holds."""
    most: dict[tuple[str, str], int] = {}
    for (setting, arch), n in seeds.items():
        key = (run_group(setting, arch), arch)
        most[key] = max(most.get(key, 0), n)
    return {(setting, arch): most[(run_group(setting, arch), arch)] for setting, arch in seeds}


def unique_runs(runs: dict[str, list[tuple[Entry, TrainConfig]]]) -> list[tuple[Entry, TrainConfig]]:
    """Every planned run once (two settings may read one run: `run_group`)."""
    return list({cfg.out_dir: (e, cfg) for group in runs.values() for e, cfg in group}.values())
