"""Solutions to the exercises of tutorial 3 (`tutorials/03_equivalent_solutions_and_entropy_collapse.py`): try them yourself first.

Each function is meant to replace the exercise cell of the same name in the notebook: it uses the
notebook's variables (`policy`, `mask`, ...) and imports, so this file is not run on its own. The
tutorial tests (`tests/tutorials`) run every notebook with these bodies put in its exercise cells.
"""

# ruff: noqa: F821


def my_sequence_weights(
    logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, length_norm: bool
) -> torch.Tensor:
    """(B,) sequence weights: Π_t r over each row's real tokens (length_norm=False) or GSPO's (Π_t r)^(1/|τ|)."""
    log_ratio = ((logp - old_logp) * mask).sum(
        -1
    )  # log Π_t r_(i,t) = log π_θ(τ_i)/π_old(τ_i), padding left out
    if length_norm:  # eq. (44): the |τ_i|-th root, each row its own number of real tokens
        log_ratio = log_ratio / mask.sum(-1)
    return log_ratio.exp()


def my_equiv_entropy(log_odds: float) -> float:
    """Entropy (nats) of (p, 1 − p), p = τ2's share of the equivalent set, from ℓ = log π(τ2)/π(τ3)."""
    p = 1.0 / (1.0 + math.exp(-log_odds))  # π(τ2)/(π(τ2) + π(τ3)) = e^ℓ/(1 + e^ℓ)
    return -p * math.log(p) - (1.0 - p) * math.log(1.0 - p)
