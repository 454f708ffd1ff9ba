"""The toy studies, declared: each study's arms, sizes, measures, curves, predictions and notes
(``STUDIES``), and the commands that run them (``run_study``, ``run_toy``).

How a study runs and what it measures is ``experiments.toy`` (``ToyStudy.run``, ``measure_seed``); the
claims the predictions state are ``experiments.claims``' table, bound here to each study's measures and
arms (``predict``).

Studies (``STUDIES``; ``python -m experiments --only toy`` runs them all):

- ``toy_main``: GRPO, GRPO-fix, GSPO, GSPO's eq. 86 control, DFPO Min-Replace and Orth-Proj (positive
  QP), and Table 3's ablations (no stop-grad, scale by 0.5) plus DFPO's ``ppo_clip`` variant, on
  ``template_task``;
- ``toy_group_size``: Table 4, G ∈ {2, 4, 8, 16} × {GSPO, eq. 86 control, DFPO}, at matched steps and at
  matched samples;
- ``toy_batching``: the cancellation-hypothesis paper's Sec. 4, random vs query-preserved mini-batches
  and reward-balanced batching;
- ``toy_low_prob``: the Lopti paper (arXiv 2505.12929), GRPO vs Advantage Reweighting vs Lopti (and both);
- ``toy_aggregation``: the aggregation (1/|y|, token-mean, Dr. GRPO's constant) × GRPO, GSPO, the eq. 86
  control and DFPO on ``equivalent_solutions`` (completions of 5 and 6 tokens): does length
  normalisation or sequence coupling drive the drift between equally correct answers?
- ``toy_epsilon``: each objective at its paper's clip range and at a wider one, with bigger steps;
- ``toy_optimizer``: the eq. 86 control, DFPO, GRPO and GSPO under Adam beside SGD;
- ``toy_frontier`` (``experiments.frontier``): each main arm at its own best learning rate × inner epochs.

Compute matching: every arm of a study has the same group size, groups per step, inner epochs,
mini-batches, steps and learning rate (plain SGD), unless the study varies exactly that (the group size
in ``toy_group_size``, the batching in ``toy_batching``, the clip range with bigger steps in
``toy_epsilon``, the optimizer and its learning rate in ``toy_optimizer``). Lopti's two stages double the
optimiser steps per batch (as in its public code); ``toy_low_prob`` says so.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from toymodel.simulate import DEFAULT_LR

from .claims import predict
from .frontier import NAME as FRONTIER
from .frontier import run_frontier
from .stats import fmt_p, paired_difference, paired_t
from .study import BLOCKS, TOL, StudyResult
from .toy import (
    EQUIV,
    NO_LOW_CLIP,
    TEMPLATE,
    THRESHOLD,
    WIDE_SEQ,
    WIDE_TOK,
    Arm,
    Sizes,
    ToyStudy,
    result_path,
)

# ---- toy_main

_MAIN_ARMS = (
    Arm("grpo", "GRPO (ε 0.2)", "grpo"),
    Arm("grpo_symclip", "GRPO-fix (symmetric clip, ε 0.2)", "grpo_symclip"),
    Arm("gspo", "GSPO (ε 3e-4/4e-4, its clipped objective)", "gspo"),
    Arm("gspo_eq86", "GSPO eq. 86 control (paper's estimator, no transform)", "gspo", {"estimator": "paper"}),
    Arm("dfpo_min_replace", "DFPO Min-Replace", "dfpo", {"transform": "min_replace"}),
    Arm("dfpo_orth_proj_pos", "DFPO Orth-Proj (positive QP)", "dfpo", {"transform": "orth_proj_pos"}),
    Arm("dfpo_orth_proj", "DFPO Orth-Proj (raw projection, eq. 18)", "dfpo", {"transform": "orth_proj"}),
    Arm("dfpo_truncate", "DFPO truncate-and-rebalance", "dfpo", {"transform": "truncate_rebalance"}),
    Arm("dfpo_no_stop_grad", "DFPO Min-Replace, no stop-grad (Table 3)", "dfpo", {"stop_grad": False}),
    Arm("dfpo_scale_half", "DFPO scale by 0.5 (Table 3)", "dfpo", {"transform": "scale_half"}),
    Arm(
        "dfpo_ppo_clip",
        "DFPO Min-Replace, ppo_clip variant (not in the paper)",
        "dfpo",
        {"estimator": "ppo_clip"},
    ),
)
_K_MAIN = 20
_NO_GRAD = (
    "on the toy the no-stop-grad ablation has an identically zero gradient (Σ_i Â_i·min_j s̄_j ≡ 0 with "
    "zero-sum advantages and seq-mean-token-mean), so it never learns: the comparison is decided by its "
    "construction, not by instability"
)
_HALF = (
    "on the toy, scale by 0.5 under the paper's estimator is the eq. 86 control at half the step "
    "(tests/cancellation/test_transforms.py): this compares step sizes, which toy_frontier does properly"
)
_MAIN_PREDICTIONS = (
    predict("faster_than_gspo", variant="Min-Replace", threshold="E[R] ≥ 0.9", measure="steps_to_threshold",
            arm="dfpo_min_replace", baseline="gspo", direction="lower"),
    predict("faster_than_gspo", variant="Orth-Proj", threshold="E[R] ≥ 0.9", measure="steps_to_threshold",
            arm="dfpo_orth_proj_pos", baseline="gspo", direction="lower"),
    predict("shrink_slower_than_control", measure="steps_to_threshold", arm="dfpo_min_replace",
            baseline="gspo_eq86", direction="higher"),
    predict("clips_less_than_control", setting="the toy's main setting", measure="clip_frac",
            arm="dfpo_min_replace", baseline="gspo_eq86", direction="lower"),
    predict("faster_than_control", variant="Orth-Proj", threshold="E[R] ≥ 0.9", measure="steps_to_threshold",
            arm="dfpo_orth_proj_pos", baseline="gspo_eq86", direction="lower"),
    predict("smoother_than_gspo", curve="E[R]", measure="jitter2_expected_reward", arm="dfpo_min_replace",
            baseline="gspo", direction="lower"),
    predict("ends_higher_than_gspo", outcome="E[R]", measure="final_reward", arm="dfpo_min_replace",
            baseline="gspo", direction="higher"),
    predict("entropy_vs_gspo", entropy="equivalent-set entropy", measure="equiv_entropy_at_threshold",
            arm="dfpo_min_replace", baseline="gspo", direction="higher"),
    predict("entropy_vs_control", entropy="equivalent-set entropy", measure="equiv_entropy_at_threshold",
            arm="dfpo_min_replace", baseline="gspo_eq86", direction="higher"),
    predict("tax_vs_gspo", measure="template_kl_at_threshold", arm="dfpo_min_replace", baseline="gspo",
            direction="lower"),
    predict("tax_vs_control", measure="template_kl_at_threshold", arm="dfpo_min_replace", baseline="gspo_eq86",
            direction="lower"),
    predict("asym_vs_gspo", measure="asym", arm="dfpo_min_replace", baseline="gspo", direction="lower"),
    predict("group_shared_vs_gspo", variant="Min-Replace", measure="group_shared_residual",
            arm="dfpo_min_replace", baseline="gspo", direction="lower"),
    predict("ends_higher_than_no_stop_grad", measure="final_reward", arm="dfpo_min_replace",
            baseline="dfpo_no_stop_grad", direction="higher", by_construction=_NO_GRAD),
    predict("faster_than_no_stop_grad", measure="steps_to_threshold", arm="dfpo_min_replace",
            baseline="dfpo_no_stop_grad", direction="lower", by_construction=_NO_GRAD),
    predict("ends_higher_than_half", measure="final_reward", arm="dfpo_min_replace", baseline="dfpo_scale_half",
            direction="higher", by_construction=_HALF),
    predict("faster_than_half", measure="steps_to_threshold", arm="dfpo_min_replace", baseline="dfpo_scale_half",
            direction="lower", by_construction=_HALF),
    predict("group_shared_vs_gspo", variant="Orth-Proj (raw)", measure="group_shared_residual",
            arm="dfpo_orth_proj", baseline="gspo", direction="lower"),
    predict("group_shared_vs_gspo", variant="truncate-and-rebalance", measure="group_shared_residual",
            arm="dfpo_truncate", baseline="gspo", direction="lower"),
    predict("faster_than_control", variant="Orth-Proj (raw)", threshold="E[R] ≥ 0.9",
            measure="steps_to_threshold", arm="dfpo_orth_proj", baseline="gspo_eq86", direction="lower"),
    predict("faster_than_control", variant="truncate-and-rebalance", threshold="E[R] ≥ 0.9",
            measure="steps_to_threshold", arm="dfpo_truncate", baseline="gspo_eq86", direction="lower"),
    predict("grpo_fix_group_shared", measure="group_shared_residual", arm="grpo_symclip", baseline="grpo",
            direction="lower"),
    predict("grpo_fix_ends_higher", measure="final_reward", arm="grpo_symclip", baseline="grpo",
            direction="higher"),
)  # fmt: skip
_MAIN_NOTES = (
    "template_task's completions all have 7 tokens, so DFPO's length effects (α = 1/|y| per token, "
    "eq. 72) are invisible here; toy_aggregation has unequal lengths.",
    "DFPO no stop-grad: with zero-sum advantages and seq-mean-token-mean, Σ_i Â_i·min_j s̄_j(θ) is identically "
    "0, so this ablation has no gradient and never learns on the toy (only length-weighted aggregations give "
    "it one). Its Table 3 comparisons are therefore decided by construction here, not by instability.",
    "DFPO scale by 0.5 under the paper's estimator is exactly the eq. 86 control at half the step (tested in "
    "tests/cancellation/test_transforms.py), so it tests 'smaller updates' against the control, not against GSPO.",
    "At lr 0.5 with 4 inner epochs no token ratio leaves GRPO's [0.8, 1.2], so GRPO and GRPO-fix take "
    "identical steps (every per-seed difference is 0); toy_epsilon runs bigger steps where they separate.",
    "Matched reward: the value at E[R] = 0.9, interpolated linearly between the last step below 0.9 and the "
    "first step at or above it, on the series that starts at step 0 (the initial policy, E[R] = 0.3), so a "
    "run that crosses at step 1 is read between steps 0 and 1 (NaN for a seed that never gets there, left "
    "out of the paired difference). Matched steps: step 20 and the last step.",
    "App. K.2-K.4 registers Min-Replace against the eq. 86 control in the paper's direction: its shrinkage "
    "(every weight replaced by the group's smallest) gives smaller effective steps, so it should be slower, "
    "and fewer sequences should be clipped. The clip fraction comes from simulate on the first seeds only.",
    "Asym (eq. 23) is the within-group variance of w_i·Â_i, so it scales with w²: at ratio 1 it is the "
    "variance of Â (about 1 with std scaling) for every objective, and the scale-0.5 ablation's is a quarter "
    "of the control's by construction, not by cancellation. From simulate on the first seeds only.",
    "Jitter₂ (eq. 20) is blind to a linear trend but not to curvature: over a whole run it also grows with "
    "how sharply the reward rises, so a faster-learning arm can score a higher Jitter₂ of E[R] without "
    "oscillating (E[R] is exact here, so its Jitter₂ has no sampling noise; the sampled-reward curve's has).",
    "No prediction reads the Jitter₂ of the sampled reward (the training reward an LM logs): its noise is the "
    "binomial p(1 − p)/G of the sampled groups, smaller near E[R] = 1, which the faster arm reaches first, "
    "so it mostly measures the reward level, not the smoothness of the updates. The measure is still shown.",
)


# ---- toy_group_size


def _gs_arms() -> tuple[Arm, ...]:
    arms = []
    for g in (2, 4, 8, 16):
        arms += [
            Arm(f"gspo_G{g}", f"GSPO, G = {g}", "gspo", group_size=g),
            Arm(f"gspo_eq86_G{g}", f"eq. 86 control, G = {g}", "gspo", {"estimator": "paper"}, group_size=g),
            Arm(f"dfpo_G{g}", f"DFPO Min-Replace, G = {g}", "dfpo", group_size=g),
        ]
    return tuple(arms)


def _gs_derive(study: ToyStudy, per_seed: dict[str, dict[str, dict[str, float]]], steps: int) -> list[str]:
    """gain_vs_gspo / gain_vs_control: 1 − steps(arm) / steps(GSPO or control) per seed, same G.

    NaN where either never reached the threshold (the ratio is then unknown).
    """
    notes = []
    for g in (2, 4, 8, 16):
        gspo = per_seed[f"gspo_G{g}"]["steps_to_threshold"]
        ctrl = per_seed[f"gspo_eq86_G{g}"]["steps_to_threshold"]
        targets = {
            f"gspo_eq86_G{g}": {"gain_vs_gspo": gspo},
            f"dfpo_G{g}": {"gain_vs_gspo": gspo, "gain_vs_control": ctrl},
        }
        for arm, refs in targets.items():
            mine = per_seed[arm]["steps_to_threshold"]
            for key, ref in refs.items():
                per_seed[arm][key] = {
                    s: (1.0 - v / ref[s])
                    if math.isfinite(v) and math.isfinite(ref.get(s, math.inf))
                    else math.nan
                    for s, v in mine.items()
                }
        censored = sum(
            not math.isfinite(v)
            for a in ("gspo", "gspo_eq86", "dfpo")
            for v in per_seed[f"{a}_G{g}"]["steps_to_threshold"].values()
        )
        if censored:
            notes.append(
                f"G = {g}: {censored} seed-runs never reached E[R] ≥ {THRESHOLD:g}; their gains are NaN."
            )
    return notes


_GS_PREDICTIONS = (
    *(
        predict("faster_than_gspo_at_g", g=str(g), measure="steps_to_threshold", arm=f"dfpo_G{g}",
                baseline=f"gspo_G{g}", direction="lower")
        for g in (2, 4, 8, 16)
    ),
    *(
        predict("faster_than_control_at_g", g=str(g), measure="steps_to_threshold", arm=f"dfpo_G{g}",
                baseline=f"gspo_eq86_G{g}", direction="lower")
        for g in (2, 4, 8, 16)
    ),
    predict("gain_vs_gspo_grows", g="16", measure="gain_vs_gspo", arm="dfpo_G16", baseline="dfpo_G2",
            direction="higher"),
    predict("gain_vs_gspo_grows", g="8", measure="gain_vs_gspo", arm="dfpo_G8", baseline="dfpo_G2",
            direction="higher"),
    predict("gain_vs_control_grows", measure="gain_vs_control", arm="dfpo_G16", baseline="dfpo_G2",
            direction="higher"),
)  # fmt: skip
_GS_NOTES = (
    "Every arm runs the same number of steps, so larger G draws more samples: steps_to_threshold compares at "
    "matched steps, samples_to_threshold and 'E[R] after the budget' at matched samples (the budget is the "
    "G = 2 arms' whole run; a larger-G arm that needs more samples than that counts as not reached).",
    "gain_vs_gspo = 1 − steps(arm)/steps(GSPO) per seed at the same G (unit-free: the same in steps and in "
    "samples); gain_vs_control likewise against the eq. 86 control. Comparing it across G pairs runs with "
    "the same seed id but different group sizes, which draw different samples (no common random numbers "
    "across G), so those pairs are independent draws, not matched ones.",
    "Table 4 measures the end-point benchmark score (AIME25 avg@32); the toy's end-point E[R] saturates near 1 "
    "for every arm, so the gain is measured in steps to the threshold instead.",
)


# ---- toy_batching


def _bt_arms() -> tuple[Arm, ...]:
    base = {"num_groups": 4, "num_minibatches": 2}
    arms = []
    for obj, lab in (("grpo", "GRPO"), ("dfpo", "DFPO Min-Replace")):
        arms += [
            Arm(f"{obj}_random", f"{lab}, random mini-batches", obj, batching="random", **base),
            Arm(f"{obj}_query", f"{lab}, query-preserved mini-batches", obj, batching="query", **base),
            Arm(f"{obj}_query_rb25", f"{lab}, query-preserved + reward-balanced ρ = 0.25", obj,
                reward_balanced_rho=0.25, **base),
            Arm(f"{obj}_query_rb125", f"{lab}, query-preserved + reward-balanced ρ = 0.125", obj,
                reward_balanced_rho=0.125, **base),
        ]  # fmt: skip
    return tuple(arms)


def _bt_derive(study: ToyStudy, per_seed: dict[str, dict[str, dict[str, float]]], steps: int) -> list[str]:
    out = []
    for arm in study.arms:
        if arm.reward_balanced_rho is not None:
            v = list(per_seed[arm.name]["update_frac"].values())
            out.append(
                f"{arm.label}: updates on {100 * sum(v) / len(v):.0f} % of the steps (mean over seeds); the other "
                "steps only sample and wait for a balanced selection."
            )
    return out


_BT_PREDICTIONS = (
    predict("query_group_shared", objective="GRPO", measure="group_shared_residual", arm="grpo_query",
            baseline="grpo_random", direction="lower"),
    predict("query_group_shared", objective="DFPO", measure="group_shared_residual", arm="dfpo_query",
            baseline="dfpo_random", direction="lower"),
    predict("query_faster", objective="GRPO", threshold="E[R] ≥ 0.9", measure="steps_to_threshold",
            arm="grpo_query", baseline="grpo_random", direction="lower"),
    predict("query_faster", objective="DFPO", threshold="E[R] ≥ 0.9", measure="steps_to_threshold",
            arm="dfpo_query", baseline="dfpo_random", direction="lower"),
    predict("query_ends_higher", measure="final_reward", arm="grpo_query", baseline="grpo_random",
            direction="higher"),
    predict("balanced_faster", objective="GRPO", rho="0.25", measure="steps_to_threshold", arm="grpo_query_rb25",
            baseline="grpo_query", direction="lower"),
    predict("balanced_faster", objective="DFPO", rho="0.25", measure="steps_to_threshold", arm="dfpo_query_rb25",
            baseline="dfpo_query", direction="lower"),
    predict("balanced_ends_higher", measure="final_reward", arm="grpo_query_rb25", baseline="grpo_query",
            direction="higher"),
    predict("balanced_faster", objective="GRPO", rho="0.125", measure="steps_to_threshold",
            arm="grpo_query_rb125", baseline="grpo_query", direction="lower"),
)  # fmt: skip
_BT_NOTES = (
    "Every arm samples 4 groups of 8 per step (32 completions) and splits them into 2 mini-batches for each "
    "of 4 inner epochs (8 optimiser steps per updated step); reward-balanced arms update only on a step "
    "whose buffer holds 4 groups with ≥ ρ positive and ≥ ρ negative advantages, so steps (= samples drawn) "
    "is the compute measure, not updates.",
    "The cancellation-hypothesis paper gives no value of ρ that we found; ρ = 0.25 and 0.125 are ours "
    "(ρ = 0.4 updated on ~10 % of the steps in a side run). On template_task the reward saturates within "
    "~10 steps, after which a balanced selection is rare.",
    "Random mini-batches split a group across optimiser steps, so each part's Σ Â ≠ 0: the group-shared "
    "residual then measures the split, as the cancellation-hypothesis paper's eq. 14 says; DFPO's transform "
    "then also sees partial groups.",
    "The cancellation-hypothesis paper's evidence is benchmark accuracy after training (Table 2); the toy's "
    "analogue is the exact E[R].",
)


# ---- toy_low_prob

_LP_ARMS = (
    Arm("grpo", "GRPO", "grpo"),
    Arm("grpo_ar", "GRPO + Advantage Reweighting (α = 0.2)", "grpo", ar_alpha=0.2),
    Arm("grpo_lopti", "GRPO + Lopti (η = 0.5)", "grpo", lopti_eta=0.5),
    Arm("grpo_ar_lopti", "GRPO + AR (α = 0.3) + Lopti (η = 0.5)", "grpo", ar_alpha=0.3, lopti_eta=0.5),
)
_K_LP = 10
_LP_PREDICTIONS = tuple(
    p
    for arm, lab in (("grpo_ar", "Advantage Reweighting"), ("grpo_lopti", "Lopti"), ("grpo_ar_lopti", "AR + Lopti"))
    for p in (
        predict("low_prob_faster", method=lab, measure="steps_to_threshold", arm=arm, baseline="grpo",
                direction="lower"),
        predict("low_prob_early", method=lab, k=str(_K_LP), measure=f"reward_at_step_{_K_LP}", arm=arm,
                baseline="grpo", direction="higher"),
        predict("low_prob_ends_higher", method=lab, measure="final_reward", arm=arm, baseline="grpo",
                direction="higher"),
        predict("low_prob_high_up", method=lab, measure="pos_high_up", arm=arm, baseline="grpo",
                direction="higher"),
    )
)  # fmt: skip
_LP_NOTES = (
    "template_task has low-probability tokens that matter: the correct answer starts at π = 0.3 (below "
    "Lopti's η = 0.5) and the template synonyms at 0.2 / 0.1 against 0.7.",
    "α = 0.2 (AR alone) and α = 0.3, η = 0.5 (AR with Lopti) are the public Lopti code's values; η = 0.5 is "
    "the paper's unified setting (its code uses 0.4 for Lopti alone).",
    "Compute: Lopti runs two full updates per step (low-probability tokens first, then the rest), i.e. "
    "twice the optimiser steps of GRPO on the same samples, as in its public code; steps are matched, "
    "optimiser steps are not.",
    "The paper's evidence is benchmark scores on K&K logic puzzles and its Fig. 3: the fraction of the "
    "high-probability tokens (here π_old ≥ 0.5, at a real choice) of positive-advantage completions whose "
    "probability the step moved up (`pos_high_up`, a mean over steps 1-10, where a seed draws the same first "
    "batch in every arm and the policies have not drifted apart). On the toy, tokens share only "
    "their context's logits, so a low-probability token can push down only the other actions of its own "
    "context.",
)


# ---- toy_aggregation

_AGGS = (
    ("seqmean", "seq-mean-token-mean", "1/|y| per token", {}),
    ("tokenmean", "token-mean", "token-mean", {}),
    ("drgrpo", "seq-mean-token-sum-norm", "Dr. GRPO constant C = 6", {"norm_constant": 6.0}),
)
_AGG_ARMS = tuple(
    Arm(f"{name}_{short}", f"{lab}, {desc}", name.split("_")[0], {**extra, **params}, aggregation=agg)
    for name, lab, params in (
        ("grpo", "GRPO", {}),
        ("gspo", "GSPO", {}),
        ("gspo_eq86", "eq. 86 control", {"estimator": "paper"}),
        ("dfpo", "DFPO Min-Replace", {}),
    )
    for short, agg, desc, extra in _AGGS
)
_AGG_PREDICTIONS = (
    *(
        predict("length_norm_drifts", objective=lab, measure="equiv_entropy_at_threshold", arm=f"{obj}_seqmean",
                baseline=f"{obj}_drgrpo", direction="lower")
        for obj, lab in (("grpo", "GRPO"), ("gspo", "GSPO"), ("gspo_eq86", "eq. 86 control"), ("dfpo", "DFPO"))
    ),
    predict("coupling_drifts", aggregation="seq-mean-token-mean", measure="equiv_entropy_at_threshold",
            arm="dfpo_seqmean", baseline="gspo_seqmean", direction="higher"),
    predict("coupling_drifts", aggregation="Dr. GRPO's constant", measure="equiv_entropy_at_threshold",
            arm="dfpo_drgrpo", baseline="gspo_drgrpo", direction="higher"),
    predict("coupling_alone_drifts", measure="equiv_entropy_at_threshold", arm="dfpo_seqmean",
            baseline="gspo_eq86_seqmean", direction="higher"),
    predict("grpo_entropy_vs_gspo", measure="equiv_entropy_at_threshold", arm="grpo_seqmean",
            baseline="gspo_seqmean", direction="higher"),
)  # fmt: skip
_AGG_NOTES = (
    "equivalent_solutions: 'The answer is 25 .' (R = 0), 'The answer is 20 .' (R = 1, 5 tokens) and "
    "'10 + 10 = 20 .' (R = 1, 6 tokens); the equivalent set is the two correct ones, starting at entropy "
    "0.637 and log-odds −0.693. Much of the drift is credit assignment: the correct 5-token answer shares "
    "its first token with the wrong one.",
    "Per-token coefficient of completion i: seq-mean-token-mean gives GRPO r·Â/(B·|y_i|) and GSPO/DFPO "
    "w·Â/(B·|y_i|) (the 1/|y| of the length-normalised sequence ratio); token-mean divides by the batch's "
    "token count and Dr. GRPO by the constant C = 6 instead, so neither weighs a token by its completion's "
    "length.",
    "DFPO's sequence-net residual is 0 only with seq-mean-token-mean (c_i = s̃_i·Â_i/B): token-mean and "
    "Dr. GRPO weigh c_i by |y_i|, so Σ_i c_i ≠ 0 with unequal lengths.",
    "Matched reward: the value at E[R] = 0.9, interpolated linearly between the last step below 0.9 and the "
    "first step at or above it, the initial policy (E[R] = 0.75) being step 0. GSPO's own clip silences most "
    "sequences after the first inner step, so it reaches the threshold along a different path (slower, "
    "fewer effective updates); the eq. 86 control keeps GSPO's coupled weights s̄ under DFPO's estimator, "
    "so DFPO vs the control isolates the coupling (inside GSPO's narrow band, where s̄ hardly spreads).",
)


# ---- toy_epsilon

_EPS_BASE = {"lr": 1.0, "inner_epochs": 8}
_EPS_ARMS = (
    Arm("grpo", "GRPO, ε 0.2", "grpo", **_EPS_BASE),
    Arm(
        "grpo_clip_higher",
        "GRPO, ε 0.2 / 0.28 (DAPO clip-higher)",
        "grpo",
        {"epsilon_high": 0.28},
        **_EPS_BASE,
    ),
    Arm("grpo_wide", "GRPO, ε 0.4", "grpo", WIDE_TOK, **_EPS_BASE),
    Arm("grpo_symclip", "GRPO-fix, ε 0.2", "grpo_symclip", **_EPS_BASE),
    Arm("grpo_no_low_clip", "GRPO, no lower clip (ε_low → 1), ε_high 0.2", "grpo", NO_LOW_CLIP, **_EPS_BASE),
    Arm("grpo_symclip_wide", "GRPO-fix, ε 0.4", "grpo_symclip", {"epsilon": 0.4}, **_EPS_BASE),
    Arm("gspo", "GSPO, ε 3e-4 / 4e-4", "gspo", **_EPS_BASE),
    Arm("gspo_wide", "GSPO, ε 0.2", "gspo", WIDE_SEQ, **_EPS_BASE),
    Arm("gspo_eq86", "eq. 86 control, ε 3e-4 / 4e-4", "gspo", {"estimator": "paper"}, **_EPS_BASE),
    Arm("gspo_eq86_wide", "eq. 86 control, ε 0.2", "gspo", {"estimator": "paper", **WIDE_SEQ}, **_EPS_BASE),
    Arm("dfpo", "DFPO Min-Replace, ε 3e-4 / 4e-4", "dfpo", **_EPS_BASE),
    Arm("dfpo_wide", "DFPO Min-Replace, ε 0.2", "dfpo", WIDE_SEQ, **_EPS_BASE),
)
_K_EPS = 10
_EPS_PREDICTIONS = (
    predict("gspo_residual_rises", measure="group_shared_residual", arm="gspo_wide", baseline="gspo",
            direction="higher"),
    predict("control_residual_rises", measure="group_shared_residual", arm="gspo_eq86_wide",
            baseline="gspo_eq86", direction="higher"),
    predict("cancels_at_wide_eps", measure="group_shared_residual", arm="dfpo_wide", baseline="gspo_wide",
            direction="lower"),
    predict("transform_cancels_at_wide_eps", measure="group_shared_residual", arm="dfpo_wide",
            baseline="gspo_eq86_wide", direction="lower"),
    predict("grpo_leaks_less_wide", measure="sequence_net_residual", arm="grpo_wide", baseline="grpo",
            direction="lower"),
    predict("grpo_asym_falls_wide", measure="asym", arm="grpo_wide", baseline="grpo", direction="lower"),
    predict("grpo_fix_leaks_less", measure="sequence_net_residual", arm="grpo_symclip", baseline="grpo",
            direction="lower"),
    predict("grpo_fix_lower_asym", measure="asym", arm="grpo_symclip", baseline="grpo", direction="lower"),
    predict("grpo_fix_slower", measure="steps_to_threshold", arm="grpo_symclip", baseline="grpo",
            direction="higher"),
    predict("grpo_fix_ends_higher", measure="final_reward", arm="grpo_symclip", baseline="grpo",
            direction="higher"),
    predict("entropy_vs_control_wide", measure="equiv_entropy_at_threshold", arm="dfpo_wide",
            baseline="gspo_eq86_wide", direction="higher"),
    predict("clip_higher_entropy", measure="equiv_entropy_final", arm="grpo_clip_higher", baseline="grpo",
            direction="higher"),
    predict("faster_than_gspo_paper_eps", measure="steps_to_threshold", arm="dfpo", baseline="gspo",
            direction="lower"),
    predict("tax_vs_control_big_steps", measure="template_kl_at_threshold", arm="dfpo", baseline="gspo_eq86",
            direction="lower"),
    predict("tax_vs_control_wide", measure="template_kl_at_threshold", arm="dfpo_wide",
            baseline="gspo_eq86_wide", direction="lower"),
    predict("shrink_slower_wide", measure="steps_to_threshold", arm="dfpo_wide", baseline="gspo_eq86_wide",
            direction="higher"),
    predict("clips_less_than_control", setting="bigger steps, ε 0.2", measure="clip_frac", arm="dfpo_wide",
            baseline="gspo_eq86_wide", direction="lower"),
    predict("grpo_fix_entropy", measure="equiv_entropy_at_threshold", arm="grpo_symclip", baseline="grpo",
            direction="higher"),
)  # fmt: skip


def _eps_derive(study: ToyStudy, per_seed: dict[str, dict[str, dict[str, float]]], steps: int) -> list[str]:
    """Where GRPO-fix's speed comes from: GRPO-fix − GRPO and GRPO-fix − GRPO without the lower clip, in
    steps to E[R] ≥ 0.9 (paired t interval, never-reached seeds at the horizon)."""
    out = []
    fix = per_seed.get("grpo_symclip", {}).get("steps_to_threshold", {})
    for other, what in (("grpo", "GRPO"), ("grpo_no_low_clip", "GRPO without the lower clip")):
        base = per_seed.get(other, {}).get("steps_to_threshold", {})
        common = sorted(set(fix) & set(base))
        if len(common) < 2:
            continue
        pd = paired_difference({k: fix[k] for k in common}, {k: base[k] for k in common}, horizon=float(steps),
                               n_boot=1, tol=TOL)  # fmt: skip
        mean, low, high, pval = paired_t(pd.differences)
        out.append(
            f"GRPO-fix − {what}, steps to E[R] ≥ {THRESHOLD:g}: {mean:+.3g} [{low:+.3g}, {high:+.3g}] (95 % t "
            f"interval, n = {pd.n}, t-test p = {fmt_p(pval)}; a comparison, not a registered prediction)."
        )
    if len(out) == 2:
        out.append(
            "Read together: GRPO-fix's clip is [0, 1 + ε] for both signs, GRPO's without the lower clip is "
            "[0, 1 + ε] for positive advantages and PPO's upper bound alone for negative ones. A difference "
            "against GRPO with none against the no-lower-clip arm says the speed comes from dropping the lower "
            "bound, not from the symmetry."
        )
    return out


_EPS_NOTES = (
    "Bigger steps than the other toy studies (lr 1.0, 8 inner epochs; every arm), so that ratios leave 1 "
    "far enough for GRPO's clip to bind (at lr 0.5 and 4 inner epochs no ratio leaves [0.8, 1.2] and GRPO "
    "≡ GRPO-fix).",
    "At GSPO's ε (3e-4 / 4e-4) nearly every sequence is clipped after the first inner step and GSPO's "
    "clipped objective gives it no gradient: its group-shared residual there is mostly clip silencing, not "
    "coupling. The eq. 86 control keeps every gradient, so its residual is the coupling part alone.",
    "Template tokens that the whole group shares have the same ratio in every completion (position "
    "contexts), so GRPO's token-level clip treats them alike for both signs except where A's sign decides "
    "the branch: GRPO's leak shows in the sequence-net residual and Asym rather than in the group-shared one.",
)


# ---- toy_optimizer

_ADAM = {"optimizer": "adam", "lr": DEFAULT_LR["adam"]}
_OPT_ARMS = (
    Arm("gspo_eq86_sgd", "eq. 86 control, SGD (lr 0.5)", "gspo", {"estimator": "paper"}),
    Arm("dfpo_sgd", "DFPO Min-Replace, SGD (lr 0.5)", "dfpo"),
    Arm("grpo_adam", "GRPO, Adam (lr 0.05)", "grpo", **_ADAM),
    Arm("gspo_adam", "GSPO, Adam (lr 0.05)", "gspo", **_ADAM),
    Arm("gspo_eq86_adam", "eq. 86 control, Adam (lr 0.05)", "gspo", {"estimator": "paper"}, **_ADAM),
    Arm("dfpo_adam", "DFPO Min-Replace, Adam (lr 0.05)", "dfpo", **_ADAM),
)
_OPT_PREDICTIONS = (
    predict("adam_faster_than_control", measure="steps_to_threshold", arm="dfpo_adam", baseline="gspo_eq86_adam",
            direction="lower"),
    predict("adam_smoother_than_control", measure="jitter2_expected_reward", arm="dfpo_adam",
            baseline="gspo_eq86_adam", direction="lower"),
    predict("adam_tax_vs_control", measure="template_kl_at_threshold", arm="dfpo_adam", baseline="gspo_eq86_adam",
            direction="lower"),
    predict("adam_entropy_vs_control", measure="equiv_entropy_at_threshold", arm="dfpo_adam",
            baseline="gspo_eq86_adam", direction="higher"),
    predict("adam_faster_than_gspo", measure="steps_to_threshold", arm="dfpo_adam", baseline="gspo_adam",
            direction="lower"),
)  # fmt: skip
_OPT_NOTES = (
    "The papers train with AdamW; the other toy studies use plain SGD, whose step is the gradient itself, so "
    "a token whose coefficients cancel does not move. Adam's step is m̂/(√v̂ + ε): at its first step it is "
    "about the sign of the gradient (cancellation-hypothesis paper App. D.3), and afterwards a shared token "
    "whose gradient cancels this step still moves through the moments of earlier steps.",
    "Adam's lr (0.05) is the toy's default for Adam, not tuned per arm; SGD arms at lr 0.5 show the same "
    "comparison under the optimizer of the other studies. The batched toy reproduces torch.optim.Adam per "
    "seed (tests/toymodel/test_batched.py).",
)


_MAIN_MEASURES = (
    "steps_to_threshold", "samples_to_threshold", "final_reward", f"reward_at_step_{_K_MAIN}",
    "jitter2_expected_reward", "jitter2_sampled_reward", "equiv_entropy_at_threshold",
    f"equiv_entropy_at_step_{_K_MAIN}", "equiv_entropy_final", "template_kl_at_threshold",
    f"template_kl_at_step_{_K_MAIN}", "template_kl_final", "shared_residual", "group_shared_residual",
    "sequence_net_residual", "asym", "clip_frac",
)  # fmt: skip

STUDIES: dict[str, ToyStudy] = {
    s.name: s
    for s in (
        ToyStudy(
            name="toy_main",
            title="Toy: GRPO, GSPO, the eq. 86 control, DFPO and Table 3's ablations",
            question=(
                "On the tabular template task, does DFPO reach the reward threshold sooner than GSPO, with a "
                "smoother curve, less learning tax and less entropy collapse, and is the gain the transform's "
                "(DFPO vs the eq. 86 control) or the estimator's?"
            ),
            scenario=TEMPLATE,
            baseline="gspo",
            arms=_MAIN_ARMS,
            measures=_MAIN_MEASURES,
            curves=("expected_reward", "equiv_entropy", "template_kl"),
            predictions=_MAIN_PREDICTIONS,
            notes=_MAIN_NOTES,
            full=Sizes(seeds=256, sim_seeds=32, steps=200, metric_seeds=16),
            quick=Sizes(seeds=32, sim_seeds=8, steps=120, metric_seeds=2),
            early_step=_K_MAIN,
        ),
        ToyStudy(
            name="toy_group_size",
            title="Toy: group size (DFPO Table 4)",
            question=(
                "Does DFPO's gain over GSPO (and over the eq. 86 control) grow with the group size G, at "
                "matched steps and at matched samples?"
            ),
            scenario=TEMPLATE,
            baseline="gspo_G8",
            arms=_gs_arms(),
            measures=(
                "steps_to_threshold",
                "samples_to_threshold",
                "reward_at_sample_budget",
                "final_reward",
                "gain_vs_gspo",
                "gain_vs_control",
                "jitter2_expected_reward",
                "equiv_entropy_at_threshold",
                "template_kl_at_threshold",
                "group_shared_residual",
                "sequence_net_residual",
            ),
            curves=("expected_reward",),
            predictions=_GS_PREDICTIONS,
            notes=_GS_NOTES,
            full=Sizes(seeds=256, sim_seeds=32, steps=800),
            quick=Sizes(seeds=32, sim_seeds=8, steps=300),
            derive=_gs_derive,
        ),
        ToyStudy(
            name="toy_batching",
            title="Toy: query-preserved and reward-balanced batching (cancellation-hypothesis paper Sec. 4)",
            question=(
                "With 4 groups per step split into 2 mini-batches, do query-preserved mini-batches keep the "
                "group's cancellation (and learn faster) where random ones split it, and does reward-balanced "
                "batching help?"
            ),
            scenario=TEMPLATE,
            baseline="grpo_random",
            arms=_bt_arms(),
            measures=(
                "steps_to_threshold",
                "samples_to_threshold",
                "final_reward",
                "reward_at_step_8",
                "jitter2_expected_reward",
                "jitter2_sampled_reward",
                "template_kl_at_threshold",
                "equiv_entropy_at_threshold",
                "shared_residual",
                "group_shared_residual",
                "sequence_net_residual",
                "asym",
                "update_frac",
            ),
            curves=("expected_reward", "template_kl"),
            predictions=_BT_PREDICTIONS,
            notes=_BT_NOTES,
            full=Sizes(seeds=256, sim_seeds=32, steps=100),
            quick=Sizes(seeds=32, sim_seeds=6, steps=40),
            early_step=8,
            per_seed_only=True,
            derive=_bt_derive,
        ),
        ToyStudy(
            name="toy_low_prob",
            title="Toy: low-probability tokens (Advantage Reweighting, Lopti)",
            question=(
                "Does damping the gradient of low-probability tokens (Advantage Reweighting) or isolating them "
                "in a first update stage (Lopti) make GRPO learn the template task faster or end higher?"
            ),
            scenario=TEMPLATE,
            baseline="grpo",
            arms=_LP_ARMS,
            measures=(
                "steps_to_threshold",
                "final_reward",
                f"reward_at_step_{_K_LP}",
                "jitter2_expected_reward",
                "equiv_entropy_at_threshold",
                "equiv_entropy_final",
                "template_kl_at_threshold",
                "template_kl_final",
                "shared_residual",
                "group_shared_residual",
                "sequence_net_residual",
                "asym",
                "pos_high_up",
            ),
            curves=("expected_reward", "template_kl"),
            predictions=_LP_PREDICTIONS,
            notes=_LP_NOTES,
            full=Sizes(seeds=256, sim_seeds=32, steps=150),
            quick=Sizes(seeds=32, sim_seeds=6, steps=60),
            early_step=_K_LP,
            per_seed_only=True,
        ),
        ToyStudy(
            name="toy_aggregation",
            title="Toy: aggregation × objective on equivalent solutions of unequal length",
            question=(
                "Between two equally correct answers of 5 and 6 tokens, is the drift of the equivalent set "
                "driven by the 1/|y| length normalisation of the aggregation or by sequence coupling?"
            ),
            scenario=EQUIV,
            baseline="grpo_seqmean",
            arms=_AGG_ARMS,
            measures=(
                "steps_to_threshold",
                "final_reward",
                "jitter2_expected_reward",
                "equiv_entropy_at_threshold",
                "equiv_entropy_final",
                "equiv_log_odds_at_threshold",
                "equiv_log_odds_final",
                "shared_residual",
                "group_shared_residual",
                "sequence_net_residual",
            ),
            curves=("expected_reward", "equiv_entropy", "equiv_log_odds"),
            predictions=_AGG_PREDICTIONS,
            notes=_AGG_NOTES,
            full=Sizes(seeds=256, sim_seeds=32, steps=150),
            quick=Sizes(seeds=32, sim_seeds=8, steps=60),
            early_step=5,
        ),
        ToyStudy(
            name="toy_epsilon",
            title="Toy: the clip range (paper ε vs a wider one), bigger steps",
            question=(
                "When ratios spread inside a wider clip band, does sequence coupling show (GSPO's and the eq. 86 "
                "control's group-shared residual rise), does GRPO's clip asymmetry bind less, and does DFPO keep "
                "cancelling?"
            ),
            scenario=TEMPLATE,
            baseline="gspo",
            arms=_EPS_ARMS,
            measures=(
                "steps_to_threshold",
                "final_reward",
                f"reward_at_step_{_K_EPS}",
                "jitter2_expected_reward",
                "equiv_entropy_at_threshold",
                "equiv_entropy_final",
                "template_kl_at_threshold",
                "group_shared_residual",
                "sequence_net_residual",
                "asym",
                "clip_frac",
                "clip_low_frac",
                "clip_high_frac",
            ),
            curves=("expected_reward", "template_kl"),
            predictions=_EPS_PREDICTIONS,
            notes=_EPS_NOTES,
            derive=_eps_derive,
            full=Sizes(seeds=256, sim_seeds=32, steps=100, metric_seeds=16),
            quick=Sizes(seeds=32, sim_seeds=8, steps=60, metric_seeds=2),
            early_step=_K_EPS,
        ),
        ToyStudy(
            name="toy_optimizer",
            title="Toy: Adam against plain SGD",
            question=(
                "Under Adam, where a shared token whose gradient cancels still moves through the moment "
                "estimates, does DFPO keep its advantage over the eq. 86 control and GSPO?"
            ),
            scenario=TEMPLATE,
            baseline="gspo_eq86_adam",
            arms=_OPT_ARMS,
            measures=(
                "steps_to_threshold",
                "final_reward",
                "reward_at_step_20",
                "jitter2_expected_reward",
                "equiv_entropy_at_threshold",
                "template_kl_at_threshold",
                "template_kl_final",
                "group_shared_residual",
            ),
            curves=("expected_reward", "template_kl"),
            predictions=_OPT_PREDICTIONS,
            notes=_OPT_NOTES,
            full=Sizes(seeds=256, sim_seeds=32, steps=200),
            quick=Sizes(seeds=32, sim_seeds=8, steps=60),
        ),
    )
}


def run_study(
    name: str,
    *,
    quick: bool = False,
    seeds: int | None = None,
    sim_seeds: int | None = None,
    steps: int | None = None,
    metric_seeds: int | None = None,
    curve_seeds: int | None = None,
    block: str = "discovery",
    progress: Callable[[str], Any] | None = print,
) -> StudyResult:
    """Run one study of ``STUDIES`` on one block of seeds (its full or quick sizes; any size can be
    overridden, e.g. a tiny slice ``run_study("toy_main", seeds=2, sim_seeds=2, steps=12,
    metric_seeds=1)`` for a test)."""
    if name not in STUDIES:
        raise ValueError(f"unknown toy study {name!r}; valid: {', '.join(STUDIES)}")
    return STUDIES[name].run(
        quick=quick,
        seeds=seeds,
        sim_seeds=sim_seeds,
        steps=steps,
        metric_seeds=metric_seeds,
        curve_seeds=curve_seeds,
        block=block,
        progress=progress,
    )


def run_toy(
    out_dir: Path,
    *,
    quick: bool = False,
    only: Sequence[str] | None = None,
    progress: Callable[[str], Any] | None = print,
) -> list[StudyResult]:
    """Run the toy studies (all, or those named in ``only``: ``STUDIES`` and ``toy_frontier``), each on
    its discovery block and then on its confirmation block (fresh seeds, same arms and predictions), save
    each block (``result_path``) and return them in that order."""
    valid = [*STUDIES, FRONTIER]
    names = valid if only is None else list(only)
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(
            f"unknown toy stud{'y' if len(unknown) == 1 else 'ies'} {unknown}; valid: {', '.join(valid)}"
        )
    out_dir = Path(out_dir)
    say = progress or (lambda _msg: None)
    results = []
    for name in names:
        t0 = time.perf_counter()
        if name == FRONTIER:
            blocks = run_frontier(quick=quick, progress=progress)
        else:
            blocks = [run_study(name, quick=quick, block=block, progress=progress) for block in BLOCKS]
        for study in blocks:
            path = study.save(result_path(out_dir, name, study.block))
            say(f"{name} ({study.block}): {len(study.arms)} arms -> {path}")
        say(f"{name}: {time.perf_counter() - t0:.1f} s")
        results += blocks
    return results


__all__ = ["STUDIES", "run_study", "run_toy"]
