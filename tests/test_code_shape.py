"""The shape of the code: no module in src/blocklab over 500 lines, no function over 80.

Each module does one job; a longer one is split by job (report/, compare/, reproduce/ show how).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "blocklab"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def _functions(node: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function under `node`, methods and nested functions included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = prefix + child.name
            if not isinstance(child, ast.ClassDef):
                yield name, child
            yield from _functions(child, name + ".")
        else:
            yield from _functions(child, prefix)


def over_limits(rel: str, text: str) -> set[str]:
    """The module `rel` as "path" when over its limit, and each function over its limit as
    "path:qualified.name"."""
    over = {rel} if len(text.splitlines()) > MAX_MODULE_LINES else set()
    return over | {f"{rel}:{name}" for name, fn in _functions(ast.parse(text))
                   if fn.end_lineno - fn.lineno + 1 > MAX_FUNCTION_LINES}


def test_no_module_over_500_lines_and_no_function_over_80():
    over = set().union(*(over_limits(p.relative_to(SRC).as_posix(), p.read_text())
                         for p in sorted(SRC.rglob("*.py"))))
    assert not over, f"over the limits (split by job): {sorted(over)}"


def test_the_limits_find_a_long_method_a_nested_function_and_a_long_module():
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))  # def line + 80 = 81 lines
    text = f"class A:\n    def long(self):\n{body}\n    def short(self):\n        return 1\n"
    assert over_limits("a.py", text) == {"a.py:A.long"}
    nested = "def outer():\n    def inner():\n" + body + "    return inner\n"
    assert "a.py:outer.inner" in over_limits("a.py", nested)
    fits = "def f():\n" + "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))  # 80 lines
    assert over_limits("a.py", fits) == set()
    assert over_limits("b.py", "x = 1\n" * (MAX_MODULE_LINES + 1)) == {"b.py"}
    assert over_limits("b.py", "x = 1\n" * MAX_MODULE_LINES) == set()
