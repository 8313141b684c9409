"""Rendering a report's blocks as one self-contained HTML page, with the small markdown subset the
paragraphs use (inline code, bold, links) and the figures embedded.
"""

from __future__ import annotations

import base64
import html
import re

from blocklab.report.markdown import alignments, anchor


def inline_html(text: str) -> str:
    """The markdown subset the report writes, as HTML: `code`, **bold** and [text](url); the rest escaped."""
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for part in parts:
        if len(part) >= 2 and part.startswith("`") and part.endswith("`"):
            out.append(f"<code>{html.escape(part[1:-1])}</code>")
            continue
        part = html.escape(part)
        part = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", part)
        part = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2">\1</a>', part)
        out.append(part)
    return "".join(out)


def html_table(head: list[str], rows: list[list[str]], align: list[str] | None = None) -> str:
    """An HTML table; with `align` each cell gets its column's alignment and cells render inline markdown."""
    if align is None:
        th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
        trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
        return f"<table><tr>{th}</tr>{trs}</table>"
    th = "".join(f'<th class="{a}">{html.escape(h)}</th>' for h, a in zip(head, align, strict=True))
    trs = "".join("<tr>" + "".join(f'<td class="{a}">{inline_html(c)}</td>'
                                   for c, a in zip(row, align, strict=True)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


STYLE = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;"
         "line-height:1.45}"
         "table{border-collapse:collapse;margin:0.5em 0 1em}td,th{border:1px solid #ccc;padding:4px 8px}"
         "th{background:#f4f4f4}.left{text-align:left}.right{text-align:right;font-variant-numeric:tabular-nums}"
         "figure{margin:1em 0}img{max-width:100%}figcaption{max-width:50em;color:#333;font-size:0.95em}"
         "code{background:#f4f4f4;padding:0 3px;border-radius:3px}"
         ".warning{background:#fff4e5;border-left:4px solid #e69500;padding:0.4em 0.8em}")


def render_html(title: str, blocks: list[tuple]) -> str:
    body = [f"<h1>{html.escape(title)}</h1>"]
    n = 0
    for block in blocks:
        kind = block[0]
        if kind == "h2":
            body.append(f'<h2 id="{anchor(block[1])}">{html.escape(block[1])}</h2>')
        elif kind == "p":
            cls = ' class="warning"' if block[1].startswith("**Warning") else ""
            body.append(f"<p{cls}>{inline_html(block[1])}</p>")
        elif kind == "ul":
            body.append("<ul>" + "".join(f"<li>{inline_html(item)}</li>" for item in block[1]) + "</ul>")
        elif kind == "table":
            body.append(html_table(block[1], block[2], alignments(block[1], block[2])))
        elif kind == "figure":
            n += 1
            data = base64.b64encode(block[1].read_bytes()).decode()
            body.append(f'<figure><img alt="{html.escape(block[2])}" src="data:image/png;base64,{data}">'
                        f"<figcaption><strong>Figure {n}.</strong> {inline_html(block[3])}</figcaption>"
                        "</figure>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>")
