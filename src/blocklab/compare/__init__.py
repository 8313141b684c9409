"""`blocklab compare`: train architectures side by side on one budget, then write a report.

Every run shares the data, the tokenizer, the batch order (batches are a pure function of seed and
step) and the budget; only the architecture differs. Equal steps (hence equal tokens) by default;
equal FLOPs or equal wall-clock on request, so that a cheaper block gets more steps. Finished runs
are reused and an interrupted one resumes from its checkpoint. After training, every architecture's
memory is measured and its training step timed again in interleaved rounds (`measure_architectures`),
so that the report's speed figures do not depend on how the machine's load changed from run to run
(docs/report.md). One module per job:
- grids: the entries of a comparison and the papers' grids;
- configs: one TrainConfig per entry and seed, the budget and `blocklab compare`'s defaults;
- sweep: the learning-rate sweep;
- timing: the interleaved timing pass and the memory measurement after training;
- added: runs trained elsewhere brought into the report (`--add`);
- orchestrate: `compare` itself.
"""

from blocklab.compare.added_runs import WINDOW_FIELDS, added_runs, data_differences
from blocklab.compare.configs import (
    DEFAULT_STEPS,
    default_budget,
    entry_model,
    merge,
    resolve_compare,
    run_configs,
    slug,
)
from blocklab.compare.grids import GRIDS, Entry, Grid
from blocklab.compare.orchestrate import compare
from blocklab.compare.sweep import sweep_learning_rates, with_best_rates
from blocklab.compare.timing import TIMING_ROUNDS, TIMING_STEPS, StepProbe, measure_architectures
from blocklab.training.config import BUDGETS

__all__ = ["BUDGETS", "DEFAULT_STEPS", "GRIDS", "TIMING_ROUNDS", "TIMING_STEPS", "WINDOW_FIELDS", "Entry",
           "Grid", "StepProbe", "added_runs", "compare", "data_differences", "default_budget", "entry_model",
           "measure_architectures", "merge", "resolve_compare", "run_configs", "slug", "sweep_learning_rates",
           "with_best_rates"]
