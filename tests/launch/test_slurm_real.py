"""`blocklab compare --launcher slurm` through a real single-node Slurm cluster (Debian's `slurm-wlm` and
`munge`, started by `slurm_cluster.SlurmCluster` in a temporary folder), with accounting off and on
(slurmdbd over MariaDB), against the same compare trained by the local launcher. Slow: about a minute;
CI installs the packages and runs it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("submitit")

from blocklab import cli  # noqa: E402
from blocklab.training.metrics import read_metrics  # noqa: E402
from helpers import write_code_corpus  # noqa: E402
from slurm_cluster import PARTITION, SlurmCluster, why_not  # noqa: E402
from timeouts import patient  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.skipif(why_not() is not None, reason=str(why_not()))]
ARCHS = ("pre-ln", "sas")


@pytest.fixture(scope="module", params=[False, True], ids=["no-accounting", "accounting"])
def cluster(request, tmp_path_factory):
    """One cluster per accounting setting; its daemons' logs are printed when a test fails."""
    if why_not(request.param):
        pytest.skip(str(why_not(request.param)))
    with SlurmCluster(tmp_path_factory.mktemp("slurm-cluster"), accounting=request.param) as started:
        yield started
        print(started.logs())


@pytest.fixture
def on_cluster(cluster, monkeypatch):
    """Slurm's clients (and submitit through them) find the test cluster, not the machine's own."""
    for key, value in cluster.env.items():
        monkeypatch.setenv(key, value)
    return cluster


def compare_args(corpus: Path, cache: Path, out: Path) -> list[str]:
    """A two-run compare that trains in seconds: d 32 x 3 layers on bytes, 6 steps, validation every 2."""
    return ["compare", "--archs", ",".join(ARCHS), "--seeds", "1", "--steps", "6", "batch_size=4",
            "seq_len=32", "eval_every=2", "--timing-rounds", "0", "--quiet", "--out", str(out),
            "model.d_model=32", "model.n_layers=3", "model.n_heads=2", "eval_batches=2", "log_every=1",
            f"data.source={corpus}", "data.tokenizer=byte", f"data.cache_dir={cache}"]


def curve(run: Path) -> list[tuple]:
    """Every logged loss of a run: (kind, step, loss), training and validation."""
    rows = read_metrics(run / "metrics.jsonl")
    return [(r["kind"], r["step"], r.get("loss", r.get("val_loss"))) for r in rows
            if "loss" in r or "val_loss" in r]


def test_the_cluster_runs_a_batch_job_and_sacct_knows_it_only_with_accounting(on_cluster, tmp_path):
    """The cluster itself, before blocklab: a job runs on the node; without accounting sacct answers that
    it is disabled (what the launcher must live with on small clusters), with it sacct lists the job."""
    out = tmp_path / "hello.out"
    job = on_cluster.run(["sbatch", "--parsable", "--wait", "-p", PARTITION, "-o", str(out), "--wrap",
                          "echo hello from $SLURM_JOB_ID"], timeout=patient(60)).stdout.strip()
    assert out.read_text() == f"hello from {job}\n"
    sacct = on_cluster.run(["sacct", "-n", "-X", "-j", job, "-o", "State"], check=False)
    if on_cluster.accounting:
        assert sacct.returncode == 0 and sacct.stdout.split() == ["COMPLETED"], sacct
    else:
        assert sacct.returncode != 0 and "accounting storage is disabled" in sacct.stderr, sacct


def test_a_compare_through_slurm_trains_the_local_launchers_losses(on_cluster, tmp_path, tmp_path_factory):
    corpus = write_code_corpus(tmp_path_factory.mktemp("corpus"))
    settings = tmp_path / "slurm.yaml"
    settings.write_text("slurm:\n  poll_s: 1\n  time_min: 10\n")  # poll_s is not a flag; the YAML sets it
    slurm_out, local_out = tmp_path / "slurm-cmp", tmp_path / "local-cmp"
    flags = ["--launcher", "slurm", "--partition", PARTITION, "--cpus-per-run", "1", "--slurm-config",
             str(settings)]
    assert cli.main([*compare_args(corpus, tmp_path / "cache", slurm_out), *flags]) == 0, on_cluster.logs()
    assert cli.main([*compare_args(corpus, tmp_path / "cache-local", local_out), "--jobs", "1",
                     "--threads", "1"]) == 0
    for arch in ARCHS:
        run = f"{arch}-seed0"
        slurm_curve, local_curve = curve(slurm_out / "runs" / run), curve(local_out / "runs" / run)
        assert len(slurm_curve) == 6 + 4 and slurm_curve == local_curve  # 6 steps, validation at 0, 2, 4, 6
    # the runs did train as jobs of this cluster: one array, its ids recorded, its logs beside the runs
    record = json.loads((slurm_out / "slurm" / "jobs.json").read_text())
    assert sorted(Path(run).name for run in record) == [f"{arch}-seed0" for arch in ARCHS]
    array = {job.split("_")[0] for job in record.values()}
    assert len(array) == 1 and all("_" in job for job in record.values())
    logs = sorted(p.name for p in (slurm_out / "slurm").rglob("*_log.out"))
    assert len(logs) == 2, logs
    method = json.loads((slurm_out / "results.json").read_text())["method"]
    assert method["launch"]["launcher"] == "slurm"
    assert on_cluster.queue() == []  # nothing left queued or running



def test_a_cancelled_job_is_reported_at_once_and_a_rerun_resumes_it_to_the_uninterrupted_curve(
        on_cluster, tmp_path, tmp_path_factory, capsys):
    """`scancel` of one job while the compare waits: the command names it cancelled and exits non-zero
    within a minute (with or without sacct); the same command again resubmits it, and the run resumes from
    its checkpoint to the curve of a run never interrupted (the local launcher's)."""
    corpus = write_code_corpus(tmp_path_factory.mktemp("corpus"))
    settings = tmp_path / "slurm.yaml"
    settings.write_text("slurm:\n  poll_s: 1\n  time_min: 10\n")
    out, local_out = tmp_path / "slurm-cmp", tmp_path / "local-cmp"
    longer = ["--steps", "400", "eval_every=50", "log_every=10"]  # a few seconds of training per run
    args = [*compare_args(corpus, tmp_path / "cache", out), *longer, "--launcher", "slurm", "--partition",
            PARTITION, "--cpus-per-run", "1", "--slurm-config", str(settings)]
    command = [sys.executable, "-c", "import sys; from blocklab import cli; sys.exit(cli.main(sys.argv[1:]))",
               *args]
    victim = out / "runs" / f"{ARCHS[0]}-seed0"
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as first:
        deadline = time.monotonic() + patient(90)
        while _last_step(victim) < 100:  # past its second checkpoint: the rerun has one to resume from
            assert time.monotonic() < deadline and first.poll() is None, on_cluster.logs()
            time.sleep(0.2)
        job = json.loads((out / "slurm" / "jobs.json").read_text())[str(victim)]
        on_cluster.run(["scancel", job])
        cancelled = time.monotonic()
        printed, _ = first.communicate(timeout=patient(60))
        assert first.returncode != 0 and time.monotonic() - cancelled < patient(60)
    assert f"job {job} was cancelled" in printed, printed
    assert _last_step(victim) < 400  # it did stop early
    capsys.readouterr()
    assert cli.main(args) == 0, on_cluster.logs()  # again: resubmitted, resumed, the report written
    assert f"{victim.name}: resuming: submitted as slurm job" in capsys.readouterr().out
    assert cli.main([*compare_args(corpus, tmp_path / "cache-local", local_out), *longer, "--jobs", "1",
                     "--threads", "1"]) == 0
    for arch in ARCHS:
        run = f"{arch}-seed0"
        assert curve(out / "runs" / run) == curve(local_out / "runs" / run)
    assert on_cluster.queue() == []


def _last_step(run: Path) -> int:
    """The last step a run (training in another process) has logged, 0 before its first line."""
    try:
        rows = read_metrics(run / "metrics.jsonl")
    except (OSError, ValueError):
        return 0
    return max((r["step"] for r in rows), default=0)


def _job_pythons(job: str) -> list[int]:
    """The pids of the Python processes running the Slurm job `job` ("12_0", or a plain id) on this node:
    submitit's `_submit` entry, with the job's ids in its environment (not the srun that started it,
    whose arguments name the entry too: killing srun makes Slurm cancel the step)."""
    array, _, task = job.partition("_")
    want = {b"SLURM_ARRAY_JOB_ID=" + array.encode(), b"SLURM_ARRAY_TASK_ID=" + task.encode()} if task \
        else {b"SLURM_JOB_ID=" + job.encode()}
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = set((proc / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        program = Path(cmdline.split(b"\0")[0].decode(errors="replace")).name
        if program.startswith("python") and b"submitit.core._submit" in cmdline and want <= environ:
            pids.append(int(proc.name))
    return pids


def test_a_job_whose_python_is_killed_is_named_killed_with_its_exit_code(on_cluster, tmp_path,
                                                                          tmp_path_factory):
    """kill -9 of a job's Python (what the kernel's out-of-memory killer does) was reported "lost ... no
    accounting to say why" without sacct: the command names it killed with signal 9 and its exit code
    (scontrol's, or sacct's), and the same command again resumes it to the end."""
    import os
    import signal

    corpus = write_code_corpus(tmp_path_factory.mktemp("corpus"))
    settings = tmp_path / "slurm.yaml"
    settings.write_text("slurm:\n  poll_s: 1\n  time_min: 10\n")
    out = tmp_path / "slurm-cmp"
    args = [*compare_args(corpus, tmp_path / "cache", out), "--steps", "400", "eval_every=50",
            "log_every=10", "--launcher", "slurm", "--partition", PARTITION, "--cpus-per-run", "1",
            "--slurm-config", str(settings)]
    command = [sys.executable, "-c", "import sys; from blocklab import cli; sys.exit(cli.main(sys.argv[1:]))",
               *args]
    victim = out / "runs" / f"{ARCHS[0]}-seed0"
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as first:
        deadline = time.monotonic() + patient(90)
        while _last_step(victim) < 100:  # past a checkpoint: the rerun resumes
            assert time.monotonic() < deadline and first.poll() is None, on_cluster.logs()
            time.sleep(0.2)
        job = json.loads((out / "slurm" / "jobs.json").read_text())[str(victim)]
        pids = _job_pythons(job)
        assert pids, f"no Python of job {job} found"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        printed, _ = first.communicate(timeout=patient(90))
        assert first.returncode != 0
    # the batch script's 137:0 from scontrol; with accounting, sacct's step 0:9 (its job line says 9:0)
    code = "Slurm exit code 0:9" if on_cluster.accounting else "exit code 137"
    assert f"job {job} was killed (signal 9, SIGKILL, {code}; Slurm state FAILED)" in printed, printed
    assert "lost" not in printed and "resumes it from its last checkpoint" in printed
    assert cli.main(args) == 0, on_cluster.logs()
    assert _last_step(victim) == 400
    assert on_cluster.queue() == []
