"""Input validation shared by every public function: clear errors that name what to fix."""

from __future__ import annotations

import torch
from torch import Tensor


def check_1d(name: str, x: Tensor, batch: int | None = None) -> None:
    """Raise unless ``x`` is a 1-D tensor (of length ``batch`` when given)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 1:
        raise ValueError(f"`{name}` must have shape (B,), got {tuple(x.shape)}")
    if batch is not None and x.shape[0] != batch:
        raise ValueError(f"`{name}` has {x.shape[0]} entries but the batch has B={batch}")


def check_2d(name: str, x: Tensor, shape: tuple[int, int] | None = None) -> None:
    """Raise unless ``x`` is a 2-D tensor (of ``shape`` when given)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"`{name}` must have shape (B, T), got {tuple(x.shape)}")
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ValueError(f"`{name}` has shape {tuple(x.shape)} but expected (B, T) = {tuple(shape)}")


def check_finite(name: str, x: Tensor) -> None:
    """Raise if ``x`` holds NaN or infinite values."""
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(
            f"`{name}` contains {bad} NaN/inf value(s); fix the values before computing the loss"
        )


def check_int(name: str, x: Tensor) -> None:
    """Raise unless ``x`` holds integers (token ids or event keys: not float, complex or bool)."""
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise TypeError(f"`{name}` must hold integer token ids, got dtype {x.dtype}")


def check_group(group: Tensor, batch: int) -> None:
    """Raise unless ``group`` is a (B,) integer tensor."""
    check_1d("group", group, batch)
    if group.is_floating_point() or group.dtype == torch.bool:
        raise TypeError(f"`group` must hold integer prompt ids, got dtype {group.dtype}")


def check_mask(mask: Tensor, shape: tuple[int, int]) -> None:
    """Raise unless ``mask`` is (B, T) and selects at least one token."""
    check_2d("mask", mask, shape)
    if not bool(mask.any()):
        raise ValueError("`mask` selects no token: every completion is empty or fully masked")


def group_index(group: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary prompt ids to 0..n_groups-1.

    Args:
        group: (B,) integer prompt ids, in any order.
    Returns:
        inverse: (B,) long, the compact group index of each completion; n_groups: the number of groups.
    """
    uniq, inverse = torch.unique(group, return_inverse=True)
    return inverse, int(uniq.numel())


def group_sum(values: Tensor, inverse: Tensor, n_groups: int) -> Tensor:
    """Sum (B,) values per group: returns (n_groups,)."""
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, inverse, values)
