"""Solutions to the exercises of tutorial 5 (`tutorials/05_dfpo_transforms.py`): try them yourself first.

Each function is meant to replace the exercise cell of the same name in the notebook: it uses the
notebook's variables and imports, so this file is not run on its own. The tutorial tests
(`tests/tutorials`) run every notebook with these bodies put in its exercise cells.
"""

# ruff: noqa: F821


def my_min_replace_and_orth_proj(s_bar: torch.Tensor, adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(s̃ of Min-Replace, s̃ of Orth-Proj) for one group: eq. (50) and eq. (18)."""
    min_replace = s_bar.min() * torch.ones_like(s_bar)  # s̃_i = min_j s̄_j
    orth_proj = s_bar - (adv @ s_bar) / (adv @ adv) * adv  # s̄ − (Âᵀs̄ / ‖Â‖²) Â
    return min_replace, orth_proj


def my_post_clip_and_shrink(
    s: torch.Tensor, adv: torch.Tensor, epsilon: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(s̄, φ) for one group: the sign-aware post-clip weights (eq. 47) and Min-Replace's s̃_i / s̄_i."""
    c = s.clamp(1 - epsilon, 1 + epsilon)
    s_bar = torch.where(adv >= 0, torch.minimum(s, c), torch.maximum(s, c))
    return s_bar, s_bar.min() / s_bar


def my_dfpo_coefficients(
    log_ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, epsilon: float
) -> torch.Tensor:
    """(G, T) ∂J/∂log π of every token of one group: DFPO Min-Replace, the paper's estimator (eq. 68)."""
    length = mask.sum(-1)  # |y_i|
    s = ((log_ratio * mask).sum(-1) / length).exp()  # eq. (44): geometric mean of the token ratios
    c = s.clamp(1 - epsilon, 1 + epsilon)
    s_bar = torch.where(adv >= 0, torch.minimum(s, c), torch.maximum(s, c))  # eq. (47)
    s_tilde = s_bar.min()  # Min-Replace, a constant (stop-gradient)
    return (s_tilde * adv / (len(adv) * length))[:, None] * mask  # s̃ Â ∇log s_i, spread over |y_i| tokens
