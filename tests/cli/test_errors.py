"""What `blocklab` says when a command fails (cli/__init__.py's `main`): an internal error shows its
traceback and asks for a report; an error of the machine is one line; a read-only --out is named
before anything is written."""

from __future__ import annotations

import pytest

from blocklab.cli import main


def test_an_internal_error_shows_its_traceback_and_asks_for_a_report(monkeypatch, capsys):
    import blocklab.cli as cli

    def broken(_args):
        raise RuntimeError("an invariant broke")

    monkeypatch.setattr(cli, "cmd_presets", broken)
    code = main(["presets"])
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback" in err and "RuntimeError: an invariant broke" in err
    assert "blocklab: internal error" in err and "Please report it" in err and "blocklab presets" in err


@pytest.mark.parametrize("error, code, line", [
    ((30, "Read-only file system", "/ro/runs"), 2,
     "cannot write '/ro/runs': the file system that holds it is read-only (Read-only file system). "
     "Give a path (such as --out) where this user can write."),
    ((13, "Permission denied", "/readonly/runs"), 2,
     "cannot write '/readonly/runs': this user has no permission there (Permission denied). "
     "Give a path (such as --out) where this user can write."),
    ((5, "Input/output error", "/disk/runs"), 1, "[Errno 5] Input/output error: '/disk/runs'"),
])
def test_an_error_of_the_machine_is_one_line(error, code, line, monkeypatch, capsys):
    """A read-only --out was a raw "[Errno 30] Read-only file system: ..." line, exit 1: now it names the
    path, the problem and what to do, exit 2 (a path to change); other errors of the machine stay as
    they were, exit 1."""
    import blocklab.cli as cli

    def refused(_args):
        raise OSError(*error)

    monkeypatch.setattr(cli, "cmd_presets", refused)
    assert main(["presets"]) == code
    assert capsys.readouterr().err == f"blocklab: error: {line}\n"


def test_a_read_only_out_is_named_before_anything_is_written(tmp_path, capsys):
    """A real read-only file system (a tmpfs mounted ro, as root) or a folder this user may not write
    (as another user): the lock beside --out is the first thing written, and its OSError is said
    plainly, exit 2."""
    import os
    import subprocess

    ro = tmp_path / "ro"
    ro.mkdir()
    root = os.geteuid() == 0
    if root:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)],
                                 capture_output=True)
        if mounted.returncode:
            pytest.skip("cannot mount a tmpfs here (a restricted container)")
    else:
        ro.chmod(0o555)
    try:
        assert main(["train", "--out", str(ro / "run"), "max_steps=1"]) == 2
    finally:
        subprocess.run(["umount", str(ro)], check=True) if root else ro.chmod(0o755)
    err = capsys.readouterr().err
    why = "the file system that holds it is read-only" if root else "this user has no permission there"
    said = f"{why} ({os.strerror(30 if root else 13)})"
    assert err == (f"blocklab: error: cannot write '{ro}/.run.lock': {said}. Give a path (such as --out) "
                   "where this user can write.\n")
