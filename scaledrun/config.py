"""The run configuration: one documented dataclass, YAML files that map 1:1 to it, CLI overrides.

Resolution order (later wins): the dataclass defaults (the tiny CPU run), the YAML file, the preset
named on the command line, the other command-line options (a preset named only in the YAML file sits
under that file's keys). ``preset`` is itself a field; see ``load_config``.

    cfg = load_config("scaledrun/configs/default.yaml", ["--objective", "dfpo", "--transform", "orth_proj"])

The command line is parsed by transformers' ``HfArgumentParser`` (``--help`` shows each field's
docstring). Every invalid value raises ``ValueError`` naming the field (``validate``).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import json
import math
import textwrap
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from cancellation.advantages import SCALES
from cancellation.aggregation import aggregation_names
from cancellation.batching import SPLIT_MODES
from cancellation.objectives import objective_names, params_class
from cancellation.params import strict_bool

from .rewards import (
    HOW_TO_REGISTER,
    absolute_reward_file,
    check_weights,
    load_reward_file,
    parse_reward_names,
    reward_names,
)
from .tasks import RESERVED_TEMPLATE_KWARGS, source_problems

DTYPES = ("float32", "bfloat16", "float64")
#: Valid ``truncation`` values (see the field's docstring).
TRUNCATIONS = ("mask", "failure_reward", "keep")
#: Valid ``attn_implementation`` values (transformers' names; None is transformers' default).
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3")
#: ``reward``'s default: ``reward_file`` replaces it (any other value must name the file's function).
DEFAULT_REWARD = "exact_match"
#: String fields that may be given as a list (YAML, Python): the names are joined with commas.
COMMA_JOINED = ("reward",)
#: Fields that no longer exist, and what replaced them (an old YAML key or CLI option names the new field).
RENAMED = {
    "mask_truncated": "`mask_truncated` was replaced by `truncation`: `truncation: mask` (the old "
    "`mask_truncated: true`, now also out of the advantages), `failure_reward` or `keep` (the old false)",
}
#: The ``ObjectiveConfig`` fields that carry an objective's own parameters (each the field of the same name of
#: the objective's dataclass, ``cancellation.objectives.params_class``), and each one's "not set" value: None,
#: the objective's default; the two booleans default to the value every objective that takes them defaults to
#: (``tests/test_objective_params.py``). ``beta`` and ``norm_constant`` go to every objective.
OBJECTIVE_FIELDS: dict[str, Any] = {
    "epsilon_low": None,
    "epsilon_high": None,
    "epsilon": None,
    "length_norm": params_class("dfpo").length_norm,  # type: ignore[union-attr]
    "transform": None,
    "estimator": None,
    "stop_grad": params_class("dfpo").stop_grad,  # type: ignore[union-attr]
}
_COMMON_PARAMS = ("beta", "norm_constant")


def objective_takes(objective: str) -> tuple[str, ...]:
    """The parameter fields objective ``objective`` takes (its dataclass's fields; () if it has none)."""
    cls = params_class(objective)
    return () if cls is None else tuple(f.name for f in dataclasses.fields(cls))


@dataclass
class ObjectiveConfig:
    """The objective's fields (all losses are ``cancellation.compute_loss`` calls), declared once.

    ``RunConfig`` (this trainer) and ``scaledrun.trl_plugin.CancellationGRPOConfig`` (TRL's
    ``GRPOTrainer``) both inherit them: the same names, defaults, docstrings and checks
    (``validate_objective``). In ``CancellationGRPOConfig`` two of them replace GRPOConfig fields of the
    same name: ``epsilon`` (TRL: the lower clip; here grpo_symclip's symmetric ε, the lower clip being
    ``epsilon_low``) and ``epsilon_high`` (the same meaning, but None: the objective's default); ``beta``
    means the same in both (the k3 KL coefficient). docs/plugins.md lists the mapping.
    """

    objective: str = "grpo"
    """Objective name in ``cancellation.OBJECTIVES``: ``grpo``, ``grpo_symclip`` (GRPO-fix, DFPO App. H),
    ``gspo``, ``dfpo``."""
    epsilon_low: float | None = None
    """Lower clip ε_low (grpo, gspo, dfpo). None: the objective's default (0.2 for grpo, GSPO's 3e-4)."""
    epsilon_high: float | None = None
    """Upper clip ε_high (grpo, gspo, dfpo). None: the objective's default (0.2 for grpo, GSPO's 4e-4)."""
    epsilon: float | None = None
    """Symmetric clip ε of grpo_symclip (DFPO App. H eq. 79). None: its default 0.2."""
    length_norm: bool = OBJECTIVE_FIELDS["length_norm"]
    """gspo/dfpo: length-normalised sequence ratio s = exp(mean_t log r) (GSPO, DFPO eq. 44)."""
    transform: str | None = None
    """dfpo's group transform (``cancellation.TRANSFORMS``: min_replace, orth_proj, orth_proj_pos,
    truncate_rebalance; DFPO App. B). None: dfpo's default min_replace."""
    estimator: str | None = None
    """gspo/dfpo: how the gradient is taken. ``paper``: DFPO's stop-gradient estimator (eq. 16, 59–62,
    68, 85–86, 91): every trajectory, clipped or not, gets a constant weight times Â_i on ∇log s_i (dfpo:
    s̃_i = T(s̄_i); gspo: s̄_i, eq. 86, the control arm that tells the transform's effect from the
    estimator's); no trust region beyond the weight's value (like CISPO). ``ppo_clip``: the clipped
    surrogate min(s·Â, clip(s)·Â) of eq. 42 (GSPO's own objective; for dfpo a trust-region variant that
    is not in the paper: a clipped sequence gets no gradient). None: the objective's default (gspo:
    ``ppo_clip``, dfpo: ``paper``)."""
    stop_grad: bool = OBJECTIVE_FIELDS["stop_grad"]
    """dfpo: treat the transformed weights as constants in backprop (DFPO App. C/D); False is Table 3's
    ablation (differentiates through the transform and s̄; ``estimator`` does not apply then)."""
    beta: float = 0.0
    """KL coefficient to the reference policy (k3 estimator). 0: no KL term, as in the setups this
    project follows: DFPO's objectives (GSPO's eq. 42 and its transforms) carry none and its App. I
    lists no KL coefficient (App. I's β = 0 is an entropy-regularisation coefficient, which this trainer
    does not implement); DAPO and the cancellation-hypothesis paper (App. B) remove the KL term."""
    aggregation: str | None = None
    """Loss aggregation (``token-mean``, ``seq-mean-token-mean``, ``seq-mean-token-sum``,
    ``seq-mean-token-sum-norm``). None: the objective's own default."""
    norm_constant: float | None = None
    """The constant of ``seq-mean-token-sum-norm`` (Dr. GRPO); None: the aggregation's default."""
    adv_scale: str = "group"
    """Advantage scaling (``cancellation.group_advantages``): group std (GRPO, DFPO eq. 43), batch std, or none."""
    ar_alpha: float | None = None
    """Advantage Reweighting α in [0, 1] (Lopti paper: 0.2 alone, 0.3 with Lopti). None: off."""
    lopti_eta: float | None = None
    """Lopti's probability threshold η in (0, 1] (Lopti paper: 0.4 alone, 0.5 with AR). None: off."""

    def __post_init__(self) -> None:
        self.validate_objective()

    def validate_objective(self) -> None:
        """Raise ``ValueError`` naming the field of the first invalid objective value."""
        for f in dataclasses.fields(ObjectiveConfig):
            setattr(self, f.name, _coerce(f.name, getattr(self, f.name)))

        def bad(name: str, why: str) -> None:
            raise ValueError(f"config field `{name}`={getattr(self, name)!r}: {why}")

        def choice(name: str, valid: list[str] | tuple[str, ...]) -> None:
            if getattr(self, name) not in valid:
                bad(name, f"unknown value; valid: {', '.join(valid)}")

        choice("objective", objective_names())
        # a parameter set for an objective that does not take it is a mistake, not something to ignore (also
        # for an objective registered without a parameter class: it takes none of them)
        takes = objective_takes(self.objective)
        for name, unset in OBJECTIVE_FIELDS.items():
            if name not in takes and getattr(self, name) != unset:
                bad(
                    name,
                    f"objective {self.objective!r} does not take it (it takes: {', '.join(takes) or 'none'})",
                )
        self.objective_param_values()  # the ranges and choices: the objective's dataclass checks them
        if self.aggregation is not None:
            choice("aggregation", aggregation_names())
        if self.beta < 0:
            bad("beta", "must be ≥ 0")
        if self.norm_constant is not None and not self.norm_constant > 0:
            bad("norm_constant", "must be > 0")
        if self.objective == "dfpo" and not self.stop_grad and self.estimator is not None:
            bad(
                "estimator",
                "dfpo with stop_grad=false differentiates through the transform; no estimator applies",
            )
        if (
            self.objective == "gspo"
            and self.estimator == "paper"
            and (self.ar_alpha is not None or self.lopti_eta is not None)
        ):
            bad(
                "estimator",
                "gspo's paper estimator needs one advantage per completion, but Advantage Reweighting and "
                "Lopti make them per token; use estimator ppo_clip with them",
            )
        choice("adv_scale", SCALES)
        if self.ar_alpha is not None and not 0 <= self.ar_alpha <= 1:
            bad("ar_alpha", "must be in [0, 1]")
        if self.lopti_eta is not None and not 0 < self.lopti_eta <= 1:
            bad("lopti_eta", "must be in (0, 1]")
        if self.objective == "dfpo" and (self.ar_alpha is not None or self.lopti_eta is not None):
            bad(
                "ar_alpha" if self.ar_alpha is not None else "lopti_eta",
                "dfpo's group transforms need one advantage per completion, but Advantage Reweighting and "
                "Lopti make them per token; use them with grpo, grpo_symclip or gspo",
            )

    def objective_param_values(self) -> Any:
        """The objective's parameters in effect: its dataclass (``cancellation.params``) with the fields set
        here and its defaults for the others (None for an objective registered without parameters)."""
        cls = params_class(self.objective)
        if cls is None:
            return None
        return cls(
            **{n: getattr(self, n) for n in objective_takes(self.objective) if getattr(self, n) is not None}
        )

    def objective_params(self) -> dict[str, Any]:
        """The keyword parameters of ``cancellation.compute_loss`` for this objective (unset ones left out)."""
        names = objective_takes(self.objective) + _COMMON_PARAMS
        params = {n: getattr(self, n) for n in names if getattr(self, n) is not None}
        if params.get("beta") == 0.0:
            del params["beta"]
        return params


@dataclass
class _RunSetup:
    """``RunConfig``'s fields before the objective (model, data, reward, rollouts): a class of its own only so
    that ``RunConfig``'s field order (YAML files, saved configs, ``--help``) stays what it was when every field
    was declared in ``RunConfig`` itself: model → data → reward → rollouts → objective → update → output."""

    # ---- model
    model: str = "artifacts/tiny-qwen3"
    """Local folder or hub name given to ``from_pretrained``. Default: the folder that
    ``python -m scaledrun.tiny --out artifacts/tiny-qwen3`` writes."""
    dtype: str = "float32"
    """Parameter dtype, ``float32``, ``bfloat16`` or ``float64``. float32 on CPU; the paper-scale presets use
    bfloat16; float64 is for exactness checks on CPU (two code paths that must compute the same numbers,
    compared at 1e-9 of their magnitude whatever the CPU's summation order: ``tests/exactness.py``)."""
    lora_rank: int = 8
    """LoRA rank r (PEFT ``LoraConfig.r``). 8: a common small-model default (PEFT's own default)."""
    lora_alpha: float = 16.0
    """LoRA scaling α (the update is scaled by α/r). 16 = 2r, the usual choice."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA input (PEFT ``lora_dropout``). The trainer runs every policy-gradient pass
    (old, reference and current log-probs) with dropout off, so that the on-policy ratio is exactly 1:
    a value > 0 changes nothing in training (it is kept so a saved adapter config says what it says).
    0, PEFT's default."""
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names LoRA wraps. Default: every linear layer of a Qwen block (attention and MLP)."""
    full_finetune: bool = False
    """Train all weights instead of LoRA adapters (the DFPO paper's runs are full fine-tuning)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory (off for the tiny model)."""

    # ---- data
    task: str = "arithmetic"
    """A synthetic task (``arithmetic``, ``arithmetic_words``, ``template``, ``template_forms``) or a dataset:
    a ``.jsonl``/``.json``/``.parquet`` file (``{split}`` in the path reads one file per split name), a local
    folder written by ``save_to_disk`` (a Dataset or a DatasetDict) or of data files, or a hub dataset
    ``owner/name`` (the only case that downloads; ``scaledrun.tasks``). Default: 2-digit addition."""
    dataset_config: str | None = None
    """A hub dataset's configuration (``datasets.load_dataset``'s ``name``, e.g. ``main`` for
    ``openai/gsm8k``). None: the dataset's default."""
    train_split: str = "train"
    """The split the training prompts come from: a split name of a DatasetDict or hub dataset
    (``train[:1000]`` works on the hub), or what fills ``{split}`` in a file path. A single file or a
    saved single Dataset is one split: leave it at ``train``."""
    eval_split: str | None = None
    """Where the held-out prompts come from: a split name of the dataset (``test``), or the path of a
    ``.jsonl``/``.json``/``.parquet`` file. None (and no ``eval_fraction``): a dataset has no eval (the
    run says so; nothing is held out silently). Synthetic tasks have their own held-out split: leave it unset."""
    eval_fraction: float | None = None
    """Instead of ``eval_split``: hold out the train split's rows whose prompt hashes below this fraction
    (crc32, ``tasks.held_out``: about that share, the same rows for every seed, duplicates of a prompt
    on one side); training then leaves them out. None: off."""
    prompt_field: str = "prompt"
    """The prompt column of a dataset, dotted for a nested one. Its cells are strings (one user message)
    or lists of ``{"role", "content"}`` messages, given to the chat template as they are."""
    answer_field: str = "answer"
    """The gold-answer column of a dataset, dotted for a nested one (``reward_model.ground_truth`` in
    verl's parquet files). The other columns reach the reward functions as keyword arguments."""
    max_prompt_length: int | None = None
    """Drop the prompts longer than this many tokens once chat-formatted (train and eval; the count
    dropped is printed), as verl's ``filter_overlong_prompts``. None: keep every prompt."""
    system_prompt: str | None = None
    """A system message put before every prompt by the chat template. None: none (a prompt with its own
    system message and a ``system_prompt`` is an error)."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Extra variables of the chat template (``apply_chat_template``'s keyword arguments), e.g. Qwen3's
    ``{enable_thinking: false}``; a YAML mapping, a JSON object on the command line
    (``--chat_template_kwargs '{"enable_thinking": false}'``). None: the template's defaults."""
    digits: int = 2
    """Operand digits of the synthetic tasks. 2: the tiny model reaches a non-zero success rate after its warm start."""
    ops: str = "+"
    """Operators of the synthetic tasks, a string of ``+`` and ``-``. Default: addition only (tiny run)."""
    seed: int = 0
    """Seed of the task draw, the sampling and the LoRA init."""
    num_train: int | None = None
    """Training prompts, a seeded sample of the train split (more than the split has is an error). None
    (``--num_train none``): every row of a dataset (after ``max_prompt_length``), and 64 problems of a
    synthetic task, the tiny run's: each prompt comes back every few steps, so 200 steps on CPU show the
    reward rising (with 2000 the tiny model's gain is within the noise)."""
    num_eval: int = 100
    """Held-out prompts for evaluation (disjoint from the train split); a dataset's eval split with fewer
    rows gives them all (the run says so)."""

    # ---- reward
    reward: str = DEFAULT_REWARD
    """Reward function name(s) (``scaledrun.rewards.REWARDS``): ``exact_match`` for the synthetic tasks,
    ``math_verify`` for ``\\boxed{}`` math answers, ``answer_line`` for an ``Answer: N`` line (DAPO-Math). Several: comma-separated (``math_verify,my_format``; a
    YAML list is joined so); the reward is their ``reward_weights``-weighted sum (TRL's ``reward_funcs``).
    Your own: a module registering it (``--import my_module``, ``@register_reward``), or ``reward_file``."""
    reward_file: str | None = None
    """``PATH.py:FUNCTION``: a reward function of your own in a file (verl's ``custom_reward_function``
    ``path`` / ``name``), imported when the config loads and registered under its name (FUNCTION); the
    config keeps the path absolute, so a resume from another folder uses the same file. It is
    the run's reward when ``reward`` is left at ``exact_match``; to combine it with others, name it in
    ``reward`` (``--reward math_verify,FUNCTION --reward_weights 1.0 0.2``). None: none."""
    reward_weights: list[float] | None = None
    """One weight per name in ``reward`` (TRL's ``reward_weights``); the logged reward is Σ_k w_k·r_k.
    None: 1.0 each. On the command line ``--reward_weights 1.0 0.2``."""
    failure_reward: float = 0.0
    """Reward given to a sample whose reward function raised (counted in the logs, the run goes on); with
    several rewards, that function's term of the sum."""

    # ---- rollouts
    group_size: int = 8
    """Completions per prompt, G. 8 for the tiny run; the DFPO paper samples 32 (App. I)."""
    prompts_per_step: int = 4
    """Prompts (groups) per training step and process."""
    max_new_tokens: int = 16
    """Completion length limit. 16 covers the arithmetic answers; the template task needs ~48 and
    ``template_forms`` 40 (its longest 2-digit form is 35 tokens + EOS with the tiny tokenizer)."""
    temperature: float = 1.0
    """Sampling temperature T of the rollouts. The old, reference and current log-probs and the entropy
    are computed from logits / T, i.e. of the policy that sampled (as TRL and verl do). 1.0: π_θ itself."""
    top_p: float = 1.0
    """Nucleus sampling threshold of the rollouts (1.0: off). Like TRL and verl, the log-probs ignore
    the top-p truncation (π_old is logits / T renormalised over the whole vocabulary)."""
    truncation: str = "mask"
    """Completions that hit ``max_new_tokens`` without EOS. ``mask`` (DAPO's overlong filtering): they
    leave the loss *and* their group's advantages (mean, std and, under dfpo, the transform), so Σ Â = 0
    over the rows that are trained on and shared tokens still cancel; a group left with fewer than 2
    rows contributes nothing (logged as ``truncation/dropped_groups``); a step whose every completion
    is truncated takes no update (``truncation/no_update`` = 1, counted in the run's last line; the
    progress bar says "all completions truncated, no update"). ``failure_reward`` (DAPO's
    overlong punishment, in its simplest form): they get ``failure_reward`` as their reward and stay in
    the loss. ``keep``: no special handling."""


@dataclass
class RunConfig(ObjectiveConfig, _RunSetup):
    """One scaled run. Defaults: the tiny CPU run on the locally built tiny Qwen3 (``scaledrun.tiny``)."""

    # ---- batching and update
    batching: str = "query"
    """Mini-batch split: ``query`` keeps each group whole (cancellation-hypothesis paper Sec. 4), ``random``
    is the common baseline."""
    num_minibatches: int = 1
    """Optimizer steps per inner epoch; the step's completions are split into this many mini-batches."""
    inner_epochs: int = 1
    """Passes over the step's completions (PPO epochs); > 1 moves the ratios away from 1 so clipping acts."""
    reward_balanced_rho: float | None = None
    """Reward-balanced batching ρ in (0, 0.5] (cancellation-hypothesis paper Sec. 4): update only on groups
    with ≥ ρ of each advantage sign. None: off."""
    micro_batch_size: int | None = 0
    """Gradient accumulation: completions (rows) per forward/backward pass within a mini-batch, in order;
    0 or None: the whole mini-batch in one pass. Every micro-batch is normalised by the whole
    mini-batch's global token/sequence count, so the accumulated gradient (one optimizer step per
    mini-batch) equals the one-pass gradient; only peak memory changes."""
    max_tokens_per_micro_batch: int | None = None
    """Token budget of one forward/backward pass (prompt + completion tokens of its rows, each row
    counted at its own length; None: off). Rows are sorted by length and packed whole groups first
    (a group larger than the budget is split), each micro-batch is trimmed to its own widest row, and
    every process runs the same number of micro-batches. Exact as ``micro_batch_size`` (the mini-batch's
    coefficients are computed first), so only memory and speed change. Set at most one of the two."""
    logprob_chunk_tokens: int = 128
    """Completion tokens per chunk of the LM head in every scoring pass (old, reference, loss, flips,
    eval): log-probs by logsumexp over the vocabulary, chunk by chunk, recomputed in the backward pass
    (``scaledrun.scoring``). Peak extra memory ≈ a few × chunk × vocabulary × 4 bytes, whatever the
    batch; a larger chunk is faster on a GPU. Exact: the values do not depend on it."""
    padding_free: bool = False
    """Padding-free scoring passes (old, reference and loss): the rows of a pass, padding removed, are
    packed into one sequence whose ``position_ids`` restart at 0 for each row, so that transformers builds
    the packed-sequence (block-diagonal causal) attention mask under ``eager`` / ``sdpa`` and runs
    flash-attention's variable-length kernel under ``flash_attention_2``. The log-probs are those of the
    padded pass (tests/scaledrun/test_padding_free.py); ``max_tokens_per_micro_batch`` then counts real
    tokens instead of padded slots. Off: each pass is a padded (rows, width) batch."""
    attn_implementation: str | None = None
    """The attention kernel the model is loaded with (``from_pretrained(attn_implementation=...)``):
    ``eager``, ``sdpa``, ``flash_attention_2`` (needs the ``flash-attn`` package and a GPU) or
    ``flash_attention_3``; None: transformers' default (``sdpa`` where torch has it)."""
    flip_every: int | None = None
    """Token-flip diagnostics (``flip/*``, one extra no-grad pass over the last mini-batch) every this
    many steps; None: on the eval cadence (``eval_every``); 0: never. Other steps log them as NaN."""
    generation_batch_size: int | None = None
    """Rows (prompt × completion) per ``generate`` call, for rollouts and evaluation (None: all of a
    step's rows at once). Bounds the KV cache at scale; changes which random numbers each row draws,
    not the sampling distribution."""
    rollout_backend: str = "hf"
    """Where rollouts are sampled (``scaledrun.backends.BACKENDS``): ``hf``, transformers' ``generate``
    on the training model; ``paged``, transformers' continuous batching (``generate_batch``: a paged KV
    cache, the G samples of a prompt forked from its prefix) on the same model. The trainer always
    recomputes the old log-probs itself, so the ratio is exact whatever the backend."""
    rollout_merge: bool = False
    """Merge the LoRA adapter into the base weights for each generation call (about half the kernel
    launches of a decode step), then restore the base bit-exactly (the saved base tensors copied back,
    no unmerge arithmetic; one copy of the adapted weights meanwhile). Needs an adapter: refused with
    ``full_finetune``."""
    generation_cache: str = "dynamic"
    """The ``hf`` backend's KV cache: ``dynamic`` (grows per token) or ``static`` (transformers' static
    cache of prompt + ``max_new_tokens`` tokens rounded up to 64, every call padded with dummy rows to
    ``generation_batch_size`` rows, so the shapes repeat and a compiled decode compiles once)."""
    compile_decode: bool = False
    """Compile the static cache's decode step (transformers' ``CompileConfig``, CUDA graphs). Needs
    ``generation_cache`` static and a CUDA/XPU device: refused on CPU, where transformers would not
    compile it."""

    # ---- optimizer and schedule
    lr: float = 1e-3
    """AdamW learning rate. 1e-3 for LoRA on the tiny model (1e-4 barely moves it in 200 steps, 1e-2
    collapses it); the DFPO paper uses 8e-7 (full FT, 32B; App. I)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float | None = 1.0
    """Max global gradient norm (None: no clipping). 1.0, as TRL and verl."""
    warmup_ratio: float = 0.03
    """Fraction of the steps with linear LR warm-up. 3%, the DFPO paper's App. I."""
    min_lr_ratio: float = 0.2
    """Cosine decay ends at this fraction of ``lr``. 0.2, the DFPO paper's App. I."""
    steps: int = 200
    """Training steps (each: rollouts for ``prompts_per_step`` prompts, then the update)."""

    # ---- evaluation, output
    eval_every: int = 20
    """Evaluate every this many steps (and at the end); 0: never."""
    eval_k: int = 4
    """Samples per eval prompt for avg@k (greedy accuracy is measured too)."""
    output_dir: str = "runs/tiny"
    """Run folder: metrics (JSON lines, TensorBoard), the resolved config, checkpoints."""
    save_every: int = 50
    """Checkpoint every this many steps (and at the end); 0: only at the end."""
    save_total_limit: int | None = None
    """Keep only the newest this many checkpoints in ``output_dir`` (None: keep all)."""
    resume: bool = False
    """Continue from the latest checkpoint in ``output_dir`` (refused if that checkpoint's run had another
    value in a field that changes the math; ``scaledrun.rundir.RESUME_MAY_DIFFER`` lists those that may differ)."""
    overwrite: bool = False
    """Delete the run already in ``output_dir`` (its metrics, TensorBoard logs, config and checkpoints) and
    start again. Without it (or ``resume``) a folder that holds a run is refused, so nothing is lost."""
    preset: str | None = None
    """A ``PRESETS`` name (None: the defaults above). Named on the command line, it overrides the YAML
    file's values (``--config default.yaml --preset qwen3-0.6b`` runs the preset's model and lr) and only
    the other command-line options override it; named in a YAML file, it sits under that file's own
    keys. See ``load_config``."""

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ``ValueError`` naming the field of the first invalid value."""
        _check_types(self)

        def bad(name: str, why: str) -> None:
            raise ValueError(f"config field `{name}`={getattr(self, name)!r}: {why}")

        if self.resume and self.overwrite:
            bad("overwrite", "cannot be combined with `resume` true: continue the run, or replace it")

        def choice(name: str, valid: list[str] | tuple[str, ...]) -> None:
            if getattr(self, name) not in valid:
                bad(name, f"unknown value; valid: {', '.join(valid)}")

        choice("dtype", DTYPES)
        if self.preset is not None:
            choice("preset", list(PRESETS))
        if self.lora_rank < 1:
            bad("lora_rank", "must be ≥ 1")
        if self.lora_alpha <= 0:
            bad("lora_alpha", "must be > 0")
        if not 0 <= self.lora_dropout < 1:
            bad("lora_dropout", "must be in [0, 1)")
        if not self.lora_target_modules:
            bad("lora_target_modules", "must name at least one module")
        if self.eval_fraction is not None and not 0 < self.eval_fraction < 1:
            bad("eval_fraction", "must be in (0, 1) (or None: off)")
        for name, why in source_problems(
            self.task, self.train_split, self.eval_split, self.eval_fraction, self.dataset_config
        ):
            bad(name, why)
        for name in ("prompt_field", "answer_field"):
            if not all(getattr(self, name).split(".")):
                bad(name, "must be a column name, dotted for a nested one (e.g. reward_model.ground_truth)")
        if self.max_prompt_length is not None and self.max_prompt_length < 1:
            bad("max_prompt_length", "must be ≥ 1 (or None: keep every prompt)")
        if self.chat_template_kwargs is not None:
            reserved = [k for k in RESERVED_TEMPLATE_KWARGS if k in self.chat_template_kwargs]
            if reserved:
                bad("chat_template_kwargs", f"may not set {', '.join(reserved)}: the trainer sets them")
        if self.digits < 1:
            bad("digits", "must be ≥ 1")
        if not self.ops or set(self.ops) - {"+", "-"}:
            bad("ops", "must be a non-empty string of '+' and '-'")
        if self.num_train is not None and self.num_train < 1:
            bad("num_train", "must be ≥ 1 (or None: every row of a dataset)")
        if self.num_eval < 0:
            bad("num_eval", "must be ≥ 0")
        if self.reward_file is not None:
            try:
                own = load_reward_file(self.reward_file)
            except ValueError as err:
                bad("reward_file", str(err))
            # saved absolute: a resume from another folder trains with the same file, not one of that name there
            self.reward_file = absolute_reward_file(self.reward_file)
            if own not in [n.strip() for n in self.reward.split(",")]:
                if self.reward != DEFAULT_REWARD:
                    bad(
                        "reward",
                        f"does not name `reward_file`'s function {own!r}: add it ({self.reward},{own})",
                    )
                self.reward = own
        try:
            names = parse_reward_names(self.reward)
        except ValueError:
            bad(
                "reward",
                f"unknown value; valid (one, or several separated by commas): {', '.join(reward_names())}; "
                + HOW_TO_REGISTER,
            )
        try:
            check_weights(names, self.reward_weights)
        except ValueError as err:
            bad("reward_weights", str(err))
        if not math.isfinite(self.failure_reward):
            bad("failure_reward", "must be a finite number")
        if self.group_size < 2:
            bad("group_size", "must be ≥ 2 (a group of one has no group-relative advantage)")
        if self.prompts_per_step < 1:
            bad("prompts_per_step", "must be ≥ 1")
        if self.max_new_tokens < 1:
            bad("max_new_tokens", "must be ≥ 1")
        if not self.temperature > 0:
            bad("temperature", "must be > 0")
        if not 0 < self.top_p <= 1:
            bad("top_p", "must be in (0, 1]")
        choice("truncation", TRUNCATIONS)
        self.validate_objective()
        choice("batching", SPLIT_MODES)
        if self.num_minibatches < 1:
            bad("num_minibatches", "must be ≥ 1")
        if self.batching == "query" and self.num_minibatches > self.prompts_per_step:
            bad(
                "num_minibatches",
                f"query batching keeps groups whole, so it must be ≤ prompts_per_step={self.prompts_per_step}",
            )
        if self.num_minibatches > self.prompts_per_step * self.group_size:
            bad(
                "num_minibatches",
                f"must be ≤ the {self.prompts_per_step * self.group_size} completions per step",
            )
        if self.inner_epochs < 1:
            bad("inner_epochs", "must be ≥ 1")
        if self.micro_batch_size is not None and self.micro_batch_size < 0:
            bad("micro_batch_size", "must be ≥ 0 (0 or None: the whole mini-batch in one pass)")
        if self.max_tokens_per_micro_batch is not None:
            if self.max_tokens_per_micro_batch < 1:
                bad("max_tokens_per_micro_batch", "must be ≥ 1 (or None: off)")
            if self.micro_batch_size:
                bad("max_tokens_per_micro_batch", "set it or `micro_batch_size`, not both")
        if self.logprob_chunk_tokens < 1:
            bad("logprob_chunk_tokens", "must be ≥ 1")
        if self.attn_implementation is not None:
            choice("attn_implementation", ATTN_IMPLEMENTATIONS)
        if self.flip_every is not None and self.flip_every < 0:
            bad("flip_every", "must be ≥ 0 (0: never; None: every `eval_every` steps)")
        from .backends import BACKENDS, CACHES

        choice("rollout_backend", list(BACKENDS))
        choice("generation_cache", list(CACHES))
        if self.rollout_merge and self.full_finetune:
            bad("rollout_merge", "needs a LoRA adapter to merge; full_finetune has none (set it false)")
        if self.compile_decode and self.generation_cache != "static":
            bad("compile_decode", "needs generation_cache static (a dynamic cache cannot be compiled once)")
        if self.compile_decode and self.generation_batch_size is None:
            bad(
                "compile_decode",
                "needs generation_batch_size (every generate call, rollouts and evaluation, then has that many "
                "rows, so the decode step compiles once)",
            )
        if self.rollout_backend == "paged" and (self.generation_cache != "dynamic" or self.compile_decode):
            bad(
                "generation_cache",
                "the paged backend has its own cache: leave it dynamic, compile_decode false",
            )
        if self.generation_batch_size is not None and self.generation_batch_size < 1:
            bad("generation_batch_size", "must be ≥ 1 (or None: all rows at once)")
        if self.save_total_limit is not None and self.save_total_limit < 1:
            bad("save_total_limit", "must be ≥ 1 (or None: keep every checkpoint)")
        if self.reward_balanced_rho is not None and not 0 < self.reward_balanced_rho <= 0.5:
            bad("reward_balanced_rho", "must be in (0, 0.5]")
        if not self.lr > 0:
            bad("lr", "must be > 0")
        if self.weight_decay < 0:
            bad("weight_decay", "must be ≥ 0")
        if self.grad_clip is not None and not self.grad_clip > 0:
            bad("grad_clip", "must be > 0 (or None for no clipping)")
        if not 0 <= self.warmup_ratio < 1:
            bad("warmup_ratio", "must be in [0, 1)")
        if not 0 <= self.min_lr_ratio <= 1:
            bad("min_lr_ratio", "must be in [0, 1]")
        if self.steps < 1:
            bad("steps", "must be ≥ 1")
        for name in ("eval_every", "save_every"):
            if getattr(self, name) < 0:
                bad(name, "must be ≥ 0 (0: off)")
        if self.eval_k < 1:
            bad("eval_k", "must be ≥ 1")


# --------------------------------------------------------------------------------------------
# presets

_QWEN = {"dtype": "bfloat16", "gradient_checkpointing": True, "lora_rank": 16, "lora_alpha": 32.0}
_NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}, "max_new_tokens": 512}
#: Context lengths (``max_position_embeddings`` of the hub configs) of the presets' models: a preset's
#: ``max_prompt_length`` + ``max_new_tokens`` must fit (tests/scaledrun/test_config.py).
CONTEXT_LENGTHS = {
    "Qwen/Qwen2.5-Math-1.5B": 4096, "Qwen/Qwen2.5-Math-7B": 4096, "Qwen/Qwen3-8B": 40960,
    "Qwen/Qwen3-32B": 40960,
}  # fmt: skip

#: Named starting points: ``--preset`` on the command line applies one over the YAML file and under the
#: other options; ``preset:`` in a YAML file applies it under that file (``load_config``). Hub names are
#: only strings here: nothing is downloaded until a run names one.
PRESETS: dict[str, dict[str, Any]] = {
    # the dataclass defaults: the tiny Qwen3 built by ``python -m scaledrun.tiny``, on CPU
    "tiny": {},
    # DFPO paper, App. I (Qwen3-32B, full fine-tuning): lr 8e-7, cosine to 0.2·lr, 3% warm-up, 32 rollouts
    # per prompt, mini-batch 32 completions (= one group per mini-batch); no KL term (beta 0: App. I's β = 0 is
    # an entropy coefficient, not a KL one, and the paper gives none); App. J decoding T 0.6, top-p 0.95.
    # Does NOT fit 80 GB GPUs as the trainer generates (the whole model gathered in bf16 on each GPU, 65.5 GB,
    # beside 65.5 GB of fp32 state under FSDP on 8 GPUs; 237 GB at the peak): `python -m scaledrun.memory`
    "dfpo_paper": {
        "model": "Qwen/Qwen3-32B", "dtype": "bfloat16", "full_finetune": True, "gradient_checkpointing": True,
        "objective": "dfpo", "group_size": 32, "prompts_per_step": 8, "num_minibatches": 8, "lr": 8e-7,
        "min_lr_ratio": 0.2, "warmup_ratio": 0.03, "beta": 0.0, "temperature": 0.6, "top_p": 0.95,
        "reward": "math_verify", "max_new_tokens": 4096, "max_prompt_length": 2048,
        "max_tokens_per_micro_batch": 16384, "generation_batch_size": 64, "logprob_chunk_tokens": 256,
    },
    # instruct / base models on the short synthetic tasks: answers of a few dozen tokens
    "qwen2.5-0.5b-instruct": {"model": "Qwen/Qwen2.5-0.5B-Instruct", **_QWEN, "lr": 1e-5, "max_new_tokens": 256},
    "qwen2.5-1.5b-instruct": {"model": "Qwen/Qwen2.5-1.5B-Instruct", **_QWEN, "lr": 5e-6, "max_new_tokens": 256},
    "qwen2.5-7b-instruct": {"model": "Qwen/Qwen2.5-7B-Instruct", **_QWEN, "lr": 2e-6, "max_new_tokens": 256},
    "qwen2.5-math-1.5b": {
        "model": "Qwen/Qwen2.5-Math-1.5B", **_QWEN, "lr": 5e-6, "reward": "math_verify", "max_new_tokens": 3072,
        "max_prompt_length": 1024,
    },
    # Qwen3 thinks by default: a short task with thinking off (every completion would otherwise be cut
    # inside its <think> block and masked: the run would train on nothing)
    "qwen3-0.6b": {"model": "Qwen/Qwen3-0.6B", **_QWEN, "lr": 1e-5, **_NO_THINK},
    "qwen3-1.7b": {"model": "Qwen/Qwen3-1.7B", **_QWEN, "lr": 5e-6, **_NO_THINK},
    "qwen3-4b": {"model": "Qwen/Qwen3-4B", **_QWEN, "lr": 2e-6, **_NO_THINK},
    # 8 × 80 GB, LoRA r 16 under DDP (scaledrun/accelerate/ddp.yaml), math with \boxed{} answers. Per GPU:
    # bf16 weights 15.2 GB; KV cache 57 KB/token (28 layers × 4 KV heads × 128 × 2 × 2 B) × 4,096 tokens ×
    # 64 rows per generate call = 15 GB; update passes of ≤ 16,384 token slots with gradient checkpointing
    # (28 saved layer inputs of 16,384 × 3,584 × 2 B = 3.3 GB, one layer recomputed ≈ 3 GB) and LM-head
    # chunks of 256 × 152,064 × 4 B = 156 MB: 33.9 GB at the peak (`python -m scaledrun.memory`). 4k context: prompt ≤ 1,024 + completion 3,072.
    # accelerate launch --config_file scaledrun/accelerate/ddp.yaml --num_processes 8 -m scaledrun.train \
    #     --preset qwen2.5-math-7b --task <your .jsonl/.parquet/hub dataset> --output_dir runs/qwen2.5-math-7b
    "qwen2.5-math-7b": {
        "model": "Qwen/Qwen2.5-Math-7B", **_QWEN, "lr": 1e-6, "reward": "math_verify", "group_size": 8,
        "prompts_per_step": 8, "max_new_tokens": 3072, "max_prompt_length": 1024, "temperature": 1.0,
        "max_tokens_per_micro_batch": 16384, "generation_batch_size": 64, "logprob_chunk_tokens": 256,
        "eval_every": 50, "save_every": 50, "save_total_limit": 3,
    },
    # 8 × 80 GB, LoRA r 16 under DDP, thinking on (Qwen3's default), 40k context. Per GPU: bf16 weights
    # 16.4 GB; KV cache 144 KB/token (36 layers × 8 KV heads × 128 × 2 × 2 B) × 9,216 tokens × 32 rows =
    # 42 GB; update passes ≤ 16,384 token slots (36 × 16,384 × 4,096 × 2 B = 4.8 GB of checkpoints + one
    # layer recomputed): ~65 GB at the generation peak. Prompt ≤ 1,024 + completion 8,192 tokens.
    # accelerate launch --config_file scaledrun/accelerate/ddp.yaml --num_processes 8 -m scaledrun.train \
    #     --preset qwen3-8b --task <your dataset> --output_dir runs/qwen3-8b
    "qwen3-8b": {
        "model": "Qwen/Qwen3-8B", **_QWEN, "lr": 1e-6, "reward": "math_verify", "group_size": 8,
        "prompts_per_step": 4, "max_new_tokens": 8192, "max_prompt_length": 1024, "temperature": 0.6,
        "top_p": 0.95, "max_tokens_per_micro_batch": 16384, "generation_batch_size": 32,
        "logprob_chunk_tokens": 256, "eval_every": 50, "save_every": 50, "save_total_limit": 3,
    },
}  # fmt: skip


# --------------------------------------------------------------------------------------------
# types, docs, loading


def _field_types() -> dict[str, Any]:
    return get_type_hints(RunConfig)


def _base_type(tp: Any) -> tuple[Any, bool]:
    """(the type without ``None``, whether None is allowed)."""
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return args[0], len(args) < len(get_args(tp))
    return tp, False


def _coerce(name: str, value: Any) -> Any:
    """``value`` (from YAML) as the field's type; ints widen to float, '8e-7' strings parse as floats."""
    tp, optional = _base_type(_field_types()[name])
    if value is None:
        if optional:
            return None
        raise ValueError(f"config field `{name}`: null is not allowed (expected {tp.__name__})")
    if get_origin(tp) is dict:
        if isinstance(value, str):  # a JSON object, as the command line gives it
            value = _json_object(value, name)
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ValueError(f"config field `{name}`={value!r}: expected a mapping of names to values")
        return dict(value)
    if get_origin(tp) is list:
        if optional and value == [None]:  # `--field none` on the command line
            return None
        elem = get_args(tp)[0]
        if not isinstance(value, list):
            raise ValueError(f"config field `{name}`={value!r}: expected a list of {_type_name(elem)}s")
        if elem is float:
            return [_coerce_float(name, v) for v in value]
        if not all(isinstance(v, str) for v in value):
            raise ValueError(f"config field `{name}`={value!r}: expected a list of strings")
        return list(value)
    if name in COMMA_JOINED and isinstance(value, list | tuple):
        if not value or not all(isinstance(v, str) for v in value):
            raise ValueError(f"config field `{name}`={value!r}: expected a name or a list of names")
        return ",".join(value)
    if tp is bool:
        try:
            return strict_bool(value)  # the objective parameters' bool coercer (cancellation.params)
        except TypeError as err:
            raise ValueError(f"config field `{name}`={value!r}: {err}") from None
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"config field `{name}`={value!r}: expected an integer")
        return value
    if tp is float:
        return _coerce_float(name, value)
    if not isinstance(value, str):
        raise ValueError(f"config field `{name}`={value!r}: expected a string")
    return value


def _coerce_float(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"config field `{name}`={value!r}: expected a number")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"config field `{name}`={value!r}: expected a number") from None


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _json_object(text: str, name: str = "value") -> dict[str, Any]:
    """A JSON object given as text (``'{"enable_thinking": false}'``); anything else raises ``ValueError``."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"config field `{name}`={text!r}: expected a JSON object, e.g. '{{\"enable_thinking\": false}}' ({err})"
        ) from None
    if not isinstance(value, dict):
        raise ValueError(f"config field `{name}`={text!r}: expected a JSON object (a mapping), got {value!r}")
    return value


def _check_types(cfg: RunConfig) -> None:
    for f in dataclasses.fields(cfg):
        setattr(cfg, f.name, _coerce(f.name, getattr(cfg, f.name)))


def field_docs() -> dict[str, str]:
    """Each field's docstring (the string literal right under it in the body of the class that declares it)."""
    return class_field_docs(RunConfig)


def class_field_docs(cls: type) -> dict[str, str]:
    """The field docstrings of dataclass ``cls`` and of the dataclasses it inherits from (``RunConfig``:
    ``_RunSetup``, ``ObjectiveConfig`` and its own; ``CancellationGRPOConfig``: ``ObjectiveConfig``'s)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is not object and dataclasses.is_dataclass(klass) and klass.__module__ == __name__:
            docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in itertools.pairwise(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if (
                isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _error(message: str) -> None:
    raise ValueError(f"command line: {message}")


def make_parser() -> argparse.ArgumentParser:
    """``HfArgumentParser`` over ``RunConfig``: ``--help`` shows the field docstrings; errors raise."""
    from transformers import HfArgumentParser

    parser = HfArgumentParser(RunConfig)
    parser.error = _error  # type: ignore[method-assign]  # raise ValueError instead of sys.exit
    docs = field_docs()
    hints = _field_types()
    optional = {n for n, tp in hints.items() if _base_type(tp)[1]}
    for action in parser._actions:
        if action.dest in docs:
            action.help = docs[action.dest].replace("%", "%%")
        if action.dest in hints and get_origin(_base_type(hints[action.dest])[0]) is dict:
            action.type = _none_or(_cli_json_object)  # a mapping field: a JSON object on the command line
            action.metavar = "JSON"
        elif action.dest in optional and action.type is not None and action.nargs in (None, "+"):
            action.type = _none_or(action.type)  # an optional list: `--field none` gives [None], read as None
    return parser


def _cli_json_object(text: str) -> dict[str, Any]:
    try:
        return _json_object(text)
    except ValueError as err:  # argparse reports ArgumentTypeError's message as it is
        raise argparse.ArgumentTypeError(str(err).replace("config field `value`=", "")) from None


def _none_or(tp: Any) -> Any:
    def convert(text: str) -> Any:
        return None if text.lower() in ("none", "null") else tp(text)

    convert.__name__ = getattr(tp, "__name__", "value")
    return convert


def load_config(path: str | None, overrides: list[str] | None = None) -> RunConfig:
    """Resolve a config; later layers win:

    1. the dataclass defaults;
    2. the YAML file at ``path`` (a preset named *in the file* is applied first, under the file's own
       keys, so a saved resolved config reads back unchanged);
    3. ``PRESETS[name]`` for a ``--preset name`` in ``overrides``: it overrides the file, so
       ``load_config("scaledrun/configs/default.yaml", ["--preset", "qwen3-0.6b"])`` has the preset's
       model and lr although the file lists every field (``--preset none`` drops the file's preset);
    4. the other options in ``overrides`` (CLI args, ``--field value``).

    Unknown YAML keys, unknown options and invalid values raise ``ValueError`` naming the key or field.
    """
    overrides = list(overrides or [])
    for arg in overrides:
        for old, why in RENAMED.items():
            if arg.split("=")[0] in (f"--{old}", f"--no_{old}"):
                raise ValueError(f"command line: {why}")
    names = {f.name for f in dataclasses.fields(RunConfig)}
    file_values: dict[str, Any] = {}
    if path is not None:
        try:
            with open(
                path, encoding="utf-8"
            ) as f:  # the file's name in YAML's message, not "<unicode string>"
                loaded = yaml.safe_load(f) or {}
        except yaml.YAMLError as err:
            where = " ".join(str(err).split())  # YAML's message on one line: what, and the line and column
            raise ValueError(f"config file {path} is not valid YAML: {where}") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"config file {path}: expected a mapping of field: value")
        for old in set(loaded) & set(RENAMED):
            raise ValueError(f"config file {path}: {RENAMED[old]}")
        unknown = sorted(set(loaded) - names)
        if unknown:
            raise ValueError(
                f"config file {path}: unknown key(s) {', '.join(map(str, unknown))}; valid: {', '.join(sorted(names))}"
            )
        file_values = {k: _coerce(k, v) for k, v in loaded.items()}
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", default=None)
    cli_preset = pre.parse_known_args(overrides)[0].preset
    values: dict[str, Any] = {}
    if cli_preset is None:
        # the file's own preset, under the file's keys
        values.update(_preset_values(file_values.get("preset")))
        values.update(file_values)
    else:
        # a preset chosen on the command line overrides the file (and the file's preset)
        values.update(file_values)
        values.update(_preset_values(cli_preset))
    parser = make_parser()
    parser.set_defaults(**values)
    cfg, rest = parser.parse_args_into_dataclasses(args=overrides, return_remaining_strings=True)
    if rest:
        raise ValueError(
            f"command line: unknown option(s) {' '.join(rest)}; valid: --" + ", --".join(sorted(names))
        )
    return cfg


def _preset_values(preset: str | None) -> dict[str, Any]:
    """The field values of ``PRESETS[preset]`` (none for None, 'none' or 'null')."""
    if preset is None or preset.lower() in ("none", "null"):
        return {}
    if preset not in PRESETS:
        raise ValueError(f"config field `preset`={preset!r}: unknown value; valid: {', '.join(PRESETS)}")
    return dict(PRESETS[preset])


def config_dict(cfg: RunConfig) -> dict[str, Any]:
    """The config as a plain dict (field order)."""
    return dataclasses.asdict(cfg)


def save_config(cfg: RunConfig, path: str | Path) -> Path:
    """Write the resolved config as YAML (one key per field, field order); ``load_config`` reads it back."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config_dict(cfg), sort_keys=False, allow_unicode=True))
    return path
