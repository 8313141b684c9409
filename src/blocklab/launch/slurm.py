"""Runs as jobs of a Slurm cluster, submitted through submitit (`pip install 'blocklab[slurm]'`).

Every run still to train becomes one job of one Slurm job array (at most `jobs` of them running at
once), which trains it with `store.train_run` into the shared run store. The data are prepared once,
here, before anything is submitted (`store.prepare_once`), as the local launcher does. A run over
several GPUs is launched with torchrun inside its job (DDP, the `parallel=auto` default, or
`parallel=fsdp`). The launcher waits for the jobs, showing one progress line, or returns at once
(`wait=False`); the job ids are kept in `FOLDER/jobs.json`, so the same command started later waits
for the jobs still queued or running instead of submitting them again, reuses the runs that finished
and submits the others again (the run's lock keeps two jobs from training one run).

Where a job is (`JobStates`): squeue while it is queued or running, its own result file once it ended,
and sacct, where the cluster keeps accounting, for how it ended; many small clusters keep none, so
nothing waits on sacct, and `scontrol show job` (which Slurm answers for MinJobAge after a job ended)
gives the state and exit code instead. A job that left the queue without a result on two looks in a
row is over: its failure names the reason, from its state, exit code and the last error of its log
(cancelled, timed out too often, out of memory, killed by a signal, a Python exception:
`launch.failures`).

A job that reaches its time limit is requeued by submitit and its run resumes from its last checkpoint
(`RunJob` is Checkpointable). SIGTERM (`scancel`, Ctrl-C in the waiting command, which cancels the jobs
not yet finished, or a preemption) stops a job at once, between two of its steps, leaving its run's last
checkpoint for the rerun to resume from; submitit itself would ignore SIGTERM and the job would train on
until Slurm kills it (KillWait, 30 s by default).

`cluster="local"` runs the same jobs through submitit's LocalExecutor on this machine (every job at
once): real processes, the same code path, for trying a set-up before a cluster, and for the tests.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import submitit
from submitit.slurm.slurm import SlurmInfoWatcher

from blocklab.launch.failures import failure_reason, killed_by, read_scontrol, rerun_text
from blocklab.launch.outcome import outcome_path, read_outcome, write_outcome
from blocklab.launch.plan import Launch, Todo, failure, result_line, reuse_finished
from blocklab.launch.progress import RunsProgress
from blocklab.launch.store import Outcome, claim, prepare_once, run_lock, train_run
from blocklab.training.config import TrainConfig, read_yaml
from blocklab.util.errors import ConfigError
from blocklab.util.filemodes import atomic_write_text

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
    days, _, b, c = (int(g) if g else None for g in match.groups())
    a = int(match.group(2))  # always there
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
    limit submitit requeues it with the same arguments, and the run resumes from its checkpoint. SIGTERM
    stops it between two steps (`_stop_on_sigterm`), its run's last checkpoint left for a rerun."""

    def __call__(self, config: dict[str, Any], procs: int = 1) -> dict[str, Any]:
        previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
        try:
            result = self._train(TrainConfig.from_dict(config), config, procs)
            write_outcome(result)
            return result
        except KeyboardInterrupt as err:
            rerun = rerun_text(config["out_dir"])
            print(f"blocklab job: stopped ({str(err) or 'interrupted'}); {rerun}", file=sys.stderr,
                  flush=True)
            raise SystemExit(STOPPED_CODE) from None  # no result file: Slurm's state says how it ended
        except Exception as err:
            write_outcome({"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()})
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _train(self, cfg: TrainConfig, config: dict[str, Any], procs: int) -> dict[str, Any]:
        if procs <= 1:
            outcome = train_run(cfg)
            return {"status": outcome.status, "seconds": outcome.seconds}
        with run_lock(cfg):
            if claim(cfg) == "finished":
                return {"status": "reused", "seconds": 0.0}
            start = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                     f"--nproc_per_node={procs}", "-m", "blocklab.launch.worker",
                                     "--torchrun", json.dumps(config)])
            try:
                code = proc.wait()
            except KeyboardInterrupt:  # torchrun passes SIGTERM on to its processes and waits for them
                proc.terminate()
                proc.wait()
                raise
            if code:
                raise RuntimeError(f"torchrun over {procs} processes exited with code {code}")
            return {"status": "trained", "seconds": time.perf_counter() - start}


STOPPED_CODE = 143  # 128 + SIGTERM: a job stopped by a signal, without a result file


def _stop_on_sigterm(signum: int, _frame: Any) -> None:
    """SIGTERM in a job: stop as Ctrl-C does. submitit's own handler only logs it ("Bypassing signal
    SIGTERM"), waiting for its time-limit signal (USR2), so a cancelled job would train on until Slurm
    kills it; a run's checkpoints are written atomically, so stopping at any moment leaves the last one."""
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}: scancel, the launching command's Ctrl-C "
                            "or a preemption")


# A job that neither squeue lists nor left a result this many looks in a row has ended without a result
GONE_LOOKS = 2


class JobStates:
    """Where each Slurm job is: squeue's state while it is queued or running; FINISHED once it left its
    result file; once it left the queue without one (GONE_LOOKS looks in a row), sacct's final state where
    the cluster keeps accounting, else LOST; UNKNOWN while squeue cannot be asked. sacct alone would leave
    a cluster without accounting waiting forever (submitit's own watcher reads only sacct)."""

    def __init__(self, run=subprocess.run) -> None:
        self.run = run  # subprocess.run, or a fake in the tests
        self.accounting = True  # until sacct first fails: then never asked again
        self.gone: dict[str, int] = {}
        self.exit_codes: dict[str, str] = {}  # Slurm's ExitCode of the ended jobs, "137:0"

    def look(self, jobs: list[Any]) -> list[str]:
        queued = self.squeue()
        states = []
        for job in jobs:
            job_id = job.job_id
            if queued is not None and job_id in queued:
                self.gone.pop(job_id, None)
                states.append(queued[job_id])
            elif _has_result(job):
                states.append("FINISHED")
            elif queued is None:
                states.append("UNKNOWN")
            else:
                self.gone[job_id] = self.gone.get(job_id, 0) + 1
                states.append("COMPLETING" if self.gone[job_id] < GONE_LOOKS else "ENDED")
        ended = [job.job_id for job, state in zip(jobs, states, strict=True) if state == "ENDED"]
        final = self.sacct(ended) if ended else {}
        unknown = [job_id for job_id in ended if job_id not in final]
        final.update(self.scontrol(unknown) if unknown else {})
        return [final.get(job.job_id, "LOST") if state == "ENDED" else state
                for job, state in zip(jobs, states, strict=True)]

    def squeue(self) -> dict[str, str] | None:
        """{job id: state} of this user's jobs, array tasks one by one ("12_3"); None if squeue fails."""
        user = os.environ.get("USER") or getpass.getuser()
        text = self._ask(["squeue", "--noheader", "--array", "--user", user, "--format", "%i|%T"])
        if text is None:
            return None
        pairs = (line.strip().split("|", 1) for line in text.splitlines() if "|" in line)
        return {job_id: state.strip().upper() for job_id, state in pairs}

    def sacct(self, job_ids: list[str]) -> dict[str, str]:
        """{job id: final state} ("CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", ...) of the jobs sacct knows as
        ended; {} where the cluster keeps no accounting. The exit code kept is a step's that a signal
        ended ("0:9" of step 0), else the job's own (whose "9:0" for a killed step hides the signal)."""
        if not self.accounting:
            return {}
        base = sorted({job_id.split("_")[0] for job_id in job_ids})
        text = self._ask(["sacct", "--parsable2", "--format", "JobID,State,ExitCode", "--jobs",
                          ",".join(base)])
        if text is None:
            self.accounting = False
            return {}
        info = SlurmInfoWatcher().read_info(text)  # the jobs' own lines; steps ("12_0.batch") left out
        steps: dict[str, list[str]] = {}
        for line in text.splitlines()[1:]:
            cells = line.split("|")
            if len(cells) >= 3 and "." in cells[0]:
                steps.setdefault(cells[0].split(".")[0], []).append(cells[2].strip())
        found = {}
        for job_id in (j for j in job_ids if j in info):
            state = ((info[job_id].get("State") or "").split() or [""])[0].upper()  # "CANCELLED by 1000"
            code = next((c for c in steps.get(job_id, []) if killed_by(c)), info[job_id].get("ExitCode", ""))
            found[job_id] = (state, code)
        return self._ended(found)

    def scontrol(self, job_ids: list[str]) -> dict[str, str]:
        """{job id: final state} from `scontrol show job`, which knows a job for MinJobAge after it ended,
        accounting or not (`failures.read_scontrol`); {} for jobs it no longer knows."""
        found: dict[str, tuple[str, str]] = {}
        for base in sorted({job_id.split("_")[0] for job_id in job_ids}):
            found.update(read_scontrol(self._ask(["scontrol", "--oneliner", "show", "job", base]) or ""))
        return self._ended({job_id: found[job_id] for job_id in job_ids if job_id in found})

    def _ended(self, found: dict[str, tuple[str, str]]) -> dict[str, str]:
        """The states of `found` ({job id: (state, exit code)}) that are final, their exit codes kept."""
        final = {job_id: state for job_id, (state, _) in found.items() if state and state not in ALIVE}
        self.exit_codes.update((job_id, found[job_id][1]) for job_id in final if found[job_id][1])
        return final

    def _ask(self, command: list[str]) -> str | None:
        try:
            done = self.run(command, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None


def _has_result(job: Any) -> bool:
    """Whether the job left its outcome file or submitit's result file (a shared file system may show
    them late: refresh first)."""
    folder = job.paths.folder
    with contextlib.suppress(OSError):
        folder.chmod(folder.stat().st_mode)
    return outcome_path(job.paths).exists() or bool(job.paths.result_pickle.exists())


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


def job_outcome(job: Any, cfg: TrainConfig, state: str, exit_code: str | None = None) -> Outcome:
    """How an ended job came out: its outcome file's (`read_outcome`; never submitit's pickle), else a
    failure that says why (`failure_reason`: from its state, Slurm's `exit_code`, its logs, and whether
    its run has a checkpoint for the rerun to resume from)."""
    result = read_outcome(job.paths) if _has_result(job) else None
    if result is not None and "status" in result:
        return Outcome(cfg, result["status"], float(result.get("seconds", 0.0)))
    trace = result.get("trace") or result["error"] if result is not None else ""
    logs = "\n".join(_tail(path) for path in (job.paths.stdout, job.paths.stderr))
    rerun = rerun_text(cfg.out_dir)
    outcome = failure(cfg, f"job {job.job_id} {failure_reason(state, trace, logs, exit_code, rerun)}")
    outcome.log = Path(job.paths.stderr)
    return outcome


def _tail(path: Path, size: int = 1 << 16) -> str:
    """The last `size` bytes of a log, as text ("" when it is not there)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - size))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""
