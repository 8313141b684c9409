"""`logger=wandb`: a run's metrics.jsonl rows in a Weights & Biases run (extra `wandb`).

One blocklab run is one wandb run: project `wandb_project`, name the run's folder, group `wandb_group`
(compare sets it to the comparison), config the run's TrainConfig, and each row's numbers
(`tracking.scalars_of`) at the row's step. wandb writes under the run's folder (``<run>/wandb/``),
offline too (``WANDB_MODE=offline``; ``wandb sync <run>/wandb/offline-run-*`` uploads later).

`RECORD` (``<run>/wandb.json``) keeps the wandb run's id and the last step of each kind of row sent
to it. A resume opens the same wandb run (``id=..., resume="allow"``) and sends only rows past those
steps: wandb never gets a step twice, even offline, where it cannot ask the server what it holds. The
rows that a run cut off between two checkpoints had already sent stay as they were sent (on CPU the
resumed steps give the same losses; their wall_time and tokens_per_s are the first attempt's). A run
whose metrics.jsonl holds rows that its wandb run never got (wandb added on resume, or a finished run
that compare reuses) sends them first, so the wandb run holds the whole curve.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blocklab.training.metrics import read_metrics
from blocklab.training.tracking import TrackTo, run_name, scalars_of
from blocklab.util.errors import ConfigError
from blocklab.util.filemodes import atomic_write_text

if TYPE_CHECKING:
    from blocklab.training.config import TrainConfig

RECORD = "wandb.json"


def read_record(run_dir: Path) -> dict[str, Any] | None:
    """The run's wandb record: {"id", "project", "logged": {kind: last step sent}}; None when there is
    none or it cannot be read (a new wandb run then starts)."""
    try:
        record = json.loads((Path(run_dir) / RECORD).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(record, dict) and isinstance(record.get("id"), str) and isinstance(record.get("logged"),
                                                                                         dict)
    return record if ok else None


def check_record(run_dir: Path, cfg: TrainConfig) -> None:
    """The record a resume goes on with, checked before the run changes any file: a run id that wandb
    refuses (the file edited by hand) is a ConfigError naming the file, rather than wandb's failure
    later, which reads as a login problem."""
    import wandb

    saved = read_record(run_dir)
    if saved is None or saved.get("project") != cfg.wandb_project:  # not resumed: a new wandb run
        return
    try:
        wandb.Settings(run_id=saved["id"])  # wandb's own rule for a run id
    except Exception as err:  # noqa: BLE001 - wandb's UsageError, pydantic's ValidationError
        path = Path(run_dir) / RECORD
        raise ConfigError(f"{path} records the wandb run id {saved['id']!r}, which wandb refuses ({err}): "
                          "the file was changed after the run wrote it. Put the run's id back, or delete "
                          f"{path} to send the whole curve to a new wandb run.") from None


def _init(**kwargs: Any) -> Any:
    """wandb.init, its failures (not logged in, no network) said as what to do."""
    import wandb

    try:
        return wandb.init(settings=wandb.Settings(console="off"), **kwargs)
    except Exception as err:  # noqa: BLE001 - wandb's own errors have no common base
        raise ConfigError(f"logger 'wandb' could not start a wandb run ({type(err).__name__}: {err}). Log in "
                          "with `wandb login`, or log offline with WANDB_MODE=offline and upload later with "
                          "`wandb sync`.") from None


class WandbTracker:
    def __init__(self, run_dir: Path, cfg: TrainConfig, resume_step: int | None):
        self.path = Path(run_dir) / RECORD
        saved = read_record(run_dir) if resume_step is not None else None
        if saved is not None and saved.get("project") != cfg.wandb_project:
            saved = None  # another project: a new run there, given the whole curve below
        self.logged: dict[str, int] = dict(saved["logged"]) if saved else {}
        self.run = _init(project=cfg.wandb_project, name=run_name(cfg.out_dir), group=cfg.wandb_group,
                         config=cfg.to_dict(), dir=str(run_dir), id=saved["id"] if saved else None,
                         resume="allow")
        self.record = {"id": self.run.id, "project": cfg.wandb_project, "logged": self.logged}
        metrics = Path(run_dir) / "metrics.jsonl"
        # the rows this wandb run lacks (metrics.jsonl is already cut back to the resumed step)
        resumed = resume_step is not None and metrics.is_file()
        for row in read_metrics(metrics, whole=False) if resumed else []:
            self.log(row, save=False)
        self._save()

    def _save(self) -> None:
        atomic_write_text(self.path, json.dumps(self.record))

    def log(self, row: dict[str, Any], save: bool = True) -> None:
        kind, step = row["kind"], row["step"]
        if step <= self.logged.get(kind, -1):  # sent before this run was cut off and resumed
            return
        self.run.log(scalars_of(row), step=step)
        self.logged[kind] = step
        if save:
            self._save()

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def send_figures(paths: list[Path], folder: Path, name: str, where: TrackTo) -> None:
    """A report's figures as one wandb run `name` (job type "report") in `where`'s group, written under
    `folder` (the report's): ``figures/<file stem>``, each a wandb.Image."""
    import wandb

    run = _init(project=where.project, name=name, group=where.group, job_type="report", dir=str(folder))
    try:
        run.log({f"figures/{p.stem}": wandb.Image(str(p)) for p in paths})
    finally:
        run.finish()


def catch_up(run_dir: Path, cfg: TrainConfig) -> None:
    """A finished run (reused by compare or reproduce): its rows that its wandb run lacks, sent; nothing
    (no wandb run opened) when it holds them all."""
    check_record(run_dir, cfg)
    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    saved = read_record(run_dir)
    if saved is not None and saved.get("project") == cfg.wandb_project and all(
            r["step"] <= saved["logged"].get(r["kind"], -1) for r in rows):
        return
    WandbTracker(Path(run_dir), cfg, max((r["step"] for r in rows), default=0)).close()
