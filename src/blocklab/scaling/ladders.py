"""Ladders: one recipe trained at several model sizes (rungs) on the same tokens, so that loss can be
fitted against parameters (`blocklab.scaling.fit`).

A rung widens and deepens the ladder's size preset together, as the papers' tables do (Value Residual
Learning, Table 4: 82M, 180M, 468M). Every rung trains the same steps of the same batch, so every size
sees the same tokens in the same order for a given seed (Fig. 6, left: 20B tokens at every size), or
steps in proportion to its parameters (a ladder file's `tokens_per_parameter`), and every architecture
trains at one learning-rate rule (`Ladder.lr_rule`; with a short sweep per rung, `scaling.sweeps`, the
rate it chose there for that architecture). The runs of a
rung live in `OUT/<ladder>/<rung>/runs/<arch>-seed<k>`, the layout and configs of `blocklab compare`,
so an interrupted ladder resumes and a finished run is reused.
"""

from __future__ import annotations

from pathlib import Path

from blocklab.compare import Entry, merge, run_configs
from blocklab.scaling.ladder_files import read_ladder_file
from blocklab.scaling.rungs import DEFAULT_ARCHS, Ladder, Rung, check_archs, rung_steps
from blocklab.scaling.shorter_runs import shorter_configs
from blocklab.scaling.sweeps import chosen_rates, with_rates
from blocklab.training import TrainConfig
from blocklab.util.errors import ConfigError

__all__ = ["DEFAULT_ARCHS", "LADDERS", "SHIPPED", "Ladder", "Rung", "check_archs", "get_ladder", "plan",
           "rung_steps", "store_name"]


# The shipped ladders: blocklab/recipes/ladders/<name>.yaml (cpu, gpu-resformer, toy), how each was sized
# in its comments. `--ladder FILE.yaml` reads a ladder of the user's own.
SHIPPED = Path(__file__).resolve().parent.parent / "recipes" / "ladders"


def _shipped() -> dict[str, Ladder]:
    order = ("cpu", "gpu-resformer", "toy")  # --list's and the reproduction page's order
    paths = sorted(SHIPPED.glob("*.yaml"), key=lambda p: (order.index(p.stem) if p.stem in order else 9,
                                                         p.stem))
    return {path.stem: read_ladder_file(path) for path in paths}


def get_ladder(name: str) -> Ladder:
    """A shipped ladder by name, or the ladder a YAML file holds (`ladder_files.read_ladder_file`)."""
    if name in LADDERS:
        return LADDERS[name]
    if name.endswith((".yaml", ".yml")) or Path(name).is_file():
        return read_ladder_file(name)
    raise ConfigError(f"ladder {name!r} is not allowed: choose one of {', '.join(LADDERS)}, or give a "
                      "ladder file (FILE.yaml, docs/scaling.md)")


def store_name(name: str) -> str:
    """The store folder of ladder `name` (a shipped name or a file): ladder-<name>, ladder-<file stem>."""
    return f"ladder-{name if name in LADDERS else Path(name).stem}"


def plan(
    archs: list[str], ladder: Ladder, out: Path, seeds: int | None = None,
    rates: dict[tuple[str, str], dict[str, float]] | None = None,
) -> list[tuple[Rung, Entry, TrainConfig]]:
    """Every run of the ladder, seed-major and the largest rung first within a seed, so that a ladder cut
    off part-way has whole seeds to fit and two runs at once finish together: (rung, entry, config).
    With a learning-rate sweep, each (rung, arch) trains at `rates[(rung name, arch)]` (default: the
    rates its finished sweep in `out` chose, `sweeps.chosen_rates`; SweepUnfinished before). With
    `shorter_runs`, each seed's shorter runs of the largest rung follow its runs there."""
    check_archs(archs)
    n = seeds or ladder.seeds
    steps = rung_steps(ladder) if ladder.steps is None else {}
    if ladder.lr_sweep is not None and rates is None:
        rates = chosen_rates(archs, ladder, out)
    by_rung, shorter = {}, {}
    for rung in ladder.rungs:
        fields = ladder.rung_base(rung)
        if rung.name in steps:
            fields = merge(fields, {"max_steps": steps[rung.name][1]})
        entries = [Entry.parse(a) if rates is None else with_rates(a, rates[(rung.name, a)]) for a in archs]
        by_rung[rung.name] = run_configs(entries, n, out / rung.name, fields)
        if ladder.shorter_runs and rung == ladder.rungs[-1]:
            shorter = shorter_configs(entries, n, out / rung.name, fields, ladder.shorter_runs, rung.name)
    runs = []
    for seed in range(n):
        for rung in reversed(ladder.rungs):
            runs += [(rung, e, cfg) for e, cfg in by_rung[rung.name] if cfg.seed == seed]
            if rung == ladder.rungs[-1]:  # the largest rung's shorter runs, longest first
                runs += [(rung, e, cfg) for k in sorted(shorter, reverse=True) for e, cfg in shorter[k]
                         if cfg.seed == seed]
    return runs


LADDERS: dict[str, Ladder] = _shipped()
