"""`blocklab reproduce`: train what the chosen claims need, measure them, and give each a verdict.

A scale fixes the model size, the batch, the steps, the seeds and the learning rate. Each check of
a claim (`blocklab.statistics.claims`) reads one group of runs, a setting: equal steps, equal FLOPs (the
baseline's FLOPs in the scale's steps), or a 4x longer sequence at the same tokens per step. The
runs of a group live in `OUT/<scale>/<size>-<setting>/runs/<arch>-seed<k>`, the same layout and
configs as `blocklab compare --out OUT/<scale>/<size>-<setting>`, so two claims over the same runs
train them once, an interrupted reproduction resumes, and a compare run there is reused.

Every seed trains every architecture on the same batches and is validated on the same held-out
windows (batches are a pure function of seed and step), so differences are paired by seed
(`blocklab.statistics.evidence`).

One module per job:
- scales: the scales and settings;
- metrics: what a check measures on a run;
- planning: which runs the claims need, the sweep, the seeds in the store;
- judge: each check's evidence and each claim's verdict;
- timing: throughput from an interleaved timing pass after training;
- campaign: the log of what trained the committed runs;
- orchestrate: `reproduce` itself;
- pieces, estimate: a scale trained a piece at a time within a budget of minutes (one lent GPU call,
  benchmarks/gpu_campaign.py next), each run's record of the GPU and commit that trained it, the
  estimated time of the runs left;
- page, page_tables, page_plots, page_scales: the reproduction page (benchmarks/REPRODUCTION.md),
  markdown and HTML, built with the comparison report's pieces (`blocklab.report`); page_scales the
  page's columns by scale, how each check moves as models grow, and what trained a GPU scale.
"""

from blocklab.reproduce.campaign import CAMPAIGN, machine, read_campaign, record_launch
from blocklab.reproduce.judge import (
    PENDING,
    CheckResult,
    ClaimResult,
    Measurements,
    Reproduction,
    evaluate_check,
    judge_claims,
    more_seeds,
)
from blocklab.reproduce.metrics import (
    FORMULAS,
    METRICS,
    RESOLUTION_NATS,
    Metric,
    deep_entropy,
    lambda_v1_slope,
)
from blocklab.reproduce.orchestrate import reproduce
from blocklab.reproduce.planning import (
    NotFinished,
    Sweep,
    finished_seeds,
    needed_archs,
    not_finished,
    plan,
    read_sweep,
    recipe_rates,
    scaled_rates,
    sweep_plan,
    unique_runs,
)
from blocklab.reproduce.scales import EVIDENCE, FLOPS_BASELINE, SCALES, SETTINGS, Scale, run_group
from blocklab.reproduce.timing import TIMING, read_timing, time_throughput, timed_archs

__all__ = [
    "CAMPAIGN", "EVIDENCE", "FLOPS_BASELINE", "FORMULAS", "METRICS", "PENDING", "RESOLUTION_NATS", "SCALES",
    "SETTINGS", "TIMING", "CheckResult", "ClaimResult", "Measurements", "Metric", "NotFinished",
    "Reproduction", "Scale", "Sweep", "deep_entropy", "evaluate_check", "finished_seeds", "judge_claims",
    "lambda_v1_slope", "machine", "more_seeds", "needed_archs", "not_finished", "plan", "read_campaign",
    "read_sweep", "read_timing", "recipe_rates", "record_launch", "reproduce", "run_group", "scaled_rates",
    "sweep_plan", "time_throughput", "timed_archs", "unique_runs",
]
