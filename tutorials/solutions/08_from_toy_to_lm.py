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


def my_sign_counts(arm: dict[int, float], baseline: dict[int, float]) -> tuple[int, int, int]:
    """(seeds with arm > baseline, seeds with arm < baseline, ties), matched by seed."""
    larger = sum(arm[s] > baseline[s] for s in arm)
    smaller = sum(arm[s] < baseline[s] for s in arm)
    return larger, smaller, len(arm) - larger - smaller  # inf vs inf is neither: a tie
