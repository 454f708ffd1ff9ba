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
# so that a token every completion shares (same length, eq. 72) gets a zero net coefficient again.
# This tutorial applies the four transforms of App. B to a hand-made group, then runs them inside
# the objective, and finally reproduces the stop-gradient ablation of Table 3 on the toy.

# %%
import statistics

import plotly.graph_objects as go
import plotly.io as pio
import torch

from cancellation import group_advantages
from cancellation.diagnostics import shared_residual, steps_to_threshold, token_coefficients
from cancellation.objectives import sequence_log_ratio, sign_aware_clip
from cancellation.transforms import TRANSFORMS, min_replace, orth_proj, orth_proj_pos, truncate_rebalance
from toymodel import get_scenario, simulate

pio.renderers.default = "plotly_mimetype+notebook_connected"
torch.set_num_threads(1)  # the toy's tensors are tiny: one thread is fastest
torch.set_printoptions(precision=4, sci_mode=False)
f64 = torch.float64

# %% [markdown]
# ## 1. A hand-made group and its post-clip weights (eq. 46–49)
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
# the sign-aware post-clip weight (eq. 47)
#
# $$\bar s_i = \begin{cases}\min(s_i, c_i), & \hat A_i \ge 0\\ \max(s_i, c_i), & \hat A_i < 0\end{cases},
# \qquad c_i = \operatorname{clip}(s_i, 1-\varepsilon, 1+\varepsilon),$$
#
# so GSPO is $\frac1G\sum_i \hat A_i\bar s_i$ (eq. 49), and DFPO replaces $\bar{\mathbf s}$ by
# $\tilde{\mathbf s}$. With $\varepsilon = 0.2$:

# %%
s_bar = sign_aware_clip(s, adv, 0.2, 0.2)
print("s̄ =", s_bar)
print("Σ Â·s̄ =", float(adv @ s_bar), " ← not 0: this group's shared tokens would not cancel")

# %% [markdown]
# ## 2. The four transforms (App. B)
#
# * **Min-Replace** (eq. 17, 50): $\tilde s_i = \min_j \bar s_j$ for every $i$;
# * **Orth-Proj** (eq. 18, 63): $\tilde{\mathbf s} = \bar{\mathbf s} -
#   \frac{\hat{\mathbf A}^\top\bar{\mathbf s}}{\lVert\hat{\mathbf A}\rVert^2}\hat{\mathbf A}$;
# * **positive QP** (eq. 51):
#   $\tilde{\mathbf s} = \arg\min_{\mathbf v}\tfrac12\lVert\mathbf v - \bar{\mathbf s}\rVert^2$
#   subject to $\hat{\mathbf A}^\top\mathbf v = 0$ and $\mathbf v \ge 0$;
# * **truncate-and-rebalance** (eq. 52–55): floor the weights at a small $\epsilon$, then scale one
#   sign side by $\alpha$ or $\beta \in (0, 1]$ so that the inner product is 0.
#
# Each is a vectorised function `(weights, advantages, group) -> weights` in
# `cancellation.transforms`:

# %%
results = {name: fn(s_bar, adv, group) for name, fn in TRANSFORMS.items()}
print(f"{'transform':20} {'s̃':>64}   {'Σ Â·s̃':>9} {'‖s̃ − s̄‖':>9} {'min s̃':>7}")
for name, s_tilde in results.items():
    values = " ".join(f"{float(v):6.3f}" for v in s_tilde)
    print(
        f"{name:20} [{values}]   {float(adv @ s_tilde):+9.1e} "
        f"{float((s_tilde - s_bar).norm()):9.4f} {float(s_tilde.min()):7.3f}"
    )

# %% [markdown]
# All four reach $\sum_i \hat A_i \tilde s_i = 0$. They differ in how far they move the weights:
#
# * **Min-Replace** gives everyone the smallest weight (0.04 here): exchangeable by construction, but
#   one unlikely completion shrinks the whole group's step by 30×. (App. C: a shrink, never a sign flip.)
# * **Orth-Proj** is the smallest change that satisfies eq. (73), but it can go **negative** (the
#   completion with $\bar s = 0.04$ ends at −0.013): a correct completion would be pushed *down*.
# * The **positive QP** (eq. 51) is the closest non-negative vector; `orth_proj_pos` solves it exactly
#   (its KKT solution is $\max(\bar{\mathbf s} - \lambda\hat{\mathbf A}, 0)$). Here it zeroes that
#   completion and spreads the rest of the correction over the others.
# * **Truncate-and-rebalance** is the paper's one-step approximation of the QP: it only scales the
#   positive side down ($\alpha < 1$), so it moves further than the QP.
#
# A picture of the same table:

# %%
fig = go.Figure()
fig.add_bar(name="s̄ (GSPO)", x=list(range(8)), y=s_bar.tolist())
for name, s_tilde in results.items():
    fig.add_bar(name=name, x=list(range(8)), y=s_tilde.tolist())
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
# against $\theta_\text{old}$, and measure the residual on the events that **every** completion of
# the group contains (`shared_residual(..., min_count=G)`: 0 means exact cancellation). Forced
# steps (a position with a single action, whose score is the zero vector) are left out.

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

objectives = {
    "GRPO": ("grpo", {}),
    "GSPO": ("gspo", {}),
    **{f"DFPO {name}": ("dfpo", {"transform": name}) for name in TRANSFORMS},
}


def whole_group_residual(theta: torch.Tensor, objective: str, **params) -> float:
    logp = policy.token_logp(theta, idx)
    coef = token_coefficients(
        objective, logp, old_logp, adv_t, mask, group, epsilon_low=0.2, epsilon_high=0.2, **params
    )
    return shared_residual(coef, keys, mask, min_count=8).total


for scale in (0.3, 1.0):
    theta = theta_old + scale * torch.randn(
        theta_old.shape, generator=torch.Generator().manual_seed(2), dtype=f64
    )
    s_seq = sequence_log_ratio(policy.token_logp(theta, idx), old_logp, mask).exp()
    print(f"\nθ = θ_old + {scale}·noise;  s = {[round(float(v), 3) for v in s_seq]}")
    for name, (objective, params) in objectives.items():
        print(f"  {name:24} whole-group residual {whole_group_residual(theta, objective, **params):.3f}")

# %% [markdown]
# With moderate ratios (top block) GSPO leaves a residual and every DFPO transform brings it to 0,
# like GRPO. With larger ratios (bottom block) DFPO's residual is back: a completion whose clip binds
# has a constant $\bar s$ and contributes no gradient at all (here the two completions with
# $\hat A < 0$ and $s = 0.765$ and $0.61$, below $1 - \varepsilon = 0.8$), so eq. (73)'s balance no
# longer reaches the shared tokens. That is also why, with GSPO's own tiny clip range, DFPO and GSPO
# leave about the same residual in training (the README's tables):
# clipping, not coupling, is what is left.
#
# ## 4. Why the stop-gradient matters (App. C/D, Table 3)
#
# DFPO treats the transformed weights as constants in backprop: $\tilde s_i = \operatorname{sg}(\tilde
# s_i/\bar s_i)\,\bar s_i(\theta)$ (eq. 59–62, 68). The value is $\tilde s_i$ and the gradient is
# $\tilde s_i\hat A_i\nabla\log\bar s_i$: every token of completion $i$ keeps its GSPO direction,
# scaled by $\tilde s_i/\bar s_i$ (App. C's "proportional shrink, no reverse update"). We can read
# that factor straight off the coefficients:

# %%
theta = theta_old + 0.3 * torch.randn(theta_old.shape, generator=torch.Generator().manual_seed(2), dtype=f64)
logp = policy.token_logp(theta, idx)
clip02 = {"epsilon_low": 0.2, "epsilon_high": 0.2}
coef_gspo = token_coefficients("gspo", logp, old_logp, adv_t, mask, group, **clip02)
coef_dfpo = token_coefficients("dfpo", logp, old_logp, adv_t, mask, group, transform="min_replace", **clip02)
s_bar_t = sign_aware_clip(sequence_log_ratio(logp, old_logp, mask).exp(), adv_t, 0.2, 0.2)
print("DFPO / GSPO coefficient, per completion:", (coef_dfpo[:, 0] / coef_gspo[:, 0]))
print("s̃ / s̄ from min_replace:                ", min_replace(s_bar_t, adv_t, group) / s_bar_t)

# %% [markdown]
# **Without** the stop-gradient the transform is differentiated too. For Min-Replace and Orth-Proj
# that is fatal under GSPO's aggregation: $\frac1G\sum_i\hat A_i\tilde s_i(\theta)$ is $\tilde s_\text{min}
# \sum_i \hat A_i = 0$ (Min-Replace) or $0$ by construction (Orth-Proj) **for every θ**, so the
# gradient is identically zero.

# %%
for name in ("min_replace", "orth_proj"):
    coef = token_coefficients(
        "dfpo", logp, old_logp, adv_t, mask, group, transform=name, stop_grad=False, **clip02
    )
    print(f"DFPO {name:11} without stop-grad: max |coefficient| = {float(coef.abs().max()):.1e}")

# %% [markdown]
# Table 3 of the paper (Qwen3-32B) compares DFPO (Min-Replace), GSPO, DFPO without stop-grad, and
# "scale by 0.5" ($\tilde s_i = 0.5\,\bar s_i$, to rule out "it only helps because the steps are
# smaller"). On the toy we can run all four. Under plain SGD, scaling every weight by 0.5 halves
# GSPO's gradient exactly, so "scale by 0.5" is GSPO at half the learning rate. All runs use
# ε = 0.2 so that coupling is not hidden by clipping (tutorial 3), 4 seeds × 100 steps.

# %%
E02 = {"epsilon_low": 0.2, "epsilon_high": 0.2}
ablation = {
    "DFPO (Min-Replace)": ("dfpo", {"transform": "min_replace", **E02}),
    "GSPO (baseline)": ("gspo", E02),
    "DFPO (no stop-grad)": ("dfpo", {"transform": "min_replace", "stop_grad": False, **E02}),
    "DFPO (scale by 0.5)": ("gspo", {"lr": 0.25, **E02}),  # = 0.5·s̄ under SGD at lr 0.5
}
print(
    f"{'variant':22} {'E[R] final':>14} {'steps→0.9':>10} {'template KL':>14} {'group-shared residual':>22}"
)
curves = {}
for name, (objective, params) in ablation.items():
    runs = [simulate(sc, objective, steps=100, seed=seed, **params) for seed in range(4)]
    curves[name] = [statistics.mean(rows[t]["expected_reward"] for rows in runs) for t in range(100)]
    reward = [rows[-1]["expected_reward"] for rows in runs]
    hits = [
        steps_to_threshold([r["expected_reward"] for r in rows], 0.9, [r["step"] for r in rows])
        for rows in runs
    ]
    reached = [h for h in hits if h is not None]
    steps = f"{statistics.mean(reached):.0f}" if reached else "never"
    kl = [rows[-1]["template_kl"] for rows in runs]
    res = [
        r["group_shared_residual"] for rows in runs for r in rows if r["group_shared_residual"] >= 0
    ]  # drop NaN (no update with a real coefficient on a whole-group event)
    res_text = f"{statistics.mean(res):22.3f}" if res else f"{'n/a (no gradient)':>22}"
    print(
        f"{name:22} {statistics.mean(reward):6.3f} ± {statistics.stdev(reward):.3f} {steps:>10} "
        f"{statistics.mean(kl):6.3f} ± {statistics.stdev(kl):.3f} {res_text}"
    )

fig = go.Figure([go.Scatter(x=list(range(1, 101)), y=ys, name=name) for name, ys in curves.items()])
fig.update_layout(
    title="Table 3 on the template toy: exact E[R], mean of 4 seeds",
    xaxis_title="step",
    yaxis_title="E[R]",
    height=380,
)
fig.show()

# %% [markdown]
# What this reproduces and what it does not:
#
# * **No stop-grad does not learn at all** here: E[R] stays at its initial 0.3 and the template KL at
#   0, and its residual is "n/a": its coefficients are $\sum_i\hat A_i$ times something, 0 up to
#   rounding (about $10^{-17}$), which the simulator does not count as an update. That is the structural reason behind Table 3's
#   degradation, in its most extreme form: under `seq-mean-token-mean` the differentiated transform
#   cancels the whole objective, not only its shared part. In the paper's LM runs it degrades rather
#   than stops, presumably because completions differ in length and a length-weighted aggregation
#   lets something through; on this equal-length toy nothing survives.
# * **Scale by 0.5 is slower, not better**: half the step reaches the threshold later, with a
#   smaller template KL because it has moved less overall.
# * **DFPO vs GSPO**: DFPO's group-shared residual is exactly 0 where GSPO's is not (the mechanism),
#   but the final reward and the learning tax (template KL) are within about one standard deviation
#   of GSPO's over these seeds; the README's 10-seed table says the same. The toy confirms the
#   mechanism, not the downstream gain.
#
# ## Exercises
#
# **Exercise 5.1 — pick the transform.** Among the four transforms applied to the hand-made group of
# section 1, which one returns the non-negative weight vector closest to $\bar{\mathbf s}$ that
# satisfies eq. (73)? Return its name; the check measures all four.


# %%
def my_closest_nonnegative_transform() -> str:
    """Name of the transform (a key of TRANSFORMS). Replace this with your own answer."""
    return "orth_proj_pos"


# %%
feasible = {n: w for n, w in results.items() if bool((w >= 0).all()) and abs(float(adv @ w)) < 1e-9}
closest = min(feasible, key=lambda n: float((feasible[n] - s_bar).norm()))
assert my_closest_nonnegative_transform() == closest, closest
assert torch.allclose(results[closest], orth_proj_pos(s_bar, adv, group)) and not bool(
    (orth_proj(s_bar, adv, group) >= 0).all()
)
print("✓ correct")

# %% [markdown]
# **Exercise 5.2 — the shrink factors.** Under the stop-gradient, DFPO's coefficient of every token
# of completion $i$ is GSPO's multiplied by $\varphi_i = \tilde s_i/\bar s_i$ (eq. 59–62). Write
# `my_shrink_factors(logp, old_logp, adv, transform)` that returns the $(G,)$ factors for a given
# transform from the sequence weights alone (no coefficients). The check divides DFPO's actual
# coefficients by GSPO's, for truncate-and-rebalance.


# %%
def my_shrink_factors(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, transform
) -> torch.Tensor:
    """(G,) s̃_i / s̄_i for one group, ε = 0.2. Replace this body with your own code."""
    s_bar = sign_aware_clip(sequence_log_ratio(logp, old_logp, mask).exp(), adv, 0.2, 0.2)
    return transform(s_bar, adv, group) / s_bar


# %%
coef_tr = token_coefficients(
    "dfpo", logp, old_logp, adv_t, mask, group, transform="truncate_rebalance", **clip02
)
expected = coef_tr[:, 0] / coef_gspo[:, 0]
assert torch.allclose(my_shrink_factors(logp, old_logp, adv_t, truncate_rebalance), expected, atol=1e-10)
print("✓ correct")
