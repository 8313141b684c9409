"""The README as a newcomer uses it: every Python block runs as written, in order, in one namespace (as a
reader pasting them into one session would), in a fresh directory with a fresh data cache; every
`blocklab` command of its bash blocks is one the command line accepts, with overrides, architectures,
grids and scales it knows (parsed, not run: the main job and full training are too slow here); every
repository path and link it names exists; its set-up commands are CI's; its tables name every preset;
and it stays short."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 300  # a README a newcomer reads in five minutes
REPO_DIRS = ("src/", "benchmarks/", "docs/", "tests/", ".ci/")


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)


def shell_commands(block: str) -> list[list[str]]:
    """Each simple command of a bash block as its words: continuation lines joined, comments dropped,
    split at `&&`, `||`, `;` and `|` (the README's blocks use nothing more of the shell)."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split, lexer.commenters = True, "#"
        words: list[str] = []
        for word in [*lexer, ";"]:
            if word.strip(";&|"):
                words.append(word)
            elif words:
                commands.append(words)
                words = []
    return commands


def blocklab_argv(words: list[str]) -> list[str] | None:
    """The argument list of a `blocklab` invocation (`blocklab ...`, `python -m blocklab ...`,
    `torchrun ... -m blocklab.cli ...`), or None for any other command."""
    if words[0] == "blocklab":
        return words[1:]
    for i, word in enumerate(words[:-1]):
        if word == "-m" and words[i + 1] in ("blocklab", "blocklab.cli"):
            return words[i + 2:]
    return None


def blocklab_commands(page: Path) -> list[list[str]]:
    found = []
    for block in bash_blocks(page.read_text()):
        found += [argv for words in shell_commands(block) if (argv := blocklab_argv(words)) is not None]
    return found


def check_command(argv: list[str]) -> None:
    """Parse `argv` with the command line's own parser, then resolve what names things: the training
    overrides and config (train, compare), each architecture, grid, scale and paper. Raises
    AssertionError, or ConfigError from the config, for anything `blocklab` would refuse as input."""
    from blocklab import cli
    from blocklab.cli import args as cli_args

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            args = cli_args.parse(cli.build_parser(), argv)
    except SystemExit as stop:  # --help and --version end here with 0; a usage error with 2
        assert stop.code == 0, f"blocklab {shlex.join(argv)}: {stderr.getvalue().strip()}"
        return
    if args.command in ("train", "compare", "prepare"):
        check_training_names(args)
    if args.command == "reproduce":
        from blocklab.reproduce import SCALES
        from blocklab.statistics.claims import PAPERS

        for scale in (args.scale or "").split(","):
            assert not scale or scale in SCALES, f"unknown scale {scale!r} in blocklab {shlex.join(argv)}"
        assert args.paper in (None, *PAPERS), f"unknown paper {args.paper!r} in blocklab {shlex.join(argv)}"
        check_training_names(args)


def check_training_names(args) -> None:
    """`blocklab train`, `prepare`, `compare` and `reproduce` overrides (after an optional config), compare's
    architectures and grid, as the config resolves them."""
    from blocklab.training.config import resolve_config

    # compare's budget is a flag, reproduce's the scale's; prepare needs none (it puts a placeholder first)
    overrides, config = list(args.overrides), None
    budget_elsewhere = args.command in ("compare", "prepare", "reproduce")
    if "..." in overrides:  # a template: "..." stands for the rest of a command shown before it
        overrides, budget_elsewhere = [o for o in overrides if o != "..."], True
    if overrides and "=" not in overrides[0]:
        config = overrides.pop(0)  # a shipped recipe is resolved; a user's own YAML file is not here
        if config.endswith((".yaml", ".yml")) and not Path(config).is_file():
            config, budget_elsewhere = None, True
    if budget_elsewhere or getattr(args, "resume", False):  # compare's flags, a file, the template, the run
        overrides.insert(0, "max_steps=1")
    resolve_config(config, overrides)
    if args.command == "compare":
        from blocklab.compare import GRIDS

        assert args.grid in (None, *GRIDS), f"unknown grid {args.grid!r}"
        for arch in args.archs.split(","):
            resolve_config(config, [*overrides, f"arch={arch}"])


# -- the checkers themselves ------------------------------------------------------------------------


def test_the_block_finder_reads_fenced_python_only():
    text = "a\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = x\n```\n"
    assert python_blocks(text) == ["x = 1\n", "y = x\n"]
    assert bash_blocks(text) == ["ls\n"]


def test_the_command_finder_splits_lines_continuations_and_operators():
    block = ("pip install torch==2.13.0 -e . && blocklab compare   # the main job\n"
             "blocklab train a=1 \\\n    --out 'runs/x y'\n"
             "torchrun --nproc_per_node 2 -m blocklab.cli train parallel=ddp; echo done\n"
             "python -m blocklab --help | head\n")
    commands = shell_commands(block)
    assert commands[:2] == [["pip", "install", "torch==2.13.0", "-e", "."], ["blocklab", "compare"]]
    assert [blocklab_argv(c) for c in commands] == [None, ["compare"], ["train", "a=1", "--out", "runs/x y"],
                                                     ["train", "parallel=ddp"], None, ["--help"], None]


@pytest.mark.parametrize("argv", [
    ["trian", "max_steps=1"],                        # no such command
    ["compare", "--archz", "pre-ln"],                # no such option
    ["train", "optim.lrr=1e-3"],                     # no such TrainConfig field
    ["train", "arch=sas-q"],                         # no such architecture
    ["compare", "--archs", "pre-ln,bovv"],
    ["compare", "--grid", "resformer-fig8"],
    ["reproduce", "--scale", "cpu,gpu"],
    ["reproduce", "--paper", "value-residuals"],
])
def test_the_command_check_refuses_what_blocklab_refuses(argv, tmp_path, monkeypatch):
    from blocklab.util.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    with pytest.raises((AssertionError, ConfigError)):
        check_command(argv)


# -- the README --------------------------------------------------------------------------------------


def test_every_readme_python_block_runs(tmp_path, monkeypatch):
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 3, "the README lost its Python examples"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BLOCKLAB_CACHE", str(tmp_path / "cache"))
    namespace: dict = {"__name__": "__readme__"}
    for i, block in enumerate(blocks, start=1):
        try:
            exec(compile(block, f"README.md python block {i}", "exec"), namespace)
        except Exception as err:  # name the block, so that the failing example is found at once
            pytest.fail(f"README python block {i} failed: {type(err).__name__}: {err}\n{block}")
    assert namespace["logits"].shape[-1] == namespace["model"].cfg.vocab_size
    assert namespace["ids"].shape[0] == 2 and 16 < namespace["ids"].shape[1] <= 16 + 64  # prompt + new


def test_every_readme_blocklab_command_is_accepted(tmp_path, monkeypatch):
    """Each `blocklab` command of a bash block parses, and the names in it resolve (nothing is run)."""
    commands = blocklab_commands(README)
    named = {argv[0] for argv in commands if argv}
    assert {"compare", "train", "reproduce", "generate", "export"} <= named, "an example lost its command"
    monkeypatch.chdir(tmp_path)
    for argv in commands:
        check_command(argv)


@pytest.mark.parametrize("page", sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_every_docs_blocklab_command_is_accepted(page, tmp_path, monkeypatch):
    """The README's detail moved to docs/: the commands there are checked alike."""
    monkeypatch.chdir(tmp_path)
    for argv in blocklab_commands(ROOT / "docs" / page):
        check_command(argv)


def test_readme_set_up_is_the_two_commands_ci_runs():
    """The set-up block holds exactly the two commands; .ci/run installs and tests as the second says."""
    setup = bash_blocks(README.read_text().split("## Set-up: two commands", 1)[1])[0]
    assert [shlex.join(c) for c in shell_commands(setup)] == [
        "pip install torch==2.13.0 -e .", "blocklab compare",
        "pip install torch==2.13.0 -e '.[dev]'", "python -m pytest"]
    ci = shell_commands((ROOT / ".ci" / "run").read_text())
    assert ["python", "-m", "pip", "install", "--quiet", "torch==2.13.0", "-e", ".[dev]"] in ci
    assert any(words[:3] == ["python", "-m", "pytest"] and "-m" not in words[3:] for words in ci)


def test_every_path_and_link_of_the_readme_exists():
    """Repository paths named in bash blocks (src/, benchmarks/, docs/ ...) and every relative link."""
    text = README.read_text()
    words = [w for block in bash_blocks(text) for c in shell_commands(block) for w in c]
    paths = {w.split("=", 1)[-1] for w in words if w.split("=", 1)[-1].startswith(REPO_DIRS)}
    links = set(re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text))
    assert links, "the README lost its links into docs/"
    missing = sorted(p for p in paths | links if not (ROOT / p).exists())
    assert not missing, f"the README names paths that do not exist: {missing}"


def table_names(text: str, header: str) -> set[str]:
    """The backticked names in the first column of the README table whose first header cell is `header`."""
    rows = re.search(rf"^\| {re.escape(header)} \|.*\n\|[-| :]+\|\n((?:\|.*\n)+)", text, re.M)
    assert rows, f"the README lost its table of {header}s"
    return {name for row in rows[1].splitlines() for name in re.findall(r"`([^`]+)`", row.split("|")[1])}


def test_the_architecture_tables_name_every_preset_and_value_path():
    """Compared with the registries the command line resolves names from: a preset or value path added
    without a row, or a row left behind by one removed, fails."""
    from blocklab.model.presets import BLOCK_PRESETS, SIZE_PRESETS
    from blocklab.model.value_paths import VALUE_PATHS

    text = README.read_text()
    assert table_names(text, "block preset") == set(BLOCK_PRESETS)
    assert table_names(text, "value path") == set(VALUE_PATHS)
    sizes = set(re.findall(r"`([a-z0-9-]+)`", text.split("## Architectures", 1)[1]))
    assert set(SIZE_PRESETS) <= sizes, f"sizes missing from the README: {sorted(set(SIZE_PRESETS) - sizes)}"


def test_the_table_reader_sees_rows_and_nothing_else():
    text = "x\n| value path | what |\n|---|---|\n| `a`, `b` | `c` |\n| `d` | e |\n\n| `z` | not it |\n"
    assert table_names(text, "value path") == {"a", "b", "d"}


def test_the_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines < MAX_LINES, f"the README has {lines} lines; move detail into docs/"
