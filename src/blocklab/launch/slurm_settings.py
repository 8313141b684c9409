"""What each run's Slurm job asks the cluster for (`SlurmSettings`): partition, account, GPUs, CPUs,
memory, time limit, extra sbatch options and setup lines, from a YAML file's `slurm:` section and the
command's flags; and Slurm's time formats read as minutes (`parse_time`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from blocklab.training.config import read_yaml
from blocklab.util.errors import ConfigError

LOCAL_MAX_REQUEUES = 6  # submitit's local controller (`Controller.run`) restarts a job at most this often


@dataclass
class SlurmSettings:
    """What each run's job asks Slurm for. From a YAML file's `slurm:` section (`load`) and flags."""

    partition: str | None = None
    account: str | None = None
    gpus_per_run: int = 0
    cpus_per_run: int = 1  # also the run's CPU threads, unless its config sets threads
    mem_gb: float | None = None
    time_min: int = 240  # the job's time limit; a run cut off there is requeued and resumes
    signal_delay_s: int | None = None  # the job is told to stop this long before its limit (submitit: 90)
    max_requeues: int = 3  # how often a job cut off at its limit is requeued before its run counts as failed
    sbatch: dict[str, Any] = field(default_factory=dict)  # other sbatch options: {"qos": "high", ...}
    setup: list[str] = field(default_factory=list)  # shell lines before each job (module load, a venv)
    procs_per_run: int | None = None  # torchrun processes per run (None: one per GPU, or one)
    folder: str | None = None  # submitit's scripts, logs and results (None: beside the runs, slurm/)
    cluster: str = "slurm"  # or "local": submitit's LocalExecutor, every job at once on this machine
    poll_s: float = 10.0  # seconds between looks at the jobs while waiting

    @classmethod
    def load(cls, path: str | Path | None = None, **flags: Any) -> SlurmSettings:
        """A YAML file's `slurm:` section (or its top level), then the `flags` that are not None."""
        data: dict[str, Any] = {}
        if path is not None:
            raw = read_yaml(path)
            data = dict(raw.get("slurm", raw) if isinstance(raw, dict) else {})
        data.update({k: v for k, v in flags.items() if v is not None})
        known = {f.name for f in fields(cls)}
        unknown = sorted(data.keys() - known)
        if unknown:
            raise ConfigError(f"slurm setting {unknown[0]!r}{f' in {path}' if path else ''} is not allowed: "
                              f"choose from {', '.join(sorted(known))}.")
        if "time_min" in data:
            data["time_min"] = parse_time(data["time_min"])
        settings = cls(**data)
        settings.check()
        return settings

    def check(self) -> None:
        for name in ("gpus_per_run", "cpus_per_run", "time_min", "procs_per_run", "signal_delay_s",
                     "max_requeues"):
            value, low = getattr(self, name), 0 if name == "gpus_per_run" else 1
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ConfigError(f"slurm setting {name} = {value!r} is not allowed: give an integer "
                                  f">= {low}.")
        if self.cluster not in ("slurm", "local"):
            raise ConfigError(f"slurm setting cluster = {self.cluster!r} is not allowed: choose slurm or "
                              "local.")
        if self.cluster == "local" and self.max_requeues > LOCAL_MAX_REQUEUES:
            raise ConfigError(f"slurm setting max_requeues = {self.max_requeues} is not allowed with "
                              "cluster: local: submitit's local controller restarts a job at most "
                              f"{LOCAL_MAX_REQUEUES} times; give at most that.")
        if not isinstance(self.sbatch, dict) or not isinstance(self.setup, list):
            raise ConfigError("slurm settings sbatch (a mapping of sbatch options, without the dashes) and "
                              "setup (a list of shell lines) must be a mapping and a list.")

    @property
    def procs(self) -> int:
        return self.procs_per_run or max(1, self.gpus_per_run)


def parse_time(value: Any) -> int:
    """Minutes from an integer or Slurm's time formats: "MM", "HH:MM:SS", "D-HH:MM:SS", "D-HH"."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", str(value).strip())
    if not match:
        raise ConfigError(f"slurm time limit {value!r} is not allowed: give minutes, HH:MM:SS or D-HH:MM:SS.")
    days, _, b, c = (int(g) if g else None for g in match.groups())
    a = int(match.group(2))  # always there
    if days is None and b is None:  # "MM"
        minutes = a
    elif days is not None and b is None:  # "D-HH"
        minutes = days * 1440 + a * 60
    else:  # "[D-]HH:MM[:SS]"
        minutes = (days or 0) * 1440 + a * 60 + (b or 0) + (1 if c else 0)
    if minutes < 1:
        raise ConfigError(f"slurm time limit {value!r} is not allowed: it must be at least a minute.")
    return minutes
