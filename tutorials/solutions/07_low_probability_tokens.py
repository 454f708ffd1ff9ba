"""Solutions to the exercises of tutorial 7 (`tutorials/07_low_probability_tokens.py`): try them yourself first.

Each function is meant to replace the exercise cell of the same name in the notebook: it uses the
notebook's variables (`policy`, `mask`, ...) and imports, so this file is not run on its own. The
tutorial tests (`tests/tutorials`) run every notebook with these bodies put in its exercise cells.
"""

# ruff: noqa: F821


def my_sequence_score_norm(i: int) -> float:
    """‖∇_θ Σ_t log π(a_t | h_t)‖ for completion idx[i] at θ, by autograd through `policy.token_logp`."""
    z = theta.clone().requires_grad_(True)  # θ itself is a leaf without a gradient
    (policy.token_logp(z, idx[i : i + 1])[0] * mask[i]).sum().backward()
    return float(z.grad.norm())


def my_pi_for_90_percent(alpha: float) -> float:
    """π_old with α·π_old + (1 − α) = 0.9."""
    return (0.9 - (1.0 - alpha)) / alpha
