"""Rendering a report's blocks (headings, paragraphs, lists, tables, figures) as markdown."""

from __future__ import annotations

import re
from pathlib import Path

# A block is ("h2", title), ("p", markdown text), ("ul", [markdown items]), ("table", head, rows) or
# ("figure", path, alt, caption).
_NUMBER = re.compile(r"^[+-]?\d")


def alignments(head: list[str], rows: list[list[str]]) -> list[str]:
    """"right" for a column whose cells are all numbers (or "-"), "left" for names and text."""
    out = []
    for j in range(len(head)):
        cells = [row[j] for row in rows if row[j] not in ("-", "")]
        out.append("right" if cells and all(_NUMBER.match(c) for c in cells) else "left")
    return out


def md_table(head: list[str], rows: list[list[str]], align: list[str] | None = None) -> list[str]:
    """A markdown table; with `align` ("left"/"right" per column) its delimiter row says so."""
    esc = [[c.replace("|", "\\|") for c in row] for row in rows]
    rule = "|" + "---|" * len(head) if align is None else (
        "|" + "".join(":---|" if a == "left" else "---:|" for a in align))
    return ["| " + " | ".join(head) + " |", rule] + ["| " + " | ".join(r) + " |" for r in esc]


def anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


_FIGURE = re.compile(r"^!\[[^\]]*\]\(([^)\s]+)\)$", re.MULTILINE)


def figures_of(markdown: Path) -> list[Path]:
    """The figures a markdown report shows (its ``![alt](file)`` lines), beside it."""
    return [markdown.parent / name for name in _FIGURE.findall(markdown.read_text())]


def render_markdown(title: str, blocks: list[tuple]) -> str:
    md = [f"# {title}"]
    n = 0
    for block in blocks:
        kind = block[0]
        if kind == "h2":
            md += ["", f"## {block[1]}"]
        elif kind == "p":
            md += ["", block[1]]
        elif kind == "ul":
            md += [""] + [f"- {item}" for item in block[1]]
        elif kind == "table":
            md += [""] + md_table(block[1], block[2], alignments(block[1], block[2]))
        elif kind == "figure":
            n += 1
            md += ["", f"![{block[2]}]({block[1].name})", "", f"Figure {n}: {block[3]}"]
    return "\n".join(md) + "\n"
