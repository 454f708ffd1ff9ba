"""Solutions to the exercises of tutorial 10 (`tutorials/10_length_and_aggregation.py`): try them yourself first.

Each function is meant to replace the exercise cell of the same name in the notebook: it uses the
notebook's variables (`coefficients`, `EPS`, ...) and imports, so this file is not run on its own. The
tutorial tests (`tests/tutorials`) run every notebook with these bodies put in its exercise cells.
"""

# ruff: noqa: F821


def my_shared_net(adv: torch.Tensor, lengths: torch.Tensor, aggregation: str) -> float:
    """Σ_i c_i of a token every completion shares, GRPO at ratio 1, one group; `lengths` (G,) = |y_i|."""
    if aggregation == "token-mean":  # every token weighs 1/N: Σ_i Â_i / N = 0
        return float(adv.sum() / lengths.sum())
    # each completion's token mean, then the mean over the G completions: Â_i / (G·|y_i|) per token
    return float((adv / lengths).sum() / len(adv))


def my_cancels_any_length(objective: str, aggregation: str, length_norm: bool) -> bool:
    """Does a whole-group shared token cancel exactly for any lengths under this objective/aggregation?"""
    # measure it: a group of three completions of lengths 1, 2 and 4 that share their first token,
    # with unequal ratios on the other tokens (θ ≠ θ_old, inside the clip range)
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
    old_logp = torch.full((3, 4), -1.0, dtype=torch.float64) * mask
    logp = old_logp + torch.tensor([[0.0, 0, 0, 0], [0, 0.05, 0, 0], [0, -0.03, 0.02, 0.04]]) * mask
    adv = torch.tensor([1.0, -0.25, -0.75], dtype=torch.float64)
    params = {"aggregation": aggregation}
    if objective == "dfpo":
        params.update(EPS, length_norm=length_norm)
    group = torch.zeros(3, dtype=torch.long)
    c = coefficients(objective, logp, old_logp, adv, mask, group, **params).coef
    return abs(float(c[:, 0].sum())) < 1e-12
