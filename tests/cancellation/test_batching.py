"""Tests of cancellation.batching: checked against plain loops, brute force and hand-worked cases."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from cancellation.batching import (
    SPLIT_MODES,
    lopti_masks,
    query_preserved_split,
    random_split,
    reward_balanced_select,
    split_minibatches,
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _assert_partition(parts: list[torch.Tensor], batch_size: int) -> None:
    for p in parts:
        assert p.dtype == torch.long
        assert p.tolist() == sorted(p.tolist())
    flat = sorted(i for p in parts for i in p.tolist())
    assert flat == list(range(batch_size))


# --------------------------------------------------------------------------------------------
# random_split


@pytest.mark.parametrize(("b", "k"), [(1, 1), (7, 3), (8, 4), (10, 10), (13, 5)])
def test_random_split_partitions_with_balanced_sizes(b: int, k: int) -> None:
    parts = random_split(b, k, _gen(0))
    assert len(parts) == k
    _assert_partition(parts, b)
    sizes = [p.numel() for p in parts]
    assert max(sizes) - min(sizes) <= 1
    # the sizes of an even cut: b // k each, the first b % k one larger
    assert sorted(sizes, reverse=True) == [b // k + (1 if i < b % k else 0) for i in range(k)]


def test_random_split_is_reproducible_and_uniform() -> None:
    assert [p.tolist() for p in random_split(9, 3, _gen(5))] == [
        p.tolist() for p in random_split(9, 3, _gen(5))
    ]
    # every index falls in mini-batch 0 with probability 1/3 (a uniform random permutation)
    g = _gen(1)
    draws = 1500
    hits = torch.zeros(6)
    for _ in range(draws):
        hits[random_split(6, 3, g)[0]] += 1
    freq = hits / draws
    # binomial std of a frequency: sqrt(p(1-p)/n) ≈ 0.012; 5 std of slack
    assert torch.allclose(freq, torch.full((6,), 1 / 3), atol=0.06)


def test_random_split_bad_input() -> None:
    with pytest.raises(ValueError, match="num_minibatches"):
        random_split(4, 0)
    with pytest.raises(ValueError, match="more than the 4 completions"):
        random_split(4, 5)
    with pytest.raises(ValueError, match="batch_size"):
        random_split(0, 1)
    with pytest.raises(TypeError, match="batch_size"):
        random_split(4.0, 2)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# query_preserved_split


def _plain_lpt(group: list[int], k: int, seed: int) -> list[list[int]]:
    """The documented algorithm as a plain loop: shuffle, stable sort by size (desc), smallest bin."""
    ids = sorted(set(group))
    sizes = [group.count(g) for g in ids]
    shuffled = torch.randperm(len(ids), generator=_gen(seed)).tolist()
    order = sorted(shuffled, key=lambda g: -sizes[g])  # Python's sort is stable
    load = [0] * k
    bins: list[list[int]] = [[] for _ in range(k)]
    for g in order:
        j = load.index(min(load))
        load[j] += sizes[g]
        bins[j].extend(i for i, x in enumerate(group) if x == ids[g])
    return [sorted(b) for b in bins]


def test_query_preserved_split_matches_plain_loop_and_keeps_groups_whole() -> None:
    rng = random.Random(0)
    for trial in range(60):
        n_groups = rng.randint(1, 9)
        group = [g * 7 - 3 for g in range(n_groups) for _ in range(rng.randint(1, 5))]
        rng.shuffle(group)
        k = rng.randint(1, n_groups)
        parts = query_preserved_split(torch.tensor(group), k, _gen(trial))
        assert [p.tolist() for p in parts] == _plain_lpt(group, k, trial)
        _assert_partition(parts, len(group))
        # every group in exactly one mini-batch
        for gid in set(group):
            homes = [j for j, p in enumerate(parts) if any(group[i] == gid for i in p.tolist())]
            assert len(homes) == 1
        sizes = [p.numel() for p in parts]
        largest = max(group.count(g) for g in set(group))
        assert max(sizes) - min(sizes) <= largest


def test_query_preserved_split_equal_groups_give_equal_sizes() -> None:
    # 12 groups of 8 into 4 mini-batches: 3 groups (24 completions) each
    group = torch.arange(12).repeat_interleave(8)
    for seed in range(5):
        parts = query_preserved_split(group, 4, _gen(seed))
        assert [p.numel() for p in parts] == [24, 24, 24, 24]
        assert [len(set(group[p].tolist())) for p in parts] == [3, 3, 3, 3]


def test_query_preserved_split_hand_worked_lpt() -> None:
    # sizes 3, 3, 2, 2, 2 into 2: 3→A, 3→B, 2→A (5), 2→B (5), 2→A (7): sizes {7, 5}
    group = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 4])
    parts = query_preserved_split(group, 2, _gen(3))
    assert sorted(p.numel() for p in parts) == [5, 7]


def test_split_minibatches_dispatches() -> None:
    group = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    q = split_minibatches(group, 2, "query", _gen(4))
    assert [p.tolist() for p in q] == [p.tolist() for p in query_preserved_split(group, 2, _gen(4))]
    r = split_minibatches(group, 3, "random", _gen(4))
    assert [p.tolist() for p in r] == [p.tolist() for p in random_split(8, 3, _gen(4))]
    assert set(SPLIT_MODES) == {"query", "random"}


def test_split_bad_input() -> None:
    group = torch.tensor([0, 0, 1, 1, 2])
    with pytest.raises(ValueError, match="valid: query, random"):
        split_minibatches(group, 2, "by_token")
    with pytest.raises(ValueError, match="more than the 3 groups"):
        query_preserved_split(group, 4)
    with pytest.raises(ValueError, match="num_minibatches"):
        query_preserved_split(group, 0)
    with pytest.raises(TypeError, match="integer prompt ids"):
        query_preserved_split(group.float(), 2)
    with pytest.raises(ValueError, match=r"shape \(B,\)"):
        query_preserved_split(group[None, :], 2)


# --------------------------------------------------------------------------------------------
# reward_balanced_select


def _fractions(adv: list[float], idx: list[int]) -> tuple[float, float]:
    n = len(idx)
    return sum(adv[i] > 0 for i in idx) / n, sum(adv[i] < 0 for i in idx) / n


def _plain_greedy(adv: list[float], group: list[int], rho: float, k: int) -> list[int] | None:
    ages: list[int] = []
    for g in group:
        if g not in ages:
            ages.append(g)  # buffer order
    if len(ages) < k:
        return None
    members = {g: [i for i, x in enumerate(group) if x == g] for g in ages}
    chosen: list[int] = []
    for _ in range(k):
        best, best_val = None, -1
        for g in ages:
            if g in chosen:
                continue
            idx = [i for c in [*chosen, g] for i in members[c]]
            val = min(sum(adv[i] > 0 for i in idx), sum(adv[i] < 0 for i in idx))
            if val > best_val:  # strict: ties keep the older group
                best, best_val = g, val
        chosen.append(best)
    idx = sorted(i for c in chosen for i in members[c])
    p, n = _fractions(adv, idx)
    return idx if (p >= rho and n >= rho) else None


def test_reward_balanced_select_against_brute_force() -> None:
    rng = random.Random(1)
    rhos = [0.0, 0.1, 0.2, 0.25, 0.3, 1 / 3, 0.4, 0.5]
    n_feasible = n_found = 0
    for _ in range(400):
        n_groups = rng.randint(1, 6)
        ids = rng.sample(range(100), n_groups)
        group: list[int] = []
        adv: list[float] = []
        for g in ids:
            for _ in range(rng.randint(1, 4)):
                group.append(g)
                adv.append(rng.choice([-1.0, -0.5, 0.0, 0.0, 0.7, 1.0]))
        k = rng.randint(1, n_groups + 1)
        rho = rng.choice(rhos)
        got = reward_balanced_select(torch.tensor(adv), torch.tensor(group), rho, k)
        expected = _plain_greedy(adv, group, rho, k)
        assert (got.tolist() if got is not None else None) == expected
        feasible = []
        for subset in itertools.combinations(ids, k):
            idx = [i for i, x in enumerate(group) if x in subset]
            p, n = _fractions(adv, idx)
            if p >= rho and n >= rho:
                feasible.append(sorted(idx))
        if got is not None:
            assert got.dtype == torch.long
            idx = got.tolist()
            # whole groups, exactly k of them, satisfying the constraint
            sel_groups = {group[i] for i in idx}
            assert len(sel_groups) == k
            assert idx == sorted(i for i, x in enumerate(group) if x in sel_groups)
            p, n = _fractions(adv, idx)
            assert p >= rho and n >= rho
            assert idx in feasible
            n_found += 1
        if not feasible:
            assert got is None
        else:
            n_feasible += 1
    # the check is not vacuous: many buffers had a feasible selection and greedy found most of them
    assert n_feasible > 100 and n_found > 80


def test_reward_balanced_select_hand_worked() -> None:
    # buffer: g7 = 2 pos, g3 = 1 pos + 1 neg, g5 = 2 neg (ids deliberately not in buffer order)
    adv = torch.tensor([1.0, 1.0, 0.5, -0.5, -1.0, -1.0])
    group = torch.tensor([7, 7, 3, 3, 5, 5])
    # step 1: min(#pos, #neg) = 0, 1, 0 → g3; step 2: g7 → min(3, 1) = 1, g5 → min(1, 3) = 1: tie → g7 (older)
    got = reward_balanced_select(adv, group, 0.25, 2)
    assert got.tolist() == [0, 1, 2, 3]  # 3/4 pos, 1/4 neg
    assert reward_balanced_select(adv, group, 0.3, 2) is None  # 1/4 < 0.3
    assert reward_balanced_select(adv, group, 0.5, 3).tolist() == [0, 1, 2, 3, 4, 5]
    assert reward_balanced_select(adv, group, 0.0, 4) is None  # only 3 groups in the buffer


def test_reward_balanced_select_zero_advantages_count_in_denominator() -> None:
    adv = torch.tensor([1.0, -1.0, 0.0, 0.0])  # one group: 1/4 pos, 1/4 neg
    group = torch.zeros(4, dtype=torch.long)
    assert reward_balanced_select(adv, group, 0.25, 1).tolist() == [0, 1, 2, 3]
    assert reward_balanced_select(adv, group, 0.26, 1) is None


def test_reward_balanced_select_bad_input() -> None:
    adv = torch.tensor([1.0, -1.0])
    group = torch.tensor([0, 0])
    with pytest.raises(ValueError, match=r"rho.*\[0, 0.5\]"):
        reward_balanced_select(adv, group, 0.6, 1)
    with pytest.raises(ValueError, match=r"rho.*\[0, 0.5\]"):
        reward_balanced_select(adv, group, -0.1, 1)
    with pytest.raises(ValueError, match="num_groups"):
        reward_balanced_select(adv, group, 0.2, 0)
    with pytest.raises(ValueError, match="B=2"):
        reward_balanced_select(adv, torch.tensor([0, 0, 1]), 0.2, 1)
    with pytest.raises(ValueError, match="NaN"):
        reward_balanced_select(torch.tensor([1.0, float("nan")]), group, 0.2, 1)


# --------------------------------------------------------------------------------------------
# lopti_masks


def test_lopti_masks_hand_worked() -> None:
    probs = torch.tensor([[0.1, 0.5, 0.9], [0.49, 0.7, 0.2]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    low, high = lopti_masks(probs.log(), mask, 0.5)
    assert low.tolist() == [[True, False, False], [True, False, False]]
    assert high.tolist() == [[False, True, True], [False, True, False]]
    assert low.dtype == torch.bool and high.dtype == torch.bool
    # η = 1: every completion token is low-probability (π < 1)
    low1, high1 = lopti_masks(probs.log(), mask, 1.0)
    assert torch.equal(low1, mask.bool()) and not high1.any()


def test_lopti_masks_partition_random() -> None:
    g = _gen(2)
    old_logp = torch.log(torch.rand(5, 9, generator=g, dtype=torch.float64))
    mask = torch.rand(5, 9, generator=g) < 0.7
    old_logp[~mask] = float("nan")  # padding values are never looked at
    low, high = lopti_masks(old_logp, mask, 0.4)
    assert not (low & high).any()
    assert torch.equal(low | high, mask)
    p = old_logp.exp()
    for i in range(5):
        for t in range(9):
            assert bool(low[i, t]) == (bool(mask[i, t]) and float(p[i, t]) < 0.4)


def test_lopti_masks_bad_input() -> None:
    lp = torch.zeros(2, 3)
    m = torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"eta.*\(0, 1\]"):
        lopti_masks(lp, m, 0.0)
    with pytest.raises(ValueError, match=r"eta.*\(0, 1\]"):
        lopti_masks(lp, m, 1.5)
    with pytest.raises(ValueError, match="mask"):
        lopti_masks(lp, torch.ones(2, 4), 0.5)
    with pytest.raises(ValueError, match="NaN"):
        lopti_masks(torch.full((2, 3), float("nan")), m, 0.5)
