"""Benchmark blocklab's value paths against the standard Pre-LN Transformer.

For every value path of `blocklab.model.value_paths.VALUE_PATHS` on the `pre-ln` block, plus a few
combinations with the simplified blocks (`sas-p+bov`, `sas-p+resformer`, `sas+svformer`, next to
plain `sas-p` and `sas`), at sizes "tiny" and "small":

- parameters (total, embedding, value tables, non-embedding: `blocklab.count_parameters`) and
  analytic training FLOPs per token (`blocklab.flops_per_token`);
- the KV-cache bytes per token of one sequence in bf16 (`kv_cache`: the layout that
  `KVCache.nbytes` holds, from `blocklab.runtime.cache.cache_bytes_per_token`);
- training throughput (forward, cross-entropy, backward, AdamW step) in tokens/s and peak memory,
  each also as a ratio to "pre-ln" measured side by side in the same run. Every configuration runs
  in its own child process with `torch.set_num_threads(1)` (default `--threads`) and the repeats go
  round-robin across configurations (see `_measure.py`). "pre-ln (control)" is a second, identical
  pre-ln child: its ratio to "pre-ln" shows how large a difference the noise alone produces.

    PYTHONPATH=src python benchmarks/bench_value_paths.py [--device cuda] [--quick] [--sizes tiny,small]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import blocklab
from _measure import BATCH, add_ratios, bench_training, machine_info, memory_unit, table
from blocklab.model.value_paths import VALUE_PATHS
from blocklab.runtime.cache import cache_bytes_per_token

REFERENCE, CONTROL = "pre-ln", "pre-ln (control)"
COMBINATIONS = ("sas-p", "sas-p+bov", "sas-p+resformer", "sas", "sas+svformer")
STEPS = {"tiny": 2, "small": 1}  # training steps per timed chunk: ~0.4 s and ~0.8 s on one CPU thread
CACHE_BYTES = 2  # bf16 keys and values


def configurations() -> dict[str, str]:
    """label -> architecture name, the reference first."""
    archs = {REFERENCE: REFERENCE, CONTROL: REFERENCE}
    archs.update({f"pre-ln+{vp}": f"pre-ln+{vp}" for vp in VALUE_PATHS if vp != "standard"})
    archs.update({arch: arch for arch in COMBINATIONS})
    return archs


def kv_cache(arch: str, size: str) -> dict:
    """KV-cache bytes per token of one sequence in bf16 at the context length, from
    `cache_bytes_per_token`, which equals `KVCache.nbytes` of a real cache (tests/runtime/test_cache.py)."""
    cfg = blocklab.ModelConfig.from_preset(arch, size=size)
    formula = cache_bytes_per_token(cfg, CACHE_BYTES)
    return dict(kinds=formula["kinds"], token_ids=formula["token_id_bytes"] > 0, bytes=formula["per_token"])


def bench_size(size: str, device: str, threads: int, warmup: int, repeats: int, steps: int) -> list[dict]:
    archs = configurations()
    results = bench_training(archs, size, device, threads, warmup, repeats, steps)
    rows = [dict(size=size, label=label, arch=archs[label], kv_cache=kv_cache(archs[label], size), **r)
            for label, r in results.items()]
    ref = rows[0]
    assert ref["label"] == REFERENCE
    add_ratios(rows, ref)
    for row in rows:
        row["kv_cache_vs_pre_ln"] = row["kv_cache"]["bytes"] / ref["kv_cache"]["bytes"]
    return rows


# -- reporting ---------------------------------------------------------------------------------
def m(n: float) -> str:
    return f"{n / 1e6:.3f}M"


def layout(kv: dict) -> str:
    """How many layers keep K and V, K only or V only, e.g. "1 K+V + 3 K + ids"."""
    kinds = " + ".join(f"{n} {kind}" for kind, n in kv["kinds"].items() if kind != "-")
    return kinds + (" + ids" if kv["token_ids"] else "")


def static_table(rows: list[dict]) -> str:
    return table(
        ["size", "arch", "params", "embedding", "value tables", "non-embedding", "FLOPs/token",
         "KV cache layout", "KV bytes/token (bf16)", "x pre-ln"],
        [[r["size"], r["label"], m(r["params"]["total"]), m(r["params"]["embedding"]),
          m(r["params"]["value_tables"]), m(r["params"]["non_embedding"]),
          f"{r['flops_per_token'] / 1e6:.2f}M",
          layout(r["kv_cache"]), f"{r['kv_cache']['bytes']:,.0f}", f"{r['kv_cache_vs_pre_ln']:.2f}"]
         for r in rows if r["label"] != CONTROL])


def measured_table(rows: list[dict], device: str) -> str:
    return table(
        ["size", "arch", "tokens/s", "(min-max)", "x pre-ln", f"memory ({memory_unit(device)})", "x pre-ln"],
        [[r["size"], r["label"], f"{r['tokens_per_s']:,.0f}",
          f"({min(r['runs']):,.0f}-{max(r['runs']):,.0f})", f"{r['speed_vs_pre_ln']:.2f}",
          f"{r['peak_mib']:.0f}", f"{r['memory_vs_pre_ln']:.2f}"] for r in rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="one repeat of one step (smoke test)")
    ap.add_argument("--sizes", default="tiny,small", help="comma-separated size presets (tiny, small)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in every child")
    ap.add_argument("--out", type=Path,
                    help="JSON results (default benchmarks/results/value-paths-<device>.json)")
    args = ap.parse_args()
    sizes = args.sizes.split(",")
    unknown = [s for s in sizes if s not in BATCH]
    if unknown:
        ap.error(f"--sizes {','.join(unknown)} is not allowed: choose from {', '.join(BATCH)}")
    out = args.out or Path(__file__).parent / "results" / f"value-paths-{args.device}.json"
    warmup, repeats = (1, 1) if args.quick else (2, 9)
    steps = dict.fromkeys(STEPS, 1) if args.quick else STEPS

    info = machine_info(args.device, args.threads)
    print(f"machine: {info}\n")
    start = time.perf_counter()
    rows = []
    for size in sizes:
        rows += bench_size(size, args.device, args.threads, warmup, repeats, steps[size])
    print("## Value paths: parameters, FLOPs per token, KV-cache bytes per token "
          "(bf16, the layout KVCache.nbytes holds)\n")
    print(static_table(rows) + "\n")
    batches = ", ".join(f"{s} {BATCH[s]} x context, {steps[s]} step(s) per repeat" for s in sizes)
    print(f"## Value paths: training step ({batches}), median of {repeats} round-robin repeats "
          f"({time.perf_counter() - start:.0f} s)\n")
    print(measured_table(rows, args.device) + "\n")

    info["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(f"load average (1/5/15 min): start {info['load_avg_at_start']}, end {info['load_avg_at_end']}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(machine=info, args=dict(quick=args.quick, batch=BATCH, warmup=warmup,
                                                           repeats=repeats, steps=steps, sizes=sizes),
                                   rows=rows), indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
