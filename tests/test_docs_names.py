"""docs/architecture.md names only what exists: every file it cites is in the repository, and every code
name in backticks (``Transformer.forward``, ``ops.padded_mask``, ``LayerRole``) is defined in the package,
each dotted part as a module, class, function, method, attribute or field of what precedes it."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "blocklab"
DOC = ROOT / "docs" / "architecture.md"
PATH = re.compile(r"\b((?:[\w.-]+/)+[\w.-]+\.(?:py|md|json|yaml)|(?:[\w-]+/)+)(?=[\s,;:)`.]|$)")
IDENT = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
EXTERNAL = {"torch", "nn", "F"}  # PyTorch's names: the page cites them as they are
# the worked example's own names
EXAMPLE = {"ScaledValues", "ScaledOptions", "src/blocklab/model/value_paths/scaled.py"}


def prose(text: str) -> str:
    """The page without its fenced code blocks (the worked example runs in test_architecture.py)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def cited_names(text: str) -> set[str]:
    """Backticked code names: a dotted identifier, optionally called (``f(x)``: ``f``)."""
    names = set()
    for span in re.findall(r"`([^`\n]+)`", prose(text)):
        head = span.split("(", 1)[0].strip()
        if head.endswith(".py") or head in EXAMPLE or head.split(".")[0] in EXTERNAL:
            continue
        if IDENT.fullmatch(head) and ("." in head or "_" in head or any(c.isupper() for c in head[1:])
                                      or "(" in span):
            names.add(head)
    return names


@cache
def defined() -> frozenset[str]:
    """Every name the package defines: modules, classes, functions, assignments, attributes, fields."""
    found: set[str] = set()
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("").parts
        found.update(rel)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                found.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                found.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                found.add(node.attr)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                found.add(node.target.id)
            elif isinstance(node, ast.arg):
                found.add(node.arg)
    return frozenset(found)


def test_the_finders_read_names_and_paths():
    text = ("see `Transformer.forward(ids)`, `ops.padded_mask`, `x`, `\"auto\"`, `pre-ln`, `nn.Linear`, "
            "`validation.BLOCK_LAYOUTS` in model/block.py.\n")
    assert cited_names(text) == {"Transformer.forward", "ops.padded_mask", "validation.BLOCK_LAYOUTS"}
    assert PATH.findall(text) == ["model/block.py"]
    assert "nope" not in defined() and {"Transformer", "padded_mask", "ops"} <= defined()
    assert "HandDecoder" not in defined()  # a class of benchmarks/, not of the package


@pytest.mark.parametrize("name", sorted(cited_names(DOC.read_text())))
def test_every_code_name_the_page_cites_is_defined(name):
    missing = [part for part in name.split(".") if part not in defined()]
    assert not missing, f"docs/architecture.md cites `{name}`: {missing} is defined nowhere in src/blocklab"


def test_every_file_the_page_cites_exists():
    paths = set(PATH.findall(prose(DOC.read_text())))
    assert len(paths) > 10
    bases = [ROOT, ROOT / "src", SRC, ROOT / "tests"]
    missing = [p for p in sorted(paths - EXAMPLE) if not any((base / p).exists() for base in bases)]
    assert not missing, f"docs/architecture.md cites files that do not exist: {missing}"
