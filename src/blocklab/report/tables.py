"""The report's tables as (head, rows) of strings: results, throughput, memory, the unigram plateau."""

from __future__ import annotations

import math
from typing import Any

from blocklab.report.stats import speeds
from blocklab.statistics.plateau import PLATEAU_MARGIN


def _fmt(mean_sd_pair, digits: int) -> str:
    """"6.7647 ± 0.0123" (two or more seeds), "6.7647" (one: no spread), "-" (none)."""
    mean, sd = mean_sd_pair
    if mean is None or math.isnan(mean):
        return "-"
    return f"{mean:.{digits}f}" if sd is None else f"{mean:.{digits}f} ± {sd:.{digits}f}"


def _range(values: list[int]) -> str:
    """"400", or "380-412" where the seeds differ (a wall-clock budget)."""
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.2f}"


def _ms(s: dict[str, Any] | None, key: str) -> str:
    return "-" if s is None else f"{s[key] * 1e3:,.1f}"


def _tokens_cell(t: dict[str, Any] | None) -> str:
    if not t or not t.get("tokens_per_s"):
        return "-"
    tps = t["tokens_per_s"]
    return f"{tps['median']:,.0f} ({tps['q1']:,.0f}-{tps['q3']:,.0f})"


def results_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The main table: one row per architecture (rows of results.json)."""
    interleaved = all((r.get("throughput") or {}).get("interleaved") for r in rows)
    speed = "tokens/s, median (IQR)" + ("" if interleaved else " in training")
    head = ["architecture", "params", "embedding + value tables", "non-embedding", "FLOPs/token", "steps",
            "tokens", speed, "model memory (MiB)", "val loss", "val bits/byte", "KV cache bytes/token"]
    body = []
    for r in rows:
        p = r["params"]
        kv = "-" if math.isnan(r["kv_bytes_per_token"]) else f"{r['kv_bytes_per_token']:,.0f}"
        lookups = p["embedding"] + p["value_tables"]
        tp = r.get("throughput") or {}
        body.append([r["label"], f"{p['total'] / 1e6:.3f}M", f"{lookups / 1e6:.3f}M",
                     f"{p['non_embedding'] / 1e6:.3f}M", f"{r['flops_per_token'] / 1e6:.2f}M",
                     _range(r.get("steps_per_seed") or [r["steps"]]),
                     _range(r.get("tokens_per_seed") or [r["tokens"]]),
                     _tokens_cell(tp.get("interleaved") if interleaved else tp.get("in_training")),
                     _mib((r.get("memory") or {}).get("model_total_bytes")), _fmt(r["val_loss"], 4),
                     _fmt(r["val_bpb"], 4), kv])
    return head, body


def throughput_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Step times in milliseconds: median, interquartile range and min-max of the interleaved pass (when
    there is one) and of the in-training windows, each run's coefficient of variation, and the speed
    relative to the first architecture from each."""
    first = rows[0]["label"]
    interleaved = all(r["throughput"]["interleaved"] for r in rows)
    head = ["architecture"]
    if interleaved:
        head += ["step (ms), median", "IQR (ms)", "min-max (ms)", "tokens/s, median", f"speed vs {first}"]
    head += ["in training: step (ms), median", "in training: IQR (ms)", "in training: CV per run",
             f"in training: speed vs {first}"]
    fast_i, fast_t = speeds(rows, "interleaved") if interleaved else [], speeds(rows, "in_training")
    body = []
    for k, r in enumerate(rows):
        t = r["throughput"]
        cells = [r["label"]]
        if interleaved:
            i = t["interleaved"]
            cells += [_ms(i, "median"), f"{_ms(i, 'q1')}-{_ms(i, 'q3')}", f"{_ms(i, 'min')}-{_ms(i, 'max')}",
                      f"{i['tokens_per_s']['median']:,.0f}", f"{fast_i[k]:.2f}x"]
        tr = t["in_training"]
        resumed = {run: f" (resumed at step {', '.join(map(str, at))})"
                   for run, at in (t.get("resumed") or {}).items()}
        cvs = ", ".join(("-" if cv is None else f"{cv:.2f}") + resumed.get(run, "")
                        for run, cv in (tr or {}).get("cv_per_run", {}).items())
        cells += [_ms(tr, "median"), "-" if tr is None else f"{_ms(tr, 'q1')}-{_ms(tr, 'q3')}", cvs or "-",
                  "-" if fast_t[k] is None else f"{fast_t[k]:.2f}x"]
        body.append(cells)
    return head, body


def memory_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Bytes attributed to each model's training (MiB), and the process's peak as a column of its own."""
    cuda = rows[0]["memory"].get("process_peak_kind") == "cuda-allocated"
    process = ("CUDA peak allocated during the run, process (MiB)" if cuda
               else "process peak RSS during the run (MiB)")
    measured = all("parameter_bytes" in r["memory"] for r in rows)
    head = ["architecture"]
    if measured:
        head += ["parameters (MiB)", "gradients (MiB)", "optimizer state (MiB)",
                 "activations, one step (MiB)", "model total (MiB)"]
        if all(r["memory"].get("cuda_step_peak_bytes") is not None for r in rows):
            head.append("CUDA step peak above resident (MiB)")
    head.append(process)
    body = []
    for r in rows:
        m = r["memory"]
        cells = [r["label"]]
        if measured:
            cells += [_mib(m[k]) for k in ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes",
                                           "activation_bytes", "model_total_bytes")]
            if len(head) > 7:
                cells.append(_mib(m["cuda_step_peak_bytes"]))
        cells.append(_fmt(m["process_peak_mib"], 0))
        body.append(cells)
    return head, body


def plateau_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Per architecture: the unigram plateau U of the scored held-out tokens, the step at which each
    seed left it, its final loss below U and the seed standard deviation of the final loss."""
    head = ["architecture", "unigram plateau U", f"left the plateau (loss < U - {PLATEAU_MARGIN:g}) at step",
            "final loss below U", "seed s.d. of final loss"]
    body = []
    for r in rows:
        health = r["plateau"]
        plateau = next((h["plateau"] for h in health if h["plateau"] is not None), None)
        exits = ", ".join("-" if h["plateau"] is None else "never" if h["exit_step"] is None
                          else f"{h['exit_step']:,}" for h in health)
        below = ", ".join("-" if h["below"] is None else f"{h['below']:.2f}" for h in health)
        sd = r["val_loss"][1]
        body.append([r["label"], "-" if plateau is None else f"{plateau:.3f}", exits, below,
                     "-" if sd is None else f"{sd:.4f}"])
    return head, body
