"""Many runs at once: how much `--jobs` saves, measured side by side on this machine.

Parts (each a fresh run store under --out, so nothing is reused; the data cache is shared and warm):

- threads: two tiny runs (pre-ln, seeds 0 and 1, 150 steps) one after another on 2 threads, against
  the same two at once on 1 thread each, and one after another on 1 thread (the per-run cost).
- main-job: `blocklab compare` as the README runs it, with --jobs 1 and with the default --jobs.
- quick: `blocklab reproduce --quick` with --jobs 1 and with the default --jobs.
- memory: the peak resident memory of one worker process at sizes tiny and small (summary.json).

Each part's figures are written to benchmarks/results/parallel-runs-cpu.json as soon as it finishes,
and a finished part is not run again (--redo PART to measure it anew), so the benchmark resumes.

    PYTHONPATH=src python benchmarks/parallel_runs.py                # every part (about 35 min on 2 cores)
    PYTHONPATH=src python benchmarks/parallel_runs.py --parts threads,memory
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "parallel-runs-cpu.json"
PARTS = ("threads", "main-job", "quick", "memory")


def _timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def _summaries(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(folder.rglob("summary.json"))]


def part_threads(out: Path) -> dict[str, Any]:
    from blocklab.compare import Entry, run_configs
    from blocklab.launch import LocalLauncher, train_runs

    base = {"max_steps": 150, "eval_every": 50, "progress": False}
    rows = {}
    for name, jobs, threads in (("2 runs one after another, 2 threads each", 1, 2),
                                ("2 runs at once, 1 thread each", 2, 1),
                                ("2 runs one after another, 1 thread each", 1, 1)):
        folder = out / "threads" / f"jobs{jobs}-threads{threads}"
        shutil.rmtree(folder, ignore_errors=True)
        configs = run_configs([Entry.parse("pre-ln")], 2, folder, base)
        start = time.perf_counter()
        launch = train_runs(configs, LocalLauncher(jobs=jobs, threads=threads), log=lambda *_: None)
        wall = time.perf_counter() - start
        assert not launch.failed, launch.failed
        summaries = _summaries(folder)
        rows[name] = {"jobs": jobs, "threads": threads, "wall_s": wall,
                      "tokens_per_s_per_run": [s["tokens_per_s"] for s in summaries],
                      "train_time_s_per_run": [s["train_time"] for s in summaries],
                      "val_loss": [s["val_loss"] for s in summaries]}
    return rows


def _command_pair(out: Path, name: str, command: list[str]) -> dict[str, Any]:
    rows = {}
    for jobs in ("1", "auto"):
        folder = out / name / f"jobs-{jobs}"
        shutil.rmtree(folder, ignore_errors=True)
        wall = _timed([*command, "--out", str(folder), "--jobs", jobs, "--quiet"] if name == "main-job"
                      else [*command, "--out", str(folder), "--jobs", jobs])
        summaries = _summaries(folder)
        rows[f"--jobs {jobs}"] = {"wall_s": wall, "runs": len(summaries),
                                  "val_loss": {f"{s['arch']}-seed{s['seed']}": s["val_loss"]
                                               for s in summaries},
                                  "peak_rss_mib_per_run": [s["peak_memory_mib"] for s in summaries]}
    one, auto = rows["--jobs 1"], rows["--jobs auto"]
    rows["speed-up"] = one["wall_s"] / auto["wall_s"]
    rows["same losses"] = one["val_loss"] == auto["val_loss"]
    return rows


def part_main_job(out: Path) -> dict[str, Any]:
    return _command_pair(out, "main-job", ["blocklab", "compare"])


def part_quick(out: Path) -> dict[str, Any]:
    return _command_pair(out, "quick", ["blocklab", "reproduce", "--quick"])


def part_memory(out: Path) -> dict[str, Any]:
    rows = {}
    for size in ("tiny", "small"):
        folder = out / "memory" / size
        shutil.rmtree(folder, ignore_errors=True)
        # two seeds, so that --jobs 2 trains each in a worker process of its own
        subprocess.run(["blocklab", "compare", "--archs", "pre-ln", "--seeds", "2", "--steps", "20",
                        "eval_every=10", f"size={size}", "--jobs", "2", "--timing-rounds", "0",
                        "--quiet", "--out", str(folder)], check=True, stdout=subprocess.DEVNULL)
        summaries = _summaries(folder)
        rows[size] = {"peak_rss_mib": max(s["peak_memory_mib"] for s in summaries),
                      "params": summaries[0]["params"]["total"]}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated: {', '.join(PARTS)}")
    parser.add_argument("--redo", default="", help="parts to measure again")
    parser.add_argument("--out", default="runs/parallel-bench")
    args = parser.parse_args()
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    results["machine"] = {"cores": len(os.sched_getaffinity(0)), "python": sys.version.split()[0]}
    for part in args.parts.split(","):
        if part in results and part not in args.redo.split(","):
            continue
        start = time.perf_counter()
        results[part] = {**globals()[f"part_{part.replace('-', '_')}"](Path(args.out)),
                         "measured_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                         "part_wall_s": time.perf_counter() - start}
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=2))
        print(f"{part}: {json.dumps(results[part], indent=2)}", flush=True)
    print(table(results))


def table(results: dict[str, Any]) -> str:
    lines = ["| measurement | --jobs 1 | --jobs auto (2 on 2 cores) | speed-up | same losses |",
             "|:---|---:|---:|---:|:---|"]
    for part in ("main-job", "quick"):
        if part in results:
            r = results[part]
            lines.append(f"| {part} | {r['--jobs 1']['wall_s']:.0f} s | {r['--jobs auto']['wall_s']:.0f} s | "
                         f"{r['speed-up']:.2f}x | {r['same losses']} |")
    if "threads" in results:
        lines += ["", "| two tiny runs of 150 steps | wall | tokens/s per run |", "|:---|---:|---:|"]
        for name, r in results["threads"].items():
            if isinstance(r, dict):
                speeds = ", ".join(f"{v:,.0f}" for v in r["tokens_per_s_per_run"])
                lines.append(f"| {name} | {r['wall_s']:.0f} s | {speeds} |")
    if "memory" in results:
        lines += ["", "| size | worker peak RSS (MiB) |", "|:---|---:|"]
        lines += [f"| {k} | {v['peak_rss_mib']:.0f} |" for k, v in results["memory"].items()
                  if isinstance(v, dict) and "peak_rss_mib" in v]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
