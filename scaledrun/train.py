"""Group-relative RL on a Hugging Face causal LM with LoRA: GRPO, GRPO-fix, GSPO, DFPO (+ AR, Lopti).

Every loss is one ``cancellation.compute_loss`` call on a whole mini-batch, and the schedule, the
reward-balanced buffer and the cancellation meters are ``cancellation.update``'s, the code the toy
runs too; this file only moves tensors around. It reads top to bottom: truncation and the buffer, one
mini-batch (log-probs -> coefficients -> backward), the exact update, then the loop (rollouts -> rewards
-> advantages -> update -> log -> eval -> checkpoint) and the command line.

One training step, from prompt to ``optimizer.step``
----------------------------------------------------
1. **Rollouts** (``rollout.generate_rollouts``): G = ``group_size`` sampled completions for each of this
   process's ``prompts_per_step`` prompts (temperature T, top-p), the completion mask through the first
   EOS, and log π_old of every sampled token from no-grad passes at T in the loss's micro-batch plan.
2. **Rewards and advantages** (``rewards.compute_rewards``, ``apply_truncation``,
   ``cancellation.group_advantages``): the ``truncation`` policy, then group-relative advantages
   (DFPO eq. 43) over the rows that enter the loss; optionally Advantage Reweighting.
3. **The update batch**: the step's batch, or a reward-balanced selection of buffered groups
   (``cancellation.update.RewardBalancedBuffer``, cancellation-hypothesis paper Sec. 4; no update until
   one meets ρ).
4. **The update** (``update``), the loop of CleanRL's ``ppo.py``::

       for mb in minibatches(...):              # Lopti stages × inner epochs × mini-batches
           logp = minibatch_logprobs(...)       # current log-probs of the whole mini-batch
           c = minibatch_coefficients(...)      # ∂J/∂logp of the whole mini-batch: one compute_loss call
           backpropagate(...)                   # ∇θJ = Σ c·∇θ logp, in one pass or micro-batch by micro-batch
           clip_grad_norm_; optimizer.step()

   Beside it, never inside its arithmetic (``UpdateDiagnostics``): the cancellation meter, the energy
   and token-flip diagnostics and the debug dump of the first gradients.
5. **The log row**: rewards, the objective's metrics (of the step's last mini-batch), the residuals,
   grad norm, timings; one JSON line per step.
6. **Eval** (``evaluate``, every ``eval_every`` steps): held-out greedy accuracy and avg@k; for tasks with
   several equally correct forms (``template_forms``) also the exact equivalent-solution entropy
   ``eval/form_entropy``, the forms' mass ``eval/form_mass`` and their log-odds ``eval/form_logodds``
   (``FORM_KEYS``), from teacher-forced log-probs of each whole form + EOS at T, and the log-prob of the
   sentence every reference opens with, ``eval/head_logprob`` (``HEAD_KEY``: where shared tokens drift).

Exact micro-batching: a group transform, a sequence ratio or an aggregation couples the rows of a
mini-batch, so the loss of a micro-batch alone is not a piece of the mini-batch's loss. The trainer
therefore computes the coefficients c = ∂J/∂logp of the *whole* mini-batch first (from its current
log-probs; with ``micro_batch_size`` set, from no-grad passes over the micro-batches), then runs one
forward and backward pass per micro-batch of the surrogate −W·Σ c·logp, whose gradient is exactly
−W·Σ c·∇θ logp: the accumulated gradient is the one-pass gradient for every objective, transform and
aggregation (tested to 1e-6), at the price of one extra no-grad forward per mini-batch.

Launching
---------
The same module runs in one process (``python -m scaledrun.train``) or under ``accelerate launch``;
``--config`` takes a YAML of ``RunConfig`` fields and any ``--field value`` overrides it; ``--help`` lists
them and the options outside the config (``scaledrun/cli.py``). docs/trainer.md lists every launch line:
the CPU smoke test, two gloo processes, one GPU with a ``--preset``, N GPUs with the shipped Accelerate
configs (``scaledrun/accelerate/``), your own data. Every run writes its own ``--output_dir``
(``scaledrun/rundir.py``); ``--resume true`` continues from the latest checkpoint in it, with the same
number of processes (under ZeRO/FSDP every process saves and restores its shard of the optimizer state:
``checkpoint.py``). The data is read and checked with the tokenizer alone before the run folder is
created and before the model loads (``scaledrun/data.py``): a mistake prints ``error: ...`` and exits 2.

Where the rest lives: the model, LoRA, precision and optimizer in ``scaledrun/model.py``; the data in
``scaledrun/data.py``; gradient synchronisation, full-parameter contexts and cross-process sums in
``scaledrun/distributed.py``; the update's diagnostics in ``scaledrun/diagnostics.py``; evaluation in
``scaledrun/evaluate.py``; the log and the run's last line in ``scaledrun/runlog.py``.

Debug hooks
-----------
``--debug_dir DIR`` (``train(debug_dir=...)``): each process writes ``DIR/rank<k>/step_<s>_rollouts.pt``
(the step's ``RolloutBatch`` on CPU, after rewards, truncation and advantages), ``step_<s>_grads.pt``
(trainable gradients of the step's first optimizer step, after the cross-process reduction, before
clipping) and ``step_<s>_trainable.pt`` (trainable weights after the step). ``--replay_dir DIR``: a step
with a file ``DIR/rank<k>/step_<s>_rollouts.pt`` (this process's) or ``DIR/step_<s>_rollouts.pt`` trains
on that batch (its completions, masks, old log-probs and rewards; truncation and advantages are
applied again) instead of sampling. The two-process test dumps both ranks, concatenates their step
batches and replays them in one process: the gradients and weights must agree. Tests also replay
batches they build themselves (``rollout.score_completions``: chosen lengths, truncated rows), so a
property of the loop is tested on the same batch on every machine.

Loss normalisation across processes
-----------------------------------
Each mini-batch's loss uses the *global* token count (``token_count``) and sequence count
(``seq_count``) of that mini-batch over all processes, so the local loss is L_p = S_p / N with S_p the
local sum of per-token (or per-sequence) terms and N the global count, and its coefficients
c = ∂(−L_p)/∂logp are those of the whole mini-batch's loss restricted to this process's rows. DDP
*averages* gradients over the W processes: it applies (1/W) Σ_p ∇θ(loss_p). Backpropagating
loss_p = −W·Σ_{(i,t) of p} c_{i,t}·logp_{i,t} (gradient −W·c on every logp) therefore applies
−Σ_p Σ c·∇θ logp = ∇θ of the whole mini-batch's loss as one process would compute it. The logged
loss is the unscaled L_p.
With micro-batches DDP reduces once, on the last micro-batch's backward (``accelerator.no_sync``
before it); the coefficients, computed once for the whole mini-batch, are the same in every pass.

Determinism and resume
----------------------
At the start of every step the global torch RNG is seeded from (seed, step, process index); sampling
(``generate`` uses the global RNG) and the mini-batch split generator derive from it. A resumed run
therefore samples exactly what the uninterrupted run sampled at the same step, given the same weights,
optimizer state and reward-balanced buffer (restored from the checkpoint).

Where this departs from the papers: docs/trainer.md, "Where the trainer departs from the papers".
"""

from __future__ import annotations

import dataclasses
import math
import random
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from cancellation import METRIC_KEYS, group_advantages, reweight_advantages
from cancellation.diagnostics import FLIP_KEYS
from cancellation.update import (
    RESIDUAL_KEYS,
    Coefficients,
    MeterTotals,
    RewardBalancedBuffer,
    Schedule,
    coefficients,
    minibatches,
)

from .backends import run_backend
from .checkpoint import checkpoint_config, latest_checkpoint, load_checkpoint, safe_load, save_checkpoint
from .cli import import_modules, pop_option, print_help, usage_error
from .config import RunConfig, load_config, save_config
from .data import DataError, RunData, check_task_source, load_data, replay_file, replay_stats, step_prompts
from .diagnostics import ENERGY_KEYS, UpdateDiagnostics, UpdateResult, measure_step, pass_tokens
from .distributed import (
    GlobalCounts,
    LaunchError,
    any_process,
    before_prepare,
    check_device_support,
    check_launch,
    full_params,
    global_counts,
    gradient_sync,
    has_accelerator,
    max_list,
    mean_over_processes,
    sum_list,
    sum_over_processes,
)
from .evaluate import evaluate
from .model import build_optimizer, check_model_source, compute_precision, load_model, load_tokenizer
from .packing import RowLengths, balance_bins, pack_rows, trim_batch
from .rewards import parse_reward_names, score_rewards
from .rollout import RolloutBatch, completion_logprobs, concat_batches, dropout_off, generate_rollouts
from .rundir import (
    RunFolderError,
    RunLock,
    check_resume_config,
    check_start,
    refuse_existing_run,
    watch_parent,
)
from .runlog import RunLogger, read_metrics, run_summary, score_stats, truncation_warning
from .scoring import at_least_float32
from .tasks import reward_columns

#: Keys of every training row (eval rows add ``eval/greedy_accuracy`` and ``eval/avg@k``, and
#: ``evaluate.FORM_KEYS`` and ``HEAD_KEY`` when the eval tasks carry ≥ 2 equally correct forms). Each reward function of
#: ``reward`` adds ``rewards/<name>/mean``, its own mean beside the weighted sum ``reward/mean`` (TRL's key).
STEP_KEYS = (
    *METRIC_KEYS, "sampled_reward", "reward/mean", "reward/std", "accuracy", "reward_failures",
    "completion_length", "truncated_frac", "truncation/dropped_groups", "truncation/no_update", "entropy",
    *RESIDUAL_KEYS, *FLIP_KEYS, *ENERGY_KEYS, "grad_norm", "score/rows", "score/rows_per_completion",
    "score/padding_frac", "lr", "opt_steps", "updated", "buffer_groups",
    "time/step_s", "time/generate_s", "time/update_s", "time/tokens_per_s",
)  # fmt: skip
#: Groups the reward-balanced buffer holds at most, in units of ``prompts_per_step``.
BUFFER_CAPACITY = 4


# ------------------------------------------------------------------------------------------------
# setup


def step_seed(seed: int, step: int, rank: int) -> int:
    """The seed of step ``step`` on process ``rank`` (sampling and mini-batch splits)."""
    return (seed * 1_000_003 + step * 10_007 + rank * 101) % (2**63 - 1)


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 (the global state libraries use)
    torch.manual_seed(seed)


# ------------------------------------------------------------------------------------------------
# rewards, truncation, advantages


def apply_truncation(cfg: RunConfig, batch: RolloutBatch) -> Tensor | None:
    """Apply the ``truncation`` policy to ``batch`` (in place); return the rows valid for the advantages.

    - ``mask``: a truncated completion's loss mask is zeroed and it is left out of its group's
      advantages (``group_advantages(..., valid=...)``) and, having no unmasked token, out of DFPO's
      transform, so Σ Â = 0 over the rows that enter the loss;
    - ``failure_reward``: a truncated completion's reward becomes ``failure_reward``; it stays in the loss;
    - ``keep``: nothing changes.

    Idempotent (a replayed batch, already processed, comes out the same).

    Returns:
        (B,) bool, the rows that take part in the advantages (``mask``), or None (every row).
    """
    if cfg.truncation == "failure_reward":
        # DAPO's overlong handling, its simplest form: a completion cut at max_new_tokens failed
        failed = torch.full_like(batch.rewards, cfg.failure_reward)
        batch.rewards = torch.where(batch.truncated, failed, batch.rewards)
        return None
    if cfg.truncation == "mask":
        # DAPO's overlong filtering, applied to the advantages as well as to the loss
        valid = ~batch.truncated
        batch.completion_mask = batch.completion_mask * valid.to(batch.completion_mask.dtype)[:, None]
        return valid
    return None


def dropped_groups(group: Tensor, valid: Tensor | None) -> int:
    """Groups of the batch left with fewer than 2 valid rows (they contribute nothing to the update)."""
    if valid is None:
        return 0
    _, inverse = torch.unique(group, return_inverse=True)
    kept = torch.bincount(inverse, weights=valid.to(torch.float64))
    return int((kept < 2).sum())


def make_buffer(cfg: RunConfig, pad_token_id: int) -> RewardBalancedBuffer[RolloutBatch]:
    """The reward-balanced buffer (cancellation-hypothesis paper Sec. 4) of ``RolloutBatch`` groups.

    ``prompts_per_step`` groups per update.
    """
    return RewardBalancedBuffer(
        cfg.reward_balanced_rho,
        num_groups=cfg.prompts_per_step,
        max_groups=BUFFER_CAPACITY * cfg.prompts_per_step,
        concat=lambda parts: concat_batches(parts, pad_token_id),
        select=lambda batch, rows: batch.select(rows),
    )


# ------------------------------------------------------------------------------------------------
# one mini-batch: log-probs -> coefficients -> backward


def loss_params(cfg: RunConfig) -> dict[str, Any]:
    """``compute_loss`` keyword parameters of the config's objective.

    ``seq-mean-token-sum-norm`` gets ``norm_constant = max_new_tokens`` unless set, so the constant does
    not depend on how a mini-batch happens to be padded (TRL's ``dr_grpo``).
    """
    params = cfg.objective_params()
    if cfg.aggregation == "seq-mean-token-sum-norm" and "norm_constant" not in params:
        params["norm_constant"] = float(cfg.max_new_tokens)
    return params


def micro_batches(rows: int, size: int | None) -> list[Tensor]:
    """The micro-batches of a mini-batch of ``rows`` rows: consecutive index runs of ``size`` (0/None: one)."""
    return list(torch.arange(rows).split(size or rows))


#: A micro-batch: row indices into the mini-batch, or None for an empty pass (a process with fewer rows
#: than the others runs it so that every process runs the same number of forward passes).
Micro = Tensor | None


def plan_micro_batches(accelerator: Any, cfg: RunConfig, sub: RolloutBatch) -> list[Micro]:
    """This process's micro-batches of mini-batch ``sub`` (all processes call it together).

    ``max_tokens_per_micro_batch``: packed by padded tokens (real tokens under ``padding_free``), whole
    groups first (``scaledrun.packing``);
    ``micro_batch_size``: consecutive runs of that many rows; neither: one pass. Every process gets the
    same number of micro-batches (FSDP and ZeRO-3 gather parameters in every forward pass, a collective).
    """
    if cfg.max_tokens_per_micro_batch:
        lengths = RowLengths.of(sub)
        micro: list[Tensor] = pack_rows(
            lengths, sub.group, cfg.max_tokens_per_micro_batch, padding_free=cfg.padding_free
        )
    else:
        lengths = None
        micro = micro_batches(len(sub), cfg.micro_batch_size)
    count = len(micro)
    if accelerator.num_processes > 1:
        count = int(max_list(accelerator, [float(count)])[0])
    if count == len(micro):
        return list(micro)
    lengths = lengths if lengths is not None else RowLengths.of(sub)
    return balance_bins(micro, count, lengths, padding_free=cfg.padding_free)


def policy_logprobs(model: Any, batch: RolloutBatch, cfg: RunConfig) -> dict[str, Tensor]:
    """log π (B, T) of ``batch``'s completion tokens at the sampling temperature; 0 where the loss mask is 0.

    One bounded pass (``scaledrun.scoring``): the LM head runs on the unmasked completion positions only,
    ``logprob_chunk_tokens`` at a time, and is recomputed in the backward pass.
    """
    t = batch.completion_mask.shape[1]
    return completion_logprobs(
        model, batch.input_ids, batch.attention_mask, t, temperature=cfg.temperature,
        completion_mask=batch.completion_mask, chunk_tokens=cfg.logprob_chunk_tokens,
        padding_free=cfg.padding_free,
    )  # fmt: skip


def micro_logprobs(model: Any, sub: RolloutBatch, cfg: RunConfig, rows: Micro) -> tuple[Tensor, Tensor]:
    """(log-probs (b_k, T_k) of micro-batch ``rows`` of ``sub``, trimmed to its own widest row; the rows).

    An empty pass (``rows`` None) scores ``sub``'s first row with its loss mask zeroed: the forward pass
    runs (every process joins the parameter gathers) and contributes nothing.
    """
    if rows is None:
        part = sub.select(torch.tensor([0]))
        part.completion_mask = torch.zeros_like(part.completion_mask)
        rows = torch.zeros(0, dtype=torch.long)
    else:
        part = sub.select(rows)
    part = trim_batch(part)
    return policy_logprobs(model, part, cfg)["logp"], rows


def minibatch_logprobs(
    model: Any, sub: RolloutBatch, cfg: RunConfig, micro: list[Micro], *, reuse_old: bool = False
) -> dict[str, Tensor]:
    """The current log-probs ``logp`` (b, T) of the whole mini-batch ``sub``, for its coefficients.

    - ``reuse_old`` (on-policy: the weights are those that scored ``old_logp``): ``sub.old_logp``
      itself, no forward pass (TRL does the same when the update is on-policy);
    - one micro-batch: one forward pass with the graph (``backpropagate`` differentiates it);
    - several: no-grad passes over the micro-batches (the same rows and trims the backward passes
      run, so the coefficients see exactly the log-probs that are then differentiated).
    """
    if reuse_old:
        return {"logp": sub.old_logp.detach(), "scored_rows": torch.tensor(0.0)}
    if len(micro) == 1 and micro[0] is not None and len(micro[0]) == len(sub):
        part = trim_batch(sub)
        logp = policy_logprobs(model, part, cfg)["logp"]  # (b, T_k): padded back to T, graph kept
        logp = torch.nn.functional.pad(logp, (0, sub.completion_mask.shape[1] - logp.shape[1]))
        return {"logp": logp, "scored_rows": torch.tensor(float(len(sub)))}
    logp = torch.zeros_like(sub.old_logp)
    with torch.no_grad():
        for rows in micro:
            part, idx = micro_logprobs(model, sub, cfg, rows)
            logp[idx, : part.shape[1]] = part.to(logp.dtype)
    return {"logp": logp, "scored_rows": torch.tensor(float(sum(len(r) for r in micro if r is not None)))}


def minibatch_coefficients(
    cfg: RunConfig, sub: RolloutBatch, advantages: Tensor, logp: Tensor, counts: GlobalCounts
) -> Coefficients:
    """The coefficients c = ∂J/∂logp (b, T) of the whole mini-batch: one ``compute_loss`` call.

    Args:
        sub: the mini-batch's rows; advantages: (b,) or (b, T), the schedule's (Lopti stage, AR);
        logp: (b, T) current log-probs (detached); counts: the global normalisers.
    A mini-batch with no unmasked token on this process (others have some) has c = 0 and no metrics.
    """
    if float(sub.completion_mask.sum()) == 0:
        return Coefficients(coef=torch.zeros_like(logp), loss=torch.zeros(()), metrics={})
    params = loss_params(cfg)
    if cfg.beta > 0:
        params["ref_logp"] = sub.ref_logp
    return coefficients(
        cfg.objective, logp, sub.old_logp, advantages, sub.completion_mask, sub.group,
        aggregation=cfg.aggregation, token_count=counts.tokens, seq_count=counts.sequences, **params,
    )  # fmt: skip


def surrogate(logp: Tensor, coef: Tensor, mask: Tensor, world: int) -> Tensor:
    """−W·Σ_{i,t} c_{i,t}·logp_{i,t}: its gradient is −W·c on every log-prob (c a constant)."""
    logp = torch.where(mask.bool(), logp, torch.zeros_like(logp))  # padding: no gradient, whatever it holds
    return -(coef.detach() * logp).sum() * world


def backpropagate(
    accelerator: Any,
    model: Any,
    cfg: RunConfig,
    sub: RolloutBatch,
    coef: Tensor,
    micro: list[Micro],
    logp: Tensor,
) -> int:
    """Accumulate ∇θ of the mini-batch's loss, −Σ c·∇θ logp (× W for DDP's mean), into ``.grad``.

    ``logp`` with a graph (one micro-batch, not reused): backward through it. Otherwise per micro-batch
    a forward pass with the graph and the backward of its rows' coefficients; gradients are synchronised
    on the last backward only (``gradient_sync``). Returns the rows scored with the graph.
    """
    world = accelerator.num_processes
    if logp.requires_grad:
        with gradient_sync(accelerator, model, True):
            accelerator.backward(surrogate(logp, coef, sub.completion_mask, world))
        return 0  # its rows were scored (with the graph) by ``minibatch_logprobs``
    scored = 0
    for k, rows in enumerate(micro):
        with gradient_sync(accelerator, model, k == len(micro) - 1):
            logp_k, idx = micro_logprobs(model, sub, cfg, rows)
            t_k = logp_k.shape[1]
            mask_k = sub.completion_mask[idx, :t_k] if len(idx) else torch.zeros_like(logp_k)
            coef_k = coef[idx, :t_k] if len(idx) else torch.zeros_like(logp_k)
            accelerator.backward(surrogate(logp_k, coef_k, mask_k, world))
        scored += len(idx)
    return scored


# ------------------------------------------------------------------------------------------------
# the update


def update(
    cfg: RunConfig,
    accelerator: Any,
    model: Any,
    optimizer: Any,
    batch: RolloutBatch,
    advantages: Tensor,
    generator: torch.Generator,
    first_grads: dict[str, Tensor] | None = None,
    *,
    on_policy: bool = False,
    measure: bool = True,
) -> UpdateResult:
    """One RL step's optimizer steps on ``batch``: Lopti stages × ``inner_epochs`` × mini-batches.

    Args:
        batch: the update batch (rewards, truncation and advantages applied).
        advantages: (B,) or (B, T) (after Advantage Reweighting) advantages of its rows.
        generator: the mini-batch split's RNG.
        first_grads: debug; filled with the first optimizer step's gradients (``UpdateDiagnostics``).
        on_policy: ``batch.old_logp`` was scored by the current weights (this step's rollouts, not a
            replayed or buffered batch): the first optimizer step then takes its coefficients from them
            instead of scoring its mini-batch again.
        measure: run the energy and token-flip diagnostics (their extra passes) on this step.
    """
    schedule = Schedule(
        inner_epochs=cfg.inner_epochs, num_minibatches=cfg.num_minibatches, batching=cfg.batching,
        lopti_eta=cfg.lopti_eta,
    )  # fmt: skip
    steps = minibatches(
        batch.group, advantages, schedule, old_logp=batch.old_logp, mask=batch.completion_mask,
        generator=generator, any_process=lambda flag: any_process(accelerator, flag),
    )  # fmt: skip
    params = [p for p in model.parameters() if p.requires_grad]
    max_norm = cfg.grad_clip if cfg.grad_clip is not None else math.inf
    diagnostics = UpdateDiagnostics(cfg, accelerator, model, batch, first_grads, measure)
    res = diagnostics.result
    with dropout_off(model):  # every pass computes the same function as the old-log-prob pass
        for mb in steps:
            sub = batch.select(mb.rows)
            counts = global_counts(accelerator, sub.completion_mask)
            if counts.tokens == 0:
                continue  # no token of this mini-batch on any process
            micro = plan_micro_batches(accelerator, cfg, sub)
            # 1. the current log-probs of the whole mini-batch (on-policy: the old ones, no pass)
            fwd = minibatch_logprobs(model, sub, cfg, micro, reuse_old=on_policy and res.opt_steps == 0)
            # 2. its coefficients ∂J/∂logp: one compute_loss call on the whole mini-batch
            co = minibatch_coefficients(cfg, sub, mb.advantages, fwd["logp"].detach(), counts)
            diagnostics.before_step(sub, co)
            # 3. ∇θ J = Σ c·∇θ logp into .grad (micro-batch by micro-batch: the same gradient)
            scored = backpropagate(accelerator, model, cfg, sub, co.coef, micro, fwd["logp"])
            diagnostics.after_backward()
            # 4. clip, step
            grad_norm = float(accelerator.clip_grad_norm_(params, max_norm))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            diagnostics.after_step(mb, sub, fwd["logp"], co, grad_norm)
            res.rows_scored += float(fwd["scored_rows"]) + scored
            slots, real = pass_tokens(
                sub, micro if not fwd["logp"].requires_grad else [torch.arange(len(sub))]
            )
            res.slots += real if cfg.padding_free else slots  # packed passes hold no padding
            res.tokens += real
    return diagnostics.finish()


# ------------------------------------------------------------------------------------------------
# evaluation


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
        replay_dir: a step ``s`` with a file ``<replay_dir>/rank<k>/step_<s>_rollouts.pt`` (this
            process's) or ``<replay_dir>/step_<s>_rollouts.pt`` (a ``RolloutBatch`` saved by
            ``debug_dir``, several concatenated, or built by a test) trains on it instead of generating.
    """
    from accelerate import Accelerator

    # a ``--multi_gpu`` launch on a machine without GPUs runs on CPU processes (gloo): Accelerate only
    # picks MULTI_CPU when told ``cpu=True`` (``ACCELERATE_USE_CPU``), so say it when there is no GPU
    accelerator = Accelerator(cpu=not has_accelerator())
    check_launch(accelerator)  # a DeepSpeed/FSDP config file on a machine without GPUs: refused, not DDP
    watch_parent()  # under a launcher: this worker exits when the launcher is gone
    seed_all(cfg.seed)
    out_dir = Path(cfg.output_dir)
    started = time.perf_counter()

    # ---- everything a user can get wrong is checked before the run folder is created or touched
    check_model_source(cfg.model)
    check_device_support(cfg, accelerator.device)  # compile_decode, flash attention
    check_task_source(cfg)
    if accelerator.is_main_process:  # not the others: they may start after the main one wrote its files
        refuse_existing_run(out_dir, resume=cfg.resume, overwrite=cfg.overwrite)
    # the data, read and checked with the (cheap) tokenizer before the folder and the (costly) model
    tokenizer = load_tokenizer(cfg)
    data = load_data(cfg, tokenizer, accelerator.print)

    # ---- the run folder: one writer (main process), no silent replacement, no mixed runs
    lock = RunLock(out_dir)
    try:
        if accelerator.is_main_process:
            lock.acquire()
            check_start(out_dir, resume=cfg.resume, overwrite=cfg.overwrite)
        result = _train(cfg, accelerator, tokenizer, data, debug_dir, replay_dir)
    finally:
        lock.release()
    # the reward quoted is the run's (metrics.jsonl: steps before a resume too), as the Runs page shows it
    history = read_metrics(out_dir) if accelerator.is_main_process else result.rows
    summary = run_summary(
        out_dir, result.rows, cfg.steps - len(result.rows), time.perf_counter() - started, history=history
    )
    accelerator.print(summary)
    return result


def _train(
    cfg: RunConfig,
    accelerator: Any,
    tokenizer: Any,
    data: RunData,
    debug_dir: str | Path | None,
    replay_dir: str | Path | None,
) -> TrainResult:
    """The run itself (``train`` holds the run folder around it and has loaded the data)."""
    rank, world = accelerator.process_index, accelerator.num_processes
    out_dir = Path(cfg.output_dir)

    # ---- model, optimizer (the data is loaded: ``train``)
    model = load_model(cfg)
    optimizer, scheduler = build_optimizer(cfg, model)
    before_prepare(accelerator, cfg)  # plugin settings: DeepSpeed's micro-batch, FSDP2's bf16 unshard
    # the scheduler is not prepared: an accelerate-prepared scheduler steps once per process
    model, optimizer = accelerator.prepare(model, optimizer)
    train_tasks, eval_tasks, formatted = data.train, data.eval, data.formatted
    buffer = None if cfg.reward_balanced_rho is None else make_buffer(cfg, tokenizer.pad_token_id)

    # ---- resume
    start = 0
    if cfg.resume:
        ckpt = latest_checkpoint(out_dir)
        if ckpt is not None:
            note = check_resume_config(checkpoint_config(ckpt), cfg, ckpt)
            start, buffered, _ = load_checkpoint(accelerator, model, optimizer, scheduler, ckpt)
            if buffer is not None and buffered is not None:
                buffer.push(buffered, buffered.advantages, buffered.group)
            accelerator.print(f"resumed from {ckpt} (step {start}){note}")
        else:
            accelerator.print(f"--resume: no checkpoint in {out_dir}/checkpoints, starting from step 0")
    if accelerator.is_main_process:
        out_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out_dir / "config.yaml")
    logger = RunLogger(out_dir, cfg.steps, enabled=accelerator.is_main_process, resume_step=start)
    unwrapped = accelerator.unwrap_model(model)
    ref_ctx = unwrapped.disable_adapter if cfg.beta > 0 else None
    backend = run_backend(cfg, unwrapped)
    rows: list[dict[str, float]] = []
    reward_fns = list(dict.fromkeys(parse_reward_names(cfg.reward)))  # one ``rewards/<name>/mean`` each
    warned_truncation = False
    model.train()

    with compute_precision(cfg, accelerator.device):  # bf16 autocast for fp32 master weights
        for step in range(start + 1, cfg.steps + 1):
            t0 = time.perf_counter()
            seed = step_seed(cfg.seed, step, rank)
            torch.manual_seed(seed)
            generator = torch.Generator().manual_seed(seed + 1)
            dump = None if debug_dir is None else Path(debug_dir) / f"rank{rank}"

            # ---- 1. rollouts: G completions for each of this process's prompts
            replay = None if replay_dir is None else replay_file(Path(replay_dir), rank, step)
            replayed = replay is not None
            if replayed:
                # debug: train on saved rollouts (their texts, masks and rewards) instead of sampling
                batch = safe_load(replay).to(accelerator.device)
                roll = replay_stats(batch)
            else:
                mine = step_prompts(train_tasks, step, cfg.prompts_per_step, rank, world, cfg.seed)
                with full_params(accelerator, model):
                    batch, roll = generate_rollouts(
                        unwrapped, tokenizer, [formatted[id(t)] for _, t in mine], [t.answer for _, t in mine],
                        [k for k, _ in mine], num_generations=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
                        temperature=cfg.temperature, top_p=cfg.top_p, ref_model_ctx=ref_ctx,
                        chunk_tokens=cfg.logprob_chunk_tokens, backend=backend,
                        plan=lambda b: plan_micro_batches(accelerator, cfg, b),  # the loss's passes
                        padding_free=cfg.padding_free,
                    )  # fmt: skip
            t_gen = time.perf_counter() - t0

            # ---- 2. rewards, truncation, group-relative advantages (DFPO eq. 43) over the rows in the loss
            failures = 0
            fdtype = at_least_float32(batch.old_logp.dtype)
            # each reward function's own values (rows × functions; NaN on a replayed batch: not scored here)
            terms = torch.full((len(batch), len(reward_fns)), math.nan, device=batch.group.device)
            if not replayed:
                by_id = dict(mine)  # each row's task by its global prompt id: its dataset columns
                scores = score_rewards(
                    cfg.reward, batch.prompts, batch.completions, batch.answers, cfg.failure_reward,
                    weights=cfg.reward_weights, columns=reward_columns([by_id[g] for g in batch.group.tolist()]),
                )  # fmt: skip
                failures = scores.failures
                # float32, or float64 in a float64 run: the dtype of the old log-probs they are weighed with
                batch.rewards = torch.tensor(scores.rewards, dtype=fdtype, device=batch.group.device)
                terms = torch.tensor([scores.terms[n] for n in reward_fns], device=batch.group.device).T
            valid = apply_truncation(cfg, batch)
            batch.advantages = group_advantages(
                batch.rewards, batch.group, scale=cfg.adv_scale, valid=valid
            ).to(fdtype)
            if dump is not None:
                dump.mkdir(parents=True, exist_ok=True)
                torch.save(batch.to("cpu"), dump / f"step_{step:06d}_rollouts.pt")

            # ---- 3. the update batch: this step's, or a reward-balanced selection (cancellation-hypothesis paper Sec. 4)
            update_batch: RolloutBatch | None = batch
            if buffer is not None:
                buffer.push(batch, batch.advantages, batch.group)
                selection = buffer.selection()
                # every process must step together: take nothing unless every process has a selection
                everyone = not any_process(accelerator, selection is None)
                update_batch = buffer.pop(selection if everyone else None)

            # ---- 4. the update
            t1 = time.perf_counter()
            first_grads: dict[str, Tensor] | None = {} if dump is not None else None
            res = UpdateResult()
            if update_batch is not None:
                adv = update_batch.advantages
                if cfg.ar_alpha is not None:
                    # Advantage Reweighting (Lopti paper §4.1, eq. 4): per-token A·[α·π_old + (1 − α)]
                    adv = reweight_advantages(adv, update_batch.old_logp, cfg.ar_alpha)
                res = update(
                    cfg, accelerator, model, optimizer, update_batch, adv, generator, first_grads=first_grads,
                    on_policy=update_batch is batch and not replayed, measure=measure_step(cfg, step),
                )  # fmt: skip
            with warnings.catch_warnings():
                # the LR schedule follows RL steps; a step without an optimizer step (every completion truncated,
                # or a reward-balanced buffer still filling) is expected here, not the mistake torch warns about
                warnings.filterwarnings(
                    "ignore", message=".*lr_scheduler.step.*optimizer.step.*", category=UserWarning
                )
                scheduler.step()
            if res.opt_steps:
                backend.sync_weights(unwrapped)  # the next rollouts sample from the updated policy
            t_upd = time.perf_counter() - t1
            if dump is not None:
                torch.save(first_grads, dump / f"step_{step:06d}_grads.pt")
                trainable = {
                    n: p.detach().cpu().clone() for n, p in unwrapped.named_parameters() if p.requires_grad
                }
                torch.save(trainable, dump / f"step_{step:06d}_trainable.pt")

            # ---- 5. the log row (same keys as the toy where they exist)
            all_rewards = accelerator.gather(batch.rewards)
            all_terms = accelerator.gather(terms.contiguous())
            row = mean_over_processes(accelerator, {
                **{k: res.metrics.get(k, math.nan) for k in METRIC_KEYS}, **res.flip, **res.energy,
                "completion_length": roll["completion_length"], "truncated_frac": roll["truncated_frac"],
                "entropy": roll["entropy"], "grad_norm": res.grad_norm,
            })  # fmt: skip
            totals = sum_over_processes(accelerator, {
                "reward_failures": float(failures), "tokens_generated": roll["tokens_generated"],
                "truncation/dropped_groups": float(dropped_groups(batch.group, valid)),
                "loss_tokens": 0.0 if update_batch is None else float(update_batch.completion_mask.sum()),
                # every row through the model this step: the old (and reference) pass, then the update's
                "rows_scored": (0.0 if replayed else len(batch) * (2.0 if ref_ctx is not None else 1.0))
                + res.rows_scored,
                "rows": float(len(batch)), "slots": res.slots, "tokens": res.tokens,
            })  # fmt: skip
            row.update(score_stats(totals))
            if update_batch is not None and totals["loss_tokens"] == 0 and not warned_truncation:
                warned_truncation = True  # once per run; the run's last line counts every such step
                accelerator.print(truncation_warning(cfg, step), file=sys.stderr)
            meter = MeterTotals.from_list(sum_list(accelerator, res.meter.as_list()))
            dt = time.perf_counter() - t0
            row.update({
                "sampled_reward": float(all_rewards.mean()),
                "reward/mean": float(all_rewards.mean()),
                "reward/std": float(all_rewards.std()) if all_rewards.numel() > 1 else 0.0,
                # each function's own mean beside their weighted sum (TRL's rewards/<name>/mean)
                **{f"rewards/{n}/mean": float(all_terms[:, k].mean()) for k, n in enumerate(reward_fns)},
                "accuracy": float((all_rewards >= 1.0).float().mean()),
                "reward_failures": totals["reward_failures"],
                "truncation/dropped_groups": totals["truncation/dropped_groups"],
                # an update batch whose every completion was truncated (and masked): nothing to learn from
                "truncation/no_update": float(update_batch is not None and totals["loss_tokens"] == 0),
                **meter.residuals(),
                "lr": scheduler.get_last_lr()[0],
                "opt_steps": float(res.opt_steps),
                "updated": 1.0 if update_batch is not None else 0.0,
                "buffer_groups": float(0 if buffer is None else buffer.num_buffered),
                "time/step_s": dt,
                "time/generate_s": t_gen,
                "time/update_s": t_upd,
                "time/tokens_per_s": totals["tokens_generated"] / dt,
            })  # fmt: skip

            # ---- eval, log, checkpoint
            if eval_tasks and (step % cfg.eval_every == 0 or step == cfg.steps):
                torch.manual_seed(seed + 2)
                with full_params(accelerator, model):
                    row.update(evaluate(cfg, accelerator, model, tokenizer, eval_tasks))
            logger.log(step, row)
            rows.append(row)
            if (cfg.save_every > 0 and step % cfg.save_every == 0) or step == cfg.steps:
                buffered = None if buffer is None else buffer.payload
                save_checkpoint(
                    accelerator, model, optimizer, scheduler, step, out_dir, buffer=buffered,
                    extra={"config": dataclasses.asdict(cfg)}, save_total_limit=cfg.save_total_limit,
                )  # fmt: skip
    logger.close()
    accelerator.wait_for_everyone()
    return TrainResult(rows=rows, model=accelerator.unwrap_model(model), tokenizer=tokenizer)


def main(argv: list[str] | None = None) -> TrainResult:
    """``--config path.yaml`` then any ``--field value`` overrides of ``RunConfig``.

    Options outside the config (``CLI_OPTIONS``): ``--import module`` (repeatable; imported first, e.g. a
    module that registers reward functions with ``@register_reward``), and the debug hooks
    ``--debug_dir DIR``, ``--replay_dir DIR`` (``train``'s keyword arguments). A reward in a file is a
    config field (``--reward_file PATH.py:FUNCTION``), saved with the run so that a resume finds it.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print_help()
        raise SystemExit(0)
    try:
        import_modules(pop_option(argv, "--import"))
    except ValueError as err:
        usage_error(err)
    debug = pop_option(argv, "--debug_dir")
    replay = pop_option(argv, "--replay_dir")
    paths = pop_option(argv, "--config")
    try:
        if len(paths) > 1:
            raise ValueError("command line: give --config once")
        path = paths[0] if paths else None
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(f"config file {path} does not exist")
        cfg = load_config(path, argv)
    except (ValueError, FileNotFoundError) as err:  # every load_config error names what to fix
        usage_error(err)
    try:
        result = train(cfg, debug_dir=debug[-1] if debug else None, replay_dir=replay[-1] if replay else None)
    except (RunFolderError, FileNotFoundError, DataError, LaunchError) as err:  # folder, model, data, launch
        usage_error(err)
    close_process_group()
    return result


def close_process_group() -> None:
    """Destroy the launch's process group before the interpreter exits (every rank has passed ``_train``'s
    last barrier). Left to the interpreter's teardown, a gloo worker now and then aborts at exit ("terminate
    called without an active exception", SIGABRT) after a finished run; the test workers close theirs the
    same way. A no-op outside a launch."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
