"""Group-relative advantages and Advantage Reweighting.

Shapes follow docs/DESIGN.md: ``rewards`` (B,), ``group`` (B,), ``advantages`` (B,) or (B, T) after a
per-token reweighting.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_1d, check_2d, check_finite, check_group, group_index, group_sum

SCALES = ("group", "batch", "none")


def group_advantages(
    rewards: Tensor,
    group: Tensor,
    scale: str = "group",
    eps: float = 1e-6,
    unbiased: bool = True,
    valid: Tensor | None = None,
) -> Tensor:
    """Group-relative advantage of every completion.

    Args:
        rewards: (B,) one scalar reward per completion.
        group: (B,) integer id of the prompt each completion answers; groups may have any sizes and
            appear in any order in the batch.
        scale: ``"group"``: divide by the group's reward std (GRPO, DFPO eq. 43); ``"batch"``: divide by
            the std of all rewards in the batch (TRL's ``scale_rewards="batch"``); ``"none"``: no
            division (Dr. GRPO; the toy of App. A eq. 29 uses this).
        eps: added to the std before dividing, as TRL (1e-4) and verl (1e-6) do; verl's value is the default.
        unbiased: Bessel-corrected std (``torch.std``'s default, which TRL and verl use).
        valid: optional (B,) bool, the rows that enter the loss (e.g. completions that were not
            truncated). A row that is not valid gets advantage 0 and takes no part in its group's
            mean and std (nor in the batch std), so the advantages of the rows that are trained on
            still sum to zero in every group; a group left with fewer than 2 valid rows gets all 0.
            None: every row is valid.

    Returns:
        (B,) advantages. Each group's advantages sum to zero. A group whose rewards are all equal
        (including a group of one) gets exactly zero advantages, never NaN.
    """
    check_1d("rewards", rewards)
    check_group(group, rewards.shape[0])
    check_finite("rewards", rewards)
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; valid: {', '.join(SCALES)}")
    if valid is not None:
        check_1d("valid", valid, rewards.shape[0])
        if valid.dtype != torch.bool:
            raise TypeError(
                f"`valid` must be a bool tensor (True: the row enters the loss), got {valid.dtype}"
            )
        out = torch.zeros_like(rewards, dtype=torch.promote_types(rewards.dtype, torch.float32))
        if bool(valid.any()):
            # the advantages of the valid rows alone; a group with one valid row gets 0 (no contrast)
            rows = torch.nonzero(valid).flatten()
            out[rows] = group_advantages(rewards[rows], group[rows], scale, eps, unbiased)
        return out
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    inverse, n_groups = group_index(group)
    counts = group_sum(torch.ones_like(rewards), inverse, n_groups)
    mean = group_sum(rewards, inverse, n_groups) / counts
    # DFPO eq. (43) numerator, App. A eq. (29): r_i - mean_j r_j within the group
    centred = rewards - mean[inverse]
    # DFPO eq. (43): an all-equal group carries no signal; the rounded mean (e.g. 7 rewards of 0.9 in
    # float32) must not leave a residue that 1/(std + eps) would blow up into a same-sign advantage
    gmax = rewards.new_full((n_groups,), float("-inf")).scatter_reduce(0, inverse, rewards, reduce="amax")
    gmin = rewards.new_full((n_groups,), float("inf")).scatter_reduce(0, inverse, rewards, reduce="amin")
    centred = torch.where((gmax == gmin)[inverse], torch.zeros_like(centred), centred)
    if scale == "none":
        return centred
    if scale == "group":
        sq = group_sum(centred * centred, inverse, n_groups)
        denom = (counts - 1.0).clamp(min=1.0) if unbiased else counts
        std = (sq / denom).sqrt()[inverse]
    else:
        std = rewards.std(unbiased=unbiased) if rewards.numel() > 1 else rewards.new_zeros(())
    # DFPO eq. (43): (r_i - mean) / std; all-equal groups have centred == 0 exactly (above), so 0 / eps = 0
    return centred / (std + eps)


def reweight_advantages(advantages: Tensor, old_logp: Tensor, alpha: float) -> Tensor:
    """Advantage Reweighting (Lopti paper §4.1, eq. 4; arXiv 2505.12929): A · [α·π_old + (1 − α)].

    Computed once from the old policy's token probability, for both signs of A, as the public Lopti
    code does (α = 0.2 alone, 0.3 together with Lopti).

    Args:
        advantages: (B,) per-completion or (B, T) per-token advantages.
        old_logp: (B, T) log π_old of each sampled token.
        alpha: in [0, 1]; 0 leaves the advantages unchanged, 1 scales each token by its π_old.
    Returns:
        (B, T) per-token advantages.
    """
    check_2d("old_logp", old_logp)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if advantages.dim() == 1:
        check_1d("advantages", advantages, old_logp.shape[0])
        advantages = advantages[:, None]
    else:
        check_2d("advantages", advantages, tuple(old_logp.shape))
    pi_old = old_logp.detach().exp()
    # Lopti paper §4.1, eq. (4): Â_{i,t} ← [α·π_old(o_{i,t}) + (1 − α)]·Â_{i,t}
    return advantages * (alpha * pi_old + (1.0 - alpha))
