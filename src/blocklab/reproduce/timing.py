"""Throughput from an interleaved timing pass after training (`compare.measure_architectures`),
never from the runs' logged tokens/s; written to timing.json beside the runs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from blocklab.compare import Entry
from blocklab.reproduce.campaign import machine
from blocklab.reproduce.metrics import METRICS
from blocklab.reproduce.planning import NotFinished, check_settings
from blocklab.reproduce.scales import Scale
from blocklab.statistics.claims import Claim
from blocklab.training import TrainConfig

TIMING = "timing.json"


def timed_archs(claims: list[Claim]) -> dict[str, list[str]]:
    """The architectures whose speed the claims' timed checks compare, by setting."""
    timed: dict[str, dict[str, None]] = {}
    for claim in claims:
        for check in claim.checks:
            if METRICS[check.metric].timed:
                for setting in check_settings(check):
                    timed.setdefault(setting, {}).update(dict.fromkeys(check.archs))
    return {setting: list(archs) for setting, archs in timed.items()}


def time_throughput(claims: list[Claim], scale: Scale, root: Path,
                    runs: dict[str, list[tuple[Entry, TrainConfig]]], threads: int | None, log=print) -> None:
    """After training: time the training step of every architecture a throughput check reads again,
    in `scale.timing_rounds` interleaved rounds of `scale.timing_steps` steps
    (`compare.measure_architectures`, as compare's report does), on `threads` threads (the runs'), and
    keep the step times in OUT/<scale>/<group>/timing.json. A run's logged tokens/s depends on what
    else the machine did while it trained (another run, a resumed half); within a round every
    architecture meets the same load. A group already timed for these architectures is not timed
    again, so the verdict stays a function of the committed data."""
    import time

    from blocklab.compare import measure_architectures
    from blocklab.util.filemodes import atomic_write_text

    for setting, archs in timed_archs(claims).items():
        path = root / scale.group(setting) / TIMING
        if path.is_file() and set(archs) <= set(json.loads(path.read_text())["architectures"]):
            continue
        configs = [next((e, c) for e, c in runs[setting] if e.label == arch and c.seed == 0)
                   for arch in archs]  # seed 0 stands for the architecture
        if threads is not None:
            configs = [(e, replace(cfg, threads=threads)) for e, cfg in configs]
        log(f"{setting}: timing {', '.join(archs)} in {scale.timing_rounds} interleaved rounds of "
            f"{scale.timing_steps} steps")
        start = time.perf_counter()
        measured = measure_architectures(configs, scale.timing_rounds, scale.timing_steps)
        info = machine()
        record = {
            "rounds": scale.timing_rounds, "steps": scale.timing_steps,
            "threads": threads if threads is not None else info["torch_threads"],
            **{k: info[k] for k in ("date", "commit", "cpu", "cores", "torch")},
            "seconds": round(time.perf_counter() - start, 1),
            "architectures": {
                label: {"tokens_per_step": cfg.batch_size * cfg.seq_len,
                        "step_s": measured["architectures"][label]["step_s"]}
                for label, (_, cfg) in zip(archs, configs, strict=True)},
        }
        atomic_write_text(path, json.dumps(record, indent=2))


def read_timing(group: Path, arch: str) -> dict[int, float]:
    """{round: tokens/s} of `arch` in `group`'s timing pass: the tokens of a step over the median of
    the round's step times."""
    import statistics

    path = group / TIMING
    if not path.is_file():
        raise NotFinished(f"{group} has no interleaved timing ({TIMING}) yet: run `blocklab reproduce` "
                          "without --no-train to time it (finished runs are reused).")
    saved = json.loads(path.read_text())
    if arch not in saved["architectures"]:
        raise NotFinished(f"{path} did not time {arch}: run `blocklab reproduce` without --no-train.")
    times, per = saved["architectures"][arch]["step_s"], saved["steps"]
    tokens = saved["architectures"][arch]["tokens_per_step"]
    return {r: tokens / statistics.median(times[r * per:(r + 1) * per]) for r in range(len(times) // per)}
