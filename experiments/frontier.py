"""``toy_frontier``: every main arm at its own best step size, not at one learning rate for all.

At GSPO's clip range (3e-4 / 4e-4) the clip silences most sequences after the first inner step, so at
an equal learning rate DFPO takes four steps per batch where GSPO takes one: "DFPO is faster than GSPO"
at equal lr is partly a statement about step sizes. This study sweeps each arm over the learning rate
and the inner epochs and compares the arms on their frontiers.

Discovery block (seeds 0, 1, ...; the grid). Each arm of ``ARMS`` runs on ``template_task`` at every
learning rate of ``LR_FACTORS`` × ``LR_BASE`` (¼× to 4×, ratios of √2) and every number of inner epochs of
``EPOCHS``; a grid whose best learning rate is its largest is extended by √2 steps (at most
``MAX_EXTEND`` times) until the best is bracketed. Per setting: the mean steps to E[R] ≥ 0.9 (restricted:
never-reached seeds at the horizon), the fraction of seeds that reached it, and the mean template KL and
equivalent-set entropy at matched reward (interpolated at E[R] = 0.9 on the series that starts at step 0,
the initial policy, over the seeds that reached). The confirmation block also records each chosen
setting's seed-mean template drift after the last step (``experiments.toy.template_drift``).

Two settings per arm are then chosen by rules fixed here, before any confirmation seed ran:

- ``<arm>@best``: the setting with the fewest mean steps to the threshold (ties: the smaller lr ×
  epochs), the arm at its own best speed;
- ``<arm>@tax`` (and ``@tax20``, the same at ``SLOW_SPEED`` = 20 steps): the speed S* = the slowest of the main arms' best speeds (every arm has a setting at
  least that fast); each arm's setting with every seed reaching the threshold, a mean speed within
  ``SPEED_BAND`` of S* (or, with none there, the closest in speed), and the least mean template KL
  (``tax_setting``): the learning tax read
  along each arm's frontier at (about) equal speed. The confirmation block reports the speeds of these
  settings beside their tax, so "equal speed" is checked, not assumed.

Confirmation block (seeds from ``CONFIRM_FIRST_SEED``): every chosen setting runs once on fresh seeds,
and the predictions (``PREDICTIONS``) are decided there. The discovery ``StudyResult`` carries the grid
(``StudyResult.grid``) and the chosen settings evaluated on the discovery seeds.

It imports ``experiments.toy`` (the arms, their runs and measures) and is imported by
``experiments.toy_studies`` (whose ``run_toy`` runs it with the other toy studies).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from toymodel import get_scenario

from .claims import predict
from .study import CONFIRM_FIRST_SEED, Measure, StudyResult, sig
from .toy import (
    NO_LOW_CLIP,
    TEMPLATE,
    THREADS,
    THRESHOLD,
    Arm,
    curve_points,
    initial_values,
    measure_seed,
    run_arm,
    template_drift,
    template_probs_of,
)

NAME = "toy_frontier"
#: The main arms (toy_main's, plus GRPO without its lower clip), at toy_main's defaults apart from lr/epochs.
ARMS = (
    Arm("grpo", "GRPO (ε 0.2)", "grpo"),
    Arm("grpo_symclip", "GRPO-fix (ε 0.2)", "grpo_symclip"),
    Arm("grpo_no_low_clip", "GRPO, no lower clip", "grpo", NO_LOW_CLIP),
    Arm("gspo", "GSPO (ε 3e-4/4e-4)", "gspo"),
    Arm("gspo_eq86", "eq. 86 control", "gspo", {"estimator": "paper"}),
    Arm("dfpo_min_replace", "DFPO Min-Replace", "dfpo", {"transform": "min_replace"}),
)
#: The arms whose best speeds set the equal-speed point S*.
MAIN = ("grpo", "grpo_symclip", "gspo", "gspo_eq86", "dfpo_min_replace")
LR_BASE = 0.5
#: ¼× to 4× the toy's lr in ratios of √2: 9 points.
LR_FACTORS = tuple(float(2.0 ** (k / 2)) for k in range(-4, 5))
EPOCHS = (1, 2, 4, 8)
MAX_EXTEND = 4
#: The second speed at which the learning tax is read: toy_main's DFPO reaches E[R] ≥ 0.9 in about 20
#: steps at the toy's default lr (0.5, 4 inner epochs), a pace of learning, not the fastest possible.
SLOW_SPEED = 20.0
#: A setting counts as "at speed S*" when its mean steps lie in [S* (1 − band), S* (1 + band)].
SPEED_BAND = 0.1
STEPS = {"full": 200, "quick": 40}
SEEDS = {"full": (256, 1024), "quick": (8, 8)}
QUICK_LRS = (0.25, 1.0)
QUICK_EPOCHS = (1, 4)

PREDICTIONS = (
    predict("best_faster_than_gspo", measure="steps_to_threshold", arm="dfpo_min_replace@best",
            baseline="gspo@best", direction="lower"),
    predict("best_faster_than_control", measure="steps_to_threshold", arm="dfpo_min_replace@best",
            baseline="gspo_eq86@best", direction="lower"),
    predict("best_faster_than_grpo", measure="steps_to_threshold", arm="dfpo_min_replace@best",
            baseline="grpo@best", direction="lower"),
    predict("best_grpo_fix_slower", measure="steps_to_threshold", arm="grpo_symclip@best", baseline="grpo@best",
            direction="higher"),
    predict("equal_speed_tax_vs_gspo", measure="template_kl_at_threshold", arm="dfpo_min_replace@tax",
            baseline="gspo@tax", direction="lower"),
    predict("equal_speed_tax_vs_control", measure="template_kl_at_threshold", arm="dfpo_min_replace@tax",
            baseline="gspo_eq86@tax", direction="lower"),
    predict("equal_speed_entropy_vs_control", measure="equiv_entropy_at_threshold", arm="dfpo_min_replace@tax",
            baseline="gspo_eq86@tax", direction="higher"),
    predict("equal_speed_entropy_vs_gspo", measure="equiv_entropy_at_threshold", arm="dfpo_min_replace@tax",
            baseline="gspo@tax", direction="higher"),
    predict("speed20_tax_vs_gspo", measure="template_kl_at_threshold", arm="dfpo_min_replace@tax20",
            baseline="gspo@tax20", direction="lower"),
    predict("speed20_tax_vs_control", measure="template_kl_at_threshold", arm="dfpo_min_replace@tax20",
            baseline="gspo_eq86@tax20", direction="lower"),
    predict("speed20_entropy_vs_control", measure="equiv_entropy_at_threshold", arm="dfpo_min_replace@tax20",
            baseline="gspo_eq86@tax20", direction="higher"),
)  # fmt: skip
MEASURES = ("steps_to_threshold", "template_kl_at_threshold", "equiv_entropy_at_threshold", "final_reward")


def _measures(steps: int) -> list[Measure]:
    thr = f"E[R] ≥ {THRESHOLD:g}"
    return [
        Measure("steps_to_threshold", f"steps to {thr}", "lower", float(steps)),
        Measure("template_kl_at_threshold", f"template KL (learning tax) at {thr}", "lower"),
        Measure("equiv_entropy_at_threshold", f"equiv.-set entropy at {thr}", "higher"),
        Measure("final_reward", f"E[R] at step {steps}", "higher"),
    ]


def _per_seed(runs: dict[int, dict[str, np.ndarray]], arm: Arm) -> dict[str, dict[str, float]]:
    """measure key → {seed: value} for ``MEASURES``."""
    out: dict[str, dict[str, float]] = {k: {} for k in MEASURES}
    init = initial_values(TEMPLATE)
    for s, cols in runs.items():
        ms = measure_seed(cols, samples_per_step=arm.samples_per_step, sample_budget=10**12, early_step=1,
                          initial=init)  # fmt: skip
        for k in MEASURES:
            out[k][str(s)] = ms[k]
    return out


def _summary(vals: dict[str, dict[str, float]], steps: int) -> dict[str, Any]:
    """A grid row's seed means (restricted mean steps; tax and entropy over the seeds that reached)."""
    st = np.array(list(vals["steps_to_threshold"].values()), dtype=float)
    reached = np.isfinite(st)
    kl = np.array(list(vals["template_kl_at_threshold"].values()), dtype=float)
    ent = np.array(list(vals["equiv_entropy_at_threshold"].values()), dtype=float)

    def mean(x: np.ndarray) -> float | None:
        x = x[np.isfinite(x)]
        return sig(float(x.mean())) if x.size else None

    return {
        "n": int(st.size),
        "steps_mean": sig(float(np.where(reached, st, steps).mean())),
        "reached": sig(float(reached.mean())),
        "template_kl": mean(kl),
        "equiv_entropy": mean(ent),
    }


def _setting(arm: Arm, lr: float, epochs: int) -> Arm:
    return replace(arm, lr=float(lr), inner_epochs=int(epochs))


def best_setting(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The fewest mean steps to the threshold; ties go to the smaller lr × inner epochs."""
    return min(rows, key=lambda r: (r["steps_mean"], r["lr"] * r["inner_epochs"]))


def tax_setting(
    rows: Sequence[dict[str, Any]], speed: float, band: float = SPEED_BAND
) -> dict[str, Any] | None:
    """The least mean template KL among the settings where every seed reached the threshold and whose
    mean steps lie within ``band`` of ``speed`` (relative); with none in the band, the setting closest
    in speed. None when no setting had every seed reach the threshold."""
    ok = [r for r in rows if r["reached"] == 1.0 and r["template_kl"] is not None]
    if not ok:
        return None
    near = [r for r in ok if abs(r["steps_mean"] - speed) <= band * speed]
    if not near:
        near = [min(ok, key=lambda r: abs(r["steps_mean"] - speed))]
    return min(near, key=lambda r: r["template_kl"])


def _grid(
    arm: Arm,
    lrs: Sequence[float],
    epochs: Sequence[int],
    seeds: Sequence[int],
    steps: int,
    say: Callable[[str], Any],
) -> tuple[list[dict[str, Any]], dict[tuple[float, int], dict[str, dict[str, float]]]]:
    """One arm over lrs × epochs on ``seeds``, extended upward while its best lr is the largest."""
    rows, values = [], {}
    lrs = list(lrs)

    def run(lr: float, ep: int) -> None:
        a = _setting(arm, lr, ep)
        vals = _per_seed(run_arm(a, TEMPLATE, seeds, steps), a)
        values[(a.lr, a.inner_epochs)] = vals  # lrs are rounded to 6 digits (_sig) before they run
        rows.append(
            {"arm": arm.name, "lr": sig(a.lr), "inner_epochs": a.inner_epochs, **_summary(vals, steps)}
        )

    t0 = time.perf_counter()
    top = lrs[-1]
    for lr in lrs:
        for ep in epochs:
            run(lr, ep)
    for k in range(1, MAX_EXTEND + 1):
        if best_setting(rows)["lr"] < lrs[-1]:
            break
        lrs.append(sig(top * 2.0 ** (k / 2)))
        for ep in epochs:
            run(lrs[-1], ep)
    b = best_setting(rows)
    say(f"  {NAME}: {arm.name:<18} {len(rows)} settings, best lr {b['lr']} × {b['inner_epochs']} epochs "
        f"({b['steps_mean']} steps): {time.perf_counter() - t0:.1f} s")  # fmt: skip
    return rows, values


def _chosen(grid: Sequence[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], float]:
    """``<arm>@best`` and ``<arm>@tax`` → the grid row chosen (module docstring), and the speed S*."""
    by_arm = {a.name: [r for r in grid if r["arm"] == a.name] for a in ARMS}
    best = {name: best_setting(rows) for name, rows in by_arm.items()}
    speed = max(best[name]["steps_mean"] for name in MAIN)
    chosen = {f"{name}@best": row for name, row in best.items()}
    for name, rows in by_arm.items():
        for key, at in (("tax", speed), ("tax20", SLOW_SPEED)):
            row = tax_setting(rows, at)
            if row is not None:
                chosen[f"{name}@{key}"] = row
    return chosen, speed


def _result(block: str, first: int, chosen: dict[str, dict[str, Any]], per_seed: dict[str, Any], steps: int,
            speed: float, grid: list[dict[str, Any]], seconds: float, curves: dict[str, Any],
            drift: dict[str, dict[str, float]] | None = None) -> StudyResult:  # fmt: skip
    arms_by_name = {a.name: a for a in ARMS}
    arms = {}
    for key, row in chosen.items():
        name, what = key.split("@")
        a = _setting(arms_by_name[name], row["lr"], row["inner_epochs"])
        label = f"{a.label} @{what}: lr {row['lr']:g} × {row['inner_epochs']} epochs"
        arms[key] = {"label": label, "config": {**a.config(), "chosen_as": what}}
    n = len(next(iter(next(iter(per_seed.values())).values())))
    setting = (
        f"toymodel scenario `{TEMPLATE}`, {steps} steps per run, plain SGD, G = 8, one group per step, "
        f"query-preserved single mini-batch; {block} block: seeds {first}..{first + n - 1}. Discovery grid: "
        f"lr ∈ {LR_BASE:g} × {{{', '.join(f'{f:.3g}' for f in LR_FACTORS)}}} (extended by √2 while an arm's best "
        f"lr was the largest) × inner epochs {EPOCHS}, {SEEDS['full'][0]} seeds per setting in full mode. "
        f"Chosen settings (from the discovery block only): @best = fewest mean steps to E[R] ≥ {THRESHOLD:g}; "
        f"@tax = least mean template KL among settings within ±{SPEED_BAND:.0%} of S* = {speed:.4g} steps "
        f"(the slowest main arm's best speed) where every seed reached the threshold; @tax20 the same at "
        f"{SLOW_SPEED:g} steps."
    )
    tops = {a: max(r["lr"] for r in grid if r["arm"] == a) for a in dict.fromkeys(r["arm"] for r in grid)}
    unbracketed = [
        a for a, row in chosen.items() if a.endswith("@best") and row["lr"] == tops[a.split("@")[0]]
    ]
    return StudyResult(
        name=NAME,
        title="Toy: each arm at its own best step size (learning-rate × inner-epoch frontier)",
        question=(
            "Swept over the learning rate and the inner epochs, is DFPO still faster than GSPO and the eq. 86 "
            "control at each one's best setting, and does it pay less learning tax at equal speed?"
        ),
        setting=setting,
        baseline="gspo@best",
        arms=arms,
        measures=_measures(steps),
        per_seed=per_seed,
        curves=curves,
        predictions=list(PREDICTIONS),
        notes=[
            "Equal-lr comparisons (one step size for every arm) are toy_main's and toy_epsilon's; this study "
            "compares each arm at settings chosen for it on the discovery block.",
            "Template KL and equivalent-set entropy are read at E[R] = 0.9 (interpolated between steps), so "
            "they compare arms at matched reward; @tax and @tax20 additionally match the speed.",
            *(
                [
                    "Not bracketed: the best speed of "
                    + ", ".join(a.split("@")[0] for a in unbracketed)
                    + " is at the largest lr tried, after extending the grid; on the toy a bigger step keeps "
                    "reaching the threshold sooner (a few steps at the top of the grid), so '@best' measures how "
                    "few steps the largest updates need, and the speed comparison at each arm's best setting says "
                    "little about practice. The learning tax at equal speed (@tax, @tax20) is the informative "
                    "comparison."
                ]
                if unbracketed
                else []
            ),
        ],
        seconds=seconds,
        block=block,
        first_seed=first,
        grid=grid,
        drift=drift or {},
    )


def run_frontier(*, quick: bool = False, progress: Callable[[str], Any] | None = print) -> list[StudyResult]:
    """The discovery block (grid and chosen settings) and the confirmation block of ``toy_frontier``."""
    say = progress or (lambda _msg: None)
    mode = "quick" if quick else "full"
    steps = STEPS[mode]
    n_disc, n_conf = SEEDS[mode]
    lrs = [sig(LR_BASE * f) for f in LR_FACTORS] if not quick else list(QUICK_LRS)
    epochs = EPOCHS if not quick else QUICK_EPOCHS
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        t0 = time.perf_counter()
        grid: list[dict[str, Any]] = []
        values: dict[str, dict[tuple[float, int], Any]] = {}
        for arm in ARMS:
            rows, values[arm.name] = _grid(arm, lrs, epochs, range(n_disc), steps, say)
            grid += rows
        chosen, speed = _chosen(grid)
        disc = {
            k: values[k.split("@")[0]][(float(r["lr"]), int(r["inner_epochs"]))] for k, r in chosen.items()
        }
        out = [_result("discovery", 0, chosen, disc, steps, speed, grid, time.perf_counter() - t0, {})]
        t0 = time.perf_counter()
        arms_by_name = {a.name: a for a in ARMS}
        conf, curves, drift = {}, {"expected_reward": {}}, {}
        seeds = range(CONFIRM_FIRST_SEED, CONFIRM_FIRST_SEED + n_conf)
        pts = curve_points(steps)
        p0 = template_probs_of(TEMPLATE, get_scenario(TEMPLATE).initial_logits())
        for key, row in chosen.items():
            a = _setting(arms_by_name[key.split("@")[0]], row["lr"], row["inner_epochs"])
            runs = run_arm(a, TEMPLATE, seeds, steps, template_probs=True)
            conf[key] = _per_seed(runs, a)
            if len(runs) >= 2:
                drift[key] = template_drift(np.stack([c["template_probs_final"] - p0 for c in runs.values()]))
            curves["expected_reward"][key] = {
                "x": [int(i) + 1 for i in pts],
                "seeds": {str(s): [sig(float(x)) for x in cols["expected_reward"][pts]]
                          for s, cols in runs.items() if s < CONFIRM_FIRST_SEED + 32},
            }  # fmt: skip
        say(
            f"  {NAME}: confirmation, {len(chosen)} settings × {n_conf} seeds: {time.perf_counter() - t0:.1f} s"
        )
        out.append(_result("confirmation", CONFIRM_FIRST_SEED, chosen, conf, steps, speed, grid,
                           time.perf_counter() - t0, curves, drift))  # fmt: skip
        return out
    finally:
        torch.set_num_threads(threads)


__all__ = ["ARMS", "NAME", "PREDICTIONS", "best_setting", "run_frontier", "tax_setting"]
