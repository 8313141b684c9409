"""The loss from hidden states, forward + backward: the (N, V) logits against the chunked op.

Contenders, for hidden states x (N, d), a head W (V, d) and targets t (N,):

- ``reference``: `F.cross_entropy(F.linear(x, W).float(), t)`, what the trainer computes today; with
  ``pad_to`` > 1, `F.linear` against W padded with zero rows to a multiple of pad_to, logits sliced
  back to V (the padded-head way of reaching CUDA's fast kernels; the padded float32 copy of W made
  each pass is counted in its memory, where a padded head would hold W padded instead);
- ``chunked``: `blocklab.runtime.head_loss.linear_cross_entropy(x, W, t, pad_to=..., chunk_size=...)`.

Each pass: forward, backward into fresh x.grad and W.grad. Time: median of `--repeats` passes after
`--warmup`, contenders round-robin so that a noisy machine slows them alike (CUDA events on a GPU, the
host clock on a CPU). Peak memory, on top of the inputs: on CUDA torch.cuda.max_memory_allocated() over
one pass (after the warm-up) minus the memory allocated before it; on CPU, where torch keeps no
allocator peak, each contender runs one pass in a fresh child process (forked before the parent
computes anything) and the figure is the child's peak resident memory over the pass (VmHWM, reset
through /proc/self/clear_refs just before it) minus its resident memory then; large buffers are
mmap-backed and returned on free, so this is the pass's true peak, allocator slack included. Both
include the gradients x.grad and W.grad (float32 W.grad: 4 V d bytes) that every method produces.
Each row's agreement with the reference row of the same shape (and pad) is printed too.

    python benchmarks/bench_loss.py                       # CPU, 2 threads, float32, two shapes
    python benchmarks/bench_loss.py --device cuda         # GPT-2 small's head at 8 x 1024, bf16 autocast
    python benchmarks/bench_loss.py --smoke               # a few seconds; writes only with --out
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import torch
import torch.nn.functional as F

from blocklab.runtime.head_loss import default_chunk_size, linear_cross_entropy, padded_rows

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _measure import event_timed_ms, machine_info, table, write_result  # noqa: E402

DEFAULTS = {  # device -> shapes N x d x V, dtype, pads, chunk sizes (0: the op's default), repeats
    "cpu": ("1024x128x4096,1024x768x50257", "float32", "1", "0", 3),
    "cuda": ("8192x768x50257", "bfloat16", "1,128", "0,256,2048", 10),
}
SMOKE = ("64x16x300", "1", "0,16")


def reference_loss(x: torch.Tensor, w: torch.Tensor, t: torch.Tensor, pad_to: int = 1) -> torch.Tensor:
    """F.cross_entropy on the float32 logits of every token (W padded to a multiple of pad_to)."""
    v = w.shape[0]
    wp = F.pad(w, (0, 0, 0, padded_rows(v, pad_to) - v)) if pad_to > 1 else w
    return F.cross_entropy(F.linear(x, wp)[:, :v].float(), t)


def make_loss(method: str, pad_to: int, chunk: int):
    if method == "reference":
        return lambda x, w, t: reference_loss(x, w, t, pad_to)
    return lambda x, w, t: linear_cross_entropy(x, w, t, pad_to=pad_to, chunk_size=chunk or None)


def build(shape: tuple[int, int, int], device: str, seed: int = 0):
    """x (N, d) and W (V, d) requiring grad, and targets; W small like a trained head's logits."""
    n, d, v = shape
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g).to(device).requires_grad_(True)
    w = torch.randn(v, d, generator=g).div_(d**0.5).to(device).requires_grad_(True)
    t = torch.randint(0, v, (n,), generator=g).to(device)
    return x, w, t


def make_pass(loss_fn, x, w, t, dtype: torch.dtype):
    """One forward + backward into fresh gradients; returns the loss."""
    on = dtype != torch.float32
    autocast = torch.autocast(x.device.type, dtype=dtype) if on else contextlib.nullcontext()

    def one() -> torch.Tensor:
        x.grad = w.grad = None
        with autocast:
            loss = loss_fn(x, w, t)
        loss.backward()
        return loss.detach()
    return one


def rss_mark() -> float:
    """Reset the kernel's peak-RSS counter (VmHWM; /proc/self/clear_refs, Linux >= 4.0) and return the
    resident memory now, in KiB. Without /proc: the lifetime peak ru_maxrss, which a freed temporary
    built before the pass would inflate."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _proc_status("VmRSS")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def rss_peak() -> float:
    try:
        return _proc_status("VmHWM")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _proc_status(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1])  # kB
    raise OSError(f"no {field} in /proc/self/status")


def cpu_peak_in_child(method: str, pad_to: int, chunk: int, shape: tuple[int, int, int], dtype: str,
                      threads: int) -> float:
    """Child process: peak resident memory over one pass of the contender minus that before it (MiB)."""
    torch.set_num_threads(threads)
    tiny = build((8, 4, 16), "cpu", seed=1)
    for m in ("reference", "chunked"):  # lazy initialisation of both code paths, not counted
        make_pass(make_loss(m, 1, 0), *tiny, getattr(torch, dtype))()
    x, w, t = build(shape, "cpu")
    one = make_pass(make_loss(method, pad_to, chunk), x, w, t, getattr(torch, dtype))
    base = rss_mark()
    one()
    return (rss_peak() - base) / 1024


def cuda_peak(one) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    one()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def contenders(pads: list[int], chunks: list[int]) -> list[tuple[str, int, int]]:
    return [("reference", p, 0) for p in pads] + [("chunked", p, c) for p in pads for c in chunks]


def cpu_peaks(shapes, dtype: torch.dtype, pads, chunks, threads: int) -> dict[tuple, float]:
    """Every (shape, contender)'s peak RSS increase, each in its own child forked from this still small
    process before it runs any torch computation (fork: no re-import, and no thread pool to inherit).
    The children run side by side: each measures its own memory, and no timing is taken meanwhile."""
    todo = [(shape, c) for shape in shapes for c in contenders(pads, chunks)]
    pools = [ProcessPoolExecutor(1, mp_context=get_context("fork")) for _ in todo]
    try:
        futs = [pool.submit(cpu_peak_in_child, *c, shape, str(dtype).split(".")[1], threads)
                for pool, (shape, c) in zip(pools, todo, strict=True)]
        return {key: f.result() for key, f in zip(todo, futs, strict=True)}
    finally:
        for pool in pools:
            pool.shutdown()


def measure_shape(shape, device: str, dtype: torch.dtype, pads, chunks, warmup: int, repeats: int,
                  peaks: dict[tuple, float]) -> list[dict]:
    """Agreement, time and (on CUDA) peak memory of every contender at one shape; CPU peaks come in."""
    cuda = device == "cuda"
    todo = contenders(pads, chunks)
    x, w, t = build(shape, device)
    passes = {c: make_pass(make_loss(*c), x, w, t, dtype) for c in todo}
    check = {}
    for c, one in passes.items():  # agreement, and the warm-up
        check[c] = (one(), x.grad.clone(), w.grad.clone())
        for _ in range(warmup - 1):
            one()
        if cuda:
            peaks[(shape, c)] = cuda_peak(one)
    times: dict[tuple, list[float]] = {c: [] for c in todo}
    for r in range(repeats):  # round-robin, starting one contender later each round
        for c in todo[r % len(todo):] + todo[:r % len(todo)]:
            times[c].append(event_timed_ms(passes[c], cuda))
    rows = []
    n, d, v = shape
    for c in todo:
        method, pad, chunk = c
        ref = check[("reference", pad, 0)]
        ms = times[c]
        rows.append(dict(shape=dict(n=n, d=d, v=v), method=method, pad_to=pad,
                         chunk_size=(chunk or default_chunk_size(padded_rows(v, pad))) if method == "chunked"
                         else None, median_ms=statistics.median(ms), min_ms=min(ms), max_ms=max(ms), runs=ms,
                         peak_mib=peaks[(shape, c)], float32_logits_mib=n * v * 4 / 2**20,
                         loss=check[c][0].item(), loss_diff=abs(check[c][0].item() - ref[0].item()),
                         dx_rel=rel(check[c][1], ref[1]), dw_rel=rel(check[c][2], ref[2])))
    return rows


def render(rows: list[dict]) -> str:
    out = []
    for r in rows:
        s = r["shape"]
        ref = next(q for q in rows if q["shape"] == s and q["method"] == "reference" and q["pad_to"] == 1)
        out.append([f"{s['n']}x{s['d']}x{s['v']}", r["method"], r["pad_to"], r["chunk_size"] or "-",
                    f"{r['median_ms']:.1f} ({r['min_ms']:.1f}-{r['max_ms']:.1f})",
                    f"{ref['median_ms'] / r['median_ms']:.2f}", f"{r['peak_mib']:.1f}",
                    f"{r['peak_mib'] / ref['peak_mib']:.2f}" if ref["peak_mib"] > 0 else "-",
                    f"{r['loss_diff']:.1e} / {r['dx_rel']:.1e}, {r['dw_rel']:.1e}"])
    header = ["N x d x V", "method", "pad_to", "chunk", "ms fwd+bwd (min-max)", "speed vs reference",
              "peak MiB", "memory vs reference", "vs reference: loss abs. diff / dx, dW rel. diff"]
    return table(header, out)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--shapes", default=None, help="comma-separated N x d x V (default: per device)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                   help="bfloat16: under autocast (default: float32 on CPU, bfloat16 on CUDA)")
    p.add_argument("--pads", default=None, help="comma-separated pad_to values (default: 1 on CPU, "
                   "1,128 on CUDA)")
    p.add_argument("--chunks", default=None, help="comma-separated chunk sizes of the chunked op, 0: its "
                   "default")
    p.add_argument("--threads", type=int, default=2, help="torch threads on CPU")
    p.add_argument("--warmup", type=int, default=1, help="passes before timing (the first checks agreement)")
    p.add_argument("--repeats", type=int, default=None, help="timed passes (default: 3 on CPU, 10 on CUDA)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one repeat; writes only with --out")
    p.add_argument("--out", type=Path, default=None, help="default results/loss-<device>.json")
    a = p.parse_args(argv)
    shapes, dtype, pads, chunks, repeats = DEFAULTS[a.device]
    a.repeats = a.repeats or repeats
    if a.smoke:
        shapes, pads, chunks = SMOKE
        a.warmup, a.repeats = 1, 1
    shapes, dtype = a.shapes or shapes, a.dtype or dtype
    pads, chunks = a.pads or pads, a.chunks or chunks
    shape_list = [tuple(int(s) for s in spec.split("x")) for spec in shapes.split(",")]
    pad_list, chunk_list = [int(s) for s in pads.split(",")], [int(s) for s in chunks.split(",")]
    if 1 not in pad_list:
        raise SystemExit("--pads must include 1 (the reference every row is compared with)")
    torch_dtype = getattr(torch, dtype)
    peaks = cpu_peaks(shape_list, torch_dtype, pad_list, chunk_list, a.threads) if a.device == "cpu" else {}
    torch.set_num_threads(a.threads)
    rows = []
    for shape in shape_list:
        rows += measure_shape(shape, a.device, torch_dtype, pad_list, chunk_list, max(a.warmup, 1),
                              a.repeats, peaks)
    mem = ("peak RSS (VmHWM) increase, one pass per child" if a.device == "cpu"
           else "max allocated over one pass")
    text = render(rows)
    threads = f", {a.threads} threads" if a.device == "cpu" else ""
    print(f"# loss from hidden states, forward + backward, {a.device} {dtype}{threads}; median of "
          f"{a.repeats}, round-robin; memory: {mem} (MiB)")
    print(text)
    out = a.out if a.smoke else a.out or HERE / "results" / f"loss-{a.device}.json"
    write_result(dict(machine=machine_info(a.device, torch.get_num_threads()),
                      options={k: str(v) for k, v in vars(a).items()}
                      | dict(shapes=shapes, dtype=dtype, pads=pads, chunks=chunks),
                      smoke=a.smoke, rows=rows, table=text), out)
    return rows


if __name__ == "__main__":
    main()
