"""The language-model study where the eq. 86 control's residual is large: DFPO Min-Replace against the
same estimator without the transform, at ε 0.2 without length normalisation, on 30 fresh seeds.

    from experiments.lm_residual import run_residual
    studies = run_residual(Path("runs/experiments/residual"))   # python -m experiments --only lm-residual

Why this setting
    In ``lm_power`` (GSPO's ε 3e-4 / 4e-4, α = 1/|y|) the post-clip weights stay within 1 ± 4e-4, so
    Min-Replace moves the coefficients by at most 0.07 % and the control and DFPO take nearly the same
    steps (identical avg@8 on 8 of 30 seeds): close to an A/A test. The two knobs together make the
    control's group-shared residual (what DFPO's transform removes) large: ε 0.2 lets the clipped
    weights spread, and ``length_norm: false`` (α = 1) stops the per-sequence 1/|y| from shrinking the
    weights' spread on the shared head. Measured before this study was written (tiny Qwen3,
    ``template_decoy``, lr 2e-4): the control's group-shared residual 0.05-0.06 per step against DFPO's
    2e-8, with neither arm collapsing; ε 0.2 alone left it at the sequence-net level (3e-3),
    ``length_norm: false`` alone at 0.008.

What runs (``FULL``: every run is ``scaledrun.train`` through ``experiments/configs/lm_base.yaml`` with
``experiments.lm_power.OVERRIDES``, ``SETTING`` and its arm's fields; one run folder per (arm, seed))
    1. The probe block (``probe/``, seeds ``probe_seeds``): both arms at ``LR`` (one lr for both: the
       comparison is the transform alone, at equal step size). It is the study's *discovery block*, and it
       fixes the speed threshold before the confirmation block runs: the mean sampled reward of steps
       1-10 over its runs + ``experiments.lm.THRESHOLD_GAIN`` (``probe_threshold``).
    2. ``lm_residual`` (``main/``): both arms on ``seeds`` fresh seeds from ``CONFIRM_FIRST_SEED``, ``steps``
       steps (long enough that few runs are censored), measured at the probe's threshold.
    The warm start's held-out eval on each seed's prompts (``lm_power.start_eval``) gives every run's
    gains and its *template drift*: the change of ``eval/head_logprob`` (log π of the sentence every
    completion opens with, ``Let me compute a + b.``) from the warm start to the last step.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .claims import predict
from .lm import (
    DEFAULT_JOBS,
    MA_WINDOW,
    THRESHOLD_GAIN,
    measure_grid,
    plan,
    probe_threshold,
    run_grid,
)
from .lm_power import OVERRIDES, WARM_START_STEPS, run_seconds, start_eval, study_model
from .lm_power import _with_start as _with_start_evals
from .lm_studies import LM_ARMS, MAIN_PREDICTIONS
from .study import CONFIRM_FIRST_SEED, Measure, Prediction, StudyResult

#: The study's arms (``experiments.lm_studies.LM_ARMS``): the paper's estimator without and with Min-Replace.
ARMS = ("gspo_eq86", "dfpo_min_replace")
#: The setting's fields over ``lm_power.OVERRIDES``: ε 0.2 on both sides, α = 1 (no 1/|y|), evals every 20
#: steps (3 per run, at steps 20, 40 and 60).
SETTING: dict[str, Any] = {"epsilon_low": 0.2, "epsilon_high": 0.2, "length_norm": False, "eval_every": 20}
#: Both arms' learning rate (the one ``lm_base.yaml``'s probe chose on ``template_forms``; the referee's).
LR = 2e-4


@dataclass(frozen=True)
class Sizes:
    """Probe seeds (the discovery block), fresh seeds per arm (the confirmation block), steps per run."""

    probe_seeds: tuple[int, ...]
    seeds: int
    steps: int


#: ``make experiments``: 2 arms × 4 probe seeds, then 2 × 30 fresh seeds, 60 steps each (the threshold is
#: reached by step 20-40 on most seeds: measured on seed 0, the 10-step mean reward rose from 0.42 to 0.62 by
#: step 40).
FULL = Sizes(probe_seeds=(0, 1, 2, 3), seeds=30, steps=60)
#: ``--quick``: 1 probe seed, 2 fresh seeds, 20 steps (too few seeds for a verdict).
QUICK = Sizes(probe_seeds=(0,), seeds=2, steps=20)

#: Per-seed measures computed from the warm start's eval (besides ``lm_power``'s gains).
DRIFT_MEASURES = (
    Measure("start_head_logprob", "log π(shared head) of the warm start (held out)", None),
    Measure("head_drift", "template drift: Δ log π(shared head), last step − warm start", None),
    Measure("head_drift_abs", "|template drift|: |Δ log π(shared head)|", "lower"),
)


def _pick(measure: str) -> Prediction:
    (p,) = [p for p in MAIN_PREDICTIONS if (p.measure, p.arm, p.baseline) == (measure, *ARMS[::-1])]
    return p


#: Fixed before the confirmation block ran. Speed, held-out accuracy, equivalent-form entropy at a fixed
#: step (at matched reward it would rest on the seeds where both arms reach the threshold, a selection
#: on an outcome), template drift; the residual is the manipulation check (decided by how DFPO is built).
PREDICTIONS = (
    _pick("steps_to_threshold"),
    _pick("final_avg_at_k"),
    _pick("final_greedy_accuracy"),
    _pick("final_reward"),
    _pick("form_entropy_final"),
    predict(
        "head_drifts_less",
        measure="head_drift_abs",
        arm="dfpo_min_replace",
        baseline="gspo_eq86",
        direction="lower",
    ),
    predict(
        "clips_less_than_control",
        setting="language model, ε 0.2",
        measure="clip_frac",
        arm="dfpo_min_replace",
        baseline="gspo_eq86",
        direction="lower",
    ),
    dataclasses.replace(
        _pick("group_shared_residual"),
        by_construction="DFPO's transform sets the group-shared residual to 0 (the manipulation check: "
        "the control's residual is what the transform removes)",
    ),
)

LIMITS = (
    "What the tiny model cannot test: a ~97k-parameter Qwen3 with LoRA on one synthetic task is no test of "
    "DFPO's benchmark accuracy (Table 1) or of long-reasoning behaviour; ε 0.2 with α = 1 is chosen to make "
    "the control's residual large, not as either paper's recommended setting.",
    "Both arms run at one lr (2e-4), so the comparison is the transform at equal step size; neither arm "
    "was tuned, and an arm's best lr may differ (the lm_power study tunes each arm).",
    "Template drift is measured on the head sentence only (log π of 'Let me compute a + b.' on held-out "
    "prompts, teacher-forced at T = 1): a policy whose head is already near-certain can drift only down.",
)


def _with_drift(study: StudyResult, start: Mapping[int, Mapping[str, float]], k: str) -> StudyResult:
    """``study`` with ``lm_power``'s gains over the warm start, ``DRIFT_MEASURES`` per seed and every one of
    ``PREDICTIONS`` (those on the drift measures can be declared only once the measures are there)."""
    study = _with_start_evals(study, start, k)
    per_seed = {arm: dict(ms) for arm, ms in study.per_seed.items()}
    for ms in per_seed.values():
        seeds = list(ms["final_avg_at_k"])
        head0 = {s: start.get(int(s), {}).get("eval/head_logprob", math.nan) for s in seeds}
        final = ms.get("head_logprob_final", dict.fromkeys(seeds, math.nan))
        ms["start_head_logprob"] = head0
        ms["head_drift"] = {s: final[s] - head0[s] for s in seeds}
        ms["head_drift_abs"] = {s: abs(final[s] - head0[s]) for s in seeds}
    return dataclasses.replace(
        study, per_seed=per_seed, measures=[*study.measures, *DRIFT_MEASURES], predictions=list(PREDICTIONS)
    )


def run_residual(
    root: Path,
    *,
    quick: bool = False,
    jobs: int = DEFAULT_JOBS,
    model: str | None = None,
    sizes: Sizes | None = None,
    overrides: Mapping[str, Any] | None = None,
    imports: Sequence[str] = (),
    warm_start_steps: int = WARM_START_STEPS,
    progress: Callable[[str], Any] | None = print,
) -> list[StudyResult]:
    """Run the probe block and the confirmation block in ``root`` (resumable: finished runs are skipped)
    and return ``lm_residual``'s two blocks. Nothing is saved here but the run folders.

    ``sizes``: instead of ``FULL``/``QUICK``; ``overrides``: config fields over ``OVERRIDES`` and
    ``SETTING`` (a test's small runs); ``imports``: modules each trainer imports first;
    ``warm_start_steps``: the tiny model's (ignored with ``model``)."""
    started = time.perf_counter()
    say = progress or (lambda _m: None)
    sizes = sizes or (QUICK if quick else FULL)
    root = Path(root).resolve()
    cfg = {**OVERRIDES, **SETTING, **dict(overrides or {})}
    model_path, model_desc = study_model(root, model, warm_start_steps, say)
    steps = sizes.steps
    grid = {a: {**LM_ARMS[a], "lr": LR} for a in ARMS}
    fresh = [CONFIRM_FIRST_SEED + i for i in range(sizes.seeds)]
    probe_seeds = list(sizes.probe_seeds)

    # 1. the probe block: it fixes the speed threshold before the confirmation block runs
    say(f"residual study, probe block: {len(ARMS)} arms × seeds {probe_seeds}, {steps} steps")
    probe = run_grid(plan(root / "probe", grid, {a: probe_seeds for a in ARMS}, steps, model_path, cfg, imports),
                     jobs=jobs, progress=say)  # fmt: skip
    start_level, threshold = probe_threshold(probe, steps)
    if not math.isfinite(threshold):
        raise RuntimeError(
            f"no probe run of the residual study finished: see the sweep.log files under {root / 'probe'}"
        )
    source = (
        f"fixed from the probe block before the confirmation block ran: its start level {start_level:.3f}, the "
        f"mean sampled reward of steps 1-{min(MA_WINDOW, steps)} over its {len(probe)} runs, + {THRESHOLD_GAIN}"
    )
    say(f"speed threshold from the probe block: {threshold:.2f}")

    # 2. the confirmation block, on fresh seeds
    say(f"start eval of the warm start on {len(probe_seeds) + len(fresh)} seeds' eval prompts")
    # (an arm's objective: the setting's fields are the objectives'; the eval itself uses none of them)
    start = start_eval(model_path, sorted(set(probe_seeds + fresh)), {**cfg, **LM_ARMS[ARMS[0]]}, imports)
    main_runs = run_grid(plan(root / "main", grid, {a: fresh for a in ARMS}, steps, model_path, cfg, imports),
                         jobs=jobs, progress=say)  # fmt: skip

    title = "Language model where the control's residual is large: DFPO against the eq. 86 control at ε 0.2, α = 1"
    question = (
        "With both arms at one lr and the clip range and per-token weight that make the eq. 86 control's "
        "group-shared residual large (ε 0.2, no length normalisation): does removing it (DFPO's Min-Replace) "
        "make training faster, end more accurate, keep more entropy between the two correct forms and move "
        "the shared head less than the same estimator without the transform?"
    )
    out = []
    for block, runs, first in (("discovery", probe, 0), ("confirmation", main_runs, CONFIRM_FIRST_SEED)):
        measured = measure_grid(runs, steps=steps, grid=grid, model_desc=model_desc, overrides=cfg,
                                threshold=threshold, threshold_source=source, limits=LIMITS)  # fmt: skip
        early = [p for p in PREDICTIONS if p.measure not in {m.key for m in DRIFT_MEASURES}]
        study = measured.study("lm_residual", list(ARMS), "gspo_eq86", title, question, early, grid, steps,
                               run_seconds(runs, jobs), block=block, first_seed=first,
                               labels={a: f"{measured_label(a)}, lr {LR:g}" for a in ARMS})  # fmt: skip
        out.append(_with_drift(study, start, measured.k))
    say(f"language-model residual study: {(time.perf_counter() - started) / 60:.1f} min")
    return out


def measured_label(arm: str) -> str:
    """The arm's label in this setting."""
    return {
        "gspo_eq86": "eq. 86 control, ε 0.2, α = 1",
        "dfpo_min_replace": "DFPO Min-Replace, ε 0.2, α = 1",
    }[arm]


__all__ = [
    "ARMS",
    "FULL",
    "LR",
    "PREDICTIONS",
    "QUICK",
    "SETTING",
    "Sizes",
    "run_residual",
]
