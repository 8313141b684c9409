"""Shaped attention's centering term C V (Simplifying Eq. 5) five ways, forward and backward.

C is the attention matrix of zero query-key logits, so for a causal mask C V is the running mean of
the values. SAS-P trained at 0.71x pre-ln's tokens/s on an H200 (RESULTS.md, "GPU path"); the
suspect is the prefix sum along the sequence axis. This times, on (B, H, T, D) values:

- ``before``: `ops.masked_mean` until 2026-11-26: `torch.cumsum` along T (a non-innermost axis),
  padded, then two gathers (the sums up to each query's last key, less those before its first);
- ``cumsum-seq``: the running mean alone: `torch.cumsum` along T, divided by the counts;
- ``cumsum-last``: the same with T moved innermost first (a transposed copy);
- ``ops.masked_mean``: the library's code now (cumsum-last for the causal, full-context case);
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


def running_mean(sums: torch.Tensor) -> torch.Tensor:
    count = torch.arange(1, sums.shape[-2] + 1, device=sums.device, dtype=sums.dtype)[:, None]
    return sums / count


def before_masked_mean(v: torch.Tensor, t_q: int, causal: bool = True, window: int | None = None
                       ) -> torch.Tensor:
    """`ops.masked_mean` as it was until 2026-11-26, kept here to measure against."""
    t_k = v.shape[-2]
    lo, hi = ops.key_bounds(t_q, t_k, causal, window, v.device)
    acc = torch.promote_types(v.dtype, torch.float32)
    prefix = F.pad(torch.cumsum(v.to(acc), dim=-2), (0, 0, 1, 0))
    total = prefix.index_select(-2, hi + 1) - prefix.index_select(-2, lo)
    return (total / (hi - lo + 1).to(total.dtype)[:, None]).to(v.dtype)


def before(v: torch.Tensor) -> torch.Tensor:
    return before_masked_mean(v, v.shape[-2])


def cumsum_seq(v: torch.Tensor) -> torch.Tensor:
    acc = torch.promote_types(v.dtype, torch.float32)
    return running_mean(torch.cumsum(v.to(acc), dim=-2)).to(v.dtype)


def cumsum_last(v: torch.Tensor) -> torch.Tensor:
    acc = torch.promote_types(v.dtype, torch.float32)
    return running_mean(torch.cumsum(v.to(acc).transpose(-1, -2).contiguous(), dim=-1).transpose(-1, -2)
                        ).to(v.dtype)


def library(v: torch.Tensor) -> torch.Tensor:
    return ops.masked_mean(v, v.shape[-2])


def sdpa_zero(v: torch.Tensor) -> torch.Tensor:
    zeros = torch.zeros_like(v)
    return F.scaled_dot_product_attention(zeros, zeros, v, is_causal=True)


VARIANTS = {"before": before, "cumsum-seq": cumsum_seq, "cumsum-last": cumsum_last,
            "ops.masked_mean": library,
            "sdpa-zero": sdpa_zero}


def reference(v: torch.Tensor) -> torch.Tensor:
    v = v.double().cpu()
    return v.cumsum(-2) / torch.arange(1, v.shape[-2] + 1, dtype=torch.float64)[:, None]


def timed(fn, cuda: bool) -> float:
    """Milliseconds of one call of fn: CUDA events on a GPU, the host clock on a CPU."""
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


def round_robin(steps: dict, cuda: bool, warmup: int, repeats: int) -> dict[str, list[float]]:
    """Each step once per round, in turn, so that a noisy machine slows them all alike."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for i in range(warmup + repeats):
        for name, step in steps.items():
            ms = timed(step, cuda)
            if i >= warmup:
                times[name].append(ms)
    return times


def train_steps(size: str, batch: int, seq: int, device: torch.device, dtype: torch.dtype) -> dict:
    """A SAS-P training step (forward, loss, backward, AdamW) with `ops.masked_mean` as it was and as
    it is: two copies of one model, the function swapped in for each one's step."""
    import blocklab

    cfg = blocklab.ModelConfig.from_preset("sas-p", size, context_length=seq)
    torch.manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    def make(impl):
        model = blocklab.Transformer(cfg).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            ops.masked_mean = impl
            with autocast:
                logits = model(ids[:, :-1])
            F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten()).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    return {"before": make(before_masked_mean), "ops.masked_mean": make(ops.masked_mean)}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--shape", default="8,12,1024,64", help="B,H,T,D (GPT-2 small at batch 8 x 1024)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--train-size", default="small", help="a size preset for the SAS-P training step "
                   "(its context is the shape's T); '' skips it")
    p.add_argument("--train-batch", type=int, default=4)
    p.add_argument("--out", type=Path, default=None, help="default results/centering-<device>.json")
    a = p.parse_args(argv)
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    shape = tuple(int(s) for s in a.shape.split(","))
    g = torch.Generator().manual_seed(0)
    cuda = device.type == "cuda"
    rows, grads, inputs = [], {}, {}
    for name, fn in VARIANTS.items():
        v = torch.randn(shape, generator=g).to(device, dtype)  # fresh values for every check
        with torch.no_grad():
            ref = reference(v)
            err = ((fn(v).double().cpu() - ref).norm() / ref.norm()).item()
        rows.append({"variant": name, "rel_err": err})
        inputs[name], grads[name] = v, torch.randn(shape, generator=g).to(device, dtype)

    def pass_of(name):
        return lambda: VARIANTS[name](inputs[name].detach().requires_grad_(True)).backward(grads[name])

    times = round_robin({name: pass_of(name) for name in VARIANTS}, cuda, a.warmup, a.repeats)
    current = ops.masked_mean  # the training steps swap it; restored whatever happens
    try:
        steps = train_steps(a.train_size, a.train_batch, shape[2], device, dtype) if a.train_size else {}
        times |= {f"SAS-P step, {name}": ms for name, ms in round_robin(steps, cuda, a.warmup,
                                                                            a.repeats).items()}
    finally:
        ops.masked_mean = current
    rows += [{"variant": name, "rel_err": None} for name in times if name.startswith("SAS-P")]
    for r in rows:
        ms = times[r["variant"]]
        r.update(median_ms=statistics.median(ms), min_ms=min(ms), max_ms=max(ms))
    median = {r["variant"]: r["median_ms"] for r in rows}
    print(f"# C V forward+backward, shape {shape}, {a.dtype}, {device}; median of {a.repeats}, "
          f"round-robin" + (f"; SAS-P training step at size {a.train_size}, batch {a.train_batch} x "
                            f"{shape[2]}" if a.train_size else ""))
    print("| variant | rel. error vs float64 | ms (min-max) | speed-up over before |")
    print("|---|---|---|---|")
    for r in rows:
        base = median["SAS-P step, before" if r["variant"].startswith("SAS-P") else "before"]
        err = "-" if r["rel_err"] is None else f"{r['rel_err']:.1e}"
        print(f"| {r['variant']} | {err} | {r['median_ms']:.3f} ({r['min_ms']:.3f}-"
              f"{r['max_ms']:.3f}) | {base / r['median_ms']:.2f} |")
    out = a.out or HERE / "results" / f"centering-{device.type}.json"
    out.write_text(json.dumps({"machine": machine_info(device.type, torch.get_num_threads()),
                               "options": vars(a) | {"out": str(out)},
                               "rows": rows}, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
