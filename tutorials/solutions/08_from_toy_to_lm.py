"""Solutions to the exercises of tutorial 8 (`tutorials/08_from_toy_to_lm.py`): try them yourself first.

Each function is meant to replace the exercise cell of the same name in the notebook: it uses the
notebook's variables and imports, so this file is not run on its own. The tutorial tests
(`tests/tutorials`) run every notebook with these bodies put in its exercise cells.
"""

# ruff: noqa: F821


def my_shared_prefix_net(coef: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(L,) Σ_i coef[i, t] over the group's common prefix t = 0 … L−1."""
    agree = ((tokens == tokens[0]) & mask.bool()).all(0)  # (T,) every completion has completion 0's token
    prefix = agree.long().cumprod(0).bool()  # ... here and at every position before
    return coef[:, prefix].sum(0)


def my_signs(arm: dict[int, float], baseline: dict[int, float]) -> dict[int, int]:
    """Seed → sign of arm − baseline (+1, −1, 0 for a tie), matched by seed; inf vs inf is a tie."""
    # compare, never subtract: inf − inf is NaN, while inf > inf and inf < inf are both False (a tie)
    return {s: int(arm[s] > baseline[s]) - int(arm[s] < baseline[s]) for s in arm}
