"""The language-model studies, declared: the arms of the sweep (``LM_ARMS``, ``ARM_LABELS``, ``MAIN_ARMS``,
``ABLATION_ARMS``), the grid sizes (``FULL``, ``QUICK``), the lr probe's arms and rates, the registered
predictions (``MAIN_PREDICTIONS``, ``ABLATION_PREDICTIONS``) and what the tiny model cannot test (``LIMITS``).

How the sweep runs and what it measures is ``experiments.lm`` (``run_grid``, ``plan``, ``measure_run``,
``measure_grid``, ``run_lm``); the claims the predictions state are ``experiments.claims``' table, bound here
to the sweep's measures and arms (``predict``). ``experiments.lm_power`` and ``experiments.lm_residual`` are
one study each and declare their own arms and predictions beside their runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .claims import predict

#: The sweep's base config (every run: this file, then the arm's overrides, then the sweep's own).
BASE_CONFIG = Path(__file__).resolve().parent / "configs" / "lm_base.yaml"


# --------------------------------------------------------------------------------------------------
# arms

#: Arm name → the config fields it sets over ``lm_base.yaml`` (everything else is shared).
LM_ARMS: dict[str, dict[str, Any]] = {
    "grpo": {"objective": "grpo"},
    "grpo_symclip": {"objective": "grpo_symclip"},
    "gspo": {"objective": "gspo"},
    "gspo_eq86": {"objective": "gspo", "estimator": "paper"},
    "dfpo_min_replace": {"objective": "dfpo", "transform": "min_replace"},
    "dfpo_orth_proj_pos": {"objective": "dfpo", "transform": "orth_proj_pos"},
    # ablations (fewer seeds)
    "dfpo_ppo_clip": {"objective": "dfpo", "transform": "min_replace", "estimator": "ppo_clip"},
    "dfpo_random_batching": {"objective": "dfpo", "transform": "min_replace", "batching": "random"},
}
ARM_LABELS = {
    "grpo": "GRPO (token clip ε 0.2)",
    "grpo_symclip": "GRPO-fix (symmetric clip)",
    "gspo": "GSPO (its clipped objective)",
    "gspo_eq86": "GSPO eq. 86 control (paper's estimator, no transform)",
    "dfpo_min_replace": "DFPO Min-Replace",
    "dfpo_orth_proj_pos": "DFPO Orth-Proj (positive QP)",
    "dfpo_ppo_clip": "DFPO Min-Replace, ppo_clip estimator",
    "dfpo_random_batching": "DFPO Min-Replace, random mini-batches",
}
MAIN_ARMS = ("grpo", "grpo_symclip", "gspo", "gspo_eq86", "dfpo_min_replace", "dfpo_orth_proj_pos")
ABLATION_ARMS = ("dfpo_ppo_clip", "dfpo_random_batching")
#: The arm the ablations are compared with (its seeds come from the main grid).
ABLATION_BASELINE = "dfpo_min_replace"


@dataclass(frozen=True)
class Sizes:
    """How big a sweep runs: seeds of the main arms, seeds of the ablation arms, steps, and the arms."""

    seeds: int
    ablation_seeds: int
    steps: int
    arms: tuple[str, ...]


#: The full grid: 5 seeds of the main arms, 3 of the ablations, the base config's steps (120).
FULL = Sizes(
    seeds=5,
    ablation_seeds=3,
    steps=int(yaml.safe_load(BASE_CONFIG.read_text())["steps"]),
    arms=MAIN_ARMS + ABLATION_ARMS,
)
#: The quick grid (a few minutes): GSPO, the eq. 86 control and DFPO Min-Replace, 2 seeds, 60 steps.
QUICK = Sizes(seeds=2, ablation_seeds=0, steps=60, arms=("gspo", "gspo_eq86", "dfpo_min_replace"))


# --------------------------------------------------------------------------------------------------
# predictions

# bound from experiments.claims' table; a claim the toy studies share is filled in with the language
# model's words (its threshold, outcome and entropy)

MAIN_PREDICTIONS = (
    predict("faster_than_gspo", variant="Min-Replace", threshold="the reward threshold",
            measure="steps_to_threshold", arm="dfpo_min_replace", baseline="gspo", direction="lower"),
    predict("faster_than_gspo", variant="Orth-Proj", threshold="the reward threshold",
            measure="steps_to_threshold", arm="dfpo_orth_proj_pos", baseline="gspo", direction="lower"),
    predict("faster_than_control", variant="Min-Replace", threshold="the threshold",
            measure="steps_to_threshold", arm="dfpo_min_replace", baseline="gspo_eq86", direction="lower"),
    predict("faster_than_control", variant="Orth-Proj", threshold="the threshold", measure="steps_to_threshold",
            arm="dfpo_orth_proj_pos", baseline="gspo_eq86", direction="lower"),
    predict("smoother_than_gspo", curve="sampled-reward", measure="jitter2_reward",
            arm="dfpo_min_replace", baseline="gspo", direction="lower"),
    predict("smoother_than_gspo", curve="eval-accuracy", measure="jitter2_eval_accuracy",
            arm="dfpo_min_replace", baseline="gspo", direction="lower"),
    predict("ends_higher_than_gspo", outcome="greedy accuracy", measure="final_greedy_accuracy",
            arm="dfpo_min_replace", baseline="gspo", direction="higher"),
    predict("ends_higher_than_gspo", outcome="avg@k", measure="final_avg_at_k", arm="dfpo_min_replace",
            baseline="gspo", direction="higher"),
    predict("ends_higher_than_control", outcome="greedy accuracy", measure="final_greedy_accuracy",
            arm="dfpo_min_replace", baseline="gspo_eq86", direction="higher"),
    predict("final_entropy_vs_gspo", measure="form_entropy_final", arm="dfpo_min_replace", baseline="gspo",
            direction="higher"),
    predict("entropy_vs_gspo", entropy="form entropy", measure="form_entropy_at_threshold",
            arm="dfpo_min_replace", baseline="gspo", direction="higher"),
    predict("final_entropy_vs_control", measure="form_entropy_final", arm="dfpo_min_replace",
            baseline="gspo_eq86", direction="higher"),
    predict("grpo_fix_group_shared", measure="group_shared_residual", arm="grpo_symclip", baseline="grpo",
            direction="lower"),
    predict("sequence_net_vs_gspo", variant="Min-Replace", measure="sequence_net_residual",
            arm="dfpo_min_replace", baseline="gspo", direction="lower"),
    predict("sequence_net_vs_gspo", variant="Orth-Proj", measure="sequence_net_residual",
            arm="dfpo_orth_proj_pos", baseline="gspo", direction="lower"),
    predict("asym_vs_gspo", measure="asym", arm="dfpo_min_replace", baseline="gspo", direction="lower"),
    predict("ends_higher_than_control", outcome="avg@k", measure="final_avg_at_k", arm="dfpo_min_replace",
            baseline="gspo_eq86", direction="higher"),
    predict("ends_higher_than_control", outcome="sampled reward", measure="final_reward", arm="dfpo_min_replace",
            baseline="gspo_eq86", direction="higher"),
    predict("entropy_vs_control", entropy="form entropy", measure="form_entropy_at_threshold",
            arm="dfpo_min_replace", baseline="gspo_eq86", direction="higher"),
    predict("group_shared_vs_control", measure="group_shared_residual", arm="dfpo_min_replace",
            baseline="gspo_eq86", direction="lower"),
    predict("energy_vs_gspo", measure="energy_frequent", arm="dfpo_min_replace", baseline="gspo",
            direction="lower"),
    predict("energy_vs_control", measure="energy_frequent", arm="dfpo_min_replace", baseline="gspo_eq86",
            direction="lower"),
)  # fmt: skip
ABLATION_PREDICTIONS = (
    predict("faster_than_ppo_clip", measure="steps_to_threshold", arm="dfpo_min_replace",
            baseline="dfpo_ppo_clip", direction="lower"),
    predict("ppo_clip_sequence_net", measure="sequence_net_residual", arm="dfpo_ppo_clip",
            baseline="dfpo_min_replace", direction="higher"),
    predict("query_group_shared", objective="DFPO", measure="group_shared_residual",
            arm="dfpo_min_replace", baseline="dfpo_random_batching", direction="lower"),
    predict("query_faster", objective="DFPO", threshold="the threshold", measure="steps_to_threshold",
            arm="dfpo_min_replace", baseline="dfpo_random_batching", direction="lower"),
)  # fmt: skip

LIMITS = (
    "What the tiny model cannot test: a ~97k-parameter Qwen3 with LoRA on one synthetic task is no test of "
    "DFPO's benchmark accuracy (Table 1), of 32B-scale or long-reasoning behaviour, nor of its compute "
    "savings in GPU hours; the completions of a group have nearly equal length (31-35 tokens), so the "
    "length effects of α = 1/|y| are small here; and with 4 prompts × 8 completions per step the sampled "
    "reward is noisy, so Jitter₂ of the reward measures sampling noise as much as oscillation.",
    "Jitter₂ (eq. 20) is blind to a linear trend but not to curvature: an arm that learns faster can score a "
    "higher Jitter₂ without oscillating.",
    "The sampled reward is on the 64 training prompts; greedy accuracy, avg@k and the form metrics are on "
    "held-out prompts no run trains on, so they measure generalisation of a 2-digit adder, which RL on 64 "
    "prompts barely teaches the tiny model.",
)


# --------------------------------------------------------------------------------------------------
# the lr probe

#: The arms and learning rates ``experiments.lm.lr_probe`` tries by default.
PROBE_ARMS = ("gspo", "gspo_eq86", "dfpo_min_replace")
PROBE_LRS = (1e-3, 5e-4, 2e-4)


__all__ = [
    "ABLATION_ARMS",
    "ABLATION_BASELINE",
    "ABLATION_PREDICTIONS",
    "ARM_LABELS",
    "BASE_CONFIG",
    "FULL",
    "LIMITS",
    "LM_ARMS",
    "MAIN_ARMS",
    "MAIN_PREDICTIONS",
    "PROBE_ARMS",
    "PROBE_LRS",
    "QUICK",
    "Sizes",
]
