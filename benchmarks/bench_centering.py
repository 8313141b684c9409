"""Shaped attention's centering term C V (Simplifying Eq. 5) three ways, forward and backward.

C is the attention matrix of zero query-key logits, so for a causal mask C V is the running mean of
the values. SAS-P trained at 0.71x pre-ln's tokens/s on an H200 (RESULTS.md, "GPU path"); the
suspect is the prefix sum along the sequence axis. This times, on (B, H, T, D) values:

- ``cumsum-seq``: `ops.masked_mean`, today's code: `torch.cumsum` along T, a non-innermost axis;
- ``cumsum-last``: the same sums with T moved innermost first (a transposed copy);
- ``sdpa-zero``: `F.scaled_dot_product_attention` with zero queries and keys: uniform weights over
  the visible keys, which is C V itself, through the fused attention kernel (O(T^2 D) work).

Each variant is checked against a float64 running mean first (relative error, fresh random values),
then timed: median of `--repeats` forward+backward passes after `--warmup`, CUDA events on a GPU.

    python benchmarks/bench_centering.py                       # CPU, float32
    python benchmarks/bench_centering.py --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from blocklab import ops

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _measure import machine_info  # noqa: E402


def cumsum_seq(v: torch.Tensor) -> torch.Tensor:
    return ops.masked_mean(v, v.shape[-2])


def cumsum_last(v: torch.Tensor) -> torch.Tensor:
    acc = torch.promote_types(v.dtype, torch.float32)
    sums = torch.cumsum(v.transpose(-1, -2).to(acc).contiguous(), dim=-1).transpose(-1, -2)
    count = torch.arange(1, v.shape[-2] + 1, device=v.device, dtype=acc)[:, None]
    return (sums / count).to(v.dtype)


def sdpa_zero(v: torch.Tensor) -> torch.Tensor:
    zeros = torch.zeros_like(v)
    return F.scaled_dot_product_attention(zeros, zeros, v, is_causal=True)


VARIANTS = {"cumsum-seq": cumsum_seq, "cumsum-last": cumsum_last, "sdpa-zero": sdpa_zero}


def reference(v: torch.Tensor) -> torch.Tensor:
    v = v.double().cpu()
    return v.cumsum(-2) / torch.arange(1, v.shape[-2] + 1, dtype=torch.float64)[:, None]


def time_one(fn, v: torch.Tensor, grad: torch.Tensor, warmup: int, repeats: int) -> list[float]:
    cuda = v.device.type == "cuda"
    times = []
    for i in range(warmup + repeats):
        x = v.detach().requires_grad_(True)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            t0 = time.perf_counter()
        fn(x).backward(grad)
        if cuda:
            end.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end)
        else:
            ms = (time.perf_counter() - t0) * 1e3
        if i >= warmup:
            times.append(ms)
    return times


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--shape", default="8,12,1024,64", help="B,H,T,D (GPT-2 small at batch 8 x 1024)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", type=Path, default=None, help="default results/centering-<device>.json")
    a = p.parse_args(argv)
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    shape = tuple(int(s) for s in a.shape.split(","))
    g = torch.Generator().manual_seed(0)
    rows = []
    for name, fn in VARIANTS.items():
        v = torch.randn(shape, generator=g).to(device, dtype)  # fresh values for every check
        with torch.no_grad():
            ref = reference(v)
            err = ((fn(v).double().cpu() - ref).norm() / ref.norm()).item()
        grad = torch.randn(shape, generator=g).to(device, dtype)
        times = time_one(fn, v, grad, a.warmup, a.repeats)
        rows.append({"variant": name, "rel_err": err, "median_ms": statistics.median(times),
                     "min_ms": min(times), "max_ms": max(times)})
    base = rows[0]["median_ms"]
    print(f"# C V forward+backward, shape {shape}, {a.dtype}, {device}; median of {a.repeats}")
    print("| variant | rel. error vs float64 | ms (min-max) | x cumsum-seq |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['rel_err']:.1e} | {r['median_ms']:.3f} ({r['min_ms']:.3f}-"
              f"{r['max_ms']:.3f}) | {base / r['median_ms']:.2f} |")
    out = a.out or HERE / "results" / f"centering-{device.type}.json"
    out.write_text(json.dumps({"machine": machine_info(device.type, torch.get_num_threads()),
                               "options": vars(a) | {"out": str(out)},
                               "rows": rows}, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
