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

from blocklab.eval.loglik import score_continuations
from blocklab.eval.multiple_choice import (
    MCExample,
    MCResult,
    centered_accuracy,
    continuation_ids,
    core_score,
    evaluate_mc,
    format_table,
    load_mc,
    score_mc,
)

__all__ = ["MCExample", "MCResult", "centered_accuracy", "continuation_ids", "core_score", "evaluate_mc",
           "format_table", "load_mc", "score_continuations", "score_mc"]
