"""`blocklab prepare`: tokenise a run's data once, before training, into the token cache `train` reads.

It takes what `blocklab train` takes (an optional YAML config, then key=value overrides, read by the same
`resolve_config`); only the data section (and init_from, whose tokenizer.json replaces a BPE to be
trained, as in `train`) matters. It trains the BPE tokenizer when the config asks for one, tokenises
every document with a progress bar and writes the cache entry under the same key `train` computes, so
that a later `train` (or `compare`, `reproduce`, a launcher's jobs) with the same data config finds it
and tokenises nothing. A second `prepare` finds the entry whole and says so.
"""

from __future__ import annotations

import argparse
from typing import Any

from blocklab.cli.args import config_and_overrides

DESCRIPTION = ("Tokenise a run's data once into the token cache, e.g. on a CPU node before GPU jobs start: "
               "the same [CONFIG.yaml] [key=value ...] as `blocklab train` (only data.* and init_from "
               "matter), e.g. data.source=corpus.jsonl data.vocab_size=8192. A later `blocklab train` "
               "with the same data settings reads the cache entry and tokenises nothing.")


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("prepare", help="tokenise a run's data into the token cache: [CONFIG.yaml] "
                       "[key=value ...]", description=DESCRIPTION)
    p.add_argument("overrides", nargs="*", help="an optional YAML config, then key=value overrides, as for "
                   "blocklab train")
    p.set_defaults(func=cmd_prepare)


def cmd_prepare(args: argparse.Namespace) -> None:
    from blocklab.data import prepare_data
    from blocklab.data.sources import skipped_lines
    from blocklab.training.config import resolve_config
    from blocklab.training.init_from import source_tokenizer, with_source_tokenizer
    from blocklab.util.progress import say

    config, overrides = config_and_overrides(args.overrides)
    # a run needs a budget and prepare does not: a placeholder first, which any budget given replaces
    cfg = resolve_config(config, ["max_steps=1", *overrides])
    if cfg.init_from:
        cfg = with_source_tokenizer(cfg, source_tokenizer(cfg.init_from))
    data = prepare_data(cfg.data, progress=cfg.progress)
    for line in skipped_lines(data.stats, str(data.path / "manifest.json")):
        say(line)
    print(summary(data.stats, str(data.path)))


def summary(stats: dict[str, Any], entry: str) -> str:
    """What `blocklab prepare` prints when done: the tokens, seconds and tokens/s, the cache entry."""
    tokens = sum(stats["tokens"].values())
    counts = (f"{tokens:,} tokens ({stats['tokens']['train']:,} training, {stats['tokens']['val']:,} "
              f"validation; {sum(stats['documents'].values()):,} documents)")
    trained = (f"; the BPE tokenizer trained first ({stats['tokenizer_seconds']:.1f} s)"
               if stats["tokenizer_trained"] else "")
    if not stats["tokenised"]:
        return (f"already prepared: {counts}, nothing tokenised{trained}\n"
                f"cache entry: {entry}")
    seconds = stats["shards_seconds"]
    return (f"prepared {counts} in {seconds:.1f} s, {tokens / max(seconds, 1e-9):,.0f} tokens/s{trained}; "
            f"{stats['seconds']:.1f} s in all\ncache entry: {entry}")
