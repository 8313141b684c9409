"""The comparison report: a table of measured figures and plots, as markdown and as one HTML file.

Everything in the table is read from the runs (`summary.json`, `metrics.jsonl`) or measured on the
built model (KV-cache bytes from the model's own cache); nothing is assumed.
"""

from __future__ import annotations

import base64
import html
import json
import math
import statistics
from pathlib import Path
from typing import Any

import torch

from blocklab.training import TrainConfig
from blocklab.training.metrics import read_metrics


# -- gathering --------------------------------------------------------------------------------------------
def _load_run(cfg: TrainConfig) -> dict[str, Any]:
    run = Path(cfg.out_dir)
    return {"dir": run, "summary": json.loads((run / "summary.json").read_text()),
            "metrics": read_metrics(run / "metrics.jsonl"),
            "model_config": json.loads((run / "model_config.json").read_text())}


def kv_cache_bytes_per_token(model_cfg: dict[str, Any], dtype: torch.dtype = torch.bfloat16) -> float:
    """Bytes per token of one sequence's KV cache at full context: the model's cache layout
    (`cache_bytes_per_token`, equal to `KVCache.nbytes` of a real cache; tests/test_cache.py),
    built from the value paths on the meta device. NaN for an encoder, which has no cache."""
    from blocklab.config import ModelConfig
    from blocklab.model.cache import cache_bytes_per_token

    cfg = ModelConfig.from_dict(model_cfg)
    if not cfg.causal:
        return float("nan")
    return cache_bytes_per_token(cfg, dtype.itemsize)["per_token"]


def _mean_std(xs: list[float]) -> tuple[float, float]:
    xs = [x for x in xs if x is not None]
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def _rows(entries, runs_by_label) -> list[dict[str, Any]]:
    rows = []
    for entry in entries:
        runs = runs_by_label[entry.label]
        s0 = runs[0]["summary"]
        kv = kv_cache_bytes_per_token(runs[0]["model_config"])
        rows.append({
            "label": entry.label, "arch": entry.arch, "seeds": len(runs), "params": s0["params"],
            "flops_per_token": s0["flops_per_token"], "steps": s0["step"], "tokens": s0["tokens"],
            "tokens_per_s": _mean_std([r["summary"]["tokens_per_s"] for r in runs]),
            "peak_memory_mib": _mean_std([r["summary"]["peak_memory_mib"] for r in runs]),
            "val_loss": _mean_std([r["summary"]["val_loss"] for r in runs]),
            "val_bpb": _mean_std([r["summary"]["val_bpb"] for r in runs]),
            "kv_bytes_per_token": kv, "device": s0["device"],
        })
    return rows


# -- plots -------------------------------------------------------------------------------------------------
def _val_curves(run: dict, x: str) -> tuple[list[float], list[float]]:
    """Validation loss against step, tokens or training wall-clock (evaluation time excluded).

    A validation row carries its own wall_time; runs written before it did are looked up in the
    train row of the same step, which exists only where the step is a multiple of log_every (NaN
    elsewhere, and the point is not drawn).
    """
    train_time = {r["step"]: r.get("wall_time", math.nan) for r in run["metrics"] if r["kind"] == "train"}
    vals = [r for r in run["metrics"] if r["kind"] == "val"]
    if x == "wall_time":
        xs = [r["wall_time"] if "wall_time" in r else train_time.get(r["step"], math.nan) for r in vals]
    else:
        xs = [r[x] for r in vals]
    return xs, [r["val_loss"] for r in vals]


def _ema(values: list[float], beta: float = 0.9) -> list[float]:
    out, avg = [], None
    for v in values:
        avg = v if avg is None else beta * avg + (1 - beta) * v
        out.append(avg)
    return out


def _colour(k: int) -> str:
    """The k-th architecture's colour, the same in every plot (the relative plot leaves out the baseline)."""
    return f"C{k % 10}"


def _plot_validation(entries, runs_by_label, out: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    paths = []
    for x, xlabel in (("step", "step"), ("tokens", "tokens"), ("wall_time", "training wall-clock (s)")):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for k, entry in enumerate(entries):
            curves = [_val_curves(run, x) for run in runs_by_label[entry.label]]
            xs = curves[0][0]
            n = min(len(c[1]) for c in curves)
            ys = [statistics.fmean(c[1][i] for c in curves) for i in range(n)]
            ax.plot(xs[:n], ys, marker="o", markersize=3, label=entry.label, color=_colour(k))
        ax.set_xlabel(xlabel)
        ax.set_ylabel("validation loss (nats/token)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"val_loss_vs_{x}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _plot_relative(entries, runs_by_label, out: Path) -> Path:
    """Smoothed training loss minus the baseline's (the first entry), as in Value Residual Fig. 7."""
    import matplotlib.pyplot as plt

    def curve(label):
        runs = runs_by_label[label]
        per_run = [{r["step"]: r["loss"] for r in run["metrics"] if r["kind"] == "train" and "loss" in r}
                   for run in runs]
        steps = sorted(set.intersection(*(set(p) for p in per_run)))
        return steps, _ema([statistics.fmean(p[s] for p in per_run) for s in steps])

    base_steps, base = curve(entries[0].label)
    base_at = dict(zip(base_steps, base, strict=False))
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for k, entry in enumerate(entries[1:], start=1):
        steps, losses = curve(entry.label)
        pairs = [(s, loss - base_at[s]) for s, loss in zip(steps, losses, strict=False) if s in base_at]
        if pairs:
            ax.plot(*zip(*pairs, strict=False), label=entry.label, color=_colour(k))
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel(f"smoothed training loss - {entries[0].label}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "relative_loss.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_scalars(label: str, run: dict, out: Path) -> Path | None:
    """The learned scalars of the run's seed 0 (blocklab.analysis.plot_scalars: SAS gains per head,
    beta_V / alpha_V, ResFormer lambdas, BoV gamma_v, DenseFormer weights); None when it has none."""
    from blocklab.analysis import plot_scalars, scalar_series

    if not scalar_series(run["metrics"])["panels"]:
        return None
    path = out / f"scalars_{''.join(c if c.isalnum() else '_' for c in label)}.png"
    plot_scalars(run["dir"] / "metrics.jsonl", path, title=f"Learned scalars over training: {label}, seed 0")
    return path


# -- statistics -------------------------------------------------------------------------------------------
def _per_seed_loss(runs: list[dict]) -> dict[int, float]:
    return {r["summary"]["seed"]: r["summary"]["val_loss"] for r in runs}


def _budget_setting(cfg: TrainConfig) -> str | None:
    """The claims' setting this comparison measures: equal FLOPs, or equal steps (and tokens)."""
    if cfg.max_flops is not None:
        return "flops"
    return "steps" if cfg.max_steps is not None or cfg.max_tokens is not None else None


def statistics_rows(entries, runs_by_label) -> list[list[str]]:
    """Each architecture's final validation loss minus the first one's, paired by seed, with its 95%
    t-interval (blocklab.evidence); empty with fewer than two seeds."""
    from blocklab import evidence

    base = _per_seed_loss(runs_by_label[entries[0].label])
    rows = []
    for entry in entries[1:]:
        diffs = evidence.paired_differences(_per_seed_loss(runs_by_label[entry.label]), base)
        if len(diffs) < 2:
            return []
        iv = evidence.t_interval(diffs)
        lower, higher = evidence.verdict(iv, "lower"), evidence.verdict(iv, "higher")
        reading = ("lower" if lower == "reproduced" else "higher" if higher == "reproduced"
                   else f"no clear difference{' (fewer than 3 seeds)' if iv.n < evidence.MIN_SEEDS else ''}")
        rows.append([entry.label, ", ".join(f"{d:+.4f}" for d in diffs), f"{iv.mean:+.4f}",
                     f"[{iv.low:+.4f}, {iv.high:+.4f}]", reading])
    return rows


def claim_rows(entries, runs_by_label, cfg: TrainConfig) -> list[list[str]]:
    """The claims (blocklab.claims) whose validation-loss checks this comparison covers: every check's
    architectures among the entries (by preset name) at this budget kind, with their verdicts."""
    from blocklab import evidence
    from blocklab.claims import CLAIMS

    setting = _budget_setting(cfg)
    by_arch = {e.arch: runs_by_label[e.label] for e in entries if e.label == e.arch}
    rows = []
    for claim in CLAIMS:
        checks = [c for c in claim.checks if c.metric == "val_loss"]
        if not checks or any(c.setting != setting or c.minus_setting or c.baseline not in by_arch
                             or c.arch not in by_arch for c in checks):
            continue
        verdicts = []
        for c in checks:
            iv = evidence.t_interval(evidence.paired_differences(_per_seed_loss(by_arch[c.arch]),
                                                                 _per_seed_loss(by_arch[c.baseline])))
            verdicts.append(evidence.verdict(iv, c.relation, c.tolerance))
            interval = "-" if iv.low is None else f"[{iv.low:+.4f}, {iv.high:+.4f}]"
            expected = c.relation + (f" {c.tolerance:g}" if c.tolerance else "")
            rows.append([claim.id, f"{c.arch} - {c.baseline}", expected, f"{iv.mean:+.4f}", interval,
                         verdicts[-1]])
        others = len(claim.checks) - len(checks)
        if len(checks) > 1 or others:
            rows.append([claim.id, "loss checks together" + (
                f" ({others} other checks: blocklab reproduce)" if others else ""), "", "", "",
                evidence.combine(verdicts)])
    return rows


STATS_HEAD = ["architecture", "val loss - first, per seed", "mean", "95% CI (t)", "reading"]
CLAIMS_HEAD = ["claim", "check", "expected", "mean", "95% CI (t)", "verdict"]


# -- writing ----------------------------------------------------------------------------------------------
def _fmt(mean_std: tuple[float, float], digits: int, seeds: int) -> str:
    mean, std = mean_std
    if math.isnan(mean):
        return "-"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if seeds > 1 else f"{mean:.{digits}f}"


def _table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    head = ["architecture", "params", "embedding + value tables", "non-embedding", "FLOPs/token", "steps",
            "tokens", "tokens/s", "peak memory (MiB)", "val loss", "val bits/byte", "KV cache bytes/token"]
    body = []
    for r in rows:
        p = r["params"]
        kv = "-" if math.isnan(r["kv_bytes_per_token"]) else f"{r['kv_bytes_per_token']:,.0f}"
        lookups = p["embedding"] + p["value_tables"]
        body.append([r["label"], f"{p['total'] / 1e6:.3f}M", f"{lookups / 1e6:.3f}M",
                     f"{p['non_embedding'] / 1e6:.3f}M", f"{r['flops_per_token'] / 1e6:.2f}M",
                     str(r["steps"]), f"{r['tokens']:,}", _fmt(r["tokens_per_s"], 0, r["seeds"]),
                     _fmt(r["peak_memory_mib"], 0, r["seeds"]), _fmt(r["val_loss"], 4, r["seeds"]),
                     _fmt(r["val_bpb"], 4, r["seeds"]), kv])
    return head, body


def md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    esc = [[c.replace("|", "\\|") for c in row] for row in rows]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(r) + " |" for r in esc]


def html_table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{th}</tr>{trs}</table>"


def _sections(entries, runs_by_label, cfg0: TrainConfig, sweep) -> list[tuple[str, str, list, list]]:
    """(title, sentence, head, rows) of the statistics, claims and learning-rate sweep sections."""
    out = []
    stats = statistics_rows(entries, runs_by_label) if len(entries) > 1 else []
    if stats:
        out.append(("Differences to " + entries[0].label,
                    "Final validation loss minus the first architecture's, paired by seed (same batches, "
                    "same held-out windows), with the mean and a 95% Student t-interval (assumes normal, "
                    "independent differences). 'lower'/'higher' only where the interval excludes 0 with 3 "
                    "or more seeds.",
                    STATS_HEAD, stats))
    claims = claim_rows(entries, runs_by_label, cfg0)
    if claims:
        out.append(("Claims these runs test",
                    "The papers' claims (blocklab.claims) whose validation-loss checks these architectures "
                    "and this budget cover; `blocklab reproduce` runs every check, the exact ones too.",
                    CLAIMS_HEAD, claims))
    if sweep:
        rates = sorted({r for losses in sweep.values() for r in losses})
        rows = [[label] + [f"{losses[r]:.4f}" + (" (chosen)" if r == min(losses, key=losses.get) else "")
                           for r in rates] for label, losses in sweep.items()]
        out.append(("Learning-rate sweep",
                    "Final validation loss of seed 0 at each peak learning rate on the short sweep budget "
                    "(lr_sweep.json); each architecture then trained every seed at its chosen rate.",
                    ["architecture"] + [f"lr {r:g}" for r in rates], rows))
    return out


def write_report(runs: list[tuple[Any, TrainConfig]], out: Path,
                 sweep: dict[str, dict[float, float]] | None = None) -> Path:
    """`runs` pairs each comparison entry (label, arch) with the TrainConfig of one of its seeds;
    `sweep` is a learning-rate sweep's held-out loss per entry and rate (compare's lr_sweep)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    entries = list({id(e): e for e, _ in runs}.values())
    runs_by_label: dict[str, list[dict]] = {e.label: [] for e in entries}
    for entry, cfg in runs:
        runs_by_label[entry.label].append(_load_run(cfg))
    configs = [cfg for _, cfg in runs]
    rows = _rows(entries, runs_by_label)
    images = _plot_validation(entries, runs_by_label, out)
    if len(entries) > 1:
        images.append(_plot_relative(entries, runs_by_label, out))
    for entry in entries:
        path = _plot_scalars(entry.label, runs_by_label[entry.label][0], out)  # seed 0
        if path is not None:
            images.append(path)
    (out / "results.json").write_text(json.dumps(rows, indent=2))

    cfg0 = configs[0]
    budget = {k: getattr(cfg0, k) for k in ("max_steps", "max_tokens", "max_flops", "max_time")
              if getattr(cfg0, k) is not None}
    last_val = [r for r in runs_by_label[entries[0].label][0]["metrics"] if r["kind"] == "val"][-1]
    if "val_tokens" in last_val:  # the trainer counts the targets it scored
        count = f"{last_val['val_tokens']:,} target tokens"
    else:
        count = f"at most {(cfg0.eval_batches or 0) * cfg0.batch_size * cfg0.seq_len:,} tokens"
    if cfg0.eval_batches is None:
        scored = "the whole held-out split"
    else:
        scored = (f"the first {cfg0.eval_batches} batches of {cfg0.batch_size} windows of {cfg0.seq_len} "
                  f"tokens of the held-out split ({count}; eval_batches=None scores all of it)")
    intro = (f"Size preset `{cfg0.size}`, data `{cfg0.data.source}` (tokenizer `{cfg0.data.tokenizer}`), "
             f"batch {cfg0.batch_size} x {cfg0.seq_len} tokens, budget {budget}, "
             f"{rows[0]['seeds']} seed(s) per architecture, device {rows[0]['device']}. "
             "Validation loss (nats per token) and bits per byte are scored after the last step on "
             f"{scored}, the same windows for every run; bits per byte divide the summed loss, in bits, "
             "by the UTF-8 bytes of the tokens scored. "
             "Tokens/s and peak memory are measured during training (peak RSS of the process on CPU, "
             "which includes the data; max allocated on CUDA). KV-cache bytes per token are measured from "
             "the model's own cache layout (KVCache.nbytes of one sequence at full context, bf16, divided "
             "by the context length). The learned-scalar plots show seed 0.")
    if rows[0]["seeds"] < 2 and len(entries) > 1:
        intro += (" With one seed there is no interval: a difference smaller than the seed-to-seed spread "
                  "cannot be told from noise. `--seeds 3` gives paired differences with 95% t-intervals; "
                  "benchmarks/REPRODUCTION.md has them for the main job's setting.")
    head, body = _table(rows)
    md = ["# blocklab compare", "", intro, "",
          "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(row) + " |" for row in body]
    sections = _sections(entries, runs_by_label, cfg0, sweep)
    for title, sentence, sec_head, sec_rows in sections:
        md += ["", f"## {title}", "", sentence, ""] + md_table(sec_head, sec_rows)
    md += ["", "Figures are written beside this file:", ""]
    md += [f"![{p.stem}]({p.name})" for p in images]
    (out / "report.md").write_text("\n".join(md) + "\n")

    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body)
    imgs = "".join(f'<figure><img alt="{p.stem}" src="data:image/png;base64,'
                   f'{base64.b64encode(p.read_bytes()).decode()}"><figcaption>{p.stem}</figcaption></figure>'
                   for p in images)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>blocklab compare</title><style>"
            "body{font-family:sans-serif;max-width:1200px;margin:2em auto}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}figure{display:inline-block}"
            f"</style></head><body><h1>blocklab compare</h1><p>{html.escape(intro)}</p>"
            f"<table><tr>{cells}</tr>{trs}</table>"
            + "".join(f"<h2>{html.escape(t)}</h2><p>{html.escape(w)}</p>{html_table(h, r)}"
                      for t, w, h, r in sections)
            + f"{imgs}</body></html>")
    (out / "report.html").write_text(page)
    return out / "report.md"
