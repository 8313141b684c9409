"""Measurement code shared by the benchmark scripts: timing, peak memory, child processes, training-step
throughput measured side by side, machine information and markdown tables.

Training throughput (`bench_training`). Every configuration lives in its own fresh child process
(spawn), which builds the model, an AdamW optimiser and one random batch of `BATCH[size]` sequences of
context_length tokens. After a warm-up the parent drives the children round-robin, one timed chunk of
training steps (forward, cross-entropy, backward, AdamW step) at a time, starting one configuration
later each repeat, so that a noisy machine slows every configuration alike; the figure is the median
tokens/s over the repeats. Only one child computes at any moment.

Peak memory. CUDA: torch.cuda.max_memory_allocated() minus the memory allocated before the first
step. CPU: torch has no allocator peak counter, so the figure is the child's peak RSS
(resource.getrusage ru_maxrss) after the last step minus its value just before the first step, i.e.
gradients, AdamW state, activations and allocator slack on top of the built model and batch. A tiny
throwaway step before that baseline absorbs one-off lazy initialisation. A spawned child's ru_maxrss
starts at its parent's RSS (Linux keeps the high-water mark across fork and exec), so the parent must
stay smaller than a child's baseline: build no large model there.
"""

from __future__ import annotations

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

BATCH = {"tiny": 8, "small": 4}  # sequences of context_length tokens per step: 1024 tokens each


# -- timing and memory -------------------------------------------------------------------------
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


def event_timed_ms(fn, cuda: bool) -> float:
    """Milliseconds of one call of fn: CUDA events on a GPU (no host sync inside the timing), the host
    clock on a CPU."""
    if not cuda:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def in_child(fn, *args):
    """Run fn(*args) in a fresh spawned process and return its result."""
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


# -- training throughput (one child process per configuration) ------------------------------------
_worker: dict = {}


def prime(dev: torch.device) -> None:
    """One training step of a toy model, so that one-off lazy initialisation (thread pools, kernels;
    ~85 MiB of RSS on CPU) is not counted in the memory figures."""
    toy = nn.Sequential(nn.Embedding(16, 8), nn.LayerNorm(8), nn.Linear(8, 16)).to(dev)
    ids = torch.randint(0, 16, (2, 8), device=dev)
    F.cross_entropy(toy(ids).flatten(0, 1), ids.flatten()).backward()
    torch.optim.AdamW(toy.parameters()).step()


def setup_training(arch: str, size: str, device: str, threads: int) -> None:
    """Child initialiser: build `arch` at `size`, its optimiser and a batch; mark the memory baseline."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dev = torch.device(device)
    prime(dev)
    cfg = blocklab.ModelConfig.from_preset(arch, size=size)
    model = blocklab.LanguageModel(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = torch.randint(0, cfg.vocab_size, (BATCH[size], cfg.context_length + 1), device=dev)

    def step() -> None:
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    counts = blocklab.count_parameters(model)
    _worker.update(step=step, device=dev, tokens=batch[:, 1:].numel(), base=memory_mark(dev),
                   params=dict(total=counts.total, embedding=counts.embedding,
                               value_tables=counts.value_tables, non_embedding=counts.non_embedding),
                   flops=blocklab.flops_per_token(model))


def train_steps(n: int) -> float:
    """Tokens per second over n training steps."""
    seconds = timed(lambda: [_worker["step"]() for _ in range(n)], _worker["device"])
    return n * _worker["tokens"] / seconds


def ready() -> bool:
    """A no-op: submitting it makes a pool start its child, which runs setup_training."""
    return True


def training_summary() -> dict:
    w = _worker
    return dict(params=w["params"], flops_per_token=w["flops"], tokens_per_step=w["tokens"],
                peak_mib=memory_peak(w["device"]) - w["base"])


def bench_training(archs: dict[str, str], size: str, device: str, threads: int, warmup: int, repeats: int,
                   steps: int, setup=None) -> dict[str, dict]:
    """Measure every `label: arch` side by side; returns label -> tokens_per_s (median), runs (every
    repeat), params (total / embedding / value_tables / non_embedding), flops_per_token,
    tokens_per_step and peak_mib.

    `setup(arch, size, device, threads)` builds each child's model and step in place of
    `setup_training` (a picklable module-level function or partial that fills `_worker` the same way)."""
    ctx = mp.get_context("spawn")
    pools = {label: ProcessPoolExecutor(1, mp_context=ctx, initializer=setup or setup_training,
                                        initargs=(arch, size, device, threads))
             for label, arch in archs.items()}
    try:
        for fut in [pool.submit(ready) for pool in pools.values()]:
            fut.result()  # all children start at once
        for pool in pools.values():
            pool.submit(train_steps, warmup).result()  # one at a time, like the timed steps
        rates = {label: [] for label in pools}
        labels = list(pools)
        for r in range(repeats):  # round-robin, starting one configuration later each repeat
            for label in labels[r % len(labels):] + labels[:r % len(labels)]:
                rates[label].append(pools[label].submit(train_steps, steps).result())
        return {label: dict(tokens_per_s=statistics.median(rates[label]), runs=rates[label],
                            **pools[label].submit(training_summary).result()) for label in labels}
    finally:
        for wait in (False, True):  # let all children exit at once, then wait for them
            for pool in pools.values():
                pool.shutdown(wait=wait)


def add_ratios(rows: list[dict], ref: dict) -> None:
    """Throughput and peak memory of every row as a ratio to the reference row's."""
    for row in rows:
        row["speed_vs_pre_ln"] = row["tokens_per_s"] / ref["tokens_per_s"]
        row["memory_vs_pre_ln"] = row["peak_mib"] / ref["peak_mib"]


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


def write_result(result: dict, out: Path | None) -> None:
    """Write a benchmark's figures to its results file (None: a quick run, nothing written)."""
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"# wrote {out}")


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows])


def memory_unit(device: str) -> str:
    return "MiB, peak RSS increase" if device == "cpu" else "MiB, max allocated"
