"""What a ladder's report was made from, read from the runs it used: the corpus (data.source and the
fingerprint of its snapshot), the tokenizer, the schedule, the runs used at every rung and the finished
runs left out (of seeds that did not finish every rung), the training time the runs recorded, and a
learning-rate sweep's choices.
Nothing here is fixed text: a ladder run on another corpus, or a piece of one, says so."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from blocklab.scaling.judge import LadderData, ScalingResult
from blocklab.scaling.sweeps import at_edge


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _run_config(run: Path | None) -> dict[str, Any]:
    from blocklab.training.config import read_yaml

    if run is None or not (run / "config.yaml").is_file():
        return {}
    try:
        return read_yaml(run / "config.yaml")
    except Exception:  # a config this blocklab cannot read: the method says it was not recorded
        return {}


def method_facts(result: ScalingResult) -> dict[str, Any]:
    """The measured facts of the report's Method, as plain data (scaling.json's "method")."""
    data = result.data
    used = [(a, r, s) for a in data.archs for r in data.rungs for s in result.seeds]
    left_out = sorted(f"{r}/{a}-seed{s}" for (a, r), found in data.points.items() for s in found
                      if s not in result.seeds)
    first = data.points[(result.baseline, data.rungs[-1])][result.seeds[0]]
    config = _run_config(first.run)
    manifest = _read_json(first.run / "data_manifest.json") if first.run else {}
    source = manifest.get("source") or {}
    tokenizer = manifest.get("tokenizer") or {}
    cfg_data, optim = config.get("data") or {}, config.get("optim") or {}
    times = [data.points[(a, r)][s].train_time for a, r, s in used]
    times += [found[s].train_time for found in data.shorter.values() for s in result.seeds]
    return {
        "data_source": cfg_data.get("source"),
        "corpus": source.get("description"),
        "fingerprint": (source.get("fingerprint") or {}).get("sha256"),
        "tokenizer": cfg_data.get("tokenizer"),
        "vocab_size": tokenizer.get("vocab_size") or cfg_data.get("vocab_size"),
        "tokenizer_sha256": tokenizer.get("hash") or manifest.get("tokenizer_hash"),
        "schedule": optim.get("schedule"),
        "seeds_used": list(result.seeds),
        "runs_used": len(used) + len(data.shorter) * len(result.seeds),
        "shorter_runs_used": len(data.shorter) * len(result.seeds),
        "runs_per_rung": {r: {a: len(result.seeds) for a in data.archs} for r in data.rungs},
        "left_out": left_out,
        "training_seconds": sum(t for t in times if t is not None) if any(t is not None for t in times)
        else None,
        "training_recorded": sum(t is not None for t in times),
        **({"lr_sweep": sweep} if (sweep := sweep_facts(data)) is not None else {}),
    }


def sweep_facts(data: LadderData) -> dict[str, Any] | None:
    """A ladder's learning-rate sweep as plain data (None without one): its grid, steps and seed, how
    many of its runs were read and the training time they recorded, and each (rung, arch)'s losses per
    factor, chosen factor and rates, and whether the choice is at the grid's edge."""
    sweep = data.ladder.lr_sweep
    if sweep is None:
        return None
    chosen = [{"rung": rung, "arch": arch, "factor": s.best, "rates": s.rates,
               "at_edge": at_edge(s, sweep.factors),
               "losses": {f"{f:g}": v if math.isfinite(v) else None for f, v in s.losses.items()}}
              for (rung, arch), s in data.sweeps.items()]
    times = [t for s in data.sweeps.values() for ts in s.train_seconds.values() for t in ts]
    return {"factors": list(sweep.factors), "steps": sweep.steps, "seed": sweep.seed, "seeds": sweep.seeds,
            "runs": sum(len(s.losses) for s in data.sweeps.values()) * sweep.seeds, "chosen": chosen,
            "training_seconds": sum(times) if times else None, "training_recorded": len(times)}


def _recorded(recorded: int, total: int) -> str:
    """"" when every run recorded its training time, else " (k of the n runs recorded it)"."""
    return "" if recorded == total else f" ({recorded} of the {total} runs recorded it)"


def sweep_time_text(facts: dict[str, Any]) -> str:
    """The sweep runs' training time (`sweep_facts`), from their summary.json: not in the Method's total
    of the runs used."""
    if facts["training_seconds"] is None:
        return "their training time not recorded in the runs"
    return (f"{_hours(facts['training_seconds'])} of training from their summary.json"
            f"{_recorded(facts['training_recorded'], facts['runs'])}, not counted in the training time of "
            "the runs used above")


def _hours(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} seconds"
    return f"{seconds / 60:.0f} minutes" if seconds < 5400 else f"{seconds / 3600:.1f} hours"


def method_text(facts: dict[str, Any], archs: list[str], rungs: list[str]) -> str:
    """The measured facts in words, for the Method section."""
    f = facts
    corpus = (f"`{f['data_source']}`" if f["data_source"] else "not recorded in the runs")
    if f["corpus"]:
        corpus += f" ({f['corpus']}"
        corpus += f", sha256 {f['fingerprint'][:16]} (first 16 hex digits))" if f["fingerprint"] else ")"
    tokenizer = "not recorded in the runs" if not f["tokenizer"] else (
        f"`{f['tokenizer']}`" + (f", vocabulary {f['vocab_size']:,}" if f["vocab_size"] else "")
        + (f", sha256 {f['tokenizer_sha256'][:16]} (first 16 hex digits)" if f["tokenizer_sha256"] else ""))
    seeds = ", ".join(map(str, f["seeds_used"]))
    shorter = f.get("shorter_runs_used", 0)
    runs = (f"{f['runs_used']} runs used: seeds {seeds} of each of {len(archs)} architectures at each of "
            f"{len(rungs)} rungs ({len(f['seeds_used'])} per rung and architecture)"
            + (f", and {shorter} shorter runs of {rungs[-1]} (the same seeds)" if shorter else ""))
    left = ("Finished runs left out, their seed unfinished elsewhere: "
            f"{_left_out_text(f['left_out'], rungs)}." if f["left_out"] else "No finished run was left out.")
    if f["training_seconds"] is None:
        time = "Training time: not recorded in the runs."
    else:
        part = _recorded(f["training_recorded"], f["runs_used"])
        time = (f"Training time, from the runs' summary.json: {_hours(f['training_seconds'])} summed over "
                f"the runs used{part}; the wall clock depends on how many ran at once, which the runs do not "
                "record.")
    return f"Corpus: {corpus}. Tokenizer: {tokenizer}. {runs}. {left} {time}"


def _left_out_text(names: list[str], rungs: list[str]) -> str:
    """The runs left out ("<rung>/<arch>-seed<k>"), an architecture's seed left out at every rung said once
    ("seeds 3-9 of pre-ln, resformer at every rung": the seeds an until-decided call added to some
    architectures), the others by name."""
    runs = []  # (name, (arch, seed), rung)
    for name in names:
        rung, _, run = name.partition("/")
        arch, _, seed = run.rpartition("-seed")
        runs.append((name, (arch, int(seed)), rung))
    whole = {key for _, key, _ in runs if {r for _, k, r in runs if k == key} >= set(rungs)}
    groups: dict[tuple[int, ...], list[str]] = {}
    for arch in dict.fromkeys(a for a, _ in sorted(whole)):
        groups.setdefault(tuple(sorted(s for a, s in whole if a == arch)), []).append(arch)
    parts = [f"{'seed' if len(seeds) == 1 else 'seeds'} {_span(seeds)} of {', '.join(archs)} at every rung"
             for seeds, archs in groups.items()]
    rest = [name for name, key, _ in runs if key not in whole]
    return "; ".join(parts + ([", ".join(rest)] if rest else []))


def _span(seeds: tuple[int, ...]) -> str:
    """3-9 for three or more consecutive seeds, else 3, 5, 8."""
    if len(seeds) > 2 and list(seeds) == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))
