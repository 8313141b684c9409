"""The campaign log: what trained the committed runs (the launches, their time, the machine), read
back by the report.
"""

from __future__ import annotations

import json
import os
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

CAMPAIGN = "campaign.jsonl"
COMMIT_VARIABLE = "BLOCKLAB_COMMIT"


def record_launch(root: Path, launch, seconds: float) -> None:
    """Append one line to OUT/<scale>/campaign.jsonl for a launch that trained something: when, at which
    commit, on what machine and threads, how long, how many runs trained and were reused."""
    trained = sum(o.status == "trained" for o in launch.outcomes)
    if not trained:
        return
    info = machine()
    record = {"date": info["date"], "commit": info["commit"], "cpu": info["cpu"], "cores": info["cores"],
              **({"gpu": info["gpu"]} if info["gpu"] else {}), "torch": info["torch"],
              **launch.describe(), "wall_seconds": round(seconds, 1),
              "trained": trained, "reused": sum(o.status == "reused" for o in launch.outcomes)}
    root.mkdir(parents=True, exist_ok=True)
    with open(root / CAMPAIGN, "a") as f:
        f.write(json.dumps(record) + "\n")


def read_campaign(root: Path) -> list[dict[str, Any]]:
    path = root / CAMPAIGN
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def machine() -> dict[str, Any]:
    """What ran the runs: CPU, GPU (None without CUDA), threads, versions, commit and date. The commit is
    git's (with "+changes" when the package differs from it), else $BLOCKLAB_COMMIT, else None."""
    import subprocess

    import torch

    import blocklab

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=Path(__file__).parent,
                              timeout=10).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD") or None
        if commit and git("status", "--porcelain", "--untracked-files=no", "--", "."):
            commit += "+changes"  # the package that ran differs from this commit
    except (OSError, subprocess.SubprocessError):
        commit = None
    # a copy of the working tree without its git folder (a lent GPU machine's): the commit its sender named
    commit = commit or os.environ.get(COMMIT_VARIABLE) or None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "blocklab": blocklab.__version__,
        "python": platform.python_version(),
        "commit": commit,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
