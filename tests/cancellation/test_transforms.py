"""Tests of cancellation.transforms (DFPO App. B): vectorised == plain per-group loop, and the paper's
properties of each transform (eq. 18, KKT of eq. 51, eq. 55, Theorem K.1, eq. 96)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from cancellation.transforms import (
    ABLATIONS,
    TRANSFORMS,
    get_transform,
    min_replace,
    orth_proj,
    orth_proj_pos,
    scale_half,
    truncate_rebalance,
)

from . import reference as ref

#: Every comparison here is between two code paths in float64, at a tolerance well above its
#: rounding (library vs plain loops and the KKT conditions): ``tests/exactness.py``.
pytestmark = pytest.mark.exactness

NAMES = ["min_replace", "orth_proj", "orth_proj_pos", "truncate_rebalance"]


def _zero_sum(rng: random.Random, g: int) -> list[float]:
    a = [rng.gauss(0.0, 1.0) for _ in range(g)]
    mu = sum(a) / g
    return [x - mu for x in a]


def _batch(seed: int, max_g: int = 9) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Shuffled, unequal groups (non-contiguous ids) of positive weights and zero-sum advantages, plus
    a one-sided group, an all-zero group, a group of one and a group with some Â = 0."""
    rng = random.Random(seed)
    ws: list[float] = []
    advs: list[float] = []
    gids: list[int] = []
    ids = [17, 3, 42, 8, 250, 61, 9]
    for k, gid in enumerate(ids):
        g = rng.randint(2, max_g)
        if k == 0:
            a = [abs(rng.gauss(0, 1)) for _ in range(g)]  # one-sided (all ≥ 0)
        elif k == 1:
            a = [0.0] * g  # all-zero advantages
        elif k == 2:
            g, a = 1, [0.0]  # a group of one
        elif k == 3:
            a = _zero_sum(rng, g)
            a[0] = 0.0  # some Â = 0 (no longer zero-sum: transforms must not assume it)
        else:
            a = _zero_sum(rng, g)
        ws += [math.exp(rng.gauss(0.0, 0.3)) for _ in range(g)]
        advs += a
        gids += [gid] * g
    order = list(range(len(ws)))
    rng.shuffle(order)
    w = torch.tensor([ws[i] for i in order], dtype=torch.float64)
    a = torch.tensor([advs[i] for i in order], dtype=torch.float64)
    group = torch.tensor([gids[i] for i in order])
    return w, a, group


def test_registry() -> None:
    assert sorted(TRANSFORMS) == sorted(NAMES)
    for name in NAMES:
        assert get_transform(name) is TRANSFORMS[name]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", range(5))
def test_vectorised_equals_per_group_loop(name: str, seed: int) -> None:
    w, a, group = _batch(seed)
    got = get_transform(name)(w, a, group)
    want = ref.REF_TRANSFORMS[name](w, a, group)
    assert got.shape == w.shape
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_gradient_through_transform_equals_loop(name: str) -> None:
    """Without stop-gradient (Table 3's ablation) the objective differentiates through the transform."""
    w, a, group = _batch(3)
    x = w.clone().requires_grad_(True)
    y = w.clone().requires_grad_(True)
    probe = torch.linspace(-1.0, 2.0, w.shape[0], dtype=torch.float64)
    (g1,) = torch.autograd.grad((get_transform(name)(x, a, group) * probe).sum(), x)
    (g2,) = torch.autograd.grad((ref.REF_TRANSFORMS[name](y, a, group) * probe).sum(), y)
    torch.testing.assert_close(g1, g2, rtol=1e-9, atol=1e-9)


# ------------------------------------------------------------------------------------------------
# orth_proj


def test_orth_proj_eq18_by_hand() -> None:
    # w = (1, 2, 3), Â = (1, 0, −1): Âᵀw = −2, ‖Â‖² = 2, s̃ = w + Â = (2, 2, 2)
    # second group: w = (1, 4), Â = (1, −1): Âᵀw = −3, ‖Â‖² = 2, s̃ = w + 1.5·Â = (2.5, 2.5)
    w = torch.tensor([1.0, 1.0, 2.0, 4.0, 3.0], dtype=torch.float64)
    a = torch.tensor([1.0, 1.0, 0.0, -1.0, -1.0], dtype=torch.float64)
    group = torch.tensor([5, 9, 5, 9, 5])
    got = orth_proj(w, a, group)
    torch.testing.assert_close(got, torch.tensor([2.0, 2.5, 2.0, 2.5, 2.0], dtype=torch.float64))


@pytest.mark.parametrize("seed", range(5))
def test_orth_proj_is_orthogonal_per_group(seed: int) -> None:
    w, a, group = _batch(seed)
    out = orth_proj(w, a, group)
    for idx in ref.groups_of(group).values():
        assert abs(sum(float(a[i] * out[i]) for i in idx)) < 1e-12
        if all(float(a[i]) == 0 for i in idx):
            assert all(float(out[i]) == float(w[i]) for i in idx)


# ------------------------------------------------------------------------------------------------
# orth_proj_pos: the exact QP of eq. (51)


def _kkt_check(s: list[float], a: list[float], v: list[float], tol: float = 1e-9) -> None:
    """KKT of eq. (51): v ≥ 0, Âᵀv = 0, v − s + λÂ − μ = 0 with μ ≥ 0 and μ·v = 0 for some λ."""
    g = len(s)
    assert min(v) >= -tol
    assert abs(sum(ai * vi for ai, vi in zip(a, v, strict=True))) <= tol
    active = [j for j in range(g) if v[j] > tol]
    n2 = sum(a[j] ** 2 for j in active)
    if n2 > 0:
        # least squares for λ on the active set, where v_j = s_j − λÂ_j
        lam = sum(a[j] * (s[j] - v[j]) for j in active) / n2
    else:
        # λ is not pinned by the active set: take the smallest value that keeps μ ≥ 0 on the inactive set
        lows = [s[j] / a[j] for j in range(g) if a[j] > 0 and j not in active]
        highs = [s[j] / a[j] for j in range(g) if a[j] < 0 and j not in active]
        lam = max(lows) if lows else (min(highs) if highs else 0.0)
        if lows and highs:
            assert max(lows) <= min(highs) + tol
    mu = [v[j] - s[j] + lam * a[j] for j in range(g)]
    for j in range(g):
        assert mu[j] >= -tol, (j, mu[j])
        assert abs(mu[j] * v[j]) <= tol, (j, mu[j], v[j])
        assert abs(v[j] - max(s[j] - lam * a[j], 0.0)) <= tol  # v = max(s − λÂ, 0)


def _random_qp_groups(seed: int, max_g: int) -> list[tuple[list[float], list[float]]]:
    rng = random.Random(seed)
    out = []
    for k in range(40):
        g = rng.randint(2, max_g)
        s = [rng.uniform(0.0, 3.0) for _ in range(g)]
        if k % 10 == 0:
            a = [abs(rng.gauss(0, 1)) for _ in range(g)]  # one-sided, positive
        elif k % 10 == 1:
            a = [-abs(rng.gauss(0, 1)) for _ in range(g)]  # one-sided, negative
        elif k % 10 == 2:
            a = [0.0] * g  # all zero
        else:
            a = _zero_sum(rng, g)
            if k % 10 == 3:
                for j in rng.sample(range(g), max(1, g // 3)):
                    a[j] = 0.0  # some Â = 0
            if k % 10 == 4:
                s[rng.randrange(g)] = 0.0
            if k % 10 == 5:
                a = [rng.choice([-1.0, 1.0]) * rng.randint(1, 3) for _ in range(g)]  # integer, ties in s/Â
                s = [float(rng.randint(0, 3)) for _ in range(g)]
        out.append((s, a))
    return out


def _solve_batched(groups: list[tuple[list[float], list[float]]]) -> list[list[float]]:
    ws, advs, gids = [], [], []
    for k, (s, a) in enumerate(groups):
        ws += s
        advs += a
        gids += [1000 - 7 * k] * len(s)
    order = list(range(len(ws)))
    random.Random(0).shuffle(order)
    w = torch.tensor([ws[i] for i in order], dtype=torch.float64)
    a = torch.tensor([advs[i] for i in order], dtype=torch.float64)
    group = torch.tensor([gids[i] for i in order])
    out = orth_proj_pos(w, a, group)
    flat = [0.0] * len(ws)
    for pos, i in enumerate(order):
        flat[i] = float(out[pos])
    res, start = [], 0
    for s, _ in groups:
        res.append(flat[start : start + len(s)])
        start += len(s)
    return res


@pytest.mark.parametrize("seed", range(3))
def test_orth_proj_pos_kkt(seed: int) -> None:
    groups = _random_qp_groups(seed, max_g=16)
    for (s, a), v in zip(groups, _solve_batched(groups), strict=True):
        _kkt_check(s, a, v)


@pytest.mark.parametrize("seed", range(3))
def test_orth_proj_pos_matches_brute_force(seed: int) -> None:
    groups = _random_qp_groups(100 + seed, max_g=10)
    for (s, a), v in zip(groups, _solve_batched(groups), strict=True):
        want, _ = ref.brute_force_qp_floats(s, a)
        assert max(abs(x - y) for x, y in zip(v, want, strict=True)) <= 1e-9, (s, a, v, want)


def test_orth_proj_pos_hand_worked() -> None:
    # s = (1, 3), Â = (1, −1): the plain projection (2, 2) is already ≥ 0
    # s = (3, 0.2), Â = (1, −1): plain projection (1.6, 1.6)
    # s = (2, 1, 0.5), Â = (2, −1, −1): λ = (4 − 1.5)/6; v = (2 − 2λ, 1 + λ, 0.5 + λ), all > 0
    # s = (1, 2), Â = (1, 0.5) (one-sided): v = (0, 0); s = (1, 2), Â = (0, 0): v = s
    lam = 2.5 / 6
    w = [1.0, 3.0, 3.0, 0.2, 2.0, 1.0, 0.5, 1.0, 2.0, 1.0, 2.0]
    a = [1.0, -1.0, 1.0, -1.0, 2.0, -1.0, -1.0, 1.0, 0.5, 0.0, 0.0]
    g = [0, 0, 1, 1, 2, 2, 2, 3, 3, 4, 4]
    got = orth_proj_pos(
        torch.tensor(w, dtype=torch.float64), torch.tensor(a, dtype=torch.float64), torch.tensor(g)
    )
    want = [2.0, 2.0, 1.6, 1.6, 2 - 2 * lam, 1 + lam, 0.5 + lam, 0.0, 0.0, 1.0, 2.0]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_orth_proj_pos_where_plain_projection_goes_negative() -> None:
    # s = (0.1, 5, 0.1), Â = (1, 1, −2): eq. (18) gives s̃_0 = 0.1 − 4.9/6 < 0. The QP puts v_0 = 0 and
    # projects on the support {1, 2}: λ = (5·1 + 0.1·(−2)) / (1 + 4) = 0.96, v = (0, 5 − 0.96, 0.1 + 1.92);
    # KKT: μ_0 = 0 − 0.1 + 0.96·1 = 0.86 ≥ 0.
    s, a = [0.1, 5.0, 0.1], [1.0, 1.0, -2.0]
    (v,) = _solve_batched([(s, a)])
    assert max(abs(x - y) for x, y in zip(v, [0.0, 4.04, 2.02], strict=True)) <= 1e-12
    _kkt_check(s, a, v)
    assert float(orth_proj(torch.tensor(s), torch.tensor(a), torch.zeros(3, dtype=torch.long))[0]) < 0


# ------------------------------------------------------------------------------------------------
# truncate_rebalance: eq. (52)-(55)


@pytest.mark.parametrize("seed", range(5))
def test_truncate_rebalance_properties(seed: int) -> None:
    rng = random.Random(seed)
    floor = 1e-3
    for _ in range(30):
        g = rng.randint(2, 12)
        s = [rng.choice([rng.uniform(0.0, 2e-3), rng.uniform(0.0, 3.0)]) for _ in range(g)]
        kind = rng.random()
        if kind < 0.2:
            a = [abs(rng.gauss(0, 1)) for _ in range(g)]
            a[0] = 0.0
        elif kind < 0.4:
            a = [-abs(rng.gauss(0, 1)) for _ in range(g)]
        else:
            a = _zero_sum(rng, g)
            a[rng.randrange(g)] = 0.0
        w = torch.tensor(s, dtype=torch.float64)
        adv = torch.tensor(a, dtype=torch.float64)
        out = truncate_rebalance(w, adv, torch.zeros(g, dtype=torch.long), floor=floor).tolist()
        s_plus = [max(x, floor) for x in s]  # eq. (52)
        pos = [j for j in range(g) if a[j] > 0]
        neg = [j for j in range(g) if a[j] < 0]
        # Σ Â s̃ = 0 afterwards
        assert abs(sum(a[j] * out[j] for j in range(g))) <= 1e-12
        # Â = 0 completions keep s⁺
        for j in range(g):
            if a[j] == 0:
                assert out[j] == s_plus[j]
        if pos and neg:
            alpha = [out[j] / s_plus[j] for j in pos]
            beta = [out[j] / s_plus[j] for j in neg]
            # one common factor per side, one side unscaled (factor 1), both in (0, 1] (eq. 55)
            assert max(alpha) - min(alpha) <= 1e-12 and max(beta) - min(beta) <= 1e-12
            assert 0 < alpha[0] <= 1 + 1e-15 and 0 < beta[0] <= 1 + 1e-15
            assert alpha[0] == 1.0 or beta[0] == 1.0
            unscaled = pos if alpha[0] == 1.0 else neg
            assert all(out[j] >= floor for j in unscaled)
            # the factor is eq. (55)'s closed form
            p = sum(a[j] * s_plus[j] for j in pos)
            n = sum(-a[j] * s_plus[j] for j in neg)
            if p > n:
                assert alpha[0] == pytest.approx(n / p, rel=1e-12)
            elif n > p:
                assert beta[0] == pytest.approx(p / n, rel=1e-12)
        else:
            # one-sided: the only way to Σ Â s̃ = 0 is to scale that side to 0
            for j in pos + neg:
                assert out[j] == 0.0


def test_truncate_rebalance_hand_worked() -> None:
    # s = (2, 1, 0), Â = (1, −1, −1), floor 0.5: s⁺ = (2, 1, 0.5), δ = 2 − 1.5 = 0.5 > 0, α = 1.5/2
    out = truncate_rebalance(
        torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64),
        torch.tensor([1.0, -1.0, -1.0], dtype=torch.float64),
        torch.tensor([4, 4, 4]),
        floor=0.5,
    )
    torch.testing.assert_close(out, torch.tensor([1.5, 1.0, 0.5], dtype=torch.float64))


# ------------------------------------------------------------------------------------------------
# min_replace: Theorem K.1 and eq. (96)


@pytest.mark.parametrize("seed", range(5))
def test_min_replace_sign_preservation(seed: int) -> None:
    def sign(x: float) -> int:
        return (x > 0) - (x < 0)

    """Theorem K.1 eq. (89): sign(Â s̃) = sign(Â s̄) = sign(Â) for s̄ > 0."""
    w, a, group = _batch(seed)
    out = min_replace(w, a, group)
    for i in range(w.shape[0]):
        assert float(out[i]) > 0
        assert sign(float(a[i] * out[i])) == sign(float(a[i] * w[i])) == sign(float(a[i]))
    for idx in ref.groups_of(group).values():
        assert {float(out[i]) for i in idx} == {min(float(w[i]) for i in idx)}


@pytest.mark.parametrize("delta", [1e-3, 0.05, 0.3, 1.0])
def test_min_replace_shrinkage_bound(delta: float) -> None:
    """Eq. (96): |log s̄_i| ≤ δ for all i ⇒ φ_i = s̃_i / s̄_i ∈ [e^{−2δ}, 1]."""
    rng = random.Random(int(delta * 1000))
    ws, gids = [], []
    for k in range(30):
        g = rng.randint(1, 10)
        ws += [math.exp(rng.uniform(-delta, delta)) for _ in range(g)]
        gids += [3 * k + 1] * g
    w = torch.tensor(ws, dtype=torch.float64)
    group = torch.tensor(gids)
    phi = min_replace(w, torch.zeros_like(w), group) / w
    assert float(phi.max()) <= 1.0
    assert float(phi.min()) >= math.exp(-2 * delta) * (1 - 1e-15)


# ------------------------------------------------------------------------------------------------
# Table 3's "DFPO (scale by 0.5)" ablation


@pytest.mark.parametrize("seed", range(3))
def test_scale_half_is_half_the_weights(seed: int) -> None:
    """Table 3: s̃_i = 0.5·s̄_i for every row, whatever the group and its advantages."""
    w, a, group = _batch(seed)
    out = scale_half(w, a, group)
    assert out.tolist() == [0.5 * x for x in w.tolist()]  # exact: a power-of-two scaling
    # a global scaling keeps the spread: Σ Â s̃ = 0.5·Σ Â s̄ per group (not 0, unlike the four transforms)
    for idx in ref.groups_of(group).values():
        want = 0.5 * sum(float(a[i] * w[i]) for i in idx)
        assert sum(float(a[i] * out[i]) for i in idx) == pytest.approx(want, abs=1e-15)


def test_scale_half_is_an_ablation_resolved_by_name() -> None:
    assert get_transform("scale_half") is scale_half is ABLATIONS["scale_half"]
    assert "scale_half" not in TRANSFORMS  # DFPO's transforms are the four that make Σ Â s̃ = 0
    with pytest.raises(ValueError, match=r"weights.*shape"):
        scale_half(torch.ones(3)[:, None], torch.zeros(3), torch.zeros(3, dtype=torch.long))


def test_dfpo_scale_half_is_the_eq86_control_at_half_the_step() -> None:
    """Under the paper's estimator DFPO with s̃ = 0.5·s̄ has exactly half GSPO eq. (86)'s gradient."""
    from cancellation import compute_loss

    gen = torch.Generator().manual_seed(3)
    old = -torch.rand(6, 4, generator=gen, dtype=torch.float64)
    logp = (old + 0.01 * torch.randn(6, 4, generator=gen, dtype=torch.float64)).requires_grad_()
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.2, -0.2], dtype=torch.float64)
    mask = torch.ones(6, 4, dtype=torch.float64)
    group = torch.tensor([0, 0, 0, 1, 1, 1])
    eps = {"epsilon_low": 3e-4, "epsilon_high": 4e-4}
    (g_half,) = torch.autograd.grad(
        compute_loss("dfpo", logp, old, adv, mask, group, transform="scale_half", **eps)[0], logp
    )
    (g_ctrl,) = torch.autograd.grad(
        compute_loss("gspo", logp, old, adv, mask, group, estimator="paper", **eps)[0], logp
    )
    assert torch.allclose(g_half, 0.5 * g_ctrl, rtol=0, atol=1e-15)
    assert float(g_ctrl.abs().max()) > 0


# ------------------------------------------------------------------------------------------------
# errors


def test_unknown_transform_lists_valid_ones() -> None:
    with pytest.raises(
        ValueError, match=r"unknown transform 'orth'.*min_replace.*orth_proj_pos.*truncate_rebalance"
    ):
        get_transform("orth")


@pytest.mark.parametrize("name", NAMES)
def test_transform_input_errors(name: str) -> None:
    fn = get_transform(name)
    w, a, g = torch.ones(3), torch.tensor([1.0, -1.0, 0.0]), torch.tensor([0, 0, 1])
    with pytest.raises(ValueError, match=r"advantages.*B=3"):
        fn(w, a[:2], g)
    with pytest.raises(ValueError, match=r"weights.*shape"):
        fn(w[:, None], a, g)
    with pytest.raises(TypeError, match=r"group.*integer"):
        fn(w, a, g.double())
    with pytest.raises(ValueError, match=r"advantages.*NaN"):
        fn(w, torch.tensor([1.0, float("nan"), 0.0]), g)
