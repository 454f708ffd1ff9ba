"""Page 4, Training lab: how do the objectives compare when they actually train the toy policy?

Every (variant, seed) run is one ``toymodel.simulate`` call behind ``st.cache_data``, so changing one
input recomputes only the runs it affects (adding an objective runs only that objective). The curves
are ``app.figures.curve_figure`` (mean over seeds, ±1 sample-std band) and the summary table is
``toymodel.compare.summarize_variant`` per variant. Incompatible choices (dfpo with Advantage
Reweighting or Lopti, more mini-batches than groups) show the library's own error message.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from app.common import page_header, user_errors
from app.figures import CURVE_TITLES, curve_figure
from cancellation import TRANSFORMS
from cancellation.batching import SPLIT_MODES
from toymodel import SCENARIOS, simulate
from toymodel.compare import COLUMNS, VARIANTS, summarize_variant
from toymodel.simulate import DEFAULT_LR, OPTIMIZERS

#: the objectives to pick from: ``toymodel.compare.VARIANTS`` plus a DFPO variant for every transform
#: of ``cancellation.TRANSFORMS`` that it lacks (at GSPO's clip range and at ε = 0.2, as VARIANTS does)
PAGE_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = dict(VARIANTS)
for _name in TRANSFORMS:
    PAGE_VARIANTS.setdefault(f"dfpo {_name}", ("dfpo", {"transform": _name}))
for _name in TRANSFORMS:
    PAGE_VARIANTS.setdefault(
        f"dfpo {_name} ε=0.2", ("dfpo", {"transform": _name, "epsilon_low": 0.2, "epsilon_high": 0.2})
    )

DEFAULT_VARIANTS = ["grpo", "gspo", "dfpo min_replace"]

#: the metrics drawn as curves (row keys of ``toymodel.simulate``)
CURVES = tuple(CURVE_TITLES)

#: summary-table column titles for ``toymodel.compare.COLUMNS``
HEADS = {
    "expected_reward": "E[R] final",
    "equiv_entropy": "equiv. entropy",
    "equiv_log_odds": "log-odds τa/τb",
    "template_kl": "template KL",
    "template_kl_at_threshold": "template KL at threshold",
    "shared_residual": "shared residual",
    "group_shared_residual": "group-shared residual",
    "steps_to_threshold": "steps to threshold",
    "jitter2": "Jitter₂ E[R]",
}


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


def _default_lr() -> None:
    """When the optimiser changes, reset the learning rate to its default (``DEFAULT_LR``)."""
    st.session_state["lr"] = DEFAULT_LR[st.session_state["optimizer"]]


def summary_table(runs_by_label: dict[str, list[list[dict[str, float]]]], threshold: float) -> pd.DataFrame:
    """``summarize_variant`` per variant: one row each, every column's mean and its seed std."""
    rows = []
    for label, runs in runs_by_label.items():
        s = summarize_variant(runs, threshold)
        row: dict[str, Any] = {"variant": label}
        for c in COLUMNS:
            row[HEADS[c]] = s[c]
            row[f"{HEADS[c]} ±std"] = s[f"{c}_std"]
        row["reached threshold"] = s["reached_frac"]
        rows.append(row)
    return pd.DataFrame(rows).set_index("variant")


page_header(
    "Training lab",
    "When the objectives train the toy policy, which ones keep shared-token gradients cancelling, and "
    "what does that change in reward, entropy and learning tax?",
    r"\frac{1}{G}\sum_{i=1}^{G}\hat A_i\,\tilde s_i\,\nabla_\theta \log\pi_\theta(a^\star\mid h^\star) = 0"
    r"\quad\text{(2)},\qquad \mathrm{Asym} = \mathrm{Var}_i(w_i\hat A_i)\quad\text{(23)}",
    "DFPO eq. (2) (cancellation condition on an event every completion shares), eq. (20) Jitter₂, "
    "eq. (23) Asym, Table 2 steps-to-threshold; batching and Lopti/AR: 002 Sec. 4 and the Lopti notes.",
)

with st.sidebar:
    st.header("Run")
    scenario = st.selectbox(
        "Scenario", list(SCENARIOS), index=list(SCENARIOS).index("equivalent_solutions"), key="scenario"
    )
    variants = st.multiselect(
        "Objectives to compare", list(PAGE_VARIANTS), default=DEFAULT_VARIANTS, key="variants",
        help="toymodel.compare.VARIANTS plus a DFPO variant per transform. GSPO/DFPO use GSPO's clip "
        "range (3e-4 / 4e-4) unless the label says ε=0.2.",
    )  # fmt: skip
    G = st.slider("Group size G", 1, 32, 8, key="G")
    optimizer = st.selectbox("Optimizer", OPTIMIZERS, key="optimizer", on_change=_default_lr)
    st.session_state.setdefault("lr", DEFAULT_LR["sgd"])  # the widget reads (and the optimizer resets) it
    lr = st.number_input(
        "Learning rate", min_value=1e-4, max_value=100.0, step=0.05,
        format="%.4f", key="lr", help=f"Defaults: {DEFAULT_LR} (changing the optimizer resets it).",
    )  # fmt: skip
    inner = st.slider("Inner epochs (PPO epochs per batch)", 1, 16, 4, key="inner")
    steps = st.number_input("Steps", min_value=1, max_value=2000, value=100, step=10, key="steps")
    seeds = st.slider("Seeds", 1, 20, 3, key="seeds")
    st.header("Batching")
    num_groups = st.slider("Groups per step", 1, 16, 1, key="num_groups")
    minibatches = st.slider("Mini-batches per inner epoch", 1, 16, 1, key="minibatches")
    batching = st.radio(
        "Mini-batch split", SPLIT_MODES, key="batching", horizontal=True,
        help="query: every completion of a group in one mini-batch (002 Sec. 4); random: the usual split.",
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
        "Reward threshold", min_value=0.0, max_value=1.0, value=0.9, step=0.05, key="threshold"
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

runs_by_label: dict[str, list[list[dict[str, float]]]] = {}
total = len(variants) * int(seeds)
bar = st.progress(0.0, text="Running the simulator…")
with user_errors():
    try:
        done = 0
        for label in variants:
            objective, params = PAGE_VARIANTS[label]
            runs = []
            for seed in range(int(seeds)):
                try:
                    runs.append(run_one(scenario, objective, tuple(sorted(params.items())), seed, **common))
                except (ValueError, TypeError) as exc:
                    raise type(exc)(f"{label}: {exc}") from exc
                except RuntimeError as exc:  # numerical failure in torch: say what to change
                    raise ValueError(
                        f"{label}, seed {seed}: the simulator failed ({exc}); try a smaller learning rate"
                    ) from exc
                done += 1
                bar.progress(done / total, text=f"{label}, seed {seed} ({done}/{total} runs)")
            runs_by_label[label] = runs
    finally:
        bar.empty()

st.subheader("Curves (mean over seeds, band ±1 std)")
cols = st.columns(2)
for i, metric in enumerate(CURVES):
    cols[i % 2].plotly_chart(curve_figure(runs_by_label, metric), key=f"curve_{metric}")

st.caption(
    "Coinciding curves hide each other: with GSPO's own clip range (3e-4 / 4e-4) nearly every sequence is "
    "clipped after the first inner step, so GSPO and DFPO are (almost) the same run; the ε=0.2 variants "
    "separate them. A metric without a value (e.g. the group-shared residual when no event is shared by the "
    "whole group, or the objective's metrics on steps that made no update) leaves a gap."
)

st.subheader("Summary over seeds")
st.caption(
    "Final values at the last step (mean and sample std over seeds); Jitter₂ of E[R] (eq. 20); steps "
    "until E[R] ≥ threshold and the template KL paid by then (Table 2; seeds that never reach it are "
    "left out, see 'reached threshold'); residuals are each seed's mean over the steps that had one."
)
table = summary_table(runs_by_label, float(threshold))
st.dataframe(
    table,
    key="summary",
    column_config={
        c: st.column_config.NumberColumn(
            format="percent"
            if c == "reached threshold"
            else ("%.1f" if c.startswith("steps") else ("%.5f" if c.startswith("Jitter") else "%.3f"))
        )
        for c in table.columns
    },
)
