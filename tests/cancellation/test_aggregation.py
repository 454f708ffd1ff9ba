"""Tests of cancellation.aggregation against plain loops over sequences and tokens (reference.reduce)."""

from __future__ import annotations

import pytest
import torch

from cancellation.aggregation import AGGREGATIONS, aggregate

from . import reference as ref

#: Every comparison here is between two code paths in float64, at a tolerance well above its
#: rounding (library vs plain loops, micro-batches vs the full batch): ``tests/exactness.py``.
pytestmark = pytest.mark.exactness

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def _batch(seed: int, b: int = 6, t: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    """Random values with varied completion lengths, one row fully masked, garbage on padding."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(b, t, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    lengths[seed % b] = 0  # a fully masked row
    lengths[(seed + 1) % b] = t  # a full row
    mask = torch.arange(t)[None, :] < lengths[:, None]
    values = torch.where(mask, values, torch.full_like(values, 1e3))  # padding must not leak
    return values, mask


def test_registry_has_the_four_verl_modes() -> None:
    assert sorted(AGGREGATIONS) == sorted(MODES)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float64, torch.long])
def test_each_mode_equals_plain_loop(mode: str, seed: int, mask_dtype: torch.dtype) -> None:
    values, mask = _batch(seed)
    got = aggregate(values, mask.to(mask_dtype), mode)
    want = ref.reduce(values, mask, mode)
    assert got.dim() == 0
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)


def test_hand_worked_small_batch() -> None:
    # rows: [1, 2, 3] (len 3), [4, 5, pad] (len 2), [pad, pad, pad] (len 0)
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 99.0], [7.0, 7.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    assert float(aggregate(values, mask, "token-mean")) == pytest.approx(15.0 / 5)
    assert float(aggregate(values, mask, "seq-mean-token-mean")) == pytest.approx((2.0 + 4.5 + 0.0) / 3)
    assert float(aggregate(values, mask, "seq-mean-token-sum")) == pytest.approx(15.0 / 3)
    assert float(aggregate(values, mask, "seq-mean-token-sum-norm")) == pytest.approx(15.0 / (3 * 3))
    assert float(aggregate(values, mask, "seq-mean-token-sum-norm", norm_constant=10)) == pytest.approx(0.5)


@pytest.mark.parametrize("seed", range(3))
def test_trl_loss_types_match(seed: int) -> None:
    """TRL's grpo ≡ seq-mean-token-mean, bnpo ≡ token-mean, dr_grpo ≡ seq-mean-token-sum-norm with C = max length."""
    values, mask = _batch(seed)
    max_completion_length = 16
    for trl_name, mode in ref.TRL_TO_VERL.items():
        kwargs = {"norm_constant": max_completion_length} if trl_name == "dr_grpo" else {}
        got = aggregate(values, mask, mode, **kwargs)
        want = ref.reduce(values, mask, trl_name, norm_constant=max_completion_length)
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("seed", range(3))
def test_norm_constant(seed: int) -> None:
    values, mask = _batch(seed)
    for c in (1.0, 7.0, 32.0):
        got = aggregate(values, mask, "seq-mean-token-sum-norm", norm_constant=c)
        torch.testing.assert_close(got, ref.reduce(values, mask, "seq-mean-token-sum-norm", norm_constant=c))
    with pytest.raises(ValueError, match="norm_constant must be > 0"):
        aggregate(values, mask, "seq-mean-token-sum-norm", norm_constant=0)


@pytest.mark.parametrize("mode", MODES)
def test_global_counts_override(mode: str) -> None:
    values, mask = _batch(5)
    kwargs = {"token_count": 123.0} if mode == "token-mean" else {"seq_count": 17.0}
    got = aggregate(values, mask, mode, **kwargs)
    want = ref.reduce(values, mask, mode, **kwargs)
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_with_global_counts_sum_to_full_batch(mode: str) -> None:
    """Splitting a batch into micro-batches and passing the global counts reproduces the full loss."""
    values, mask = _batch(2, b=8)
    n_tok, n_seq = float(mask.sum()), float(values.shape[0])
    full = ref.reduce(values, mask, mode)
    parts = []
    for rows in (slice(0, 3), slice(3, 5), slice(5, 8)):
        kwargs = {"token_count": n_tok} if mode == "token-mean" else {"seq_count": n_seq}
        parts.append(aggregate(values[rows], mask[rows], mode, **kwargs))
    torch.testing.assert_close(sum(parts), full, rtol=1e-13, atol=1e-13)


def test_gradient_matches_loop() -> None:
    values, mask = _batch(4)
    for mode in MODES:
        x = values.clone().requires_grad_(True)
        y = values.clone().requires_grad_(True)
        (g1,) = torch.autograd.grad(aggregate(x, mask, mode), x)
        (g2,) = torch.autograd.grad(ref.reduce(y, mask, mode), y)
        torch.testing.assert_close(g1, g2, rtol=1e-13, atol=1e-13)
        assert float(g1[~mask].abs().sum()) == 0.0


def test_unknown_mode_lists_valid_ones() -> None:
    values, mask = _batch(0)
    with pytest.raises(
        ValueError, match=r"unknown aggregation 'seq-sum'.*token-mean.*seq-mean-token-sum-norm"
    ):
        aggregate(values, mask, "seq-sum")
