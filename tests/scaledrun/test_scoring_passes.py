"""The old and reference scoring passes go through the loss's micro-batch plan (issue 27 §5).

``rollout.score_completions`` with the trainer's plan (``train.plan_micro_batches``) runs one forward per
planned micro-batch, trimmed to its rows, instead of one forward over all of a process's rows. Checked on
the real tiny Qwen3 with a forward pre-hook on its embedding (rows × width of every forward call): under a
token budget no scoring forward holds more token slots than the budget, the calls are the plan's passes
(old and reference for each), the log-probs equal the one-pass ones (float64, ``tests/exactness.py``),
and two processes with unequal rows run the same number of passes.
"""

from __future__ import annotations

import math
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

import scaledrun.train as tr
from scaledrun.model import load_model_and_tokenizer
from scaledrun.packing import RowLengths, pack_rows
from scaledrun.rollout import score_completions
from scaledrun.tasks import format_prompt

from ..exactness import FLOAT64_RTOL, close, max_abs_err
from .test_train import make_cfg

#: Completion lengths (tokens through EOS) per group, as in ``test_train.LENGTHS``; None: truncated.
LENGTHS = [[2, 5, 3, 7], [4, 1, 6, None]]
MAX_NEW = 8


def _inputs(cfg, tokenizer, lengths):
    """Prompts (every odd group's longer: left padding) and chosen completions, as ``test_train._rollout``.

    Returns (kwargs of ``score_completions``, the real prompt length of each row)."""
    from scaledrun.data import load_tasks

    tasks = load_tasks(cfg, "train", cfg.num_train)[: len(lengths)]
    digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    prompts, answers, groups, comps = [], [], [], []
    for k, (task, row_lengths) in enumerate(zip(tasks, lengths, strict=True)):
        for j, n in enumerate(row_lengths):
            size = MAX_NEW if n is None else n - 1
            body = [digits[(j + i) % 10] for i in range(size)]
            tail = [] if n is None else [eos]
            comps.append(body + tail + [pad] * (MAX_NEW - len(body) - len(tail)))
            prompts.append(format_prompt(tokenizer, ("Quick one. " if k % 2 else "") + task.prompt))
            answers.append(task.answer)
            groups.append(k)
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    kw = dict(
        prompt_ids=enc["input_ids"], prompt_mask=enc["attention_mask"], completion_ids=torch.tensor(comps),
        prompts=prompts, answers=answers, group_ids=groups,
    )  # fmt: skip
    return kw, enc["attention_mask"].sum(1).tolist()


def _model(cfg):
    """The tiny Qwen3 with LoRA in float64, its LoRA B weights set so that π ≠ π_ref."""
    model, tokenizer = load_model_and_tokenizer(cfg)
    model.double()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model, tokenizer


class _Widths:
    """Rows × width of every forward call of ``model`` (a pre-hook on its input embedding)."""

    def __init__(self, model):
        self.calls: list[tuple[int, int]] = []
        self.handle = model.get_input_embeddings().register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        self.calls.append(tuple(args[0].shape))


def _score(model, tokenizer, kw, plan=None):
    widths = _Widths(model)
    try:
        batch, stats = score_completions(
            model, tokenizer, **kw, temperature=0.7, ref_model_ctx=model.disable_adapter, plan=plan
        )
    finally:
        widths.handle.remove()
    return batch, stats, widths.calls


def _same_scores(got, want, stats, want_stats):
    for name in ("old_logp", "ref_logp"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == torch.float64
        assert max_abs_err(a, b) <= FLOAT64_RTOL * float(b.abs().max()), name
    assert torch.equal(got.completion_mask, want.completion_mask)
    assert close(stats["entropy"], want_stats["entropy"], gross=1.0)


def _cost(prompt_len, comp_len, rows):
    """Token slots of one trimmed pass over ``rows``: |rows| × (longest prompt + longest completion)."""
    return len(rows) * (max(prompt_len[r] for r in rows) + max(comp_len[r] for r in rows))


@pytest.mark.exactness
def test_scoring_passes_follow_the_token_budget(tiny_model, tmp_path):
    """Budget 3 × the widest row: the one-pass forward holds 8 rows (all of them), the planned ones at
    most the budget each; the calls are exactly the plan's passes, old then reference for each, each
    of the width the plan's rows need; the log-probs and the entropy equal the one-pass ones."""
    from accelerate import Accelerator

    cfg = make_cfg(tiny_model, tmp_path, max_new_tokens=MAX_NEW, beta=0.1)
    model, tokenizer = _model(cfg)
    kw, prompt_len = _inputs(cfg, tokenizer, LENGTHS)
    comp_len = [MAX_NEW if n is None else n for row in LENGTHS for n in row]
    widest = max(p + c for p, c in zip(prompt_len, comp_len, strict=True))
    budget = 3 * widest
    cfg.max_tokens_per_micro_batch = budget
    whole, whole_stats, whole_calls = _score(model, tokenizer, kw)
    assert whole_calls == [(8, max(prompt_len) + MAX_NEW)] * 2  # old and reference: one pass each
    assert whole_calls[0][0] * whole_calls[0][1] > budget

    accelerator = Accelerator(cpu=True)
    plans = []

    def plan(batch):
        plans.append(tr.plan_micro_batches(accelerator, cfg, batch))
        return plans[-1]

    got, stats, calls = _score(model, tokenizer, kw, plan)
    passes = [p.tolist() for p in plans[0]]
    assert sorted(r for p in passes for r in p) == list(range(8))
    # at least the total token slots / budget passes
    assert math.ceil(sum(p + c for p, c in zip(prompt_len, comp_len, strict=True)) / budget) <= len(passes)
    assert len(calls) == 2 * len(passes)
    want = [(len(p), _cost(prompt_len, comp_len, p) // len(p)) for p in passes]
    assert calls[0::2] == want and calls[1::2] == want  # old then reference, per pass
    assert all(r * w <= budget for r, w in calls)
    _same_scores(got, whole, stats, whole_stats)

    # micro_batch_size 3: ceil(8 / 3) = 3 passes of consecutive rows
    cfg.max_tokens_per_micro_batch = None
    cfg.micro_batch_size = 3
    plans.clear()
    got, stats, calls = _score(model, tokenizer, kw, plan)
    runs = [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert [(len(r), _cost(prompt_len, comp_len, r) // len(r)) for r in runs] == calls[0::2]
    assert len(calls) == 6
    _same_scores(got, whole, stats, whole_stats)


#: Each process's groups: rank 0 has 2 groups of 4, rank 1 one group of 2 short rows; under the budget
#: rank 0 needs more passes than rank 1, so rank 1 splits its bin and both run the same count.
RANK_LENGTHS = ([[2, 5, 3, 7], [4, 1, 6, None]], [[2, 3]])


def _rank_worker(rank, port, model_dir, out_dir):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2"
    )
    torch.set_num_threads(1)
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    cfg = make_cfg(model_dir, out_dir, max_new_tokens=MAX_NEW, beta=0.1)
    model, tokenizer = _model(cfg)
    kw, prompt_len = _inputs(cfg, tokenizer, RANK_LENGTHS[rank])
    widest = max(prompt_len) + MAX_NEW
    cfg.max_tokens_per_micro_batch = 2 * widest
    whole, whole_stats, _ = _score(model, tokenizer, kw)
    own = []

    def plan(batch):
        own.append(len(pack_rows(RowLengths.of(batch), batch.group, cfg.max_tokens_per_micro_batch)))
        return tr.plan_micro_batches(accelerator, cfg, batch)

    got, stats, calls = _score(model, tokenizer, kw, plan)
    _same_scores(got, whole, stats, whole_stats)
    assert all(r * w <= cfg.max_tokens_per_micro_batch for r, w in calls)
    torch.save({"calls": len(calls), "own": own[0]}, os.path.join(out_dir, f"rank{rank}.pt"))
    accelerator.wait_for_everyone()
    torch.distributed.destroy_process_group()


def test_two_processes_run_the_same_number_of_scoring_passes(tiny_model, tmp_path):
    """Rank 1's 2 rows pack into 1 pass, rank 0's 8 into more: both run the larger count (old and
    reference: twice as many forward calls), with log-probs equal to their one-pass ones."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(
        _rank_worker, args=(port, str(tiny_model), str(tmp_path)), nprocs=2, start_method="spawn"
    )
    res = [torch.load(tmp_path / f"rank{k}.pt") for k in (0, 1)]
    assert res[1]["own"] == 1 and res[0]["own"] > 1
    assert res[0]["calls"] == res[1]["calls"] == 2 * res[0]["own"]
