"""The DFPO paper's toy problems, reproduced exactly on the tabular policy.

- App. A.2 eq. (38): the shared-prefix net coefficient under sequence coupling, and its cancellation
  under GRPO (eq. 9) and DFPO (eq. 73);
- App. F eq. (75)/(76): GRPO's sign-dependent clipping breaks the shared token's cancellation; App. H
  eq. (82): symmetric clipping restores it;
- App. A.3 eq. (40)/(41): the first-order log-odds change of two equivalent correct answers.

Coefficients are ∂J/∂logp (``cancellation.diagnostics.token_coefficients``, autograd), summed per
shared context-token event (``shared_residual``), compared with the paper's closed forms.
"""

from __future__ import annotations

import math

import pytest
import torch

from cancellation import compute_loss
from cancellation.diagnostics import shared_residual, token_coefficients
from toymodel.scenarios import (
    CLIP_ASYMMETRY,
    EQUIVALENT_SOLUTIONS,
    SHARED_PREFIX,
    clip_asymmetry_net,
    clip_asymmetry_policies,
    shared_prefix_net,
    shared_prefix_policies,
)

#: Every comparison here is between two float64 computations of the same number, at a tolerance well above
#: float64's rounding (the paper's toys vs their closed forms): ``tests/exactness.py``.
pytestmark = pytest.mark.exactness

#: clipping disabled: clip(s, 1 − 0.999999, 1 + 1e9) never binds for the ratios used here
NO_CLIP = {"epsilon_low": 0.999999, "epsilon_high": 1e9}

#: (ρ1, ρ2, λ1, λ2): λ1 > λ2 and λ1 < λ2, ratios inside and far outside GRPO's [0.8, 1.2]
SETTINGS = [
    (1.1, 0.9, 1.3, 0.7),
    (0.95, 1.15, 0.6, 1.8),
    (1.5, 0.5, 2.0, 1.0),
    (0.3, 1.7, 0.2, 3.0),
    (1.9, 1.05, 0.9, 1.1),
]
IN_GRPO_RANGE = [s for s in SETTINGS if 0.8 < s[0] < 1.2 and 0.8 < s[1] < 1.2]


def _shared_prefix_batch(rho1: float, rho2: float, lam1: float, lam2: float):
    policy = SHARED_PREFIX.policy()
    idx = torch.tensor(
        [policy.trajectory_index(("answer", "is", "25")), policy.trajectory_index(("answer", "is", "20"))]
    )
    new, old = shared_prefix_policies(rho1, rho2, lam1, lam2)
    return policy, idx, policy.token_logp(new, idx), policy.token_logp(old, idx), policy.mask[idx]


def _shared_nets(policy, idx, coef, mask) -> list[float]:
    """Net coefficients of the events shared by both trajectories, ordered by time step."""
    keys = policy.event_keys[idx]
    res = shared_residual(coef, keys, mask)
    shared = {int(k): float(n) for k, n, c in zip(res.keys, res.net, res.count, strict=True) if int(c) == 2}
    # the shared events are exactly steps 1 and 2 ("answer", "is")
    assert sorted(shared) == sorted([int(keys[0, 0]), int(keys[0, 1])])
    return [shared[int(keys[0, 0])], shared[int(keys[0, 1])]]


@pytest.mark.parametrize("setting", SETTINGS)
def test_shared_prefix_policies_give_the_requested_ratios(setting) -> None:
    rho1, rho2, lam1, lam2 = setting
    _, _, logp, old_logp, _ = _shared_prefix_batch(*setting)
    r = (logp - old_logp).exp()
    # DFPO eq. (35)-(36)
    expected = torch.tensor([[rho1, rho2, lam1], [rho1, rho2, lam2]], dtype=torch.float64)
    assert torch.allclose(r, expected, atol=1e-13, rtol=0)


def test_shared_prefix_policies_reject_unreachable_values() -> None:
    with pytest.raises(ValueError, match="ρ1 and ρ2"):
        shared_prefix_policies(2.5, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="λ1"):
        shared_prefix_policies(1.0, 1.0, 2.0, 2.0)
    with pytest.raises(ValueError, match="w must be"):
        clip_asymmetry_policies(2.0)


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("a", [0.5, 1.0, 2.3])
def test_eq38_product_weights_leave_a_shared_prefix_residual(setting, a: float) -> None:
    rho1, rho2, lam1, lam2 = setting
    policy, idx, logp, old_logp, mask = _shared_prefix_batch(*setting)
    adv = torch.tensor([-a, a], dtype=torch.float64)  # DFPO eq. (32): Â1 = −A, Â2 = +A
    group = torch.zeros(2, dtype=torch.long)
    coef = token_coefficients(
        "gspo",
        logp,
        old_logp,
        adv,
        mask,
        group,
        length_norm=False,
        aggregation="seq-mean-token-mean",
        **NO_CLIP,
    )
    g = 2
    # DFPO eq. (38), with the 1/G of eq. (11): A·ρ1·ρ2·(λ2 − λ1)/G, on both shared steps
    closed = a * rho1 * rho2 * (lam2 - lam1) / g
    for net in _shared_nets(policy, idx, coef, mask):
        assert abs(net - closed) < 1e-12
        assert abs(closed) > 1e-3  # strictly non-zero: λ1 ≠ λ2


@pytest.mark.parametrize("setting", SETTINGS)
def test_eq38_with_gspo_length_normalised_weights(setting) -> None:
    rho1, rho2, lam1, lam2 = setting
    policy, idx, logp, old_logp, mask = _shared_prefix_batch(*setting)
    a, g, t = 1.7, 2, 3
    adv = torch.tensor([-a, a], dtype=torch.float64)
    coef = token_coefficients("gspo", logp, old_logp, adv, mask, torch.zeros(2, dtype=torch.long), **NO_CLIP)
    # DFPO eq. (44): s_i = (ρ1·ρ2·λ_i)^(1/T); ∂s_i/∂logp_{i,t} = s_i/T, so the net is (A/(G·T))·(s2 − s1)
    s1, s2 = (rho1 * rho2 * lam1) ** (1 / t), (rho1 * rho2 * lam2) ** (1 / t)
    closed = a / (g * t) * (s2 - s1)
    for net in _shared_nets(policy, idx, coef, mask):
        assert abs(net - closed) < 1e-12


@pytest.mark.parametrize("setting", IN_GRPO_RANGE)
def test_eq9_grpo_cancels_the_shared_prefix_inside_the_clip_range(setting) -> None:
    policy, idx, logp, old_logp, mask = _shared_prefix_batch(*setting)
    adv = torch.tensor([-1.3, 1.3], dtype=torch.float64)
    coef = token_coefficients("grpo", logp, old_logp, adv, mask, torch.zeros(2, dtype=torch.long))
    # DFPO eq. (9): (ρ/2)(Â1 + Â2) = 0, whatever λ1, λ2 (λ may even be clipped: it is not shared)
    for net in _shared_nets(policy, idx, coef, mask):
        assert abs(net) < 1e-15
    assert float(coef.abs().max()) > 0.1  # the individual coefficients are not zero


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("transform", ["min_replace", "orth_proj"])
@pytest.mark.parametrize("length_norm", [True, False])
def test_eq73_dfpo_transforms_cancel_the_shared_prefix(setting, transform: str, length_norm: bool) -> None:
    policy, idx, logp, old_logp, mask = _shared_prefix_batch(*setting)
    adv = torch.tensor([-0.8, 0.8], dtype=torch.float64)
    coef = token_coefficients(
        "dfpo",
        logp,
        old_logp,
        adv,
        mask,
        torch.zeros(2, dtype=torch.long),
        transform=transform,
        length_norm=length_norm,
        **NO_CLIP,
    )
    # DFPO eq. (50)/(18) with G = 2, Â = (−A, A): both give s̃1 = s̃2, so Σ_i Â_i s̃_i = 0 on the shared steps
    for net in _shared_nets(policy, idx, coef, mask):
        assert abs(net) < 1e-12
    assert float(coef.abs().max()) > 0.01


# ---------------------------------------------------------------------------------------------
# App. F / App. H: clipping asymmetry


def _clip_batch(w: float):
    policy = CLIP_ASYMMETRY.policy()
    idx = torch.tensor([policy.trajectory_index(("answer", "25")), policy.trajectory_index(("answer", "20"))])
    new, old = clip_asymmetry_policies(w)
    return policy.token_logp(new, idx), policy.token_logp(old, idx), policy.mask[idx]


EPS = 0.2
A_F = 0.9


def eq75(w: float) -> float:
    """DFPO eq. (75): Â1·w + Â2·w̄ = A((1+ε) − w) for w > 1 + ε."""
    return A_F * ((1 + EPS) - w)


def eq76(w: float) -> float:
    """DFPO eq. (76): Â1·w̄ + Â2·w = A(w − (1−ε)) for w < 1 − ε."""
    return A_F * (w - (1 - EPS))


@pytest.mark.parametrize(
    ("w", "closed", "d_closed_dw"), [(1.5, eq75, -A_F), (1.9, eq75, -A_F), (0.3, eq76, A_F), (0.6, eq76, A_F)]
)
def test_eq75_76_grpo_clipping_breaks_the_shared_token(w: float, closed, d_closed_dw: float) -> None:
    logp, old_logp, mask = _clip_batch(w)
    adv = torch.tensor([-A_F, A_F], dtype=torch.float64)
    group = torch.zeros(2, dtype=torch.long)
    assert float((logp - old_logp)[0, 0].exp()) == pytest.approx(w, abs=1e-14)

    # (a) the value: the group's aggregated surrogate on the shared token alone is eq. (75)/(76)
    # (token-mean over the 2 shared tokens divides by 2)
    shared_only = mask.clone()
    shared_only[:, 1] = 0.0
    loss, _ = compute_loss("grpo", logp, old_logp, adv, shared_only, group, epsilon_low=EPS, epsilon_high=EPS)
    assert float(-loss) == pytest.approx(closed(w) / 2, abs=1e-14)

    # (b) the gradient. Conversion: eq. (75)/(76) is a function C(w) of the shared ratio w = π/π_old;
    # along ∇log π the chain rule gives ∂C/∂log π = w·∂C/∂w (∇θ w = w·∇θ log π). The clipped branch
    # is a constant, so ∂C/∂w = −A (eq. 75) or +A (eq. 76): only the unclipped trajectory's term
    # moves. Token-mean over the batch's 4 tokens divides by 4. Note this is w·C'(w), not C(w)·w.
    coef = token_coefficients("grpo", logp, old_logp, adv, mask, group, epsilon_low=EPS, epsilon_high=EPS)
    net = float(coef[0, 0] + coef[1, 0])
    assert net == pytest.approx(w * d_closed_dw / 4, abs=1e-14)
    assert abs(net) > 0.05  # strictly non-zero: no cancellation


@pytest.mark.parametrize("w", [1.05, 0.9])
def test_grpo_inside_the_clip_range_cancels(w: float) -> None:
    logp, old_logp, mask = _clip_batch(w)
    adv = torch.tensor([-A_F, A_F], dtype=torch.float64)
    coef = token_coefficients("grpo", logp, old_logp, adv, mask, torch.zeros(2, dtype=torch.long))
    assert abs(float(coef[0, 0] + coef[1, 0])) < 1e-15


@pytest.mark.parametrize("w", [1.5, 1.9, 0.3, 0.6, 1.05])
def test_eq82_symmetric_clipping_restores_cancellation(w: float) -> None:
    logp, old_logp, mask = _clip_batch(w)
    adv = torch.tensor([-A_F, A_F], dtype=torch.float64)
    group = torch.zeros(2, dtype=torch.long)
    coef = token_coefficients("grpo_symclip", logp, old_logp, adv, mask, group, epsilon=EPS)
    # DFPO eq. (82): φ(r*)·(Σ Â_i)·∇log π = 0
    assert abs(float(coef[0, 0] + coef[1, 0])) < 1e-15
    shared_only = mask.clone()
    shared_only[:, 1] = 0.0
    loss, _ = compute_loss("grpo_symclip", logp, old_logp, adv, shared_only, group, epsilon=EPS)
    assert abs(float(loss)) < 1e-15


# ---------------------------------------------------------------------------------------------
# App. A.3: first-order log-odds drift of two equivalent correct answers


def test_eq41_first_order_log_odds_change_and_its_s_driven_part() -> None:
    """One SGD step on GSPO (no clipping) changes log π(τ2)/π(τ3) as the first-order prediction says.

    Honest note: eq. (40) writes Δlog π(τ_i) ≈ η·c·Â_i·s_i with one constant c. In this toy c is not
    one constant: τ2 has 5 tokens and τ3 6 (GSPO's 1/|y_i|), and τ2 shares the root context with τ1
    and τ3, so the kernel k_i = (∇log π(τ2) − ∇log π(τ3))·∇log π(τ_i)/(G·|τ_i|) differs per i. The test
    therefore checks the first-order structure: Δ = η·Σ_i Â_i·s_i·k_i + O(η²), whose s-driven part
    Σ_i Â_i·(s_i − s_min)·k_i is what eq. (41)'s s2 ≠ s3 adds, and which DFPO Min-Replace removes.
    """
    sc = EQUIVALENT_SOLUTIONS
    policy = sc.policy()
    old = sc.initial_logits()
    theta = policy.logits_from_probs(
        {(): {"The": 0.3, "10": 0.7}, ("The", "answer", "is"): {"25": 0.4, "20": 0.6}}
    )
    idx = torch.tensor([0, 1, 2])  # τ1, τ2, τ3
    adv = torch.tensor([-2 / 3, 1 / 3, 1 / 3], dtype=torch.float64)  # DFPO eq. (30)
    group = torch.zeros(3, dtype=torch.long)
    mask = policy.mask[idx]
    old_logp = policy.token_logp(old, idx)
    g_n = 3
    lengths = mask.sum(-1)
    valid = policy.valid

    def objective(name: str, z: torch.Tensor, **kw) -> torch.Tensor:
        loss, _ = compute_loss(name, policy.token_logp(z, idx), old_logp, adv, mask, group, **NO_CLIP, **kw)
        return -loss

    def grad_of(fn) -> torch.Tensor:
        z = theta.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(fn(z), z)
        return torch.where(valid, g, torch.zeros_like(g))

    def log_odds(z: torch.Tensor) -> float:
        lp = policy.traj_logp(z)
        return float(lp[1] - lp[2])

    score = [grad_of(lambda z, i=i: policy.traj_logp(z)[i]) for i in range(3)]  # ∇log π(τ_i)
    d_lo = score[1] - score[2]
    g_gspo = grad_of(lambda z: objective("gspo", z))

    # s_i from the probabilities (eq. 44), independently of the objective code
    s = ((policy.token_logp(theta, idx) - old_logp).sum(-1) / lengths).exp()
    assert abs(float(s[1] - s[2])) > 0.05  # eq. (39): s2 ≠ s3
    # the kernel k_i and the decomposition of ∇J (GSPO, seq-mean-token-mean: ∇J = Σ Â s ∇log π / (G |τ|))
    k = torch.stack([(d_lo * score[i]).sum() / (g_n * lengths[i]) for i in range(3)])
    first_order = float((d_lo * g_gspo).sum())
    assert first_order == pytest.approx(float((adv * s * k).sum()), abs=1e-13)

    # Δ log-odds after θ⁺ = θ + η∇J matches η·first_order up to O(η²)
    errors = []
    for eta in (0.02, 0.01):
        delta = log_odds(theta + eta * g_gspo) - log_odds(theta)
        errors.append(abs(delta - eta * first_order))
        assert errors[-1] < 0.05 * abs(eta * first_order)
    assert 0.2 < errors[1] / errors[0] < 0.3  # halving η quarters the error: second order

    # the s-driven part is non-zero under GSPO ...
    s_min = float(s.min())
    s_driven = float((adv * (s - s_min) * k).sum())
    # (here 6.3e-4 against a first-order change of −1.13e-2: s2 = 0.936, s3 = 1.058, s_min = s1 = 0.863)
    assert abs(s_driven) > 1e-4
    assert abs(s_driven) > 0.01 * abs(first_order)
    # ... and DFPO Min-Replace's first-order change is exactly the s ≡ s_min prediction (eq. 50)
    g_dfpo = grad_of(lambda z: objective("dfpo", z, transform="min_replace"))
    dfpo_first_order = float((d_lo * g_dfpo).sum())
    assert dfpo_first_order == pytest.approx(float((adv * s_min * k).sum()), abs=1e-13)
    assert first_order - dfpo_first_order == pytest.approx(s_driven, abs=1e-13)
    assert math.isfinite(dfpo_first_order)


def test_the_app_helpers_reproduce_the_closed_forms() -> None:
    rho1, rho2, lam1, lam2 = SETTINGS[2]
    nets = shared_prefix_net("gspo", rho1, rho2, lam1, lam2, advantage=1.5, length_norm=False, **NO_CLIP)
    # DFPO eq. (38) / G
    assert nets == pytest.approx((1.5 * rho1 * rho2 * (lam2 - lam1) / 2,) * 2, abs=1e-12)
    assert shared_prefix_net("grpo", rho1, rho2, lam1, lam2, **NO_CLIP) == (0.0, 0.0)
    # DFPO eq. (75) converted: w·(−A)/4 (token-mean over 4 tokens); eq. (82): 0
    assert clip_asymmetry_net("grpo", 1.6, advantage=A_F) == pytest.approx(-1.6 * A_F / 4, abs=1e-14)
    assert clip_asymmetry_net("grpo_symclip", 1.6, advantage=A_F) == 0.0
