"""Token-budget packings checked for what they optimise, not only for validity (issue 26 §4): hand-worked
cases where a plausible slip (``>`` for ``>=``, worst fit for best fit, rows sorted the wrong way before a
cut, pass counts not equalised across two processes) still gives a valid packing, but another one.

Widths are prompt + completion lengths; a pass over rows R costs |R| · max width (``padded_tokens``)."""

from __future__ import annotations

import itertools
import os
import socket

import torch
import torch.multiprocessing as mp

from scaledrun.config import RunConfig
from scaledrun.packing import RowLengths, _units, balance_bins, pack_rows
from scaledrun.rollout import RolloutBatch


def _widths(widths):
    """Rows of prompt length 1 and completion length ``w − 1``: width w."""
    return RowLengths(prompt=torch.ones(len(widths), dtype=torch.long), completion=torch.tensor(widths) - 1)


def _bins(bins):
    return [None if b is None else b.tolist() for b in bins]


def _best_two_pass_slots(lengths, group, budget):
    """The fewest token slots of any packing into 2 passes that keeps every group whole and every pass
    within ``budget`` (every assignment of the groups to 2 passes, tried)."""
    groups = sorted(set(group.tolist()))
    best = None
    for sides in itertools.product((0, 1), repeat=len(groups)):
        passes = [[r for r, g in enumerate(group.tolist()) if sides[groups.index(g)] == k] for k in (0, 1)]
        costs = [lengths.padded_tokens(p) for p in passes]
        if all(passes) and max(costs) <= budget and (best is None or sum(costs) < best):
            best = sum(costs)
    return best


def test_a_group_that_exactly_fits_the_budget_stays_whole():
    """Group 0 (widths 10 and 5) costs 2·10 = 20 = the budget: one unit. Split (``>=``), its row of width
    10 would share a pass with group 1's row of width 10 and the group would run in two passes."""
    lengths, group = _widths([10, 5, 10]), torch.tensor([0, 0, 1])
    assert lengths.padded_tokens([0, 1]) == 20
    assert _units(lengths, group, 20) == [[0, 1], [2]]
    assert _bins(pack_rows(lengths, group, 20)) == [[0, 1], [2]]
    assert _units(lengths, group, 19) == [[0], [1], [2]]  # one token under: cut


def test_best_fit_puts_a_unit_where_the_pass_grows_least():
    """Widths 4, 4 (group 0), 7 (group 1), 3 (group 2), budget 20. Longest first: [7]; group 0 cannot join
    it (3·7 = 21), so it opens a pass (2·4 = 8); the row of width 3 fits both passes: with [7] the pass
    grows by 7 (to 14), with group 0 by 4 (to 12). Best fit: [7] | [4, 4, 3], 7 + 12 = 19 slots, the
    fewest of any two-pass packing (one pass would cost 4·7 = 28 > 20)."""
    lengths, group, budget = _widths([4, 4, 7, 3]), torch.tensor([0, 0, 1, 2]), 20
    bins = pack_rows(lengths, group, budget)
    assert _bins(bins) == [[2], [0, 1, 3]]
    assert sum(lengths.padded_tokens(b) for b in bins) == 19 == _best_two_pass_slots(lengths, group, budget)
    assert lengths.padded_tokens([0, 1, 2, 3]) > budget  # two passes is the fewest


def test_a_cut_group_is_cut_longest_rows_first():
    """Group 2 (widths 8, 8, 6) costs 3·8 = 24 > 23: cut. Longest first it becomes [8, 8] (16) and [6],
    and group 1 (widths 1, 2) joins the [6]: two passes, [8, 8] | [1, 2, 6] (16 + 18 slots). Cut from the
    shortest row up it would be [6, 8] and [8], and group 1 would fit neither (3·8 = 24): three passes."""
    lengths, group, budget = _widths([1, 2, 8, 8, 6]), torch.tensor([1, 1, 2, 2, 2]), 23
    assert sorted(map(sorted, _units(lengths, group, budget))) == [[0, 1], [2, 3], [4]]
    bins = pack_rows(lengths, group, budget)
    assert _bins(bins) == [[2, 3], [0, 1, 4]]
    assert lengths.padded_tokens(list(range(5))) > budget  # two passes is the fewest


def test_balance_bins_halves_a_bin_longest_rows_first():
    """Rows of widths 10, 9, 1 made two passes: the longest row alone, [10] | [9, 1] (largest pass 18),
    not [10, 9] | [1] (largest pass 20)."""
    lengths = _widths([10, 9, 1])
    out = balance_bins([torch.tensor([0, 1, 2])], 2, lengths)
    assert _bins(out) == [[0], [1, 2]]
    assert max(lengths.padded_tokens(b) for b in out) == 18


# ---- two processes: the same number of passes on each


#: Row widths of each process's mini-batch (one group per row) and the budget: rank 0 packs into 3
#: passes ([10] [9] [8]: no two fit together under 17), rank 1 into 1 ([2, 2, 2]: 6).
RANK_WIDTHS = ([10, 9, 8], [2, 2, 2])
BUDGET = 17


def _batch(widths):
    """A ``RolloutBatch`` whose row k has a 1-token prompt and a ``widths[k] − 1``-token completion."""
    rows, t = len(widths), max(widths) - 1
    comp = (torch.arange(t)[None, :] < torch.tensor(widths)[:, None] - 1).long()
    am = torch.cat([torch.ones(rows, 1, dtype=torch.long), comp], 1)
    zeros = torch.zeros(rows)
    return RolloutBatch(
        input_ids=am * 5, attention_mask=am, completion_mask=comp.float(), old_logp=-comp.float(),
        group=torch.arange(rows), advantages=zeros, rewards=zeros, truncated=torch.zeros(rows, dtype=torch.bool),
        ref_logp=None, prompts=[""] * rows, completions=[""] * rows, answers=[""] * rows,
    )  # fmt: skip


def _plan_on_rank(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2"
    )
    from accelerate import Accelerator

    import scaledrun.train as tr

    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == 2
    cfg = RunConfig(model="unused", output_dir="unused", max_tokens_per_micro_batch=BUDGET)
    plan = tr.plan_micro_batches(accelerator, cfg, _batch(RANK_WIDTHS[rank]))
    torch.save(_bins(plan), os.path.join(out_dir, f"rank{rank}.pt"))
    accelerator.wait_for_everyone()
    torch.distributed.destroy_process_group()


def test_two_processes_plan_the_same_number_of_passes(tmp_path):
    """Rank 0 packs its rows into 3 passes, rank 1 into 1: ``plan_micro_batches`` (two real processes,
    gloo) gives both 3. Rank 1 halves its one bin (rows sorted by width, ties by index: [0] | [1, 2]),
    then the costlier half ([1, 2], 2·2 = 4 slots): [0] | [1] | [2]."""
    lengths = [_widths(w) for w in RANK_WIDTHS]
    assert [len(pack_rows(x, torch.arange(3), BUDGET)) for x in lengths] == [3, 1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_plan_on_rank, args=(port, str(tmp_path)), nprocs=2, start_method="spawn")
    plans = [torch.load(tmp_path / f"rank{k}.pt") for k in (0, 1)]
    assert plans == [[[0], [1], [2]], [[0], [1], [2]]]
