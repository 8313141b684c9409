"""Why a Slurm job ended without finishing its run, in words: from its state and exit code (sacct's where
the cluster keeps accounting; else `scontrol show job`'s, which Slurm keeps for MinJobAge, 300 s by
default, after a job ended), the traceback of its outcome file and the last lines of its logs.

`scontrol --oneliner show job ID` prints one line of Key=Value fields per job (every task of an array):

    JobId=3 ArrayJobId=3 ArrayTaskId=1 JobName=blocklab ... JobState=FAILED Reason=NonZeroExitCode ...
    Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=137:0 RunTime=00:00:05 ...

ExitCode is Slurm's "<exit code>:<signal>": 137:0 is a batch script whose Python was killed by signal 9
(128 + 9, the shell's convention: kill -9, or the kernel's out-of-memory killer), 0:9 a job killed by
signal 9 itself. A job whose run had written no checkpoint yet is not told that a rerun resumes it.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

from blocklab.training.checkpoint import list_checkpoints

# slurmstepd's line in a job's log when Slurm ends it: "*** JOB 22 ON n1 CANCELLED AT ... DUE TO TIME
# LIMIT ***"
SLURM_END = re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+(?: DUE TO ([A-Z ]+?))? \*\*\*")
# srun's line when a task of the job was killed by a signal: "srun: error: node1: task 0: Killed"
SRUN_KILLED = re.compile(r"srun: error: \S+: task \d+: Killed")
# a Python exception's last line: "ValueError: ...", "torch.OutOfMemoryError: CUDA out of memory ..."
EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Z]\w*(?:Error|Exception|Interrupt|Exit))(?::\s*(.*))?$")
RERUN = "the same command run again resumes it from its last checkpoint"
RERUN_AFRESH = "it had written no checkpoint yet, so the same command run again trains it from the start"


def rerun_text(out_dir: str | Path) -> str:
    """What the same command does with the run in `out_dir`: resume it (RERUN), or, with no checkpoint
    yet, train it from the start (RERUN_AFRESH)."""
    return RERUN if list_checkpoints(out_dir) else RERUN_AFRESH


def read_scontrol(text: str) -> dict[str, tuple[str, str]]:
    """{job id: (JobState, ExitCode)} of `scontrol --oneliner show job` output; an array task is
    "<ArrayJobId>_<ArrayTaskId>", as squeue --array and submitit name it."""
    jobs = {}
    for line in text.splitlines():
        fields = dict(re.findall(r"(?:^|\s)([A-Za-z_]+)=(\S*)", line))
        if "JobId" not in fields or "JobState" not in fields:
            continue
        task = fields.get("ArrayTaskId", "")
        job_id = f"{fields['ArrayJobId']}_{task}" if task.isdigit() and "ArrayJobId" in fields \
            else fields["JobId"]
        jobs[job_id] = (fields["JobState"].upper(), fields.get("ExitCode", ""))
    return jobs


def killed_by(exit_code: str | None) -> tuple[int, str] | None:
    """(signal number, how Slurm's ExitCode said it) of a job a signal ended: "0:9" (the signal itself)
    or "137:0" (128 + 9 from the shell around a killed process); None for an exit of its own."""
    match = re.fullmatch(r"(\d+):(\d+)", (exit_code or "").strip())
    if not match:
        return None
    code, sig = int(match.group(1)), int(match.group(2))
    if 0 < sig < 65:  # not Slurm's own marks above the real signals (0:125 of an out-of-memory kill)
        return sig, f"Slurm exit code {code}:{sig}"
    if not sig and 128 < code < 128 + 65:
        return code - 128, f"exit code {code}"
    return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def failure_reason(state: str, trace: str, logs: str, exit_code: str | None = None, rerun: str = RERUN
                   ) -> str:
    """Why a job ended without finishing its run, from its Slurm state (sacct's or scontrol's, LOST where
    neither knows it), its ExitCode, the traceback in its outcome file and its logs' last lines. `rerun`
    says what the same command does with the run (RERUN, or RERUN_AFRESH without a checkpoint)."""
    cut = SLURM_END.findall(logs)
    why = (cut[-1] or "CANCELLED").strip() if cut else ""
    killed = killed_by(exit_code)
    if "timed-out too many times" in trace:
        return (f"reached its time limit more often than it may be requeued (the Slurm setting max_requeues, "
                f"3 by default); {rerun}, or give it a longer time limit (time_min, --time-limit) or more "
                "requeues (max_requeues)")
    if state == "OUT_OF_MEMORY" or re.search(r"oom[-_]kill|Out Of Memory", logs):
        how = f", signal {killed[0]}, {killed[1]}" if killed else ""
        return f"ran out of memory (killed by Slurm{how}): ask for more with mem_gb (--mem-gb); {rerun}"
    if state == "TIMEOUT" or why == "TIME LIMIT":
        return f"reached its time limit and was not requeued; {rerun}"
    if state == "PREEMPTED" or why == "PREEMPTION":
        return f"was preempted and not requeued; {rerun}"
    if state == "NODE_FAIL" or why == "NODE FAILURE":
        return f"ended with the failure of its node; {rerun}"
    if state.startswith("CANCELLED") or why == "CANCELLED":
        return f"was cancelled (scancel, or the cluster's administrators); {rerun}"
    if killed or SRUN_KILLED.search(logs):
        what = (f"signal {killed[0]}, {_signal_name(killed[0])}, {killed[1]}" if killed else
                "srun: 'task 0: Killed'")
        cause = ("the kernel's out-of-memory killer (ask for more with mem_gb, --mem-gb) or a kill -9"
                 if not killed or killed[0] == signal.SIGKILL else "a signal from outside the job")
        return f"was killed ({what}; Slurm state {state}): by {cause}, not by an error of its own; {rerun}"
    error = last_error(trace) or last_error(logs)
    if error:
        return f"failed: {error}"
    if state == "LOST":
        return ("is lost: neither queued nor running, and it left no result (no accounting, and scontrol no "
                f"longer knows it, to say why); {rerun}")
    code = f", exit code {exit_code}" if exit_code and exit_code != "0:0" else ""
    return f"ended ({state.lower()}{code}) without a result; {rerun}"


def last_error(text: str) -> str | None:
    """The last Python exception line of a traceback or a log ("ValueError: bad value"), if any."""
    for raw in reversed(text.splitlines()):
        line = raw.split("\r")[-1].strip()  # progress bars redraw a line with carriage returns
        match = EXCEPTION.match(line)
        if match and match.group(1) not in ("SystemExit", "KeyboardInterrupt"):
            return f"{match.group(1)}: {match.group(2)}" if match.group(2) else match.group(1)
    return None
