"""`blocklab scaling`: train a ladder (or a piece of it), fit it, and write its report."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from blocklab.launch import cli as launch_cli
from blocklab.rounds import add_until_decided_arguments, budget_from_args
from blocklab.util.argtypes import config_and_overrides, positive_int
from blocklab.util.errors import ConfigError

THREADS_HELP = (
    "CPU threads for torch per run (torch.set_num_threads); default: with --jobs above 1 the "
    "cores split between the runs, else torch's own"
)


def _names(text: str | None) -> list[str] | None:
    """--archs as a list (None: not given); given but naming nothing (``,``, ``""``, ``" "``): []."""
    return None if text is None else [n.strip() for n in text.split(",") if n.strip()]


def user_fields(positionals: list[str] | None) -> dict:
    """The TrainConfig fields of `[CONFIG.yaml] [key=value ...]`, read as every command that trains
    several runs reads them (`training.command_line.config_fields`); a ladder file given there is named."""
    from blocklab.training.config import read_yaml

    config, _ = config_and_overrides(positionals or [])
    if config is not None and "rungs" in read_yaml(config):
        raise ConfigError(f"{config} is a ladder file, not a training config: pass it as --ladder {config}")
    from blocklab.training.command_line import config_fields

    return config_fields(positionals or [])


def cmd_scaling(args: argparse.Namespace) -> None:
    from blocklab.scaling.orchestrate import check_store
    from blocklab.scaling.outputs import check_outputs
    from blocklab.scaling.report import check_report_folder

    if args.list:
        _list()
        return
    ladder, name, archs = _chosen(args)
    root = Path(args.out) / name
    _check_flags(args)
    check_outputs(args, root)
    report, flag = _report_folder(args, root)
    check_report_folder(report, args.overwrite, flag)  # the user's files in it refused before anything trains
    check_store(archs, ladder, root, args.seeds, args.fresh, args.no_train)
    budget = budget_from_args(args)
    if budget is not None:
        _until_decided(args, ladder, archs, name, budget)
        return
    if args.claims:
        raise ConfigError("--claims names the claims --until-decided waits for: add --until-decided")
    if not _train(args, ladder, name, archs):
        return
    _report(args, ladder, name, archs, root)


def _list() -> None:
    """The shipped ladders (and where their files are), how to write one's own, and the headline claims."""
    from blocklab.scaling.ladders import LADDERS, SHIPPED
    from blocklab.statistics.claims import HEADLINES, PAPERS

    for name, ladder in LADDERS.items():
        print(f"ladder {name}: {ladder.description}; {ladder.tokens_line()}; {ladder.seeds} seeds; "
              f"archs {','.join(ladder.archs)}")
    print(f"\nthe shipped ladders are files in {SHIPPED}: copy one (or the example in docs/scaling.md), edit "
          "its rungs, tokens and learning-rate rule, and pass --ladder FILE.yaml\n")
    for h in HEADLINES:
        print(f"{h.id:<28} {h.arch} against {h.baseline}: {h.statement} ({PAPERS[h.paper]}, {h.where})")


def _chosen(args: argparse.Namespace):
    """The ladder (a shipped one or a file, with the user's config and overrides), its store's folder name
    and the architectures, checked."""
    from blocklab.scaling.ladders import check_archs, get_ladder, store_name
    from blocklab.scaling.overrides import with_user_fields

    name = store_name(args.ladder)
    fields = user_fields(args.overrides)
    ladder = with_user_fields(get_ladder(args.ladder), name.removeprefix("ladder-"), fields)
    archs = _names(args.archs)
    if archs is None:
        archs = list(ladder.archs)
    check_archs(archs)
    if len(archs) < 2:
        raise ConfigError(
            f"--archs {args.archs!r}: a ladder compares two or more architectures, the "
            "baseline first, e.g. pre-ln,resformer"
        )
    return ladder, name, archs


def _check_flags(args: argparse.Namespace) -> None:
    if args.seeds is not None and args.seeds < 1:
        raise ConfigError(f"--seeds {args.seeds} is not allowed: give 1 or more")
    if args.no_train and args.minutes is not None:
        raise ConfigError("--minutes trains a piece of the ladder: leave out --no-train")
    if args.no_train and args.fresh:
        raise ConfigError("--fresh retrains the runs whose config differs: leave out --no-train")


def _train(args: argparse.Namespace, ladder, name: str, archs: list[str]) -> bool:
    """Train what the call asks (nothing with --no-train; a piece with --minutes; else the whole ladder);
    whether the report follows (a piece leaves it to the call that trains the last run)."""
    from blocklab.scaling.orchestrate import train_ladder, train_piece

    if args.minutes is not None:
        export = Path(args.export) if args.export else None
        trained, left = train_piece(archs, ladder, name, args.out, args.minutes, args.seeds, export)
        print(f"piece: trained {len(trained)} runs; {left} left")
        return not left
    if not args.no_train:
        train_ladder(archs, ladder, name, args.out, args.seeds, launch_cli.launcher_from_args(args, args.out))
    return True


def _report_folder(args: argparse.Namespace, root: Path) -> tuple[Path, str]:
    """Where the report goes (--report; else with --until-decided the ladder folder's own `until-decided`,
    so that neither a call on some architectures nor the page's rebuild of the fixed-seed report replaces
    the other; else the store's ladder folder) and how its refusals name it."""
    from blocklab.rounds.commands import SCALING_FOLDER

    if args.report:
        return Path(args.report), "--report"
    if getattr(args, "until_decided", False):
        return root / SCALING_FOLDER, f"the ladder's {SCALING_FOLDER} folder"
    return root, "the ladder's folder"


def _report(args: argparse.Namespace, ladder, name: str, archs: list[str], root: Path) -> None:
    """Fit the whole seeds, write the report (and say where), and print the verdicts."""
    from blocklab.scaling.judge import judge_ladder, read_ladder
    from blocklab.scaling.report import write_scaling_report

    report, flag = _report_folder(args, root)
    data = read_ladder(root, ladder, archs, name)
    if not data.seeds():
        raise ConfigError(
            f"no seed has finished every rung for every architecture in {root}: train the ladder "
            "(leave out --no-train), or wait for the runs under way"
        )
    result = judge_ladder(data)
    command = shlex.join(
        ["blocklab", "scaling", "--ladder", args.ladder, "--archs", ",".join(archs), "--out", str(args.out),
         "--no-train", *(args.overrides or [])]
    )
    path = write_scaling_report(result, report, command, args.overwrite, flag)
    print(f"report: {path} (and {path.with_suffix('.html')}, {path.with_suffix('.json')})")
    for h in result.headlines:
        print(f"  {h.verdict:<13} {h.claim.id:<28} {h.text}")


def _until_decided(args: argparse.Namespace, ladder, archs: list[str], name: str, budget) -> None:
    """`--until-decided`: seeds added a round at a time until the headline claims are decided."""
    from blocklab.rounds.commands import note_in_report, scaling_rounds
    from blocklab.scaling.report import write_scaling_report
    from blocklab.statistics import sequential
    from blocklab.statistics.claims import HEADLINES

    if args.no_train or args.minutes is not None:
        raise ConfigError("--until-decided trains seeds in rounds: leave out --no-train and --minutes")
    judged = [h.id for h in HEADLINES if h.baseline == archs[0] and h.arch in archs[1:]]
    unknown = [c for c in _names(args.claims) or [] if c not in judged]
    if unknown:
        raise ConfigError(f"--claims {','.join(unknown)}: not a headline claim this ladder judges; choose "
                          f"from {', '.join(judged) or 'none (see --list)'}")
    launcher = launch_cli.launcher_from_args(args, args.out)
    result, outcome = scaling_rounds(archs, ladder, name, args.out, budget, args.seeds, launcher,
                                     _names(args.claims))
    command = shlex.join(["blocklab", *getattr(args, "argv", ["scaling"])])  # rerun: every run reused
    with sequential.in_use():
        report, flag = _report_folder(args, Path(args.out) / name)
        path = write_scaling_report(result, report, command, args.overwrite, flag)
    # what the reproduction page needs to rebuild the last look from the runs (headlines.page)
    about = {"ladder": args.ladder, "archs": archs, "claims": _names(args.claims) or judged,
             "overrides": list(args.overrides or []), "command": command}
    note_in_report(path, outcome, about)
    print(f"report: {path} (and {path.with_suffix('.html')}, {path.with_suffix('.json')})")
    for h in result.headlines:
        print(f"  {h.verdict:<13} {h.claim.id:<28} {h.text}")
    print("\n".join(outcome.lines()))


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
        "the paper's number beside them (docs/scaling.md); with --until-decided, in "
        "OUT/ladder-<name>/until-decided/ with until_decided.json. A training config and key=value overrides "
        "(as `blocklab train` takes them, e.g. data.source=corpus/) apply to every run; the ladder's own "
        "fields (the rungs' shapes, steps, batch, sequence length, learning-rate rule) are changed by a "
        "ladder file (--ladder FILE.yaml), not by overrides.",
    )
    _ladder_arguments(p)
    _store_arguments(p)
    _piece_arguments(p)
    p.add_argument("--list", action="store_true", help="list the ladders and the headline claims")
    p.add_argument("--claims", help="with --until-decided: the headline claims (comma-separated ids, see "
                   "--list) whose verdicts the rounds wait for (default: every one the ladder judges)")
    add_until_decided_arguments(p)
    p.add_argument("--threads", type=positive_int, help=THREADS_HELP)
    launch_cli.add_arguments(p)
    p.set_defaults(func=cmd_scaling, option_fields={"threads": "threads"})


def _ladder_arguments(p) -> None:
    """What trains: the config and overrides of every run, the architectures, the ladder and its seeds."""
    p.add_argument(
        "overrides",
        nargs="*",
        help="an optional YAML training config, then key=value overrides (TrainConfig fields), for every "
        "run of the ladder",
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
        "gpu-resformer (the paper's 82M-468M shapes), toy (seconds: a smoke), or a ladder file "
        "FILE.yaml of one's own (docs/scaling.md); see --list",
    )
    p.add_argument("--seeds", type=int, help="seeds per architecture and rung (default: the ladder's, 3)")


def _store_arguments(p) -> None:
    """Where the runs and the report go, and whether only finished runs are read."""
    p.add_argument("--out", default="runs/scaling", help="the run store (default runs/scaling)")
    p.add_argument("--report", help="write the report here instead of OUT/ladder-<name>/ (with "
                   "--until-decided: instead of OUT/ladder-<name>/until-decided/)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a scaling.md, .html, .json or figure in the report's folder, or an --export file, that "
        "blocklab did not write (by default such files are refused by name; blocklab's own are rewritten)",
    )
    p.add_argument(
        "--no-train",
        action="store_true",
        help="only read finished runs: fit and report on the seeds that finished every rung",
    )


def _piece_arguments(p) -> None:
    """A piece of the ladder trained in a lent time (--minutes, --export), and retraining stale runs."""
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
    p.add_argument(
        "--fresh",
        action="store_true",
        help="retrain the runs in the store whose config differs from this ladder's (refused without it); "
        "the others are reused",
    )
