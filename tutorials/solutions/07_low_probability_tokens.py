"""Solutions to the exercises of tutorial 7 (`tutorials/07_low_probability_tokens.py`): try them yourself first.

Each function is meant to replace the exercise cell of the same name in the notebook: it uses the
notebook's imports, so this file is not run on its own. The
tutorial tests (`tests/tutorials`) run every notebook with these bodies put in its exercise cells.
"""

# ruff: noqa: F821


def my_sequence_score_norm(token_logp, theta: torch.Tensor, mask: torch.Tensor) -> float:
    """‖∇_θ Σ_t mask_t · log π(a_t | h_t)‖ at θ, by autograd through `token_logp`."""
    z = theta.clone().requires_grad_(True)  # θ itself is a leaf without a gradient
    (token_logp(z) * mask).sum().backward()  # padding positions are no tokens: masked out
    return float(z.grad.norm())


def my_lever_peak(alpha: float) -> float:
    """The π in [0, 1] that maximises (α·π + 1 − α)·(1 − π)."""
    # f(π) = (1 − α) + (2α − 1)π − απ²: f'(π) = 0 at (2α − 1)/(2α); for α ≤ 1/2 that is ≤ 0, and f falls on [0, 1]
    if alpha <= 0.5:
        return 0.0
    return (2 * alpha - 1) / (2 * alpha)
