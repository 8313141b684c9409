"""Where do compiled shaped attention's gradients go wrong on CUDA? A prepared check for a lent GPU.

On an H200 (2026-11-28, RESULTS.md "Compiled SAS-P and SAS against compiled Pre-LN") `compile_model()`
of SAS-P and SAS under bf16 autocast gave gradients 0.82 and 1.04 (relative) from float64 at sequence
1024, where the eager model's were 0.04 and 0.09; on the CPU both are right. This script compiles one
small model (head dim 64, as there) per variant, each turning off one CUDA-only piece of the compiled
path, and prints the gradient error of the eager and the compiled model against the same weights in
float64 on the CPU, with the parameters the compiled gradient misses most:

    default         the trainer's compile=true (fused projections, T-innermost scan, plain mix)
    no-fusion       fused projections off (`KernelChoice.fused_projections`)
    scan-outer      the prefix sums' scan along the outer axis (`KernelChoice.scan_t_innermost`)
    mix-function    the hand-written ShapedMix Function inside the graph (`KernelChoice.compiled_mix`)
    blocks          one graph per block (`compile_blocks`) instead of the whole trunk

    PYTHONPATH=src python benchmarks/compiled_shaped_check.py [--device cuda] [--t 1024]
        [--archs sas-p,pre-ln] [--variants default,no-fusion,...] [--out results.json]

A variant whose compiled error is within 1.5x the eager one (plus 1e-3) is marked ok.
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch

import blocklab
from blocklab.runtime import LanguageModel, kernels

VARIANTS = {
    "default": {},
    "no-fusion": {"fused_projections": frozenset()},
    "scan-outer": {"scan_t_innermost": frozenset()},
    "mix-function": {"compiled_mix": "function"},
    "blocks": {},
}


def model_for(arch: str, t: int) -> LanguageModel:
    """A small model away from its initial values (every parameter nudged), head dim 64."""
    torch.manual_seed(12)
    cfg = blocklab.ModelConfig.from_preset(arch, "tiny", n_layers=4, d_model=128, n_heads=2, mlp_hidden=256,
                                           vocab_size=61, context_length=t)
    model = LanguageModel(cfg).train()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def gradients(model, ids, autocast: bool) -> tuple[float, dict[str, torch.Tensor]]:
    x = ids.to(next(model.parameters()).device)
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
        loss = model(x, labels=torch.roll(x, -1, dims=1))
    loss.backward()
    return loss.item(), {n: p.grad.detach().double().cpu() for n, p in model.named_parameters()
                         if p.grad is not None}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check(arch: str, variant: str, t: int, device: str) -> dict:
    base = model_for(arch, t)
    ids = torch.randint(0, 61, (2, t), generator=torch.Generator().manual_seed(8))
    _, ref = gradients(copy.deepcopy(base).double(), ids, autocast=False)
    trusted = kernels.KERNELS.compiled_shaped | {device}
    with kernels.kernel_choice(**VARIANTS[variant], compiled_shaped=trusted):
        eager = copy.deepcopy(base).to(device)
        compiled = copy.deepcopy(base).to(device)
        began = time.perf_counter()
        compiled.compile_blocks() if variant == "blocks" else compiled.compile_model()
        _, got_eager = gradients(eager, ids, autocast=True)
        _, got = gradients(compiled, ids, autocast=True)
        seconds = time.perf_counter() - began
    flat = lambda g: torch.cat([g[n].flatten() for n in ref])  # noqa: E731
    eager_err, compiled_err = rel(flat(got_eager), flat(ref)), rel(flat(got), flat(ref))
    worst = sorted(((rel(got[n], ref[n]), n) for n in ref), reverse=True)[:3]
    fallback = getattr(compiled._trunk, "fallback", None) if variant != "blocks" else None
    return dict(arch=arch, variant=variant, t=t, eager=eager_err, compiled=compiled_err,
                seconds=seconds, ok=compiled_err <= 1.5 * eager_err + 1e-3,
                worst=[(n, e) for e, n in worst], fallback=fallback)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--t", type=int, default=1024)
    p.add_argument("--archs", default="sas-p,pre-ln")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out")
    args = p.parse_args(argv)
    rows = []
    print("| arch | variant | T | eager grad err | compiled grad err | ok | worst parameters (compiled) "
          "| s |")
    print("|---|---|---|---|---|---|---|---|")
    for arch in args.archs.split(","):
        for variant in args.variants.split(","):
            try:
                r = check(arch, variant, args.t, args.device)
            except Exception as e:  # one failing variant must not lose the others
                r = dict(arch=arch, variant=variant, t=args.t, error=f"{type(e).__name__}: {str(e)[:200]}")
                print(f"| {arch} | {variant} | {args.t} | failed: {r['error']} |", flush=True)
            else:
                worst = ", ".join(f"{n} {e:.2f}" for n, e in r["worst"])
                print(f"| {arch} | {variant} | {args.t} | {r['eager']:.4f} | {r['compiled']:.4f} | "
                      f"{'ok' if r['ok'] else 'WRONG'} | {worst} | {r['seconds']:.0f} |", flush=True)
            rows.append(r)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump({"device": args.device, "torch": torch.__version__, "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
