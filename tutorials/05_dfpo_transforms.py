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
# the objective, shows why the paper's stop-gradient estimator is what carries eq. (73) to the
# gradient (also when the clip binds), and finally trains the toy to separate what the *estimator*
# does from what the *transform* does, with the paper's own control (eq. 86) and Table 3's ablation.

# %%
import statistics

import plotly.graph_objects as go
import plotly.io as pio
import torch
from exercise_check import check, ensure, expect_close  # the exercises' check cells (next to this file)

from cancellation import group_advantages
from cancellation.diagnostics import shared_residual, steps_to_threshold, token_coefficients
from cancellation.objectives import sequence_log_ratio, sign_aware_clip
from cancellation.transforms import TRANSFORMS, min_replace, orth_proj, orth_proj_pos, truncate_rebalance
from cancellation.update import RESIDUAL_KEYS
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
    "DFPO min_replace, ppo_clip": ("dfpo", {"transform": "min_replace", "estimator": "ppo_clip"}),
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
# like GRPO. With larger ratios (bottom block) two completions' clips bind (those with $\hat A < 0$ and
# $s = 0.765$ and $0.61$, below $1 - \varepsilon = 0.8$), and still every DFPO transform cancels. Only
# the last row, DFPO's *trust-region* variant (`estimator="ppo_clip"`, not in the paper), leaves a
# residual there: it gives a clipped completion no gradient, so eq. (73)'s balance no longer reaches
# the shared tokens. Which of the two DFPO differentiates is the subject of the next section.
#
# ## 4. Why the stop-gradient matters: the paper's estimator (App. C/D, eq. 16, 59–62, 68, 86, 91)
#
# DFPO treats the transformed weights as **constants**: $\tilde s_i = T(\bar{\mathbf s})_i$ is a number,
# and the gradient the paper writes is the score-function estimator
#
# $$\nabla_\theta J = \frac1G\sum_{i=1}^G \tilde s_i\,\hat A_i\,\nabla_\theta \log s_i(\theta)
#   \qquad\text{(eq. 68, 91)},$$
#
# i.e. *every* completion, clipped or not, moves along the direction of its **unclipped** sequence
# ratio, scaled by $\tilde s_i$: with GSPO's $s_i = \exp(\frac{1}{|y_i|}\sum_t \log r_{i,t})$ each of its
# tokens gets the coefficient $\tilde s_i\hat A_i/(G\,|y_i|)$. In code that is
# $\hat A_i\cdot\operatorname{sg}(\tilde s_i/s_i)\cdot s_i(\theta)$ (value $\hat A_i\tilde s_i$), `dfpo`'s default
# `estimator="paper"`. A token that every completion of an equal-length group shares then gets
# $\frac{1}{G\,T}\sum_i\hat A_i\tilde s_i = 0$ **whatever the clip does**. The clip only bounds the
# weight's value; it never silences a completion (no PPO-style trust region beyond that, like CISPO).
#
# Two other ways to differentiate the same objective value:
#
# * `estimator="ppo_clip"` writes $\operatorname{sg}(\tilde s_i/\bar s_i)\,\bar s_i(\theta)$: a completion
#   whose $\bar s_i$ is clipped (a constant) gets **no** gradient, as in PPO/GSPO. A trust region, but
#   not what the paper writes, and the group constraint no longer holds on the gradient.
# * GSPO under the paper's estimator (eq. 86, `gspo` with `estimator="paper"`): every completion gets
#   $\bar s_i\hat A_i\nabla\log s_i$, **no transform**. This is the control: it keeps the gradients
#   that GSPO's clip silences, exactly as DFPO does, but not the balance $\sum_i\hat A_i\bar s_i = 0$.
#
# A hand-built group makes the difference visible: $G = 4$ completions of $T = 3$ tokens, three
# correct; token 0 is the same event in all four (same context, same token, so the same log-ratio),
# and the other tokens move the sequence ratios so that two clips bind at $\varepsilon = 0.2$.

# %%
G, T = 4, 3
adv_h = group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=f64), torch.zeros(G, dtype=torch.long))
group_h = torch.zeros(G, dtype=torch.long)
log_r = torch.tensor(  # column 0: the shared token, same log-ratio in every completion
    [[0.1, 0.6, 0.5], [0.1, 0.0, -0.1], [0.1, 0.1, -0.05], [0.1, -0.8, -0.3]], dtype=f64
)
old_h = torch.full((G, T), -1.0, dtype=f64)
logp_h = old_h + log_r
mask_h = torch.ones(G, T)
clip02 = {"epsilon_low": 0.2, "epsilon_high": 0.2}
s_h = sequence_log_ratio(logp_h, old_h, mask_h).exp()
s_bar_h = sign_aware_clip(s_h, adv_h, 0.2, 0.2)
clipped_h = s_bar_h != s_h
print("Â  =", adv_h)
print("s  =", s_h)
print("s̄  =", s_bar_h, "  clipped:", clipped_h.tolist())

variants_h = {
    "DFPO min_replace (paper)": ("dfpo", {"transform": "min_replace"}),
    "DFPO orth_proj (paper)": ("dfpo", {"transform": "orth_proj"}),
    "DFPO min_replace (ppo_clip)": ("dfpo", {"transform": "min_replace", "estimator": "ppo_clip"}),
    "DFPO orth_proj (ppo_clip)": ("dfpo", {"transform": "orth_proj", "estimator": "ppo_clip"}),
    "GSPO, eq. 86 control": ("gspo", {"estimator": "paper"}),
    "GSPO (its own ppo_clip)": ("gspo", {}),
}
print(f"\n{'shared token 0: coefficient per completion':44} {'':30} net Σ_i")
coef_h = {}
for name, (objective, params) in variants_h.items():
    coef_h[name] = token_coefficients(objective, logp_h, old_h, adv_h, mask_h, group_h, **clip02, **params)
    col = coef_h[name][:, 0]
    print(f"  {name:42} {[round(float(c), 4) + 0.0 for c in col]!s:32} {float(col.sum()):+.2e}")

# %% [markdown]
# Under the paper's estimator every completion, the two clipped ones included, gets exactly
# $\tilde s_i\hat A_i/(G\,T)$ on the shared token, so the net is $\frac{1}{GT}\sum_i\hat A_i\tilde s_i = 0$.
# The `ppo_clip` variant gives the clipped completions 0 and leaves the rest unbalanced. The eq. 86
# control keeps every completion too, but with $\bar s_i$: its net is $\frac{1}{GT}\sum_i \hat A_i\bar s_i$,
# not 0. Checked against the formula:

# %%
for name in ("min_replace", "orth_proj"):
    s_tilde_h = TRANSFORMS[name](s_bar_h, adv_h, group_h)
    expected = (s_tilde_h * adv_h / (G * T))[:, None].expand(G, T)
    assert torch.allclose(coef_h[f"DFPO {name} (paper)"], expected, atol=1e-15)
    ppo = torch.where(clipped_h, torch.zeros_like(s_tilde_h), s_tilde_h * adv_h / (G * T))
    assert torch.allclose(coef_h[f"DFPO {name} (ppo_clip)"][:, 0], ppo, atol=1e-15)
    print(
        f"{name:11} paper: Σ_i Â_i s̃_i = {float(adv_h @ s_tilde_h):+.1e};  ppo_clip net ×G·T = {float(ppo.sum()) * G * T:+.4f}"
    )
assert torch.allclose(coef_h["GSPO, eq. 86 control"][:, 0], s_bar_h * adv_h / (G * T), atol=1e-15)
print(f"eq. 86 control: Σ_i Â_i s̄_i = {float(adv_h @ s_bar_h):+.4f}")

# %% [markdown]
# So under the paper's estimator DFPO's coefficient of every token of completion $i$ is the eq. 86
# control's multiplied by $\varphi_i = \tilde s_i/\bar s_i$, clipped completions included (App. C's
# "proportional shrink, no reverse update"): the transform only rescales each completion's step. We
# can read that factor straight off the coefficients, on the template group of section 3 with the
# larger perturbation (two clipped completions):

# %%
theta = theta_old + 1.0 * torch.randn(theta_old.shape, generator=torch.Generator().manual_seed(2), dtype=f64)
logp = policy.token_logp(theta, idx)
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
# most sequences are clipped after the first), 4 seeds × 100 steps, plus GSPO and DFPO at ε = 0.2.
# Under plain SGD and the paper's estimator "scale by 0.5" is exactly the eq. 86 control at half the
# learning rate.

# %%
E02 = {"epsilon_low": 0.2, "epsilon_high": 0.2}
ablation = {
    "GSPO (baseline)": ("gspo", {}),
    "eq. 86 control": ("gspo", {"estimator": "paper"}),
    "DFPO (Min-Replace)": ("dfpo", {"transform": "min_replace"}),
    "DFPO ppo_clip": ("dfpo", {"transform": "min_replace", "estimator": "ppo_clip"}),
    "DFPO (no stop-grad)": ("dfpo", {"transform": "min_replace", "stop_grad": False}),
    "DFPO (scale by 0.5)": ("gspo", {"estimator": "paper", "lr": 0.25}),  # = 0.5·s̄ under SGD at lr 0.5
    "GSPO ε=0.2": ("gspo", E02),
    "DFPO (Min-Replace) ε=0.2": ("dfpo", {"transform": "min_replace", **E02}),
}
SEEDS, STEPS = range(4), 100


def first_hit(rows):
    """(step, template KL) where E[R] first reaches 0.9; (nan, nan) if it never does."""
    hit = steps_to_threshold([r["expected_reward"] for r in rows], 0.9, [r["step"] for r in rows])
    return (float("nan"), float("nan")) if hit is None else (hit, rows[int(hit) - 1]["template_kl"])


def mean_of(xs):
    xs = [x for x in xs if x == x]  # drop NaN
    return statistics.mean(xs) if xs else float("nan")


runs = {
    name: [simulate(sc, obj, steps=STEPS, seed=seed, **params) for seed in SEEDS]
    for name, (obj, params) in ablation.items()
}
print(
    f"{'variant':25} {'E[R] final':>7} {'steps→0.9':>9} {'KL at 0.9':>9} {'KL final':>8} {'group-shared':>12} {'seq-net':>8}"
)
for name, rows_by_seed in runs.items():
    hits = [first_hit(rows) for rows in rows_by_seed]
    res = {k: mean_of([mean_of([r[k] for r in rows]) for rows in rows_by_seed]) for k in RESIDUAL_KEYS}
    print(
        f"{name:25} {mean_of([rows[-1]['expected_reward'] for rows in rows_by_seed]):7.3f} "
        f"{mean_of([h[0] for h in hits]):9.1f} {mean_of([h[1] for h in hits]):9.3f} "
        f"{mean_of([rows[-1]['template_kl'] for rows in rows_by_seed]):8.3f} "
        f"{res['group_shared_residual']:12.4f} {res['sequence_net_residual']:8.4f}"
    )

fig = go.Figure(
    [
        go.Scatter(
            x=list(range(1, STEPS + 1)),
            y=[mean_of([rows[t]["expected_reward"] for rows in rs]) for t in range(STEPS)],
            name=name,
        )
        for name, rs in runs.items()
    ]
)
fig.update_layout(
    title="template_task: exact E[R], mean of 4 seeds", xaxis_title="step", yaxis_title="E[R]", height=380
)
fig.show()

# %% [markdown]
# The same seeds in every run, so the effects can be read as paired differences (mean ± standard
# error over the 4 seeds): the estimator's effect is control − GSPO, the transform's DFPO − control.


# %%
def paired(a: str, b: str, i: int) -> str:
    d = [x[i] - y[i] for x, y in zip(map(first_hit, runs[a]), map(first_hit, runs[b]), strict=True)]
    return f"{statistics.mean(d):+7.3f} ± {statistics.stdev(d) / len(d) ** 0.5:.3f}"


for what, a, b in (
    ("estimator (eq. 86 control − GSPO)", "eq. 86 control", "GSPO (baseline)"),
    ("transform (DFPO − eq. 86 control)", "DFPO (Min-Replace)", "eq. 86 control"),
    ("transform at ε=0.2 (DFPO − GSPO)", "DFPO (Min-Replace) ε=0.2", "GSPO ε=0.2"),
):
    print(f"{what:36} steps→0.9 {paired(a, b, 0)}   template KL at 0.9 {paired(a, b, 1)}")

# %% [markdown]
# What this shows on the toy, and what it does not:
#
# * **The estimator does almost everything that separates DFPO from GSPO at GSPO's ε.** GSPO silences
#   most sequences after the first inner step and needs about four times as many steps to reach
#   E[R] ≥ 0.9. The eq. 86 control, which has no transform, is as fast as DFPO and pays the same
#   larger template KL for it, within the seeds' noise (it moves the policy more per batch); DFPO's
#   ppo_clip variant behaves like GSPO. So DFPO's speed, and its *larger* learning tax here, are the
#   estimator's doing.
# * **The transform's own effect is the last bit of cancellation.** The control's group-shared
#   residual is already small (its $\bar s_i$ stay close to each other at this ε) and DFPO takes it
#   to 0; the paired differences in steps and template KL are within about one standard error. At
#   ε = 0.2 nothing clips on this toy (GSPO is the control there, seed for seed) and the transform
#   removes GSPO's group-shared residual, again without a measurable change in speed or learning tax.
#   (`python -m toymodel template_task --compare` over 10 seeds and the Training lab's first screen
#   say the same.)
# * **No stop-grad does not learn at all**: E[R] stays at its initial 0.3 and the template KL at 0; its
#   coefficients are $\sum_i\hat A_i$ times something, 0 up to rounding. In the paper's LM runs it
#   degrades rather than stops, presumably because completions differ in length; on this equal-length
#   toy nothing survives.
# * **Scale by 0.5 is slower, not better**: half the control's step reaches the threshold later.
#
# The toy confirms the mechanism (DFPO's shared tokens cancel exactly, under any clip) and shows that,
# here, a downstream gain over GSPO comes from the estimator; whether the transform adds one at
# language-model scale is the public review's open question.
#
# ## Exercises
#
# Write the body of each `my_*` function (until you do, it raises `NotImplementedError`), run its
# cell, then run the check cell below it: it prints ✓ or says what is missing or wrong. A worked
# solution is in `tutorials/solutions/05_dfpo_transforms.py`; try first.
#
# **Exercise 5.1 — pick the transform.** Among the four transforms applied to the hand-made group of
# section 1, which one returns the non-negative weight vector closest to $\bar{\mathbf s}$ that
# satisfies eq. (73)? Return its name; the check measures all four.


# %%
def my_closest_nonnegative_transform() -> str:
    """Name of the transform (a key of TRANSFORMS)."""
    raise NotImplementedError("Exercise 5.1: replace this line with your answer")


# %%
feasible = {n: w for n, w in results.items() if bool((w >= 0).all()) and abs(float(adv @ w)) < 1e-9}
closest = min(feasible, key=lambda n: float((feasible[n] - s_bar).norm()))
# the exact QP is the closest; Orth-Proj alone can leave negative weights
assert torch.allclose(results[closest], orth_proj_pos(s_bar, adv, group))
assert not bool((orth_proj(s_bar, adv, group) >= 0).all())
with check("5.1"):
    name = my_closest_nonnegative_transform()
    ensure(name in results, f"{name!r} is not one of the four transforms {sorted(results)}")
    w = results[name]
    ensure(bool((w >= 0).all()), f"{name!r} returns a negative weight: {[round(x, 4) for x in w.tolist()]}")
    ensure(abs(float(adv @ w)) < 1e-9, f"{name!r} does not satisfy eq. (73): Σ Â s = {float(adv @ w):.3g}")
    ensure(
        name == closest,
        f"{name!r} is non-negative and satisfies eq. (73), but lies at distance "
        f"{float((w - s_bar).norm()):.4f} from s̄; another transform comes closer "
        f"({float((feasible[closest] - s_bar).norm()):.4f})",
    )

# %% [markdown]
# **Exercise 5.2 — the shrink factors.** Under the paper's estimator, DFPO's coefficient of every token
# of completion $i$ is the eq. 86 control's multiplied by $\varphi_i = \tilde s_i/\bar s_i$ (eq. 59–62,
# 86), clipped completions included. Write `my_shrink_factors(logp, old_logp, adv, transform)` that
# returns the $(G,)$ factors for a given transform from the sequence weights alone (no coefficients).
# The check divides DFPO's actual coefficients by the control's, for truncate-and-rebalance.


# %%
def my_shrink_factors(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, transform
) -> torch.Tensor:
    """(G,) s̃_i / s̄_i for one group, ε = 0.2."""
    raise NotImplementedError("Exercise 5.2: replace this line with your code")


# %%
with check("5.2"):
    got = my_shrink_factors(logp, old_logp, adv_t, truncate_rebalance)
    coef_tr = token_coefficients(
        "dfpo", logp, old_logp, adv_t, mask, group, transform="truncate_rebalance", **clip02
    )
    expected = coef_tr[:, 0] / coef_eq86[:, 0]
    expect_close(got, expected, "the shrink factors φ_i", atol=1e-10)
