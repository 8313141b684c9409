"""Which deep, narrow size can the evidence afford? (issue "Decisive evidence": 8-12 layers at d 128-192,
a run within a few minutes.)

Each candidate trains the evidence scales' run as `blocklab reproduce --scale cpu` does (the main job's
recipe, batches of 16 x 128 tokens, validation every 50 steps, checkpoints) for `--steps` steps on one
thread, one candidate after another in this process; the table gives the measured tokens/s, the seconds
of a 400-step run projected from it (training only; validation and checkpoints add about 10%), and the
FLOPs per token against size tiny (4 layers, d 128). Runs go to a temporary folder.

    PYTHONPATH=src python benchmarks/evidence_sizes.py            # writes results/evidence-sizes-cpu.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from _measure import machine_info, table

CANDIDATES = {  # label: model overrides of size tiny (d_model, n_layers, n_heads, mlp_hidden = 4 d)
    "tiny (4 x 128)": {},
    "8 x 128": {"n_layers": 8},
    "12 x 128": {"n_layers": 12},
    "8 x 192": {"n_layers": 8, "d_model": 192, "n_heads": 6, "mlp_hidden": 768},
    "12 x 192": {"n_layers": 12, "d_model": 192, "n_heads": 6, "mlp_hidden": 768},
}


def measure(model: dict, steps: int, out: Path) -> dict:
    from blocklab.compare import Entry, run_configs
    from blocklab.reproduce import SCALES
    from blocklab.training.loop import Trainer

    fields = {**SCALES["cpu"].base("steps"), "max_steps": steps, "threads": 1, "model": model}
    cfg = run_configs([Entry.parse("pre-ln")], 1, out, fields)[0][1]
    summary = Trainer(cfg).run().summary
    return {"tokens_per_s": summary["tokens_per_s"], "flops_per_token": summary["flops_per_token"],
            "params": summary["params"]["total"]}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--only", help="candidate labels separated by ';'")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "evidence-sizes-cpu.json")
    opts = p.parse_args(argv)
    chosen = {k: v for k, v in CANDIDATES.items() if not opts.only or k in opts.only.split(";")}
    rows = {}
    for label, model in chosen.items():
        with tempfile.TemporaryDirectory() as tmp:
            rows[label] = measure(model, opts.steps, Path(tmp))
        print(f"{label}: {rows[label]['tokens_per_s']:,.0f} tokens/s", flush=True)
    ref = rows.get("tiny (4 x 128)")
    for row in rows.values():
        row["run_400_steps_s"] = 400 * 16 * 128 / row["tokens_per_s"]
        if ref:
            row["flops_vs_tiny"] = row["flops_per_token"] / ref["flops_per_token"]
    result = {"machine": machine_info("cpu", 1), "steps": opts.steps, "rows": rows}
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(result, indent=2))
    print(table(["size", "params", "FLOPs/token vs tiny", "tokens/s (1 thread)", "400-step run (s)"],
                [[k, f"{r['params']:,}", f"{r.get('flops_vs_tiny', float('nan')):.2f}",
                  f"{r['tokens_per_s']:,.0f}", f"{r['run_400_steps_s']:.0f}"] for k, r in rows.items()]))
    return result


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
