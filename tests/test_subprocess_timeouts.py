"""Every time limit a test sets on a child process leaves room for a shared machine (issue 57): no
``timeout=`` and no polling deadline is a bare number of seconds, each passes through
`timeouts.patient`, which scales it (x10 by default). A fixed 120 s killed a check that takes 21 s
alone on a loaded 2-core machine."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import timeouts
from timeouts import patient

TESTS = Path(__file__).resolve().parent


def _bare_seconds(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and node.value > 1


def fixed_limits(text: str) -> list[int]:
    """Lines of `text` that set a child's time limit as a bare number: a `timeout=` keyword, or a
    `deadline = <clock>() + N` (a number, or a name, such as a parameter, taken unscaled)."""
    lines = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.keyword) and node.arg == "timeout" and _bare_seconds(node.value):
            lines.append(node.value.lineno)
        deadline = isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and "deadline" in t.id
                                                        for t in node.targets)
        if deadline and isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.Add):
            added = node.value.right
            if _bare_seconds(added) or isinstance(added, (ast.Name, ast.Attribute)):
                lines.append(node.lineno)
    return sorted(lines)


def test_no_test_gives_a_child_process_a_fixed_number_of_seconds():
    found = {p.relative_to(TESTS).as_posix(): fixed_limits(p.read_text())
             for p in sorted(TESTS.rglob("*.py"))}
    assert not {name: lines for name, lines in found.items() if lines}, "use timeouts.patient(seconds)"


def test_the_scanner_finds_what_it_looks_for():
    text = ("subprocess.run(cmd, timeout=120)\nproc.wait(timeout=rng.uniform(0, 0.6))\n"
            "deadline = time.monotonic() + 90\nlater = time.time() + 3600\n"
            "deadline = time.monotonic() + timeout\nproc.wait(timeout=patient(15))\n")
    assert fixed_limits(text) == [1, 3, 5]


@pytest.mark.parametrize("value, scale", [(None, 10.0), ("3", 3.0), ("0", 10.0), ("-2", 10.0), ("x", 10.0)])
def test_patient_scales_by_the_environment(monkeypatch, value, scale):
    if value is None:
        monkeypatch.delenv("BLOCKLAB_TEST_TIMEOUT_SCALE", raising=False)
    else:
        monkeypatch.setenv("BLOCKLAB_TEST_TIMEOUT_SCALE", value)
    assert timeouts.scale() == scale and patient(120) == 120 * scale
