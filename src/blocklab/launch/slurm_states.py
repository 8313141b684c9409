"""Where each Slurm job is (`JobStates`), and how an ended one came out (`job_outcome`).

squeue says where a job is while it is queued or running, its own result file once it ended, and sacct,
where the cluster keeps accounting, how it ended; many small clusters keep none, so nothing waits on
sacct, and `scontrol show job` (which Slurm answers for MinJobAge after a job ended) gives the state and
exit code instead. A job that left the queue without a result on two looks in a row is over: its
failure names the reason, from its state, exit code and the last error of its log (cancelled, timed out
too often, out of memory, killed by a signal, a Python exception: `launch.failures`).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import subprocess
from pathlib import Path
from typing import Any

from submitit.slurm.slurm import SlurmInfoWatcher

from blocklab.launch.failures import failure_reason, killed_by, read_scontrol, rerun_text
from blocklab.launch.outcome import outcome_path, read_outcome
from blocklab.launch.plan import failure
from blocklab.launch.store import Outcome
from blocklab.training.config import TrainConfig

# Slurm's job states in which a job will still run (squeue/sacct): the same command waits for these
ALIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
         "RESIZING", "SUSPENDED", "UNKNOWN"}

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
            elif has_result(job):
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


def has_result(job: Any) -> bool:
    """Whether the job left its outcome file or submitit's result file (a shared file system may show
    them late: refresh first)."""
    folder = job.paths.folder
    with contextlib.suppress(OSError):
        folder.chmod(folder.stat().st_mode)
    return outcome_path(job.paths).exists() or bool(job.paths.result_pickle.exists())


def job_outcome(job: Any, cfg: TrainConfig, state: str, exit_code: str | None = None) -> Outcome:
    """How an ended job came out: its outcome file's (`read_outcome`; never submitit's pickle), else a
    failure that says why (`failure_reason`: from its state, Slurm's `exit_code`, its logs, and whether
    its run has a checkpoint for the rerun to resume from)."""
    result = read_outcome(job.paths) if has_result(job) else None
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
