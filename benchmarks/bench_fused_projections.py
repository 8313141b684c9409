"""Fused projections on and off (issue 37, item 4): a training step of Pre-LN and SAS-P, and the
projections alone.

With fusion on, the maps that read one input run as one GEMM: x [W_Q; W_K; W_V]^T in Pre-LN (SAS-P
has identity values, so x [W_Q; W_K]^T), and in SAS-P's parallel block also the MLP's first matrix,
x [W_Q; W_K; W_fc]^T. The weights are concatenated at every step (`runtime.fused_projections.fused_linear`),
a copy the unfused step does not make; this measures whether the bigger GEMM pays for it.

Part 1, training step. Shapes: `small` (6 layers, d 256, context 256) and `d768x4` (`small` widened
to d 768, 12 heads, MLP 3072, 4 layers), batch 4 x 256 tokens. A step is zero_grad, forward,
cross-entropy and backward, float32 (CUDA: bf16 autocast). Fusion is a switch on the same model
(`set_fused_projections`), so both modes run the same weights in one process: after a warm-up of
each, every round times one step of each mode back to back, in alternating order, so that a busy
machine slows both alike.

Part 2, the projections alone: x (1024 tokens, d) -> the maps above, forward and backward of the sum
of their outputs, fused (`fused_linear`) or each nn.Linear on its own, d 256 and 768, same rounds.

Part 3, decoding (one new token a step, batch 1, after 64 cached positions, under inference mode),
what a weight made once would change: the maps alone at one token, each nn.Linear on its own against
one GEMM on a concatenated weight made before timing ("made once", what a fused parameter or a weight
built at load time would run) and against `fused_linear`'s copy per call; and the model's eager
decoding step (`decode_step`) with fusion off and on (a copy per call: what "on" runs while decoding).

Reported per row: the median time of each mode, and "unfused / fused" (> 1: fusion is faster) as the
median over rounds of the paired ratio and as the ratio of the best (minimum) times, which a loaded
machine disturbs least; the process CPU time ratio too (all threads, median paired).

    PYTHONPATH=src python benchmarks/bench_fused_projections.py [--device cuda] [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import blocklab
from _measure import machine_info, sync, table
from blocklab.runtime.fused_projections import fused_linear, set_fused_projections

ARCHS = ("pre-ln", "sas-p")
SHAPES = {"small": {}, "d768x4": dict(d_model=768, n_heads=12, mlp_hidden=3072, n_layers=4)}
BATCH, SEQ = 4, 256


def paired(run: Callable[[str], None], device: torch.device, warmup: int, rounds: int) -> dict:
    """Times of run("off") and run("on"), one of each per round, in alternating order."""
    def timed(mode: str) -> tuple[float, float]:
        sync(device)
        wall, cpu = time.perf_counter(), time.process_time()
        run(mode)
        sync(device)
        return time.perf_counter() - wall, time.process_time() - cpu

    for _ in range(warmup):
        timed("off"), timed("on")
    walls: dict[str, list[float]] = {"off": [], "on": []}
    cpus: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(rounds):
        for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
            wall, cpu = timed(mode)
            walls[mode].append(wall)
            cpus[mode].append(cpu)
    ratios = [off / on for off, on in zip(walls["off"], walls["on"], strict=True)]
    cpu_ratios = [off / on for off, on in zip(cpus["off"], cpus["on"], strict=True)]
    return dict(unfused_ms=1000 * statistics.median(walls["off"]),
                fused_ms=1000 * statistics.median(walls["on"]),
                speedup_paired=statistics.median(ratios), speedup_best=min(walls["off"]) / min(walls["on"]),
                speedup_cpu_time=statistics.median(cpu_ratios), paired_min=min(ratios),
                paired_max=max(ratios), unfused_s=walls["off"], fused_s=walls["on"])


def bench_step(arch: str, shape: str, device: str, warmup: int, rounds: int) -> dict:
    torch.manual_seed(0)
    dev = torch.device(device)
    cfg = blocklab.ModelConfig.from_preset(arch, size="small", context_length=SEQ, **SHAPES[shape])
    model = blocklab.LanguageModel(cfg).to(dev)
    batch = torch.randint(0, cfg.vocab_size, (BATCH, SEQ + 1), device=dev)

    def step(mode: str) -> None:
        set_fused_projections(model, mode)
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", torch.bfloat16, enabled=dev.type == "cuda"):  # a GPU's training dtype
            logits = model(batch[:, :-1])
        F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten()).backward()

    return dict(part="step", shape=shape, arch=arch, **paired(step, dev, warmup, rounds))


def bench_maps(arch: str, d: int, device: str, warmup: int, rounds: int) -> dict:
    torch.manual_seed(0)
    dev = torch.device(device)
    widths = (d, d, d) if arch == "pre-ln" else (d, d, 4 * d)  # [W_Q; W_K; W_V] or [W_Q; W_K; W_fc]
    maps = [nn.Linear(d, w, bias=False).to(dev) for w in widths]
    x = torch.randn(BATCH * SEQ, d, device=dev, requires_grad=True)

    def run(mode: str) -> None:
        for m in maps:
            m.zero_grad(set_to_none=True)
        outs = fused_linear(x, maps) if mode == "on" else [m(x) for m in maps]
        sum(o.sum() for o in outs).backward()

    return dict(part="maps", shape=f"d {d}", arch=arch, **paired(run, dev, warmup, rounds))


DECODE_CACHED = 64  # positions in the KV cache before the timed decoding step


def bench_decode_maps(arch: str, d: int, device: str, warmup: int, rounds: int, made_once: bool) -> dict:
    """The maps of Part 2 at one token (batch 1) without gradients: on their own ("off") against one GEMM
    on a weight concatenated before timing (`made_once`) or by `fused_linear` at every call; each timed
    call runs the maps 100 times."""
    torch.manual_seed(0)
    dev = torch.device(device)
    widths = (d, d, d) if arch == "pre-ln" else (d, d, 4 * d)
    maps = [nn.Linear(d, w, bias=False).to(dev).requires_grad_(False) for w in widths]
    weight = torch.cat([m.weight for m in maps])
    x = torch.randn(1, 1, d, device=dev)

    def run(mode: str) -> None:
        with torch.inference_mode():
            for _ in range(100):
                if mode == "off":
                    [F.linear(x, m.weight) for m in maps]
                elif made_once:
                    F.linear(x, weight).split(widths, dim=-1)
                else:
                    fused_linear(x, maps)

    kind = "made once" if made_once else "copy per call"
    return dict(part=f"decode maps x100, {kind}", shape=f"d {d}", arch=arch,
                **paired(run, dev, warmup, rounds))


def bench_decode_step(arch: str, shape: str, device: str, warmup: int, rounds: int) -> dict:
    """The model's eager decoding step (batch 1, `DECODE_CACHED` positions cached) with fusion off and on;
    each timed call runs 20 steps at the same position."""
    torch.manual_seed(0)
    dev = torch.device(device)
    cfg = blocklab.ModelConfig.from_preset(arch, size="small", context_length=SEQ, **SHAPES[shape])
    model = blocklab.LanguageModel(cfg).to(dev).eval()
    cache = model.new_cache(1, DECODE_CACHED + 1)
    ids = torch.randint(0, cfg.vocab_size, (1, DECODE_CACHED + 1), device=dev)
    with torch.inference_mode():
        model(ids[:, :-1], cache=cache)

    def run(mode: str) -> None:
        set_fused_projections(model, mode)
        with torch.inference_mode():
            for _ in range(20):
                cache.length = DECODE_CACHED  # the same step again: its keys and values are overwritten
                model.decode_step(ids[:, -1:], cache)

    return dict(part="decode step x20, copy per call", shape=shape, arch=arch,
                **paired(run, dev, warmup, rounds))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="one round after one warm-up (smoke test)")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, from {', '.join(SHAPES)}")
    ap.add_argument("--rounds", type=int, default=9, help="rounds of the training step (the maps: 4x)")
    ap.add_argument("--out", type=Path,
                    help="JSON results (default benchmarks/results/fused-projections-<device>.json)")
    args = ap.parse_args()
    shapes = args.shapes.split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        ap.error(f"--shapes {','.join(unknown)} is not allowed: choose from {', '.join(SHAPES)}")
    out = args.out or Path(__file__).parent / "results" / f"fused-projections-{args.device}.json"
    warmup, rounds = (1, 1) if args.quick else (2, args.rounds)
    torch.set_num_threads(args.threads)
    info = machine_info(args.device, args.threads)
    print(f"machine: {info}\n")
    start = time.perf_counter()
    rows = [bench_maps(arch, d, args.device, warmup, 4 * rounds) for d in (256, 768) for arch in ARCHS]
    rows += [bench_step(arch, shape, args.device, warmup, rounds) for shape in shapes for arch in ARCHS]
    rows += [bench_decode_maps(arch, d, args.device, warmup, 4 * rounds, once) for d in (256, 768)
             for arch in ARCHS for once in (True, False)]
    rows += [bench_decode_step(arch, shape, args.device, warmup, 4 * rounds) for shape in shapes
             for arch in ARCHS]
    print(f"## Fused projections: the maps alone (x of {BATCH * SEQ} tokens; {4 * rounds} rounds), the "
          f"training step's forward + backward (batch {BATCH} x {SEQ}; {rounds} rounds) and decoding "
          f"(batch 1; {4 * rounds} rounds), {args.threads} threads ({time.perf_counter() - start:.0f} s)\n")
    print(table(["part", "shape", "arch", "unfused ms", "fused ms", "unfused / fused: paired (min-max)",
                 "best", "CPU time"],
                [[r["part"], r["shape"], r["arch"], f"{r['unfused_ms']:.1f}", f"{r['fused_ms']:.1f}",
                  f"{r['speedup_paired']:.3f} ({r['paired_min']:.2f}-{r['paired_max']:.2f})",
                  f"{r['speedup_best']:.3f}", f"{r['speedup_cpu_time']:.3f}"] for r in rows]) + "\n")
    info["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(f"load average (1/5/15 min): start {info['load_avg_at_start']}, end {info['load_avg_at_end']}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(machine=info, args=dict(quick=args.quick, warmup=warmup, rounds=rounds,
                                                           batch=BATCH, seq=SEQ, shapes=SHAPES), rows=rows),
                              indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
