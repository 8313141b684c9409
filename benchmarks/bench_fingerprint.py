"""What keying the token cache by the files' bytes costs at a start: a file source's `fingerprint` (the
sha256 of every file) read in full as before the digest record (`data.digests`), against a start that
finds the record (a stat a file), a start after one file was touched (that file read again), the first
start that writes the record, and the old key of names, sizes and modification times. Each is timed as
a fresh process would run it (the process memo cleared), with the files in the page cache after the
first read, as on a second `train`. The corpora: the embedded snapshot written out as files, a
generated folder of 1 MiB text files (`--gb`) and a folder of sparse 1 MiB files (`--sparse-gb`: no
disk written; reading a hole costs the page copies and the hashing, as cached data does).

    python benchmarks/bench_fingerprint.py --gb 1 --sparse-gb 10 \
        --out benchmarks/results/fingerprint-record-cpu.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from blocklab.data import DataConfig, digests
from blocklab.data import sources as sources_module
from blocklab.data.snapshot import iter_snapshot

MIB = 1 << 20


def stat_key(files: list[Path]) -> str:
    """The key before the content key: names, sizes and modification times."""
    entries = [[str(p), s.st_size, s.st_mtime_ns] for p in files for s in [p.stat()]]
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()


def time_it(fn: Callable[[], object], repeats: int, before: Callable[[], object] | None = None) -> float:
    """Median seconds of `fn` over `repeats`, each as a fresh process (nothing memoised; `before`
    untimed)."""
    times = []
    for _ in range(repeats):
        digests._SEEN.clear()
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(folder: Path, cache: Path, repeats: int) -> dict:
    source = sources_module.open_source(DataConfig(source=str(folder), tokenizer="byte"))
    files = source.files
    size = sum(p.stat().st_size for p in files)
    record_path = digests.DigestRecord.for_source(cache, str(folder)).path
    assert record_path is not None

    def with_record() -> dict:
        record = digests.DigestRecord.for_source(cache, str(folder))
        found = source.fingerprint(record)
        record.save()
        return found

    def forget() -> None:
        record_path.unlink(missing_ok=True)

    touched = files[len(files) // 2]

    def touch() -> None:
        with_record()  # the record as the last start left it ...
        digests._SEEN.clear()
        st = touched.stat()
        os.utime(touched, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # ... then one file touched

    full = time_it(lambda: source.fingerprint(digests.DigestRecord(None)), repeats)
    first = time_it(with_record, repeats, before=forget)
    with_record()
    recorded = time_it(with_record, repeats)
    assert source.digests_read == 0, "a start with the record read files"
    after_touch = time_it(with_record, repeats, before=touch)
    assert source.digests_read == 1, "a start after one touch read another count of files"
    old = time_it(lambda: stat_key(files), repeats)
    return {"files": len(files), "bytes": size, "full_hash_s": full, "first_start_s": first,
            "recorded_s": recorded, "one_touched_s": after_touch, "stat_key_s": old,
            "record_bytes": record_path.stat().st_size, "full_mb_per_s": size / full / 1e6}


def generated(folder: Path, gb: float, sparse: bool) -> Path:
    """A folder of 1 MiB files, `gb` GB in all: text-like random bytes, or holes (sparse)."""
    folder.mkdir()
    block = os.urandom(MIB).hex().encode()[:MIB]
    for i in range(round(gb * 1000)):
        path = folder / f"f{i:05d}.txt"
        if sparse:
            with open(path, "wb") as fh:
                fh.truncate(MIB)
        else:
            path.write_bytes(block)
    return folder


def machine() -> dict:
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
               platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "load_avg": os.getloadavg(),
            "python": platform.python_version(), "system": platform.platform()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="size of the generated folder of text files")
    parser.add_argument("--sparse-gb", type=float, default=0.0, help="size of the folder of sparse files")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", help="where to write the corpora (default: a temporary folder)")
    parser.add_argument("--out")
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        cache = Path(tmp) / "cache"
        embedded = Path(tmp) / "embedded"
        for name, text in iter_snapshot():
            path = embedded / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        corpora = {"embedded corpus as files": embedded}
        if args.gb:
            corpora[f"generated text files ({args.gb:g} GB)"] = generated(Path(tmp) / "text", args.gb, False)
        if args.sparse_gb:
            corpora[f"sparse files ({args.sparse_gb:g} GB)"] = generated(Path(tmp) / "sparse", args.sparse_gb,
                                                                         True)
        time.sleep(digests.RACY_NS / 1e9 + 0.1)  # the files old enough to be recorded (not racy)
        for name, folder in corpora.items():
            stat_key(sources_module.open_source(DataConfig(source=str(folder))).files)
            sources_module.open_source(DataConfig(source=str(folder))).fingerprint()  # into the page cache
            rows[name] = measure(folder, cache, args.repeats)
            print(f"measured {name}", flush=True)
    print("| corpus | files | MB | full sha256 (before) | first start, record written "
          "| start with the record | one file touched | old stat key | full MB/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['files']:,} | {r['bytes'] / 1e6:,.0f} | {r['full_hash_s']:.3f} s | "
              f"{r['first_start_s']:.3f} s | {r['recorded_s']:.3f} s | {r['one_touched_s']:.3f} s | "
              f"{r['stat_key_s']:.3f} s | {r['full_mb_per_s']:,.0f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": machine(), "repeats": args.repeats, "rows": rows},
                                             indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
