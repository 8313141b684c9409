"""`blocklab finetune`: argument definitions and the handler (heavy imports happen in the handler)."""

from __future__ import annotations

import argparse
from pathlib import Path

from blocklab.util.errors import ConfigError


def add_parsers(sub) -> None:
    p = sub.add_parser("finetune", help="fine-tune a masked-LM run on a GLUE-format task, report metrics",
                       description="Fine-tune a pretrained encoder run on local task files (TSV/CSV with a "
                       "header, GLUE's headerless CoLA TSVs, or JSONL) with the Crammed BERT protocol of "
                       "Simplifying Transformer Blocks (5 epochs, batch 32, lr 1.5e-4 cosine, dropout 0.1), "
                       "then write OUT/metrics.json and OUT/predictions.jsonl.")
    p.add_argument("--run", required=True, help="run directory of `blocklab train` (objective mlm), or a "
                   "blocklab export (`blocklab export`, `blocklab import-hf`; a causal one needs "
                   "--allow-causal)")
    p.add_argument("--train", required=True, help="training file (.tsv, .csv or .jsonl)")
    p.add_argument("--eval", required=True, help="evaluation file with labels (.tsv, .csv or .jsonl)")
    p.add_argument("--task", required=True,
                   help="cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli, or generic (with --text-columns "
                   "and --label-column)")
    p.add_argument("--out", help="output directory (default RUN/finetune/TASK)")
    p.add_argument("--text-columns", help="one or two comma-separated sentence columns")
    p.add_argument("--label-column")
    p.add_argument("--num-labels", type=int,
                   help="generic task: 1 for regression, else the number of classes")
    p.add_argument("--label-names", help="generic task: comma-separated string labels in id order")
    p.add_argument("--epochs", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--warmup-fraction", type=float)
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--dropout", type=float)
    p.add_argument("--pooling", help="first, mean or last (default: first; last for a causal run)")
    p.add_argument("--max-length", type=int, help="tokens per example (default: the run's context length)")
    p.add_argument("--max-steps", type=int, help="stop after this many steps (quick checks)")
    p.add_argument("--seed", type=int)
    p.add_argument("--device")
    p.add_argument("--allow-causal", action="store_true", help="fine-tune a causal run (last-token pooling)")
    p.add_argument("--progress", action="store_true", help="show a progress bar")
    p.set_defaults(func=cmd_finetune)


OPTIONS = ("epochs", "batch_size", "lr", "warmup_fraction", "weight_decay", "dropout", "pooling",
           "max_length", "max_steps", "seed", "device", "label_column", "num_labels")


def cmd_finetune(args: argparse.Namespace) -> None:
    from blocklab.finetune.loop import finetune, finetune_dir

    hp = {name: getattr(args, name) for name in OPTIONS if getattr(args, name) is not None}
    for name in ("text_columns", "label_names"):
        if getattr(args, name):
            hp[name] = tuple(c.strip() for c in getattr(args, name).split(","))
    hp["allow_causal"], hp["progress"] = args.allow_causal, args.progress
    try:
        metrics = finetune(args.run, args.train, args.eval, args.task, out_dir=args.out, **hp)
    except FileNotFoundError as err:  # no such run or export: a usage error, reported without a traceback
        raise ConfigError(str(err)) from None
    for name, value in metrics.items():
        print(f"{name:<10} {value:.4f}")
    print(f"metrics: {Path(args.out or finetune_dir(args.run, args.task)) / 'metrics.json'}")
