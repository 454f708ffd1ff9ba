"""Statistics a reviewer accepts: bootstrap CIs per arm, paired differences against a baseline, tables.

Pure numpy (scipy is not a dependency; the exact distributions needed are the sign test's binomial, a sum
of integer binomial coefficients, and Student's t, through the regularized incomplete beta function).

Per-seed values
    Every function takes one arm's per-seed values as either

    - a 1-D array-like aligned by seed: position ``i`` is the ``i``-th seed, and every arm passed together
      must use the same seed list in the same order; or
    - a mapping ``seed id -> value``: paired functions match two arms *by seed id*, never by position, so
      dictionaries filled in different orders pair correctly. Seed ids present in one arm only raise.

    Passing an array for one arm and a mapping for the other raises ``TypeError`` (a silent position
    match of a mapping would defeat the point of seed ids).

Missing values (``nan_policy``)
    ``"omit"`` (the default) drops NaN values (a failed or unfinished run) and counts them: results carry
    ``n`` (values used) and ``n_dropped``; a pair is dropped when either side is NaN. ``"raise"`` raises
    ``ValueError`` on any NaN instead. Infinite values are never "missing": ``+inf`` means "never reached"
    in a censored measure (next paragraph) and raises without a ``horizon``; ``-inf`` always raises.

Censored measures (steps or samples to a threshold)
    A seed that never reaches the threshold within the run is given as ``+inf`` and the call names the
    run length as ``horizon`` (in the measure's unit). The choice made here, stated once for every
    function: a never-reached seed counts as ``horizon`` (right-censored at the run length), and

    - ``n_censored`` reports how many seeds never reached it (reached fraction ``1 - n_censored / n``);
    - the mean and its CI are the *restricted* mean (steps capped at the horizon): a lower bound on the
      true mean whenever any seed is censored, comparable between arms run for the same horizon;
    - the paired sign test is exact under censoring: in a pair where one seed reached and the other did
      not, the reached one is faster whatever the censored one would have needed (the sign is known),
      and a pair where neither reached is a tie and is dropped. Prefer the sign test's p-value for
      censored measures; the bootstrap p-value tests the difference of restricted means.

    Arms compared on a censored measure must share the horizon (compute-matched arms do).

Bootstrap
    Percentile bootstrap: ``n_boot`` resamples of the ``n`` values with replacement, the statistic of each,
    the ``(1 - level)/2`` and ``(1 + level)/2`` quantiles (numpy's linear interpolation). Resampling uses
    ``numpy.random.default_rng(seed)``, so results are reproducible, and arms with the same ``n`` are
    resampled with the same indices. A constant sample gives the CI ``[c, c]``.

Paired differences
    ``d_s = arm_s - baseline_s`` per seed ``s`` (common random numbers: the same seed id in both arms). Two
    p-values for the null "no difference":

    - ``sign_p``: the exact two-sided sign test: ties (``d_s == 0``) dropped, ``k`` = the larger of the
      positive and negative counts among the ``m`` others, ``p = min(1, 2 * P(Bin(m, 1/2) >= k))``;
      ``p = 1`` when every pair ties. Valid for any ``m`` and under censoring; conservative.
    - ``boot_p``: the paired bootstrap: resample the ``d_s`` (pairs stay together), take the mean of each
      resample, re-centre that distribution at 0 (subtract the observed mean ``d̄``) as the null, and
      ``p = (1 + #{b : |mean_b - d̄| >= |d̄|}) / (n_boot + 1)`` (two-sided; the +1 keeps ``p > 0``).
      Identical arms give ``d̄ = 0`` and ``p = 1`` exactly. It is NaN when fewer than 2 pairs remain. It is
      anti-conservative for small ``n`` (with every ``d_s`` of one sign it can reach ``1/(n_boot+1)``
      where the sign test cannot go below ``2^(1-n)``): with fewer than about 10 seeds, read ``sign_p``.

    ``tol`` (default 0): a difference with ``|d_s| <= tol`` is set to exactly 0 (``apply_tolerance``)
    before anything is computed, so float noise between arms that should be identical is a tie, not a
    string of tiny signed differences that the sign test would call significant.

Small samples and multiplicity
    With 3 to 20 seeds the percentile bootstrap CI is too narrow (at ``n = 5`` its 95 % CI of a zero mean
    difference excludes 0 in well over 5 % of samples) and the exact sign tests are too coarse to reject
    at all (``2 / 2^n`` is their smallest p, 0.0625 at ``n = 5``). For those the functions below are used:

    - ``t_cdf(x, df)`` and ``t_quantile(q, df)``: Student's t, ``P(T <= x) = 1 - I_{df/(df+x²)}(df/2,
      1/2) / 2`` for ``x >= 0`` (``I``: the regularized incomplete beta function, Numerical Recipes'
      Lentz continued fraction ``betacf`` with ``math.lgamma``); the quantile inverts it by bisection to
      ``1e-12``.
    - ``paired_t(d, level)``: ``(mean, low, high, p)``, the one-sample t interval
      ``mean ± t_{(1+level)/2, n-1} · sd / √n`` (``sd`` with ``ddof = 1``) and the two-sided
      ``p = 2 · (1 - t_cdf(|t|, n - 1))``, ``t = mean / (sd / √n)``. Exact for normal differences at any
      ``n``; close to its level for heavier tails (Laplace) from ``n = 5`` (see the tests).
    - ``signflip_p(d)``: the sign-flip permutation test of the mean, ``p = #{ε ∈ {±1}^n : |Σ ε_i d_i| >=
      |Σ d_i|} / 2^n``, exact for ``n <= 20`` (Monte Carlo, ``(1 + count) / (1 + n_mc)``, above): valid
      without normality, as coarse as the sign test at small ``n``.
    - ``apply_tolerance(d, tol)``: ``|d_i| <= tol`` set to exactly 0 (ties).
    - ``decide(d, direction, alpha=, tol=)``: the decision rule for a predicted direction: the t test's p
      decides, ``perm_p`` is reported beside it (see its docstring).
    - ``holm(p)`` (family-wise error) and ``benjamini_hochberg(p)`` (false discovery rate): adjusted
      p-values of a family of tests, ``max_{j <= i} min(1, (m - j + 1) p_(j))`` and
      ``min_{j >= i} min(1, m p_(j) / j)`` over the ``m`` sorted non-NaN p (NaN passes through and is not
      counted in ``m``).

Tables
    ``summarize_arms`` turns ``{arm: {measure: per-seed values}}`` into ``SummaryRow`` s (grouped by
    measure, arms in the order given) and ``markdown_table`` renders them, ``n/a`` where a value is missing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any

import numpy as np

__all__ = [
    "BootstrapCI",
    "PairedDifference",
    "SummaryRow",
    "apply_tolerance",
    "benjamini_hochberg",
    "bootstrap_ci",
    "decide",
    "fmt_p",
    "fmt_value",
    "holm",
    "markdown_table",
    "paired_difference",
    "paired_t",
    "sign_test",
    "signflip_p",
    "summarize_arms",
    "t_cdf",
    "t_quantile",
]

NAN_POLICIES = ("omit", "raise")
# Elements of one resample block (rows x n); bounds the bootstrap's memory at ~16 MB of indices and values.
_BLOCK = 1_000_000


@dataclass(frozen=True)
class BootstrapCI:
    """One arm's statistic with its percentile bootstrap CI.

    ``estimate`` is the statistic of the ``n`` values used; ``low``/``high`` the CI at ``level``; all three
    NaN when no value remains. ``n_dropped``: NaN values dropped; ``n_censored``: values that never reached
    the threshold (``+inf``, counted as ``horizon``), 0 for uncensored measures.
    """

    estimate: float
    low: float
    high: float
    n: int
    n_dropped: int = 0
    n_censored: int = 0
    level: float = 0.95


@dataclass(frozen=True)
class PairedDifference:
    """Per-seed paired differences ``arm - baseline`` and their tests.

    ``seeds`` are the matched seed ids (sorted when sortable; positions ``0..n-1`` for aligned arrays) and
    ``differences`` the ``d_s`` in that order. ``mean``/``low``/``high``: the mean difference and its
    percentile bootstrap CI. ``n_pos``/``n_neg``/``n_ties``: the sign counts; ``sign_p``: exact two-sided
    sign test; ``boot_p``: paired bootstrap (see the module docstring). ``n_dropped``: pairs dropped for a
    NaN on either side.
    """

    mean: float
    low: float
    high: float
    n: int
    n_pos: int
    n_neg: int
    n_ties: int
    sign_p: float
    boot_p: float
    n_dropped: int = 0
    level: float = 0.95
    seeds: tuple = ()
    differences: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False, compare=False)


@dataclass(frozen=True)
class SummaryRow:
    """One (arm, measure) line of a report table; ``None`` where a value does not exist.

    ``n_reached`` is set for censored measures only (seeds that reached the threshold, out of ``n``). The
    ``diff_*``, ``n_pairs`` and p-value fields compare with ``baseline`` and are ``None`` on the baseline's
    own rows, without a baseline, or when either side has no values for the measure.
    """

    arm: str
    measure: str
    n: int
    mean: float | None
    ci_low: float | None
    ci_high: float | None
    n_dropped: int = 0
    n_reached: int | None = None
    baseline: str | None = None
    diff: float | None = None
    diff_low: float | None = None
    diff_high: float | None = None
    n_pairs: int | None = None
    sign_p: float | None = None
    boot_p: float | None = None
    level: float = 0.95


# --------------------------------------------------------------------------------------------------
# input handling


def _check_args(level: float, n_boot: int, nan_policy: str) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"`level` must be in (0, 1), got {level}")
    if int(n_boot) != n_boot or n_boot < 1:
        raise ValueError(f"`n_boot` must be a positive integer, got {n_boot}")
    if nan_policy not in NAN_POLICIES:
        raise ValueError(f"`nan_policy` must be one of {NAN_POLICIES}, got {nan_policy!r}")


def _sorted_keys(keys: Sequence[Hashable]) -> list[Hashable]:
    """Seed ids sorted when they are comparable, otherwise in the order given."""
    try:
        return sorted(keys)  # type: ignore[type-var]
    except TypeError:
        return list(keys)


def _as_array(name: str, values: Any) -> tuple[list[Hashable], np.ndarray]:
    """(seed ids, float values) of a mapping seed -> value or of a 1-D array aligned by seed."""
    if isinstance(values, Mapping):
        seeds = _sorted_keys(list(values.keys()))
        x = np.array([values[s] for s in seeds], dtype=float)
    else:
        x = np.asarray(values, dtype=float)
        if x.ndim != 1:
            raise ValueError(f"`{name}` must be 1-D (one value per seed), got shape {x.shape}")
        seeds = list(range(x.size))
    return seeds, x


def _censor(name: str, x: np.ndarray, horizon: float | None) -> tuple[np.ndarray, int]:
    """Replace ``+inf`` (never reached) by ``horizon``; return the values and the censored count."""
    if np.any(np.isneginf(x)):
        raise ValueError(f"`{name}` contains -inf; per-seed values must be finite, NaN or +inf (censored)")
    posinf = np.isposinf(x)
    if horizon is None:
        if posinf.any():
            raise ValueError(
                f"`{name}` contains {int(posinf.sum())} +inf value(s) (never reached?); a censored measure "
                "needs `horizon=` (the run length), see experiments.stats"
            )
        return x, 0
    horizon = float(horizon)
    if not math.isfinite(horizon):
        raise ValueError(f"`horizon` must be finite, got {horizon}")
    finite = np.isfinite(x)
    if np.any(x[finite] > horizon):
        raise ValueError(f"`{name}` has values above the horizon {horizon} (max {x[finite].max()})")
    return np.where(posinf, horizon, x), int(posinf.sum())


def _drop_nan(name: str, x: np.ndarray, nan_policy: str) -> np.ndarray:
    """Boolean mask of the non-NaN entries (raises under ``nan_policy='raise'`` if any is NaN)."""
    keep = ~np.isnan(x)
    if nan_policy == "raise" and not keep.all():
        raise ValueError(f"`{name}` contains {int((~keep).sum())} NaN value(s) (nan_policy='raise')")
    return keep


# --------------------------------------------------------------------------------------------------
# the bootstrap and the sign test


def _bootstrap(
    x: np.ndarray, statistic: Callable[..., Any], n_boot: int, rng: np.random.Generator
) -> np.ndarray:
    """The statistic of ``n_boot`` resamples of ``x`` with replacement, in blocks of bounded memory."""
    n = x.size
    out = np.empty(n_boot)
    rows = max(1, _BLOCK // n)
    for start in range(0, n_boot, rows):
        m = min(rows, n_boot - start)
        idx = rng.integers(0, n, size=(m, n))
        stat = np.asarray(statistic(x[idx], axis=1), dtype=float)
        if stat.shape != (m,):
            raise ValueError(
                "`statistic` must reduce along `axis` (called as statistic(samples, axis=1)); "
                f"got shape {stat.shape} for samples of shape {(m, n)}"
            )
        out[start : start + m] = stat
    return out


def _percentile_ci(boot: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.quantile(boot, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(lo), float(hi)


def sign_test(n_pos: int, n_neg: int) -> float:
    """Exact two-sided sign test of ``n_pos`` positive and ``n_neg`` negative differences (ties dropped).

    ``p = min(1, 2 * P(X >= max(n_pos, n_neg)))`` for ``X ~ Binomial(n_pos + n_neg, 1/2)``, summed in
    integers (exact for any ``n``); 1 when ``n_pos + n_neg == 0``. E.g. 8 of 10 positive:
    ``2 * (C(10,8) + C(10,9) + C(10,10)) / 2^10 = 0.109375``.
    """
    if n_pos < 0 or n_neg < 0:
        raise ValueError(f"counts must be non-negative, got {n_pos}, {n_neg}")
    m = int(n_pos) + int(n_neg)
    if m == 0:
        return 1.0
    k = max(int(n_pos), int(n_neg))
    tail = sum(math.comb(m, i) for i in range(k, m + 1))
    return min(1.0, (2 * tail) / (2**m))


# --------------------------------------------------------------------------------------------------
# small samples and multiplicity

# Lentz's continued fraction stops when a step changes the value by less than this (relative)
_CF_EPS = 1e-15
_CF_TINY = 1e-300
_CF_MAXIT = 100_000


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (Numerical Recipes ``betacf``, modified
    Lentz); converges fast for ``x < (a + 1) / (a + b + 2)``."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _CF_TINY else _CF_TINY)
    h = d
    for m in range(1, _CF_MAXIT + 1):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _CF_TINY else _CF_TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _CF_TINY else _CF_TINY
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _CF_TINY else _CF_TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _CF_TINY else _CF_TINY
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _CF_EPS:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b}, x={x})")


def _betai(a: float, b: float, x: float, y: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)``, with ``y = 1 - x`` passed in exactly."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, y) / b


def _check_df(df: float) -> float:
    df = float(df)
    if not df > 0.0:  # also rejects NaN
        raise ValueError(f"`df` must be positive, got {df}")
    return df


def _t_two_sided(t: float, df: float) -> float:
    """``P(|T| >= |t|)`` for ``T ~ t(df)``: ``I_{df/(df+t²)}(df/2, 1/2)`` (no ``1 - cdf`` cancellation)."""
    t = abs(float(t))
    if math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0
    if math.isinf(df):
        return math.erfc(t / math.sqrt(2.0))
    t2 = t * t
    return _betai(df / 2.0, 0.5, df / (df + t2), t2 / (df + t2))


def t_cdf(x: float, df: int | float) -> float:
    """The Student-t CDF ``P(T <= x)``, ``T ~ t(df)`` (any ``df > 0``; ``df = inf`` is the normal).

    ``P(T <= x) = 1 - I_{df/(df+x²)}(df/2, 1/2) / 2`` for ``x >= 0`` and ``I_{df/(df+x²)}(df/2, 1/2) / 2``
    for ``x < 0``, where ``I`` is the regularized incomplete beta function (Numerical Recipes ``betai``:
    the Lentz continued fraction ``betacf`` with ``math.lgamma``), accurate to ~1e-14.
    """
    df = _check_df(df)
    x = float(x)
    if math.isnan(x):
        return math.nan
    half_tail = 0.5 * _t_two_sided(x, df)
    return 1.0 - half_tail if x >= 0 else half_tail


def t_quantile(q: float, df: int | float) -> float:
    """The Student-t quantile: the ``t`` with ``t_cdf(t, df) = q``, ``0 < q < 1``.

    ``t(0.5) = 0`` and ``t(1 - q) = -t(q)`` exactly; for ``q > 1/2`` the upper tail
    ``I_{df/(df+t²)}(df/2, 1/2) / 2 = 1 - q`` is solved by bisection on ``t`` (bracket doubled from 1) to a
    width of ``1e-12 * max(1, t)``. E.g. ``t_quantile(0.975, 9) = 2.262157163``.
    """
    df = _check_df(df)
    q = float(q)
    if not 0.0 < q < 1.0:
        raise ValueError(f"`q` must be in (0, 1), got {q}")
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    target = 2.0 * (1.0 - q)  # two-sided tail P(|T| >= t), decreasing in t
    lo, hi = 0.0, 1.0
    while _t_two_sided(hi, df) > target:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if _t_two_sided(mid, df) > target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _differences(d: Any) -> np.ndarray:
    """Paired differences as a finite 1-D float array (NaN or inf raise: drop them first)."""
    x = np.asarray(d, dtype=float)
    if x.ndim != 1:
        raise ValueError(f"differences must be 1-D (one per pair), got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(
            "differences must be finite (drop NaN pairs, cap censored ones, e.g. paired_difference)"
        )
    return x


def _check_tol(tol: float) -> float:
    tol = float(tol)
    if not (tol >= 0.0 and math.isfinite(tol)):
        raise ValueError(f"`tol` must be finite and non-negative, got {tol}")
    return tol


def apply_tolerance(d: Any, tol: float) -> np.ndarray:
    """A copy of the differences ``d`` (float array) with every ``|d_i| <= tol`` set to exactly ``0``.

    ``tol = 0`` leaves values as they are (and turns ``-0.0`` into ``0.0``); NaN stays NaN.
    """
    tol = _check_tol(tol)
    x = np.array(d, dtype=float)
    x[np.abs(x) <= tol] = 0.0
    return x


def paired_t(d: Any, level: float = 0.95) -> tuple[float, float, float, float]:
    """One-sample t interval and two-sided t-test p of paired differences: ``(mean, low, high, p)``.

    ``mean ± t_{(1+level)/2, n-1} · sd / √n`` with ``sd`` the sample standard deviation (``ddof = 1``) and
    ``p = 2 · (1 - t_cdf(|t|, n - 1))``, ``t = mean / (sd / √n)`` (computed as the incomplete beta
    ``I_{(n-1)/(n-1+t²)}((n-1)/2, 1/2)``, so tiny p keep their digits). ``d`` must be finite. ``n < 2``:
    ``low``, ``high`` and ``p`` are NaN (``mean`` is ``d[0]`` for ``n = 1``, NaN for ``n = 0``). All
    ``d_i`` equal (``sd = 0``): the interval is ``[mean, mean]`` and ``p = 1`` if ``mean == 0`` else ``0``.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"`level` must be in (0, 1), got {level}")
    x = _differences(d)
    n = int(x.size)
    if n == 0:
        return math.nan, math.nan, math.nan, math.nan
    mean = float(np.mean(x))
    if n < 2:
        return mean, math.nan, math.nan, math.nan
    if np.all(x == x[0]):
        mean = float(x[0])
        return mean, mean, mean, 1.0 if mean == 0 else 0.0
    se = float(np.std(x, ddof=1)) / math.sqrt(n)
    half = t_quantile((1.0 + level) / 2.0, n - 1) * se
    p = _t_two_sided(mean / se, n - 1)
    return mean, mean - half, mean + half, min(1.0, p)


def signflip_p(d: Any, *, exact_max: int = 20, n_mc: int = 100_000, seed: int = 0) -> float:
    """Two-sided sign-flip permutation test of the mean paired difference (distribution-free).

    Under the null each difference is symmetric about 0, so its sign is a fair coin:
    ``p = #{ε ∈ {±1}^n : |Σ ε_i d_i| >= |Σ d_i| - 1e-12 · Σ|d_i|} / 2^n``, all ``2^n`` flips enumerated
    exactly for ``n <= exact_max`` (as sums of two halves, in bounded blocks), else Monte Carlo over
    ``n_mc`` random flips from ``numpy.random.default_rng(seed)`` with ``p = (1 + count) / (1 + n_mc)``.
    Zeros (ties) stay in and flip to themselves. ``d`` must be finite; ``n = 0`` gives 1. The smallest
    exact ``p`` is ``2 / 2^n`` (0.0625 at ``n = 5``).
    """
    x = _differences(d)
    n = int(x.size)
    if int(exact_max) != exact_max or exact_max < 0:
        raise ValueError(f"`exact_max` must be a non-negative integer, got {exact_max}")
    if int(n_mc) != n_mc or n_mc < 1:
        raise ValueError(f"`n_mc` must be a positive integer, got {n_mc}")
    if n == 0:
        return 1.0
    threshold = abs(float(np.sum(x))) - 1e-12 * float(np.sum(np.abs(x)))
    if n <= exact_max:
        # every flip's sum is (a sum over the first half) + (a sum over the second half)
        h = n // 2
        first = _all_flip_sums(x[:h])
        second = _all_flip_sums(x[h:])
        rows = max(1, _BLOCK // second.size)
        count = 0
        for start in range(0, first.size, rows):
            s = first[start : start + rows, None] + second[None, :]
            count += int((np.abs(s) >= threshold).sum())
        return count / 2.0**n
    rng = np.random.default_rng(seed)
    count = 0
    rows = max(1, _BLOCK // n)
    for start in range(0, int(n_mc), rows):
        m = min(rows, int(n_mc) - start)
        signs = rng.integers(0, 2, size=(m, n)) * 2 - 1
        count += int((np.abs(signs @ x) >= threshold).sum())
    return (1 + count) / (1 + int(n_mc))


def _all_flip_sums(x: np.ndarray) -> np.ndarray:
    """``Σ ε_i x_i`` for all ``2^len(x)`` sign vectors ``ε`` (``[0.]`` for an empty ``x``)."""
    sums = np.zeros(1)
    for v in x:
        sums = np.concatenate([sums + v, sums - v])
    return sums


def _pvalues(pvalues: Sequence[float]) -> np.ndarray:
    p = np.array(pvalues, dtype=float).reshape(-1)
    ok = ~np.isnan(p)
    if np.any((p[ok] < 0) | (p[ok] > 1)):
        raise ValueError(f"p-values must be in [0, 1] (or NaN), got {p[ok][(p[ok] < 0) | (p[ok] > 1)][:5]}")
    return p


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error), in the order given.

    With the ``m`` non-NaN p sorted ``p_(1) <= ... <= p_(m)``:
    ``p̃_(i) = max_{j <= i} min(1, (m - j + 1) · p_(j))``. NaN entries stay NaN and do not count in ``m``.
    E.g. ``[0.01, 0.04, 0.03, 0.005] -> [0.03, 0.06, 0.06, 0.02]``.
    """
    p = _pvalues(pvalues)
    out = p.copy()
    ok = np.flatnonzero(~np.isnan(p))
    m = ok.size
    if m:
        order = ok[np.argsort(p[ok], kind="stable")]
        adj = np.minimum(1.0, (m - np.arange(m)) * p[order])
        out[order] = np.maximum.accumulate(adj)
    return out


def benjamini_hochberg(pvalues: Sequence[float]) -> np.ndarray:
    """Benjamini-Hochberg step-up adjusted p-values (false discovery rate), in the order given.

    With the ``m`` non-NaN p sorted ``p_(1) <= ... <= p_(m)``:
    ``p̃_(i) = min_{j >= i} min(1, m · p_(j) / j)``. NaN entries stay NaN and do not count in ``m``.
    E.g. ``[0.01, 0.04, 0.03, 0.005] -> [0.02, 0.04, 0.04, 0.02]``.
    """
    p = _pvalues(pvalues)
    out = p.copy()
    ok = np.flatnonzero(~np.isnan(p))
    m = ok.size
    if m:
        order = ok[np.argsort(p[ok], kind="stable")]
        adj = np.minimum(1.0, m * p[order] / np.arange(1, m + 1))
        out[order] = np.minimum.accumulate(adj[::-1])[::-1]
    return out


DIRECTIONS = ("lower", "higher")


def decide(
    d: Any, direction: str, *, alpha: float = 0.05, tol: float = 0.0, perm_max: int | None = None
) -> dict[str, Any]:
    """The decision rule for a predicted paired difference ``d`` (``arm - baseline`` per seed).

    ``direction``: the prediction, ``"lower"`` (``mean < 0``) or ``"higher"`` (``mean > 0``). Differences
    with ``|d_i| <= tol`` become exact ties (``apply_tolerance``); then ``(mean, low, high, p) =
    paired_t(d, level=1 - alpha)``, so the interval excludes 0 exactly when ``p < alpha``. ``side`` is
    ``"tie"`` when ``|mean| <= tol`` (or no pair), else ``"predicted"`` when the mean has the predicted sign
    and ``"opposite"`` otherwise. The prediction holds when ``side == "predicted"`` and ``p < alpha``; it
    is contradicted when ``side == "opposite"`` and ``p < alpha``; otherwise it is not resolved.

    Why the t test decides: it is exact for normal differences at any ``n`` (and close to its level for
    heavier-tailed ones, see the tests), while the exact sign-flip test cannot go below ``2 / 2^n``: at
    ``n = 5`` its smallest p is 0.0625, so it could never reject at 0.05. The sign-flip p is returned as
    ``perm_p``, a distribution-free check (``signflip_p``; None above ``perm_max`` pairs, where its Monte
    Carlo costs seconds and the t test's normal approximation holds). Returns
    ``{"n", "mean", "low", "high", "p", "perm_p", "side"}``.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"`direction` must be one of {DIRECTIONS}, got {direction!r}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"`alpha` must be in (0, 1), got {alpha}")
    x = apply_tolerance(_differences(d), tol)
    mean, low, high, p = paired_t(x, level=1.0 - alpha)
    if x.size == 0 or abs(mean) <= tol:
        side = "tie"
    elif (mean < 0) == (direction == "lower"):
        side = "predicted"
    else:
        side = "opposite"
    return {
        "n": int(x.size),
        "mean": mean,
        "low": low,
        "high": high,
        "p": p,
        "perm_p": signflip_p(x) if perm_max is None or x.size <= perm_max else None,
        "side": side,
    }


# --------------------------------------------------------------------------------------------------
# public API


def bootstrap_ci(
    values: Any,
    *,
    level: float = 0.95,
    n_boot: int = 10_000,
    seed: int = 0,
    statistic: Callable[..., Any] = np.mean,
    horizon: float | None = None,
    nan_policy: str = "omit",
) -> BootstrapCI:
    """The statistic (default: the mean) of one arm's per-seed values and its percentile bootstrap CI.

    ``values``: a 1-D array-like (one value per seed) or a mapping seed -> value. NaN values are dropped
    and counted (``nan_policy='omit'``) or raise (``'raise'``). ``+inf`` marks a seed that never reached a
    threshold and needs ``horizon`` (it is counted as ``horizon``; ``n_censored`` says how many). The
    ``statistic`` must accept ``axis`` (``np.mean``, ``np.median``). With no value left every number is NaN
    and ``n == 0``; with one value the CI is that value.
    """
    _check_args(level, n_boot, nan_policy)
    _, x = _as_array("values", values)
    keep = _drop_nan("values", x, nan_policy)
    x, n_censored = _censor("values", x[keep], horizon)
    n_dropped = int((~keep).sum())
    if x.size == 0:
        return BootstrapCI(math.nan, math.nan, math.nan, 0, n_dropped, 0, level)
    estimate = np.asarray(statistic(x), dtype=float)
    if estimate.ndim != 0:
        raise ValueError(
            f"`statistic` must reduce a sample to one number (and along `axis`); got shape {estimate.shape}"
        )
    estimate = float(estimate)
    boot = _bootstrap(x, statistic, int(n_boot), np.random.default_rng(seed))
    low, high = _percentile_ci(boot, level)
    return BootstrapCI(estimate, low, high, int(x.size), n_dropped, n_censored, level)


def paired_difference(
    arm: Any,
    baseline: Any,
    *,
    level: float = 0.95,
    n_boot: int = 10_000,
    seed: int = 0,
    horizon: float | None = None,
    nan_policy: str = "omit",
    tol: float = 0.0,
) -> PairedDifference:
    """Per-seed paired differences ``arm - baseline``: mean, bootstrap CI, sign-test and bootstrap p.

    ``arm`` and ``baseline`` are both mappings seed -> value (matched by seed id; the seed sets must be
    equal) or both 1-D arrays of equal length aligned by seed. A pair with a NaN on either side is dropped
    and counted (``nan_policy='omit'``) or raises (``'raise'``). For a censored measure (``+inf`` = never
    reached) pass the shared run length as ``horizon``: never-reached seeds count as ``horizon`` on both
    sides, so a both-censored pair is a tie. ``tol``: a difference with ``|d_s| <= tol`` is an exact tie
    (``d_s = 0``) for the sign test, the mean, the CI and the p-values; a pair where exactly one side never
    reached keeps its known sign. The tests are described in the module docstring.
    """
    _check_args(level, n_boot, nan_policy)
    tol = _check_tol(tol)
    if isinstance(arm, Mapping) != isinstance(baseline, Mapping):
        raise TypeError(
            "`arm` and `baseline` must both be mappings seed -> value (matched by seed id) or both "
            "arrays aligned by seed; got one of each"
        )
    if isinstance(arm, Mapping):
        only_arm = set(arm) - set(baseline)
        only_base = set(baseline) - set(arm)
        if only_arm or only_base:
            raise ValueError(
                "`arm` and `baseline` must have the same seed ids; "
                f"only in arm: {_sorted_keys(list(only_arm))[:10]}, "
                f"only in baseline: {_sorted_keys(list(only_base))[:10]}"
            )
        seeds = _sorted_keys(list(baseline.keys()))
        a = np.array([arm[s] for s in seeds], dtype=float)
        b = np.array([baseline[s] for s in seeds], dtype=float)
    else:
        _, a = _as_array("arm", arm)
        _, b = _as_array("baseline", baseline)
        if a.size != b.size:
            raise ValueError(f"aligned arrays must have one value per seed each; got {a.size} and {b.size}")
        seeds = list(range(a.size))
    keep = _drop_nan("arm", a, nan_policy) & _drop_nan("baseline", b, nan_policy)
    a_raw, b_raw = a[keep], b[keep]
    a, _ = _censor("arm", a_raw, horizon)
    b, _ = _censor("baseline", b_raw, horizon)
    seeds = [s for s, k in zip(seeds, keep, strict=True) if k]
    n_dropped = int((~keep).sum())
    d = apply_tolerance(a - b, tol)
    n = int(d.size)
    # signs from the uncensored values: a seed that reached (even exactly at the horizon) is faster than one
    # that never did (+inf), and two never-reached seeds tie; two reached seeds within `tol` tie
    with np.errstate(invalid="ignore"):
        tied = np.isfinite(a_raw) & np.isfinite(b_raw) & (np.abs(a_raw - b_raw) <= tol)
    n_pos, n_neg = int(((a_raw > b_raw) & ~tied).sum()), int(((a_raw < b_raw) & ~tied).sum())
    n_ties = n - n_pos - n_neg
    sign_p = sign_test(n_pos, n_neg)
    if n == 0:
        mean = low = high = boot_p = math.nan
    else:
        mean = float(np.mean(d))
        boot = _bootstrap(d, np.mean, int(n_boot), np.random.default_rng(seed))
        low, high = _percentile_ci(boot, level)
        if n < 2:
            boot_p = math.nan
        else:
            extreme = int((np.abs(boot - mean) >= abs(mean)).sum())
            boot_p = (1 + extreme) / (int(n_boot) + 1)
    return PairedDifference(
        mean=mean,
        low=low,
        high=high,
        n=n,
        n_pos=n_pos,
        n_neg=n_neg,
        n_ties=n_ties,
        sign_p=sign_p,
        boot_p=boot_p,
        n_dropped=n_dropped,
        level=level,
        seeds=tuple(seeds),
        differences=d,
    )


def _none_if_nan(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def summarize_arms(
    per_seed: Mapping[str, Mapping[str, Any]],
    baseline: str | None = None,
    *,
    level: float = 0.95,
    n_boot: int = 10_000,
    seed: int = 0,
    horizons: Mapping[str, float] | None = None,
    nan_policy: str = "omit",
    measures: Sequence[str] | None = None,
) -> list[SummaryRow]:
    """Table rows for every (measure, arm): mean and CI, and the paired difference against ``baseline``.

    ``per_seed[arm][measure]`` holds one arm's per-seed values of one measure (an array aligned by seed
    or a mapping seed -> value, as in ``paired_difference``; all arms must use the same seeds). Rows are
    grouped by measure (``measures``, default: the order in which measures first appear), arms in the
    order of ``per_seed``. ``horizons[measure]`` marks a censored measure (``+inf`` = never reached) and
    gives its run length; its rows carry ``n_reached``. An arm given as a mapping on fewer (or other) seeds
    than the baseline is paired on the seeds both have (``n_pairs`` says how many; its own mean and CI use
    all its seeds). An arm without a measure gets a row with
    ``n == 0`` and ``None`` values. The baseline's own rows have no difference. Every bootstrap uses
    ``seed``, so the table is reproducible.
    """
    _check_args(level, n_boot, nan_policy)
    if baseline is not None and baseline not in per_seed:
        raise ValueError(f"baseline {baseline!r} is not one of the arms {list(per_seed)}")
    horizons = dict(horizons or {})
    if measures is None:
        measures = list(dict.fromkeys(m for arm_values in per_seed.values() for m in arm_values))
    kw = {"level": level, "n_boot": n_boot, "seed": seed, "nan_policy": nan_policy}
    rows: list[SummaryRow] = []
    for measure in measures:
        horizon = horizons.get(measure)
        base_values = per_seed[baseline].get(measure) if baseline is not None else None
        for arm, arm_values in per_seed.items():
            values = arm_values.get(measure)
            if values is None:
                rows.append(SummaryRow(str(arm), str(measure), 0, None, None, None, level=level))
                continue
            ci = bootstrap_ci(values, horizon=horizon, **kw)
            row: dict[str, Any] = {
                "arm": str(arm),
                "measure": str(measure),
                "n": ci.n,
                "mean": _none_if_nan(ci.estimate),
                "ci_low": _none_if_nan(ci.low),
                "ci_high": _none_if_nan(ci.high),
                "n_dropped": ci.n_dropped,
                "n_reached": ci.n - ci.n_censored if horizon is not None else None,
                "baseline": baseline,
                "level": level,
            }
            if baseline is not None and arm != baseline and base_values is not None and ci.n > 0:
                a, b = values, base_values
                if isinstance(a, Mapping) and isinstance(b, Mapping) and set(a) != set(b):
                    # an arm run on fewer seeds (an ablation) pairs on the seeds both have
                    common = [s for s in b if s in a]
                    a, b = {s: a[s] for s in common}, {s: b[s] for s in common}
                pd = paired_difference(a, b, horizon=horizon, **kw)
                if pd.n > 0:
                    row.update(
                        diff=_none_if_nan(pd.mean),
                        diff_low=_none_if_nan(pd.low),
                        diff_high=_none_if_nan(pd.high),
                        n_pairs=pd.n,
                        sign_p=_none_if_nan(pd.sign_p),
                        boot_p=_none_if_nan(pd.boot_p),
                    )
            rows.append(SummaryRow(**row))
    return rows


# --------------------------------------------------------------------------------------------------
# markdown


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float | np.floating) and math.isnan(x))


def fmt_value(x: Any, *, signed: bool = False) -> str:
    """A number for a table: ``n/a`` when missing, integers as they are, 4 significant digits below 1000,
    no decimals from 1000 on, scientific below 0.001; ``signed`` adds ``+`` to positive values."""
    if _missing(x):
        return "n/a"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int | np.integer):
        s = str(int(x))
    else:
        x = float(x)
        a = abs(x)
        if math.isinf(x):
            s = "inf" if x > 0 else "-inf"
        elif x == 0:
            s = "0"
        elif a >= 1000:
            s = f"{x:.0f}"
        elif a >= 1e-3:
            s = f"{x:.4g}"
        else:
            s = f"{x:.2e}"
    if signed and not s.startswith("-") and s not in ("0", "n/a") and float(x) > 0:
        s = "+" + s
    return s


def fmt_p(p: Any) -> str:
    """A p-value: ``n/a`` when missing, 3 decimals from 0.001 on, scientific below."""
    if _missing(p):
        return "n/a"
    p = float(p)
    return f"{p:.3f}" if p >= 1e-3 else f"{p:.1e}"


def _fmt_ci(low: Any, high: Any, *, signed: bool = False) -> str:
    if _missing(low) or _missing(high):
        return "n/a"
    return f"[{fmt_value(low, signed=signed)}, {fmt_value(high, signed=signed)}]"


def _cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[SummaryRow | Mapping[str, Any]]) -> str:
    """A GitHub-markdown table of ``summarize_arms`` rows (``SummaryRow`` s or dicts with its fields).

    Columns: measure, arm, n, mean, CI, reached (only when a row is censored), Δ vs the baseline, its CI,
    sign-test p, bootstrap p, and "dropped" (only when a NaN was dropped). Missing values print ``n/a``.
    When a censored measure is present a note under the table says how never-reached seeds were counted.
    """
    if not rows:
        return ""
    names = [f.name for f in fields(SummaryRow)]
    dicts = []
    for r in rows:
        d = asdict(r) if is_dataclass(r) and not isinstance(r, type) else dict(r)
        dicts.append({k: d.get(k) for k in names} | {k: d[k] for k in d if k not in names})
    levels = {d["level"] for d in dicts if d.get("level") is not None}
    ci_name = f"{round(100 * levels.pop(), 1):g} % CI" if len(levels) == 1 else "CI"
    baselines = {d["baseline"] for d in dicts if d.get("baseline") is not None}
    delta = f"Δ vs {baselines.pop()}" if len(baselines) == 1 else "Δ vs baseline"
    censored = any(d.get("n_reached") is not None for d in dicts)
    dropped = any(d.get("n_dropped") for d in dicts)

    header = ["measure", "arm", "n", "mean", ci_name]
    if censored:
        header.append("reached")
    header += [delta, f"Δ {ci_name}", "sign p", "boot p"]
    if dropped:
        header.append("dropped (NaN)")
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] * 2 + ["---:"] * (len(header) - 2)) + "|",
    ]
    for d in dicts:
        cells = [
            _cell(d.get("measure") or "n/a"),
            _cell(d.get("arm") or "n/a"),
            fmt_value(d.get("n")),
            fmt_value(d.get("mean")),
            _fmt_ci(d.get("ci_low"), d.get("ci_high")),
        ]
        if censored:
            reached = d.get("n_reached")
            cells.append("n/a" if reached is None else f"{reached}/{d.get('n')}")
        cells += [
            fmt_value(d.get("diff"), signed=True),
            _fmt_ci(d.get("diff_low"), d.get("diff_high"), signed=True),
            fmt_p(d.get("sign_p")),
            fmt_p(d.get("boot_p")),
        ]
        if dropped:
            cells.append(fmt_value(d.get("n_dropped") or 0))
        lines.append("| " + " | ".join(cells) + " |")
    out = "\n".join(lines)
    if censored:
        out += (
            "\n\nCensored measures: a seed that never reached the threshold counts as the run length, so "
            "the mean is a restricted mean (a lower bound); prefer the sign test's p there."
        )
    return out + "\n"
