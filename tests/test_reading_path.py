"""benchmarks/reading_path.py: the code a reader follows from a config to the logits, each line once."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

from blocklab.model import Transformer

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import reading_path  # noqa: E402


def test_a_comprehension_or_lambda_inside_a_function_counts_with_it_once():
    # code objects by first and last line: a function 10-20 holding a comprehension (12) and a lambda
    # (15-18), then a function 30-31; by hand, 11 + 2 lines in 2 functions
    spans = {10: 20, 12: 12, 15: 18, 30: 31}
    assert reading_path.outermost(spans) == {"functions": 2, "function_lines": 13}
    assert reading_path.outermost({}) == {"functions": 0, "function_lines": 0}


def test_the_forward_pass_is_part_of_the_path_from_the_config():
    whole = reading_path.reading_path("pre-ln")
    forward = reading_path.reading_path("pre-ln", path="forward pass")
    assert {"blocklab/model/presets.py", "blocklab/model/config.py", "blocklab/model/init_schemes.py"} <= set(
        whole["files"])
    assert set(forward["files"]) < set(whole["files"])
    assert all(name.startswith("blocklab/model/") for name in forward["files"])
    assert 0 < forward["function_lines"] < whole["function_lines"]
    for result in (whole, forward):
        assert all(0 <= r["function_lines"] <= r["file_lines"] for r in result["files"].values())
    # Transformer.forward, final_hidden and hidden_states run in every forward pass: their lines at least
    lines = sum(len(inspect.getsourcelines(f)[0]) for f in (Transformer.forward, Transformer.final_hidden,
                                                             Transformer.hidden_states))
    assert lines <= forward["files"]["blocklab/model/transformer.py"]["function_lines"]
