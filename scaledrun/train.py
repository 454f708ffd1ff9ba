"""Group-relative RL on a Hugging Face causal LM with LoRA: GRPO, GRPO-fix, GSPO, DFPO (+ AR, Lopti).

Every loss is one ``cancellation.compute_loss`` call on a whole mini-batch, and the schedule, the
reward-balanced buffer and the cancellation meters are ``cancellation.update``'s, the code the toy
runs too; this file only moves tensors around. It reads top to bottom: config, model, data, then the
loop (rollouts -> rewards -> advantages -> update -> log -> eval -> checkpoint).

One training step, from prompt to ``optimizer.step``
----------------------------------------------------
1. **Rollouts** (``rollout.generate_rollouts``): G = ``group_size`` sampled completions for each of this
   process's ``prompts_per_step`` prompts (temperature T, top-p), the completion mask through the first
   EOS, and log π_old of every sampled token from one no-grad pass at T.
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
   (``FORM_KEYS``), from teacher-forced log-probs of each whole form + EOS at T.

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
``--config`` takes a YAML of ``RunConfig`` fields and any ``--field value`` overrides it.

CPU smoke test (the tiny Qwen3, well under a minute)::

    python -m scaledrun.tiny --out artifacts/tiny-qwen3
    python -m scaledrun.train --config scaledrun/configs/default.yaml --steps 20 --output_dir runs/smoke

Two CPU processes (gloo; what ``tests/scaledrun/test_multiprocess.py`` runs; on a machine without a
GPU the trainer passes ``cpu=True`` to Accelerate so a ``--multi_gpu`` launch uses gloo)::

    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no \\
        --dynamo_backend no -m scaledrun.train --config scaledrun/configs/default.yaml --steps 20 \\
        --output_dir runs/smoke-2proc

Every run writes its own ``--output_dir``: a folder that already holds a run is refused unless
``--resume true`` or ``--overwrite true`` (``scaledrun/rundir.py``); ``kill -9`` of the launcher stops its
workers too.

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

Options outside the config (``--help`` lists them): ``--import module`` (repeatable) imports a module
first, e.g. one that registers a reward with ``@scaledrun.rewards.register_reward``; a reward function in
a file is the config field ``--reward_file path.py:function``.

Your own data (docs/trainer.md, "Train on your own data")::

    python -m scaledrun.train --config scaledrun/configs/default.yaml --task data/train.parquet \
        --answer_field reward_model.ground_truth --reward_file my_rewards.py:score --output_dir runs/mine

The data is read and checked (columns, keys, ``num_train``, the chat template) with the tokenizer alone,
before the run folder is created and before the model loads: a mistake prints ``error: ...`` and exits 2.

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

Where this departs from the papers
----------------------------------
- LoRA instead of full fine-tuning by default (``full_finetune: true`` for the papers' setting).
- The LR schedule advances once per RL step (not per optimizer step): warm-up and cosine decay are in
  units of ``steps``.
- Old log-probs come from a separate no-grad forward pass (not the sampler's logits) in eval mode; all
  log-probs (old, reference, current) and the entropy are those of logits / ``temperature``, the
  policy that sampled, as TRL and verl compute them; like them, the top-p truncation is ignored in
  the ratio. The policy-gradient passes run with every dropout at p = 0 (``rollout.dropout_off``,
  train mode kept for gradient checkpointing), so the first on-policy ratio is exactly 1 even with
  ``lora_dropout`` > 0. Reward-balanced batching reuses buffered groups whose old log-probs (and
  advantages) are those of the policy that sampled them, i.e. the update is off-policy for them by up
  to a few steps.
- Token entropy (``entropy``) is the mean per-token entropy of π_old (at T) on the sampled tokens, not
  the toy's exact trajectory entropy.
- ``shared_residual``, ``group_shared_residual`` and ``sequence_net_residual`` are computed exactly as in
  the toy (``cancellation.update.CancellationMeter``): from the coefficients ∂J/∂logp that each
  optimizer step applied, summed over all optimizer steps of the RL step and over processes.
- ``energy/bucket_*`` (DFPO eq. 24, output-layer proxy) uses the **first mini-batch** of each step only
  (it needs the (B, T, V) probabilities), and is NaN when that tensor would exceed ``ENERGY_MAX_ELEMENTS``.
- Token-flip stats (cancellation-hypothesis paper App. C) use the **last mini-batch** only: its log-probs
  before and after its optimizer step.
- Multi-process: objective metrics (clip fractions, ratios, ...) are averaged over processes; rewards
  are gathered exactly; the residuals' sums are added. KL to the reference needs LoRA (the reference is
  the base model with the adapter disabled). Under DeepSpeed ZeRO / FSDP checkpoints hold the gathered
  weights but not the sharded optimizer state (``checkpoint.py``); those two launch modes are shipped
  untested (no GPU here).
"""

from __future__ import annotations

import dataclasses
import math
import random
import sys
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
from torch import Tensor

from cancellation import METRIC_KEYS, group_advantages, reweight_advantages
from cancellation.diagnostics import FLIP_KEYS, energy_by_bucket, prefix_event_keys, token_flip_stats
from cancellation.update import (
    RESIDUAL_KEYS,
    CancellationMeter,
    Coefficients,
    MeterTotals,
    MiniBatch,
    RewardBalancedBuffer,
    Schedule,
    coefficients,
    minibatches,
)

from .backends import make_backend
from .checkpoint import checkpoint_config, latest_checkpoint, load_checkpoint, safe_load, save_checkpoint
from .config import RunConfig, load_config, save_config
from .distributed import (
    any_process,
    deepspeed_micro_batch,
    full_params,
    gradient_sync,
    has_accelerator,
    max_list,
    mean_over_processes,
    sum_list,
    sum_over_processes,
)
from .packing import RowLengths, balance_bins, pack_rows, trim_batch
from .rewards import compute_rewards, parse_reward_names, score_rewards
from .rollout import (
    RolloutBatch,
    completion_logprobs,
    concat_batches,
    dropout_off,
    generate_rollouts,
    generate_texts,
)
from .rundir import (
    RunFolderError,
    RunLock,
    check_resume_config,
    check_start,
    refuse_existing_run,
    watch_parent,
)
from .runlog import RunLogger, last_steps_mean, read_metrics
from .tasks import (
    TASKS,
    Task,
    drop_overlong,
    format_prompt,
    has_eval_source,
    is_task_file,
    load_task,
    reward_columns,
    source_problems,
)

#: energy_by_bucket needs the (B, T, V) probabilities of the first mini-batch; skipped above this size.
ENERGY_MAX_ELEMENTS = 2**26
NUM_ENERGY_BUCKETS = 3
ENERGY_KEYS = tuple(f"energy/bucket_{k}" for k in range(NUM_ENERGY_BUCKETS))
#: Keys of every training row (eval rows add ``eval/greedy_accuracy`` and ``eval/avg@k``, and
#: ``FORM_KEYS`` when the eval tasks carry ≥ 2 equally correct forms). Each reward function of ``reward``
#: adds ``rewards/<name>/mean``, its own mean beside the weighted sum ``reward/mean`` (TRL's key).
STEP_KEYS = (
    *METRIC_KEYS,
    "sampled_reward",
    "reward/mean",
    "reward/std",
    "accuracy",
    "reward_failures",
    "completion_length",
    "truncated_frac",
    "truncation/dropped_groups",
    "truncation/no_update",
    "entropy",
    *RESIDUAL_KEYS,
    *FLIP_KEYS,
    *ENERGY_KEYS,
    "grad_norm",
    "score/rows",
    "score/rows_per_completion",
    "score/padding_frac",
    "lr",
    "opt_steps",
    "updated",
    "buffer_groups",
    "time/step_s",
    "time/generate_s",
    "time/update_s",
    "time/tokens_per_s",
)
#: Eval keys of tasks with several equally correct forms (``Task.forms``, e.g. ``template_forms``), from
#: q_k = π(form_k | prompt) / Σ_j π(form_j | prompt) (whole completions + EOS, teacher-forced at T):
#: ``eval/form_entropy`` the mean over prompts of H(q) in nats (ln 2 for two equally likely forms, 0 when
#: the policy has collapsed onto one), ``eval/form_mass`` the mean of Σ_k π(form_k | prompt) and
#: ``eval/form_logodds`` the mean of log π(form_0 | prompt) − log π(form_1 | prompt).
FORM_KEYS = ("eval/form_entropy", "eval/form_mass", "eval/form_logodds")
#: Rows (prompt + one form) per no-grad forward pass of ``form_logprobs``.
FORM_BATCH_ROWS = 64
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


def master_fp32(cfg: RunConfig) -> bool:
    """Full fine-tuning in bfloat16 keeps float32 master weights and computes in bfloat16 (autocast).

    AdamW on bfloat16 weights loses every update below bfloat16's resolution (8 bits of mantissa: a step
    of lr 8e-7 on a weight of 0.02 is 4e-5 of it, far below 2^-8), so one step at the ``dfpo_paper`` lr
    changed 0.5 % of the weights. With float32 parameters and the forward and backward passes under
    bfloat16 autocast (``compute_precision``; verl too keeps fp32 master weights), every
    weight moves as in float32 (tests/scaledrun/test_train.py). LoRA keeps the frozen base in bfloat16:
    its trainable adapters are float32 already (PEFT's ``autocast_adapter_dtype``).
    """
    return cfg.full_finetune and cfg.dtype == "bfloat16"


def compute_precision(cfg: RunConfig, device: torch.device) -> Any:
    """The context every pass of a run runs in: bfloat16 autocast for ``master_fp32`` runs, else nothing.

    (Autocast rather than Accelerate's ``mixed_precision``: Accelerate's state is one per process, and
    tests run several configurations in one process.)
    """
    if not master_fp32(cfg):
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def load_model_and_tokenizer(cfg: RunConfig) -> tuple[Any, Any]:
    """``load_model(cfg)`` and ``load_tokenizer(cfg)``."""
    return load_model(cfg), load_tokenizer(cfg)


def load_tokenizer(cfg: RunConfig) -> Any:
    """The model's tokenizer, left-padding (pad = EOS when it has none). Cheap: the trainer loads it
    before the model, to check and format the data first."""
    from transformers import AutoTokenizer

    try:  # ``train`` has checked the source already (``check_model_source``)
        tokenizer = AutoTokenizer.from_pretrained(cfg.model, padding_side="left")
    except OSError as err:
        raise FileNotFoundError(f"config field `model`={cfg.model!r} could not be loaded: {err}") from err
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(cfg: RunConfig) -> Any:
    """``from_pretrained`` (dtype from the config), LoRA unless full fine-tuning.

    Full fine-tuning in bfloat16 loads float32 weights (``master_fp32``): the passes then run under
    bfloat16 autocast (``compute_precision``).
    """
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if master_fp32(cfg) else getattr(torch, cfg.dtype)
    try:  # ``train`` has checked the source already (``check_model_source``)
        model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype)
    except OSError as err:
        raise FileNotFoundError(f"config field `model`={cfg.model!r} could not be loaded: {err}") from err
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if not cfg.full_finetune:
        from peft import get_peft_model

        torch.manual_seed(cfg.seed)  # the LoRA A init
        with warnings.catch_warnings():
            # PEFT reads transformers' deprecated `is_gradient_checkpointing`: a FutureWarning on every run
            # that is not ours to fix (seen with transformers 5.24, PEFT 0.21)
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            model = get_peft_model(model, lora_config(cfg))
    elif cfg.beta > 0:
        raise ValueError(
            "config field `beta` > 0 needs LoRA (the reference is the base model with the adapter off)"
        )
    return model


#: Seconds the hub probe of ``check_model_source`` waits for an answer.
HUB_PROBE_TIMEOUT_S = 5.0


def local_model_folders(root: Path | None = None) -> list[str]:
    """Folders under ``root`` (the working directory) or ``root/artifacts`` that hold a model (config.json)."""
    root = Path.cwd() if root is None else root
    found = [*root.glob("*/config.json"), *root.glob("artifacts/*/config.json")]
    return sorted({str(p.parent.relative_to(root)) for p in found if not p.parent.name.startswith(".")})


def _hub_answer(name: str) -> str | None:
    """None when the hub serves model ``name`` (or answers unexpectedly); otherwise why it cannot be fetched."""
    import urllib.error
    import urllib.request

    from huggingface_hub import constants

    url = f"{constants.ENDPOINT.rstrip('/')}/api/models/{name}"
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=HUB_PROBE_TIMEOUT_S)
    except urllib.error.HTTPError as err:
        if err.code in (401, 404):
            return f"the Hugging Face hub has no model {name!r} (HTTP {err.code})"
        return None  # rate limits, gated models, ...: let from_pretrained report it
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        return f"the Hugging Face hub ({constants.ENDPOINT}) cannot be reached ({reason})"
    return None


def check_model_source(name: str) -> None:
    """Fail at once, naming the local model folders, when ``model`` can be neither read nor fetched.

    A local folder must hold ``config.json``. A name that looks like a path (absolute, ``./``, ``~``,
    under ``artifacts/`` or ``runs/``, more than ``org/name``) and does not exist fails here without
    touching the network; so does a hub name that is not in the local hub cache when ``HF_HUB_OFFLINE``
    is set, or when one short request (``HUB_PROBE_TIMEOUT_S``) finds the hub unreachable or without
    that model. Without this, ``from_pretrained`` retries the download for a long while before its own error.
    """
    path = Path(name).expanduser()
    folders = local_model_folders()
    listing = (
        f"local model folders here: {', '.join(folders)}"
        if folders
        else "no local model folder here; build the tiny model with `python -m scaledrun.tiny --out artifacts/tiny-qwen3`"
    )
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"config field `model`={name!r}: the folder holds no config.json; {listing}"
            )
        return
    looks_local = (
        path.is_absolute() or name.startswith((".", "~")) or name.endswith("/") or len(Path(name).parts) > 2
        or Path(name).parts[:1] in (("artifacts",), ("runs",))
    )  # fmt: skip
    if looks_local:
        reason = "no such folder"
    else:
        from huggingface_hub import constants, try_to_load_from_cache

        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return  # in the local hub cache: from_pretrained reads it from there
        if constants.HF_HUB_OFFLINE:
            reason = "not a local folder, not in the local hub cache, and HF_HUB_OFFLINE is set"
        else:
            hub = _hub_answer(name)
            if hub is None:
                return
            reason = f"not a local folder, not in the local hub cache, and {hub}"
    raise FileNotFoundError(f"config field `model`={name!r}: {reason}; {listing}")


def check_task_source(cfg: RunConfig) -> None:
    """The task's local files and folders (and a saved DatasetDict's split names) must exist before the
    run folder is touched (``tasks.source_problems``; a hub dataset is checked when it loads)."""
    for name, why in source_problems(
        cfg.task, cfg.train_split, cfg.eval_split, cfg.eval_fraction, cfg.dataset_config
    ):
        raise FileNotFoundError(f"config field `{name}`={getattr(cfg, name)!r}: {why}")


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


def load_tasks(
    cfg: RunConfig, split: str, n: int | None, tokenizer: Any = None, log: Callable[[str], None] = print
) -> list[Task]:
    """The ``split`` (``train``/``eval``) tasks of ``cfg``: ``n`` of them, a seeded sample (None: every row
    of a dataset, 64 problems of a synthetic task), prompts over ``max_prompt_length`` tokens dropped.

    A dataset without ``eval_split``/``eval_fraction`` has no eval tasks (``[]``, and ``log`` says so).
    ``n`` above a dataset's train rows is an error; an eval split with fewer than ``n`` rows gives them
    all. ``tokenizer`` is needed only with ``max_prompt_length``.
    """
    synthetic = cfg.task in TASKS
    if split == "eval" and not has_eval_source(cfg.task, cfg.eval_split, cfg.eval_fraction):
        log(f"no eval: {cfg.task} has no eval split (set `eval_split` or `eval_fraction` to evaluate)")
        return []
    tasks = load_task(
        cfg.task, split, n if synthetic else None, cfg.seed, cfg.prompt_field, cfg.answer_field,
        digits=cfg.digits, ops=cfg.ops, train_split=cfg.train_split, eval_split=cfg.eval_split,
        eval_fraction=cfg.eval_fraction, dataset_config=cfg.dataset_config,
    )  # fmt: skip
    rows = len(tasks)
    if cfg.max_prompt_length is not None:
        if tokenizer is None:
            raise ValueError("load_tasks: `max_prompt_length` is set, so the tokenizer is needed")
        tasks, dropped = drop_overlong(
            tasks, tokenizer, cfg.max_prompt_length, cfg.system_prompt, cfg.chat_template_kwargs
        )
        if dropped:
            limit = cfg.max_prompt_length
            log(f"{split}: dropped {dropped} of {rows} prompts over {limit} tokens (max_prompt_length)")
        if not tasks:
            raise ValueError(
                f"config field `max_prompt_length`={cfg.max_prompt_length}: every {split} prompt is longer"
            )
    if synthetic:
        return tasks
    knob = "num_train" if split == "train" else "num_eval"
    if n is not None and n > len(tasks):
        if split == "train":
            raise ValueError(
                f"config field `num_train`={n}: the train split has only {len(tasks)} prompts; ask for at "
                "most that many, or none (--num_train none: every row)"
            )
        log(f"eval: the eval split has {len(tasks)} prompts, fewer than num_eval={n}: using them all")
    tasks = tasks[:n] if n is not None else tasks
    log(f"{split}: {len(tasks)} prompts from {task_source(cfg, split)} ({knob}={n})")
    return tasks


def task_source(cfg: RunConfig, split: str) -> str:
    """Where the ``split`` (``train``/``eval``) rows of a dataset come from, as the logs name it."""
    if split == "eval" and cfg.eval_split is not None:
        return cfg.eval_split if is_task_file(cfg.eval_split) else f"{cfg.task} (split {cfg.eval_split})"
    if split == "eval":
        return f"{cfg.task} (the prompts eval_fraction={cfg.eval_fraction} holds out)"
    return cfg.task if cfg.train_split == "train" else f"{cfg.task} (split {cfg.train_split})"


class DataError(ValueError):
    """The task data cannot be used as configured (a column, a key, ``num_train``, a prompt); the message
    names the field to fix."""


@dataclass
class RunData:
    """The run's prompts, loaded and checked before the run folder or the model: the train and eval
    tasks, and each train prompt as the model sees it (by ``id`` of its task)."""

    train: list[Task]
    eval: list[Task]
    formatted: dict[int, str]


def load_data(cfg: RunConfig, tokenizer: Any, log: Callable[[str], None] = print) -> RunData:
    """The train and eval tasks of ``cfg`` (``load_tasks``), their prompts chat-formatted; every mistake in
    the data (a missing column or key, ``num_train`` above the rows, a prompt the template refuses) is a
    ``DataError`` naming what to fix."""
    try:
        train_tasks = load_tasks(cfg, "train", cfg.num_train, tokenizer, log)
        eval_tasks = (
            load_tasks(cfg, "eval", cfg.num_eval, tokenizer, log)
            if cfg.eval_every > 0 and cfg.num_eval > 0
            else []
        )
        formatted = {
            id(t): format_prompt(tokenizer, t.prompt, cfg.system_prompt, cfg.chat_template_kwargs)
            for t in train_tasks
        }
    except (ValueError, KeyError) as err:
        raise DataError(str(err)) from err
    return RunData(train_tasks, eval_tasks, formatted)


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


@dataclass(frozen=True)
class GlobalCounts:
    """The normalisers of one mini-batch, summed over all processes (see "Loss normalisation")."""

    tokens: float  # unmasked completion tokens
    sequences: float  # completions (rows)


def global_counts(accelerator: Any, mask: Tensor) -> GlobalCounts:
    """The mini-batch's token and sequence counts over all processes; ``mask`` (b, T) is this process's part."""
    local = torch.tensor(
        [float(mask.sum()), float(mask.shape[0])], dtype=torch.float64, device=accelerator.device
    )
    tokens, sequences = accelerator.reduce(local, "sum").tolist()
    return GlobalCounts(tokens=tokens, sequences=sequences)


def micro_batches(rows: int, size: int | None) -> list[Tensor]:
    """The micro-batches of a mini-batch of ``rows`` rows: consecutive index runs of ``size`` (0/None: one)."""
    return list(torch.arange(rows).split(size or rows))


#: A micro-batch: row indices into the mini-batch, or None for an empty pass (a process with fewer rows
#: than the others runs it so that every process runs the same number of forward passes).
Micro = Tensor | None


def plan_micro_batches(accelerator: Any, cfg: RunConfig, sub: RolloutBatch) -> list[Micro]:
    """This process's micro-batches of mini-batch ``sub`` (all processes call it together).

    ``max_tokens_per_micro_batch``: packed by padded tokens, whole groups first (``scaledrun.packing``);
    ``micro_batch_size``: consecutive runs of that many rows; neither: one pass. Every process gets the
    same number of micro-batches (FSDP and ZeRO-3 gather parameters in every forward pass, a collective).
    """
    if cfg.max_tokens_per_micro_batch:
        lengths = RowLengths.of(sub)
        micro: list[Tensor] = pack_rows(lengths, sub.group, cfg.max_tokens_per_micro_batch)
    else:
        lengths = None
        micro = micro_batches(len(sub), cfg.micro_batch_size)
    count = len(micro)
    if accelerator.num_processes > 1:
        count = int(max_list(accelerator, [float(count)])[0])
    if count == len(micro):
        return list(micro)
    return balance_bins(micro, count, lengths if lengths is not None else RowLengths.of(sub))


def policy_logprobs(model: Any, batch: RolloutBatch, cfg: RunConfig) -> dict[str, Tensor]:
    """log π (B, T) of ``batch``'s completion tokens at the sampling temperature; 0 where the loss mask is 0.

    One bounded pass (``scaledrun.scoring``): the LM head runs on the unmasked completion positions only,
    ``logprob_chunk_tokens`` at a time, and is recomputed in the backward pass.
    """
    t = batch.completion_mask.shape[1]
    return completion_logprobs(
        model, batch.input_ids, batch.attention_mask, t, temperature=cfg.temperature,
        completion_mask=batch.completion_mask, chunk_tokens=cfg.logprob_chunk_tokens,
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


@dataclass
class UpdateResult:
    """What one RL step's update did, for the log row.

    Attributes:
        metrics: the objective's metrics of the last mini-batch (empty without an update).
        opt_steps: optimizer steps taken; grad_norm: the last one's norm before clipping.
        meter: this process's cancellation-meter sums (add them over processes, then ``.residuals()``).
        energy: ``ENERGY_KEYS`` → share, of the first mini-batch (NaN: not measured).
        flip: ``FLIP_KEYS`` → fraction, of the last mini-batch (NaN: not measured).
        rows_scored: rows run through the model by the update and its diagnostics (every pass counted).
        slots, tokens: token slots (padding included) and real tokens of the gradient passes.
    """

    metrics: dict[str, float] = field(default_factory=dict)
    opt_steps: int = 0
    grad_norm: float = math.nan
    meter: MeterTotals = field(default_factory=MeterTotals)
    energy: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ENERGY_KEYS, math.nan))
    flip: dict[str, float] = field(default_factory=lambda: dict.fromkeys(FLIP_KEYS, math.nan))
    rows_scored: float = 0.0
    slots: float = 0.0
    tokens: float = 0.0


def pass_tokens(sub: RolloutBatch, micro: list[Micro]) -> tuple[float, float]:
    """(token slots, real tokens) of the forward passes over ``micro`` (each trimmed to its own rows)."""
    lengths = RowLengths.of(sub)
    slots = sum(lengths.padded_tokens(rows) for rows in micro if rows is not None)
    slots += sum(lengths.padded_tokens([0]) for rows in micro if rows is None)
    real = float((lengths.prompt + lengths.completion).sum())
    return float(slots), real


class UpdateDiagnostics:
    """What the trainer measures about an update, beside it: ``update`` calls these hooks, in order.

    - the cancellation meter (``cancellation.update.CancellationMeter``) built on the step batch, fed
      each optimizer step's coefficients (every step);
    - with ``measure`` (every ``flip_every`` steps): energy by token-frequency bucket (DFPO eq. 24) of the
      **first** mini-batch (a no-grad pass before its optimizer step, when its (b, T, V) probabilities
      stay under ``ENERGY_MAX_ELEMENTS``), and token flips (cancellation-hypothesis paper App. C) of
      the **last** mini-batch: its log-probs before its optimizer step and after the step's last one (a
      no-grad pass in ``finish``);
    - ``first_grads`` (debug): the first optimizer step's gradients, after the cross-process reduction,
      before clipping.
    """

    def __init__(
        self,
        cfg: RunConfig,
        accelerator: Any,
        model: Any,
        batch: RolloutBatch,
        first_grads: dict[str, Tensor] | None,
        measure: bool = True,
    ) -> None:
        self.cfg, self.accelerator, self.model, self.batch = cfg, accelerator, model, batch
        self.first_grads, self.measure = first_grads, measure
        self.unwrapped = accelerator.unwrap_model(model)
        mask = batch.completion_mask
        keys = prefix_event_keys(batch.completion_ids, mask, batch.group)
        self.meter = CancellationMeter(keys, mask, batch.group)
        self.result = UpdateResult()
        self.last: tuple[RolloutBatch, Tensor] | None = (
            None  # (rows, log-probs before) of the last mini-batch
        )

    def _no_grad_pass(self, sub: RolloutBatch, **kw: Any) -> dict[str, Tensor]:
        """A pass over ``sub`` in eval mode, outside the update's graph (full parameters gathered)."""
        t = sub.completion_mask.shape[1]
        with torch.no_grad(), full_params(self.accelerator, self.model):
            was = self.unwrapped.training
            self.unwrapped.eval()
            out = completion_logprobs(
                self.unwrapped, sub.input_ids, sub.attention_mask, t, temperature=self.cfg.temperature,
                completion_mask=sub.completion_mask, chunk_tokens=self.cfg.logprob_chunk_tokens, **kw,
            )  # fmt: skip
            self.unwrapped.train(was)
        self.result.rows_scored += len(sub)
        return out

    def before_step(self, sub: RolloutBatch, co: Coefficients) -> None:
        """Energy by bucket of the first mini-batch, at the weights its coefficients were computed at."""
        size = len(sub) * sub.completion_mask.shape[1] * _vocab(self.unwrapped)
        if not self.measure or self.result.opt_steps > 0 or size > ENERGY_MAX_ELEMENTS:
            return
        if float(sub.completion_mask.sum()) == 0:
            return
        fwd = self._no_grad_pass(sub, with_hidden=True)
        shares = energy_by_bucket(
            co.coef.double(), fwd["probs"], sub.completion_ids, sub.completion_mask,
            hidden_norm=fwd["hidden_norm"], num_buckets=NUM_ENERGY_BUCKETS,
        )  # fmt: skip
        self.result.energy = dict(zip(ENERGY_KEYS, shares.tolist(), strict=True))

    def after_backward(self) -> None:
        if self.first_grads is not None and self.result.opt_steps == 0:
            for name, p in self.unwrapped.named_parameters():
                if p.requires_grad and p.grad is not None:
                    self.first_grads[name] = p.grad.detach().cpu().clone()

    def after_step(
        self, mb: MiniBatch, sub: RolloutBatch, logp: Tensor, co: Coefficients, grad_norm: float
    ) -> None:
        res = self.result
        self.meter.add(co.coef, mb.rows)
        if co.metrics:
            res.metrics = co.metrics
        res.grad_norm = grad_norm
        res.opt_steps += 1
        self.last = (sub, logp.detach())

    def finish(self) -> UpdateResult:
        res = self.result
        res.meter = self.meter.totals
        if self.measure and self.last is not None:
            sub, before = self.last
            after = self._no_grad_pass(sub)["logp"]
            # cancellation-hypothesis paper App. C eq. (16): the last mini-batch's log-probs before vs after its update
            res.flip = token_flip_stats(before, after, sub.advantages, sub.completion_mask)
        return res


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
            res.slots += slots
            res.tokens += real
    return diagnostics.finish()


def _vocab(model: Any) -> int:
    """The vocabulary size from the model's config (a sharded head's local rows are not the vocabulary:
    9056 for a 282-row head under FSDP1 on 2 ranks, 0 under ZeRO-3)."""
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return int(size) if size else int(model.get_output_embeddings().weight.shape[0])


# ------------------------------------------------------------------------------------------------
# evaluation


@torch.no_grad()
def form_logprobs(
    model: Any, tokenizer: Any, prompts: list[str], forms: list[tuple[str, ...]], temperature: float,
    batch_rows: int = FORM_BATCH_ROWS,
) -> list[list[float]]:  # fmt: skip
    """log π(form | prompt) of whole completions, teacher-forced: ``out[i][k]`` for ``forms[i][k]``.

    ``prompts`` are chat-formatted (``format_prompt``). Each row is the prompt's tokens (left-padded, as
    the rollouts) followed by the form's tokens and EOS (right-padded); log π is the sum over those
    completion tokens of ``completion_logprobs`` at ``temperature`` (the trainer's log-probs of
    logits / T), in eval mode (no dropout), ``batch_rows`` rows per forward pass.
    """
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos_token_id: a form's probability includes its EOS")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    device = next(model.parameters()).device
    rows: list[tuple[int, list[int], list[int]]] = []
    for i, (prompt, fs) in enumerate(zip(prompts, forms, strict=True)):
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        rows += [(i, p, tokenizer(f, add_special_tokens=False)["input_ids"] + [eos]) for f in fs]
    was_training = model.training
    model.eval()
    sums: list[float] = []
    for s in range(0, len(rows), batch_rows):
        chunk = rows[s : s + batch_rows]
        width_p, width_c = max(len(p) for _, p, _ in chunk), max(len(c) for _, _, c in chunk)
        ids, att = [], []
        for _, p, c in chunk:
            lp, rc = width_p - len(p), width_c - len(c)
            ids.append([pad] * lp + p + c + [pad] * rc)
            att.append([0] * lp + [1] * (len(p) + len(c)) + [0] * rc)
        ids_t = torch.tensor(ids, device=device)
        att_t = torch.tensor(att, device=device)
        logp = completion_logprobs(model, ids_t, att_t, width_c, temperature=temperature)["logp"]
        sums += (logp.double() * att_t[:, width_p:]).sum(1).tolist()
    if was_training:
        model.train()
    out: list[list[float]] = [[] for _ in prompts]
    for (i, _, _), v in zip(rows, sums, strict=True):
        out[i].append(v)
    return out


def form_stats(logps: list[float]) -> dict[str, float]:
    """The entropy (nats) of q_k ∝ π(form_k), the mass Σ_k π(form_k) and log π(form_0) − log π(form_1)."""
    lp = torch.tensor(logps, dtype=torch.float64)
    log_q = torch.log_softmax(lp, 0)
    return {
        "entropy": float(-(log_q.exp() * log_q).sum()),
        "mass": float(lp.exp().sum()),
        "logodds": float(lp[0] - lp[1]),
    }


def evaluate(
    cfg: RunConfig, accelerator: Any, model: Any, tokenizer: Any, tasks: list[Task]
) -> dict[str, float]:
    """Greedy accuracy and avg@k (mean reward of k samples) on this process's share of the held-out prompts.

    When some eval tasks carry ≥ 2 equally correct ``forms`` (``template_forms``), also ``FORM_KEYS``:
    exact (teacher-forced, no sampling) means over those prompts of the equivalent-solution entropy,
    the forms' total probability and the forms' log-odds (``form_logprobs`` at ``cfg.temperature``;
    ``micro_batch_size`` rows per forward pass when set, else ``FORM_BATCH_ROWS``).
    """
    mine = tasks[accelerator.process_index :: accelerator.num_processes]
    unwrapped = accelerator.unwrap_model(model)
    with_forms = any(len(t.forms) >= 2 for t in tasks)  # the whole list: every process decides alike
    local = {"greedy_correct": 0.0, "mean_sampled_reward": 0.0, "prompts": float(len(mine))}
    if with_forms:
        local.update(form_entropy=0.0, form_mass=0.0, form_logodds=0.0, form_prompts=0.0)
    if mine:
        prompts = [
            format_prompt(tokenizer, t.prompt, cfg.system_prompt, cfg.chat_template_kwargs) for t in mine
        ]
        answers = [t.answer for t in mine]
        backend = make_backend(cfg.rollout_backend, unwrapped, cfg.generation_batch_size)
        greedy = generate_texts(
            unwrapped, tokenizer, prompts, n=1, max_new_tokens=cfg.max_new_tokens, do_sample=False,
            backend=backend,
        )  # fmt: skip
        r_greedy, _ = compute_rewards(
            cfg.reward, prompts, greedy, answers, cfg.failure_reward,
            weights=cfg.reward_weights, columns=reward_columns(mine),
        )  # fmt: skip
        k = cfg.eval_k
        sampled = generate_texts(
            unwrapped, tokenizer, prompts, n=k, max_new_tokens=cfg.max_new_tokens,
            do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, backend=backend,
        )  # fmt: skip
        r_k, _ = compute_rewards(
            cfg.reward, [p for p in prompts for _ in range(k)], sampled, [a for a in answers for _ in range(k)],
            cfg.failure_reward, weights=cfg.reward_weights, columns=reward_columns([t for t in mine for _ in range(k)]),
        )  # fmt: skip
        local["greedy_correct"] = float(sum(r >= 1.0 for r in r_greedy))
        local["mean_sampled_reward"] = sum(r_k) / k  # summed over prompts: Σ_prompts mean of its k rewards
    multi = [t for t in mine if len(t.forms) >= 2]
    if multi:
        logps = form_logprobs(
            unwrapped, tokenizer,
            [format_prompt(tokenizer, t.prompt, cfg.system_prompt, cfg.chat_template_kwargs) for t in multi],
            [t.forms for t in multi], cfg.temperature, cfg.micro_batch_size or FORM_BATCH_ROWS,
        )  # fmt: skip
        for lp in logps:
            st = form_stats(lp)
            local["form_entropy"] += st["entropy"]
            local["form_mass"] += st["mass"]
            local["form_logodds"] += st["logodds"]
        local["form_prompts"] = float(len(multi))
    total = sum_over_processes(accelerator, local)
    n = max(total["prompts"], 1.0)
    out = {
        "eval/greedy_accuracy": total["greedy_correct"] / n,
        f"eval/avg@{cfg.eval_k}": total["mean_sampled_reward"] / n,
    }
    if with_forms:
        m = max(total["form_prompts"], 1.0)
        out.update({key: total[key.removeprefix("eval/")] / m for key in FORM_KEYS})
    return out


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
    watch_parent()  # under a launcher: this worker exits when the launcher is gone
    seed_all(cfg.seed)
    out_dir = Path(cfg.output_dir)
    started = time.perf_counter()

    # ---- everything a user can get wrong is checked before the run folder is created or touched
    check_model_source(cfg.model)
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


def run_summary(
    out_dir: Path,
    rows: list[dict[str, float]],
    start: int,
    seconds: float,
    history: list[dict[str, Any]] | None = None,
) -> str:
    """The one line a run ends with: folder, steps, final reward, last eval, steps without an update, time.

    ``rows`` are this call's new steps; ``history`` all of the run's rows (``metrics.jsonl``, steps before
    a resume included; default ``rows``): the reward is the mean of its last ``SUMMARY_STEPS`` steps, the
    number the Runs page shows, whether or not the run was resumed in between.
    """
    if not rows:
        return f"run {out_dir}: nothing to do (already at its last step), {seconds:.0f} s"
    reward, tail = last_steps_mean(history if history else rows)
    evals = [r for r in rows if "eval/greedy_accuracy" in r]
    last_eval = f"last eval greedy accuracy {evals[-1]['eval/greedy_accuracy']:.3f}" if evals else "no eval"
    cut = sum(r.get("truncation/no_update", 0.0) == 1.0 for r in rows)
    no_update = (
        f", {cut} step{'s' if cut != 1 else ''} with every completion truncated (no update)" if cut else ""
    )
    steps = f"{len(rows)} new step{'s' if len(rows) != 1 else ''} up to step {len(rows) + start}"
    return (
        f"run {out_dir}: {steps}, reward {reward:.3f} (mean of the last {tail} step{'s' if tail != 1 else ''}), "
        f"{last_eval}{no_update}, {seconds:.0f} s"
    )


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
    deepspeed_micro_batch(accelerator)
    # the scheduler is not prepared: an accelerate-prepared scheduler steps once per process
    model, optimizer = accelerator.prepare(model, optimizer)
    train_tasks, eval_tasks, formatted = data.train, data.eval, data.formatted
    buffer = None if cfg.reward_balanced_rho is None else make_buffer(cfg, tokenizer.pad_token_id)

    # ---- resume
    start = 0
    if cfg.resume:
        ckpt = latest_checkpoint(out_dir)
        if ckpt is not None:
            check_resume_config(checkpoint_config(ckpt), cfg, ckpt)
            start, buffered, _ = load_checkpoint(accelerator, model, optimizer, scheduler, ckpt)
            if buffer is not None and buffered is not None:
                buffer.push(buffered, buffered.advantages, buffered.group)
            accelerator.print(f"resumed from {ckpt} (step {start})")
        else:
            accelerator.print(f"--resume: no checkpoint in {out_dir}/checkpoints, starting from step 0")
    if accelerator.is_main_process:
        out_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out_dir / "config.yaml")
    logger = RunLogger(out_dir, cfg.steps, enabled=accelerator.is_main_process, resume_step=start)
    unwrapped = accelerator.unwrap_model(model)
    ref_ctx = unwrapped.disable_adapter if cfg.beta > 0 else None
    backend = make_backend(cfg.rollout_backend, unwrapped, cfg.generation_batch_size)
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
                roll = _replay_stats(batch)
            else:
                mine = step_prompts(train_tasks, step, cfg.prompts_per_step, rank, world, cfg.seed)
                with full_params(accelerator, model):
                    batch, roll = generate_rollouts(
                        unwrapped, tokenizer, [formatted[id(t)] for _, t in mine], [t.answer for _, t in mine],
                        [k for k, _ in mine], num_generations=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
                        temperature=cfg.temperature, top_p=cfg.top_p, ref_model_ctx=ref_ctx,
                        chunk_tokens=cfg.logprob_chunk_tokens, backend=backend,
                    )  # fmt: skip
            t_gen = time.perf_counter() - t0

            # ---- 2. rewards, truncation, group-relative advantages (DFPO eq. 43) over the rows in the loss
            failures = 0
            fdtype = torch.promote_types(batch.old_logp.dtype, torch.float32)
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
            row.update(_score_stats(totals))
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


def truncation_warning(cfg: RunConfig, step: int) -> str:
    """What the run prints (once) at the first step whose every completion was truncated and masked."""
    return (
        f"WARNING step {step}: every completion reached max_new_tokens={cfg.max_new_tokens} without an end "
        f"token and `truncation: {cfg.truncation}` masked them all: this step trains on nothing. Raise "
        "`max_new_tokens` (a thinking model needs thousands of tokens), or turn thinking off "
        "(`chat_template_kwargs: {enable_thinking: false}` for Qwen3), or set `truncation: failure_reward` "
        "so that truncated completions are punished instead of dropped."
    )


def measure_step(cfg: RunConfig, step: int) -> bool:
    """Whether step ``step`` runs the energy and token-flip diagnostics (``flip_every``; None: ``eval_every``)."""
    every = cfg.eval_every if cfg.flip_every is None else cfg.flip_every
    return every > 0 and (step % every == 0 or step == cfg.steps)


def _score_stats(totals: dict[str, float]) -> dict[str, float]:
    """``score/*`` of a step from its summed counts: rows scored (all passes), per completion, padding."""
    return {
        "score/rows": totals["rows_scored"],
        "score/rows_per_completion": totals["rows_scored"] / max(totals["rows"], 1.0),
        "score/padding_frac": 1.0 - totals["tokens"] / totals["slots"] if totals["slots"] > 0 else math.nan,
    }


def replay_file(replay_dir: Path, rank: int, step: int) -> Path | None:
    """The batch this process replays at ``step``: its own rank's file first, then the shared one."""
    name = f"step_{step:06d}_rollouts.pt"
    for path in (replay_dir / f"rank{rank}" / name, replay_dir / name):
        if path.is_file():
            return path
    return None


def _replay_stats(batch: RolloutBatch) -> dict[str, float]:
    """The rollout diagnostics of a replayed batch (no sampler: ``entropy`` is NaN)."""
    lengths = batch.attention_mask[:, batch.prompt_len :].float().sum(1)
    return {
        "entropy": math.nan,
        "completion_length": float(lengths.mean()),
        "truncated_frac": float(batch.truncated.float().mean()),
        "tokens_generated": float(lengths.sum()),
    }


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


#: The command line's options outside ``RunConfig`` (``main`` takes them out first), as ``--help`` lists them.
CLI_OPTIONS = {
    "--config": (
        "PATH.yaml",
        "A YAML file of RunConfig fields (scaledrun/configs/default.yaml); the --field options override it.",
    ),
    "--import": (
        "MODULE",
        "Import this module first (repeatable), e.g. one that registers a reward with "
        "@scaledrun.rewards.register_reward('my_fn') for --reward my_fn. Its folder must be on the Python "
        "path (the working directory is); for a file anywhere use --reward_file PATH.py:FUNCTION.",
    ),
    "--debug_dir": ("DIR", "Debug: each process writes its step batches, gradients and weights under DIR."),
    "--replay_dir": ("DIR", "Debug: a step with a saved batch under DIR trains on it instead of sampling."),
}


def print_help() -> None:
    """``--help``: the options outside the config, then every ``RunConfig`` field with its docstring."""
    import argparse

    from .config import make_parser

    parser = make_parser()
    parser.prog = "python -m scaledrun.train"
    group = parser.add_argument_group("options outside the config")
    for name, (metavar, text) in CLI_OPTIONS.items():
        group.add_argument(name, metavar=metavar, help=text, default=argparse.SUPPRESS)
    parser.print_help()


def import_modules(modules: list[str]) -> None:
    """``--import`` each module; one that cannot be imported is a ``ValueError`` naming it and the path."""
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name is None or not (module == err.name or module.startswith(err.name + ".")):
                raise ValueError(
                    f"--import {module}: it imports {err.name!r}, which is not installed"
                ) from err
            raise ValueError(
                f"--import {module}: no module {err.name!r} on the Python path (the working directory "
                f"{Path.cwd()} and the installed packages); run from the folder that holds {module.split('.')[0]}.py, "
                "add its folder to PYTHONPATH, or pass --reward_file PATH.py:FUNCTION for a reward in a file"
            ) from err
        except Exception as err:  # a module that fails while it runs: say which one
            raise ValueError(f"--import {module} failed: {type(err).__name__}: {err}") from err


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
        import_modules(_pop_option(argv, "--import"))
    except ValueError as err:
        _usage_error(err)
    debug = _pop_option(argv, "--debug_dir")
    replay = _pop_option(argv, "--replay_dir")
    paths = _pop_option(argv, "--config")
    try:
        if len(paths) > 1:
            raise ValueError("command line: give --config once")
        path = paths[0] if paths else None
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(f"config file {path} does not exist")
        cfg = load_config(path, argv)
    except (ValueError, FileNotFoundError) as err:  # every load_config error names what to fix
        _usage_error(err)
    try:
        return train(cfg, debug_dir=debug[-1] if debug else None, replay_dir=replay[-1] if replay else None)
    except (RunFolderError, FileNotFoundError, DataError) as err:  # the folder, the model, the data
        _usage_error(err)


def _usage_error(err: Exception) -> NoReturn:
    """A mistake in the command, the config or a folder: print the message (no traceback), exit 2."""
    print(f"error: {err}", file=sys.stderr)
    raise SystemExit(2) from None


if __name__ == "__main__":
    main()
