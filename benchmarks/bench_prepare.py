"""Tokenising a corpus once (issue 50): blocklab's data path, what `blocklab prepare` and a first
`blocklab train` run, against the `tokenizers` library alone, on the same texts with the same tokenizer.

The corpus is a JSONL file of --mb megabytes made from the embedded Python-stdlib snapshot: each file
cut at blank lines into documents of about 2,000 characters, shuffled (seeded) and repeated until the
size is reached, one ``{"text": ...}`` record a line. A byte-level BPE of --vocab ids is trained once
on the snapshot (blocklab's `train_bpe`, outside the timing) and saved as tokenizer.json; every
contender loads that file, so all encode with the same tokenizer.

Contenders, each timed from the files on disk to the token ids, in one process (so one Rayon thread
pool for all: --threads sets RAYON_NUM_THREADS before `tokenizers` is imported):

* ``encode_batch``: load the tokenizer, read the file, json.loads each line, one
  `Tokenizer.encode_batch(texts)` over every text, the ids of each encoding (a user's few lines);
* ``encode_batch_fast``: the same with `encode_batch_fast` (no character offsets), the faster of the two;
* ``encode_batch_fast, 4M-char batches``: the same over batches of about 4M characters (blocklab's
  chunk), in case one call over a large corpus is slowed by holding every encoding at once;
* ``blocklab``: `prepare_data` into a fresh cache folder, with the process's memos cleared as in a
  fresh process: the file's sha256 (the cache key), reading, the split, tokenising, writing train.bin
  and val.bin with their sha256, the manifest, and the check of the finished entry.

After --warmup rounds that are not counted, each of --rounds rounds runs every contender once, the
first one rotating from round to round so that a busy machine slows each alike. Reported: the median
seconds (min-max) and tokens/s, the process CPU seconds (all threads), and "blocklab's speed / this
one's": the median over rounds of this contender's time divided by blocklab's in the same round (1.0:
as fast; 0.9: blocklab takes 1/0.9 of this one's time; above 1: blocklab is faster), and the same
ratio of the best (minimum) times, which a loaded machine disturbs least. Tokens are the
text's tokens (blocklab's separators not counted), the same count for every contender (checked each
round).

    PYTHONPATH=src python benchmarks/bench_prepare.py --mb 40 --rounds 7 \
        --out benchmarks/results/prepare-cpu.json
    PYTHONPATH=src python benchmarks/bench_prepare.py --smoke --out /tmp/prepare-smoke.json   # seconds
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _measure import source_version

CONTENDERS = ("encode_batch", "encode_batch_fast", "encode_batch_fast, 4M-char batches", "blocklab")
BATCH_CHARS = 4_000_000  # blocklab's data.tokenise.CHUNK_CHARS
DOC_CHARS = 2000  # about the characters of a generated document


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=40.0, help="size of the generated JSONL corpus (MB)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--warmup", type=int, default=1, help="rounds run first and not counted")
    p.add_argument("--vocab", type=int, default=4096, help="BPE vocabulary (blocklab's default)")
    p.add_argument("--bpe-chars", type=int, help="train the BPE on this many characters of the snapshot "
                   "(default: all of it)")
    p.add_argument("--threads", type=int, help="RAYON_NUM_THREADS for every contender (default: the "
                   "tokenizers library's own, one per core)")
    p.add_argument("--smoke", action="store_true", help="0.3 MB, a 300-id BPE, 1 round, no warm-up")
    p.add_argument("--out", help="JSON results file (none when not given)")
    args = p.parse_args(argv)
    if args.smoke:
        args.mb, args.vocab, args.rounds, args.warmup, args.bpe_chars = 0.3, 300, 1, 0, 300_000
    return args


def make_corpus(path: Path, mb: float, seed: int = 0) -> int:
    """Write the JSONL corpus (see the module docstring); returns its record count."""
    from blocklab.data.snapshot import iter_snapshot

    docs: list[str] = []
    for _, text in iter_snapshot():
        piece: list[str] = []
        for para in text.split("\n\n"):
            piece.append(para)
            if sum(map(len, piece)) >= DOC_CHARS:
                docs.append("\n\n".join(piece))
                piece = []
        if piece:
            docs.append("\n\n".join(piece))
    rng, target, size, records = random.Random(seed), int(mb * 1e6), 0, 0
    with open(path, "w", encoding="utf-8") as fh:
        while size < target:
            rng.shuffle(docs)
            for doc in docs:
                line = json.dumps({"text": doc}) + "\n"
                fh.write(line)
                size, records = size + len(line.encode("utf-8")), records + 1
                if size >= target:
                    break
    return records


def make_tokenizer(folder: Path, vocab: int, chars: int | None) -> Path:
    """A BPE of `vocab` ids trained on the snapshot (its first `chars` characters; None: all of it),
    saved as folder/tokenizer.json."""
    from blocklab.data.snapshot import iter_snapshot
    from blocklab.data.tokenizer import train_bpe

    text = "".join(text for _, text in iter_snapshot())[:chars]
    return train_bpe([text], vocab).save(folder)


def raw(corpus: Path, tokenizer: Path, method: str, batch_chars: int | None = None) -> int:
    """The tokenizers library alone: the text tokens of every record of `corpus`, encoded in one call or
    in batches of about `batch_chars` characters."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    with open(corpus, "rb") as fh:
        texts = [json.loads(line)["text"] for line in fh]
    batches, start, chars = [], 0, 0
    for i, text in enumerate(texts):
        chars += len(text)
        if batch_chars is not None and chars >= batch_chars:
            batches.append(texts[start:i + 1])
            start, chars = i + 1, 0
    batches.append(texts[start:])
    ids = [e.ids for batch in batches for e in getattr(tok, method)(batch, add_special_tokens=False)]
    return sum(map(len, ids))


def blocklab_path(corpus: Path, tokenizer: Path, cache: Path) -> int:
    """blocklab's data path into the fresh cache folder `cache`: the text tokens it wrote."""
    from blocklab.data import DataConfig, cache_entry, prepare_data

    # as in a fresh process: the shards' digests are checked again; the corpus is hashed again because
    # its digest record lives in the fresh cache folder (data.digests)
    cache_entry._DIGESTS.clear()
    data = prepare_data(DataConfig(source=str(corpus), tokenizer=str(tokenizer), cache_dir=str(cache)))
    splits = data.manifest["splits"].values()
    return sum(s["tokens"] - s["documents"] for s in splits)  # one separator after each document


def rounds(runs: dict[str, Callable[[], int]], warmup: int, n: int,
           before: dict[str, Callable[[], object]] | None = None) -> dict[str, list[dict]]:
    """Every contender once a round, the first one rotating; the counted rounds' times and tokens.
    `before[name]`, if any, runs ahead of each of that contender's calls, untimed."""
    names = list(runs)
    out: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(warmup + n):
        order = names[r % len(names):] + names[:r % len(names)]
        tokens = set()
        for name in order:
            (before or {}).get(name, lambda: None)()
            gc.collect()
            wall, cpu = time.perf_counter(), time.process_time()
            count = runs[name]()
            row = {"s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu, "tokens": count}
            tokens.add(count)
            if r >= warmup:
                out[name].append(row)
            print(f"# round {r + 1 - warmup if r >= warmup else 'warm-up'}: {name} {row['s']:.2f} s",
                  file=sys.stderr, flush=True)
        if len(tokens) != 1:
            raise SystemExit(f"the contenders counted different tokens: {sorted(tokens)}")
    return out


def summarise(times: dict[str, list[dict]]) -> list[dict]:
    """One row per contender: medians, min-max, and the paired ratio to blocklab."""
    ours = times["blocklab"]
    rows = []
    for name, runs in times.items():
        s = [r["s"] for r in runs]
        tokens = runs[0]["tokens"]
        paired = [a["s"] / b["s"] for a, b in zip(runs, ours, strict=True)]
        rows.append({"contender": name, "tokens": tokens, "median_s": statistics.median(s), "min_s": min(s),
                     "max_s": max(s), "tokens_per_s": tokens / statistics.median(s),
                     "cpu_s": statistics.median(r["cpu_s"] for r in runs),
                     "this_over_blocklab": statistics.median(paired),
                     "best_over_blocklab_best": min(s) / min(r["s"] for r in ours),
                     "rounds": runs})
    return rows


def render(rows: list[dict]) -> str:
    header = ("| contender | tokens | s, median (min-max) | tokens/s | CPU s | blocklab's speed / this "
              "one's, paired median | the same, best times |")
    lines = [header, "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['contender']} | {r['tokens']:,} | {r['median_s']:.2f} ({r['min_s']:.2f}-"
                     f"{r['max_s']:.2f}) | {r['tokens_per_s']:,.0f} | {r['cpu_s']:.2f} | "
                     f"{r['this_over_blocklab']:.3f} | {r['best_over_blocklab_best']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:  # before tokenizers is imported: its Rayon pool reads it once
        os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    import tokenizers

    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
        folder = Path(tmp)
        corpus = folder / "corpus.jsonl"
        records = make_corpus(corpus, args.mb)
        tokenizer = make_tokenizer(folder, args.vocab, args.bpe_chars)
        cache = folder / "cache"

        runs = {"encode_batch": lambda: raw(corpus, tokenizer, "encode_batch"),
                "encode_batch_fast": lambda: raw(corpus, tokenizer, "encode_batch_fast"),
                CONTENDERS[2]: lambda: raw(corpus, tokenizer, "encode_batch_fast", BATCH_CHARS),
                "blocklab": lambda: blocklab_path(corpus, tokenizer, cache)}
        # the last round's cache entry goes before each blocklab call, outside its time
        forget = {"blocklab": lambda: shutil.rmtree(cache, ignore_errors=True)}
        rows = summarise(rounds(runs, args.warmup, args.rounds, before=forget))
        size = corpus.stat().st_size
    table = render(rows)
    print(f"corpus: {size / 1e6:.1f} MB JSONL, {records:,} records; BPE of {args.vocab} ids; "
          f"RAYON_NUM_THREADS={os.environ.get('RAYON_NUM_THREADS', 'unset')}; "
          f"{args.rounds} rounds after {args.warmup} warm-up")
    print(table)
    result = {"args": vars(args), "corpus_bytes": size, "records": records, "table": table, "rows": rows,
              "machine": {"cpus": os.cpu_count(), "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
                          "tokenizers": tokenizers.__version__, "python": sys.version.split()[0],
                          "blocklab_source": source_version(),
                          "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"# wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
