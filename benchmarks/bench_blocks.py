"""Benchmark blocklab's block presets and its fused shaped-attention path.

Part 1, block presets: for every block preset at sizes "tiny" and "small", the throughput of a full
training step (forward, cross-entropy loss, backward, AdamW step) in tokens/s and the peak memory of
training, each also as a ratio to "pre-ln" measured in the same run. Every (preset, size) lives in
its own fresh child process (spawn). After a warm-up the parent drives the children round-robin,
one timed chunk of steps at a time, so that a noisy machine slows every preset alike; the figure is
the median over the repeats.

Part 2, shaped attention: `ops.shaped_attention` (fused: SDPA + alpha v - gamma mean(v), no T x T
matrix) against the explicit matrix `ops.shaped_attention_matrix(...) @ v`, forward only (no_grad)
and forward + backward, for B=1, H=2, D=64, causal, T = 512 ... 8192; the fused path also with a
sliding window of WINDOW keys (block by block, O(T w) memory). Each (T, path) runs in a fresh child
process. The explicit path is skipped where its estimated memory exceeds MAX_EXPLICIT_GIB.

Measurement (child processes, round-robin repeats, peak memory): see `_measure.py`. For Part 2 the
peak memory is the child's peak RSS increase (CPU) or max allocated (CUDA) over the inputs.

    PYTHONPATH=src python benchmarks/bench_blocks.py [--device cuda] [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from _measure import (
    BATCH,
    add_ratios,
    bench_training,
    in_child,
    machine_info,
    memory_mark,
    memory_peak,
    memory_unit,
    table,
    timed,
)
from blocklab.model import ops
from blocklab.model.presets import BLOCK_PRESETS

SEQ_LENS = (512, 1024, 2048, 4096, 8192)
HEADS, HEAD_DIM = 2, 64
WINDOW = 512  # the sliding window of the "fused window" path (nanochat's short window)
ATTENTION_PATHS = ("fused", "fused window", "explicit")
MAX_EXPLICIT_GIB = 8.0
EXPLICIT_MATRICES = 7  # measured peak on CPU: 5-7 (B, H, T, T) float32 matrices (T = 2048-8192)


# -- Part 1: block presets ---------------------------------------------------------------------
def bench_presets(size: str, device: str, threads: int, warmup: int, repeats: int, steps: int) -> list:
    results = bench_training({p: p for p in BLOCK_PRESETS}, size, device, threads, warmup, repeats, steps)
    rows = [dict(size=size, preset=p, tokens_per_s=r["tokens_per_s"], runs=r["runs"],
                 params=r["params"]["total"], flops_per_token=r["flops_per_token"],
                 tokens_per_step=r["tokens_per_step"], peak_mib=r["peak_mib"]) for p, r in results.items()]
    assert rows[0]["preset"] == "pre-ln"
    add_ratios(rows, rows[0])
    return rows


# -- Part 2: shaped attention, fused vs explicit -----------------------------------------------
def explicit_gib(t: int) -> float:
    return EXPLICIT_MATRICES * HEADS * t * t * 4 / 2**30


def attention_call(path: str, t: int, dev: torch.device):
    """A function computing one path's output for random (1, HEADS, t, HEAD_DIM) inputs."""
    q, k, v = (torch.randn(1, HEADS, t, HEAD_DIM, device=dev, requires_grad=True) for _ in range(3))
    alpha, beta, gamma = (torch.rand(HEADS, device=dev, requires_grad=True) for _ in range(3))
    if path in ("fused", "fused window"):
        window = WINDOW if path == "fused window" else None
        return lambda: ops.shaped_attention(q, k, v, alpha, beta, gamma, causal=True, window=window)
    return lambda: ops.shaped_attention_matrix(q, k, alpha, beta, gamma, causal=True) @ v


def bench_attention(path: str, t: int, device: str, threads: int, repeats: int, budget_s: float) -> dict:
    """Forward (no_grad) and forward + backward of one path at length t: median ms and peak MiB."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dev = torch.device(device)
    attention_call(path, 64, dev)().sum().backward()  # one-off lazy initialisation, not counted
    forward = attention_call(path, t, dev)

    def forward_only():
        with torch.no_grad():
            forward()

    def forward_backward():
        forward().sum().backward()

    result = {}
    base = memory_mark(dev)
    for name, fn in (("fwd", forward_only), ("fwd_bwd", forward_backward)):
        timed(fn, dev)  # the warm-up call sets the memory peak
        result[f"{name}_peak_mib"] = memory_peak(dev) - base
        times = [timed(fn, dev)]
        while len(times) < repeats and sum(times) < budget_s:
            times.append(timed(fn, dev))
        result[f"{name}_ms"] = 1000 * statistics.median(times)
        result[f"{name}_runs"] = len(times)
    return result


def bench_shaped_attention(device: str, threads: int, seq_lens, repeats: int, budget_s: float) -> list:
    rows = []
    for t in seq_lens:
        row = dict(T=t, explicit_est_gib=explicit_gib(t))
        for path in ATTENTION_PATHS:
            if path == "explicit" and explicit_gib(t) > MAX_EXPLICIT_GIB:
                row["explicit"] = None
                continue
            row[path] = in_child(bench_attention, path, t, device, threads, repeats, budget_s)
        rows.append(row)
    return rows


# -- reporting ---------------------------------------------------------------------------------
def presets_table(rows: list[dict], device: str) -> str:
    unit = memory_unit(device)
    return table(
        ["size", "preset", "params", "FLOPs/token", "tokens/s", "(min-max)", "x pre-ln", f"memory ({unit})",
         "x pre-ln"],
        [[r["size"], r["preset"], f"{r['params'] / 1e6:.3f}M", f"{r['flops_per_token'] / 1e6:.1f}M",
          f"{r['tokens_per_s']:,.0f}", f"({min(r['runs']):,.0f}-{max(r['runs']):,.0f})",
          f"{r['speed_vs_pre_ln']:.2f}", f"{r['peak_mib']:.0f}", f"{r['memory_vs_pre_ln']:.2f}"]
         for r in rows])


def attention_table(rows: list[dict]) -> str:
    def cells(res, row):
        if res is None:
            return [f"skipped (est. {row['explicit_est_gib']:.1f} GiB)"] * 4
        return [f"{res['fwd_ms']:.1f}", f"{res['fwd_bwd_ms']:.1f}",
                f"{res['fwd_peak_mib']:.0f}", f"{res['fwd_bwd_peak_mib']:.0f}"]

    header = ["T"] + [f"{p} {c}" for p in ATTENTION_PATHS
                      for c in ("fwd ms", "fwd+bwd ms", "fwd peak MiB", "fwd+bwd peak MiB")]
    return table(header, [[r["T"]] + [c for p in ATTENTION_PATHS for c in cells(r[p], r)] for r in rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="one repeat, short sequences (smoke test)")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads in every child")
    ap.add_argument("--out", type=Path, help="JSON results (default benchmarks/results/blocks-<device>.json)")
    args = ap.parse_args()
    out = args.out or Path(__file__).parent / "results" / f"blocks-{args.device}.json"
    warmup, repeats, steps = (1, 1, 1) if args.quick else (2, 9, 2)
    seq_lens = SEQ_LENS[:2] if args.quick else SEQ_LENS

    info = machine_info(args.device, args.threads)
    print(f"machine: {info}\n")
    start = time.perf_counter()
    presets = []
    for size in ("tiny", "small"):
        presets += bench_presets(size, args.device, args.threads, warmup, repeats, steps)
    batches = ", ".join(f"{size} {b} x context" for size, b in BATCH.items())
    print(f"## Block presets: training step, batch {batches}, median of {repeats} "
          f"round-robin repeats of {steps} steps ({time.perf_counter() - start:.0f} s)\n")
    print(presets_table(presets, args.device) + "\n")

    start = time.perf_counter()
    attention = bench_shaped_attention(args.device, args.threads, seq_lens, repeats=1 if args.quick else 5,
                                       budget_s=5.0)
    print(f"## Shaped attention, fused (full context; window {WINDOW}) vs explicit: B=1, H={HEADS}, "
          f"D={HEAD_DIM}, causal, float32, "
          f"median ms ({time.perf_counter() - start:.0f} s)\n")
    print(attention_table(attention) + "\n")

    info["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(f"load average (1/5/15 min): start {info['load_avg_at_start']}, end {info['load_avg_at_end']}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(machine=info, args=dict(quick=args.quick, batch=BATCH, warmup=warmup,
                                                           repeats=repeats, steps=steps),
                                   presets=presets, shaped_attention=attention), indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
