"""The folder lock on the real path (a symlink or another spelling of a
folder in use is refused, naming the holder), arguments that are not valid text refused naming the
argument, and key=value overrides after options."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import blocklab.compare
import blocklab.training
from blocklab.cli import main
from blocklab.compare import compare
from blocklab.interop import load_pretrained, save_pretrained
from blocklab.launch.store import run_lock
from blocklab.training import TrainConfig
from blocklab.training.config import resolve_config
from blocklab.util import locks
from blocklab.util.errors import ConfigError
from helpers import compare_base, make_model, write_code_corpus
from tests.timeouts import patient
from tests.util.test_locks import HOLD, _holder


def _stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("blocklab: error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def spellings(tmp_path, monkeypatch):
    """runs/x, a symlink `alias` to it, and `runs/link/../y`, which lexically reads runs/y but is
    other/y (link leads to other/deep): the working folder is tmp_path."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "other" / "deep").mkdir(parents=True)
    (tmp_path / "alias").symlink_to("runs/x")  # dangling until runs/x is made: still the same folder
    (tmp_path / "runs" / "link").symlink_to(tmp_path / "other" / "deep")
    return tmp_path


# -- 1. the lock on the real path ------------------------------------------------------------------

@pytest.mark.parametrize("held, written", [("runs/x", "alias"), ("alias", "runs/x"),
                                           ("runs/x", "./runs/../runs/x"), ("other/y", "runs/link/../y")])
def test_train_into_another_spelling_of_a_held_folder_is_refused_naming_the_holder(held, written, spellings,
                                                                                     capsys):
    holder = _holder(spellings / held)
    try:
        code = main(["train", "max_steps=1", "--out", written])
    finally:
        _stop(holder)
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2 and f"{written}" in line and f"is in use by process {holder.pid}" in line
    assert not (spellings / "runs" / "x").exists() and not (spellings / "other" / "y").exists()


def test_the_lexical_spelling_is_not_the_folder_a_symlink_leads_to(spellings):
    """runs/link/../y is other/y: holding runs/y does not keep it out (nor would it keep a writer of
    other/y out of runs/y), as a lock on the path as typed (made absolute) did."""
    holder = _holder(spellings / "runs" / "y")
    try:
        assert locks.lock_path("runs/link/../y") == spellings / "other" / ".y.lock"
        with locks.hold("runs/link/../y"):
            pass
        with pytest.raises(locks.FolderInUse, match=str(holder.pid)):
            with locks.hold("runs/y"):
                pass
    finally:
        _stop(holder)


def test_compare_and_a_launchers_run_lock_meet_a_holder_through_a_symlink(spellings):
    holder = _holder(spellings / "runs" / "x")
    try:
        with pytest.raises(locks.FolderInUse, match=rf"alias \(the folder .*runs/x\) is in use by process "
                                                   rf"{holder.pid}"):
            compare(["pre-ln"], "alias", base=compare_base(spellings / "corpus", spellings / "cache"),
                    log=lambda m: None)
        # reproduce and compare train their runs through the launcher, which waits for a held run
        waited: list[int] = []
        subprocess.Popen(["sh", "-c", f"sleep 0.5; kill {holder.pid}"])
        with run_lock(TrainConfig(out_dir="alias", max_steps=1), on_wait=lambda: waited.append(1)):
            # the holder is dying: the kernel frees its lock while it exits, a moment before its parent
            # can reap it (poll() may still read None then, on a busy machine), so wait for its exit
            assert holder.wait(timeout=patient(10)) is not None
        assert waited == [1]
    finally:
        _stop(holder)
    assert not (spellings / "runs" / "x").exists()


def test_an_export_takes_the_lock_of_the_folder_it_writes(spellings):
    model = make_model()
    holder = _holder(spellings / "runs" / "x")  # e.g. a run training there
    try:
        with pytest.raises(locks.FolderInUse, match=str(holder.pid)):
            save_pretrained(model, "alias")
    finally:
        _stop(holder)
    assert sorted(p.name for p in (spellings / "runs").iterdir()) == [".x.lock", "link"]  # the holder's
    folder = save_pretrained(model, "alias")  # through the symlink: into runs/x, the symlink kept
    assert folder == Path("alias") and (spellings / "alias").is_symlink()
    assert sorted(p.name for p in (spellings / "runs").iterdir()) == ["link", "x"]  # no lock file left
    assert load_pretrained(spellings / "runs" / "x").cfg == model.cfg


def test_a_waiter_on_a_removed_lock_file_locks_the_one_at_the_path(tmp_path):
    """An export removes its lock file as it lets go: a process that was waiting on that file must
    then hold the lock at the path, or a third writer would get in beside it."""
    folder = tmp_path / "export"
    with locks.hold(folder, remove=True):
        waiter = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE,
                                  text=True)
        assert waiter.stdout is not None and waiter.stdout.readline().strip() == "waiting"
    try:
        assert waiter.stdout.readline().strip() == "held"
        with pytest.raises(locks.FolderInUse, match=str(waiter.pid)):
            with locks.hold(folder):
                pass
    finally:
        os.kill(waiter.pid, signal.SIGKILL)
        waiter.wait()


# -- 5. arguments that are not valid text ------------------------------------------------------------

BAD = os.fsdecode(b"lat\xe9")  # what Python makes of a Latin-1 name in argv: 'lat\udce9'

NOT_TEXT = [  # (argv, the argument's name as the message gives it)
    (["train", f"data.source=corpus/{BAD}", "max_steps=1"], "data.source"),
    (["train", "max_steps=1", "--out", f"runs/{BAD}"], "--out"),
    (["train", "max_steps=1", f"--out=runs/{BAD}"], "--out"),
    (["train", "max_steps=1", f"out_dir=runs/{BAD}"], "out_dir"),
    (["train", "max_steps=1", "--out", "runs/r", f"init_from=runs/{BAD}"], "init_from"),
    (["train", f"{BAD}.yaml", "max_steps=1"], "the config file"),
    (["compare", "--out", f"runs/{BAD}"], "--out"),
    (["compare", "--out", "runs/c", f"data.source=corpus/{BAD}"], "data.source"),
    (["export", "--run", "runs/r", "--out", f"exports/{BAD}"], "--out"),
    (["plot", "runs/a", f"runs/{BAD}"], "RUN"),
]


@pytest.mark.parametrize("argv, name", NOT_TEXT, ids=[" ".join(a[:1] + [n]) for a, n in NOT_TEXT])
def test_an_argument_that_is_not_valid_text_is_named(argv, name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    os.mkdir(b"corpus")
    os.mkdir(os.fsencode(f"corpus/{BAD}"))  # the folder exists: its name is the trouble, not its absence
    before = sorted(tmp_path.rglob("*"))
    assert main(argv) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"blocklab: error: {name} '") and "lat\\xe9" in line and "not valid UTF-8" in line
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


@pytest.mark.parametrize("field", ["out_dir", "init_from", "data.source", "data.cache_dir"])
def test_the_python_api_names_the_field(field):
    with pytest.raises(ConfigError, match=rf"{field} 'runs/lat\\xe9' is not valid UTF-8"):
        resolve_config({"max_steps": 1}, {field: f"runs/{BAD}"})
    with pytest.raises(ConfigError, match=rf"^{field} 'runs/lat\\xe9' is not valid UTF-8"):
        resolve_config({"max_steps": 1}, [f"{field}=runs/{BAD}"])
    with pytest.raises(ConfigError, match=rf"{field} 'runs/lat\\xe9' is not valid UTF-8"):  # a pathlib path
        resolve_config({"max_steps": 1}, {field: Path("runs") / BAD})


def test_an_override_or_config_that_yaml_cannot_read_is_one_error_line(tmp_path, capsys):
    assert main(["train", "max_steps=1", "model.value_path_options={layers: [1,"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "model.value_path_options" in line and "not valid YAML" in line
    config = tmp_path / "latin1.yaml"
    config.write_bytes(b"max_steps: 1\n# caf\xe9\n")
    assert main(["train", str(config)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "latin1.yaml" in line and "not UTF-8" in line


# -- 6. overrides after options ------------------------------------------------------------------

def _resolved(monkeypatch, capsys, argv: list[str]) -> dict:
    """What `blocklab train` would train with for `argv` (the config handed to train) as a dict."""
    seen = []

    def fake_train(cfg, resume=False):
        seen.append((cfg.to_dict(), resume))
        raise ConfigError("stop here")

    monkeypatch.setattr(blocklab.training, "train", fake_train)
    assert main(argv) == 2 and "stop here" in capsys.readouterr().err
    return {"config": seen[0][0], "resume": seen[0][1]}


def test_train_overrides_after_options_are_the_same_as_before_them(monkeypatch, capsys):
    first = _resolved(monkeypatch, capsys, ["train", "arch=sas-p", "max_steps=10", "optim.lr=2e-3",
                                            "--threads", "2", "--out", "runs/r"])
    mixed = _resolved(monkeypatch, capsys, ["train", "arch=sas-p", "--threads", "2", "max_steps=10",
                                            "--out", "runs/r", "optim.lr=2e-3"])
    assert mixed == first
    cfg = first["config"]
    assert (cfg["arch"], cfg["max_steps"], cfg["optim"]["lr"], cfg["out_dir"], cfg["threads"]) == (
        "sas-p", 10, 2e-3, "runs/r", 2)
    later = _resolved(monkeypatch, capsys, ["train", "max_steps=5", "--out", "runs/r", "max_steps=7"])
    assert later["config"]["max_steps"] == 7  # in the order typed: the later one wins


@pytest.mark.parametrize("argv, threads, out", [
    (["--threads", "2", "threads=1", "--out", "runs/a", "out_dir=runs/b"], 1, "runs/b"),
    (["threads=1", "--threads", "2", "out_dir=runs/b", "--out", "runs/a"], 2, "runs/a"),
    (["threads=3", "--thr", "2", "threads=1"], 1, "runs/run"),  # an abbreviated option, overrides around it
    (["--threads=2", "max_steps=3", "threads=4", "--threads", "5"], 5, "runs/run"),
])
def test_an_option_and_an_override_of_one_field_the_last_typed_wins(monkeypatch, capsys, argv, threads, out):
    """--threads and --out set the fields threads and out_dir: given with threads=... or out_dir=...,
    the one typed last is the value trained with and recorded (the option always won before)."""
    cfg = _resolved(monkeypatch, capsys, ["train", "max_steps=2", *argv])["config"]
    assert (cfg["threads"], cfg["out_dir"]) == (threads, out)


def test_compare_threads_option_and_override_the_last_typed_wins(monkeypatch, capsys):
    seen = []

    def fake_compare(entries, out, base=None, launcher=None, **kwargs):
        seen.append((base["threads"], launcher.threads))
        raise ConfigError("stop here")

    monkeypatch.setattr(blocklab.compare, "compare", fake_compare)
    cases = ((["--threads", "2", "threads=1"], (1, None)), (["threads=1", "--threads", "2"], (2, 2)))
    for argv, want in cases:  # (the runs' threads, the launcher's)
        assert main(["compare", "--archs", "pre-ln", "--steps", "3", *argv]) == 2
        assert "stop here" in capsys.readouterr().err
        assert seen.pop() == want


def test_train_resume_takes_overrides_after_options(tmp_path, capsys):
    (tmp_path / "corpus").mkdir()
    corpus = write_code_corpus(tmp_path / "corpus")
    run = tmp_path / "run"
    small = [f"data.source={corpus}", "data.tokenizer=byte", f"data.cache_dir={tmp_path / 'cache'}",
             "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "batch_size=2", "seq_len=16",
             "progress=false", "eval_every=2", "ckpt_every=2"]
    assert main(["train", *small, "--out", str(run), "max_steps=2"]) == 0
    assert main(["train", "max_steps=4", "--resume", "--out", str(run), "log_every=1"]) == 0
    capsys.readouterr()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["step"] == 4
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("kind") == "train" and r["step"] > 2] == [3, 4]  # log_every=1


def test_compare_overrides_after_options_are_the_same_as_before_them(monkeypatch, capsys):
    seen = []

    def fake_compare(entries, out, base=None, **kwargs):
        seen.append(([e.label for e in entries], str(out), base))
        raise ConfigError("stop here")

    monkeypatch.setattr(blocklab.compare, "compare", fake_compare)
    for argv in (["compare", "batch_size=8", "optim.lr=2e-3", "--archs", "pre-ln,sas", "--steps", "3",
                  "--out", "runs/c"],
                 ["compare", "batch_size=8", "--archs", "pre-ln,sas", "optim.lr=2e-3", "--steps", "3",
                  "--out", "runs/c"]):
        assert main(argv) == 2 and "stop here" in capsys.readouterr().err
    assert seen[0] == seen[1]
    labels, out, base = seen[0]
    assert labels == ["pre-ln", "sas"] and out == "runs/c"
    assert (base["batch_size"], base["optim"]["lr"], base["max_steps"]) == (8, 2e-3, 3)


def test_an_unknown_option_or_an_override_where_none_go_is_still_a_usage_error(capsys):
    for argv, words in ((["train", "max_steps=1", "--outt", "x", "seed=1"], "unrecognized arguments: --outt"),
                        (["export", "--run", "r", "--out", "e", "seed=1"], "export takes no key=value")):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2 and words in capsys.readouterr().err


def test_compare_and_export_refuse_bad_input(finished_run, tmp_path, capsys):
    for args, words in ((["compare", "--seeds", "0"], ["--seeds", "'0'"]),
                        (["compare", "--seeds", "two"], ["--seeds", "'two'"]),
                        (["compare", "--lr-sweep", "1e-3,fast", "--steps", "1"], ["--lr-sweep", "fast"]),
                        (["export", "--run", str(tmp_path / "nope"), "--out", str(tmp_path / "e")],
                         ["nope", "not a blocklab run"])):
        try:
            code = main(args)
        except SystemExit as stop:  # argparse's own errors exit 2 from parse_args
            code = stop.code
        assert code == 2, args
        err = capsys.readouterr().err
        assert "Traceback" not in err and all(w in err for w in words), (args, err)
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    assert main(["export", "--run", str(finished_run), "--out", str(full)]) == 2
    assert "notes.txt" in capsys.readouterr().err and (full / "notes.txt").read_text() == "mine"
