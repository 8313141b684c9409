"""`metrics.jsonl` (one JSON object per line) and, beside it, the run's trackers (`trackers`: TensorBoard,
Weights & Biases).

Training lines: ``{"kind": "train", "step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s",
"wall_time", "scalars": {name: [floats]}}``; validation lines: ``{"kind": "val", "step", "tokens",
"wall_time", "val_loss", "val_bpb", "val_tokens", "val_bytes"}`` (``tokens`` and ``wall_time`` as in
training lines: trained so far; ``val_bpb`` divides by the UTF-8 bytes of the ``val_tokens`` target
tokens scored, ``val_bytes``). Scalar names are the names of the trainable gains without their
``.gain`` suffix (``blocks.0.attn.alpha`` per head, ``blocks.2.attn.values.coef`` for BoV's gamma_v).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from torch import nn

from blocklab.model.gains import is_gain
from blocklab.training.checkpoint import resume_hint
from blocklab.util.diskfull import said_plainly
from blocklab.util.errors import ConfigError
from blocklab.util.filemodes import atomic_write_text


def learned_scalars(model: nn.Module) -> dict[str, list[float]]:
    """Every trainable gain (SAS alpha/beta/gamma, beta_FF, ResFormer lambda, BoV gamma_v, ...)."""
    out = {}
    for name, param in model.named_parameters():
        if is_gain(name):
            full = param.full_tensor() if hasattr(param, "full_tensor") else param  # FSDP DTensor
            out[name.removesuffix(".gain")] = [round(v, 6) for v in full.detach().float().cpu().tolist()]
    return out


def read_metrics(path: str | Path, kind: str | None = None, whole: bool = True) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file, one JSON object a line (blank lines are skipped), only those
    of `kind` ("train", "val") if given. A last line that is not valid JSON is the torn end of an
    interrupted write (a full disk, a power cut) and is passed over: no record was ever whole there. A
    missing file is a FileNotFoundError, any other damaged line a ConfigError naming the file and line.
    With `whole`, the curve of a finished run must reach the step its summary.json names (`check_whole`);
    the trainer, which cuts the file back itself on resume, reads it with whole=False."""
    path = Path(path)
    rows, _ = read_rows(path)
    if whole:
        check_whole(path, rows)
    return [r for r in rows if kind is None or r.get("kind") == kind]


def check_whole(path: Path, rows: list[dict[str, Any]]) -> None:
    """A ConfigError naming the run when its metrics.jsonl (`path`, read as `rows`) lacks the validation
    row at the step where summary.json, beside it, says the run finished: the trainer writes that row
    before the summary, so lines were lost afterwards (a file cut short, a copy that stopped early),
    and a report, fit or plot read from the curve would be silently wrong. Nothing is checked for a run
    without a summary (still training or cut off: its curve simply ends earlier)."""
    try:
        summary = json.loads((path.parent / "summary.json").read_text())
        final = summary["step"]
    except (OSError, ValueError, TypeError, KeyError):  # no summary (or one too damaged to say)
        return
    if not isinstance(final, int) or any(r.get("kind") == "val" and r.get("step") == final for r in rows):
        return
    steps = [r["step"] for r in rows if isinstance(r.get("step"), int)]
    ends = f"ends at step {max(steps)}" if steps else "holds no row"
    raise ConfigError(f"{path} {ends}, without the validation at step {final} where the run's "
                      "summary.json says it finished: lines were lost after the run wrote them, and the "
                      "curve would be read as shorter than trained. Restore metrics.jsonl from a copy, or "
                      f"remove {path.parent} and rerun the command that made it (compare, reproduce and "
                      "scaling retrain it without --no-train).")


def check_finished_curve(run_dir: str | Path) -> None:
    """`check_whole` on a run folder, before a launcher reuses it as finished: a metrics.jsonl that is
    missing altogether lost every line."""
    path = Path(run_dir) / "metrics.jsonl"
    check_whole(path, read_rows(path)[0] if path.is_file() else [])


def read_rows(path: Path) -> tuple[list[dict[str, Any]], bytes | None]:
    """`read_metrics`' rows, and the torn last line it passed over (None when there is none)."""
    numbered, torn = _numbered_rows(path)
    return [row for _, row in numbered], torn


def _numbered_rows(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], bytes | None]:
    """`read_rows`, each row with its line number in the file (from 1), for messages that name it."""
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}")
    # bytes: a torn tail may be anything (zeros after a power cut), not even UTF-8
    lines = [(n, line) for n, line in enumerate(path.read_bytes().split(b"\n"), start=1) if line.strip()]
    rows = []
    for i, (n, line) in enumerate(lines):
        parsed = True
        try:
            row = json.loads(line)
            why = "" if isinstance(row, dict) else f"it is a JSON {type(row).__name__}"
        except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
            parsed, why = False, str(err)
        if not why:
            rows.append((n, row))
        elif i == len(lines) - 1 and not parsed:
            # lines are appended whole, one at a time: only the last can be torn, and a cut-off object is
            # never valid JSON, so a last line that parses (a list, a number) was written whole
            return rows, line
        else:
            # not a torn write, which only ever cuts the end: something changed the file afterwards (an
            # edit, a second writer, a damaged disk). Dropping the line would leave a silent hole in the
            # curve that reports and plots are read from, so the user decides.
            raise ConfigError(f"{path}:{n} is not a JSON object ({why}). Only the last line can be torn by "
                              "an interrupted write, so the file was changed after it was written: repair or "
                              "delete that line.")
    return rows, None


def resume_rows(path: str | Path) -> tuple[list[dict[str, Any]], bytes | None]:
    """`read_rows`, with every row checked for the fields a resume reads (`resume_gap`): a row without
    them is a ConfigError naming the file and line, before the resume changes any file. A valid JSON
    object is whole, so it cannot be a torn write: like a damaged line before the end, it was changed
    (or added) after the run wrote it, and the user decides what it should say."""
    path = Path(path)
    numbered, torn = _numbered_rows(path)
    for n, row in numbered:
        gap = resume_gap(row)
        if gap:
            raise ConfigError(f"{path}:{n} {gap}, which a resume needs. The trainer writes every line "
                              "whole, with its kind and step (a validation line also with val_loss and "
                              "val_bpb), so the file was changed after it was written: repair or delete that "
                              "line.")
    return [row for _, row in numbered], torn


KINDS = ("train", "val")


def row_counts(rows: list[dict[str, Any]], step: int) -> dict[str, int]:
    """How many of `rows` of each kind lie at or before `step`."""
    return {kind: sum(r["kind"] == kind and r["step"] <= step for r in rows) for kind in KINDS}


def resume_gap(row: dict[str, Any]) -> str:
    """What a metrics row lacks that a resume reads, in words ("" when nothing): on every row its `kind`
    ("train" or "val") and `step` (an integer >= 0), which place it on the curve and decide whether it
    is kept; on validation rows also `val_loss` and `val_bpb` (a number, or null for masked LM), which
    the summary of a finished run resumed takes again."""
    kind, step = row.get("kind"), row.get("step")
    if kind not in ("train", "val"):
        return f"has kind {kind!r} where 'train' or 'val' is needed" if "kind" in row else "has no 'kind'"
    if "step" not in row:
        return "has no 'step'"
    if not (isinstance(step, int) and not isinstance(step, bool) and step >= 0):
        return f"has step {step!r} where an integer >= 0 is needed"
    if kind == "val":
        for name in ("val_loss", "val_bpb"):
            if name not in row:
                return f"is a validation line without {name!r}"
        if not _is_number(row["val_loss"]):
            return f"has val_loss {row['val_loss']!r} where a number is needed"
        if row["val_bpb"] is not None and not _is_number(row["val_bpb"]):
            return f"has val_bpb {row['val_bpb']!r} where a number (or null) is needed"
    return ""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Tracker(Protocol):
    """Where a run's rows go besides metrics.jsonl (training/trackers.py: TensorBoard, wandb)."""

    def log(self, row: dict[str, Any]) -> None:
        """One metrics.jsonl row (`tracking.scalars_of` gives its numbers), at its step."""

    def close(self, failed: bool = False) -> None:
        """The run ended (`failed`: by an error or an interrupt; a resume goes on with it)."""


class MetricsLogger:
    """Appends to metrics.jsonl; on resume, drops lines past the resumed step so the log stays one curve,
    and a torn last line (`torn`, its size in bytes, tells; None when there was none). With
    `open_trackers` ((run folder, resume step) -> trackers, called once the file is cut back), each row
    also goes to the run's trackers. `rows` counts the file's rows by kind, which each checkpoint records
    (`metrics_rows`), so that a resume can tell rows lost since (`rundir.check_resume_metrics`)."""

    def __init__(self, run_dir: Path, resume_step: int | None = None,
                 open_trackers: Callable[[Path, int | None], list[Tracker]] | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.run_dir = Path(run_dir)
        self.torn: int | None = None
        self.rows = dict.fromkeys(KINDS, 0)
        if resume_step is None:
            with self._writing(0):
                self.path.write_text("")
        elif self.path.exists():
            rows, torn = resume_rows(self.path)  # checked: the trainer checks before it writes anything
            self.torn = None if torn is None else len(torn)
            kept = [r for r in rows if r["step"] <= resume_step]
            self.rows = row_counts(kept, resume_step)
            text = "".join(json.dumps(r) + "\n" for r in kept)
            with self._writing(len(text)):  # whole or not at all: a failure keeps the file as it was
                atomic_write_text(self.path, text)
        self.trackers: list[Tracker] = [] if open_trackers is None else open_trackers(self.run_dir,
                                                                                       resume_step)

    def _writing(self, size: int) -> AbstractContextManager[None]:
        """A write to metrics.jsonl, said plainly when the disk refuses it."""
        return said_plainly("metrics", self.path, size, lambda: resume_hint(self.run_dir))

    def log(self, row: dict[str, Any]) -> None:
        line = json.dumps(row) + "\n"
        with self._writing(len(line)), self.path.open("a") as f:  # one write: only it can be torn
            f.write(line)
        self.rows[row["kind"]] += 1
        for tracker in self.trackers:
            tracker.log(row)

    def close(self, failed: bool = False) -> None:
        """Close the trackers (once; `failed`: the run ended by an error or an interrupt)."""
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            tracker.close(failed)
