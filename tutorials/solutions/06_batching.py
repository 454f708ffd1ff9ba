"""Solutions to the exercises of tutorial 6 (`tutorials/06_batching.py`): try them yourself first.

Each function is meant to replace the exercise cell of the same name in the notebook: it uses the
notebook's variables and imports, so this file is not run on its own. The tutorial tests
(`tests/tutorials`) run every notebook with these bodies put in its exercise cells.
"""

# ruff: noqa: F821


def my_sign_split(adv: torch.Tensor, group: torch.Tensor) -> list[torch.Tensor]:
    """[indices with Â > 0, indices with Â ≤ 0] of the whole batch."""
    return [torch.nonzero(adv > 0).flatten(), torch.nonzero(adv <= 0).flatten()]  # the groups play no part


def my_balance(adv: torch.Tensor, rho: float) -> tuple[float, float, bool]:
    """(N_pos / |B|, N_neg / |B|, both ≥ ρ) for one update batch (cancellation-hypothesis paper, Sec. 4)."""
    n = len(adv)  # every completion, Â = 0 included
    pos, neg = float((adv > 0).sum()) / n, float((adv < 0).sum()) / n
    return pos, neg, pos >= rho and neg >= rho
