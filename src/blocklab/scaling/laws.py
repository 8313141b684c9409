"""Which laws an equivalence reads, and how far past the ladder it reads them.

The law is chosen on the same data it is then read on: the lack-of-fit test (`fit.check_fit`) admits or
refuses each law on the ladder's mean losses. An interval computed under the one law chosen ignores that
choice, and where both laws are admitted they can read the same seeds ten points apart (issue 56). So an
equivalence is read under every admissible law, each with its t-interval over seeds, and reported as
the hull of those intervals: it decides (reproduced or contradicted) only where every admissible law's
interval lies on the same side, and its width shows the spread between the laws. A bootstrap over seeds
repeating the choice in every resample was the other way; with 3 to 5 seeds it has 10 to 126 distinct
resamples and covers less than its level (docs/scaling.md). The test with the choice inside is a
simulation: ladders drawn from a known saturating law, where the power law is admitted in some draws
(tests/scaling/test_report.py).

A reading that needs the baseline's law more than READ_BEYOND times past the ladder's largest rung (or
below its smallest) is extrapolation, not measurement: it is reported as "beyond the ladder" with the
factor, and no verdict rests on it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from blocklab.statistics import evidence

# How far past its largest (or below its smallest) rung a law is read for a number: a factor of 2 in N,
# about one and a half rungs of the CPU ladder (1.5x apart) and less than one of the GPU ladder's.
READ_BEYOND = 2.0


def hull(by_law: Mapping[str, Sequence[float]], confidence: float = evidence.CONFIDENCE
         ) -> evidence.Interval | None:
    """The hull of the intervals (t, or the confidence sequence inside `sequential.in_use`) of each law's
    per-seed values (None where any value is infinite: beyond the baseline's reach). Its mean is the
    middle of the laws' means and its values those of the law whose values spread most (what more seeds
    would tell is read from them)."""
    if not by_law or not all(math.isfinite(v) for vs in by_law.values() for v in vs):
        return None
    intervals = [evidence.t_interval(vs, confidence) for vs in by_law.values()]
    if len(intervals) == 1:
        return intervals[0]
    means = [iv.mean for iv in intervals]
    widest = max(intervals, key=lambda iv: iv.half_width or 0.0)
    # the hull is of the intervals in use: t-intervals, or the confidence sequence in until-decided rounds
    if any(iv.low is None or iv.high is None for iv in intervals):
        return evidence.Interval(widest.values, (min(means) + max(means)) / 2, None, None, confidence,
                                 widest.method)
    return evidence.Interval(widest.values, (min(means) + max(means)) / 2,
                             min(iv.low for iv in intervals if iv.low is not None),
                             max(iv.high for iv in intervals if iv.high is not None), confidence,
                             widest.method)


def beyond_ladder(n: float, log_ratios: Mapping[str, Sequence[float]], sizes: Sequence[float]
                  ) -> float | None:
    """How far past the baseline's rungs (`sizes`) the reading at N needs its law: N' = N exp(mean log
    ratio) under each law, as a factor past the largest rung (above 1) or below the smallest (below 1),
    the farthest of the laws; None when every law's N' lies within READ_BEYOND of the rungs (or is
    infinite, which `hull` reports)."""
    worst = None
    for values in log_ratios.values():
        if not values or not all(map(math.isfinite, values)):
            continue
        needed = n * math.exp(sum(values) / len(values))
        if min(sizes) <= needed <= max(sizes):
            continue
        factor = needed / max(sizes) if needed > max(sizes) else needed / min(sizes)
        if (factor > READ_BEYOND or factor < 1 / READ_BEYOND) and (
            worst is None or abs(math.log(factor)) > abs(math.log(worst))
        ):
            worst = factor
    return worst


def beyond_text(factor: float) -> str:
    """"beyond the ladder (4.3x its largest rung)" or "(0.31x its smallest rung)"."""
    where = "largest" if factor > 1 else "smallest"
    return f"beyond the ladder ({factor:.1f}x the baseline's {where} rung)" if factor > 1 else (
        f"beyond the ladder ({factor:.2f}x the baseline's {where} rung)")
