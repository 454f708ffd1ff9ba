"""experiments.stats against hand-computed cases.

Sign test: 8 positive of 10 gives p = 2·(C(10,8) + C(10,9) + C(10,10)) / 2^10 = 2·56/1024 = 0.109375.
Paired bootstrap, by enumeration: d = (0, 0, 3) has mean 1; a resample's mean is the number k of 3s it
draws, k ~ Bin(3, 1/3), so the re-centred |k − 1| ≥ 1 has probability 1 − P(k = 1) = 1 − 12/27 = 15/27,
and the 95 % percentile CI is [0, 3] (P(k = 0) = 8/27 > 2.5 %, P(k = 3) = 1/27 > 2.5 %).
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from experiments.stats import (
    BootstrapCI,
    SummaryRow,
    apply_tolerance,
    benjamini_hochberg,
    bootstrap_ci,
    decide,
    fmt_p,
    fmt_value,
    holm,
    markdown_table,
    paired_difference,
    paired_t,
    sign_test,
    signflip_p,
    summarize_arms,
    t_cdf,
    t_quantile,
)

# --------------------------------------------------------------------------------------------------
# sign test


@pytest.mark.parametrize(
    ("n_pos", "n_neg", "p"),
    [
        (8, 2, 2 * (45 + 10 + 1) / 1024),  # 0.109375
        (2, 8, 0.109375),
        (10, 0, 2 / 1024),
        (3, 0, 2 / 8),
        (1, 0, 1.0),
        (5, 5, 1.0),
        (6, 5, 1.0),  # 2 · P(X ≥ 6 | n = 11) = 1 exactly
        (0, 0, 1.0),
        (7, 3, 2 * (120 + 45 + 10 + 1) / 1024),
    ],
)
def test_sign_test_by_hand(n_pos, n_neg, p):
    assert sign_test(n_pos, n_neg) == pytest.approx(p, rel=1e-15)


def test_sign_test_large_n_is_finite():
    # 2^1100 overflows a float; the integer sum must still give a (tiny) probability
    assert 0.0 <= sign_test(1100, 0) < 1e-300
    assert sign_test(600, 500) == pytest.approx(sign_test(500, 600))


def test_paired_sign_counts_drop_ties():
    base = np.arange(12, dtype=float)
    d = np.array([1, 1, 1, 1, 1, 1, 1, 1, -1, -1, 0, 0], dtype=float)
    r = paired_difference(base + d, base, n_boot=500)
    assert (r.n, r.n_pos, r.n_neg, r.n_ties) == (12, 8, 2, 2)
    assert r.sign_p == 0.109375
    assert r.mean == pytest.approx(6 / 12)


# --------------------------------------------------------------------------------------------------
# bootstrap CI


@pytest.mark.parametrize("c", [2.5, 0.1, -7.0])
def test_ci_of_constant_sample_is_a_point(c):
    r = bootstrap_ci(np.full(30, c), n_boot=2000)
    assert r.low == r.high == r.estimate
    assert r.estimate == pytest.approx(c, rel=1e-12)
    assert (r.n, r.n_dropped, r.n_censored) == (30, 0, 0)


def test_ci_single_value_and_empty():
    r = bootstrap_ci([4.0])
    assert (r.estimate, r.low, r.high, r.n) == (4.0, 4.0, 4.0, 1)
    e = bootstrap_ci([math.nan, math.nan])
    assert e.n == 0 and e.n_dropped == 2
    assert all(math.isnan(x) for x in (e.estimate, e.low, e.high))


def test_ci_by_enumeration():
    # resample means of (0, 0, 3) are 0, 1, 2, 3 with probabilities 8/27, 12/27, 6/27, 1/27
    r = bootstrap_ci([0.0, 0.0, 3.0], n_boot=20_000)
    assert (r.estimate, r.low, r.high) == (1.0, 0.0, 3.0)
    narrow = bootstrap_ci([0.0, 0.0, 3.0], n_boot=20_000, level=0.5)
    assert (narrow.low, narrow.high) == (0.0, 2.0)  # quartiles: P(k ≤ 0) = 0.30, P(k ≤ 1) = 0.74


def test_ci_coverage_on_normal_samples():
    rng = np.random.default_rng(123)
    mu, covered, reps = 3.0, 0, 200
    for rep in range(reps):
        x = rng.normal(mu, 2.0, size=30)
        r = bootstrap_ci(x, n_boot=1000, seed=rep)
        covered += r.low <= mu <= r.high
    assert 0.90 * reps <= covered <= 0.99 * reps, covered


def test_ci_is_reproducible_and_seed_dependent():
    x = np.random.default_rng(0).normal(size=40)
    assert bootstrap_ci(x, seed=5) == bootstrap_ci(x, seed=5)
    assert bootstrap_ci(x, seed=5).low != bootstrap_ci(x, seed=6).low


def test_ci_other_statistic_and_level():
    x = np.array([1.0, 2.0, 3.0, 4.0, 100.0])
    med = bootstrap_ci(x, statistic=np.median, n_boot=2000)
    assert med.estimate == 3.0
    assert 1.0 <= med.low <= 3.0 <= med.high <= 100.0
    wide = bootstrap_ci(x, level=0.99, n_boot=2000)
    narrow = bootstrap_ci(x, level=0.5, n_boot=2000)
    assert wide.low <= narrow.low <= narrow.high <= wide.high
    with pytest.raises(ValueError, match="one number"):
        bootstrap_ci(x, statistic=lambda s, axis=None: np.asarray(s), n_boot=10)
    with pytest.raises(ValueError, match="reduce along `axis`"):
        bootstrap_ci(x, statistic=lambda s, axis=None: np.mean(s), n_boot=10)  # ignores axis


def test_ci_mapping_input_ignores_order():
    values = {s: float(v) for s, v in enumerate(np.random.default_rng(1).normal(size=20))}
    reversed_values = dict(reversed(list(values.items())))
    assert bootstrap_ci(values, n_boot=500) == bootstrap_ci(reversed_values, n_boot=500)
    assert bootstrap_ci(values, n_boot=500) == bootstrap_ci(list(values.values()), n_boot=500)


def test_ci_large_n_in_blocks():
    # 10,000 resamples of 2,000 seeds are 20 M draws: the bootstrap runs in blocks
    x = np.random.default_rng(2).normal(size=2000)
    r = bootstrap_ci(x)
    se = x.std(ddof=1) / math.sqrt(x.size)
    assert r.high - r.low == pytest.approx(2 * 1.96 * se, rel=0.1)


# --------------------------------------------------------------------------------------------------
# NaN policy, argument checks


def test_nan_policy_omit_counts_and_raise_raises():
    x = [1.0, math.nan, 3.0, math.nan]
    r = bootstrap_ci(x, n_boot=200)
    assert (r.n, r.n_dropped, r.estimate) == (2, 2, 2.0)
    with pytest.raises(ValueError, match="2 NaN"):
        bootstrap_ci(x, nan_policy="raise")
    # a pair is dropped when either side is NaN
    p = paired_difference([1.0, math.nan, 3.0, 4.0], [0.0, 1.0, math.nan, 2.0], n_boot=200)
    assert (p.n, p.n_dropped, p.seeds) == (2, 2, (0, 3))
    assert p.differences.tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="NaN"):
        paired_difference([1.0, math.nan], [0.0, 1.0], nan_policy="raise")


@pytest.mark.parametrize(
    "kwargs", [{"level": 0.0}, {"level": 1.0}, {"n_boot": 0}, {"n_boot": 2.5}, {"nan_policy": "drop"}]
)
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        bootstrap_ci([1.0, 2.0], **kwargs)


def test_inf_needs_a_horizon():
    with pytest.raises(ValueError, match="horizon"):
        bootstrap_ci([1.0, math.inf])
    with pytest.raises(ValueError, match="-inf"):
        bootstrap_ci([1.0, -math.inf], horizon=10)
    with pytest.raises(ValueError, match="above the horizon"):
        bootstrap_ci([1.0, 12.0], horizon=10)


# --------------------------------------------------------------------------------------------------
# paired differences


def test_identical_arms_difference_is_exactly_zero_with_p_one():
    x = np.random.default_rng(3).normal(size=25)
    r = paired_difference(x, x.copy())
    assert (r.mean, r.low, r.high) == (0.0, 0.0, 0.0)
    assert r.sign_p == 1.0 and r.boot_p == 1.0
    assert (r.n_pos, r.n_neg, r.n_ties) == (0, 0, 25)


def test_paired_bootstrap_p_by_enumeration():
    r = paired_difference([0.0, 0.0, 3.0], [0.0, 0.0, 0.0], n_boot=20_000)
    assert r.mean == 1.0
    assert (r.low, r.high) == (0.0, 3.0)
    assert r.boot_p == pytest.approx(15 / 27, abs=0.02)
    assert r.sign_p == 1.0  # one positive, two ties


def test_paired_clear_effect_and_null():
    rng = np.random.default_rng(4)
    base = rng.normal(size=64)
    better = base + 0.5 + 0.1 * rng.normal(size=64)
    r = paired_difference(better, base, n_boot=2000)
    assert r.low > 0.3 and r.high < 0.7
    assert r.boot_p == 1 / 2001  # no re-centred resample mean reaches 0.5
    assert r.sign_p == 2 / 2**64
    noise = base + 0.1 * rng.normal(size=64)
    n = paired_difference(noise, base, n_boot=2000)
    assert n.low < 0 < n.high
    assert n.boot_p > 0.05 and n.sign_p > 0.05


def test_paired_bootstrap_p_needs_two_pairs():
    r = paired_difference([2.0], [1.0])
    assert r.mean == 1.0 and math.isnan(r.boot_p) and r.sign_p == 1.0
    e = paired_difference([math.nan], [1.0])
    assert e.n == 0 and math.isnan(e.mean) and e.sign_p == 1.0


def test_pairs_match_by_seed_id_not_position():
    rng = np.random.default_rng(5)
    seeds = [11, 3, 42, 7, 100, 0, 9, 5]
    base = {s: float(rng.normal()) for s in seeds}
    arm = {s: base[s] + 1.0 for s in seeds}  # +1 on every seed
    arm_reversed = dict(reversed(list(arm.items())))
    r = paired_difference(arm_reversed, base, n_boot=500)
    assert r.seeds == tuple(sorted(seeds))
    np.testing.assert_allclose(r.differences, 1.0)
    assert (r.n_pos, r.n_neg) == (8, 0)
    assert r == paired_difference(arm, base, n_boot=500)
    # matching by position would have paired different seeds
    by_position = np.array(list(arm_reversed.values())) - np.array(list(base.values()))
    assert not np.allclose(by_position, 1.0)


def test_pairs_need_the_same_seeds_and_kinds():
    with pytest.raises(ValueError, match="same seed ids"):
        paired_difference({0: 1.0, 1: 2.0}, {0: 1.0, 2: 2.0})
    with pytest.raises(TypeError, match="one of each"):
        paired_difference({0: 1.0, 1: 2.0}, [1.0, 2.0])
    with pytest.raises(ValueError, match="one value per seed"):
        paired_difference([1.0, 2.0], [1.0, 2.0, 3.0])


# --------------------------------------------------------------------------------------------------
# censored measures


def test_censored_steps_to_threshold():
    H = 500
    inf = math.inf
    # arm reaches on seeds 0-5, never on 6-7; the baseline reaches on 0-2 only (later), never on 3-7
    arm = [100, 120, 90, 200, 300, 250, inf, inf]
    base = [150, 130, 95, inf, inf, inf, inf, inf]
    c = bootstrap_ci(arm, horizon=H, n_boot=500)
    assert (c.n, c.n_censored) == (8, 2)
    assert c.estimate == pytest.approx((100 + 120 + 90 + 200 + 300 + 250 + 2 * H) / 8)
    r = paired_difference(arm, base, horizon=H, n_boot=2000)
    # 6 pairs where the arm was faster (3 both reached, 3 only the arm), 2 ties (neither reached)
    assert (r.n_pos, r.n_neg, r.n_ties) == (0, 6, 2)
    assert r.sign_p == 2 / 2**6
    assert r.differences.tolist() == [-50, -10, -5, -300, -200, -250, 0, 0]
    assert r.high < 0


# --------------------------------------------------------------------------------------------------
# summarize_arms and markdown


def _per_seed():
    rng = np.random.default_rng(6)
    base = rng.normal(0.5, 0.1, size=16)
    steps_base = np.where(rng.random(16) < 0.5, rng.integers(50, 400, 16).astype(float), np.inf)
    return {
        "GRPO": {"final_reward": base, "steps_to_0.8": steps_base},
        "DFPO": {"final_reward": base + 0.05, "steps_to_0.8": np.minimum(steps_base, 300.0)},
        "GSPO": {"final_reward": base - 0.01},  # no steps measure
    }


def test_summarize_arms_rows():
    rows = summarize_arms(_per_seed(), baseline="GRPO", horizons={"steps_to_0.8": 400}, n_boot=500)
    assert [(r.measure, r.arm) for r in rows] == [
        ("final_reward", "GRPO"),
        ("final_reward", "DFPO"),
        ("final_reward", "GSPO"),
        ("steps_to_0.8", "GRPO"),
        ("steps_to_0.8", "DFPO"),
        ("steps_to_0.8", "GSPO"),
    ]
    by = {(r.measure, r.arm): r for r in rows}
    g = by["final_reward", "GRPO"]
    assert g.diff is None and g.sign_p is None and g.n == 16 and g.n_reached is None
    d = by["final_reward", "DFPO"]
    assert d.diff == pytest.approx(0.05) and d.n_pairs == 16
    assert d.sign_p == 2 / 2**16 and d.diff_low == pytest.approx(0.05) and d.diff_high == pytest.approx(0.05)
    assert d.mean == pytest.approx(g.mean + 0.05)
    s = by["steps_to_0.8", "DFPO"]
    assert s.n_reached == 16 and by["steps_to_0.8", "GRPO"].n_reached < 16
    assert s.diff < 0 and s.n_pairs == 16
    missing = by["steps_to_0.8", "GSPO"]
    assert missing.n == 0 and missing.mean is None and missing.diff is None
    # reproducible
    assert rows == summarize_arms(_per_seed(), baseline="GRPO", horizons={"steps_to_0.8": 400}, n_boot=500)


def test_summarize_arms_checks_baseline_and_censoring():
    with pytest.raises(ValueError, match="baseline"):
        summarize_arms(_per_seed(), baseline="PPO")
    with pytest.raises(ValueError, match="horizon"):
        summarize_arms(_per_seed(), baseline="GRPO", n_boot=100)  # steps have +inf, no horizon
    rows = summarize_arms({"a": {"m": [1.0, 2.0]}}, n_boot=100)
    assert rows[0].diff is None and rows[0].baseline is None


def test_markdown_table_renders_na_and_numbers():
    rows = summarize_arms(_per_seed(), baseline="GRPO", horizons={"steps_to_0.8": 400}, n_boot=500)
    md = markdown_table(rows)
    lines = md.strip().split("\n")
    header = lines[0]
    assert header.startswith("| measure | arm | n | mean | 95 % CI | reached | Δ vs GRPO | Δ 95 % CI |")
    assert "sign p | boot p |" in header
    table = [ln for ln in lines if ln.startswith("|")]
    assert len(table) == 2 + len(rows)
    assert all(ln.count("|") == header.count("|") for ln in table)
    gspo_steps = next(ln for ln in table if "steps_to_0.8" in ln and "GSPO" in ln)
    assert gspo_steps.count("n/a") >= 7  # no values at all
    grpo = next(ln for ln in table if "final_reward" in ln and "| GRPO |" in ln)
    assert grpo.endswith("| n/a | n/a | n/a | n/a |")  # the baseline has no difference
    dfpo = next(ln for ln in table if "final_reward" in ln and "DFPO" in ln)
    assert "| +0.05 | [+0.05, +0.05] | 3.1e-05 |" in dfpo
    assert "restricted mean" in md


def test_markdown_table_from_dicts_and_missing_values():
    rows = [
        SummaryRow("a|b", "acc", 3, 0.123456, 0.1, 0.2, baseline="base", diff=math.nan, sign_p=None),
        {"arm": "c", "measure": "acc", "n": 0, "mean": None, "ci_low": None, "ci_high": None, "n_dropped": 2},
    ]
    md = markdown_table(rows)
    assert "a\\|b" in md
    assert "| acc | a\\|b | 3 | 0.1235 | [0.1, 0.2] | n/a | n/a | n/a | n/a | 0 |" in md
    assert "| acc | c | 0 | n/a | n/a | n/a | n/a | n/a | n/a | 2 |" in md
    assert "reached" not in md and "dropped (NaN)" in md
    assert markdown_table([]) == ""


@pytest.mark.parametrize(
    ("x", "kw", "s"),
    [
        (None, {}, "n/a"),
        (math.nan, {}, "n/a"),
        (np.float64("nan"), {}, "n/a"),
        (0.0, {}, "0"),
        (12, {}, "12"),
        (np.int64(7), {}, "7"),
        (0.109375, {}, "0.1094"),
        (123.456, {}, "123.5"),
        (12345.6, {}, "12346"),
        (0.000123, {}, "1.23e-04"),
        (-2.5, {"signed": True}, "-2.5"),
        (2.5, {"signed": True}, "+2.5"),
        (0.0, {"signed": True}, "0"),
    ],
)
def test_fmt_value(x, kw, s):
    assert fmt_value(x, **kw) == s


def test_fmt_p():
    assert fmt_p(0.109375) == "0.109"
    assert fmt_p(1.0) == "1.000"
    assert fmt_p(1 / 10001) == "1.0e-04"
    assert fmt_p(None) == "n/a" and fmt_p(math.nan) == "n/a"


def test_bootstrap_ci_result_type():
    assert isinstance(bootstrap_ci([1.0, 2.0], n_boot=10), BootstrapCI)


def test_reached_at_the_horizon_beats_never_reached_in_the_sign_test() -> None:
    """A seed that reached exactly at the horizon ties with a censored one in the restricted mean (both count
    as the horizon) but is known to be faster: the sign test counts it."""
    from experiments.stats import paired_difference, sign_test

    arm = {0: 20.0, 1: math.inf, 2: 5.0}
    base = {0: math.inf, 1: math.inf, 2: 7.0}
    pd = paired_difference(arm, base, horizon=20.0, n_boot=200)
    assert (pd.n_pos, pd.n_neg, pd.n_ties) == (0, 2, 1)
    assert pd.sign_p == sign_test(0, 2) == 0.5
    assert pd.mean == -2.0 / 3  # restricted means: (0 + 0 - 2) / 3


def test_an_arm_on_fewer_seeds_pairs_on_the_common_ones() -> None:
    from experiments.stats import summarize_arms

    rows = summarize_arms(
        {"base": {"m": {0: 1.0, 1: 2.0, 2: 3.0, 3: 10.0}}, "abl": {"m": {0: 2.0, 1: 4.0, 2: 3.0}}},
        "base",
        n_boot=200,
    )
    abl = next(r for r in rows if r.arm == "abl")
    assert abl.n == 3 and abl.n_pairs == 3
    assert abl.diff == (1.0 + 2.0 + 0.0) / 3  # seed 3 has no partner


# --------------------------------------------------------------------------------------------------
# small samples and multiplicity


@pytest.mark.parametrize(
    ("q", "df", "t"),
    [
        (0.975, 4, 2.776445105),
        (0.975, 9, 2.262157163),
        (0.975, 19, 2.093024054),
        (0.975, 1, 12.70620474),
        (0.95, 29, 1.699127027),
    ],
)
def test_t_quantile_textbook_values(q, df, t):
    assert t_quantile(q, df) == pytest.approx(t, abs=5e-9)
    assert t_quantile(1 - q, df) == -t_quantile(q, df)
    assert t_cdf(t_quantile(q, df), df) == pytest.approx(q, abs=1e-12)


def test_t_distribution_closed_forms():
    for df in (1, 2.5, 7, 1000):
        assert t_quantile(0.5, df) == 0.0
        assert t_cdf(0.0, df) == pytest.approx(0.5, abs=1e-15)
    # df = 1 is the Cauchy: F(x) = 1/2 + atan(x)/π, quantile tan(π (q − 1/2))
    for x in (-30.0, -1.0, 0.3, 4.0):
        assert t_cdf(x, 1) == pytest.approx(0.5 + math.atan(x) / math.pi, abs=1e-14)
    assert t_quantile(0.99, 1) == pytest.approx(math.tan(math.pi * 0.49), rel=1e-11)
    # df = 2: F(x) = 1/2 + x / (2 √(2 + x²))
    for x in (-3.0, 0.5, 2.0):
        assert t_cdf(x, 2) == pytest.approx(0.5 + x / (2 * math.sqrt(2 + x * x)), abs=1e-14)
    # large df approaches the normal's 1.959964
    assert t_quantile(0.975, 1e6) == pytest.approx(1.959964, abs=1e-5)
    assert t_quantile(0.975, math.inf) == pytest.approx(1.959963985, abs=1e-9)
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError):
        t_cdf(1.0, 0)


def test_paired_t_by_hand():
    # d = (1, 2, 3, 4, 5): mean 3, sd √2.5, se √0.5, t = 3/√0.5 = 4.2426, df 4
    mean, low, high, p = paired_t([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.776445105 * math.sqrt(0.5)
    assert (mean, low, high) == pytest.approx((3.0, 3.0 - half, 3.0 + half), abs=1e-8)
    assert p == pytest.approx(2 * (1 - t_cdf(3 / math.sqrt(0.5), 4)), rel=1e-10)
    assert p == pytest.approx(0.013236, abs=1e-6)
    # the 95 % interval excludes 0 exactly when p < 0.05
    for d in ([0.3, -0.1, 0.5, 0.2], [0.3, -0.4, 0.5, 0.2], [-2.0, -1.0, -1.5]):
        _, low, high, p = paired_t(d)
        assert (p < 0.05) == (not low <= 0 <= high)


def test_paired_t_edge_cases():
    assert all(math.isnan(v) for v in paired_t([]))
    mean, low, high, p = paired_t([2.0])
    assert mean == 2.0 and math.isnan(low) and math.isnan(high) and math.isnan(p)
    assert paired_t([0.0, 0.0, 0.0]) == (0.0, 0.0, 0.0, 1.0)
    assert paired_t([0.1, 0.1, 0.1]) == (0.1, 0.1, 0.1, 0.0)
    with pytest.raises(ValueError):
        paired_t([1.0, math.nan])


def _signflip_by_loop(d):
    total = abs(sum(d))
    scale = sum(abs(v) for v in d)
    flips = list(itertools.product((1, -1), repeat=len(d)))
    hits = sum(abs(sum(e * v for e, v in zip(eps, d, strict=True))) >= total - 1e-12 * scale for eps in flips)
    return hits / len(flips)


@pytest.mark.parametrize(
    "d",
    [
        [0.5, 1.2, -0.3, 2.0, 0.7, -0.1],
        [1.0, 2.0, 3.0, -1.0, -2.0, 0.0],  # ties at the observed |Σ| and a zero
        [0.25, -1.5, 0.75, 0.1, 3.0, 0.4],
    ],
)
def test_signflip_p_matches_a_plain_loop(d):
    assert signflip_p(d) == _signflip_by_loop(d)


def test_signflip_p_by_hand_and_monte_carlo():
    assert signflip_p([1.0, 2.0, 0.5, 3.0, 0.1]) == 2 / 32  # only all-+ and all-− reach |Σ|
    assert signflip_p([0.0, 0.0, 0.0, 0.0]) == 1.0
    assert signflip_p([]) == 1.0
    d = np.random.default_rng(3).normal(0.3, 1.0, size=14)
    exact = signflip_p(d)
    mc = signflip_p(d, exact_max=10, n_mc=40_000, seed=1)
    assert mc == pytest.approx(exact, abs=0.01)
    assert mc == signflip_p(d, exact_max=10, n_mc=40_000, seed=1)
    # n = 25 (Monte Carlo by default) all positive: p = (1 + #{all-+ or all-−}) / (1 + n_mc), near 1/(1+n_mc)
    assert signflip_p(np.arange(1.0, 26.0), n_mc=10_000) <= 3 / 10_001


def _signflip_exact(d):
    """The sign-flip p in exact rational arithmetic (``Fraction``: decimal strings as written, floats as
    stored), so a tie is a tie and nothing else is."""
    x = [Fraction(v) for v in d]
    total = abs(sum(x))
    flips = list(itertools.product((1, -1), repeat=len(x)))
    return Fraction(
        sum(abs(sum(e * v for e, v in zip(eps, x, strict=True))) >= total for eps in flips), len(flips)
    )


def test_signflip_p_counts_a_decimal_tie_lost_to_float_rounding():
    # 0.3 − 0.1 − 0.2 = 0 in decimal, so flipping those three reaches |Σ| = 0.9 exactly: subsets with sum
    # ≤ 0 ({}, {−0.1}, {−0.2}, {−0.1, −0.2}, {0.3, −0.1, −0.2}) and their complements, 10 of 32. In floats
    # that flip lands a few ulps below the observed sum; the 1e-12 · Σ|d| tolerance counts it.
    text = ["0.3", "-0.1", "-0.2", "0.5", "0.4"]
    assert _signflip_exact(text) == Fraction(10, 32)
    assert signflip_p([float(s) for s in text]) == 10 / 32


def test_signflip_p_tolerance_is_float_noise_only():
    # d = (1, 0.5, −0.5 + 1e-9): flipping {0.5, −0.5 + 1e-9} gives 1 − 1e-9, 2e-9 short of Σ = 1 + 1e-9,
    # a real shortfall (2000× the tolerance), so it does not count: {} , {−0.5+ε}, {1, 0.5}, all: 4 of 8
    d = [1.0, 0.5, -0.5 + 1e-9]
    assert _signflip_exact(d) == Fraction(4, 8)
    assert signflip_p(d) == 0.5


def test_signflip_p_enumerates_exactly_at_exact_max():
    d = [0.5, 1.2, -0.3, 2.0, 0.7, -0.1]
    # Σ = 4: the subsets of {−0.3, −0.1} (sum ≤ 0) and their complements reach it, 8 of 64
    exact = float(_signflip_exact(d))
    assert exact == 8 / 64
    assert signflip_p(d, exact_max=6) == exact  # n = exact_max: still enumerated
    # n = exact_max + 1: Monte Carlo, p = (1 + count) / (1 + n_mc), never the exact fraction here
    mc = signflip_p(d, exact_max=5, n_mc=999, seed=2)
    assert mc * 1000 == pytest.approx(round(mc * 1000), abs=1e-9) and mc != exact


def test_signflip_p_monte_carlo_is_never_zero():
    # n = 25 all positive: only the all-+ and all-− flips (2 of 2^25) reach |Σ|, so one random flip almost
    # surely misses (probability 1 − 2^-24); p = (1 + 0) / (1 + 1) = 1/2, never 0 / 1
    d = np.arange(1.0, 26.0)
    for seed in range(5):
        assert signflip_p(d, n_mc=1, seed=seed) == 0.5
    assert signflip_p(d, n_mc=1_000, seed=0) == 1 / 1_001


def test_tolerance_makes_float_noise_a_tie():
    assert apply_tolerance([1e-15, -2e-10, 0.5, -0.0], 1e-9).tolist() == [0.0, 0.0, 0.5, 0.0]
    with pytest.raises(ValueError):
        apply_tolerance([1.0], -1.0)
    base = np.linspace(0.1, 3.0, 30)
    noisy = base + 1e-15 * (1 + base)  # all 30 differences tiny (float noise) and positive
    assert np.all(noisy - base > 0)
    r0 = paired_difference(noisy, base, n_boot=200)
    assert r0.n_pos == 30 and r0.sign_p < 1e-8  # 2 · 2^-30 without a tolerance
    r = paired_difference(noisy, base, n_boot=200, tol=1e-9)
    assert (r.n_pos, r.n_neg, r.n_ties) == (0, 0, 30)
    assert (r.sign_p, r.boot_p, r.mean, r.low, r.high) == (1.0, 1.0, 0.0, 0.0, 0.0)
    assert np.all(r.differences == 0.0)
    assert paired_t(r.differences)[3] == 1.0 and signflip_p(r.differences) == 1.0
    # a real difference survives the tolerance; a censored pair keeps its known sign
    r = paired_difference([5.0, math.inf, 3.0], [2.0, 10.0, 3.0 + 1e-12], horizon=10.0, n_boot=200, tol=1e-9)
    assert (r.n_pos, r.n_neg, r.n_ties) == (2, 0, 1)
    assert r.differences.tolist() == [3.0, 0.0, 0.0]


def test_holm_and_benjamini_hochberg_by_hand():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted 0.005, 0.01, 0.03, 0.04: Holm ×4, ×3, ×2, ×1 = 0.02, 0.03, 0.06, 0.04 → running max
    np.testing.assert_allclose(holm(p), [0.03, 0.06, 0.06, 0.02], rtol=1e-12)
    # BH m·p/i = 0.02, 0.02, 0.04, 0.04 → running min from the largest
    np.testing.assert_allclose(benjamini_hochberg(p), [0.02, 0.04, 0.04, 0.02], rtol=1e-12)
    # capped at 1, NaN passed through and not counted (m = 3)
    np.testing.assert_allclose(holm([0.5, math.nan, 0.01, 0.2]), [0.5, math.nan, 0.03, 0.4], rtol=1e-12)
    np.testing.assert_allclose(holm([0.6, 0.7]), [1.0, 1.0])
    np.testing.assert_allclose(
        benjamini_hochberg([0.5, math.nan, 0.01, 0.2]), [0.5, math.nan, 0.03, 0.3], rtol=1e-12
    )
    assert holm([]).size == 0 and benjamini_hochberg([]).size == 0
    with pytest.raises(ValueError):
        holm([1.5])


def test_decide():
    d = [-1.0, -2.0, -1.5, -0.5, -1.2]
    r = decide(d, "lower")
    assert set(r) == {"n", "mean", "low", "high", "p", "perm_p", "side"}
    assert r["side"] == "predicted" and r["n"] == 5 and r["p"] < 0.05 and r["high"] < 0
    assert r["perm_p"] == 0.0625  # the smallest exact sign-flip p at n = 5: it could not reject at 0.05
    assert decide(d, "higher")["side"] == "opposite"
    assert decide([1e-12, -3e-12, 2e-12], "lower", tol=1e-9)["side"] == "tie"
    assert decide([1e-12, -3e-12, 2e-12], "lower", tol=1e-9)["p"] == 1.0
    # alpha sets the interval's level, so the interval excludes 0 exactly when p < alpha
    r = decide([0.3, 0.1, 0.5, -0.05, 0.2, 0.25], "higher", alpha=0.01)
    assert (r["p"] < 0.01) == (not r["low"] <= 0 <= r["high"])
    with pytest.raises(ValueError):
        decide(d, "smaller")


def test_tolerance_boundaries_are_ties():
    # |d| == tol is a tie (<=), everywhere the tolerance is applied; all values exact in binary
    assert apply_tolerance([0.25, -0.25, 0.5, -0.5], 0.25).tolist() == [0.0, 0.0, 0.5, -0.5]
    r = paired_difference([1.25, 3.0, 0.0], [1.0, 1.0, 0.5], n_boot=200, tol=0.25)  # d = 0.25, 2, -0.5
    assert (r.n_pos, r.n_neg, r.n_ties) == (1, 1, 1)
    assert r.differences.tolist() == [0.0, 2.0, -0.5]
    # d = (1, -0.5): both outside tol = 0.25, mean 0.25 == tol: a tie, not a predicted "higher"
    assert decide([1.0, -0.5], "higher", tol=0.25)["side"] == "tie"
    assert decide([1.0, -0.5], "higher", tol=0.125)["side"] == "predicted"
    # tol = 0: a mean of exactly 0 is a tie whichever direction was predicted
    for direction in ("lower", "higher"):
        assert decide([0.5, -0.5, 0.0], direction)["side"] == "tie"


def test_type_one_error_of_the_t_rule_and_of_the_small_n_bootstrap():
    """The rule ``paired_t p < 0.05`` under a true difference of 0 rejects about 5 % of the time at n = 5,
    10, 20 (exactly 5 % for normal differences; for Laplace differences it is conservative at n = 5,
    about 3.4 % in 400,000 replicates, hence the lower bound 0.02 there). The percentile bootstrap CI of
    ``paired_difference`` at n = 5 excludes 0 in about 15-19 % of samples (its quantiles ignore the
    t-factor for small n), which is why small-n decisions use the t test."""
    rng = np.random.default_rng(20240611)
    reps = 4000
    for dist in ("normal", "laplace"):
        for n in (5, 10, 20):
            x = rng.standard_normal((reps, n)) if dist == "normal" else rng.laplace(size=(reps, n))
            t = x.mean(axis=1) / (x.std(axis=1, ddof=1) / math.sqrt(n))
            # p < 0.05 ⇔ |t| > t_{0.975, n-1} (p decreases in |t|); checked against paired_t on some rows
            reject = np.abs(t) > t_quantile(0.975, n - 1)
            for i in range(60):
                assert (paired_t(x[i])[3] < 0.05) == reject[i]
            lower = 0.03 if dist == "normal" else 0.02
            assert lower <= reject.mean() <= 0.07, (dist, n, reject.mean())
    reps = 1000
    excludes = 0
    for i in range(reps):
        d = rng.standard_normal(5)
        r = paired_difference(d, np.zeros(5), n_boot=1000, seed=i)
        excludes += not r.low <= 0 <= r.high
    assert excludes / reps > 0.09
