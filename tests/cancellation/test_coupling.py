"""Tests of cancellation.coupling: plain loops, closed forms, a small neural net and a tabular tree.

Equation numbers are those of "The Cancellation Hypothesis in Critic-Free RL: From Outcome Rewards to
Token Credits" (arXiv 2605.08666). Every expected value is computed here independently of the module
(double loops, a hand-written SGD step, enumeration of a tree, hand-worked numbers).
"""

from __future__ import annotations

import math

import pytest
import torch

from cancellation.coupling import (
    BoostStats,
    FirstOrderDelta,
    boost_stats,
    counterfactual_value,
    coupling_kernel,
    coupling_mass,
    first_order_delta,
    first_order_masking_effect,
    mask_sets,
    masking_effect,
    output_overlap,
    per_token_scores,
    proxy_kernel,
    repeated_sgd,
    sgd_step,
    sgd_update,
    surviving_signal,
    update_norm_split,
    value_gap,
)

#: Every comparison here is between two code paths in float64, at a tolerance well above its
#: rounding (library vs double loops, hand-written SGD steps and the exact kernel): ``tests/exactness.py``.
pytestmark = pytest.mark.exactness

F64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------------------------
# a small neural policy with shared weights: embedding -> tanh layer -> untied unembedding

V, D = 6, 10
# 12 flat tokens: the context id each is predicted from and the token taken (repeats on purpose)
CTX = torch.tensor([0, 1, 2, 3, 0, 1, 4, 3, 0, 5, 2, 3])
TOK = torch.tensor([1, 2, 3, 4, 1, 4, 3, 5, 5, 2, 3, 4])
# three responses of four tokens with group advantages (Σ A = 0), seq-mean-token-mean style coefficients
ADV = torch.tensor([1.5, -0.5, -1.0], dtype=F64)
COEF = ADV.repeat_interleave(4) / 4


def _net_params(seed: int = 0) -> list[torch.Tensor]:
    g = _gen(seed)
    ps = [
        torch.randn(V, D, generator=g, dtype=F64),  # embedding E
        torch.randn(D, D, generator=g, dtype=F64) / D**0.5,  # hidden layer W1
        torch.randn(D, generator=g, dtype=F64) * 0.1,  # bias b1
        torch.randn(V, D, generator=g, dtype=F64) / D**0.5,  # unembedding U (untied)
    ]
    return [p.requires_grad_(True) for p in ps]


def _hidden(ps: list[torch.Tensor]) -> torch.Tensor:
    emb, w1, b1, _ = ps
    return torch.tanh(emb[CTX] @ w1.T + b1)


def _net_logp(ps: list[torch.Tensor]) -> torch.Tensor:
    h = _hidden(ps)
    return torch.log_softmax(h @ ps[3].T, dim=-1).gather(1, TOK[:, None]).squeeze(1)


def _sgd_logp(ps: list[torch.Tensor], coef: torch.Tensor, lr: float, only: list[int] | None = None):
    """Hand-written SGD ascent step on J = Σ c_k log π(y_k) from copies of ``ps``; the new log-probs."""
    theta = [p.detach().clone().requires_grad_(True) for p in ps]
    objective = torch.dot(coef, _net_logp(theta))
    grads = torch.autograd.grad(objective, theta)
    moved = only if only is not None else list(range(len(ps)))
    new = [
        (t + lr * gr if i in moved else t).detach()
        for i, (t, gr) in enumerate(zip(theta, grads, strict=True))
    ]
    return _net_logp(new).detach()


# --------------------------------------------------------------------------------------------
# eq. (8) and the output-layer proxy (eq. 6-7)


def test_output_overlap_is_a_double_loop_of_dot_products() -> None:
    g = _gen(1)
    n, v = 7, 5
    probs = torch.softmax(torch.randn(n, v, generator=g, dtype=F64) * 1.5, dim=-1)
    tokens = torch.tensor([0, 3, 3, 1, 0, 4, 3])
    got = output_overlap(probs, tokens)
    expected = torch.empty(n, n, dtype=F64)
    for j in range(n):
        for k in range(n):
            ej = torch.zeros(v, dtype=F64)
            ej[int(tokens[j])] = 1.0
            ek = torch.zeros(v, dtype=F64)
            ek[int(tokens[k])] = 1.0
            expected[j, k] = float(torch.dot(ej - probs[j], ek - probs[k]))
    torch.testing.assert_close(got, expected, atol=1e-14, rtol=0)


@pytest.mark.parametrize("tau", [1.0, 0.6, 1.7])
def test_proxy_equals_the_exact_kernel_of_an_untied_output_matrix(tau: float) -> None:
    g = _gen(2)
    n, d, v = 9, 4, 6
    hidden = torch.randn(n, d, generator=g, dtype=F64)
    w = torch.randn(v, d, generator=g, dtype=F64).requires_grad_(True)
    tokens = torch.tensor([0, 2, 2, 5, 1, 2, 0, 4, 5])

    def logp_fn() -> torch.Tensor:
        return torch.log_softmax(hidden @ w.T / tau, dim=-1).gather(1, tokens[:, None]).squeeze(1)

    exact = coupling_kernel(per_token_scores(logp_fn, [w]))
    probs = torch.softmax(hidden @ w.detach().T / tau, dim=-1)
    torch.testing.assert_close(proxy_kernel(hidden, probs, tokens, temperature=tau), exact, atol=1e-9, rtol=0)
    if tau != 1.0:  # without the 1/τ² the two differ
        assert not torch.allclose(proxy_kernel(hidden, probs, tokens), exact, atol=1e-6)


def test_per_token_scores_on_a_known_jacobian() -> None:
    g = _gen(3)
    x = torch.randn(2, 3, generator=g, dtype=F64).requires_grad_(True)
    y = torch.randn(2, generator=g, dtype=F64).requires_grad_(True)
    unused = torch.randn(4, dtype=F64).requires_grad_(True)
    m = torch.randn(3, 2, 3, generator=g, dtype=F64)
    b = torch.randn(3, 2, generator=g, dtype=F64)
    # logp_j = Σ m_j ⊙ x + b_j·y + ‖x‖² (a quadratic term: its gradient 2x must be in every row)
    scores = per_token_scores(lambda: (m * x).sum((1, 2)) + b @ y + (x * x).sum(), [x, y, unused])
    for j in range(3):
        expected = torch.cat([(m[j] + 2 * x.detach()).flatten(), b[j], torch.zeros(4, dtype=F64)])
        torch.testing.assert_close(scores[j], expected)


# --------------------------------------------------------------------------------------------
# first-order Δ log π (eq. 4-5) against one real SGD step


def _errors(pred, actual_fn, lrs=(0.1, 0.01, 0.001)) -> list[float]:
    return [float((actual_fn(lr) - pred(lr)).abs().max()) for lr in lrs]


def test_first_order_delta_error_is_second_order_in_lr() -> None:
    ps = _net_params()
    kernel = coupling_kernel(per_token_scores(lambda: _net_logp(ps), ps))
    base = _net_logp(ps).detach()
    errs = _errors(
        lambda lr: first_order_delta(kernel, COEF, lr).total, lambda lr: _sgd_logp(ps, COEF, lr) - base
    )
    # measured: 1.9e-1, 2.1e-3, 2.1e-5 (ratios 91, 100)
    assert 30 < errs[0] / errs[1] < 300
    assert 30 < errs[1] / errs[2] < 300
    # the coupling term matters here: leaving it out is wrong at first order (error ∝ lr)
    without = _errors(
        lambda lr: first_order_delta(kernel, COEF, lr).self, lambda lr: _sgd_logp(ps, COEF, lr) - base
    )
    assert 5 < without[1] / without[2] < 20


def test_first_order_delta_split_by_hand() -> None:
    kernel = torch.tensor([[2.0, -1.0, 0.5], [-1.0, 3.0, 0.0], [0.5, 0.0, 1.0]], dtype=F64)
    coef = torch.tensor([1.0, 2.0, -4.0], dtype=F64)
    out = first_order_delta(kernel, coef, lr=0.5)
    assert isinstance(out, FirstOrderDelta)
    # self: 0.5·c_j·K_jj; coupling: 0.5·Σ_{k≠j} c_k K_jk
    torch.testing.assert_close(out.self, torch.tensor([1.0, 3.0, -2.0], dtype=F64))
    torch.testing.assert_close(out.coupling, torch.tensor([-2.0, -0.5, 0.25], dtype=F64))
    torch.testing.assert_close(out.total, torch.tensor([-1.0, 2.5, -1.75], dtype=F64))


def test_proxy_first_order_delta_predicts_an_lm_head_only_step() -> None:
    # eq. (9): stepping only the untied unembedding, the proxy kernel is that step's exact kernel
    ps = _net_params(4)
    h = _hidden(ps).detach()
    probs = torch.softmax(h @ ps[3].detach().T, dim=-1)
    kernel = proxy_kernel(h, probs, TOK)
    base = _net_logp(ps).detach()
    errs = _errors(
        lambda lr: first_order_delta(kernel, COEF, lr).total,
        lambda lr: _sgd_logp(ps, COEF, lr, only=[3]) - base,
    )
    assert 30 < errs[0] / errs[1] < 300
    assert 30 < errs[1] / errs[2] < 300


# --------------------------------------------------------------------------------------------
# the masking effect (Sec. 2, Table 1)

# hand-made example: index 0..5
MS_TOKENS = torch.tensor([5, 3, 5, 5, 2, 5])
MS_PROBS = torch.tensor([0.2, 0.1, 0.9, 0.3, 0.4, 0.35], dtype=F64)  # low (< 0.5): 0, 1, 3, 4, 5
MS_ADV = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, 1.0], dtype=F64)


def _idx(mask: torch.Tensor) -> list[int]:
    return torch.nonzero(mask).flatten().tolist()


@pytest.mark.parametrize(
    ("candidate", "same_sign", "expected"),
    [
        (0, False, {"same_token": [2, 3, 5], "low_confidence": [1, 3, 4, 5], "both": [3, 5]}),
        (0, True, {"same_token": [2, 5], "low_confidence": [4, 5], "both": [5]}),
        (3, False, {"same_token": [0, 2, 5], "low_confidence": [0, 1, 4, 5], "both": [0, 5]}),
        (3, True, {"same_token": [], "low_confidence": [1], "both": []}),
    ],
)
def test_mask_sets_hand_made(candidate: int, same_sign: bool, expected: dict[str, list[int]]) -> None:
    sets = mask_sets(
        MS_TOKENS,
        MS_PROBS,
        candidate,
        low_conf=0.5,
        advantages=MS_ADV,
        same_sign=same_sign,
        generator=_gen(0),
    )
    assert set(sets) == {"random", "same_token", "low_confidence", "both"}
    for key, idx in expected.items():
        assert _idx(sets[key]) == idx, key
    eligible = {k for k in range(6) if k != candidate and (not same_sign or MS_ADV[k] == MS_ADV[candidate])}
    rand = _idx(sets["random"])
    assert len(rand) == len(expected["both"])  # the default size: matched to "both"
    assert set(rand) <= eligible


def test_mask_sets_candidate_never_in_its_own_mask_and_random_is_reproducible() -> None:
    for candidate in range(6):
        for same_sign in (False, True):
            sets = mask_sets(MS_TOKENS, MS_PROBS, candidate, advantages=MS_ADV, same_sign=same_sign, size=1)
            assert not any(bool(m[candidate]) for m in sets.values())
    draws = [_idx(mask_sets(MS_TOKENS, MS_PROBS, 0, size=3, generator=_gen(7))["random"]) for _ in range(2)]
    assert draws[0] == draws[1] and len(draws[0]) == 3 and 0 not in draws[0]
    # over many seeds every eligible token is drawn and the candidate never
    seen = set()
    for seed in range(40):
        seen |= set(_idx(mask_sets(MS_TOKENS, MS_PROBS, 0, size=2, generator=_gen(seed))["random"]))
    assert seen == {1, 2, 3, 4, 5}


def test_mask_sets_threshold_is_strict() -> None:
    probs = torch.tensor([0.1, 0.5, 0.49, 0.7], dtype=F64)
    sets = mask_sets(torch.tensor([1, 1, 1, 1]), probs, 0, low_conf=0.5)
    assert _idx(sets["low_confidence"]) == [2]


def test_masking_effect_exact_by_hand_and_against_first_order() -> None:
    ps = _net_params(5)
    kernel = coupling_kernel(per_token_scores(lambda: _net_logp(ps), ps))
    probs_taken = _net_logp(ps).detach().exp()
    adv_tok = ADV.repeat_interleave(4)
    masks = torch.stack(
        [
            mask_sets(TOK, probs_taken, j, low_conf=0.6, advantages=adv_tok, generator=_gen(j))["same_token"]
            for j in range(len(TOK))
        ]
    )
    assert bool(masks.any())
    # one candidate by hand: the same step with the masked coefficients set to 0, the others kept
    lr = 0.05
    j = int(torch.nonzero(masks.any(1))[0, 0])
    by_hand = _sgd_logp(ps, COEF, lr)[j] - _sgd_logp(ps, COEF.masked_fill(masks[j], 0.0), lr)[j]
    exact = masking_effect(lambda c: _sgd_logp(ps, c, lr), COEF, masks)
    torch.testing.assert_close(exact[j], by_hand, atol=1e-14, rtol=0)
    # an empty mask has no effect
    empty = torch.zeros(1, len(TOK), dtype=torch.bool)
    no_effect = masking_effect(lambda c: _sgd_logp(ps, c, lr), COEF, empty, candidates=torch.tensor([j]))
    assert float(no_effect[0]) == 0.0
    # the (M, N) form with candidates gives the same rows
    cand = torch.tensor([j, 0])
    torch.testing.assert_close(
        masking_effect(lambda c: _sgd_logp(ps, c, lr), COEF, masks[cand], candidates=cand), exact[cand]
    )
    # first order: error shrinks ~100x per 10x smaller lr
    errs = _errors(
        lambda lr: first_order_masking_effect(kernel, COEF, masks, lr),
        lambda lr: masking_effect(lambda c: _sgd_logp(ps, c, lr), COEF, masks),
    )
    assert 30 < errs[0] / errs[1] < 300
    assert 30 < errs[1] / errs[2] < 300


def test_sgd_step_matches_a_hand_written_step_and_leaves_params_alone() -> None:
    ps = _net_params(6)
    before = [p.detach().clone() for p in ps]
    step = sgd_step(_net_logp, ps, lr=0.1)
    torch.testing.assert_close(step(COEF), _sgd_logp(ps, COEF, 0.1), atol=1e-13, rtol=0)
    torch.testing.assert_close(step(torch.zeros_like(COEF)), _net_logp(ps).detach(), atol=1e-13, rtol=0)
    for p, b in zip(ps, before, strict=True):
        assert torch.equal(p.detach(), b)


def test_sgd_update_returns_the_hand_written_parameters_and_chains() -> None:
    ps = _net_params(7)
    before = [p.detach().clone() for p in ps]
    one = sgd_update(_net_logp, ps, COEF, 0.1)
    torch.testing.assert_close(_net_logp(one).detach(), _sgd_logp(ps, COEF, 0.1), atol=1e-13, rtol=0)
    two = sgd_update(_net_logp, one, COEF, 0.1)  # a second step from θ', as repeated updates take it
    torch.testing.assert_close(_net_logp(two).detach(), _sgd_logp(one, COEF, 0.1), atol=1e-13, rtol=0)
    assert all(not t.requires_grad for t in two)
    for p, b in zip(ps, before, strict=True):
        assert torch.equal(p.detach(), b)


def test_repeated_sgd_is_a_chain_of_hand_written_steps() -> None:
    ps = _net_params(8)
    seen: list[torch.Tensor] = []

    def coef_at(n: int, logp: torch.Tensor) -> torch.Tensor:
        seen.append(logp)
        return COEF * (n + 1)  # a different coefficient at every step

    out = repeated_sgd(_net_logp, ps, coef_at, 0.1, 3)
    theta = [p.detach().clone() for p in ps]
    for n in range(3):
        # coef_at sees the log-probs at the parameters the step starts from
        torch.testing.assert_close(seen[n], _net_logp(theta).detach(), atol=1e-13, rtol=0)
        torch.testing.assert_close(out[n], _sgd_logp(theta, COEF * (n + 1), 0.1), atol=1e-13, rtol=0)
        theta = sgd_update(_net_logp, theta, COEF * (n + 1), 0.1)
    with pytest.raises(ValueError, match="`n_steps`"):
        repeated_sgd(_net_logp, ps, coef_at, 0.1, 0)


def test_boost_stats_by_hand() -> None:
    out = boost_stats(torch.tensor([0.2, -0.1, 0.0, 0.3, 0.1], dtype=F64))
    assert isinstance(out, BoostStats)
    # 3 of 5 strictly positive (the zero counts as not boosted); mean 0.5 / 5
    assert out.boost_rate == pytest.approx(0.6)
    assert out.mean_boost == pytest.approx(0.1)


def test_coupling_mass_by_hand() -> None:
    kernel = torch.tensor(
        [[1.0, 2.0, -1.0, 0.5], [2.0, 1.0, 0.5, 1.0], [-1.0, 0.5, 1.0, -2.0], [0.5, 1.0, -2.0, 1.0]],
        dtype=F64,
    )
    coef = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=F64)
    tokens = torch.tensor([7, 7, 4, 7])
    probs = torch.tensor([0.2, 0.8, 0.3, 0.1], dtype=F64)  # low confidence (< 0.5): 0, 2, 3
    out = coupling_mass(kernel, coef, tokens, probs, low_conf=0.5)
    # |c_k K_jk| for j ≠ k, row j: (0,1) 4 (0,2) 3 (0,3) 0.25 | (1,0) 2 (1,2) 1.5 (1,3) 0.5 |
    # (2,0) 1 (2,1) 1 (2,3) 1 | (3,0) 0.5 (3,1) 2 (3,2) 6  -> total 22.75
    # same token: (0,1) (0,3) (1,0) (1,3) (3,0) (3,1) = 9.25; both low: (0,2) (0,3) (2,0) (2,3) (3,0) (3,2) = 11.75
    assert out["mass"] == pytest.approx(22.75)
    assert out["same_token"] == pytest.approx(9.25 / 22.75)
    assert out["different_token"] == pytest.approx(13.5 / 22.75)
    assert out["both_low_confidence"] == pytest.approx(11.75 / 22.75)
    assert out["not_both_low_confidence"] == pytest.approx(11.0 / 22.75)
    assert out["same_token_low_confidence"] == pytest.approx(0.75 / 22.75)  # (0,3) and (3,0)
    zero = coupling_mass(torch.zeros(2, 2, dtype=F64), torch.ones(2, dtype=F64), tokens[:2], probs[:2])
    assert zero["mass"] == 0.0 and math.isnan(zero["same_token"])


def test_coupling_mass_low_confidence_is_strict() -> None:
    # the kernel and coefficients of test_coupling_mass_by_hand, token 1 now exactly at low_conf = 0.5: still
    # not low confidence (strict <, as in mask_sets), so both-low stays (0,2) (0,3) (2,0) (2,3) (3,0) (3,2)
    kernel = torch.tensor(
        [[1.0, 2.0, -1.0, 0.5], [2.0, 1.0, 0.5, 1.0], [-1.0, 0.5, 1.0, -2.0], [0.5, 1.0, -2.0, 1.0]],
        dtype=F64,
    )
    coef = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=F64)
    probs = torch.tensor([0.2, 0.5, 0.3, 0.1], dtype=F64)
    out = coupling_mass(kernel, coef, torch.tensor([7, 7, 4, 7]), probs, low_conf=0.5)
    assert out["both_low_confidence"] == pytest.approx(11.75 / 22.75)
    assert out["same_token_low_confidence"] == pytest.approx(0.75 / 22.75)


# --------------------------------------------------------------------------------------------
# eq. (11)-(13): the group update


def test_update_norm_split_constant_overlap_eq12() -> None:
    g = _gen(8)
    n_resp, p, kappa = 5, 12, 0.7
    q, _ = torch.linalg.qr(torch.randn(p, n_resp + 1, generator=g, dtype=F64))
    r = torch.rand(n_resp, generator=g, dtype=F64) + 0.5
    # g_i = sqrt(κ)·u_0 + r_i·e_i with orthonormal u_0, e_i: ⟨g_i, g_k⟩ = κ (i ≠ k), ‖g_i‖² = κ + r_i²
    scores = math.sqrt(kappa) * q[:, 0][None, :] + r[:, None] * q[:, 1:].T
    gram = scores @ scores.T
    off = ~torch.eye(n_resp, dtype=torch.bool)
    torch.testing.assert_close(gram[off], torch.full((n_resp * (n_resp - 1),), kappa, dtype=F64))
    adv = torch.randn(n_resp, generator=g, dtype=F64)
    adv = adv - adv.mean()
    split = update_norm_split(scores, adv)
    sum_a2 = sum(float(a) ** 2 for a in adv)
    # eq. (12): cross = −κ Σ A_i²
    assert float(split.cross) == pytest.approx(-kappa * sum_a2, rel=1e-12)
    assert float(split.self) == pytest.approx(
        sum(float(a) ** 2 * (kappa + float(ri) ** 2) for a, ri in zip(adv, r, strict=True))
    )
    update = torch.zeros(p, dtype=F64)
    for i in range(n_resp):
        update = update + adv[i] * scores[i]
    assert float(split.self + split.cross) == pytest.approx(float(update @ update), rel=1e-12)


def test_update_norm_split_general_matches_direct_norm() -> None:
    g = _gen(9)
    scores = torch.randn(4, 7, generator=g, dtype=F64)
    adv = torch.randn(4, generator=g, dtype=F64)  # no zero-sum here: eq. (11) holds for any A
    split = update_norm_split(scores, adv)
    update = sum(adv[i] * scores[i] for i in range(4))
    assert float(split.self + split.cross) == pytest.approx(float(update @ update), rel=1e-12)


def test_surviving_signal_is_g_times_covariance_when_advantages_sum_to_zero() -> None:
    g = _gen(10)
    a = [float(x) for x in torch.randn(6, generator=g, dtype=F64)]
    proj = [float(x) for x in torch.randn(6, generator=g, dtype=F64) + 2.0]  # ā ≠ 0 on purpose
    mean_a = sum(a) / 6
    adv = [x - mean_a for x in a]  # Σ A = 0

    def cov(u: list[float], w: list[float]) -> float:
        mu, mw = sum(u) / len(u), sum(w) / len(w)
        return sum((x - mu) * (y - mw) for x, y in zip(u, w, strict=True)) / len(u)

    got = float(surviving_signal(torch.tensor(adv, dtype=F64), torch.tensor(proj, dtype=F64)))
    assert got == pytest.approx(6 * cov(adv, proj), rel=1e-12)
    # Σ A ≠ 0: it is G·Cov + G·Ā·ā instead
    adv2 = [x + 0.5 for x in adv]
    got2 = float(surviving_signal(torch.tensor(adv2, dtype=F64), torch.tensor(proj, dtype=F64)))
    assert abs(got2 - 6 * cov(adv2, proj)) > 1.0
    assert got2 == pytest.approx(6 * cov(adv2, proj) + 6 * 0.5 * (sum(proj) / 6), rel=1e-12)


# --------------------------------------------------------------------------------------------
# eq. (20): the counterfactual token value on a depth-2 binary tree

PI_ROOT = [0.3, 0.7]  # π(a0 | root)
PI_CHILD = [[0.6, 0.4], [0.2, 0.8]]  # π(a1 | a0)
P_SUCCESS = [[0.9, 0.1], [0.5, 0.25]]  # P(R = 1 | a0, a1): binary reward at the leaves


def _exact_values() -> dict[tuple, tuple[float, float]]:
    """(state, action) -> (π(a|s), Q(s,a) − E[R | s, not a]) by enumeration; a state is the prefix."""
    out = {}
    v_child = [sum(PI_CHILD[a0][a1] * P_SUCCESS[a0][a1] for a1 in (0, 1)) for a0 in (0, 1)]
    for a in (0, 1):  # the root: Q(root, a) = V(child a); "not a" is the other action
        out[((), a)] = (PI_ROOT[a], v_child[a] - v_child[1 - a])
    for a0 in (0, 1):
        for a in (0, 1):
            out[((a0,), a)] = (PI_CHILD[a0][a], P_SUCCESS[a0][a] - P_SUCCESS[a0][1 - a])
    return out


def _rollouts(prefix: tuple, forced: int | None, n: int, g: torch.Generator) -> torch.Tensor:
    """n rewards of continuations from the state ``prefix`` (its next action forced when given)."""

    def draw(p1: torch.Tensor) -> torch.Tensor:  # action 1 with probability p1
        return (torch.rand(n, generator=g, dtype=F64) < p1).long()

    pi_child_1 = torch.tensor([PI_CHILD[0][1], PI_CHILD[1][1]], dtype=F64)
    if prefix == ():
        a0 = torch.full((n,), forced) if forced is not None else draw(torch.full((n,), PI_ROOT[1], dtype=F64))
        a1 = draw(pi_child_1[a0])
    else:
        a0 = torch.full((n,), prefix[0])
        a1 = torch.full((n,), forced) if forced is not None else draw(pi_child_1[a0])
    return draw(torch.tensor(P_SUCCESS, dtype=F64)[a0, a1]).to(F64)


def test_counterfactual_value_eq20_on_a_tabular_tree() -> None:
    g = _gen(11)
    n = 20_000
    naive_biased = False
    for (prefix, a), (pi, exact) in _exact_values().items():
        forced = _rollouts(prefix, a, n, g)
        state = _rollouts(prefix, None, n, g)
        se_naive = math.sqrt(forced.var() / n + state.var() / n)
        est = float(counterfactual_value(forced.mean(), state.mean(), torch.tensor(pi, dtype=F64)))
        assert abs(est - exact) < 4.5 * se_naive / (1 - pi), (prefix, a, est, exact)
        naive = float(forced.mean() - state.mean())
        naive_biased |= abs(naive - exact) > 4.5 * se_naive
    assert naive_biased  # without the 1/(1 − π) the estimate is attenuated


def test_counterfactual_value_broadcasts_and_guards_pi_one() -> None:
    mf = torch.tensor([[0.8], [0.4]], dtype=F64)
    ms = torch.tensor([0.5, 0.6, 0.2], dtype=F64)
    pi = torch.tensor([0.5, 1.0, 0.75], dtype=F64)
    out = counterfactual_value(mf, ms, pi)
    assert out.shape == (2, 3)
    torch.testing.assert_close(out[:, 0], torch.tensor([0.6, -0.2], dtype=F64))
    torch.testing.assert_close(out[:, 2], torch.tensor([2.4, 0.8], dtype=F64))
    assert bool(out[:, 1].isnan().all())
    near = 1 - 1e-7
    assert math.isnan(float(counterfactual_value(0.6, 0.5, near)))
    assert float(counterfactual_value(0.6, 0.5, near, min_alt_prob=0.0)) == pytest.approx(0.1 / (1 - near))
    assert float(counterfactual_value(0.7, 0.5, 0.0)) == pytest.approx(0.2)


def test_counterfactual_value_min_alt_prob_zero_guards_pi_one_exactly() -> None:
    # min_alt_prob = 0: NaN only where π(a|s) = 1 exactly (1 − π = 0: no alternative is ever sampled), never
    # the ±inf or 0/0 of an unguarded division; just below 1 the value is (R̄(s, a) − R̄(s)) / (1 − π)
    pi = torch.tensor([1.0, 1.0, 1.0, 0.5], dtype=F64)
    out = counterfactual_value(torch.tensor([0.75, 0.25, 0.5, 0.75], dtype=F64), 0.5, pi, min_alt_prob=0.0)
    assert bool(out[:3].isnan().all()), out
    assert float(out[3]) == 0.5  # 0.25 / 0.5, exact in binary
    below = 1.0 - 2.0**-40
    assert float(counterfactual_value(0.75, 0.5, below, min_alt_prob=0.0)) == 0.25 * 2.0**40


def test_counterfactual_value_guard_includes_its_threshold() -> None:
    # NaN where 1 − π ≤ min_alt_prob: 1 − 0.75 = 0.25 exactly, so min_alt_prob = 0.25 guards it and 0.125 not
    assert math.isnan(float(counterfactual_value(0.75, 0.5, 0.75, min_alt_prob=0.25)))
    assert float(counterfactual_value(0.75, 0.5, 0.75, min_alt_prob=0.125)) == 1.0  # 0.25 / 0.25


# --------------------------------------------------------------------------------------------
# bad input


def _v(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=F64)


def test_value_gap_by_hand_and_entropy_top_k() -> None:
    values = _v(1.0, 0.5, math.nan, -0.2, 0.4, 0.0)
    delta = _v(0.3, -0.1, 0.2, -0.4, 0.0, 0.1)
    entropy = _v(0.9, 0.1, 0.8, 0.7, 0.6, 0.2)
    # all tokens: boosted {0, 5} (2 has a NaN value, 4 a zero delta), suppressed {1, 3}
    g = value_gap(values, delta)
    assert (g.n_boosted, g.n_suppressed) == (2, 2)
    assert g.boosted == pytest.approx(0.5) and g.suppressed == pytest.approx(0.15)
    assert g.gap == pytest.approx(0.35)
    # top half by entropy = tokens {0, 2, 3}: boosted {0}, suppressed {3}
    h = value_gap(values, delta, entropy, top_frac=0.5)
    assert (h.n_boosted, h.n_suppressed) == (1, 1) and h.gap == pytest.approx(1.2)
    # no suppressed token among the top third {0, 2}: the gap is undefined, not 0
    t = value_gap(values, delta, entropy, top_frac=1 / 3)
    assert t.n_suppressed == 0 and math.isnan(t.gap) and t.boosted == pytest.approx(1.0)
    # top_frac · N = 0.4 · 6 = 2.4 rounds up: the top 3 {0, 2, 3}, as for top_frac = 0.5
    u = value_gap(values, delta, entropy, top_frac=0.4)
    assert (u.n_boosted, u.n_suppressed) == (1, 1) and u.gap == pytest.approx(1.2)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: coupling_kernel(_v(1.0, 2.0)), "scores"),
        (lambda: coupling_kernel(torch.tensor([[1.0, math.nan]], dtype=F64)), "scores"),
        (lambda: output_overlap(torch.full((3, 4), 0.25, dtype=F64), torch.tensor([0, 1])), "tokens"),
        (lambda: output_overlap(torch.full((2, 4), 0.25, dtype=F64), torch.tensor([0, 4])), "tokens"),
        (lambda: output_overlap(torch.full((2,), 0.25, dtype=F64), torch.tensor([0, 1])), "probs"),
        (
            lambda: proxy_kernel(
                torch.ones(3, 2, dtype=F64), torch.full((2, 4), 0.25, dtype=F64), torch.tensor([0, 1])
            ),
            "probs",
        ),
        (
            lambda: proxy_kernel(
                torch.ones(2, 2, dtype=F64), torch.full((2, 4), 0.25, dtype=F64), torch.tensor([0, 1]), 0.0
            ),
            "temperature",
        ),
        (
            lambda: proxy_kernel(
                torch.tensor([[math.inf, 0.0]] * 2, dtype=F64),
                torch.full((2, 4), 0.25, dtype=F64),
                torch.tensor([0, 1]),
            ),
            "hidden",
        ),
        (lambda: first_order_delta(torch.eye(2, dtype=F64), _v(1.0, 2.0), -0.1), "lr"),
        (lambda: first_order_delta(torch.eye(2, dtype=F64), _v(1.0, 2.0), math.nan), "lr"),
        (lambda: first_order_delta(torch.eye(3, dtype=F64), _v(1.0, 2.0), 0.1), "kernel"),
        (lambda: first_order_delta(torch.eye(2, dtype=F64), _v(1.0, math.inf), 0.1), "coef"),
        (
            lambda: first_order_masking_effect(
                torch.eye(2, dtype=F64), _v(1.0, 2.0), torch.ones(2, 2, dtype=torch.bool), 0.1
            ),
            "masks",
        ),
        (
            lambda: first_order_masking_effect(
                torch.eye(2, dtype=F64), _v(1.0, 2.0), torch.zeros(2, 3, dtype=torch.bool), 0.1
            ),
            "masks",
        ),
        (
            lambda: first_order_masking_effect(
                torch.eye(2, dtype=F64), _v(1.0, 2.0), torch.zeros(2, 2, dtype=torch.bool), -1.0
            ),
            "lr",
        ),
        (
            lambda: masking_effect(
                lambda c: c, _v(1.0, 2.0), torch.zeros(1, 2, dtype=torch.bool), candidates=torch.tensor([2])
            ),
            "candidates",
        ),
        (lambda: masking_effect(lambda c: c[:1], _v(1.0, 2.0), torch.zeros(2, 2, dtype=torch.bool)), "step"),
        (lambda: mask_sets(MS_TOKENS, MS_PROBS, 6), "candidate"),
        (lambda: mask_sets(MS_TOKENS, MS_PROBS, 0, same_sign=True), "advantages"),
        (lambda: mask_sets(MS_TOKENS, MS_PROBS, 0, advantages=MS_ADV[:3], same_sign=True), "advantages"),
        (lambda: mask_sets(MS_TOKENS, MS_PROBS, 0, size=6), "size"),
        (lambda: mask_sets(MS_TOKENS, MS_PROBS + 0.2, 0), "probs_taken"),
        (lambda: mask_sets(MS_TOKENS, MS_PROBS, 0, low_conf=1.5), "low_conf"),
        (lambda: boost_stats(torch.zeros(0, dtype=F64)), "masking_effect"),
        (lambda: boost_stats(_v(0.1, math.nan)), "masking_effect"),
        (
            lambda: coupling_mass(
                torch.eye(2, dtype=F64), _v(1.0, 2.0), torch.tensor([1, 2, 3]), _v(0.1, 0.2)
            ),
            "tokens",
        ),
        (lambda: update_norm_split(torch.ones(3, 4, dtype=F64), _v(1.0, -1.0)), "advantages"),
        (lambda: update_norm_split(torch.ones(4, dtype=F64), _v(1.0, -1.0)), "response_scores"),
        (lambda: surviving_signal(_v(1.0, -1.0), _v(1.0, 2.0, 3.0)), "projections"),
        (lambda: counterfactual_value(0.5, 0.4, 1.2), "pi_a"),
        (lambda: counterfactual_value(math.nan, 0.4, 0.2), "mean_forced"),
        (lambda: counterfactual_value(_v(0.5, 0.6), _v(0.1, 0.2, 0.3), 0.2), "mean_state"),
        (lambda: counterfactual_value(0.5, 0.4, 0.2, min_alt_prob=1.0), "min_alt_prob"),
        (lambda: per_token_scores(lambda: _v(1.0, 2.0), [torch.ones(2, dtype=F64)]), "params"),
        (lambda: value_gap(_v(1.0, 2.0), _v(0.1)), "delta"),
        (lambda: value_gap(_v(1.0, 2.0), _v(0.1, -0.1), top_frac=0.5), "entropy"),
        (lambda: value_gap(_v(1.0, 2.0), _v(0.1, -0.1), _v(1.0, 2.0), top_frac=0.0), "top_frac"),
        (lambda: sgd_step(_net_logp, _net_params(), -0.5), "lr"),
        (lambda: sgd_update(_net_logp, _net_params(), COEF[:2], 0.1), "coef"),
    ],
)
def test_bad_input_raises_naming_the_argument(call, name: str) -> None:
    with pytest.raises(ValueError, match=f"`{name}"):
        call()
