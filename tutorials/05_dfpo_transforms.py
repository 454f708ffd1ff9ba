# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 5 · The DFPO transforms
#
# Tutorials 2–4 showed two ways an objective breaks the cancellation of shared tokens: sequence
# coupling (the weights $s_i$ differ within a group) and sign-dependent clipping. DFPO keeps GSPO's
# sequence-level structure and repairs the first with a **group transform**: before the weights
# multiply the advantages, map the group's weight vector $\bar{\mathbf s}$ to a new one
# $\tilde{\mathbf s}$ with
#
# $$\sum_{i=1}^G \tilde s_i \hat A_i = 0 \qquad\text{(eq. 73)},$$
#
# so that a token every completion shares (same length) gets a zero net coefficient again.
# This tutorial applies the four transforms of App. B to a hand-made group, runs them inside the
# objective, shows why the paper's stop-gradient estimator carries eq. (73) to the gradient (also
# when the clip binds), and trains the toy to tell what the *estimator* does from what the
# *transform* does. In the exercises you write Min-Replace, Orth-Proj, the post-clip weight and the
# paper's estimator yourself.

# %%
import math

import plotly.graph_objects as go
import plotly.io as pio
import torch
from exercise_check import check, ensure, expect_cases, expect_close, forbid, reject  # the exercises' checks
from plotly.subplots import make_subplots
from show import report_rows, table  # tables, and quotes of experiments/REPORT.md

from cancellation import group_advantages
from cancellation.diagnostics import shared_residual, token_coefficients
from cancellation.objectives import sequence_log_ratio, sign_aware_clip
from cancellation.transforms import TRANSFORMS, min_replace
from experiments.stats import paired_difference
from plots import ARM_COLORS, curve_figure  # one colour per arm; the app's mean ± 1 std seed curves
from toymodel import get_scenario
from toymodel.batched import seed_rows, simulate_seeds
from toymodel.compare import summarize_variant

pio.renderers.default = "plotly_mimetype+notebook_connected"
torch.set_num_threads(1)  # the toy's tensors are tiny: one thread is fastest
torch.set_printoptions(precision=4, sci_mode=False)
f64 = torch.float64

# %% [markdown]
# One colour per arm, the same in every tutorial and on the Training lab (`plots.ARM_COLORS`,
# the app's palette); the same arm at ε = 0.2 keeps its colour, dotted. This tutorial's labels:

# %%
ARM_OF = {  # this tutorial's label → the arm's name in ARM_COLORS
    "s̄ (GSPO)": "GSPO", "DFPO (Min-Replace)": "DFPO Min-Replace", "min_replace": "DFPO Min-Replace",
    "orth_proj": "DFPO Orth-Proj", "orth_proj_pos": "DFPO positive QP",
    "truncate_rebalance": "DFPO truncate-rebalance",
}  # fmt: skip
COLOR = {**ARM_COLORS, **{label: ARM_COLORS[arm] for label, arm in ARM_OF.items()}}
COLOR.update({f"{label} ε=0.2": COLOR[label] for label in ("GSPO", "DFPO (Min-Replace)")})


def rgba(color: str, alpha: float) -> str:
    """A "#rrggbb" colour with opacity ``alpha``, for bands and dots."""
    return "rgba({},{},{},{})".format(*(int(color[k : k + 2], 16) for k in (1, 3, 5)), alpha)


# %% [markdown]
# ## 1. A hand-made group and its post-clip weights
#
# Eight completions, five correct. Their sequence ratios $s_i$ have moved away from 1 during the
# inner epochs; one correct completion ($i = 3$) has become much less likely ($s = 0.04$).

# %%
rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0], dtype=f64)
group = torch.zeros(8, dtype=torch.long)
adv = group_advantages(rewards, group)
s = torch.tensor([1.35, 1.15, 1.25, 0.04, 0.5, 0.85, 1.4, 0.7], dtype=f64)
print("Â =", adv)
print("s =", s)

# %% [markdown]
# GSPO's clipped term $\min(s_i\hat A_i, \operatorname{clip}(s_i)\hat A_i)$ equals $\hat A_i\,\bar s_i$ with
# the sign-aware post-clip weight
#
# $$\bar s_i = \begin{cases}\min(s_i, c_i), & \hat A_i \ge 0\\ \max(s_i, c_i), & \hat A_i < 0\end{cases},
# \qquad c_i = \operatorname{clip}(s_i, 1-\varepsilon, 1+\varepsilon) \qquad\text{(eq. 47)}:$$
#
# the clip caps a ratio only when it has moved **in its advantage's direction** (up for $\hat A > 0$,
# down for $\hat A < 0$). GSPO is $\frac1G\sum_i \hat A_i\bar s_i$, and DFPO replaces $\bar{\mathbf s}$ by
# $\tilde{\mathbf s}$. With $\varepsilon = 0.2$:

# %%
s_bar = sign_aware_clip(s, adv, 0.2, 0.2)
print("s̄ =", s_bar)
print("Σ Â·s̄ =", float(adv @ s_bar), " ← not 0: this group's shared tokens would not cancel")

# %% [markdown]
# ## 2. The four transforms (App. B)
#
# * **Min-Replace** (eq. 50): $\tilde s_i = \min_j \bar s_j$ for every $i$;
# * **Orth-Proj** (eq. 18): $\tilde{\mathbf s} = \bar{\mathbf s} -
#   \frac{\hat{\mathbf A}^\top\bar{\mathbf s}}{\lVert\hat{\mathbf A}\rVert^2}\hat{\mathbf A}$;
# * **positive QP** (eq. 51):
#   $\tilde{\mathbf s} = \arg\min_{\mathbf v}\tfrac12\lVert\mathbf v - \bar{\mathbf s}\rVert^2$
#   subject to $\hat{\mathbf A}^\top\mathbf v = 0$ and $\mathbf v \ge 0$;
# * **truncate-and-rebalance** (eq. 52–55): floor the weights at a small $\epsilon$, then scale one
#   sign side by $\alpha$ or $\beta \in (0, 1]$ so that the inner product is 0.
#
# Each is a vectorised function `(weights, advantages, group) -> weights` in
# `cancellation.transforms` (Exercise 5.1 writes the first two yourself):

# %%
results = {name: fn(s_bar, adv, group) for name, fn in TRANSFORMS.items()}
table(
    [
        {"transform": name, "s̃": [round(v, 3) for v in w.tolist()], "Σ Â·s̃": float(adv @ w),
         "‖s̃ − s̄‖": float((w - s_bar).norm()), "min s̃": float(w.min())}
        for name, w in results.items()
    ]
)  # fmt: skip
shrink = float(adv.abs() @ s_bar / (adv.abs() @ results["min_replace"]))
print(f"\nMin-Replace shrinks the group's step Σ|Â|·s by {shrink:.1f}× (Σ|Â|·s̄ over Σ|Â|·s̃)")

# %% [markdown]
# All four reach $\sum_i \hat A_i \tilde s_i = 0$ (up to rounding). They differ in how far they move the
# weights:
#
# * **Min-Replace** gives everyone the smallest weight (0.04 here): exchangeable by construction, but
#   one unlikely completion shrinks the whole group's step about 22× (the line under the table). (App. C: a shrink, never a sign flip.)
# * **Orth-Proj** is the smallest change that satisfies eq. (73), but it can go **negative** (the
#   completion with $\bar s = 0.04$ ends at −0.013): a correct completion would be pushed *down*.
# * The **positive QP** is the closest non-negative vector; `orth_proj_pos` solves it exactly (its
#   KKT solution is $\max(\bar{\mathbf s} - \lambda\hat{\mathbf A}, 0)$). Here it zeroes that completion
#   and spreads the rest of the correction over the others.
# * **Truncate-and-rebalance** is the paper's one-step approximation of the QP: it only scales the
#   positive side down ($\alpha < 1$), so it moves further than the QP.

# %%
fig = go.Figure()
for name, w in {"s̄ (GSPO)": s_bar, **results}.items():
    fig.add_bar(name=name, x=list(range(8)), y=w.tolist(), marker_color=COLOR[name])
fig.update_layout(
    barmode="group",
    title="Post-clip weights of one group before and after each transform (Â > 0 for i = 0, 1, 2, 3, 6)",
    xaxis_title="completion i",
    yaxis_title="weight",
    height=400,
)
fig.show()

# %% [markdown]
# ## 3. Inside the objective: cancellation restored
#
# Now the real thing: the `dfpo` objective computes $s_i$ from the token ratios, clips it
# sign-aware, applies the transform and multiplies by $\hat A_i$. We use the `template_task` toy
# (5 template positions with 3 synonyms each, then a deciding token; every completion has the same
# length, and template positions are shared by design) with one group of 8, a perturbed $\theta$
# against $\theta_\text{old}$. Forced steps (a position with a single action, whose score is the zero
# vector) are left out.

# %%
sc = get_scenario("template_task")
policy = sc.policy()
theta_old = sc.initial_logits()
idx = policy.sample(8, theta_old, generator=torch.Generator().manual_seed(1))
adv_t = group_advantages(policy.rewards[idx], group)
mask = policy.mask[idx]
free = policy.valid.sum(-1)[policy.ctx[idx]] > 1  # steps with a real choice
keys = torch.where(free & policy.valid_steps[idx], policy.event_keys[idx], -1)
old_logp = policy.token_logp(theta_old, idx)
print("Â =", adv_t)

# %% [markdown]
# The meter is the residual on the events that **every** completion of the group contains
# (`shared_residual(..., min_count=G)`): $\sum|\text{net}| / \sum\text{gross}$, 0 for exact cancellation.

# %%
clip02 = {"epsilon_low": 0.2, "epsilon_high": 0.2}
objectives = {
    "GRPO": ("grpo", {}),
    "GSPO": ("gspo", {}),
    **{f"DFPO {name}": ("dfpo", {"transform": name}) for name in TRANSFORMS},
    "DFPO min_replace, ppo_clip": ("dfpo", {"transform": "min_replace", "estimator": "ppo_clip"}),
}


def whole_group_residual(theta: torch.Tensor, objective: str, **params) -> float:
    logp = policy.token_logp(theta, idx)
    coef = token_coefficients(objective, logp, old_logp, adv_t, mask, group, **clip02, **params)
    return shared_residual(coef, keys, mask, min_count=8).total


# %% [markdown]
# Two perturbations $\theta = \theta_\text{old} + \text{scale}\cdot\text{noise}$, a small and a large one:

# %%
noise = torch.randn(theta_old.shape, generator=torch.Generator().manual_seed(2), dtype=f64)
thetas = {scale: theta_old + scale * noise for scale in (0.3, 1.0)}
for scale, theta in thetas.items():
    s_seq = sequence_log_ratio(policy.token_logp(theta, idx), old_logp, mask).exp()
    print(f"scale {scale}: s = {[round(float(v), 3) for v in s_seq]}")
residual_at = {
    (name, scale): whole_group_residual(theta, obj, **params)
    for name, (obj, params) in objectives.items()
    for scale, theta in thetas.items()
}
table(
    [
        {"objective": n, **{f"residual at scale {sc_}": residual_at[n, sc_] for sc_ in thetas}}
        for n in objectives
    ]
)
print(f"\nGSPO leaves {residual_at['GSPO', 0.3]:.3f} and {residual_at['GSPO', 1.0]:.3f}; "
      f"DFPO ppo_clip {residual_at['DFPO min_replace, ppo_clip', 0.3]:.3f} and "
      f"{residual_at['DFPO min_replace, ppo_clip', 1.0]:.3f}")  # fmt: skip

# %% [markdown]
# GRPO and every DFPO transform cancel at both scales (0 up to float rounding, ~1e-16). GSPO does
# not (0.047 at the small perturbation, 0.304 at the large one): its $\bar s_i$ differ within the
# group. At the large perturbation two completions' clips bind (those with $\hat A < 0$ and $s = 0.765$ and $0.61$, below
# $1 - \varepsilon = 0.8$), and still every DFPO transform cancels. The exception is DFPO's
# *trust-region* variant (`estimator="ppo_clip"`, not in the paper, last row): 0 at the small
# perturbation, where nothing clips, but 0.200 at the large one. It gives a clipped completion no
# gradient, so eq. (73)'s balance no longer reaches the shared tokens. Which of the two DFPO
# differentiates is the subject of the next section.
#
# ## 4. Why the stop-gradient matters: the paper's estimator
#
# DFPO treats the transformed weights as **constants**: $\tilde s_i = T(\bar{\mathbf s})_i$ is a number,
# and the gradient the paper writes is the score-function estimator
#
# $$\nabla_\theta J = \frac1G\sum_{i=1}^G \tilde s_i\,\hat A_i\,\nabla_\theta \log s_i(\theta)
#   \qquad\text{(eq. 68)}:$$
#
# *every* completion, clipped or not, moves along its **unclipped** sequence ratio, scaled by
# $\tilde s_i$. With GSPO's $s_i = \exp(\frac{1}{|y_i|}\sum_t \log r_{i,t})$ each of its tokens gets the
# coefficient $\tilde s_i\hat A_i/(G\,|y_i|)$ (you write it in Exercise 5.3). A token that every
# completion of an equal-length group shares then gets $\frac{1}{G\,T}\sum_i\hat A_i\tilde s_i = 0$
# **whatever the clip does**: the clip bounds the weight's value, it never silences a completion.

# %% [markdown]
# Two other ways to differentiate the same objective value:
#
# * `estimator="ppo_clip"`: a completion whose $\bar s_i$ is clipped (a constant) gets **no**
#   gradient, as in PPO/GSPO. A trust region, but not what the paper writes, and the group constraint
#   no longer holds on the gradient.
# * GSPO under the paper's estimator (eq. 86, `gspo` with `estimator="paper"`): every completion gets
#   $\bar s_i\hat A_i\nabla\log s_i$, **no transform**. This is the control: it keeps the gradients
#   that GSPO's clip silences, exactly as DFPO does, but not the balance $\sum_i\hat A_i\bar s_i = 0$.
#
# A hand-built group makes the difference visible: $G = 4$ completions of $T = 3$ tokens, three
# correct; token 0 is the same event in all four (same context, same token, so the same log-ratio),
# and the other tokens move the sequence ratios so that two clips bind at $\varepsilon = 0.2$.

# %%
G, T = 4, 3
group_h = torch.zeros(G, dtype=torch.long)
adv_h = group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=f64), group_h)
log_r = torch.tensor(  # column 0: the shared token, same log-ratio in every completion
    [[0.1, 0.6, 0.5], [0.1, 0.0, -0.1], [0.1, 0.1, -0.05], [0.1, -0.8, -0.3]], dtype=f64
)
old_h = torch.full((G, T), -1.0, dtype=f64)
logp_h = old_h + log_r
mask_h = torch.ones(G, T)
s_h = sequence_log_ratio(logp_h, old_h, mask_h).exp()
s_bar_h = sign_aware_clip(s_h, adv_h, 0.2, 0.2)
print("Â  =", adv_h)
print("s  =", s_h)
print("s̄  =", s_bar_h, "  clipped:", (s_bar_h != s_h).tolist())

# %%
variants_h = {
    "DFPO min_replace (paper)": ("dfpo", {"transform": "min_replace"}),
    "DFPO orth_proj (paper)": ("dfpo", {"transform": "orth_proj"}),
    "DFPO min_replace (ppo_clip)": ("dfpo", {"transform": "min_replace", "estimator": "ppo_clip"}),
    "DFPO orth_proj (ppo_clip)": ("dfpo", {"transform": "orth_proj", "estimator": "ppo_clip"}),
    "GSPO, eq. 86 control": ("gspo", {"estimator": "paper"}),
    "GSPO (its own ppo_clip)": ("gspo", {}),
}
shared_rows = []
for name, (objective, params) in variants_h.items():
    col = token_coefficients(objective, logp_h, old_h, adv_h, mask_h, group_h, **clip02, **params)[:, 0]
    shared_rows.append({"variant": name, "coefficient of shared token 0, per completion":
                        [round(float(c), 4) + 0.0 for c in col], "net Σ_i": float(col.sum())})  # fmt: skip
table(shared_rows)

# %% [markdown]
# Under the paper's estimator every completion, the two clipped ones included, gets
# $\tilde s_i\hat A_i/(G\,T)$ on the shared token, so the net is $\frac{1}{GT}\sum_i\hat A_i\tilde s_i = 0$.
# The `ppo_clip` variant gives the clipped completions 0 and leaves the rest unbalanced. The eq. 86
# control keeps every completion too, but with $\bar s_i$: its net is $\frac{1}{GT}\sum_i \hat A_i\bar s_i$,
# not 0.
#
# So under the paper's estimator DFPO's coefficient of every token of completion $i$ is the eq. 86
# control's multiplied by $\varphi_i = \tilde s_i/\bar s_i$, clipped completions included (App. C's
# "proportional shrink, no reverse update"): the transform only rescales each completion's step.
# We read that factor off the coefficients of the template group of section 3, large perturbation:

# %%
logp = policy.token_logp(thetas[1.0], idx)
coef_eq86 = token_coefficients("gspo", logp, old_logp, adv_t, mask, group, estimator="paper", **clip02)
coef_dfpo = token_coefficients("dfpo", logp, old_logp, adv_t, mask, group, transform="min_replace", **clip02)
s_bar_t = sign_aware_clip(sequence_log_ratio(logp, old_logp, mask).exp(), adv_t, 0.2, 0.2)
print("DFPO / eq. 86 coefficient, per completion:", (coef_dfpo[:, 0] / coef_eq86[:, 0]))
print("s̃ / s̄ from min_replace:                  ", min_replace(s_bar_t, adv_t, group) / s_bar_t)

# %% [markdown]
# **Without** the stop-gradient (`stop_grad=False`, Table 3's ablation) the transform is differentiated
# too. For Min-Replace and Orth-Proj that is fatal under GSPO's aggregation:
# $\frac1G\sum_i\hat A_i\tilde s_i(\theta)$ is $\tilde s_\text{min} \sum_i \hat A_i = 0$ (Min-Replace) or $0$ by
# construction (Orth-Proj) **for every θ**, so the gradient is identically zero.

# %%
for name in ("min_replace", "orth_proj"):
    coef = token_coefficients(
        "dfpo", logp, old_logp, adv_t, mask, group, transform=name, stop_grad=False, **clip02
    )
    print(f"DFPO {name:11} without stop-grad: max |coefficient| = {float(coef.abs().max()):.1e}")

# %% [markdown]
# ## 5. Training: what the estimator does, and what the transform does
#
# Table 3 of the paper (Qwen3-32B) compares DFPO (Min-Replace), GSPO, DFPO without stop-grad and
# "scale by 0.5" ($\tilde s_i = 0.5\,\bar s_i$, to rule out "it only helps because the steps are
# smaller"). It has no run of the eq. 86 control, and that is the comparison that separates the two
# things DFPO changes at once: **the estimator** (GSPO → control: clipped sequences keep their
# gradient) and **the transform** (control → DFPO: $\sum_i\hat A_i\tilde s_i = 0$). On the toy we run all
# of them at GSPO's own clip range (3e-4 / 4e-4, the paper's setting; 4 inner SGD epochs per batch, so
# most sequences are clipped after the first), 8 seeds × 100 steps, plus GSPO and DFPO at ε = 0.2.
# Under plain SGD and the paper's estimator "scale by 0.5" is exactly the eq. 86 control at half the
# learning rate. `simulate_seeds` trains all seeds of an arm at once (per seed it equals `simulate`).

# %%
E02 = {"epsilon_low": 0.2, "epsilon_high": 0.2}
ablation = {
    "GSPO": ("gspo", {}),
    "eq. 86 control": ("gspo", {"estimator": "paper"}),
    "DFPO (Min-Replace)": ("dfpo", {"transform": "min_replace"}),
    "DFPO ppo_clip": ("dfpo", {"transform": "min_replace", "estimator": "ppo_clip"}),
    "DFPO (no stop-grad)": ("dfpo", {"transform": "min_replace", "stop_grad": False}),
    "DFPO (scale by 0.5)": ("gspo", {"estimator": "paper", "lr": 0.25}),  # = 0.5·s̄ under SGD at lr 0.5
    "GSPO ε=0.2": ("gspo", E02),
    "DFPO (Min-Replace) ε=0.2": ("dfpo", {"transform": "min_replace", **E02}),
}
SEEDS, STEPS = 8, 100
runs = {}
for name, (obj, params) in ablation.items():
    result = simulate_seeds(sc, obj, SEEDS, steps=STEPS, **params)
    runs[name] = [seed_rows(result, i) for i in range(SEEDS)]  # one list of rows per seed

# %% [markdown]
# The summary per arm (`toymodel.compare.summarize_variant`: means over the seeds; the steps and the
# template KL at E[R] ≥ 0.9 over the seeds that got there, `reached` says how many):

# %%
summary = {name: summarize_variant(rows, 0.9) for name, rows in runs.items()}
table(
    [
        {"arm": name, "E[R] final": m["expected_reward"], "reached": m["reached_frac"],
         "steps→0.9": m["steps_to_threshold"], "KL at 0.9": m["template_kl_at_threshold"],
         "KL final": m["template_kl"], "group-shared res.": m["group_shared_residual"],
         "seq-net res.": m["sequence_net_residual"]}
        for name, m in summary.items()
    ]
)  # fmt: skip

# %% [markdown]
# E[R] over the steps, mean ± 1 std over the 8 seeds (`plots.curve_figure`, the app's own). Arms
# that lie on top of another are dashed.


# %%
def curves(arms: list[str], metric: str, title: str, dashed: tuple[str, ...] = ()) -> go.Figure:
    """The app's seed-band figure of ``metric`` for ``arms``, in this tutorial's colours."""
    fig = curve_figure({a: runs[a] for a in arms}, metric, title=title, height=380)
    for tr in fig.data:
        arm, c = tr.legendgroup, COLOR[tr.legendgroup]
        if tr.fill:  # the ±1 std band
            tr.fillcolor = rgba(c, 0.15)
            continue
        tr.line.color = c
        tr.line.dash = "dot" if arm.endswith("ε=0.2") else ("dash" if arm in dashed else None)
    return fig


at_eps = ["GSPO", "eq. 86 control", "DFPO (Min-Replace)", "DFPO ppo_clip", "DFPO (no stop-grad)",
          "DFPO (scale by 0.5)"]  # fmt: skip
curves(at_eps, "expected_reward", "template_task at GSPO's ε: E[R]", ("DFPO ppo_clip",)).show()

# %% [markdown]
# The group-shared residual is not measured at every step, and a mean ± std curve would hide that (its
# band also dipped below 0 for a quantity that is never negative). A step has no value (NaN) when its
# group contains **no event that all 8 completions share** (every completion must pick the same synonym
# at a template position: with the starting 0.7 / 0.2 / 0.1 that is rare) or when **every Â is 0** (all
# 8 rewards equal, the rule once E[R] is near 1). Each panel's title gives the share of seed-steps that
# measured a value. So the figure draws what was measured: every measured (step, value) as a dot, and per
# 10-step window the median of the window's values (line) with their 25th–75th percentiles (band); a
# window without a value is left empty. The y-axis is logarithmic so that DFPO's float rounding (~1e-16)
# and GSPO's 0.1–1 fit on one axis; an exact 0 is drawn at 1e-18. GSPO's values (and those of DFPO's
# ppo_clip variant, which behaves like it) fall in two clusters, 0 up to rounding and 0.1–1, and the
# window medians jump between them; the control sits near 1e-4, DFPO at rounding, and DFPO without
# stop-grad never updates, so it never measures anything.


# %%
def measured(arm: str) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(steps, values) of every (seed, step) of ``arm`` that measured a group-shared residual, and their
    share of all its seed-steps."""
    pts = [(r["step"], r["group_shared_residual"]) for rows in runs[arm] for r in rows]
    kept = [(x, y) for x, y in pts if y == y]  # NaN: nothing measured at that step
    xs = torch.tensor([x for x, _ in kept], dtype=f64)
    return xs, torch.tensor([max(y, 1e-18) for _, y in kept], dtype=f64), len(kept) / len(pts)  # 0 → 1e-18


def window_quartiles(
    xs: torch.Tensor, ys: torch.Tensor, window: int
) -> list[tuple[float, list[float] | None]]:
    """Per ``window`` steps: (its middle, [25th, 50th, 75th percentile] of its values, None when it has none)."""
    out = []
    for start in range(0, STEPS, window):
        inside = ys[(xs >= start) & (xs < start + window)]
        q = (
            torch.quantile(inside, torch.tensor([0.25, 0.5, 0.75], dtype=f64)).tolist()
            if len(inside)
            else None
        )
        out.append((start + window / 2, q))
    return out


# %%
def residual_figure(arms: list[str], title: str, cols: int = 3, window: int = 10) -> go.Figure:
    """One panel per arm: every measured group-shared residual (seed, step) as a dot, and per ``window`` steps
    the median (line) with the 25–75 percentile band of the measured values; windows without one left empty."""
    rows = -(-len(arms) // cols)
    fig = make_subplots(rows=rows, cols=cols, shared_yaxes=True, subplot_titles=[
        f"{arm} ({measured(arm)[2]:.0%} measured)" if len(measured(arm)[0]) else f"{arm}: never measured" for arm in arms
    ])  # fmt: skip
    for k, arm in enumerate(arms):
        xs, ys, _ = measured(arm)
        c, at = COLOR[arm], {"row": k // cols + 1, "col": k % cols + 1}
        fig.add_scatter(
            x=xs.tolist(), y=ys.tolist(), mode="markers", marker={"size": 3, "color": rgba(c, 0.4)}, **at
        )
        band = [(m, q) for m, q in window_quartiles(xs, ys, window) if q is not None]
        fig.add_scatter(x=[m for m, _ in band] + [m for m, _ in band][::-1], y=[q[2] for _, q in band]
                        + [q[0] for _, q in band][::-1], fill="toself", fillcolor=rgba(c, 0.2), line={"width": 0}, **at)  # fmt: skip
        wq = window_quartiles(xs, ys, window)
        fig.add_scatter(x=[m for m, _ in wq], y=[q[1] if q else None for _, q in wq], mode="lines+markers",
                        line={"color": c}, marker={"color": c}, connectgaps=False, **at)  # fmt: skip
    fig.update_yaxes(type="log", range=[-18.5, 0.5])
    fig.update_xaxes(range=[0, STEPS])
    fig.update_layout(title=title, showlegend=False, height=300 * rows)
    fig.update_xaxes(title_text="step", row=rows)
    fig.update_yaxes(title_text="residual (log)", col=1)
    return fig


# %%
residual_figure(
    at_eps, "… group-shared residual: every measured value, median and quartiles per 10 steps"
).show()
residual_figure(["GSPO ε=0.2", "DFPO (Min-Replace) ε=0.2"], "… at ε = 0.2", cols=2).show()

# %% [markdown]
# The same seeds in every run, so the effects are paired differences
# (`experiments.stats.paired_difference`, mean over the 8 seeds with its bootstrap 95 % CI):
# the estimator's effect is control − GSPO, the transform's DFPO − control.

# %%
rows = []
for what, a, b in (
    ("estimator (eq. 86 control − GSPO)", "eq. 86 control", "GSPO"),
    ("transform (DFPO − eq. 86 control)", "DFPO (Min-Replace)", "eq. 86 control"),
    ("transform at ε=0.2 (DFPO − GSPO)", "DFPO (Min-Replace) ε=0.2", "GSPO ε=0.2"),
):
    for key, label in (("steps_to_threshold", "steps→0.9"), ("template_kl_at_threshold", "KL at 0.9")):
        per_seed = (
            [summarize_variant([r], 0.9)[key] for r in runs[a]],
            [summarize_variant([r], 0.9)[key] for r in runs[b]],
        )
        d = paired_difference(*per_seed)
        rows.append(
            {"effect": what, "measure": label, "Δ": d.mean, "95% CI": f"[{d.low:+.3g}, {d.high:+.3g}]"}
        )
table(rows)

# %% [markdown]
# Eight seeds give the direction; `experiments/` measured the same comparisons on 1024 fresh seeds
# (150 steps each). Its report, quoted as written (`show.report_rows` prints the rows of
# `experiments/REPORT.md`'s summary; nothing is recomputed here):

# %%
report_rows("toy_main", "Min-Replace reaches")
report_rows("toy_main", "learning tax")
report_rows("toy_main", "cancels on tokens the whole group shares, GSPO does not (group")

# %% [markdown]
# What this shows on the toy, and what it does not:
#
# * **The estimator does almost everything that separates DFPO from GSPO at GSPO's ε.** GSPO silences
#   most sequences after the first inner step; the eq. 86 control, which has no transform, is as fast
#   as DFPO (the report's "fewer steps than the eq. 86 control": not resolved, Δ within ±0.2 steps) and
#   DFPO's ppo_clip variant behaves like GSPO (dashed, on top of it). DFPO pays *more* learning tax than
#   GSPO (the report: contradicted), and about the same as the control.
# * **The transform's own effect is the last bit of cancellation.** The control's group-shared
#   residual is already small at this ε (its $\bar s_i$ stay close to each other) and DFPO takes it to
#   0 (float rounding, ~1e-16); at ε = 0.2 GSPO's residual is larger and DFPO's is again 0.
# * **No stop-grad does not learn at all**: E[R] stays at its initial 0.3 and its residual is n/a (no
#   coefficient is non-zero). In the paper's LM runs it degrades rather than stops, presumably because
#   completions differ in length; on this equal-length toy nothing survives.
# * **Scale by 0.5 is slower, not better**: it is the control at half the step.
#
# The toy confirms the mechanism (DFPO's shared tokens cancel exactly, under any clip) and shows that,
# here, the gain over GSPO comes from the estimator; whether the transform adds one at language-model
# scale is the public review's open question (tutorial 8).

# %% [markdown]
# ## Exercises
#
# Write the body of each `my_*` function (until you do, it raises `NotImplementedError`), run its
# cell, then run the check cell below it: it prints ✓ or says what is missing or wrong. Each check
# first compares with numbers worked out by hand (in its comments), then runs your function on 20
# random groups (fresh every run; the seed is printed when one fails, `TUTORIAL_CHECK_SEED=<seed>`
# reruns them) against its own plain-loop computation of the definition: Σ Â ≠ 0, groups of two,
# Â = 0 rows, identical completions, padding. An answer that calls the library (`cancellation`,
# `toymodel`, ...) or reads the notebook's variables is refused: take what you need from the
# arguments. A worked solution is in `tutorials/solutions/05_dfpo_transforms.py`; try first.
#
# **Exercise 5.1 — Min-Replace and Orth-Proj.** For **one** group, given its post-clip weights
# $\bar{\mathbf s}$ and advantages $\hat{\mathbf A}$ (both `(G,)`), return the pair
# (Min-Replace's $\tilde{\mathbf s}$, eq. 50; Orth-Proj's $\tilde{\mathbf s}$, eq. 18), each `(G,)`, written with
# plain tensor operations (a line each). Mind that $\hat{\mathbf A}$ need not sum to 0 (a batch-normalised
# or reweighted $\hat A$) and that Orth-Proj may go below 0 (section 2).


# %%
# the check's groups worked out by hand: case 1 has Âᵀs̄ = 1.5·0.8 − 0.5·(1.2 + 0.9 + 1.0) = −0.35 and
# ‖Â‖² = 2.25 + 3·0.25 = 3, so Orth-Proj adds (0.35/3)·Â: +0.175 to completion 0, −0.35/6 to the others;
# case 2: Âᵀs̄ = 0.4, ‖Â‖² = 2. Each: (Â, s̄, Min-Replace's s̃, Orth-Proj's s̃)
ex51 = [
    ([1.5, -0.5, -0.5, -0.5], [0.8, 1.2, 0.9, 1.0], [0.8] * 4, [0.975, 1.2 - 0.35 / 6, 0.9 - 0.35 / 6, 1.0 - 0.35 / 6]),
    ([1.0, -1.0], [1.2, 0.8], [0.8, 0.8], [1.0, 1.0]),
]  # fmt: skip


def pair_of(got, at: str, names: tuple[str, str]) -> None:
    """The check's test that an answer is a pair (two tensors, or numbers)."""
    ensure(isinstance(got, (tuple, list)) and len(got) == 2, f"expected a pair ({names[0]}, {names[1]}) {at}, "
           f"got {type(got).__name__} {got!r}", "wrong type")  # fmt: skip


def compare_5_1(got, want, what: str, at: str) -> None:
    pair_of(got, at, ("Min-Replace", "Orth-Proj"))
    expect_close(got[0], want[0], "Min-Replace's s̃ (eq. 50)", at=at)
    expect_close(got[1], want[1], "Orth-Proj's s̃ (eq. 18)", at=at)


# %%
def case_5_1(gen: torch.Generator):
    """A random group for the check: (s̄, Â) and what it holds; the kinds come in turn."""
    kind = gen.initial_seed() % 1000 % 5  # expect_cases seeds its case i with seed·1000 + i
    g = int(torch.randint(4, 9, (1,), generator=gen))
    s_bar = 0.4 + torch.rand(g, generator=gen, dtype=f64)
    adv = torch.randn(g, generator=gen, dtype=f64)
    if kind == 0:
        return (s_bar, adv + 0.3), "Σ Â ≠ 0"
    if kind == 1:
        return (s_bar[:2], adv[:2]), "a group with exactly two rows"
    if kind == 2:  # a small weight on an Â > 0 row, large ones on the other Â > 0 rows: Orth-Proj below 0
        adv = torch.tensor([1.0, 1.0, 1.0] + [-1.0] * (g - 3), dtype=f64) - 3 / g
        s_bar[0], s_bar[1:3], s_bar[3:] = 0.02, 1.3 + 0.2 * s_bar[1:3], 0.5 + 0.2 * s_bar[3:]
        return (s_bar, adv), "an Orth-Proj result below 0 (s̄ = 0.02 on an Â > 0 row)"
    if kind == 3:
        adv[torch.randperm(g, generator=gen)[: g // 2]] = 0.0
        return (s_bar, adv), "rows with Â = 0"
    pick = torch.arange(g) % 3  # identical completions: three rows repeated
    return (s_bar[pick], adv[pick] - adv[pick].mean()), "identical completions (three rows repeated)"


# %%
def my_min_replace_and_orth_proj(s_bar: torch.Tensor, adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(s̃ of Min-Replace, s̃ of Orth-Proj) for one group: eq. (50) and eq. (18)."""
    raise NotImplementedError("Exercise 5.1: replace this line with your code")


# %%
with check("5.1"):
    forbid(my_min_replace_and_orth_proj, why="write eq. (50) and eq. (18) with tensor operations")
    for a, sb, want_mr, want_op in ex51:
        a_, sb_ = torch.tensor(a, dtype=f64), torch.tensor(sb, dtype=f64)
        got, at = my_min_replace_and_orth_proj(sb_, a_), f"at Â = {a}, s̄ = {sb}"
        pair_of(got, at, ("Min-Replace", "Orth-Proj"))
        expect_close(got[0], torch.tensor(want_mr, dtype=f64), "Min-Replace's s̃ (eq. 50)", at=at)
        dot = float(a_ @ torch.as_tensor(got[1], dtype=f64))
        ensure(abs(dot) < 1e-9, f"Orth-Proj's s̃ {at}: Σ Â·s̃ = {dot:.4g}, not 0 (eq. 73). Orth-Proj removes the "
               "whole component of s̄ along Â: (Âᵀs̄ / ‖Â‖²)·Â, with the squared norm")  # fmt: skip
        expect_close(got[1], torch.tensor(want_op, dtype=f64), "Orth-Proj's s̃ (eq. 18)", at=at)

    def reference(s_bar, adv):  # eq. (50) and eq. (18) with plain loops
        smallest = min(float(v) for v in s_bar)
        dot = sum(float(a) * float(v) for a, v in zip(adv, s_bar, strict=True))
        norm2 = sum(float(a) ** 2 for a in adv)
        orth = [float(v) - dot / norm2 * float(a) for a, v in zip(adv, s_bar, strict=True)]
        return torch.full((len(s_bar),), smallest, dtype=f64), torch.tensor(orth, dtype=f64)

    expect_cases(my_min_replace_and_orth_proj, reference, case_5_1, "s̃", compare=compare_5_1)

# %% [markdown]
# **Exercise 5.2 — the post-clip weights and the shrink factors.** For one group's sequence ratios
# $\mathbf s$ and advantages $\hat{\mathbf A}$ (both `(G,)`) and one $\varepsilon$ for both sides,
# return the pair ($\bar{\mathbf s}$, eq. 47; $\boldsymbol\varphi$ with $\varphi_i = \tilde s_i/\bar s_i$ for
# Min-Replace), the factor by which DFPO's coefficients are the eq. 86 control's (section 4). Mind
# which side of the clip applies to which sign of $\hat A$ ($\hat A = 0$ goes with $\hat A \ge 0$, as in eq. 47).


# %%
# the check's groups, worked out by hand (ε = 0.2). Group 1: c = clip(s) = [1.2, 0.8, 1.0, 1.2, 0.8, 0.9];
# min(s, c) for Â > 0, max(s, c) for Â < 0; s̃ = min s̄ = 0.5, so φ_i = 0.5 / s̄_i
ex52_s = torch.tensor([1.5, 0.5, 1.0, 1.5, 0.5, 0.9], dtype=f64)
ex52_adv = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, -1.0], dtype=f64)
ex52_s_bar = [1.2, 0.5, 1.0, 1.5, 0.8, 0.9]
ex52_why = ["Â > 0 and s above 1 + ε: the clip binds", "Â > 0 and s below 1 − ε: min(s, c) = s, the clip only caps a "
            "ratio that moved in the advantage's direction", "inside [1 − ε, 1 + ε]", "Â < 0 and s above 1 + ε: "
            "max(s, c) = s, the clip only caps a ratio that moved in the advantage's direction",
            "Â < 0 and s below 1 − ε: the clip binds", "inside [1 − ε, 1 + ε]"]  # fmt: skip
ex52_phi = torch.tensor([0.5 / 1.2, 1.0, 0.5, 0.5 / 1.5, 0.5 / 0.8, 0.5 / 0.9], dtype=f64)
# group 2: its smallest ratio s = 0.5 has Â < 0 and is clipped up to 0.8, so min s̄ = 0.7 (Â > 0, s below
# 1 − ε, kept) is not min s; Â = 0 takes min(s, c) like Â > 0
s2_ex = torch.tensor([0.7, 1.1, 0.5, 1.3, 1.5], dtype=f64)
adv2_ex = torch.tensor([1.0, 0.0, -1.0, -1.0, 0.0], dtype=f64)
s2_s_bar = torch.tensor([0.7, 1.1, 0.8, 1.3, 1.2], dtype=f64)
s2_phi = torch.tensor([1.0, 0.7 / 1.1, 0.7 / 0.8, 0.7 / 1.3, 0.7 / 1.2], dtype=f64)  # φ_i = 0.7 / s̄_i


def compare_5_2(got, want, what: str, at: str) -> None:
    pair_of(got, at, ("s̄", "φ"))
    expect_close(got[0], want[0], "s̄ (eq. 47)", at=at)
    expect_close(got[1], want[1], "the shrink factors φ_i = s̃_i / s̄_i", at=at)


# %%
def case_5_2(gen: torch.Generator):
    """A random group for the check: (s, Â, ε) and what it holds; the kinds come in turn."""
    kind = gen.initial_seed() % 1000 % 5
    g = int(torch.randint(3, 9, (1,), generator=gen))
    eps = float(0.05 + 0.3 * torch.rand(1, generator=gen))  # not always 0.2
    s = 0.3 + 1.4 * torch.rand(g, generator=gen, dtype=f64)
    adv = torch.randn(g, generator=gen, dtype=f64)
    if kind == 0:  # Â = 0 rows whose ratios sit outside the clip range, one above, one below
        adv[:2], s[0], s[1] = 0.0, 1 + eps + 0.3, 1 - eps - 0.2
        return (s, adv, eps), f"rows with Â = 0 and s outside [1 − ε, 1 + ε], ε = {eps:.3g}"
    if kind == 1:  # the smallest raw ratio on an Â < 0 row: clipped up, so min s̄ is not min s
        adv[0], s[0] = -abs(float(adv[0])) - 0.1, 0.1
        return (s, adv, eps), f"the smallest s on an Â < 0 row, ε = {eps:.3g}"
    if kind == 2:
        return (s[:2], adv[:2], eps), f"a group with exactly two rows, ε = {eps:.3g}"
    if kind == 3:
        s = 1 + (2 * torch.rand(g, generator=gen, dtype=f64) - 1) * eps * 0.9
        return (s, adv, eps), f"every s inside the clip range, ε = {eps:.3g}"
    return (s, adv + 0.5, eps), f"Σ Â ≠ 0, ε = {eps:.3g}"


# %%
def my_post_clip_and_shrink(
    s: torch.Tensor, adv: torch.Tensor, epsilon: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(s̄, φ) for one group: the sign-aware post-clip weights (eq. 47) and Min-Replace's s̃_i / s̄_i."""
    raise NotImplementedError("Exercise 5.2: replace this line with your code")


# %%
with check("5.2"):
    forbid(my_post_clip_and_shrink, why="write eq. (47) and φ with tensor operations")
    got, got2 = my_post_clip_and_shrink(ex52_s, ex52_adv, 0.2), my_post_clip_and_shrink(s2_ex, adv2_ex, 0.2)
    pair_of(got, "", ("s̄", "φ"))
    shape = tuple(got[0].shape) if isinstance(got[0], torch.Tensor) else type(got[0]).__name__
    ensure(shape == (6,), f"s̄: expected a tensor of shape (6,), got {shape}", "wrong shape")
    for i, (want, note) in enumerate(zip(ex52_s_bar, ex52_why, strict=True)):
        expect_close(got[0][i], want, f"s̄ of completion {i}", at=f"(s = {float(ex52_s[i])}, {note})")
    expect_close(got[1], ex52_phi, "the shrink factors φ_i = s̃_i / s̄_i", at="(s̃_i = min_j s̄_j = 0.5)")
    at2 = f"at s = {s2_ex.tolist()}, Â = {adv2_ex.tolist()}"
    expect_close(got2[0], s2_s_bar, "s̄", at=at2 + " (Â = 0 takes min(s, c), as Â ≥ 0 does)")
    reject(got2[1], 0.5 / s2_s_bar, f"φ {at2}: your numerator is the smallest raw ratio, min_j s_j = 0.5 (Â < 0, clipped up to s̄ = 0.8); Min-Replace's s̃ is the smallest post-clip weight, min_j s̄_j = 0.7")  # fmt: skip
    expect_close(got2[1], s2_phi, "the shrink factors φ_i = s̃_i / s̄_i", at=at2 + " (s̃_i = min_j s̄_j = 0.7)")

    def reference(s, adv, epsilon):  # eq. (47) and φ_i = min_j s̄_j / s̄_i with plain loops
        s_bar = []
        for si, ai in zip(s.tolist(), adv.tolist(), strict=True):
            c = min(max(si, 1 - epsilon), 1 + epsilon)
            s_bar.append(min(si, c) if ai >= 0 else max(si, c))
        return torch.tensor(s_bar, dtype=f64), torch.tensor([min(s_bar) / v for v in s_bar], dtype=f64)

    expect_cases(my_post_clip_and_shrink, reference, case_5_2, "(s̄, φ)", compare=compare_5_2)

# %% [markdown]
# **Exercise 5.3 — the paper's estimator.** Write DFPO's per-token coefficients
# $c_{i,t} = \partial J/\partial\log\pi(y_{i,t})$ under the paper's estimator (eq. 68) with Min-Replace,
# for one group: `log_ratio` is $\log r_{i,t} = \log\pi_\theta - \log\pi_\text{old}$ `(G, T)`, `mask` marks
# each completion's $|y_i|$ tokens, $\varepsilon$ is both clip sides. Every completion, clipped or not,
# gets $\tilde s_i\hat A_i/(G\,|y_i|)$ on each of its tokens, 0 on padding; $s_i$ is the geometric mean of
# its token ratios (eq. 44). Write the coefficients with tensor operations, not by autograd.


# %%
# the check's groups, worked out by hand (ε = 0.2). Group 1, Â = [0.5, 0.5, 0.5, −1.5]: mean log r = [0.4, 0.05,
# 0.05, −1/3] (completion 1 has 2 tokens; its padding's 9.9 is no token), s = [1.492, 1.051, 1.051, 0.717],
# s̄ = [1.2 (clipped), 1.051, 1.051, 0.8 (clipped)], s̃ = min s̄ = 0.8 for all, c = 0.8·Â_i / (4·|y_i|)
ex53 = {
    "lr": torch.tensor([[0.1, 0.6, 0.5], [0.1, 0.0, 9.9], [0.1, 0.1, -0.05], [0.1, -0.8, -0.3]], dtype=f64),
    "mask": torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]], dtype=f64),
    "adv": torch.tensor([0.5, 0.5, 0.5, -1.5], dtype=f64),
    "want": torch.tensor([[0.4 / 12] * 3, [0.4 / 8, 0.4 / 8, 0.0], [0.4 / 12] * 3, [-1.2 / 12] * 3], dtype=f64),
    "why": ["s = e^0.4 clipped to s̄ = 1.2: it keeps its gradient, scaled by s̃ = min s̄ = 0.8, not by s̄",
            "|y_1| = 2 tokens, so each gets s̃Â/(G·2); its padding gets 0",
            "not clipped, s̄ = e^0.05, but every completion is scaled by the same s̃ = 0.8",
            "Â < 0, s = e^(−1/3) clipped up to s̄ = 0.8: it keeps its gradient, s̃Â/(G·3)"],
}  # fmt: skip
# two more groups (Â = [1, 0.5, −0.5, −1]): completion i's tokens get s̃·Â_i/(4·|y_i|); in both the smallest s̄
# is completion 0's own unclipped s, so s̃ is that s
dfpo_adv = torch.tensor([1.0, 0.5, -0.5, -1.0], dtype=f64)
# group 2: mean log r = [−0.3, 0.1, 0, 0.3]; s = e^(−0.3) ≈ 0.741 (Â > 0, below 1 − ε) keeps min(s, c) = s
lr2_ex = torch.tensor([[-0.3, -0.3, -0.3], [0.1, 0.1, 0.0], [0.0, 0.0, 0.0], [0.2, 0.4, 0.3]], dtype=f64)
mask2_ex = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]], dtype=f64)
unit2 = torch.tensor([[1 / 12] * 3, [0.5 / 8] * 2 + [0.0], [-0.5 / 12] * 3, [-1 / 12] * 3], dtype=f64)
# group 3: mean log r over the real tokens = [−0.1, 0.1, 0.05, 0.1]; completion 2 (Â < 0) has 2 tokens and a
# padding log r of −9.9, which would pull its s down to e^(−3.27) and the clip up to 0.8, below e^(−0.1)
lr3_ex = torch.tensor([[-0.1, -0.1, -0.1], [0.0, 0.1, 0.2], [0.05, 0.05, -9.9], [0.1, 0.0, 0.2]], dtype=f64)
mask3_ex = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=f64)
unit3 = torch.tensor([[1 / 12] * 3, [0.5 / 12] * 3, [-0.5 / 8] * 2 + [0.0], [-1 / 12] * 3], dtype=f64)


# %%
dfpo_more = [  # (log r, mask, Â_i/(G·|y_i|) per token, s̃, the case, [(s̃ a known slip gives, what it is)])
    (lr2_ex, mask2_ex, unit2, 0.7408182206817179, "for group 2 (s̃ = min s̄ = completion 0's s = e^(−0.3))", [
        (0.8, "s̄ of completion 0 (s = e^(−0.3) ≈ 0.741, Â > 0) is s itself: eq. (47) takes min(s, c) for Â ≥ 0, "
              "it does not lift a ratio below 1 − ε; a plain clip made it 0.8, and s̃ = min s̄ with it"),
        (0.4065696597405991, "s_i is the product Π_t r_{i,t} (completion 0: e^(−0.9)); eq. (44) takes the "
                             "geometric mean, exp(Σ_t log r_{i,t} / |y_i|) = e^(−0.3)")]),
    (lr3_ex, mask3_ex, unit3, 0.9048374180359595, "for group 3 (s̃ = min s̄ = completion 0's s = e^(−0.1))", [
        (0.8, "completion 2's s counts its padding (log r = −9.9): the mean over all T positions gives s ≈ 0.04, "
              "clipped up to 0.8 (Â < 0), which became s̃ = min s̄; eq. (44) averages log r over its |y_2| = 2 "
              "real tokens only (s = e^0.05)")]),
]  # fmt: skip


# %%
def case_5_3(gen: torch.Generator):
    """A random group for the check: (log r, Â, mask, ε) and what it holds; the kinds come in turn."""
    kind = gen.initial_seed() % 1000 % 7
    g, t_max = (int(n) for n in torch.randint(3, 7, (2,), generator=gen))
    eps = float(0.05 + 0.3 * torch.rand(1, generator=gen))
    lengths = torch.randint(1, t_max + 1, (g,), generator=gen)
    mask = (torch.arange(t_max)[None, :] < lengths[:, None]).to(f64)
    lr = torch.where(mask.bool(), 0.4 * torch.randn(g, t_max, generator=gen, dtype=f64), -5.0)  # padding: −5
    adv = torch.randn(g, generator=gen, dtype=f64)
    adv = adv - adv.mean() + (0.4 if kind == 1 else 0.0)  # Σ Â ≠ 0 in kind 1
    if kind == 2:
        lr, adv, mask = lr[:2], adv[:2], mask[:2]
    elif kind in (3, 6):  # row 0 holds the smallest ratio e^(−1): Â < 0 (clipped up), or Â = 0 (kept)
        lr[0] = torch.where(mask[0].bool(), -1.0, -5.0)
        adv[0] = -abs(float(adv[0])) - 0.1 if kind == 3 else 0.0
    elif kind == 4:  # a one-token completion with Â > 0 holds the smallest ratio
        mask[0], lr[0, 0], adv[0] = torch.tensor([1.0] + [0.0] * (t_max - 1)), -1.0, abs(float(adv[0])) + 0.1
    elif kind == 5:  # identical completions: two rows repeated
        pick = torch.arange(g) % 2
        lr, adv, mask = lr[pick], torch.tensor([0.5, -0.5], dtype=f64)[pick], mask[pick]
    what = ["padding with log r = −5, unequal lengths", "Σ Â ≠ 0", "exactly two completions", "the smallest s on an "
            "Â < 0 row (clipped up)", "a one-token completion with Â > 0 and the smallest s", "identical completions "
            "(two rows repeated)", "an Â = 0 row with the smallest s (below 1 − ε)"][kind]  # fmt: skip
    return (lr, adv, mask, eps), f"{what}, ε = {eps:.3g}, lengths {mask.sum(-1).long().tolist()}"


# %%
def my_dfpo_coefficients(
    log_ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, epsilon: float
) -> torch.Tensor:
    """(G, T) ∂J/∂log π of every token of one group: DFPO Min-Replace, the paper's estimator (eq. 68)."""
    raise NotImplementedError("Exercise 5.3: replace this line with your code")


# %%
with check("5.3"):
    forbid(my_dfpo_coefficients, refused=("backward", "autograd"), why="write eq. (68) yourself")
    got = my_dfpo_coefficients(ex53["lr"], ex53["adv"], ex53["mask"], 0.2)
    ensure(isinstance(got, torch.Tensor) and got.shape == (4, 3), f"the coefficients: expected a tensor of shape (4, 3), got {tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}", "wrong shape")  # fmt: skip
    for i, note in enumerate(ex53["why"]):
        expect_close(got[i], ex53["want"][i], f"the coefficients of completion {i}", at=f"({note})")
    for lr_, mask_, unit, s_tilde, case, slips in dfpo_more:  # the cell before the exercise
        got = my_dfpo_coefficients(lr_, dfpo_adv, mask_, 0.2)
        for s_slip, message in slips:
            reject(got, s_slip * unit, message)
        expect_close(got, s_tilde * unit, "the coefficients", at=case)

    def reference(log_ratio, adv, mask, epsilon):  # eq. (44), (47), (50), (68) with plain loops
        g, a = len(adv), adv.tolist()
        logs = [[float(x) for x, m in zip(log_ratio[i], mask[i], strict=True) if m] for i in range(g)]
        s = [math.exp(sum(row) / len(row)) for row in logs]  # eq. (44) over each completion's real tokens
        c = [min(max(v, 1 - epsilon), 1 + epsilon) for v in s]
        s_tilde = min(min(v, cv) if ai >= 0 else max(v, cv) for v, cv, ai in zip(s, c, a, strict=True))
        rows = [[s_tilde * a[i] / (g * len(logs[i])) if m else 0.0 for m in mask[i]] for i in range(g)]
        return torch.tensor(rows, dtype=f64)  # s̃·Â_i/(G·|y_i|) on every real token, 0 on padding

    expect_cases(my_dfpo_coefficients, reference, case_5_3, "the coefficients")
