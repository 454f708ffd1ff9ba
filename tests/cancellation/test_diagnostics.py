"""Tests of cancellation.diagnostics: closed forms, plain loops and hand-worked examples."""

from __future__ import annotations

import math
import random

import pytest
import torch

from cancellation.diagnostics import (
    FLIP_KEYS,
    SharedResidual,
    energy_by_bucket,
    jitter2,
    prefix_event_keys,
    shared_residual,
    softmax_grad_norm,
    softmax_grad_norm_bounds,
    steps_to_threshold,
    token_coefficients,
    token_flip_stats,
    trailing_mean,
    value_at_threshold,
)

#: Every comparison here is between two code paths in float64, at a tolerance well above its
#: rounding (library vs plain loops, autograd and hand-worked sums): ``tests/exactness.py``.
pytestmark = pytest.mark.exactness

F64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _batch(seed: int = 0, b: int = 6, t: int = 5):
    g = _gen(seed)
    lengths = torch.tensor([5, 3, 4, 5, 2, 4])[:b]
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(F64)
    logp = torch.log(torch.rand(b, t, generator=g, dtype=F64) * 0.9 + 0.05)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0], dtype=F64)[:b]
    group = torch.tensor([0, 0, 0, 1, 1, 1])[:b]
    return logp, mask, adv, group, lengths


# --------------------------------------------------------------------------------------------
# token_coefficients


def test_token_coefficients_grpo_on_policy_token_mean() -> None:
    logp, mask, adv, group, lengths = _batch()
    coef = token_coefficients("grpo", logp, logp.clone(), adv, mask, group)
    # r = 1 on-policy (inside the clip range), token-mean over N tokens: ∂J/∂logp_{i,t} = r·A_i / N
    n_tok = float(lengths.sum())
    expected = adv[:, None].expand_as(logp) / n_tok * mask
    torch.testing.assert_close(coef, expected)


def test_token_coefficients_gspo_is_eq70() -> None:
    logp, mask, adv, group, lengths = _batch(1)
    coef = token_coefficients("gspo", logp, logp.clone(), adv, mask, group)
    # DFPO eq. (70) with s̃ = s = 1: coefficient A_i / (G·|y_i|), G = number of sequences in the batch
    expected = (adv / (len(adv) * lengths.to(F64)))[:, None] * mask
    torch.testing.assert_close(coef, expected)


def test_token_coefficients_dfpo_min_replace_passes_params() -> None:
    logp, mask, adv, group, lengths = _batch(2)
    old = logp + 0.05 * torch.randn(logp.shape, generator=_gen(9), dtype=F64)
    coef = token_coefficients(
        "dfpo", logp, old, adv, mask, group, transform="min_replace", epsilon_low=0.9, epsilon_high=10.0
    )
    # no clipping with these ranges: s̄ = s = exp(mean_t (logp − old)); Min-Replace: s̃_i = min over the group
    s = (((logp - old) * mask).sum(1) / mask.sum(1)).exp()
    s_min = torch.stack([s[group == group[i]].min() for i in range(len(s))])
    # DFPO eq. (70): coefficient s̃_i·A_i / (G·|y_i|)
    expected = (s_min * adv / (len(adv) * lengths.to(F64)))[:, None] * mask
    torch.testing.assert_close(coef, expected)


def test_token_coefficients_bad_name() -> None:
    logp, mask, adv, group, _ = _batch()
    with pytest.raises(ValueError, match=r"unknown objective 'ppo'.*valid"):
        token_coefficients("ppo", logp, logp, adv, mask, group)


# --------------------------------------------------------------------------------------------
# prefix_event_keys


def _plain_event_keys(tokens: list[list[int]], mask: list[list[int]], group: list[int]) -> list[list]:
    out = []
    for i, row in enumerate(tokens):
        keys = []
        for t in range(len(row)):
            if not mask[i][t]:
                keys.append(None)
                continue
            prefix = tuple(row[u] if mask[i][u] else "pad" for u in range(t))
            keys.append((group[i], t, prefix, row[t]))
        out.append(keys)
    return out


def _same_partition(got: torch.Tensor, plain: list[list]) -> None:
    fwd: dict = {}
    back: dict = {}
    for i, row in enumerate(plain):
        for t, k in enumerate(row):
            g = int(got[i, t])
            if k is None:
                assert g == -1
                continue
            assert g >= 0
            assert fwd.setdefault(k, g) == g  # equal plain keys → equal ids
            assert back.setdefault(g, k) == k  # equal ids → equal plain keys


def test_prefix_event_keys_hand_worked() -> None:
    tokens = torch.tensor([[5, 6, 7], [5, 6, 8], [5, 9, 7], [5, 6, 7]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 1]])
    group = torch.tensor([0, 0, 0, 1])
    k = prefix_event_keys(tokens, mask, group)
    assert k.dtype == torch.long
    # group 0: t=0 shared by rows 0-2; t=1 (5,6) shared by rows 0-1; t=2 all distinct; row 2 t=2 is padding
    assert k[0, 0] == k[1, 0] == k[2, 0]
    assert k[0, 1] == k[1, 1] != k[2, 1]
    assert k[0, 2] != k[1, 2]
    assert k[2, 2] == -1
    # row 3 has the same tokens as row 0 but another prompt: no event shared with group 0
    assert not bool((k[3][:, None] == k[:3].flatten()[None, :]).any())
    # ids are compact: 0..E−1 with E = 1+2+2 (group 0) + 3 (group 1) = 8 events
    assert sorted(set(k[mask.bool()].tolist())) == list(range(8))


def test_prefix_event_keys_against_plain_loop() -> None:
    rng = random.Random(0)
    for _ in range(30):
        b, t = rng.randint(1, 10), rng.randint(1, 7)
        tokens = [[rng.randint(0, 2) for _ in range(t)] for _ in range(b)]
        group = [rng.randint(0, 3) * 11 for _ in range(b)]
        mask = []
        for _ in range(b):
            if rng.random() < 0.8:  # right padding
                n = rng.randint(0, t)
                mask.append([1] * n + [0] * (t - n))
            else:  # holes: padding inside a prefix is its own symbol
                mask.append([rng.randint(0, 1) for _ in range(t)])
        got = prefix_event_keys(torch.tensor(tokens), torch.tensor(mask), torch.tensor(group))
        _same_partition(got, _plain_event_keys(tokens, mask, group))


def test_prefix_event_keys_bad_input() -> None:
    tokens = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(TypeError, match="integer token ids"):
        prefix_event_keys(tokens.float(), torch.ones(2, 3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="mask"):
        prefix_event_keys(tokens, torch.ones(2, 4), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="B=2"):
        prefix_event_keys(tokens, torch.ones(2, 3), torch.tensor([0, 1, 2]))


# --------------------------------------------------------------------------------------------
# shared_residual


def test_shared_residual_hand_worked() -> None:
    coef = torch.tensor([[1.0, 2.0, 0.5], [-1.0, 1.0, 9.0]], dtype=F64)
    keys = torch.tensor([[4, 2, 7], [4, 2, -1]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1]])
    r = shared_residual(coef, keys, mask)
    assert isinstance(r, SharedResidual)
    # events sorted by key: 2 → {2, 1}; 4 → {1, −1}; 7 → {0.5}; the −1 key is ignored
    assert r.keys.tolist() == [2, 4, 7]
    assert r.net.tolist() == [3.0, 0.0, 0.5]
    assert r.gross.tolist() == [3.0, 2.0, 0.5]
    assert r.count.tolist() == [2, 2, 1]
    assert r.ratio.tolist() == [1.0, 0.0, 1.0]
    # shared (count ≥ 2) events 2 and 4: (3 + 0) / (3 + 2)
    assert r.total == pytest.approx(0.6)
    # min_count=1 adds event 7: (3 + 0 + 0.5) / (3 + 2 + 0.5)
    assert shared_residual(coef, keys, mask, min_count=1).total == pytest.approx(3.5 / 5.5)
    # no event with 3 occurrences: NaN
    assert math.isnan(shared_residual(coef, keys, mask, min_count=3).total)
    # masking a token removes it: event 4 becomes a single occurrence
    r2 = shared_residual(coef, keys, torch.tensor([[1, 1, 1], [0, 1, 1]]))
    assert r2.count.tolist() == [2, 1, 1] and r2.total == pytest.approx(1.0)


def test_shared_residual_zero_gross() -> None:
    coef = torch.zeros(2, 2, dtype=F64)
    keys = torch.tensor([[0, 1], [0, 1]])
    r = shared_residual(coef, keys, torch.ones(2, 2))
    assert r.ratio.tolist() == [0.0, 0.0]
    assert math.isnan(r.total)


def test_shared_residual_against_plain_loop() -> None:
    g = _gen(3)
    coef = torch.randn(8, 6, generator=g, dtype=F64)
    keys = torch.randint(-1, 7, (8, 6), generator=g)
    mask = torch.rand(8, 6, generator=g) < 0.8
    events: dict[int, list[float]] = {}
    for i in range(8):
        for t in range(6):
            if mask[i, t] and keys[i, t] >= 0:
                events.setdefault(int(keys[i, t]), []).append(float(coef[i, t]))
    r = shared_residual(coef, keys, mask)
    assert r.keys.tolist() == sorted(events)
    for e, k in enumerate(sorted(events)):
        assert float(r.net[e]) == pytest.approx(sum(events[k]))
        assert float(r.gross[e]) == pytest.approx(sum(abs(c) for c in events[k]))
        assert int(r.count[e]) == len(events[k])
    shared = [v for v in events.values() if len(v) >= 2]
    expected = sum(abs(sum(v)) for v in shared) / sum(abs(c) for v in shared for c in v)
    assert r.total == pytest.approx(expected)


def test_shared_residual_of_grpo_vs_gspo_coefficients() -> None:
    # one group: two completions of lengths 2 and 4 sharing their first token, advantages ±1, on-policy
    tokens = torch.tensor([[3, 4, 0, 0], [3, 5, 6, 7]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=F64)
    group = torch.tensor([0, 0])
    adv = torch.tensor([1.0, -1.0], dtype=F64)
    logp = torch.full((2, 4), -1.0, dtype=F64)
    keys = prefix_event_keys(tokens, mask, group)
    # token-mean GRPO: both shared tokens weigh ±1/6: exact cancellation
    c_grpo = token_coefficients("grpo", logp, logp, adv, mask, group)
    assert shared_residual(c_grpo, keys, mask).total == pytest.approx(0.0, abs=1e-15)
    # GSPO seq-mean-token-mean: +1/(2·2) and −1/(2·4): residual |1/4 − 1/8| / (1/4 + 1/8) = 1/3 (eq. 72)
    c_gspo = token_coefficients("gspo", logp, logp, adv, mask, group)
    assert shared_residual(c_gspo, keys, mask).total == pytest.approx(1 / 3)


def test_shared_residual_bad_input() -> None:
    coef = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="keys"):
        shared_residual(coef, torch.zeros(2, 2, dtype=torch.long), torch.ones(2, 3))
    with pytest.raises(TypeError, match="keys"):
        shared_residual(coef, torch.zeros(2, 3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="min_count"):
        shared_residual(coef, torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3), min_count=0)
    with pytest.raises(ValueError, match="NaN"):
        shared_residual(
            torch.full((2, 3), float("nan")), torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3)
        )


# --------------------------------------------------------------------------------------------
# jitter2 and steps_to_threshold


def test_jitter2_hand_worked() -> None:
    # second differences of 0, 1, 0, 1: (0 − 2 + 0) = −2 and (1 − 0 + 1) = 2 → mean |·| = 2
    assert jitter2([0.0, 1.0, 0.0, 1.0]) == pytest.approx(2.0)
    assert jitter2(torch.tensor([0.0, 1.0, 0.0, 1.0])) == pytest.approx(2.0)
    # a straight line has no jitter; a parabola t² has constant second difference 2
    assert jitter2([3.0 + 0.5 * t for t in range(10)]) == pytest.approx(0.0)
    assert jitter2([float(t * t) for t in range(7)]) == pytest.approx(2.0)
    # (1/(T−2)) Σ: T = 5, second differences 1−0+0 = 1, 0−2+0 = −2, 3−0+1 = 4 → 7/3
    assert jitter2([0, 0, 1, 0, 3]) == pytest.approx(7 / 3)


def test_jitter2_bad_input() -> None:
    with pytest.raises(ValueError, match="at least 3"):
        jitter2([1.0, 2.0])
    with pytest.raises(ValueError, match="NaN"):
        jitter2([1.0, float("nan"), 2.0])
    with pytest.raises(ValueError, match="1-D"):
        jitter2(torch.zeros(2, 3))


def test_steps_to_threshold() -> None:
    vals = [0.1, 0.3, float("nan"), 0.5, 0.7, 0.4]
    assert steps_to_threshold(vals, 0.5) == 3.0
    assert steps_to_threshold(vals, 0.3) == 1.0
    assert steps_to_threshold(vals, 0.5, steps=[10, 20, 30, 40, 50, 60]) == 40.0
    assert steps_to_threshold(torch.tensor([0.1, 0.2]), 0.9) is None
    with pytest.raises(ValueError, match="steps"):
        steps_to_threshold(vals, 0.5, steps=[1, 2])


# --------------------------------------------------------------------------------------------
# softmax_grad_norm and its bounds


def test_softmax_grad_norm_against_autograd_and_loop() -> None:
    g = _gen(4)
    z = torch.randn(3, 4, 7, generator=g, dtype=F64)
    y = torch.randint(0, 7, (3, 4), generator=g)
    probs = torch.softmax(z, -1)
    got = softmax_grad_norm(probs, y)
    assert got.shape == (3, 4)
    for i in range(3):
        for t in range(4):
            zz = z[i, t].clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(torch.log_softmax(zz, -1)[y[i, t]], zz)
            assert float(got[i, t]) == pytest.approx(float(grad.norm()), rel=1e-12)
            plain = math.sqrt(sum((float(k == int(y[i, t])) - float(probs[i, t, k])) ** 2 for k in range(7)))
            assert float(got[i, t]) == pytest.approx(plain, rel=1e-12)


@pytest.mark.parametrize("n", [2, 3, 10, 1000])
def test_softmax_grad_norm_within_bounds(n: int) -> None:
    g = _gen(n)
    z = torch.randn(500, n, generator=g, dtype=F64) * torch.rand(500, 1, generator=g, dtype=F64) * 8
    y = torch.randint(0, n, (500,), generator=g)
    probs = torch.softmax(z, -1)
    norm = softmax_grad_norm(probs, y)
    pi = probs.gather(-1, y[:, None]).squeeze(-1)
    lower, upper = softmax_grad_norm_bounds(pi, n)
    assert bool((lower <= norm + 1e-12).all()) and bool((norm <= upper + 1e-12).all())
    if n == 2:
        # N = 2: sqrt(N/(N−1)) = sqrt(2), both bounds are equalities
        torch.testing.assert_close(norm, lower, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(norm, upper, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [3, 5, 50])
def test_softmax_grad_norm_bounds_are_attained(n: int) -> None:
    pi = torch.tensor([0.0, 0.1, 0.37, 0.9], dtype=F64)
    lower, upper = softmax_grad_norm_bounds(pi, n)
    y = torch.zeros(4, dtype=torch.long)
    # all the other mass on one token: upper bound
    on_one = torch.zeros(4, n, dtype=F64)
    on_one[:, 0] = pi
    on_one[:, 1] = 1 - pi
    torch.testing.assert_close(softmax_grad_norm(on_one, y), upper, rtol=1e-12, atol=1e-12)
    # the other mass uniform over the N − 1 other tokens: lower bound
    uniform = ((1 - pi) / (n - 1))[:, None].expand(4, n).clone()
    uniform[:, 0] = pi
    torch.testing.assert_close(softmax_grad_norm(uniform, y), lower, rtol=1e-12, atol=1e-12)
    # closed forms of the bounds (Lopti paper §3.1)
    torch.testing.assert_close(lower, math.sqrt(n / (n - 1)) * (1 - pi))
    torch.testing.assert_close(upper, math.sqrt(2) * (1 - pi))


def test_softmax_grad_norm_bad_input() -> None:
    probs = torch.full((2, 3), 1 / 3)
    with pytest.raises(ValueError, match="tokens"):
        softmax_grad_norm(probs, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="outside"):
        softmax_grad_norm(probs, torch.tensor([0, 3]))
    with pytest.raises(TypeError, match="integer"):
        softmax_grad_norm(probs, torch.zeros(2))
    with pytest.raises(ValueError, match="vocab_size"):
        softmax_grad_norm_bounds(torch.tensor([0.5]), 1)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        softmax_grad_norm_bounds(torch.tensor([1.5]), 4)


# --------------------------------------------------------------------------------------------
# energy_by_bucket


def test_energy_by_bucket_hand_worked() -> None:
    # token counts: id 5 ×6, id 2 ×3, id 7 ×3 (12 occurrences). Ranking 5, 2, 7 (tie 2/7 by id).
    # buckets ⌊3·before/12⌋: id 5 → ⌊0⌋ = 0, id 2 → ⌊18/12⌋ = 1, id 7 → ⌊27/12⌋ = 2
    tokens = torch.tensor([[5, 5, 5, 2, 2, 2], [5, 5, 5, 7, 7, 7], [0, 0, 0, 0, 0, 0]])
    mask = torch.tensor([[1] * 6, [1] * 6, [0] * 6])
    coef = torch.tensor([[1.0, 1, 1, 2, 2, 2], [-1, -1, -1, 0.5, 0.5, 0.5], [9, 9, 9, 9, 9, 9]], dtype=F64)
    # π puts all mass on token 1 (never sampled): ‖e_y − π‖ = sqrt(2) for every token
    probs = torch.zeros(3, 6, 10, dtype=F64)
    probs[..., 1] = 1.0
    shares = energy_by_bucket(coef, probs, tokens, mask, num_buckets=3)
    # |coef| per bucket: 6, 6, 1.5 (the sqrt(2) factor cancels in the shares)
    torch.testing.assert_close(shares, torch.tensor([6.0, 6.0, 1.5], dtype=F64) / 13.5)
    # hidden norms scale each token: 2 on the id-2 tokens
    h = torch.ones(3, 6, dtype=F64)
    h[0, 3:] = 2.0
    torch.testing.assert_close(
        energy_by_bucket(coef, probs, tokens, mask, hidden_norm=h),
        torch.tensor([6.0, 12.0, 1.5], dtype=F64) / 19.5,
    )
    # a given frequency table re-buckets: id 7 most frequent → bucket 0, then 5 → bucket ⌊3·10/16⌋ = 1
    freq = torch.zeros(10, dtype=F64)
    freq[7], freq[5], freq[2] = 10.0, 5.0, 1.0  # id 2: ⌊3·15/16⌋ = 2
    torch.testing.assert_close(
        energy_by_bucket(coef, probs, tokens, mask, frequency=freq),
        torch.tensor([1.5, 6.0, 6.0], dtype=F64) / 13.5,
    )
    # zero coefficients: zero energy everywhere
    assert energy_by_bucket(torch.zeros_like(coef), probs, tokens, mask).tolist() == [0.0, 0.0, 0.0]


def test_energy_by_bucket_against_plain_loop() -> None:
    g = _gen(6)
    b, t, v, k = 5, 7, 6, 4
    probs = torch.softmax(torch.randn(b, t, v, generator=g, dtype=F64), -1)
    tokens = torch.multinomial(torch.tensor([8.0, 4, 2, 1, 1, 1]), b * t, replacement=True, generator=g)
    tokens = tokens.view(b, t)
    mask = torch.rand(b, t, generator=g) < 0.8
    coef = torch.randn(b, t, generator=g, dtype=F64)
    h = torch.rand(b, t, generator=g, dtype=F64) + 0.5
    got = energy_by_bucket(coef, probs, tokens, mask, hidden_norm=h, num_buckets=k)
    # plain loop
    counts = [0] * v
    for i in range(b):
        for s in range(t):
            if mask[i, s]:
                counts[int(tokens[i, s])] += 1
    total = sum(counts)
    ranked = sorted(range(v), key=lambda y: (-counts[y], y))
    bucket, before = {}, 0
    for y in ranked:
        bucket[y] = min(k - 1, math.floor(k * before / total))
        before += counts[y]
    energy = [0.0] * k
    for i in range(b):
        for s in range(t):
            if mask[i, s]:
                y = int(tokens[i, s])
                gn = math.sqrt(sum(((j == y) - float(probs[i, s, j])) ** 2 for j in range(v)))
                energy[bucket[y]] += abs(float(coef[i, s])) * gn * float(h[i, s])
    expected = torch.tensor(energy, dtype=F64) / sum(energy)
    torch.testing.assert_close(got, expected)
    assert float(got.sum()) == pytest.approx(1.0)


def test_energy_by_bucket_bad_input() -> None:
    coef = torch.ones(2, 3)
    probs = torch.full((2, 3, 4), 0.25)
    tokens = torch.zeros(2, 3, dtype=torch.long)
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match="probs"):
        energy_by_bucket(coef, probs[:, :2], tokens, mask)
    with pytest.raises(ValueError, match="num_buckets"):
        energy_by_bucket(coef, probs, tokens, mask, num_buckets=0)
    with pytest.raises(ValueError, match="frequency"):
        energy_by_bucket(coef, probs, tokens, mask, frequency=torch.ones(5))
    with pytest.raises(ValueError, match="outside"):
        energy_by_bucket(coef, probs, tokens + 4, mask)
    with pytest.raises(ValueError, match="selects no token"):
        energy_by_bucket(coef, probs, tokens, torch.zeros(2, 3))


# --------------------------------------------------------------------------------------------
# token_flip_stats


def test_token_flip_stats_hand_worked() -> None:
    before = torch.zeros(4, 4, dtype=F64)
    after = torch.tensor(
        [
            [0.1, -0.1, 0.0, 0.5],  # A > 0: boosted, suppressed, stable, (padding)
            [0.1, 0.1, -0.1, 0.0],  # A < 0: boosted, boosted, suppressed, stable
            [0.1, 0.0005, 0.0, 0.0],  # A = 0: boosted, stable (|Δ| ≤ τ), (padding) ×2
            [-0.2, 0.2, 0.0, 0.0],  # A > 0: suppressed, boosted, (padding) ×2
        ],
        dtype=F64,
    )
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]])
    after[mask == 0] = float("nan")  # padding is never read
    adv = torch.tensor([1.0, -1.0, 0.0, 0.5], dtype=F64)
    s = _flip(before, after, adv, mask)
    # positive rollouts: 5 tokens: boosted 2, suppressed 2, stable 1
    assert (s["flip/pos_boosted"], s["flip/pos_suppressed"], s["flip/pos_stable"]) == (0.4, 0.4, 0.2)
    # negative rollout: 4 tokens: boosted 2, suppressed 1, stable 1
    assert (s["flip/neg_boosted"], s["flip/neg_suppressed"], s["flip/neg_stable"]) == (0.5, 0.25, 0.25)
    # all 11 tokens: boosted 5, suppressed 3, stable 3
    assert s["flip/all_boosted"] == pytest.approx(5 / 11)
    assert s["flip/all_suppressed"] == pytest.approx(3 / 11)
    assert s["flip/all_stable"] == pytest.approx(3 / 11)
    # against the sign: 2 suppressed in positive rollouts + 2 boosted in the negative one, of 9 tokens
    assert s["flip/rate"] == pytest.approx(4 / 9)


def _flip(before: torch.Tensor, after: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> dict:
    s = token_flip_stats(before, after, adv, mask, tau=1e-3)
    assert tuple(s) == FLIP_KEYS
    assert all(isinstance(v, float) and not math.isnan(v) for v in s.values())
    return s


def test_token_flip_stats_empty_sets_are_zero() -> None:
    before = torch.zeros(2, 2)
    after = torch.tensor([[1.0, -1.0], [0.0, 0.0]])
    s = _flip(before, after, torch.tensor([1.0, 2.0]), torch.ones(2, 2))
    assert s["flip/neg_boosted"] == s["flip/neg_suppressed"] == s["flip/neg_stable"] == 0.0
    assert s["flip/pos_boosted"] == 0.25 and s["flip/rate"] == 0.25
    s0 = _flip(before, after, torch.zeros(2), torch.ones(2, 2))
    assert s0["flip/rate"] == 0.0 and s0["flip/all_stable"] == 0.5


def test_token_flip_stats_bad_input() -> None:
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="tau"):
        token_flip_stats(z, z, torch.zeros(2), torch.ones(2, 3), tau=-1.0)
    with pytest.raises(ValueError, match="logp_after"):
        token_flip_stats(z, torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"advantages.*shape \(B,\)"):
        token_flip_stats(z, z, torch.zeros(2, 3), torch.ones(2, 3))


def test_value_at_threshold_interpolates_between_the_steps_around_the_crossing() -> None:
    reward = [0.7, 0.85, 0.95, 0.99]
    kl = [0.01, 0.02, 0.06, 0.07]
    # the reward crosses 0.9 halfway from position 1 (0.85) to position 2 (0.95): KL halfway, 0.04
    assert value_at_threshold(reward, kl, 0.9) == pytest.approx(0.04, abs=1e-15)
    assert value_at_threshold([0.95, 0.99], [0.01, 0.02], 0.9) == 0.01  # reached at once: nothing before
    assert math.isnan(value_at_threshold(reward, kl, 1.5))
    assert value_at_threshold([0.5, 0.9], [1.0, 3.0], 0.9) == 3.0  # exactly at the threshold
    with pytest.raises(ValueError, match="`values` has 1 entries but `reward` has 2"):
        value_at_threshold([0.5, 0.9], [1.0], 0.9)


def test_trailing_mean_by_hand() -> None:
    nan = math.nan
    x = [1.0, 3.0, nan, 5.0, None]
    # window 2: [1], [1, 3], [3], [5], [5]  (NaN and None left out)
    assert trailing_mean(x, 2) == [1.0, 2.0, 3.0, 5.0, 5.0]
    got = trailing_mean(x, 3, full=True)
    assert math.isnan(got[0]) and math.isnan(got[1]) and got[2:] == [2.0, 4.0, 5.0]
    assert math.isnan(trailing_mean([nan, nan], 2)[1])
    with pytest.raises(ValueError, match="`window` must be ≥ 1"):
        trailing_mean(x, 0)
