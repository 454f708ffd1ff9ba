"""Token-budget micro-batches (``scaledrun.packing``): hand-worked packings, the budget, whole groups,
the same number of passes on every process, and trimming. The gradient they give is tested against
one pass in ``test_update.py``."""

from __future__ import annotations

import torch

from scaledrun.packing import RowLengths, balance_bins, pack_rows, trim_batch
from scaledrun.rollout import RolloutBatch


def _lengths(prompt, completion):
    return RowLengths(prompt=torch.tensor(prompt), completion=torch.tensor(completion))


def _rows(bins):
    return sorted(r for b in bins if b is not None for r in b.tolist())


def test_padded_tokens_by_hand():
    lengths = _lengths([3, 5, 2], [4, 1, 7])
    assert lengths.padded_tokens([0]) == 7
    assert lengths.padded_tokens([0, 1]) == 2 * (5 + 4)
    assert lengths.padded_tokens([0, 1, 2]) == 3 * (5 + 7)
    assert lengths.padded_tokens([]) == 0


def test_whole_groups_packed_by_width():
    # two groups of 2 rows; widths: group 0 rows 10 and 9, group 1 rows 4 and 3 (prompt 2 everywhere)
    lengths = _lengths([2, 2, 2, 2], [8, 7, 2, 1])
    group = torch.tensor([0, 0, 1, 1])
    # budget 20: group 0 costs 2·10 = 20 (fits alone), group 1 costs 2·4 = 8; together 4·10 = 40 > 20
    bins = pack_rows(lengths, group, 20)
    assert [b.tolist() for b in bins] == [[0, 1], [2, 3]]
    # budget 40: everything in one pass
    assert [b.tolist() for b in pack_rows(lengths, group, 40)] == [[0, 1, 2, 3]]


def test_a_group_larger_than_the_budget_is_cut_and_every_bin_fits():
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 20, (24,), generator=gen)
    completion = torch.randint(1, 60, (24,), generator=gen)
    lengths = RowLengths(prompt=prompt, completion=completion)
    group = torch.arange(24) // 8  # three groups of 8
    widest = int((prompt + completion).max())
    for budget in (widest, 2 * widest, 5 * widest, 100 * widest):
        bins = pack_rows(lengths, group, budget)
        assert _rows(bins) == list(range(24))  # every row exactly once
        assert all(lengths.padded_tokens(b) <= budget for b in bins)
        # a group that fits the budget is never split
        for g in range(3):
            rows = (group == g).nonzero().flatten()
            holding = [b for b in bins if set(b.tolist()) & set(rows.tolist())]
            if lengths.padded_tokens(rows) <= budget:
                assert len(holding) == 1, (budget, g)
        assert pack_rows(lengths, group, budget)[0].tolist() == bins[0].tolist()  # deterministic
    assert len(pack_rows(lengths, group, 100 * widest)) == 1


def test_a_row_longer_than_the_budget_goes_alone():
    lengths = _lengths([2, 2, 2], [30, 1, 1])
    bins = pack_rows(lengths, torch.tensor([0, 0, 0]), 10)
    assert [b.tolist() for b in bins] == [[0], [1, 2]]


def test_balance_bins_splits_the_largest_then_pads_with_empty_passes():
    lengths = _lengths([1, 1, 1, 1], [9, 9, 2, 2])
    bins = [torch.tensor([0, 1]), torch.tensor([2, 3])]
    out = balance_bins(bins, 3, lengths)
    assert [b.tolist() for b in out] == [[0], [1], [2, 3]]  # the costlier bin (2·10 vs 2·3) is halved
    out = balance_bins(bins, 6, lengths)
    assert [None if b is None else b.tolist() for b in out] == [[0], [1], [2], [3], None, None]
    assert balance_bins(bins, 2, lengths) == bins


def test_trim_keeps_every_real_token_in_place():
    # prompt part 4 columns (left-padded), completion part 5 columns (right-padded)
    am = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 0, 0], [0, 1, 1, 1, 1, 1, 1, 0, 0]])
    ids = torch.arange(18).reshape(2, 9) * am
    mask = am[:, 4:].float()
    b = RolloutBatch(
        input_ids=ids, attention_mask=am, completion_mask=mask, old_logp=-mask, group=torch.tensor([0, 0]),
        advantages=torch.zeros(2), rewards=torch.zeros(2), truncated=torch.tensor([False, False]),
        ref_logp=None, prompts=["a", "b"], completions=["", ""], answers=["", ""],
    )  # fmt: skip
    t = trim_batch(b)
    assert t.prompt_len == 3 and t.completion_mask.shape[1] == 3  # widest prompt 3, widest completion 3
    assert torch.equal(t.input_ids, ids[:, 1:7]) and torch.equal(t.attention_mask, am[:, 1:7])
    assert torch.equal(t.old_logp, -mask[:, :3]) and float(t.completion_mask.sum()) == float(mask.sum())
