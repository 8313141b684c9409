"""blocklab.statistics.evidence against scipy, and the verdict logic on constructed intervals."""

from __future__ import annotations

import math
import random

import pytest
from scipy import stats

from blocklab.statistics import evidence
from blocklab.statistics.evidence import (
    Interval,
    combine,
    exact_verdict,
    paired_differences,
    t_interval,
    verdict,
)


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 9, 29, 200])
def test_t_quantile_and_cdf_match_scipy(df):
    for p in (0.6, 0.9, 0.95, 0.975, 0.995, 0.9995):
        assert evidence.t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-9)
    for t in (-30.0, -2.5, -0.1, 0.0, 0.7, 3.0, 40.0):
        assert evidence.t_cdf(t, df) == pytest.approx(stats.t.cdf(t, df), abs=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_t_interval_matches_scipy(seed):
    rng = random.Random(seed)
    xs = [rng.gauss(rng.uniform(-1, 1), rng.uniform(0.01, 2)) for _ in range(rng.randint(2, 9))]
    iv = t_interval(xs)
    low, high = stats.t.interval(0.95, len(xs) - 1, loc=stats.tmean(xs), scale=stats.sem(xs))
    assert iv.mean == pytest.approx(sum(xs) / len(xs), rel=1e-12)
    assert (iv.low, iv.high) == pytest.approx((low, high), rel=1e-9)
    assert iv.n == len(xs)


def test_t_interval_edge_cases():
    one = t_interval([0.25])
    assert one.mean == 0.25 and one.low is None and one.high is None
    same = t_interval([0.5, 0.5, 0.5])  # no spread: the interval is the point
    assert (same.low, same.high) == (0.5, 0.5)
    with pytest.raises(ValueError, match="at least one"):
        t_interval([])
    with pytest.raises(ValueError, match="NaN"):
        t_interval([0.1, math.nan, 0.2])


def test_paired_differences_pair_by_seed():
    assert paired_differences({0: 3.0, 1: 5.0, 2: 4.0}, {2: 1.0, 0: 1.0, 1: 2.0, 7: 9.0}) == [2.0, 3.0, 3.0]
    with pytest.raises(ValueError, match="no seed in common"):
        paired_differences({0: 1.0}, {1: 1.0})


def iv(low, high, n=3):
    return Interval(tuple([0.0] * n), (low + high) / 2, low, high)


@pytest.mark.parametrize(
    "relation, low, high, tol, expected",
    [
        ("lower", -0.3, -0.1, 0, "reproduced"),
        ("lower", -0.3, 0.1, 0, "inconclusive"),
        ("lower", 0.1, 0.3, 0, "contradicted"),
        ("higher", 0.1, 0.3, 0, "reproduced"),
        ("higher", -0.1, 0.3, 0, "inconclusive"),
        ("higher", -0.3, -0.1, 0, "contradicted"),
        ("within", -0.02, 0.01, 0.03, "reproduced"),
        ("within", -0.02, 0.05, 0.03, "inconclusive"),
        ("within", 0.04, 0.08, 0.03, "contradicted"),
        ("within", -0.09, -0.04, 0.03, "contradicted"),
        ("at_most", -0.5, 0.0, 0.0, "reproduced"),
        ("at_most", -0.5, 0.1, 0.0, "inconclusive"),
        ("at_most", 0.05, 0.1, 0.0, "contradicted"),
        ("at_most", 0.05, 0.1, 0.2, "reproduced"),
    ],
)
def test_verdicts(relation, low, high, tol, expected):
    assert verdict(iv(low, high), relation, tol) == expected


@pytest.mark.parametrize(
    "relation, low, high, expected",
    [
        ("lower", -0.015, 0.01, "no effect"),  # holds zero, inside +-0.02
        ("lower", -0.03, 0.01, "inconclusive"),  # too wide to rule out the papers' effect
        ("lower", 0.002, 0.01, "contradicted"),  # inside the bound but above zero: the claim fails
        ("lower", -0.01, -0.002, "reproduced"),  # below zero wins, however small
        ("higher", -0.02, 0.02, "no effect"),  # the bound itself is inside
        ("at_most", -0.01, 0.015, "no effect"),
        ("within", -0.01, 0.01, "reproduced"),  # "within" has its own tolerance, never "no effect"
        ("within", -0.01, 0.05, "inconclusive"),
    ],
)
def test_no_effect_needs_zero_inside_an_interval_inside_the_bound(relation, low, high, expected):
    tolerance = 0.03 if relation == "within" else 0.0
    assert verdict(iv(low, high), relation, tolerance, equivalence=0.02) == expected
    if expected == "no effect":  # without a bound the same interval is only inconclusive
        assert verdict(iv(low, high), relation) == "inconclusive"


def test_half_width_by_hand():
    assert iv(-0.03, 0.01).half_width == pytest.approx(0.02)
    assert Interval((1.0,), 1.0, None, None).half_width is None


def test_fewer_than_three_seeds_is_inconclusive_however_clear():
    assert verdict(iv(-9, -8, n=2), "lower") == "inconclusive"
    assert verdict(iv(-9, -8, n=3), "lower") == "reproduced"
    with pytest.raises(ValueError, match="not allowed"):
        verdict(iv(-1, 1), "equals")


def test_exact_verdicts_and_combination():
    assert exact_verdict(5, 6, "lower") == "reproduced" and exact_verdict(6, 6, "lower") == "contradicted"
    assert exact_verdict(7, 6, "higher") == "reproduced"
    assert exact_verdict(0.625, 5 / 8, "equals") == "reproduced"
    assert exact_verdict(0.626, 5 / 8, "equals") == "contradicted"
    with pytest.raises(ValueError, match="within"):
        exact_verdict(1, 1, "within")
    assert combine(["reproduced", "reproduced"]) == "reproduced"
    assert combine(["reproduced", "inconclusive"]) == "inconclusive"
    assert combine(["inconclusive", "contradicted", "reproduced"]) == "contradicted"
    assert combine(["reproduced", "no effect"]) == "no effect"
    assert combine(["no effect", "inconclusive"]) == "inconclusive"
    assert combine(["no effect", "contradicted"]) == "contradicted"
    assert combine([]) == "inconclusive"
