"""The comparison report: how the numbers were made, what they are and how sure they are, as markdown
(report.md), one self-contained HTML page (report.html) and JSON (results.json).

Everything is read from the runs (`config.yaml` through the TrainConfig, `model_config.json`,
`summary.json`, `metrics.jsonl`) or measured: KV-cache bytes from the model's own cache layout, and,
when `blocklab compare` passes them (`measured`), each architecture's training-step times from an
interleaved timing pass after training and the memory its training takes (parameters, gradients,
optimizer state, activations). Nothing is assumed. Also the parameter and FLOPs table of presets that
`blocklab params` prints.

The report is built once as a list of blocks (headings, paragraphs, lists, tables, figures) and
rendered twice, so the markdown and the HTML say the same; the HTML renders the small markdown subset
the paragraphs use (inline code, bold, links) itself.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import platform
import re
import statistics
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from blocklab import verdict
from blocklab.analysis.plateau import LATE_EXIT, NEAR_PLATEAU, PLATEAU_MARGIN, run_health, spread_warnings
from blocklab.training import TrainConfig
from blocklab.training.config import BUDGETS
from blocklab.training.metrics import read_metrics

# When the architectures' speed ratios measured during training (one run after another) and in the
# interleaved timing pass differ by more than this fraction, the machine's load changed between runs
# and the report says so.
LOAD_DISAGREEMENT = 0.15
# A coefficient of variation of step times above this, within one run or in the timing pass, says the
# machine was busy while it was measured (on an idle machine it is a few percent).
BUSY_CV = 0.25


# -- gathering --------------------------------------------------------------------------------------------
def _load_run(cfg: TrainConfig) -> dict[str, Any]:
    run = Path(cfg.out_dir)
    return {"dir": run, "cfg": cfg, "summary": json.loads((run / "summary.json").read_text()),
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


def mean_sd(xs: list[float | None]) -> tuple[float, float | None]:
    """(mean, sample standard deviation) of the values given; the deviation is None for one value,
    which has no spread, and both are NaN for none."""
    given = [x for x in xs if x is not None]
    if not given:
        return float("nan"), None
    return statistics.fmean(given), (statistics.stdev(given) if len(given) > 1 else None)


def spread(xs: list[float]) -> dict[str, Any] | None:
    """Median, quartiles, min, max, count and coefficient of variation (sd / mean) of `xs`."""
    xs = sorted(x for x in xs if x is not None and math.isfinite(x))
    if not xs:
        return None
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else (xs[0],) * 3
    mean = statistics.fmean(xs)
    cv = statistics.stdev(xs) / mean if len(xs) > 1 and mean > 0 else None
    return {"median": statistics.median(xs), "q1": q1, "q3": q3, "min": xs[0], "max": xs[-1],
            "n": len(xs), "cv": cv}


def training_step_times(metrics: list[dict[str, Any]]) -> list[float]:
    """Seconds per step during training, one value per logged window of `log_every` steps: the
    difference of the training clock (`wall_time`, steps only: evaluation and checkpoints excluded)
    between consecutive train rows over the steps between them. The first window, which holds the
    first step's one-off allocations (and a compile), is left out when three or more remain."""
    rows = [r for r in metrics if r.get("kind") == "train" and r.get("wall_time") is not None]
    times, prev_step, prev_time = [], 0, 0.0
    for r in rows:
        if r["step"] > prev_step:
            times.append((r["wall_time"] - prev_time) / (r["step"] - prev_step))
        prev_step, prev_time = r["step"], r["wall_time"]
    return times[1:] if len(times) >= 4 else times


def _throughput(runs: list[dict], measured: dict[str, Any] | None, tokens_per_step: int) -> dict[str, Any]:
    """The speed figures of one architecture: the interleaved pass's step times (None without one), the
    in-training step times of every seed pooled, each run's coefficient of variation, and the mean of
    the runs' own tokens/s (summary.json)."""
    per_run = [training_step_times(r["metrics"]) for r in runs]
    in_training = spread([t for times in per_run for t in times])
    if in_training is not None:
        in_training["tokens_per_s"] = spread([tokens_per_step / t for times in per_run for t in times
                                              if t > 0])
        in_training["cv_per_run"] = {f"seed {r['summary']['seed']}": (spread(t) or {}).get("cv")
                                     for r, t in zip(runs, per_run, strict=True)}
    timed = (measured or {}).get("step_s") or []
    interleaved = spread(timed)
    if interleaved is not None:
        interleaved["tokens_per_s"] = spread([tokens_per_step / t for t in timed if t > 0])
    # a resumed run's summary tokens/s mixes the load of its starts: kept, and marked as such
    resumed = {f"seed {r['summary']['seed']}": r["summary"]["resumed_at"] for r in runs
               if r["summary"].get("resumed_at")}
    return {"tokens_per_step": tokens_per_step, "interleaved": interleaved, "in_training": in_training,
            "tokens_per_s_summary": list(mean_sd([r["summary"].get("tokens_per_s") for r in runs])),
            "resumed": resumed}


def _rows(entries, runs_by_label, measured: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    archs = (measured or {}).get("architectures", {})
    rows = []
    for entry in entries:
        runs = runs_by_label[entry.label]
        s0, cfg = runs[0]["summary"], runs[0]["cfg"]
        memory = dict(archs.get(entry.label, {}).get("memory") or {})
        memory["process_peak_mib"] = list(mean_sd([r["summary"].get("peak_memory_mib") for r in runs]))
        memory["process_peak_kind"] = "cuda-allocated" if str(s0["device"]).startswith("cuda") else "rss"
        rows.append({
            "label": entry.label, "arch": entry.arch, "seeds": len(runs), "lr": cfg.optim.lr,
            "params": s0["params"], "flops_per_token": s0["flops_per_token"], "steps": s0["step"],
            "tokens": s0["tokens"],
            "steps_per_seed": [r["summary"]["step"] for r in runs],
            "tokens_per_seed": [r["summary"]["tokens"] for r in runs],
            "val_loss": list(mean_sd([r["summary"]["val_loss"] for r in runs])),
            "val_bpb": list(mean_sd([r["summary"]["val_bpb"] for r in runs])),
            "throughput": _throughput(runs, archs.get(entry.label), cfg.batch_size * cfg.seq_len),
            "memory": memory,
            "kv_bytes_per_token": kv_cache_bytes_per_token(runs[0]["model_config"]), "device": s0["device"],
            "plateau": [{"seed": r["summary"]["seed"], "final": r["summary"]["val_loss"], **run_health(
                [(m["step"], m["val_loss"]) for m in r["metrics"] if m["kind"] == "val"],
                r["summary"].get("unigram_loss"), r["summary"]["step"])} for r in runs],
        })
    return rows


# -- the method: every setting that changes results, the machine, the software ----------------------------
def git_commit(where: str | Path | None = None) -> tuple[str | None, bool | None]:
    """(short commit, uncommitted changes?) of the git checkout holding `where` (default: blocklab's own
    source, the code that made the numbers); (None, None) outside a checkout, for an installed package,
    or without git. Read-only: optional index locks are off, so nothing in the checkout changes."""
    where = Path(where) if where is not None else Path(__file__).resolve().parent
    if {"site-packages", "dist-packages"} & set(where.parts):
        return None, None
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10,
                              check=True, env=env).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError, ValueError):
        return None, None
    return (commit, dirty) if commit else (None, None)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def environment(device: str = "cpu") -> dict[str, Any]:
    """The machine and software the report was made on: CPU model, logical cores (and those this process
    may use), torch's default CPU threads, the GPU of a CUDA `device`, Python, torch and blocklab
    versions, blocklab's git commit and the date (UTC)."""
    import blocklab

    commit, dirty = git_commit()
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    gpu = None
    if device.startswith("cuda") and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(torch.device(device))
    return {"cpu": _cpu_model(), "logical_cores": os.cpu_count(), "usable_cores": usable,
            "torch_threads_default": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "gpu": gpu,
            "os": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "blocklab": blocklab.__version__, "commit": commit, "commit_dirty": dirty,
            "date_utc": utc_now()}


def utc_now() -> str:
    """The time now in UTC, as "2026-05-09 07:35:25 UTC"."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _sci(value: float) -> str:
    """2.0e12, not 2.0e+12."""
    mantissa, _, exponent = f"{value:.1e}".partition("e")
    return f"{mantissa}e{int(exponent)}"


def budget_text(cfg: TrainConfig) -> str:
    """The budget in words: "400 steps", "819,200 tokens", "2.0e12 FLOPs", "300 s of training"."""
    words = {"max_steps": lambda v: f"{v:,} steps", "max_tokens": lambda v: f"{v:,} tokens",
             "max_flops": lambda v: f"{_sci(v)} FLOPs", "max_time": lambda v: f"{v:g} s of training"}
    return " or ".join(words[name](value) for name, value in cfg.budgets().items()) or "none"


def _budget_kind(cfg: TrainConfig) -> str:
    kinds = [kind for kind, name in BUDGETS.items() if getattr(cfg, name) is not None]
    return kinds[0] if len(kinds) == 1 else "+".join(kinds)


def _shape(mc: dict[str, Any]) -> str:
    """A model's resolved shape from its model_config.json, in words."""
    head_dim = mc.get("head_dim") or mc["d_model"] // mc["n_heads"]
    kv = f" ({mc['n_kv_heads']} KV heads)" if mc.get("n_kv_heads") else ""
    window = f", window {mc['window_size']} ({mc['window_pattern']})" if mc.get("window_size") else ""
    return (f"{mc['n_layers']} layers, d_model {mc['d_model']}, {mc['n_heads']} heads of {head_dim}{kv}, "
            f"MLP {mc['mlp_hidden']} ({mc['mlp_act']}), {mc['norm']}, {mc['positions']} positions, "
            f"context {mc['context_length']}{window}, vocab {mc['vocab_size']}, "
            f"{'tied' if mc.get('tie_embeddings') else 'untied'} embeddings")


def _schedule_text(cfg: TrainConfig) -> str:
    from blocklab.training.schedules import FINAL_LR_FRACTION

    o = cfg.optim
    final = o.final_lr_fraction if o.final_lr_fraction is not None else FINAL_LR_FRACTION[o.schedule]
    to = "to 0" if final == 0 else f"to {final:g} x the peak"
    if o.schedule == "one-cycle":
        return f"one-cycle: linear rise to the peak at {o.peak_at:.0%} of the budget, then linear decay {to}"
    if o.warmup_steps is not None and cfg.max_steps is not None:
        warm = f"linear warmup over {o.warmup_steps:,} steps"
    else:
        warm = f"linear warmup over {o.warmup_fraction:.0%} of the budget"
    body = {"linear": f"then linear decay {to}", "cosine": f"then cosine decay {to}",
            "wsd": f"then constant, and a linear warmdown over the last {o.warmdown_fraction:.0%} of the "
                   f"budget {to}",
            "constant": "then constant"}[o.schedule]
    return f"{o.schedule}: {warm}, {body}"


def optimizer_text(cfg: TrainConfig) -> str:
    o = cfg.optim
    decayed = ["matrices"] + (["embeddings"] if o.decay_embeddings else []) + (
        ["value tables"] if o.decay_value_tables else [])
    adamw = (f"AdamW (betas {o.betas[0]:g}, {o.betas[1]:g}; eps {o.eps:g}; decoupled weight decay "
             f"{o.weight_decay:g} on {', '.join(decayed)}, none on gains, norms and biases)")
    groups = [f"{name} {value:g}" for name, value in (("embeddings", o.lr_embeddings), ("head", o.lr_head),
                                                      ("value tables", o.lr_value_tables),
                                                      ("gains", o.lr_scalars)) if value is not None]
    if groups:
        adamw += f", own learning rates for {', '.join(groups)}"
    if o.name == "muon":
        wd = o.muon_weight_decay if o.muon_weight_decay is not None else o.weight_decay
        return (f"Muon for the block matrices (lr {o.muon_lr:g}, momentum {o.muon_momentum:g}, Nesterov, "
                f"weight decay {wd:g}, adjust_lr {o.muon_adjust_lr}) and {adamw} for the rest")
    return adamw


def follows_recipe(arch: str, cfg: TrainConfig) -> bool:
    """Whether the run's optimiser settings are the main job's recipe for its architecture and size."""
    from blocklab.recipes import recipe_optim

    recipe = recipe_optim(arch, cfg.size)
    return bool(recipe) and all(getattr(cfg.optim, k) == v for k, v in recipe.items())


def _precision_text(cfg: TrainConfig, device: str) -> str:
    if cfg.precision == "bfloat16" or (cfg.precision == "auto" and device.startswith("cuda")
                                       and torch.cuda.is_available() and torch.cuda.is_bf16_supported()):
        return f"bfloat16 autocast, float32 weights and optimizer state (precision={cfg.precision})"
    return f"float32 (precision={cfg.precision}{' on the CPU' if cfg.precision == 'auto' else ''})"


def _eval_facts(runs: list[dict], cfg: TrainConfig) -> dict[str, Any]:
    vals = [r for r in runs[0]["metrics"] if r["kind"] == "val"]
    steps = sorted({r["step"] for r in vals})
    return {"every": cfg.eval_every, "batches": cfg.eval_batches,
            "target_tokens": vals[-1].get("val_tokens") if vals else None,
            "first_step": steps[0] if steps else None,
            "step0": all(any(v["kind"] == "val" and v["step"] == 0 for v in run["metrics"])
                         for run in runs)}


def method_facts(entries, runs_by_label, run_info: dict[str, Any] | None = None,
                 measured: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every setting that changes the results, the machine, the software and how this report came to
    be (`run_info`: command, wall time, runs reused, lr sweep; from compare), as plain data: the
    "method" of results.json and the Method section of the report."""
    run_info = run_info or {}
    first = runs_by_label[entries[0].label]
    cfg, device = first[0]["cfg"], str(first[0]["summary"]["device"])
    all_runs = [run for e in entries for run in runs_by_label[e.label]]
    shapes: dict[str, list[str]] = {}
    for e in entries:
        shapes.setdefault(_shape(runs_by_label[e.label][0]["model_config"]), []).append(e.label)
    env = environment(device)
    return {
        "architectures": [{"label": e.label, "arch": e.arch, "lr": runs_by_label[e.label][0]["cfg"].optim.lr,
                           "recipe": follows_recipe(e.arch, runs_by_label[e.label][0]["cfg"])}
                          for e in entries],
        "size": cfg.size, "model_shapes": [{"shape": k, "architectures": v} for k, v in shapes.items()],
        "batch_size": cfg.batch_size, "seq_len": cfg.seq_len, "grad_accum": cfg.grad_accum,
        "tokens_per_step": cfg.batch_size * cfg.seq_len,
        "budget": {"kind": _budget_kind(cfg), **cfg.budgets(), "text": budget_text(cfg)},
        "optimizer": {"text": optimizer_text(cfg), **cfg.optim.to_dict()},
        "lr_sweep": run_info.get("lr_sweep"), "schedule": _schedule_text(cfg),
        "weight_decay": cfg.optim.weight_decay, "grad_clip": cfg.optim.grad_clip or None,
        "precision": _precision_text(cfg, device), "device": device,
        "data": {"source": cfg.data.source, "objective": cfg.data.objective,
                 "mask_prob": cfg.data.mask_prob if cfg.data.objective == "mlm" else None,
                 "val_fraction": cfg.data.val_fraction, "tokenizer": cfg.data.tokenizer,
                 "vocab_size": first[0]["model_config"]["vocab_size"]},
        "eval": _eval_facts(first, cfg),
        "seeds": sorted({run["summary"]["seed"] for run in first}),
        "threads": cfg.threads, "compile": cfg.compile,
        "machine": {k: env[k] for k in ("cpu", "logical_cores", "usable_cores", "torch_threads_default",
                                        "omp_num_threads", "gpu", "os")},
        "software": {k: env[k] for k in ("python", "torch", "blocklab")},
        "commit": env["commit"], "commit_dirty": env["commit_dirty"], "date_utc": env["date_utc"],
        "started_utc": run_info.get("started_utc"), "command": run_info.get("command", "python API"),
        "wall_time_s": (time.perf_counter() - run_info["started_perf"] if "started_perf" in run_info
                        else run_info.get("wall_time_s")),
        "training_time_s": sum(run["summary"].get("train_time") or 0.0 for run in all_runs),
        "runs": len(all_runs), "runs_reused": run_info.get("runs_reused"),
        "launch": run_info.get("launch"), "failed": run_info.get("failed") or [],
        "timing": None if measured is None else {k: measured.get(k) for k in ("rounds", "steps", "order",
                                                                             "seconds")},
    }


def how_runs_trained(method: dict[str, Any]) -> str:
    """"one after another", or how many trained at once (compare's launch)."""
    launch = method.get("launch") or {}
    jobs = launch.get("jobs") or 1
    if launch.get("launcher", "local") != "local":
        return f"as {launch['launcher']} jobs, several at once"
    return "one after another" if jobs == 1 else f"{jobs} at a time, side by side"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "not recorded (write_report called without compare)"
    from blocklab.training.loop import format_duration

    return format_duration(seconds)


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def method_items(m: dict[str, Any]) -> list[str]:
    """The Method section, one markdown list item per fact."""
    archs = ", ".join(f"`{a['label']}`" + (f" (`{a['arch']}`)" if a["arch"] != a["label"] else "")
                      for a in m["architectures"])
    shapes = "; ".join(s["shape"] + ("" if len(m["model_shapes"]) == 1 else
                                     f" ({', '.join(s['architectures'])})") for s in m["model_shapes"])
    rates = {a["lr"] for a in m["architectures"]}
    if len(rates) == 1:
        lr = f"{rates.pop():g} for every architecture"
    else:
        lr = ", ".join(f"{a['label']} {a['lr']:g}" for a in m["architectures"])
    if m["lr_sweep"]:
        sweep = m["lr_sweep"]
        lr += (f", each chosen by a learning-rate sweep over {', '.join(f'{r:g}' for r in sweep['rates'])} "
               f"(seed 0, {sweep['steps']} steps; see the sweep section)")
    elif all(a.get("recipe") for a in m["architectures"]):
        lr += (" (the main job's recipe for this size and architecture, recipes/main_job_optim.json; "
               "not swept)")
    else:
        lr += " (given, not swept)"
    data, ev = m["data"], m["eval"]
    objective = ("next-token prediction" if data["objective"] == "clm"
                 else f"masked-token prediction ({data['mask_prob']:g} of the tokens masked)")
    scored = "the whole held-out split" if ev["batches"] is None else (
        f"the first {ev['batches']} batches of the held-out split"
        + (f" ({ev['target_tokens']:,} target tokens)" if ev["target_tokens"] else ""))
    cadence = f"every {ev['every']} steps and after the last" if ev["every"] else "after the last step only"
    step0 = ("a step-0 evaluation is logged" if ev["step0"] else
             f"no step-0 evaluation is logged, the first is at step {ev['first_step']}")
    seeds = m["seeds"]
    seed_text = plural(len(seeds), "seed") + f" per architecture ({', '.join(map(str, seeds))}); " + (
        "figures with ± give the mean ± 1 s.d. over seeds" if len(seeds) > 1 else
        "one seed has no interval: each figure is a single measurement")
    mach = m["machine"]
    cores = f"{mach['logical_cores']} logical cores" + (
        f" ({mach['usable_cores']} usable by this process)" if mach["usable_cores"] not in (None,
                                                                                      mach["logical_cores"])
        else "")
    threads = (f"threads={m['threads']} per run" if m["threads"] else
               f"torch's default of {mach['torch_threads_default']} threads"
               + (f" (OMP_NUM_THREADS={mach['omp_num_threads']})" if mach["omp_num_threads"] else ""))
    commit = ("not a git checkout (an installed package), so no commit" if m["commit"] is None else
              f"`{m['commit']}`" + (" with uncommitted changes" if m["commit_dirty"] else ""))
    sw = m["software"]
    timing = m["timing"]
    if timing and timing["rounds"]:
        timing_text = (f"; the timing pass ({plural(timing['rounds'], 'interleaved round')} x "
                       f"{plural(timing['steps'], 'step')} per architecture) and memory measurement after "
                       f"training took {_duration(timing.get('seconds'))}")
    else:
        timing_text = "; no interleaved timing pass"
    launch = m.get("launch")
    if launch and (launch["jobs"] > 1 or launch["launcher"] != "local"):
        threads = f"the runs trained {how_runs_trained(m)}" + (
            f", {plural(launch['threads'], 'thread')} each" if launch.get("threads") else "")
    reused = (f", {m['runs_reused']} of the {m['runs']} runs reused from an earlier invocation (their "
              "training time is not in it)" if m.get("runs_reused") else "")
    return [
        f"**Architectures:** {archs}.",
        f"**Model:** size `{m['size']}`, resolved (model_config.json): {shapes}.",
        f"**Batch:** {m['batch_size']} sequences x {m['seq_len']} tokens = {m['tokens_per_step']:,} tokens "
        f"per step" + (f" (in {m['grad_accum']} accumulation steps)" if m["grad_accum"] > 1 else "") + ".",
        f"**Budget:** equal {m['budget']['kind']}, {m['budget']['text']} per run.",
        f"**Optimizer:** {m['optimizer']['text']}.",
        f"**Peak learning rate:** {lr}.",
        f"**Schedule:** {m['schedule']}.",
        f"**Weight decay:** {m['weight_decay']:g}. **Gradient clipping:** "
        + (f"global norm {m['grad_clip']:g}." if m["grad_clip"] else "none."),
        f"**Precision:** {m['precision']}; device `{m['device']}`" + (", blocks compiled." if m["compile"]
                                                                      else "."),
        f"**Data:** `{data['source']}`, {objective}, {data['val_fraction']:.0%} of the documents held out.",
        f"**Tokenizer:** `{data['tokenizer']}`, vocabulary {data['vocab_size']:,}.",
        f"**Evaluation:** {cadence}, on {scored}, the same windows for every run; {step0}.",
        f"**Seeds:** {seed_text}.",
        f"**Machine:** {mach['cpu']}, {cores}, {threads}; GPU: {mach['gpu'] or 'none'}; {mach['os']}.",
        f"**Software:** Python {sw['python']}, torch {sw['torch']}, blocklab {sw['blocklab']}; "
        f"commit {commit}.",
        f"**Date:** report written {m['date_utc']}" + (f", compare started {m['started_utc']}"
                                                      if m.get("started_utc") else "") + ".",
        f"**Command:** `{m['command'].replace('`', chr(39))}`.",
        f"**Wall time:** {_duration(m['wall_time_s'])} for the whole compare (up to this report's "
        f"figures){reused}; the runs' training "
        f"steps took {_duration(m['training_time_s'])} in all{timing_text}.",
    ]


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


VAL_PLOTS = (("step", "step"), ("tokens", "tokens"), ("wall_time", "training wall-clock (s)"))
WALL_FROM_TIMING = "training time at the interleaved speed (s): step x median step time"
WALL_FROM_LOGS_WARNING = ("from the runs' own logs, trained {trained}: a change in the machine's load "
                          "between runs shifts this axis")


def wall_clock_source(rows: list[dict], budget_kind: str) -> str | None:
    """Where the wall-clock figure's axis comes from: "interleaved" (each architecture's steps at its
    median step time in the interleaved timing pass, which every load change hits alike), "logs" (the
    runs' own clocks, drawn with a warning on the figure: no timing pass, or a wall-clock budget, whose
    runs' clocks are the budget itself), or None to leave the figure out (the timing pass, or the runs
    without one, saw step times too uneven to mean anything: coefficient of variation above BUSY_CV)."""
    timed = [r["throughput"].get("interleaved") for r in rows]
    if budget_kind != "time" and all(timed):
        return "interleaved" if all((t["cv"] or 0) <= BUSY_CV for t in timed) else None
    in_training = [cv for r in rows for cv in ((r["throughput"].get("in_training") or {}).get("cv_per_run")
                                              or {}).values()]
    return None if any((cv or 0) > BUSY_CV for cv in in_training) else "logs"


def _plot_validation(entries, runs_by_label, out: Path, rows: list[dict] | None = None,
                     wall: str | None = "logs", trained: str = "one after another") -> list[Path | None]:
    """Validation loss against step, tokens and training wall-clock: the mean over seeds, with a band of
    ±1 standard deviation over seeds where there are two or more. The wall-clock axis follows `wall`
    (`wall_clock_source`; None: that figure is left out, its path None)."""
    import matplotlib.pyplot as plt

    step_s = {r["label"]: r["throughput"]["interleaved"]["median"] for r in rows or []
              if r["throughput"].get("interleaved")}
    paths: list[Path | None] = []
    for x, xlabel in VAL_PLOTS:
        if x == "wall_time" and wall is None:
            paths.append(None)
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for k, entry in enumerate(entries):
            if x == "wall_time" and wall == "interleaved":
                curves = [_val_curves(run, "step") for run in runs_by_label[entry.label]]
                curves = [([step * step_s[entry.label] for step in xs], ys) for xs, ys in curves]
            else:
                curves = [_val_curves(run, x) for run in runs_by_label[entry.label]]
            n = min(len(c[1]) for c in curves)
            xs = [statistics.fmean(c[0][i] for c in curves) for i in range(n)]
            stats = [mean_sd([c[1][i] for c in curves]) for i in range(n)]
            ys = [m for m, _ in stats]
            ax.plot(xs, ys, marker="o", markersize=3, label=entry.label, color=_colour(k))
            if len(curves) > 1:
                sds = [sd or 0.0 for _, sd in stats]
                ax.fill_between(xs, [y - s for y, s in zip(ys, sds, strict=True)],
                                [y + s for y, s in zip(ys, sds, strict=True)], color=_colour(k), alpha=0.2,
                                linewidth=0)
        ax.set_xlabel(WALL_FROM_TIMING if x == "wall_time" and wall == "interleaved" else xlabel)
        if x == "wall_time" and wall == "logs":  # the caveat travels with the image
            ax.set_title(WALL_FROM_LOGS_WARNING.format(trained=trained), fontsize=8, color="C3", wrap=True)
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


def gain_product_note(model_cfg: dict[str, Any]) -> str | None:
    """A sentence for a block whose attention-branch gain beta_SA and MLP-skip gain alpha_FF are both
    trained but act only through their product; None for any other block.

    With no attention skip (SAS, V-SkipInit), the sequential Pre-LN layout gives h = beta_SA MHA(.),
    then out = alpha_FF h + beta_FF MLP(N2(h)). The MLP's input norm N2 is blind to the scale of h (up
    to its epsilon), so beta_SA reaches the output only in alpha_FF beta_SA: scaling one by c and the
    other by 1/c changes nothing. tests/test_report.py checks it on the built model."""
    mc = model_cfg
    if (mc.get("block_layout") == "pre-ln" and mc.get("attn_skip_gain") == 0
            and mc.get("trainable_block_gains") and mc.get("mlp_skip_gain")
            and mc.get("norm_layers") == "all" and mc.get("norm") != "none"):
        shaped = mc.get("attn_matrix") == "shaped"
        official = (" The official SAS code trains the same two gains; it is a redundancy of the "
                    "parameterisation, not of this implementation." if shaped else "")
        return ("Only the product of two panels matters: beta_SA (attention branch) and alpha_FF (MLP skip) "
                "enter the block's output only as alpha_FF x beta_SA, because the MLP's input norm cancels "
                "the scale beta_SA gives the attention output (scaling one by c and the other by 1/c leaves "
                "the model unchanged, up to the norm's epsilon), so read their product, not either gain "
                "alone." + official)
    return None


# -- statistics -------------------------------------------------------------------------------------------
def _budget_setting(cfg: TrainConfig) -> str | None:
    """The claims' setting this comparison measures: equal FLOPs, or equal steps (and tokens)."""
    kinds = {kind for kind, name in BUDGETS.items() if getattr(cfg, name) is not None}
    if "flops" in kinds:
        return "flops"
    return "steps" if kinds & {"steps", "tokens"} else None


CLAIMS_TEXT = ("The papers' claims (blocklab.claims) whose validation-loss checks these architectures "
               "cover, each check paired by seed; `blocklab reproduce` runs every check, the exact ones "
               "too, at the budget the paper compares at.")
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


# -- tables -----------------------------------------------------------------------------------------------
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


def _speeds(rows: list[dict], which: str) -> list[float | None]:
    """Each architecture's speed relative to the first (the first's median step time over its own):
    above 1 is faster. `which`: "interleaved" or "in_training"."""
    medians = [(r["throughput"][which] or {}).get("median") for r in rows]
    base = medians[0]
    return [None if m is None or not base else base / m for m in medians]


def _tokens_cell(t: dict[str, Any] | None) -> str:
    if not t or not t.get("tokens_per_s"):
        return "-"
    tps = t["tokens_per_s"]
    return f"{tps['median']:,.0f} ({tps['q1']:,.0f}-{tps['q3']:,.0f})"


def _table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
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
    fast_i, fast_t = _speeds(rows, "interleaved") if interleaved else [], _speeds(rows, "in_training")
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


def baseline_warnings(rows: list[dict]) -> list[str]:
    """Runs that left the unigram plateau late or ended near it, and differences to the first
    architecture no larger than the seed spread: where the comparison measures noise or timing."""
    out = []
    late = [f"`{r['label']}` seed {h['seed']} ("
            + ("never in " if h["exit_step"] is None else f"step {h['exit_step']:,} of ") + f"{r['steps']:,})"
            for r in rows for h in r["plateau"] if h["late"]]
    if late:
        out.append(f"{plural(len(late), 'run')} left the unigram plateau late (after {LATE_EXIT:.0%} of the "
                   f"budget) or never: {', '.join(late)}. Their final losses say more about when they left "
                   "it than about the architecture; look at the validation curves, and try a longer budget "
                   "or another learning rate.")
    near = [f"`{r['label']}` seed {h['seed']} ({h['below']:.2f} nats below)"
            for r in rows for h in r["plateau"] if h["near"]]
    if near:
        out.append(f"{plural(len(near), 'run')} ended within {NEAR_PLATEAU:g} nats of the unigram plateau: "
                   f"{', '.join(near)}. Such a model has learned little beyond token frequencies.")
    noisy = spread_warnings({r["label"]: {h["seed"]: h["final"] for h in r["plateau"]} for r in rows})
    if noisy:
        out.append("The seed spread is as large as the difference: " + "; ".join(noisy) +
                   ". Those differences cannot be told from noise at this number of seeds.")
    return out


def load_warnings(rows: list[dict], budget_kind: str, trained: str = "one after another") -> list[str]:
    """What the step times say about the machine's load: the architectures' speed ratios in training
    (one run after another) against those of the interleaved pass, and the spread of step times within
    each run and in the pass itself."""
    out = []
    first = rows[0]["label"]
    if all(r["throughput"]["interleaved"] for r in rows):
        fast_i, fast_t = _speeds(rows, "interleaved"), _speeds(rows, "in_training")
        off = [(r["label"], t, i) for r, t, i in zip(rows, fast_t, fast_i, strict=True)
               if t is not None and i and abs(t / i - 1) > LOAD_DISAGREEMENT]
        if off:
            which = "; ".join(f"`{label}` {t:.2f}x in training against {i:.2f}x interleaved"
                              for label, t, i in off)
            out.append(
                f"Speed relative to `{first}` disagrees by more than {LOAD_DISAGREEMENT:.0%} between "
                f"training and the interleaved timing pass ({which}): the machine's load changed while the "
                f"runs trained {trained}. The in-training tokens/s and the wall-clock plot are not "
                "comparable between architectures; the interleaved figures of the throughput table are."
                + (" With a wall-clock budget the number of steps each run got depended on that load too, so "
                   "the losses are not on an equal footing either." if budget_kind == "time" else ""))
        busy = [(r["label"], r["throughput"]["interleaved"]["cv"]) for r in rows
                if (r["throughput"]["interleaved"]["cv"] or 0) > BUSY_CV]
        if busy:
            out.append(f"The timing pass itself saw varying step times (coefficient of variation "
                       f"{', '.join(f'{cv:.2f} for `{label}`' for label, cv in busy)}, above {BUSY_CV}): "
                       "another process was competing for the machine, so even the interleaved figures are "
                       "approximate; rerun on an idle machine, or with `threads=` a share of the cores.")
    runs = [(r["label"], seed, cv) for r in rows for seed, cv in
            ((r["throughput"]["in_training"] or {}).get("cv_per_run") or {}).items() if (cv or 0) > BUSY_CV]
    if runs:
        worst = max(runs, key=lambda x: x[2])
        out.append(f"Step times varied within {plural(len(runs), 'run')} (coefficient of variation up to "
                   f"{worst[2]:.2f}, `{worst[0]}` {worst[1]}; above {BUSY_CV}): the machine was busy while "
                   "they trained, so their in-training tokens/s and wall-clock curves are uncertain.")
    return out


# -- rendering: one list of blocks, written as markdown and as HTML ----------------------------------------
# A block is ("h2", title), ("p", markdown text), ("ul", [markdown items]), ("table", head, rows) or
# ("figure", path, alt, caption).
_NUMBER = re.compile(r"^[+-]?\d")


def alignments(head: list[str], rows: list[list[str]]) -> list[str]:
    """"right" for a column whose cells are all numbers (or "-"), "left" for names and text."""
    out = []
    for j in range(len(head)):
        cells = [row[j] for row in rows if row[j] not in ("-", "")]
        out.append("right" if cells and all(_NUMBER.match(c) for c in cells) else "left")
    return out


def md_table(head: list[str], rows: list[list[str]], align: list[str] | None = None) -> list[str]:
    """A markdown table; with `align` ("left"/"right" per column) its delimiter row says so."""
    esc = [[c.replace("|", "\\|") for c in row] for row in rows]
    rule = "|" + "---|" * len(head) if align is None else (
        "|" + "".join(":---|" if a == "left" else "---:|" for a in align))
    return ["| " + " | ".join(head) + " |", rule] + ["| " + " | ".join(r) + " |" for r in esc]


def inline_html(text: str) -> str:
    """The markdown subset the report writes, as HTML: `code`, **bold** and [text](url); the rest escaped."""
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for part in parts:
        if len(part) >= 2 and part.startswith("`") and part.endswith("`"):
            out.append(f"<code>{html.escape(part[1:-1])}</code>")
            continue
        part = html.escape(part)
        part = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", part)
        part = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2">\1</a>', part)
        out.append(part)
    return "".join(out)


def html_table(head: list[str], rows: list[list[str]], align: list[str] | None = None) -> str:
    """An HTML table; with `align` each cell gets its column's alignment and cells render inline markdown."""
    if align is None:
        th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
        trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
        return f"<table><tr>{th}</tr>{trs}</table>"
    th = "".join(f'<th class="{a}">{html.escape(h)}</th>' for h, a in zip(head, align, strict=True))
    trs = "".join("<tr>" + "".join(f'<td class="{a}">{inline_html(c)}</td>'
                                   for c, a in zip(row, align, strict=True)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def render_markdown(title: str, blocks: list[tuple]) -> str:
    md = [f"# {title}"]
    n = 0
    for block in blocks:
        kind = block[0]
        if kind == "h2":
            md += ["", f"## {block[1]}"]
        elif kind == "p":
            md += ["", block[1]]
        elif kind == "ul":
            md += [""] + [f"- {item}" for item in block[1]]
        elif kind == "table":
            md += [""] + md_table(block[1], block[2], alignments(block[1], block[2]))
        elif kind == "figure":
            n += 1
            md += ["", f"![{block[2]}]({block[1].name})", "", f"Figure {n}: {block[3]}"]
    return "\n".join(md) + "\n"


STYLE = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;"
         "line-height:1.45}"
         "table{border-collapse:collapse;margin:0.5em 0 1em}td,th{border:1px solid #ccc;padding:4px 8px}"
         "th{background:#f4f4f4}.left{text-align:left}.right{text-align:right;font-variant-numeric:tabular-nums}"
         "figure{margin:1em 0}img{max-width:100%}figcaption{max-width:50em;color:#333;font-size:0.95em}"
         "code{background:#f4f4f4;padding:0 3px;border-radius:3px}"
         ".warning{background:#fff4e5;border-left:4px solid #e69500;padding:0.4em 0.8em}")


def render_html(title: str, blocks: list[tuple]) -> str:
    body = [f"<h1>{html.escape(title)}</h1>"]
    n = 0
    for block in blocks:
        kind = block[0]
        if kind == "h2":
            body.append(f'<h2 id="{_anchor(block[1])}">{html.escape(block[1])}</h2>')
        elif kind == "p":
            cls = ' class="warning"' if block[1].startswith("**Warning") else ""
            body.append(f"<p{cls}>{inline_html(block[1])}</p>")
        elif kind == "ul":
            body.append("<ul>" + "".join(f"<li>{inline_html(item)}</li>" for item in block[1]) + "</ul>")
        elif kind == "table":
            body.append(html_table(block[1], block[2], alignments(block[1], block[2])))
        elif kind == "figure":
            n += 1
            data = base64.b64encode(block[1].read_bytes()).decode()
            body.append(f'<figure><img alt="{html.escape(block[2])}" src="data:image/png;base64,{data}">'
                        f"<figcaption><strong>Figure {n}.</strong> {inline_html(block[3])}</figcaption>"
                        "</figure>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>")


# -- the report -------------------------------------------------------------------------------------------
def _figures(entries, runs_by_label, rows, ev: dict[str, Any], out: Path, trained: str = "one after another"
             ) -> list[tuple[Path, str, str]]:
    """Every figure with its alt text and a caption saying what it shows and what to look for."""
    n_seeds = rows[0]["seeds"]
    bands = (f"lines are the mean over {n_seeds} seeds, bands ±1 s.d. over seeds" if n_seeds > 1
             else "one seed, so no band: a gap smaller than the seed-to-seed spread is not a difference")
    start = ("curves start at step 0, the initial model's loss" if ev["step0"] else
             f"the first evaluation is at step {ev['first_step']} (no step-0 evaluation is logged), so the "
             "curves start there")
    wall = wall_clock_source(rows, _budget_kind(runs_by_label[entries[0].label][0]["cfg"]))
    val = _plot_validation(entries, runs_by_label, out, rows, wall, trained)
    figs = [
        (val[0], "validation loss against step",
         f"Validation loss (nats per token, the same held-out windows for every run) against training step; "
         f"lower is better; {bands}; {start}."),
        (val[1], "validation loss against tokens",
         f"Validation loss against training tokens; lower is better; {bands}. At equal steps this is the "
         "step plot rescaled; at equal FLOPs a cheaper block reaches further right."),
    ]
    if wall == "interleaved":
        figs.append((val[2], "validation loss against training time at the interleaved speed",
                     f"Validation loss against the training time each run would take at its architecture's "
                     f"median step time in the interleaved timing pass (step x median step time; evaluation "
                     f"excluded); lower and further left is better; {bands}. The runs' own clocks are not "
                     "used: they trained " + trained + ", and a change in the machine's load between them "
                     "would move this axis."))
    elif wall == "logs":
        figs.append((val[2], "validation loss against training wall-clock",
                     f"Validation loss against seconds of training from the runs' own logs (evaluation "
                     f"excluded); lower and further left is better; {bands}. The runs trained {trained}, so "
                     "if the machine's load changed between them this axis is not comparable between "
                     "architectures (the warning on the figure says so): check the throughput section."))
    if len(entries) > 1:
        base = entries[0].label
        figs.append((_plot_relative(entries, runs_by_label, out), f"training loss relative to {base}",
                     f"Training loss minus `{base}`'s at the same step, mean over seeds, smoothed with an "
                     "exponential moving average (0.9) as in Value Residual Learning Fig. 7; below 0 is "
                     "better than the baseline. Training loss is measured on the training batches, which "
                     "every run shares; the smoothing lags the raw curve by about ten logged steps."))
    for entry in entries:
        run = runs_by_label[entry.label][0]  # seed 0
        path = _plot_scalars(entry.label, run, out)
        if path is None:
            continue
        caption = (f"The learned scalar gains of `{entry.label}` (seed 0) against step: one panel per kind "
                   "of gain, one line per layer (head-wise gains: the mean over heads with a ±1 s.d. band, "
                   "then one line per head). Look at how far each gain moves from its initial value and "
                   "whether the layers differ.")
        note = gain_product_note(run["model_config"])
        if note:
            caption += " " + note
        figs.append((path, f"learned scalars of {entry.label}", caption))
    return figs


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
        runs_by_label[entry.label].append(_load_run(cfg))
    rows = _rows(entries, runs_by_label, measured)
    first = runs_by_label[entries[0].label]
    trained = how_runs_trained(run_info or {})
    figures = _figures(entries, runs_by_label, rows, _eval_facts(first, first[0]["cfg"]), out, trained)
    method = method_facts(entries, runs_by_label, run_info, measured)  # its wall time includes the figures
    warnings = baseline_warnings(rows) + load_warnings(rows, method["budget"]["kind"], trained)
    ranked = verdict.ranking(entries, runs_by_label, method["size"])
    results = {"format": "blocklab compare results, version 3", "method": method, "architectures": rows,
               "verdict": verdict.as_data(ranked), "warnings": warnings}
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
    blocks += [("h2", "Results"), ("p", _results_text(rows, method)), ("table", *_table(rows))]
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
    title = "blocklab compare"
    (out / "report.md").write_text(render_markdown(title, blocks))
    (out / "report.html").write_text(render_html(title, blocks))
    return out / "report.md"


def verdict_blocks(ranked: dict[str, Any], entries, runs_by_label, rows: list[dict], method: dict[str, Any]
                   ) -> list[tuple]:
    """The report's opening: the ranked verdict, the claims these runs cover, what is held equal."""
    blocks: list[tuple] = [("h2", "Verdict"), ("p", verdict.verdict_text(ranked)),
                           ("table", verdict.VERDICT_HEAD, verdict.verdict_table(ranked))]
    setting = _budget_setting(runs_by_label[entries[0].label][0]["cfg"])
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
    head, body = _table(rows)
    lines = md_table(head, body, alignments(head, body))
    if isinstance(data, dict) and data.get("verdict"):
        lines += [""] + verdict.terminal_lines(data["verdict"])
    if isinstance(data, dict):
        lines += [f"warning: {w}" for w in data.get("warnings", [])]
    return "\n".join(lines)


# -- blocklab params -----------------------------------------------------------------------------------
def params_rows(archs: list[str] | None, sizes: list[str]) -> list[dict[str, Any]]:
    """Parameter counts and analytic training FLOPs per token of each preset at each size, the models
    built on the meta device (no memory). `archs` None: every block preset, then every value path on a
    Pre-LN block."""
    from blocklab.accounting import count_parameters, flops_per_token
    from blocklab.config import ModelConfig
    from blocklab.model import Transformer
    from blocklab.model.value_paths import VALUE_PATHS
    from blocklab.presets import BLOCK_PRESETS

    if archs is None:
        archs = list(BLOCK_PRESETS) + [f"pre-ln+{vp}" for vp in VALUE_PATHS if vp != "standard"]
    rows = []
    for size in sizes:
        for arch in archs:
            cfg = ModelConfig.from_preset(arch, size=size)
            with torch.device("meta"):
                model = Transformer(cfg)
            counts = count_parameters(model)
            rows.append(dict(arch=arch, size=size, total=counts.total, embedding=counts.embedding,
                             value_tables=counts.value_tables, non_embedding=counts.non_embedding,
                             flops_per_token=flops_per_token(model)))
    return rows


def params_table(rows: list[dict[str, Any]]) -> str:
    """`params_rows` as a plain-text table, millions of parameters and FLOPs."""
    head = (f"{'arch':<32} {'size':<15} {'total':>9} {'embed':>9} {'v-tables':>9} {'non-emb':>9} "
            f"{'FLOPs/tok':>10}")
    lines = [head, "-" * len(head)]
    lines += [f"{r['arch']:<32} {r['size']:<15} {r['total'] / 1e6:>8.2f}M {r['embedding'] / 1e6:>8.2f}M "
              f"{r['value_tables'] / 1e6:>8.2f}M {r['non_embedding'] / 1e6:>8.2f}M "
              f"{r['flops_per_token'] / 1e6:>9.1f}M" for r in rows]
    return "\n".join(lines + ["FLOPs/tok: analytic training FLOPs per token (forward + backward) at the "
                               "context length."])
