"""TabularPolicy: exact probabilities, sampling, KL chain rule, hand values, closed-form gradients.

Independent references: plain Python loops over the trajectories (a dict of per-context softmaxes and
a product per trajectory), hand-worked values, and autograd.
"""

from __future__ import annotations

import math

import pytest
import torch

from toymodel.policy import TabularPolicy
from toymodel.scenarios import (
    CLIP_ASYMMETRY,
    EQUIVALENT_SOLUTIONS,
    SCENARIOS,
    SHARED_PREFIX,
    TEMPLATE_TASK,
    get_scenario,
)

from .sampling import sample_by_hand

#: Every comparison here is between two float64 computations of the same number, at a tolerance well above
#: float64's rounding (the tabular policy vs enumeration and autograd): ``tests/exactness.py``.
pytestmark = pytest.mark.exactness


def random_logits(policy: TabularPolicy, seed: int, scale: float = 1.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn((policy.C, policy.K), generator=g, dtype=torch.float64) * scale
    return torch.where(policy.valid, z, torch.full_like(z, float("-inf")))


def loop_probs(policy: TabularPolicy, logits: torch.Tensor) -> list[float]:
    """π(τ) by a plain loop: per step, the softmax over the context's actions (Python floats)."""
    out = []
    for tau in policy.trajectories:
        p = 1.0
        for t, tok in enumerate(tau):
            key = tau[:t] if policy.context_mode == "prefix" else t
            c = policy.context_id(key)
            acts = policy.actions[c]
            zs = [float(logits[c, k]) for k in range(len(acts))]
            m = max(zs)
            den = sum(math.exp(z - m) for z in zs)
            p *= math.exp(zs[acts.index(tok)] - m) / den
        out.append(p)
    return out


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_probabilities_sum_to_one_and_match_a_plain_loop(name: str, seed: int) -> None:
    policy = get_scenario(name).policy()
    logits = random_logits(policy, seed)
    p = policy.probs(logits)
    assert abs(float(p.sum()) - 1.0) < 1e-12
    ref = loop_probs(policy, logits)
    assert max(abs(a - b) for a, b in zip(p.tolist(), ref, strict=True)) < 1e-13
    assert abs(sum(ref) - 1.0) < 1e-12


def test_hand_values_at_uniform_equivalent_solutions() -> None:
    # App. A.1: uniform first token (The / 10), uniform answer (25 / 20): π = (1/4, 1/4, 1/2)
    sc = EQUIVALENT_SOLUTIONS
    policy = sc.policy()
    logits = sc.initial_logits()
    assert policy.probs(logits).tolist() == pytest.approx([0.25, 0.25, 0.5], abs=1e-15)
    assert policy.expected_reward(logits) == pytest.approx(0.75, abs=1e-15)
    # H = 2·(1/4)·ln 4 + (1/2)·ln 2 = 1.5·ln 2
    assert policy.entropy(logits) == pytest.approx(1.5 * math.log(2), abs=1e-14)
    # over {τ2, τ3}: (1/3, 2/3): H = ln 3 − (2/3)·ln 2; log-odds ln(1/4 ÷ 1/2) = −ln 2
    assert policy.equiv_entropy(logits) == pytest.approx(math.log(3) - 2 / 3 * math.log(2), abs=1e-14)
    assert policy.equiv_log_odds(logits) == pytest.approx(-math.log(2), abs=1e-14)
    assert [len(tau) for tau in policy.trajectories] == [5, 5, 6]


def test_hand_values_of_the_other_initial_policies() -> None:
    # shared_prefix: every last-step context has π(20) = 0.3
    assert SHARED_PREFIX.policy().expected_reward(SHARED_PREFIX.initial_logits()) == pytest.approx(
        0.3, abs=1e-14
    )
    # template_task: π(correct) = 0.3 whatever the template
    tt = TEMPLATE_TASK.policy()
    assert tt.N == 3**5 * 3 and tt.T == 7
    assert tt.expected_reward(TEMPLATE_TASK.initial_logits()) == pytest.approx(0.3, abs=1e-14)
    # the all-first-synonym correct completion: 0.7^5 · 0.3
    i = tt.trajectory_index(TEMPLATE_TASK.equivalent[0])
    assert float(tt.probs(TEMPLATE_TASK.initial_logits())[i]) == pytest.approx(0.7**5 * 0.3, rel=1e-13)
    # clip_asymmetry: uniform, 4 trajectories
    assert CLIP_ASYMMETRY.policy().probs(CLIP_ASYMMETRY.initial_logits()).tolist() == pytest.approx(
        [0.25] * 4
    )


@pytest.mark.parametrize("name", ["equivalent_solutions", "shared_prefix", "clip_asymmetry"])
def test_sampled_frequencies_match_exact_probabilities(name: str) -> None:
    policy = get_scenario(name).policy()
    logits = random_logits(policy, 7, scale=1.0)
    n = 20_000
    idx = policy.sample(n, logits, torch.Generator().manual_seed(0))
    freq = torch.bincount(idx, minlength=policy.N).to(torch.float64) / n
    p = torch.tensor(loop_probs(policy, logits), dtype=torch.float64)
    std = (p * (1 - p) / n).sqrt()
    # 5 binomial standard deviations per trajectory (a false alarm has probability < 1e-5 per entry)
    assert bool(((freq - p).abs() <= 5 * std + 1e-12).all())


def test_sample_is_reproducible_with_a_generator() -> None:
    policy = TEMPLATE_TASK.policy()
    logits = TEMPLATE_TASK.initial_logits()
    a = policy.sample(50, logits, torch.Generator().manual_seed(3))
    b = policy.sample(50, logits, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def _dyadic_logits(policy: TabularPolicy, m: int, seed: int) -> torch.Tensor:
    """Logits whose every π(a|h) is a multiple of 1/m (a random composition of m per context)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.full((policy.C, policy.K), float("-inf"), dtype=torch.float64)
    for c, acts in enumerate(policy.actions):
        k = len(acts)
        cuts = sorted((torch.randperm(m - 1, generator=g)[: k - 1] + 1).tolist())
        parts = [b - a for a, b in zip([0, *cuts], [*cuts, m], strict=True)]
        z[c, :k] = torch.tensor(parts, dtype=torch.float64).log()
    return z


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("seed", [0, 1])
def test_per_position_sampling_gives_each_trajectory_its_exact_measure(name: str, seed: int) -> None:
    """Exactness by measure: with every π(a|h) a multiple of 1/m, the sampler is constant on each cell of
    the m^T grid of [0, 1)^T (every boundary F(a|h) is a multiple of 1/m), so mapping the cells'
    midpoints gives trajectory τ exactly m^T·π(τ) cells when the per-position draws are distributed
    exactly as π. π(τ) by the plain loop (a product of the integers over m^T, exact in float64)."""
    policy = get_scenario(name).policy()
    m = 4 if policy.K <= 4 else 8
    logits = _dyadic_logits(policy, m, seed)
    axes = [(torch.arange(m, dtype=torch.float64) + 0.5) / m] * policy.T
    grid = torch.cartesian_prod(*axes).reshape(-1, policy.T)  # (m^T, T) midpoints
    counts = torch.bincount(policy.sample_from_uniforms(logits, grid), minlength=policy.N)
    expected = [round(p * m**policy.T) for p in loop_probs(policy, logits)]
    assert sum(expected) == m**policy.T
    assert counts.tolist() == expected


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_per_position_sampling_equals_a_plain_loop(name: str) -> None:
    """Draw for draw on random uniforms and random policies, one table and a batch of tables (per seed)."""
    policy = get_scenario(name).policy()
    gen = torch.Generator().manual_seed(5)
    tables = torch.stack([random_logits(policy, s) for s in range(3)])  # (3, C, K)
    u = torch.rand(3, 40, policy.T, dtype=torch.float64, generator=gen)
    batched = policy.sample_from_uniforms(tables, u)
    assert batched.shape == (3, 40)
    for s in range(3):
        one = policy.sample_from_uniforms(tables[s], u[s])
        assert torch.equal(one, batched[s])
        assert one.tolist() == sample_by_hand(policy, tables[s], u[s])
    # a uniform at 0 picks the first action of positive probability; near 1, the last one
    z = policy.uniform_logits()
    first = policy.sample_from_uniforms(z, torch.zeros(1, policy.T, dtype=torch.float64))
    last = policy.sample_from_uniforms(z, torch.full((1, policy.T), 1 - 2**-53, dtype=torch.float64))
    assert int(first) == 0
    tau = []
    while tuple(tau) not in policy.trajectories:
        c = policy.context_id(tuple(tau) if policy.context_mode == "prefix" else len(tau))
        tau.append(policy.actions[c][-1])
    assert int(last) == policy.trajectory_index(tau)


def test_per_position_sampling_rejects_misshapen_uniforms() -> None:
    policy = TEMPLATE_TASK.policy()
    z = TEMPLATE_TASK.initial_logits()
    with pytest.raises(ValueError, match="T = 7"):
        policy.sample_from_uniforms(z, torch.rand(4, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match="leading shape"):
        policy.sample_from_uniforms(z, torch.rand(2, 4, 7, dtype=torch.float64))


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_kl_chain_rule_over_all_contexts_equals_trajectory_kl(name: str) -> None:
    policy = get_scenario(name).policy()
    lp, lq = random_logits(policy, 11), random_logits(policy, 12)
    p, q = loop_probs(policy, lp), loop_probs(policy, lq)
    traj_kl = sum(a * math.log(a / b) for a, b in zip(p, q, strict=True))
    assert policy.kl_to(lp, lq) == pytest.approx(traj_kl, rel=1e-11, abs=1e-13)
    assert policy.trajectory_kl(lp, lq) == pytest.approx(traj_kl, rel=1e-11, abs=1e-13)
    # the per-context parts add up, and every part is ≥ 0
    parts = [policy.kl_to(lp, lq, [c]) for c in range(policy.C)]
    assert all(x >= 0 for x in parts)
    assert sum(parts) == pytest.approx(traj_kl, rel=1e-11, abs=1e-13)
    assert policy.stats(lp, lq, None)["kl"] == pytest.approx(traj_kl, rel=1e-11, abs=1e-13)


def test_context_visit_probs_by_a_plain_loop() -> None:
    policy = SHARED_PREFIX.policy()
    logits = random_logits(policy, 5)
    p = loop_probs(policy, logits)
    d = [0.0] * policy.C
    for i, tau in enumerate(policy.trajectories):
        for t in range(len(tau)):
            d[policy.context_id(tau[:t])] += p[i]
    assert policy.context_visit_probs(logits).tolist() == pytest.approx(d, abs=1e-14)
    assert float(policy.context_visit_probs(logits)[policy.context_id(())]) == pytest.approx(1.0, abs=1e-14)


def test_template_kl_of_the_lattice_is_per_position() -> None:
    # position mode: every position is visited with probability 1, so the template KL is Σ_t KL_t
    policy = TEMPLATE_TASK.policy()
    lp, lq = random_logits(policy, 1), random_logits(policy, 2)
    ids = TEMPLATE_TASK.template_context_ids()
    by_hand = 0.0
    for c in ids.tolist():
        n = len(policy.actions[c])
        a = torch.softmax(lp[c, :n], -1).tolist()
        b = torch.softmax(lq[c, :n], -1).tolist()
        by_hand += sum(x * math.log(x / y) for x, y in zip(a, b, strict=True))
    assert policy.kl_to(lp, lq, ids) == pytest.approx(by_hand, rel=1e-12)


def test_template_contexts_get_zero_exact_policy_gradient() -> None:
    # template choices are independent of the reward: ∂E[R]/∂z = 0 on template contexts, for any θ
    policy = TEMPLATE_TASK.policy()
    logits = random_logits(policy, 4).requires_grad_(True)
    (policy.probs(logits) @ policy.rewards).backward()
    grad = logits.grad
    ids = TEMPLATE_TASK.template_context_ids()
    assert float(grad[ids].abs().max()) < 1e-15
    decide = policy.context_id(5)
    assert float(grad[decide].abs().max()) > 1e-3


def test_logits_grad_equals_autograd() -> None:
    policy = EQUIVALENT_SOLUTIONS.policy()
    logits = random_logits(policy, 3)
    idx = torch.tensor([0, 2, 2, 1, 0])
    g_logp = torch.randn((5, policy.T), dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    leaf = logits.clone().requires_grad_(True)
    (policy.token_logp(leaf, idx) * g_logp).sum().backward()
    closed = policy.logits_grad(g_logp, idx, policy.probs_table(logits))
    valid = policy.valid
    assert torch.allclose(closed[valid], leaf.grad[valid], atol=1e-14)
    assert float(closed[~valid].abs().max()) == 0.0
    assert float(leaf.grad[~valid].abs().max()) == 0.0  # −inf slots get exactly zero gradient


def test_logits_from_probs_round_trip_and_errors() -> None:
    policy = EQUIVALENT_SOLUTIONS.policy()
    logits = policy.logits_from_probs({(): {"The": 0.2, "10": 0.8}})
    root = policy.context_id(())
    assert policy.probs_table(logits)[root, :2].tolist() == pytest.approx([0.2, 0.8], abs=1e-15)
    with pytest.raises(ValueError, match="missing"):
        policy.logits_from_probs({(): {"The": 1.0}})
    with pytest.raises(ValueError, match="sum to 1"):
        policy.logits_from_probs({(): {"The": 0.5, "10": 0.6}})
    with pytest.raises(ValueError, match="unknown context"):
        policy.logits_from_probs({("nope",): {"x": 1.0}})
    with pytest.raises(ValueError, match="shape"):
        policy.check_logits(torch.zeros(3, 3, dtype=torch.float64))


def test_event_keys_are_equal_exactly_for_equal_context_and_action() -> None:
    policy = SHARED_PREFIX.policy()
    keys = policy.event_keys
    for i in range(policy.N):
        for j in range(policy.N):
            for t in range(policy.T):
                same = policy.trajectories[i][: t + 1] == policy.trajectories[j][: t + 1]
                assert (int(keys[i, t]) == int(keys[j, t])) == same


def test_construction_errors() -> None:
    with pytest.raises(ValueError, match="prefix"):
        TabularPolicy([("a",), ("a", "b")], [0.0, 1.0])
    with pytest.raises(ValueError, match="twice"):
        TabularPolicy([("a",), ("a",)], [0.0, 1.0])
    with pytest.raises(ValueError, match="full product"):
        TabularPolicy([("a", "x"), ("b", "y")], [0.0, 1.0], context="position")
    with pytest.raises(ValueError, match="unknown context mode"):
        TabularPolicy([("a",)], [0.0], context="tree")
    with pytest.raises(ValueError, match="unknown scenario"):
        get_scenario("nope")
