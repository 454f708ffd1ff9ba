"""Update tokens/s and padding on completions of mixed lengths: micro-batches by rows vs by token budget.

    .venv/bin/python benchmarks/packing_speed.py            # ~2 min on 2 CPU cores
    .venv/bin/python benchmarks/packing_speed.py --quick    # a smaller batch, 1 round

One batch of ``--groups`` × ``--group-size`` completions whose lengths are drawn log-uniformly between
``--min-len`` and ``--max-len`` tokens (the long tail of reasoning rollouts: most rows short, a few
long), scored by ``scaledrun.rollout.score_completions`` on the tiny Qwen3 (random weights: nothing here
depends on what it would sample). Each layout runs ``scaledrun.train.update`` (one mini-batch, GRPO,
AdamW) on that batch, alternating A, B, C, ... for ``--rounds`` rounds, in this one process:

- ``rows, untrimmed`` (how the trainer packed before token budgets): ``micro_batch_size`` consecutive rows,
  every pass padded to the step's widest prompt + completion (run with ``scaledrun.train.trim_batch``
  replaced by the identity for its rounds);
- ``rows, trimmed``: ``micro_batch_size`` consecutive rows, each pass trimmed to its own widest row;
- ``tokens``: ``max_tokens_per_micro_batch`` = ``micro_batch_size`` × the widest row, i.e. the same
  bound on the activations of one pass as the rows layout's worst case, packed by length.

Reported per layout: passes, padding fraction of the gradient passes' token slots, update seconds (best
and median over rounds) and real tokens per second of the update (prompt + completion tokens of the
mini-batch over its update time). The old-log-prob pass is not timed: it is the same for all layouts.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import scaledrun.train as tr
from scaledrun.config import RunConfig
from scaledrun.data import load_tasks
from scaledrun.model import load_model_and_tokenizer
from scaledrun.packing import RowLengths, pack_rows
from scaledrun.rollout import score_completions
from scaledrun.tasks import format_prompt
from scaledrun.tiny import build_tiny


def mixed_batch(cfg: RunConfig, model, tokenizer, groups: int, size: int, lo: int, hi: int, seed: int):
    """A batch of chosen completions with log-uniform lengths in [lo, hi] (EOS at the end of each)."""
    gen = torch.Generator().manual_seed(seed)
    tasks = load_tasks(cfg, "train", groups)
    vocab = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    u = torch.rand(groups * size, generator=gen)
    lengths = torch.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))).round().long().tolist()
    prompts, answers, gids, comps = [], [], [], []
    for i, n in enumerate(lengths):
        task = tasks[i // size]
        body = [vocab[int(d)] for d in torch.randint(0, 10, (n - 1,), generator=gen)]
        comps.append([*body, eos] + [pad] * (hi - n))
        prompts.append(format_prompt(tokenizer, task.prompt))
        answers.append(task.answer)
        gids.append(i // size)
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    batch, _ = score_completions(
        model, tokenizer, enc["input_ids"], enc["attention_mask"], torch.tensor(comps),
        prompts=prompts, answers=answers, group_ids=gids, temperature=1.0,
    )  # fmt: skip
    batch.advantages = torch.randn(len(batch), generator=gen)
    return batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", dest="group_size", type=int, default=8)
    ap.add_argument("--min-len", dest="min_len", type=int, default=8)
    ap.add_argument("--max-len", dest="max_len", type=int, default=384)
    ap.add_argument("--micro-batch-size", dest="micro", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="2 groups, lengths up to 128, 1 round")
    args = ap.parse_args()
    if args.quick:
        args.groups, args.max_len, args.rounds = 2, 128, 1
    warnings.filterwarnings("ignore")
    import transformers
    from accelerate import Accelerator

    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="packing_speed_") as tmp:
        model_dir = build_tiny(Path(tmp) / "tiny", "arithmetic", seed=0, warm_start_steps=0)
        base = RunConfig(
            model=str(model_dir), output_dir=str(Path(tmp) / "run"), max_new_tokens=args.max_len,
            group_size=args.group_size, prompts_per_step=args.groups, num_train=args.groups, truncation="keep",
        )  # fmt: skip
        model, tokenizer = load_model_and_tokenizer(base)
        batch = mixed_batch(
            base, model, tokenizer, args.groups, args.group_size, args.min_len, args.max_len, 0
        )
        model.train()
        lengths = RowLengths.of(batch)
        widest = int((lengths.prompt + lengths.completion).max())
        real = float((lengths.prompt + lengths.completion).sum())
        budget = args.micro * widest
        layouts = {
            "rows, untrimmed": {"micro_batch_size": args.micro},
            "rows, trimmed": {"micro_batch_size": args.micro},
            "tokens": {"max_tokens_per_micro_batch": budget},
        }
        accelerator = Accelerator(cpu=True)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
        times: dict[str, list[float]] = {k: [] for k in layouts}
        slots: dict[str, float] = {}
        passes: dict[str, int] = {}
        for r in range(args.rounds + 1):  # round 0: a warm-up (first-call costs), not timed
            for name, fields in layouts.items():
                cfg = RunConfig(**{**base.__dict__, **fields})
                trim = tr.trim_batch
                if name == "rows, untrimmed":
                    tr.trim_batch = lambda b: b  # the old layout: every pass as wide as the step's widest row
                t0 = time.perf_counter()
                res = tr.update(cfg, accelerator, model, optimizer, batch, batch.advantages, torch.Generator(),
                                measure=False)  # fmt: skip
                tr.trim_batch = trim
                if name == "rows, untrimmed":  # ``res.slots`` counts trimmed passes: the untrimmed ones
                    res.slots = float(len(batch) * batch.input_ids.shape[1])
                if r > 0:
                    times[name].append(time.perf_counter() - t0)
                slots[name] = res.slots
        passes["rows, untrimmed"] = passes["rows, trimmed"] = math.ceil(len(batch) / args.micro)
        passes["tokens"] = len(pack_rows(lengths, batch.group, budget))

    print(
        f"{len(batch)} completions ({args.groups} groups of {args.group_size}), lengths log-uniform in "
        f"[{args.min_len}, {args.max_len}] (mean {float(lengths.completion.float().mean()):.0f}), widest row "
        f"{widest} tokens; micro_batch_size {args.micro} vs max_tokens_per_micro_batch {budget}; "
        f"{args.rounds} rounds, torch threads {torch.get_num_threads()}"
    )
    head = f"{'layout':<18}{'passes':>7}{'padding':>9}{'best s':>9}{'median s':>10}{'tokens/s':>10}"
    print(head)
    print("-" * len(head))
    for name in layouts:
        best, med = min(times[name]), statistics.median(times[name])
        print(
            f"{name:<18}{passes[name]:>7}{1 - real / slots[name]:>9.2f}{best:>9.3f}{med:>10.3f}{real / best:>10.0f}"
        )
    for name in ("rows, untrimmed", "rows, trimmed"):
        print(f"time, tokens / {name} (best): {min(times['tokens']) / min(times[name]):.2f}")


if __name__ == "__main__":
    main()
