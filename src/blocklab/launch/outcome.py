"""How a Slurm job came out, as JSON beside submitit's own result file.

submitit writes that one as a pickle, and reading a pickle runs whatever code it names: anyone who can
write to a shared run store could plant one in `OUT/slurm/`. So blocklab never reads it (the launcher
only looks whether it exists: the job has ended), and the job writes its outcome here: {"status",
"seconds"}, or {"error", "trace"}.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from blocklab.util.filemodes import atomic_write_text


def outcome_path(paths: Any) -> Path:
    """`<job>_<task>_outcome.json` beside submitit's `<job>_<task>_result.pkl` (its JobPaths)."""
    pickle_path = Path(paths.result_pickle)
    return pickle_path.with_name(pickle_path.name.replace("_result.pkl", "_outcome.json"))


def write_outcome(outcome: dict[str, Any]) -> None:
    """Write this job's outcome (called inside the job, by `slurm_job.RunJob`)."""
    try:
        import submitit

        paths = submitit.JobEnvironment().paths
    except RuntimeError:  # called outside a submitit job (a test, a direct call): nobody reads it
        return
    atomic_write_text(outcome_path(paths), json.dumps(outcome))


def read_outcome(paths: Any) -> dict[str, Any] | None:
    """A job's outcome file, or None if it has none or it is not one (torn, foreign, hand-edited)."""
    try:
        outcome = json.loads(outcome_path(paths).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(outcome, dict):
        return None
    seconds = outcome.get("seconds", 0.0)
    if outcome.get("status") in ("trained", "reused") and isinstance(seconds, (int, float)):
        return outcome
    return outcome if isinstance(outcome.get("error"), str) else None
