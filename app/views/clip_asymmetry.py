"""Page 2, Clipping asymmetry (DFPO App. F / App. H): why does GRPO's clipping break cancellation?

A positive (Â = +A) and a negative (Â = −A) trajectory share one token whose ratio is w. The page
builds a batch of 2·N single-token completions, one pair per w on the x-axis (group ids pairwise,
logp = log w, old_logp = 0), and gets every ∂J/∂logp in one autograd call
(``cancellation.diagnostics.token_coefficients``). The batch loss is the plain sum over pairs
(``seq-mean-token-sum`` with ``seq_count=1``), so each pair's coefficients are exactly the terms of
eq. (75)/(76), with no aggregation factor. The prediction comes from ``toymodel.theory``.
"""

from __future__ import annotations

import math
from typing import Any

import streamlit as st
import torch

from app.common import page_header, user_errors
from app.theory_figures import clip_curves, fmt_number
from cancellation.diagnostics import token_coefficients
from toymodel.theory import clip_coefficient, clip_surrogate, symclip_coefficient

OBJECTIVES: dict[str, str] = {"GRPO": "grpo", "GRPO-fix": "grpo_symclip"}
W_MIN = 0.01
N_POINTS = 400
#: every pair is one group of two single-token completions; the loss sums the pairs (no 1/G, no 1/N)
AGGREGATION: dict[str, Any] = {"aggregation": "seq-mean-token-sum", "seq_count": 1}


def objective_call(label: str, eps: float) -> tuple[str, dict[str, Any]]:
    """(objective name, params): GRPO with ε_low = ε_high = ε; GRPO-fix with clip(r, 0, 1 + ε)."""
    name = OBJECTIVES[label]
    clip = {"epsilon": eps} if name == "grpo_symclip" else {"epsilon_low": eps, "epsilon_high": eps}
    return name, {**clip, **AGGREGATION}


def pair_coefficients(label: str, w: torch.Tensor, a: float, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(negative, positive) trajectory coefficients of the shared token, each (N,), for ratios ``w`` (N,)."""
    name, params = objective_call(label, eps)
    n = w.shape[0]
    logp = w.log().repeat_interleave(2)[:, None]  # (2N, 1): rows 2k, 2k+1 share the ratio w_k
    adv = torch.tensor([-a, a], dtype=torch.float64).repeat(n)  # DFPO eq. (32), per pair
    group = torch.arange(n).repeat_interleave(2)
    coef = token_coefficients(name, logp, torch.zeros_like(logp), adv, torch.ones_like(logp), group, **params)
    return coef[0::2, 0], coef[1::2, 0]


@st.cache_data(show_spinner=False, max_entries=128)
def curves(label: str, a: float, eps: float, w_max: float) -> dict[str, list[float]]:
    """The whole curve in one vectorised call, plus the paper's prediction at every w."""
    w = torch.linspace(W_MIN, w_max, N_POINTS, dtype=torch.float64)
    neg, pos = pair_coefficients(label, w, a, eps)
    if OBJECTIVES[label] == "grpo":
        pred = [clip_coefficient(x, a, eps, eps) for x in w.tolist()]
    else:
        pred = [symclip_coefficient(x, [-a, a], eps) for x in w.tolist()]
    return {
        "w": w.tolist(),
        "pos": pos.tolist(),
        "neg": neg.tolist(),
        "net": (pos + neg).tolist(),
        "prediction": pred,
    }


@st.cache_data(show_spinner=False, max_entries=256)
def at_w(label: str, w: float, a: float, eps: float) -> tuple[float, float, float]:
    """(negative, positive, net) coefficient of the shared token at one ratio w."""
    neg, pos = pair_coefficients(label, torch.tensor([w], dtype=torch.float64), a, eps)
    return float(neg[0]), float(pos[0]), float(neg[0] + pos[0])


page_header(
    "Clipping asymmetry",
    "A positive and a negative trajectory share a token with ratio w: where does GRPO's clipping stop "
    "their coefficients from cancelling, and does symmetric clipping (GRPO-fix) restore it?",
    r"\hat A_1 w + \hat A_2 \bar w = A\big((1+\varepsilon)-w\big)\ (w>1+\varepsilon),\quad"
    r"\hat A_1 \bar w + \hat A_2 w = A\big(w-(1-\varepsilon)\big)\ (w<1-\varepsilon) \quad (75)\text{-}(76)"
    r"\\ \textstyle\sum_i \hat A_i\,\phi(r^\star)\,\nabla\log\pi(a^\star|h^\star)"
    r" = \phi(r^\star)\big(\sum_i \hat A_i\big)\nabla\log\pi = 0,\ \ \phi(r)=\mathrm{clip}(r,0,1+\varepsilon)"
    r" \quad (82)",
    "DFPO App. F eq. (75)-(76) and App. H eq. (79)-(82). Â = (−A, +A). The curves are ∂J/∂logp of the "
    "shared token; along ∇log π the gradient of eq. (75)/(76)'s C(w) is w·C'(w) = ∓A·w (the clipped "
    "branch is a constant).",
)

with st.sidebar:
    st.header("Inputs")
    eps = st.slider("ε (clip range)", 0.0, 0.95, 0.2, 0.01, key="eps")
    a = st.slider("A (advantage magnitude, Â = ∓A)", 0.1, 3.0, 1.0, 0.1, key="A")
    w_max = st.slider("largest ratio w on the x-axis", 1.1, 5.0, 2.0, 0.1, key="w_max")
    chosen = st.multiselect("Objectives", list(OBJECTIVES), default=list(OBJECTIVES), key="objectives")
    w = st.slider("w for the numbers below", W_MIN, 5.0, 1.5, 0.01, key="w")
    st.caption("GRPO: min(r·Â, clip(r, 1 − ε, 1 + ε)·Â) · GRPO-fix: Â·clip(r, 0, 1 + ε).")

if not chosen:
    st.warning("Pick at least one objective in the sidebar to draw its curves.")
else:
    with user_errors():
        data = {label: curves(label, a, eps, w_max) for label in chosen}
    grid = data[chosen[0]]["w"]
    shade = {"GRPO": [(grid[0], min(1.0 - eps, grid[-1])), (max(1.0 + eps, grid[0]), grid[-1])]}
    st.plotly_chart(
        clip_curves(
            grid,
            {k: {c: v[c] for c in ("pos", "neg", "net", "prediction")} for k, v in data.items()},
            shade,
            w,
        ),
        key="curves",
    )
    if w > w_max:
        st.caption(f"The chosen w = {w:g} is beyond the x-axis (w ≤ {w_max:g}).")

st.subheader(f"At w = {w:g}")
with user_errors():
    grpo = at_w("GRPO", w, a, eps)
    fix = at_w("GRPO-fix", w, a, eps)
    pred_grpo = clip_coefficient(w, a, eps, eps)
    pred_fix = symclip_coefficient(w, [-a, a], eps)
    c_w = clip_surrogate(w, a, eps, eps)

c1, c2, c3, c4 = st.columns(4)
c1.metric("Net coefficient, GRPO", fmt_number(grpo[2]))
c2.metric("Eq. (75)/(76) prediction, GRPO", fmt_number(pred_grpo))
c3.metric("Net coefficient, GRPO-fix", fmt_number(fix[2]))
c4.metric("Eq. (82) prediction, GRPO-fix", fmt_number(pred_fix))
if w > 1.0 + eps:
    region = "w > 1 + ε: the positive trajectory is clipped (constant), the negative one keeps −A·w (eq. 75)"
elif w < 1.0 - eps:
    region = "w < 1 − ε: the negative trajectory is clipped (constant), the positive one keeps +A·w (eq. 76)"
else:
    region = "w inside [1 − ε, 1 + ε]: both terms are live and cancel (eq. 9)"
st.caption(
    f"{region}. GRPO coefficients: negative {fmt_number(grpo[0])}, positive {fmt_number(grpo[1])}; "
    f"C(w) = {fmt_number(c_w)}, so w·C'(w) = {fmt_number(pred_grpo)}. GRPO-fix: negative "
    f"{fmt_number(fix[0])}, positive {fmt_number(fix[1])}."
)
if any(math.isclose(w, b, abs_tol=1e-9) for b in (1.0 - eps, 1.0 + eps)):
    st.info(
        "w sits exactly on a clip boundary 1 ± ε: the objective has a kink there, its derivative is "
        "one-sided, and autograd and the closed form may pick different sides. Move w or ε."
    )
