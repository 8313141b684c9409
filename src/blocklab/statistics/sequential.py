"""An anytime-valid interval for paired per-seed differences: valid however many seeds are added after
looking, and whenever the adding stops (docs/statistics-sequential.md).

The t-interval (`blocklab.statistics.evidence`) covers the mean in 95% of experiments whose number of
seeds was fixed in advance. Adding seeds until the interval excludes zero, and reading it each time,
covers less: the optional-stopping problem. This module gives instead a confidence sequence, a
sequence of intervals CS_1, CS_2, ... with

    P(the mean lies in CS_n for every n at once) >= 1 - alpha,

so that the interval read at any seed count, chosen in any way from the data (a rule that stops once
the verdict is decided, a budget of hours), covers the mean with at least 1 - alpha.

The method: the scale-invariant mixture sequential t-test (Lai 1976, with the Gaussian mixture of
Wang & Ramdas 2023), the t-test Bayes factor with a normal prior on the standardised effect and the
right Haar prior 1/sigma on the scale (Rouder et al. 2009). For differences d_1..d_n, assumed
independent N(mu, sigma^2), and a hypothesised mean m, let x_i = d_i - m and

    u_n(m) = n * mean(x)^2 / sum_i x_i^2 = t^2 / (n - 1 + t^2)      (t: the one-sample t statistic)
    B_n(m) = (1 + n tau^2)^(-1/2) * (1 - u_n * n tau^2 / (1 + n tau^2))^(-n/2).

B_n(m) is the Bayes factor of N(m + delta sigma, sigma^2) with delta ~ N(0, tau^2) against
N(m, sigma^2), sigma integrated over 1/sigma. It is a function of the scale-invariant statistic
x / |x|, whose distribution under the mean m does not depend on sigma, and by Wijsman's representation
it is that statistic's likelihood ratio; so under the mean m it is a nonnegative martingale with
B_1 = 1 (Pérez-Ortiz, Lardy, de Heide & Grünwald, Ann. Statist. 2024; Wang & Ramdas: a test
martingale in the reduced filtration). Ville's inequality bounds P(B_n(mu) >= 1/alpha for some n)
by alpha; the event concerns the whole path, so the bound holds for any stopping rule at all. The
confidence sequence is the set of m that B_n has not rejected:

    CS_n = {m : B_n(m) < 1/alpha} = mean(d) -/+ q_n * s / sqrt(n),

because B_n grows with u_n, which grows with |mean(d) - m|: q_n solves B_n = 1/alpha for t and plays
the part of the t quantile t_{1-alpha/2, n-1}. It does not depend on the data, only on n, alpha and
tau; where even u_n -> 1 leaves B_n below 1/alpha the interval is the whole line (q_n infinite).

tau, the prior's scale on the standardised effect mu / sigma, is fixed here before any data:
PRIOR_SCALE = 4 makes a look at 3 seeds (the fewest a verdict reads) give a finite interval, 2.5x the
t-interval's half-width, and costs 1.9-2.1x from 4 to 20 seeds (the design note's table).
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
from collections.abc import Sequence

from blocklab.statistics import evidence

PRIOR_SCALE = 4.0
METHOD = "sequential"
NAME = (f"anytime-valid 95% confidence sequence (scale-invariant mixture t-test, normal prior of scale "
        f"{PRIOR_SCALE:g} on the standardised effect)")
# Beyond this many seeds "what more would tell" says "more than".
MOST_SEEDS = 100



def log_bayes_factor(values: Sequence[float], mean: float = 0.0, prior_scale: float = PRIOR_SCALE) -> float:
    """log B_n(mean) of the module doc: the evidence of `values` against their true mean being `mean`."""
    xs = [v - mean for v in values]
    n = len(xs)
    total = sum(x * x for x in xs)
    if n == 0 or total == 0.0:
        return 0.0
    u = n * statistics.fmean(xs) ** 2 / total
    shrink = n * prior_scale**2 / (1 + n * prior_scale**2)
    # 1 - u * shrink >= 1 - shrink > 0: finite
    return -0.5 * math.log1p(n * prior_scale**2) - 0.5 * n * math.log1p(-u * shrink)


@functools.lru_cache(maxsize=4096)
def quantile(n: int, confidence: float = evidence.CONFIDENCE, prior_scale: float = PRIOR_SCALE) -> float:
    """q_n: the half-width of CS_n in units of s / sqrt(n) (infinite where no mean is rejected yet)."""
    if n < 2:
        return math.inf
    tau2 = prior_scale**2
    shrink = n * tau2 / (1 + n * tau2)
    # B_n = 1/alpha  <=>  1 - u shrink = (sqrt(1 + n tau^2) / alpha)^(-2/n)
    g = math.exp(-2.0 / n * (0.5 * math.log1p(n * tau2) - math.log(1 - confidence)))
    u = (1 - g) / shrink
    if u >= 1:
        return math.inf
    return math.sqrt((n - 1) * u / (1 - u))


def interval(values: Sequence[float], confidence: float = evidence.CONFIDENCE) -> evidence.Interval:
    """The mean of `values` and CS_n around it, as an `evidence.Interval` whose method says so (bounds
    None below 2 values, infinite while the sequence rejects nothing)."""
    return evidence.mean_interval(values, confidence, lambda n: quantile(n, confidence), METHOD)


def active() -> bool:
    """Whether the verdicts read confidence sequences now (inside `in_use`)."""
    return evidence.read_instead() is interval


def in_use() -> contextlib.AbstractContextManager[None]:
    """Within this block every paired interval a verdict reads (`evidence.t_interval`) is the confidence
    sequence instead: the judges of `scaling`, `reproduce` and `compare` read their evidence unchanged,
    and the verdict rules (interval excludes zero, lies within the equivalence margin) stay the same."""
    return evidence.reading(interval)


def decides(half: float, mean: float, equivalence: float | None) -> bool:
    """Whether an interval mean -/+ half excludes zero, or (with an equivalence margin) lies within it."""
    if half < abs(mean):
        return True
    return equivalence is not None and abs(mean) + half <= equivalence


def seeds_to_decide(mean: float, sd: float, equivalence: float | None = None,
                    least: int = evidence.MIN_SEEDS) -> int | None:
    """The fewest seeds (`least` or more) whose confidence sequence, at this mean and seed spread, would
    exclude zero or lie within +-`equivalence`; None beyond MOST_SEEDS (or with no spread to read)."""
    if not sd > 0 or math.isnan(mean):
        return None
    for n in range(max(least, 2), MOST_SEEDS + 1):
        q = quantile(n)
        if not math.isinf(q) and decides(q * sd / math.sqrt(n), mean, equivalence):
            return n
    return None
