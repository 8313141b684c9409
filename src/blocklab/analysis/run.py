"""`diagnose_run`: the diagnostics of a trained run directory, on windows of its own held-out split.

The windows are the raw token stream, never masked: a masked-LM run trains on masked inputs, but
the statistics describe how the model reads real text. Where a window starts is a choice
(`START`): Value Residual Learning's first token is "the same and special across all sequences"
(App. A.2), which a window that starts anywhere in the packed stream is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from blocklab.analysis.diagnose import diagnose
from blocklab.util.errors import ConfigError

# "window": every seq_len tokens from the start of the split (the validation windows' inputs);
# "document": at the first token of each document (after the end-of-text separator);
# "separator": at the separator before each document, so position 0 is the same special token in
#              every sequence, like the paper's start token, and the document follows.
START = ("window", "document", "separator")


def held_out_windows(tokens: np.ndarray, seq_len: int, batch_size: int = 8, max_batches: int | None = 4,
                     start: str = "window", eos_id: int | None = None) -> list[Tensor]:
    """Batches (B, seq_len) of unmasked token ids from a split's token stream, in order.

    Documents in the stream are each followed by the separator `eos_id` (blocklab.data), so a
    document starts at position 0 and after every separator. Windows that would run past the end
    of the stream are left out.
    """
    if start not in START:
        raise ValueError(f"start = {start!r} is not allowed: choose one of {', '.join(START)}")
    n = len(tokens)
    if start == "window":
        starts = np.arange(0, n - seq_len + 1, seq_len)
    else:
        if eos_id is None:
            raise ValueError(f"start = {start!r} needs the separator's id (eos_id)")
        separators = np.flatnonzero(np.asarray(tokens) == eos_id)
        starts = np.concatenate([[0], separators + 1]) if start == "document" else separators
    starts = starts[starts + seq_len <= n]
    if max_batches is not None:
        starts = starts[: max_batches * batch_size]
    if len(starts) == 0:
        raise ValueError(f"the held-out split ({n} tokens) has no window of {seq_len} tokens starting at a "
                         f"{start} boundary")
    windows = np.stack([np.asarray(tokens[s:s + seq_len], dtype=np.int64) for s in starts])
    return [torch.from_numpy(windows[i:i + batch_size]) for i in range(0, len(windows), batch_size)]


def diagnose_run(run_dir: str | Path, out_dir: str | Path | None = None, batches: int = 4,
                 layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
                 device: str = "cpu", map_tokens: int = 64, start: str = "window",
                 batch_size: int = 8) -> dict[str, Any]:
    """`diagnose` the latest checkpoint of a run on `batches` batches of `batch_size` unmasked
    windows of its held-out split (`held_out_windows`, at the run's seq_len, from `start`).

    With `out_dir`, also `write_report` there (the learned scalars from the run's metrics.jsonl).
    Returns the diagnose() dict, whose meta also names the run and `start`.
    """
    from blocklab.analysis.figures import write_report
    from blocklab.data import prepare_data
    from blocklab.training import load_run

    run = load_run(run_dir, device=device)
    if run.config is None:
        raise FileNotFoundError(f"{str(run_dir)!r} has no config.yaml: its data and seq_len are unknown")
    data = prepare_data(run.config.data)  # cached: the run's own tokenised held-out split
    ids = held_out_windows(data.split("val"), run.config.seq_len, batch_size, batches, start,
                           data.tokenizer.eos_id)
    results = diagnose(run.model, ids, layers=layers, heads=heads, max_batches=batches, map_tokens=map_tokens)
    results["meta"].update(run=str(run_dir), start=start, objective=run.config.data.objective)
    if out_dir is not None:
        metrics = Path(run_dir) / "metrics.jsonl"
        write_report(results, out_dir, metrics_path=metrics if metrics.is_file() else None)
    return results


def compare_runs(run_a: str | Path, run_b: str | Path, out_dir: str | Path, **options: Any) -> list[Path]:
    """`diagnose_run` two runs alike (`options`: batches, layers, heads, device, map_tokens, start) and
    overlay them in `out_dir` (`compare_reports`), labelled by their architectures, or by their
    directories when those are the same. Entropy, importance and similarity depend on the sequence
    length and the tokens, so the runs must share seq_len and tokenizer (ConfigError otherwise)."""
    from blocklab.analysis.figures import compare_reports
    from blocklab.data import load_tokenizer
    from blocklab.training import TrainConfig

    a, b = (TrainConfig.load(Path(r) / "config.yaml") for r in (run_a, run_b))
    if a.seq_len != b.seq_len:
        raise ConfigError(f"comparing diagnostics needs two runs with the same seq_len, since entropy, "
                          f"importance and similarity depend on it: {run_a} has {a.seq_len}, {run_b} has "
                          f"{b.seq_len}.")
    if load_tokenizer(run_a).hash != load_tokenizer(run_b).hash:
        raise ConfigError(f"comparing diagnostics needs two runs with the same tokenizer: {run_a} and "
                          f"{run_b} differ.")
    results = [diagnose_run(r, **options) for r in (run_a, run_b)]
    labels = (a.arch, b.arch) if a.arch != b.arch else (str(run_a), str(run_b))
    return compare_reports(*results, out_dir, labels=labels)
