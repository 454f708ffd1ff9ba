"""``toymodel.theory``'s closed forms against autograd through ``cancellation`` on grids of inputs.

The closed forms are written from the paper's symbols (ρ, λ, w, A, ε) alone; the reference values come
from ``token_coefficients`` (∂J/∂logp by autograd) on the toy's exact policies
(``shared_prefix_net``, ``clip_asymmetry_net``) or on a bare batch of single-token completions.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from cancellation import compute_loss
from cancellation.diagnostics import token_coefficients
from toymodel.scenarios import clip_asymmetry_net, shared_prefix_net, shared_prefix_policies
from toymodel.theory import (
    ClosedForm,
    carries_gradient,
    clip_asymmetry_closed_form,
    clip_coefficient,
    clip_surrogate,
    dfpo_shared_prefix_coefficient,
    eq38_coefficient,
    eq38_gspo_coefficient,
    eq38_surrogate,
    shared_event_coefficient,
    shared_prefix_closed_form,
    symclip_coefficient,
)

NO_CLIP = {"epsilon_low": 0.999999, "epsilon_high": 1e9}

#: (ρ1, ρ2, λ1, λ2) on a grid that reaches every clip case; only reachable ones (0.3·(λ1+λ2) < 1)
GRID = [
    s
    for s in itertools.product((0.3, 0.9, 1.1, 1.7), (0.55, 1.05, 1.45), (0.2, 0.7, 1.3), (0.4, 1.0, 1.9))
    if 0.3 * (s[2] + s[3]) < 1.0
]
ADVANTAGES = (0.5, 2.0)
EPSILONS = (0.05, 0.2, 0.5)

#: every objective the app offers, as (name, params)
OBJECTIVES = [
    ("grpo", {}),
    ("grpo_symclip", {}),
    ("gspo", {}),
    ("gspo", {"length_norm": False}),
    ("dfpo", {"transform": "min_replace"}),
    ("dfpo", {"transform": "orth_proj"}),
    ("dfpo", {"transform": "orth_proj_pos"}),
    ("dfpo", {"transform": "truncate_rebalance"}),
    ("dfpo", {"transform": "min_replace", "length_norm": False}),
]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These are thousands of tiny tensor ops: torch's intra-op thread pool only adds overhead to them
    (on a loaded 2-core machine ~8 ms per log_softmax instead of ~2 µs), so run them on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _eps(name: str, eps: float) -> dict[str, float]:
    return {"epsilon": eps} if name == "grpo_symclip" else {"epsilon_low": eps, "epsilon_high": eps}


# ---------------------------------------------------------------------------------------------
# App. A.2: eq. (38)


@pytest.mark.parametrize("setting", GRID[::3])
def test_eq38_surrogate_is_sum_of_advantage_times_product_weight(setting) -> None:
    rho1, rho2, lam1, lam2 = setting
    from toymodel.scenarios import SHARED_PREFIX

    policy = SHARED_PREFIX.policy()
    idx = torch.tensor(
        [policy.trajectory_index(("answer", "is", "25")), policy.trajectory_index(("answer", "is", "20"))]
    )
    new, old = shared_prefix_policies(*setting)
    logp, old_logp, mask = policy.token_logp(new, idx), policy.token_logp(old, idx), policy.mask[idx]
    a = 1.7
    adv = torch.tensor([-a, a], dtype=torch.float64)
    # the objective's own value with the 1/G removed (seq_count = 1): J = Σ_i Â_i s_i, s_i = Π_t r_{i,t}
    loss, _ = compute_loss(
        "gspo",
        logp,
        old_logp,
        adv,
        mask,
        torch.zeros(2, dtype=torch.long),
        length_norm=False,
        seq_count=1,
        **NO_CLIP,
    )
    assert eq38_surrogate(rho1, rho2, lam1, lam2, a) == pytest.approx(float(-loss), abs=1e-12)


@pytest.mark.parametrize("a", ADVANTAGES)
def test_eq38_coefficient_matches_autograd_without_clipping(a: float) -> None:
    for setting in GRID:
        nets = shared_prefix_net("gspo", *setting, advantage=a, length_norm=False, **NO_CLIP)
        closed = eq38_coefficient(*setting, a)
        # both shared steps (t = 1, 2) carry the same net coefficient
        assert nets == pytest.approx((closed, closed), abs=1e-12)
        assert closed == pytest.approx(a * setting[0] * setting[1] * (setting[3] - setting[2]) / 2, rel=1e-14)


@pytest.mark.parametrize("a", ADVANTAGES)
def test_eq38_gspo_coefficient_matches_autograd_without_clipping(a: float) -> None:
    for setting in GRID:
        nets = shared_prefix_net("gspo", *setting, advantage=a, **NO_CLIP)
        closed = eq38_gspo_coefficient(*setting, a)
        assert nets == pytest.approx((closed, closed), abs=1e-12)


@pytest.mark.parametrize("eps", EPSILONS)
def test_eq38_forms_with_sign_aware_clipping_match_autograd(eps: float) -> None:
    clipped_nonzero = 0
    for setting in GRID:
        for length_norm, form in ((False, eq38_coefficient), (True, eq38_gspo_coefficient)):
            net = shared_prefix_net(
                "gspo", *setting, advantage=1.3, length_norm=length_norm, epsilon_low=eps, epsilon_high=eps
            )[0]
            closed = form(*setting, 1.3, epsilon_low=eps, epsilon_high=eps)
            assert net == pytest.approx(closed, abs=1e-12)
            unclipped = form(*setting, 1.3)
            clipped_nonzero += closed != unclipped and closed != 0.0
    assert clipped_nonzero > 5  # the grid really exercises the clipped branch


@pytest.mark.parametrize(("name", "params"), OBJECTIVES)
def test_shared_prefix_closed_form_matches_autograd_for_every_objective(name: str, params: dict) -> None:
    for setting, a, eps in itertools.product(GRID, ADVANTAGES, EPSILONS):
        kw = {**params, **_eps(name, eps)}
        net = shared_prefix_net(name, *setting, advantage=a, **kw)[0]
        cf = shared_prefix_closed_form(name, *setting, advantage=a, **kw)
        assert isinstance(cf, ClosedForm)
        assert net == pytest.approx(cf.value, abs=1e-12), (setting, a, eps)


@pytest.mark.parametrize("transform", ["min_replace", "orth_proj", "orth_proj_pos", "truncate_rebalance"])
def test_eq73_dfpo_cancels_unless_a_clip_binds(transform: str) -> None:
    for setting in GRID:
        # no clip binds: eq. (73) gives exactly 0, and so does autograd
        assert dfpo_shared_prefix_coefficient(transform, *setting, **NO_CLIP) == pytest.approx(0.0, abs=1e-15)
        assert abs(shared_prefix_net("dfpo", *setting, transform=transform, **NO_CLIP)[0]) < 1e-12
    # a clip binds: s2 = (1.7·1.45·1.9)^(1/3) ≈ 1.67 > 1.2 for Â2 > 0, so only τ1's term is left
    setting = (1.7, 1.45, 1.3, 1.9)
    value = dfpo_shared_prefix_coefficient(transform, *setting, epsilon_low=0.2, epsilon_high=0.2)
    assert abs(value) > 1e-3
    assert value == pytest.approx(
        shared_prefix_net("dfpo", *setting, transform=transform, epsilon_low=0.2, epsilon_high=0.2)[0],
        abs=1e-12,
    )


def test_shared_event_coefficient_is_a_plain_loop_over_eq72() -> None:
    w, adv, lengths = [0.9, 1.3, 0.4], [-1.0, 0.25, 0.75], [3, 5, 2]
    expected = 0.0
    for wi, ai, li in zip(w, adv, lengths, strict=True):
        expected += wi * ai / li
    assert shared_event_coefficient(w, adv, lengths) == pytest.approx(expected / 3, rel=1e-15)
    assert shared_event_coefficient(w, adv, lengths, [True, False, True], 4) == pytest.approx(
        (0.9 * -1.0 / 3 + 0.4 * 0.75 / 2) / 4, rel=1e-15
    )
    with pytest.raises(ValueError, match="one entry per trajectory"):
        shared_event_coefficient([1.0], [1.0, 2.0], [1])


# ---------------------------------------------------------------------------------------------
# App. F / App. H: eq. (75)/(76), (82)

W_GRID = [0.05, 0.3, 0.61, 0.79, 0.85, 1.0, 1.15, 1.21, 1.5, 1.99, 2.7, 4.0]


def _pair_batch(w: float, a: float):
    """Two single-token completions sharing one token with ratio w: logp = log w, old_logp = 0."""
    logp = torch.full((2, 1), math.log(w), dtype=torch.float64)
    return logp, torch.zeros_like(logp), torch.tensor([-a, a], dtype=torch.float64), torch.ones_like(logp)


@pytest.mark.parametrize(("lo", "hi"), [(0.2, 0.2), (0.1, 0.28), (0.5, 0.05)])
@pytest.mark.parametrize("a", ADVANTAGES)
def test_clip_surrogate_is_the_groups_clipped_objective(lo: float, hi: float, a: float) -> None:
    for w in W_GRID:
        logp, old, adv, mask = _pair_batch(w, a)
        loss, _ = compute_loss(
            "grpo", logp, old, adv, mask, torch.zeros(2, dtype=torch.long),
            aggregation="seq-mean-token-sum", seq_count=1, epsilon_low=lo, epsilon_high=hi,
        )  # fmt: skip
        assert clip_surrogate(w, a, lo, hi) == pytest.approx(float(-loss), abs=1e-13)


@pytest.mark.parametrize(("lo", "hi"), [(0.2, 0.2), (0.1, 0.28), (0.5, 0.05)])
@pytest.mark.parametrize("a", ADVANTAGES)
def test_clip_coefficient_is_the_autograd_net_of_the_shared_token(lo: float, hi: float, a: float) -> None:
    nonzero = 0
    for w in W_GRID:
        logp, old, adv, mask = _pair_batch(w, a)
        coef = token_coefficients(
            "grpo", logp, old, adv, mask, torch.zeros(2, dtype=torch.long),
            aggregation="seq-mean-token-sum", seq_count=1, epsilon_low=lo, epsilon_high=hi,
        )  # fmt: skip
        closed = clip_coefficient(w, a, lo, hi)
        assert float(coef.sum()) == pytest.approx(closed, abs=1e-13)
        nonzero += closed != 0.0
        # the same through the toy (token-mean over its 4 tokens: norm = 4), where w is reachable
        if w < 2.0:
            assert clip_asymmetry_net("grpo", w, a, epsilon_low=lo, epsilon_high=hi) == pytest.approx(
                clip_coefficient(w, a, lo, hi, norm=4), abs=1e-14
            )
    assert nonzero >= 6


@pytest.mark.parametrize("eps", [0.2, 0.5])
def test_symclip_coefficient_matches_autograd_also_without_zero_sum(eps: float) -> None:
    for w in W_GRID:
        for adv_list in ([-1.3, 1.3], [0.3, 0.5], [-0.9, 0.2]):
            logp = torch.full((2, 1), math.log(w), dtype=torch.float64)
            adv = torch.tensor(adv_list, dtype=torch.float64)
            coef = token_coefficients(
                "grpo_symclip", logp, torch.zeros_like(logp), adv, torch.ones_like(logp),
                torch.zeros(2, dtype=torch.long), aggregation="seq-mean-token-sum", seq_count=1, epsilon=eps,
            )  # fmt: skip
            assert float(coef.sum()) == pytest.approx(symclip_coefficient(w, adv_list, eps), abs=1e-13)
        assert symclip_coefficient(w, [-1.3, 1.3], eps) == 0.0  # eq. (82)


@pytest.mark.parametrize("objective", ["grpo", "grpo_symclip"])
def test_clip_asymmetry_closed_form_matches_the_toy(objective: str) -> None:
    for w, a, eps in itertools.product([0.1, 0.5, 0.9, 1.1, 1.3, 1.9], ADVANTAGES, EPSILONS):
        cf = clip_asymmetry_closed_form(objective, w, a, **_eps(objective, eps))
        assert clip_asymmetry_net(objective, w, a, **_eps(objective, eps)) == pytest.approx(
            cf.value, abs=1e-14
        )


def test_carries_gradient_follows_the_sign_aware_rule() -> None:
    # DFPO eq. (47): Â > 0 clipped above 1 + ε_high, Â < 0 clipped below 1 − ε_low
    assert not carries_gradient(1.5, 1.0, 0.2, 0.2)
    assert carries_gradient(1.5, -1.0, 0.2, 0.2)
    assert not carries_gradient(0.5, -1.0, 0.2, 0.2)
    assert carries_gradient(0.5, 1.0, 0.2, 0.2)
    assert carries_gradient(100.0, 1.0, None, None)


def test_bad_inputs_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="advantage A"):
        eq38_surrogate(1.0, 1.0, 1.0, 1.0, -1.0)
    with pytest.raises(ValueError, match="ratio > 0"):
        eq38_coefficient(0.0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="valid: grpo, grpo_symclip, gspo, dfpo"):
        shared_prefix_closed_form("ppo", 1.0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="beta"):
        shared_prefix_closed_form("gspo", 1.0, 1.0, 1.0, 1.0, beta=0.1)
    with pytest.raises(ValueError, match="stop_grad"):
        shared_prefix_closed_form("dfpo", 1.0, 1.0, 1.0, 1.0, stop_grad=False)
    with pytest.raises(ValueError, match="aggregation"):
        shared_prefix_closed_form("grpo", 1.0, 1.0, 1.0, 1.0, aggregation="seq-mean-token-sum")
    with pytest.raises(ValueError, match="transform"):
        dfpo_shared_prefix_coefficient("nope", 1.0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"App\. F"):
        clip_asymmetry_closed_form("gspo", 1.0)
