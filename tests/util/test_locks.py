"""One writer per folder: a second `train` or `compare` into a folder in use is refused, naming the
holder, and touches nothing; the lock dies with its holder (kill -9 included)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from blocklab.cli import main
from blocklab.compare import compare
from blocklab.training.metrics import read_metrics
from blocklab.util import locks
from helpers import compare_base, write_code_corpus
from timeouts import patient

HOLD = textwrap.dedent("""
    import sys, time
    from blocklab.util import locks
    with locks.hold(sys.argv[1], wait=True, on_wait=lambda: print("waiting", flush=True)):
        print("held", flush=True)
        time.sleep(120)
""")  # a holder, or (the folder held) a waiter that says "waiting" first


def _holder(folder: Path) -> subprocess.Popen:
    """A process that holds `folder`'s lock (as spelt) until killed; it says "held" once it has it."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _train_args(corpus: Path, cache: Path, out: Path, steps: int) -> list[str]:
    return ["train", f"data.source={corpus}", "data.tokenizer=byte", f"data.cache_dir={cache}",
            "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "batch_size=4", "seq_len=32",
            f"max_steps={steps}", "log_every=1", "eval_every=1000", "ckpt_every=1000", "progress=false",
            "--out", str(out)]


def test_a_second_train_into_a_running_folder_is_refused_and_the_first_curve_stays_whole(tmp_path, capsys):
    corpus = write_code_corpus(_mkdir(tmp_path / "corpus"))
    out = tmp_path / "runs" / "x"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "blocklab.cli", *_train_args(corpus, tmp_path / "c1", out, 60)]
    first = subprocess.Popen(args, env=env, stderr=subprocess.DEVNULL)
    lock = locks.lock_path(out)
    deadline = time.time() + patient(60)
    while not (lock.is_file() and str(first.pid) in lock.read_text()):  # the first holds it from the start
        assert first.poll() is None and time.time() < deadline
        time.sleep(0.05)
    # the same data through another cache: the second would get as far as writing, were it let in
    code = main(_train_args(corpus, tmp_path / "c2", out, 5))
    err = capsys.readouterr().err
    assert code == 2
    assert f"is in use by process {first.pid}" in err and "train" in err and "Traceback" not in err
    assert first.wait(timeout=patient(300)) == 0
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl", "train")]
    assert steps == list(range(61))  # one curve, not two interleaved
    assert json.loads((out / "summary.json").read_text())["step"] == 60


def test_a_second_compare_into_the_same_out_is_refused_and_touches_nothing(tmp_path):
    corpus = write_code_corpus(_mkdir(tmp_path / "corpus"))
    out = tmp_path / "cmp"
    run = out / "runs" / "pre-ln-seed0"  # a run in progress without a checkpoint yet: the case once deleted
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 5.0}\n')
    (out / "report.md").write_text("the first comparison's report\n")
    holder = _holder(out)
    try:
        with pytest.raises(locks.FolderInUse, match=f"in use by process {holder.pid}"):
            compare(["pre-ln"], out, base=compare_base(corpus, tmp_path / "cache"), fresh=True,
                    log=lambda m: None)
    finally:
        holder.kill()
        holder.wait()
    assert (run / "metrics.jsonl").read_text() == '{"kind": "train", "step": 1, "loss": 5.0}\n'
    assert (out / "report.md").read_text() == "the first comparison's report\n"


def test_train_into_a_run_a_launcher_is_training_is_refused(tmp_path):
    """A comparison's worker holds its run's lock (launch.store.run_lock): `train` into it is refused."""
    from blocklab.training import train

    run = tmp_path / "cmp" / "runs" / "pre-ln-seed0"
    holder = _holder(run)
    try:
        with pytest.raises(locks.FolderInUse, match=str(holder.pid)):
            train({"out_dir": str(run), "max_steps": 1})
    finally:
        holder.kill()
        holder.wait()
    assert not run.exists()  # refused before anything was written


def test_compare_fresh_never_deletes_a_run_that_another_process_is_training(tmp_path):
    corpus = write_code_corpus(_mkdir(tmp_path / "corpus"))
    run = tmp_path / "cmp" / "runs" / "pre-ln-seed0"
    (run / "checkpoints").mkdir(parents=True)
    holder = _holder(run)  # e.g. `blocklab train --resume --out cmp/runs/pre-ln-seed0`
    try:
        with pytest.raises(locks.FolderInUse, match=f"pre-ln-seed0 is in use by process {holder.pid}"):
            compare(["pre-ln"], tmp_path / "cmp", base=compare_base(corpus, tmp_path / "cache"), fresh=True,
                    log=lambda m: None)
    finally:
        holder.kill()
        holder.wait()
    assert (run / "checkpoints").is_dir()


def test_the_lock_goes_with_its_holder_even_on_kill_9(tmp_path):
    holder = _holder(tmp_path / "run")
    with pytest.raises(locks.FolderInUse):
        with locks.hold(tmp_path / "run"):
            pass
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    with locks.hold(tmp_path / "run"):  # free at once: no stale lock to clear by hand
        assert json.loads(locks.lock_path(tmp_path / "run").read_text())["pid"] == os.getpid()


def test_a_waiting_holder_gets_the_folder_once_it_is_free(tmp_path):
    holder = _holder(tmp_path / "run")
    waited = []
    subprocess.Popen(["sh", "-c", f"sleep 0.5; kill {holder.pid}"])
    with locks.hold(tmp_path / "run", wait=True, on_wait=lambda: waited.append(1)):
        assert holder.poll() is not None
    holder.wait()
    assert waited == [1]


def test_the_lock_of_dot_lies_beside_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert locks.lock_path(".") == tmp_path.parent / f".{tmp_path.name}.lock"
    assert locks.lock_path("runs/x/") == tmp_path / "runs" / ".x.lock"


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


@pytest.fixture
def bind_mount(tmp_path):
    """A run folder mounted again at another path with another name: a bind mount (root only;
    skipped where mounting is not allowed). Yields (real, mounted)."""
    real, mounted = tmp_path / "real" / "run", tmp_path / "elsewhere" / "alias"
    real.mkdir(parents=True)
    mounted.mkdir(parents=True)
    done = subprocess.run(["mount", "--bind", str(real), str(mounted)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"a bind mount needs root and mount(8): {done.stderr.strip() or done.returncode}")
    try:
        yield real, mounted
    finally:
        subprocess.run(["umount", str(mounted)], check=False)


def test_the_lock_holds_on_the_folder_itself_through_a_bind_mount(bind_mount):
    """The same folder at another path (a bind mount, a container volume) has its lock file beside it
    elsewhere; the lock on the folder's own inode turns the second writer away all the same."""
    real, mounted = bind_mount
    assert locks.lock_path(real) != locks.lock_path(mounted)
    proc = _holder(real)
    try:
        with pytest.raises(locks.FolderInUse, match="another path"), locks.hold(mounted):
            pass
    finally:
        proc.kill()
        proc.wait()
    with locks.hold(mounted):  # free once its holder is gone
        pass


def test_a_run_emptied_for_a_fresh_start_keeps_its_folder_and_lock(tmp_path):
    """A run stopped before its first checkpoint starts afresh in its folder emptied, not removed: the
    folder whose inode the launcher locked stays the run's."""
    from blocklab.launch.store import claim
    from blocklab.training.config import TrainConfig

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')
    (run / "checkpoints").mkdir()
    inode = run.stat().st_ino
    assert claim(TrainConfig(out_dir=str(run), max_steps=5)) == "new"
    assert run.stat().st_ino == inode and not any(run.iterdir())


def test_train_through_a_symlink_to_a_folder_not_made_yet_writes_the_run_there(tmp_path, capsys):
    """A symlink --out whose folder does not exist yet is the folder it names, as for compare and exports
    (and its lock): train made it there instead of failing with "[Errno 17] File exists"."""
    corpus = write_code_corpus(_mkdir(tmp_path / "corpus"))
    link, target = tmp_path / "out", tmp_path / "gone" / "run"
    link.symlink_to(target)
    assert main(_train_args(corpus, tmp_path / "cache", link, 2)) == 0, capsys.readouterr().err
    assert link.is_symlink() and json.loads((target / "summary.json").read_text())["step"] == 2
