"""Solutions to the exercises of tutorial 4 (`tutorials/04_clipping_breaks_cancellation.py`): try them yourself first.

Each function is meant to replace the exercise cell of the same name in the notebook: it uses the
notebook's variables (`policy`, `mask`, ...) and imports, so this file is not run on its own. The
tutorial tests (`tests/tutorials`) run every notebook with these bodies put in its exercise cells.
"""

# ruff: noqa: F821


def my_sign_aware_clip(
    r: torch.Tensor, adv: torch.Tensor, epsilon_low: float, epsilon_high: float
) -> torch.Tensor:
    """s̄ of eq. (47), elementwise: min(r, clip(r)) where adv ≥ 0, max(r, clip(r)) where adv < 0."""
    c = r.clamp(1.0 - epsilon_low, 1.0 + epsilon_high)  # eq. (46)
    return torch.where(adv >= 0, torch.minimum(r, c), torch.maximum(r, c))  # eq. (47)


def my_token_coefficient(r: torch.Tensor, adv: torch.Tensor, objective: str) -> torch.Tensor:
    """∂(term)/∂log π of each token, term = min(rA, clip(r, 0.8, 1.2)A) or A·clip(r, 0, 1.2)."""
    if objective == "grpo":  # the term is A·s̄ (eq. 47); it depends on θ only where s̄ = r:
        live = torch.where(
            adv >= 0, r <= 1.2, r >= 0.8
        )  # min(r, c) = r iff r ≤ 1.2, max(r, c) = r iff r ≥ 0.8
    else:  # eq. (79): φ(r) = clip(r, 0, 1 + ε) is r below 1 + ε (r > 0 always), constant above
        live = r < 1.2
    return torch.where(live, r * adv, torch.zeros_like(r))  # ∂(r·A)/∂log π = r·A


def my_cancelling_interval(epsilon_low: float, epsilon_high: float) -> tuple[float, float]:
    """(w_lo, w_hi) where GRPO still cancels on the shared token."""
    # inside the clip range both terms depend on θ and cancel; outside it only one of them does (eq. 75-76)
    return (1.0 - epsilon_low, 1.0 + epsilon_high)
