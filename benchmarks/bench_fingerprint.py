"""What keying the token cache by the files' bytes costs: a file source's `fingerprint` (the sha256 of
every file, `data.sources.file_sha256`) against the old key of names, sizes and modification times, on
the embedded corpus written out as files and on a generated folder of about 1 GB, each read cold (a
fresh process memo; the files in the page cache after the first read, as on a second `train`).

    python benchmarks/bench_fingerprint.py --gb 1 --out benchmarks/results/fingerprint-cpu.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from blocklab.data import DataConfig
from blocklab.data import sources as sources_module
from blocklab.data.snapshot import iter_snapshot


def stat_key(files: list[Path]) -> str:
    """The key before: names, sizes and modification times."""
    entries = [[str(p), s.st_size, s.st_mtime_ns] for p in files for s in [p.stat()]]
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()


def time_it(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        sources_module._DIGESTS.clear()  # a fresh process: nothing memoised
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(folder: Path, repeats: int) -> dict:
    source = sources_module.open_source(DataConfig(source=str(folder), tokenizer="byte"))
    files = source.files
    size = sum(p.stat().st_size for p in files)
    content = time_it(source.fingerprint, repeats)
    old = time_it(lambda: stat_key(files), repeats)
    return {"files": len(files), "bytes": size, "content_s": content, "stat_s": old,
            "content_mb_per_s": size / content / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="size of the generated folder")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        embedded = Path(tmp) / "embedded"
        for name, text in iter_snapshot():
            path = embedded / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        rows["embedded corpus as files"] = measure(embedded, args.repeats)
        big = Path(tmp) / "big"
        big.mkdir()
        block = os.urandom(1 << 20).hex().encode()[: 1 << 20]  # 1 MiB of text-like bytes
        for i in range(int(args.gb * 1000)):
            (big / f"f{i:05d}.txt").write_bytes(block)
        measure(big, 1)  # once to put it in the page cache
        rows[f"generated folder ({args.gb:g} GB)"] = measure(big, args.repeats)
    print("| corpus | files | MB | content sha256 s | old stat key s | MB/s hashed |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['files']:,} | {r['bytes'] / 1e6:,.0f} | {r['content_s']:.3f} | "
              f"{r['stat_s']:.3f} | "
              f"{r['content_mb_per_s']:,.0f} |")
    if args.out:
        info = {"load_avg": os.getloadavg(), "cpu": os.cpu_count()}
        Path(args.out).write_text(json.dumps({"machine": info, "rows": rows}, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
