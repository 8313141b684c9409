"""`reproduce`: train (or reuse) the runs the claims need, add seeds while a check is undecided, and
give each claim its verdict.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blocklab.compare import Entry
from blocklab.reproduce.campaign import record_launch
from blocklab.reproduce.judge import ClaimResult, Measurements, Reproduction, judge_claims, more_seeds
from blocklab.reproduce.metrics import METRICS
from blocklab.reproduce.planning import (
    Sweep,
    finished_seeds,
    needed_archs,
    plan,
    read_sweep,
    refuse_varied,
    shared_run_seeds,
    sweep_plan,
    unique_runs,
)
from blocklab.reproduce.scales import SCALES, Scale, run_group, with_overrides
from blocklab.reproduce.timing import time_throughput
from blocklab.reproduce.tracking import with_tracking
from blocklab.statistics.claims import Claim
from blocklab.training import TrainConfig
from blocklab.training.config import NOT_RESULTS, check_saved_config
from blocklab.util.errors import ConfigError


def _scale(scale: str | Scale, name: str | None = None) -> tuple[str, Scale]:
    if isinstance(scale, Scale):
        return name or "custom", scale
    if scale not in SCALES:
        raise ConfigError(f"scale {scale!r} is not allowed: choose one of {', '.join(SCALES)}.")
    return scale, SCALES[scale]


# The seeds each (setting, arch) was given when undecided checks asked for more, kept so that a call
# cut off before they all trained (a GPU campaign's piece) plans the same seeds again, wherever it
# stopped: OUT/<scale>/seeds.json, {setting: {arch: seeds}}.
SEEDS = "seeds.json"


def planned_seeds(root: Path) -> dict[tuple[str, str], int]:
    path = root / SEEDS
    if not path.is_file():
        return {}
    return {(s, a): n for s, archs in json.loads(path.read_text()).items() for a, n in archs.items()}


def _keep_planned_seeds(root: Path, seeds: dict[tuple[str, str], int], scale: Scale) -> None:
    merged = {**planned_seeds(root), **{k: n for k, n in seeds.items() if n > scale.seeds}}
    nested: dict[str, dict[str, int]] = {}
    for (setting, arch), n in sorted(merged.items()):
        nested.setdefault(setting, {})[arch] = n
    root.mkdir(parents=True, exist_ok=True)
    (root / SEEDS).write_text(json.dumps(nested, indent=2) + "\n")


def starting_seeds(needed: dict[str, list[str]], scale: Scale, root: Path) -> dict[tuple[str, str], int]:
    """Seeds per (setting, arch): the scale's, as many as have finished in the store, or as many as an
    earlier call planned (`SEEDS`), whichever is most; pairs that read one run folder share the most
    (`shared_run_seeds`)."""
    planned = planned_seeds(root)
    seeds = {(setting, arch): max(scale.seeds, planned.get((setting, arch), 0),
                                  finished_seeds(root / scale.group(run_group(setting, arch)), arch))
             for setting, archs in needed.items() for arch in archs}
    return shared_run_seeds(seeds)


def check_stored(configs: list[TrainConfig]) -> None:
    """Refuse a finished run in the store whose config differs from the one planned for it (the
    overrides included) outside NOT_RESULTS: the check a training call makes before reusing a run
    (`launch.store.check_reusable`), made without training too, so that no verdict reads runs of
    another config."""
    for cfg in configs:
        run = Path(cfg.out_dir)
        if (run / "summary.json").is_file():
            check_saved_config(run, cfg, NOT_RESULTS, f"{run} holds a finished run",
                               "give the config and overrides it was trained with, or another --out.")


def scale_claims(claims: list[Claim], scale: Scale) -> list[Claim]:
    """The claims judged at `scale`: those without a tag it leaves out."""
    return [c for c in claims if not set(c.tags) & set(scale.leaves_out)]


def _selected(claims: list[Claim], scale: str | Scale, name: str | None, overrides: dict[str, Any] | None
              ) -> tuple[str, Scale, list[Claim]]:
    """The scale's name, the scale with the TrainConfig `overrides` (nested, as a YAML config gives them)
    on every run of every claim and sweep (`scales.with_overrides`; none that a claim varies itself:
    `refuse_varied`), and the claims judged at it. Each run records its config (config.yaml)."""
    name, scale = _scale(scale, name)
    claims = scale_claims(claims, scale)
    if not claims:
        raise ConfigError("no claim selected: see `blocklab reproduce --list`.")
    refuse_varied(claims, scale, overrides or {})
    return name, with_overrides(scale, overrides), claims


def _plannable(claims: list[Claim], ready: set[str] | None, train: bool) -> list[Claim]:
    """The claims to plan: all of them, but without training only those whose architectures' sweeps
    have finished (`ready`; None: no sweep)."""
    if ready is not None and not train:
        return [c for c in claims if {a for k in c.checks for a in k.archs
                                      if not METRICS[k.metric].exact} <= ready]
    return claims


@dataclass
class Trainer:
    """How `reproduce` gets its runs: trained with `launcher` (finished runs reused), each launch
    recorded under `root` (`campaign.record_launch`) and kept in `launches`; or, with `train` off,
    only the stored runs checked against the configs planned for them (`check_stored`)."""

    train: bool
    log: Callable[[str], Any]
    launcher: Any
    tracking: dict[str, Any] | None
    out: str | Path
    root: Path
    launches: list[dict[str, Any]] = field(default_factory=list)

    def run(self, configs: list[tuple[Any, TrainConfig]], what: str, began: float) -> None:
        """Train `configs` (the launch's time counted from `began`); without training, check the
        stored ones against them."""
        from blocklab.launch import RunsFailed, train_runs

        if not self.train:
            return check_stored([cfg for _, cfg in configs])
        self.log(f"{what}: {len(configs)} runs")
        launch = train_runs(with_tracking(configs, self.tracking, self.out), self.launcher, self.log)
        launch.raise_if_pending("reproduce", "judge the claims")
        if launch.failed:
            raise RunsFailed(launch.failed)
        self.launches.append(launch.describe())
        record_launch(self.root, launch, time.perf_counter() - began)


def sweep_rates(trainer: Trainer, needed: dict[str, list[str]], scale: Scale, partial: bool
                ) -> dict[str, Sweep]:
    """With a learning-rate sweep (`Scale.lr_sweep`), every needed architecture's sweep trained and
    read (`read_sweep`; without training and with `partial`, the unfinished ones left out); without
    one, none."""
    if not scale.lr_sweep:
        return {}
    archs = list(dict.fromkeys(a for archs in needed.values() for a in archs))
    swept = sweep_plan(archs, scale, trainer.root)
    trainer.run([(None, cfg) for *_, cfg in swept], "learning-rate sweep", time.perf_counter())
    return read_sweep(swept, scale, partial=partial and not trainer.train)


@dataclass
class Judged:
    """The last round of `judge_adding_seeds`: each claim's result, the runs planned per setting and
    what was measured of them."""

    results: list[ClaimResult]
    runs: dict[str, list[tuple[Entry, TrainConfig]]]
    measured: Measurements


def train_planned(trainer: Trainer, claims: list[Claim], scale: Scale, factors: dict[str, float] | None,
                  seeds: dict[tuple[str, str], int]) -> dict[str, list[tuple[Entry, TrainConfig]]]:
    """The claims' runs planned with `seeds` (`planning.plan`) and trained; once training is over, the
    throughput checks timed in interleaved rounds on this machine, never from the runs' logs."""
    runs = plan(claims, scale, trainer.root, factors, seeds)
    began = time.perf_counter()
    for setting, configs in runs.items() if trainer.train else ():
        trainer.log(f"{setting}: {len(configs)} runs in {trainer.root / scale.group(setting)}")
    trainer.run(unique_runs(runs), "claims", began)
    if trainer.train:
        time_throughput(claims, scale, trainer.root, runs, trainer.launches[-1].get("threads"), trainer.log)
    return runs


def judge_adding_seeds(trainer: Trainer, claims: list[Claim], scale: Scale, sweeps: dict[str, Sweep],
                       ready: set[str] | None, seeds: dict[tuple[str, str], int], partial: bool) -> Judged:
    """Train the claims' runs with each architecture's best rate from `sweeps`, and judge them; while
    training and a measured check is undecided with fewer than `scale.max_seeds` seeds (`more_seeds`),
    its (setting, arch) pairs get more seeds (kept in `SEEDS`; with them every pair that reads the same
    runs, so the verdicts are those `--no-train` gives on the store this leaves), and the claims are
    trained and judged again."""
    factors = {arch: s.best for arch, s in sweeps.items()} or None
    claims_to_plan = _plannable(claims, ready, trainer.train)
    while True:
        runs = train_planned(trainer, claims_to_plan, scale, factors, seeds)
        measured = Measurements(runs)
        results = judge_claims(claims, scale, measured, ready, partial and not trainer.train)
        more = more_seeds(results, seeds, scale) if trainer.train else {}
        if not more:
            return Judged(results, runs, measured)
        trainer.log(f"undecided checks: {len(more)} (setting, arch) pairs get more seeds, "
                    f"up to {max(more.values())}")
        seeds.update(shared_run_seeds({**seeds, **more}))
        _keep_planned_seeds(trainer.root, seeds, scale)


def reproduce(
    claims: list[Claim],
    scale: str | Scale = "quick",
    out: str | Path = "runs/reproduce",
    train: bool = True,
    log=print,
    launcher=None,
    name: str | None = None,
    partial: bool = False,
    tracking: dict[str, Any] | None = None,  # logger fields for every run (`reproduce.tracking`)
    overrides: dict[str, Any] | None = None,
) -> Reproduction:
    """Train (or reuse) the runs the claims need at `scale` under `OUT/<scale>/` with `launcher`
    (`blocklab.launch`; default one at a time here) and give each claim its verdict;
    `blocklab.reproduce.page.write_reproduction` writes the report.

    With a sweep (`Scale.lr_sweep`), every architecture's sweep trains first and its runs take the
    best rate. Every (setting, arch) gets `scale.seeds` seeds, or as many as have finished in the
    store or an earlier call planned (`SEEDS`); then, while a measured check is undecided
    (`CheckResult.undecided`) and has fewer than `scale.max_seeds` seeds, its architectures get
    `scale.seeds` more and the claims are judged again. Throughput checks read an interleaved timing
    pass after training (`time_throughput`), never the runs' logged tokens/s.
    With `train=False` nothing trains: the verdicts come from the runs in the store, exactly as a
    training call left them; with `partial` too, a claim whose runs have not all finished reads
    pending instead of stopping the call. `name` names a `scale` given as a Scale (its folder;
    default "custom"). `overrides`: TrainConfig fields for every run (`_selected`); a finished run of
    another config is refused, training or not (`check_stored`).

    Raises RunsPending when the launcher left runs queued, and RunsFailed when some failed (a claim
    cannot be judged on missing seeds)."""
    start = time.perf_counter()
    name, scale, claims = _selected(claims, scale, name, overrides)
    root = Path(out) / name
    trainer = Trainer(train, log, launcher, tracking, out, root)
    needed = needed_archs(claims)
    sweeps = sweep_rates(trainer, needed, scale, partial)
    ready = set(sweeps) if scale.lr_sweep else None  # the archs whose rates are known
    judged = judge_adding_seeds(trainer, claims, scale, sweeps, ready, starting_seeds(needed, scale, root),
                                partial)
    return Reproduction(judged.results, scale, name, judged.runs, time.perf_counter() - start,
                        trainer.launches[-1] if trainer.launches else None, sweeps, root, judged.measured)
