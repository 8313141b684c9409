"""What every launcher shares: which runs still need training, how many train at once, a short name
per run, and what came of each (`Launch`, with the failures and the runs left queued)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blocklab.util.errors import ConfigError

if TYPE_CHECKING:  # the store imports torch's checkpoint code: only where a run is read or trained
    from blocklab.launch.store import Outcome

# The memory `--jobs auto` sets aside per worker: it starts no more workers than the free memory holds
# at this much each. A worker's measured peak (resident memory, torch and the data included;
# benchmarks/RESULTS.md) is 552 MiB at size tiny and 782 MiB at small.
RUN_MEMORY_BYTES = 1 << 30


class RunsPending(Exception):
    """Runs were submitted without waiting (`--no-wait`): running the same command again collects them."""


class RunsFailed(Exception):
    """Some runs failed; the others trained and the report (when one was written) marks the failed ones."""

    def __init__(self, failed: list[Outcome], report: Path | None = None):
        self.failed, self.report = failed, report
        lines = [f"{len(failed)} run(s) failed:"]
        lines += [f"  {o.cfg.out_dir}: {o.error} (log: {o.log})" for o in failed]
        super().__init__("\n".join(lines))


@dataclass
class Launch:
    """What a launcher did with every config: its outcome, in the order of the configs."""

    configs: list[tuple[Any, Any]]  # (entry, TrainConfig) as trained (the launcher may set threads)
    outcomes: list[Outcome] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)  # out_dirs of runs still queued or running
    jobs: int = 1  # runs at once
    threads: int | None = None  # CPU threads per run (None: torch's default)
    launcher: str = "local"  # "local", "slurm" or "submitit-local"

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "failed"]

    def raise_if_pending(self, what: str, then: str) -> None:
        """RunsPending when a launcher that does not wait left runs queued: `what` they were for, and
        what the same command does `then`, once they have finished."""
        if self.pending:
            raise RunsPending(f"{what}: {len(self.pending)} run(s) submitted and not finished yet; run the "
                              f"same command again to wait for them (finished runs are reused) and {then}.")

    def describe(self) -> dict[str, Any]:
        """How the runs were launched, for a report's method: launcher, runs at once, threads per run."""
        return {"launcher": self.launcher, "jobs": self.jobs, "threads": self.threads}


def available_cores() -> int:
    """The CPU cores this process may use (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def available_memory() -> int | None:
    """Bytes of memory available to new processes (Linux's MemAvailable), or None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def parse_jobs(text: str | int) -> int | str:
    """`--jobs`: a positive integer or "auto"."""
    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = 0
    if isinstance(text, bool) or value < 1:
        raise ConfigError(f"--jobs {text!r} is not allowed: give a positive number of runs at once, or auto.")
    return value


def resolve_jobs(jobs: int | str, runs: int, threads: int | None = None, gpus: int = 0) -> int:
    """How many runs train at once. "auto": one per GPU when the runs use GPUs; else one per core (or per
    `threads` cores), no more than the free memory holds at RUN_MEMORY_BYTES each; never more than
    `runs`, never fewer than one."""
    jobs = parse_jobs(jobs)
    if jobs != "auto":
        return int(jobs)
    if gpus:
        return max(1, min(runs, gpus))
    n = available_cores() // (threads or 1)
    memory = available_memory()
    if memory is not None:
        n = min(n, memory // RUN_MEMORY_BYTES)
    return max(1, min(runs, n))


def run_names(configs: list[tuple[Any, Any]]) -> list[str]:
    """A short name per run for progress lines: its out_dir below the runs' common folder."""
    dirs = [Path(cfg.out_dir).resolve() for _, cfg in configs]
    if len(dirs) == 1:
        return [dirs[0].name]
    root = Path(os.path.commonpath([d.parent for d in dirs]))
    return [str(d.relative_to(root)) for d in dirs]


@dataclass
class Todo:
    """A run still to train: its place in the launch ("[number/total] name"), config and what it does."""

    index: int
    total: int
    name: str
    cfg: Any
    verb: str  # "training" or "resuming"

    def line(self, text: str) -> str:
        return f"[{self.index + 1}/{self.total}] {self.name}: {text}"


def reuse_finished(configs: list[tuple[Any, Any]], log) -> tuple[list[Outcome | None], list[Todo]]:
    """Check every saved run against its config (a ConfigError names a difference, before anything
    trains), log the finished ones as reused, and return the outcomes so far (None: still to train)
    with the runs still to train."""
    from blocklab.launch.store import Outcome, check_reusable, read_summary
    from blocklab.util.progress import format_summary

    names = run_names(configs)
    outcomes: list[Outcome | None] = []
    todo = []
    for i, (_, cfg) in enumerate(configs):
        state = check_reusable(cfg)
        if state == "finished":
            summary = read_summary(cfg)
            result = format_summary(summary) if summary else ""
            log(f"[{i + 1}/{len(configs)}] {names[i]}: finished earlier, reused"
                + (f"; {result}" if result else ""))
            outcomes.append(Outcome(cfg, "reused", summary=summary))
        else:
            outcomes.append(None)
            todo.append(Todo(i, len(configs), names[i], cfg, "resuming" if state == "resume" else "training"))
    return outcomes, todo


def result_line(outcome: Outcome) -> str:
    """A finished or failed run's line."""
    from blocklab.launch.store import read_summary
    from blocklab.util.progress import format_summary

    if outcome.status == "failed":
        return f"FAILED: {outcome.error} (log: {outcome.log})"
    if outcome.status == "reused":
        return "finished meanwhile by another process, reused"
    summary = outcome.summary or read_summary(outcome.cfg) or {}
    return format_summary(summary, outcome.seconds)


def failure(cfg, error: str) -> Outcome:
    from blocklab.launch.store import Outcome, log_path

    return Outcome(cfg, "failed", error=error, log=log_path(cfg))
