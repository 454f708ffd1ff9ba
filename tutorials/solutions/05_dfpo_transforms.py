"""Solutions to the exercises of tutorial 5 (`tutorials/05_dfpo_transforms.py`): try them yourself first.

Each function is meant to replace the exercise cell of the same name in the notebook: it uses the
notebook's variables (`policy`, `mask`, ...) and imports, so this file is not run on its own. The
tutorial tests (`tests/tutorials`) run every notebook with these bodies put in its exercise cells.
"""

# ruff: noqa: F821


def my_closest_nonnegative_transform() -> str:
    """Name of the transform (a key of TRANSFORMS)."""
    return "orth_proj_pos"


def my_shrink_factors(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, transform
) -> torch.Tensor:
    """(G,) s̃_i / s̄_i for one group, ε = 0.2."""
    s_bar = sign_aware_clip(sequence_log_ratio(logp, old_logp, mask).exp(), adv, 0.2, 0.2)
    return transform(s_bar, adv, group) / s_bar
