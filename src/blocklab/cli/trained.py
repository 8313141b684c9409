"""The commands that read a trained run (or an export): `blocklab diagnose`, `export` and `generate`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from blocklab.cli import args as cli_args
from blocklab.util.errors import ConfigError


def cmd_diagnose(args: argparse.Namespace) -> None:
    from pathlib import Path

    from blocklab.analysis import compare_runs, diagnose_run

    def ints(text):
        return [int(i) for i in text.split(",")] if text else None

    options = dict(batches=args.batches, layers=ints(args.layers), heads=ints(args.heads), device=args.device,
                   map_tokens=args.map_tokens, start=args.start)
    try:
        if args.compare:
            out = Path(args.out or "diagnostics-compare")
            compare_runs(*args.compare, out, **options)
        else:
            if not args.run:
                raise ConfigError("blocklab diagnose needs --run DIR, or --compare RUN_A RUN_B.")
            out = Path(args.out or Path(args.run) / "diagnostics")
            diagnose_run(args.run, out, **options)
    except (FileNotFoundError, ValueError) as err:  # a missing run or a bad option: a usage error
        raise ConfigError(str(err)) from None
    print(f"diagnostics written to {out}")


def cmd_export(args: argparse.Namespace) -> None:
    from blocklab.interop import save_pretrained
    from blocklab.training import load_run

    run = load_run(args.run)
    try:
        folder = save_pretrained(run.model, args.out, tokenizer=f"{args.run}/tokenizer.json",
                                 format=args.format, run=args.run)
    except ImportError as err:  # format hf without the hf extra: a usage error, not a traceback
        raise ConfigError(str(err)) from None
    remote = ", trust_remote_code=True" if (folder / "modeling_blocklab.py").is_file() else ""
    auto = f"AutoModelFor{'CausalLM' if run.model.cfg.causal else 'MaskedLM'}"
    how = (f"transformers.{auto}.from_pretrained(folder{remote}) or blocklab.interop.from_hf"
           if args.format == "hf" else "blocklab.interop.load_pretrained")
    print(f"exported {run.checkpoint} to {folder} (load with {how})")


def cmd_generate(args: argparse.Namespace) -> None:
    import torch

    from blocklab.training.runs import load_model_folder, sampling_with_beams

    given = sampling_with_beams(dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p))
    if args.num_beams > 1 and given:  # before the model loads
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ConfigError(f"--num-beams {args.num_beams} runs a beam search, which samples nothing: drop "
                          f"{flags}, or sample with --num-beams 1.")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    run = load_model_folder(args.run, device=device)  # a run or an export; main reports a missing one
    try:
        text = run.complete(args.prompt, args.max_new_tokens, not args.no_stop, args.num_beams,
                            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    except ValueError as err:  # an empty prompt, a sampling setting or a length the model cannot take
        raise ConfigError(str(err)) from None
    print(args.prompt + text)


def _add_diagnose(sub) -> None:
    """`blocklab diagnose`: the papers' diagnostics of a run, or two overlaid."""
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


def _add_export(sub) -> None:
    """`blocklab export`: a run in blocklab's format or for transformers."""
    p = sub.add_parser("export", help="export a run: blocklab's format, or --format hf for transformers")
    p.add_argument("--run", required=True, help="a run directory")
    p.add_argument("--out", required=True, help="the folder to write")
    p.add_argument("--format", choices=("blocklab", "hf"), default="blocklab",
                   help="blocklab (default): every field, read back with load_pretrained; hf: a folder for "
                   "transformers' Auto classes: native GPT-2 / Llama for plain Pre-LN baselines, else remote "
                   "code that imports blocklab (trust_remote_code=True), with a model card")
    p.set_defaults(func=cmd_export)


def _add_generate(sub) -> None:
    """`blocklab generate`: decoding a prompt with a trained run."""
    p = sub.add_parser("generate", help="continue a prompt with a trained run, decoding with the KV cache",
                       description="Greedy decoding by default; --temperature with --top-k / --top-p "
                       "samples (reproducibly with --seed); --num-beams N: beam search. Stops at end-of-text")
    p.add_argument("--run", required=True,
                   help="a run directory, or a blocklab export (blocklab export, import-hf)")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0: greedy (the default); else a positive finite number")
    p.add_argument("--top-k", type=int, help="sample from the k likeliest tokens: 1 to the vocabulary size")
    p.add_argument("--top-p", type=float, help="sample from the smallest set of tokens with this much "
                   "probability: in (0, 1]")
    p.add_argument("--seed", type=int)
    p.add_argument("--num-beams", type=cli_args.positive_int, default=1, help="beam search with this many "
                   "beams (Hugging Face's rules, length penalty 1), printing the best text; no sampling "
                   "options (default 1: greedy or sampled decoding)")
    p.add_argument("--no-stop", action="store_true", help="do not stop at the end-of-text token")
    p.add_argument("--device", help="cpu, cuda ... (default: cuda when available)")
    p.set_defaults(func=cmd_generate)


def add_parsers(sub: Any, names: Sequence[str]) -> None:
    """Add the subcommands `names` (of "diagnose", "export", "generate") to `sub`, in that order."""
    adders = {"diagnose": _add_diagnose, "export": _add_export, "generate": _add_generate}
    for name in names:
        adders[name](sub)
