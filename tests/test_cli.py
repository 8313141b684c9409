"""The `blocklab` command line."""

from __future__ import annotations

import re

import pytest
import torch

from blocklab import ModelConfig, Transformer, count_parameters
from blocklab.cli import main
from blocklab.presets import BLOCK_PRESETS, SIZE_PRESETS


def total_params(arch, size):
    with torch.device("meta"):
        return count_parameters(Transformer(ModelConfig.from_preset(arch, size))).total


def row_of(out, arch, size):
    rows = [line.split() for line in out.splitlines() if line.split()[:2] == [arch, size]]
    assert len(rows) == 1, out
    return rows[0]


def test_params_prints_the_counts(capsys):
    assert main(["params", "--arch", "sas", "--size", "codeparrot-18l"]) == 0
    out = capsys.readouterr().out
    row = row_of(out, "sas", "codeparrot-18l")
    total = float(row[2].rstrip("M")) * 1e6
    assert total == pytest.approx(total_params("sas", "codeparrot-18l"), abs=0.006e6)
    assert total == pytest.approx(146e6, rel=0.01)  # Simplifying Sec. 4.2


def test_params_several_archs_and_sizes(capsys):
    assert main(["params", "--arch", "pre-ln,sas-p", "--size", "tiny,codeparrot-18l"]) == 0
    out = capsys.readouterr().out
    for arch in ("pre-ln", "sas-p"):
        for size in ("tiny", "codeparrot-18l"):
            row = row_of(out, arch, size)
            assert float(row[2].rstrip("M")) * 1e6 == pytest.approx(total_params(arch, size), abs=0.006e6)
    pre = float(row_of(out, "pre-ln", "codeparrot-18l")[2].rstrip("M"))
    assert pre == pytest.approx(167, rel=0.01)


def test_params_all_lists_every_block_preset(capsys):
    assert main(["params", "--all", "--size", "tiny"]) == 0
    out = capsys.readouterr().out
    for arch in BLOCK_PRESETS:
        row_of(out, arch, "tiny")


def test_presets_lists_every_preset(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    names = set(re.findall(r"^\s+(\S+)\s", out, flags=re.MULTILINE))
    assert set(BLOCK_PRESETS) <= names
    assert set(SIZE_PRESETS) <= names


@pytest.mark.parametrize("argv,name", [
    (["params", "--arch", "nope"], "nope"),
    (["params", "--arch", "sas,bogus-arch"], "bogus-arch"),
    (["params", "--arch", "sas", "--size", "enormous"], "enormous"),
])
def test_bad_preset_returns_2_with_a_clear_message(argv, name, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert name in captured.err
    assert "error" in captured.err.lower()
    assert "Known" in captured.err or "known" in captured.err
    assert "Traceback" not in captured.err
