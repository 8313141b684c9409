"""`blocklab scaling`: train a ladder (or a piece of it), fit it, and write its report."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from blocklab.cli.args import positive_int
from blocklab.launch import cli as launch_cli
from blocklab.util.errors import ConfigError

THREADS_HELP = (
    "CPU threads for torch per run (torch.set_num_threads); default: with --jobs above 1 the "
    "cores split between the runs, else torch's own"
)


def _names(text: str | None) -> list[str] | None:
    return [n.strip() for n in text.split(",") if n.strip()] if text else None


def cmd_scaling(args: argparse.Namespace) -> None:
    from blocklab.scaling.judge import judge_ladder, read_ladder
    from blocklab.scaling.ladders import LADDERS, check_archs, get_ladder
    from blocklab.scaling.orchestrate import train_ladder, train_piece
    from blocklab.scaling.report import check_report_folder, write_scaling_report
    from blocklab.statistics.claims import HEADLINES, PAPERS

    if args.list:
        for name, ladder in LADDERS.items():
            print(
                f"ladder {name}: {ladder.description}; {ladder.seeds} seeds; archs {','.join(ladder.archs)}"
            )
        print()
        for h in HEADLINES:
            print(f"{h.id:<28} {h.arch} against {h.baseline}: {h.statement} ({PAPERS[h.paper]}, {h.where})")
        return
    ladder = get_ladder(args.ladder)
    archs = _names(args.archs) or list(ladder.archs)
    check_archs(archs)
    if len(archs) < 2:
        raise ConfigError(
            f"--archs {args.archs!r}: a ladder compares two or more architectures, the "
            "baseline first, e.g. pre-ln,resformer"
        )
    if args.seeds is not None and args.seeds < 1:
        raise ConfigError(f"--seeds {args.seeds} is not allowed: give 1 or more")
    name = f"ladder-{args.ladder}"
    root = Path(args.out) / name
    report, flag = (Path(args.report), "--report") if args.report else (root, "the ladder's folder")
    check_report_folder(report, args.overwrite, flag)  # before anything trains
    if args.minutes is not None:
        if args.no_train:
            raise ConfigError("--minutes trains a piece of the ladder: leave out --no-train")
        trained, left = train_piece(
            archs,
            ladder,
            name,
            args.out,
            args.minutes,
            args.seeds,
            Path(args.export) if args.export else None,
        )
        print(f"piece: trained {len(trained)} runs; {left} left")
        if left:
            return
    elif not args.no_train:
        train_ladder(archs, ladder, name, args.out, args.seeds, launch_cli.launcher_from_args(args, args.out))
    data = read_ladder(root, ladder, archs, name)
    if not data.seeds():
        raise ConfigError(
            f"no seed has finished every rung for every architecture in {root}: train the ladder "
            "(leave out --no-train), or wait for the runs under way"
        )
    result = judge_ladder(data)
    command = shlex.join(
        [
            "blocklab",
            "scaling",
            "--ladder",
            args.ladder,
            "--archs",
            ",".join(archs),
            "--out",
            str(args.out),
            "--no-train",
        ]
    )
    path = write_scaling_report(result, report, command, args.overwrite, flag)
    print(f"report: {path} (and {path.with_suffix('.html')}, {path.with_suffix('.json')})")
    for h in result.headlines:
        print(f"  {h.verdict:<13} {h.claim.id:<28} {h.text}")


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "scaling",
        help="train architectures at several sizes, fit loss against parameters, and "
        "judge the papers' headline numbers",
        description="Train each architecture at every rung of a ladder of sizes on the same "
        "tokens (OUT/ladder-<name>/<rung>/runs/<arch>-seed<k>; finished runs are reused and "
        "interrupted ones resume), fit loss against parameters, and write "
        "OUT/ladder-<name>/scaling.md, .html and .json: the papers' headline numbers ('x% "
        "fewer parameters', 'y% less data') with 95% intervals over seeds and a verdict each, "
        "the paper's number beside them (docs/scaling.md).",
    )
    p.add_argument(
        "--archs",
        help="comma-separated architectures, the baseline first (default: the "
        "ladder's: pre-ln,resformer,svformer,bov,sas-p)",
    )
    p.add_argument(
        "--ladder",
        default="cpu",
        help="cpu (default; 98 minutes measured on a 2-core CPU), "
        "gpu-resformer (the paper's 82M-468M shapes) or toy (seconds: a smoke); see --list",
    )
    p.add_argument("--seeds", type=int, help="seeds per architecture and rung (default: the ladder's, 3)")
    p.add_argument("--out", default="runs/scaling", help="the run store (default runs/scaling)")
    p.add_argument("--report", help="write the report here instead of OUT/ladder-<name>/")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a scaling.md, .html, .json or figure in the report's folder that blocklab did not "
        "write (by default such files are refused by name; blocklab's own are rewritten)",
    )
    p.add_argument(
        "--no-train",
        action="store_true",
        help="only read finished runs: fit and report on the seeds that finished every rung",
    )
    p.add_argument(
        "--minutes",
        type=float,
        help="train the next runs for about this many minutes, one "
        "at a time, starting a run only while its estimate fits (a lent GPU call); the report "
        "follows once every run has finished",
    )
    p.add_argument(
        "--export",
        help="with --minutes: a tarball of the store's small files, rewritten after "
        "each run (to bring a piece's runs back from a GPU machine)",
    )
    p.add_argument("--list", action="store_true", help="list the ladders and the headline claims")
    p.add_argument("--threads", type=positive_int, help=THREADS_HELP)
    launch_cli.add_arguments(p)
    p.set_defaults(func=cmd_scaling)
