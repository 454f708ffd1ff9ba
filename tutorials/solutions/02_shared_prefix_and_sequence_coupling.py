"""Solutions to the exercises of tutorial 2 (`tutorials/02_shared_prefix_and_sequence_coupling.py`): try them yourself first.

Each function is meant to replace the exercise cell of the same name in the notebook: it uses the
notebook's variables (`policy`, `mask`, ...) and imports, so this file is not run on its own. The
tutorial tests (`tests/tutorials`) run every notebook with these bodies put in its exercise cells.
"""

# ruff: noqa: F821


def my_shared_net(rho1: float, rho2: float, lam1: float, lam2: float) -> float:
    """Σ_i ∂J/∂logp_(i,2) for the group {τ1, τ2}, from `token_coefficients`."""
    new, old = shared_prefix_policies(rho1, rho2, lam1, lam2)
    lp, olp = policy.token_logp(new, idx), policy.token_logp(old, idx)
    c = token_coefficients("gspo", lp, olp, adv, mask, group, length_norm=False, **NO_CLIP)
    return float(c[:, 1].sum())


def my_cancelling_lambda2(rho1: float, rho2: float, lam1: float) -> float:
    """The λ2 that makes GSPO's shared-prefix coefficient vanish (a number or a formula)."""
    # s_i = (ρ1·ρ2·λ_i)^(1/3) (eq. 37, length-normalised): s_1 = s_2, hence Â_1 s_1 + Â_2 s_2 = 0, needs λ2 = λ1
    return lam1
