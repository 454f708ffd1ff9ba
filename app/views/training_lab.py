"""Page 4, Training lab: how do the objectives compare when they actually train the toy policy?

When ``toymodel.batched.simulate_seeds`` supports the chosen options (plain SGD, query-preserved
mini-batches, no reward-balanced batching, Lopti or Advantage Reweighting) every variant's seeds are one
``simulate_seeds`` call behind ``st.cache_data`` (all seeds as one batched computation, equal per seed to
``toymodel.simulate`` to rounding, so the page defaults to 16 seeds). That call does not compute the
objective's own metrics (Asym, clip fractions): the page then leaves those curves out and says so, and the
"Objective metrics" toggle runs every seed with ``simulate`` instead. Otherwise (the fallback) every
(variant, seed) run is one ``toymodel.simulate`` call behind ``st.cache_data``, so changing one input
recomputes only the runs it affects; on either path adding an objective runs only that objective. A
caption says which path ran. The curves
are ``plots.curve_figure`` (mean over seeds, ±1 sample-std band) and the summary table is
``toymodel.compare.summarize_variant`` per variant (plus the cancellation meters it lacks, averaged the
same way). Incompatible choices (dfpo or gspo's paper estimator with Advantage Reweighting or Lopti,
more mini-batches than groups) show the library's own error message.

Before anything runs, the page estimates the rerun's cost (``app.lab_cost``: per-unit costs measured on a
2-core machine, for the path it will take, over the runs this session has not computed yet, plus drawing).
Above ``app.lab_cost.CONFIRM_ABOVE_S`` (10 s) it shows the estimate and a "Run (about N s)" button and
runs nothing until that is pressed (once per set of inputs); the defaults (about 1 s) run at once.

The first screen compares GSPO, the eq. (86) control (GSPO's weight under the paper's estimator, no
transform) and DFPO Min-Replace on ``template_task``: GSPO against the control isolates what the
estimator does, the control against DFPO what the transform does (the public review's question).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st
import torch

from app.common import page_header, user_errors
from app.lab_cost import CONFIRM_ABOVE_S, batched_seconds, drawing_seconds, format_seconds, simulate_seconds
from cancellation import TRANSFORMS
from cancellation.batching import SPLIT_MODES
from cancellation.glossary import METER_DOCS
from cancellation.update import RESIDUAL_KEYS
from plots import CURVE_TITLES, curve_figure
from toymodel import SCENARIOS, simulate
from toymodel.batched import BATCHED_KEYS, seed_rows, simulate_seeds
from toymodel.compare import COLUMNS, VARIANTS, summarize_variant
from toymodel.simulate import DEFAULT_LR, OPTIMIZERS

E02 = {"epsilon_low": 0.2, "epsilon_high": 0.2}

#: the calls this page names itself (its labels say which estimator runs): GSPO under the paper's
#: estimator (eq. 86, the control that tells the transform's effect from the estimator's) and DFPO's
#: trust-region variant (``estimator="ppo_clip"``, not in the paper) for every transform
PAGE_NAMED: dict[str, tuple[str, dict[str, Any]]] = {
    "gspo (paper estimator, eq. 86)": ("gspo", {"estimator": "paper"}),
    "gspo (paper estimator, eq. 86) ε=0.2": ("gspo", {"estimator": "paper", **E02}),
    **{
        f"dfpo {name} (ppo_clip, trust region)": ("dfpo", {"transform": name, "estimator": "ppo_clip"})
        for name in TRANSFORMS
    },
}


def _page_variants() -> dict[str, tuple[str, dict[str, Any]]]:
    """``toymodel.compare.VARIANTS`` (under this page's label where ``PAGE_NAMED`` names the same call),
    then a DFPO variant for every transform of ``cancellation.TRANSFORMS`` that it lacks (at GSPO's clip
    range and at ε = 0.2, as VARIANTS does), then the rest of ``PAGE_NAMED``; one label per call."""
    named = {(obj, tuple(sorted(p.items()))): label for label, (obj, p) in PAGE_NAMED.items()}
    out: dict[str, tuple[str, dict[str, Any]]] = {}

    def add(label: str, objective: str, params: dict[str, Any]) -> None:
        if (objective, params) not in out.values():
            out.setdefault(named.get((objective, tuple(sorted(params.items()))), label), (objective, params))

    for label, (objective, params) in VARIANTS.items():
        add(label, objective, params)
    for name in TRANSFORMS:
        add(f"dfpo {name}", "dfpo", {"transform": name})
    for name in TRANSFORMS:
        add(f"dfpo {name} ε=0.2", "dfpo", {"transform": name, **E02})
    for label, (objective, params) in PAGE_NAMED.items():
        add(label, objective, params)
    return out


#: the objectives to pick from (``_page_variants``)
PAGE_VARIANTS = _page_variants()


def label_of(objective: str, params: dict[str, Any]) -> str:
    """The page label of a call."""
    return next(k for k, v in PAGE_VARIANTS.items() if v == (objective, params))


#: the three runs the first screen compares: GSPO, the eq. (86) control, DFPO Min-Replace
GSPO_LABEL = label_of("gspo", {})
EQ86_LABEL = label_of("gspo", {"estimator": "paper"})
DFPO_LABEL = label_of("dfpo", {"transform": "min_replace"})
DEFAULT_VARIANTS = [GSPO_LABEL, EQ86_LABEL, DFPO_LABEL]
DEFAULT_SCENARIO = "template_task"
DEFAULT_THRESHOLD = 0.9
#: the other inputs' defaults, as ``simulate`` arguments (the sidebar's widgets start from them)
DEFAULT_COMMON: dict[str, Any] = {
    "group_size": 8,
    "lr": DEFAULT_LR["sgd"],
    "optimizer": "sgd",
    "inner_epochs": 4,
    "num_groups": 1,
    "num_minibatches": 1,
    "batching": "query",
    "reward_balanced_rho": None,
    "lopti_eta": None,
    "ar_alpha": None,
}

#: the metrics drawn as curves (row keys of ``toymodel.simulate``)
CURVES = tuple(CURVE_TITLES)
#: the curves the batched path does not compute (the objective's own metrics): drawn only on the fallback
OBJECTIVE_CURVES = tuple(k for k in CURVES if k not in BATCHED_KEYS)

#: the seeds slider: its default and maximum (the batched path runs 16 seeds of the first screen in
#: about the time the per-seed path took for 3)
DEFAULT_SEEDS = 16
MAX_SEEDS = 256

#: the cancellation meters that ``summarize_variant`` does not summarise (each seed's mean over steps)
EXTRA_COLUMNS = tuple(k for k in RESIDUAL_KEYS if k not in COLUMNS)

#: summary-table column titles for ``toymodel.compare.COLUMNS`` and ``EXTRA_COLUMNS``
HEADS = {
    "expected_reward": "E[R] final",
    "equiv_entropy": "equiv. entropy",
    "equiv_log_odds": "log-odds τa/τb",
    "template_kl": "template KL",
    "template_kl_at_threshold": "template KL at threshold",
    "shared_residual": "shared residual",
    "group_shared_residual": "group-shared residual",
    "sequence_net_residual": "sequence-net residual",
    "steps_to_threshold": "steps to threshold",
    "jitter2": "Jitter₂ E[R]",
}

#: what 10 seeds × 150 steps of the three default runs measured (the page's other defaults): GSPO,
#: the eq. (86) control, DFPO Min-Replace. ``tests/app/test_training_lab.py`` re-measures them (slow test)
MEASURED_10_SEEDS = (
    "At these defaults with 10 seeds × 150 steps, GSPO needs 82 steps to reach E[R] ≥ 0.9, the eq. (86) "
    "control 21 and DFPO Min-Replace 21; group-shared residual 0.140 / 0.0003 / 0.000; template KL at the "
    "threshold 0.009 / 0.046 / 0.046 (DFPO − control, paired over seeds: 0.000 ± 0.000 s.e.). So DFPO's "
    "speed, and the larger learning tax that comes with it, are the estimator's doing (it keeps the "
    "gradients of the sequences GSPO's clip silences); the transform's own measurable effect here is the "
    "last 0.0003 of group-shared residual."
)


def head(column: str) -> str:
    """The table title of a summary column (its key with spaces for a column this page does not know)."""
    return HEADS.get(column, column.replace("_", " "))


@st.cache_data(show_spinner=False, max_entries=1024)
def run_one(
    scenario: str,
    objective: str,
    params: tuple[tuple[str, Any], ...],
    seed: int,
    steps: int,
    group_size: int,
    lr: float,
    optimizer: str,
    inner_epochs: int,
    num_groups: int,
    num_minibatches: int,
    batching: str,
    reward_balanced_rho: float | None,
    lopti_eta: float | None,
    ar_alpha: float | None,
) -> list[dict[str, float]]:
    """One ``toymodel.simulate`` run (cached per argument set)."""
    return simulate(
        scenario, objective, steps=steps, group_size=group_size, lr=lr, optimizer=optimizer,
        inner_epochs=inner_epochs, seed=seed, num_groups=num_groups, num_minibatches=num_minibatches,
        batching=batching, reward_balanced_rho=reward_balanced_rho, lopti_eta=lopti_eta,
        ar_alpha=ar_alpha, **dict(params),
    )  # fmt: skip


@st.cache_data(show_spinner=False, max_entries=64)
def run_seeds(
    scenario: str,
    objective: str,
    params: tuple[tuple[str, Any], ...],
    seeds: int,
    steps: int,
    group_size: int,
    lr: float,
    inner_epochs: int,
    num_groups: int,
    num_minibatches: int,
) -> dict[str, np.ndarray]:
    """``toymodel.batched.simulate_seeds`` for seeds 0 … ``seeds`` − 1 (cached per argument set), as arrays."""
    result = simulate_seeds(
        scenario, objective, seeds, steps=steps, group_size=group_size, lr=lr, inner_epochs=inner_epochs,
        num_groups=num_groups, num_minibatches=num_minibatches, **dict(params),
    )  # fmt: skip
    return {k: v.numpy() for k, v in result.items()}


def fallback_reasons(common: dict[str, Any], objective_metrics: bool) -> list[str]:
    """Why the seeds must run one by one with ``simulate`` (empty when ``simulate_seeds`` supports them)."""
    reasons = []
    if common["optimizer"] != "sgd":
        reasons.append(f"the {common['optimizer']} optimizer")
    if common["batching"] != "query":
        reasons.append(f"the {common['batching']} mini-batch split")
    for key, name in (
        ("reward_balanced_rho", "reward-balanced batching"),
        ("lopti_eta", "Lopti"),
        ("ar_alpha", "Advantage Reweighting"),
    ):
        if common[key] is not None:
            reasons.append(name)
    if objective_metrics:
        reasons.append("the objective metrics (Asym, clip fractions)")
    return reasons


def batched_runs(
    scenario: str, objective: str, params: dict[str, Any], seeds: int, common: dict[str, Any]
) -> list[list[dict[str, float]]]:
    """Every seed's rows of one variant from one ``run_seeds`` call (``simulate``'s row keys; the ones
    ``simulate_seeds`` does not compute are NaN)."""
    args = {
        k: common[k] for k in ("steps", "group_size", "lr", "inner_epochs", "num_groups", "num_minibatches")
    }
    arrays = run_seeds(scenario, objective, tuple(sorted(params.items())), seeds, **args)
    result = {k: torch.from_numpy(v) for k, v in arrays.items()}
    return [seed_rows(result, i) for i in range(seeds)]


def _default_lr() -> None:
    """When the optimiser changes, reset the learning rate to its default (``DEFAULT_LR``)."""
    st.session_state["lr"] = DEFAULT_LR[st.session_state["optimizer"]]


def _mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample std of the finite values (NaN, NaN without one; std 0 with one)."""
    xs = [v for v in values if math.isfinite(v)]
    if not xs:
        return math.nan, math.nan
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def meter_summary(runs: list[list[dict[str, float]]], key: str) -> tuple[float, float]:
    """Mean and std over seeds of each seed's mean of ``key`` over the steps that had one.

    As ``summarize_variant`` does for the residuals it knows; a row without the key counts as NaN.
    """
    return _mean_std([_mean_std([r.get(key, math.nan) for r in rows])[0] for rows in runs])


def summary_table(runs_by_label: dict[str, list[list[dict[str, float]]]], threshold: float) -> pd.DataFrame:
    """``summarize_variant`` per variant (and ``meter_summary`` of ``EXTRA_COLUMNS``): every mean and std."""
    rows = []
    for label, runs in runs_by_label.items():
        s = summarize_variant(runs, threshold)
        for key in EXTRA_COLUMNS:
            s[key], s[f"{key}_std"] = meter_summary(runs, key)
        row: dict[str, Any] = {"variant": label}
        for c in (*COLUMNS, *EXTRA_COLUMNS):
            row[head(c)] = s[c]
            row[f"{head(c)} ±std"] = s[f"{c}_std"]
        row["reached threshold"] = s["reached_frac"]
        rows.append(row)
    return pd.DataFrame(rows).set_index("variant")


def comparison_text(table: pd.DataFrame, seeds: int, threshold: float) -> str:
    """One sentence: GSPO, the eq. (86) control and DFPO Min-Replace side by side, from ``table``."""
    picked = [GSPO_LABEL, EQ86_LABEL, DFPO_LABEL]

    def triple(column: str, fmt: str) -> str:
        return " / ".join("n/a" if math.isnan(v) else format(v, fmt) for v in table.loc[picked, head(column)])

    return (
        f"**GSPO / eq. (86) control / DFPO Min-Replace** on this screen ({seeds} seed"
        f"{'s' if seeds > 1 else ''}): steps to E[R] ≥ {threshold:g} {triple('steps_to_threshold', '.1f')}; "
        f"group-shared residual {triple('group_shared_residual', '.4f')}; template KL at the threshold "
        f"{triple('template_kl_at_threshold', '.3f')}. GSPO → control is what the paper's estimator does "
        "(it keeps the gradients of clipped sequences), control → DFPO what the transform does."
    )


def run_keys(scenario: str, label: str, seeds: int, common: dict[str, Any], batched: bool) -> list[tuple]:
    """The cached calls that the runs of one variant make: one ``run_seeds`` call (batched) or one
    ``run_one`` call per seed (their arguments, as keys of the page's record of what has run)."""
    objective, params = PAGE_VARIANTS[label]
    call = (scenario, objective, tuple(sorted(params.items())), tuple(sorted(common.items())))
    if batched:
        return [("batched", *call, seeds)]
    return [("simulate", *call, seed) for seed in range(seeds)]


def rerun_estimate(
    scenario: str, variants: list[str], seeds: int, common: dict[str, Any], batched: bool, done: set[tuple]
) -> dict[str, float]:
    """Estimated seconds of one rerun (``app.lab_cost``): {"simulate": the runs not in ``done`` (the ones
    this session has computed, which are cached), "draw": every seed's rows to table and curves, "total"}.
    """
    shape = {k: common[k] for k in ("steps", "group_size", "inner_epochs", "num_groups", "num_minibatches")}
    per_run = batched_seconds(seeds, **shape) if batched else simulate_seconds(**shape)
    todo = sum(k not in done for label in variants for k in run_keys(scenario, label, seeds, common, batched))
    sim = todo * per_run
    draw = drawing_seconds(len(variants), seeds, common["steps"])
    return {"simulate": sim, "draw": draw, "total": sim + draw, "runs": todo}


def estimate_text(
    cost: dict[str, float], variants: list[str], seeds: int, common: dict[str, Any], batched: bool
) -> str:
    """The message that asks before a long rerun: the estimate and what it is made of."""
    n = len(variants)
    size = (
        f"{common['steps']} steps × {common['inner_epochs']} inner epochs × {common['num_minibatches']} "
        f"mini-batch{'es' if common['num_minibatches'] > 1 else ''}, {common['num_groups']} group"
        f"{'s' if common['num_groups'] > 1 else ''} of G = {common['group_size']} a step"
    )
    if batched:
        what = (
            f"{int(cost['runs'])} batched simulator call{'s' if cost['runs'] != 1 else ''} (one per objective "
            f"not yet run, {seeds} seeds each) of {size}"
        )
    else:
        what = f"{int(cost['runs'])} per-seed `toymodel.simulate` runs (objectives × seeds not yet run) of {size}"
    return (
        f"**This rerun would take about {format_seconds(cost['total'])}** on a 2-core machine: {what}, "
        f"about {format_seconds(cost['simulate'])} (less for objectives that learn fast: a seed whose groups "
        f"all get the same reward stops costing), then drawing {n} objective{'s' if n > 1 else ''} × "
        f"{seeds} seeds × {common['steps']} steps, about {format_seconds(cost['draw'])}. Fewer seeds, steps, "
        "inner epochs, groups or mini-batches make it quicker"
        + (
            ""
            if batched
            else "; so does the batched path (see the sidebar: plain SGD, query split, no "
            "reward-balanced batching, Lopti, AR or objective metrics)"
        )
        + ". Nothing has run yet."
    )


page_header(
    "Training lab",
    "When the objectives train the toy policy, which ones keep shared-token gradients cancelling, and "
    "what does that change in reward, entropy and learning tax?",
    r"\frac{1}{G}\sum_{i=1}^{G}\hat A_i\,\tilde s_i\,\nabla_\theta \log\pi_\theta(a^\star\mid h^\star) = 0"
    r"\quad\text{(2)},\qquad \mathrm{Asym} = \mathrm{Var}_i(w_i\hat A_i)\quad\text{(23)}",
    "DFPO eq. (2) (cancellation condition on an event every completion shares), eq. (20) Jitter₂, "
    "eq. (23) Asym, Table 2 steps-to-threshold, eq. (68)/(91) DFPO's estimator and eq. (86) its control; "
    "batching and Lopti/AR: the cancellation-hypothesis paper Sec. 4 and the Lopti paper (docs/papers.md).",
)

with st.sidebar:
    st.header("Run")
    scenario = st.selectbox(
        "Scenario", list(SCENARIOS), index=list(SCENARIOS).index(DEFAULT_SCENARIO), key="scenario"
    )
    variants = st.multiselect(
        "Objectives to compare", list(PAGE_VARIANTS), default=DEFAULT_VARIANTS, key="variants",
        help="toymodel.compare.VARIANTS plus a DFPO variant per transform. GSPO/DFPO use GSPO's clip "
        "range (3e-4 / 4e-4) unless the label says ε=0.2. DFPO uses the paper's estimator (every "
        "sequence, clipped or not, gets s̃·Â on ∇log s); '(ppo_clip, trust region)' is the variant that "
        "silences clipped sequences (not in the paper); 'gspo (paper estimator, eq. 86)' is GSPO's s̄ "
        "under the paper's estimator with no transform: the control that tells the transform's effect "
        "from the estimator's.",
    )  # fmt: skip
    G = st.slider("Group size G", 1, 32, DEFAULT_COMMON["group_size"], key="G")
    optimizer = st.selectbox("Optimizer", OPTIMIZERS, key="optimizer", on_change=_default_lr)
    st.session_state.setdefault("lr", DEFAULT_COMMON["lr"])  # the widget reads (and the optimizer resets) it
    lr = st.number_input(
        "Learning rate", min_value=1e-4, max_value=100.0, step=0.05,
        format="%.4f", key="lr", help=f"Defaults: {DEFAULT_LR} (changing the optimizer resets it).",
    )  # fmt: skip
    inner = st.slider(
        "Inner epochs (PPO epochs per batch)", 1, 16, DEFAULT_COMMON["inner_epochs"], key="inner"
    )
    steps = st.number_input("Steps", min_value=1, max_value=2000, value=100, step=10, key="steps")
    seeds = st.slider(
        "Seeds", 1, MAX_SEEDS, DEFAULT_SEEDS, key="seeds",
        help="With plain SGD and query-preserved mini-batches (no reward-balanced batching, Lopti or AR) "
        "all seeds of an objective run as one batched computation (toymodel.batched.simulate_seeds): "
        "many seeds cost little to run (256 seeds × 100 steps: about a second per objective), though "
        "drawing them takes longer (about 1.3 s a rerun at 256). Otherwise each seed is its own "
        "toymodel.simulate run (about 0.5 s per seed and objective at 100 steps).",
    )  # fmt: skip
    objective_metrics = st.toggle(
        "Objective metrics (Asym, clip fractions)", key="objective_metrics",
        help="The batched simulator does not compute the objective's own metrics; this runs every seed "
        "with toymodel.simulate instead (slower) and draws them.",
    )  # fmt: skip
    st.header("Batching")
    num_groups = st.slider("Groups per step", 1, 16, 1, key="num_groups")
    minibatches = st.slider("Mini-batches per inner epoch", 1, 16, 1, key="minibatches")
    batching = st.radio(
        "Mini-batch split", SPLIT_MODES, key="batching", horizontal=True,
        help="query: every completion of a group in one mini-batch (cancellation-hypothesis paper Sec. 4); "
        "random: the usual split.",
    )  # fmt: skip
    rb_on = st.toggle("Reward-balanced batching", key="rb_on")
    rho = st.slider("ρ (min fraction of each advantage sign)", 0.0, 0.5, 0.25, key="rho", disabled=not rb_on)
    st.header("Low-probability tokens")
    lopti_on = st.toggle("Lopti (two-stage update)", key="lopti_on")
    eta = st.slider("Lopti η", 0.01, 1.0, 0.4, key="eta", disabled=not lopti_on)
    ar_on = st.toggle("Advantage Reweighting", key="ar_on")
    alpha = st.slider("AR α", 0.0, 1.0, 0.2, key="alpha", disabled=not ar_on)
    st.header("Summary")
    threshold = st.number_input(
        "Reward threshold", min_value=0.0, max_value=1.0, value=DEFAULT_THRESHOLD, step=0.05, key="threshold"
    )

sc = SCENARIOS[scenario]
st.caption(f"**{sc.name}** ({sc.reference}): {sc.description}")

if not variants:
    st.info("Pick at least one objective in the sidebar.")
    st.stop()
if G == 1:
    st.warning(
        "With G = 1 every completion is its own group's mean: every advantage is 0 and nothing learns. "
        "Use G ≥ 2."
    )

common = {
    "steps": int(steps),
    "group_size": int(G),
    "lr": float(lr),
    "optimizer": optimizer,
    "inner_epochs": int(inner),
    "num_groups": int(num_groups),
    "num_minibatches": int(minibatches),
    "batching": batching,
    "reward_balanced_rho": float(rho) if rb_on else None,
    "lopti_eta": float(eta) if lopti_on else None,
    "ar_alpha": float(alpha) if ar_on else None,
}

reasons = fallback_reasons(common, bool(objective_metrics))
batched = not reasons

# the cost of this rerun, before anything runs: ask first when it is long (the runs already computed in
# this session are cached, so they cost nothing; drawing every seed's rows costs on every rerun)
done: set[tuple] = st.session_state.setdefault("lab_done", set())
cost = rerun_estimate(scenario, variants, int(seeds), common, batched, done)
signature = (scenario, tuple(variants), int(seeds), tuple(sorted(common.items())), batched)
if cost["total"] > CONFIRM_ABOVE_S and st.session_state.get("lab_confirmed") != signature:
    gate = st.empty()
    with gate.container():
        st.warning(estimate_text(cost, variants, int(seeds), common, batched))
        go = st.button(f"Run (about {format_seconds(cost['total'])})", key="confirm_run", type="primary")
    if not go:
        st.stop()
    st.session_state["lab_confirmed"] = signature
    gate.empty()

runs_by_label: dict[str, list[list[dict[str, float]]]] = {}
bar = st.progress(0.0, text="Running the simulator…")
with user_errors():
    try:
        for n_done, label in enumerate(variants):
            objective, params = PAGE_VARIANTS[label]
            where = label
            try:
                if batched:  # one call for all seeds
                    bar.progress(n_done / len(variants), text=f"{label}, {int(seeds)} seeds (batched)")
                    runs_by_label[label] = batched_runs(scenario, objective, params, int(seeds), common)
                    done.update(run_keys(scenario, label, int(seeds), common, batched))
                    continue
                runs = []
                for seed in range(int(seeds)):
                    where = f"{label}, seed {seed}"
                    bar.progress((n_done + seed / int(seeds)) / len(variants), text=where)
                    runs.append(run_one(scenario, objective, tuple(sorted(params.items())), seed, **common))
                runs_by_label[label] = runs
                done.update(run_keys(scenario, label, int(seeds), common, batched))
            except (ValueError, TypeError) as exc:
                raise type(exc)(f"{label}: {exc}") from exc
            except RuntimeError as exc:  # numerical failure in torch: say what to change
                raise ValueError(
                    f"{where}: the simulator failed ({exc}); try a smaller learning rate"
                ) from exc
    finally:
        bar.empty()

if batched:
    st.caption(
        f"Ran each objective's {int(seeds)} seed{'s' if int(seeds) > 1 else ''} as one batched computation "
        "(`toymodel.batched.simulate_seeds`, equal per seed to `toymodel.simulate` to rounding)."
    )
else:
    st.caption(
        f"Ran each seed with `toymodel.simulate`: the batched `toymodel.batched.simulate_seeds` does not "
        f"support {', '.join(reasons)}."
    )

table = summary_table(runs_by_label, float(threshold))
if {GSPO_LABEL, EQ86_LABEL, DFPO_LABEL} <= set(table.index):
    st.markdown(comparison_text(table, int(seeds), float(threshold)))
    at_defaults = {k: v for k, v in common.items() if k != "steps"} == DEFAULT_COMMON
    if scenario == DEFAULT_SCENARIO and at_defaults and float(threshold) == DEFAULT_THRESHOLD:
        st.caption(MEASURED_10_SEEDS)

st.subheader("Curves (mean over seeds, band ±1 std)")
cols = st.columns(2)
for i, metric in enumerate(m for m in CURVES if not (batched and m in OBJECTIVE_CURVES)):
    cols[i % 2].plotly_chart(curve_figure(runs_by_label, metric), key=f"curve_{metric}")
if batched:
    st.caption(
        f"Not drawn: {', '.join(CURVE_TITLES[m][0] for m in OBJECTIVE_CURVES)}. The batched simulator "
        "does not compute the objective's own metrics; turn on 'Objective metrics' in the sidebar to run "
        "every seed with `toymodel.simulate` and draw them (slower)."
    )

st.caption(
    "A metric without a value (e.g. the group-shared residual when no event is shared by the whole "
    "group, or the objective's metrics on steps that made no update) leaves a gap; coinciding curves "
    "hide each other. "
    f"**Sequence-net residual**: {METER_DOCS['sequence_net_residual'][0]} (About page: glossary)"
)

st.subheader("Summary over seeds")
st.caption(
    "Final values at the last step (mean and sample std over seeds); Jitter₂ of E[R] (eq. 20); steps "
    "until E[R] ≥ threshold and the template KL paid by then (Table 2; seeds that never reach it are "
    "left out, see 'reached threshold'); residuals are each seed's mean over the steps that had one."
)
st.dataframe(
    table,
    key="summary",
    column_config={
        c: st.column_config.NumberColumn(
            format="percent"
            if c == "reached threshold"
            else (
                "%.1f"
                if c.startswith("steps")
                else ("%.5f" if c.startswith("Jitter") else ("%.4f" if "residual" in c else "%.3f"))
            )
        )
        for c in table.columns
    },
)
