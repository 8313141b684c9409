"""Shaped attention (Simplifying Eq. 5) before and after its fused path, forward and backward.

Part 1, the centering term C V alone. C is the attention matrix of zero query-key logits, so for a
causal mask C V is the running mean of the values. On (B, H, T, D) values:

- ``before``: `ops.masked_mean` until 2026-11-26: `torch.cumsum` along T (a non-innermost axis),
  padded, then two gathers (the sums up to each query's last key, less those before its first);
- ``cumsum-seq``: the running mean alone: `torch.cumsum` along T, divided by the counts;
- ``cumsum-last``: the same with T moved innermost first (a transposed copy);
- ``ops.masked_mean``: the library's code now (cumsum-last for the causal, full-context case);
- ``sdpa-zero``: `F.scaled_dot_product_attention` with zero queries and keys: uniform weights over
  the visible keys, which is C V itself, through the fused attention kernel (O(T^2 D) work).

Part 2, the whole shaped attention (beta A V + alpha V - gamma C V) with SAS-P's trainable head-wise
gains, causal, full context (training):

- ``shaped, before``: `ops.shaped_attention` until 2026-11-27 (plain ops: autograd differentiates
  each product, the casts and transposes, and the cumsum by flip-cumsum-flip), kept here;
- ``shaped, ops``: the library's code now as `LanguageModel` runs it (SDPA, then the fused kernel
  `runtime.shaped_mix.ShapedMix` with its own backward);
- ``shaped, ops, other scan``: the same with the prefix sums in the other layout than this device
  takes by default (`KernelChoice.scan_t_innermost`: T innermost on CUDA, T strided on the CPU).

Each variant is checked against float64 first (relative error of the output and, in part 2, of the
gradients w.r.t. q, k, v and the gains against autograd through the equation in float64), then
timed: median of `--repeats` forward+backward passes after `--warmup`, round-robin, CUDA events on
a GPU. Part 2 also counts the aten ops one call dispatches forward and backward (views excluded):
deterministic, and on a GPU each is about one kernel launch. Part 3 times a SAS-P training step
(forward, loss, backward, AdamW) with `ops.shaped_attention` as it was and as it is, and counts the
ops of its forward and backward. Part 4 (`--compiled`) compiles that step whole (`torch.compile(model)`)
with shaped attention as it was, as the Function and as plain ops (what inductor gets by default,
`KernelChoice.compiled_mix`) and counts the kernels inductor generates.

    python benchmarks/bench_centering.py                       # CPU, float32
    python benchmarks/bench_centering.py --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from blocklab.model import ops
from blocklab.runtime import kernels
from blocklab.runtime.shaped_mix import ShapedMix, shaped_mix

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _measure import event_timed_ms, machine_info  # noqa: E402


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


def round_robin(steps: dict, cuda: bool, warmup: int, repeats: int) -> dict[str, list[float]]:
    """Each step once per round, in turn, so that a noisy machine slows them all alike."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for i in range(warmup + repeats):
        for name, step in steps.items():
            ms = event_timed_ms(step, cuda)
            if i >= warmup:
                times[name].append(ms)
    return times


# -- part 2: the whole shaped attention ---------------------------------------------------------
def before_shaped_attention(q, k, v, alpha, beta, gamma, causal=True, window=None, scale=None,
                            past_sum=None, mix=None):  # noqa: ARG001
    """`ops.shaped_attention` as it was until 2026-11-27, kept here to measure against (`mix`: ignored)."""
    n_heads, t_q = q.shape[-3], q.shape[-2]
    out = ops._per_head(beta) * ops.attention(q, k, v, causal, window, scale)
    out = out + ops._per_head(alpha) * ops.expand_kv(v[..., -t_q:, :], n_heads)
    if gamma is not None:  # C V as it still is in the library: `ops.centered_values`, `ops.masked_mean`
        mean = ops.centered_values(v, t_q, causal, window, past_sum)
        out = out - ops._per_head(gamma) * ops.expand_kv(mean, n_heads)
    return out


def before_mix(a, v, alpha, beta, gamma):
    """What `before_shaped_attention` does after SDPA: beta a + alpha v - gamma C V in plain ops."""
    out = ops._per_head(beta) * a + ops._per_head(alpha) * v
    return out - ops._per_head(gamma) * ops.masked_mean(v, v.shape[-2])


@contextlib.contextmanager
def other_scan(device: torch.device, flip: bool = True):
    """Within: the prefix sums in the layout this device does not take by default (forward and
    backward alike)."""
    layout = set(kernels.KERNELS.scan_t_innermost)
    if flip:
        layout ^= {device.type}
    with kernels.kernel_choice(scan_t_innermost=frozenset(layout)):
        yield


def fused_shaped_attention(*args):
    """`ops.shaped_attention` with the fused mix that `LanguageModel` swaps in."""
    return ops.shaped_attention(*args, mix=shaped_mix)


def shaped_variants() -> dict:
    """Part 2's variants: name -> (fn, its float64 reference); the `mix` ones start from A V, the
    "other scan" ones run (forward and backward) within `other_scan`."""
    mix = ShapedMix.apply
    return {"shaped, before": (before_shaped_attention, shaped_reference),
            "shaped, ops": (fused_shaped_attention, shaped_reference),
            "shaped, ops, other scan": (fused_shaped_attention, shaped_reference),
            "mix, before": (before_mix, mix_reference), "mix, ops": (mix, mix_reference),
            "mix, ops, other scan": (mix, mix_reference)}


def shaped_inputs(shape: tuple, device: torch.device, dtype: torch.dtype, seed: int,
                  mix: bool = False) -> tuple:
    """q, k, v in the layout SAS-P gives them (heads split from (B, T, H * D), so T is strided) and
    SAS-P's trainable head-wise gains, away from their init (1, 1, 1). mix: A V (the same layout)
    in place of q and k."""
    b, h, t, d = shape
    g = torch.Generator().manual_seed(seed)

    def heads():
        return torch.randn(b, t, h, d, generator=g).to(device, dtype).transpose(1, 2)

    q, k, v = heads(), heads(), heads() + 0.5
    gains = [(c + 0.3 * torch.randn(h, generator=g)).to(device) for c in (1.2, 0.8, 0.6)]
    return (q, v, *gains) if mix else (q, k, v, *gains)


def shaped_reference(q, k, v, alpha, beta, gamma):
    """(alpha I + beta A - gamma C) V for a causal mask, written from the equation in float64."""
    q, k, v = q.double(), k.double(), v.double()
    alpha, beta, gamma = (x.double().reshape(1, -1, 1, 1) for x in (alpha, beta, gamma))
    count = torch.arange(1, v.shape[-2] + 1, dtype=torch.float64, device=v.device)[:, None]
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return beta * attn + alpha * v - gamma * v.cumsum(-2) / count


def mix_reference(a, v, alpha, beta, gamma):
    """beta a + alpha v - gamma C V (C V the running mean of v), in float64 from the equation."""
    a, v = a.double(), v.double()
    alpha, beta, gamma = (x.double().reshape(1, -1, 1, 1) for x in (alpha, beta, gamma))
    count = torch.arange(1, v.shape[-2] + 1, dtype=torch.float64, device=v.device)[:, None]
    return beta * a + alpha * v - gamma * v.cumsum(-2) / count


def grads_of(fn, inputs: tuple, grad: torch.Tensor) -> tuple:
    leaves = [x.detach().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    return (out, *torch.autograd.grad(out, leaves, grad.to(out.dtype)))


CHECK_T = 256  # the float64 check runs on the first batch entry and the first CHECK_T positions


def relative_errors(fn, ref_fn, inputs: tuple, grad: torch.Tensor) -> dict:
    """Relative error (norm) of the output and of each gradient against float64 autograd, on the
    first batch entry and the first `CHECK_T` positions (float64 attention at T = 1024 is slow)."""
    inputs = tuple(x[:1, :, :CHECK_T] if x.dim() == 4 else x for x in inputs)
    grad = grad[:1, :, :CHECK_T]
    got = grads_of(fn, inputs, grad)
    ref = grads_of(ref_fn, tuple(x.double() for x in inputs), grad.double())
    names = ["out", *(["q", "k"] if len(inputs) == 6 else ["a"]), "v", "alpha", "beta", "gamma"]
    return {n: ((a.double() - r).norm() / r.norm()).item() for n, a, r in zip(names, got, ref, strict=True)}


class OpCount(TorchDispatchMode):
    """Counts the aten ops dispatched that return a tensor and are not views, by name."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        kernel = not func.is_view and func._overloadpacket is not torch.ops.aten.detach
        if kernel and any(isinstance(t, torch.Tensor) for t in outs):
            self.ops[func._overloadpacket.__name__] += 1
        return out


def count_ops(forward, backward=None) -> dict:
    """The aten ops of forward() and of backward(result), each as a total and by name."""
    with OpCount() as fwd:
        out = forward()
    counts = {"forward": sum(fwd.ops.values()), "forward_ops": dict(fwd.ops)}
    if backward is not None:
        with OpCount() as bwd:
            backward(out)
        counts |= {"backward": sum(bwd.ops.values()), "backward_ops": dict(bwd.ops)}
    return counts


def shaped_op_counts(fn, inputs: tuple, grad: torch.Tensor) -> dict:
    leaves = [x.detach().requires_grad_(True) for x in inputs]
    return count_ops(lambda: fn(*leaves), lambda out: out.backward(grad.to(out.dtype)))


# -- part 3: a SAS-P training step -------------------------------------------------------------
def train_steps(size: str, batch: int, seq: int, device: torch.device, dtype: torch.dtype,
                impls: dict) -> tuple[dict, dict]:
    """A SAS-P training step (forward, loss, backward, AdamW) for each implementation of
    `ops.shaped_attention` in `impls`: one copy of the model each, the function swapped in for each
    one's step (the caller restores it). Also the aten ops of each step's forward and backward."""
    import blocklab

    cfg = blocklab.ModelConfig.from_preset("sas-p", size, context_length=seq)
    torch.manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    def loss_of(model):
        with autocast:
            logits = model(ids[:, :-1])
        return F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())

    def make(impl):
        model = blocklab.LanguageModel(cfg).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            ops.shaped_attention = impl
            loss_of(model).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step, model

    steps, counts = {}, {}
    for name, impl in impls.items():
        steps[name], model = make(impl)
        ops.shaped_attention = impl
        counts[name] = count_ops(lambda model=model: loss_of(model), lambda loss: loss.backward())
        model.zero_grad(set_to_none=True)
    return steps, counts


def compiled_steps(size: str, batch: int, seq: int, device: torch.device, dtype: torch.dtype,
                   repeats: int) -> list[dict]:
    """Whole-model `torch.compile` of a SAS-P training step (forward, loss, backward) with shaped
    attention as it was, as the Function and as plain ops (`KernelChoice.compiled_mix`, "plain" by
    default): the kernels inductor generates (forward + backward) and the median step time after
    compiling."""
    from torch._inductor import metrics

    import blocklab

    cfg = blocklab.ModelConfig.from_preset("sas-p", size, context_length=seq)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    library = ops.shaped_attention
    rows = []
    try:
        for name, impl, mix in [("compiled, before", before_shaped_attention, "plain"),
                                ("compiled, ops, Function", library, "function"),
                                ("compiled, ops, plain ops", library, "plain")]:
            ops.shaped_attention = impl
            with kernels.kernel_choice(compiled_mix=mix):
                torch._dynamo.reset()
                metrics.reset()
                torch.manual_seed(0)
                model = blocklab.LanguageModel(cfg).to(device)
                compiled = torch.compile(model)

                def step(model=model, compiled=compiled):
                    with autocast:
                        logits = compiled(ids[:, :-1])
                    F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten()).backward()
                    model.zero_grad(set_to_none=True)
                step()
                generated = metrics.generated_kernel_count
                ms = round_robin({name: step}, device.type == "cuda", 1, repeats)[name]
            rows.append({"variant": name, "part": "compiled step", "rel_err": None,
                         "inductor_kernels": generated, "median_ms": statistics.median(ms),
                         "min_ms": min(ms), "max_ms": max(ms)})
    finally:
        ops.shaped_attention = library
        torch._dynamo.reset()
    return rows


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
    p.add_argument("--parts", default="cv,shaped,mix", help="which of parts 1 and 2 to run: cv (C V "
                   "alone), shaped (the whole shaped attention), mix (shaped attention after SDPA)")
    p.add_argument("--compiled", action="store_true", help="also part 4: the SAS-P step under "
                   "torch.compile(model), shaped attention before / as the Function / as plain ops")
    p.add_argument("--out", type=Path, default=None, help="default results/centering-<device>.json")
    a = p.parse_args(argv)
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    shape = tuple(int(s) for s in a.shape.split(","))
    g = torch.Generator().manual_seed(0)
    cuda = device.type == "cuda"
    parts = set(a.parts.split(","))
    rows, grads, inputs = [], {}, {}
    for name, fn in (VARIANTS if "cv" in parts else {}).items():
        v = torch.randn(shape, generator=g).to(device, dtype)  # fresh values for every check
        with torch.no_grad():
            ref = reference(v)
            err = ((fn(v).double().cpu() - ref).norm() / ref.norm()).item()
        rows.append({"variant": name, "part": "C V", "rel_err": err})
        inputs[name], grads[name] = v, torch.randn(shape, generator=g).to(device, dtype)

    def pass_of(name):
        return lambda: VARIANTS[name](inputs[name].detach().requires_grad_(True)).backward(grads[name])

    times = round_robin({name: pass_of(name) for name in inputs}, cuda, a.warmup, a.repeats)

    shaped = {name: fns for name, fns in shaped_variants().items() if name.split(",")[0] in parts}
    for i, (name, (fn, ref_fn)) in enumerate(shaped.items()):
        args = shaped_inputs(shape, device, dtype, seed=10 + i, mix=name.startswith("mix"))
        grad = torch.randn(shape, generator=g).to(device, dtype)
        with other_scan(device, name.endswith("other scan")):
            errs = relative_errors(fn, ref_fn, args, grad)
            counts = shaped_op_counts(fn, args, grad)
        rows.append({"variant": name, "part": name.split(",")[0].replace("shaped", "shaped attention"),
                     "rel_err": errs["out"], "grad_rel_err": errs, "ops": counts})
        inputs[name], grads[name] = args, grad

    def shaped_pass(name):
        def run():
            with other_scan(device, name.endswith("other scan")):
                grads_of(shaped[name][0], inputs[name], grads[name])
        return run

    times |= round_robin({name: shaped_pass(name) for name in shaped}, cuda, a.warmup, a.repeats)

    current = ops.shaped_attention  # the training steps swap it; restored whatever happens
    try:
        if a.train_size:
            impls = {"before": before_shaped_attention, "ops.shaped_attention": current}
            steps, counts = train_steps(a.train_size, a.train_batch, shape[2], device, dtype, impls)
            ops.shaped_attention = current
            for name, ms in round_robin(steps, cuda, a.warmup, a.repeats).items():
                times[f"SAS-P step, {name}"] = ms
                rows.append({"variant": f"SAS-P step, {name}", "part": "SAS-P step", "rel_err": None,
                             "ops": counts[name]})
    finally:
        ops.shaped_attention = current
    for r in rows:
        ms = times[r["variant"]]
        r.update(median_ms=statistics.median(ms), min_ms=min(ms), max_ms=max(ms))
    if a.compiled and a.train_size:
        rows += compiled_steps(a.train_size, a.train_batch, shape[2], device, dtype, a.repeats)
    print_table(rows, a, shape, device)
    out = a.out or HERE / "results" / f"centering-{device.type}.json"
    out.write_text(json.dumps({"machine": machine_info(device.type, torch.get_num_threads()),
                               "options": vars(a) | {"out": str(out)},
                               "rows": rows}, indent=1) + "\n")
    return rows


BASELINES = {"C V": "before", "shaped attention": "shaped, before", "mix": "mix, before",
             "SAS-P step": "SAS-P step, before", "compiled step": "compiled, before"}


def print_table(rows: list[dict], a: argparse.Namespace, shape: tuple, device: torch.device) -> None:
    print(f"# forward+backward, shape {shape}, {a.dtype}, {device}, {torch.get_num_threads()} threads; "
          f"median of {a.repeats}, round-robin" + (f"; SAS-P training step at size {a.train_size}, batch "
                                                    f"{a.train_batch} x {shape[2]}" if a.train_size else ""))
    print("| part | variant | rel. error vs float64 (out; worst grad) | aten ops fwd + bwd | ms (min-max) "
          "| speed-up over before |")
    print("|---|---|---|---|---|---|")
    median = {r["variant"]: r["median_ms"] for r in rows}
    for r in rows:
        base = median.get(BASELINES[r["part"]], math.nan)
        err = "-" if r["rel_err"] is None else f"{r['rel_err']:.1e}"
        if "grad_rel_err" in r:
            err += f"; {max(v for k, v in r['grad_rel_err'].items() if k != 'out'):.1e}"
        n = r.get("ops")
        count = "-" if n is None else f"{n['forward']} + {n['backward']}"
        if "inductor_kernels" in r:
            count = f"{r['inductor_kernels']} inductor kernels"
        print(f"| {r['part']} | {r['variant']} | {err} | {count} | {r['median_ms']:.3f} ({r['min_ms']:.3f}-"
              f"{r['max_ms']:.3f}) | {base / r['median_ms']:.2f} |")


if __name__ == "__main__":
    main()
