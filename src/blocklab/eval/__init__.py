"""Evaluation of causal runs: zero-shot multiple choice with the DCLM CORE aggregate, and an
adapter for EleutherAI's lm-evaluation-harness (`blocklab.eval.harness`, optional extra ``eval``).

```python
from blocklab.eval import evaluate_mc
from blocklab.training import load_run

run = load_run("runs/gpt")
report = evaluate_mc(run.model, run.tokenizer, ["hellaswag_like.jsonl"])   # accuracies, CORE
```

`blocklab.eval.harness` imports `lm_eval` and is therefore not imported here.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module that defines it; loaded on first use, so that `blocklab eval --help` needs no torch
_LAZY = {"score_continuations": "loglik", **{name: "multiple_choice" for name in (
    "MCExample", "MCResult", "centered_accuracy", "continuation_ids", "core_score", "evaluate_mc",
    "format_table", "load_mc", "score_mc")}}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"blocklab.eval.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'blocklab.eval' has no attribute {name!r}")


__all__ = ["MCExample", "MCResult", "centered_accuracy", "continuation_ids", "core_score", "evaluate_mc",
           "format_table", "load_mc", "score_continuations", "score_mc"]
