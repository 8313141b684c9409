"""Write what `diagnose` found: diagnostics.json, PNG plots and a markdown summary; overlay two runs.

Plots follow the figures of Value Residual Learning (Fig. 1: entropy per layer; Fig. 2: the first
token's importance, value-state norm and hidden-state norm per layer; Fig. 12: value spectra;
Fig. 18: token similarity; Fig. 19: the same per position) and Simplifying Transformer Blocks
(Figs. 4, 16-19: learned scalars over training), on matplotlib's Agg canvas without pyplot
(`blocklab.util.figures`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from blocklab.analysis.diagnose import FORMAT
from blocklab.analysis.scalars import read_metrics, scalar_series
from blocklab.util.figures import agg_figure

REQUIRED = ("meta", "entropy", "importance", "value_norm", "hidden_norm", "similarity", "spectrum",
            "attention_maps")


# -- helpers ------------------------------------------------------------------------------------------
def _figure(n_panels: int, ncols: int = 3, size: tuple[float, float] = (4.2, 3.2)):
    ncols = max(1, min(ncols, n_panels))
    nrows = math.ceil(n_panels / ncols)
    fig, axes = agg_figure(size[0] * ncols, size[1] * nrows, nrows, ncols, layout="constrained",
                           squeeze=False)
    axes = axes.ravel()
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    return fig, axes[:n_panels]


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=100)
    return path


def _load(results: dict[str, Any] | str | Path) -> dict[str, Any]:
    """A diagnose() result, given as the dict itself, a diagnostics.json or the folder holding one."""
    if isinstance(results, (str, Path)):
        path = Path(results)
        path = path / "diagnostics.json" if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(f"no diagnostics.json at {path}")
        results = json.loads(path.read_text())
    missing = [k for k in REQUIRED if k not in results] if isinstance(results, dict) else list(REQUIRED)
    if missing:
        raise ValueError(f"not a diagnose() result ({FORMAT}): missing {', '.join(missing)}")
    return results


def _layers(results: dict[str, Any]) -> list[int]:
    return list(range(results["meta"]["n_layers"]))


def _per_layer(ax, ylabel: str, title: str) -> None:
    """Label an axis whose x is the layer index: integer ticks, plain y numbers (no offset)."""
    ax.set(xlabel="layer", ylabel=ylabel, title=title)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ax.get_yscale() == "linear":
        ax.ticklabel_format(axis="y", useOffset=False)


# -- single-run plots ---------------------------------------------------------------------------------
def _plot_entropy(r: dict[str, Any], path: Path) -> Path:
    fig, (ax,) = _figure(1, size=(5.5, 3.6))
    layers = _layers(r)
    for layer, heads in zip(layers, r["entropy"]["per_head"], strict=True):
        ax.scatter([layer] * len(heads), heads, s=8, color="0.6")
    ax.plot(layers, r["entropy"]["mean"], "o-", label="mean over heads")
    ax.axhline(r["entropy"]["max"], ls="--", color="0.3", label="log T")
    ax.plot(layers, r["entropy"]["uniform_attention"], ":", color="0.3", label="uniform attention (mask)")
    _per_layer(ax, "entropy of token importance", "Attention concentration (Eq. 11)")
    ax.legend()
    return _save(fig, path)


def _plot_first_token(r: dict[str, Any], path: Path) -> Path:
    fig, axes = _figure(3)
    layers = _layers(r)
    for ax, key, name in zip(axes, ("importance", "value_norm", "hidden_norm"),
                             ("token importance a'", "value-state norm ||v||", "hidden-state norm ||h||"),
                             strict=True):
        ax.plot(layers, r[key]["first_token"], "o-", label="first token")
        ax.plot(layers, r[key]["other_tokens"], "s--", label="mean of the others")
        uniform = r[key].get("uniform_attention")  # absent from diagnostics.json of older versions
        if uniform:
            ax.plot(layers, uniform["first_token"], ":", color="0.3", label="first token, uniform attention")
        ax.set_yscale("log" if key == "importance" else "linear")
        _per_layer(ax, name, name)
        ax.legend()
    fig.suptitle("Sinks, value-state drains, hidden-state peaks (Value Residual Fig. 2)")
    return _save(fig, path)


def _plot_positions(r: dict[str, Any], path: Path) -> Path:
    fig, axes = _figure(3)
    for ax, key, name in zip(axes, ("importance", "value_norm", "hidden_norm"),
                             ("log10 token importance", "value-state norm", "hidden-state norm"),
                             strict=True):
        grid = np.asarray(r[key]["per_position"])
        if key == "importance":
            grid = np.log10(np.clip(grid, 1e-12, None))
        image = ax.imshow(grid, aspect="auto", origin="lower", interpolation="nearest")
        bar = fig.colorbar(image, ax=ax)
        bar.formatter.set_useOffset(False)
        ax.set(xlabel="position", ylabel="layer", title=name)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle("Per position and layer (Value Residual Fig. 19)")
    return _save(fig, path)


def _plot_similarity(r: dict[str, Any], path: Path) -> Path:
    fig, (ax,) = _figure(1, size=(5.5, 3.6))
    ax.plot(_layers(r), r["similarity"], "o-")
    ax.set_ylim(min(0, *r["similarity"]), 1.05)
    _per_layer(ax, "mean pairwise cosine similarity", "Over-smoothing (Eq. 13)")
    return _save(fig, path)


def _plot_spectrum(r: dict[str, Any], path: Path, top: int = 64) -> Path:
    fig, (left, right) = _figure(2, ncols=2)
    spectra = r["spectrum"]["normalized"]
    colors = _layer_colors(len(spectra))
    for layer, (spec, color) in enumerate(zip(spectra, colors, strict=True)):
        spec = np.asarray(spec[:top])
        spec = np.where(spec > 0, spec, np.nan)  # rank-deficient tails (l < d) are not drawn on a log axis
        left.plot(np.arange(1, len(spec) + 1), spec, color=color, label=f"L{layer}")
    left.set(yscale="log", xlabel="eigenvalue rank", ylabel="lambda_j / sum lambda",
             title="Value spectrum per layer (Eq. 12)")
    left.legend(fontsize="small", ncols=2)
    right.plot(_layers(r), r["spectrum"]["max"], "o-")
    _per_layer(right, "largest eigenvalue", "Largest eigenvalue (Fig. 12 right)")
    return _save(fig, path)


def _layer_colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(i / max(1, n - 1)) for i in range(n)]


def _plot_maps(maps: list[dict[str, Any]], kind: str, path: Path) -> Path | None:
    maps = [m for m in maps if m["kind"] == kind]
    if not maps:
        return None
    heads = len({m["head"] for m in maps})
    ncols = heads if heads > 1 else min(4, len(maps))  # one row per layer when there are several heads
    fig, axes = _figure(len(maps), ncols=ncols, size=(3.0, 2.8))
    grids = [np.asarray(m["values"]) for m in maps]
    if kind == "matrix":  # signed entries: one colour scale centred on 0
        bound = max(max(float(np.abs(g).max()) for g in grids), 1e-12)
        scale = dict(cmap="RdBu_r", norm=TwoSlopeNorm(0.0, -bound, bound))
    else:
        scale = dict(cmap="viridis", vmin=0.0, vmax=max(float(g.max()) for g in grids))
    for ax, m, grid in zip(axes, maps, grids, strict=True):
        image = ax.imshow(grid, interpolation="nearest", **scale)
        ax.set(title=f"layer {m['layer']}, head {m['head']}", xlabel="key", ylabel="query")
    fig.colorbar(image, ax=list(axes), shrink=0.8)
    applied = "alpha I + beta A - gamma C" if maps[0]["form"] == "shaped" else "alpha I + beta A"
    title = "softmax attention A" if kind == "softmax" else f"applied matrix {applied}"
    fig.suptitle(f"{title}, mean over sequences")
    return _save(fig, path)


# -- learned scalars ----------------------------------------------------------------------------------
def plot_scalars(metrics_path: str | Path, out_path: str | Path, title: str | None = None) -> dict[str, Any]:
    """Plot every learned scalar of a run against step, one panel per kind, one line per layer
    (per layer and head in the per-head panels).

    Reads the train records of `metrics_path` (metrics.jsonl); returns the series it plotted
    (`scalars.scalar_series`). `title` replaces the figure's title. Raises ValueError when the run
    logged no scalars.
    """
    series = scalar_series(read_metrics(metrics_path))
    panels = series["panels"]
    if not panels:
        raise ValueError(f"{metrics_path} has no train records with learned scalars to plot")
    fig, axes = _figure(len(panels))
    steps = np.asarray(series["steps"])
    for ax, (name, panel) in zip(axes, panels.items(), strict=True):
        colors = _layer_colors(len(panel["lines"]))
        for (label, line), color in zip(panel["lines"].items(), colors, strict=True):
            line = np.asarray(line, dtype=float)
            ax.plot(steps, line, color=color, label=label)
            if label in panel["bands"]:
                band = np.asarray(panel["bands"][label], dtype=float)
                ax.fill_between(steps, line - band, line + band, color=color, alpha=0.2)
        ax.set(title=name, xlabel="step")
        if len(panel["lines"]) <= 12:
            ax.legend(fontsize="small", ncols=2)
    fig.suptitle(title or "Learned scalars over training (Simplifying Figs. 4, 16-19)")
    _save(fig, Path(out_path))
    return series


# -- the report ---------------------------------------------------------------------------------------
def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _summary(r: dict[str, Any], files: list[Path], scalars: dict[str, Any] | None,
             metrics: list[dict[str, Any]] | None) -> str:
    m = r["meta"]
    lines = ["# Diagnostics", "",
             f"{m['n_layers']} layers, {m['n_heads']} heads, attention `{m['attn_matrix']}`, value path "
             f"`{m.get('value_path')}`; {m['sequences']} sequences of {m['seq_len']} tokens. "
             f"Uniform token importance has entropy log T = {_fmt(r['entropy']['max'])}; uniform "
             f"attention under the mask gives {_fmt(min(r['entropy']['uniform_attention']))}.", "",
             "| layer | entropy (Eq. 11) | similarity (Eq. 13) | importance 1st / others | "
             "||v|| 1st / others | ||h|| 1st / others | max eigenvalue (Eq. 12) |",
             "|---|---|---|---|---|---|---|"]
    for i in _layers(r):
        pairs = [f"{_fmt(r[k]['first_token'][i])} / {_fmt(r[k]['other_tokens'][i])}"
                 for k in ("importance", "value_norm", "hidden_norm")]
        lines.append(f"| {i} | {_fmt(r['entropy']['mean'][i])} | {_fmt(r['similarity'][i])} | "
                     + " | ".join(pairs) + f" | {_fmt(r['spectrum']['max'][i])} |")
    if metrics:
        train = [x for x in metrics if x.get("kind") == "train" and "loss" in x]
        val = [x for x in metrics if x.get("kind") == "val" and "val_loss" in x]
        lines += ["", "## Run"]
        if train:
            lines.append(f"- last train loss {_fmt(train[-1]['loss'])} at step {train[-1]['step']}")
        if val:
            lines.append(f"- last val loss {_fmt(val[-1]['val_loss'])} at step {val[-1]['step']}")
    if scalars:
        lines += ["", f"## Learned scalars at step {scalars['steps'][-1]}", ""]
        for title, panel in scalars["panels"].items():
            last = ", ".join(f"{label} {_fmt(line[-1])}" for label, line in panel["lines"].items())
            lines.append(f"- {title}: {last}")
    lines += ["", "## Files", ""] + [f"- `{f.name}`" for f in files]
    if r.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in r["notes"]]
    return "\n".join(lines) + "\n"


def write_report(results: dict[str, Any] | str | Path, out_dir: str | Path,
                 metrics_path: str | Path | None = None) -> list[Path]:
    """Write diagnostics.json, the plots and summary.md into `out_dir`; returns the files written.

    With `metrics_path` (a run's metrics.jsonl) the learned scalars are plotted too (scalars.png)
    and the last losses go into the summary.
    """
    r = _load(results)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "diagnostics.json").write_text(json.dumps(r))
    files = [out / "diagnostics.json",
             _plot_entropy(r, out / "entropy.png"),
             _plot_first_token(r, out / "first_token.png"),
             _plot_positions(r, out / "positions.png"),
             _plot_similarity(r, out / "similarity.png"),
             _plot_spectrum(r, out / "spectrum.png")]
    files += [p for p in (_plot_maps(r["attention_maps"], "softmax", out / "attention_softmax.png"),
                          _plot_maps(r["attention_maps"], "matrix", out / "attention_matrix.png")) if p]
    scalars = metrics = None
    if metrics_path is not None:
        metrics = read_metrics(metrics_path)
        if scalar_series(metrics)["panels"]:
            scalars = plot_scalars(metrics_path, out / "scalars.png")
            files.append(out / "scalars.png")
    (out / "summary.md").write_text(_summary(r, files, scalars, metrics))
    return files + [out / "summary.md"]


# -- two runs -----------------------------------------------------------------------------------------
COMPARED = {"entropy": ("entropy of token importance (Eq. 11)", lambda r: r["entropy"]["mean"]),
            "similarity": ("hidden-state similarity (Eq. 13)", lambda r: r["similarity"]),
            "importance_first": ("first-token importance", lambda r: r["importance"]["first_token"]),
            "value_norm_first": ("first-token value norm", lambda r: r["value_norm"]["first_token"]),
            "hidden_norm_first": ("first-token hidden norm", lambda r: r["hidden_norm"]["first_token"]),
            "max_eigenvalue": ("largest value eigenvalue (Eq. 12)", lambda r: r["spectrum"]["max"])}
OTHERS = {"value_norm_first": lambda r: r["value_norm"]["other_tokens"],
          "hidden_norm_first": lambda r: r["hidden_norm"]["other_tokens"],
          "importance_first": lambda r: r["importance"]["other_tokens"]}


def compare_reports(results_a: dict[str, Any] | str | Path, results_b: dict[str, Any] | str | Path,
                    out_dir: str | Path, labels: tuple[str, str] = ("A", "B")) -> list[Path]:
    """Overlay two diagnose() results per layer, as Value Residual Fig. 1 (right) and Fig. 2 do.

    Each result is a dict, a diagnostics.json or a folder holding one; both must be diagnosed on
    the same sequence length (ValueError otherwise). Writes compare.png (entropy with log T and each
    run's uniform-attention entropy, similarity, the first token's importance and norms with the
    other tokens' mean dashed, the largest eigenvalue), compare.json (the series) and compare.md (a
    table); returns the files.
    """
    runs = [_load(results_a), _load(results_b)]
    if len(labels) != 2:
        raise ValueError(f"labels must name the two runs; got {labels!r}")
    lengths = [run["meta"]["seq_len"] for run in runs]
    if lengths[0] != lengths[1]:  # entropy (max log T), importance and similarity all depend on T
        raise ValueError(f"cannot overlay runs diagnosed on different sequence lengths ({lengths[0]} and "
                         f"{lengths[1]} tokens): entropy, importance and similarity depend on T")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig, axes = _figure(len(COMPARED))
    for ax, (key, (title, get)) in zip(axes, COMPARED.items(), strict=True):
        for run, label, color in zip(runs, labels, ("C0", "C3"), strict=True):
            ax.plot(_layers(run), get(run), "o-", color=color, label=label)
            if key in OTHERS:
                ax.plot(_layers(run), OTHERS[key](run), "s--", color=color, alpha=0.6,
                        label=f"{label}, other tokens")
            if key == "entropy":  # the reference: uniform attention under this run's masks
                ax.plot(_layers(run), run["entropy"]["uniform_attention"], ":", color=color,
                        label=f"{label}, uniform attention")
        if key == "entropy":
            ax.axhline(runs[0]["entropy"]["max"], ls="--", color="0.3", label="log T")
        ax.set_yscale("log" if key == "importance_first" else "linear")
        _per_layer(ax, "", title)
        ax.legend(fontsize="small")
    fig.suptitle(f"{labels[0]} vs {labels[1]}")
    files = [_save(fig, out / "compare.png")]
    series = {label: {key: get(run) for key, (_, get) in COMPARED.items()}
              for run, label in zip(runs, labels, strict=True)}
    (out / "compare.json").write_text(json.dumps({"labels": list(labels), "series": series}))
    table = [f"# {labels[0]} vs {labels[1]}", "", "| statistic | layer | " + " | ".join(labels) + " |",
             "|---|---|---|---|"]
    for key, (title, _) in COMPARED.items():
        depth = max(len(s[key]) for s in series.values())
        for i in range(depth):
            cells = [_fmt(s[key][i]) if i < len(s[key]) else "" for s in series.values()]
            table.append(f"| {title} | {i} | " + " | ".join(cells) + " |")
    (out / "compare.md").write_text("\n".join(table) + "\n")
    return files + [out / "compare.json", out / "compare.md"]
