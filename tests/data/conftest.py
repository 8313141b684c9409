"""Fixtures of the data tests: a cache folder, and a folder of small Python files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.data.data_reference import write_files


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    """20 small files whose names put both splits non-empty at val_fraction 0.3."""
    files = {f"pkg{i % 3}/mod_{i:02d}.py": f"def f{i}(x):\n    return x * {i} + 'é{i}'\n" * (3 + i % 4)
             for i in range(20)}
    return write_files(tmp_path / "code", files)
