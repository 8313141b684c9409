"""Diagnostics: look inside a model as Value Residual Learning and Simplifying Transformer Blocks do.

    results = diagnose(model, batches)            # per-layer statistics on held-out batches
    results = diagnose_run("runs/x", "runs/x/diagnostics")  # the same for a run directory, written
    write_report(results, "out/", metrics_path)   # diagnostics.json, *.png, summary.md
    compare_reports(results_a, results_b, "cmp/", labels=("pre-ln", "resformer"))
    compare_runs("runs/a", "runs/b", "cmp/")      # diagnose two runs alike and overlay them
    plot_scalars("run/metrics.jsonl", "scalars.png")

See docs/diagnostics.md.
"""

from blocklab.analysis.capture import LayerTrace, diagnostic_mode, trace
from blocklab.analysis.diagnose import diagnose
from blocklab.analysis.figures import compare_reports, plot_scalars, write_report
from blocklab.analysis.run import compare_runs, diagnose_run, held_out_windows
from blocklab.analysis.scalars import read_metrics, scalar_series
from blocklab.analysis.stats import (
    importance_entropy,
    normalized_spectrum,
    token_importance,
    token_norms,
    token_similarity,
    value_spectrum,
)

compare = compare_reports  # the short name

__all__ = ["LayerTrace", "compare", "compare_reports", "compare_runs", "diagnose", "diagnose_run",
           "diagnostic_mode", "held_out_windows", "importance_entropy", "normalized_spectrum", "plot_scalars",
           "read_metrics", "scalar_series", "token_importance", "token_norms", "token_similarity", "trace",
           "value_spectrum", "write_report"]
