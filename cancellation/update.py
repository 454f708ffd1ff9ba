"""One update, written once: the schedule of one RL step's optimiser steps, and the meters that read it.

The toy (``toymodel.simulate``) and the LM trainer (``scaledrun.train``) both run an RL step as

    for each mini-batch of ``minibatches(...)``:          # Lopti stages × inner epochs × mini-batches
        logp  = the front end's log-probs of the rows       # a table lookup, or an LM forward pass
        coef, metrics = coefficients(objective, logp, ...)  # ∂J/∂logp of the *whole* mini-batch
        backpropagate coef into the parameters; one optimiser step
        meter.add(coef, rows)                               # beside the update, never inside it

Only the first and third lines differ between the two front ends. Computing the coefficients of the
whole mini-batch first is what makes gradient accumulation exact for every objective: a group
transform, a sequence ratio or an aggregation couples the rows of a mini-batch, but once the
coefficients c = ∂J/∂logp are known, Σ_{micro-batches} ∇_θ Σ_{(i,t)∈micro} c_{i,t}·logp_{i,t}(θ) is
∇_θ J exactly (the chain rule), whatever the micro-batch size. Under DFPO's paper estimator the
coefficients are s̃_i·Â_i·α_{i,t} with s̃ a constant of the whole group.

Contents:

- ``lopti_stage_advantages``: Lopti's two stages as the public Lopti code runs them (advantages zeroed
  outside each stage's token set, everything else unchanged);
- ``Schedule`` / ``minibatches``: the optimiser steps of one RL step, in order;
- ``coefficients``: one ``compute_loss`` call on a mini-batch → its coefficients and metrics;
- ``event_index`` / ``event_sums``: DFPO's shared context-token events (eq. 71–72) of a batch, indexed
  once, and each event's net and gross coefficient sum (the meters' and ``diagnostics.shared_residual``'s);
- ``CancellationMeter``: ``shared_residual``, ``group_shared_residual`` and ``sequence_net_residual`` of
  the coefficients the optimiser steps applied;
- ``RewardBalancedBuffer``: the FIFO of groups that reward-balanced batching (cancellation-hypothesis
  paper Sec. 4) selects from.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor

from ._checks import check_1d, check_2d, check_group, check_int, group_index, group_sum
from .batching import SPLIT_MODES, lopti_masks, reward_balanced_select, split_minibatches
from .objectives import compute_loss

# ------------------------------------------------------------------------------------------------
# the schedule


def lopti_stage_advantages(
    advantages: Tensor,
    old_logp: Tensor,
    mask: Tensor,
    eta: float,
    *,
    any_process: Callable[[bool], bool] | None = None,
) -> list[Tensor]:
    """Lopti's stages (Lopti paper §4.2): advantages zeroed outside the low-probability set, then the rest.

    As the public Lopti code does, each stage keeps the loss mask, the normaliser, the old log-probs
    and everything else as they are and only zeroes the advantages of the tokens outside its set, so
    a sequence-level ratio still spans every token and the aggregation still divides by every token.

    Args:
        advantages: (B,) or (B, T) advantages (per token after Advantage Reweighting).
        old_logp: (B, T) log π_old of the sampled tokens.
        mask: (B, T) 1 for completion tokens.
        eta: the probability threshold η (π_old < η is "low").
        any_process: in a multi-process run, ``any_process(flag)`` says whether ``flag`` holds on
            any process (an all-reduce): a stage is then skipped only when it is empty on every
            process, so that all processes take the same optimiser steps. None: this batch decides.
    Returns:
        one (B, T) advantage tensor per non-empty stage, the low-probability stage first.
    """
    low, high = lopti_masks(old_logp, mask, eta)
    full = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(old_logp)
    stages = []
    for stage in (low, high):  # Lopti: low-probability tokens first, then the rest
        present = bool(stage.any())
        if any_process is not None:
            present = any_process(present)
        if present:  # a stage with no token (on any process) is skipped
            stages.append(full * stage.to(full.dtype))
    return stages


@dataclass(frozen=True)
class Schedule:
    """How one RL step's batch becomes optimiser steps (the fields of the toy's and the trainer's configs).

    Attributes:
        inner_epochs: passes over the mini-batches against the same π_old (PPO epochs).
        num_minibatches: optimiser steps per inner epoch.
        batching: ``"query"`` (query-preserved mini-batches, cancellation-hypothesis paper Sec. 4) or
            ``"random"``.
        lopti_eta: η of Lopti's two-stage update (None: one stage).
    """

    inner_epochs: int = 1
    num_minibatches: int = 1
    batching: str = "query"
    lopti_eta: float | None = None

    def __post_init__(self) -> None:
        for name in ("inner_epochs", "num_minibatches"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"`{name}` must be an int ≥ 1, got {v!r}")
        if self.batching not in SPLIT_MODES:
            raise ValueError(f"unknown batching {self.batching!r}; valid: {', '.join(SPLIT_MODES)}")


@dataclass(frozen=True)
class MiniBatch:
    """One optimiser step of an RL step.

    Attributes:
        stage: Lopti stage (0 without Lopti); epoch: inner epoch; number: 0-based count over the step.
        rows: (b,) int64 rows of the batch, ascending.
        advantages: the stage's advantages of those rows, (b,) or (b, T).
        last: whether this is the RL step's last optimiser step.
    """

    stage: int
    epoch: int
    number: int
    rows: Tensor
    advantages: Tensor
    last: bool


def minibatches(
    group: Tensor,
    advantages: Tensor,
    schedule: Schedule,
    *,
    old_logp: Tensor | None = None,
    mask: Tensor | None = None,
    generator: torch.Generator | None = None,
    any_process: Callable[[bool], bool] | None = None,
) -> Iterator[MiniBatch]:
    """The optimiser steps of one RL step: Lopti stages × inner epochs × mini-batches, in order.

    Mini-batches are re-split at every inner epoch (as PPO implementations do) with ``generator``;
    with one mini-batch no split is drawn (the generator is not advanced). Lopti needs ``old_logp``
    and ``mask``; ``any_process`` goes to ``lopti_stage_advantages`` (multi-process runs).

    Args:
        group: (B,) prompt ids; advantages: (B,) or (B, T).
    """
    check_1d("group", group)
    check_group(group, group.shape[0])
    if schedule.lopti_eta is not None:
        if old_logp is None or mask is None:
            raise ValueError("Lopti (`lopti_eta`) needs `old_logp` and `mask`")
        stages = lopti_stage_advantages(
            advantages, old_logp, mask, schedule.lopti_eta, any_process=any_process
        )
    else:
        stages = [advantages]
    total = len(stages) * schedule.inner_epochs * schedule.num_minibatches
    all_rows = torch.arange(group.shape[0], device=group.device)
    number = 0
    for s, stage_adv in enumerate(stages):
        for epoch in range(schedule.inner_epochs):
            if schedule.num_minibatches == 1:
                parts = [all_rows]
            else:
                parts = split_minibatches(group.cpu(), schedule.num_minibatches, schedule.batching, generator)
            for rows in parts:
                rows = rows.to(group.device)
                number += 1
                yield MiniBatch(s, epoch, number - 1, rows, stage_adv[rows], number == total)


# ------------------------------------------------------------------------------------------------
# the coefficients of one mini-batch


@dataclass(frozen=True)
class Coefficients:
    """What one objective call on a mini-batch gives the update.

    Attributes:
        coef: (b, T) ∂J/∂logp (J = −loss), 0 on padding: the score-function coefficient of every token.
        loss: the 0-d loss value (detached).
        metrics: the objective's metrics (empty when not asked for).
    """

    coef: Tensor
    loss: Tensor
    metrics: dict[str, float]


def coefficients(
    objective: str,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    group: Tensor,
    *,
    with_metrics: bool = True,
    **params: Any,
) -> Coefficients:
    """Run ``compute_loss`` on (detached) ``logp`` and return its coefficients ∂J/∂logp.

    ``logp`` (b, T) are the current log-probs of the whole mini-batch (no graph needed); ``params`` go
    to ``compute_loss`` (aggregation, token_count, clip range, ...). The front end then applies
    ∇_θ J = Σ_{i,t} coef_{i,t}·∇_θ logp_{i,t}, in one pass or in micro-batches.
    """
    leaf = logp.detach().clone().requires_grad_(True)
    loss, metrics = compute_loss(
        objective, leaf, old_logp, advantages, mask, group, with_metrics=with_metrics, **params
    )
    grad = torch.autograd.grad(loss, leaf, allow_unused=True)[0] if loss.requires_grad else None
    if grad is None:  # e.g. every sequence clipped: the objective is constant in logp
        grad = torch.zeros_like(leaf)
    # J = −loss, so ∂J/∂logp = −∂loss/∂logp
    coef = torch.where(mask.bool(), -grad, torch.zeros_like(grad))
    return Coefficients(coef=coef, loss=loss.detach(), metrics=metrics)


# ------------------------------------------------------------------------------------------------
# meters: how much of the applied update cancels


#: Σ gross below this is rounding noise, not a coefficient: the residuals are NaN then.
NOISE = 1e-12


@dataclass
class MeterTotals:
    """Sums over a step's optimiser steps (add them across processes, then take ``residuals``).

    ``*_net`` is Σ |net| and ``*_gross`` the matching Σ gross of each residual (see ``CancellationMeter``).
    """

    shared_net: float = 0.0
    shared_gross: float = 0.0
    group_shared_net: float = 0.0
    group_shared_gross: float = 0.0
    sequence_net: float = 0.0
    sequence_gross: float = 0.0

    def as_list(self) -> list[float]:
        return [getattr(self, f.name) for f in fields(self)]

    @classmethod
    def from_list(cls, values: list[float]) -> MeterTotals:
        return cls(*[float(v) for v in values])

    def residuals(self) -> dict[str, float]:
        """The three residuals (NaN where the gross is rounding noise: nothing to measure)."""

        def ratio(net: float, gross: float) -> float:
            return net / gross if gross > NOISE else math.nan

        return {
            "shared_residual": ratio(self.shared_net, self.shared_gross),
            "group_shared_residual": ratio(self.group_shared_net, self.group_shared_gross),
            "sequence_net_residual": ratio(self.sequence_net, self.sequence_gross),
        }


#: The keys of ``MeterTotals.residuals`` (row keys in the toy and the trainer).
RESIDUAL_KEYS = ("shared_residual", "group_shared_residual", "sequence_net_residual")


@dataclass(frozen=True)
class EventIndex:
    """The shared events of one batch, indexed once (reuse it for every coefficient tensor of the batch).

    Attributes:
        keys: (E,) int64 event ids, sorted.
        inverse: (B, T) int64 slot of each token's event; E (one extra "no event" slot) for padding
            and for tokens whose key is −1.
        count: (E,) int64 occurrences of each event in the batch.
    """

    keys: Tensor
    inverse: Tensor
    count: Tensor


def event_index(keys: Tensor, mask: Tensor) -> EventIndex:
    """Index the (context, token) events of a batch: ``keys`` (B, T) int64 ids (−1: none), ``mask`` (B, T)."""
    check_2d("keys", keys)
    check_int("keys", keys)
    check_2d("mask", mask, (keys.shape[0], keys.shape[1]))
    valid = mask.bool() & (keys >= 0)
    uniq, inv = torch.unique(keys[valid].long(), return_inverse=True)
    e = uniq.shape[0]
    inverse = torch.full(keys.shape, e, dtype=torch.long, device=keys.device)
    inverse[valid] = inv
    count = torch.zeros(e, dtype=torch.long, device=keys.device).index_add_(0, inv, torch.ones_like(inv))
    return EventIndex(keys=uniq, inverse=inverse, count=count)


def event_sums(coef: Tensor, index: EventIndex) -> tuple[Tensor, Tensor]:
    """Per-event net Σ coef and gross Σ |coef| (DFPO eq. 72's bracket), each (E,).

    Args:
        coef: (B, T) token coefficients of the batch ``index`` was built on (0 where a token took no
            part, e.g. outside the mini-batch of one optimiser step).
        index: from ``event_index``.
    """
    check_2d("coef", coef, (index.inverse.shape[0], index.inverse.shape[1]))
    e = index.count.shape[0]
    flat = index.inverse.flatten()
    c = coef.flatten()
    net = torch.zeros(e + 1, dtype=coef.dtype, device=coef.device).index_add_(0, flat, c)[:e]
    gross = torch.zeros(e + 1, dtype=coef.dtype, device=coef.device).index_add_(0, flat, c.abs())[:e]
    return net, gross


class CancellationMeter:
    """The cancellation left in the coefficients an RL step applied (DFPO eq. 2, 72), over its optimiser steps.

    Built once per RL step on the step's whole batch; ``add`` is called with each optimiser step's
    coefficients. Three ratios Σ|net| / Σ gross, each summed over the optimiser steps:

    - ``shared_residual``: per event (group, context, token) occurring at least twice in the batch;
    - ``group_shared_residual``: per event that *every* completion of its group contains (Prop. 3.1's
      E_t*), where Σ_i Â_i = 0 makes GRPO inside its clip range cancel exactly (eq. 9); a group counts
      only the rows that enter the loss (a row with no unmasked token is left out);
    - ``sequence_net_residual``: per group, |Σ_i c_i| / Σ_i |c_i| with c_i = Σ_t coef_{i,t}. Under DFPO's
      paper estimator with its defaults (length-normalised s, ``seq-mean-token-mean``, whole groups in a
      mini-batch) c_i = s̃_i·Â_i/B and Σ_i Â_i s̃_i = 0, so it is 0 for any lengths; it is not with
      ``token-mean`` or ``length_norm=False`` and unequal lengths (c_i then carries |y_i|), with random
      mini-batches (a split group), nor under GRPO's token-mean with unequal lengths.

    An event or group split across mini-batches counts in each mini-batch separately (the damage that
    query-preserved batching avoids).

    Segments: a batch that holds several independent runs (the batched toy's seeds) passes ``segments``,
    each row's run; the sums are then kept per segment ((n_segments,) tensors, scatter-added, with no
    sync per optimiser step) and ``segment_residuals`` gives each run's residuals, equal to those of a
    meter built on that run's rows alone. A group must lie in one segment (a ValueError names one that
    does not), and so do its events (an event's key includes its group). ``totals`` is then the whole
    batch's (the sum over the segments).

    Args:
        keys: (B, T) int64 event ids (−1: no event, e.g. a forced step whose score direction is zero).
        mask: (B, T) 1 for the tokens that enter the loss.
        group: (B,) prompt ids.
        segments: None (one run), or (B,) int64 segment ids in [0, n_segments), n_segments = max + 1.
    """

    def __init__(self, keys: Tensor, mask: Tensor, group: Tensor, segments: Tensor | None = None) -> None:
        check_2d("keys", keys)
        check_2d("mask", mask, (keys.shape[0], keys.shape[1]))
        check_group(group, keys.shape[0])
        self.index = event_index(keys, mask)
        self.mask = mask.bool()
        e = self.index.count.shape[0]
        self.ginv, self.n_groups = group_index(group)
        in_loss = (mask.sum(-1) > 0).to(torch.long)
        gsize = group_sum(in_loss, self.ginv, self.n_groups)
        # each event's group, written by one of its tokens (over every token: slot e is "no event")
        tokens = self.index.inverse.flatten()
        ev_group = torch.zeros(e + 1, dtype=torch.long, device=keys.device)
        ev_group = ev_group.scatter_(0, tokens, self.ginv.repeat_interleave(keys.shape[1]))[:e]
        self.shared = self.index.count >= 2
        # a completion holds an event at most once (the event includes its prefix)
        self.whole = self.shared & (self.index.count == gsize[ev_group])
        self._totals = MeterTotals()
        self.n_segments: int | None = None
        if segments is not None:
            self._init_segments(segments, group, ev_group)

    def _init_segments(self, segments: Tensor, group: Tensor, ev_group: Tensor) -> None:
        """The segment of every group (checked) and event, and the (6, n_segments + 1) sums (last: unused)."""
        check_1d("segments", segments, self.ginv.shape[0])
        if segments.is_floating_point() or segments.dtype == torch.bool:
            raise TypeError(f"`segments` must hold integer segment ids, got dtype {segments.dtype}")
        seg = segments.to(self.ginv.device, torch.long)
        if seg.numel() and int(seg.min()) < 0:
            raise ValueError(f"`segments` must be ≥ 0, got {int(seg.min())}")
        n = int(seg.max()) + 1 if seg.numel() else 0
        # the segment of each group, written by one of its rows; every row must agree
        group_seg = torch.zeros(self.n_groups, dtype=torch.long, device=seg.device).scatter_(
            0, self.ginv, seg
        )
        bad = group_seg[self.ginv] != seg
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0, 0])
            a, b = sorted((int(group_seg[self.ginv[i]]), int(seg[i])))
            raise ValueError(
                f"group {int(group[i])} spans segments {a} and {b}: a group must lie in one segment"
            )
        ev_seg = group_seg[ev_group]  # an event lies in its group (its key includes the group)
        self.n_segments = n
        # the scatter targets: an event outside the shared / whole set goes to the spare slot n
        self._seg_shared = torch.where(self.shared, ev_seg, n)
        self._seg_whole = torch.where(self.whole, ev_seg, n)
        self._seg_group = group_seg
        self._seg_row = seg
        self._seg_sums = torch.zeros((6, n + 1), dtype=torch.float64, device=seg.device)

    @property
    def totals(self) -> MeterTotals:
        """The sums over the optimiser steps (with segments: over the whole batch, the segments' sum)."""
        if self.n_segments is None:
            return self._totals
        return MeterTotals.from_list(self._seg_sums[:, : self.n_segments].sum(1).tolist())

    def add(self, coef: Tensor, rows: Tensor | None = None) -> None:
        """Add one optimiser step's coefficients: (B, T), or (b, T) of the batch rows ``rows``."""
        if rows is not None:
            full = torch.zeros(self.index.inverse.shape, dtype=coef.dtype, device=coef.device)
            coef = full.index_copy_(0, rows.to(coef.device), coef)
        net, gross = event_sums(coef, self.index)
        c = torch.where(self.mask, coef, torch.zeros_like(coef)).sum(-1)  # padding never counts
        inv = self.ginv.to(coef.device)
        if self.n_segments is not None:  # per segment: scatter-add, no sync
            sums = self._seg_sums
            net_abs, gross = net.abs().to(sums.dtype), gross.to(sums.dtype)
            sums[0].index_add_(0, self._seg_shared, net_abs)
            sums[1].index_add_(0, self._seg_shared, gross)
            sums[2].index_add_(0, self._seg_whole, net_abs)
            sums[3].index_add_(0, self._seg_whole, gross)
            sums[4].index_add_(0, self._seg_group, group_sum(c, inv, self.n_groups).abs().to(sums.dtype))
            sums[5].index_add_(0, self._seg_row, c.abs().to(sums.dtype))
            return
        tot = self._totals
        tot.shared_net += float(net.abs()[self.shared].sum())
        tot.shared_gross += float(gross[self.shared].sum())
        tot.group_shared_net += float(net.abs()[self.whole].sum())
        tot.group_shared_gross += float(gross[self.whole].sum())
        tot.sequence_net += float(group_sum(c, inv, self.n_groups).abs().sum())
        tot.sequence_gross += float(c.abs().sum())

    def segment_residuals(self) -> dict[str, Tensor]:
        """Each residual per segment: (n_segments,) float64, NaN where the gross is rounding noise."""
        if self.n_segments is None:
            raise ValueError(
                "segment_residuals needs a meter built with `segments`; use `totals.residuals()`"
            )
        sums = self._seg_sums[:, : self.n_segments]
        net, gross = sums[0::2], sums[1::2]
        ok = gross > NOISE
        res = torch.where(ok, net / torch.where(ok, gross, torch.ones_like(gross)), math.nan)
        return {name: res[j] for j, name in enumerate(RESIDUAL_KEYS)}


# ------------------------------------------------------------------------------------------------
# reward-balanced batching's buffer

P = TypeVar("P")


class RewardBalancedBuffer(Generic[P]):
    """The FIFO of whole groups that reward-balanced batching selects update batches from.

    Reward-balanced batching: the cancellation-hypothesis paper, Sec. 4.

    The payload (the toy: trajectory indices; the trainer: a ``RolloutBatch``) is kept row-aligned with
    ``advantages`` and ``group``; the front end says how to concatenate and index it. Each step pushes
    its groups, ``pop`` returns a selection of ``num_groups`` groups whose positive and negative
    fractions are each ≥ ρ (``reward_balanced_select``) and removes them, or None (keep sampling);
    then the oldest groups beyond ``max_groups`` are dropped (a smaller group id is older).

    Args:
        rho, num_groups: of ``reward_balanced_select``.
        max_groups: capacity in groups (≥ num_groups).
        concat: ``concat([a, b]) -> payload`` (rows of a then b).
        select: ``select(payload, rows) -> payload`` (rows: int64 indices).
    """

    def __init__(
        self,
        rho: float,
        num_groups: int,
        max_groups: int,
        concat: Callable[[list[P]], P],
        select: Callable[[P, Tensor], P],
    ) -> None:
        if max_groups < num_groups:
            raise ValueError(f"`max_groups`={max_groups} must be ≥ num_groups={num_groups}")
        self.rho, self.num_groups, self.max_groups = float(rho), num_groups, max_groups
        self._concat, self._select = concat, select
        self.payload: P | None = None
        self.advantages: Tensor | None = None
        self.group: Tensor | None = None

    @property
    def num_buffered(self) -> int:
        """Groups waiting in the buffer."""
        return 0 if self.group is None else int(torch.unique(self.group).numel())

    def push(self, payload: P, advantages: Tensor, group: Tensor) -> None:
        if self.payload is None:
            self.payload, self.advantages, self.group = payload, advantages, group
        else:
            self.payload = self._concat([self.payload, payload])
            self.advantages = torch.cat([self.advantages, advantages])
            self.group = torch.cat([self.group, group])

    def selection(self) -> Tensor | None:
        """The rows ``pop`` would take, or None."""
        if self.group is None:
            return None
        return reward_balanced_select(self.advantages, self.group, self.rho, self.num_groups)

    def pop(self, rows: Tensor | None) -> P | None:
        """Remove and return ``rows`` (from ``selection``; None: take nothing), then apply the capacity.

        The trainer passes None when any process has no selection, so that all processes step together.
        """
        out = None
        if rows is not None:
            out = self._select(self.payload, rows)
            keep = torch.ones(self.group.shape[0], dtype=torch.bool, device=self.group.device)
            keep[rows] = False
            self._keep(keep)
        if self.group is not None:
            ids = torch.unique(self.group)
            if ids.numel() > self.max_groups:  # FIFO: drop the oldest groups beyond the capacity
                self._keep(self.group >= ids[ids.numel() - self.max_groups])
        return out

    def _keep(self, keep: Tensor) -> None:
        if not bool(keep.any()):
            self.payload = self.advantages = self.group = None
            return
        rows = torch.nonzero(keep).flatten()
        self.payload = self._select(self.payload, rows)
        self.advantages, self.group = self.advantages[rows], self.group[rows]


__all__ = [
    "RESIDUAL_KEYS",
    "CancellationMeter",
    "Coefficients",
    "EventIndex",
    "MeterTotals",
    "MiniBatch",
    "RewardBalancedBuffer",
    "Schedule",
    "coefficients",
    "event_index",
    "event_sums",
    "lopti_stage_advantages",
    "minibatches",
]
