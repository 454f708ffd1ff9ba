"""Tests of cancellation.advantages against plain per-group loops (reference.py) and hand-worked cases."""

from __future__ import annotations

import math
import random

import pytest
import torch

from cancellation.advantages import group_advantages, reweight_advantages
from tests.exactness import rounding_tolerance

from . import reference as ref

#: Every comparison here is between two code paths in float64, at a tolerance well above its
#: rounding (library vs plain per-group loops): ``tests/exactness.py``.
pytestmark = pytest.mark.exactness


def _shuffled_groups(seed: int, ids: tuple[int, ...] = (17, 3, 42, 8, 101, 5)) -> list[int]:
    """Unequal groups (sizes 1..9) with non-contiguous ids, shuffled through the batch."""
    rng = random.Random(seed)
    group = []
    for gid in ids:
        group += [gid] * rng.randint(1, 9)
    rng.shuffle(group)
    return group


def _rewards(seed: int, n: int, kind: str) -> list[float]:
    rng = random.Random(seed)
    if kind == "binary":
        return [float(rng.random() < 0.5) for _ in range(n)]
    return [rng.uniform(-2.0, 3.0) for _ in range(n)]


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("kind", ["uniform", "binary"])
@pytest.mark.parametrize("seed", range(4))
def test_group_advantages_equals_plain_loop(scale: str, kind: str, seed: int) -> None:
    group = _shuffled_groups(seed)
    rewards = _rewards(seed, len(group), kind)
    got = group_advantages(torch.tensor(rewards, dtype=torch.float64), torch.tensor(group), scale=scale)
    want = ref.group_advantages_floats(rewards, group, scale=scale, eps=1e-6)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    # each group's advantages sum to zero
    for idx in ref.groups_of(group).values():
        assert abs(sum(float(got[i]) for i in idx)) <= 1e-9 * max(1.0, max(abs(float(got[i])) for i in idx))


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_group_advantages_population_std_and_eps(scale: str) -> None:
    group = _shuffled_groups(11)
    rewards = _rewards(11, len(group), "uniform")
    got = group_advantages(
        torch.tensor(rewards, dtype=torch.float64), torch.tensor(group), scale=scale, eps=1e-4, unbiased=False
    )
    want = ref.group_advantages_floats(rewards, group, scale=scale, eps=1e-4, unbiased=False)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_group_advantages_hand_worked() -> None:
    # group 7: rewards (1, 0, 0, 1): mean 0.5, Bessel std sqrt(1/3); group 2: (2, 4): mean 3, std sqrt(2)
    rewards = torch.tensor([1.0, 2.0, 0.0, 4.0, 0.0, 1.0], dtype=torch.float64)
    group = torch.tensor([7, 2, 7, 2, 7, 7])
    got = group_advantages(rewards, group, eps=0.0)
    a = 0.5 / math.sqrt(1.0 / 3.0)
    b = 1.0 / math.sqrt(2.0)
    torch.testing.assert_close(got, torch.tensor([a, -b, -a, b, -a, a], dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_constant_groups_and_singletons_are_exactly_zero(dtype: torch.dtype, scale: str) -> None:
    # rounding of the mean of 7 copies of 0.9 in float32 is not exact: the advantage must still be 0
    values = [0.9] * 7 + [0.1] * 3 + [123.456] * 5 + [2.0] + [0.0, 1.0]
    group = [1] * 7 + [2] * 3 + [3] * 5 + [4] + [5, 5]
    order = list(range(len(values)))
    random.Random(0).shuffle(order)
    rewards = torch.tensor([values[i] for i in order], dtype=dtype)
    gid = torch.tensor([group[i] for i in order])
    got = group_advantages(rewards, gid, scale=scale)
    assert not torch.isnan(got).any()
    for i in range(len(order)):
        if group[order[i]] != 5:
            assert float(got[i]) == 0.0, (values[order[i]], group[order[i]], float(got[i]))
    # the two-row group's advantages cancel up to the rounding of their sum, in float32 as in float64
    pair = got[gid == 5]
    assert float(pair.sum().abs()) <= rounding_tolerance(float(pair.abs().sum()), 2, dtype)
    # all rewards identical, batch std 0: still exactly zero
    flat = group_advantages(torch.full((6,), 0.7, dtype=dtype), torch.tensor([0, 0, 0, 1, 1, 2]), scale=scale)
    assert torch.equal(flat, torch.zeros(6, dtype=dtype))


def test_group_advantages_integer_rewards_become_float() -> None:
    got = group_advantages(torch.tensor([1, 0, 1, 1]), torch.tensor([0, 0, 1, 1]), scale="none")
    assert got.is_floating_point()
    torch.testing.assert_close(got, torch.tensor([0.5, -0.5, 0.0, 0.0]))


@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.3, 1.0])
def test_reweight_advantages_equals_loop_1d(alpha: float) -> None:
    gen = torch.Generator().manual_seed(0)
    adv = torch.randn(5, generator=gen, dtype=torch.float64)
    old = -torch.rand(5, 7, generator=gen, dtype=torch.float64) * 4
    got = reweight_advantages(adv, old, alpha)
    want = ref.reweight_floats(adv.tolist(), old.tolist(), alpha)
    assert got.shape == (5, 7)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_reweight_advantages_equals_loop_2d(alpha: float) -> None:
    gen = torch.Generator().manual_seed(1)
    adv = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    old = -torch.rand(4, 6, generator=gen, dtype=torch.float64) * 4
    got = reweight_advantages(adv, old, alpha)
    want = ref.reweight_floats(adv.tolist(), old.tolist(), alpha)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-14, atol=1e-14)


def test_reweight_advantages_hand_worked() -> None:
    # π_old = 0.5, α = 0.2: factor 0.2·0.5 + 0.8 = 0.9; π_old = 1: factor 1 (both signs alike)
    got = reweight_advantages(
        torch.tensor([2.0, -1.0], dtype=torch.float64),
        torch.log(torch.tensor([[0.5, 1.0], [0.5, 1.0]])).double(),
        0.2,
    )
    torch.testing.assert_close(got, torch.tensor([[1.8, 2.0], [-0.9, -1.0]], dtype=torch.float64))


@pytest.mark.parametrize("alpha", [-0.1, 1.5])
def test_reweight_alpha_out_of_range(alpha: float) -> None:
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\]"):
        reweight_advantages(torch.zeros(2), torch.zeros(2, 3), alpha)


def test_reweight_shape_errors() -> None:
    with pytest.raises(ValueError, match="advantages"):
        reweight_advantages(torch.zeros(3), torch.zeros(2, 3), 0.2)
    with pytest.raises(ValueError, match="advantages"):
        reweight_advantages(torch.zeros(2, 4), torch.zeros(2, 3), 0.2)
    with pytest.raises(ValueError, match="old_logp"):
        reweight_advantages(torch.zeros(2), torch.zeros(2), 0.2)


def test_group_advantages_errors() -> None:
    g = torch.tensor([0, 0, 1])
    with pytest.raises(ValueError, match=r"rewards.*NaN"):
        group_advantages(torch.tensor([1.0, float("nan"), 0.0]), g)
    with pytest.raises(ValueError, match=r"rewards.*shape"):
        group_advantages(torch.zeros(3, 1), g)
    with pytest.raises(ValueError, match=r"group.*B=4"):
        group_advantages(torch.zeros(4), g)
    with pytest.raises(TypeError, match=r"group.*integer"):
        group_advantages(torch.zeros(3), torch.tensor([0.0, 0.0, 1.0]))
    with pytest.raises(TypeError, match=r"group.*integer"):
        group_advantages(torch.zeros(3), torch.tensor([True, False, True]))
    with pytest.raises(ValueError, match=r"unknown scale 'std'.*group, batch, none"):
        group_advantages(torch.zeros(3), g, scale="std")
    with pytest.raises(TypeError, match=r"rewards.*torch.Tensor"):
        group_advantages([1.0, 0.0, 1.0], g)  # type: ignore[arg-type]


def _valid_loop(rewards: list[float], group: list[int], valid: list[bool], scale: str) -> list[float]:
    """Advantages over the valid rows only, with a plain loop: invalid rows 0, groups of < 2 valid rows 0."""
    out = [0.0] * len(rewards)
    kept = [r for r, v in zip(rewards, valid, strict=True) if v]
    if scale == "batch" and len(kept) > 1:
        mu_b = sum(kept) / len(kept)
        batch_std = math.sqrt(sum((r - mu_b) ** 2 for r in kept) / (len(kept) - 1))
    else:
        batch_std = 0.0
    for gid in dict.fromkeys(group):
        idx = [i for i, g in enumerate(group) if g == gid and valid[i]]
        vals = [rewards[i] for i in idx]
        if len(idx) < 2 or max(vals) == min(vals):
            continue
        mu = sum(vals) / len(vals)
        if scale == "group":
            denom = math.sqrt(sum((v - mu) ** 2 for v in vals) / (len(vals) - 1)) + 1e-6
        elif scale == "batch":
            denom = batch_std + 1e-6
        else:
            denom = 1.0
        for i in idx:
            out[i] = (rewards[i] - mu) / denom
    return out


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("seed", range(4))
def test_group_advantages_valid_rows_equal_plain_loop(scale: str, seed: int) -> None:
    """Truncated (invalid) rows: advantage 0, out of their group's mean and std; Σ Â = 0 over valid rows."""
    group = _shuffled_groups(seed)
    rewards = _rewards(seed, len(group), "uniform")
    rng = random.Random(100 + seed)
    valid = [rng.random() < 0.6 for _ in group]
    got = group_advantages(
        torch.tensor(rewards, dtype=torch.float64),
        torch.tensor(group),
        scale=scale,
        valid=torch.tensor(valid),
    )
    want = _valid_loop(rewards, group, valid, scale)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert all(float(got[i]) == 0.0 for i, v in enumerate(valid) if not v)
    for gid in set(group):
        idx = [i for i, g in enumerate(group) if g == gid and valid[i]]
        assert abs(sum(float(got[i]) for i in idx)) <= 1e-9
    # some group is left with < 2 valid rows (all 0) and some is not (the case is exercised)
    sizes = [sum(1 for i, g in enumerate(group) if g == gid and valid[i]) for gid in set(group)]
    assert min(sizes) < 2 <= max(sizes)


def test_group_advantages_valid_edge_cases() -> None:
    g = torch.tensor([0, 0, 0, 1, 1])
    # float64: the all-valid path and the plain one, and the closed form, agree far below float64's 1e-7
    r = torch.tensor([1.0, 0.0, 5.0, 1.0, 0.0], dtype=torch.float64)
    # all valid: the plain call; none valid: all zeros
    torch.testing.assert_close(
        group_advantages(r, g, valid=torch.ones(5, dtype=torch.bool)),
        group_advantages(r, g),
        rtol=1e-12,
        atol=0,
    )
    got0 = group_advantages(r, g, valid=torch.zeros(5, dtype=torch.bool))
    assert torch.equal(got0, torch.zeros(5, dtype=torch.float64))
    # the 5.0 row truncated: group 0 is (1, 0) → ±1/(sqrt(1/2)+eps); group 1 keeps one row → 0
    got = group_advantages(r, g, valid=torch.tensor([True, True, False, True, False]))
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(
        got, torch.tensor([a, -a, 0.0, 0.0, 0.0], dtype=torch.float64), rtol=1e-12, atol=0
    )
    with pytest.raises(TypeError, match="`valid`"):
        group_advantages(r, g, valid=torch.ones(5))
    with pytest.raises(ValueError, match="`valid`"):
        group_advantages(r, g, valid=torch.ones(4, dtype=torch.bool))
