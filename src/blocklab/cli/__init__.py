"""blocklab: train, compare and inspect the Transformer block and value-path variants of three papers
(Simplifying Transformer Blocks, Value Residual Learning, Bank of Values), side by side."""

from __future__ import annotations

import argparse
import functools
import sys
import traceback
from importlib import metadata

from blocklab import __version__
from blocklab.cli import args as cli_args
from blocklab.cli import import_hf as import_hf_cli
from blocklab.cli import prepare as prepare_cli
from blocklab.cli import trained as trained_cli
from blocklab.eval import cli as eval_cli
from blocklab.finetune import cli as finetune_cli
from blocklab.launch import cli as launch_cli
from blocklab.rounds import add_until_decided_arguments, budget_from_args
from blocklab.scaling import cli as scaling_cli
from blocklab.util.commands import pasteable
from blocklab.util.errors import ConfigError, DiskFullError
from blocklab.util.pathtext import refused_path

# torch and the model load inside the commands, so that --help and --version answer at once.

EXAMPLES = """examples:
  blocklab presets                                   every architecture, value path and size
  blocklab prepare data.source=corpus.jsonl          tokenise once; train then reads the cache
  blocklab train arch=sas-p size=tiny max_steps=300 --out runs/sas-p
  blocklab train arch=pre-ln+bov model.value_path_options.layers=[2,3] max_steps=300
  blocklab compare --archs pre-ln,sas-p,bov --seeds 3 --threads 2 --out runs/cmp
  blocklab scaling --archs pre-ln,resformer --ladder cpu --seeds 3 --out runs/scaling
  blocklab generate --run runs/sas-p --prompt "def main("
  blocklab diagnose --run runs/sas-p
  blocklab export --run runs/sas-p --out exported/sas-p

`blocklab COMMAND --help` explains each command. Overrides are key=value pairs of TrainConfig fields,
dotted for nested ones, before or after the options; values are read as YAML (lists [1,2], dicts
{layers: [1, 2]})."""


def _version() -> str:
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    return f"blocklab {__version__} (torch {torch_version}, python {sys.version.split()[0]})"


def cmd_params(args: argparse.Namespace) -> None:
    from blocklab.report import params_rows, params_table

    archs = None if args.all else args.arch.split(",")  # None: every block preset and value path
    print(params_table(params_rows(archs, args.size.split(","))))


def cmd_presets(_args: argparse.Namespace) -> None:
    from blocklab.model.presets import list_presets

    for group, entries in list_presets().items():
        print(f"{group}:")
        for name, text in entries.items():
            print(cli_args.wrapped(name, text, width=max(map(len, entries)) + 1))
    print("\ncombine a block preset and a value path with +, e.g. arch=sas-p+bov; see blocklab params")


def cmd_train(args: argparse.Namespace) -> None:
    from blocklab.training import TrainingError, distributed, train
    from blocklab.training.config import resolve_config
    from blocklab.util.progress import format_summary

    config, overrides = cli_args.config_and_overrides(args.overrides)
    if args.out:
        overrides.append(f"out_dir={args.out}")
    if args.threads:
        overrides.append(f"threads={args.threads}")
    # on --resume, DIR/config.yaml is the base: `blocklab train --resume --out DIR` needs nothing else
    cfg = resolve_config(config, overrides, resume=args.resume)
    try:
        result = train(cfg, resume=args.resume)
    except TrainingError as err:
        print(f"blocklab: error: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise KeyboardInterrupt(_interrupted(cfg.out_dir)) from None
    if distributed.launch_rank() != 0:  # one summary line per run, not one per process
        return
    print(f"{result.run_dir}: {format_summary(result)}")


def _interrupted(out_dir: str) -> str:
    """What a rerun after Ctrl-C does: go on from the last checkpoint, or start again."""
    from blocklab.training.checkpoint import latest_checkpoint

    last = latest_checkpoint(out_dir)
    if last is None:
        return (f"{out_dir} has no checkpoint yet, so a rerun starts from step 0 (add overwrite=true, or "
                "--resume, which says so and starts again)")
    return f"`{pasteable('blocklab', 'train', '--resume', '--out', out_dir)}` continues from {last.name}"


THREADS_HELP = ("CPU threads for torch (torch.set_num_threads); default: torch's own, one per core or "
                "OMP_NUM_THREADS; on a shared machine set it")
RUN_THREADS = "; per run: with --jobs above 1, the cores split between the runs unless this says otherwise"
DEFAULT_ARCHS = "pre-ln,sas,sas-p,resformer,svformer,bov"


def cmd_compare(args: argparse.Namespace) -> None:
    from blocklab.compare import BUDGETS, GRIDS, compare, resolve_compare
    from blocklab.launch import RunsFailed
    from blocklab.report import summary_table

    if args.list_grids:
        for name, grid in GRIDS.items():
            rows = ", ".join(e.label for e in grid.entries)
            text = f"[equal {grid.budget}] {grid.description}: {rows}"
            print(cli_args.wrapped(name, text, width=20, indent=0))
        return
    from blocklab.recipes import COMPARE_CONFIG
    from blocklab.training.config import read_yaml

    # every run starts from the YAML config (compare's own recipe when none is named), then the overrides
    config, overrides = cli_args.config_and_overrides(args.overrides)
    base = read_yaml(config or COMPARE_CONFIG)
    if args.quiet:
        base["progress"] = False
    if args.threads:
        base["threads"] = args.threads
    archs = [a.strip() for a in args.archs.split(",") if a.strip()]
    budget = {kind: getattr(args, kind) for kind in BUDGETS}  # the equal-budget rule's flags
    entries, base = resolve_compare(archs, args.grid, base, budget=budget, overrides=overrides)
    sweep = None
    if args.lr_sweep:
        try:
            sweep = [float(r) for r in args.lr_sweep.split(",") if r.strip()]
        except ValueError:
            raise ConfigError(f"--lr-sweep {args.lr_sweep!r} is not allowed: give comma-separated learning "
                              "rates, e.g. 1e-3,3e-3,1e-2.") from None
    launcher = launch_cli.launcher_from_args(args, args.out)
    rounds = budget_from_args(args)
    run = compare
    if rounds is not None:  # seeds added in rounds until the verdict is decided
        from blocklab.rounds.commands import compare_command

        run = functools.partial(compare_command, budget=rounds)
    try:
        report = run(entries, args.out, seeds=args.seeds, base=base, fresh=args.fresh, lr_sweep=sweep,
                     sweep_steps=args.sweep_steps, command=pasteable("blocklab", *args.argv),
                     timing_rounds=args.timing_rounds, launcher=launcher, add=args.add,
                     overwrite=args.overwrite)
    except RunsFailed as err:  # the report of the runs that finished, then the failures (exit status 1)
        if err.report is not None:
            _print_report(err.report, summary_table)
        raise
    _print_report(report, summary_table)


def _print_report(report, summary_table) -> None:
    print(f"report: {report} (and {report.with_suffix('.html')})")
    print(summary_table(report.parent))


def cmd_reproduce(args: argparse.Namespace) -> None:
    from pathlib import Path

    from blocklab.reproduce import SCALES, reproduce, tracking
    from blocklab.reproduce.page import scope, write_reproduction, write_summary
    from blocklab.statistics.claims import select

    def names(text):
        return [n.strip() for n in text.split(",") if n.strip()] if text else None

    claims = select(names(args.claims), names(args.paper), quick=args.quick)
    if args.list:
        for c in claims:
            print(f"{c.id:<30} {c.paper:<15} {c.where:<20} {c.statement}")
        print("\nscales: " + "; ".join(f"{k}: {v.describe()}" for k, v in SCALES.items()))
        return
    scales = names(args.scale) or ["quick" if args.quick else "cpu"]
    launcher = launch_cli.launcher_from_args(args, args.out)
    if args.partial and not args.no_train:
        raise ConfigError("--partial is allowed only with --no-train: a training call trains every run it "
                          "judges.")
    tracked = tracking.fields(args)
    from blocklab.training.command_line import config_fields

    fields = config_fields(args.overrides)  # on every run of every claim
    budget = budget_from_args(args)
    if budget is not None:  # seeds added in rounds until the claims are decided
        from blocklab.rounds.commands import reproduce_command

        return reproduce_command(args, claims, scales, launcher, tracked, budget, fields)
    reps = [reproduce(claims, scale, args.out, train=not args.no_train, launcher=launcher,
                      partial=args.partial, tracking=tracked, overrides=fields) for scale in scales]
    if len(reps) == 1:
        path = write_reproduction(reps[0], args.report or args.out)
        tracking.send_figures(tracked, [(reps[0].scale_name, path)], args.out)
        print(f"report: {path} (and {path.with_suffix('.html')})")
    else:  # each scale's report beside its runs, and one page over them all
        written = [(rep.scale_name, write_reproduction(rep, Path(args.out) / rep.scale_name)) for rep in reps]
        tracking.send_figures(tracked, written, args.out)
        report = args.report or str(Path(args.out) / "REPRODUCTION.md")
        words = ["blocklab", "reproduce", "--scale", ",".join(scales), "--no-train",
                 *(["--partial"] if args.partial else []), "--out", args.out, "--report", report]
        for option, value in (("--claims", args.claims), ("--paper", args.paper)):
            words += [option, value] if value else []
        command = pasteable(*words, *(["--quick"] if args.quick else []), *args.overrides)
        from blocklab.headlines.page import headline_section

        path = write_summary(reps, report, command, notes=Path(args.out) / "notes.md",
                             extra=headline_section(Path(args.out), Path(report).parent))
        print(f"report: {path} (each scale's in {args.out}/<scale>/reproduction.md)")
    for rep in reps:  # each verdict with the scope the report gives it
        for r in rep.results:
            print(f"  {rep.scale_name:<10} {r.verdict:<13} {r.claim.id:<30} ({scope(rep, r)})")


def cmd_plot(args: argparse.Namespace) -> None:
    from blocklab.plot import plot_runs

    path = plot_runs(args.runs, args.out, args.overwrite)
    print(f"plot: {path} (and {path.with_suffix('.html')}, PNGs beside them)")


def _add_params(sub) -> None:
    """`blocklab params`: parameter counts and FLOPs of presets."""
    p = sub.add_parser("params", help="parameter counts and FLOPs per token of presets")
    p.add_argument("--arch", default="pre-ln", help="architecture preset(s), comma-separated")
    p.add_argument("--size", default="tiny", help="size preset(s), comma-separated")
    p.add_argument("--all", action="store_true", help="every block preset and value path")
    p.set_defaults(func=cmd_params)


def _add_presets(sub) -> None:
    """`blocklab presets`: every preset."""
    p = sub.add_parser("presets", help="list every architecture, value-path and size preset")
    p.set_defaults(func=cmd_presets)


def _add_train(sub) -> None:
    """`blocklab train`: one model from a config and overrides."""
    p = sub.add_parser("train", help="train one model: [CONFIG.yaml] [key=value ...]",
                       description="Train any preset. Overrides use TrainConfig fields, dotted for "
                       "sections: arch=sas-p size=tiny max_steps=200 optim.lr=3e-3 data.tokenizer=byte "
                       "model.n_layers=4.")
    p.add_argument("overrides", nargs="*", help="an optional YAML config, then key=value overrides")
    p.add_argument("--out", help="run directory (same as out_dir=...)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in out_dir from its last checkpoint")
    p.add_argument("--threads", type=cli_args.positive_int, help=THREADS_HELP)
    p.set_defaults(func=cmd_train, option_fields={"out": "out_dir", "threads": "threads"})


# compare's options before its TrainConfig fields became overrides: {option: the override to write}
COMPARE_MOVED = {"--size": "size", "--lr": "optim.lr", "--batch-size": "batch_size", "--seq-len": "seq_len",
                 "--eval-every": "eval_every"}


def _add_compare(sub) -> None:
    """`blocklab compare`: its architectures, seeds, budget rule, grid, sweep, timing and launch flags; every
    TrainConfig field is a key=value override (or a YAML config's), as in `blocklab train`."""
    from blocklab.recipes import compare_defaults

    p = sub.add_parser("compare", help="train architectures side by side on one budget and write a report: "
                       "[CONFIG.yaml] [key=value ...]",
                       description="Train each architecture on the same data, tokenizer, batch order and "
                       "budget, then write OUT/report.md and OUT/report.html. Finished runs are reused; an "
                       "interrupted one resumes. Every run starts from CONFIG.yaml (default: compare's "
                       f"recipe, blocklab/recipes/compare.yaml: {compare_defaults()}; TrainConfig's defaults "
                       "for the rest), then the key=value overrides, as in `blocklab train`: e.g. size=small "
                       "optim.lr=2e-3 eval_every=100 data.source=corpus/. Optimiser fields that neither sets "
                       "come from the main job's recipe for each architecture at sizes tiny and small "
                       "(blocklab/recipes/main_job_optim.json). The architecture, seed and out_dir are "
                       "compare's own (--archs, --seeds, --out): a config's are replaced, an override's "
                       "refused.")
    p.add_argument("overrides", nargs="*", help="an optional YAML config (a file, or a recipe's name), then "
                   "TrainConfig overrides for every run, e.g. size=small optim.lr=2e-3")
    p.add_argument("--archs", default=DEFAULT_ARCHS,
                   help=f"comma-separated presets (default {DEFAULT_ARCHS})")
    p.add_argument("--grid", help="a named grid of a paper experiment instead of --archs (see --list-grids); "
                   "its size is the grid's own unless size=... says otherwise")
    p.add_argument("--list-grids", action="store_true", help="list the named grids")
    p.add_argument("--seeds", type=cli_args.positive_int, default=2,
                   help="seeds per architecture, paired by seed (default 2)")
    p.add_argument("--out", default="runs/compare")
    # the equal-budget rule: the runs are equal in exactly one of these (docs/compare.md, "Budgets")
    p.add_argument("--steps", type=int, help="equal steps (and tokens) per run; without a budget flag or a "
                   "max_* field, 150 steps, or a grid's own budget kind (see --list-grids) at what the first "
                   "architecture spends in 150 steps")
    p.add_argument("--tokens", type=int, help="equal tokens per run")
    p.add_argument("--flops", type=float, help="equal analytic training FLOPs per run")
    p.add_argument("--time", type=float, help="equal training wall-clock seconds per run")
    cli_args.add_moved_options(p, COMPARE_MOVED)
    p.add_argument("--lr-sweep", help="comma-separated peak learning rates: each architecture trains seed 0 "
                   "at each on a short budget and keeps the best on held-out loss for all seeds")
    p.add_argument("--sweep-steps", type=int,
                   help="steps of each sweep run (default: a quarter of --steps, or 100)")
    p.add_argument("--fresh", action="store_true", help="retrain every run instead of reusing finished ones")
    p.add_argument("--overwrite", action="store_true", help="replace a report.md, report.html or "
                   "results.json in --out that blocklab compare did not write (refused without it)")
    p.add_argument("--add", action="append", default=[], metavar="RUN",
                   help="a finished run trained elsewhere (blocklab train, another compare) to bring into "
                   "the report; repeatable. It must share the data, tokenizer and held-out windows; one that "
                   "matches an architecture's config but for its seed joins it as another seed")
    p.add_argument("--timing-rounds", type=int, default=5,
                   help="interleaved rounds of timed steps per architecture after training, for the "
                   "throughput table (0 skips them)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bars or data-preparation messages (each run's result line and the table "
                   "still print)")
    p.add_argument("--threads", type=cli_args.positive_int, help=THREADS_HELP + RUN_THREADS)
    add_until_decided_arguments(p)
    launch_cli.add_arguments(p)
    p.set_defaults(func=cmd_compare, option_fields={"threads": "threads"})


def _add_reproduce(sub) -> None:
    """`blocklab reproduce`: the claims, the scale, the store and the launch flags."""
    p = sub.add_parser("reproduce", help="run the papers' claims with seeds and intervals, a verdict each",
                       description="Train (or reuse) the runs the chosen claims need at one scale, pair them "
                       "by seed, and write OUT/reproduction.md and .html: per claim the paper's result next "
                       "to ours, the per-seed differences with a 95% t-interval, plots and a verdict. Every "
                       "run starts from the scale's settings (see --list), then CONFIG.yaml's fields and the "
                       "key=value overrides, as in `blocklab train`: e.g. data.source=corpus/ runs the "
                       "claims on your data. Refused: the architecture, seed, out_dir and budget (the "
                       "scale's), a field a selected claim varies itself (e.g. model.value_path), and the "
                       "learning rate at a scale whose sweep chooses it; and a store holding runs of another "
                       "config.")
    p.add_argument("overrides", nargs="*", help="an optional YAML config (a file, or a recipe's name), then "
                   "TrainConfig overrides for every run, e.g. data.source=corpus/ model.n_layers=6")
    p.add_argument("--claims", help="comma-separated claim ids (default: all; see --list)")
    p.add_argument("--paper", help="only the claims of these papers: simplifying, value-residual, "
                   "bank-of-values")
    p.add_argument("--quick", action="store_true",
                   help="the claims tagged quick at scale quick: about 10 minutes on a 2-core CPU")
    p.add_argument("--scale", help="quick, cpu, cpu-deep, gpu-resformer, gpu-sas-p, or several separated by "
                   "commas (default: cpu, or quick)")
    p.add_argument("--out", default="runs/reproduce", help="the run store and, by default, the report")
    p.add_argument("--report", help="write the report here instead of OUT; with several scales, the path of "
                   "the page over them all (default OUT/REPRODUCTION.md; each scale's report goes to "
                   "OUT/<scale>/, and OUT/notes.md, if there, is included as the page's reading)")
    p.add_argument("--no-train", action="store_true",
                   help="only read runs that exist (a missing one is an error): rebuilds the report from the "
                   "run data exactly")
    p.add_argument("--partial", action="store_true",
                   help="with --no-train: judge the claims whose runs have finished; the others read pending "
                   "(the report of a campaign still under way)")
    p.add_argument("--list", action="store_true", help="list the selected claims and the scales")
    p.add_argument("--threads", type=cli_args.positive_int, help=THREADS_HELP + RUN_THREADS)
    cli_args.add_tracking_arguments(p)
    add_until_decided_arguments(p)
    launch_cli.add_arguments(p)
    p.set_defaults(func=cmd_reproduce)


def _add_plot(sub) -> None:
    """`blocklab plot`: learning curves of runs, overlaid."""
    p = sub.add_parser("plot", help="learning curves of any runs, overlaid (PNG, markdown, HTML)",
                       description="Validation loss and bits per byte of one or more runs against step, "
                       "tokens, training FLOPs and wall-clock, overlaid: OUT/loss_vs_<axis>.png, OUT/plot.md "
                       "and OUT/plot.html.")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (blocklab train's --out, a "
                   "compare's runs/<arch>-seed<k>); finished or still training")
    p.add_argument("--out", default="runs/plot", help="where the figures and pages go (default runs/plot)")
    p.add_argument("--overwrite", action="store_true", help="replace a plot.md, plot.html or loss_vs_*.png "
                   "in --out that blocklab did not write (by default refused by name)")
    p.set_defaults(func=cmd_plot)


def build_parser() -> argparse.ArgumentParser:
    """The `blocklab` command line: one subcommand per job, each added by its own function."""
    parser = argparse.ArgumentParser(prog="blocklab", description=__doc__, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_params(sub)
    _add_presets(sub)
    prepare_cli.add_parsers(sub)
    _add_train(sub)
    _add_compare(sub)
    _add_reproduce(sub)
    scaling_cli.add_parsers(sub)
    _add_plot(sub)
    trained_cli.add_parsers(sub, ("diagnose", "export"))
    import_hf_cli.add_parsers(sub)
    trained_cli.add_parsers(sub, ("generate",))
    finetune_cli.add_parsers(sub)
    eval_cli.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; the exit status: 0 done, 1 a run failed or the machine refused, 2 bad input,
    130 interrupted."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:  # overrides after options too (cli_args.parse), and no argument that is not valid text
        args = cli_args.parse(parser, argv)
    except ConfigError as err:
        print(f"blocklab: error: {err}", file=sys.stderr)
        return 2
    args.argv = argv  # the command line, for the report's method section
    from blocklab.launch.plan import RunsFailed, RunsPending

    try:
        args.func(args)
    except (ConfigError, FileNotFoundError, FileExistsError) as err:  # bad input: named, no traceback
        print(f"blocklab: error: {err}", file=sys.stderr)
        return 2
    except RunsPending as err:  # --no-wait: submitted, nothing wrong
        print(f"blocklab: {err}")
        return 0
    except (RunsFailed, DiskFullError) as err:  # DiskFullError: `train` says it alike (cmd_train)
        print(f"blocklab: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:
        # str(err): the exception itself is always true, even when it says nothing
        print(f"blocklab: interrupted; {str(err) or 'rerun the same command: finished runs are reused'}",
              file=sys.stderr)
        return 130
    except OSError as err:  # the machine's, not blocklab's: permissions, a full or read-only disk ...
        refused = refused_path(err)  # a path this user cannot write: one to change, like other bad input
        print(f"blocklab: error: {refused or err}", file=sys.stderr)
        return 1 if refused is None else 2
    except Exception:  # not a mistake in the input (those are named above): a bug, with its traceback
        traceback.print_exc()
        command = pasteable("blocklab", *argv)
        print(f"blocklab: internal error (traceback above) in `{command}`: this is a bug in "
              "blocklab, not in your input. Please report it with the command and the traceback.",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
