"""The `blocklab` command line: thin argument parsing over the library."""

from __future__ import annotations

import argparse
import sys

import torch

from blocklab.accounting import count_parameters, flops_per_token
from blocklab.config import ConfigError, ModelConfig
from blocklab.eval import cli as eval_cli
from blocklab.finetune import cli as finetune_cli
from blocklab.model import Transformer
from blocklab.model.value_paths import VALUE_PATHS
from blocklab.presets import BLOCK_PRESETS, list_presets


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: give a positive integer")
    return value


def _params_row(arch: str, size: str) -> dict:
    cfg = ModelConfig.from_preset(arch, size=size)
    with torch.device("meta"):
        model = Transformer(cfg)
    counts = count_parameters(model)
    return dict(arch=arch, size=size, total=counts.total, embedding=counts.embedding,
                value_tables=counts.value_tables, non_embedding=counts.non_embedding,
                flops_per_token=flops_per_token(model))


def _print_table(rows: list[dict]) -> None:
    head = (f"{'arch':<32} {'size':<15} {'total':>9} {'embed':>9} {'v-tables':>9} {'non-emb':>9} "
            f"{'FLOPs/tok':>10}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['arch']:<32} {r['size']:<15} {r['total'] / 1e6:>8.2f}M {r['embedding'] / 1e6:>8.2f}M "
              f"{r['value_tables'] / 1e6:>8.2f}M {r['non_embedding'] / 1e6:>8.2f}M "
              f"{r['flops_per_token'] / 1e6:>9.1f}M")
    print("FLOPs/tok: analytic training FLOPs per token (forward + backward) at the context length.")


def cmd_params(args: argparse.Namespace) -> None:
    if args.all:  # every block preset, then every value path on a Pre-LN block
        archs = list(BLOCK_PRESETS) + [f"pre-ln+{vp}" for vp in VALUE_PATHS if vp != "standard"]
    else:
        archs = args.arch.split(",")
    sizes = args.size.split(",")
    _print_table([_params_row(a, s) for s in sizes for a in archs])


def cmd_presets(args: argparse.Namespace) -> None:
    for group, entries in list_presets().items():
        print(f"{group}:")
        for name, text in entries.items():
            print(f"  {name:<18} {text}")


def cmd_train(args: argparse.Namespace) -> None:
    from blocklab.training import TrainingError, distributed, train
    from blocklab.training.config import resolve_config

    config, overrides = None, list(args.overrides)
    if overrides and "=" not in overrides[0]:  # the first positional is a YAML file
        config = overrides.pop(0)
    if args.out:
        overrides.append(f"out_dir={args.out}")
    # on --resume, DIR/config.yaml is the base: `blocklab train --resume --out DIR` needs nothing else
    cfg = resolve_config(config, overrides, resume=args.resume)
    try:
        result = train(cfg, resume=args.resume)
    except TrainingError as err:
        print(f"blocklab: error: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    if distributed.launch_rank() != 0:  # one summary line per run, not one per process
        return
    s = result.summary
    bpb = f", val bits/byte {s['val_bpb']:.3f}" if s["val_bpb"] is not None else ""
    speed = f" ({s['tokens_per_s']:,.0f} tokens/s)" if s["tokens_per_s"] else ""
    print(f"{result.run_dir}: {s['step']} steps, {s['tokens']:,} tokens in {s['train_time']:.0f} s"
          f"{speed}; val loss {s['val_loss']:.4f}{bpb}")


DEFAULT_ARCHS = "pre-ln,sas,sas-p,resformer,svformer,bov"


def cmd_compare(args: argparse.Namespace) -> None:
    from blocklab.compare import BUDGETS, DEFAULT_STEPS, GRIDS, TINY_LR, Entry, compare, default_budget
    from blocklab.training.config import _set_dotted, _split_override

    if args.list_grids:
        for name, grid in GRIDS.items():
            print(f"{name:<20} [equal {grid.budget}] {grid.description}: "
                  f"{', '.join(e.label for e in grid.entries)}")
        return
    base: dict = {"size": args.size, "batch_size": args.batch_size, "seq_len": args.seq_len,
                  "eval_every": args.eval_every, "progress": not args.quiet}
    kind = "steps"
    if args.grid:
        if args.grid not in GRIDS:
            raise ConfigError(f"--grid {args.grid!r} is not allowed: choose one of {', '.join(GRIDS)}.")
        grid = GRIDS[args.grid]
        entries, base, kind = list(grid.entries), {**base, **grid.train}, grid.budget
    else:
        entries = [Entry.parse(a.strip()) for a in args.archs.split(",") if a.strip()]
    lr = args.lr if args.lr is not None else (TINY_LR if args.size == "tiny" else None)
    if lr is not None:
        _set_dotted(base, "optim.lr", lr)
    for key, value in map(_split_override, args.overrides):  # an optim.lr=... override wins
        _set_dotted(base, key, value)
    chosen = [(name, getattr(args, name)) for name in BUDGETS if getattr(args, name) is not None]
    if len(chosen) > 1:
        raise ConfigError(f"give one budget, got {', '.join('--' + n for n, _ in chosen)}: the runs are "
                          "equal in exactly one of steps, tokens, FLOPs or wall-clock time.")
    if chosen:
        kind, value = chosen[0]
        base[BUDGETS[kind]] = value
    elif not any(base.get(f) is not None for f in BUDGETS.values()):  # nor a max_*=... override
        # the grid's own budget kind (steps without a grid), as much as the baseline spends in 400 steps
        value = default_budget(kind, entries, base)
        if value is None:
            raise ConfigError(f"--grid {args.grid} compares at equal wall-clock time, as the paper does, "
                              "and no default fits every machine: give the seconds per run with --time "
                              f"SECONDS, or --steps N for equal steps ({DEFAULT_STEPS} by default).")
        base[BUDGETS[kind]] = value
    sweep = None
    if args.lr_sweep:
        try:
            sweep = [float(r) for r in args.lr_sweep.split(",") if r.strip()]
        except ValueError:
            raise ConfigError(f"--lr-sweep {args.lr_sweep!r} is not allowed: give comma-separated learning "
                              "rates, e.g. 1e-3,3e-3,1e-2.") from None
    report = compare(entries, args.out, seeds=args.seeds, base=base, fresh=args.fresh, lr_sweep=sweep,
                     sweep_steps=args.sweep_steps)
    print(f"report: {report} (and {report.with_suffix('.html')})")
    print(report.read_text().split("\n\n")[2])  # the table


def cmd_reproduce(args: argparse.Namespace) -> None:
    from blocklab.claims import select
    from blocklab.reproduce import SCALES, reproduce
    from blocklab.reproduction_report import write_reproduction

    def names(text):
        return [n.strip() for n in text.split(",") if n.strip()] if text else None

    claims = select(names(args.claims), names(args.paper), quick=args.quick)
    if args.list:
        for c in claims:
            print(f"{c.id:<30} {c.paper:<15} {c.where:<20} {c.statement}")
        print("\nscales: " + "; ".join(f"{k}: {v.description}" for k, v in SCALES.items()))
        return
    scale = args.scale or ("quick" if args.quick else "cpu")
    rep = reproduce(claims, scale, args.out, train=not args.no_train)
    path = write_reproduction(rep, args.report or args.out)
    print(f"report: {path} (and {path.with_suffix('.html')})")
    for r in rep.results:
        print(f"  {r.verdict:<13} {r.claim.id}")


def cmd_diagnose(args: argparse.Namespace) -> None:
    from pathlib import Path

    from blocklab.analysis import compare_reports, diagnose_run
    from blocklab.data import load_tokenizer
    from blocklab.training import TrainConfig

    def ints(text):
        return [int(i) for i in text.split(",")] if text else None

    options = dict(batches=args.batches, layers=ints(args.layers), heads=ints(args.heads), device=args.device,
                   map_tokens=args.map_tokens, start=args.start)
    try:
        if args.compare:
            a, b = args.compare
            lengths = [TrainConfig.load(Path(r) / "config.yaml").seq_len for r in (a, b)]
            if lengths[0] != lengths[1]:  # entropy, importance and similarity all depend on T
                raise ConfigError(f"--compare needs two runs with the same seq_len, since entropy, "
                                  f"importance and similarity depend on it: {a} has {lengths[0]}, {b} has "
                                  f"{lengths[1]}.")
            if load_tokenizer(a).hash != load_tokenizer(b).hash:
                raise ConfigError(f"--compare needs two runs with the same tokenizer: {a} and {b} differ.")
            res_a, res_b = diagnose_run(a, **options), diagnose_run(b, **options)
            out = Path(args.out or "diagnostics-compare")
            arch_a, arch_b = (TrainConfig.load(Path(r) / "config.yaml").arch for r in (a, b))
            compare_reports(res_a, res_b, out, labels=(arch_a, arch_b) if arch_a != arch_b else (a, b))
        else:
            if not args.run:
                raise ConfigError("blocklab diagnose needs --run DIR, or --compare RUN_A RUN_B.")
            out = Path(args.out or Path(args.run) / "diagnostics")
            diagnose_run(args.run, out, **options)
    except (FileNotFoundError, ValueError) as err:  # a missing run or a bad option: a usage error
        raise ConfigError(str(err)) from None
    print(f"diagnostics written to {out}")


def cmd_export(args: argparse.Namespace) -> None:
    from pathlib import Path

    from blocklab.interop import save_pretrained
    from blocklab.training import load_run

    run = load_run(args.run)
    folder = save_pretrained(run.model, args.out, tokenizer=Path(args.run) / "tokenizer.json")
    print(f"exported {run.checkpoint} to {folder} (load with blocklab.interop.load_pretrained)")


def cmd_generate(args: argparse.Namespace) -> None:
    from blocklab.training import load_run

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        run = load_run(args.run, device=device)
    except FileNotFoundError as err:  # no such run: a usage error, reported without a traceback
        raise ConfigError(str(err)) from None
    prompt = run.tokenizer.encode(args.prompt)
    if not prompt:
        raise ConfigError("--prompt is empty: give at least one character of text to continue.")
    ids = torch.tensor([prompt], device=device)
    stops = None if args.no_stop else [run.tokenizer.eos_id]
    try:
        out = run.model.generate(ids, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                                 top_p=args.top_p, stop_tokens=stops, seed=args.seed)
    except ValueError as err:  # a sampling setting or a length the model cannot take
        raise ConfigError(str(err)) from None
    new = out[0, len(prompt):].tolist()
    if stops and new and new[-1] in stops:
        new = new[:-1]  # the stop token ends the text; it is not part of it
    print(args.prompt + run.tokenizer.decode(new))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="blocklab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("params", help="parameter counts and FLOPs per token of presets")
    p.add_argument("--arch", default="pre-ln", help="architecture preset(s), comma-separated")
    p.add_argument("--size", default="tiny", help="size preset(s), comma-separated")
    p.add_argument("--all", action="store_true", help="every block preset and value path")
    p.set_defaults(func=cmd_params)
    p = sub.add_parser("presets", help="list every architecture, value-path and size preset")
    p.set_defaults(func=cmd_presets)
    p = sub.add_parser("train", help="train one model: [CONFIG.yaml] [key=value ...]",
                       description="Train any preset. Overrides use TrainConfig fields, dotted for "
                       "sections: arch=sas-p size=tiny max_steps=200 optim.lr=3e-3 data.tokenizer=byte "
                       "model.n_layers=4.")
    p.add_argument("overrides", nargs="*", help="an optional YAML config, then key=value overrides")
    p.add_argument("--out", help="run directory (same as out_dir=...)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in out_dir from its last checkpoint")
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("compare", help="train architectures side by side on one budget and write a report",
                       description="Train each architecture on the same data, tokenizer, batch order and "
                       "budget, then write OUT/report.md and OUT/report.html. Finished runs are reused; an "
                       "interrupted one resumes. Extra key=value overrides apply to every run.")
    p.add_argument("overrides", nargs="*", help="TrainConfig overrides for every run, e.g. optim.lr=2e-3")
    p.add_argument("--archs", default=DEFAULT_ARCHS,
                   help=f"comma-separated presets (default {DEFAULT_ARCHS})")
    p.add_argument("--grid", help="a named grid of a paper experiment instead of --archs (see --list-grids)")
    p.add_argument("--list-grids", action="store_true", help="list the named grids")
    p.add_argument("--size", default="tiny")
    p.add_argument("--seeds", type=_positive_int, default=1, help="seeds per architecture (paired by seed)")
    p.add_argument("--out", default="runs/compare")
    p.add_argument("--steps", type=int, help="equal steps (and tokens) per run; without a budget flag, "
                   "400 steps, or a grid's own budget kind (see --list-grids) at what the first "
                   "architecture spends in 400 steps")
    p.add_argument("--lr", type=float, help="peak learning rate of every run (default: 3e-3 at size tiny, "
                   "where 1e-3 left every model but BoV on the unigram plateau after 300 steps; "
                   "else the TrainConfig default 1e-3)")
    p.add_argument("--tokens", type=int, help="equal tokens per run")
    p.add_argument("--flops", type=float, help="equal analytic training FLOPs per run")
    p.add_argument("--time", type=float, help="equal training wall-clock seconds per run")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--eval-every", type=int, default=50, help="steps between validations and checkpoints")
    p.add_argument("--lr-sweep", help="comma-separated peak learning rates: each architecture trains seed 0 "
                   "at each on a short budget and keeps the best on held-out loss for all seeds")
    p.add_argument("--sweep-steps", type=int,
                   help="steps of each sweep run (default: a quarter of --steps, or 100)")
    p.add_argument("--fresh", action="store_true", help="retrain every run instead of reusing finished ones")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("reproduce", help="run the papers' claims with seeds and intervals, a verdict each",
                       description="Train (or reuse) the runs the chosen claims need at one scale, pair them "
                       "by seed, and write OUT/reproduction.md and .html: per claim the paper's result next "
                       "to ours, the per-seed differences with a 95% t-interval, plots and a verdict.")
    p.add_argument("--claims", help="comma-separated claim ids (default: all; see --list)")
    p.add_argument("--paper", help="only the claims of these papers: simplifying, value-residual, "
                   "bank-of-values")
    p.add_argument("--quick", action="store_true",
                   help="the claims tagged quick at scale quick: about 13 minutes on a 2-core CPU")
    p.add_argument("--scale", help="quick, cpu, cpu-deep, gpu-resformer, gpu-sas-p (default: cpu, or quick)")
    p.add_argument("--out", default="runs/reproduce", help="the run store and, by default, the report")
    p.add_argument("--report", help="write the report here instead of OUT")
    p.add_argument("--no-train", action="store_true",
                   help="only read runs that exist (a missing one is an error)")
    p.add_argument("--list", action="store_true", help="list the selected claims and the scales")
    p.set_defaults(func=cmd_reproduce)
    p = sub.add_parser("diagnose", help="the papers' diagnostics of a trained run (entropy, norms, spectra)",
                       description="Attention-concentration entropy, value and hidden-state norms, token "
                       "similarity, value spectra, attention maps and learned scalars of a run, on its "
                       "held-out split; or two runs overlaid with --compare.")
    p.add_argument("--run", help="a run directory (out_dir of blocklab train, or a compare run)")
    p.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"), help="overlay two runs")
    p.add_argument("--out", help="output directory (default RUN/diagnostics)")
    p.add_argument("--batches", type=int, default=4, help="held-out batches of 8 sequences")
    p.add_argument("--layers", help="layers whose attention maps are drawn, e.g. 0,3 (default all)")
    p.add_argument("--heads", help="heads to draw, e.g. 0,1 (default the mean over heads)")
    p.add_argument("--map-tokens", type=int, default=64,
                   help="attention maps show the first N queries and keys (default 64)")
    p.add_argument("--start", choices=("window", "document", "separator"), default="window",
                   help="where windows start: every seq_len tokens (default), at a document's first token, "
                   "or at the end-of-text separator before a document, so that the first token is the same "
                   "start token in every sequence (Value Residual App. A.2)")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=cmd_diagnose)
    p = sub.add_parser("export", help="export a run: config.json, model.safetensors, tokenizer.json")
    p.add_argument("--run", required=True, help="a run directory")
    p.add_argument("--out", required=True, help="the folder to write")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("generate", help="continue a prompt with a trained run, decoding with the KV cache",
                       description="Greedy decoding by default; --temperature with --top-k / --top-p "
                       "samples (reproducibly with --seed). Stops at the run's end-of-text token.")
    p.add_argument("--run", required=True, help="a run directory")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the default)")
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--no-stop", action="store_true", help="do not stop at the end-of-text token")
    p.add_argument("--device", help="cpu, cuda ... (default: cuda when available)")
    p.set_defaults(func=cmd_generate)
    finetune_cli.add_parsers(sub)
    eval_cli.add_parsers(sub)
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (ConfigError, FileNotFoundError, FileExistsError) as err:  # bad input: named, no traceback
        print(f"blocklab: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("blocklab: interrupted; rerun with --resume to continue from the last checkpoint",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
