"""Runs as jobs of a Slurm cluster, submitted through submitit (`pip install 'blocklab[slurm]'`).

Every run still to train becomes one job of one Slurm job array (at most `jobs` of them running at
once), which trains it with `store.train_run` into the shared run store. A run over several GPUs is
launched with torchrun inside its job (DDP, the `parallel=auto` default, or `parallel=fsdp`). The
launcher waits for the jobs, showing one progress line, or returns at once (`wait=False`); the job
ids are kept in
`FOLDER/jobs.json`, so the same command started later waits for the jobs still queued or running
instead of submitting them again, and reuses the runs that finished. A job that reaches its time
limit is requeued by submitit and its run resumes from its last checkpoint (`RunJob` is
Checkpointable). Ctrl-C while waiting cancels the jobs not yet finished.

`cluster="local"` runs the same jobs through submitit's LocalExecutor on this machine (every job at
once): real processes, the same code path, for trying a set-up before a cluster, and for the tests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import submitit

from blocklab.errors import ConfigError
from blocklab.filemodes import atomic_write_text
from blocklab.launch.plan import Launch, Todo, failure, result_line, reuse_finished
from blocklab.launch.progress import RunsProgress
from blocklab.launch.store import Outcome, claim, run_lock, train_run
from blocklab.training.config import TrainConfig, read_yaml

# Slurm's job states in which a job will still run (squeue/sacct): the same command waits for these
ALIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
         "RESIZING", "SUSPENDED", "UNKNOWN"}


@dataclass
class SlurmSettings:
    """What each run's job asks Slurm for. From a YAML file's `slurm:` section (`load`) and flags."""

    partition: str | None = None
    account: str | None = None
    gpus_per_run: int = 0
    cpus_per_run: int = 1  # also the run's CPU threads, unless its config sets threads
    mem_gb: float | None = None
    time_min: int = 240  # the job's time limit; a run cut off there is requeued and resumes
    signal_delay_s: int | None = None  # the job is told to stop this long before its limit (submitit: 90)
    sbatch: dict[str, Any] = field(default_factory=dict)  # other sbatch options: {"qos": "high", ...}
    setup: list[str] = field(default_factory=list)  # shell lines before each job (module load, a venv)
    procs_per_run: int | None = None  # torchrun processes per run (None: one per GPU, or one)
    folder: str | None = None  # submitit's scripts, logs and results (None: beside the runs, slurm/)
    cluster: str = "slurm"  # or "local": submitit's LocalExecutor, every job at once on this machine
    poll_s: float = 10.0  # seconds between looks at the jobs while waiting

    @classmethod
    def load(cls, path: str | Path | None = None, **flags: Any) -> SlurmSettings:
        """A YAML file's `slurm:` section (or its top level), then the `flags` that are not None."""
        data: dict[str, Any] = {}
        if path is not None:
            raw = read_yaml(path)
            data = dict(raw.get("slurm", raw) if isinstance(raw, dict) else {})
        data.update({k: v for k, v in flags.items() if v is not None})
        known = {f.name for f in fields(cls)}
        unknown = sorted(data.keys() - known)
        if unknown:
            raise ConfigError(f"slurm setting {unknown[0]!r}{f' in {path}' if path else ''} is not allowed: "
                              f"choose from {', '.join(sorted(known))}.")
        if "time_min" in data:
            data["time_min"] = parse_time(data["time_min"])
        settings = cls(**data)
        settings.check()
        return settings

    def check(self) -> None:
        for name in ("gpus_per_run", "cpus_per_run", "time_min", "procs_per_run", "signal_delay_s"):
            value, low = getattr(self, name), 0 if name == "gpus_per_run" else 1
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ConfigError(f"slurm setting {name} = {value!r} is not allowed: give an integer "
                                  f">= {low}.")
        if self.cluster not in ("slurm", "local"):
            raise ConfigError(f"slurm setting cluster = {self.cluster!r} is not allowed: choose slurm or "
                              "local.")
        if not isinstance(self.sbatch, dict) or not isinstance(self.setup, list):
            raise ConfigError("slurm settings sbatch (a mapping of sbatch options, without the dashes) and "
                              "setup (a list of shell lines) must be a mapping and a list.")

    @property
    def procs(self) -> int:
        return self.procs_per_run or max(1, self.gpus_per_run)


def parse_time(value: Any) -> int:
    """Minutes from an integer or Slurm's time formats: "MM", "HH:MM:SS", "D-HH:MM:SS", "D-HH"."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", str(value).strip())
    if not match:
        raise ConfigError(f"slurm time limit {value!r} is not allowed: give minutes, HH:MM:SS or D-HH:MM:SS.")
    days, a, b, c = (int(g) if g else None for g in match.groups())
    if days is None and b is None:  # "MM"
        minutes = a
    elif days is not None and b is None:  # "D-HH"
        minutes = days * 1440 + a * 60
    else:  # "[D-]HH:MM[:SS]"
        minutes = (days or 0) * 1440 + a * 60 + (b or 0) + (1 if c else 0)
    if minutes < 1:
        raise ConfigError(f"slurm time limit {value!r} is not allowed: it must be at least a minute.")
    return minutes


class RunJob(submitit.helpers.Checkpointable):
    """What one job runs: train one run (over `procs` torchrun processes when more than one). At the time
    limit submitit requeues it with the same arguments, and the run resumes from its checkpoint."""

    def __call__(self, config: dict[str, Any], procs: int = 1) -> dict[str, Any]:
        cfg = TrainConfig.from_dict(config)
        if procs <= 1:
            outcome = train_run(cfg)
            return {"status": outcome.status, "seconds": outcome.seconds}
        with run_lock(cfg):
            if claim(cfg) == "finished":
                return {"status": "reused", "seconds": 0.0}
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            f"--nproc_per_node={procs}", "-m", "blocklab.launch.worker", "--torchrun",
                            json.dumps(config)], check=True)
            return {"status": "trained", "seconds": time.perf_counter() - start}


@dataclass
class SlurmLauncher:
    """Submit the runs as jobs (`settings`), at most `jobs` running at once (None: Slurm decides);
    `wait`: wait for them and collect their outcomes, else return with them pending."""

    settings: SlurmSettings = field(default_factory=SlurmSettings)
    jobs: int | None = None
    wait: bool = True

    @property
    def name(self) -> str:
        return "slurm" if self.settings.cluster == "slurm" else "submitit-local"

    def train(self, configs: list[tuple[Any, Any]], log=print) -> Launch:
        s = self.settings
        configs = [(e, c if c.threads else c.replace(threads=s.cpus_per_run)) for e, c in configs]
        outcomes, todo = reuse_finished(configs, log)
        folder = Path(s.folder) if s.folder else _default_folder(configs)
        launch = Launch(configs, [], jobs=self.jobs or len(todo), threads=configs[0][1].threads,
                        launcher=self.name)
        if todo:
            jobs = self._submit(todo, folder, log)
            if not self.wait:
                launch.pending = [t.cfg.out_dir for t in todo]
                log(f"{len(todo)} run(s) queued as {self.name} jobs (logs in {folder}); run the same command "
                    "again to wait for them and write the report.")
                return launch
            for t, outcome in zip(todo, self._wait(jobs, todo, log), strict=True):
                outcomes[t.index] = outcome
        launch.outcomes = [o for o in outcomes if o is not None]
        return launch

    def _executor(self, folder: Path, count: int):
        s = self.settings
        try:
            executor = submitit.AutoExecutor(folder=folder / "%j", cluster=s.cluster)
        except RuntimeError as err:  # no srun here: not a Slurm login node
            raise ConfigError(f"--launcher slurm: {err} Run the command where sbatch and srun work (a login "
                              "node), or set cluster: local in the Slurm settings to try it on this "
                              "machine.") from None
        params: dict[str, Any] = dict(
            name="blocklab", timeout_min=s.time_min, cpus_per_task=s.cpus_per_run * max(1, s.procs),
            gpus_per_node=s.gpus_per_run or None, tasks_per_node=1, nodes=1, mem_gb=s.mem_gb,
            slurm_partition=s.partition, slurm_account=s.account,
            slurm_additional_parameters=dict(s.sbatch) or None, slurm_setup=list(s.setup) or None,
            slurm_array_parallelism=self.jobs or count, local_setup=list(s.setup) or None,
            slurm_signal_delay_s=s.signal_delay_s)
        executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
        if s.cluster == "local" and s.signal_delay_s is not None:  # AutoExecutor has no local name for it
            executor._executor.update_parameters(signal_delay_s=s.signal_delay_s)
        return executor

    def _submit(self, todo: list[Todo], folder: Path, log) -> list[Any]:
        """A job per run of `todo`: the one already queued or running for it (jobs.json), else a new one."""
        record_path = folder / "jobs.json"
        record = json.loads(record_path.read_text()) if record_path.is_file() else {}
        jobs: list[Any] = [None] * len(todo)
        if self.settings.cluster == "slurm":  # a local job of an earlier command cannot be looked up
            for i, t in enumerate(todo):
                known = record.get(t.cfg.out_dir)
                if known:
                    job = submitit.SlurmJob(folder=folder / known, job_id=known)
                    if job.state.split()[0] in ALIVE:
                        jobs[i] = job
                        log(t.line(f"job {known} is still {job.state.lower()}; waiting for it"))
        new = [i for i, job in enumerate(jobs) if job is None]
        if new:
            executor = self._executor(folder, len(new))
            with executor.batch():
                submitted = [executor.submit(RunJob(), todo[i].cfg.to_dict(), self.settings.procs)
                             for i in new]
            for i, job in zip(new, submitted, strict=True):
                jobs[i] = job
                record[todo[i].cfg.out_dir] = job.job_id
                log(todo[i].line(f"{todo[i].verb}: submitted as {self.name} job {job.job_id}"))
        atomic_write_text(record_path, json.dumps(record, indent=2))
        return jobs

    def _wait(self, jobs: list[Any], todo: list[Todo], log) -> list[Outcome]:
        """Poll the jobs until each has ended; Ctrl-C cancels those still queued or running."""
        outcomes: dict[int, Outcome] = {}
        with RunsProgress(len(jobs), enabled=any(t.cfg.progress for t in todo)) as line:
            trackers = [line.begin(t.name, t.name) for t in todo]
            try:
                while len(outcomes) < len(jobs):
                    for i, (job, t) in enumerate(zip(jobs, todo, strict=True)):
                        if i in outcomes:
                            continue
                        if not job.done():
                            trackers[i].advance(_fraction(t.cfg), job.state.lower())
                            continue
                        outcomes[i] = _job_outcome(job, t.cfg)
                        line.end(t.name)
                        line.write(t.line(result_line(outcomes[i])), log)
                    if len(outcomes) < len(jobs):
                        time.sleep(self.settings.poll_s)
            except BaseException:
                for i, job in enumerate(jobs):
                    if i not in outcomes:
                        job.cancel(check=False)
                raise
        return [outcomes[i] for i in range(len(jobs))]


def _default_folder(configs: list[tuple[Any, Any]]) -> Path:
    """slurm/ beside the folder that holds the runs (compare's OUT/slurm)."""
    dirs = [Path(cfg.out_dir).resolve().parent for _, cfg in configs]
    return Path(os.path.commonpath(dirs)).parent / "slurm"


def _fraction(cfg: TrainConfig) -> float:
    """How far a run in another process has come: its last logged step over its step budget."""
    if not cfg.max_steps:
        return 0.0
    path = Path(cfg.out_dir) / "metrics.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0.0
    for text in reversed(lines):
        try:
            return min(1.0, json.loads(text)["step"] / cfg.max_steps)
        except (ValueError, KeyError, TypeError):
            continue
    return 0.0


def _job_outcome(job: Any, cfg: TrainConfig) -> Outcome:
    try:
        result = job.result()
    except Exception as err:  # noqa: BLE001 - submitit re-raises the job's own error, with its traceback
        first = str(err).strip().splitlines()
        outcome = failure(cfg, f"job {job.job_id} failed: {first[-1] if first else type(err).__name__}")
        outcome.log = Path(job.paths.stderr)
        return outcome
    return Outcome(cfg, result["status"], result.get("seconds", 0.0))

