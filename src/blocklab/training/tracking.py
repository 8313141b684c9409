"""What every experiment tracker shares (training/trackers.py holds the registry, and wandb_tracker.py
the one that needs a package of its own): the names `TrainConfig.logger` takes, where a group of runs
is tracked, the numbers of a metrics.jsonl row and a run's name. Kept apart so that the config and the
trackers read them without importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRACKER_NAMES = ("tensorboard", "wandb")  # the keys of trackers.TRACKERS, in its order
NONE = "none"


def logger_names(logger: Any) -> list[str] | str:
    """The tracker names `logger` gives (a name, a comma-separated string or a list; "none": none), or
    what is wrong with it in words."""
    if isinstance(logger, str):
        items: list[Any] = [n.strip() for n in logger.split(",") if n.strip()]
    elif isinstance(logger, (list, tuple)):
        items = list(logger)
    else:
        items = [logger]
    known = [*TRACKER_NAMES, NONE]
    for item in items:
        if item not in known:
            return f"choose from {', '.join(map(repr, known))}, one or a list (logger=[wandb,tensorboard])."
    return list(dict.fromkeys(n for n in items if n != NONE))


@dataclass(frozen=True)
class TrackTo:
    """Where a group of runs is tracked: the trackers' names and their project and group."""

    names: tuple[str, ...]
    project: str = "blocklab"
    group: str | None = None


def scalars_of(row: dict[str, Any]) -> dict[str, float]:
    """A metrics.jsonl row's numbers as trackers name them: ``<kind>/<field>`` for each number but the
    step, ``scalars/<gain>/<i>`` for each learned gain's value per head (a null val_bpb is left out)."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("step", "kind"):
            out[f"{row['kind']}/{key}"] = value
    for name, values in row.get("scalars", {}).items():
        for i, value in enumerate(values):
            out[f"scalars/{name}/{i}"] = value
    return out


def run_name(out_dir: str | Path) -> str:
    """A run's name in a tracker: the name of its folder `out_dir` (compare's and reproduce's
    "<arch>-seed<n>")."""
    return Path(out_dir).resolve().name
