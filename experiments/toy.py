"""The toy studies: the arms grid on the tabular toy, hundreds of seeds, paired by seed.

Each study trains every arm on one ``toymodel`` scenario for the same seeds and steps, turns each seed's
run into per-seed measures and curves, and returns an ``experiments.study.StudyResult`` (saved as
``<out_dir>/<study name>.json`` by ``run_toy``). The verdicts of its predictions are computed later from
the paired differences (``StudyResult.verdicts``); nothing here decides one.

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

How an arm runs. An arm that the batched toy supports (plain SGD or Adam, query-preserved mini-batches, no
reward-balanced buffer, Lopti or AR) runs all its seeds as one computation (``toymodel.simulate_seeds``);
the others run ``toymodel.simulate`` once per seed, with fewer seeds. Every arm of a study runs the same
seeds (the report pairs each arm with the baseline seed by seed), so a study with a per-seed arm runs all
its arms on the per-seed count; ``toy_batching`` and ``toy_low_prob`` run every arm through ``simulate``
(each study's ``setting`` says which arm ran how, on how many seeds). Both paths give every seed the same
random stream whatever the arm (common random numbers: seed s draws the same samples at step 1 in every
arm), so the differences are taken per seed. The batched toy does not compute the objective's metrics
(``asym``, ``clip/*``); where a study reports them, they come from ``simulate`` on the first
``metric_seeds`` seeds of the same arm.

Compute matching: every arm of a study has the same group size, groups per step, inner epochs,
mini-batches, steps and learning rate (plain SGD), unless the study varies exactly that (the group size
in ``toy_group_size``, the batching in ``toy_batching``, the clip range with bigger steps in
``toy_epsilon``, the optimizer and its learning rate in ``toy_optimizer``). Lopti's two stages double the
optimiser steps per batch (as in its public code); ``toy_low_prob`` says so.

Per-seed measures (``measure_seed``; the threshold is E[R] ≥ ``THRESHOLD`` = 0.9 of the exact expected
reward):

- ``steps_to_threshold``: the first step (1-based) whose E[R] ≥ 0.9; ``math.inf`` if never (right-
  censored, horizon = the run's steps); ``samples_to_threshold``: that step × G × groups per step,
  ``math.inf`` beyond the study's sample budget (the run length in samples of its arm with the fewest
  samples per step: every arm had at least that budget);
- ``final_reward`` (E[R] at the last step) and ``reward_at_step_K`` (an early, matched step);
- ``jitter2_expected_reward`` / ``jitter2_sampled_reward``: DFPO eq. 20 on the whole E[R] curve and on
  the curve of the sampled groups' mean reward (the training reward an LM run logs);
- ``equiv_entropy_*``, ``template_kl_*``, ``equiv_log_odds_*`` at the last step (``final``), at step K
  (``at_step_K``) and at matched reward (``at_threshold``: interpolated linearly at E[R] = 0.9 between
  the last step below and the first step at or above it, ``cancellation.diagnostics.value_at_threshold``,
  on the series that starts at step 0, the initial policy (``initial_values``), so a run that crosses at
  step 1 is read between steps 0 and 1; NaN for a seed that never gets there). Template KL exists on
  ``template_task`` only;
- the residuals ``shared_residual``, ``group_shared_residual``, ``sequence_net_residual``: the mean over
  the steps that had one (an update with a non-zero gross coefficient);
- ``asym`` (DFPO eq. 23), ``clip_frac``, ``clip_low_frac``, ``clip_high_frac``: the mean over the
  steps whose last optimiser step had a learning signal (``simulate`` only);
- ``update_frac``: the fraction of steps that updated (reward-balanced batching defers updates).

Study-level measure (not per seed; ``template_drift``, on scenarios with template contexts): the drift of
the seed-mean template distribution after the last step from the initial one, ‖mean_s(π_s − π_0)‖² over
the template contexts' actions, beside its sampling floor (what it would be if every seed drifted by a
zero-mean amount) and their difference, the systematic part (DFPO App. G, Sec. 3.3), with a bootstrap SE.
The per-seed template KL mixes this systematic drift with the seeds' zero-mean scatter.

Curves for the figures: per arm, each seed's ``expected_reward`` (and ``equiv_entropy``,
``template_kl`` or ``equiv_log_odds``) at ≤ ``CURVE_POINTS`` evenly spaced steps, for the first
``curve_seeds`` seeds (values to 6 significant digits), ``{"x": steps, "seeds": {seed: values}}``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cancellation.diagnostics import jitter2, steps_to_threshold, value_at_threshold
from toymodel import ROW_KEYS, get_scenario, simulate, simulate_seeds
from toymodel.batched import BATCHED_KEYS
from toymodel.simulate import DEFAULT_LR

from .stats import fmt_p, paired_difference, paired_t
from .study import (
    BLOCKS,
    CANCEL,
    CONFIRM_FIRST_SEED,
    CURVE_POINTS,
    DAPO,
    DFPO,
    LOPTI,
    REVIEW,
    SRC_CONTROL,
    SRC_COUPLING,
    SRC_ENTROPY,
    SRC_GROUP_SIZE,
    SRC_SPEED,
    SRC_SYMCLIP_SLOWER,
    SRC_TAX,
    TOL,
    Measure,
    Prediction,
    StudyResult,
    sig,
)

#: The reward threshold of steps-to-threshold and of "matched reward" (DFPO Table 2's compute-to-threshold).
THRESHOLD = 0.9
#: torch threads while a study runs (restored after): the toy's tensors are tiny, and on a shared 2-core
#: machine a second intra-op thread bought nothing when idle and cost up to 10× when another job was running.
THREADS = 1

# --------------------------------------------------------------------------------------------------
# sources (the papers' citations are in experiments.study, following docs/papers.md)

EARLIER_RUN = "Cancellation Lab: the hypothesis of an earlier tabular run"

#: The measures the toy cannot compute, said in every study's notes.
NOT_IN_TOY = (
    "Not measured by the toy: token-flip rates (cancellation-hypothesis paper App. C) and Energy by "
    "frequency bucket (DFPO eq. 24) are trainer-only diagnostics (scaledrun logs them), and benchmark "
    "accuracy (DFPO Table 1) has no toy analogue beyond the exact E[R]."
)


# --------------------------------------------------------------------------------------------------
# arms


@dataclass(frozen=True)
class Arm:
    """One arm: an objective with its parameters and the run's settings (``simulate``'s arguments)."""

    name: str
    label: str
    objective: str
    params: Mapping[str, Any] = field(default_factory=dict)
    group_size: int = 8
    num_groups: int = 1
    num_minibatches: int = 1
    batching: str = "query"
    inner_epochs: int = 4
    lr: float = DEFAULT_LR["sgd"]
    optimizer: str = "sgd"
    aggregation: str | None = None
    reward_balanced_rho: float | None = None
    lopti_eta: float | None = None
    ar_alpha: float | None = None

    @property
    def batched(self) -> bool:
        """Whether ``toymodel.simulate_seeds`` supports this arm (else ``simulate`` runs it per seed)."""
        return (
            self.batching == "query"
            and self.reward_balanced_rho is None
            and self.lopti_eta is None
            and self.ar_alpha is None
        )

    @property
    def samples_per_step(self) -> int:
        """Completions sampled per step (G × groups per step)."""
        return self.group_size * self.num_groups

    def run_kwargs(self) -> dict[str, Any]:
        """The keyword arguments ``simulate`` / ``simulate_seeds`` take (without scenario, seeds, steps)."""
        kw: dict[str, Any] = {
            "group_size": self.group_size,
            "lr": self.lr,
            "optimizer": self.optimizer,
            "inner_epochs": self.inner_epochs,
            "num_groups": self.num_groups,
            "num_minibatches": self.num_minibatches,
            "batching": self.batching,
            "aggregation": self.aggregation,
        }
        if not self.batched:
            kw.update(
                reward_balanced_rho=self.reward_balanced_rho, lopti_eta=self.lopti_eta, ar_alpha=self.ar_alpha
            )
        return {**kw, **self.params}

    def config(self) -> dict[str, Any]:
        """The arm as plain data (for the saved study)."""
        out = {"objective": self.objective, **dict(self.params)}
        out.update(
            group_size=self.group_size,
            num_groups=self.num_groups,
            num_minibatches=self.num_minibatches,
            batching=self.batching,
            inner_epochs=self.inner_epochs,
            lr=self.lr,
            optimizer=self.optimizer,
        )
        for k in ("aggregation", "reward_balanced_rho", "lopti_eta", "ar_alpha"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out


def run_arm(
    arm: Arm,
    scenario: str,
    seeds: Sequence[int],
    steps: int,
    *,
    per_seed: bool = False,
    template_probs: bool = False,
) -> dict[int, dict[str, np.ndarray]]:
    """Train ``arm`` for every seed: seed → {row key → (steps,) float array}.

    The batched toy when it supports the arm (its keys, ``BATCHED_KEYS``), else ``simulate`` per seed
    (every ``ROW_KEYS``); ``per_seed=True`` forces ``simulate`` (for the objective's metrics).
    ``template_probs=True`` adds ``"template_probs_final"`` to each seed: the policy's probabilities on
    the scenario's template contexts after the last step (``template_probs``), for ``template_drift``.
    """
    seeds = [int(s) for s in seeds]
    if arm.batched and not per_seed:
        res = simulate_seeds(scenario, arm.objective, seeds, steps=steps, return_logits=template_probs,
                             **arm.run_kwargs())  # fmt: skip
        out = {s: {k: res[k][i].numpy().copy() for k in BATCHED_KEYS} for i, s in enumerate(seeds)}
        if template_probs:
            for i, s in enumerate(seeds):
                out[s]["template_probs_final"] = template_probs_of(scenario, res["logits"][i])
        return out
    out = {}
    last: dict[str, torch.Tensor] = {}

    def keep(_step: int, logits: torch.Tensor) -> None:
        last["logits"] = logits

    for s in seeds:
        rows = simulate(scenario, arm.objective, steps=steps, seed=s, callback=keep if template_probs else None,
                        **arm.run_kwargs())  # fmt: skip
        out[s] = {k: np.array([r[k] for r in rows], dtype=float) for k in ROW_KEYS}
        if template_probs:
            out[s]["template_probs_final"] = template_probs_of(scenario, last["logits"])
    return out


def template_probs_of(scenario: str, logits: torch.Tensor) -> np.ndarray:
    """π(a | h) on the scenario's template contexts h, flattened over (context, valid action), float64."""
    sc = get_scenario(scenario)
    ids = sc.template_context_ids()
    if not ids.numel():
        return np.zeros(0)
    valid = sc.policy().valid[ids]
    probs = torch.softmax(logits.detach().to(torch.float64)[ids], -1)
    return probs[valid].numpy().copy()


def initial_values(scenario: str) -> dict[str, float]:
    """The initial policy's (step 0's) ``expected_reward``, ``equiv_entropy``, ``equiv_log_odds`` and
    ``template_kl`` (0: the template KL is measured from the initial policy), exact."""
    sc = get_scenario(scenario)
    st = sc.policy().stats(sc.initial_logits())
    return {
        "expected_reward": st["expected_reward"],
        "equiv_entropy": st["equiv_entropy"],
        "equiv_log_odds": st["equiv_log_odds"],
        "template_kl": 0.0,
    }


#: Bootstrap resamples of ``template_drift``'s standard error (seeded: a rerun gives the same SE).
DRIFT_BOOT = 2000


def template_drift(drifts: np.ndarray, *, n_boot: int = DRIFT_BOOT, seed: int = 0) -> dict[str, float]:
    """The systematic part of the template drift over seeds (DFPO App. G, Sec. 3.3), from the (n, d) per-seed
    drift vectors x_s = π_s(· | template) − π_0(· | template) after the last step.

    - ``drift2``: ‖x̄‖², the squared drift of the seed-mean template distribution from the initial one;
    - ``floor``: Σ_j Var_s(x_sj)/n (sample variance), what ``drift2`` averages when every seed's drift has
      mean 0 (zero-mean, seed-to-seed drift only): the sampling floor;
    - ``systematic``: ``drift2`` − ``floor`` = Σ_{s≠t} x_s·x_t / (n(n − 1)), unbiased for ‖E x‖² (can be < 0);
      ``se``: its bootstrap standard error over seeds (``n_boot`` resamples);
    - ``per_seed2``: the mean of ‖x_s‖² (systematic plus zero-mean part, the per-seed drift); ``n``.
    """
    x = np.asarray(drifts, dtype=float)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"`drifts` must be an (n, d) array with n ≥ 2 seeds, got shape {x.shape}")
    n = x.shape[0]

    def stat(m: np.ndarray) -> tuple[float, float]:
        mean = m.mean(0)
        d2 = float(mean @ mean)
        floor = float(m.var(0, ddof=1).sum() / n)
        return d2, floor

    d2, floor = stat(x)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot):
        b2, bf = stat(x[rng.integers(0, n, n)])
        boots.append(b2 - bf)
    return {
        "n": n,
        "drift2": d2,
        "floor": floor,
        "systematic": d2 - floor,
        "se": float(np.std(boots, ddof=1)) if n_boot > 1 else math.nan,
        "per_seed2": float((x * x).sum(1).mean()),
    }


# --------------------------------------------------------------------------------------------------
# per-seed measures


def _mean_finite(x: np.ndarray, where: np.ndarray | None = None) -> float:
    x = np.asarray(x, dtype=float)
    keep = np.isfinite(x) if where is None else (np.isfinite(x) & where)
    return float(x[keep].mean()) if keep.any() else math.nan


#: Objective metrics (``simulate`` rows) → measure keys.
METRIC_MEASURES = {
    "asym": "asym",
    "clip/frac": "clip_frac",
    "clip/low_frac": "clip_low_frac",
    "clip/high_frac": "clip_high_frac",
}
RESIDUALS = ("shared_residual", "group_shared_residual", "sequence_net_residual")


def measure_seed(
    cols: Mapping[str, np.ndarray],
    *,
    samples_per_step: int,
    sample_budget: int,
    early_step: int,
    threshold: float = THRESHOLD,
    initial: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Every per-seed measure of one run (``cols``: row key → (steps,) array, as ``run_arm`` gives).

    See the module docstring for the definitions. Objective metrics are included only when ``cols``
    has them (``simulate`` rows). ``initial``: the initial policy's values (``initial_values``), step 0
    of the series the measures "at matched reward" interpolate on, so a run that crosses the threshold at
    its first step is read between step 0 and step 1 (without it the series starts at step 1 and such a
    run reads step 1's value).
    """
    er = np.asarray(cols["expected_reward"], dtype=float)
    steps = er.shape[0]
    step_no = np.asarray(cols["step"], dtype=float)
    hit = steps_to_threshold(er, threshold)
    k = None if hit is None else int(hit)
    early = early_step - 1 if early_step <= steps else None  # a run shorter than step K has no value there

    def at(v: np.ndarray, i: int | None) -> float:
        return math.nan if i is None else float(v[i])

    out: dict[str, float] = {}
    out["steps_to_threshold"] = math.inf if k is None else float(step_no[k])
    samples = math.inf if k is None else float(step_no[k]) * samples_per_step
    out["samples_to_threshold"] = samples if samples <= sample_budget else math.inf
    out["final_reward"] = float(er[-1])
    out[f"reward_at_step_{early_step}"] = at(er, early)
    budget_step = sample_budget // samples_per_step  # the step at which this arm has drawn the budget
    out["reward_at_sample_budget"] = float(er[min(budget_step, steps) - 1])
    out["jitter2_expected_reward"] = jitter2(er) if steps >= 3 else math.nan
    sr = np.asarray(cols["sampled_reward"], dtype=float)
    out["jitter2_sampled_reward"] = jitter2(sr) if steps >= 3 else math.nan
    for key in ("equiv_entropy", "template_kl", "equiv_log_odds"):
        v = np.asarray(cols[key], dtype=float)
        out[f"{key}_final"] = float(v[-1])
        out[f"{key}_at_step_{early_step}"] = at(v, early)
        if initial is None:
            out[f"{key}_at_threshold"] = value_at_threshold(er, v, threshold)
        else:
            out[f"{key}_at_threshold"] = value_at_threshold(
                np.concatenate([[initial["expected_reward"]], er]),
                np.concatenate([[initial[key]], v]),
                threshold,
            )
    for key in RESIDUALS:
        out[key] = _mean_finite(cols[key])
    updated = np.asarray(cols["updated"], dtype=float)
    out["update_frac"] = float(updated.mean())
    if "pos_high_up" in cols:  # the per-seed loop only (the Lopti paper's Fig. 3), over steps 1..K: a seed
        # draws the same first batch in every arm, and the arms' policies have not drifted apart yet
        out["pos_high_up"] = _mean_finite(np.asarray(cols["pos_high_up"], dtype=float)[:early_step])
    if "asym" in cols:
        signal = (updated == 1.0) & (np.asarray(cols["zero_adv_group_frac"], dtype=float) < 1.0)
        for src, dst in METRIC_MEASURES.items():
            out[dst] = _mean_finite(cols[src], signal)
    return out


def curve_points(steps: int, points: int = CURVE_POINTS) -> np.ndarray:
    """0-based indices of ≤ ``points`` evenly spaced steps, the first and the last included."""
    return np.unique(np.linspace(0, steps - 1, min(points, steps)).round().astype(int))


# --------------------------------------------------------------------------------------------------
# a study: its arms, sizes, measures and predictions


@dataclass(frozen=True)
class Sizes:
    """How big a study runs: seeds of the batched arms, seeds of the per-seed (``simulate``) arms, steps,
    the seeds on which a batched arm is re-run with ``simulate`` for the objective's metrics (0: none),
    the seeds kept in the curves, and the confirmation block's seeds (batched, per-seed): a per-seed
    arm runs ``simulate`` once per seed (about 30 s per 32 seeds of a study), so the per-seed studies
    confirm on fewer seeds than the batched ones."""

    seeds: int
    sim_seeds: int
    steps: int
    metric_seeds: int = 0
    curve_seeds: int = 32
    confirm_seeds: int = 1024
    confirm_sim_seeds: int = 256


@dataclass(frozen=True)
class ToyStudy:
    """A toy study's definition; ``run`` trains it and returns its ``StudyResult``."""

    name: str
    title: str
    question: str
    scenario: str
    baseline: str
    arms: tuple[Arm, ...]
    measures: tuple[str, ...]
    curves: tuple[str, ...]
    predictions: tuple[Prediction, ...]
    notes: tuple[str, ...]
    full: Sizes
    quick: Sizes
    early_step: int = 20
    per_seed_only: bool = False
    derive: Callable[[ToyStudy, dict[str, dict[str, dict[str, float]]], int], list[str]] | None = None

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(f"study {self.name!r} has no arm {name!r}; it has {[a.name for a in self.arms]}")

    def sample_budget(self, steps: int) -> int:
        """Samples every arm drew: the run length × the fewest samples per step of any arm."""
        return steps * min(a.samples_per_step for a in self.arms)

    def measure_defs(self, steps: int) -> list[Measure]:
        k = self.early_step
        budget = self.sample_budget(steps)
        thr = f"E[R] ≥ {THRESHOLD:g}"
        defs = {
            "steps_to_threshold": Measure("steps_to_threshold", f"steps to {thr}", "lower", float(steps)),
            "samples_to_threshold": Measure(
                "samples_to_threshold", f"samples to {thr} (budget {budget})", "lower", float(budget)
            ),
            "final_reward": Measure("final_reward", f"E[R] at step {steps}", "higher"),
            f"reward_at_step_{k}": Measure(f"reward_at_step_{k}", f"E[R] at step {k}", "higher"),
            "reward_at_sample_budget": Measure(
                "reward_at_sample_budget", f"E[R] after {budget} samples", "higher"
            ),
            "jitter2_expected_reward": Measure(
                "jitter2_expected_reward", "Jitter₂ of E[R] (eq. 20)", "lower"
            ),
            "jitter2_sampled_reward": Measure(
                "jitter2_sampled_reward", "Jitter₂ of the sampled reward (eq. 20)", "lower"
            ),
            "equiv_entropy_at_threshold": Measure(
                "equiv_entropy_at_threshold", f"equiv.-set entropy at {thr}", "higher"
            ),
            f"equiv_entropy_at_step_{k}": Measure(
                f"equiv_entropy_at_step_{k}", f"equiv.-set entropy at step {k}", "higher"
            ),
            "equiv_entropy_final": Measure(
                "equiv_entropy_final", f"equiv.-set entropy at step {steps}", "higher"
            ),
            "template_kl_at_threshold": Measure(
                "template_kl_at_threshold", f"template KL (learning tax) at {thr}", "lower"
            ),
            f"template_kl_at_step_{k}": Measure(
                f"template_kl_at_step_{k}", f"template KL at step {k}", "lower"
            ),
            "template_kl_final": Measure("template_kl_final", f"template KL at step {steps}", "lower"),
            "equiv_log_odds_at_threshold": Measure(
                "equiv_log_odds_at_threshold", f"equiv. log-odds τa/τb at {thr}", None
            ),
            "equiv_log_odds_final": Measure(
                "equiv_log_odds_final", f"equiv. log-odds τa/τb at step {steps}", None
            ),
            "shared_residual": Measure("shared_residual", "shared residual (eq. 72)", "lower"),
            "group_shared_residual": Measure("group_shared_residual", "group-shared residual", "lower"),
            "sequence_net_residual": Measure("sequence_net_residual", "sequence-net residual", "lower"),
            "asym": Measure("asym", "Asym (eq. 23)", "lower"),
            "clip_frac": Measure("clip_frac", "clip fraction", None),
            "clip_low_frac": Measure("clip_low_frac", "clip fraction, lower side", None),
            "clip_high_frac": Measure("clip_high_frac", "clip fraction, upper side", None),
            "update_frac": Measure("update_frac", "fraction of steps that updated", None),
            "pos_high_up": Measure(
                "pos_high_up",
                f"high-probability tokens of Â > 0 completions updated upwards, steps 1-{k} (Fig. 3)",
                "higher",
            ),
            "gain_vs_gspo": Measure("gain_vs_gspo", "fraction of GSPO's steps saved (same G)", "higher"),
            "gain_vs_control": Measure(
                "gain_vs_control", "fraction of the eq. 86 control's steps saved (same G)", "higher"
            ),
        }
        return [defs[m] for m in self.measures]

    def measure_keys(self) -> list[str]:
        return [m.key for m in self.measure_defs(1)]

    def run(
        self,
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
        """Train every arm and build the ``StudyResult`` (sizes: ``quick`` or ``full``, each overridable).

        ``block="confirmation"`` runs the confirmation block: seeds from ``CONFIRM_FIRST_SEED``, the
        sizes' ``confirm_seeds`` / ``confirm_sim_seeds`` (unless ``seeds`` / ``sim_seeds`` are given)."""
        if block not in BLOCKS:
            raise ValueError(f"`block` must be one of {BLOCKS}, got {block!r}")
        base = self.quick if quick else self.full
        confirm = block == "confirmation"
        if confirm and not quick:  # quick mode's confirmation block is as small as its discovery block
            base = Sizes(base.confirm_seeds, base.confirm_sim_seeds, base.steps, base.metric_seeds,
                         base.curve_seeds, base.confirm_seeds, base.confirm_sim_seeds)  # fmt: skip
        sz = Sizes(
            seeds=base.seeds if seeds is None else seeds,
            sim_seeds=base.sim_seeds if sim_seeds is None else sim_seeds,
            steps=base.steps if steps is None else steps,
            metric_seeds=base.metric_seeds if metric_seeds is None else metric_seeds,
            curve_seeds=base.curve_seeds if curve_seeds is None else curve_seeds,
        )
        threads = torch.get_num_threads()
        torch.set_num_threads(THREADS)
        try:
            return self._run(sz, progress, first=CONFIRM_FIRST_SEED if confirm else 0, block=block)
        finally:
            torch.set_num_threads(threads)

    def _run(
        self, sz: Sizes, progress: Callable[[str], Any] | None, *, first: int, block: str
    ) -> StudyResult:
        say = progress or (lambda _msg: None)
        started = time.perf_counter()
        keys = self.measure_keys()
        budget = self.sample_budget(sz.steps)
        pts = curve_points(sz.steps)
        per_seed: dict[str, dict[str, dict[str, float]]] = {}
        curves: dict[str, dict[str, dict[str, Any]]] = {c: {} for c in self.curves}
        paths: dict[str, str] = {}
        # the report pairs every arm with the baseline seed by seed, so every arm runs the same seeds: the
        # batched count when every arm is batched, else the per-seed count (batched arms then run fewer)
        all_batched = not self.per_seed_only and all(a.batched for a in self.arms)
        initial = initial_values(self.scenario)
        has_template = bool(get_scenario(self.scenario).template_context_ids().numel())
        drift: dict[str, dict[str, float]] = {}
        for arm in self.arms:
            t0 = time.perf_counter()
            batched = arm.batched and not self.per_seed_only
            n = sz.seeds if all_batched else sz.sim_seeds
            runs = run_arm(arm, self.scenario, range(first, first + n), sz.steps, per_seed=not batched,
                           template_probs=has_template)  # fmt: skip
            if has_template and n >= 2:
                p0 = template_probs_of(self.scenario, get_scenario(self.scenario).initial_logits())
                drift[arm.name] = template_drift(
                    np.stack([cols["template_probs_final"] - p0 for cols in runs.values()])
                )
            metric_runs: dict[int, dict[str, np.ndarray]] = {}
            m = min(sz.metric_seeds, n)
            if batched and m > 0 and any(k in METRIC_MEASURES.values() for k in keys):
                metric_runs = run_arm(arm, self.scenario, range(first, first + m), sz.steps, per_seed=True)
            vals: dict[str, dict[str, float]] = {k: {} for k in keys}
            kw = {
                "samples_per_step": arm.samples_per_step,
                "sample_budget": budget,
                "early_step": self.early_step,
                "initial": initial,
            }
            for s, cols in runs.items():
                ms = measure_seed(cols, **kw)
                if s in metric_runs:
                    ms.update(
                        {
                            k: v
                            for k, v in measure_seed(metric_runs[s], **kw).items()
                            if k in METRIC_MEASURES.values()
                        }
                    )
                for k in keys:
                    if k in ms:
                        vals[k][str(s)] = ms[k]
            per_seed[arm.name] = {k: v for k, v in vals.items() if v}
            for c in self.curves:
                curves[c][arm.name] = {
                    "x": [int(i) + 1 for i in pts],
                    "seeds": {
                        str(s): [sig(float(x)) for x in cols[c][pts]]
                        for s, cols in runs.items()
                        if s < first + sz.curve_seeds
                    },
                }
            paths[arm.name] = (
                f"simulate_seeds, {n} seeds" if batched else f"simulate per seed, {n} seeds"
            ) + (
                f" (+ simulate on seeds {first}-{first + m - 1} for the objective's metrics)"
                if metric_runs
                else ""
            )
            say(
                f"  {self.name}: {arm.name:<28} {paths[arm.name]}, {sz.steps} steps: {time.perf_counter() - t0:.1f} s"
            )
        notes = list(self.notes)
        if self.derive is not None:
            notes += self.derive(self, per_seed, sz.steps)
        notes.append(NOT_IN_TOY)
        arms = {
            a.name: {"label": a.label, "config": {**a.config(), "path": paths[a.name]}} for a in self.arms
        }
        batched_arms = [a.name for a in self.arms if a.batched and not self.per_seed_only]
        loop_arms = [a.name for a in self.arms if a.name not in batched_arms]
        n_curve = min(sz.curve_seeds, sz.seeds if all_batched else sz.sim_seeds)
        parts = [
            f"toymodel scenario `{self.scenario}`, {sz.steps} steps per run; "
            f"{_shared_settings(self.arms)}; threshold E[R] ≥ {THRESHOLD:g} (the exact expected reward); "
            f"{block.capitalize()} block: seeds {first}..{first}+n−1, the same seed ids in every arm (common "
            "random numbers).",
        ]
        n_seeds = sz.seeds if all_batched else sz.sim_seeds
        if batched_arms:
            parts.append(
                f"{'All arms' if not loop_arms else 'Arms ' + ', '.join(batched_arms)}: toymodel.simulate_seeds "
                f"(batched), {n_seeds} seeds."
            )
        if loop_arms:
            parts.append(
                f"{'All arms' if not batched_arms else 'Arms ' + ', '.join(loop_arms)}: toymodel.simulate per "
                f"seed (an arm the batched toy does not support), {n_seeds} seeds"
                + (
                    ", and every arm of the study runs these seeds so that all pair seed by seed."
                    if batched_arms
                    else "."
                )
            )
        if batched_arms and sz.metric_seeds and any(k in METRIC_MEASURES.values() for k in keys):
            parts.append(
                "Objective metrics (Asym, clip fractions), which the batched toy does not compute: "
                f"toymodel.simulate on seeds {first}-{first + min(sz.metric_seeds, sz.seeds) - 1} of each batched arm."
            )
        parts.append(
            f"Sample budget of samples-to-threshold: {budget} samples. Curves: seeds {first}-{first + n_curve - 1} at "
            f"≤ {CURVE_POINTS} evenly spaced steps."
        )
        setting = " ".join(parts)
        return StudyResult(
            name=self.name,
            title=self.title,
            question=self.question,
            setting=setting,
            baseline=self.baseline,
            arms=arms,
            measures=self.measure_defs(sz.steps),
            per_seed=per_seed,
            curves=curves,
            predictions=list(self.predictions),
            notes=notes,
            seconds=time.perf_counter() - started,
            block=block,
            first_seed=first,
            drift=drift,
        )


def _shared_settings(arms: Sequence[Arm]) -> str:
    """The run settings, each given once when every arm shares it, per arm otherwise."""
    parts = []
    for attr, name in (
        ("group_size", "G"),
        ("num_groups", "groups per step"),
        ("inner_epochs", "inner epochs"),
        ("num_minibatches", "mini-batches"),
        ("lr", "lr"),
        ("optimizer", "optimizer"),
        ("batching", "mini-batch split"),
    ):
        values = [getattr(a, attr) for a in arms]
        if len(set(values)) == 1:
            parts.append(f"{name} = {values[0]}")
        else:
            parts.append(f"{name} varies by arm ({', '.join(sorted({str(v) for v in values}))})")
    return ", ".join(parts)


# --------------------------------------------------------------------------------------------------
# the studies

TEMPLATE = "template_task"
EQUIV = "equivalent_solutions"
#: GSPO's / DFPO's clip range (3e-4 / 4e-4) is each objective's default; these widen it.
WIDE_SEQ = {"epsilon_low": 0.2, "epsilon_high": 0.2}
WIDE_TOK = {"epsilon_low": 0.4, "epsilon_high": 0.4}
#: GRPO without its lower clip: ε_low → 1 (the objectives need ε_low < 1; at 1 − 1e-9 the lower bound
#: 1e-9 never binds), so the clip is [0, 1 + ε_high] like GRPO-fix's for positive advantages and PPO's upper
#: bound alone for negative ones: the arm that separates "symmetric" from "no lower bound".
NO_LOW_CLIP = {"epsilon_low": 1 - 1e-9, "epsilon_high": 0.2}


_p = Prediction  # (claim, source, measure, arm, baseline, direction), positionally


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
#: DFPO App. K.2-K.4: Min-Replace only shrinks coefficients (φ_i = s̄_min/s̄_i ≤ 1, eq. 87-88): "smaller
#: effective step sizes, potentially slowing convergence" against the eq. 86 control, its baseline.
_K24 = f"{DFPO}, App. K.2-K.4 (eq. 86-88, 92): Min-Replace's conservative shrinkage slows convergence"
#: DFPO App. K.4 (2): "clipping/KL constraints trigger less frequently".
_K4_CLIP = f"{DFPO}, App. K.4 (2): Min-Replace suppresses tail ratios, so clipping triggers less often"
_T2 = SRC_SPEED
_CTRL = SRC_CONTROL
_TAX = SRC_TAX
_GSR = f"{DFPO}, Sec. 4.4 (eq. 17-18); Prop. 3.1"
_ENT = SRC_ENTROPY
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
    _p("DFPO Min-Replace reaches E[R] ≥ 0.9 in fewer steps than GSPO", _T2, "steps_to_threshold",
       "dfpo_min_replace", "gspo", "lower"),
    _p("DFPO Orth-Proj reaches E[R] ≥ 0.9 in fewer steps than GSPO", _T2, "steps_to_threshold",
       "dfpo_orth_proj_pos", "gspo", "lower"),
    _p("DFPO Min-Replace reaches E[R] ≥ 0.9 later than the eq. 86 control (Min-Replace shrinks every "
       "non-minimal weight: smaller effective steps)", _K24, "steps_to_threshold", "dfpo_min_replace",
       "gspo_eq86", "higher"),
    _p("DFPO Min-Replace triggers clipping less often than the eq. 86 control (clip fraction)", _K4_CLIP,
       "clip_frac", "dfpo_min_replace", "gspo_eq86", "lower"),
    _p("DFPO Orth-Proj reaches E[R] ≥ 0.9 in fewer steps than the eq. 86 control (credit to the transform)",
       _CTRL, "steps_to_threshold", "dfpo_orth_proj_pos", "gspo_eq86", "lower"),
    _p("DFPO's E[R] curve has lower Jitter₂ than GSPO's", f"{DFPO}, Sec. 4.5 Prediction 2 (eq. 20-21); Sec. 6",
       "jitter2_expected_reward", "dfpo_min_replace", "gspo", "lower"),
    _p("DFPO ends with a higher E[R] than GSPO", f"{DFPO}, Sec. 4.5 Prediction 3 (eq. 22); Table 1",
       "final_reward", "dfpo_min_replace", "gspo", "higher"),
    _p("DFPO keeps a higher equivalent-set entropy than GSPO at matched reward", _ENT,
       "equiv_entropy_at_threshold", "dfpo_min_replace", "gspo", "higher"),
    _p("DFPO keeps a higher equivalent-set entropy than the eq. 86 control at matched reward", f"{_ENT}; {REVIEW}",
       "equiv_entropy_at_threshold", "dfpo_min_replace", "gspo_eq86", "higher"),
    _p("DFPO pays less learning tax (template KL) than GSPO at matched reward", _TAX,
       "template_kl_at_threshold", "dfpo_min_replace", "gspo", "lower"),
    _p("DFPO pays less learning tax (template KL) than the eq. 86 control at matched reward", f"{_TAX}; {REVIEW}",
       "template_kl_at_threshold", "dfpo_min_replace", "gspo_eq86", "lower"),
    _p("DFPO's transform lowers Asym relative to GSPO", f"{DFPO}, Sec. 6.1 (eq. 23)", "asym",
       "dfpo_min_replace", "gspo", "lower"),
    _p("DFPO cancels on tokens the whole group shares, GSPO does not (group-shared residual)", _GSR,
       "group_shared_residual", "dfpo_min_replace", "gspo", "lower"),
    _p("DFPO ends higher than its no-stop-grad ablation", f"{DFPO}, Sec. 6.2 Table 3", "final_reward",
       "dfpo_min_replace", "dfpo_no_stop_grad", "higher", by_construction=_NO_GRAD),
    _p("DFPO reaches E[R] ≥ 0.9 sooner than its no-stop-grad ablation", f"{DFPO}, Sec. 6.2 Table 3",
       "steps_to_threshold", "dfpo_min_replace", "dfpo_no_stop_grad", "lower", by_construction=_NO_GRAD),
    _p("DFPO ends higher than the global 0.5 scaling (not just a smaller step)", f"{DFPO}, Sec. 6.2 Table 3",
       "final_reward", "dfpo_min_replace", "dfpo_scale_half", "higher", by_construction=_HALF),
    _p("DFPO reaches E[R] ≥ 0.9 sooner than the global 0.5 scaling", f"{DFPO}, Sec. 6.2 Table 3",
       "steps_to_threshold", "dfpo_min_replace", "dfpo_scale_half", "lower", by_construction=_HALF),
    _p("DFPO Orth-Proj (raw) cancels on tokens the whole group shares, GSPO does not", _GSR,
       "group_shared_residual", "dfpo_orth_proj", "gspo", "lower"),
    _p("DFPO truncate-and-rebalance cancels on tokens the whole group shares, GSPO does not", _GSR,
       "group_shared_residual", "dfpo_truncate", "gspo", "lower"),
    _p("DFPO Orth-Proj (raw) reaches E[R] ≥ 0.9 in fewer steps than the eq. 86 control", _CTRL,
       "steps_to_threshold", "dfpo_orth_proj", "gspo_eq86", "lower"),
    _p("DFPO truncate-and-rebalance reaches E[R] ≥ 0.9 in fewer steps than the eq. 86 control", _CTRL,
       "steps_to_threshold", "dfpo_truncate", "gspo_eq86", "lower"),
    _p("GRPO-fix leaves a lower group-shared residual than GRPO", f"{DFPO}, App. F eq. 75-76; App. H eq. 79-82",
       "group_shared_residual", "grpo_symclip", "grpo", "lower"),
    _p("GRPO-fix ends higher than GRPO", f"{DFPO}, Table 1 (GRPO-fix > GRPO)", "final_reward", "grpo_symclip",
       "grpo", "higher"),
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


_T4 = SRC_GROUP_SIZE
_GS_PREDICTIONS = (
    *(
        _p(f"G = {g}: DFPO reaches E[R] ≥ 0.9 in fewer steps than GSPO", _T4, "steps_to_threshold",
           f"dfpo_G{g}", f"gspo_G{g}", "lower")
        for g in (2, 4, 8, 16)
    ),
    *(
        _p(f"G = {g}: DFPO reaches E[R] ≥ 0.9 in fewer steps than the eq. 86 control", _CTRL,
           "steps_to_threshold", f"dfpo_G{g}", f"gspo_eq86_G{g}", "lower")
        for g in (2, 4, 8, 16)
    ),
    _p("DFPO's relative gain over GSPO is larger at G = 16 than at G = 2", _T4, "gain_vs_gspo", "dfpo_G16",
       "dfpo_G2", "higher"),
    _p("DFPO's relative gain over GSPO is larger at G = 8 than at G = 2", _T4, "gain_vs_gspo", "dfpo_G8",
       "dfpo_G2", "higher"),
    _p("DFPO's relative gain over the eq. 86 control is larger at G = 16 than at G = 2", f"{_T4}; {REVIEW}",
       "gain_vs_control", "dfpo_G16", "dfpo_G2", "higher"),
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


_QB = f"{CANCEL}, Sec. 4 (query-preserved mini-batching, eq. 14; Table 2)"
_RB = f"{CANCEL}, Sec. 4 (reward-balanced batching; Table 2)"
_BT_PREDICTIONS = (
    _p("GRPO: query-preserved mini-batches leave a lower group-shared residual than random ones", _QB,
       "group_shared_residual", "grpo_query", "grpo_random", "lower"),
    _p("DFPO: query-preserved mini-batches leave a lower group-shared residual than random ones", _QB,
       "group_shared_residual", "dfpo_query", "dfpo_random", "lower"),
    _p("GRPO: query-preserved mini-batches reach E[R] ≥ 0.9 sooner than random ones", _QB,
       "steps_to_threshold", "grpo_query", "grpo_random", "lower"),
    _p("DFPO: query-preserved mini-batches reach E[R] ≥ 0.9 sooner than random ones", _QB,
       "steps_to_threshold", "dfpo_query", "dfpo_random", "lower"),
    _p("GRPO: query-preserved mini-batches end higher than random ones", _QB, "final_reward", "grpo_query",
       "grpo_random", "higher"),
    _p("GRPO: reward-balanced batching (ρ = 0.25) reaches E[R] ≥ 0.9 sooner", _RB, "steps_to_threshold",
       "grpo_query_rb25", "grpo_query", "lower"),
    _p("DFPO: reward-balanced batching (ρ = 0.25) reaches E[R] ≥ 0.9 sooner", _RB, "steps_to_threshold",
       "dfpo_query_rb25", "dfpo_query", "lower"),
    _p("GRPO: reward-balanced batching (ρ = 0.25) ends higher", _RB, "final_reward", "grpo_query_rb25",
       "grpo_query", "higher"),
    _p("GRPO: reward-balanced batching (ρ = 0.125) reaches E[R] ≥ 0.9 sooner", _RB, "steps_to_threshold",
       "grpo_query_rb125", "grpo_query", "lower"),
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
_LPS = f"{LOPTI}, Sec. 4.1-4.2, 5"
_LP_FIG3 = f"{LOPTI}, Sec. 4.2, Fig. 3"
_LP_PREDICTIONS = tuple(
    p
    for arm, lab in (("grpo_ar", "Advantage Reweighting"), ("grpo_lopti", "Lopti"), ("grpo_ar_lopti", "AR + Lopti"))
    for p in (
        _p(f"{lab} reaches E[R] ≥ 0.9 in fewer steps than GRPO", _LPS, "steps_to_threshold", arm, "grpo", "lower"),
        _p(f"{lab} has a higher E[R] than GRPO at step {_K_LP} (same budget)", _LPS, f"reward_at_step_{_K_LP}", arm,
           "grpo", "higher"),
        _p(f"{lab} ends with a higher E[R] than GRPO", _LPS, "final_reward", arm, "grpo", "higher"),
        _p(f"{lab} updates more high-probability tokens of positive completions upwards than GRPO", _LP_FIG3,
           "pos_high_up", arm, "grpo", "higher"),
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
_A3 = f"{DFPO}, Prop. 3.1; App. A.3 eq. 39-41"
_AGG_PREDICTIONS = (
    *(
        _p(f"{lab}: 1/|y| normalisation drifts the equivalent set more than Dr. GRPO's constant (lower "
           "entropy at matched reward)", EARLIER_RUN, "equiv_entropy_at_threshold", f"{obj}_seqmean",
           f"{obj}_drgrpo", "lower")
        for obj, lab in (("grpo", "GRPO"), ("gspo", "GSPO"), ("gspo_eq86", "eq. 86 control"), ("dfpo", "DFPO"))
    ),
    _p("Sequence coupling drifts the equivalent set: DFPO keeps a higher entropy than GSPO at matched reward "
       "(seq-mean-token-mean)", _A3, "equiv_entropy_at_threshold", "dfpo_seqmean", "gspo_seqmean", "higher"),
    _p("Sequence coupling drifts the equivalent set: DFPO keeps a higher entropy than GSPO at matched reward "
       "(Dr. GRPO's constant)", _A3, "equiv_entropy_at_threshold", "dfpo_drgrpo", "gspo_drgrpo", "higher"),
    _p("Sequence coupling alone (same estimator): DFPO keeps a higher entropy than the eq. 86 control at "
       "matched reward (seq-mean-token-mean)", f"{_A3}; {REVIEW}", "equiv_entropy_at_threshold", "dfpo_seqmean",
       "gspo_eq86_seqmean", "higher"),
    _p("GRPO (no sequence coupling) keeps a higher equivalent-set entropy than GSPO at matched reward", _A3,
       "equiv_entropy_at_threshold", "grpo_seqmean", "gspo_seqmean", "higher"),
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
_COUPLE = SRC_COUPLING
_EPS_PREDICTIONS = (
    _p("GSPO's group-shared residual rises with ε (sequence weights spread inside a wider band)", _COUPLE,
       "group_shared_residual", "gspo_wide", "gspo", "higher"),
    _p("The eq. 86 control's group-shared residual rises with ε (coupling alone, no clip silencing)", _COUPLE,
       "group_shared_residual", "gspo_eq86_wide", "gspo_eq86", "higher"),
    _p("DFPO cancels at ε = 0.2 where GSPO does not (group-shared residual)", f"{DFPO}, Sec. 4.4 eq. 17-18",
       "group_shared_residual", "dfpo_wide", "gspo_wide", "lower"),
    _p("DFPO's transform cancels at ε = 0.2 where the eq. 86 control does not", f"{DFPO}, Sec. 4.4; {REVIEW}",
       "group_shared_residual", "dfpo_wide", "gspo_eq86_wide", "lower"),
    _p("GRPO's clip asymmetry leaks less at a wider ε (sequence-net residual)", f"{DFPO}, App. F eq. 75-76",
       "sequence_net_residual", "grpo_wide", "grpo", "lower"),
    _p("GRPO's Asym falls at a wider ε", f"{DFPO}, App. F; Sec. 6.1 (eq. 23)", "asym", "grpo_wide", "grpo",
       "lower"),
    _p("GRPO-fix leaks less than GRPO at ε 0.2 (sequence-net residual)", f"{DFPO}, App. H eq. 79-82",
       "sequence_net_residual", "grpo_symclip", "grpo", "lower"),
    _p("GRPO-fix has a lower Asym than GRPO at ε 0.2", f"{DFPO}, App. H; Sec. 6.1 (eq. 23)", "asym",
       "grpo_symclip", "grpo", "lower"),
    _p("GRPO-fix reaches E[R] ≥ 0.9 later than GRPO at ε 0.2 (symmetric clipping is more conservative, "
       "slower)", SRC_SYMCLIP_SLOWER, "steps_to_threshold", "grpo_symclip", "grpo", "higher"),
    _p("GRPO-fix ends with a higher E[R] than GRPO at ε 0.2", f"{DFPO}, Table 1 (GRPO-fix > GRPO, final "
       "accuracy)", "final_reward", "grpo_symclip", "grpo", "higher"),
    _p("DFPO keeps a higher equivalent-set entropy than the eq. 86 control at ε 0.2, where the transform acts "
       "(matched reward)", f"{_ENT}; {REVIEW}", "equiv_entropy_at_threshold", "dfpo_wide", "gspo_eq86_wide",
       "higher"),
    _p("Clip-higher keeps a higher equivalent-set entropy than GRPO", f"{DAPO}, Sec. 3.1 (Clip-Higher)",
       "equiv_entropy_final", "grpo_clip_higher", "grpo", "higher"),
    _p("DFPO reaches E[R] ≥ 0.9 sooner than GSPO at the paper's ε", _T2, "steps_to_threshold", "dfpo", "gspo",
       "lower"),
    _p("With bigger steps, DFPO pays less learning tax (template KL at matched reward) than the eq. 86 control "
       "at the paper's ε (credit to the transform)", f"{DFPO}, App. G; {REVIEW}", "template_kl_at_threshold",
       "dfpo", "gspo_eq86", "lower"),
    _p("With bigger steps, DFPO pays less learning tax than the eq. 86 control at ε 0.2 (credit to the "
       "transform)", f"{DFPO}, App. G; {REVIEW}", "template_kl_at_threshold", "dfpo_wide", "gspo_eq86_wide",
       "lower"),
    _p("With bigger steps, DFPO Min-Replace reaches E[R] ≥ 0.9 later than the eq. 86 control at ε 0.2 "
       "(its shrinkage: smaller effective steps)", _K24, "steps_to_threshold", "dfpo_wide", "gspo_eq86_wide",
       "higher"),
    _p("With bigger steps, DFPO Min-Replace triggers clipping less often than the eq. 86 control at ε 0.2",
       _K4_CLIP, "clip_frac", "dfpo_wide", "gspo_eq86_wide", "lower"),
    _p("GRPO-fix keeps a higher equivalent-set entropy than GRPO at ε 0.2, matched reward (symmetric "
       "clipping: 'slower updates but more stability')", f"{SRC_SYMCLIP_SLOWER}; {_ENT}",
       "equiv_entropy_at_threshold", "grpo_symclip", "grpo", "higher"),
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
_E1 = f"{DFPO}, App. E.1 (2): uncancelled gradients pollute Adam's moment estimates"
_OPT_PREDICTIONS = (
    _p("Under Adam, DFPO reaches E[R] ≥ 0.9 in fewer steps than the eq. 86 control", f"{_E1}; {SRC_CONTROL}",
       "steps_to_threshold", "dfpo_adam", "gspo_eq86_adam", "lower"),
    _p("Under Adam, DFPO's E[R] curve has lower Jitter₂ than the eq. 86 control's (fewer oscillations)", _E1,
       "jitter2_expected_reward", "dfpo_adam", "gspo_eq86_adam", "lower"),
    _p("Under Adam, DFPO pays less learning tax than the eq. 86 control at matched reward", f"{_E1}; {_TAX}",
       "template_kl_at_threshold", "dfpo_adam", "gspo_eq86_adam", "lower"),
    _p("Under Adam, DFPO keeps a higher equivalent-set entropy than the eq. 86 control at matched reward",
       f"{_E1}; {_ENT}", "equiv_entropy_at_threshold", "dfpo_adam", "gspo_eq86_adam", "higher"),
    _p("Under Adam, DFPO reaches E[R] ≥ 0.9 in fewer steps than GSPO", f"{_E1}; {_T2}", "steps_to_threshold",
       "dfpo_adam", "gspo_adam", "lower"),
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


def _study(name: str, **kw: Any) -> ToyStudy:
    return ToyStudy(name=name, **kw)


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
        _study(
            "toy_main",
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
        _study(
            "toy_group_size",
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
        _study(
            "toy_batching",
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
        _study(
            "toy_low_prob",
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
        _study(
            "toy_aggregation",
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
        _study(
            "toy_epsilon",
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
        _study(
            "toy_optimizer",
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


def result_path(out_dir: Path, name: str, block: str) -> Path:
    """Where a study's block is saved: ``<name>.json.gz`` (discovery), ``<name>.confirmation.json.gz``."""
    return Path(out_dir) / (f"{name}.json.gz" if block == "discovery" else f"{name}.{block}.json.gz")


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
    from .frontier import NAME as FRONTIER
    from .frontier import run_frontier

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


__all__ = [
    "STUDIES",
    "THRESHOLD",
    "Arm",
    "Sizes",
    "ToyStudy",
    "initial_values",
    "measure_seed",
    "result_path",
    "run_arm",
    "run_study",
    "run_toy",
    "template_drift",
    "template_probs_of",
]
