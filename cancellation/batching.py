"""Batch construction that preserves cancellation, and Lopti's token split.

- ``random_split``: the plain random mini-batch split most RL frameworks use (cancellation-hypothesis
  paper Sec. 4), the baseline that query-preserved mini-batching replaces;
- ``query_preserved_split``: every completion of a prompt lands in the same mini-batch
  (cancellation-hypothesis paper Sec. 4);
- ``split_minibatches``: one entry point for both, chosen by name;
- ``reward_balanced_select``: pick whole groups from a rollout buffer so that both advantage signs are
  represented in the update (cancellation-hypothesis paper Sec. 4, "reward-balanced batching");
- ``lopti_masks``: Lopti's low/high-probability token sets (Lopti paper §4.2; the low set is updated first).

Shapes: ``group`` (B,) integer prompt ids; ``advantages`` (B,); ``old_logp`` and ``mask`` (B, T).
Index tensors are returned as int64 on the device of the input (CPU for ``random_split``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_1d, check_2d, check_finite, check_group, group_index, group_sum

#: Valid ``mode`` values of ``split_minibatches``.
SPLIT_MODES = ("query", "random")


def _check_num_minibatches(num_minibatches: int, available: int, what: str) -> None:
    if isinstance(num_minibatches, bool) or not isinstance(num_minibatches, int):
        raise TypeError(f"`num_minibatches` must be an int, got {type(num_minibatches).__name__}")
    if num_minibatches < 1:
        raise ValueError(f"`num_minibatches` must be ≥ 1, got {num_minibatches}")
    if num_minibatches > available:
        raise ValueError(
            f"`num_minibatches`={num_minibatches} is more than the {available} {what} in the batch: "
            f"every mini-batch needs at least one; use num_minibatches ≤ {available}"
        )


def _check_group_alone(group: Tensor) -> None:
    check_1d("group", group)
    check_group(group, group.shape[0])


def random_split(
    batch_size: int, num_minibatches: int, generator: torch.Generator | None = None
) -> list[Tensor]:
    """A random permutation of ``range(batch_size)`` cut into ``num_minibatches`` parts.

    This is the split that query-preserved mini-batching replaces: "most RL frameworks split rollout
    batches randomly into smaller mini-batches" (cancellation-hypothesis paper Sec. 4), which scatters a
    group's completions over several optimizer steps.

    Args:
        batch_size: B, the number of completions.
        num_minibatches: how many parts, 1 ≤ num_minibatches ≤ B.
        generator: optional CPU ``torch.Generator`` for reproducibility (the global RNG when None).
    Returns:
        ``num_minibatches`` int64 CPU index tensors whose sizes differ by at most 1, which together hold
        every index exactly once. Each is sorted ascending (the order inside a mini-batch does not
        change its gradient; sorted indices keep gathers contiguous).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError(f"`batch_size` must be an int, got {type(batch_size).__name__}")
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be ≥ 1, got {batch_size}")
    _check_num_minibatches(num_minibatches, batch_size, "completions")
    perm = torch.randperm(batch_size, generator=generator)
    # tensor_split gives parts whose sizes differ by at most 1
    return [part.sort().values for part in torch.tensor_split(perm, num_minibatches)]


def query_preserved_split(
    group: Tensor, num_minibatches: int, generator: torch.Generator | None = None
) -> list[Tensor]:
    """Query-preserved mini-batching (cancellation-hypothesis paper Sec. 4): each group in one mini-batch.

    The groups are shuffled with ``generator``, then sorted by size, largest first (a stable sort, so
    equal-size groups keep their shuffled order), and each goes to the mini-batch that is currently
    smallest (ties: the lowest-numbered one). This is the LPT rule of scheduling; it guarantees
    ``max size − min size ≤ largest group size``, and with equal-size groups whose number is divisible
    by ``num_minibatches`` all mini-batches have the same size.

    Args:
        group: (B,) integer prompt id of each completion (any ids, any order).
        num_minibatches: 1 ≤ num_minibatches ≤ number of groups.
        generator: optional CPU ``torch.Generator`` (the global RNG when None).
    Returns:
        ``num_minibatches`` int64 index tensors (on ``group``'s device), each sorted ascending,
        that together hold every index of the batch exactly once.
    """
    _check_group_alone(group)
    if group.shape[0] == 0:
        raise ValueError("`group` is empty: there is nothing to split")
    inverse, n_groups = group_index(group)
    _check_num_minibatches(num_minibatches, n_groups, "groups")
    sizes = torch.bincount(inverse.cpu(), minlength=n_groups)
    order = torch.randperm(n_groups, generator=generator)
    by_size = torch.sort(sizes[order], descending=True, stable=True).indices
    order = order[by_size].tolist()
    sizes_list = sizes.tolist()
    load = [0] * num_minibatches
    assignment = [0] * n_groups
    for g in order:
        # LPT: the currently smallest mini-batch (ties: the lowest index) takes the next largest group
        k = min(range(num_minibatches), key=load.__getitem__)
        assignment[g] = k
        load[k] += sizes_list[g]
    bin_of_row = torch.tensor(assignment, dtype=torch.long, device=inverse.device)[inverse]
    rows = torch.arange(group.shape[0], device=group.device)
    return [rows[bin_of_row == k] for k in range(num_minibatches)]


def split_minibatches(
    group: Tensor, num_minibatches: int, mode: str = "query", generator: torch.Generator | None = None
) -> list[Tensor]:
    """Split a batch into mini-batches: ``mode="query"`` (query-preserved) or ``"random"``.

    Args:
        group: (B,) integer prompt id of each completion.
        num_minibatches: number of mini-batches.
        mode: ``"query"`` (``query_preserved_split``) or ``"random"`` (``random_split``).
        generator: optional CPU ``torch.Generator``.
    Returns:
        a list of int64 index tensors, each sorted ascending, partitioning ``range(B)``.
    """
    if mode not in SPLIT_MODES:
        raise ValueError(f"unknown mini-batch split mode {mode!r}; valid: {', '.join(SPLIT_MODES)}")
    if mode == "query":
        return query_preserved_split(group, num_minibatches, generator)
    _check_group_alone(group)
    return [ix.to(group.device) for ix in random_split(int(group.shape[0]), num_minibatches, generator)]


def reward_balanced_select(advantages: Tensor, group: Tensor, rho: float, num_groups: int) -> Tensor | None:
    """Reward-balanced batching (cancellation-hypothesis paper Sec. 4): whole groups, both advantage signs.

    The batch given is a buffer of completed groups in arrival order (a smaller index is older). The
    selection takes exactly ``num_groups`` whole groups such that, over the selected completions,

        #{Â > 0} / n ≥ ρ   and   #{Â < 0} / n ≥ ρ,

    where n counts *every* selected completion, zero-advantage ones included (a group whose rewards
    are all equal adds to the denominator but to neither sign; that is what the paper's condition on
    the update batch means, since such completions are still in the update).

    Greedy rule: repeatedly add the not-yet-selected group that maximises min(#pos, #neg) of the
    running selection; ties go to the oldest group (the one whose first completion comes first in the
    buffer). After ``num_groups`` groups the constraint is checked once.

    Note: the greedy rule is a heuristic and can miss feasible subsets. Example (ρ = 0.4, 2 groups):
    buffer groups (in order) A = 1 pos + 1 neg, B = 1 pos + 1 neg + 8 zeros, C = 2 neg, D = 2 pos.
    Greedy takes A (min 1), then B (min 2 beats C's and D's 1) giving 2/12 of each sign, infeasible,
    so it returns None; but {C, D} has 2/4 of each sign. The tests check against brute force that
    whatever the greedy returns satisfies the constraint, and that it returns None whenever no subset
    is feasible.

    Args:
        advantages: (B,) one advantage per completion.
        group: (B,) integer prompt id of each completion.
        rho: minimum fraction of each sign, in [0, 0.5] (0.5 needs a perfect half/half selection).
        num_groups: how many whole groups to select, ≥ 1.
    Returns:
        the sorted int64 indices of the selected completions, or None when the buffer holds fewer than
        ``num_groups`` groups or the greedy selection does not satisfy the constraint (keep
        accumulating rollouts, then try again).
    """
    check_1d("advantages", advantages)
    b = advantages.shape[0]
    check_group(group, b)
    check_finite("advantages", advantages)
    rho = float(rho)
    if not (0.0 <= rho <= 0.5):
        raise ValueError(f"`rho` must be in [0, 0.5] (a fraction of each advantage sign), got {rho}")
    if isinstance(num_groups, bool) or not isinstance(num_groups, int):
        raise TypeError(f"`num_groups` must be an int, got {type(num_groups).__name__}")
    if num_groups < 1:
        raise ValueError(f"`num_groups` must be ≥ 1, got {num_groups}")
    if b == 0:
        return None
    inverse, n = group_index(group)
    if n < num_groups:
        return None
    ones = torch.ones(b, dtype=torch.long, device=group.device)
    pos = group_sum((advantages > 0).long(), inverse, n).tolist()
    neg = group_sum((advantages < 0).long(), inverse, n).tolist()
    size = group_sum(ones, inverse, n).tolist()
    # buffer order: a group's age is the position of its first completion
    first = torch.full((n,), b, dtype=torch.long, device=group.device)
    first = first.scatter_reduce(0, inverse, torch.arange(b, device=group.device), reduce="amin").tolist()
    candidates = sorted(range(n), key=first.__getitem__)
    chosen: list[int] = []
    n_pos = n_neg = n_all = 0
    for _ in range(num_groups):
        # max of min(#pos, #neg); max() keeps the first (oldest) of equal candidates
        best = max(candidates, key=lambda g: min(n_pos + pos[g], n_neg + neg[g]))
        candidates.remove(best)
        chosen.append(best)
        n_pos, n_neg, n_all = n_pos + pos[best], n_neg + neg[best], n_all + size[best]
    # cancellation-hypothesis paper Sec. 4: N_pos / |B| ≥ ρ and N_neg / |B| ≥ ρ
    if n_pos / n_all < rho or n_neg / n_all < rho:
        return None
    selected = torch.zeros(n, dtype=torch.bool, device=group.device)
    selected[chosen] = True
    return torch.nonzero(selected[inverse]).flatten()


def lopti_masks(old_logp: Tensor, mask: Tensor, eta: float) -> tuple[Tensor, Tensor]:
    """Lopti's token split (Lopti paper §4.2): low-probability tokens first, then the rest.

    Args:
        old_logp: (B, T) log π_old of each sampled token.
        mask: (B, T) 1 for completion tokens, 0 for padding.
        eta: the probability threshold η in (0, 1] (Lopti's code: 0.4 alone, 0.5 with Advantage
            Reweighting).
    Returns:
        ``(low, high)``, two (B, T) bool tensors that partition the mask: ``low`` holds the tokens with
        π_old < η, ``high`` the other completion tokens (π_old ≥ η).
    """
    check_2d("old_logp", old_logp)
    check_2d("mask", mask, (old_logp.shape[0], old_logp.shape[1]))
    eta = float(eta)
    if not (0.0 < eta <= 1.0):
        raise ValueError(f"`eta` must be a probability threshold in (0, 1], got {eta}")
    valid = mask.bool()
    check_finite("old_logp", torch.where(valid, old_logp, torch.zeros_like(old_logp)))
    # Lopti paper §4.2: low-probability group π_old(o_t) < η, high-probability group π_old(o_t) ≥ η
    low = valid & (old_logp.exp() < eta)
    high = valid & ~low
    return low, high
