"""`blocklab eval`: argument definitions and the handler (heavy imports happen in the handler)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from blocklab.util.errors import ConfigError


def add_parsers(sub) -> None:
    p = sub.add_parser("eval", help="zero-shot multiple choice (CORE) and lm-evaluation-harness tasks",
                       description="Score a causal run (or a blocklab export) on local multiple-choice JSONL "
                       "files ({context, choices, label}) by summed and per-byte log-likelihood, with "
                       "centered accuracies and their mean (the DCLM CORE score), and/or run "
                       "lm-evaluation-harness tasks (pip install 'blocklab[eval]'). Prints a table "
                       "and writes JSON.")
    p.add_argument("--run", required=True,
                   help="a run directory of `blocklab train`, or a blocklab export (`blocklab export`, "
                   "`blocklab import-hf`)")
    p.add_argument("--mc", help="comma-separated multiple-choice JSONL files (one task each)")
    p.add_argument("--baseline", metavar="TASK=R[,TASK=R]",
                   help="--mc tasks: random (or majority-class) baseline r of the centered accuracy "
                   "(acc - r) / (1 - r); default 1 / number of choices. TASK is the file's stem (parent/stem "
                   "when two files share one)")
    p.add_argument("--tasks", help="comma-separated lm-evaluation-harness task names")
    p.add_argument("--include-path", help="directory of extra harness task YAMLs (local tasks)")
    p.add_argument("--local-only", action="store_true",
                   help="index only the tasks under --include-path (the harness's own take ~10 s to index)")
    p.add_argument("--bootstrap-iters", type=int,
                   help="harness bootstrap iterations for standard errors (its default 100000; 0: none)")
    p.add_argument("--limit", type=int, help="at most this many examples per task")
    p.add_argument("--num-fewshot", type=int, help="harness tasks: few-shot examples")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--delimiter", default=" ", help="text between a context and a choice (default: a space)")
    p.add_argument("--device", help="cpu, cuda ... (default: cuda when available)")
    p.add_argument("--out", help="JSON file for the results (default RUN/eval/results.json)")
    p.set_defaults(func=cmd_eval)


def parse_baselines(text: str | None) -> dict[str, float]:
    """``"boolq=0.62,copa=0.5"`` -> {"boolq": 0.62, "copa": 0.5}."""
    out: dict[str, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        task, _, value = item.partition("=")
        try:
            r = float(value)
        except ValueError:
            r = None
        if r is None or not task.strip():
            raise ConfigError(f"--baseline {item!r} is not allowed: write TASK=R[,TASK=R], e.g. boolq=0.62.")
        out[task.strip()] = r
    return out


def cmd_eval(args: argparse.Namespace) -> None:
    if not args.mc and not args.tasks:
        raise ConfigError("blocklab eval needs --mc FILE[,FILE...] and/or --tasks NAME[,NAME...].")
    if args.baseline and not args.mc:
        raise ConfigError("--baseline sets the random baseline of --mc tasks; give --mc too.")
    baselines = parse_baselines(args.baseline)  # a syntax error before loading the run
    import torch

    from blocklab.training.runs import load_model_folder

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        run = load_model_folder(args.run, device=device)
    except FileNotFoundError as err:  # no such run or export: a usage error, reported without a traceback
        raise ConfigError(str(err)) from None
    report: dict = {"run": str(args.run), "checkpoint": str(run.checkpoint)}
    if args.mc:
        from blocklab.eval.multiple_choice import evaluate_mc, format_table

        files = [f.strip() for f in args.mc.split(",") if f.strip()]
        report["multiple_choice"] = evaluate_mc(run.model, run.tokenizer, files, args.batch_size,
                                                args.delimiter, args.limit, baselines)
        print(format_table(report["multiple_choice"]))
    if args.tasks:
        try:
            from blocklab.eval.harness import BlocklabLM, run_harness
        except ImportError as err:
            raise ConfigError(f"--tasks needs lm-evaluation-harness ({err}); install it with "
                              "pip install 'blocklab[eval]'.") from None
        from lm_eval.utils import make_table

        lm = BlocklabLM(run.model, run.tokenizer, batch_size=args.batch_size)
        tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
        extra = {} if args.bootstrap_iters is None else {"bootstrap_iters": args.bootstrap_iters}
        results = run_harness(lm, tasks, args.include_path, limit=args.limit, num_fewshot=args.num_fewshot,
                              include_defaults=not args.local_only, **extra)
        print(make_table(results))
        report["harness"] = {"results": results["results"], "versions": results.get("versions"),
                             "n-shot": results.get("n-shot")}
    out = Path(args.out) if args.out else Path(args.run) / "eval" / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str))
    print(f"results: {out}")
