"""toymodel.values: the exact counterfactual token value of arXiv 2605.08666 (App. E.2, eq. 20).

Independent references: a plain Python loop over the support's trajectories (tuples of tokens) that sums
π(τ) and π(τ)·R(τ) over the trajectories extending a prefix, and gets E[R | s, not a] from the siblings
directly (never through (Q − V)/(1 − π)); Monte Carlo continuations sampled token by token with torch from
a hand-written tree policy (eq. 20's R̄(s, a) and R̄(s)); a 2-step tree worked by hand.
"""

from __future__ import annotations

import math

import pytest
import torch

from toymodel import NeuralPolicy, TabularPolicy, TokenValues, exact_token_values, get_scenario

#: Every comparison here is between two float64 computations of the same number, at a tolerance well above
#: float64's rounding (exact token values vs enumeration of the tree and hand-worked cases):
#: ``tests/exactness.py``.
pytestmark = pytest.mark.exactness

# ------------------------------------------------------------------------------------------------
# the plain-loop reference


def loop_values(
    trajs: list[tuple[str, ...]], rewards: list[float], probs: list[float], which: list[int]
) -> list[list[tuple[float, float, float, float, float]]]:
    """Per step of trajectory ``which[b]``: (Q, V, π, E[R | s, not a], value = Q − E[R | s, not a]).

    Plain floats over tuples; a forced token (no alternative in the support) gets E[R | s, not a] and the
    value NaN.
    """
    out = []
    for i in which:
        tau = trajs[i]
        row = []
        for t in range(len(tau)):
            s, a = tau[:t], tau[t]
            m_s = w_s = m_a = w_a = m_alt = w_alt = 0.0
            for tau2, r, p in zip(trajs, rewards, probs, strict=True):
                if tau2[:t] != s:
                    continue
                m_s += p
                w_s += p * r
                if tau2[t] == a:
                    m_a += p
                    w_a += p * r
                else:
                    m_alt += p
                    w_alt += p * r
            q, v = w_a / m_a, w_s / m_s
            alt = w_alt / m_alt if m_alt > 0 else math.nan
            row.append((q, v, m_a / m_s, alt, q - alt))
        out.append(row)
    return out


def _random_logits(pol: TabularPolicy, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn((pol.C, pol.K), generator=g, dtype=torch.float64) * 1.5
    return torch.where(pol.valid, z, torch.full_like(z, float("-inf")))


def _check_against_loop(pol: TabularPolicy | NeuralPolicy, probs: torch.Tensor, idx: torch.Tensor) -> None:
    st = pol.structure if isinstance(pol, NeuralPolicy) else pol
    ref = loop_values(st.trajectories, st.rewards.tolist(), probs.tolist(), idx.tolist())
    tv = exact_token_values(pol, probs, idx)
    assert isinstance(tv, TokenValues)
    for x in tv:
        assert x.shape == (idx.shape[0], st.T) and x.dtype == torch.float64
    for b, row in enumerate(ref):
        for t, (q, v, pi, _alt, value) in enumerate(row):
            assert float(tv.q[b, t]) == pytest.approx(q, abs=1e-12)
            assert float(tv.v[b, t]) == pytest.approx(v, abs=1e-12)
            assert float(tv.pi[b, t]) == pytest.approx(pi, abs=1e-12)
            if math.isnan(value):
                assert math.isnan(float(tv.value[b, t]))
            else:
                assert float(tv.value[b, t]) == pytest.approx(value, abs=1e-9)
        for t in range(len(row), st.T):  # padding
            assert all(math.isnan(float(x[b, t])) for x in tv)


@pytest.mark.parametrize("name", ["shared_prefix", "equivalent_solutions", "clip_asymmetry"])
def test_tabular_matches_the_plain_loop(name: str) -> None:
    pol = get_scenario(name).policy()
    logits = _random_logits(pol, 3)
    idx = torch.tensor([*range(pol.N), 0, pol.N - 1])  # every trajectory, and repeats
    _check_against_loop(pol, pol.probs(logits), idx)


def test_position_contexts_are_valued_by_prefix_not_by_context() -> None:
    """Two prefixes sharing one softmax (context="position") have different values when R depends on them."""
    support = [("answer", "25"), ("answer", "20"), ("result", "25"), ("result", "20")]
    rewards = [0.0, 1.0, 1.0, 0.0]  # XOR: which second token pays depends on the first
    pol = TabularPolicy(support, rewards, context="position")
    logits = pol.logits_from_probs({0: {"answer": 0.6, "result": 0.4}, 1: {"25": 0.3, "20": 0.7}})
    probs = pol.probs(logits)
    idx = torch.arange(4)
    _check_against_loop(pol, probs, idx)
    tv = exact_token_values(pol, probs, idx)
    # '20' after 'answer' is worth +1, after 'result' −1, though both are one context
    assert float(tv.value[1, 1]) == pytest.approx(1.0, abs=1e-12)
    assert float(tv.value[3, 1]) == pytest.approx(-1.0, abs=1e-12)


@pytest.mark.parametrize(("name", "context"), [("shared_prefix", "prefix"), ("shared_prefix", "position")])
def test_neural_matches_the_plain_loop(name: str, context: str) -> None:
    pol = NeuralPolicy.from_scenario(name, context=context)
    params = pol.init_params(5, scale=2.0)
    with torch.no_grad():
        probs = pol.probs(params)
    _check_against_loop(pol, probs, torch.arange(pol.N))


def test_template_task_neural_on_a_sample() -> None:
    pol = NeuralPolicy.from_scenario("template_task")
    params = pol.init_params(1)
    with torch.no_grad():
        probs = pol.probs(params)
    idx = pol.sample(6, params, torch.Generator().manual_seed(0))
    _check_against_loop(pol, probs, idx)
    # the net's own π(a|s) is the tree's ratio M(τ[:t+1]) / M(τ[:t])
    tv = exact_token_values(pol, probs, idx)
    with torch.no_grad():
        pi_net = pol.token_logp(params, idx).exp()
    m = pol.step_mask(idx).bool()
    torch.testing.assert_close(tv.pi[m], pi_net[m], atol=1e-12, rtol=0)


# ------------------------------------------------------------------------------------------------
# (c) a 2-step tree worked by hand


def test_hand_worked_two_step_tree() -> None:
    """Root: A 0.6, B 0.4. After A: x 0.5, y 0.5; after B: x 0.25, y 0.75. (A, x) ends with a forced '.'.

    R(A x .) = 1, R(A y) = 0, R(B x) = 0, R(B y) = 1. Trajectory probabilities: A x . 0.3, A y 0.3,
    B x 0.1, B y 0.3; E[R] = 0.3 + 0.3 = 0.6.

    Step 0: V = 0.6. Token A: Q = E[R | A] = 0.3/0.6 = 0.5, π = 0.6, value = (0.5 − 0.6)/0.4 = −0.25
    (= Q − E[R | B] = 0.5 − 0.75). Token B: Q = E[R | B] = 0.3/0.4 = 0.75, π = 0.4,
    value = (0.75 − 0.6)/0.6 = +0.25 (= 0.75 − 0.5).
    Step 1 after A (V = 0.5): x: Q = 1, π = 0.5, value = (1 − 0.5)/0.5 = +1; y: Q = 0, value = −1.
    Step 1 after B (V = 0.75): x: Q = 0, π = 0.25, value = (0 − 0.75)/0.75 = −1; y: Q = 1, π = 0.75,
    value = (1 − 0.75)/0.25 = +1.
    Step 2 of A x .: '.' is forced: π = 1, Q = V = 1, value NaN. The other trajectories are padding there.
    """
    support = [("A", "x", "."), ("A", "y"), ("B", "x"), ("B", "y")]
    pol = TabularPolicy(support, [1.0, 0.0, 0.0, 1.0])
    logits = pol.logits_from_probs(
        {(): {"A": 0.6, "B": 0.4}, ("A",): {"x": 0.5, "y": 0.5}, ("B",): {"x": 0.25, "y": 0.75}}
    )
    probs = pol.probs(logits)
    torch.testing.assert_close(probs, torch.tensor([0.3, 0.3, 0.1, 0.3], dtype=torch.float64))
    tv = exact_token_values(pol, probs, torch.arange(4))
    nan = math.nan
    want = {
        "value": [[-0.25, 1.0, nan], [-0.25, -1.0, nan], [0.25, -1.0, nan], [0.25, 1.0, nan]],
        "q": [[0.5, 1.0, 1.0], [0.5, 0.0, nan], [0.75, 0.0, nan], [0.75, 1.0, nan]],
        "v": [[0.6, 0.5, 1.0], [0.6, 0.5, nan], [0.6, 0.75, nan], [0.6, 0.75, nan]],
        "pi": [[0.6, 0.5, 1.0], [0.6, 0.5, nan], [0.4, 0.25, nan], [0.4, 0.75, nan]],
    }
    for key, rows in want.items():
        torch.testing.assert_close(
            getattr(tv, key), torch.tensor(rows, dtype=torch.float64), atol=1e-12, rtol=0, equal_nan=True
        )
    # the forced '.' has π = 1 exactly (not a rounded ratio)
    assert float(tv.pi[0, 2]) == 1.0


# ------------------------------------------------------------------------------------------------
# (d) the identity V = π·Q + (1 − π)·E[R | s, not a]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_state_value_mixes_the_token_and_its_alternatives(seed: int) -> None:
    pol = get_scenario("shared_prefix").policy()
    probs = pol.probs(_random_logits(pol, seed))
    idx = torch.arange(pol.N)
    tv = exact_token_values(pol, probs, idx)
    ref = loop_values(pol.trajectories, pol.rewards.tolist(), probs.tolist(), idx.tolist())
    for b, row in enumerate(ref):
        for t, (_q, _v, _pi, alt, _value) in enumerate(row):
            pi, q, v = float(tv.pi[b, t]), float(tv.q[b, t]), float(tv.v[b, t])
            assert pi * q + (1.0 - pi) * alt == pytest.approx(v, abs=1e-12)
            # and the value is exactly what taking a gains over an alternative
            assert float(tv.value[b, t]) == pytest.approx(q - alt, abs=1e-9)


# ------------------------------------------------------------------------------------------------
# (b) Monte Carlo continuations (eq. 20) from a hand-written tree policy

TREE: dict[tuple[str, ...], dict[str, float]] = {
    (): {"a": 0.5, "b": 0.3, "c": 0.2},
    ("a",): {"x": 0.7, "y": 0.3},
    ("b",): {"x": 0.4, "y": 0.6},
    ("c",): {"z": 1.0},
    ("a", "x"): {"u": 0.5, "w": 0.5},
    ("a", "y"): {"u": 0.1, "w": 0.9},
    ("b", "x"): {"u": 0.8, "w": 0.2},
    ("b", "y"): {"u": 0.3, "w": 0.7},
    ("c", "z"): {"u": 0.6, "w": 0.4},
}


def tree_reward(tau: tuple[str, ...]) -> float:
    """A non-binary reward that depends on the whole path."""
    return {"a": 0.0, "b": 1.0, "c": 0.5}[tau[0]] + (2.0 if tau[-1] == "u" else 0.0) - (tau[1] == "y")


def rollout(prefix: tuple[str, ...], n: int, gen: torch.Generator) -> torch.Tensor:
    """(n,) rewards of n continuations of ``prefix`` sampled token by token from ``TREE``."""
    out = torch.empty(n, dtype=torch.float64)
    for k in range(n):
        tau = prefix
        while tau in TREE:
            toks = list(TREE[tau])
            p = torch.tensor([TREE[tau][a] for a in toks], dtype=torch.float64)
            tau = (*tau, toks[int(torch.multinomial(p, 1, generator=gen))])
        out[k] = tree_reward(tau)
    return out


def test_monte_carlo_eq20_estimate_is_within_4_5_se_of_the_exact_value() -> None:
    leaves: list[tuple[str, ...]] = []

    def walk(tau: tuple[str, ...]) -> None:
        if tau not in TREE:
            leaves.append(tau)
        else:
            for a in TREE[tau]:
                walk((*tau, a))

    walk(())
    pol = TabularPolicy(leaves, [tree_reward(tau) for tau in leaves])
    logits = pol.logits_from_probs({k: v for k, v in TREE.items() if len(v) > 1})
    probs = pol.probs(logits)
    tv = exact_token_values(pol, probs, torch.arange(pol.N))
    gen = torch.Generator().manual_seed(1234)
    n = 1500
    checked: set[tuple[str, ...]] = set()
    for i, tau in enumerate(leaves):
        for t in range(len(tau)):
            s, a = tau[:t], tau[t]
            pi = TREE[s][a]
            if (*s, a) in checked:
                continue
            checked.add((*s, a))
            if pi == 1.0:  # forced: no alternative, the value is NaN
                assert math.isnan(float(tv.value[i, t]))
                continue
            forced, state = rollout((*s, a), n, gen), rollout(s, n, gen)
            # eq. (20): (R̄(s, a) − R̄(s)) / (1 − π(a|s)), two independent sample means
            est = (float(forced.mean()) - float(state.mean())) / (1.0 - pi)
            se = math.sqrt(float(forced.var()) / n + float(state.var()) / n) / (1.0 - pi)
            exact = float(tv.value[i, t])
            assert abs(est - exact) < 4.5 * se + 1e-12, (s, a, est, exact, se)
    assert len(checked) == 3 + 2 + 2 + 1 + 5 * 2  # every (state, token) pair of the tree


# ------------------------------------------------------------------------------------------------
# (e) bad input


def test_bad_input_names_the_argument() -> None:
    pol = get_scenario("shared_prefix").policy()
    probs = pol.probs(pol.uniform_logits())
    idx = torch.arange(3)
    with pytest.raises(ValueError, match="`policy`"):
        exact_token_values("shared_prefix", probs, idx)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`traj_probs`"):
        exact_token_values(pol, probs.tolist(), idx)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`traj_probs`.*shape"):
        exact_token_values(pol, probs[:-1], idx)
    with pytest.raises(ValueError, match=r"`traj_probs`.*shape"):
        exact_token_values(pol, probs[None], idx)
    with pytest.raises(ValueError, match=r"`traj_probs`.*floating"):
        exact_token_values(pol, torch.ones(pol.N, dtype=torch.long), idx)
    with pytest.raises(ValueError, match=r"`traj_probs`.*negative"):
        exact_token_values(pol, probs.log(), idx)
    with pytest.raises(ValueError, match=r"`traj_probs`.*sum to 1"):
        exact_token_values(pol, 2 * probs, idx)
    neg = probs.clone()
    neg[0], neg[1] = -0.1, neg[1] + 0.1 + probs[0]
    with pytest.raises(ValueError, match=r"`traj_probs`.*negative"):
        exact_token_values(pol, neg, idx)
    bad = probs.clone()
    bad[0] = math.nan
    with pytest.raises(ValueError, match=r"`traj_probs`.*NaN"):
        exact_token_values(pol, bad, idx)
    with pytest.raises(ValueError, match="`idx`"):
        exact_token_values(pol, probs, idx.double())
    with pytest.raises(ValueError, match="`idx`"):
        exact_token_values(pol, probs, idx[None])
    with pytest.raises(ValueError, match="`idx`"):
        exact_token_values(pol, probs, [0, 1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`idx`.*outside"):
        exact_token_values(pol, probs, torch.tensor([pol.N]))
    with pytest.raises(ValueError, match=r"`idx`.*outside"):
        exact_token_values(pol, probs, torch.tensor([-1]))
    with pytest.raises(ValueError, match="`min_alt_prob`"):
        exact_token_values(pol, probs, idx, min_alt_prob=1.0)


def test_empty_idx_and_float32_probs() -> None:
    pol = get_scenario("shared_prefix").policy()
    probs = pol.probs(_random_logits(pol, 0))
    tv = exact_token_values(pol, probs, torch.zeros(0, dtype=torch.long))
    assert tv.value.shape == (0, pol.T)
    # float32 probabilities are used in float64 (the result is float64 whatever the input)
    tv32 = exact_token_values(pol, probs.float(), torch.arange(pol.N))
    assert tv32.value.dtype == torch.float64
    tv64 = exact_token_values(pol, probs, torch.arange(pol.N))
    torch.testing.assert_close(tv32.value, tv64.value, atol=1e-5, rtol=0)
