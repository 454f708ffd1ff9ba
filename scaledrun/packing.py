"""Micro-batches by token budget: rows sorted by length, whole groups packed, each pass trimmed to its rows.

A mini-batch's rows are left-padded prompts followed by right-padded completions (``RolloutBatch``), so a
forward pass over rows ``R`` costs ``|R| · (max prompt length + max completion length)`` token slots
(``padded_tokens``), padding included. With ``max_tokens_per_micro_batch`` the trainer splits every
mini-batch into micro-batches whose padded cost stays within that budget:

1. **Units.** Each group (the completions of one prompt) is one unit, its rows sorted by length; a group
   whose padded cost exceeds the budget is cut into consecutive runs of its sorted rows that fit (a row
   longer than the budget on its own is a unit alone: it cannot be cut).
2. **Bins.** Units are placed longest first, each into the open bin whose padded cost grows least while
   staying within the budget (first-fit-decreasing by width); a unit that fits no bin opens a new one.
   Rows of similar length end up together, so little of each pass is padding.
3. **The same number of passes on every process** (``balance_bins``): FSDP and ZeRO-3 gather the
   parameters in every forward pass, a collective that all processes must join, so a process with fewer
   bins splits its largest bins (by rows) until it has as many as the process with the most; a process
   that runs out of rows to split adds empty passes (``None``: a forward pass with zero coefficients).
4. **Trim** (``trim_batch``): each micro-batch drops the prompt columns that are padding in all its rows
   and the completion columns past its longest completion.

The grouping only decides which rows share a forward pass: the trainer computes the coefficients
∂J/∂logp of the whole mini-batch first, so the accumulated gradient is the one-pass gradient whatever the
packing (tests/scaledrun/test_packing.py checks it to 1e-6, for groups larger than the budget too).
This is the idea of verl's ``rearrange_micro_batches`` (dynamic batch size). Rows stay padded by
default, so the budget counts padding too and is a bound on the activations of each pass. With padding-free
passes (config ``padding_free``: each pass's rows packed into one sequence, ``scoring.packed_inputs``) a
pass holds only its real tokens, and every cost above is ``real_tokens`` (Σ prompt + completion lengths)
instead of ``padded_tokens``: the same steps, so the plan is as deterministic and as equal in pass count
across processes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .rollout import RolloutBatch


@dataclass(frozen=True)
class RowLengths:
    """Real (unpadded) prompt and completion lengths of each row of a batch, (b,) int64 each."""

    prompt: Tensor
    completion: Tensor

    @staticmethod
    def of(batch: RolloutBatch) -> RowLengths:
        p = batch.prompt_len
        am = batch.attention_mask.long()
        return RowLengths(prompt=am[:, :p].sum(1).cpu(), completion=am[:, p:].sum(1).cpu())

    def padded_tokens(self, rows: Tensor | list[int]) -> int:
        """|rows| · (max prompt + max completion length) of ``rows``: the token slots of one pass over them."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        if rows.numel() == 0:
            return 0
        return int(rows.numel() * (self.prompt[rows].max() + self.completion[rows].max()))

    def real_tokens(self, rows: Tensor | list[int]) -> int:
        """Σ (prompt + completion length) of ``rows``: the tokens of one padding-free pass over them."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        return int((self.prompt[rows] + self.completion[rows]).sum())

    def tokens(self, rows: Tensor | list[int], padding_free: bool = False) -> int:
        """The cost of one pass over ``rows``: ``real_tokens`` if ``padding_free``, else ``padded_tokens``."""
        return self.real_tokens(rows) if padding_free else self.padded_tokens(rows)


def _units(lengths: RowLengths, group: Tensor, budget: int, padding_free: bool = False) -> list[list[int]]:
    """Whole groups (rows sorted by length, longest first), cut where one exceeds ``budget``."""
    total = lengths.prompt + lengths.completion
    units: list[list[int]] = []
    for g in torch.unique(group.cpu()).tolist():
        rows = (group.cpu() == g).nonzero().flatten()
        rows = rows[torch.argsort(total[rows], descending=True, stable=True)].tolist()
        run: list[int] = []
        for r in rows:
            if run and lengths.tokens([*run, r], padding_free) > budget:
                units.append(run)
                run = []
            run.append(r)
        units.append(run)
    return units


def pack_rows(lengths: RowLengths, group: Tensor, budget: int, *, padding_free: bool = False) -> list[Tensor]:
    """The micro-batches (row indices, each sorted ascending) of one mini-batch under a token ``budget``.

    Every row is in exactly one micro-batch; each micro-batch's ``padded_tokens`` (``padding_free``:
    ``real_tokens``) is ≤ ``budget`` unless it is a single row longer than the budget. Deterministic (no
    RNG): every process and every rerun packs the same rows the same way.
    """
    if budget < 1:
        raise ValueError(f"max_tokens_per_micro_batch must be ≥ 1, got {budget}")
    units = _units(lengths, group, budget, padding_free)

    def cost(rows: list[int]) -> int:
        return lengths.tokens(rows, padding_free)

    width = lengths.prompt + lengths.completion
    units.sort(key=lambda u: (-int(width[u].max()), u[0]))
    bins: list[list[int]] = []
    for unit in units:
        best, best_cost = None, None
        for k, b in enumerate(bins):
            new = cost(b + unit)
            if new <= budget and (best_cost is None or new - cost(b) < best_cost):
                best, best_cost = k, new - cost(b)
        if best is None:
            bins.append(list(unit))
        else:
            bins[best].extend(unit)
    return [torch.tensor(sorted(b), dtype=torch.long) for b in bins]


def balance_bins(
    bins: list[Tensor], count: int, lengths: RowLengths, *, padding_free: bool = False
) -> list[Tensor | None]:
    """``bins`` made exactly ``count`` long (``count`` ≥ ``len(bins)``, the largest over processes).

    The bin with the largest cost (padded; ``padding_free``: real tokens) that has ≥ 2 rows is halved (its rows sorted by length) until
    there are ``count`` bins; if no bin can be split, ``None`` entries (empty passes) fill the rest.
    """
    if count < len(bins):
        raise ValueError(f"balance_bins: {len(bins)} bins cannot become {count}")
    out: list[Tensor | None] = list(bins)
    total = lengths.prompt + lengths.completion
    while len(out) < count:
        splittable = [k for k, b in enumerate(out) if b is not None and b.numel() >= 2]
        if not splittable:
            out.extend([None] * (count - len(out)))
            break
        k = max(splittable, key=lambda j: (lengths.tokens(out[j], padding_free), -j))  # type: ignore[arg-type]
        rows = out[k]
        assert rows is not None
        rows = rows[torch.argsort(total[rows], descending=True, stable=True)]
        half = rows.numel() // 2
        out[k] = rows[:half].sort().values
        out.insert(k + 1, rows[half:].sort().values)
    return out


def trim_batch(batch: RolloutBatch) -> RolloutBatch:
    """``batch`` without the prompt columns that are padding in every row and the completion columns past
    its longest completion (positions and every real token unchanged)."""
    p, t = batch.prompt_len, batch.completion_mask.shape[1]
    lengths = RowLengths.of(batch)
    keep_p = int(lengths.prompt.max()) if len(batch) else p
    keep_t = max(int(lengths.completion.max()), 1) if len(batch) else t
    cols = slice(p - keep_p, p + keep_t)
    return RolloutBatch(
        input_ids=batch.input_ids[:, cols],
        attention_mask=batch.attention_mask[:, cols],
        completion_mask=batch.completion_mask[:, :keep_t],
        old_logp=batch.old_logp[:, :keep_t],
        group=batch.group,
        advantages=batch.advantages,
        rewards=batch.rewards,
        truncated=batch.truncated,
        ref_logp=None if batch.ref_logp is None else batch.ref_logp[:, :keep_t],
        prompts=batch.prompts,
        completions=batch.completions,
        answers=batch.answers,
    )
