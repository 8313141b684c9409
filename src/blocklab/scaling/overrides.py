"""The user's training config and ``key=value`` overrides over a ladder (`blocklab scaling [CONFIG.yaml]
[key=value ...]`, read as `blocklab train` reads them: `scaling.cli.user_fields`).

They apply to every run of the ladder (e.g. ``data.source=corpus/``: the ladder on the user's folder).
What the ladder itself sets stays the ladder's: the shape of each rung, its size preset, the tokens a run
(steps and the budget fields), batch_size, seq_len, eval_every, the learning-rate rule (optim.lr) and its
`train` fields. A config or override that would change one of those is refused, naming it and saying to
write a ladder file, rather than set aside silently or let through (a run of another shape or budget
would no longer be the ladder its report describes). The architecture, the seed and where a run lives
come from --archs, --seeds and --out. Fields that change only how a run is watched or stored
(`training.config.NOT_RESULTS`: progress bars, trackers, checkpoints, threads) are the user's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from blocklab.compare import merge
from blocklab.scaling.ladders import Ladder
from blocklab.training.config import BUDGET_FIELDS, NOT_RESULTS, flat
from blocklab.util.errors import ConfigError

LADDER_FILE = "write a ladder file that sets it (docs/scaling.md) and pass --ladder FILE.yaml"
# fields of a run that a flag of `blocklab scaling` sets, and the flag
BY_FLAG = {"arch": "--archs", "seed": "--seeds", "out_dir": "--out"}
# fields a ladder refuses outright: every rung starts from scratch
FROM_SCRATCH = ("init_from", "retrofit")


def with_user_fields(ladder: Ladder, name: str, fields: dict[str, Any]) -> Ladder:
    """`ladder` with the user's `fields` for every run (its `train` merged with them), after refusing
    any field the ladder sets (`check_user_fields`)."""
    if not fields:
        return ladder
    check_user_fields(ladder, name, fields)
    return replace(ladder, train=merge(ladder.train, fields))


def check_user_fields(ladder: Ladder, name: str, fields: dict[str, Any]) -> None:
    """Refuse the first of `fields` (nested, as read) that the ladder, or a flag, sets."""
    own = flat(ladder.base())
    per_rung = {k for rung in ladder.rungs for k in flat({"model": rung.model})}
    per_rung |= {"size"} if any(r.size for r in ladder.rungs) else set()
    for key, value in flat(fields).items():
        given = f"{key} = {value!r}"
        if key in NOT_RESULTS - {"out_dir"}:
            continue
        if key in BY_FLAG:
            raise ConfigError(f"{given} is not allowed: `blocklab scaling` sets it per run; use "
                              f"{BY_FLAG[key]}")
        if key.split(".")[0] in FROM_SCRATCH:
            raise ConfigError(f"{given} is not allowed: a ladder trains every rung from scratch")
        if key in per_rung or any(key.startswith(k + ".") for k in per_rung):
            values = ", ".join(f"{r.name}: {_rung_value(r, key)}" for r in ladder.rungs)
            raise ConfigError(f"{given} is not allowed: each rung of ladder {name} sets it ({values}); to "
                              f"change the rungs, {LADDER_FILE}")
        if key == "optim.lr":
            raise ConfigError(f"{given} is not allowed: ladder {name}'s learning-rate rule sets it "
                              f"({ladder.lr_rule}); for another rate, write a ladder file with `lr: <rate>` "
                              "(or `lr: per-rung`, or a sweep per rung `lr: {sweep: [0.333, 1, 3], "
                              "steps: N}`; docs/scaling.md) and pass --ladder FILE.yaml")
        if key in own or key in BUDGET_FIELDS:
            if own.get(key) == value:
                continue
            ladder_value = own.get(key, f"{ladder.steps} steps" if ladder.steps else "steps per rung")
            raise ConfigError(f"{given} is not allowed: it is ladder {name}'s own ({ladder_value!r}); to "
                              f"change it, {LADDER_FILE}")


def _rung_value(rung, key: str) -> Any:
    if key == "size":
        return rung.size
    return flat({"model": rung.model}).get(key, "(preset)")
