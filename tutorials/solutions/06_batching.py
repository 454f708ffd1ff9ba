"""Solutions to the exercises of tutorial 6 (`tutorials/06_batching.py`): try them yourself first.

Each function is meant to replace the exercise cell of the same name in the notebook: it uses the
notebook's variables (`policy`, `mask`, ...) and imports, so this file is not run on its own. The
tutorial tests (`tests/tutorials`) run every notebook with these bodies put in its exercise cells.
"""

# ruff: noqa: F821


def my_sign_split(adv: torch.Tensor) -> list[torch.Tensor]:
    """[indices with Â > 0, indices with Â ≤ 0]."""
    return [torch.nonzero(adv > 0).flatten(), torch.nonzero(adv <= 0).flatten()]


def my_is_balanced(adv: torch.Tensor, rho: float) -> bool:
    """The cancellation-hypothesis paper's condition (Sec. 4) on one update batch."""
    n = len(adv)
    return bool((adv > 0).sum() / n >= rho and (adv < 0).sum() / n >= rho)
