"""orth_proj_pos (DFPO eq. 51) on one-sided groups, and feasibility + optimality on thousands of groups.

A group is one-sided when it has a non-zero advantage and all its non-zero advantages share one sign.
Then Σ_i Â_i v_i = 0 with v ≥ 0 forces v_i = 0 wherever Â_i ≠ 0: that face is the whole feasible set,
and the QP's optimum on it is v_i = 0 (Â_i ≠ 0), v_i = max(s̄_i, 0) (Â_i = 0).
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from cancellation.transforms import orth_proj_pos

from . import reference as ref

#: Every comparison here is between two code paths in float64, at a tolerance well above its
#: rounding (library vs plain loops and the KKT conditions): ``tests/exactness.py``.
pytestmark = pytest.mark.exactness

F64 = torch.float64


def test_one_sided_hand_worked() -> None:
    # g=7: s = (0.9, 1.0, 3.0), Â = (−0.3, 0, −1) (negative one-sided): v = (0, 1, 0). Breakpoints
    #      s/Â = (−3, ·, −3) tie in exact arithmetic; in floats 0.9/−0.3 rounds so that
    #      0.9 − (0.9/−0.3)·(−0.3) > 0, which left no root bracket and returned s unchanged (Σ Â v = −3.27).
    # g=2: s = (0.5, 2.0, 0.25, 1.5), Â = (1, 0.5, 0, 2) (positive one-sided): v = (0, 0, 0.25, 0).
    # g=5: s = (1.3, −0.4), Â = (−1.1, −0.0) (−0.0 is a zero advantage): v = (0, max(−0.4, 0)) = (0, 0).
    # g=9: s = (1, 3), Â = (1, −1) (two-sided, for contrast): the plain projection (2, 2).
    s = [0.9, 0.5, 1.0, 2.0, 1.3, 3.0, 0.25, -0.4, 1.5, 1.0, 3.0]
    a = [-0.3, 1.0, 0.0, 0.5, -1.1, -1.0, 0.0, -0.0, 2.0, 1.0, -1.0]
    g = [7, 2, 7, 2, 5, 7, 2, 5, 2, 9, 9]
    want = [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.25, 0.0, 0.0, 2.0, 2.0]
    got = orth_proj_pos(torch.tensor(s, dtype=F64), torch.tensor(a, dtype=F64), torch.tensor(g)).tolist()
    for i in range(len(s)):
        if a[i] != 0.0 and g[i] != 9:
            assert got[i] == 0.0, (i, got[i])  # exactly zero, not merely small
        assert abs(got[i] - want[i]) <= 1e-12, (i, got[i], want[i])
    for gid in set(g):
        idx = [i for i in range(len(s)) if g[i] == gid]
        assert abs(sum(a[i] * got[i] for i in idx)) <= 1e-12


def _zero_sum(rng: random.Random, g: int) -> list[float]:
    x = [rng.gauss(0.0, 1.0) for _ in range(g)]
    mu = sum(x) / g
    return [v - mu for v in x]


def _random_group(rng: random.Random) -> tuple[list[float], list[float]]:
    """A group of size 2..16 of one of several kinds (two-sided, one-sided either sign, zeros, ties)."""
    g = rng.randint(2, 16)
    s = [rng.uniform(0.0, 3.0) for _ in range(g)]
    kind = rng.randrange(8)
    if kind == 0:
        a = _zero_sum(rng, g)
    elif kind == 1:  # two-sided with some Â = 0 and some s = 0
        a = _zero_sum(rng, g)
        for j in rng.sample(range(g), rng.randint(1, g - 1)):
            a[j] = 0.0
        s[rng.randrange(g)] = 0.0
    elif kind in (2, 3):  # one-sided, with zero advantages mixed in
        sign = 1.0 if kind == 2 else -1.0
        a = [sign * abs(rng.gauss(0.0, 1.0)) * (rng.random() < 0.7) for _ in range(g)]
        a[rng.randrange(g)] = sign * rng.uniform(0.1, 2.0)
    elif kind == 4:  # one-sided with ties: equal advantages and equal weights
        sign = rng.choice([-1.0, 1.0])
        a = [sign * rng.choice([0.0, 0.3, 0.5, 1.0]) for _ in range(g)]
        a[0] = sign * 0.3
        s = [rng.choice([0.0, 0.9, 1.0, 1.5]) for _ in range(g)]
    elif kind == 5:  # integer advantages and weights: ties among the breakpoints s/Â
        a = [float(rng.choice([-2, -1, 0, 1, 2])) for _ in range(g)]
        s = [float(rng.randint(0, 3)) for _ in range(g)]
    elif kind == 6:  # all advantages zero
        a = [0.0] * g
    else:  # weights at DFPO's clip bounds (s̄ = 1 ± ε), GRPO-style advantages with ties
        r = [float(rng.randint(0, 1)) for _ in range(g)]
        mu = sum(r) / g
        a = [x - mu for x in r]
        s = [rng.choice([1.0 - 3e-4, 1.0, 1.0 + 4e-4, rng.uniform(0.99, 1.01)]) for _ in range(g)]
    return s, a


def _kkt_optimal(s: list[float], a: list[float], v: list[float], tol: float = 1e-9) -> bool:
    """A certificate of optimality for the convex QP: some λ with v = max(s − λÂ, 0) (stationarity with
    μ = v − s + λÂ ≥ 0, μ·v = 0). λ is pinned by any row with v_j > 0 and Â_j ≠ 0; otherwise any λ in
    the interval that keeps the zero rows at zero works."""
    g = len(s)
    pinned = [j for j in range(g) if v[j] > tol and a[j] != 0.0]
    if pinned:
        n2 = sum(a[j] ** 2 for j in pinned)
        lams = [sum(a[j] * (s[j] - v[j]) for j in pinned) / n2]
    else:
        # every row with Â ≠ 0 sits at 0: need s_j − λÂ_j ≤ 0, i.e. λ ≥ s_j/Â_j (Â > 0), λ ≤ s_j/Â_j (Â < 0)
        lows = [s[j] / a[j] for j in range(g) if a[j] > 0]
        highs = [s[j] / a[j] for j in range(g) if a[j] < 0]
        lo = max(lows) if lows else -math.inf
        hi = min(highs) if highs else math.inf
        if lo > hi + tol:
            return False
        lams = [lo if math.isfinite(lo) else (hi if math.isfinite(hi) else 0.0)]
    lam = lams[0]
    return all(abs(v[j] - max(s[j] - lam * a[j], 0.0)) <= tol * max(1.0, abs(s[j])) for j in range(g))


def test_orth_proj_pos_feasible_and_optimal_on_random_groups() -> None:
    rng = random.Random(2024)
    groups = [_random_group(rng) for _ in range(2400)]
    kinds_seen = {"pos": 0, "neg": 0, "two": 0, "zero": 0}
    ws, advs, gids = [], [], []
    for k, (s, a) in enumerate(groups):
        ws += s
        advs += a
        gids += [7919 * k % 100003] * len(s)  # distinct, non-contiguous ids
    order = list(range(len(ws)))
    rng.shuffle(order)
    out = orth_proj_pos(
        torch.tensor([ws[i] for i in order], dtype=F64),
        torch.tensor([advs[i] for i in order], dtype=F64),
        torch.tensor([gids[i] for i in order]),
    ).tolist()
    flat = [0.0] * len(ws)
    for pos, i in enumerate(order):
        flat[i] = out[pos]
    start = 0
    n_brute = 0
    for s, a in groups:
        v = flat[start : start + len(s)]
        start += len(s)
        has_pos, has_neg = any(x > 0 for x in a), any(x < 0 for x in a)
        kinds_seen["two" if has_pos and has_neg else "pos" if has_pos else "neg" if has_neg else "zero"] += 1
        # feasibility: Âᵀv = 0 and v ≥ 0
        assert min(v) >= 0.0, (s, a, v)
        assert abs(sum(x * y for x, y in zip(a, v, strict=True))) <= 1e-9, (s, a, v)
        if has_pos != has_neg:  # one-sided: the feasible set is a face; its optimum is explicit
            for j in range(len(s)):
                assert v[j] == (0.0 if a[j] != 0.0 else max(s[j], 0.0)), (s, a, v)
        # optimality: the brute force over supports for small groups, a KKT certificate for all
        if len(s) <= 8:
            want, _ = ref.brute_force_qp_floats(s, a)
            assert max(abs(x - y) for x, y in zip(v, want, strict=True)) <= 1e-9, (s, a, v, want)
            n_brute += 1
        assert _kkt_optimal(s, a, v), (s, a, v)
    assert n_brute >= 800
    assert min(kinds_seen.values()) >= 100, kinds_seen
