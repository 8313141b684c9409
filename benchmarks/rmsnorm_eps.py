"""How far apart the two RMSNorm epsilon placements are, by the RMS of the input.

    inside  (torch.nn.RMSNorm):               y = w x / sqrt(mean(x^2) + eps)
    outside (the Simplifying Transformer Blocks code): y = w x / (sqrt(mean(x^2)) + eps)

For inputs of RMS r (d = 768 Gaussian rows, float64, eps 1e-5 as in the SAS code) it prints the
relative difference of the outputs, ||y_out - y_in|| / ||y_in||, and of the input gradients of a fixed
random linear read-out, ||g_out - g_in|| / ||g_in||, and writes them to
benchmarks/results/rmsnorm-eps.json. No timing: the figures are exact arithmetic.

    PYTHONPATH=src python benchmarks/rmsnorm_eps.py [--eps 1e-5] [--dim 768]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from blocklab.model.norms import make_norm

RMS_VALUES = (1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.028, 0.1, 1.0)  # 0.028: a GPT-2-init residual stream


def differences(rms: float, eps: float, dim: int, rows: int = 256) -> tuple[float, float]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, dim, generator=g, dtype=torch.float64) * rms
    readout = torch.randn(dim, generator=g, dtype=torch.float64)
    outs, grads = [], []
    for outside in (False, True):
        norm = make_norm("rmsnorm", dim, eps, eps_outside=outside).double()
        xi = x.clone().requires_grad_(True)
        y = norm(xi)
        (y @ readout).sum().backward()
        assert xi.grad is not None
        outs.append(y.detach())
        grads.append(xi.grad)
    return (float((outs[1] - outs[0]).norm() / outs[0].norm()),
            float((grads[1] - grads[0]).norm() / grads[0].norm()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eps", type=float, default=1e-5)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "rmsnorm-eps.json"))
    args = parser.parse_args()
    rows = []
    print(f"| input RMS | output difference | input-gradient difference |  (eps {args.eps}, d {args.dim})")
    print("|---|---|---|")
    for rms in RMS_VALUES:
        out, grad = differences(rms, args.eps, args.dim)
        rows.append({"rms": rms, "output_rel_diff": out, "grad_rel_diff": grad})
        print(f"| {rms:g} | {100 * out:.3g}% | {100 * grad:.3g}% |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"eps": args.eps, "dim": args.dim, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
