"""A ladder's short learning-rate sweep per rung (a ladder file's `lr: {sweep: [0.333, 1, 3], steps: 100}`,
`rungs.LrSweep`): which runs it trains, and the rate it chooses at each rung for each architecture.

At every rung, each architecture trains one short run per factor and seed: the sweep's seeds (one by
default), its steps, and
otherwise the fields of that rung's ladder runs (batch, sequence length, data, the user's overrides), at
peak rate factor x the architecture's recipe rate there (the rate `lr: recipe` would train it at; with
Muon, its Muon rate too). The runs live in `OUT/<ladder>/<rung>/sweep/runs/<arch>-x<factor>-seed<k>`,
beside the rung's `runs/`, in the run store's layout, so a finished one is reused and an interrupted one
resumes. Each (rung, architecture) takes the factor of the lowest final validation loss, averaged over the
sweep's seeds (`Sweep.best`, as `blocklab reproduce` chooses its sweep's; a factor with a diverged run has
a NaN mean, which never wins), and the ladder's runs of
that rung and architecture train at exactly factor x recipe rate (`chosen_rates`, read by
`ladders.plan`). A best factor at the grid's smallest or largest is at its edge (`at_edge`): a wider grid
might choose otherwise, and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blocklab.compare import Entry, run_configs
from blocklab.reproduce.planning import Sweep
from blocklab.scaling.rungs import Ladder, LrSweep, Rung, rung_steps
from blocklab.training import TrainConfig
from blocklab.training.config import BUDGET_FIELDS
from blocklab.util.errors import ConfigError

SWEEP_FOLDER = "sweep"  # a rung's sweep: OUT/<ladder>/<rung>/sweep/runs/<arch>-x<factor>-seed<k>
EDGE_NOTE = "at the edge: a wider grid might choose otherwise"


@dataclass(frozen=True)
class SweepRun:
    """One run of the sweep: its rung, architecture, factor of the recipe rate, and config."""

    rung: Rung
    arch: str
    factor: float
    cfg: TrainConfig


class SweepUnfinished(ConfigError):
    """The ladder's runs need the sweep's choice, and some of its runs have not finished."""


def recipe_rates(arch: str, fields: dict[str, Any]) -> dict[str, float]:
    """The peak rates `arch` trains with over `fields` (a rung's) at the recipe: AdamW's lr, and Muon's
    with Muon."""
    optim = run_configs([Entry.parse(arch)], 1, Path("unused"), fields)[0][1].optim
    return {"lr": optim.lr, **({"muon_lr": optim.muon_lr} if optim.name == "muon" else {})}


def swept_rates(arch: str, fields: dict[str, Any], factor: float) -> dict[str, float]:
    """`factor` x each of `arch`'s recipe rates over `fields`, exactly (no rounding)."""
    return {key: rate * factor for key, rate in recipe_rates(arch, fields).items()}


def factor_name(factor: float) -> str:
    return f"x{factor:g}"


def sweep_plan(archs: list[str], ladder: Ladder, root: Path) -> list[SweepRun]:
    """Every run of `ladder`'s sweep for `archs` in the store folder `root` (OUT/<ladder>), rung by rung
    in the ladder's order: each of the sweep's seeds of each architecture at each factor, `sweep.steps`
    steps."""
    sweep = _sweep(ladder)
    steps = rung_steps(ladder) if ladder.steps is None else {}
    runs = []
    for rung in ladder.rungs:
        if rung.name in steps and sweep.steps > steps[rung.name][1]:
            raise ConfigError(f"the learning-rate sweep's steps ({sweep.steps}) are more than rung "
                              f"{rung.name}'s {steps[rung.name][1]}: a sweep run is a short run; give the "
                              f"sweep at most {steps[rung.name][1]} steps in the ladder file")
        fields = ladder.rung_base(rung)
        short = {k: v for k, v in fields.items() if k not in BUDGET_FIELDS} | {"max_steps": sweep.steps}
        group = root / rung.name / SWEEP_FOLDER
        for arch in archs:
            for factor in sweep.factors:
                entry = Entry(f"{arch}-{factor_name(factor)}", arch,
                              train={"optim": swept_rates(arch, fields, factor)})
                seeds = run_configs([entry], sweep.seed + sweep.seeds, group, short)
                runs += [SweepRun(rung, arch, factor, c) for _, c in seeds if c.seed in sweep.seed_list]
    return runs


def _sweep(ladder: Ladder) -> LrSweep:
    if ladder.lr_sweep is None:
        raise ConfigError(f"ladder {ladder.description!r} has no learning-rate sweep (lr: {{sweep: ...}})")
    return ladder.lr_sweep


def finished(run: SweepRun) -> bool:
    return (Path(run.cfg.out_dir) / "summary.json").is_file()


def read_sweeps(runs: list[SweepRun], partial: bool = False) -> dict[tuple[str, str], Sweep]:
    """Each (rung, architecture)'s sweep from its finished runs: final validation loss per factor, the mean
    over the sweep's seeds (NaN: a run that diverged), and in `Sweep.rates` the rates of its best factor.
    An unfinished run raises SweepUnfinished; with `partial`, its (rung, architecture) is left out.
    `Sweep.train_seconds` keeps each factor's runs' training times where their summary.json records them."""
    from blocklab.reproduce.metrics import run_summary

    unfinished = [r for r in runs if not finished(r)]
    if unfinished and not partial:
        raise SweepUnfinished(unfinished_text(runs, unfinished))
    left_out = {(r.rung.name, r.arch) for r in unfinished}
    sweeps: dict[tuple[str, str], Sweep] = {}
    losses: dict[tuple[str, str, float], list[float]] = {}  # each factor's loss at each seed
    for run in runs:
        key = (run.rung.name, run.arch)
        if key in left_out:
            continue
        summary = run_summary(Path(run.cfg.out_dir))
        loss, seconds = summary.get("val_loss"), summary.get("train_time")
        losses.setdefault((*key, run.factor), []).append(
            float("nan") if not isinstance(loss, int | float) else float(loss))
        sweep = sweeps.setdefault(key, Sweep(run.arch, {}, {}))
        if isinstance(seconds, int | float):
            sweep.train_seconds.setdefault(run.factor, []).append(float(seconds))
    for (rung, arch, factor), values in losses.items():
        sweeps[(rung, arch)].losses[factor] = sum(values) / len(values)  # NaN if one diverged
    for (rung, arch), sweep in sweeps.items():
        try:
            best = sweep.best
        except ConfigError:
            raise ConfigError(f"every learning-rate sweep run of {arch} at rung {rung} diverged or failed, "
                              f"so no rate can be chosen there: see its runs in {rung}/{SWEEP_FOLDER}/runs/ "
                              "and try smaller factors") from None
        sweep.rates = next(_rates(r.cfg) for r in runs
                           if (r.rung.name, r.arch, r.factor) == (rung, arch, best))
    return sweeps


def _rates(cfg: TrainConfig) -> dict[str, float]:
    """The peak rates a sweep run trained at (its factor x the recipe's): the ladder's runs take them."""
    rates = {"lr": cfg.optim.lr}
    if cfg.optim.name == "muon":
        rates["muon_lr"] = cfg.optim.muon_lr
    return rates


def unfinished_text(runs: list[SweepRun], unfinished: list[SweepRun]) -> str:
    first = Path(unfinished[0].cfg.out_dir)  # OUT/<ladder>/<rung>/sweep/runs/<run>
    return (f"the learning-rate sweep of {first.parents[3].name} has not finished: {len(unfinished)} of "
            f"its {len(runs)} runs have no summary.json (the first: {first}), so the rates of the ladder's "
            "runs are not chosen yet; train the ladder (leave out --no-train; finished runs are reused)")


def chosen_rates(archs: list[str], ladder: Ladder, root: Path) -> dict[tuple[str, str], dict[str, float]]:
    """The peak rates the sweep chose for each (rung, architecture) of `archs`, from its finished runs in
    `root`; SweepUnfinished while one of them has not finished."""
    return {key: sweep.rates for key, sweep in read_sweeps(sweep_plan(archs, ladder, root)).items()}


def at_edge(sweep: Sweep, factors: tuple[float, ...]) -> bool:
    """Whether the sweep's best factor is the grid's smallest or largest."""
    return sweep.best in (min(factors), max(factors))


def with_rates(arch: str, rates: dict[str, float]) -> Entry:
    """`arch` as a ladder run trains it at the rates its sweep chose (in the folder it has without)."""
    return Entry(arch, arch, train={"optim": dict(rates)})
