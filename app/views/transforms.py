"""Page 3, Group transforms (DFPO App. B): what does each transform do to one group's weights?

The user edits one group (a reward and a sequence weight s per completion) in a data editor; the page
shows the advantages Â (``cancellation.group_advantages``), the sign-aware post-clip weights s̄
(``cancellation.objectives.sign_aware_clip``, eq. 47), every transform's s̃
(``cancellation.transforms.TRANSFORMS``: eq. 50, 18, 51, 52–55), Σ Â s̃ for each, DFPO's Asym (eq. 23)
before and after, and for G = 2 or 3 a picture of the projection in weight space.

Asym is ``cancellation.objectives.group_asym`` (the function behind every objective's ``asym`` metric):
"before" with GSPO's trajectory weight s̄, "after" with each transform's s̃.

Σ Â s̃ = 0 reaches the gradient only under DFPO's paper estimator, where every completion, clipped or
not, keeps the coefficient s̃_i·Â_i on ∇log s_i. The page shows the net coefficient that a token every
completion shares gets, from ``cancellation.diagnostics.token_coefficients`` of the real objectives
(``gspo``/``dfpo``) on a one-token-per-completion batch whose sequence ratios are the table's s, under
both estimators: ``paper`` (DFPO's default; for ``gspo`` the eq. 86 control) and ``ppo_clip`` (GSPO's
own; DFPO's trust-region variant, not in the paper), where a clipped completion drops out.
"""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st
import torch

from app.common import page_header, user_errors
from cancellation import TRANSFORMS, group_advantages
from cancellation.advantages import SCALES
from cancellation.diagnostics import token_coefficients
from cancellation.objectives import ESTIMATORS, group_asym, sign_aware_clip
from plots import LINE_COLOR_WORD, ORTHANT_COLOR_WORD, PLANE_COLOR_WORD, weight_space_figure

#: the group shown at first: G = 3, one correct and two wrong completions. G = 3 so that the projection is
#: drawn (weight space is G-dimensional: the picture exists for G = 2 or 3); one correct answer against
#: two wrong ones so that the |Â_i| differ (+1.15, −0.58, −0.58), without which Orth-Proj shifts every
#: w_i·Â_i by the same constant and leaves Asym unchanged (as for any G = 2 group, or two reward values in
#: equal numbers). At ε = 0.2 the clip binds on completions 1 and 3 (s̄ = 1.2, 1.05, 0.8), not on 2.
DEFAULT_GROUP = pd.DataFrame({"reward": [1.0, 0.0, 0.0], "s": [1.3, 1.05, 0.7]})

TRANSFORM_EQS = {
    "min_replace": r"\text{Min-Replace (50):}\quad \tilde s_i = \bar s_{\min} = \min_j \bar s_j",
    "orth_proj": r"\text{Orth-Proj (18):}\quad \tilde{\mathbf s} = \bar{\mathbf s}"
    r" - \frac{\hat{\mathbf A}^\top \bar{\mathbf s}}{\|\hat{\mathbf A}\|_2^2}\,\hat{\mathbf A}",
    "orth_proj_pos": r"\text{positive QP (51):}\quad \tilde{\mathbf s} = \arg\min_{\mathbf v}"
    r" \tfrac12\|\mathbf v - \bar{\mathbf s}\|_2^2 \ \text{s.t.}\ \hat{\mathbf A}^\top\mathbf v = 0,"
    r"\ \mathbf v \succeq 0",
    "truncate_rebalance": r"\text{truncate-and-rebalance (52)–(55):}\quad \mathbf s^+ = \max(\bar{\mathbf s},"
    r" \epsilon\mathbf 1),\ \delta = \hat{\mathbf A}^\top\mathbf s^+,\ \text{scale the positive side by }"
    r"\alpha\ (\delta > 0)\text{ or the negative side by }\beta\ (\delta < 0)",
}


def read_group(df: pd.DataFrame) -> tuple[list[float], list[float]]:
    """The rewards and sequence weights of the edited table; ValueError naming what to fix."""
    if df is None or len(df) == 0:
        raise ValueError("The group is empty: add at least two completions (rows) to the table.")
    rewards = pd.to_numeric(df["reward"], errors="coerce").tolist()
    weights = pd.to_numeric(df["s"], errors="coerce").tolist()
    for name, col in (("reward", rewards), ("sequence weight s", weights)):
        bad = [i + 1 for i, v in enumerate(col) if v is None or not math.isfinite(v)]
        if bad:
            raise ValueError(
                f"Row(s) {', '.join(map(str, bad))} have an empty or non-numeric {name} cell: "
                "fill in a finite number or delete the row."
            )
    if len(rewards) < 2:
        raise ValueError(
            "A group of one completion has nothing to compare with: its reward is its group's mean, so its "
            "advantage is 0 by construction and no transform has anything to do. Add at least one more row."
        )
    bad = [f"row {i + 1}: s = {v:g}" for i, v in enumerate(weights) if v <= 0]
    if bad:
        raise ValueError(
            "Sequence weights must be > 0: s_i = exp(mean_t log r_{i,t}) (eq. 44) is a ratio of "
            f"probabilities, so it is never zero or negative ({'; '.join(bad)}). Enter positive values."
        )
    return rewards, weights


def group_results(
    rewards: list[float], weights: list[float], scale: str, eps_low: float, eps_high: float, floor: float
) -> dict:
    """Everything the page shows, computed by ``cancellation`` (float64)."""
    r = torch.tensor(rewards, dtype=torch.float64)
    s = torch.tensor(weights, dtype=torch.float64)
    group = torch.zeros(len(rewards), dtype=torch.long)
    adv = group_advantages(r, group, scale=scale)
    # DFPO eq. (47): the sign-aware post-clip weight
    s_bar = sign_aware_clip(s, adv, eps_low, eps_high)
    s_tilde = {
        name: fn(s_bar, adv, group, floor=floor) if name == "truncate_rebalance" else fn(s_bar, adv, group)
        for name, fn in TRANSFORMS.items()
    }
    return {
        "adv": adv,
        "s_bar": s_bar,
        "s_tilde": s_tilde,
        "sum_bar": float(adv @ s_bar),
        "sums": {k: float(adv @ v) for k, v in s_tilde.items()},
        "asym_before": float(group_asym(s_bar, adv, group)),
        "asym_after": {k: float(group_asym(v, adv, group)) for k, v in s_tilde.items()},
        # the sign-aware clip binds (eq. 47): s̄ ≠ s on a completion that carries an advantage
        "clipped": [
            bool(b != w and x != 0) for b, w, x in zip(s_bar.tolist(), weights, adv.tolist(), strict=True)
        ],
        "nets": shared_token_nets(weights, adv, eps_low, eps_high),
    }


def shared_token_nets(
    weights: list[float], adv: torch.Tensor, eps_low: float, eps_high: float
) -> dict[str, dict[str, float]]:
    """{estimator: {"GSPO (no transform)" or transform: G·Σ_i ∂J/∂logp_i}} from the real objectives.

    The batch has one token per completion with log-ratio log s_i (so the sequence ratio is the table's
    s_i), one group, the objectives' own aggregation (``seq-mean-token-mean``): ∂J/∂logp_i is then the
    coefficient of ∇log s_i divided by G, and G·Σ_i of it is what a token every completion (of equal
    length T) shares gets, times G·T. Paper estimator: Σ_i Â_i s̃_i (s̄_i for gspo: eq. 86); ppo_clip:
    the same sum over the completions whose clip does not bind. ``truncate_rebalance`` runs at dfpo's
    own floor (1e-6).
    """
    g = len(weights)
    old = torch.zeros(g, 1, dtype=torch.float64)
    logp = torch.tensor(weights, dtype=torch.float64).log()[:, None]
    mask, group = torch.ones(g, 1), torch.zeros(g, dtype=torch.long)
    clip = {"epsilon_low": eps_low, "epsilon_high": eps_high}
    out: dict[str, dict[str, float]] = {}
    for est in ESTIMATORS:
        calls = {
            "GSPO (no transform)": ("gspo", {}),
            **{name: ("dfpo", {"transform": name}) for name in TRANSFORMS},
        }
        out[est] = {
            label: g
            * float(token_coefficients(obj, logp, old, adv, mask, group, estimator=est, **clip, **p).sum())
            for label, (obj, p) in calls.items()
        }
    return out


#: row titles of the shared-token table, per estimator
ESTIMATOR_ROWS = {
    "paper": "paper estimator (DFPO's default; GSPO: the eq. 86 control)",
    "ppo_clip": "ppo_clip (GSPO's own; DFPO's trust-region variant, not in the paper)",
}


def _fmt(x: float) -> str:
    out = f"{x:.6f}"
    return "0.000000" if out == "-0.000000" else out


page_header(
    "Group transforms",
    "What does each DFPO transform do to a group's sequence weights, and does Σ Â s̃ = 0 afterwards?",
    r"\bar s_i = \begin{cases}\min(s_i, c_i) & \hat A_i \ge 0\\ \max(s_i, c_i) & \hat A_i < 0\end{cases},"
    r"\quad c_i = \mathrm{clip}(s_i, 1-\varepsilon_{\mathrm{low}}, 1+\varepsilon_{\mathrm{high}})"
    r"\qquad \text{(47)}",
    "DFPO App. B: eq. (47) sign-aware post-clip weight; transforms eq. (17)/(50), (18), (51), (52)–(55); "
    "Asym eq. (23). The shared-token gradient cancels when Σ_i Â_i s̃_i = 0 (eq. 2, 9).",
)

with st.sidebar:
    st.header("Inputs")
    scale = st.selectbox(
        "Advantage scale",
        SCALES,
        key="scale",
        help="group: divide by the group's reward std (GRPO, eq. 43); batch: by the batch std (one group "
        "here, so the same); none: no division (Dr. GRPO, App. A eq. 29).",
    )
    eps_low = st.number_input(
        "ε_low", min_value=0.0, max_value=0.999, value=0.2, step=0.01, format="%.4f", key="eps_low",
        help="Lower clip range of eq. (46): c = clip(s, 1 − ε_low, 1 + ε_high). GSPO's own is 3e-4.",
    )  # fmt: skip
    eps_high = st.number_input(
        "ε_high", min_value=0.0, max_value=10.0, value=0.2, step=0.01, format="%.4f", key="eps_high",
        help="Upper clip range of eq. (46). GSPO's own is 4e-4.",
    )  # fmt: skip
    floor = st.number_input(
        "truncate-and-rebalance floor ϵ (eq. 52)", min_value=0.0, max_value=10.0, value=1e-6, step=0.01,
        format="%.6f", key="floor", help="s⁺ = max(s̄, ϵ) before the one-side rescaling (eq. 52).",
    )  # fmt: skip

st.subheader("The group")
st.caption(
    "One row per completion: its reward R_i and its sequence weight s_i = π_θ/π_old (GSPO's "
    "length-normalised ratio, eq. 44). Edit cells, add or delete rows."
)
edited = st.data_editor(
    DEFAULT_GROUP,
    key="group",
    num_rows="dynamic",
    column_config={
        "reward": st.column_config.NumberColumn("reward R_i", format="%.3f"),
        "s": st.column_config.NumberColumn("sequence weight s_i", format="%.3f"),
    },
)

with user_errors():
    rewards, weights = read_group(edited)
    res = group_results(rewards, weights, scale, float(eps_low), float(eps_high), float(floor))

G = len(rewards)
all_zero = not bool(res["adv"].any())
if all_zero:
    st.warning(
        "All rewards are equal, so every advantage Â_i is 0: this group carries no learning signal. "
        "Every transform leaves the loss term Σ Â s̃ at 0, and nothing is projected (every v satisfies "
        "Âᵀv = 0). Give the completions different rewards to see the transforms act."
    )

table = pd.DataFrame(
    {
        "R": rewards,
        "s": weights,
        "Â": res["adv"].tolist(),
        "s̄ (eq. 47)": res["s_bar"].tolist(),
        "clip binds": ["yes" if c else "no" for c in res["clipped"]],
        **{f"s̃ {k}": v.tolist() for k, v in res["s_tilde"].items()},
    },
    index=pd.Index(range(1, G + 1), name="i"),
)
st.subheader("Advantages, post-clip weights and each transform's output")
st.dataframe(
    table, column_config={c: st.column_config.NumberColumn(format="%.4f") for c in table if c != "clip binds"}
)

st.markdown(
    r"**$\sum_i \hat A_i \tilde s_i$** (0: a token that every completion shares gets no net gradient under the paper estimator, eq. 2/9/68)"
)
cols = st.columns(len(res["sums"]) + 1)
cols[0].metric("Σ Â s̄ (GSPO)", _fmt(res["sum_bar"]))
for col, (name, v) in zip(cols[1:], res["sums"].items(), strict=True):
    col.metric(f"Σ Â s̃ — {name}", _fmt(v))

st.markdown(
    "**What reaches the gradient**: the net coefficient of a token every completion shares (equal lengths), "
    "G·Σ_i ∂J/∂log s_i, from the objectives' own autograd"
)
nets = pd.DataFrame({ESTIMATOR_ROWS[est]: row for est, row in res["nets"].items()}).T.rename_axis("estimator")
st.dataframe(nets, key="nets", column_config={c: st.column_config.NumberColumn(format="%.6f") for c in nets})
st.caption(
    "Under the paper's estimator every completion, clipped or not, keeps s̃_i·Â_i on ∇log s_i, so the net "
    "is Σ Â s̃ (0 for every transform; Σ Â s̄ for the eq. 86 control). Under ppo_clip a completion whose "
    "clip binds ('clip binds' above) contributes nothing, so the transform's balance no longer reaches the "
    "gradient. truncate_rebalance runs at dfpo's floor 1e-6 here."
)

st.markdown(
    r"**$\mathrm{Asym} = \mathrm{Var}_i(w_i \hat A_i)$** (eq. 23): how unevenly the weights modulate the "
    "advantages (before: w = s̄; after: w = s̃)"
)
cols = st.columns(len(res["asym_after"]) + 1)
cols[0].metric("Asym before: s̄ (GSPO)", _fmt(res["asym_before"]))
for col, (name, v) in zip(cols[1:], res["asym_after"].items(), strict=True):
    change = _fmt(v - res["asym_before"])
    col.metric(
        f"Asym after — {name}",
        _fmt(v),
        delta=change,
        delta_color="inverse" if change != "0.000000" else "off",
        delta_arrow="auto" if change != "0.000000" else "off",
    )

st.caption(
    "Orth-Proj changes w_i Â_i by −c·Â_i² (c = Âᵀs̄/‖Â‖², eq. 18); when every |Â_i| is the same (any G = 2 "
    "group, or two reward values in equal numbers such as rewards 1, 0, 1, 0) that is one constant for the "
    "whole group, so Asym does not move. The default group (one correct answer, two wrong) has unequal |Â_i|, "
    "so it does."
)

st.subheader("The projection in weight space")
if all_zero:
    st.info("With every advantage 0 there is no constraint Âᵀv = 0 to draw.")
elif G in (2, 3):
    fig = weight_space_figure(
        res["adv"].tolist(), res["s_bar"].tolist(), {k: v.tolist() for k, v in res["s_tilde"].items()}
    )
    st.plotly_chart(fig, key="weight_space")
    if G == 2:
        what = (
            f"The dashed {LINE_COLOR_WORD} line is Âᵀv = 0, where shared tokens cancel; the green-shaded "
            "quadrant is v ≥ 0 (eq. 51). The black dot is s̄ and an arrow in each transform's colour goes "
            "from s̄ to its s̃ (legend; coinciding points keep their distinct symbols)."
        )
    else:
        what = (
            f"The {PLANE_COLOR_WORD} plane is Âᵀv = 0, where shared tokens cancel; the two {ORTHANT_COLOR_WORD} "
            "lines from the origin bound its part where v ≥ 0 (eq. 51). The black dot is s̄ and a segment in "
            "each transform's colour goes from s̄ to its s̃ (legend; coinciding points hide each other). "
            "Drag to turn the cube."
        )
    st.caption(
        what + " Orth-Proj moves s̄ perpendicularly onto the constraint (eq. 18), the positive QP to its "
        "closest point of it with v ≥ 0, truncate-and-rebalance by shrinking one sign's side, Min-Replace to "
        "the diagonal (all weights equal), which lies on the constraint because Σ Â = 0."
    )
else:
    st.info(
        f"The picture needs G ≤ 3 (weight space is G-dimensional; this group has G = {G}). "
        "Delete rows until 2 or 3 remain to see the projection drawn."
    )

with st.expander("The transforms (DFPO App. B)"):
    for eq in TRANSFORM_EQS.values():
        st.latex(eq)
    st.latex(r"\mathrm{Asym} = \mathrm{Var}_{i}\big(w_i\,\hat A_i\big)\qquad(23)")
