"""Tests of cancellation.update: the schedule, the coefficients and the buffer that the toy and the
trainer share (each against a plain loop or a hand-worked case)."""

from __future__ import annotations

import pytest
import torch

from cancellation.batching import lopti_masks, split_minibatches
from cancellation.objectives import compute_loss
from cancellation.update import (
    RewardBalancedBuffer,
    Schedule,
    coefficients,
    lopti_stage_advantages,
    minibatches,
)

F64 = torch.float64


def test_schedule_order_and_splits_match_a_plain_loop() -> None:
    group = torch.tensor([3, 3, 7, 7, 7, 1, 1, 9])
    adv = torch.linspace(-1.0, 1.0, 8, dtype=F64)
    sched = Schedule(inner_epochs=3, num_minibatches=2, batching="random")
    got = list(minibatches(group, adv, sched, generator=torch.Generator().manual_seed(5)))
    gen = torch.Generator().manual_seed(5)
    want = [rows for _ in range(3) for rows in split_minibatches(group, 2, "random", gen)]
    assert [m.rows.tolist() for m in got] == [w.tolist() for w in want]
    assert [m.number for m in got] == list(range(6))
    assert [m.epoch for m in got] == [0, 0, 1, 1, 2, 2]
    assert [m.last for m in got] == [False] * 5 + [True]
    for m in got:
        assert torch.equal(m.advantages, adv[m.rows])


def test_one_minibatch_draws_no_split() -> None:
    gen = torch.Generator().manual_seed(0)
    state = gen.get_state()
    out = list(minibatches(torch.tensor([0, 0, 1]), torch.zeros(3), Schedule(2, 1), generator=gen))
    assert [m.rows.tolist() for m in out] == [[0, 1, 2], [0, 1, 2]]
    assert torch.equal(gen.get_state(), state)


def test_lopti_stages_zero_the_advantages_outside_each_set() -> None:
    old = torch.log(torch.tensor([[0.1, 0.9, 0.3], [0.6, 0.05, 0.5]], dtype=F64))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([2.0, -1.0], dtype=F64)
    low, high = lopti_stage_advantages(adv, old, mask, 0.4)
    # π_old < 0.4: (0,0), (0,2), (1,1); the rest of the mask is the second stage; padding in neither
    assert low.tolist() == [[2.0, 0.0, 2.0], [0.0, -1.0, 0.0]]
    assert high.tolist() == [[0.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]
    sched = Schedule(inner_epochs=2, lopti_eta=0.4)
    out = list(minibatches(torch.tensor([0, 0]), adv, sched, old_logp=old, mask=mask))
    assert [m.stage for m in out] == [0, 0, 1, 1]
    assert torch.equal(out[0].advantages, low) and torch.equal(out[3].advantages, high)
    # a stage with no token is skipped
    only_high = lopti_stage_advantages(adv, old, mask, 0.01)
    assert len(only_high) == 1 and torch.equal(only_high[0], adv[:, None] * lopti_masks(old, mask, 0.01)[1])
    with pytest.raises(ValueError, match=r"Lopti.*old_logp"):
        list(minibatches(torch.tensor([0, 0]), adv, sched))


@pytest.mark.parametrize("bad", [{"inner_epochs": 0}, {"num_minibatches": 1.5}, {"batching": "groups"}])
def test_schedule_rejects_bad_values_by_name(bad: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        Schedule(**bad)


@pytest.mark.parametrize("name", ["grpo", "grpo_symclip", "gspo", "dfpo"])
def test_coefficients_are_minus_the_loss_gradient(name: str) -> None:
    gen = torch.Generator().manual_seed(1)
    old = -torch.rand(6, 4, generator=gen, dtype=F64) - 0.1
    logp = old + 0.3 * torch.randn(6, 4, generator=gen, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    adv = torch.tensor([1.0, -0.5, -0.5, 0.7, -0.2, -0.5], dtype=F64)
    group = torch.tensor([0, 0, 0, 4, 4, 4])
    kw = {"epsilon_low": 0.2, "epsilon_high": 0.2} if name in ("gspo", "dfpo") else {}
    out = coefficients(name, logp, old, adv, mask, group, **kw)
    x = logp.clone().requires_grad_(True)
    loss, metrics = compute_loss(name, x, old, adv, mask, group, **kw)
    (g,) = torch.autograd.grad(loss, x)
    torch.testing.assert_close(
        out.coef, torch.where(mask.bool(), -g, torch.zeros_like(g)), rtol=0, atol=1e-15
    )
    assert float(out.loss) == float(loss.detach())
    assert out.metrics == metrics
    assert float(out.coef.abs().sum()) > 0


def test_buffer_selects_balanced_groups_and_applies_its_capacity() -> None:
    buf = RewardBalancedBuffer(
        rho=0.25, num_groups=1, max_groups=2, concat=lambda xs: torch.cat(xs), select=lambda p, r: p[r]
    )
    # group 0: all positive-free (zero advantages); group 1: balanced
    buf.push(torch.tensor([10, 11]), torch.tensor([0.0, 0.0]), torch.tensor([0, 0]))
    assert buf.pop(buf.selection()) is None and buf.num_buffered == 1
    buf.push(torch.tensor([20, 21]), torch.tensor([1.0, -1.0]), torch.tensor([1, 1]))
    taken = buf.pop(buf.selection())
    assert taken.tolist() == [20, 21] and buf.num_buffered == 1
    # two more unbalanced groups: capacity 2 drops the oldest (group 0)
    buf.push(torch.tensor([30]), torch.tensor([0.0]), torch.tensor([2]))
    buf.push(torch.tensor([40]), torch.tensor([0.0]), torch.tensor([3]))
    assert buf.pop(buf.selection()) is None
    assert buf.group.tolist() == [2, 3] and buf.payload.tolist() == [30, 40]
    with pytest.raises(ValueError, match="max_groups"):
        RewardBalancedBuffer(0.2, 3, 2, concat=lambda xs: xs[0], select=lambda p, r: p)


@pytest.mark.exactness  # two code paths, float64 (tests/exactness.py)
def test_cancellation_meter_matches_a_plain_loop_over_events_and_groups() -> None:
    """Two optimiser steps (a mini-batch of 3 rows, then all 6) on a hand-built batch of two groups.

    Group 5 (rows 0-2): event 100 in every completion, 101 and 102 in two, the rest once; row 1 has a
    forced step (key −1). Group 2 (rows 3-5): row 5 has no unmasked token, so the group's completions
    in the loss are rows 3 and 4, and 200 and 201 are in every one of them.
    """
    from cancellation.update import RESIDUAL_KEYS, CancellationMeter

    keys = torch.tensor([
        [100, 101, 102, 106],
        [100, 101, 103, -1],
        [100, 105, 102, 107],
        [200, 201, 202, 203],
        [200, 201, 204, 205],
        [200, 201, 202, 203],
    ])  # fmt: skip
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0], [0, 0, 0, 0]])
    group = torch.tensor([5, 5, 5, 2, 2, 2])
    gen = torch.Generator().manual_seed(3)
    first_rows = torch.tensor([0, 1, 3])
    first = torch.randn(3, 4, generator=gen, dtype=F64) * mask[first_rows]
    second = torch.randn(6, 4, generator=gen, dtype=F64) * mask
    meter = CancellationMeter(keys, mask, group)
    assert all(v != v for v in meter.totals.residuals().values())  # nothing added yet: NaN
    meter.add(first, first_rows)
    meter.add(second)

    # the plain loop
    def cells():
        return [(i, t) for i in range(6) for t in range(4) if mask[i, t] and keys[i, t] >= 0]

    count: dict[int, int] = {}
    key_group: dict[int, int] = {}
    for i, t in cells():
        k = int(keys[i, t])
        count[k] = count.get(k, 0) + 1
        key_group[k] = int(group[i])
    in_loss = {g: sum(1 for i in range(6) if int(group[i]) == g and int(mask[i].sum()) > 0) for g in (5, 2)}
    assert in_loss == {5: 3, 2: 2}
    sums = dict.fromkeys(("shared", "whole", "seq"), (0.0, 0.0))

    def acc(name: str, cs: list[float]) -> None:
        net, gross = sums[name]
        sums[name] = (net + abs(sum(cs)), gross + sum(abs(c) for c in cs))

    for rows, coef in ((first_rows.tolist(), first), (list(range(6)), second)):
        full = [[0.0] * 4 for _ in range(6)]
        for j, i in enumerate(rows):
            for t in range(4):
                full[i][t] = float(coef[j, t])
        per_event: dict[int, list[float]] = {}
        for i, t in cells():
            per_event.setdefault(int(keys[i, t]), []).append(full[i][t])
        for k, cs in per_event.items():
            if count[k] >= 2:
                acc("shared", cs)
                if count[k] == in_loss[key_group[k]]:
                    acc("whole", cs)
        for g in (5, 2):
            acc("seq", [sum(full[i]) for i in range(6) if int(group[i]) == g])
    want = [sums[name][0] / sums[name][1] for name in ("shared", "whole", "seq")]
    got = meter.totals.residuals()
    assert list(got) == list(RESIDUAL_KEYS)
    for key, w in zip(RESIDUAL_KEYS, want, strict=True):
        assert got[key] == pytest.approx(w, rel=1e-12), key
    assert 0.0 < min(want) and max(want) < 1.0
    t = meter.totals
    assert (t.sequence_net, t.sequence_gross) == pytest.approx(sums["seq"], rel=1e-12)
    assert (t.group_shared_net, t.group_shared_gross) == pytest.approx(sums["whole"], rel=1e-12)


@pytest.mark.exactness  # two code paths, float64 (tests/exactness.py)
def test_segmented_meter_equals_one_meter_per_segment() -> None:
    """Four segments in one batch, their rows interleaved, two optimiser steps (5 rows, then all 11).

    Segment 0: group 10, events 1 and 3 shared; segment 1: groups 20 and 21; segment 2: group 30 with a
    forced step (key −1), a padded token and a row with no unmasked token; segment 3: one row, nothing
    shared (its shared residuals are NaN). Each segment's residuals equal a meter's built on its rows alone.
    """
    from cancellation.update import RESIDUAL_KEYS, CancellationMeter

    keys = torch.tensor([
        [1, 2, 3], [40, 41, 42], [70, 71, -1], [1, 2, 4], [50, 51, 52], [70, 72, 73],
        [1, 5, 3], [40, 41, 43], [50, 53, 54], [74, 75, 76], [90, 91, 92],
    ])  # fmt: skip
    mask = torch.ones(11, 3, dtype=torch.long)
    mask[5, 2] = 0
    mask[9] = 0
    group = torch.tensor([10, 20, 30, 10, 21, 30, 10, 20, 21, 30, 40])
    segments = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 1, 2, 3])
    gen = torch.Generator().manual_seed(7)
    first_rows = torch.tensor([0, 1, 4, 5, 8])
    first = torch.randn(5, 3, generator=gen, dtype=F64) * mask[first_rows]
    second = torch.randn(11, 3, generator=gen, dtype=F64) * mask
    meter = CancellationMeter(keys, mask, group, segments)
    meter.add(first, first_rows)
    meter.add(second)
    got = meter.segment_residuals()
    assert list(got) == list(RESIDUAL_KEYS)
    assert all(v.shape == (4,) and v.dtype == F64 for v in got.values())

    full_first = torch.zeros(11, 3, dtype=F64).index_copy_(0, first_rows, first)
    alone = []
    for s in range(4):
        rows = torch.nonzero(segments == s).flatten()
        m = CancellationMeter(keys[rows], mask[rows], group[rows])
        m.add(full_first[rows])
        m.add(second[rows])
        alone.append(m.totals)
        want = m.totals.residuals()
        for key in RESIDUAL_KEYS:
            assert float(got[key][s]) == pytest.approx(want[key], abs=1e-12, nan_ok=True), (s, key)
    # every segment measured something; the lone row of segment 3 shares nothing
    assert not any(bool(got[k][:3].isnan().any()) for k in RESIDUAL_KEYS)
    assert got["shared_residual"][3].isnan() and got["group_shared_residual"][3].isnan()
    assert float(got["sequence_net_residual"][3]) == 1.0
    # ``totals``: the whole batch's sums, i.e. the segments' together
    whole = [sum(vals) for vals in zip(*(t.as_list() for t in alone), strict=True)]
    assert meter.totals.as_list() == pytest.approx(whole, abs=1e-12)


def test_segmented_meter_refuses_a_group_across_segments() -> None:
    from cancellation.update import CancellationMeter

    keys = torch.tensor([[1, 2], [1, 3], [4, 5], [4, 6]])
    mask = torch.ones(4, 2)
    with pytest.raises(ValueError, match="group 7 spans segments 0 and 1"):
        CancellationMeter(keys, mask, torch.tensor([7, 7, 8, 8]), torch.tensor([0, 1, 1, 1]))
    with pytest.raises(ValueError, match="group 8 spans segments 0 and 1"):
        CancellationMeter(keys, mask, torch.tensor([7, 8, 8, 9]), torch.tensor([0, 0, 1, 1]))
    with pytest.raises(ValueError, match="segments"):
        CancellationMeter(keys, mask, torch.tensor([7, 7, 8, 8]), torch.tensor([0, 0, -1, -1]))
    with pytest.raises(ValueError, match="segments"):  # one meter, no segments
        CancellationMeter(keys, mask, torch.tensor([7, 7, 8, 8])).segment_residuals()
