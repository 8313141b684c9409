"""One progress line over the runs of a launch, however many train at once.

Each run still to train is one unit, which its Trainer advances by the fraction of its budget done
(`RunTracker`, the Trainer's `overall`), so the ETA (from the average rate so far) counts every run's
steps or seconds alike, in one process or in several. The postfix names the runs in training and
where each is; `write` prints a line, such as a finished run's result, above a terminal bar.
"""

from __future__ import annotations

from typing import IO

from tqdm.std import tqdm as std_tqdm

from blocklab.util.progress import progress_bar


class RunTracker:
    """One run's part of a `RunsProgress` line: what its Trainer (or its worker's messages) advances."""

    def __init__(self, line: RunsProgress, label: str) -> None:
        self.line, self.label = line, label
        self.fraction = self.offset = 0.0
        self.status = ""

    def skip(self, done: float) -> None:
        """The run resumes with `done` of its budget spent before: neither done now nor still to do."""
        self.offset = self.fraction = done
        self.line.bar.total -= done
        self.line.refresh()

    def advance(self, fraction: float, status: str = "") -> None:
        self.fraction, self.status = fraction, status
        self.line.refresh()


class RunsProgress:
    def __init__(self, runs: int, enabled: bool = True, stream: IO[str] | None = None,
                 desc: str = "compare") -> None:
        self.bar = progress_bar(
            runs, enabled=enabled and runs > 0, stream=stream, desc=desc, smoothing=0,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}{postfix}]",
            line_format="{desc}: {percentage:3.0f}% [{elapsed}<{remaining}{postfix}]", dynamic_ncols=True)
        self.runs, self.done, self.finished = runs, 0.0, 0
        self.active: dict[str, RunTracker] = {}

    def begin(self, key: str, label: str) -> RunTracker:
        """Run `key` starts: its tracker, for its Trainer."""
        self.active[key] = tracker = RunTracker(self, label)
        self.refresh()
        return tracker

    def end(self, key: str) -> None:
        """Run `key` ended (finished or failed): its whole unit counts as done, so the ETA covers the rest."""
        tracker = self.active.pop(key)
        self.done += 1.0 - tracker.offset
        self.finished += 1
        self.refresh()

    def refresh(self) -> None:
        parts = [f"{self.finished}/{self.runs} runs done"]
        parts += [f"{t.label}: {t.status}" if t.status else t.label for t in self.active.values()]
        self.bar.set_postfix_str(", ".join(parts), refresh=False)
        self.bar.update(self.done + sum(t.fraction - t.offset for t in self.active.values()) - self.bar.n)

    def write(self, message: str, log=print) -> None:
        """`log(message)` with a terminal bar cleared first and drawn again after."""
        with std_tqdm.external_write_mode():
            log(message)

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> RunsProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
