"""Every Python block of the README runs as written, in order, in one namespace (as a reader pasting
them into one session would), in a fresh directory with a fresh data cache."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def test_the_block_finder_reads_fenced_python_only():
    text = "a\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = x\n```\n"
    assert python_blocks(text) == ["x = 1\n", "y = x\n"]


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
