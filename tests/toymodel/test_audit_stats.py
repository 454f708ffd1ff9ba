"""The simulator's exact statistics against a plain-Python enumeration of the trajectories.

``simulate`` rows carry ``expected_reward``, ``entropy``, ``equiv_entropy``, ``equiv_log_odds`` and
``template_kl``. Here each is rebuilt from the logits that ``callback(step, logits)`` hands out: the
probability of every trajectory of the scenario's support is the product, over its steps, of the
softmax (``math.exp``, a Python loop) of its context's logits at the action it takes. The logits table
is only read through the policy's layout (``context_id``, ``actions``), never through its tensors.

Sign of ``equiv_log_odds``: ``TabularPolicy.equiv_log_odds`` is documented as log π(τa) − log π(τb)
for the first two members of the equivalent set, DFPO eq. (41)'s left side log π(τ2)/π(τ3). So it is
log(first / second): −log 2 on ``equivalent_solutions`` at the uniform start (π(τ2) = 1/4 "The answer
is 20 ." over π(τ3) = 1/2 "10 + 10 = 20 ."), +5·log(0.7/0.2) on ``template_task`` at its start
(all-first-synonym over all-second-synonym).
"""

from __future__ import annotations

import math

import pytest
import torch

from toymodel.scenarios import get_scenario
from toymodel.simulate import simulate

#: Every comparison here is between two float64 computations of the same number, at a tolerance well above
#: float64's rounding (the logged statistics vs a plain loop): ``tests/exactness.py``.
pytestmark = pytest.mark.exactness


def _context_key(scenario, tau: tuple[str, ...], t: int):
    return tau[:t] if scenario.context == "prefix" else t


def _traj_probs(scenario, logits: torch.Tensor) -> list[float]:
    """π(τ) of every trajectory of the support, by a loop over its steps and a Python softmax."""
    policy = scenario.policy()
    z = logits.tolist()
    out = []
    for tau in scenario.support:
        p = 1.0
        for t, tok in enumerate(tau):
            c = policy.context_id(_context_key(scenario, tau, t))
            acts = policy.actions[c]
            row = [z[c][k] for k in range(len(acts))]
            mx = max(row)
            den = sum(math.exp(x - mx) for x in row)
            p *= math.exp(row[acts.index(tok)] - mx) / den
        out.append(p)
    return out


def _init_prob(scenario, key, tok: str) -> float:
    """π_init(tok | key) from the scenario's ``initial`` dict (unlisted contexts are uniform)."""
    if key in scenario.initial:
        return scenario.initial[key][tok]
    return 1.0 / len(scenario.policy().actions[scenario.policy().context_id(key)])


def loop_stats(scenario, logits: torch.Tensor) -> dict[str, float]:
    p = _traj_probs(scenario, logits)
    support = list(scenario.support)
    out = {
        "expected_reward": sum(pi * r for pi, r in zip(p, scenario.rewards, strict=True)),
        "entropy": -sum(pi * math.log(pi) for pi in p),
    }
    eq = [p[support.index(tau)] for tau in scenario.equivalent]
    z = sum(eq)
    out["equiv_entropy"] = -sum(q / z * math.log(q / z) for q in eq)
    # log(first / second) of the equivalent set, eq. (41)
    out["equiv_log_odds"] = math.log(eq[0] / eq[1])
    # template KL: KL of the joint law of the template tokens (their positions come first) under π_θ
    # against π_init, by enumerating the template tuples: marginals summed over the support
    kl = 0.0
    if scenario.template_contexts:
        positions = sorted(scenario.template_contexts)
        assert positions == list(range(len(positions)))
        marg: dict[tuple[str, ...], float] = {}
        for tau, pi in zip(support, p, strict=True):
            head = tau[: len(positions)]
            marg[head] = marg.get(head, 0.0) + pi
        for head, pi in marg.items():
            q = 1.0
            for t, tok in enumerate(head):
                q *= _init_prob(scenario, _context_key(scenario, head, t), tok)
            kl += pi * math.log(pi / q)
    out["template_kl"] = kl
    return out


KEYS = ("expected_reward", "entropy", "equiv_entropy", "equiv_log_odds", "template_kl")


@pytest.mark.parametrize("name", ["equivalent_solutions", "template_task"])
def test_initial_statistics_by_hand(name: str) -> None:
    sc = get_scenario(name)
    got = sc.policy().stats(sc.initial_logits())
    want = loop_stats(sc, sc.initial_logits())
    if name == "equivalent_solutions":
        # π = (1/4, 1/4, 1/2), R = (0, 1, 1)
        assert want["expected_reward"] == pytest.approx(0.75, abs=1e-15)
        assert want["entropy"] == pytest.approx(1.5 * math.log(2), abs=1e-15)
        assert want["equiv_entropy"] == pytest.approx(-(1 / 3) * math.log(1 / 3) - (2 / 3) * math.log(2 / 3))
        assert want["equiv_log_odds"] == pytest.approx(-math.log(2), abs=1e-15)  # log(π(τ2)/π(τ3)) < 0
    else:
        assert want["expected_reward"] == pytest.approx(0.3, abs=1e-15)
        assert want["equiv_log_odds"] == pytest.approx(5 * math.log(0.7 / 0.2), abs=1e-12)  # > 0
        assert want["template_kl"] == pytest.approx(0.0, abs=1e-15)
    for key in KEYS[:-1]:
        assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-14), key


@pytest.mark.parametrize("name", ["equivalent_solutions", "template_task"])
def test_simulate_rows_equal_a_plain_enumeration(name: str) -> None:
    sc = get_scenario(name)
    snaps: list[torch.Tensor] = []
    rows = simulate(name, "grpo", steps=6, seed=1, callback=lambda step, z: snaps.append(z))
    assert len(snaps) == len(rows) == 6
    moved = False
    for row, z in zip(rows, snaps, strict=True):
        want = loop_stats(sc, z)
        for key in KEYS:
            assert row[key] == pytest.approx(want[key], rel=1e-11, abs=1e-13), (row["step"], key)
        moved |= abs(want["equiv_log_odds"] - loop_stats(sc, sc.initial_logits())["equiv_log_odds"]) > 1e-3
        # the documented sign: log π(first)/π(second), so positive exactly when the first is likelier
        p = _traj_probs(sc, z)
        first, second = (p[list(sc.support).index(tau)] for tau in sc.equivalent[:2])
        assert (row["equiv_log_odds"] > 0) == (first > second)
    assert moved  # training changed the odds, so the comparison is not the start's value again
    if name == "template_task":
        assert rows[-1]["template_kl"] > 0
