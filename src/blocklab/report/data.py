"""Reading what a comparison left behind and the machine it ran on: each run's files, the git
commit, the environment, a cache's bytes per token.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from blocklab.training import TrainConfig
from blocklab.training.metrics import read_metrics


def read_run(cfg: TrainConfig) -> dict[str, Any]:
    """One run's config, summary, metrics and model config, as the report reads them."""
    run = Path(cfg.out_dir)
    return {"dir": run, "cfg": cfg, "summary": json.loads((run / "summary.json").read_text()),
            "metrics": read_metrics(run / "metrics.jsonl"),
            "model_config": json.loads((run / "model_config.json").read_text())}


def kv_cache_bytes_per_token(model_cfg: dict[str, Any], dtype: torch.dtype = torch.bfloat16) -> float:
    """Bytes per token of one sequence's KV cache at full context: the model's cache layout
    (`cache_bytes_per_token`, equal to `KVCache.nbytes` of a real cache; tests/runtime/test_cache.py),
    built from the value paths on the meta device. NaN for an encoder, which has no cache."""
    from blocklab.model.config import ModelConfig
    from blocklab.runtime.cache_layout import cache_bytes_per_token

    cfg = ModelConfig.from_dict(model_cfg)
    if not cfg.causal:
        return float("nan")
    return cache_bytes_per_token(cfg, dtype.itemsize)["per_token"]


def git_commit(where: str | Path | None = None) -> tuple[str | None, bool | None]:
    """(short commit, uncommitted changes?) of the git checkout holding `where` (default: blocklab's own
    source, the code that made the numbers); (None, None) outside a checkout, for an installed package,
    or without git. Read-only: optional index locks are off, so nothing in the checkout changes."""
    where = Path(where) if where is not None else Path(__file__).resolve().parent
    if {"site-packages", "dist-packages"} & set(where.parts):
        return None, None
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10,
                              check=True, env=env).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError, ValueError):
        return None, None
    return (commit, dirty) if commit else (None, None)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def environment(device: str = "cpu") -> dict[str, Any]:
    """The machine and software the report was made on: CPU model, logical cores (and those this process
    may use), torch's default CPU threads, the GPU of a CUDA `device`, Python, torch and blocklab
    versions, blocklab's git commit and the date (UTC)."""
    import blocklab

    commit, dirty = git_commit()
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    gpu = None
    if device.startswith("cuda") and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(torch.device(device))
    return {"cpu": _cpu_model(), "logical_cores": os.cpu_count(), "usable_cores": usable,
            "torch_threads_default": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "gpu": gpu,
            "os": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "blocklab": blocklab.__version__, "commit": commit, "commit_dirty": dirty,
            "date_utc": utc_now()}


def utc_now() -> str:
    """The time now in UTC, as "2026-05-09 07:35:25 UTC"."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
