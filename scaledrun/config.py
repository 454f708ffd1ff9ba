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
from cancellation.objectives import ESTIMATORS, objective_names
from cancellation.transforms import TRANSFORMS

from .rewards import reward_names
from .tasks import FILE_BUILDERS, TASKS, is_task_file, task_files

DTYPES = ("float32", "bfloat16")
#: Valid ``truncation`` values (see the field's docstring).
TRUNCATIONS = ("mask", "failure_reward", "keep")
#: Fields that no longer exist, and what replaced them (an old YAML key or CLI option names the new field).
RENAMED = {
    "mask_truncated": "`mask_truncated` was replaced by `truncation`: `truncation: mask` (the old "
    "`mask_truncated: true`, now also out of the advantages), `failure_reward` or `keep` (the old false)",
}
#: Objective-specific parameters each built-in objective accepts (``beta`` and ``norm_constant`` go to all).
OBJECTIVE_PARAMS: dict[str, tuple[str, ...]] = {
    "grpo": ("epsilon_low", "epsilon_high"),
    "grpo_symclip": ("epsilon",),
    "gspo": ("epsilon_low", "epsilon_high", "length_norm", "estimator"),
    "dfpo": ("epsilon_low", "epsilon_high", "length_norm", "transform", "estimator", "stop_grad"),
}
_COMMON_PARAMS = ("beta", "norm_constant")


@dataclass
class RunConfig:
    """One scaled run. Defaults: the tiny CPU run on the locally built tiny Qwen3 (``scaledrun.tiny``)."""

    # ---- model
    model: str = "artifacts/tiny-qwen3"
    """Local folder or hub name given to ``from_pretrained``. Default: the folder that
    ``python -m scaledrun.tiny --out artifacts/tiny-qwen3`` writes."""
    dtype: str = "float32"
    """Parameter dtype, ``float32`` or ``bfloat16``. float32 on CPU; the paper-scale presets use bfloat16."""
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
    """A synthetic task (``arithmetic``, ``arithmetic_words``, ``template``, ``template_forms``) or a
    ``.jsonl``/``.json``/``.parquet`` path (``{split}`` in it reads one file per split). Default: 2-digit addition."""
    prompt_field: str = "prompt"
    """The prompt column of a task file."""
    answer_field: str = "answer"
    """The gold-answer column of a task file."""
    digits: int = 2
    """Operand digits of the synthetic tasks. 2: the tiny model reaches a non-zero success rate after its warm start."""
    ops: str = "+"
    """Operators of the synthetic tasks, a string of ``+`` and ``-``. Default: addition only (tiny run)."""
    seed: int = 0
    """Seed of the task draw, the sampling and the LoRA init."""
    num_train: int = 64
    """Training prompts drawn from the train split. 64 for the tiny run: each prompt comes back every few
    steps, so 200 steps on CPU show the reward rising (with 2000 the tiny model's gain is within the noise);
    set it to the dataset size for real runs."""
    num_eval: int = 100
    """Held-out prompts for evaluation (disjoint from the train split)."""

    # ---- reward
    reward: str = "exact_match"
    """Reward function name (``scaledrun.rewards.REWARDS``): ``exact_match`` for the synthetic tasks,
    ``math_verify`` for ``\\boxed{}`` math answers."""
    failure_reward: float = 0.0
    """Reward given to a sample whose reward function raised (counted in the logs, the run goes on)."""

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

    # ---- objective (all losses are ``cancellation.compute_loss`` calls)
    objective: str = "grpo"
    """Objective name in ``cancellation.OBJECTIVES``: ``grpo``, ``grpo_symclip`` (GRPO-fix, DFPO App. H),
    ``gspo``, ``dfpo``."""
    epsilon_low: float | None = None
    """Lower clip ε_low (grpo, gspo, dfpo). None: the objective's default (0.2 for grpo, GSPO's 3e-4)."""
    epsilon_high: float | None = None
    """Upper clip ε_high (grpo, gspo, dfpo). None: the objective's default (0.2 for grpo, GSPO's 4e-4)."""
    epsilon: float | None = None
    """Symmetric clip ε of grpo_symclip (DFPO App. H eq. 79). None: its default 0.2."""
    length_norm: bool = True
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
    stop_grad: bool = True
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
        if self.task not in TASKS:
            if not is_task_file(self.task):
                bad(
                    "task",
                    f"unknown task; valid: {', '.join(TASKS)}, or a path ending in {', '.join(FILE_BUILDERS)}",
                )
            for path in dict.fromkeys(task_files(self.task).values()):
                if not path.is_file():
                    bad("task", f"the task file {path} does not exist")
        if self.digits < 1:
            bad("digits", "must be ≥ 1")
        if not self.ops or set(self.ops) - {"+", "-"}:
            bad("ops", "must be a non-empty string of '+' and '-'")
        if self.num_train < 1:
            bad("num_train", "must be ≥ 1")
        if self.num_eval < 0:
            bad("num_eval", "must be ≥ 0")
        choice("reward", reward_names())
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
        choice("objective", objective_names())
        if self.epsilon_low is not None and not 0 <= self.epsilon_low < 1:
            bad("epsilon_low", "must be in [0, 1)")
        for name in ("epsilon_high", "epsilon"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                bad(name, "must be ≥ 0")
        if self.transform is not None:
            choice("transform", list(TRANSFORMS))
        if self.estimator is not None:
            choice("estimator", ESTIMATORS)
        if self.aggregation is not None:
            choice("aggregation", aggregation_names())
        if self.beta < 0:
            bad("beta", "must be ≥ 0")
        if self.norm_constant is not None and not self.norm_constant > 0:
            bad("norm_constant", "must be > 0")
        # a parameter set for an objective that does not take it is a mistake, not something to ignore
        if self.objective in OBJECTIVE_PARAMS:
            takes = OBJECTIVE_PARAMS[self.objective]
            for name, unset in (
                ("epsilon_low", None), ("epsilon_high", None), ("epsilon", None), ("transform", None),
                ("estimator", None), ("stop_grad", True), ("length_norm", True),
            ):  # fmt: skip
                if name not in takes and getattr(self, name) != unset:
                    bad(name, f"objective {self.objective!r} does not take it (it takes: {', '.join(takes)})")
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

    def objective_params(self) -> dict[str, Any]:
        """The keyword parameters of ``cancellation.compute_loss`` for this objective (unset ones left out)."""
        names = OBJECTIVE_PARAMS.get(self.objective, ()) + _COMMON_PARAMS
        params = {n: getattr(self, n) for n in names if getattr(self, n) is not None}
        if params.get("beta") == 0.0:
            del params["beta"]
        return params


# --------------------------------------------------------------------------------------------
# presets

_QWEN = {"dtype": "bfloat16", "gradient_checkpointing": True, "lora_rank": 16, "lora_alpha": 32.0}

#: Named starting points: ``--preset`` on the command line applies one over the YAML file and under the
#: other options; ``preset:`` in a YAML file applies it under that file (``load_config``). Hub names are
#: only strings here: nothing is downloaded until a run names one.
PRESETS: dict[str, dict[str, Any]] = {
    # the dataclass defaults: the tiny Qwen3 built by ``python -m scaledrun.tiny``, on CPU
    "tiny": {},
    # DFPO paper, App. I (Qwen3-32B, full fine-tuning): lr 8e-7, cosine to 0.2·lr, 3% warm-up, 32 rollouts
    # per prompt, mini-batch 32 completions (= one group per mini-batch); no KL term (beta 0: App. I's β = 0 is
    # an entropy coefficient, not a KL one, and the paper gives none); App. J decoding T 0.6, top-p 0.95
    "dfpo_paper": {
        "model": "Qwen/Qwen3-32B", "dtype": "bfloat16", "full_finetune": True, "gradient_checkpointing": True,
        "objective": "dfpo", "group_size": 32, "prompts_per_step": 8, "num_minibatches": 8, "lr": 8e-7,
        "min_lr_ratio": 0.2, "warmup_ratio": 0.03, "beta": 0.0, "temperature": 0.6, "top_p": 0.95,
        "reward": "math_verify", "max_new_tokens": 4096,
    },
    "qwen2.5-0.5b-instruct": {"model": "Qwen/Qwen2.5-0.5B-Instruct", **_QWEN, "lr": 1e-5},
    "qwen2.5-1.5b-instruct": {"model": "Qwen/Qwen2.5-1.5B-Instruct", **_QWEN, "lr": 5e-6},
    "qwen2.5-7b-instruct": {"model": "Qwen/Qwen2.5-7B-Instruct", **_QWEN, "lr": 2e-6},
    "qwen2.5-math-1.5b": {"model": "Qwen/Qwen2.5-Math-1.5B", **_QWEN, "lr": 5e-6, "reward": "math_verify"},
    "qwen3-0.6b": {"model": "Qwen/Qwen3-0.6B", **_QWEN, "lr": 1e-5},
    "qwen3-1.7b": {"model": "Qwen/Qwen3-1.7B", **_QWEN, "lr": 5e-6},
    "qwen3-4b": {"model": "Qwen/Qwen3-4B", **_QWEN, "lr": 2e-6},
    "qwen3-8b": {"model": "Qwen/Qwen3-8B", **_QWEN, "lr": 2e-6},
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
    if get_origin(tp) is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"config field `{name}`={value!r}: expected a list of strings")
        return list(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"config field `{name}`={value!r}: expected true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"config field `{name}`={value!r}: expected an integer")
        return value
    if tp is float:
        if isinstance(value, bool):
            raise ValueError(f"config field `{name}`={value!r}: expected a number")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"config field `{name}`={value!r}: expected a number") from None
    if not isinstance(value, str):
        raise ValueError(f"config field `{name}`={value!r}: expected a string")
    return value


def _check_types(cfg: RunConfig) -> None:
    for f in dataclasses.fields(cfg):
        setattr(cfg, f.name, _coerce(f.name, getattr(cfg, f.name)))


def field_docs() -> dict[str, str]:
    """Each field's docstring (the string literal right under it in the class body)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(RunConfig)))
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
    optional = {n for n, tp in _field_types().items() if _base_type(tp)[1]}
    for action in parser._actions:
        if action.dest in docs:
            action.help = docs[action.dest].replace("%", "%%")
        if action.dest in optional and action.type is not None and action.nargs is None:
            action.type = _none_or(action.type)
    return parser


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
        text = Path(path).read_text()
        loaded = yaml.safe_load(text) or {}
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
