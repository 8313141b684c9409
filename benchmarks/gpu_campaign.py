"""The GPU campaign: the papers' GPU-scale claims at short budgets and the MFU table, in pieces meant
to fit one 10-minute call each on one H100-class GPU. Times measured on one H200 (2026-11-26):

    python benchmarks/gpu_campaign.py mfu        # bench_gpu.py --quick: tokens/s, MFU, memory, decoding
                                                 # (pre-ln 70 s, four more archs 33 s, measured before the
                                                 # hand-written contender joined it: its eager and compiled
                                                 # rows add an estimated ~50 s; --budget-s caps it)
    python benchmarks/gpu_campaign.py resformer  # ResFormer-82M vs the Transformer, 3 seeds (131 s)
    python benchmarks/gpu_campaign.py sas-p      # codeparrot-18l: SAS and SAS-P vs Pre-LN, 3 seeds
                                                 # (6 runs took 250 s; all 9, about 6 min, not yet)
    python benchmarks/gpu_campaign.py all --smoke --device cpu   # every piece at a toy size: seconds

`benchmarks/gpu_session.sh` runs bench_gpu.py against the hand-written model, the CUDA tests, the smoke
and the ResFormer piece in one call (the MFU table with MFU=1), each under its own time limit. The
claims' runs go to `--out` (default benchmarks/reproduction-data, the committed run store) as
`blocklab reproduce --scale gpu-resformer-short|gpu-sas-p-short` lays them out, so `blocklab reproduce
--scale ... --no-train` rebuilds their reports; the weights are deleted when a piece ends (only the
small files are results). The MFU table goes to `--results` (default benchmarks/results/gpu.json).
A piece that was cut off resumes where it stopped: finished runs are reused, unfinished ones resume
from their last checkpoint. `--smoke` swaps in a 2-layer d-32 model, 3 steps, byte tokens and
`bench_gpu.py --smoke`, and writes under `--out` only: the tests run it on the CPU.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
PIECES = {
    # piece: (scale, the claims it judges)
    "resformer": ("gpu-resformer-short", ["resformer-beats-pre-ln"]),
    "sas-p": ("gpu-sas-p-short", ["sas-matches-pre-ln", "sas-p-throughput"]),
}
SMOKE_MODEL = {"d_model": 32, "n_layers": 2, "n_heads": 2, "mlp_hidden": 64}


def run_claims(piece: str, opts: argparse.Namespace) -> list[str]:
    """Train (or reuse) one piece's runs, write its report beside them, delete their weights; the
    verdicts as lines."""
    from blocklab.claims import select
    from blocklab.reproduce import SCALES, reproduce
    from blocklab.reproduce.page import write_reproduction

    name, claims = PIECES[piece]
    scale = SCALES[name]  # its runs train on the GPU (TrainConfig device "auto") in bf16 autocast
    if opts.smoke:
        data = {"source": str(opts.data), "tokenizer": "byte"} if opts.data else {"tokenizer": "byte"}
        scale = replace(scale, steps=3, eval_every=3, batch_size=4, seq_len=32, model=SMOKE_MODEL,
                        train={**scale.train, "eval_batches": 1, "data": data})
    rep = reproduce(select(claims), scale, opts.out, log=print, name=name)
    report = write_reproduction(rep, Path(opts.out) / name)
    for checkpoints in (Path(opts.out) / name).rglob("checkpoints"):
        shutil.rmtree(checkpoints)
    print(f"{piece}: report {report}")
    return [f"{name}: {r.claim.id}: {r.verdict}" for r in rep.results]


def run_mfu(opts: argparse.Namespace) -> list[str]:
    sys.path.insert(0, str(HERE))
    import bench_gpu

    args = ["--device", opts.device, "--smoke" if opts.smoke else "--quick", "--budget-s", str(opts.budget_s)]
    results = Path(opts.out) / "gpu-smoke.json" if opts.smoke else opts.results
    bench_gpu.main([*args, "--out", str(results)])
    return [f"mfu: {results}"]


def main(argv: list[str] | None = None) -> list[str]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("piece", choices=["mfu", *PIECES, "all"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, default=HERE / "reproduction-data")
    p.add_argument("--results", type=Path, default=HERE / "results" / "gpu.json")
    p.add_argument("--budget-s", type=float, default=300.0, help="bench_gpu.py's budget for the MFU table")
    p.add_argument("--smoke", action="store_true", help="toy sizes on any device: seconds")
    p.add_argument("--data", type=Path,
                   help="with --smoke: a folder of text files instead of the embedded corpus")
    opts = p.parse_args(argv)
    start = time.perf_counter()
    lines: list[str] = []
    for piece in (["mfu", *PIECES] if opts.piece == "all" else [opts.piece]):
        lines += run_mfu(opts) if piece == "mfu" else run_claims(piece, opts)
    print("\n".join(lines) + f"\ncampaign: {time.perf_counter() - start:.0f} s")
    return lines


if __name__ == "__main__":
    main()
