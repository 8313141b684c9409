"""Runs as jobs of a Slurm cluster, submitted through submitit (`pip install 'blocklab[slurm]'`).

Every run still to train becomes one job of one Slurm job array (at most `jobs` of them running at
once), which trains it with `store.train_run` into the shared run store (`slurm_job.RunJob`). The data
are prepared once, here, before anything is submitted (`store.prepare_once`), as the local launcher
does. A run over several GPUs is launched with torchrun inside its job (DDP, the `parallel=auto`
default, or `parallel=fsdp`). The launcher waits for the jobs, showing one progress line, or returns at
once (`wait=False`); the job ids are kept in `FOLDER/jobs.json`, so the same command started later
waits for the jobs still queued or running instead of submitting them again, reuses the runs that
finished and submits the others again (the run's lock keeps two jobs from training one run).

What each job asks Slurm for: `slurm_settings.SlurmSettings`. Where a job is and how an ended one came
out (squeue, its result file, sacct, scontrol; the reason a failed one names): `slurm_states`. What a
job runs, requeued at its time limit and stopped by SIGTERM between two steps: `slurm_job`.

`cluster="local"` runs the same jobs through submitit's LocalExecutor on this machine (every job at
once): real processes, the same code path, for trying a set-up before a cluster, and for the tests.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import submitit

from blocklab.launch.plan import Launch, Todo, result_line, reuse_finished
from blocklab.launch.progress import RunsProgress
from blocklab.launch.slurm_job import RunJob
from blocklab.launch.slurm_settings import SlurmSettings
from blocklab.launch.slurm_states import ALIVE, JobStates, job_outcome
from blocklab.launch.store import Outcome, prepare_once
from blocklab.training.config import TrainConfig
from blocklab.util.errors import ConfigError
from blocklab.util.filemodes import atomic_write_text


@dataclass
class SlurmLauncher:
    """Submit the runs as jobs (`settings`), at most `jobs` running at once (None: Slurm decides);
    `wait`: wait for them and collect their outcomes, else return with them pending."""

    settings: SlurmSettings = field(default_factory=SlurmSettings)
    jobs: int | None = None
    wait: bool = True
    states: JobStates = field(default_factory=JobStates)

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
            prepare_once([t.cfg for t in todo])
            jobs = self._submit(todo, folder, log)
            if not self.wait:
                launch.pending = [t.cfg.out_dir for t in todo]
                log(_pending_line(jobs, self.name, folder))
                return launch
            for t, outcome in zip(todo, self._wait(jobs, todo, log), strict=True):
                outcomes[t.index] = outcome
        launch.outcomes = [o for o in outcomes if o is not None]
        return launch

    def _executor(self, folder: Path, count: int):
        s = self.settings
        try:
            executor = submitit.AutoExecutor(folder=folder / "%j", cluster=s.cluster,
                                             slurm_max_num_timeout=s.max_requeues,
                                             local_max_num_timeout=s.max_requeues)
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
        """A job per run of `todo`: the one still queued or running for it (jobs.json, squeue), else a new
        one; a recorded job that ended without finishing its run (cancelled, lost) is replaced."""
        record_path = folder / "jobs.json"
        record = json.loads(record_path.read_text()) if record_path.is_file() else {}
        jobs: list[Any] = [None] * len(todo)
        known = {i: record[t.cfg.out_dir] for i, t in enumerate(todo) if record.get(t.cfg.out_dir)}
        if self.settings.cluster == "slurm" and known:  # an earlier command's local job: not looked up
            queued = self.states.squeue() or {}
            for i, job_id in known.items():
                if queued.get(job_id) in ALIVE:
                    jobs[i] = submitit.SlurmJob(folder=folder / job_id, job_id=job_id)
                    jobs[i].earlier = True  # submitted by an earlier command: not again
                    then = "waiting for it" if self.wait else "submitted earlier, so not submitted again"
                    log(todo[i].line(f"job {job_id} is still {queued[job_id].lower()}; {then}"))
                else:
                    log(todo[i].line(f"job {job_id} is no longer queued or running; submitting it again"))
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

    def _look(self, jobs: list[Any]) -> list[str]:
        """Each job's state (`JobStates`); a local job's from submitit, which follows its process."""
        if self.settings.cluster == "slurm":
            return self.states.look(jobs)
        return ["FINISHED" if job.done() else str(job.state).upper() for job in jobs]

    def _wait(self, jobs: list[Any], todo: list[Todo], log) -> list[Outcome]:
        """Poll the jobs until each has ended; Ctrl-C cancels those still queued or running."""
        outcomes: dict[int, Outcome] = {}
        with RunsProgress(len(jobs), enabled=any(t.cfg.progress for t in todo)) as line:
            trackers = [line.begin(t.name, t.name) for t in todo]
            try:
                while len(outcomes) < len(jobs):
                    states = self._look(jobs)
                    for i, (job, t, state) in enumerate(zip(jobs, todo, states, strict=True)):
                        if i in outcomes:
                            continue
                        if state in ALIVE:
                            trackers[i].advance(_fraction(t.cfg), state.lower())
                            continue
                        outcomes[i] = job_outcome(job, t.cfg, state, self.states.exit_codes.get(job.job_id))
                        line.end(t.name)
                        line.write(t.line(result_line(outcomes[i])), log)
                    if len(outcomes) < len(jobs):
                        time.sleep(self.settings.poll_s)
            except BaseException as err:
                for i, job in enumerate(jobs):
                    if i not in outcomes:
                        job.cancel(check=False)  # SIGTERM: each stops at its next step (`RunJob`)
                if isinstance(err, KeyboardInterrupt):
                    raise KeyboardInterrupt(
                        f"{len(jobs) - len(outcomes)} job(s) not finished were cancelled; rerun the same "
                        "command: finished runs are reused and the others resume from their last "
                        "checkpoint") from None
                raise
        return [outcomes[i] for i in range(len(jobs))]


def _pending_line(jobs: list[Any], name: str, folder: Path) -> str:
    """What `wait=False` left: the jobs just submitted, those submitted earlier and still queued or
    running (a second --no-wait submits nothing again), and how to check on them."""
    earlier = [job.job_id for job in jobs if getattr(job, "earlier", False)]
    ids = ",".join(job.job_id for job in jobs)
    new = len(jobs) - len(earlier)
    said = [f"{new} run(s) queued as {name} jobs"] if new else []
    if earlier:
        said.append(f"{len(earlier)} run(s) already submitted earlier and still queued or running (job(s) "
                    f"{', '.join(earlier)})")
    check = f"squeue --jobs {ids}" if name == "slurm" else f"the logs in {folder}"
    return (f"{' and '.join(said)}; logs in {folder}. Check on them with {check}; run the same command "
            "again without --no-wait to wait for them and write the report.")


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


