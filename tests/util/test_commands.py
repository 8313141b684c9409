"""Every command blocklab prints for pasting quotes its words (`blocklab.util.commands.pasteable`): read
back by a POSIX shell's rules (`shlex.split`), a hostile path is one word, as it was given."""

from __future__ import annotations

import json
import shlex

import pytest

from blocklab.cli import _interrupted, main
from blocklab.training.checkpoint import resume_hint
from blocklab.util.commands import pasteable

HOSTILE = "odd name ü 'q' $HOME;x$(id)\\back"


def test_pasteable_reads_back_as_the_words_given():
    words = ["blocklab", "train", f"init_from=exp/{HOSTILE}", "--out", "RUN", "max_steps=..."]
    line = pasteable(*words)
    assert shlex.split(line) == words
    assert line.endswith("--out RUN max_steps=...")  # placeholders print as they are


def _command_in(text: str) -> list[str]:
    """The words of the first `backquoted` command in `text`."""
    return shlex.split(text.split("`")[1])


def test_resume_hints_quote_the_run_folder(tmp_path):
    run = tmp_path / HOSTILE
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "checkpoints" / "step_000002" / "state.json").write_text("{}")
    for text in (resume_hint(run), _interrupted(str(run))):
        assert _command_in(text) == ["blocklab", "train", "--resume", "--out", str(run)]


def test_errors_that_name_a_command_quote_its_folder(tmp_path, capsys):
    hf = tmp_path / HOSTILE / "hf"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert main(["generate", "--run", str(hf), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert shlex.split(err.split("import it first (")[1].split("), then")[0]) == [
        "blocklab", "import-hf", str(hf), "--out", "OUT"]
    export = tmp_path / HOSTILE / "export"
    export.mkdir()
    (export / "config.json").write_text(json.dumps({"blocklab_format_version": 1}))
    assert main(["import-hf", str(export), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert shlex.split(err.split("use it as it is (")[1].split(", or blocklab.interop")[0]) == [
        "blocklab", "train", f"init_from={export}"]


@pytest.mark.parametrize("argv", [["plot", HOSTILE, "--out", "x y"]])
def test_the_internal_error_line_quotes_the_command(argv, monkeypatch, capsys):
    import blocklab.cli as cli

    def broken(_args):
        raise RuntimeError("an invariant broke")

    monkeypatch.setattr(cli, "cmd_plot", broken)
    main(argv)
    err = capsys.readouterr().err
    assert shlex.split(err.split("in `")[1].split("`: this is a bug")[0]) == ["blocklab", *argv]
