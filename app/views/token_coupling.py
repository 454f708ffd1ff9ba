"""Page 6, Token coupling (cancellation-hypothesis paper, arXiv 2605.08666): how do a batch's tokens move each other?

One on-policy batch of the small neural policy (``instruments.coupling.sample_batch``: ``toymodel.neural``
on a toy scenario, GRPO coefficients c = ∂J/∂log π) and one plain SGD step on it. Every number is the
library's: ``instruments.coupling.measure`` gives the coupling kernels (full, output layer, and the
output-layer proxy of eq. 6–8), the actual and first-order Δ log π and the exact Masking Effects of Table 1's
four mask sets; ``cancellation.coupling`` gives the self/coupling split (``first_order_delta``, eq. 5),
``boost_stats``, ``coupling_mass`` and ``value_gap`` (Fig. 5); ``instruments.coupling.batch_token_values``
the exact counterfactual token values (App. E.2, eq. 20). The paper's text lost its typeset equations: the
library rebuilt them from the prose, and the equation numbers here are the paper's.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import streamlit as st
import torch

from app.common import page_header, user_errors
from cancellation.coupling import ValueGap, boost_stats, first_order_delta, value_gap
from instruments import coupling as xc
from plots import (
    delta_scatter,
    kernel_heatmap,
    masking_histogram,
    self_coupling_scatter,
    topk_gap_curve,
    value_gap_bars,
)
from toymodel.scenarios import SCENARIOS

#: more tokens than this make the exact masked steps (one SGD step per candidate and set) too slow
MAX_TOKENS = 320
#: the mask sets, as Table 1 names them
SET_LABELS = {
    "random": "random (as many tokens as 'both')",
    "same_token": "same token",
    "low_confidence": "low confidence",
    "both": "same token & low confidence (Eq. 10)",
}
UPDATE_LABELS = {"full": "Full (all parameters)", "head": "LM-head (W_out only)"}
MARK_LABELS = (
    "same token & both low-confidence (Eq. 10)",
    "same token",
    "both low-confidence",
    "none",
)
ORDERS = ("rollout (batch order)", "token string")
#: the entropy fractions of the top-k curve (Fig. 5b)
TOP_FRACS = tuple(round(0.05 * i, 2) for i in range(1, 21))


def token_labels(vocab: tuple[str, ...], tokens: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """One distinct label per flat token: ``r<rollout>.<step> <token string>``, in ``batch.tokens`` order."""
    rows, steps = torch.nonzero(mask.bool(), as_tuple=True)  # row-major, as x[mask.bool()]
    return [f"r{int(b)}.{int(t)} {vocab[int(y)]}" for b, t, y in zip(rows, steps, tokens, strict=True)]


def group_starts(group: torch.Tensor, mask: torch.Tensor) -> list[int]:
    """The flat index of the first token of every group but the first (where a boundary line goes)."""
    first_token = torch.cumsum(mask.sum(1), 0) - mask.sum(1)  # flat index of each rollout's first token
    new_group = torch.nonzero(group.diff() != 0).flatten() + 1  # rollouts that open a group
    return [int(first_token[b]) for b in new_group]


@st.cache_resource(show_spinner=False, max_entries=8)
def batch_of(scenario: str, seed: int, group_size: int, num_groups: int) -> xc.Batch:
    """The library's batch (kept as one object: the measurement and the values read it, never change it)."""
    return xc.sample_batch(scenario, seed=seed, group_size=group_size, num_groups=num_groups)


@st.cache_data(show_spinner=False, max_entries=16)
def analysis(
    scenario: str, seed: int, group_size: int, num_groups: int, lr: float, same_sign: bool, low_conf: float,
    update: str,
) -> dict[str, Any]:  # fmt: skip
    """Everything the page shows for one set of inputs but the chosen mask set (plain arrays and floats)."""
    batch = batch_of(scenario, seed, group_size, num_groups)
    m = xc.measure(batch, lr=lr, same_sign=same_sign, low_conf=low_conf, updates=(update,), mask_seed=seed)
    summary = xc.summarise(m, update=update)
    kernel = m.kernels[update]
    split = first_order_delta(kernel, batch.coef, lr)  # eq. (5): self and coupling terms
    first = m.delta["full_first" if update == "full" else "proxy_first"]
    tokens = batch.tokens
    low = batch.probs_taken < low_conf
    return {
        "n": int(tokens.shape[0]),
        "labels": token_labels(batch.policy.vocab, tokens, batch.mask),
        "token_str": [batch.policy.vocab[int(y)] for y in tokens],
        "group_start": group_starts(batch.group, batch.mask),
        "adv": batch.adv_tok.numpy(),
        "forced": batch.forced.numpy(),
        "all_zero_coef": bool((batch.coef == 0).all()),
        "n_params": batch.policy.num_params(),
        "kernels": {k: v.numpy() for k, v in m.kernels.items()},
        "head_proxy_maxdiff": float((m.kernels["head"] - m.kernels["proxy"]).abs().max()),
        "same_pairs": (tokens[:, None] == tokens[None, :]).numpy(),
        "low_pairs": (low[:, None] & low[None, :]).numpy(),
        "actual": m.delta[update].numpy(),
        "first": first.numpy(),
        "self": split.self.numpy(),
        "coupling": split.coupling.numpy(),
        "me": {s: m.me[update][s].numpy() for s in xc.MASK_SETS},
        "me_first": {s: m.me_first[update][s].numpy() for s in xc.MASK_SETS},
        "computed": {s: m.computed[s].numpy() for s in xc.MASK_SETS},
        "summary": summary,
        "table": xc.table_rows(summary),
    }


@st.cache_data(show_spinner=False, max_entries=16)
def token_values(scenario: str, seed: int, group_size: int, num_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """(N,) exact counterfactual values (eq. 20; NaN for forced tokens) and (N,) entropies of the batch."""
    batch = batch_of(scenario, seed, group_size, num_groups)
    return xc.batch_token_values(batch).numpy(), xc.token_entropy(batch).numpy()


@st.cache_data(show_spinner=False, max_entries=32)
def value_gaps(values: np.ndarray, delta: np.ndarray, entropy: np.ndarray) -> tuple[ValueGap, list[float]]:
    """Fig. 5: ``value_gap`` on every token, and on the top fraction by entropy for each of ``TOP_FRACS``."""
    v, d, e = (torch.from_numpy(x) for x in (values, delta, entropy))
    full = value_gap(v, d)
    curve = [value_gap(v, d, e, f).gap for f in TOP_FRACS]
    return full, curve


@st.cache_data(show_spinner=False, max_entries=32)
def control_gap(values: np.ndarray, coef: np.ndarray) -> float:
    """The no-coupling control: ``value_gap`` when each token moves by its own term lr·c_j·K_jj alone
    (K_jj > 0, so its sign is c_j's: boosted = the tokens of positive rollouts)."""
    return value_gap(torch.from_numpy(values), torch.from_numpy(coef)).gap


def fmt(x: float, digits: int = 3) -> str:
    return "–" if isinstance(x, float) and math.isnan(x) else f"{x:.{digits}g}"


def pct(x: float) -> str:
    return "–" if math.isnan(x) else f"{100.0 * x:.1f}%"


page_header(
    "Token coupling",
    "One SGD step on one batch: how much does each token's log-probability move because of the *other* "
    "tokens, which tokens push each other, and do the boosted tokens have higher value?",
    r"\Delta\log\pi(y_j) \approx \underbrace{\eta\,c_j K_{jj}}_{\text{self}}"
    r" + \underbrace{\eta\sum_{k\neq j} c_k K_{jk}}_{\text{coupling}},\quad"
    r" K_{jk}=\langle g_j, g_k\rangle\ (5),\qquad"
    r" K^{W}_{jk}=\langle h_j,h_k\rangle\,\langle e_{y_j}-\pi_j,\ e_{y_k}-\pi_k\rangle\ (7\text{–}8)",
    "The Cancellation Hypothesis in Critic-Free RL (arXiv 2605.08666), eq. (4)–(10), Sec. 2 / Table 1, "
    "Sec. 3 / Fig. 5, App. E.2 eq. (20). The paper's text lost its typeset equations; these were rebuilt "
    "from its prose (cancellation/coupling.py says how). g_j = ∇θ log π(y_j), c_j = ∂J/∂log π(y_j), η the "
    "SGD step size.",
)

with st.sidebar:
    st.header("Inputs")
    names = list(SCENARIOS)
    scenario = st.selectbox("scenario", names, index=names.index("template_task"), key="scenario")
    seed = int(st.number_input("seed", min_value=0, max_value=2**31 - 1, value=0, step=1, key="seed"))
    group_size = int(st.slider("group size G", 2, 16, 8, 1, key="group_size"))
    num_groups = int(st.slider("number of groups", 1, 8, 4, 1, key="num_groups"))
    lr = float(st.slider("SGD step size η", 0.1, 5.0, 1.0, 0.1, key="lr"))
    update = st.radio(
        "update (Table 1's column)", list(UPDATE_LABELS), format_func=UPDATE_LABELS.get, key="update"
    )
    st.subheader("Mask sets (Table 1)")
    same_sign = st.toggle("masks take only tokens of the candidate's advantage sign", False, key="same_sign")
    low_conf = float(st.slider("low confidence: π(y) <", 0.0, 1.0, 0.5, 0.01, key="low_conf"))
    mask_set = st.selectbox(
        "mask set shown", list(SET_LABELS), index=3, format_func=SET_LABELS.get, key="set"
    )
    st.subheader("Display")
    marks_label = st.radio("mark pairs on the kernels", MARK_LABELS, key="marks")
    order = st.radio("order tokens by", ORDERS, key="order")

rollouts = group_size * num_groups
with user_errors():
    batch = batch_of(scenario, seed, group_size, num_groups)
n_tokens = int(batch.tokens.shape[0])
if n_tokens > MAX_TOKENS:
    st.error(
        f"{num_groups} groups × {group_size} rollouts give {n_tokens} tokens on `{scenario}`: too many for an "
        f"interactive page (at most {MAX_TOKENS}: the exact Masking Effect takes one SGD step per candidate "
        "and mask set). Lower the group size or the number of groups."
    )
    st.stop()

with user_errors():
    res = analysis(scenario, seed, group_size, num_groups, lr, same_sign, low_conf, update)

if res["all_zero_coef"]:
    st.error(
        f"Every rollout of each group got the same reward (seed {seed}, {num_groups} group(s) of {group_size}), "
        "so every advantage and every coefficient c_j is 0: the SGD step does not move θ and there is "
        "nothing to couple. Raise the group size, add groups or change the seed."
    )
    st.stop()

n = res["n"]
labels = res["labels"]
if order == ORDERS[1]:
    perm = np.argsort(np.asarray(res["token_str"], dtype=object), kind="stable")
    boundaries: list[int] = []
else:
    perm = np.arange(n)
    boundaries = res["group_start"]
plabels = [labels[i] for i in perm]
mark_of = {
    MARK_LABELS[0]: res["same_pairs"] & res["low_pairs"],
    MARK_LABELS[1]: res["same_pairs"],
    MARK_LABELS[2]: res["low_pairs"],
}
marks = mark_of.get(marks_label)
pmarks = None if marks is None else (marks & ~np.eye(n, dtype=bool))[np.ix_(perm, perm)]
summary = res["summary"]

# ------------------------------------------------------------------------------------------------
st.header("1. The coupling kernel")
st.markdown(
    f"The batch: {num_groups} group(s) × {group_size} rollouts of `{scenario}`, {n} tokens "
    f"({int(res['forced'].sum())} forced: their context allows a single token), a net of {res['n_params']} "
    "parameters. K_jk = ⟨g_j, g_k⟩ (eq. 5) is how much a step along token k's score moves token j: red "
    "pairs push each other up, blue ones down. The output-layer kernel keeps only W_out's part of g; the "
    "proxy (eq. 6–7) builds it from the hidden states and the distributions alone, ⟨h_j, h_k⟩·D_jk with "
    "D_jk = ⟨e_{y_j} − π_j, e_{y_k} − π_k⟩ (eq. 8). Eq. (10): D_jk is large and positive when y_j = y_k and "
    "both tokens have low confidence, so the coupling concentrates on same-token low-confidence pairs; two "
    "different tokens of uncertain distributions get a smaller D, often negative (they compete for mass)."
)
kernels = res["kernels"]
c1, c2, c3 = st.columns(3)
c1.plotly_chart(
    kernel_heatmap(kernels["full"][np.ix_(perm, perm)], plabels, "Full kernel K (eq. 5)", marks=pmarks,
                   mark_name=marks_label, boundaries=boundaries),
    key="kernel_full",
)  # fmt: skip
c2.plotly_chart(
    kernel_heatmap(kernels["head"][np.ix_(perm, perm)], plabels, "Output-layer kernel K^W (exact)",
                   marks=pmarks, mark_name=marks_label, boundaries=boundaries),
    key="kernel_head",
)  # fmt: skip
c3.plotly_chart(
    kernel_heatmap(kernels["proxy"][np.ix_(perm, perm)], plabels, "Proxy ⟨h_j, h_k⟩·D_jk (eq. 7)",
                   marks=pmarks, mark_name=marks_label, boundaries=boundaries),
    key="kernel_proxy",
)  # fmt: skip
st.caption(
    "Rows j and columns k are the batch's tokens (hover: r<rollout>.<step> <token>); black lines separate "
    "groups (batch order). The colour range is ± the 99th percentile of the off-diagonal |K|, so the "
    f"diagonal self-terms K_jj = ‖g_j‖² and the strongest couplings saturate. Dark overlay: {marks_label} pairs (j ≠ k; low confidence: π(y) < {low_conf:g})."
)
mass = summary["coupling_mass"]
m1, m2, m3, m4 = st.columns(4)
m1.metric("max |K^W − proxy|", f"{res['head_proxy_maxdiff']:.3g}")
m1.caption("W_out is untied and has no bias, so the proxy is its exact kernel (up to rounding).")
m2.metric("‖K − proxy‖ / ‖K‖", f"{summary['kernel_rel_diff']:.3f}")
m2.caption("What the proxy misses: the shared hidden layer and the embeddings.")
m3.metric("coupling mass on same-token pairs", pct(mass["same_token"]))
m3.caption(f"`coupling_mass` of the {update} kernel: share of Σ_{{j≠k}} |c_k K_jk| with y_j = y_k.")
m4.metric("… on same-token & both low-confidence", pct(mass["same_token_low_confidence"]))
m4.caption(f"both low-confidence (any tokens): {pct(mass['both_low_confidence'])}")

# ------------------------------------------------------------------------------------------------
st.header("2. Δ log π after one SGD step")
st.markdown(
    f"θ' = θ + η·Σ_k c_k g_k with η = {lr:g} ({UPDATE_LABELS[update]}). Left: each token's actual change of "
    "log π against eq. (5)'s first-order prediction η·Σ_k c_k K_jk (with the proxy kernel, eq. 9, for the "
    "LM-head update). Right: that prediction split into the token's own term η c_j K_jj and the coupling "
    "term from every other token; points near the dotted line are tokens whose own push the others cancel."
)
movable = ~res["forced"]
adv = res["adv"]
lab_m = [labels[i] for i in np.flatnonzero(movable)]
d1, d2 = st.columns(2)
d1.plotly_chart(
    delta_scatter(res["first"][movable], res["actual"][movable], lab_m, adv[movable],
                  f"Actual vs first-order Δ log π ({update})"),
    key="delta",
)  # fmt: skip
d2.plotly_chart(
    self_coupling_scatter(res["self"][movable], res["coupling"][movable], lab_m, adv[movable],
                          "Self-term vs coupling term (eq. 5)"),
    key="self_coupling",
)  # fmt: skip
sa = summary["sign_agreement"]
outweigh = float(np.mean(np.abs(res["coupling"][movable]) > np.abs(res["self"][movable])))
s1, s2, s3, s4 = st.columns(4)
s1.metric("sign agreement: first order vs actual (full)", pct(sa["full_first_vs_full_actual"]))
s2.metric("sign agreement: proxy (eq. 9) vs full actual", pct(sa["proxy_first_vs_full_actual"]))
s3.metric("sign agreement: LM-head vs full step (App. D.1)", pct(sa["head_actual_vs_full_actual"]))
s4.metric("tokens whose coupling term outweighs their self-term", pct(outweigh))
st.caption(
    "Over the non-forced tokens (`summarise`'s sign agreements). Forced tokens have π = 1 and do not move."
)

# ------------------------------------------------------------------------------------------------
st.header("3. The Masking Effect (Sec. 2, Table 1)")
st.markdown(
    "Mask a set M_j of tokens out of the loss (coefficients set to 0, the normaliser kept) and take the same "
    "step: ME_j = log π_θ'(y_j) − log π_θ'₋M(y_j) > 0 means the masked tokens had boosted token j. The Boost "
    "Rate is the share of candidates with ME_j > 0, the Mean Boost their mean ME (`boost_stats`). Candidates: "
    "the non-forced tokens whose 'same token & low confidence' set is non-empty, so all four rows count the "
    "same tokens."
)
sel = res["computed"][mask_set]
if not sel.any():
    st.error(
        f"No candidate: no non-forced token has another token with the same string and π(y) < {low_conf:g}"
        f"{' and the same advantage sign' if same_sign else ''}, so the mask sets are empty. Raise the "
        "low-confidence threshold"
        f"{' or turn off the same-sign convention' if same_sign else ''}."
    )
else:
    me = res["me"][mask_set][sel]
    stats = boost_stats(torch.from_numpy(me))
    paper = xc.PAPER_BOOST_RATE[update][mask_set]
    b1, b2, b3, b4 = st.columns(4)
    b1.metric(f"Boost Rate: {SET_LABELS[mask_set]}", pct(stats.boost_rate))
    b2.metric("Mean Boost", f"{stats.mean_boost:.3e}")
    b3.metric(f"Paper's Boost Rate ({update} column)", pct(paper))
    b4.metric("candidates", f"{int(sel.sum())}")
    st.plotly_chart(
        masking_histogram(me, res["me_first"][mask_set][sel], f"Masking Effect of '{SET_LABELS[mask_set]}'"),
        key="me_hist",
    )
    rows = [
        {
            "mask set": SET_LABELS[r["mask"]],
            "candidates": r["n"],
            "Boost Rate": pct(r["boost_rate"]),
            "paper (Table 1)": pct(r["paper_br"]),
            "Mean Boost": fmt(r["mean_boost"]),
            "first-order Boost Rate": pct(r["first_order_boost_rate"]),
            "ME = 0 exactly": pct(r["tie_rate"]),
            "mean mask size": f"{r['mask_size']:.1f}",
        }
        for r in res["table"]
    ]
    st.dataframe(rows, hide_index=True, key="table1")
    st.caption(
        f"All four sets under the same step; the paper's column is Table 1's {UPDATE_LABELS[update]}. On this "
        f"net of {res['n_params']} parameters the rates differ from the paper's (an LM): the paper leaves several "
        "conventions open (which candidates, the mask's advantage sign, orienting ME by it, the threshold), "
        "and `python -m experiments.coupling` ranks them by their distance to the paper's rates. *ME = 0 "
        "exactly*: the masked step moves the candidate not at all (under the LM-head update, a mask of tokens "
        "whose W_out rows the candidate's softmax does not use); counted as not boosted."
    )

# ------------------------------------------------------------------------------------------------
st.header("4. Values of boosted vs suppressed tokens (Sec. 3, Fig. 5)")
st.markdown(
    "A token's counterfactual value (App. E.2, eq. 20) is (Q(s, a) − V(s)) / (1 − π(a|s)): how much better "
    "taking it is than sampling another token from s. Here it is exact (the toy's support is enumerated), "
    "not a Monte Carlo estimate. The paper finds that the tokens the update boosts (Δ log π > 0) have higher "
    "value than those it suppresses (Fig. 5a), and that the gap on the top-k% highest-entropy tokens rises "
    "then falls, peaking near the top 40% (Fig. 5b). A token of a positive rollout is raised by its own coefficient "
    "too, so part of any gap needs no cancellation: the *no-coupling control* is the gap when every token "
    "moves by its own term alone (boosted = the tokens of positive rollouts); the coupled step's gap above or "
    "below it is what the coupling between tokens adds."
)
with user_errors():
    values, entropy = token_values(scenario, seed, group_size, num_groups)
    gap, curve = value_gaps(values, res["actual"], entropy)
    control = control_gap(values, batch_of(scenario, seed, group_size, num_groups).coef.numpy())
v1, v2, v3, v4, v5 = st.columns(5)
v1.metric("value gap (boosted − suppressed)", fmt(gap.gap, 4))
v2.metric("mean value, boosted", fmt(gap.boosted, 4))
v3.metric("mean value, suppressed", fmt(gap.suppressed, 4))
v4.metric("no-coupling control's gap", fmt(control, 4))
v5.metric("what coupling adds (gap − control)", fmt(gap.gap - control, 4))
g1, g2 = st.columns(2)
g1.plotly_chart(value_gap_bars(gap.boosted, gap.suppressed, gap.n_boosted, gap.n_suppressed), key="values")
g2.plotly_chart(topk_gap_curve(TOP_FRACS, curve), key="topk")
st.caption(
    f"`value_gap` with Δ log π the actual change under the {update} step; forced tokens (no alternative, "
    "value undefined) and tokens with Δ = 0 are in neither set. Right: the same gap on the highest-entropy "
    "fraction of the tokens."
)
