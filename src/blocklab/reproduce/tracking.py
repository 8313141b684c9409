"""`blocklab reproduce --logger wandb`: the campaign's runs and the report's figures in a tracker
(`training.trackers`). Each run's group is its setting's folder (``OUT/<scale>/<setting>``), its name
the run's folder (``<arch>-seed<n>``); each scale's figures are one run, "reproduction", in the group
``OUT/<scale>``. The trackers only display, so runs trained without them are reused as they are (and
give wandb their rows, `trackers.catch_up`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from blocklab.util.errors import ConfigError


def fields(args: argparse.Namespace) -> dict[str, Any] | None:
    """The TrainConfig fields `--logger` and `--wandb-project` give every run (None: neither given)."""
    from blocklab.training.tracking import logger_names

    if args.wandb_project and not args.logger:
        raise ConfigError("--wandb-project is allowed only with --logger wandb.")
    if not args.logger:
        return None
    names = logger_names(args.logger)
    if isinstance(names, str):
        raise ConfigError(f"--logger {args.logger!r} is not allowed: {names}")
    return {"logger": names, **({"wandb_project": args.wandb_project} if args.wandb_project else {})}


def with_tracking(configs: list[tuple[Any, Any]], tracking: dict[str, Any] | None, out: str | Path
                  ) -> list[tuple[Any, Any]]:
    """`configs` with the tracking fields and each run's group (its setting's folder under `out`)."""
    from blocklab.training.trackers import group_under

    if not tracking:
        return configs
    return [(e, c.replace(**tracking, wandb_group=group_under(c.out_dir, out))) for e, c in configs]


def send_figures(tracking: dict[str, Any] | None, reports: list[tuple[str, Path]], out: str | Path) -> None:
    """Each scale's figures (`reports`: its name and its reproduction.md) as one run in ``OUT/<scale>``."""
    from blocklab.training.trackers import send_figures as send
    from blocklab.training.tracking import TrackTo

    if not tracking:
        return
    for scale, report in reports:
        where = TrackTo(tuple(tracking["logger"]), tracking.get("wandb_project", "blocklab"),
                        f"{Path(out).resolve().name}/{scale}")
        send(where, sorted((report.parent / f"{scale}-figures").glob("*.png")), report.parent, "reproduction")
