"""A campaign in pieces: the runs of a scale trained a few at a time, each piece within a budget of
minutes (one lent GPU call: `benchmarks/gpu_campaign.py next`), until every claim is judged.

A piece calls `reproduce` with a `BudgetLauncher`, so the sweep, the claims' runs and the seeds added
for undecided checks come in the order `reproduce` asks for them, and the store's reuse and resume rules
hold as for any launch. The launcher starts a run only while its estimated time
(`estimate.Estimator`) fits in what is left of the budget; the others stay pending for the next piece.
A run the piece finishes gets its record (`TRAINED_ON`: the GPU's name or "cpu", the commit, the date,
its seconds), its metrics that read weights are computed, and its checkpoints are deleted, so the store
keeps small files only. A run cut off mid-way keeps its checkpoints and resumes from the newest when
the next piece runs where they are (the same machine; a fresh one starts it again). `export_store`
packs the small files into one tarball, rewritten after every run, for a GPU call to send back.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blocklab.reproduce.campaign import machine
from blocklab.reproduce.estimate import TRAINED_ON, Estimator, Remaining, remaining
from blocklab.reproduce.judge import Reproduction
from blocklab.reproduce.metrics import METRICS
from blocklab.reproduce.orchestrate import reproduce, scale_claims
from blocklab.reproduce.planning import check_settings
from blocklab.reproduce.scales import Scale, run_group
from blocklab.statistics.claims import Claim
from blocklab.training import TrainConfig


def run_device(device: str = "auto") -> str:
    """What a run with TrainConfig.device `device` trains on here: the GPU's name, or "cpu"."""
    import torch

    if device in ("auto", "cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return "cpu"


@dataclass
class BudgetLauncher:
    """A launcher (`blocklab.launch`) that trains runs one after another in this process while the
    estimate of the next fits before `deadline` (read on `clock`), and leaves it and every later one
    pending: `reproduce` then raises RunsPending and the next piece goes on from there. `after(cfg,
    started)` runs after each run it trains (`started`: the clock when the run began)."""

    deadline: float
    estimate: Callable[[TrainConfig], float]
    after: Callable[[TrainConfig, float], None] | None = None
    clock: Callable[[], float] = time.monotonic
    trained: list[str] = field(default_factory=list)  # out_dirs trained, in order
    out_of_time: bool = False
    name = "local"

    def train(self, configs: list[tuple[Any, TrainConfig]], log=print):
        from blocklab.launch import Launch
        from blocklab.launch.plan import failure, result_line, reuse_finished
        from blocklab.launch.store import log_path, train_run

        outcomes, todo = reuse_finished(configs, log)
        pending = []
        for t in todo:
            need, left = self.estimate(t.cfg), self.deadline - self.clock()
            if self.out_of_time or need > left:
                self.out_of_time = True
                pending.append(t.cfg.out_dir)
                continue
            log(t.line(f"{t.verb}: about {need:.0f} s of the {left:.0f} s left"))
            started = self.clock()
            try:
                outcome = train_run(t.cfg)
            except Exception as err:  # noqa: BLE001 - any error is this run's: the others go on
                with open(log_path(t.cfg), "a") as handle:
                    traceback.print_exc(file=handle)
                outcome = failure(t.cfg, f"{type(err).__name__}: {err}")
            if outcome.status == "trained":
                if self.after is not None:
                    self.after(t.cfg, started)
                self.trained.append(t.cfg.out_dir)
            log(t.line(result_line(outcome)))
            outcomes[t.index] = outcome
        if pending:
            log(f"out of time: {len(pending)} run(s) of this launch left for the next piece")
        return Launch(configs, [o for o in outcomes if o is not None], pending=pending)


def weight_metrics(claims: list[Claim], scale: Scale) -> dict[tuple[str, str], set[str]]:
    """The metrics read from a run's weights (`Metric.from_weights`) that the claims need, by the
    (group folder, arch) of the runs they read."""
    needed: dict[tuple[str, str], set[str]] = {}
    for claim in claims:
        for check in claim.checks:
            if METRICS[check.metric].from_weights:
                for setting in check_settings(check):
                    for arch in check.archs:
                        group = scale.group(run_group(setting, arch))
                        needed.setdefault((group, arch), set()).add(check.metric)
    return needed


def finish_run(cfg: TrainConfig, metrics: dict[tuple[str, str], set[str]]) -> None:
    """A finished run: compute (and keep) the metrics the claims read from its weights, then delete its
    checkpoints."""
    run = Path(cfg.out_dir)
    for name in sorted(metrics.get((run.parent.parent.name, cfg.arch), ())):
        compute = METRICS[name].compute
        assert compute is not None
        compute(run)
    shutil.rmtree(run / "checkpoints", ignore_errors=True)


def record_run(cfg: TrainConfig, seconds: float, device: str) -> dict[str, Any]:
    """Write the run's `TRAINED_ON` record: what trained it, when, at which commit, in how long."""
    run = Path(cfg.out_dir)
    summary = json.loads((run / "summary.json").read_text())
    info = machine()
    record = {"device": device, "commit": info["commit"], "date": info["date"], "torch": info["torch"],
              "wall_seconds": round(seconds, 1), "resumed_at": summary.get("resumed_at", [])}
    (run / TRAINED_ON).write_text(json.dumps(record, indent=2) + "\n")
    return record


# What stays out of the exported store, as out of the committed one (reproduction-data/.gitignore):
# weights, the per-run tokenizer copy, logs and locks; and the reports, which --no-train rebuilds.
_LEFT_OUT_NAMES = ("tokenizer.json", "reproduction.md", "reproduction.html", "reproduction.json")


def store_files(root: Path) -> list[Path]:
    """The small files of a scale's store: every file but the weights, tokenizer copies, logs, locks,
    reports and figures, and no file of a run that has not finished."""
    files = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if (not path.is_file() or "checkpoints" in rel.parts or path.name in _LEFT_OUT_NAMES
                or path.suffix == ".log" or path.name.startswith(".") or rel.parts[0].endswith("-figures")):
            continue
        if "runs" in rel.parts[:-1]:
            at = rel.parts.index("runs")
            run = root.joinpath(*rel.parts[:at + 2])
            if len(rel.parts) > at + 2 and not (run / "summary.json").is_file():
                continue
        files.append(path)
    return files


# What marks a tarball `export_store` wrote, and for which store: a pax global header inside it (read by
# tarfile, not unpacked as a file by tar), so that a later export replaces it and nothing else.
EXPORT_MARK = "BLOCKLAB.export_of"


def export_store(root: Path, tarball: Path) -> Path:
    """Pack `store_files(root)` into `tarball` (gzip), under the scale's folder name, so that
    `tar xzf TARBALL -C STORE` puts them in place in another store; written whole or not at all, marked
    as this store's export (`EXPORT_MARK`, read by `check_export`)."""
    tarball = Path(tarball)
    tarball.parent.mkdir(parents=True, exist_ok=True)
    partial = tarball.with_name(tarball.name + ".partial")
    mark = {EXPORT_MARK: str(Path(root).resolve())}
    with tarfile.open(partial, "w:gz", format=tarfile.PAX_FORMAT, pax_headers=mark) as tar:
        files = store_files(root)
        for path in files:
            tar.add(path, arcname=str(Path(root.name) / path.relative_to(root)), recursive=False)
        if not files:  # the store's folder alone: a mark with no member after it is not a readable tar
            tar.add(root, arcname=root.name, recursive=False)
    os.replace(partial, tarball)
    return tarball


def export_of(tarball: Path) -> str | None:
    """The store whose export `tarball` is (None: not a tarball `export_store` wrote)."""
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            return tar.pax_headers.get(EXPORT_MARK)
    except (OSError, tarfile.TarError, EOFError):
        return None


def check_export(tarball: Path, root: Path, overwrite: bool = False, option: str = "--export") -> None:
    """Refuse, before anything trains, an export path that cannot be written (an empty name, a folder, a
    folder that this user cannot write to) or that holds a file blocklab did not write as this store's
    export (a user's own file, another store's export), unless `overwrite`: the export would replace it."""
    import tempfile

    from blocklab.util.errors import ConfigError

    if not str(tarball).strip():
        raise ConfigError(f"{option} {str(tarball)!r} is not allowed: give the path of a .tgz to write")
    tarball = Path(tarball)
    if tarball.is_dir():
        raise ConfigError(f"{option} {tarball} is a folder: give the path of a .tgz file, e.g. "
                          f"{tarball / (Path(root).name + '.tgz')}")
    folder = tarball.absolute().parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):  # permissions alone miss read-only mounts, /proc ...
            pass
    except OSError:
        raise ConfigError(f"{option} {tarball} is not allowed: {str(folder)!r} is not a folder this user "
                          "can write to; give a .tgz path in one") from None
    if tarball.exists() and not overwrite and export_of(tarball) != str(Path(root).resolve()):
        theirs = export_of(tarball)
        what = f"the export of another store ({theirs})" if theirs else "a file blocklab did not write"
        raise ConfigError(f"{option} {tarball} holds {what}, which the export would replace: give another "
                          "path, or pass --overwrite to replace it")


def drop_orphans(root: Path, log=print) -> list[Path]:
    """Remove the unfinished runs under `root` that kept their checkpoints but lost their config.yaml
    (a copy of the tree that refreshed the committed files and kept the ignored ones): they cannot be
    resumed, and would stop every launch that meets them; they start again instead."""
    dropped = []
    for run in sorted(root.glob("*/runs/*")):
        if run.is_dir() and (run / "checkpoints").is_dir() and not (run / "summary.json").is_file() \
                and not (run / "config.yaml").is_file():
            shutil.rmtree(run)
            log(f"{run}: checkpoints without their config.yaml; it starts again")
            dropped.append(run)
    return dropped


@dataclass
class Piece:
    """What one piece did: the runs it trained, on what, in how long, and what is left."""

    trained: list[str]
    seconds: float
    device: str
    rep: Reproduction | None  # the verdicts, once every run has finished (None: runs remain)
    remaining: Remaining


def run_piece(claims: list[Claim], scale: Scale, name: str, out: str | Path, minutes: float, log=print,
              export: Path | None = None, clock: Callable[[], float] = time.monotonic) -> Piece:
    """Train the next unfinished runs of `claims` at `scale` in OUT/<name> for about `minutes`
    (`BudgetLauncher`), resuming cut-off runs and reusing finished ones; record, clean and export each
    run it finishes; return what it trained and what remains (`estimate.remaining`)."""
    from blocklab.launch import RunsPending

    start = clock()
    root = Path(out) / name
    claims = scale_claims(claims, scale)
    device = run_device(scale.train.get("device", "auto"))
    estimate = Estimator(root, device)
    log(f"piece: {minutes:g} min on {device}; run times estimated at {estimate.source}")
    metrics = weight_metrics(claims, scale)
    drop_orphans(root, log)

    def after(cfg: TrainConfig, started: float) -> None:
        finish_run(cfg, metrics)
        record_run(cfg, clock() - started, device)
        estimate.refresh()  # the next runs' estimates from this run's measured rate on
        if export is not None:
            export_store(root, export)

    launcher = BudgetLauncher(start + 60 * minutes, estimate.seconds, after, clock)
    rep = None
    try:
        rep = reproduce(claims, scale, out, log=log, launcher=launcher, name=name)
    except RunsPending:
        pass
    finally:
        if export is not None and root.is_dir():
            export_store(root, export)
    left = Remaining([], estimate) if rep is not None else remaining(claims, scale, root, estimate)
    return Piece(launcher.trained, clock() - start, device, rep, left)
