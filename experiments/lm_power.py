"""The language-model study with power: GSPO, the eq. 86 control and DFPO, each at its own learning rate,
on 30 fresh seeds, on a task where RL moves held-out accuracy.

    from experiments.lm_power import run_power
    studies = run_power(Path("runs/experiments/power"))             # python -m experiments --only lm
    studies = run_power(Path("runs/experiments-quick/power"), quick=True)

Why this task
    On ``template_forms`` with 64 training prompts (the old five-seed grid, ``experiments.lm.run_lm``) RL
    raised the training reward but not held-out accuracy (every arm ended at 0.36-0.41 greedy accuracy
    against 0.41 after the warm start), so accuracy predictions tested nothing. ``template_decoy``
    (``scaledrun.tasks``) adds a third completion to the supervised warm start, a plausible wrong shortcut
    that shares the head ``Let me compute a + b.`` with the two correct forms (``Adding the tens of a and b
    gives T. The answer is T.``). The warm-started policy puts about a third of its mass on it, RL learns
    to leave it on prompts it never trained on (2,000 training prompts, 200 held-out ones per seed), and the
    two correct forms keep the equivalent-solution entropy measurable. The warm start has a fixed length
    (``WARM_START_STEPS``): its greedy accuracy swings between 0 and 0.3 from one check to the next
    (greedy decoding picks the decoy or a correct form for most prompts at once), so the stop-at-accuracy
    rule of ``template_forms`` would stop at an arbitrary point of that swing.

What runs (``FULL``; every run is ``scaledrun.train`` through ``experiments/configs/lm_base.yaml`` with
``OVERRIDES`` and its arm's fields, one run folder per (arm, lr, seed) under ``root``)
    1. The learning-rate probe (``probe/``): each arm of ``ARMS`` at each lr of ``PROBE_LRS`` on seeds 0, 1.
       ``choose_lr`` picks each arm's lr by a rule fixed here: the highest mean sampled reward over all
       steps (the area under the reward curve, so speed and level both count); lrs within
       ``LR_TIE_MARGIN`` of the best tie, and ties go to the smaller lr.
       While an arm's chosen lr is the largest it tried, its probe doubles that lr; while it is the
       smallest, it halves it (``next_lr``, at most ``Sizes.extend`` times in all), so that the choice is
       bracketed.
       The probe runs at the chosen lrs are the study's *discovery block*; they fix the speed threshold
       (their mean sampled reward of steps 1-10 + ``experiments.lm.THRESHOLD_GAIN``) before the
       confirmation block runs.
    2. ``lm_power`` (``main/``): the three arms, each at its chosen lr, on ``seeds`` fresh seeds from
       ``CONFIRM_FIRST_SEED`` (the *confirmation block*, predictions fixed in ``PREDICTIONS``).
    3. ``lm_power_big_steps`` (``big/``): the eq. 86 control and DFPO at one larger lr,
       ``BIG_STEP_FACTOR`` × the larger of their two chosen lrs, on the same fresh seeds: bigger steps move
       the ratios further from 1, so the control's group-shared residual (what DFPO's transform removes)
       is larger there.
    The warm start's own held-out greedy accuracy and avg@k are measured on each seed's eval prompts
    (``start_eval``: the trainer's ``evaluate`` on the untrained model) so that every run's gain is a
    per-seed measure (``avg_at_k_gain``, ``greedy_gain``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .lm import (
    DEFAULT_JOBS,
    LOG_FILE,
    MA_WINDOW,
    THRESHOLD_GAIN,
    RunOutcome,
    _mean,
    _model_note,
    _overrides,
    _read_rows,
    ensure_model,
    measure_grid,
    plan,
    probe_threshold,
    run_grid,
)
from .lm_studies import ARM_LABELS, BASE_CONFIG, LM_ARMS, MAIN_PREDICTIONS
from .study import (
    CONFIRM_FIRST_SEED,
    Measure,
    Prediction,
    StudyResult,
    sig,
)

#: The task: ``template_forms`` plus a decoy (see the module docstring).
TASK = "template_decoy"
#: The tiny model's build settings (``scaledrun.tiny.build_tiny``).
MODEL_SETTINGS = {"task": TASK, "seed": 0, "digits": 2, "ops": "+"}
#: Supervised warm-start steps (fixed; see the module docstring). Measured here (seed 0): the first
#: build's held-out greedy accuracy after 600 steps was 0.05, sampled avg@8 ≈ 0.25; the rebuild of
#: 2026-11-28 (the committed report's) 0.16 and 0.43, inside the swing described above (greedy decoding
#: mostly follows the decoy either way). GSPO then reaches greedy ≈ 0.88 and avg@8 ≈ 0.66 in 100 RL steps.
WARM_START_STEPS = 600
#: Config fields every run of the study sets over ``lm_base.yaml``: 2,000 training prompts (RL cannot
#: memorise them in 100 steps of 4 prompts, so the training reward tracks held-out behaviour), 200 held-out
#: prompts and 8 samples each for avg@k (a per-run binomial SE ≤ √(0.25 / 1600) = 0.0125), evals every 10 steps.
OVERRIDES: dict[str, Any] = {
    "task": TASK, "num_train": 2000, "num_eval": 200, "eval_k": 8, "eval_every": 10, "save_every": 10,
}  # fmt: skip
#: The study's arms (``experiments.lm_studies.LM_ARMS``).
ARMS = ("gspo", "gspo_eq86", "dfpo_min_replace")
#: The arms of the bigger-step setting.
BIG_ARMS = ("gspo_eq86", "dfpo_min_replace")
#: The probe's learning rates (LoRA; 5e-4 and above made the control and DFPO collapse on
#: ``template_forms``, see ``lm_base.yaml``).
PROBE_LRS = (1e-4, 2e-4, 4e-4)
#: The bigger-step setting's lr: this × the larger of the control's and DFPO's chosen lrs.
BIG_STEP_FACTOR = 2.0
#: ``choose_lr``'s tie margin (mean sampled reward). Set for the first study: the binomial standard error
#: of a probe lr's mean over 2 seeds × 30 steps × 32 completions, √(0.25 / 1920) = 0.011; it chose GSPO's
#: lr on 0.312 against 0.310, well inside that noise. At 100 steps the binomial part is 0.006, but two
#: seeds' means at one lr differ by up to 0.025 (seed-to-seed variance), so 0.01 is no wider than the noise.
LR_TIE_MARGIN = 0.01


@dataclass(frozen=True)
class Sizes:
    """How big the study runs: probe seeds and lrs, fresh seeds per arm (main and bigger steps), steps,
    and how many lrs the probe may add to an arm while its chosen lr is at an edge of those tried
    (``extend``: ×2 the largest or ×½ the smallest)."""

    probe_seeds: tuple[int, ...]
    lrs: tuple[float, ...]
    seeds: int
    big_seeds: int
    steps: int
    extend: int = 0


#: ``make experiments``: 3 × 3 × 2 probe runs (more where an arm's chosen lr is at an edge of those tried,
#: at most 2 added per arm), 3 × 30 main runs, 2 × 30 bigger-step runs, 100 steps each (at 30, 16-22 of
#: 30 seeds per arm never reached the threshold: speed was censored, not tested).
FULL = Sizes(probe_seeds=(0, 1), lrs=PROBE_LRS, seeds=30, big_seeds=30, steps=100, extend=2)
#: ``--quick``: one probe lr and seed, two fresh seeds per arm, 12 steps (too few seeds for a verdict).
QUICK = Sizes(probe_seeds=(0,), lrs=(2e-4,), seeds=2, big_seeds=2, steps=12)


# --------------------------------------------------------------------------------------------------
# predictions (fixed before the confirmation block ran)

#: The predictions (measure, arm, baseline) of the main setting, taken from ``experiments.lm_studies``' one table:
#: speed, held-out accuracy, equivalent-solution entropy at the last step (at matched reward it rests on
#: the seeds where both arms reach the threshold, a selection on an outcome: in the first study 8 of 30),
#: the residual DFPO's transform removes and eq. 24's energy. Jitter₂ of the sampled reward is left out (it measures the reward level
#: as much as oscillation, see the toy's notes), as are the meters decided by how the arms are built.
KEYS = (
    ("steps_to_threshold", "dfpo_min_replace", "gspo"),
    ("steps_to_threshold", "dfpo_min_replace", "gspo_eq86"),
    ("final_avg_at_k", "dfpo_min_replace", "gspo"),
    ("final_avg_at_k", "dfpo_min_replace", "gspo_eq86"),
    ("final_greedy_accuracy", "dfpo_min_replace", "gspo"),
    ("form_entropy_final", "dfpo_min_replace", "gspo"),
    ("form_entropy_final", "dfpo_min_replace", "gspo_eq86"),
    ("group_shared_residual", "dfpo_min_replace", "gspo_eq86"),
    ("energy_frequent", "dfpo_min_replace", "gspo"),
    ("energy_frequent", "dfpo_min_replace", "gspo_eq86"),
)
#: The bigger-step setting's: those against the control, and the final sampled reward.
BIG_KEYS = (*(k for k in KEYS if k[2] == "gspo_eq86"), ("final_reward", "dfpo_min_replace", "gspo_eq86"))


def _select(keys: Sequence[tuple[str, str, str]]) -> tuple[Prediction, ...]:
    table = {(p.measure, p.arm, p.baseline): p for p in MAIN_PREDICTIONS}
    return tuple(table[k] for k in keys)


PREDICTIONS = _select(KEYS)
BIG_PREDICTIONS = _select(BIG_KEYS)

#: Per-seed measures besides ``experiments.lm``'s: the warm start's held-out accuracy on the seed's eval
#: prompts and each run's gain over it.
START_MEASURES = (
    Measure("start_avg_at_k", "avg@k of the warm start (held out)", None),
    Measure("avg_at_k_gain", "avg@k gain over the warm start (held out)", None),
    Measure("start_greedy_accuracy", "greedy accuracy of the warm start (held out)", None),
    Measure("greedy_gain", "greedy-accuracy gain over the warm start (held out)", None),
)

LIMITS = (
    "What the tiny model cannot test: a ~97k-parameter Qwen3 with LoRA on one synthetic task is no test of "
    "DFPO's benchmark accuracy (Table 1) or of long-reasoning behaviour; what RL learns here is mostly to "
    "leave the decoy, a choice made after a head every completion shares, which is where the papers place "
    "the cancellation effect but is a narrow case of it.",
    f"Each arm runs at the lr the probe chose for it (two seeds per lr, the highest mean sampled reward; lrs "
    f"within {LR_TIE_MARGIN} of it tie and a tie goes to the smaller lr; an arm whose choice is at an edge of "
    "the lrs tried probes one step further, ×2 or ×½); the "
    "probe runs at those lrs are the discovery block, so its differences were seen before the confirmation "
    "block ran, the confirmation block's were not.",
    "Held-out measures are on each seed's own 200 eval prompts (the same prompts in every arm for a seed); "
    "avg@8's sampling error per run is at most √(0.25 / (200 · 8)) = 0.0125 (binomial), greedy accuracy has "
    "none beyond the choice of prompts.",
)


# --------------------------------------------------------------------------------------------------
# pieces


def choose_lr(rewards: Mapping[float, Sequence[float]], margin: float = LR_TIE_MARGIN) -> float:
    """The smallest lr whose runs' mean of their mean sampled reward is within ``margin`` of the highest
    (a tie within the probe's noise goes to the smaller step).

    ``rewards``: lr → each probe run's mean ``reward/mean`` over its steps (NaN for a failed run, which
    counts as the worst). Raises ``ValueError`` when no lr has a finite value."""
    score = {}
    for lr, values in rewards.items():
        finite = [v for v in values if math.isfinite(v)]
        score[lr] = sum(finite) / len(finite) if finite and len(finite) == len(values) else -math.inf
    if not score or max(score.values()) == -math.inf:
        raise ValueError(f"no learning rate has a finished probe run: {dict(rewards)}")
    best = max(score.values())
    return min(lr for lr, s in score.items() if s >= best - margin)


def start_eval(
    model: str, seeds: Sequence[int], overrides: Mapping[str, Any] = OVERRIDES, imports: Sequence[str] = ()
) -> dict[int, dict[str, float]]:
    """Seed → the trainer's held-out eval (``scaledrun.evaluate.evaluate``) of the model before any RL step,
    on the eval prompts and sampling settings a run with that seed uses (its keys: ``eval/greedy_accuracy``,
    ``eval/avg@k``, the form metrics). The sampling RNG is seeded from the seed. ``imports``: modules to
    import first (a reward the config names)."""
    import importlib

    import torch
    from accelerate import Accelerator

    from scaledrun.config import load_config
    from scaledrun.data import load_tasks
    from scaledrun.evaluate import evaluate
    from scaledrun.model import load_model_and_tokenizer

    for module in imports:
        importlib.import_module(module)
    accelerator = Accelerator(cpu=True)
    out: dict[int, dict[str, float]] = {}
    policy = tokenizer = None
    for seed in seeds:
        cfg = load_config(str(BASE_CONFIG), _overrides({**overrides, "model": model, "seed": int(seed)}))
        if policy is None:
            policy, tokenizer = load_model_and_tokenizer(cfg)
        tasks = load_tasks(cfg, "eval", cfg.num_eval, tokenizer, log=lambda _m: None)
        torch.manual_seed(int(seed))
        out[int(seed)] = evaluate(cfg, accelerator, policy, tokenizer, tasks)
    return out


def next_lr(rewards: Mapping[float, Sequence[float]], extended: int, max_extend: int) -> float | None:
    """The next lr to probe while the chosen lr (``choose_lr``) sits at an edge of those probed: 2 × the
    largest when it is the largest, ½ × the smallest when it is the smallest; at most ``max_extend`` added
    (``extended`` so far). None once the best is bracketed (or the probe has a single lr: nothing to
    bracket)."""
    if len(rewards) < 2 or extended >= max_extend:
        return None
    best = choose_lr(rewards)
    if best == max(rewards):
        return 2.0 * best
    if best == min(rewards):
        return 0.5 * best
    return None


def run_seconds(outcomes: Sequence[RunOutcome], jobs: int) -> float:
    """The wall time the runs took, from their logs: the sum of every attempt's ``exit code ... after X s``
    line in each run's ``sweep.log`` (so a resumed or skipped run still counts what it cost), / ``jobs``."""
    total = 0.0
    for o in outcomes:
        log = o.path / LOG_FILE
        if log.is_file():
            total += sum(
                float(m)
                for m in re.findall(r"^=== exit code -?\d+ after ([0-9.]+) s$", log.read_text(), re.M)
            )
    return total / max(1, jobs)


def _mean_reward(outcome: RunOutcome) -> float:
    if outcome.status == "failed":
        return math.nan
    rows = _read_rows(outcome.path)
    values = [r["reward/mean"] for r in rows if r["step"] <= outcome.steps_after]
    return sum(values) / len(values) if values else math.nan


#: Eval curves (``experiments.lm.CURVES``) that start at step 0 with the warm start's own eval.
START_CURVES = {"eval_greedy_accuracy": "eval/greedy_accuracy", "form_entropy": "eval/form_entropy"}


def _with_start(study: StudyResult, start: Mapping[int, Mapping[str, float]], k: str) -> StudyResult:
    """``study`` with the ``START_MEASURES`` per seed (NaN where a seed has no start eval), and its eval
    curves (``START_CURVES``) starting at step 0 from the warm start (seeds without a start eval dropped)."""
    curves = {name: dict(per_arm) for name, per_arm in study.curves.items()}
    for name, key in START_CURVES.items():
        for arm, entry in curves.get(name, {}).items():
            if entry["x"] and entry["x"][0] != 0:
                seeds = {s: [sig(start[int(s)][key]), *ys] for s, ys in entry["seeds"].items()
                         if key in start.get(int(s), {})}  # fmt: skip
                curves[name][arm] = {"x": [0, *entry["x"]], "seeds": seeds}
    per_seed = {arm: dict(ms) for arm, ms in study.per_seed.items()}
    for ms in per_seed.values():
        seeds = list(ms["final_avg_at_k"])
        s_avg = {s: start.get(int(s), {}).get(f"eval/avg@{k}", math.nan) for s in seeds}
        s_greedy = {s: start.get(int(s), {}).get("eval/greedy_accuracy", math.nan) for s in seeds}
        ms["start_avg_at_k"] = s_avg
        ms["avg_at_k_gain"] = {s: ms["final_avg_at_k"][s] - s_avg[s] for s in seeds}
        ms["start_greedy_accuracy"] = s_greedy
        ms["greedy_gain"] = {s: ms["final_greedy_accuracy"][s] - s_greedy[s] for s in seeds}
    return dataclasses.replace(
        study, per_seed=per_seed, measures=[*study.measures, *START_MEASURES], curves=curves
    )


# --------------------------------------------------------------------------------------------------
# the study


def study_model(
    root: Path, model: str | None, warm_start_steps: int, say: Callable[[str], Any]
) -> tuple[str, str]:
    """(path, description) of the model a language-model study trains: ``model`` when given, else the
    tiny ``template_decoy`` Qwen3 built (once) in ``root / "model"`` with ``warm_start_steps``."""
    if model is not None:
        return model, f"`{model}`"
    path = ensure_model(root / "model", warm_start_steps=warm_start_steps, stop_accuracy=None,
                        settings=MODEL_SETTINGS, progress=say)  # fmt: skip
    return str(path), _model_note(root / "model")


def run_power(
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
    """Run the probe, the main setting and the bigger-step setting in ``root`` (resumable: finished runs
    are skipped) and return the studies: ``lm_power`` (discovery and confirmation blocks) and
    ``lm_power_big_steps``. Nothing is saved here but the run folders.

    ``sizes``: instead of ``FULL``/``QUICK``; ``overrides``: config fields over ``OVERRIDES`` (a test's
    small runs); ``imports``: modules each trainer imports first (``--import``, e.g. a test's reward);
    ``warm_start_steps``: the tiny model's (ignored with ``model``)."""
    import time

    started = time.perf_counter()
    say = progress or (lambda _m: None)
    sizes = sizes or (QUICK if quick else FULL)
    root = Path(root).resolve()
    cfg = {**OVERRIDES, **dict(overrides or {})}
    model_path, model_desc = study_model(root, model, warm_start_steps, say)
    steps = sizes.steps

    # 1. the learning-rate probe (the discovery block), extended (×2 or ×½) while an arm's choice is at an edge
    lrs_of = {a: list(sizes.lrs) for a in ARMS}
    say(
        f"lr probe: {len(ARMS)} arms × lr {', '.join(f'{x:g}' for x in sizes.lrs)} × seeds {list(sizes.probe_seeds)}"
    )
    probe: list[RunOutcome] = []
    while True:
        probe_grid = {f"{a}@lr{lr:g}": {**LM_ARMS[a], "lr": lr} for a in ARMS for lr in lrs_of[a]}
        probe_seeds = {name: list(sizes.probe_seeds) for name in probe_grid}
        probe = run_grid(plan(root / "probe", probe_grid, probe_seeds, steps, model_path, cfg, imports),
                         jobs=jobs, progress=say)  # fmt: skip
        rewards = {
            a: {lr: [_mean_reward(o) for o in probe if o.arm == f"{a}@lr{lr:g}"] for lr in lrs_of[a]}
            for a in ARMS
        }
        more = {a: next_lr(rewards[a], len(lrs_of[a]) - len(sizes.lrs), sizes.extend) for a in ARMS}
        if not any(more.values()):
            break
        for a, lr in more.items():
            if lr is not None:
                edge = "largest" if lr > max(lrs_of[a]) else "smallest"
                say(f"{a}: the chosen lr is the {edge} probed; probing {lr:g}")
                lrs_of[a] = sorted([*lrs_of[a], lr])
    chosen = {a: choose_lr(rewards[a]) for a in ARMS}
    probe_lines = [
        f"{ARM_LABELS[a]}: " + ", ".join(f"lr {lr:g} → {_mean(v):.4f}" for lr, v in rewards[a].items())
        + f" (chosen: {chosen[a]:g})"
        for a in ARMS
    ]  # fmt: skip
    say("chosen lrs: " + ", ".join(f"{a} {lr:g}" for a, lr in chosen.items()))
    discovery_runs = [
        dataclasses.replace(o, arm=o.arm.split("@")[0])
        for o in probe
        if o.arm == f"{o.arm.split('@')[0]}@lr{chosen[o.arm.split('@')[0]]:g}"
    ]
    # the speed threshold, fixed from the discovery block before the confirmation block runs
    start_level, threshold = probe_threshold(discovery_runs, steps)
    source = (
        f"fixed from the discovery block (the probe runs at the chosen lrs) before the confirmation block ran: "
        f"its start level {start_level:.3f}, the mean sampled reward of steps 1-{min(MA_WINDOW, steps)}, "
        f"+ {THRESHOLD_GAIN}"
    )
    say(f"speed threshold from the discovery block: {threshold:.2f}")

    # 2. the main setting and 3. bigger steps, on fresh seeds
    fresh = [CONFIRM_FIRST_SEED + i for i in range(sizes.seeds)]
    big_fresh = [CONFIRM_FIRST_SEED + i for i in range(sizes.big_seeds)]
    main_grid = {a: {**LM_ARMS[a], "lr": chosen[a]} for a in ARMS}
    big_lr = BIG_STEP_FACTOR * max(chosen[a] for a in BIG_ARMS)
    big_grid = {a: {**LM_ARMS[a], "lr": big_lr} for a in BIG_ARMS}
    say(
        f"start eval of the warm start on {len(set(fresh + big_fresh + list(sizes.probe_seeds)))} seeds' eval prompts"
    )
    start = start_eval(model_path, sorted(set(fresh + big_fresh + list(sizes.probe_seeds))), cfg, imports)
    main_runs = run_grid(plan(root / "main", main_grid, {a: fresh for a in ARMS}, steps, model_path, cfg, imports),
                         jobs=jobs, progress=say)  # fmt: skip
    big_runs = run_grid(plan(root / "big", big_grid, {a: big_fresh for a in BIG_ARMS}, steps, model_path,
                             cfg, imports), jobs=jobs, progress=say)  # fmt: skip

    # the studies
    probe_note = (
        f"The lr probe (mean sampled reward over all steps; within {LR_TIE_MARGIN} of the best is a tie, "
        "which goes to the smaller lr; seeds "
        + f"{list(sizes.probe_seeds)}): "
        + "; ".join(probe_lines)
        + "."
    )
    title = (
        "Language model with power: GSPO, the eq. 86 control and DFPO, each at its own lr, on template_decoy"
    )
    question = (
        "On a task where RL moves held-out accuracy (the tiny Qwen3 learns to leave a decoy that shares the "
        f"completions' head), with each arm at the lr its probe chose and {sizes.seeds} fresh "
        f"seed{'s' if sizes.seeds != 1 else ''}: does DFPO reach the reward threshold sooner, end with a higher "
        "held-out accuracy, keep more entropy between the two correct forms and leave a lower group-shared residual than GSPO and the eq. 86 control?"
    )
    out: list[StudyResult] = []
    for block, runs, first, seconds in (
        ("discovery", discovery_runs, 0, run_seconds(probe, jobs)),
        ("confirmation", main_runs, CONFIRM_FIRST_SEED, run_seconds(main_runs, jobs)),
    ):
        measured = measure_grid(runs, steps=steps, grid=main_grid, model_desc=model_desc, overrides=cfg,
                                limits=(*LIMITS, probe_note), threshold=threshold,
                                threshold_source=source)  # fmt: skip
        labels = {a: f"{ARM_LABELS[a]}, lr {chosen[a]:g}" for a in ARMS}
        study = measured.study("lm_power", list(ARMS), "gspo", title, question, PREDICTIONS, main_grid, steps,
                               seconds, block=block, first_seed=first, labels=labels)  # fmt: skip
        out.append(_with_start(study, start, measured.k))
    measured = measure_grid(big_runs, steps=steps, grid=big_grid, model_desc=model_desc, overrides=cfg,
                            limits=(*LIMITS[:1], probe_note), threshold=threshold,
                            threshold_source=source)  # fmt: skip
    big = measured.study(
        "lm_power_big_steps", list(BIG_ARMS), "gspo_eq86",
        f"Language model with bigger steps: the eq. 86 control and DFPO at lr {big_lr:g} on template_decoy",
        f"With steps {BIG_STEP_FACTOR:g}× the larger of the two arms' chosen lrs, which move the ratios "
        "further from 1: does the control's group-shared residual grow, and does DFPO's transform then make "
        "it faster, more accurate and less collapsed than the control?",
        BIG_PREDICTIONS, big_grid, steps, run_seconds(big_runs, jobs), block="confirmation",
        first_seed=CONFIRM_FIRST_SEED,
        labels={a: f"{ARM_LABELS[a]}, lr {big_lr:g}" for a in BIG_ARMS},
    )  # fmt: skip
    out.append(_with_start(big, start, measured.k))
    say(f"language-model power study: {(time.perf_counter() - started) / 60:.1f} min")
    return out


__all__ = ["ARMS", "BIG_ARMS", "FULL", "OVERRIDES", "PREDICTIONS", "QUICK", "Sizes", "choose_lr", "next_lr", "run_power",
           "start_eval"]  # fmt: skip
