"""The anytime-valid interval (blocklab.statistics.sequential): its Bayes factor against numerical
integration over the prior, its quantile against the Bayes factor, and its coverage when seeds are
added until decided, simulated exactly as the rounds stop, beside a t-interval read the same way."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from blocklab.statistics import evidence, sequential

DRAWS = 20_000
MARGIN = evidence.NO_EFFECT_NATS


def bayes_factor_by_integration(x: np.ndarray, tau: float) -> float:
    """B_n(0) from its definition: N(delta sigma, sigma^2) with delta ~ N(0, tau^2) against N(0, sigma^2),
    sigma integrated over the right Haar prior 1/sigma (d sigma / sigma = d log sigma), both integrals by
    Simpson's rule on a fine grid of delta and log sigma."""
    delta = np.linspace(-10 * tau, 10 * tau, 801)[:, None]
    log_sigma = np.linspace(-12.0, 8.0, 1601)[None, :]
    sigma = np.exp(log_sigma)

    def likelihood(mean: np.ndarray) -> np.ndarray:
        return np.exp(stats.norm.logpdf(x[:, None, None], mean, sigma).sum(axis=0))

    top = integrate.simpson(integrate.simpson(likelihood(delta * sigma), x=log_sigma[0], axis=1)
                            * stats.norm.pdf(delta[:, 0], 0, tau), x=delta[:, 0])
    bottom = integrate.simpson(likelihood(np.zeros((1, 1)))[0], x=log_sigma[0])
    return float(top / bottom)


@pytest.mark.parametrize("x, tau", [([0.8, 1.9, 0.4, 1.1], 1.0), ([0.3, -0.2, 0.5], 4.0),
                                    ([1.2, 0.1, -0.4, 0.9, 0.7], 2.0)])
def test_the_bayes_factor_is_the_integral_over_the_prior(x, tau):
    expected = bayes_factor_by_integration(np.array(x), tau)
    assert math.exp(sequential.log_bayes_factor(x, prior_scale=tau)) == pytest.approx(expected, rel=1e-5)


def test_one_value_carries_no_evidence_and_a_shift_moves_the_mean_tested():
    assert sequential.log_bayes_factor([0.7]) == pytest.approx(0.0, abs=1e-12)
    x = [0.3, 0.5, 0.1]
    assert sequential.log_bayes_factor([v + 2 for v in x], mean=2) == pytest.approx(
        sequential.log_bayes_factor(x))
    # scale-invariant: nats or millinats, the same evidence
    assert sequential.log_bayes_factor([1000 * v for v in x]) == pytest.approx(sequential.log_bayes_factor(x))


@pytest.mark.parametrize("n", [3, 4, 7, 20])
def test_the_interval_ends_are_where_the_bayes_factor_reaches_twenty(n):
    rng = np.random.default_rng(n)
    x = list(rng.normal(0.01, 0.02, n))
    iv = sequential.interval(x)
    assert iv.method == "sequential" and iv.n == n
    for end in (iv.low, iv.high):
        assert sequential.log_bayes_factor(x, mean=end) == pytest.approx(math.log(20), rel=1e-9)
    inside = sequential.log_bayes_factor(x, mean=0.5 * (iv.mean + iv.high))
    assert inside < math.log(20)


def test_the_interval_is_wider_than_the_t_interval_and_infinite_before_three_seeds():
    assert math.isinf(sequential.quantile(2))
    iv = sequential.interval([0.1, 0.3])
    assert iv.low == -math.inf and iv.high == math.inf
    for n in range(3, 21):
        assert sequential.quantile(n) > stats.t.ppf(0.975, n - 1)


def test_inside_in_use_the_verdicts_read_the_sequence_and_outside_the_t_interval():
    x = [0.03, 0.05, 0.02, 0.04]
    t = evidence.t_interval(x)
    with sequential.in_use():
        s = evidence.t_interval(x)
    assert evidence.t_interval(x) == t and t.method == "t"
    assert s.method == "sequential" and s.high - s.low > t.high - t.low


def test_seeds_to_decide_is_the_first_n_whose_interval_decides():
    n = sequential.seeds_to_decide(0.03, 0.02)
    assert n is not None
    def half(k: int) -> float:
        return sequential.quantile(k) * 0.02 / math.sqrt(k)

    assert half(n) < 0.03 <= half(n - 1)
    # a mean near zero decides "no effect" once the interval fits within the margin
    m = sequential.seeds_to_decide(0.001, 0.01, equivalence=MARGIN)
    assert m is not None and 0.001 + sequential.quantile(m) * 0.01 / math.sqrt(m) <= MARGIN
    assert sequential.seeds_to_decide(0.0, 0.0) is None


# -- coverage when seeds are added until decided ---------------------------------------------------------
def stopped_coverage(diffs: np.ndarray, truth: float, quantiles: np.ndarray, first: int = 3) -> tuple[
        float, float]:
    """Each row of `diffs` is one experiment's paired differences in seed order: look after each seed from
    `first` on, stop at the first look whose interval mean -/+ q_n s / sqrt(n) excludes zero or lies within
    the +-MARGIN equivalence, or at the last seed; the fraction of experiments whose interval at the stop
    covers `truth`, and the mean number of seeds at the stop."""
    draws, most = diffs.shape
    n = np.arange(1, most + 1)
    mean = np.cumsum(diffs, axis=1) / n
    sd = np.sqrt(np.maximum(np.cumsum(diffs**2, axis=1) - n * mean**2, 0) / np.maximum(n - 1, 1))
    with np.errstate(invalid="ignore"):  # one seed: an infinite quantile times a zero spread
        half = np.where(n > 1, quantiles[None, :] * sd / np.sqrt(n), np.inf)
    decided = (half < np.abs(mean)) | (np.abs(mean) + half <= MARGIN)
    decided[:, : first - 1] = False
    decided[:, -1] = True
    stop = decided.argmax(axis=1)
    rows = np.arange(draws)
    covered = np.abs(mean[rows, stop] - truth) <= half[rows, stop]
    return float(covered.mean()), float((stop + 1).mean())


def quantiles(most: int, kind: str) -> np.ndarray:
    n = np.arange(1, most + 1)
    if kind == "t":
        return np.where(n > 1, stats.t.ppf(0.975, np.maximum(n - 1, 1)), np.inf)
    return np.array([sequential.quantile(int(k)) for k in n])


def draw(truth: float, sd: float, most: int, rng: np.random.Generator, tails: str = "normal") -> np.ndarray:
    if tails == "normal":
        return rng.normal(truth, sd, (DRAWS, most))
    # Student t with 3 degrees of freedom, scaled to standard deviation `sd`: heavier tails than normal
    return truth + sd * rng.standard_t(3, (DRAWS, most)) / math.sqrt(3)


# (true mean, seed spread, most seeds): no effect; a small effect, one a third of the spread; one of the
# spread; a large one; no effect with a spread small enough that "no effect" can be decided
CASES = [(0.0, 0.02, 20), (0.007, 0.02, 20), (0.02, 0.02, 20), (0.06, 0.02, 10), (0.0, 0.008, 20)]


@pytest.mark.parametrize("truth, sd, most", CASES)
def test_stopping_when_decided_keeps_the_sequence_above_95_percent(truth, sd, most):
    rng = np.random.default_rng(int(1000 * truth + 100 * sd + most))
    covered, _ = stopped_coverage(draw(truth, sd, most, rng), truth, quantiles(most, "sequential"))
    # 20,000 draws: the standard error of a 95% coverage is 0.0015; 0.945 is 3.3 of them below
    assert covered >= 0.945, covered


@pytest.mark.parametrize("truth", [0.0, 0.02])
def test_the_t_interval_read_the_same_way_covers_clearly_less(truth):
    """The same draws and stopping rule: the t-interval covers about 84% (no effect) and 90% (an effect
    of one seed spread), the sequence 98-99%."""
    diffs = draw(truth, 0.02, 20, np.random.default_rng(0))
    t_covered, _ = stopped_coverage(diffs, truth, quantiles(20, "t"))
    s_covered, _ = stopped_coverage(diffs, truth, quantiles(20, "sequential"))
    assert t_covered < 0.92 < 0.945 <= s_covered, (t_covered, s_covered)


def test_with_heavier_tails_the_sequence_still_covers():
    """Student t(3) differences break the normal assumption; the coverage is measured, not proven."""
    rng = np.random.default_rng(3)
    for truth in (0.0, 0.02):
        covered, _ = stopped_coverage(draw(truth, 0.02, 20, rng, "t3"), truth, quantiles(20, "sequential"))
        assert covered >= 0.945, (truth, covered)


def test_the_seeds_a_verdict_says_would_tell_follow_the_interval_in_use():
    from blocklab.statistics.verdict import seeds_needed

    t_seeds = seeds_needed(0.02, 0.02)
    with sequential.in_use():
        s_seeds = seeds_needed(0.02, 0.02)
    assert s_seeds == sequential.seeds_to_decide(0.02, 0.02) and t_seeds is not None
    assert s_seeds is not None and s_seeds > t_seeds
