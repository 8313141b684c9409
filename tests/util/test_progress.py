"""Progress and result lines (util/progress.py): a bar on a terminal, a line per tenth in a log file
however fast the updates, and the one-line summary of a run."""

from __future__ import annotations

import io
from pathlib import Path

from blocklab.training import loop
from blocklab.util import progress


def test_line_progress_writes_each_tenth_however_fast_the_updates():
    """A line per 10% of the total even when the updates come faster than tqdm's display interval
    (tiny runs in a compare did, and their step lines went missing)."""
    stream = io.StringIO()
    bar = progress.LineProgress(total=10, file=stream, desc="x")
    for _ in range(10):
        bar.update(1)
    bar.close()
    lines = stream.getvalue().splitlines()
    percents = [line.split("%")[0].split(":")[-1].strip() for line in lines]
    assert percents == [str(10 * i) for i in range(1, 11)]


def test_format_summary_is_the_result_line_of_train_and_compare():
    summary = {"arch": "sas-p", "seed": 1, "step": 400, "tokens": 819200, "train_time": 95.2,
               "tokens_per_s": 8623.4, "val_loss": 4.12345, "val_bpb": 1.23456}
    assert progress.format_summary(summary) == ("sas-p seed 1, 400 steps, 819,200 tokens in 1 min 35 s "
                                            "(8,623 tokens/s); val loss 4.1235, val bits/byte 1.2346")
    result = loop.RunResult(Path("runs/x"), None, {**summary, "val_bpb": None, "tokens_per_s": None})
    assert progress.format_summary(result, wall_time=9.81) == ("sas-p seed 1, 400 steps, 819,200 tokens in "
                                                               "1 min 35 s; val loss 4.1235; 9.8 s wall time")
    assert progress.format_summary({}) == ""  # an unreadable summary.json gives no line, not an error
    assert [progress.format_duration(t) for t in (0.04, 59.9, 60, 3599, 7300)] == [
        "0.0 s", "59.9 s", "1 min 00 s", "59 min 59 s", "2 h 02 min"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_in_a_log_file_is_plain_lines_without_carriage_returns():
    assert progress.progress_mode(_Terminal()) == "bar" and progress.progress_mode(io.StringIO()) == "lines"
    outputs = {}
    for stream in (_Terminal(), io.StringIO()):
        bar = progress.progress_bar(40, stream=stream, mininterval=0, miniters=1,
                                line_format="{percentage:3.0f}% {n_fmt}/{total_fmt} steps{postfix}")
        for step in range(40):
            bar.set_postfix(loss=step, refresh=False)
            bar.update(1)
        bar.close()
        outputs[progress.progress_mode(stream)] = stream.getvalue()
    assert "\r" in outputs["bar"]  # a terminal: tqdm redraws its bar
    assert "\r" not in outputs["lines"]  # a file: one line per tenth, none for the steps between
    expected = [f"{10 * k:3d}% {4 * k}/40 steps, loss={4 * k - 1}" for k in range(1, 11)]
    assert outputs["lines"].splitlines() == expected
    silent = io.StringIO()
    bar = progress.progress_bar(10, enabled=False, stream=silent)
    bar.update(10)
    bar.close()
    assert silent.getvalue() == ""
