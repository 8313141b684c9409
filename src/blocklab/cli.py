"""The `blocklab` command line: thin argument parsing over the library."""

from __future__ import annotations

import argparse
import sys

import torch

from blocklab.accounting import count_parameters, flops_per_token
from blocklab.config import ConfigError, ModelConfig
from blocklab.model import Transformer
from blocklab.model.value_paths import VALUE_PATHS
from blocklab.presets import BLOCK_PRESETS, list_presets


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
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except ConfigError as err:
        print(f"blocklab: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
