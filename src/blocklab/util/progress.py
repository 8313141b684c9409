"""What a run shows while it trains and says when it ends: progress bars (tqdm on a terminal, plain
lines in a log file), messages above them, and the one-line summary of a finished run."""

from __future__ import annotations

import sys
from typing import IO, Any

from tqdm.std import tqdm as std_tqdm


def format_duration(seconds: float) -> str:
    """"9.8 s", "1 min 35 s", "2 h 05 min"."""
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes:02d} min"


def format_summary(result: Any, wall_time: float | None = None) -> str:
    """One line on a finished run, from its summary (a RunResult, or a run's summary.json read back):
    what `blocklab train` prints after the run and `blocklab compare` after each, e.g. "pre-ln seed 0,
    400 steps, 819,200 tokens in 1 min 35 s (8,623 tokens/s); val loss 4.1234, val bits/byte 1.2345".
    The time is training's alone (validation and data preparation excluded); `wall_time`, the seconds
    from start to end, is added when given. A field the summary lacks is left out."""
    s = result if isinstance(result, dict) else result.summary
    who = " ".join(str(part) for part in (s.get("arch"), f"seed {s['seed']}" if "seed" in s else None)
                   if part is not None)
    work = [who] if who else []
    if s.get("step") is not None:
        work.append(f"{s['step']:,} steps")
    if s.get("tokens") is not None:
        spent = f" in {format_duration(s['train_time'])}" if s.get("train_time") is not None else ""
        resumed = (f" over {len(s['resumed_at']) + 1} starts, resumed at step "
                   f"{', '.join(map(str, s['resumed_at']))}" if s.get("resumed_at") else "")
        speed = f" ({s['tokens_per_s']:,.0f} tokens/s{resumed})" if s.get("tokens_per_s") else ""
        work.append(f"{s['tokens']:,} tokens{spent}{speed}")
    parts = [", ".join(work)] if work else []
    if s.get("val_loss") is not None:
        bpb = f", val bits/byte {s['val_bpb']:.4f}" if s.get("val_bpb") is not None else ""
        parts.append(f"val loss {s['val_loss']:.4f}{bpb}")
    if wall_time is not None:
        parts.append(f"{format_duration(wall_time)} wall time")
    return "; ".join(parts)


# Progress goes to stderr. On a terminal (or in a notebook) tqdm redraws its bar in place; in a log file,
# a pipe or CI the redrawn bar would be a run of carriage returns, so the same figures are written as
# plain lines instead: one each time another LINE_EVERY of the total is done, at least every
# LINE_INTERVAL seconds, and a last one at the end.
LINE_EVERY = 0.1
LINE_INTERVAL = 300.0


def progress_mode(stream: IO[str] | None = None) -> str:
    """How progress shows on `stream` (default: sys.stderr): "bar", tqdm's bar redrawn in place, on a
    terminal or in a Jupyter notebook; "lines", plain lines without a carriage return, anywhere else."""
    stream = sys.stderr if stream is None else stream
    try:
        if stream is not None and stream.isatty():
            return "bar"
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        pass
    from tqdm.auto import tqdm as auto_tqdm  # the notebook's widget bar when running in Jupyter

    return "bar" if any(c.__module__ == "tqdm.notebook" for c in auto_tqdm.__mro__) else "lines"


class LineProgress(std_tqdm):
    """A tqdm that writes plain lines, for a log file: one when another `every` of the total is done,
    one at least every `interval` seconds, and a last one when it closes; no bar, no carriage return."""

    def __init__(self, *args: Any, every: float = LINE_EVERY, interval: float = LINE_INTERVAL,
                 **kwargs: Any) -> None:
        self.every, self.interval = every, interval
        self.printed_n: float | None = None  # n at the last line written
        self.printed_t: float | None = None
        # `_due` decides when a line is written: tqdm must offer every update, however fast (its
        # mininterval would drop the line of a 10% mark reached within 0.1 s of the last display)
        kwargs.update(mininterval=0, miniters=0)
        super().__init__(*args, **kwargs)

    def _due(self) -> bool:
        if getattr(self, "start_t", None) is None or self.n == self.printed_n:  # still in __init__
            return False
        last_n = self.initial if self.printed_n is None else self.printed_n
        size = self.total * self.every if self.total else 0  # the amount between two lines
        if size and self.n // size > last_n // size:
            return True
        return self._time() - (self.start_t if self.printed_t is None else self.printed_t) >= self.interval

    def _line(self) -> None:
        fields = {**self.format_dict, "ncols": None}  # a line is not cut to a terminal's width ($COLUMNS)
        self.fp.write(self.format_meter(**fields) + "\n")
        self.fp.flush()
        self.printed_n, self.printed_t = self.n, self._time()

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:  # noqa: ARG002 (tqdm's)
        if msg is not None:  # tqdm clearing or replacing a bar: a written line stays as it is
            return False
        if self._due():
            self._line()
        return True

    def clear(self, nolock: bool = False) -> None:
        """Nothing to clear: every line stays."""

    def close(self) -> None:
        if not self.disable and getattr(self, "start_t", None) is not None and self.n != self.printed_n:
            self._line()
        self.leave = False  # tqdm would end a bar it keeps with a newline; each line has its own
        super().close()


def progress_bar(total: float | None, enabled: bool = True, stream: IO[str] | None = None,
                 line_format: str | None = None, **kwargs: Any) -> std_tqdm:
    """A tqdm bar on `stream` (default: sys.stderr) in the `progress_mode` of that stream: tqdm.auto's
    bar with `kwargs` (bar_format ...), or a LineProgress whose lines follow `line_format` (a tqdm
    bar_format without {bar}) and are written no matter what `leave` says. `enabled=False`: silent."""
    stream = sys.stderr if stream is None else stream
    if progress_mode(stream) == "lines":
        for name in ("dynamic_ncols", "leave"):
            kwargs.pop(name, None)
        bar_format = line_format or kwargs.get("bar_format")
        kwargs.pop("bar_format", None)
        return LineProgress(total=total, disable=not enabled, file=stream, bar_format=bar_format, **kwargs)
    from tqdm.auto import tqdm as auto_tqdm

    return auto_tqdm(total=total, disable=not enabled, file=stream, **kwargs)


def say(message: str) -> None:
    """A message on stderr ("blocklab: ..."), written above any progress bar."""
    std_tqdm.write(f"blocklab: {message}", file=sys.stderr)
