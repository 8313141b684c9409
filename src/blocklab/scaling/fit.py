"""Loss against model size: two fitted laws, a test of whether they describe the points, and the
equivalences the papers quote.

The laws, for N parameters and validation loss L:

    power law    L(N) = a N^b                 (b < 0; a line in log L against log N)
    saturating   L(N) = E + A N^(-alpha)      (E the loss no size goes below)

The power law is fitted by least squares in log-log space. The saturating law is fitted by least
squares in L: for a fixed alpha, L = E + A N^-alpha is a line in N^-alpha, so alpha is found by a
one-dimensional search and E, A follow from the line.

Lack of fit. With k rungs whose losses are means over n seeds, a law with p fitted constants that
describes the points leaves residuals r_i of the size of a rung mean's noise, so

    F = [ sum_i r_i^2 / (k - p) ] / [ s^2 / n ]   ~   F(k - p, df)

where s^2 is the seed variance pooled over the rungs and architectures fitted (df its degrees of
freedom). A law whose F lies beyond the 99th percentile does not describe the points and is refused.

Parameter equivalence (Value Residual Learning, Fig. 6 left): at N, the baseline needs N' parameters
to reach the loss X's law gives at N, N' = L_base^-1(L_X(N)), and X "reaches the baseline's loss with
p = 1 - N / N' fewer parameters" (negative p: more). Both laws fitted to Table 5 of that paper give
p = 9.8%, 10.4% and 11.3% at 82M, 180M and 468M (tests/scaling/test_scaling.py): the paper's 10.4%.
Intervals are taken over seeds of log(N' / N), which is close to linear in the loss difference (for a
power law, log(N'/N) = log(L_X / L_base) / b), and read back as p = 1 - exp(-log(N'/N)).

Data equivalence (Fig. 6 right): on the largest model's validation curves, X reaches the baseline's
final loss after T_X tokens of the baseline's T; q = 1 - T_X / T ("q fewer tokens"). The curve is read
between its evaluations linearly in log tokens. When X never reaches it, the baseline's tokens to reach
X's final loss, T_b, stand in by symmetry: q = 1 - T / T_b (negative: X needs more data).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from blocklab.statistics.evidence import betainc

# A law is refused when its lack-of-fit F is beyond this quantile of F(k - p, df).
REFUSE_P = 0.01


@dataclass(frozen=True)
class PowerLaw:
    a: float
    b: float
    constants = 2
    name = "power law"

    def __call__(self, n: float) -> float:
        return self.a * n**self.b

    def inverse(self, loss: float) -> float:
        """The N at which the law reaches `loss`."""
        return (loss / self.a) ** (1.0 / self.b)

    def formula(self) -> str:
        return f"L = {self.a:.4g} N^{self.b:.4f}"


@dataclass(frozen=True)
class Saturating:
    e: float
    a: float
    alpha: float
    constants = 3
    name = "saturating law"

    def __call__(self, n: float) -> float:
        return self.e + self.a * n ** (-self.alpha)

    def inverse(self, loss: float) -> float:
        """The N at which the law reaches `loss`; infinite at or below E (no size reaches it)."""
        if loss <= self.e:
            return math.inf
        return (self.a / (loss - self.e)) ** (1.0 / self.alpha)

    def formula(self) -> str:
        return f"L = {self.e:.4f} + {self.a:.4g} N^-{self.alpha:.4f}"


Law = PowerLaw | Saturating


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares slope and intercept of ys against xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("a law needs at least two different sizes")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope, my - slope * mx


def _check(sizes: Sequence[float], losses: Sequence[float], least: int) -> None:
    if len(sizes) != len(losses) or len(sizes) < least:
        raise ValueError(
            f"a fit needs at least {least} (size, loss) pairs; got {len(sizes)} sizes and "
            f"{len(losses)} losses"
        )
    if any(not (n > 0 and math.isfinite(n)) for n in sizes) or any(
        not (v > 0 and math.isfinite(v)) for v in losses
    ):
        raise ValueError(f"sizes and losses must be positive and finite; got {list(sizes)}, {list(losses)}")


def fit_power_law(sizes: Sequence[float], losses: Sequence[float]) -> PowerLaw:
    _check(sizes, losses, 2)
    b, log_a = _line([math.log(n) for n in sizes], [math.log(v) for v in losses])
    return PowerLaw(math.exp(log_a), b)


def _saturating_at(alpha: float, sizes: Sequence[float], losses: Sequence[float]) -> tuple[float, Saturating]:
    """For a fixed alpha, L = E + A x with x = N^-alpha is a line: E and A by least squares."""
    a, e = _line([n**-alpha for n in sizes], losses)
    law = Saturating(e, a, alpha)
    return sum((law(n) - v) ** 2 for n, v in zip(sizes, losses, strict=True)), law


def fit_saturating(sizes: Sequence[float], losses: Sequence[float]) -> Saturating:
    """E + A N^-alpha by least squares in L: for each alpha, E and A are a linear least-squares line in
    N^-alpha; alpha is searched in (0, 3] on a log grid, then refined by golden section."""
    _check(sizes, losses, 3)
    grid = [10 ** (-3 + 3.5 * i / 400) for i in range(401)]  # 0.001 to ~3.2
    sse = [_saturating_at(alpha, sizes, losses)[0] for alpha in grid]
    best = min(range(len(grid)), key=sse.__getitem__)
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(100):
        m1, m2 = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if _saturating_at(m1, sizes, losses)[0] <= _saturating_at(m2, sizes, losses)[0]:
            hi = m2
        else:
            lo = m1
    return _saturating_at((lo + hi) / 2, sizes, losses)[1]


def fit(form: str, sizes: Sequence[float], losses: Sequence[float]) -> Law:
    if form == PowerLaw.name:
        return fit_power_law(sizes, losses)
    if form == Saturating.name:
        return fit_saturating(sizes, losses)
    raise ValueError(f"law {form!r} is not allowed: choose {PowerLaw.name!r} or {Saturating.name!r}")


def f_cdf(x: float, d1: float, d2: float) -> float:
    """Fisher's F distribution function: I_{d1 x / (d1 x + d2)}(d1 / 2, d2 / 2)."""
    if x <= 0:
        return 0.0
    return betainc(d1 / 2, d2 / 2, d1 * x / (d1 * x + d2))


@dataclass(frozen=True)
class FitCheck:
    """How well a law describes a ladder's mean losses: the residuals (fit minus mean, per rung), the
    lack-of-fit F against the seed noise and its p-value (None without a noise estimate)."""

    law: Law
    residuals: tuple[float, ...]
    f: float | None
    p: float | None

    @property
    def rms(self) -> float:
        return math.sqrt(sum(r * r for r in self.residuals) / len(self.residuals))

    @property
    def describes(self) -> bool:
        """False when the points are left with more than the seed noise (p < REFUSE_P), or when the law
        has no degree of freedom left to test (as many constants as rungs) or no noise estimate."""
        return self.p is not None and self.p >= REFUSE_P


def check_fit(
    law: Law, sizes: Sequence[float], means: Sequence[float], seed_variance: float | None, seeds: int, df: int
) -> FitCheck:
    """The law's residuals at the rungs' `means` (over `seeds` seeds each) and its lack-of-fit test
    against `seed_variance` (pooled, with `df` degrees of freedom)."""
    residuals = tuple(law(n) - v for n, v in zip(sizes, means, strict=True))
    free = len(sizes) - law.constants
    if free < 1 or not seed_variance or df < 1:
        return FitCheck(law, residuals, None, None)
    f = (sum(r * r for r in residuals) / free) / (seed_variance / seeds)
    return FitCheck(law, residuals, f, 1.0 - f_cdf(f, free, df))


def parameter_ratio(base: Law, arch: Law, n: float) -> float:
    """N' / N, N' = base^-1(arch(N)): how many times X's parameters the baseline needs for X's loss at
    N (infinite when X's loss is below anything the baseline's law reaches)."""
    return base.inverse(arch(n)) / n


def parameter_equivalence(base: Law, arch: Law, n: float) -> float:
    """p = 1 - N / N': the fraction of parameters X saves at N (negative: needs more)."""
    return saving(parameter_ratio(base, arch, n))


def saving(ratio: float) -> float:
    """The fraction saved, 1 - 1 / ratio, of a ratio (baseline's amount over X's)."""
    return 1.0 - 1.0 / ratio


def tokens_to_reach(tokens: Sequence[float], losses: Sequence[float], target: float) -> float | None:
    """The tokens at which a validation curve first reaches `target`, read linearly in log tokens
    between evaluations (evaluations at 0 tokens are skipped); None if it never does."""
    points = [(t, v) for t, v in zip(tokens, losses, strict=True) if t > 0]
    for i, (t, v) in enumerate(points):
        if v <= target:
            if i == 0:
                return t
            t0, v0 = points[i - 1]
            frac = (v0 - target) / (v0 - v)
            return math.exp(math.log(t0) + frac * (math.log(t) - math.log(t0)))
    return None


def data_ratio(
    base_tokens: Sequence[float],
    base_losses: Sequence[float],
    tokens: Sequence[float],
    losses: Sequence[float],
) -> float:
    """T / T_X: the baseline's tokens over the tokens X needs to reach the baseline's final loss (below
    1: X needs more, read by symmetry as T_b / T). Both curves end at the same tokens T."""
    total = base_tokens[-1]
    reached = tokens_to_reach(tokens, losses, base_losses[-1])
    if reached is not None:
        return total / reached
    base_reached = tokens_to_reach(base_tokens, base_losses, losses[-1])
    if base_reached is None:  # cannot happen: the baseline reaches a loss above its own final one
        raise ValueError("the baseline's curve never reaches X's final loss")
    return base_reached / total


def data_equivalence(
    base_tokens: Sequence[float],
    base_losses: Sequence[float],
    tokens: Sequence[float],
    losses: Sequence[float],
) -> float:
    """q = 1 - T_X / T: the fraction of the baseline's tokens X saves (negative: needs more)."""
    return saving(data_ratio(base_tokens, base_losses, tokens, losses))
