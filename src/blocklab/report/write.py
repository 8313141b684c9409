"""`write_report`: the comparison report built once as a list of blocks and written as report.md,
report.html and results.json; `summary_table`, what `blocklab compare` prints at the end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from blocklab.report.data import read_run
from blocklab.report.html import render_html
from blocklab.report.markdown import alignments, md_table, render_markdown
from blocklab.report.method import (
    budget_setting,
    eval_facts,
    how_runs_trained,
    method_facts,
    method_items,
    plural,
)
from blocklab.report.plots import report_figures
from blocklab.report.stats import BUSY_CV, architecture_rows, baseline_warnings, load_warnings
from blocklab.report.tables import memory_table, plateau_table, results_table, throughput_table
from blocklab.statistics import verdict
from blocklab.statistics.plateau import LATE_EXIT, NEAR_PLATEAU, PLATEAU_MARGIN
from blocklab.training import TrainConfig
from blocklab.training.config import changed_text
from blocklab.util.errors import ConfigError

CLAIMS_TEXT = ("The papers' claims (blocklab.statistics.claims) whose validation-loss checks these "
               "architectures cover, each check paired by seed; `blocklab reproduce` runs every check, the "
               "exact ones too, at the budget the paper compares at.")


PLATEAU_TEXT = ("A model that knows only how often each token occurs in the training split scores U, the "
                "cross-entropy of the scored held-out tokens under those frequencies (the unigram plateau); "
                "early training sits near U before it uses context. A run still near it, or one that left it "
                "late, compares when it left rather than its architecture, so this table gives each seed's "
                f"first validation step with loss below U - {PLATEAU_MARGIN:g} and how far below U it ended. "
                f"The report warns when a run left after {LATE_EXIT:.0%} of its steps, ended within "
                f"{NEAR_PLATEAU:g} nats of U, or when a difference to the first architecture is no larger "
                "than the spread of its per-seed (paired) differences.")


SWEEP_TEXT = ("Final validation loss of seed 0 at each peak learning rate on the short sweep budget "
              "(lr_sweep.json); each architecture then trained every seed at its chosen rate.")


def _results_text(rows, method) -> str:
    n = rows[0]["seeds"]
    spread_text = (f"Validation loss and bits per byte are the mean ± 1 s.d. over {n} seeds." if n > 1 else
                   "With 1 seed there is no interval: every figure is a single run, and a difference smaller "
                   "than the seed-to-seed spread cannot be told from noise (`--seeds 3` gives paired "
                   "differences with 95% t-intervals; benchmarks/REPRODUCTION.md has them for the main job's "
                   "setting).")
    interleaved = all(r["throughput"]["interleaved"] for r in rows)
    speed = ("tokens/s is the median (and interquartile range) of the training steps timed again after "
             "training, interleaved between architectures (see Throughput)" if interleaved else
             "tokens/s is the median (and interquartile range) over the logged windows of the runs' own step "
             "times, measured one run after another (see Throughput)")
    ev = method["eval"]
    scored = "the whole held-out split" if ev["batches"] is None else (
        f"the first {ev['batches']} batches of {method['batch_size']} windows of {method['seq_len']} tokens "
        f"of the held-out split ("
        + (f"{ev['target_tokens']:,} target tokens" if ev["target_tokens"] else
           f"at most {ev['batches'] * method['batch_size'] * method['seq_len']:,} tokens")
        + "; eval_batches=None scores all of it)")
    return (f"{spread_text} Loss is in nats per token and bits per byte divide the summed loss, in bits, by "
            f"the UTF-8 bytes of the tokens scored, both after the last step on {scored}, the same windows "
            f"for every run. {speed[0].upper() + speed[1:]}. Model memory is parameters + gradients + "
            "optimizer state + one step's activations (see Memory). KV-cache bytes per token are measured "
            "from the model's own cache layout (KVCache.nbytes of one sequence at full context, bf16, "
            "divided by the context length).")


def _throughput_text(method, rows) -> str:
    t = method["timing"]
    first = rows[0]["label"]
    if t and t["rounds"] and all(r["throughput"]["interleaved"] for r in rows):
        how = (f"After all training, each architecture's training step (its model built afresh, the same "
               f"optimizer, precision and batch of {method['batch_size']} x {method['seq_len']} tokens) was "
               f"timed again in {plural(t['rounds'], 'interleaved round')} of {plural(t['steps'], 'step')} "
               "each, after one untimed warm-up step: every architecture in turn within a round, the order "
               "rotated from round to round, so a change in the machine's load hits all of them alike. Step "
               "times are the median, interquartile range (IQR) and min-max of those steps; speed is the "
               f"first architecture's (`{first}`) median step time over each one's, above 1 faster. ")
    else:
        how = "No interleaved timing pass was run (timing_rounds=0), so only the in-training figures exist. "
    return how + (
        "In training, the runs' step times come from their logs (seconds of training between logged rows "
        "over the steps between them, evaluation excluded), one value per logged window of `log_every` "
        f"steps, measured as the runs trained ({how_runs_trained(method)}); the coefficient of variation "
        f"(CV, sd / mean) of each run's windows shows how steady the machine was (a few percent when idle; "
        f"above {BUSY_CV} it was busy).")


def _memory_text(rows) -> str:
    m = rows[0]["memory"]
    cuda = m.get("process_peak_kind") == "cuda-allocated"
    process = ("The last column is CUDA's peak allocated memory over each whole run, as the trainer records "
               "it (summary.json)" if cuda else
               "The last column is the peak resident memory of the whole process over each run "
               "(summary.json): the Python interpreter, torch's libraries and the data, of which the model "
               "is a small part at small sizes, so its differences between architectures are mostly noise")
    if "parameter_bytes" not in m:
        return process + "; no per-model measurement was made (write_report called without compare's)."
    micro = m.get("activation_micro_batch")
    cuda_peak = (" On CUDA, the step-peak column is the allocator's peak during one step above what stays "
                 "resident between steps (torch.cuda.max_memory_allocated)." if m.get("cuda_step_peak_bytes")
                 is not None else "")
    return ("Memory attributed to each model, measured on a freshly built copy after training: parameters "
            "(every parameter once: 4 bytes each in float32), gradients (one per trainable parameter), "
            "optimizer state (the tensors the optimizers keep after a step: AdamW's two moments and step "
            "count, Muon's momentum) and the activations of one training step, measured on every device by "
            "counting the tensors autograd saves for the backward pass of one micro-batch"
            + (f" of {micro} sequences" if micro else "") + " (each storage once, parameters left out)."
            f"{cuda_peak} {process}.")


REPORT_TITLE = "blocklab compare"
RESULTS_FORMAT = "blocklab compare results, version 3"
# what write_report writes into a comparison's folder, and how each shows that blocklab compare wrote it
REPORT_FILES = {"report.md": f"# {REPORT_TITLE}\n", "report.html": f"<h1>{REPORT_TITLE}</h1>",
                "results.json": f'"format": "{RESULTS_FORMAT.rpartition(",")[0]}'}


def check_report_files(out: str | Path, overwrite: bool = False,
                       identity: dict[str, Any] | None = None, settings: bool = True) -> None:
    """Refuse a comparison into `out` when it holds a report.md, report.html or results.json that
    blocklab compare did not write (a user's own, another tool's), or, given this comparison's
    `identity` (`compare.configs.comparison_identity`), the report of another comparison: other
    architectures, or (with `settings`) the same ones with other settings. The report would replace
    them. `overwrite` lets it; the same comparison's report is rewritten (its runs are reused, more
    seeds added)."""
    if overwrite:
        return
    foreign = []
    for name, mark in REPORT_FILES.items():
        path = Path(out) / name
        if path.exists():
            try:
                ours = path.is_file() and mark in path.read_text(encoding="utf-8", errors="replace")[:2000]
            except OSError:
                ours = False
            if not ours:
                foreign.append(name)
    if foreign:
        raise ConfigError(f"--out {out} holds {', '.join(foreign)} that blocklab compare did not write, "
                          "which the report would replace. Choose another --out, or pass --overwrite to "
                          "replace them.")
    differences = _other_comparison(Path(out) / "results.json", identity, settings) if identity else []
    if differences:
        raise ConfigError(f"--out {out} holds the report of another comparison ({'; '.join(differences)}), "
                          "which this one's would replace. Choose another --out, or pass --overwrite to "
                          "replace its report.md, report.html and results.json (the runs under runs/ are "
                          "reused only where their config matches; --fresh retrains them).")


def _other_comparison(results: Path, identity: dict[str, Any], settings: bool) -> list[str]:
    """How the comparison whose results.json is `results` differs from `identity`, in words ([] when it
    is the same, or there is none to read): its architectures, then (with `settings`) the rest. A
    results.json written before the identity was recorded is told by its architectures alone."""
    try:
        data = json.loads(results.read_text(encoding="utf-8"))
        before = data.get("comparison") or {
            "architectures": [a["label"] for a in data["method"]["architectures"]]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    if before["architectures"] != identity["architectures"]:
        return [f"architectures {', '.join(map(str, before['architectures']))}; this one: "
                f"{', '.join(identity['architectures'])}"]
    if not settings or "settings" not in before:
        return []
    changed = changed_text(before["settings"], identity["settings"], most=6)
    said = [changed] if changed else []
    if not changed and before.get("config_sha256") != identity["config_sha256"]:
        said.append("the same shared settings, other model or optimizer fields for some architecture")
    for key, what in (("lr_sweep", "learning-rate sweep"), ("added", "runs added with --add")):
        if before.get(key) != identity[key]:
            said.append(f"{what}: {before.get(key)} -> {identity[key]}")
    return said


def write_report(runs: list[tuple[Any, TrainConfig]], out: Path,
                 sweep: dict[str, dict[float, float]] | None = None, measured: dict[str, Any] | None = None,
                 run_info: dict[str, Any] | None = None) -> Path:
    """`runs` pairs each comparison entry (label, arch) with the TrainConfig of one of its seeds;
    `sweep` is a learning-rate sweep's held-out loss per entry and rate (compare's lr_sweep);
    `measured` the interleaved step times and memory of each entry (`compare.measure_architectures`);
    `run_info` what only compare knows (command, wall time, runs reused, the sweep's rates and steps).
    Writes report.md, report.html, results.json and the figures into `out`; returns report.md."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    entries = list({id(e): e for e, _ in runs}.values())
    runs_by_label: dict[str, list[dict]] = {e.label: [] for e in entries}
    for entry, cfg in runs:
        runs_by_label[entry.label].append(read_run(cfg))
    rows = architecture_rows(entries, runs_by_label, measured)
    first = runs_by_label[entries[0].label]
    trained = how_runs_trained(run_info or {})
    figures = report_figures(entries, runs_by_label, rows, eval_facts(first, first[0]["cfg"]), out, trained)
    method = method_facts(entries, runs_by_label, run_info, measured)  # its wall time includes the figures
    warnings = baseline_warnings(rows) + load_warnings(rows, method["budget"]["kind"], trained)
    ranked = verdict.ranking(entries, runs_by_label, method["size"])
    results = {"format": RESULTS_FORMAT, "method": method, "architectures": rows,
               "verdict": verdict.as_data(ranked), "warnings": warnings,
               "comparison": (run_info or {}).get("comparison")}
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))

    n_seeds = rows[0]["seeds"]
    intro = (f"{plural(len(entries), 'architecture')} trained side by side on one budget "
             f"({method['budget']['text']} each, equal {method['budget']['kind']}), "
             f"{plural(n_seeds, 'seed')} per architecture, size `{method['size']}`, on "
             f"`{method['data']['source']}`. Every run shares the data, tokenizer, batch order and held-out "
             "windows; only the architecture differs. How every number was made is in [Method](#method); "
             "results.json holds the same figures and facts.")
    added = (run_info or {}).get("added") or []
    if added:
        intro += (" Runs trained elsewhere and added with `--add` (same data, tokenizer and held-out "
                  "windows, checked): " + "; ".join(f"`{a['label']}` from `{a['run']}`" for a in added) + ".")
    blocks: list[tuple] = [("p", intro)]
    blocks += verdict_blocks(ranked, entries, runs_by_label, rows, method)
    blocks += [("p", f"**Warning:** {w}") for w in warnings]
    if method["failed"]:
        n = len(method["failed"])
        blocks += [("p", f"**Warning:** {plural(n, 'run')} failed and {'is' if n == 1 else 'are'} left out "
                         "of every table and figure below: see [Failed runs](#failed-runs). Rerunning the "
                         "same command trains them again and reuses the rest.")]
    blocks += [("h2", "Results"), ("p", _results_text(rows, method)), ("table", *results_table(rows))]
    blocks += [("h2", "Leaving the unigram plateau"), ("p", PLATEAU_TEXT), ("table", *plateau_table(rows))]
    blocks += [("h2", "Throughput"), ("p", _throughput_text(method, rows)),
               ("table", *throughput_table(rows))]
    blocks += [("h2", "Memory"), ("p", _memory_text(rows)), ("table", *memory_table(rows))]
    if sweep:
        rates = sorted({r for losses in sweep.values() for r in losses})
        sweep_rows = [[label] + [f"{losses[r]:.4f}" + (" (chosen)" if r == min(losses, key=losses.get)
                                                       else "") for r in rates]
                      for label, losses in sweep.items()]
        blocks += [("h2", "Learning-rate sweep"), ("p", SWEEP_TEXT),
                   ("table", ["architecture"] + [f"lr {r:g}" for r in rates], sweep_rows)]
    if method["failed"]:
        blocks += [("h2", "Failed runs"),
                   ("p", "Each run's log holds its traceback and everything it printed."),
                   ("table", ["run", "architecture", "seed", "error", "log"],
                    [[Path(f["run"]).name, f["label"], str(f["seed"]), f["error"], f"`{f['log']}`"]
                     for f in method["failed"]])]
    blocks += [("h2", "Figures"), ("p", "Written beside this file as PNG and embedded in report.html.")]
    blocks += [("figure", path, alt, caption) for path, alt, caption in figures]
    blocks += [("h2", "Method"), ("p", "Every setting that changes the results, the machine and the software "
                                       "(results.json: \"method\")."), ("ul", method_items(method))]
    title = REPORT_TITLE
    (out / "report.md").write_text(render_markdown(title, blocks))
    (out / "report.html").write_text(render_html(title, blocks))
    return out / "report.md"


def verdict_blocks(ranked: dict[str, Any], entries, runs_by_label, rows: list[dict], method: dict[str, Any]
                   ) -> list[tuple]:
    """The report's opening: the ranked verdict, the claims these runs cover, what is held equal."""
    blocks: list[tuple] = [("h2", "Verdict"), ("p", verdict.verdict_text(ranked)),
                           ("table", verdict.VERDICT_HEAD, verdict.verdict_table(ranked))]
    setting = budget_setting(runs_by_label[entries[0].label][0]["cfg"])
    claims = verdict.claim_rows(entries, runs_by_label, setting)
    if claims:
        blocks += [("p", CLAIMS_TEXT), ("table", verdict.CLAIMS_HEAD, claims)]
    held = verdict.held_equal_text(rows, method["budget"]["kind"])
    return blocks + [("p", "**What is held equal.** " + held)]


def summary_table(out: str | Path) -> str:
    """The report's main table, as markdown, then its verdict with the report's caveats, from the
    results.json that `write_report` wrote in `out`."""
    data = json.loads((Path(out) / "results.json").read_text())
    rows = data["architectures"] if isinstance(data, dict) else data
    head, body = results_table(rows)
    lines = md_table(head, body, alignments(head, body))
    if isinstance(data, dict) and data.get("verdict"):
        lines += [""] + verdict.terminal_lines(data["verdict"])
    if isinstance(data, dict):
        lines += [f"warning: {w}" for w in data.get("warnings", [])]
    return "\n".join(lines)
