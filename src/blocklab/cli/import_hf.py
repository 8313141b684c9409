"""`blocklab import-hf`: its arguments and handler. The import itself (interop/import_hf.py) loads torch
and transformers, so it is imported in the handler: `blocklab --help` stays fast."""

from __future__ import annotations

import argparse


def add_parsers(sub) -> None:
    p = sub.add_parser("import-hf", help="import a local Hugging Face GPT-2 / Llama checkpoint folder",
                       description="Turn a folder written by transformers' save_pretrained (GPT-2 or Llama; "
                       "one safetensors file or shards; not pytorch_model.bin, a pickle) or by blocklab's "
                       "export --format hf into a blocklab export with the same logits, with the "
                       "checkpoint's tokenizer. Continue pretraining it with `blocklab train init_from=OUT "
                       "...`.")
    p.add_argument("folder", metavar="DIR", help="the Hugging Face checkpoint folder (config.json, weights, "
                   "tokenizer.json)")
    p.add_argument("--out", required=True, help="the blocklab export folder to write")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier export in --out (a folder with other files is never replaced)")
    p.set_defaults(func=cmd_import_hf)


def cmd_import_hf(args: argparse.Namespace) -> None:
    from blocklab.interop.import_hf import import_hf

    done = import_hf(args.folder, args.out, overwrite=args.overwrite)
    cfg = done.model.cfg
    dtype = str(next(done.model.parameters()).dtype).removeprefix("torch.")
    print(f"imported the {done.model_type} checkpoint {args.folder} to {done.folder} ({cfg.n_layers} layers, "
          f"d_model {cfg.d_model}, vocabulary {cfg.vocab_size}, {dtype}); {done.tokenizer}")
    from blocklab.util.commands import pasteable

    command = pasteable("blocklab", "train", f"init_from={done.folder}", "max_steps=...", "--out", "RUN")
    print(f"continue pretraining: {command}")
