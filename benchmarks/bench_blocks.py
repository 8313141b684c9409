"""Benchmark blocklab's block presets and its fused shaped-attention path.

Part 1, block presets: for every block preset at sizes "tiny" and "small", the throughput of a full
training step (forward, cross-entropy loss, backward, AdamW step) in tokens/s and the peak memory of
training, each also as a ratio to "pre-ln" measured in the same run. Every (preset, size) lives in
its own fresh child process (spawn). After a warm-up the parent drives the children round-robin,
one timed chunk of steps at a time, so that a noisy machine slows every preset alike; the figure is
the median over the repeats.

Part 2, shaped attention: `ops.shaped_attention` (fused: SDPA + alpha v - gamma mean(v), no T x T
matrix) against the explicit matrix `ops.shaped_attention_matrix(...) @ v`, forward only (no_grad)
and forward + backward, for B=1, H=2, D=64, causal, T = 512 ... 8192. Each (T, path) runs in a fresh
child process. The explicit path is skipped where its estimated memory exceeds MAX_EXPLICIT_GIB.

Peak memory. CUDA: torch.cuda.max_memory_allocated() minus the memory allocated before the first
step. CPU: torch has no allocator peak counter, so the figure is the child's peak RSS
(resource.getrusage ru_maxrss) after the last step minus its value just before the first step:
for Part 1 that is gradients, AdamW state, activations and allocator slack on top of the built
model and batch. A tiny throwaway step before that baseline absorbs one-off lazy initialisation.

    PYTHONPATH=src python benchmarks/bench_blocks.py [--device cuda] [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import subprocess
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import blocklab
from blocklab.presets import BLOCK_PRESETS

BATCH = {"tiny": 8, "small": 4}  # sequences of context_length tokens per step: 1024 tokens each
SEQ_LENS = (512, 1024, 2048, 4096, 8192)
HEADS, HEAD_DIM = 2, 64
MAX_EXPLICIT_GIB = 8.0
EXPLICIT_MATRICES = 7  # measured peak on CPU: 5-7 (B, H, T, T) float32 matrices (T = 2048-8192)


# -- measuring ---------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def memory_mark(device: torch.device) -> float:
    """Start a peak-memory measurement; returns the baseline in MiB."""
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def memory_peak(device: torch.device) -> float:
    """Peak memory in MiB so far (since the last memory_mark on CUDA)."""
    sync(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn, device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def in_child(fn, *args):
    """Run fn(*args) in a fresh spawned process and return its result."""
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


# -- Part 1: block presets (runs in one child process per preset and size) -------------------------
_worker: dict = {}


def prime(dev: torch.device) -> None:
    """One training step of a toy model, so that one-off lazy initialisation (thread pools, kernels;
    ~85 MiB of RSS on CPU) is not counted in the memory figures."""
    toy = nn.Sequential(nn.Embedding(16, 8), nn.LayerNorm(8), nn.Linear(8, 16)).to(dev)
    ids = torch.randint(0, 16, (2, 8), device=dev)
    F.cross_entropy(toy(ids).flatten(0, 1), ids.flatten()).backward()
    torch.optim.AdamW(toy.parameters()).step()


def setup_preset(preset: str, size: str, device: str, threads: int) -> None:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dev = torch.device(device)
    prime(dev)
    cfg = blocklab.ModelConfig.from_preset(preset, size=size)
    model = blocklab.Transformer(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = torch.randint(0, cfg.vocab_size, (BATCH[size], cfg.context_length + 1), device=dev)

    def step() -> None:
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    _worker.update(step=step, device=dev, tokens=batch[:, 1:].numel(), base=memory_mark(dev),
                   params=blocklab.count_parameters(model).total, flops=blocklab.flops_per_token(model))


def train_steps(n: int) -> float:
    """Tokens per second over n training steps."""
    seconds = timed(lambda: [_worker["step"]() for _ in range(n)], _worker["device"])
    return n * _worker["tokens"] / seconds


def ready() -> bool:
    """A no-op: submitting it makes a pool start its child, which runs setup_preset."""
    return True


def preset_summary() -> dict:
    w = _worker
    return dict(params=w["params"], flops_per_token=w["flops"], tokens_per_step=w["tokens"],
                peak_mib=memory_peak(w["device"]) - w["base"])


def bench_presets(size: str, device: str, threads: int, warmup: int, repeats: int, steps: int) -> list:
    ctx = mp.get_context("spawn")
    pools = {p: ProcessPoolExecutor(1, mp_context=ctx, initializer=setup_preset,
                                    initargs=(p, size, device, threads)) for p in BLOCK_PRESETS}
    try:
        for fut in [pool.submit(ready) for pool in pools.values()]:
            fut.result()  # all children start at once
        for pool in pools.values():
            pool.submit(train_steps, warmup).result()  # one at a time, like the timed steps
        rates = {p: [] for p in pools}
        names = list(pools)
        for r in range(repeats):  # round-robin, starting one preset later each repeat
            for p in names[r % len(names):] + names[:r % len(names)]:
                rates[p].append(pools[p].submit(train_steps, steps).result())
        rows = [dict(size=size, preset=p, tokens_per_s=statistics.median(rates[p]), runs=rates[p],
                     **pools[p].submit(preset_summary).result()) for p in names]
    finally:
        for wait in (False, True):  # let all children exit at once, then wait for them
            for pool in pools.values():
                pool.shutdown(wait=wait)
    ref = rows[0]
    assert ref["preset"] == "pre-ln"
    for row in rows:
        row["speed_vs_pre_ln"] = row["tokens_per_s"] / ref["tokens_per_s"]
        row["memory_vs_pre_ln"] = row["peak_mib"] / ref["peak_mib"]
    return rows


# -- Part 2: shaped attention, fused vs explicit -----------------------------------------------
def explicit_gib(t: int) -> float:
    return EXPLICIT_MATRICES * HEADS * t * t * 4 / 2**30


def attention_call(path: str, t: int, dev: torch.device):
    """A function computing one path's output for random (1, HEADS, t, HEAD_DIM) inputs."""
    q, k, v = (torch.randn(1, HEADS, t, HEAD_DIM, device=dev, requires_grad=True) for _ in range(3))
    alpha, beta, gamma = (torch.rand(HEADS, device=dev, requires_grad=True) for _ in range(3))
    if path == "fused":
        return lambda: blocklab.ops.shaped_attention(q, k, v, alpha, beta, gamma, causal=True)
    return lambda: blocklab.ops.shaped_attention_matrix(q, k, alpha, beta, gamma, causal=True) @ v


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
        for path in ("fused", "explicit"):
            if path == "explicit" and explicit_gib(t) > MAX_EXPLICIT_GIB:
                row["explicit"] = None
                continue
            row[path] = in_child(bench_attention, path, t, device, threads, repeats, budget_s)
        rows.append(row)
    return rows


# -- reporting ---------------------------------------------------------------------------------
def machine_info(device: str, threads: int) -> dict:
    cpu = "unknown"
    if Path("/proc/cpuinfo").exists():
        names = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    info = dict(cpu=cpu, cores=os.cpu_count(), torch_threads=threads, torch=torch.__version__,
                python=platform.python_version(), platform=platform.platform(), device=device,
                date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                blocklab_source=source_version(), load_avg_at_start=[round(x, 2) for x in os.getloadavg()])
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def source_version() -> str:
    """The git commit of the checkout, with "+dirty" when src/ has uncommitted changes."""
    def git(*args: str) -> str:
        cmd = ["git", "-C", str(Path(__file__).resolve().parent.parent), *args]
        return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()

    try:
        commit, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "src")
    except OSError:
        return "unknown"
    return (commit or "unknown") + ("+dirty" if dirty else "")


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows])


def presets_table(rows: list[dict], device: str) -> str:
    unit = "MiB, peak RSS increase" if device == "cpu" else "MiB, max allocated"
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

    header = ["T"] + [f"{p} {c}" for p in ("fused", "explicit")
                      for c in ("fwd ms", "fwd+bwd ms", "fwd peak MiB", "fwd+bwd peak MiB")]
    return table(header, [[r["T"]] + cells(r["fused"], r) + cells(r["explicit"], r) for r in rows])


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
    print(f"## Shaped attention, fused vs explicit: B=1, H={HEADS}, D={HEAD_DIM}, causal, float32, "
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
