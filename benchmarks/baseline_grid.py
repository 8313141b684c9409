"""The learning-curve grid that chose the CPU sizes' training recipe (issue "A baseline worth beating").

Every trial is a short `blocklab.train` run on the embedded corpus: the main job's settings (batches
of 16 x 128 tokens, 400 steps, validation every 50 steps on 16 batches, the main job's optimiser
recipe of the trial's architecture) with one thing changed. It reports, per trial, the validation
loss along the way, the step at which the run left the unigram plateau (`blocklab.statistics.plateau`:
validation loss below U - 0.1 nats, U the loss of the training split's unigram model on the scored
validation tokens) and the final bits per byte, which decide across vocabularies.

Runs go in `--out` (default runs/baseline-grid), one folder per trial and seed; a finished run is
read back, not trained again, so the grid resumes across sessions. Trials run `--jobs` at a time,
each on one thread in its own worker process (`blocklab.launch`).

    PYTHONPATH=src python benchmarks/baseline_grid.py                      # the recipe grid, seed 0
    PYTHONPATH=src python benchmarks/baseline_grid.py --grid archs             # every block preset
    PYTHONPATH=src python benchmarks/baseline_grid.py --grid lr --steps 200    # rates x1/3, x1, x3
    PYTHONPATH=src python benchmarks/baseline_grid.py --grid seeds --steps 200 --seeds 5   # seed spread
    PYTHONPATH=src python benchmarks/baseline_grid.py --grid small             # size small

Writes benchmarks/results/baseline-grid-<grid>-cpu.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
MAIN_JOB = {"size": "tiny", "max_steps": 400, "eval_every": 50, "batch_size": 16, "seq_len": 128}
# The recipe as shipped before this grid: sinusoidal positions added to N(0, 0.02) embeddings, AdamW
# at 3e-3, linear decay after 5% warmup. Every trial starts from the main job's recipe of its size and
# architecture (recipes.recipe_optim), so the recipe trials name their optimiser.
SHIPPED = {"model": {"positions": "sinusoidal"}, "optim": {"name": "adamw", "lr": 3e-3}}
ROPE = {"model": {"positions": "rope"}, "optim": {"name": "adamw", "lr": 3e-3}}


def _with(base: dict[str, Any], **sections: dict[str, Any]) -> dict[str, Any]:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for key, value in sections.items():
        if isinstance(value, dict):
            out[key] = {**out.get(key, {}), **value}
        else:
            out[key] = value
    return out


def recipe_trials() -> dict[str, dict[str, Any]]:
    """One factor at a time: positions and embedding scale against the shipped recipe, then the
    optimiser, learning rate, warmup, batch and vocabulary around RoPE."""
    tokens = MAIN_JOB["max_steps"] * MAIN_JOB["batch_size"] * MAIN_JOB["seq_len"]
    return {
        "shipped: sinusoidal, AdamW 3e-3": SHIPPED,
        "learned positions": _with(SHIPPED, model={"positions": "learned"}),
        "no positions (NoPE)": _with(SHIPPED, model={"positions": "none"}),
        "sinusoidal, embedding x sqrt(d) (Vaswani)": _with(SHIPPED, model={"embed_scale": 128 ** 0.5}),
        "sinusoidal, embedding init std 1": _with(SHIPPED, model={"embed_init_std": 1.0}),
        "rope": ROPE,
        "rope, embedding init std 1": _with(ROPE, model={"embed_init_std": 1.0}),
        "rope, lr 1e-3": _with(ROPE, optim={"lr": 1e-3}),
        "rope, lr 1e-2": _with(ROPE, optim={"lr": 1e-2}),
        "rope, no warmup": _with(ROPE, optim={"warmup_fraction": 0.0}),
        "rope, warmup 20%": _with(ROPE, optim={"warmup_fraction": 0.2}),
        "rope, Muon for block matrices": _with(ROPE, optim={"name": "muon", "muon_lr": 0.02}),
        "rope, nanochat's optimiser recipe": _with(ROPE, optim={"name": "nanochat", "schedule": "wsd"}),
        "rope, batch 8 (800 steps)": _with(ROPE, batch_size=8, max_steps=None, max_tokens=tokens),
        "rope, batch 32 (200 steps)": _with(ROPE, batch_size=32, max_steps=None, max_tokens=tokens),
        "rope, vocab 2048": _with(ROPE, data={"vocab_size": 2048}),
        "rope, vocab 8192": _with(ROPE, data={"vocab_size": 8192}),
    }


MUON = _with(ROPE, optim={"name": "muon", "lr": 3e-3, "muon_lr": 0.02})


def recipe_round2_trials() -> dict[str, dict[str, Any]]:
    """The second round, around the first round's best (RoPE with Muon for the block matrices): the
    warmup that helped AdamW, Muon's own rate and the AdamW rate of the rest."""
    return {
        "rope, Muon, warmup 20%": _with(MUON, optim={"warmup_fraction": 0.2}),
        "rope, Muon lr 0.01": _with(MUON, optim={"muon_lr": 0.01}),
        "rope, Muon lr 0.04": _with(MUON, optim={"muon_lr": 0.04}),
        "rope, Muon, AdamW lr 1e-2 for the rest": _with(MUON, optim={"lr": 1e-2}),
    }


def recipe_round3_trials() -> dict[str, dict[str, Any]]:
    """The third round: the AdamW rate of the embeddings, head, norms and gains beside Muon."""
    return {"rope, Muon, AdamW lr 3e-2 for the rest": _with(MUON, optim={"lr": 3e-2}),
            "rope, Muon, AdamW lr 1e-2, warmup 20%": _with(MUON, optim={"lr": 1e-2, "warmup_fraction": 0.2})}


BLOCK_PRESETS = ["pre-ln", "post-ln", "parallel", "v-skipinit", "shaped", "sas", "sas-p", "sas-p-nonorm"]
MAIN_JOB_ARCHS = ["pre-ln", "sas", "sas-p", "resformer", "svformer", "bov"]
SCALES = [1 / 3, 1.0, 3.0]  # both peak rates (AdamW's lr and Muon's muon_lr) times this


def lr_trials(archs: list[str], scales: list[float]) -> dict[str, dict[str, Any]]:
    """Each architecture with both peak rates of the default recipe (tiny) scaled; the rest as shipped."""
    from blocklab.recipes import recipe_optim

    trials = {}
    for arch in archs:
        base = recipe_optim(arch, "tiny")
        for scale in scales:
            rates = {k: float(f"{base[k] * scale:.3g}") for k in ("lr", "muon_lr")}  # 0.03 / 3 = 0.01
            trials[f"{arch}, lr {rates['lr']:.2g}, muon_lr {rates['muon_lr']:.2g}"] = {"arch": arch,
                                                                                         "optim": rates}
    return trials


def value_path_trials() -> dict[str, dict[str, Any]]:
    """Every value path on pre-ln with the shipped recipe, 200 steps: does each leave the plateau?"""
    from blocklab.model.value_paths import VALUE_PATHS

    return {f"pre-ln+{vp}": {"arch": f"pre-ln+{vp}", "max_steps": 200}
            for vp in VALUE_PATHS if vp != "standard"}


def trial_config(fields: dict[str, Any], out_dir: str):
    """One trial's TrainConfig: the main job's settings and its recipe, then the trial's fields."""
    from blocklab.compare import merge
    from blocklab.recipes import recipe_optim
    from blocklab.training import TrainConfig

    fields = merge({**MAIN_JOB, "optim": recipe_optim(fields.get("arch", "pre-ln"),
                                                      fields.get("size", MAIN_JOB["size"]))}, fields)
    return TrainConfig.from_dict({**fields, "out_dir": out_dir, "progress": False, "ckpt_every": 0})


def read_run(run: Path) -> dict[str, Any]:
    from blocklab.statistics.plateau import plateau_exit

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    curve = [(r["step"], r["tokens"], r["val_loss"]) for r in rows if "val_loss" in r]
    summary = json.loads((run / "summary.json").read_text())
    plateau = summary.get("unigram_loss") or plateau_of(run)
    exit_at = plateau_exit([(s, loss) for s, _, loss in curve], plateau)
    return {"curve": curve, "val_loss": summary["val_loss"], "val_bpb": summary.get("val_bpb"),
            "unigram_loss": plateau, "plateau_exit": exit_at, "seconds": summary.get("train_time")}


def plateau_of(run: Path) -> float:
    """The unigram plateau of a run saved before the trainer recorded it: the same scored batches."""
    import yaml

    from blocklab.data import Batches, prepare_data
    from blocklab.statistics.plateau import run_plateau
    from blocklab.training import TrainConfig

    cfg = TrainConfig.from_dict(yaml.safe_load((run / "config.yaml").read_text()))
    data = prepare_data(cfg.data)
    batches = Batches(data, "val", cfg.batch_size, cfg.seq_len, seed=cfg.seed)
    return run_plateau(data, batches, cfg.batch_size, cfg.eval_batches)


def slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "_" for c in name)


def run_grid(trials: dict[str, dict[str, Any]], seeds: int, out: Path, jobs: int) -> dict[str, list[dict]]:
    """Train every trial and seed `jobs` at a time, one thread each (`blocklab.launch`: finished runs are
    read back, unfinished ones start again), then read each run's curve."""
    from blocklab.launch import LocalLauncher, train_runs

    runs = [(name, seed, out / f"{slug(name)}-seed{seed}") for name in trials for seed in range(seeds)]
    configs = [(name, trial_config({**trials[name], "seed": seed}, str(run))) for name, seed, run in runs]
    launch = train_runs(configs, LocalLauncher(jobs=jobs, threads=1))
    if launch.failed:
        raise SystemExit(f"{len(launch.failed)} trial run(s) failed: " +
                         "; ".join(f"{o.cfg.out_dir} ({o.error}, log {o.log})" for o in launch.failed))
    results: dict[str, list[dict]] = {name: [] for name in trials}
    for name, seed, run in runs:
        result = read_run(run)
        result["seed"] = seed
        results[name].append(result)
        print(f"{name} seed {seed}: val loss {result['val_loss']:.3f}, left the plateau at "
              f"{result['plateau_exit']}", flush=True)
    return results


def _at(curve: list, step: int) -> float | None:
    return next((loss for s, _, loss in curve if s == step), None)


def table(results: dict[str, list[dict]], steps: list[int], by_tokens: bool) -> str:
    head = "loss at" if by_tokens else "step"
    cols = [f"{s * MAIN_JOB['batch_size'] * MAIN_JOB['seq_len'] / 1000:g}k tokens" if by_tokens else str(s)
            for s in steps]
    lines = [f"| trial | {' | '.join(f'{head} {c}' for c in cols)} | final bits/byte "
             "| left plateau at step |",
             "|---|" + "---|" * (len(steps) + 2)]
    for name, runs in results.items():
        cells = []
        for step in steps:
            if by_tokens:
                tokens = step * MAIN_JOB["batch_size"] * MAIN_JOB["seq_len"]
                vals = [next((loss for _, t, loss in r["curve"] if t == tokens), None) for r in runs]
            else:
                vals = [_at(r["curve"], step) for r in runs]
            cells.append(" / ".join("-" if v is None else f"{v:.2f}" for v in vals))
        bpb = " / ".join(f"{r['val_bpb']:.3f}" for r in runs)
        exits = " / ".join(str(r["plateau_exit"]) for r in runs)
        lines.append(f"| {name} | {' | '.join(cells)} | {bpb} | {exits} |")
    return "\n".join(lines)


def spread(results: dict[str, list[dict]]) -> str:
    lines = []
    for name, runs in results.items():
        finals = [r["val_loss"] for r in runs]
        if len(finals) > 1:
            lines.append(f"- {name}: final val loss mean {statistics.mean(finals):.3f}, sd "
                         f"{statistics.stdev(finals):.3f} over {len(finals)} seeds")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", default="recipe",
                        choices=["recipe", "recipe2", "recipe3", "archs", "lr", "value-paths", "seeds",
                                 "small"])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=MAIN_JOB["max_steps"],
                        help="steps of every trial (its runs go in a folder of their own unless 400)")
    parser.add_argument("--scales", default=None,
                        help="comma-separated factors (1/3 allowed) on both peak rates of the shipped recipe "
                        "for --grid lr (default 1/3,1,3) and archs (default 1)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("runs/baseline-grid"))
    parser.add_argument("--only", default=None, help="trial names to run, separated by ';'")
    args = parser.parse_args()
    from blocklab.recipes import recipe_optim

    if args.grid == "recipe":
        trials = recipe_trials()
    elif args.grid == "recipe2":
        trials = recipe_round2_trials()
    elif args.grid == "recipe3":
        trials = recipe_round3_trials()
    elif args.grid in ("archs", "lr"):
        scales = [float(Fraction(x)) for x in args.scales.split(",")] if args.scales else None
        trials = (lr_trials(BLOCK_PRESETS, scales or [1.0]) if args.grid == "archs"
                  else lr_trials(MAIN_JOB_ARCHS, scales or SCALES))
    elif args.grid == "value-paths":
        trials = value_path_trials()
    elif args.grid == "seeds":
        trials = {"pre-ln (shipped recipe)": {}, "pre-ln (recipe before: sinusoidal, AdamW)": SHIPPED}
    else:
        # size small at 200 steps (about 5 times tiny's cost a step), with tiny's recipe
        trials = {"small, shipped recipe": {"size": "small", "optim": recipe_optim("pre-ln", "tiny"),
                                            "max_steps": 200},
                  "small, recipe before (sinusoidal, AdamW 3e-3)": _with(SHIPPED, size="small",
                                                                          max_steps=200)}
    trials = {name: {"max_steps": args.steps, **fields} for name, fields in trials.items()}  # sent to workers
    if args.only:
        keep = args.only.split(";")
        trials = {k: v for k, v in trials.items() if k in keep}
    start = time.perf_counter()
    # archs and lr share their runs: the same architecture at the same rate is one run
    folder = {"archs": "lr", "recipe2": "recipe", "recipe3": "recipe"}.get(args.grid, args.grid)
    if args.steps != 400:
        folder += f"-{args.steps}steps"
    results = run_grid(trials, args.seeds, args.out / folder, args.jobs)
    steps = [50, 100, 150, 200, 300, 400]
    text = table(results, steps, by_tokens=True)
    print(text)
    if spread(results):
        print(spread(results))
    RESULTS.mkdir(exist_ok=True)
    steps = "" if args.steps == 400 else f"-{args.steps}steps"
    path = RESULTS / f"baseline-grid-{args.grid}{steps}-cpu.json"
    path.write_text(json.dumps({"main_job": MAIN_JOB, "grid": args.grid, "seeds": args.seeds,
                                "seconds": time.perf_counter() - start, "results": results}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
