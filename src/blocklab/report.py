"""The comparison report: a table of measured figures and plots, as markdown and as one HTML file.

Everything in the table is read from the runs (`summary.json`, `metrics.jsonl`) or measured on the
built model (KV-cache bytes from a real cache where the model provides one); nothing is assumed.
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

from blocklab.model import Transformer
from blocklab.training import TrainConfig
from blocklab.training.metrics import read_metrics

PLOT_SCALARS = ("alpha", "beta", "gamma", "mlp_branch", "mlp_skip", "attn_branch", "w_v.skip", "w_v.resid",
                "lambda1", "lambda2", "coef")


# -- gathering --------------------------------------------------------------------------------------------
def _load_run(cfg: TrainConfig) -> dict[str, Any]:
    run = Path(cfg.out_dir)
    return {"summary": json.loads((run / "summary.json").read_text()),
            "metrics": read_metrics(run / "metrics.jsonl"),
            "model_config": json.loads((run / "model_config.json").read_text())}


def kv_cache_bytes_per_token(model_cfg: dict[str, Any], dtype: torch.dtype = torch.bfloat16
                             ) -> tuple[float, str]:
    """Bytes per token of one sequence's KV cache, measured from a real cache when the model has one."""
    from blocklab.config import ModelConfig

    cfg = ModelConfig.from_dict(model_cfg)
    if not cfg.causal:
        return float("nan"), "encoder: no cache"
    model = Transformer(cfg)
    if hasattr(model, "new_cache"):
        length = cfg.context_length
        cache = model.new_cache(1, length, dtype=dtype)
        return cache.nbytes / length, "measured"
    width = torch.finfo(dtype).bits // 8
    total = 0
    for block in model.blocks:
        values = block.attn.values
        total += cfg.kv_dim * width * (values.owns_keys + values.caches_values)
    return total, "analytic"


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
        kv, how = kv_cache_bytes_per_token(runs[0]["model_config"])
        rows.append({
            "label": entry.label, "arch": entry.arch, "seeds": len(runs), "params": s0["params"],
            "flops_per_token": s0["flops_per_token"], "steps": s0["step"], "tokens": s0["tokens"],
            "tokens_per_s": _mean_std([r["summary"]["tokens_per_s"] for r in runs]),
            "peak_memory_mib": _mean_std([r["summary"]["peak_memory_mib"] for r in runs]),
            "val_loss": _mean_std([r["summary"]["val_loss"] for r in runs]),
            "val_bpb": _mean_std([r["summary"]["val_bpb"] for r in runs]),
            "kv_bytes_per_token": kv, "kv_how": how, "device": s0["device"],
        })
    return rows


# -- plots -------------------------------------------------------------------------------------------------
def _val_curves(run: dict, x: str) -> tuple[list[float], list[float]]:
    train_time = {r["step"]: r.get("wall_time", 0.0) for r in run["metrics"] if r["kind"] == "train"}
    vals = [r for r in run["metrics"] if r["kind"] == "val"]
    xs = [r[x] if x != "wall_time" else train_time.get(r["step"], float("nan")) for r in vals]
    return xs, [r["val_loss"] for r in vals]


def _ema(values: list[float], beta: float = 0.9) -> list[float]:
    out, avg = [], None
    for v in values:
        avg = v if avg is None else beta * avg + (1 - beta) * v
        out.append(avg)
    return out


def _plot_validation(entries, runs_by_label, out: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    paths = []
    for x, xlabel in (("step", "step"), ("tokens", "tokens"), ("wall_time", "training wall-clock (s)")):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for entry in entries:
            curves = [_val_curves(run, x) for run in runs_by_label[entry.label]]
            xs = curves[0][0]
            n = min(len(c[1]) for c in curves)
            ys = [statistics.fmean(c[1][i] for c in curves) for i in range(n)]
            ax.plot(xs[:n], ys, marker="o", markersize=3, label=entry.label)
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
    for entry in entries[1:]:
        steps, losses = curve(entry.label)
        pairs = [(s, loss - base_at[s]) for s, loss in zip(steps, losses, strict=False) if s in base_at]
        if pairs:
            ax.plot(*zip(*pairs, strict=False), label=entry.label)
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


def _scalar_kind(name: str) -> str | None:
    for kind in PLOT_SCALARS:
        if name.endswith("." + kind):
            return kind
    return None


def _plot_scalars(label: str, run: dict, out: Path) -> Path | None:
    """Learned scalars (mean over heads) against step, one panel per kind, one line per layer."""
    import matplotlib.pyplot as plt

    rows = [r for r in run["metrics"] if r["kind"] == "train" and r.get("scalars")]
    names = sorted({n for r in rows for n in r["scalars"] if _scalar_kind(n)})
    kinds = sorted({_scalar_kind(n) for n in names}, key=PLOT_SCALARS.index)
    if not kinds:
        return None
    cols = min(3, len(kinds))
    fig, axes = plt.subplots(math.ceil(len(kinds) / cols), cols, figsize=(4.2 * cols, 3.0 *
                             math.ceil(len(kinds) / cols)), squeeze=False)
    for ax, kind in zip(axes.flat, kinds, strict=False):
        for name in (n for n in names if _scalar_kind(n) == kind):
            pts = [(r["step"], statistics.fmean(r["scalars"][name])) for r in rows if name in r["scalars"]]
            layer = name.split(".")[1] if name.startswith("blocks.") else name
            ax.plot(*zip(*pts, strict=True), label=layer)
        ax.set_title(kind, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, title="layer", title_fontsize=6)
    for ax in list(axes.flat)[len(kinds):]:
        ax.axis("off")
    fig.suptitle(f"learned scalars: {label}", fontsize=10)
    fig.tight_layout()
    path = out / f"scalars_{''.join(c if c.isalnum() else '_' for c in label)}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


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
        kv = "-" if math.isnan(r["kv_bytes_per_token"]) else f"{r['kv_bytes_per_token']:,.0f} ({r['kv_how']})"
        lookups = p["embedding"] + p["value_tables"]
        body.append([r["label"], f"{p['total'] / 1e6:.3f}M", f"{lookups / 1e6:.3f}M",
                     f"{p['non_embedding'] / 1e6:.3f}M", f"{r['flops_per_token'] / 1e6:.2f}M",
                     str(r["steps"]), f"{r['tokens']:,}", _fmt(r["tokens_per_s"], 0, r["seeds"]),
                     _fmt(r["peak_memory_mib"], 0, r["seeds"]), _fmt(r["val_loss"], 4, r["seeds"]),
                     _fmt(r["val_bpb"], 4, r["seeds"]), kv])
    return head, body


def write_report(runs: list[tuple[Any, TrainConfig]], out: Path) -> Path:
    """`runs` pairs each comparison entry (label, arch) with the TrainConfig of one of its seeds."""
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
        path = _plot_scalars(entry.label, runs_by_label[entry.label][0], out)
        if path is not None:
            images.append(path)
    (out / "results.json").write_text(json.dumps(rows, indent=2))

    cfg0 = configs[0]
    budget = {k: getattr(cfg0, k) for k in ("max_steps", "max_tokens", "max_flops", "max_time")
              if getattr(cfg0, k) is not None}
    intro = (f"Size preset `{cfg0.size}`, data `{cfg0.data.source}` (tokenizer `{cfg0.data.tokenizer}`), "
             f"batch {cfg0.batch_size} x {cfg0.seq_len} tokens, budget {budget}, "
             f"{rows[0]['seeds']} seed(s) per architecture, device {rows[0]['device']}. "
             "Validation loss and bits per byte are on the held-out files, after the last step. "
             "Tokens/s and peak memory are measured during training (peak RSS of the process on CPU, "
             "which includes the data; max allocated on CUDA). KV-cache bytes per token are for one "
             "sequence in bf16.")
    head, body = _table(rows)
    md = ["# blocklab compare", "", intro, "",
          "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(row) + " |" for row in body]
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
            f"<table><tr>{cells}</tr>{trs}</table>{imgs}</body></html>")
    (out / "report.html").write_text(page)
    return out / "report.md"
