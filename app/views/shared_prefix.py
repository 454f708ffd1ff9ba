"""Page 1, Shared prefix (DFPO App. A.2): does the shared prefix "answer is" get a net update?

τ1 "answer is 25" (Â = −A) and τ2 "answer is 20" (Â = +A) share their first two tokens. The page builds
the exact toy policies with ratios ρ1, ρ2 on the shared steps and λ1, λ2 on the last tokens
(``toymodel.scenarios.shared_prefix_policies``), gets every token's ∂J/∂logp by autograd
(``cancellation.diagnostics.token_coefficients``) and sets the net on the shared prefix next to the
paper's closed form (``toymodel.theory.shared_prefix_closed_form``).

DFPO runs under the paper's stop-gradient estimator (its default: every trajectory, clipped or not,
gets s̃_i·Â_i on ∇log s_i); two more rows separate what the estimator does from what the transform
does: GSPO under the same estimator (eq. 86, no transform) and DFPO's trust-region variant
(``estimator="ppo_clip"``, not in the paper), where a clipped trajectory drops out. When a sequence
clip binds, the table labels a ``ppo_clip`` row's equation "eq. (72), clipped term dropped".
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from app.common import page_header, user_errors
from app.theory_figures import ZERO_TOL, coefficient_bars, fmt_number
from toymodel.scenarios import shared_prefix_coefficients, shared_prefix_net, shared_prefix_policies
from toymodel.theory import SP_LENGTH, carries_gradient, shared_prefix_closed_form

#: the objectives the page offers: label -> (registered objective, fixed params); ε is added per objective
OBJECTIVES: dict[str, tuple[str, dict[str, Any]]] = {
    "GRPO": ("grpo", {}),
    "GRPO-fix": ("grpo_symclip", {}),
    "GSPO": ("gspo", {}),
    "GSPO (Π r, eq. 11)": ("gspo", {"length_norm": False}),
    "GSPO (paper estimator, eq. 86)": ("gspo", {"estimator": "paper"}),
    "DFPO min_replace": ("dfpo", {"transform": "min_replace"}),
    "DFPO orth_proj": ("dfpo", {"transform": "orth_proj"}),
    "DFPO orth_proj_pos": ("dfpo", {"transform": "orth_proj_pos"}),
    "DFPO truncate_rebalance": ("dfpo", {"transform": "truncate_rebalance"}),
    "DFPO min_replace (ppo_clip, trust region)": (
        "dfpo",
        {"transform": "min_replace", "estimator": "ppo_clip"},
    ),
}
#: the label whose equation says that a clipped trajectory dropped out (DFPO's, from toymodel.theory)
CLIPPED_EQUATION = "eq. (72), clipped term dropped"
STEPS = ("t=1 'answer'", "t=2 'is'", "t=3 '25' / '20'")


def objective_call(label: str, eps: float) -> tuple[str, dict[str, Any]]:
    """(objective name, params) of a page label with clip range ε (GRPO-fix: clip(r, 0, 1 + ε); others ±ε)."""
    name, fixed = OBJECTIVES[label]
    clip = {"epsilon": eps} if name == "grpo_symclip" else {"epsilon_low": eps, "epsilon_high": eps}
    return name, {**fixed, **clip}


def clip_binds(label: str, rho1: float, rho2: float, lam1: float, lam2: float, a: float, eps: float) -> bool:
    """Whether a sequence clip silences a trajectory of a sequence-level ``ppo_clip`` row (eq. 47-49).

    GSPO's and DFPO's ``ppo_clip`` estimator: τ1 (Â = −A) or τ2 (Â = +A) has its sequence weight s_i
    (eq. 44, or Π r for ``length_norm=False``) past the bound that its advantage's sign selects
    (``toymodel.theory.carries_gradient``). False for the token-level objectives and the paper's
    estimator, where no trajectory drops out.
    """
    name, params = objective_call(label, eps)
    if (
        name not in ("gspo", "dfpo")
        or params.get("estimator", "ppo_clip" if name == "gspo" else "paper") == "paper"
    ):
        return False
    t = 1 if params.get("length_norm") is False else SP_LENGTH
    s = [(rho1 * rho2 * lam) ** (1.0 / t) for lam in (lam1, lam2)]
    return not all(carries_gradient(w, adv, eps, eps) for w, adv in zip(s, (-a, a), strict=True))


def equation_label(label: str, equation: str, clipped: bool) -> str:
    """The closed form's equation, or ``CLIPPED_EQUATION`` when a ``ppo_clip`` row's clip binds."""
    return CLIPPED_EQUATION if clipped and "clipped" not in equation else equation


@st.cache_data(show_spinner=False, max_entries=256)
def coefficients(label: str, rho1: float, rho2: float, lam1: float, lam2: float, a: float, eps: float):
    """(2, 3) ∂J/∂logp of τ1 and τ2 at t = 1, 2, 3 on the toy's exact policies."""
    name, params = objective_call(label, eps)
    # DFPO eq. (32): Â = (−A, +A)
    return shared_prefix_coefficients(name, rho1, rho2, lam1, lam2, a, **params).tolist()


@st.cache_data(show_spinner=False, max_entries=256)
def net_and_closed_form(label: str, rho1: float, rho2: float, lam1: float, lam2: float, a: float, eps: float):
    """(net at t=1, net at t=2, closed-form value, equation, why) for one objective."""
    name, params = objective_call(label, eps)
    net1, net2 = shared_prefix_net(name, rho1, rho2, lam1, lam2, advantage=a, **params)
    cf = shared_prefix_closed_form(name, rho1, rho2, lam1, lam2, advantage=a, **params)
    clipped = clip_binds(label, rho1, rho2, lam1, lam2, a, eps)
    return net1, net2, cf.value, equation_label(label, cf.equation, clipped), cf.why


@st.cache_data(show_spinner=False, max_entries=64)
def cancel_table(
    rho1: float, rho2: float, lam1: float, lam2: float, a: float, eps: float
) -> list[dict[str, Any]]:
    """One row per objective: the shared-prefix nets (autograd) and the paper's closed form."""
    rows = []
    for label in OBJECTIVES:
        net1, net2, closed, equation, _ = net_and_closed_form(label, rho1, rho2, lam1, lam2, a, eps)
        rows.append(
            {
                "objective": label,
                "net t=1 (autograd)": net1,
                "net t=2 (autograd)": net2,
                "closed form (t=1)": closed,
                "equation": equation,
                "cancels": "yes" if abs(net1) < ZERO_TOL and abs(net2) < ZERO_TOL else "no",
            }
        )
    return rows


page_header(
    "Shared prefix",
    "When two completions of one group share a prefix, does that prefix get a net update, and which "
    "objective makes it cancel?",
    r"\hat A_1 s_1 + \hat A_2 s_2 = (-A)\,\rho_1\rho_2\lambda_1 + A\,\rho_1\rho_2\lambda_2"
    r" = A\,\rho_1\rho_2\,(\lambda_2-\lambda_1) \qquad (38)",
    "DFPO App. A.2, eq. (32)-(38). τ1 'answer is 25' (Â = −A) and τ2 'answer is 20' (Â = +A) share "
    "'answer is': r = ρ1, ρ2 on those steps, λ1, λ2 on the last token.",
)

with st.sidebar:
    st.header("Inputs")
    rho1 = st.slider("ρ1 (ratio of 'answer')", 0.05, 1.95, 1.1, 0.05, key="rho1")
    rho2 = st.slider("ρ2 (ratio of 'is')", 0.05, 1.95, 0.9, 0.05, key="rho2")
    lam1 = st.slider("λ1 (ratio of '25', τ1)", 0.05, 3.25, 1.3, 0.05, key="lam1")
    lam2 = st.slider("λ2 (ratio of '20', τ2)", 0.05, 3.25, 0.7, 0.05, key="lam2")
    st.caption("Reachable: 0.3·(λ1 + λ2) < 1 (π_old('25') = π_old('20') = 0.3, '30' keeps the rest).")
    a = st.slider("A (advantage magnitude, Â = ∓A)", 0.1, 3.0, 1.0, 0.1, key="A")
    eps = st.slider("ε (clip range)", 0.0, 0.95, 0.2, 0.01, key="eps")
    st.caption(
        "GRPO: ε_low = ε_high = ε · GRPO-fix: clip(r, 0, 1 + ε) · GSPO, DFPO: [1 − ε, 1 + ε]. DFPO uses "
        "the paper's estimator (every trajectory keeps s̃_i·Â_i on ∇log s_i, clipped or not) unless the "
        "label says ppo_clip; 'GSPO (paper estimator, eq. 86)' is GSPO's s̄ under that estimator."
    )
    label = st.selectbox("Objective", list(OBJECTIVES), index=2, key="objective")

try:
    shared_prefix_policies(rho1, rho2, lam1, lam2)
except ValueError as exc:
    st.error(f"This combination is not reachable on the toy: {exc}. Lower λ1 or λ2 so that λ1 + λ2 < 3.33.")
    st.stop()

with user_errors():
    coef = coefficients(label, rho1, rho2, lam1, lam2, a, eps)
    net1, net2, closed, equation, why = net_and_closed_form(label, rho1, rho2, lam1, lam2, a, eps)
    table = cancel_table(rho1, rho2, lam1, lam2, a, eps)

st.plotly_chart(
    coefficient_bars(
        STEPS,
        coef[0],
        coef[1],
        ("τ1 'answer is 25' (Â = −A)", "τ2 'answer is 20' (Â = +A)"),
        net=[coef[0][0] + coef[1][0], coef[0][1] + coef[1][1], None],
        title=f"{label}: per-token coefficients ∂J/∂logp",
    ),
    key="bars",
)

c1, c2 = st.columns(2)
c1.metric("Net coefficient on the shared prefix (t=1)", fmt_number(net1))
c1.caption(f"autograd, `shared_prefix_net`; t=2: {fmt_number(net2)}")
c2.metric("Eq. (38) closed form", fmt_number(closed))
c2.caption(f"**{equation}**: {why}")

boundaries = (1.0 - eps, 1.0 + eps)
if any(abs(r - b) < 1e-9 for r in (rho1, rho2) for b in boundaries):
    st.info(
        "A shared ratio sits exactly on a clip boundary 1 ± ε: the objective has a kink there and its "
        "derivative is one-sided, so autograd and the closed form may pick different sides. Move ρ or ε."
    )

st.subheader("Where each objective cancels")
st.caption(
    "Net coefficient on the two shared steps for every objective at the current sliders; 'yes' when both "
    f"are 0 (|net| < {ZERO_TOL:g}). With λ2 = 1.9 at the other defaults τ2's "
    "sequence ratio (1.23) passes 1 + ε and its clip binds: DFPO under the paper's estimator still cancels, "
    "its ppo_clip variant and GSPO drop the clipped trajectory ('eq. (72), clipped term dropped'), and the "
    "eq. (86) control keeps it but not the balance Σ Â s̄ = 0."
)
st.dataframe(table, hide_index=True, key="cancel_table")
