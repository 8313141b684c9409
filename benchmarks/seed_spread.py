"""The seed-to-seed spread of paired loss differences, from the committed reproduction runs.

A compare report with too few seeds to tell a difference from noise says how many seeds would; that
needs the standard deviation of the per-seed paired differences (architecture minus baseline, same
batches, same held-out windows) at the report's size and budget. This script pools it over every
architecture pair of the committed run data and writes src/blocklab/recipes/seed_spread.json, which
the report reads (blocklab.statistics.verdict).

    python benchmarks/seed_spread.py            # prints the table, rewrites the JSON
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent
OUT = ROOT.parent / "src" / "blocklab" / "recipes" / "seed_spread.json"
BASELINE = "pre-ln"


def per_seed(group: Path) -> dict[str, dict[int, float]]:
    """{arch: {seed: final validation loss}} of a group's finished runs (summary.json)."""
    losses: dict[str, dict[int, float]] = {}
    for path in sorted(group.glob("runs/*/summary.json")):
        s = json.loads(path.read_text())
        losses.setdefault(s["arch"], {})[s["seed"]] = s["val_loss"]
    return losses


def from_runs(group: Path) -> tuple[list[list[float]], int]:
    """The paired differences to the baseline of every other architecture with 3 or more seeds."""
    losses = per_seed(group)
    base = losses.get(BASELINE, {})
    diffs = [[v[s] - base[s] for s in sorted(v) if s in base] for a, v in losses.items() if a != BASELINE]
    diffs = [d for d in diffs if len(d) >= 3]
    steps = json.loads(next(group.glob("runs/*/summary.json")).read_text())["step"]
    return diffs, steps


def from_report(path: Path, setting: str = "steps") -> list[list[float]]:
    """The per-seed loss differences to the baseline kept in a reproduction.json."""
    claims = json.loads(path.read_text())["claims"]
    return [k["values"] for c in claims for k in c["checks"]
            if k["metric"] == "val_loss" and k.get("baseline") == BASELINE and k["setting"] == setting
            and not k.get("minus_setting") and len(k.get("values") or []) >= 3]


def pooled_sd(groups: list[list[float]]) -> tuple[float, int]:
    """sqrt(sum (n_i - 1) s_i^2 / sum (n_i - 1)) over the groups, and its degrees of freedom."""
    df = sum(len(g) - 1 for g in groups)
    return math.sqrt(sum((len(g) - 1) * statistics.variance(g) for g in groups) / df), df


def main() -> None:
    rows = []
    quick = ROOT / "reproduction-quick" / "reproduction.json"
    if quick.is_file():
        diffs = from_report(quick)
        rows.append({"size": "tiny", "steps": 120, "batch": "16 x 128",
                     "source": str(quick.relative_to(ROOT.parent)), "pairs": len(diffs),
                     "seeds": max(len(d) for d in diffs)})
        rows[-1]["paired_sd"], rows[-1]["df"] = pooled_sd(diffs)
    cpu = ROOT / "reproduction-data" / "cpu" / "tiny-steps"
    if cpu.is_dir():
        diffs, steps = from_runs(cpu)
        rows.append({"size": "tiny", "steps": steps, "batch": "16 x 128",
                     "source": str(cpu.relative_to(ROOT.parent)), "pairs": len(diffs),
                     "seeds": max(len(d) for d in diffs)})
        rows[-1]["paired_sd"], rows[-1]["df"] = pooled_sd(diffs)
    print(f"{'size':<6} {'steps':>5} {'pairs':>5} {'seeds':>5} {'df':>4} {'paired s.d.':>11}  source")
    for r in rows:
        print(f"{r['size']:<6} {r['steps']:>5} {r['pairs']:>5} {r['seeds']:>5} {r['df']:>4} "
              f"{r['paired_sd']:>11.4f}  {r['source']}")
    sizes: dict[str, list] = {}
    for r in rows:
        sizes.setdefault(r.pop("size"), []).append({**r, "paired_sd": round(r["paired_sd"], 4)})
    OUT.write_text(json.dumps({
        "about": "Standard deviation of per-seed paired differences of final validation loss (nats), an "
                 "architecture minus pre-ln on the same batches and held-out windows, pooled over the "
                 "architectures of the committed runs; written by benchmarks/seed_spread.py.",
        "sizes": sizes}, indent=2) + "\n")
    print(f"wrote {OUT.relative_to(ROOT.parent)}")


if __name__ == "__main__":
    main()
