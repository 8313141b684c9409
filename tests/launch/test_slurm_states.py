"""The Slurm launcher's view of its jobs without a cluster: squeue's and sacct's output faked, job folders
written by hand as submitit's jobs leave them. Whether a job is queued, finished, cancelled or lost, and
why it failed, must not depend on Slurm keeping accounting (sacct)."""

from __future__ import annotations

import json
import subprocess
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path

import pytest

from blocklab import cli
from blocklab import compare as compare_module
from blocklab.launch.plan import Todo
from blocklab.training.config import TrainConfig

submitit = pytest.importorskip("submitit")
from submitit.core.utils import cloudpickle_dump  # noqa: E402

from blocklab.launch.failures import failure_reason, last_error  # noqa: E402
from blocklab.launch.outcome import outcome_path  # noqa: E402
from blocklab.launch.slurm import JobStates, SlurmLauncher, SlurmSettings  # noqa: E402

NO_ACCOUNTING = "sacct: error: Slurm accounting storage is disabled\n"
SCONTROL_UNKNOWN = "slurm_load_jobs error: Invalid job id specified\n"


def scontrol_line(job_id: int, state: str, exit_code: str, array: tuple[int, int] | None = None) -> str:
    """One line of `scontrol --oneliner show job` as Slurm 22.05.8 prints it (fields cut from a job on
    the single-node test cluster; an array task names its array and index after JobId)."""
    task = f" ArrayJobId={array[0]} ArrayTaskId={array[1]}" if array else ""
    reason = "None" if state == "COMPLETED" else "NonZeroExitCode"
    return (f"JobId={job_id}{task} JobName=blocklab UserId=root(0) GroupId=root(0) MCS_label=N/A "
            "Priority=4294901757 Nice=0 Account=(null) QOS=(null) "
            f"JobState={state} Reason={reason} Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 "
            f"ExitCode={exit_code} RunTime=00:00:05 TimeLimit=00:10:00 TimeMin=N/A "
            "SubmitTime=2024-05-01T10:00:00 EligibleTime=2024-05-01T10:00:01 Partition=debug NodeList=node1 "
            "BatchHost=node1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
            "TRES=cpu=1,node=1,billing=1 Command=(null) WorkDir=/home/u StdErr=/home/u/slurm/%j_0_log.err "
            "StdIn=/dev/null StdOut=/home/u/slurm/%j_0_log.out Power= \n")
CANCELLED_LINE = "slurmstepd: error: *** JOB 22 ON node1 CANCELLED AT 2024-05-01T10:00:00 ***\n"


class FakeSlurm:
    """subprocess.run for squeue, sacct and scontrol: squeue lists `queued` ({job id: state}); sacct answers
    `ended` ({job id: state}) or, with `accounting` off, fails as a cluster without it does; `scontrol
    show job ID` prints `shown[ID]`, or fails as for a job Slurm no longer knows (after MinJobAge)."""

    def __init__(self, queued: dict[str, str], ended: dict[str, str] | None = None, accounting=True,
                 shown: dict[str, str] | None = None):
        self.queued, self.ended, self.accounting, self.shown = queued, ended or {}, accounting, shown or {}
        self.calls: list[str] = []

    def __call__(self, command, **_kwargs):
        self.calls.append(command[0])
        if command[0] == "squeue":
            text = "".join(f"{job_id}|{state}\n" for job_id, state in self.queued.items())
            return subprocess.CompletedProcess(command, 0, text, "")
        if command[0] == "scontrol":
            if command[-1] in self.shown:
                return subprocess.CompletedProcess(command, 0, self.shown[command[-1]], "")
            return subprocess.CompletedProcess(command, 1, "", SCONTROL_UNKNOWN)
        if not self.accounting:
            return subprocess.CompletedProcess(command, 1, "", NO_ACCOUNTING)
        text = "JobID|State\n" + "".join(f"{j}|{s}\n{j}.batch|{s}\n" for j, s in self.ended.items())
        return subprocess.CompletedProcess(command, 0, text, "")


class FakeJob:
    """A job as submitit's SlurmJob keeps it: its id and its folder's paths (log, result file)."""

    def __init__(self, folder: Path, job_id: str):
        self.job_id = job_id
        self.paths = submitit.core.utils.JobPaths(folder / job_id, job_id=job_id, task_id=0)
        self.paths.folder.mkdir(parents=True, exist_ok=True)
        self.cancelled = False

    def result_file(self, outcome: str, value) -> FakeJob:
        """What an ended job leaves: submitit's pickle and RunJob's outcome file."""
        cloudpickle_dump((outcome, value), self.paths.result_pickle)
        written = value if outcome == "success" else {"error": value.splitlines()[-1], "trace": value}
        outcome_path(self.paths).write_text(json.dumps(written))
        return self

    def log(self, text: str) -> FakeJob:
        self.paths.stderr.write_text(text)
        return self

    def cancel(self, check: bool = True) -> None:
        self.cancelled = True


def test_without_accounting_a_job_gone_from_squeue_twice_is_lost_and_sacct_is_asked_once(tmp_path):
    slurm = FakeSlurm({"12_0": "RUNNING"}, accounting=False)
    states = JobStates(run=slurm)
    running, gone = FakeJob(tmp_path, "12_0"), FakeJob(tmp_path, "12_1")
    done = FakeJob(tmp_path, "12_2").result_file("success", {"status": "trained", "seconds": 1.0})
    assert states.look([running, gone, done]) == ["RUNNING", "COMPLETING", "FINISHED"]  # may be a late file
    assert states.look([running, gone, done]) == ["RUNNING", "LOST", "FINISHED"]
    assert states.look([running, gone, done]) == ["RUNNING", "LOST", "FINISHED"]
    assert slurm.calls.count("sacct") == 1 and not states.accounting  # never asked again


def test_with_accounting_a_gone_job_takes_sacct_final_state(tmp_path):
    slurm = FakeSlurm({}, ended={"12_1": "CANCELLED by 1000", "13": "OUT_OF_MEMORY"})
    states = JobStates(run=slurm)
    jobs = [FakeJob(tmp_path, "12_1"), FakeJob(tmp_path, "13"), FakeJob(tmp_path, "14")]
    states.look(jobs)
    assert states.look(jobs) == ["CANCELLED", "OUT_OF_MEMORY", "LOST"]  # 14: sacct does not know it
    assert states.accounting


def test_a_job_that_squeue_lists_again_starts_its_count_over(tmp_path):
    slurm = FakeSlurm({})
    states = JobStates(run=slurm)
    job = FakeJob(tmp_path, "7")
    assert states.look([job]) == ["COMPLETING"]
    slurm.queued = {"7": "PENDING"}  # requeued at its time limit: briefly out of squeue, then back
    assert states.look([job]) == ["PENDING"]
    slurm.queued = {}
    assert states.look([job]) == ["COMPLETING"]


def test_squeue_that_cannot_be_asked_leaves_the_jobs_unknown_not_lost(tmp_path):
    def broken(command, **_kwargs):
        raise FileNotFoundError(command[0])

    states = JobStates(run=broken)
    job = FakeJob(tmp_path, "5")
    assert [states.look([job])[0] for _ in range(3)] == ["UNKNOWN"] * 3


REQUEUED_TOO_OFTEN = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
                      "submitit.core.utils.UncompletedJobError: Job not requeued because: timed-out too many "
                      "times.\n")
PROGRESS = " 50% 100/200 steps [00:10<00:10, 10.0step/s]\r 51% 102/200 steps [00:10<00:10]\n"


@pytest.mark.parametrize("state, trace, log, expected", [
    ("FAILED", REQUEUED_TOO_OFTEN, "", "reached its time limit more often than it may be requeued (the "
                                       "Slurm setting max_requeues"),
    ("LOST", "", PROGRESS + CANCELLED_LINE + PROGRESS, "was cancelled (scancel"),
    ("CANCELLED", "", PROGRESS, "was cancelled (scancel"),
    ("LOST", "", CANCELLED_LINE.replace(" ***", " DUE TO TIME LIMIT ***"), "reached its time limit and"),
    ("OUT_OF_MEMORY", "", PROGRESS, "ran out of memory"),
    ("LOST", "", "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=3.batch.\n", "ran out of memory"),
    ("FAILED", "Traceback:\n  ...\nValueError: no such corpus\n", "", "failed: ValueError: no such corpus"),
    ("LOST", "", "Traceback:\n  ...\ntorch.OutOfMemoryError: CUDA out of memory.\n" + PROGRESS,
     "failed: OutOfMemoryError: CUDA out of memory."),
    ("LOST", "", PROGRESS, "is lost: neither queued nor running"),
])
def test_the_failure_reason_comes_from_the_state_and_the_last_error_of_the_log(state, trace, log, expected):
    assert failure_reason(state, trace, log).startswith(expected)


def test_the_last_error_skips_progress_lines_and_the_jobs_own_exit():
    text = ("RuntimeError: first\nKeyError: 'x'\n" + PROGRESS
            + "SystemExit: 143\nsubmitit ERROR (t) - failed\n")
    assert last_error(text) == "KeyError: 'x'"
    assert last_error(PROGRESS) is None


def todo(tmp_path: Path, name: str, index: int, total: int) -> Todo:
    cfg = TrainConfig(max_steps=10, progress=False, out_dir=str(tmp_path / "runs" / name))
    return Todo(index, total, name, cfg, "training")


def test_the_waiting_command_reports_a_lost_job_with_its_reason_instead_of_waiting(tmp_path):
    slurm = FakeSlurm({}, accounting=False)
    launcher = SlurmLauncher(SlurmSettings(poll_s=0.0), states=JobStates(run=slurm))
    jobs = [FakeJob(tmp_path, "22_0").result_file("success", {"status": "trained", "seconds": 2.0}),
            FakeJob(tmp_path, "22_1").log(PROGRESS + CANCELLED_LINE)]
    runs = [todo(tmp_path, "a", 0, 2), todo(tmp_path, "b", 1, 2)]
    lines: list[str] = []
    trained, lost = launcher._wait(jobs, runs, lines.append)
    assert (trained.status, trained.seconds) == ("trained", 2.0)
    assert lost.status == "failed" and lost.error.startswith("job 22_1 was cancelled (scancel")
    assert lost.log == jobs[1].paths.stderr
    assert slurm.calls.count("squeue") == 2  # two looks: the lost job is not waited on
    assert not any(job.cancelled for job in jobs)


class Planted:
    """A pickle that runs code when read: it makes a file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_pickle_planted_in_the_store_is_never_read(tmp_path):
    """A result pickle someone planted beside a job of the store (no outcome file): the job is reported
    failed from its logs, and the pickle's code never runs."""
    slurm = FakeSlurm({}, accounting=False)
    launcher = SlurmLauncher(SlurmSettings(poll_s=0.0), states=JobStates(run=slurm))
    job = FakeJob(tmp_path, "31")
    marker = tmp_path / "ran"
    cloudpickle_dump(("success", Planted(marker)), job.paths.result_pickle)
    (outcome,) = launcher._wait([job], [todo(tmp_path, "a", 0, 1)], lambda *_: None)
    assert outcome.status == "failed" and not marker.exists()
    outcome_path(job.paths).write_text("[1, 2]")  # not an outcome: failed, not read as a success
    (outcome,) = launcher._wait([job], [todo(tmp_path, "a", 0, 1)], lambda *_: None)
    assert outcome.status == "failed" and not marker.exists()


def test_a_failed_job_reports_its_own_exception_from_its_result_file(tmp_path):
    slurm = FakeSlurm({})
    launcher = SlurmLauncher(SlurmSettings(poll_s=0.0), states=JobStates(run=slurm))
    job = FakeJob(tmp_path, "30").result_file("error", "Traceback:\nValueError: bad\n")
    job.log("- " + str(job.paths.stdout) + "\n")  # the line submitit's error text used to end with
    (outcome,) = launcher._wait([job], [todo(tmp_path, "a", 0, 1)], lambda *_: None)
    assert outcome.error == "job 30 failed: ValueError: bad"


class FakeExecutor:
    """submitit's executor, submitting nothing: each job gets the next id."""

    def __init__(self, folder: Path):
        self.folder, self.submitted = folder, 0

    @contextmanager
    def batch(self):
        yield

    def submit(self, *_args):
        self.submitted += 1
        return FakeJob(self.folder, f"40_{self.submitted - 1}")


def test_a_rerun_waits_for_a_queued_job_and_resubmits_one_gone_from_the_queue(tmp_path, monkeypatch):
    folder = tmp_path / "slurm"
    runs = [todo(tmp_path, "a", 0, 2), todo(tmp_path, "b", 1, 2)]
    folder.mkdir()
    (folder / "jobs.json").write_text(f'{{"{runs[0].cfg.out_dir}": "4_0", "{runs[1].cfg.out_dir}": "4_1"}}')
    slurm = FakeSlurm({"4_0": "PENDING"}, accounting=False)  # 4_1 was scancelled: in neither
    launcher = SlurmLauncher(SlurmSettings(), states=JobStates(run=slurm))
    executor = FakeExecutor(folder)
    monkeypatch.setattr(launcher, "_executor", lambda *_: executor)
    lines: list[str] = []
    jobs = launcher._submit(runs, folder, lines.append)
    assert [job.job_id for job in jobs] == ["4_0", "40_0"] and executor.submitted == 1
    assert "job 4_0 is still pending; waiting for it" in lines[0]
    assert "job 4_1 is no longer queued or running; submitting it again" in lines[1]
    assert '"40_0"' in (folder / "jobs.json").read_text()


def test_ctrl_c_says_what_a_rerun_does_when_the_interrupt_says_nothing(monkeypatch, tmp_path, capsys):
    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(compare_module, "compare", interrupted)
    assert cli.main(["compare", "--steps", "2", "--out", str(tmp_path / "cmp")]) == 130
    err = capsys.readouterr().err
    assert "blocklab: interrupted; rerun the same command: finished runs are reused" in err

    def said(*_args, **_kwargs):
        raise KeyboardInterrupt("2 job(s) not finished were cancelled")

    monkeypatch.setattr(compare_module, "compare", said)
    assert cli.main(["compare", "--steps", "2", "--out", str(tmp_path / "cmp")]) == 130
    assert "blocklab: interrupted; 2 job(s) not finished were cancelled\n" in capsys.readouterr().err


def test_the_help_names_every_slurm_setting(capsys):
    with pytest.raises(SystemExit):
        cli.main(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    missing = [f.name for f in fields(SlurmSettings) if f.name not in text]
    assert not missing


# -- without accounting: scontrol's state and exit code ---------------------------------
def test_scontrol_names_array_tasks_as_squeue_does_and_keeps_the_exit_code():
    from blocklab.launch.failures import read_scontrol

    text = (scontrol_line(13, "FAILED", "137:0", array=(12, 1))
            + scontrol_line(14, "COMPLETED", "0:0", (12, 0))
            + scontrol_line(15, "OUT_OF_MEMORY", "0:125") + "\n")
    assert read_scontrol(text) == {"12_1": ("FAILED", "137:0"), "12_0": ("COMPLETED", "0:0"),
                                   "15": ("OUT_OF_MEMORY", "0:125")}
    assert read_scontrol(SCONTROL_UNKNOWN) == {}


@pytest.mark.parametrize("exit_code, shown", [("137:0", "signal 9, SIGKILL, exit code 137"),
                                              ("0:9", "signal 9, SIGKILL, Slurm exit code 0:9")])
def test_without_accounting_a_killed_job_is_named_killed_with_its_exit_code(exit_code, shown, tmp_path):
    """kill -9 (or the kernel's out-of-memory killer) of a job's Python was "lost ... no accounting to say
    why", though scontrol still knew FAILED and its exit code: now the job is named killed, with both."""
    slurm = FakeSlurm({"12_0": "RUNNING"}, accounting=False,
                      shown={"12": scontrol_line(13, "FAILED", exit_code, array=(12, 1))})
    states = JobStates(run=slurm)
    running, killed = FakeJob(tmp_path, "12_0"), FakeJob(tmp_path, "12_1").log(PROGRESS)
    assert states.look([running, killed]) == ["RUNNING", "COMPLETING"]
    assert states.look([running, killed]) == ["RUNNING", "FAILED"]
    assert states.exit_codes == {"12_1": exit_code} and not states.accounting
    launcher = SlurmLauncher(SlurmSettings(poll_s=0.0), states=states)
    slurm.queued = {}
    (outcome,) = launcher._wait([killed], [todo(tmp_path, "b", 0, 1)], lambda *_: None)
    assert outcome.error.startswith(f"job 12_1 was killed ({shown}; Slurm state FAILED): by the kernel's "
                                    "out-of-memory killer"), outcome.error
    assert "lost" not in outcome.error


def test_a_job_scontrol_no_longer_knows_is_lost_and_one_it_calls_out_of_memory_ran_out(tmp_path):
    slurm = FakeSlurm({}, accounting=False, shown={"15": scontrol_line(15, "OUT_OF_MEMORY", "0:125")})
    states = JobStates(run=slurm)
    launcher = SlurmLauncher(SlurmSettings(poll_s=0.0), states=states)
    jobs = [FakeJob(tmp_path, "15"), FakeJob(tmp_path, "16")]
    oom, lost = launcher._wait(jobs, [todo(tmp_path, "a", 0, 2), todo(tmp_path, "b", 1, 2)], lambda *_: None)
    assert oom.error.startswith("job 15 ran out of memory (killed by Slurm): ask for more with mem_gb")
    assert lost.error.startswith("job 16 is lost: neither queued nor running")


@pytest.mark.parametrize("state, log, exit_code, expected", [
    ("FAILED", "srun: error: node1: task 0: Killed\nsrun: Force Terminated StepId=3.0\n", "",
     "was killed (srun: 'task 0: Killed'; Slurm state FAILED)"),
    ("LOST", "srun: error: node1: task 0: Killed\n", None,
     "was killed (srun: 'task 0: Killed'; Slurm state LOST)"),
    ("FAILED", PROGRESS, "139:0",
     "was killed (signal 11, SIGSEGV, exit code 139; Slurm state FAILED): by a signal"),
    ("FAILED", "Traceback:\nValueError: bad\n", "1:0", "failed: ValueError: bad"),
    ("FAILED", PROGRESS, "3:0", "ended (failed, exit code 3:0) without a result"),
    ("CANCELLED", PROGRESS, "0:15", "was cancelled (scancel"),
])
def test_the_exit_code_tells_a_kill_from_an_exit(state, log, exit_code, expected):
    assert failure_reason(state, "", log, exit_code).startswith(expected)


@pytest.mark.parametrize("checkpoint", [False, True])
def test_a_job_cancelled_before_its_first_checkpoint_is_not_told_it_resumes(checkpoint, tmp_path):
    slurm = FakeSlurm({}, accounting=False, shown={"22": scontrol_line(22, "CANCELLED", "0:15")})
    launcher = SlurmLauncher(SlurmSettings(poll_s=0.0), states=JobStates(run=slurm))
    run = todo(tmp_path, "a", 0, 1)
    if checkpoint:
        (Path(run.cfg.out_dir) / "checkpoints" / "step_000002").mkdir(parents=True)
        (Path(run.cfg.out_dir) / "checkpoints" / "step_000002" / "state.json").write_text("{}")
    (outcome,) = launcher._wait([FakeJob(tmp_path, "22").log(PROGRESS)], [run], lambda *_: None)
    assert outcome.error.startswith("job 22 was cancelled (scancel")
    if checkpoint:
        assert outcome.error.endswith("the same command run again resumes it from its last checkpoint")
    else:
        assert "resumes" not in outcome.error and "last checkpoint" not in outcome.error
        assert outcome.error.endswith("it had written no checkpoint yet, so the same command run again "
                                      "trains it from the start")


def test_a_second_no_wait_says_the_jobs_are_already_submitted_and_how_to_check_on_them(tmp_path, monkeypatch):
    """A second `compare --no-wait` while the first's jobs were queued said "waiting for it" and returned
    at once: now it says they were submitted earlier, submits nothing, and names squeue and the rerun."""
    from blocklab.launch import slurm as slurm_module

    folder = tmp_path / "slurm"
    runs = [todo(tmp_path, "a", 0, 2), todo(tmp_path, "b", 1, 2)]
    folder.mkdir()
    (folder / "jobs.json").write_text(json.dumps({runs[0].cfg.out_dir: "4_0", runs[1].cfg.out_dir: "4_1"}))
    slurm = FakeSlurm({"4_0": "PENDING", "4_1": "RUNNING"}, accounting=False)
    launcher = SlurmLauncher(SlurmSettings(folder=str(folder)), wait=False, states=JobStates(run=slurm))
    executor = FakeExecutor(folder)
    monkeypatch.setattr(launcher, "_executor", lambda *_: executor)
    monkeypatch.setattr(slurm_module, "prepare_once", lambda *_: None)
    lines: list[str] = []
    launch = launcher.train([(None, r.cfg) for r in runs], lines.append)
    assert executor.submitted == 0 and launch.pending == [r.cfg.out_dir for r in runs]
    assert not any("waiting for it" in line for line in lines), lines
    assert "job 4_0 is still pending; submitted earlier, so not submitted again" in lines[0]
    assert "job 4_1 is still running; submitted earlier, so not submitted again" in lines[1]
    assert lines[-1].startswith("2 run(s) already submitted earlier and still queued or running (job(s) 4_0, "
                                "4_1)") and "squeue --jobs 4_0,4_1" in lines[-1]
    assert "without --no-wait to wait for them" in lines[-1]


def test_with_accounting_the_signal_comes_from_the_step_sacct_lists(tmp_path):
    """sacct of an array task whose Python was killed by signal 9, as Slurm 22.05.8 with slurmdbd gave it:
    the job's line says 9:0, its step 0 says 0:9; the step's is the one that tells a kill."""
    text = ("JobID|State|ExitCode\n1_0|FAILED|9:0\n1_0.batch|FAILED|9:0\n1_0.0|CANCELLED|0:9\n"
            "1_1|COMPLETED|0:0\n1_1.batch|COMPLETED|0:0\n1_1.0|COMPLETED|0:0\n")

    def sacct(command, **_kwargs):
        return subprocess.CompletedProcess(command, 0, text if command[0] == "sacct" else "", "")

    states = JobStates(run=sacct)
    assert states.sacct(["1_0", "1_1"]) == {"1_0": "FAILED", "1_1": "COMPLETED"}
    assert states.exit_codes == {"1_0": "0:9", "1_1": "0:0"}
    assert failure_reason("FAILED", "", "", states.exit_codes["1_0"]).startswith(
        "was killed (signal 9, SIGKILL, Slurm exit code 0:9; Slurm state FAILED)")
