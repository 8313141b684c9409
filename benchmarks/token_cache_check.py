"""Benchmark the token cache's check: what reading each shard once per process (sha256 and the largest
id in one pass, `blocklab.data.cache_entry.check_entry`) costs, against plain memory-mapped loading.

For each size (default 1M, 10M and 50M tokens of uint16 ids, as any vocabulary under 65,536 gives), a
cache entry is written into a temporary folder: random ids split 90/10 into train.bin and val.bin,
hashed as they are written (as build_shards does) and a manifest. Then, in this process:

* check, warm: `check_entry` with the process's earlier results forgotten, the files in the page
  cache (a run started soon after the files were written or used);
* check, cold: the same after the two shards were dropped from the page cache (fsync, then
  posix_fadvise DONTNEED on just those files), so they come from the disk;
* check, cached: a second `check_entry` in the same process (a stat per file, the manifest parsed):
  every later prepare_data call of a process (compare's and the launcher's workers, tests);
* memmap: what loading cost before the check (the manifest read, both shards memory-mapped);
* read via memmap: one pass over every token through the memmap (its largest id), warm: the floor
  of any check that looks at every id;
* hash while writing: sha256 of the shards' bytes in memory, what build_shards now adds to
  tokenising them.

Each figure is the median of --repeats runs with the min-max beside it; "per 10M tokens" divides the
median by the size. The machine may be shared: the load average at the start is recorded.

    PYTHONPATH=src python benchmarks/token_cache_check.py [--sizes 1,10,50] [--repeats 5] [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from blocklab.data import cache_entry, prepare
from blocklab.data.tokenizer import byte_tokenizer

RESULTS = Path(__file__).resolve().parent / "results"
TIMINGS = ("check_warm", "check_cold", "check_cached", "memmap", "read_memmap", "hash_while_writing")


def write_entry(entry: Path, n_tokens: int, vocab_size: int, seed: int = 0) -> dict:
    """A cache entry of `n_tokens` random ids in the layout build_shards writes; its manifest."""
    tok = byte_tokenizer()
    ids = np.random.default_rng(seed).integers(0, vocab_size, n_tokens, dtype=np.uint16)
    parts = {"train": ids[: n_tokens * 9 // 10], "val": ids[n_tokens * 9 // 10:]}
    entry.mkdir(parents=True)
    for split, part in parts.items():
        part.tofile(entry / f"{split}.bin")
    counts = {s: {"file": f"{s}.bin", "documents": 1, "tokens": int(p.size), "bytes": int(p.size),
                  "chars": int(p.size), "bytes_per_token": 1.0} for s, p in parts.items()}
    manifest = {
        "format": cache_entry.FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "source": {"spec": "synthetic", "kind": "synthetic", "description": "random ids", "fingerprint": "",
                   "files": 0, "skipped_files": [], "skipped_count": 0, "bad_records": 0},
        "settings": {}, "dtype": "uint16", "splits": counts,
        "tokenizer": {"hash": tok.hash, "vocab_size": tok.vocab_size, "eos_id": tok.eos_id,
                      "mask_id": tok.mask_id, "file": "tokenizer.json"},
        "checksums": {f"{s}.bin": {"size": int(p.nbytes), "sha256": hashlib.sha256(p.data).hexdigest()}
                      for s, p in parts.items()},
    }
    (entry / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def drop_from_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(entry: Path, repeats: int) -> dict[str, list[float]]:
    """Seconds per repeat of each contender on one entry; the contenders take turns within a repeat."""
    tok = byte_tokenizer()
    shards = [entry / f"{s}.bin" for s in cache_entry.SPLITS]
    cache_entry._DIGESTS.clear()
    cache_entry.check_entry(entry, tok)  # whole, and the files warm
    data = {s: np.memmap(p, dtype=np.uint16, mode="r")
            for s, p in zip(cache_entry.SPLITS, shards, strict=True)}
    in_memory = [np.fromfile(p, dtype=np.uint16) for p in shards]

    def memmap() -> None:
        manifest = json.loads((entry / "manifest.json").read_text())
        for s in cache_entry.SPLITS:
            prepare._load_split(entry / manifest["splits"][s]["file"], np.dtype(manifest["dtype"]))

    def cold() -> float:
        cache_entry._DIGESTS.clear()
        for p in shards:
            drop_from_page_cache(p)
        return timed(lambda: cache_entry.check_entry(entry, tok))

    def warm() -> float:
        cache_entry._DIGESTS.clear()
        for p in shards:  # back in the page cache after a cold repeat
            p.read_bytes()
        return timed(lambda: cache_entry.check_entry(entry, tok))

    out: dict[str, list[float]] = {name: [] for name in TIMINGS}
    for _ in range(repeats):
        out["check_cold"].append(cold())
        out["check_warm"].append(warm())
        out["check_cached"].append(timed(lambda: cache_entry.check_entry(entry, tok)))
        out["memmap"].append(timed(memmap))
        out["read_memmap"].append(timed(lambda: [int(a.max()) for a in data.values()]))
        out["hash_while_writing"].append(timed(lambda: [hashlib.sha256(a.data).digest() for a in in_memory]))
    return out


def fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}" if seconds < 0.01 else f"{seconds * 1e3:.1f}"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1,10,50", help="millions of tokens per entry, comma-separated")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dir", type=Path, default=None, help="where the entries are written (default: a "
                   "temporary folder; give one on the file system that holds your cache)")
    p.add_argument("--quick", action="store_true", help="1M tokens, 2 repeats, no file written")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON results (default benchmarks/results/token_cache_check.json; none with --quick)")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.repeats = "1", 2
    sizes = [int(float(s) * 1_000_000) for s in args.sizes.split(",")]
    from _measure import machine_info, table, write_result

    info = machine_info("cpu", 1)
    print(f"# token_cache_check: {[f'{n / 1e6:g}M' for n in sizes]} tokens, {args.repeats} repeats; "
          f"load {info['load_avg_at_start']}", flush=True)
    rows, cells = [], []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for n in sizes:
            entry = Path(tmp) / f"entry-{n}"
            write_entry(entry, n, vocab_size=258)
            runs = measure(entry, args.repeats)
            median = {k: statistics.median(v) for k, v in runs.items()}
            cells.append(dict(tokens=n, bytes=2 * n, seconds=runs, median_s=median,
                              ms_per_10m_tokens={k: v * 1e3 * 1e7 / n for k, v in median.items()}))
            per_10m = cells[-1]["ms_per_10m_tokens"]
            rows.append([f"{n / 1e6:g}M", *(f"{fmt(median[k])} ({fmt(min(runs[k]))}-{fmt(max(runs[k]))})"
                                            for k in TIMINGS),
                         f"{per_10m['check_warm']:.0f}", f"{per_10m['check_cold']:.0f}"])
            print(f"  {n / 1e6:g}M tokens done", flush=True)
    header = ["tokens", "check, warm ms", "check, cold ms", "check, cached ms", "memmap ms",
              "read via memmap ms", "hash while writing ms", "warm ms / 10M", "cold ms / 10M"]
    text = table(header, rows)
    print(text)
    result = dict(machine=info, command=" ".join(["python", *sys.argv]),
                  args=dict(sizes=sizes, repeats=args.repeats, dtype="uint16",
                            read_bytes=cache_entry.READ_BYTES),
                  cells=cells, table=text)
    out = args.out or (None if args.quick else RESULTS / "token_cache_check.json")
    write_result(result, out)
    return result


if __name__ == "__main__":
    main()
