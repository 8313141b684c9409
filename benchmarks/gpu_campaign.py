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
`bench_gpu.py --smoke`, and writes under `--out` only: the tests run it on the CPU. `--dry-run` prints
what `mfu` or a piece would run (the bench_gpu.py command, the runs' folder) and runs, trains and writes
nothing; `--budget-s` must be a positive number of seconds.

The `gpu-mid` campaign (issue 41) is trained a piece at a time, one piece per GPU call, into the
committed store (`blocklab.reproduce.budgeted_launch`):

    python benchmarks/gpu_campaign.py status                 # what remains: runs, estimated GPU minutes
    python benchmarks/gpu_campaign.py next --minutes 7 --export OUT/gpu-mid.tgz
                                                             # the next runs for 7 minutes, then what remains
    python benchmarks/gpu_campaign.py next --smoke --device cpu --minutes 5   # the same at toy sizes

`next` trains the learning-rate sweep first, then the claims' runs at 3 seeds at the swept rates, then
more seeds for checks still undecided (up to 9), as `blocklab reproduce --scale gpu-mid` would; it
starts a run only while its estimated time fits in the minutes left, resumes a cut-off run from its
checkpoint where one is (the same machine), records the GPU and commit of each run it finishes
(`trained_on.json`), deletes its weights, and rewrites the tarball `--export` after every run (the
small files of the scale's store, for `tar xzf TARBALL -C benchmarks/reproduction-data`). `--claims`
narrows the campaign; `--scale` picks another scale. `benchmarks/gpu_session.sh` runs it with
CAMPAIGN_MIN=M.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
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
CAMPAIGN_SCALE = "gpu-mid"
# 3 layers: learned-lambda-deeper fits a slope over the layers after the first
CAMPAIGN_SMOKE_MODEL = {**SMOKE_MODEL, "n_layers": 3}


def smoke_scale(scale, opts: argparse.Namespace):
    """`scale` at a toy size on `--device`: 4 steps (a sweep of 2) of 4 x 32 byte tokens, d 32 x 3
    layers, a checkpoint and a validation every 2 steps, one seed more at most for undecided checks."""
    data = {"source": str(opts.data), "tokenizer": "byte"} if opts.data else {"tokenizer": "byte"}
    train = {**scale.train, "eval_batches": 1, "log_every": 1, "ckpt_every": 2, "data": data,
             "device": opts.device}
    return replace(scale, description=f"a toy smoke of {scale.size} (d 32 x 3 layers, 4 x 32 byte tokens)",
                   steps=4, sweep_steps=2, eval_every=2, batch_size=4, seq_len=32,
                   model=CAMPAIGN_SMOKE_MODEL, train=train, timing_rounds=2, timing_steps=1,
                   max_seeds=scale.seeds + 1 if scale.max_seeds else None)


def run_campaign(opts: argparse.Namespace) -> list[str]:
    """`next`: train the campaign's next runs for `--minutes` (`pieces.run_piece`) and print what
    remains; `status` (or `next --dry-run`): only what remains."""
    from blocklab.reproduce import SCALES
    from blocklab.reproduce.budgeted_launch import run_device, run_piece
    from blocklab.reproduce.estimate import Estimator, remaining
    from blocklab.reproduce.orchestrate import scale_claims
    from blocklab.statistics.claims import select

    scale = SCALES[opts.scale]
    if opts.smoke:
        scale = smoke_scale(scale, opts)
    claims = scale_claims(select([c.strip() for c in opts.claims.split(",")] if opts.claims else None), scale)
    root = opts.out / opts.scale
    if opts.piece == "status" or opts.dry_run:
        device = run_device(scale.train.get("device", "auto"))
        if device == "cpu" and scale.trains_on == "gpu" and not opts.smoke:
            device = "any GPU"  # a plan made on a machine without one: the GPU runs' rate, or the prior
        left = remaining(claims, scale, root, Estimator(root, device))
        lines = left.lines()
    else:
        if opts.minutes is None:
            raise usage_error("next needs --minutes: the budget of this piece, a positive number")
        piece = run_piece(claims, scale, opts.scale, opts.out, opts.minutes, export=opts.export)
        lines = [f"piece: trained {len(piece.trained)} runs in {piece.seconds / 60:.1f} min on "
                 f"{piece.device}"]
        if piece.rep is not None:
            lines += [f"{opts.scale}: {r.claim.id}: {r.verdict}" for r in piece.rep.results]
        lines += piece.remaining.lines()
    if opts.export is not None and opts.export.is_file():
        lines.append(f"export: {opts.export} (tar xzf it -C benchmarks/reproduction-data)")
    return lines


def piece_scale(name: str, opts: argparse.Namespace):
    """The scale a piece's runs train at: `name`'s (on the GPU, TrainConfig device "auto", in bf16
    autocast), or with --smoke a toy size of it: 3 steps of 4 x 32 byte tokens, d 32 x 2 layers."""
    from blocklab.reproduce import SCALES

    scale = SCALES[name]
    if not opts.smoke:
        return scale
    data = {"source": str(opts.data), "tokenizer": "byte"} if opts.data else {"tokenizer": "byte"}
    return replace(scale, steps=3, eval_every=3, batch_size=4, seq_len=32, model=SMOKE_MODEL,
                   train={**scale.train, "eval_batches": 1, "data": data})


def run_claims(piece: str, opts: argparse.Namespace) -> list[str]:
    """Train (or reuse) one piece's runs, write its report beside them, delete their weights; the
    verdicts as lines. With --dry-run, only what it would do: nothing trained or written."""
    from blocklab.reproduce import reproduce
    from blocklab.reproduce.page import write_reproduction
    from blocklab.statistics.claims import select

    name, claims = PIECES[piece]
    scale = piece_scale(name, opts)
    if opts.dry_run:
        return [f"{piece}: would train (or reuse) the runs of {name} for {', '.join(claims)} in "
                f"{Path(opts.out) / name} (dry run: nothing trained or written)"]
    rep = reproduce(select(claims), scale, opts.out, log=print, name=name)
    report = write_reproduction(rep, Path(opts.out) / name)
    for checkpoints in (Path(opts.out) / name).rglob("checkpoints"):
        shutil.rmtree(checkpoints)
    print(f"{piece}: report {report}")
    return [f"{name}: {r.claim.id}: {r.verdict}" for r in rep.results]


def run_mfu(opts: argparse.Namespace) -> list[str]:
    """bench_gpu.py's MFU table into `--results` (with --smoke, beside the runs); with --dry-run, only
    the command it would run: nothing measured, nothing written."""
    from blocklab.util.commands import pasteable

    results = Path(opts.out) / "gpu-smoke.json" if opts.smoke else opts.results
    args = ["--device", opts.device, "--smoke" if opts.smoke else "--quick", "--budget-s", str(opts.budget_s),
            "--out", str(results)]
    if opts.dry_run:
        return [f"mfu: would run {pasteable('python', str(HERE / 'bench_gpu.py'), *args)} (dry run: nothing "
                "measured or written)"]
    sys.path.insert(0, str(HERE))
    import bench_gpu

    bench_gpu.main(args)
    return [f"mfu: {results}"]


def usage_error(message: str) -> SystemExit:
    """A bad option: one line on stderr naming it and what is allowed, exit status 2 (argparse's)."""
    print(f"gpu_campaign.py: error: {message}", file=sys.stderr)
    return SystemExit(2)


def check_options(opts: argparse.Namespace) -> None:
    """Every option checked before anything trains: a wrong one is found now, not after a run."""
    import torch

    from blocklab.reproduce import SCALES
    from blocklab.statistics.claims import select
    from blocklab.util.errors import ConfigError

    if not (math.isfinite(opts.budget_s) and opts.budget_s > 0):
        raise usage_error(f"--budget-s {opts.budget_s:g} is not allowed: give bench_gpu.py's budget as a "
                          "positive number of seconds, e.g. --budget-s 300")
    if opts.minutes is not None and not (math.isfinite(opts.minutes) and opts.minutes > 0):
        raise usage_error(f"--minutes {opts.minutes:g} is not allowed: give a positive number of minutes, "
                          "e.g. --minutes 7")
    if opts.scale not in SCALES:
        raise usage_error(f"--scale {opts.scale!r} is not allowed: choose one of {', '.join(SCALES)}")
    try:
        select([c.strip() for c in opts.claims.split(",")] if opts.claims else None)
    except ConfigError as err:
        raise usage_error(f"--claims {opts.claims!r} is not allowed: {err}") from None
    try:
        torch.device(opts.device)
    except RuntimeError:
        raise usage_error(f"--device {opts.device!r} is not allowed: give a torch device, e.g. cuda, "
                          "cuda:1 or cpu") from None
    if opts.export is not None:  # its folder is made now (as the export would), and written to once
        folder = opts.export.absolute().parent
        try:
            if opts.export.is_dir():
                raise IsADirectoryError(opts.export)
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):  # permissions alone miss /proc, read-only mounts ...
                pass
        except OSError:
            raise usage_error(f"--export {opts.export} is not allowed: {str(folder)!r} is not a folder this "
                              "user can write to; give a .tgz path in one") from None


def main(argv: list[str] | None = None) -> list[str]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("piece", choices=["mfu", *PIECES, "all", "next", "status"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path,
                   help="the run store (default reproduction-data beside this script; with next --smoke, a "
                   "new temporary folder)")
    p.add_argument("--results", type=Path, default=HERE / "results" / "gpu.json")
    p.add_argument("--budget-s", type=float, default=300.0, help="bench_gpu.py's budget for the MFU table")
    p.add_argument("--smoke", action="store_true", help="toy sizes on any device: seconds")
    p.add_argument("--data", type=Path,
                   help="with --smoke: a folder of text files instead of the embedded corpus")
    p.add_argument("--minutes", type=float,
                   help="next: this piece's budget; no run starts whose estimate does not fit")
    p.add_argument("--scale", default=CAMPAIGN_SCALE,
                   help="next, status: the campaign's scale (default gpu-mid)")
    p.add_argument("--claims",
                   help="next, status: comma-separated claim ids (default: all the scale judges)")
    p.add_argument("--export", type=Path, help="next: write the scale's small files to this tarball after "
                   "every run (for a GPU call's $OUT)")
    p.add_argument("--dry-run", action="store_true", help="next: print what remains; mfu and the pieces: "
                   "print what they would run; nothing trains and nothing is written")
    opts = p.parse_args(argv)
    check_options(opts)
    if opts.out is None:
        opts.out = Path(tempfile.mkdtemp(prefix="campaign-smoke-")) if opts.smoke and opts.piece in (
            "next", "status") else HERE / "reproduction-data"
    start = time.perf_counter()
    lines: list[str] = []
    if opts.piece in ("next", "status"):
        lines = run_campaign(opts)
        print("\n".join(lines) + f"\ncampaign: {time.perf_counter() - start:.0f} s")
        return lines
    for piece in (["mfu", *PIECES] if opts.piece == "all" else [opts.piece]):
        lines += run_mfu(opts) if piece == "mfu" else run_claims(piece, opts)
    print("\n".join(lines) + f"\ncampaign: {time.perf_counter() - start:.0f} s")
    return lines


if __name__ == "__main__":
    main()
