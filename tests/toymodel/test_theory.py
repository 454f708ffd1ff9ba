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
from cancellation import objectives as cancellation_objectives
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

#: Every comparison here is between two float64 computations of the same number, at a tolerance well above
#: float64's rounding (the closed forms vs the library's losses and coefficients): ``tests/exactness.py``.
pytestmark = pytest.mark.exactness

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
    ("gspo", {"estimator": "paper"}),
    ("gspo", {"estimator": "paper", "length_norm": False}),
    ("dfpo", {"transform": "min_replace", "estimator": "ppo_clip"}),
    ("dfpo", {"transform": "orth_proj_pos", "estimator": "ppo_clip"}),
    ("dfpo", {"transform": "truncate_rebalance", "estimator": "ppo_clip", "length_norm": False}),
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
    """Under ``estimator="ppo_clip"`` a binding clip drops a trajectory and breaks eq. (73); under the
    paper's estimator (DFPO's default) every trajectory keeps s̃_i·Â_i and the net stays 0."""
    for setting in GRID:
        for est in ("paper", "ppo_clip"):
            # no clip binds: eq. (73) gives exactly 0, and so does autograd
            cf = dfpo_shared_prefix_coefficient(transform, *setting, estimator=est, **NO_CLIP)
            assert cf == pytest.approx(0.0, abs=1e-15)
            net = shared_prefix_net("dfpo", *setting, transform=transform, estimator=est, **NO_CLIP)[0]
            assert abs(net) < 1e-12
    # a clip binds: s2 = (1.7·1.45·1.9)^(1/3) ≈ 1.67 > 1.2 for Â2 > 0, so only τ1's term is left
    setting = (1.7, 1.45, 1.3, 1.9)
    kw = {"epsilon_low": 0.2, "epsilon_high": 0.2}
    value = dfpo_shared_prefix_coefficient(transform, *setting, estimator="ppo_clip", **kw)
    assert abs(value) > 1e-3
    assert value == pytest.approx(
        shared_prefix_net("dfpo", *setting, transform=transform, estimator="ppo_clip", **kw)[0], abs=1e-12
    )
    # the paper's estimator: still 0 (eq. 68 + eq. 73), by the closed form and by autograd
    assert dfpo_shared_prefix_coefficient(transform, *setting, **kw) == pytest.approx(0.0, abs=1e-15)
    assert abs(shared_prefix_net("dfpo", *setting, transform=transform, **kw)[0]) < 1e-12


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


# ---------------------------------------------------------------------------------------------
# the kinks w = 1 + ε_high and w = 1 − ε_low: the closed forms take autograd's side there

F64 = torch.float64
KINK_DELTAS = (-1e-9, 0.0, 1e-9)  # just below, exactly at, just above the kink (in log-ratio)


def _bare_batch(log_ratios: list[float]):
    """Single-token completions with logp = log r, old_logp = 0, and the ratios the objective computes
    from them (the very expression of ``cancellation.objectives``: exp(logp − old_logp) on the mask)."""
    logp = torch.tensor(log_ratios, dtype=F64)[:, None]
    old, mask = torch.zeros_like(logp), torch.ones_like(logp)
    r = torch.where(mask.bool(), logp - old, torch.zeros_like(logp)).exp()[:, 0].tolist()
    return logp, old, mask, r


def _kinks() -> tuple[float, float, float, float]:
    """(t_hi, ε_high, t_lo, ε_low) with the objective's ratio exp(t_hi) == 1 + ε_high and
    exp(t_lo) == 1 − ε_low exactly in float64 (x − 1 and 1 − y are exact for x ∈ [1, 2], y ∈ [½, 1])."""
    t_hi, t_lo = 0.1, -0.15
    _, _, _, (x, y) = _bare_batch([t_hi, t_lo])
    hi, lo = x - 1.0, 1.0 - y
    assert 1.0 + hi == x and 1.0 - lo == y
    return t_hi, hi, t_lo, lo


def _coef_sum(name: str, logp, old, mask, adv: list[float], **kw) -> float:
    group = torch.zeros(logp.shape[0], dtype=torch.long)
    coef = token_coefficients(name, logp, old, torch.tensor(adv, dtype=F64), mask, group, **kw)
    return float(coef.sum())


@pytest.mark.parametrize("a", ADVANTAGES)
def test_token_level_closed_forms_at_the_kinks_match_autograd(a: float) -> None:
    """GRPO (eq. 75/76) and GRPO-fix (eq. 82) on a token shared by Â = (−A, +A) (and, for GRPO-fix,
    non-zero-sum advantages, where its kink shows), at each kink and 1e-9 either side."""
    t_hi, hi, t_lo, lo = _kinks()
    agg = {"aggregation": "seq-mean-token-sum", "seq_count": 1}  # the bare sum of the terms: no 1/G, no 1/N
    seen = set()
    for t0, other in ((t_hi, 0.3), (t_lo, 0.3)):
        for d in KINK_DELTAS:
            logp, old, mask, (w,) = _bare_batch([t0 + d])
            logp = logp.repeat(2, 1)
            old, mask = old.repeat(2, 1), mask.repeat(2, 1)
            e_lo, e_hi = (other, hi) if t0 == t_hi else (lo, other)
            got = _coef_sum("grpo", logp, old, mask, [-a, a], epsilon_low=e_lo, epsilon_high=e_hi, **agg)
            want = clip_coefficient(w, a, e_lo, e_hi)
            assert got == pytest.approx(want, abs=1e-14), (t0, d, w, got, want)
            seen.add(round(want / (a * w), 12))
            if t0 == t_hi:
                for adv in ([0.3, 0.5], [-0.9, 0.2]):
                    got = _coef_sum("grpo_symclip", logp, old, mask, adv, epsilon=e_hi, **agg)
                    assert got == pytest.approx(symclip_coefficient(w, adv, e_hi), abs=1e-14), (d, w, adv)
                    assert (got == 0.0) == (d > 0)  # clipped (no gradient) only strictly above the kink
    assert seen == {-1.0, 0.0, 1.0}  # both clipped branches and the kink's unclipped value were reached
    # at the kink itself: unclipped, both terms live, the net is 0 (eq. 9), not ∓A·w
    _, _, _, (w_hi,) = _bare_batch([t_hi])
    assert clip_coefficient(w_hi, a, 0.3, hi) == 0.0 and carries_gradient(w_hi, a, 0.3, hi)
    _, _, _, (w_lo,) = _bare_batch([t_lo])
    assert clip_coefficient(w_lo, a, lo, 0.3) == 0.0 and carries_gradient(w_lo, -a, lo, 0.3)


@pytest.mark.parametrize("a", ADVANTAGES)
def test_sequence_level_closed_forms_at_the_kinks_match_autograd(a: float) -> None:
    """eq38_coefficient, eq38_gspo_coefficient (length 1) and dfpo_shared_prefix_coefficient (product
    weight) with ρ1 = ρ2 = 1, so s_i = λ_i exactly: τ1 (Â = −A) at or around 1 − ε_low and τ2 (Â = +A)
    at or around 1 + ε_high, against the sum of the two trajectories' coefficients by autograd on a
    batch of two single-token completions (for which the objective's s_i is exactly the token ratio)."""
    t_hi, hi, t_lo, lo = _kinks()
    dropped = 0
    for d1, d2 in itertools.product(KINK_DELTAS, KINK_DELTAS):
        logp, old, mask, (lam1, lam2) = _bare_batch([t_lo + d1, t_hi + d2])
        adv = [-a, a]
        eps = {"epsilon_low": lo, "epsilon_high": hi}
        for length_norm in (False, True):
            s = [
                float(x)
                for x in cancellation_objectives.sequence_log_ratio(logp, old, mask, length_norm).exp()
            ]
            assert s == [lam1, lam2]
            got = _coef_sum("gspo", logp, old, mask, adv, length_norm=length_norm, **eps)
            if length_norm:
                want = eq38_gspo_coefficient(1.0, 1.0, lam1, lam2, a, length=1, **eps)
            else:
                want = eq38_coefficient(1.0, 1.0, lam1, lam2, a, **eps)
            assert got == pytest.approx(want, abs=1e-14), (d1, d2, length_norm, got, want)
        active = [carries_gradient(lam1, -a, lo, hi), carries_gradient(lam2, a, lo, hi)]
        assert active == [d1 >= 0, d2 <= 0]  # at the kink (d = 0) the trajectory keeps its gradient
        dropped += not all(active)
        for transform in ("min_replace", "orth_proj", "orth_proj_pos", "truncate_rebalance"):
            for est in ("ppo_clip", "paper"):
                kw = {"length_norm": False, "estimator": est, **eps}
                got = _coef_sum("dfpo", logp, old, mask, adv, transform=transform, **kw)
                want = dfpo_shared_prefix_coefficient(transform, 1.0, 1.0, lam1, lam2, a, **kw)
                assert got == pytest.approx(want, abs=1e-14), (d1, d2, transform, est, got, want)
                if est == "ppo_clip" and all(active):
                    assert want == pytest.approx(0.0, abs=1e-15)  # eq. (73) at the kink too
    assert dropped == 5  # every combination with a trajectory strictly past its bound


def test_clip_kinks_at_w_one_with_zero_clip_range_on_the_toy() -> None:
    """ε = 0 puts both kinks at w = 1, which the toy realises exactly (π_θ = π_old, every ratio is 1):
    autograd keeps both terms there (net 0), as the closed form does; just off it one side is clipped."""
    for a in ADVANTAGES:
        kw = {"epsilon_low": 0.0, "epsilon_high": 0.0}
        assert clip_asymmetry_net("grpo", 1.0, a, **kw) == 0.0
        assert clip_asymmetry_closed_form("grpo", 1.0, a, **kw).value == 0.0
        for w in (1.0 - 1e-6, 1.0 + 1e-6):
            cf = clip_asymmetry_closed_form("grpo", w, a, **kw).value
            assert abs(cf) > 0.2 * a
            assert clip_asymmetry_net("grpo", w, a, **kw) == pytest.approx(cf, abs=1e-12)
