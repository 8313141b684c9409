"""The comparison report: how the numbers were made, what they are and how sure they are, as markdown
(report.md), one self-contained HTML page (report.html) and JSON (results.json).

Everything is read from the runs (`config.yaml` through the TrainConfig, `model_config.json`,
`summary.json`, `metrics.jsonl`) or measured: KV-cache bytes from the model's own cache layout, and,
when `blocklab compare` passes them (`measured`), each architecture's training-step times from an
interleaved timing pass after training and the memory its training takes (parameters, gradients,
optimizer state, activations). Nothing is assumed.

The report is built once as a list of blocks (headings, paragraphs, lists, tables, figures) and
rendered twice, so the markdown and the HTML say the same. One module per job:
- data: the runs' files, the git commit and the machine;
- stats: mean and spread over seeds, step times, one row per architecture, the warnings;
- method: how the runs were trained, in words;
- tables, plots: the report's tables and figures;
- markdown, html: rendering the blocks;
- write: `write_report` and `summary_table`;
- params: `blocklab params`'s table of presets.
The reproduction page (benchmarks/REPRODUCTION.md) is `blocklab.reproduce.page`, which uses these.
"""

from blocklab.report.data import environment, git_commit, kv_cache_bytes_per_token, utc_now
from blocklab.report.html import html_table, inline_html, render_html
from blocklab.report.markdown import alignments, anchor, figures_of, md_table, render_markdown
from blocklab.report.method import (
    budget_text,
    follows_recipe,
    how_runs_trained,
    method_facts,
    method_items,
    optimizer_text,
    plural,
)
from blocklab.report.params import params_rows, params_table
from blocklab.report.plots import gain_product_note
from blocklab.report.stats import (
    WALL_FROM_TIMING,
    baseline_warnings,
    load_warnings,
    mean_sd,
    spread,
    training_step_times,
    wall_clock_source,
)
from blocklab.report.tables import memory_table, plateau_table, throughput_table
from blocklab.report.write import summary_table, verdict_blocks, write_report

__all__ = [
    "WALL_FROM_TIMING", "alignments", "anchor", "baseline_warnings", "budget_text", "environment",
    "figures_of", "follows_recipe",
    "gain_product_note", "git_commit", "how_runs_trained", "html_table", "inline_html",
    "kv_cache_bytes_per_token", "load_warnings", "md_table", "mean_sd", "memory_table", "method_facts",
    "method_items", "optimizer_text", "params_rows", "params_table", "plateau_table", "plural",
    "render_html", "render_markdown", "spread", "summary_table", "throughput_table",
    "training_step_times", "utc_now", "verdict_blocks", "wall_clock_source", "write_report",
]
