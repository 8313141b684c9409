"""How the runs were trained, in words: the budget, schedule, optimizer and precision, gathered into
the report's Method section (results.json: "method").
"""

from __future__ import annotations

import time
from typing import Any

import torch

from blocklab.model.config import ModelConfig
from blocklab.report.data import environment
from blocklab.training import TrainConfig
from blocklab.training.config import BUDGETS


def _sci(value: float) -> str:
    """2.0e12, not 2.0e+12."""
    mantissa, _, exponent = f"{value:.1e}".partition("e")
    return f"{mantissa}e{int(exponent)}"


def budget_text(cfg: TrainConfig) -> str:
    """The budget in words: "400 steps", "819,200 tokens", "2.0e12 FLOPs", "300 s of training"."""
    words = {"max_steps": lambda v: f"{v:,} steps", "max_tokens": lambda v: f"{v:,} tokens",
             "max_flops": lambda v: f"{_sci(v)} FLOPs", "max_time": lambda v: f"{v:g} s of training"}
    return " or ".join(words[name](value) for name, value in cfg.budgets().items()) or "none"


def budget_kind_of(cfg: TrainConfig) -> str:
    kinds = [kind for kind, name in BUDGETS.items() if getattr(cfg, name) is not None]
    return kinds[0] if len(kinds) == 1 else "+".join(kinds)


def _shape(mc: dict[str, Any]) -> str:
    """A model's resolved shape from its model_config.json, in words (sizes left None resolved as
    the model resolves them)."""
    cfg = ModelConfig.from_dict(mc)
    attention = cfg.attention_shape
    kv = f" ({mc['n_kv_heads']} KV heads)" if mc.get("n_kv_heads") else ""
    window = f", window {mc['window_size']} ({mc['window_pattern']})" if mc.get("window_size") else ""
    return (f"{mc['n_layers']} layers, d_model {mc['d_model']}, {mc['n_heads']} heads of "
            f"{attention.head_dim}{kv}, "
            f"MLP {cfg.mlp_shape.hidden} ({mc['mlp_act']}), {mc['norm']}, {mc['positions']} positions, "
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


def eval_facts(runs: list[dict], cfg: TrainConfig) -> dict[str, Any]:
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
        "budget": {"kind": budget_kind_of(cfg), **cfg.budgets(), "text": budget_text(cfg)},
        "optimizer": {"text": optimizer_text(cfg), **cfg.optim.to_dict()},
        "lr_sweep": run_info.get("lr_sweep"), "schedule": _schedule_text(cfg),
        "weight_decay": cfg.optim.weight_decay, "grad_clip": cfg.optim.grad_clip or None,
        "precision": _precision_text(cfg, device), "device": device,
        "data": {"source": cfg.data.source, "objective": cfg.data.objective,
                 "mask_prob": cfg.data.mask_prob if cfg.data.objective == "mlm" else None,
                 "val_fraction": cfg.data.val_fraction, "tokenizer": cfg.data.tokenizer,
                 "vocab_size": first[0]["model_config"]["vocab_size"]},
        "eval": eval_facts(first, cfg),
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
    from blocklab.util.progress import format_duration

    return format_duration(seconds)


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _lr_text(m: dict[str, Any]) -> str:
    """The peak learning rates and where they came from: a sweep, the main job's recipe, or given."""
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
    return lr


def method_items(m: dict[str, Any]) -> list[str]:
    """The Method section, one markdown list item per fact."""
    archs = ", ".join(f"`{a['label']}`" + (f" (`{a['arch']}`)" if a["arch"] != a["label"] else "")
                      for a in m["architectures"])
    shapes = "; ".join(s["shape"] + ("" if len(m["model_shapes"]) == 1 else
                                     f" ({', '.join(s['architectures'])})") for s in m["model_shapes"])
    lr = _lr_text(m)
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


def budget_setting(cfg: TrainConfig) -> str | None:
    """The claims' setting this comparison measures: equal FLOPs, or equal steps (and tokens)."""
    kinds = {kind for kind, name in BUDGETS.items() if getattr(cfg, name) is not None}
    if "flops" in kinds:
        return "flops"
    return "steps" if kinds & {"steps", "tokens"} else None
