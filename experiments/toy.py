"""The toy studies' runner: an arm trained on the tabular toy for hundreds of seeds, paired by seed, its
per-seed measures, and a study (``ToyStudy``) run into a ``StudyResult``.

A study trains every arm on one ``toymodel`` scenario for the same seeds and steps, turns each seed's
run into per-seed measures and curves, and returns an ``experiments.study.StudyResult`` (saved at
``result_path`` by ``experiments.toy_studies.run_toy``). The verdicts of its predictions are computed later
from the paired differences (``StudyResult.verdicts``); nothing here decides one. The studies themselves
(arms, measures, predictions, notes) are declared in ``experiments.toy_studies``; ``toy_frontier``'s
sweep in ``experiments.frontier``. Both import this module; it imports neither.

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

from .study import (
    BLOCKS,
    CONFIRM_FIRST_SEED,
    CURVE_POINTS,
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

#: The measures the toy cannot compute, said in every study's notes.
NOT_IN_TOY = (
    "Not measured by the toy: token-flip rates (cancellation-hypothesis paper App. C) and Energy by "
    "frequency bucket (DFPO eq. 24) are trainer-only diagnostics (scaledrun logs them), and benchmark "
    "accuracy (DFPO Table 1) has no toy analogue beyond the exact E[R]."
)


# --------------------------------------------------------------------------------------------------
# the scenarios and clip ranges the studies share (experiments.toy_studies, experiments.frontier)

TEMPLATE = "template_task"
EQUIV = "equivalent_solutions"
#: GSPO's / DFPO's clip range (3e-4 / 4e-4) is each objective's default; these widen it.
WIDE_SEQ = {"epsilon_low": 0.2, "epsilon_high": 0.2}
WIDE_TOK = {"epsilon_low": 0.4, "epsilon_high": 0.4}
#: GRPO without its lower clip: ε_low → 1 (the objectives need ε_low < 1; at 1 − 1e-9 the lower bound
#: 1e-9 never binds), so the clip is [0, 1 + ε_high] like GRPO-fix's for positive advantages and PPO's upper
#: bound alone for negative ones: the arm that separates "symmetric" from "no lower bound".
NO_LOW_CLIP = {"epsilon_low": 1 - 1e-9, "epsilon_high": 0.2}


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


def result_path(out_dir: Path, name: str, block: str) -> Path:
    """Where a study's block is saved: ``<name>.json.gz`` (discovery), ``<name>.confirmation.json.gz``."""
    return Path(out_dir) / (f"{name}.json.gz" if block == "discovery" else f"{name}.{block}.json.gz")


__all__ = [
    "EQUIV",
    "NO_LOW_CLIP",
    "TEMPLATE",
    "THRESHOLD",
    "Arm",
    "Sizes",
    "ToyStudy",
    "initial_values",
    "measure_seed",
    "result_path",
    "run_arm",
    "template_drift",
    "template_probs_of",
]
