"""Seconds per RL step and generated tokens/s: ``scaledrun.train`` vs TRL's ``GRPOTrainer``. Not a test.

    .venv/bin/python benchmarks/trainer_vs_trl.py                    # ~5 min on 2 CPU cores
    .venv/bin/python benchmarks/trainer_vs_trl.py --steps 10 --repeats 3 --objectives grpo
    .venv/bin/python benchmarks/trainer_vs_trl.py --model artifacts/tiny-qwen3   # skip the build
    # realistic completion lengths: an untrained model rarely samples EOS, so completions run to the limit
    .venv/bin/python benchmarks/trainer_vs_trl.py --warm-start-steps 0 --max-new-tokens 256 \
        --truncation keep --steps 4 --repeats 2 --objectives grpo

The tiny Qwen3 (``scaledrun.tiny.build_tiny``, warm-started so that completions end with EOS and some
groups have a reward signal) is built once into a temporary folder unless ``--model`` names one. For
each objective (GRPO, then GSPO) the two trainers run alternately, A, B, A, B, ... for ``--repeats``
rounds, each a fresh run of ``--steps`` RL steps from the same weights, in this one process.

Held equal
----------
- Model and tokenizer (the same folder, float32, no bf16, CPU, one process, no vLLM).
- LoRA: one ``peft.LoraConfig`` built from the run config (r, alpha, dropout, target_modules).
- Prompts: the arithmetic task's train prompts formatted with the chat template, in the order the
  trainer draws them (``scaledrun.data.step_prompts``), fed to TRL unshuffled, so both see the same
  prompts at every step; G = ``group_size`` completions per prompt, ``prompts_per_step`` prompts per
  step; ``max_new_tokens`` = ``max_completion_length``; temperature, top_p, top_k = 0 (off).
- Reward: ``scaledrun.rewards.exact_match`` (TRL gets it wrapped in its reward-function signature,
  with the gold answer as the ``answer`` dataset column).
- Advantages: group mean / group std (``adv_scale: group`` ≡ TRL ``scale_rewards="group"``).
- Truncated completions dropped from the loss (``truncation: mask`` ≡ ``mask_truncated_completions``;
  ours also leaves them out of their group's advantages, TRL keeps them there; with
  ``max_new_tokens`` 16 almost no completion of the tiny model is truncated).
- Objective: GRPO with ε = 0.2/0.2 and token-mean aggregation (TRL ``loss_type="bnpo"``); GSPO with
  ε = 3e-4/4e-4 and seq-mean-token-mean (TRL ``importance_sampling_level="sequence"``,
  ``loss_type="grpo"``); β = 0 (no reference model); ``inner_epochs`` = ``num_iterations``.
- One optimizer step per RL step per inner epoch (one mini-batch: TRL ``per_device_train_batch_size``
  = P·G, ``gradient_accumulation_steps`` = ``steps_per_generation`` = 1); AdamW, same LR, grad clip
  1.0, cosine schedule with 3% warm-up down to 0.2·LR.

What differs (each trainer's own work, deliberately kept: that is what is compared)
-----------------------------------------------------------------------------------
- Old log-probs: ours always runs a separate no-grad forward pass (with token entropy) after
  sampling and, on-policy, takes the first optimizer step's coefficients from it (no second scoring
  pass); TRL skips the old pass when ``num_iterations == 1`` (it uses the detached current log-probs,
  equal on-policy) and runs one only for ``num_iterations > 1``. Both score through the LM head on
  the completion positions only; ours in token chunks (``logprob_chunk_tokens``).
- The update: ours computes the coefficients ∂J/∂logp of the whole mini-batch with one
  ``compute_loss`` call on the detached log-probs, then backpropagates them (exact micro-batching);
  TRL backpropagates its loss directly. Diagnostics: ours computes per step the cancellation
  residuals (event keys over the batch, from those coefficients); its energy buckets and token-flip
  stats (one extra no-grad pass each) run every ``flip_every`` steps, by default on the eval cadence:
  never here (eval is off). TRL computes token entropies in its loss pass and gathers/logs its metrics every step
  (``logging_steps=1``).
- Both decode completions and compute rewards in Python; TRL also builds per-step logging tables.
- The sampled completions differ (different RNG use), so lengths and rewards differ slightly; the
  generated-token count is reported next to the time for that reason.

Timing
------
Ours: the trainer's own ``time/step_s`` of each step (rollouts through diagnostics; excludes writing
the log row and the final checkpoint; eval is off). TRL: a ``TrainerCallback``'s wall-clock from
``on_step_begin`` to ``on_step_end`` (generation, rewards, loss, backward, optimizer step; excludes the
Trainer's logging call after ``on_step_end``); with ``inner_epochs`` k an RL step is k consecutive
optimizer steps and their times are summed. The first RL step of every run is a warm-up and is left
out (allocator, lazy imports, first-call overheads); a run's seconds/step is the median of the rest
(robust to a step slowed by other processes on a shared machine). tokens/s = completion tokens up to
and including EOS, summed over the timed steps, over their summed seconds. The table gives, over the
rounds, the best (min s/step, max tok/s: the cleanest measure on a shared machine) and the median,
and ours/TRL time (< 1: ours faster). Check ``uptime`` first: other CPU-heavy processes make the
numbers meaningless (seconds instead of tens of milliseconds per step).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

# running as a script puts benchmarks/ on sys.path, not the repository root
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from scaledrun.config import RunConfig, load_config
from scaledrun.data import load_tasks, step_prompts
from scaledrun.model import lora_config
from scaledrun.rewards import exact_match
from scaledrun.tasks import format_prompt
from scaledrun.tiny import build_tiny
from scaledrun.train import train

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "scaledrun" / "configs" / "default.yaml"
#: The objectives TRL's own loss computes (their mapping onto GRPOConfig: ``scaledrun.trl_plugin.trl_loss_settings``).
OBJECTIVES = ("grpo", "gspo")


def run_config(args: argparse.Namespace, objective: str, out_dir: Path) -> RunConfig:
    overrides = [
        "--model", str(args.model), "--objective", objective, "--steps", str(args.steps),
        "--output_dir", str(out_dir), "--eval_every", "0", "--save_every", "0",
        "--group_size", str(args.group_size), "--prompts_per_step", str(args.prompts_per_step),
        "--max_new_tokens", str(args.max_new_tokens), "--inner_epochs", str(args.inner_epochs),
        "--num_minibatches", "1", "--beta", "0.0", "--dtype", "float32", "--truncation", args.truncation,
    ]  # fmt: skip
    cfg = load_config(str(args.config), overrides)
    if cfg.aggregation is not None:
        raise ValueError(
            "this benchmark maps each objective's default aggregation to TRL; leave `aggregation` unset"
        )
    return cfg


# ------------------------------------------------------------------------------------------------
# ours


def time_ours(cfg: RunConfig) -> tuple[list[float], list[float]]:
    """(seconds, generated tokens) of each RL step, from the trainer's own log rows."""
    rows = train(cfg).rows
    secs = [r["time/step_s"] for r in rows]
    toks = [r["time/tokens_per_s"] * r["time/step_s"] for r in rows]
    return secs, toks


# ------------------------------------------------------------------------------------------------
# TRL


def trl_config(cfg: RunConfig, out_dir: Path) -> Any:
    from trl import GRPOConfig

    from scaledrun.trl_plugin import trl_loss_settings

    batch = cfg.prompts_per_step * cfg.group_size
    return GRPOConfig(
        output_dir=str(out_dir),
        use_cpu=not torch.cuda.is_available(),
        bf16=cfg.dtype == "bfloat16",
        fp16=False,
        gradient_checkpointing=cfg.gradient_checkpointing,
        use_vllm=False,
        seed=cfg.seed,
        max_steps=cfg.steps * cfg.inner_epochs,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=cfg.group_size,
        num_iterations=cfg.inner_epochs,
        max_completion_length=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=0,
        mask_truncated_completions=cfg.truncation == "mask",
        **trl_loss_settings(cfg),  # loss_type, importance_sampling_level, epsilon(_high), scale_rewards
        beta=0.0,
        learning_rate=cfg.lr,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.grad_clip,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": cfg.min_lr_ratio},
        warmup_steps=max(1, round(cfg.warmup_ratio * cfg.steps * cfg.inner_epochs)),
        optim="adamw_torch",
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


class StepClock:
    """A ``TrainerCallback`` (built by ``step_clock``): the wall-clock of each optimizer step, from
    ``on_step_begin`` to ``on_step_end``; ``sync`` runs first at both ends (e.g. ``torch.cuda.synchronize``)."""

    def __init__(self, sync: Any = None) -> None:
        self.secs: list[float] = []
        self.t0 = self.t1 = 0.0  # the last step's begin and end
        self.sync = sync or (lambda: None)

    def on_step_begin(self, args, state, control, **kw):
        self.sync()
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self.sync()
        self.t1 = time.perf_counter()
        self.secs.append(self.t1 - self.t0)


def step_clock(sync: Any = None) -> Any:
    """A ``StepClock`` that is a ``transformers.TrainerCallback`` (imported only when TRL runs)."""
    from transformers import TrainerCallback

    return type("Clock", (StepClock, TrainerCallback), {})(sync)


def trl_trainer(
    cfg: RunConfig, out_dir: Path, reward: Any = exact_match, callbacks: list[Any] | None = None
) -> tuple[Any, list[float]]:
    """TRL's ``GRPOTrainer`` at ``cfg``'s settings (``trl_config``; the model folder, LoRA, the trainer's
    prompts in its order, ``reward(prompts, completions, answers)``), and the list that its reward
    wrapper appends each generation's completion-token count to."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(cfg.model, padding_side="left")
    tasks = load_tasks(cfg, "train", cfg.num_train)
    order = [
        t
        for s in range(1, cfg.steps + 1)
        for _, t in step_prompts(tasks, s, cfg.prompts_per_step, 0, 1, cfg.seed)
    ]
    data = Dataset.from_dict({
        "prompt": [format_prompt(tokenizer, t.prompt) for t in order],  # plain text: TRL adds no template
        "answer": [t.answer for t in order],
    })  # fmt: skip
    tokens: list[float] = []

    def reward_fn(prompts, completions, completion_ids, answer, **_):  # TRL's signature
        tokens.append(float(sum(len(ids) for ids in completion_ids)))
        return reward(prompts, completions, answer)

    reward_fn.__name__ = getattr(reward, "__name__", "reward")  # TRL's rewards/<name> metric
    torch.manual_seed(cfg.seed)  # the LoRA A init, as ours
    model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=getattr(torch, cfg.dtype))
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_fn,
        args=trl_config(cfg, out_dir),
        train_dataset=data,
        processing_class=tokenizer,
        peft_config=lora_config(cfg),
        callbacks=callbacks,
    )
    trainer.remove_callback(PrinterCallback)  # the metrics are still computed and logged, not printed
    return trainer, tokens


def time_trl(cfg: RunConfig, out_dir: Path) -> tuple[list[float], list[float]]:
    """(seconds, generated tokens) of each RL step (``inner_epochs`` optimizer steps) of a TRL run."""
    clock = step_clock()
    trainer, tokens = trl_trainer(cfg, out_dir, callbacks=[clock])
    trainer.train()
    k = cfg.inner_epochs
    secs = [sum(clock.secs[i : i + k]) for i in range(0, len(clock.secs), k)]
    return secs, tokens


# ------------------------------------------------------------------------------------------------


def summary(secs: list[float], toks: list[float]) -> tuple[float, float]:
    """(median seconds per step, tokens/s) of one run, without its first (warm-up) step."""
    s, t = secs[1:], toks[1 : len(secs)]
    return statistics.median(s), sum(t) / sum(s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="a built tiny model folder (default: build one)")
    ap.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    ap.add_argument("--steps", type=int, default=10, help="RL steps per run (the first is a warm-up)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating rounds (ours, TRL) per objective")
    ap.add_argument("--objectives", nargs="+", default=["grpo", "gspo"], choices=list(OBJECTIVES))
    ap.add_argument("--group-size", dest="group_size", type=int, default=8)
    ap.add_argument("--prompts-per-step", dest="prompts_per_step", type=int, default=4)
    ap.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=16)
    ap.add_argument("--inner-epochs", dest="inner_epochs", type=int, default=1)
    ap.add_argument("--warm-start-steps", dest="warm_start_steps", type=int, default=200)
    ap.add_argument(
        "--truncation",
        default="mask",
        choices=["mask", "keep"],
        help="keep: train on completions cut at --max-new-tokens (an untrained model's)",
    )
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be ≥ 2 (the first step of each run is a warm-up)")
    warnings.filterwarnings("ignore")
    import transformers

    transformers.logging.set_verbosity_error()

    with tempfile.TemporaryDirectory(prefix="trainer_vs_trl_") as tmp:
        tmp_path = Path(tmp)
        label = str(args.model)
        if args.model is None:
            label = f"tiny Qwen3 (built in a temp dir, {args.warm_start_steps} warm-start steps)"
            t0 = time.perf_counter()
            args.model = build_tiny(
                tmp_path / "tiny", "arithmetic", seed=0, warm_start_steps=args.warm_start_steps
            )
            print(
                f"built the tiny model ({args.warm_start_steps} warm-start steps) in {time.perf_counter() - t0:.0f} s"
            )
        results: dict[str, dict[str, list[tuple[float, float]]]] = {}
        for objective in args.objectives:
            results[objective] = {"ours": [], "trl": []}
            for r in range(args.repeats):
                cfg = run_config(args, objective, tmp_path / f"ours_{objective}_{r}")
                results[objective]["ours"].append(summary(*time_ours(cfg)))
                results[objective]["trl"].append(summary(*time_trl(cfg, tmp_path / f"trl_{objective}_{r}")))
                o, t = results[objective]["ours"][-1], results[objective]["trl"][-1]
                print(f"{objective} round {r + 1}: ours {o[0]:.4f} s/step, TRL {t[0]:.4f} s/step", flush=True)

    print()
    print(
        f"model {label}; "
        f"G={args.group_size}, prompts/step={args.prompts_per_step}, max_new_tokens={args.max_new_tokens}, "
        f"inner_epochs={args.inner_epochs}, truncation={args.truncation}, {args.steps} steps/run (first excluded), {args.repeats} rounds, "
        f"torch threads={torch.get_num_threads()}"
    )
    header = f"{'objective':<14}{'ours s/step':>13}{'TRL s/step':>12}{'ours/TRL':>10}{'ours tok/s':>12}{'TRL tok/s':>11}"
    print(header)
    print("-" * len(header))
    for objective, res in results.items():
        for how, pick, pick_t in (("best", min, max), ("median", statistics.median, statistics.median)):
            o_s, t_s = pick(x[0] for x in res["ours"]), pick(x[0] for x in res["trl"])
            o_t, t_t = pick_t(x[1] for x in res["ours"]), pick_t(x[1] for x in res["trl"])
            name = f"{objective} {how}"
            print(f"{name:<14}{o_s:>13.4f}{t_s:>12.4f}{o_s / t_s:>10.2f}{o_t:>12.0f}{t_t:>11.0f}")


if __name__ == "__main__":
    main()
