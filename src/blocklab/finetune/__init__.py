"""Fine-tuning a pretrained encoder on GLUE-format sentence (pair) tasks.

```python
from blocklab.finetune import finetune

metrics = finetune("runs/bert", "sst2/train.tsv", "sst2/dev.tsv", "sst2")   # {"accuracy": ..., "score": ...}
```

`metrics` and `tasks` import light; `finetune` (which loads the trainer) is imported on first use.
"""

from blocklab.finetune.metrics import accuracy, average_ranks, f1_binary, matthews_corrcoef, pearson, spearman
from blocklab.finetune.tasks import GLUE_TASKS, TASK_NAMES, TaskSpec, make_task, read_rows

_LAZY = {"finetune": "loop", "FinetuneConfig": "loop", "SequenceClassifier": "model",
         "final_hidden_states": "model", "encode_example": "model"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"blocklab.finetune.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'blocklab.finetune' has no attribute {name!r}")


__all__ = ["GLUE_TASKS", "TASK_NAMES", "FinetuneConfig", "SequenceClassifier", "TaskSpec", "accuracy",
           "average_ranks", "encode_example", "f1_binary", "final_hidden_states", "finetune", "make_task",
           "matthews_corrcoef", "pearson", "read_rows", "spearman"]
