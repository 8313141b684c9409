"""Paired evidence for a claim: per-seed differences, a t-interval, and a verdict.

Runs that differ only in architecture share a seed's data order and held-out windows, so their
difference cancels the seed's luck with the data. For n seeds with paired differences d_1..d_n,

    mean  = (1/n) sum_i d_i
    s     = sqrt( sum_i (d_i - mean)^2 / (n - 1) )
    CI_95 = mean -/+ t_{0.975, n-1} s / sqrt(n)                   (Student's t-interval)

which assumes the d_i are independent draws from a normal distribution; with 3 to 5 seeds that is
an assumption, not a check. The quantile t_{0.975, n-1} is found here by bisection on Student's
CDF, written through the regularised incomplete beta function, so the core needs no scipy
(tests/statistics/test_evidence.py checks it against scipy.stats.t).

A verdict reads the interval against the expected relation:

    lower     reproduced if CI_high < 0, contradicted if CI_low > 0
    higher    reproduced if CI_low > 0,  contradicted if CI_high < 0
    within    reproduced if [CI_low, CI_high] lies in [-tol, tol], contradicted if it misses it
    at_most   reproduced if CI_high <= tol, contradicted if CI_low > tol  ("at or below")

and anything else, or fewer than MIN_SEEDS seeds, is inconclusive - unless an equivalence bound
delta is given (loss checks: NO_EFFECT_NATS) and the interval holds zero and lies within [-delta,
delta]: then the verdict is "no effect", a measured absence of the claimed difference at this scale,
where "inconclusive" means too few seeds or too wide an interval to say anything. ("within" checks
already carry their own tolerance, so they take no bound.) Exact quantities (parameter counts,
FLOPs per token, cache bytes) have no interval: they are compared directly.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

MIN_SEEDS = 3
CONFIDENCE = 0.95
RELATIONS = ("lower", "higher", "within", "at_most", "equals")
VERDICTS = ("reproduced", "contradicted", "no effect", "inconclusive")
# The equivalence bound of loss checks: an interval that holds zero and lies within +-0.02 nats rules
# out every loss effect the papers report (ResFormer: 0.02-0.04 nats of training loss at 82M-468M;
# Bank of Values: 0.009 BPB, about 0.03 nats per token at nanochat's ~4.7 bytes per token), so the
# claimed gain is absent at this scale rather than unmeasured.
NO_EFFECT_NATS = 0.02


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz), converging for
    x < (a + 1) / (a + b + 2)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function: P(T <= t) = 1 - I_{df/(df+t^2)}(df/2, 1/2) / 2 for t >= 0."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with df degrees of freedom (0.5 < p < 1), by bisection."""
    if not 0.5 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df > 0; got p={p}, df={df}")
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Interval:
    """Mean of the per-seed values with its two-sided interval (None bounds below 2 values): Student's t
    ("t"), or an anytime-valid confidence sequence ("sequential", `blocklab.statistics.sequential`)."""

    values: tuple[float, ...]
    mean: float
    low: float | None
    high: float | None
    confidence: float = CONFIDENCE
    method: str = "t"

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def half_width(self) -> float | None:
        return None if self.low is None or self.high is None else (self.high - self.low) / 2

    def __str__(self) -> str:
        if self.low is None:
            return f"{self.mean:+.4f} (n={self.n}, no interval)"
        return f"{self.mean:+.4f} [{self.low:+.4f}, {self.high:+.4f}]"


# The interval every paired verdict reads in place of the t-interval inside `reading` (None: the t).
_INSTEAD: contextvars.ContextVar[Callable[[Sequence[float], float], Interval] | None] = (
    contextvars.ContextVar("paired_interval", default=None))


@contextlib.contextmanager
def reading(method: Callable[[Sequence[float], float], Interval]) -> Iterator[None]:
    """Within this block `t_interval` gives `method(values, confidence)` instead: how seeds added until
    decided (`sequential.in_use`) make every judge read the confidence sequence, its rules unchanged."""
    token = _INSTEAD.set(method)
    try:
        yield
    finally:
        _INSTEAD.reset(token)


def read_instead() -> Callable[[Sequence[float], float], Interval] | None:
    """The interval `t_interval` gives in place of the t-interval now (None: the t-interval itself)."""
    return _INSTEAD.get()


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Mean and the Student t-interval of `values` (assumed independent and normal); inside `reading`
    (`sequential.in_use()`: seeds added until decided) that method's interval instead."""
    instead = _INSTEAD.get()
    if instead is not None:
        return instead(values, confidence)
    return mean_interval(values, confidence, lambda n: t_quantile(0.5 + confidence / 2, n - 1), "t")


def mean_interval(values: Sequence[float], confidence: float, quantile: Callable[[int], float],
                  method: str) -> Interval:
    """mean(values) -/+ quantile(n) * s / sqrt(n): the shape of the t-interval and of the confidence
    sequence (`sequential.interval`), which differ only in their quantile; no bounds below 2 values,
    infinite ones where the quantile is."""
    xs = tuple(float(v) for v in values)
    if not xs:
        raise ValueError(f"a {method} interval needs at least one value")
    if any(math.isnan(x) for x in xs):
        raise ValueError(f"a {method} interval got a NaN among {xs}")
    mean = statistics.fmean(xs)
    if len(xs) < 2:
        return Interval(xs, mean, None, None, confidence, method)
    q = quantile(len(xs))
    half = math.inf if math.isinf(q) else q * statistics.stdev(xs) / math.sqrt(len(xs))
    return Interval(xs, mean, mean - half, mean + half, confidence, method)


def welch_interval(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE
          ) -> tuple[float, float, float]:
    """mean(a) - mean(b) and its Welch t-interval (independent samples, unequal variances): the
    change of a paired difference between two scales, whose seeds are not paired with each other."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = statistics.fmean(a) - statistics.fmean(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return diff, diff, diff
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile(0.5 + confidence / 2, df) * se
    return diff, diff - half, diff + half


def paired_differences(values: dict[int, float], baseline: dict[int, float]) -> list[float]:
    """values[seed] - baseline[seed] over the seeds both have, in seed order."""
    seeds = sorted(set(values) & set(baseline))
    if not seeds:
        raise ValueError(f"no seed in common to pair: {sorted(values)} and {sorted(baseline)}")
    return [values[s] - baseline[s] for s in seeds]


def verdict(interval: Interval, relation: str, tolerance: float = 0.0, min_seeds: int = MIN_SEEDS,
            equivalence: float | None = None) -> str:
    """reproduced, contradicted, no effect (with an `equivalence` bound) or inconclusive for a measured
    difference (see the module doc)."""
    if relation not in RELATIONS or relation == "equals":
        raise ValueError(
            f"relation {relation!r} is not allowed for an interval: choose one of "
            f"{', '.join(r for r in RELATIONS if r != 'equals')}"
        )
    if interval.n < min_seeds or interval.low is None:
        return "inconclusive"
    lo, hi = interval.low, interval.high
    if relation == "within":
        if -tolerance <= lo and hi <= tolerance:
            return "reproduced"
        return "contradicted" if hi < -tolerance or lo > tolerance else "inconclusive"
    if relation == "lower":
        found = "reproduced" if hi < 0 else "contradicted" if lo > 0 else "inconclusive"
    elif relation == "higher":
        found = "reproduced" if lo > 0 else "contradicted" if hi < 0 else "inconclusive"
    else:
        found = "reproduced" if hi <= tolerance else "contradicted" if lo > tolerance else "inconclusive"
    if found == "inconclusive" and equivalence is not None and -equivalence <= lo <= 0 <= hi <= equivalence:
        return "no effect"
    return found


def exact_verdict(value: float, reference: float, relation: str, rel_tol: float = 1e-9) -> str:
    """reproduced or contradicted for exact quantities: value against reference (a baseline's value
    or a formula's) under `relation` (lower, higher, equals)."""
    if relation == "lower":
        return "reproduced" if value < reference else "contradicted"
    if relation == "higher":
        return "reproduced" if value > reference else "contradicted"
    if relation == "equals":
        return (
            "reproduced" if math.isclose(value, reference, rel_tol=rel_tol, abs_tol=1e-12) else "contradicted"
        )
    raise ValueError(
        f"relation {relation!r} is not allowed for an exact quantity: choose lower, higher or equals"
    )


def combine(verdicts: Sequence[str]) -> str:
    """A claim with several checks: contradicted if any is, else inconclusive if any is, else no effect
    if any check found none, else (all reproduced) reproduced."""
    if not verdicts:
        return "inconclusive"
    for outcome in ("contradicted", "inconclusive", "no effect"):
        if outcome in verdicts:
            return outcome
    return "reproduced"
