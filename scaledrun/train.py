"""Group-relative RL on a Hugging Face causal LM with LoRA: GRPO, GRPO-fix, GSPO, DFPO (+ AR, Lopti).

Every loss is one ``cancellation.compute_loss`` call; this file only moves tensors around. It reads top
to bottom: config, model, data, then the loop (rollout -> rewards -> advantages -> update -> diagnostics
-> log -> eval -> checkpoint).

Launching
---------
The same module runs in one process (``python -m scaledrun.train``) or under ``accelerate launch``;
``--config`` takes a YAML of ``RunConfig`` fields and any ``--field value`` overrides it.

CPU smoke test (the tiny Qwen3, a few minutes)::

    python -m scaledrun.tiny --out artifacts/tiny-qwen3
    python -m scaledrun.train --config scaledrun/configs/default.yaml --steps 20

Two CPU processes (gloo; what ``tests/scaledrun/test_multiprocess.py`` runs; on a machine without a
GPU the trainer passes ``cpu=True`` to Accelerate so a ``--multi_gpu`` launch uses gloo)::

    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no \\
        --dynamo_backend no -m scaledrun.train --config scaledrun/configs/default.yaml --steps 20

One GPU (``--preset`` on the command line overrides the YAML file: Qwen3-0.6B, bf16, LoRA r 16, lr 1e-5;
the other options override the preset; ``--micro_batch_size`` bounds the rows per forward/backward)::

    python -m scaledrun.train --config scaledrun/configs/default.yaml --preset qwen3-0.6b --task template \\
        --max_new_tokens 64 --output_dir runs/qwen3-0.6b
    # or: accelerate launch --num_processes 1 -m scaledrun.train --config ...

N GPUs on one machine, with the shipped Accelerate configs (``--num_processes`` overrides the file's 2;
each process generates whole groups for its own ``prompts_per_step`` prompts, so a step sees
N × ``prompts_per_step`` prompts)::

    # DDP (tested on 2 CPU processes)
    accelerate launch --config_file scaledrun/accelerate/ddp.yaml --num_processes N -m scaledrun.train --config ...
    # DeepSpeed ZeRO-2 / ZeRO-3 (pip install deepspeed; not run by this project's tests)
    accelerate launch --config_file scaledrun/accelerate/zero2.yaml --num_processes N -m scaledrun.train --config ...
    accelerate launch --config_file scaledrun/accelerate/zero3.yaml --num_processes N -m scaledrun.train --config ...
    # FSDP (not run by this project's tests)
    accelerate launch --config_file scaledrun/accelerate/fsdp.yaml --num_processes N -m scaledrun.train --config ...

Resume a killed run: the same command with ``--resume true`` (continues from the latest checkpoint in
``output_dir``; the same number of processes; under ZeRO/FSDP the optimizer state is not checkpointed).

Options outside the config: ``--import module`` (repeatable) imports a module first, e.g. one that
registers a reward with ``@scaledrun.rewards.register_reward``.

Debug hooks
-----------
``--debug_dir DIR`` (``train(debug_dir=...)``): each process writes ``DIR/rank<k>/step_<s>_rollouts.pt``
(the step's ``RolloutBatch`` on CPU, after rewards and advantages), ``step_<s>_grads.pt`` (trainable
gradients of the step's first optimizer step, after the cross-process reduction, before clipping) and
``step_<s>_trainable.pt`` (trainable weights after the step). ``--replay_dir DIR``: a step with a file
``DIR/step_<s>_rollouts.pt`` trains on that batch (its completions, old log-probs and rewards;
advantages are recomputed) instead of sampling. The two-process test dumps both ranks, concatenates
their step batches and replays them in one process: the gradients and weights must agree.

Loss normalisation across processes
-----------------------------------
Each mini-batch's loss uses the *global* token count (``token_count``) and sequence count
(``seq_count``) of that mini-batch over all processes, so the local loss is L_p = S_p / N with S_p the
local sum of per-token (or per-sequence) terms and N the global count. DDP *averages* gradients over the
W processes: it applies (1/W) Σ_p ∇(loss_p). Backpropagating loss_p = W·L_p therefore applies
Σ_p ∇S_p / N, the gradient of the loss of the whole mini-batch as one process would compute it. The
logged loss is the unscaled L_p. Gradient accumulation (``micro_batch_size``) keeps the same normaliser
N for every micro-batch of a mini-batch, so the accumulated gradient is the mini-batch's gradient;
DDP reduces once, on the last micro-batch's backward (``accelerator.no_sync`` before it).

Determinism and resume
----------------------
At the start of every step the global torch RNG is seeded from (seed, step, process index); sampling
(``generate`` uses the global RNG), LoRA dropout and the mini-batch split generator all derive from it.
A resumed run therefore samples exactly what the uninterrupted run sampled at the same step, given the
same weights and optimizer state (restored from the checkpoint).

Where this departs from the papers
----------------------------------
- LoRA instead of full fine-tuning by default (``full_finetune: true`` for the papers' setting).
- The LR schedule advances once per RL step (not per optimizer step): warm-up and cosine decay are in
  units of ``steps``.
- Old log-probs come from a separate no-grad forward pass (not the sampler's logits) with LoRA in eval
  mode; reward-balanced batching reuses buffered groups whose old log-probs (and advantages) are those
  of the policy that sampled them, i.e. the update is off-policy for them by up to a few steps.
- Token entropy (``entropy``) is the mean per-token entropy of π_old on the sampled tokens, not the
  toy's exact trajectory entropy.
- ``shared_residual`` / ``group_shared_residual`` are computed exactly as in the toy: from the
  coefficients ∂J/∂logp that each optimizer step actually applied (read from ``logp.grad``), summed per
  shared (group, prefix, token) event over all optimizer steps of the RL step.
- ``energy/bucket_*`` (DFPO eq. 24, output-layer proxy) uses the first mini-batch of each step only
  (it needs the (B, T, V) probabilities), and is NaN when that tensor would exceed ``ENERGY_MAX_ELEMENTS``.
- Token-flip stats (002 App. C) compare the last mini-batch's log-probs before and after its update.
- Multi-process: objective metrics (clip fractions, ratios, ...) are averaged over processes; rewards
  are gathered exactly. KL to the reference needs LoRA (the reference is the base model with the
  adapter disabled). Under DeepSpeed ZeRO / FSDP checkpoints hold the gathered weights but not the
  sharded optimizer state (``checkpoint.py``); those two launch modes are shipped untested (no GPU here).
"""

from __future__ import annotations

import math
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from cancellation import METRIC_KEYS, compute_loss, group_advantages, reweight_advantages
from cancellation.batching import lopti_masks, reward_balanced_select, split_minibatches
from cancellation.diagnostics import (
    FLIP_KEYS,
    energy_by_bucket,
    event_index,
    event_sums,
    prefix_event_keys,
    token_flip_stats,
)

from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .config import RunConfig, load_config, save_config
from .rewards import compute_rewards
from .rollout import RolloutBatch, completion_logprobs, concat_batches, generate_rollouts, generate_texts
from .runlog import RunLogger
from .tasks import Task, format_prompt, is_task_file, load_task

#: energy_by_bucket needs the (B, T, V) probabilities of the first mini-batch; skipped above this size.
ENERGY_MAX_ELEMENTS = 2**26
NUM_ENERGY_BUCKETS = 3
ENERGY_KEYS = tuple(f"energy/bucket_{k}" for k in range(NUM_ENERGY_BUCKETS))
#: Keys of every training row (eval rows add ``eval/greedy_accuracy`` and ``eval/avg@k``).
STEP_KEYS = (
    *METRIC_KEYS,
    "sampled_reward",
    "reward/mean",
    "reward/std",
    "accuracy",
    "reward_failures",
    "completion_length",
    "truncated_frac",
    "entropy",
    "shared_residual",
    "group_shared_residual",
    *FLIP_KEYS,
    *ENERGY_KEYS,
    "grad_norm",
    "lr",
    "opt_steps",
    "updated",
    "buffer_groups",
    "time/step_s",
    "time/generate_s",
    "time/update_s",
    "time/tokens_per_s",
)
_NOISE = 1e-12


# ------------------------------------------------------------------------------------------------
# setup


def step_seed(seed: int, step: int, rank: int) -> int:
    """The seed of step ``step`` on process ``rank`` (sampling, dropout and mini-batch splits)."""
    return (seed * 1_000_003 + step * 10_007 + rank * 101) % (2**63 - 1)


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 (the global state libraries use)
    torch.manual_seed(seed)


def lora_config(cfg: RunConfig):
    """The ``peft.LoraConfig`` of a run (rank, alpha, dropout, target modules from the config)."""
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.lora_target_modules),
        task_type="CAUSAL_LM",
    )


def load_model_and_tokenizer(cfg: RunConfig) -> tuple[Any, Any]:
    """``from_pretrained`` (dtype from the config), left-padding tokenizer, LoRA unless full fine-tuning."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = Path(cfg.model)
    if (
        local.is_absolute() or cfg.model.startswith(".") or local.parts[:1] in (("artifacts",), ("runs",))
    ) and not (local.is_dir()):
        raise FileNotFoundError(
            f"config field `model`={cfg.model!r}: no such model folder; build the tiny model with "
            f"`python -m scaledrun.tiny --out {cfg.model}` or name a hub model"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(cfg.model, padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=getattr(torch, cfg.dtype))
    except OSError as err:
        raise FileNotFoundError(f"config field `model`={cfg.model!r} could not be loaded: {err}") from err
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if not cfg.full_finetune:
        from peft import get_peft_model

        torch.manual_seed(cfg.seed)  # the LoRA A init
        model = get_peft_model(model, lora_config(cfg))
    elif cfg.beta > 0:
        raise ValueError(
            "config field `beta` > 0 needs LoRA (the reference is the base model with the adapter off)"
        )
    return model, tokenizer


def build_optimizer(cfg: RunConfig, model: Any) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW on the trainable parameters; cosine schedule with linear warm-up and a minimum LR ratio."""
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    # DFPO App. I: 3% warm-up, cosine decay to 0.2·lr
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(
        optimizer,
        num_warmup_steps=math.ceil(cfg.warmup_ratio * cfg.steps),
        num_training_steps=cfg.steps,
        min_lr_rate=cfg.min_lr_ratio,
    )
    return optimizer, scheduler


def load_tasks(cfg: RunConfig, split: str, n: int) -> list[Task]:
    common = {"seed": cfg.seed, "prompt_field": cfg.prompt_field, "answer_field": cfg.answer_field}
    if is_task_file(cfg.task):
        return load_task(cfg.task, split, None, **common)[:n]
    return load_task(cfg.task, split, n, **common, digits=cfg.digits, ops=cfg.ops)


def step_prompts(
    tasks: list[Task], step: int, per_process: int, rank: int, world: int, seed: int
) -> list[tuple[int, Task]]:
    """This process's (global prompt id, task) pairs of ``step`` (1-based): whole groups per process.

    The prompt stream is the task list in a new seeded permutation each epoch; the global id (its
    position in the stream) is unique over the run, so buffered groups never share ids.
    """
    n = len(tasks)
    out = []
    for i in range(per_process):
        k = (step - 1) * world * per_process + rank * per_process + i
        perm = list(range(n))
        random.Random(seed * 7919 + k // n).shuffle(perm)
        out.append((k, tasks[perm[k % n]]))
    return out


# ------------------------------------------------------------------------------------------------
# the loss of one mini-batch


def loss_params(cfg: RunConfig) -> dict[str, Any]:
    """``compute_loss`` keyword parameters of the config's objective.

    ``seq-mean-token-sum-norm`` gets ``norm_constant = max_new_tokens`` unless set, so the constant does
    not depend on how a mini-batch happens to be padded (TRL's ``dr_grpo``).
    """
    params = cfg.objective_params()
    if cfg.aggregation == "seq-mean-token-sum-norm" and "norm_constant" not in params:
        params["norm_constant"] = float(cfg.max_new_tokens)
    return params


def minibatch_loss(
    model: Any,
    batch: RolloutBatch,
    idx: Tensor,
    cfg: RunConfig,
    advantages: Tensor,
    *,
    mask: Tensor | None = None,
    token_count: float | None = None,
    seq_count: float | None = None,
    with_hidden: bool = False,
) -> tuple[Tensor, dict[str, float], Tensor, dict[str, Tensor]]:
    """The loss of rows ``idx`` of ``batch``: one forward pass and one ``cancellation.compute_loss`` call.

    Args:
        model: the policy (possibly DDP-wrapped).
        batch: the step's rollouts.
        idx: (b,) int64 rows of the mini-batch.
        cfg: the run config (objective, aggregation, objective parameters).
        advantages: (B,) or (B, T) advantages of the whole batch (rows ``idx`` are used).
        mask: (B, T) the token mask of this stage (Lopti), default ``batch.completion_mask``.
        token_count, seq_count: the global counts of the mini-batch (None: local counts).
        with_hidden: also return the probabilities and hidden-state norms (energy diagnostics).
    Returns:
        ``(loss, metrics, logp, extras)``; ``logp`` (b, T) is the forward pass's log-probs (with grad).
        A mini-batch with no unmasked token on this process returns 0·Σ logp (zero gradient, so DDP
        still synchronises) and empty metrics.
    """
    sub = batch.select(idx)
    m = (batch.completion_mask if mask is None else mask)[idx.to(batch.completion_mask.device)]
    t = sub.completion_mask.shape[1]
    out = completion_logprobs(model, sub.input_ids, sub.attention_mask, t, with_hidden=with_hidden)
    logp = out["logp"]
    if float(m.sum()) == 0:
        return (logp * 0.0).sum(), {}, logp, out
    loss, metrics = _loss(cfg, sub, idx, advantages, m, logp, token_count, seq_count)
    return loss, metrics, logp, out


def minibatch_metrics(
    batch: RolloutBatch,
    idx: Tensor,
    cfg: RunConfig,
    advantages: Tensor,
    logp: Tensor,
    *,
    mask: Tensor | None = None,
    token_count: float | None = None,
    seq_count: float | None = None,
) -> dict[str, float]:
    """The ``compute_loss`` metrics of rows ``idx`` given their log-probs (no forward pass, no grad).

    Gradient accumulation runs a mini-batch in several passes; this reports the metrics of the whole
    mini-batch (same arguments as ``minibatch_loss``; ``logp`` (b, T) are the passes' log-probs, in the
    order of ``idx``). Empty dict when no token of the mini-batch is unmasked.
    """
    sub = batch.select(idx)
    m = (batch.completion_mask if mask is None else mask)[idx.to(batch.completion_mask.device)]
    if float(m.sum()) == 0:
        return {}
    with torch.no_grad():
        return _loss(cfg, sub, idx, advantages, m, logp.detach(), token_count, seq_count)[1]


def _loss(
    cfg: RunConfig,
    sub: RolloutBatch,
    idx: Tensor,
    advantages: Tensor,
    m: Tensor,
    logp: Tensor,
    token_count: float | None,
    seq_count: float | None,
) -> tuple[Tensor, dict[str, float]]:
    """The one ``compute_loss`` call of a mini-batch ``sub`` = rows ``idx`` (mask ``m`` (b, T))."""
    params = loss_params(cfg)
    if cfg.beta > 0:
        params["ref_logp"] = sub.ref_logp
    return compute_loss(
        cfg.objective,
        logp,
        sub.old_logp,
        advantages[idx.to(advantages.device)],
        m,
        sub.group,
        aggregation=cfg.aggregation,
        token_count=token_count,
        seq_count=seq_count,
        **params,
    )


# ------------------------------------------------------------------------------------------------
# the update


@dataclass
class UpdateResult:
    metrics: dict[str, float]
    opt_steps: int = 0
    grad_norm: float = math.nan
    flip: dict[str, float] = field(default_factory=dict)
    energy: list[float] = field(default_factory=lambda: [math.nan] * NUM_ENERGY_BUCKETS)
    residual: tuple[float, float, float, float] = (
        0.0,
        0.0,
        0.0,
        0.0,
    )  # net, gross (shared); net, gross (whole)


def _shared_events(batch: RolloutBatch) -> tuple[Any, Tensor, Tensor]:
    """The batch's (group, prefix, token) events, and which are shared (≥ 2) / in every group member."""
    mask = batch.completion_mask
    keys = prefix_event_keys(batch.completion_ids, mask, batch.group)
    index = event_index(keys, mask)
    e = index.count.shape[0]
    _, ginv, gsize = torch.unique(batch.group, return_inverse=True, return_counts=True)
    valid = index.inverse < e
    ev_group = torch.zeros(e, dtype=torch.long, device=mask.device)
    rows = torch.arange(mask.shape[0], device=mask.device)[:, None].expand_as(mask)
    ev_group[index.inverse[valid]] = ginv[rows[valid]]
    shared = index.count >= 2
    whole = shared & (index.count == gsize[ev_group])
    return index, shared, whole


def update(
    cfg: RunConfig,
    accelerator: Any,
    model: Any,
    optimizer: Any,
    batch: RolloutBatch,
    loss_adv: Tensor,
    generator: torch.Generator,
    first_grads: dict[str, Tensor] | None = None,
) -> UpdateResult:
    """Lopti stages × ``inner_epochs`` × mini-batches, one optimizer step per mini-batch.

    With ``cfg.micro_batch_size`` > 0 each mini-batch's rows are run in micro-batches of that size
    (gradient accumulation; ``accelerator.no_sync`` on all but the last), each loss normalised by the
    mini-batch's global counts: the accumulated gradient is the one-pass gradient. Metrics, the
    shared-prefix residual and the energy diagnostic cover the whole mini-batch either way.

    ``first_grads`` (debug): when given, filled with the trainable parameters' gradients of the first
    optimizer step (after the cross-process reduction, before clipping), keyed by parameter name.
    """
    res = UpdateResult(metrics={})
    world = accelerator.num_processes
    if cfg.lopti_eta is not None:
        # Lopti (004 notes): update the low-probability tokens first, then the rest; same old log-probs
        stages = [s.float() for s in lopti_masks(batch.old_logp, batch.completion_mask, cfg.lopti_eta)]
    else:
        stages = [batch.completion_mask]
    index, shared, whole = _shared_events(batch)
    net_s = gross_s = net_w = gross_w = 0.0
    unwrapped = accelerator.unwrap_model(model)
    params = [p for p in model.parameters() if p.requires_grad]
    n_mb = 0
    for stage_mask in stages:
        for _ in range(cfg.inner_epochs):
            group_cpu = batch.group.cpu()
            parts = split_minibatches(group_cpu, cfg.num_minibatches, mode=cfg.batching, generator=generator)
            for idx in parts:
                idx = idx.to(batch.group.device)
                local = torch.tensor(
                    [float(stage_mask[idx].sum()), float(len(idx))],
                    device=accelerator.device,
                    dtype=torch.float64,
                )
                token_count, seq_count = (float(x) for x in accelerator.reduce(local, "sum"))
                if token_count == 0:
                    continue  # no token of this stage in the mini-batch on any process
                first = n_mb == 0
                n_mb += 1
                with_hidden = (
                    first
                    and idx.numel() * batch.completion_mask.shape[1] * _vocab(unwrapped)
                    <= ENERGY_MAX_ELEMENTS
                )
                # gradient accumulation: micro-batches of the mini-batch's rows (in order), each normalised
                # by the whole mini-batch's global counts, so their gradients sum to the mini-batch's
                size = cfg.micro_batch_size or idx.numel()
                micro = list(idx.split(size))
                logps, extras_mb, metrics = [], [], {}
                for k, mb in enumerate(micro):
                    sync = k == len(micro) - 1  # DDP: reduce the gradients once, on the last backward
                    with nullcontext() if sync else accelerator.no_sync(model):
                        loss, mb_metrics, logp, extras = minibatch_loss(
                            model, batch, mb, cfg, loss_adv, mask=stage_mask,
                            token_count=token_count, seq_count=seq_count, with_hidden=with_hidden,
                        )  # fmt: skip
                        logp.retain_grad()
                        # DDP averages gradients over the W processes: scale by W to apply Σ_p ∇S_p / N
                        accelerator.backward(loss * world)
                    metrics = mb_metrics
                    # the coefficients this optimiser step applies: ∂J/∂logp = −∂(W·loss)/∂logp / W
                    grad = logp.grad.detach() if logp.grad is not None else torch.zeros_like(logp)
                    logps.append((logp.detach(), -grad / world))
                    if with_hidden:
                        extras_mb.append(extras)
                logp_mb = torch.cat([lp for lp, _ in logps])
                coef_mb = torch.cat([c for _, c in logps])
                if len(micro) > 1:
                    # the metrics of the whole mini-batch, as one pass would report them
                    metrics = minibatch_metrics(
                        batch, idx, cfg, loss_adv, logp_mb, mask=stage_mask,
                        token_count=token_count, seq_count=seq_count,
                    )  # fmt: skip
                if metrics:
                    res.metrics = metrics
                coef_mb = torch.where(stage_mask[idx].bool(), coef_mb, torch.zeros_like(coef_mb))
                coef = torch.zeros_like(batch.old_logp).index_copy_(0, idx, coef_mb.to(batch.old_logp.dtype))
                net, gro = event_sums(coef, index)
                net_s += float(net.abs()[shared].sum())
                gross_s += float(gro[shared].sum())
                net_w += float(net.abs()[whole].sum())
                gross_w += float(gro[whole].sum())
                if with_hidden:
                    sub_mask = stage_mask[idx]
                    if float(sub_mask.sum()) > 0:
                        res.energy = energy_by_bucket(
                            coef_mb.double(), torch.cat([e["probs"] for e in extras_mb]),
                            batch.completion_ids[idx], sub_mask,
                            hidden_norm=torch.cat([e["hidden_norm"] for e in extras_mb]),
                            num_buckets=NUM_ENERGY_BUCKETS,
                        ).tolist()  # fmt: skip
                if first_grads is not None and res.opt_steps == 0:
                    for name, p in unwrapped.named_parameters():
                        if p.requires_grad and p.grad is not None:
                            first_grads[name] = p.grad.detach().cpu().clone()
                max_norm = cfg.grad_clip if cfg.grad_clip is not None else float("inf")
                res.grad_norm = float(accelerator.clip_grad_norm_(params, max_norm))
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                res.opt_steps += 1
                last_idx, logp_before, last_mask = idx, logp_mb, stage_mask[idx]
    if res.opt_steps:
        with torch.no_grad(), full_params(accelerator, model):
            was = unwrapped.training
            unwrapped.eval()
            sub = batch.select(last_idx)
            after = completion_logprobs(
                unwrapped, sub.input_ids, sub.attention_mask, sub.completion_mask.shape[1]
            )
            unwrapped.train(was)
        # 002 App. C eq. (16): the last mini-batch's log-probs before vs after its update
        res.flip = token_flip_stats(logp_before, after["logp"], sub.advantages, last_mask)
    res.residual = (net_s, gross_s, net_w, gross_w)
    return res


def _vocab(model: Any) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


# ------------------------------------------------------------------------------------------------
# evaluation


def evaluate(
    cfg: RunConfig, accelerator: Any, model: Any, tokenizer: Any, tasks: list[Task]
) -> dict[str, float]:
    """Greedy accuracy and avg@k (mean reward of k samples) on this process's share of the held-out prompts."""
    mine = tasks[accelerator.process_index :: accelerator.num_processes]
    unwrapped = accelerator.unwrap_model(model)
    sums = torch.zeros(3, dtype=torch.float64, device=accelerator.device)
    if mine:
        prompts = [format_prompt(tokenizer, t.prompt) for t in mine]
        answers = [t.answer for t in mine]
        greedy = generate_texts(
            unwrapped, tokenizer, prompts, n=1, max_new_tokens=cfg.max_new_tokens, do_sample=False
        )
        r_greedy, _ = compute_rewards(cfg.reward, prompts, greedy, answers, cfg.failure_reward)
        k = cfg.eval_k
        sampled = generate_texts(
            unwrapped, tokenizer, prompts, n=k, max_new_tokens=cfg.max_new_tokens,
            do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p,
        )  # fmt: skip
        r_k, _ = compute_rewards(
            cfg.reward, [p for p in prompts for _ in range(k)], sampled, [a for a in answers for _ in range(k)],
            cfg.failure_reward,
        )  # fmt: skip
        sums += torch.tensor(
            [sum(r >= 1.0 for r in r_greedy), sum(r_k) / k, len(mine)],
            dtype=torch.float64,
            device=sums.device,
        )
    sums = accelerator.reduce(sums, "sum")
    n = max(float(sums[2]), 1.0)
    return {"eval/greedy_accuracy": float(sums[0]) / n, f"eval/avg@{cfg.eval_k}": float(sums[1]) / n}


# ------------------------------------------------------------------------------------------------
# the run


@dataclass
class TrainResult:
    """What ``train`` returns: this process's rows (the main process writes them) and the trained policy."""

    rows: list[dict[str, float]]
    model: Any
    tokenizer: Any


def train(
    cfg: RunConfig, *, debug_dir: str | Path | None = None, replay_dir: str | Path | None = None
) -> TrainResult:
    """Run ``cfg`` (see the module docstring).

    Debug hooks (the two-process test uses them; see "Debug hooks" in the module docstring):
        debug_dir: each process writes ``<debug_dir>/rank<k>/step_<s>_{rollouts,grads,trainable}.pt``.
        replay_dir: a step ``s`` with a file ``<replay_dir>/step_<s>_rollouts.pt`` (a ``RolloutBatch``
            saved by ``debug_dir``, or several concatenated) trains on it instead of generating.
    """
    from accelerate import Accelerator

    # a ``--multi_gpu`` launch on a machine without GPUs runs on CPU processes (gloo): Accelerate only
    # picks MULTI_CPU when told ``cpu=True`` (``ACCELERATE_USE_CPU``), so say it when there is no GPU
    accelerator = Accelerator(cpu=not _has_accelerator())
    seed_all(cfg.seed)
    rank, world = accelerator.process_index, accelerator.num_processes
    out_dir = Path(cfg.output_dir)

    # ---- model, optimizer, data
    model, tokenizer = load_model_and_tokenizer(cfg)
    optimizer, scheduler = build_optimizer(cfg, model)
    _deepspeed_micro_batch(accelerator)
    # the scheduler is not prepared: an accelerate-prepared scheduler steps once per process
    model, optimizer = accelerator.prepare(model, optimizer)
    train_tasks = load_tasks(cfg, "train", cfg.num_train)
    eval_tasks = load_tasks(cfg, "eval", cfg.num_eval) if cfg.eval_every > 0 and cfg.num_eval > 0 else []
    formatted = {id(t): format_prompt(tokenizer, t.prompt) for t in train_tasks}

    # ---- resume
    start, buffer = 0, None
    if cfg.resume:
        ckpt = latest_checkpoint(out_dir)
        if ckpt is not None:
            start, buffer, _ = load_checkpoint(accelerator, model, optimizer, scheduler, ckpt)
            accelerator.print(f"resumed from {ckpt} (step {start})")
        else:
            accelerator.print(f"--resume: no checkpoint in {out_dir}/checkpoints, starting from step 0")
    if accelerator.is_main_process:
        out_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out_dir / "config.yaml")
    logger = RunLogger(out_dir, cfg.steps, enabled=accelerator.is_main_process, resume_step=start)
    unwrapped = accelerator.unwrap_model(model)
    ref_ctx = unwrapped.disable_adapter if cfg.beta > 0 else None
    rows: list[dict[str, float]] = []
    model.train()

    for step in range(start + 1, cfg.steps + 1):
        t0 = time.perf_counter()
        seed = step_seed(cfg.seed, step, rank)
        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed + 1)

        # ---- rollouts: G completions for each of this process's prompts
        replay = None if replay_dir is None else Path(replay_dir) / f"step_{step:06d}_rollouts.pt"
        if replay is not None and replay.is_file():
            # debug: train on saved rollouts (their texts and rewards) instead of sampling
            batch = torch.load(replay, map_location=accelerator.device, weights_only=False)
            roll = _replay_stats(batch)
        else:
            mine = step_prompts(train_tasks, step, cfg.prompts_per_step, rank, world, cfg.seed)
            with full_params(accelerator, model):
                batch, roll = generate_rollouts(
                    unwrapped, tokenizer, [formatted[id(t)] for _, t in mine], [t.answer for _, t in mine],
                    [k for k, _ in mine], num_generations=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
                    temperature=cfg.temperature, top_p=cfg.top_p, mask_truncated=cfg.mask_truncated,
                    ref_model_ctx=ref_ctx,
                )  # fmt: skip
        t_gen = time.perf_counter() - t0

        # ---- rewards and group-relative advantages (DFPO eq. 43)
        if replay is not None and replay.is_file():
            failures = 0
        else:
            rewards, failures = compute_rewards(
                cfg.reward, batch.prompts, batch.completions, batch.answers, cfg.failure_reward
            )
            batch.rewards = torch.tensor(rewards, dtype=torch.float32, device=batch.group.device)
        batch.advantages = group_advantages(batch.rewards, batch.group, scale=cfg.adv_scale).float()
        dump = None if debug_dir is None else Path(debug_dir) / f"rank{rank}"
        if dump is not None:
            dump.mkdir(parents=True, exist_ok=True)
            torch.save(batch.to("cpu"), dump / f"step_{step:06d}_rollouts.pt")

        # ---- reward-balanced batching (002 Sec. 4): update only on a buffer selection meeting ρ
        update_batch: RolloutBatch | None = batch
        if cfg.reward_balanced_rho is not None:
            buffer = batch if buffer is None else concat_batches([buffer, batch], tokenizer.pad_token_id)
            sel = reward_balanced_select(
                buffer.advantages, buffer.group, cfg.reward_balanced_rho, cfg.prompts_per_step
            )
            ok = torch.tensor([0.0 if sel is None else 1.0], device=accelerator.device)
            if float(accelerator.reduce(ok, "sum")) == world:  # every process must step together
                keep = torch.ones(len(buffer), dtype=torch.bool, device=buffer.group.device)
                keep[sel] = False
                update_batch = buffer.select(sel)
                buffer = buffer.select(torch.nonzero(keep).flatten())
            else:
                update_batch = None
            buffer = _cap_buffer(buffer, 4 * cfg.prompts_per_step)

        # ---- update
        t1 = time.perf_counter()
        grads: dict[str, Tensor] | None = {} if dump is not None else None
        if update_batch is not None:
            adv = update_batch.advantages
            if cfg.ar_alpha is not None:
                # Advantage Reweighting (004 notes): per-token A·[α·π_old + (1 − α)]
                adv = reweight_advantages(adv, update_batch.old_logp, cfg.ar_alpha)
            # the debug keyword only when dumping (tests may replace ``update`` with a 7-argument spy)
            debug_kw = {} if grads is None else {"first_grads": grads}
            res = update(cfg, accelerator, model, optimizer, update_batch, adv, generator, **debug_kw)
        else:
            res = UpdateResult(metrics={})
        scheduler.step()
        t_upd = time.perf_counter() - t1
        if dump is not None:
            torch.save(grads, dump / f"step_{step:06d}_grads.pt")
            trainable = {
                n: p.detach().cpu().clone() for n, p in unwrapped.named_parameters() if p.requires_grad
            }
            torch.save(trainable, dump / f"step_{step:06d}_trainable.pt")

        # ---- diagnostics (same keys as the toy where they exist)
        all_rewards = accelerator.gather(batch.rewards)
        local = {k: res.metrics.get(k, math.nan) for k in METRIC_KEYS}
        local.update({k: res.flip.get(k, math.nan) for k in FLIP_KEYS})
        local.update(dict(zip(ENERGY_KEYS, res.energy, strict=True)))
        local.update(
            completion_length=roll["completion_length"], truncated_frac=roll["truncated_frac"],
            entropy=roll["entropy"], grad_norm=res.grad_norm,
        )  # fmt: skip
        row = _mean_over_processes(accelerator, local)
        sums = accelerator.reduce(
            torch.tensor(
                [*res.residual, float(failures), roll["tokens_generated"]],
                dtype=torch.float64,
                device=accelerator.device,
            ),
            "sum",
        ).tolist()
        dt = time.perf_counter() - t0
        row.update({
            "sampled_reward": float(all_rewards.mean()),
            "reward/mean": float(all_rewards.mean()),
            "reward/std": float(all_rewards.std()) if all_rewards.numel() > 1 else 0.0,
            "accuracy": float((all_rewards >= 1.0).float().mean()),
            "reward_failures": sums[4],
            "shared_residual": sums[0] / sums[1] if sums[1] > _NOISE else math.nan,
            "group_shared_residual": sums[2] / sums[3] if sums[3] > _NOISE else math.nan,
            "lr": scheduler.get_last_lr()[0],
            "opt_steps": float(res.opt_steps),
            "updated": 1.0 if update_batch is not None else 0.0,
            "buffer_groups": float(0 if buffer is None else buffer.group.unique().numel()),
            "time/step_s": dt,
            "time/generate_s": t_gen,
            "time/update_s": t_upd,
            "time/tokens_per_s": sums[5] / dt,
        })  # fmt: skip

        # ---- eval, log, checkpoint
        if eval_tasks and (step % cfg.eval_every == 0 or step == cfg.steps):
            torch.manual_seed(seed + 2)
            with full_params(accelerator, model):
                row.update(evaluate(cfg, accelerator, model, tokenizer, eval_tasks))
        logger.log(step, row)
        rows.append(row)
        if (cfg.save_every > 0 and step % cfg.save_every == 0) or step == cfg.steps:
            save_checkpoint(accelerator, model, optimizer, scheduler, step, out_dir, buffer=buffer)
    logger.close()
    accelerator.wait_for_everyone()
    return TrainResult(rows=rows, model=accelerator.unwrap_model(model), tokenizer=tokenizer)


def full_params(accelerator: Any, model: Any) -> Any:
    """A context in which the unwrapped model holds its full parameters (generation, no-grad passes).

    DDP and one process: nothing to do. DeepSpeed ZeRO-3 and FSDP shard the parameters: gather them
    (each GPU then holds the whole model for the duration). The ZeRO-3/FSDP branches are not exercised
    by this project's CPU tests (see ``scaledrun/accelerate/*.yaml``).
    """
    from accelerate.utils import DistributedType

    kind = accelerator.distributed_type
    if kind == DistributedType.DEEPSPEED and accelerator.state.deepspeed_plugin.zero_stage == 3:
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)
    if kind == DistributedType.FSDP:
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel.summon_full_params(model, writeback=False, recurse=True)
    return nullcontext()


def _deepspeed_micro_batch(accelerator: Any) -> None:
    """DeepSpeed wants ``train_micro_batch_size_per_gpu``; no dataloader is prepared to infer it."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is not None and plugin.is_auto("train_micro_batch_size_per_gpu"):
        plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 1


def _has_accelerator() -> bool:
    """Whether a GPU-like device (CUDA/ROCm, XPU, MPS) is visible to this process."""
    if torch.cuda.is_available():
        return True
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return True
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def _replay_stats(batch: RolloutBatch) -> dict[str, float]:
    """The rollout diagnostics of a replayed batch (no sampler: ``entropy`` is NaN)."""
    lengths = batch.attention_mask[:, batch.prompt_len :].float().sum(1)
    return {
        "entropy": math.nan,
        "completion_length": float(lengths.mean()),
        "truncated_frac": float(batch.truncated.float().mean()),
        "tokens_generated": float(lengths.sum()),
    }


def _cap_buffer(buffer: RolloutBatch | None, max_groups: int) -> RolloutBatch | None:
    """Keep the newest ``max_groups`` groups of the buffer (a smaller group id is older)."""
    if buffer is None or len(buffer) == 0:
        return None
    ids = buffer.group.unique()
    if ids.numel() <= max_groups:
        return buffer
    keep_ids = ids[-max_groups:]
    return buffer.select(torch.nonzero(torch.isin(buffer.group, keep_ids)).flatten())


def _mean_over_processes(accelerator: Any, values: dict[str, float]) -> dict[str, float]:
    if accelerator.num_processes == 1:
        return {k: float(v) for k, v in values.items()}
    keys = list(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=accelerator.device)
    return dict(zip(keys, accelerator.reduce(t, "mean").tolist(), strict=True))


def _pop_option(argv: list[str], name: str) -> list[str]:
    """Remove every ``name value`` pair from ``argv``; return the values."""
    values = []
    while name in argv:
        i = argv.index(name)
        if i + 1 >= len(argv):
            raise ValueError(f"command line: {name} needs a value")
        values.append(argv[i + 1])
        del argv[i : i + 2]
    return values


def main(argv: list[str] | None = None) -> TrainResult:
    """``--config path.yaml`` then any ``--field value`` overrides of ``RunConfig``.

    Options outside the config: ``--import module`` (repeatable; imported first, e.g. a module that
    registers reward functions with ``@register_reward``), and the debug hooks ``--debug_dir DIR``,
    ``--replay_dir DIR`` (``train``'s keyword arguments).
    """
    import importlib

    argv = list(sys.argv[1:] if argv is None else argv)
    for module in _pop_option(argv, "--import"):
        importlib.import_module(module)
    debug = _pop_option(argv, "--debug_dir")
    replay = _pop_option(argv, "--replay_dir")
    paths = _pop_option(argv, "--config")
    if len(paths) > 1:
        raise ValueError("command line: give --config once")
    path = paths[0] if paths else None
    if path is not None and not Path(path).is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    cfg = load_config(path, argv)
    return train(cfg, debug_dir=debug[-1] if debug else None, replay_dir=replay[-1] if replay else None)


if __name__ == "__main__":
    main()
