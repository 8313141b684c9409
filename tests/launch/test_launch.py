"""Many runs at once: compare and reproduce through `blocklab.launch`, in worker processes on this machine
and as jobs through submitit, with the results of the sequential command."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from blocklab import cli
from blocklab import compare as compare_module
from blocklab.compare import Entry
from blocklab.launch import LocalLauncher, RunsFailed, RunsPending, parse_jobs, plan, resolve_jobs
from blocklab.launch.progress import RunsProgress
from blocklab.launch.store import run_lock
from blocklab.training.metrics import read_metrics
from blocklab.util.errors import ConfigError
from helpers import compare_base

ARCHS = ["pre-ln", "sas", "resformer"]


def compare(*args, **kwargs):
    return compare_module.compare(*args, **{"timing_rounds": 1, "timing_steps": 1, "log": lambda *_: None,
                                            **kwargs})


def base(corpus, cache, steps=6):
    return compare_base(corpus, cache, steps)


def curve(run: Path) -> list[tuple]:
    """Every logged loss of a run: (kind, step, loss), training and validation."""
    rows = read_metrics(run / "metrics.jsonl")
    return [(r["kind"], r["step"], r.get("loss", r.get("val_loss"))) for r in rows
            if "loss" in r or "val_loss" in r]


@pytest.mark.slow  # 12-20 s of training in subprocesses: CI's slow tier runs it
def test_two_jobs_train_the_losses_of_one_job_bit_for_bit(corpus, tmp_path):
    cfg = base(corpus, tmp_path / "cache")
    for jobs in (1, 2):
        compare(ARCHS, tmp_path / f"jobs{jobs}", base=cfg, launcher=LocalLauncher(jobs=jobs, threads=1))
    for arch in ARCHS:
        one, two = (curve(tmp_path / f"jobs{jobs}" / "runs" / f"{arch}-seed0") for jobs in (1, 2))
        assert len(one) == 6 + 4 and one == two  # 6 steps, validation at 0, 2, 4, 6
    log = (tmp_path / "jobs2" / "runs" / "sas-seed0.log").read_text()
    assert "in a worker process (threads 1)" in log  # each run trained in a process of its own
    method = json.loads((tmp_path / "jobs2" / "results.json").read_text())["method"]
    assert method["launch"] == {"launcher": "local", "jobs": 2, "threads": 1}
    report = (tmp_path / "jobs2" / "report.md").read_text()
    assert "the runs trained 2 at a time, side by side, 1 thread each" in report
    stamp = (tmp_path / "jobs2" / "runs" / "sas-seed0" / "summary.json").stat().st_mtime_ns
    messages = []
    compare(ARCHS, tmp_path / "jobs2", base=cfg, launcher=LocalLauncher(jobs=2, threads=1),
            log=messages.append)  # again: every run reused, none trained
    assert len(messages) == 3 and all("finished earlier, reused" in m for m in messages)
    assert (tmp_path / "jobs2" / "runs" / "sas-seed0" / "summary.json").stat().st_mtime_ns == stamp


def test_one_progress_line_follows_the_workers(corpus, tmp_path, capsys):
    out = tmp_path / "cmp"
    compare(ARCHS[:2], out, base={**base(corpus, tmp_path / "c"), "progress": True},
            launcher=LocalLauncher(jobs=2, threads=1), log=print)
    captured = capsys.readouterr()
    progress = [line for line in captured.err.splitlines() if line.startswith("compare:")]
    assert progress[-1].startswith("compare: 100% [")  # stderr is not a terminal here: plain lines
    assert any(re.search(r"runs done, .*-seed0: step 6/6, loss \d", line) for line in progress)
    lines = captured.out.splitlines()
    for line in ("[1/2] pre-ln-seed0: training in a worker", "[2/2] sas-seed0: training in a worker"):
        assert line in lines
    assert sum(" val loss " in line and line.endswith(" s wall time") for line in lines) == 2


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_failing_run_is_reported_and_the_others_finish(corpus, tmp_path, jobs):
    diverges = Entry("diverges", "pre-ln", train={"optim": {"lr": 1e30}})  # a NaN gradient at step 3
    out = tmp_path / "cmp"
    with pytest.raises(RunsFailed) as caught:
        compare([Entry.parse("pre-ln"), diverges, Entry.parse("sas")], out, base=base(corpus, tmp_path / "c"),
                launcher=LocalLauncher(jobs=jobs, threads=1))
    [failed] = caught.value.failed
    assert Path(failed.cfg.out_dir).name == "diverges-seed0"
    assert failed.error.startswith("TrainingError: the gradient norm became nan")
    assert failed.log == out / "runs" / "diverges-seed0.log"
    assert "Traceback" in failed.log.read_text() and "TrainingError" in failed.log.read_text()
    assert caught.value.report == out / "report.md"
    for arch in ("pre-ln", "sas"):
        assert (out / "runs" / f"{arch}-seed0" / "summary.json").is_file()
    report = (out / "report.md").read_text()
    results = report.split("\n## Results\n")[1].split("\n## ")[0]
    assert "| pre-ln |" in results and "| sas |" in results and "diverges" not in results
    assert "1 run failed and is left out of every table" in report
    failed_section = report.split("\n## Failed runs\n")[1].split("\n## ")[0]
    assert "| diverges-seed0 | diverges | 0 | TrainingError: the gradient norm became nan" in failed_section
    assert str(failed.log) in failed_section
    assert str(failed.log) in str(caught.value)  # the message names the log


def test_the_command_exits_non_zero_and_names_the_failed_runs_logs(corpus, tmp_path, capsys):
    out = tmp_path / "cmp"
    code = cli.main(["compare", "--archs", "pre-ln,sas", "--seeds", "1", "--steps", "4", "batch_size=4",
                     "seq_len=32", "eval_every=2", "--quiet", "--jobs", "2", "--timing-rounds", "0",
                     "--out", str(out), "optim.lr=1e30", "eval_batches=2", "model.d_model=32",
                     "model.n_layers=2", "model.n_heads=2", f"data.source={corpus}", "data.tokenizer=byte",
                     f"data.cache_dir={tmp_path / 'cache'}"])
    err = capsys.readouterr().err
    assert code == 1
    assert "2 run(s) failed" in err
    for arch in ("pre-ln", "sas"):
        assert f"(log: {out / 'runs' / f'{arch}-seed0.log'})" in err


def test_each_worker_gets_one_visible_gpu_round_robin(corpus, tmp_path, monkeypatch):
    """On CUDA a worker sees one GPU, by its slot: with CUDA_VISIBLE_DEVICES=3,5 and 2 jobs, the first two
    runs get 3 and 5 and the third the one its slot frees. (This machine has no GPU: torch is told it
    has two, and the runs train on the CPU, which their logs do not change.)"""
    import torch

    from blocklab.launch import local

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    configs = compare_module.run_configs([Entry.parse("pre-ln")], 1, tmp_path, base(corpus, tmp_path / "c"))
    assert local._visible_gpus(configs) == ["3", "5"]
    assert local._visible_gpus([(e, c.replace(device="cpu")) for e, c in configs]) == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the workers, and the runs, on CPU
    monkeypatch.setattr(local, "_visible_gpus", lambda configs: ["3", "5"])
    out = tmp_path / "cmp"
    compare(ARCHS, out, base=base(corpus, tmp_path / "c", steps=2), launcher=LocalLauncher(jobs=2, threads=1))
    seen = [(out / "runs" / f"{a}-seed0.log").read_text().split("CUDA_VISIBLE_DEVICES=")[1][0] for a in ARCHS]
    assert seen[:2] == ["3", "5"] and seen[2] in ("3", "5")


def _workers_of(out: Path) -> list[int]:
    """Processes (other than this one) whose command line names `out`: the workers of a compare there."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "blocklab.launch.worker" in command and str(out) in command:
                pids.append(int(entry.name))
    return pids


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + patient(timeout)
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _checkpoints(out: Path) -> int:
    """The steps of every run's newest checkpoint, summed (older checkpoints are deleted as runs go on)."""
    from blocklab.training.checkpoint import latest_checkpoint

    newest = [latest_checkpoint(run) for run in (out / "runs").glob("*-seed0")]
    return sum(int(path.name.split("_")[-1]) for path in newest if path is not None)


@pytest.mark.slow  # about 35 s: CI runs it with the slow tests
@pytest.mark.skipif(not Path("/proc/self/cmdline").is_file(), reason="finds the workers through /proc")
def test_ctrl_c_and_kill_9_leave_no_worker_and_the_rerun_completes_the_report(corpus, tmp_path):
    """Ctrl-C (SIGINT to the compare) and kill -9 midway: no worker outlives the compare, and running
    the same command again resumes the unfinished runs to the curves of an uninterrupted compare."""
    def command(out: Path, jobs: str) -> list[str]:
        return [sys.executable, "-m", "blocklab.cli", "compare", "--archs", "pre-ln,sas", "--seeds", "1",
                "--steps", "300", "eval_every=20", "batch_size=4", "seq_len=32", "--quiet",
                "--jobs", jobs, "--threads", "1", "--timing-rounds", "0", "--out", str(out), "log_every=5",
                "eval_batches=1", "model.d_model=32", "model.n_layers=2", "model.n_heads=2",
                f"data.source={corpus}", "data.tokenizer=byte", f"data.cache_dir={tmp_path / 'cache'}"]

    from blocklab.training.checkpoint import latest_checkpoint

    out = tmp_path / "cmp"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    first = subprocess.Popen(command(out, "2"), **quiet)
    _wait_for(lambda: all(latest_checkpoint(out / "runs" / f"{a}-seed0") for a in ("pre-ln", "sas")), 120,
              "the first checkpoints")
    first.send_signal(signal.SIGINT)  # Ctrl-C reaches the compare alone: it stops its workers itself
    assert first.wait(60) == 130
    assert _workers_of(out) == []
    assert not all((out / "runs" / f"{a}-seed0" / "summary.json").is_file() for a in ("pre-ln", "sas"))
    saved = _checkpoints(out)
    second = subprocess.Popen(command(out, "2"), **quiet)
    _wait_for(lambda: _checkpoints(out) > saved, 120, "a checkpoint after the resume")
    second.kill()  # kill -9: no cleanup in the compare; its workers see their stdin close
    second.wait()
    _wait_for(lambda: not _workers_of(out), 90, "the orphaned workers to stop")
    assert subprocess.run(command(out, "2"), **quiet, timeout=patient(300)).returncode == 0
    assert (out / "report.md").is_file()
    reference = tmp_path / "reference"
    assert subprocess.run(command(reference, "1"), **quiet, timeout=patient(300)).returncode == 0
    for arch in ("pre-ln", "sas"):
        assert curve(out / "runs" / f"{arch}-seed0") == curve(reference / "runs" / f"{arch}-seed0")


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"),
                    reason="signal.pthread_kill (a signal aimed at one thread) is POSIX-only, not on Windows")
def test_sigterm_caught_by_a_reader_thread_still_stops_the_launcher_at_once():
    """The kernel may hand `kill`'s SIGTERM to any thread; Python runs the handler in the main thread,
    which the launcher must not leave asleep in its queue until a worker next writes (the old wait)."""
    import queue
    import threading

    from blocklab.launch import local

    events: queue.Queue = queue.Queue()

    def reader():  # a thread like the workers' readers: the signal lands here
        time.sleep(0.3)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        time.sleep(10)
        events.put(("worker", None))  # a blocked wait would only wake here, and return this event

    previous = local._sigterm_as_interrupt()
    try:
        threading.Thread(target=reader, daemon=True).start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt, match="stopped by signal 15"):
            local._next_event(events)
        assert time.monotonic() - start < 5
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_second_process_waits_for_the_runs_lock(tmp_path):
    from blocklab.training import TrainConfig

    cfg = TrainConfig(max_steps=1, out_dir=str(tmp_path / "runs" / "a-seed0"))
    holder = subprocess.Popen([sys.executable, "-c", (
        "import time; from blocklab.training import TrainConfig\n"
        "from blocklab.launch.store import run_lock\n"
        f"with run_lock(TrainConfig(max_steps=1, out_dir={cfg.out_dir!r})):\n"
        "    print('held', flush=True); time.sleep(1.5)")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    waited = []
    start = time.monotonic()
    with run_lock(cfg, on_wait=lambda: waited.append(time.monotonic() - start)):
        held_after = time.monotonic() - start
    holder.wait()
    assert len(waited) == 1 and waited[0] < 0.5 and held_after > 0.5


def test_the_summary_marks_a_finished_run_only_once_it_is_whole(corpus, tmp_path, monkeypatch):
    """summary.json is written to a temporary file and renamed: a run stopped while writing it has none."""
    from blocklab.training import TrainConfig, train
    from blocklab.util import filemodes

    real = os.replace

    def crash_on_summary(src, dst):
        if Path(dst).name == "summary.json":
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(filemodes.os, "replace", crash_on_summary)
    cfg = TrainConfig.from_dict({**base(corpus, tmp_path / "cache", steps=2),
                                 "out_dir": str(tmp_path / "run")})
    with pytest.raises(KeyboardInterrupt):
        train(cfg)
    assert not (tmp_path / "run" / "summary.json").exists()


def test_jobs_auto_fills_the_cores_the_memory_and_the_gpus(monkeypatch):
    monkeypatch.setattr(plan, "available_cores", lambda: 64)
    monkeypatch.setattr(plan, "available_memory", lambda: 10 * plan.RUN_MEMORY_BYTES + 1)
    assert resolve_jobs("auto", runs=100) == 10  # the memory holds 10 workers
    assert resolve_jobs("auto", runs=6) == 6  # never more than the runs
    monkeypatch.setattr(plan, "available_memory", lambda: None)
    assert resolve_jobs("auto", runs=100) == 64  # one per core
    assert resolve_jobs("auto", runs=100, threads=4) == 16
    assert resolve_jobs("auto", runs=100, gpus=8) == 8 and resolve_jobs("auto", runs=3, gpus=8) == 3
    monkeypatch.setattr(plan, "available_cores", lambda: 1)
    assert resolve_jobs("auto", runs=5, threads=4) == 1  # never fewer than one
    assert resolve_jobs(3, runs=1) == 3 and parse_jobs("2") == 2
    for bad in ("0", "-1", "two", 0, True):
        with pytest.raises(ConfigError, match="not allowed: give a positive number of runs at once, or auto"):
            parse_jobs(bad)


def test_one_progress_line_counts_every_run_in_training():
    stream = io.StringIO()
    with RunsProgress(3, stream=stream) as line:
        a, b = line.begin("a", "a-seed0"), line.begin("b", "b-seed0")
        a.advance(0.5, "step 5/10")
        b.skip(0.25)  # b resumes a quarter done: that quarter is neither done now nor to do
        b.advance(0.75, "step 30/40")
        assert line.bar.total == 2.75 and line.bar.n == 0.5 + 0.5
        assert line.bar.postfix == "0/3 runs done, a-seed0: step 5/10, b-seed0: step 30/40"
        line.end("a")
        assert line.bar.n == 1.5 and line.bar.postfix.startswith("1/3 runs done, b-seed0")


def test_launch_flags_need_their_launcher_and_name_what_is_allowed(capsys):
    assert cli.main(["compare", "--no-wait"]) == 2
    assert "need --launcher slurm" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["compare", "--jobs", "0"])
    err = capsys.readouterr().err
    assert "--jobs '0' is not allowed: give a positive number of runs at once, or auto" in err


# -- submitit --------------------------------------------------------------------------------------------
submitit = pytest.importorskip("submitit")
from blocklab.launch.slurm import SlurmLauncher, SlurmSettings  # noqa: E402
from blocklab.launch.slurm_settings import parse_time  # noqa: E402
from timeouts import patient  # noqa: E402


@pytest.mark.slow  # 12-20 s of training in subprocesses: CI's slow tier runs it
def test_the_slurm_launcher_trains_a_compare_through_submitits_local_executor(corpus, tmp_path):
    cfg = base(corpus, tmp_path / "cache")
    settings = SlurmSettings(cluster="local", poll_s=0.2, time_min=10, folder=str(tmp_path / "slurm"))
    out = tmp_path / "cmp"
    with pytest.raises(RunsPending, match="run the same command again"):  # --no-wait: submitted only
        compare(ARCHS[:2], out, base=cfg, launcher=SlurmLauncher(settings, wait=False))
    record = json.loads((tmp_path / "slurm" / "jobs.json").read_text())
    assert sorted(Path(run).name for run in record) == ["pre-ln-seed0", "sas-seed0"]
    report = compare(ARCHS[:2], out, base=cfg, launcher=SlurmLauncher(settings))  # the same command: waits
    assert report == out / "report.md" and report.is_file()
    method = json.loads((out / "results.json").read_text())["method"]
    assert method["launch"]["launcher"] == "submitit-local"
    compare(ARCHS[:2], tmp_path / "here", base=cfg)  # in this process, one after another
    for arch in ARCHS[:2]:
        assert curve(out / "runs" / f"{arch}-seed0") == curve(tmp_path / "here" / "runs" / f"{arch}-seed0")


@pytest.mark.slow  # 12-20 s of training in subprocesses: CI's slow tier runs it
def test_a_run_over_two_processes_is_launched_with_torchrun_inside_its_job(corpus, tmp_path):
    cfg = base(corpus, tmp_path / "cache", steps=4)  # parallel=auto: DDP under torchrun
    settings = SlurmSettings(cluster="local", poll_s=0.2, time_min=10, procs_per_run=2,
                             folder=str(tmp_path / "slurm"))
    # sas-p: its learned gains are gathered and logged by every rank
    compare(["sas-p"], tmp_path / "ddp", base=cfg, launcher=SlurmLauncher(settings), timing_rounds=0)
    summary = json.loads((tmp_path / "ddp" / "runs" / "sas-p-seed0" / "summary.json").read_text())
    assert summary["world_size"] == 2
    compare(["sas-p"], tmp_path / "one", base=cfg, timing_rounds=0)  # one process, in this one
    ddp, one = (curve(tmp_path / name / "runs" / "sas-p-seed0") for name in ("ddp", "one"))
    assert [r[:2] for r in ddp] == [r[:2] for r in one]  # the same global batches, split over 2 ranks
    assert [r[2] for r in ddp] == pytest.approx([r[2] for r in one], rel=1e-3)  # float rounding


@pytest.mark.slow
def test_a_job_cut_off_at_its_time_limit_is_requeued_and_its_run_resumes(corpus, tmp_path):
    """A 1-minute job told to stop 40 s before its limit: submitit checkpoints the job (`RunJob` is
    Checkpointable) and requeues it, and the run resumes from its last checkpoint to one curve. A busy
    machine trains less in each job, so the job may be requeued up to 6 times (`max_requeues`, at most
    what submitit's local controller allows), which reaches submitit's own executor."""
    cfg = {**base(corpus, tmp_path / "cache", steps=800), "model": {}, "eval_every": 100, "log_every": 10}
    settings = SlurmSettings(cluster="local", poll_s=0.5, time_min=1, signal_delay_s=40, max_requeues=6,
                             folder=str(tmp_path / "slurm"))  # about 15 s of training at size tiny
    assert SlurmLauncher(settings)._executor(tmp_path / "probe", 1)._executor.max_num_timeout == 6
    compare(["pre-ln"], tmp_path / "cmp", base=cfg, launcher=SlurmLauncher(settings), timing_rounds=0)
    logs = "".join(path.read_text() for path in (tmp_path / "slurm").rglob("*_log.*"))
    assert "Requeued job" in logs
    steps = [r["step"] for r in read_metrics(tmp_path / "cmp" / "runs" / "pre-ln-seed0" / "metrics.jsonl",
                                             "train") if "loss" in r]
    assert steps == list(range(10, 801, 10))  # one curve: no step lost or logged twice


def test_slurm_settings_come_from_a_file_and_flags_and_reach_the_sbatch_script(tmp_path, monkeypatch):
    config = tmp_path / "cluster.yaml"
    config.write_text("slurm:\n  partition: cpu\n  account: lab\n  gpus_per_run: 2\n  cpus_per_run: 8\n"
                      "  time_min: '1-02:00:00'\n  sbatch: {qos: high}\n"
                      "  setup: ['source venv/bin/activate']\n")
    settings = SlurmSettings.load(config, partition="gpu")  # a flag wins over the file
    got = (settings.partition, settings.account, settings.time_min, settings.procs)
    assert got == ("gpu", "lab", 1560, 2)
    fake = tmp_path / "bin"  # submitit looks for srun before it writes a script; nothing is submitted here
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nexit 0\n")
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    executor = SlurmLauncher(settings, jobs=3)._executor(tmp_path / "slurm", 5)
    script = executor._executor._make_submission_file_text("python -m x", "uid")
    for line in ("#SBATCH --partition=gpu", "#SBATCH --account=lab", "#SBATCH --gpus-per-node=2",
                 "#SBATCH --cpus-per-task=16", "#SBATCH --time=1560", "#SBATCH --qos=high",
                 "#SBATCH --ntasks-per-node=1", "source venv/bin/activate"):
        assert line in script
    assert executor._executor.parameters["array_parallelism"] == 3


@pytest.mark.parametrize("text, minutes", [(90, 90), ("90", 90), ("02:30:00", 150), ("1-00:00:00", 1440),
                                           ("1-2", 1560), ("00:00:30", 1)])
def test_slurm_time_limits_read_slurms_formats(text, minutes):
    assert parse_time(text) == minutes


def test_bad_slurm_settings_are_named(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"slurm setting 'partiton' is not allowed: choose from account,"):
        SlurmSettings.load(None, partiton="gpu")
    with pytest.raises(ConfigError, match="slurm time limit 'soon' is not allowed: give minutes, HH:MM:SS"):
        SlurmSettings.load(None, time_min="soon")
    with pytest.raises(ConfigError, match="slurm setting gpus_per_run = -1 is not allowed"):
        SlurmSettings.load(None, gpus_per_run=-1)
    with pytest.raises(ConfigError, match="slurm setting max_requeues = 0 is not allowed: give an integer"):
        SlurmSettings.load(None, max_requeues=0)
    with pytest.raises(ConfigError, match="max_requeues = 7 is not allowed with cluster: local: submitit's"):
        SlurmSettings.load(None, cluster="local", max_requeues=7)
    assert cli.main(["compare", "--launcher", "slurm", "--sbatch", "qos"]) == 2
    assert "--sbatch 'qos' is not allowed: give KEY=VALUE" in capsys.readouterr().err


def test_the_cli_builds_the_slurm_launcher_from_its_flags(monkeypatch, tmp_path):
    seen = {}

    def fake_compare(entries, out, launcher=None, **kwargs):  # what cmd_compare hands over, nothing trained
        seen.update(launcher=launcher, out=out)
        raise RunsPending("queued")

    monkeypatch.setattr(compare_module, "compare", fake_compare)
    code = cli.main(["compare", "--launcher", "slurm", "--partition", "gpu", "--account", "lab",
                     "--gpus-per-run", "1", "--cpus-per-run", "4", "--mem-gb", "16",
                     "--time-limit", "2:00:00",
                     "--sbatch", "qos=high", "--sbatch=--constraint=a100", "--jobs", "8", "--no-wait",
                     "--steps", "10", "--out", str(tmp_path / "cmp")])
    assert code == 0
    launcher = seen["launcher"]
    assert (launcher.jobs, launcher.wait) == (8, False)
    s = launcher.settings
    assert (s.partition, s.account, s.gpus_per_run, s.cpus_per_run, s.mem_gb, s.time_min) == (
        "gpu", "lab", 1, 4, 16.0, 120)
    assert s.sbatch == {"qos": "high", "constraint": "a100"} and s.folder == str(tmp_path / "cmp" / "slurm")


def test_the_slurm_launcher_prepares_the_data_once_before_it_submits(corpus, tmp_path, monkeypatch):
    cache, seen = tmp_path / "cache", {}

    def submit(self, todo, folder, log):  # what the jobs would find: nothing is submitted
        seen["shards"] = sorted(p.name for p in cache.rglob("*.bin"))
        raise KeyboardInterrupt("stop before submitting")

    monkeypatch.setattr(SlurmLauncher, "_submit", submit)
    settings = SlurmSettings(cluster="local", folder=str(tmp_path / "slurm"))
    with pytest.raises(KeyboardInterrupt, match="stop before submitting"):
        compare(ARCHS[:2], tmp_path / "cmp", base=base(corpus, cache), launcher=SlurmLauncher(settings))
    assert seen["shards"] == ["train.bin", "val.bin"]  # tokenised here, once, for both runs' jobs


@pytest.mark.slow  # about 30 s
def test_sigterm_stops_a_job_at_its_next_step_and_the_rerun_resumes_its_run(corpus, tmp_path):
    """scancel's SIGTERM, which submitit only logs: the job stops at once, its run keeps its last
    checkpoint, and the same command run again resumes it to one whole curve."""
    cfg = {**base(corpus, tmp_path / "cache", steps=1500), "ckpt_every": 10, "eval_every": 1000,
           "log_every": 10}
    settings = SlurmSettings(cluster="local", poll_s=0.2, time_min=10, folder=str(tmp_path / "slurm"))
    out, run = tmp_path / "cmp", tmp_path / "cmp" / "runs" / "pre-ln-seed0"
    with pytest.raises(RunsPending):
        compare(["pre-ln"], out, base=cfg, launcher=SlurmLauncher(settings, wait=False), timing_rounds=0)
    (pid,) = (int(job_id) for job_id in json.loads((tmp_path / "slurm" / "jobs.json").read_text()).values())
    deadline = time.monotonic() + patient(120)
    while not (run / "checkpoints").is_dir() or not any((run / "checkpoints").iterdir()):
        assert time.monotonic() < deadline, "the job never checkpointed"
        time.sleep(0.1)
    os.kill(pid, signal.SIGTERM)  # submitit's local controller passes it on to the job, as Slurm does
    start = time.monotonic()
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        assert time.monotonic() - start < patient(8), "the job trained on after SIGTERM"
        time.sleep(0.1)
    assert not (run / "summary.json").exists() and any((run / "checkpoints").iterdir())
    logs = "".join(path.read_text() for path in (tmp_path / "slurm").rglob("*_log.*"))
    assert "blocklab job: stopped (signal SIGTERM" in logs
    compare(["pre-ln"], out, base=cfg, launcher=SlurmLauncher(settings), timing_rounds=0)  # resumes
    steps = [r["step"] for r in read_metrics(run / "metrics.jsonl", "train") if "loss" in r]
    assert steps == list(range(10, 1501, 10)) and json.loads((run / "summary.json").read_text())
