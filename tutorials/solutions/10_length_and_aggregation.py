"""Solutions to the exercises of tutorial 10 (`tutorials/10_length_and_aggregation.py`): try them yourself first.

Each function is meant to replace the exercise cell of the same name in the notebook: it uses the
notebook's imports (`torch`), so this file is not run on its own. The tutorial tests
(`tests/tutorials`) run every notebook with these bodies put in its exercise cells.
"""

# ruff: noqa: F821


def my_shared_net(adv: torch.Tensor, lengths: torch.Tensor, aggregation: str) -> float:
    """Σ_i c_i of a token every completion shares, GRPO at ratio 1, one group; `lengths` (G,) = |y_i|."""
    lengths = lengths.to(adv.dtype)
    g = len(adv)
    if aggregation == "token-mean":  # every token weighs 1/N, N = Σ|y_i|
        weight = 1 / lengths.sum()
    elif aggregation == "seq-mean-token-mean":  # each completion's token mean, then the mean over G
        weight = 1 / (g * lengths)
    elif aggregation == "seq-mean-token-sum":  # each completion's token sum, then the mean over G
        weight = torch.full_like(adv, 1 / g)
    elif aggregation == "seq-mean-token-sum-norm":  # the same over a constant C, the padded length
        weight = 1 / (g * lengths.max())
    else:
        raise ValueError(f"unknown aggregation {aggregation!r}")
    return float((adv * weight).sum())


def my_cancels_any_length(objective: str, aggregation: str, length_norm: bool) -> bool:
    """Does a whole-group shared token cancel exactly for any lengths under this objective/aggregation?"""
    # A token of completion i gets Â_i·w_i (GRPO) or s̃_i·Â_i·|y_i|·w_i·d_i (DFPO: the sequence term
    # counted on each of the |y_i| tokens, d_i = ∂log s_i/∂logp = 1/|y_i| with the geometric mean, 1
    # without). Σ Â_i = 0 and Σ s̃_i·Â_i = 0 (the transform), so the shared token's net is 0 for any
    # lengths iff that factor is the same for every completion: the power of |y_i| in it is 0.
    power = {
        "token-mean": 0,
        "seq-mean-token-mean": -1,
        "seq-mean-token-sum": 0,
        "seq-mean-token-sum-norm": 0,
    }
    if objective == "dfpo" and not length_norm:
        return power[aggregation] + 1 == 0
    return power[aggregation] == 0
