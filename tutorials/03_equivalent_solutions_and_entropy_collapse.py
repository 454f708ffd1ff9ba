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
# # 3 · Equivalent solutions and entropy collapse (DFPO App. A.3)
#
# Two answers can be equally correct and still be learned at different speeds. The DFPO paper's
# second failure mode is **probability drift between equivalent correct solutions**: when a
# sequence-level objective weights them by different $s_i$, their log-odds move even though their
# advantages are equal, and over many steps one surface form can take all the mass (entropy
# collapse on the equivalent set, Cor. 3.2). This tutorial does eq. (41) first, on one exact step,
# then runs the toy for many steps and is explicit about what the toy does and does not show.

# %%
import statistics

import plotly.io as pio
import torch
from exercise_check import check, expect_close  # the exercises' check cells (next to this file)
from plotly.subplots import make_subplots

from cancellation import compute_loss, group_advantages
from cancellation.objectives import sequence_log_ratio
from toymodel import simulate
from toymodel.scenarios import EQUIVALENT_SOLUTIONS

pio.renderers.default = "plotly_mimetype+notebook_connected"
torch.set_num_threads(1)  # the toy's tensors are tiny: one thread is fastest
torch.set_printoptions(precision=4, sci_mode=False)
f64 = torch.float64
NO_CLIP = {"epsilon_low": 0.999999, "epsilon_high": 1e9}  # the paper's linear-region analysis

# %% [markdown]
# ## 1. The toy: "What is 10+10?" (eq. 25–30)
#
# $$\tau_1 = \text{"The answer is 25 ."}\ (R=0),\quad \tau_2 = \text{"The answer is 20 ."}\ (R=1),\quad
# \tau_3 = \text{"10 + 10 = 20 ."}\ (R=1).$$
#
# $\tau_2$ and $\tau_3$ form the **equivalent set**: same reward, different length (5 vs 6 tokens)
# and different local likelihood. The tabular policy has two real choices: the first token
# (The / 10) and the answer after "The answer is" (25 / 20). It starts uniform.

# %%
sc = EQUIVALENT_SOLUTIONS
policy = sc.policy()
theta_old = sc.initial_logits()
probs = policy.probs(theta_old)
for i in range(policy.N):
    reward = float(policy.rewards[i])
    print(f"τ{i + 1} = {policy.text(i)!r:24} R = {reward:.0f}   π(τ) = {float(probs[i]):.2f}")
print("\nequivalent set:", [policy.text(int(i)) for i in policy.equivalent])
print("log-odds log π(τ2)/π(τ3):", policy.equiv_log_odds(theta_old))
print("equivalent-set entropy:   ", policy.equiv_entropy(theta_old), "(max log 2 = 0.693)")

# %% [markdown]
# The group $\{\tau_1, \tau_2, \tau_3\}$ with the paper's unscaled advantages (eq. 29–30):

# %%
idx = torch.arange(3)
group = torch.zeros(3, dtype=torch.long)
adv = group_advantages(policy.rewards[idx], group, scale="none")
mask = policy.mask[idx]
old_logp = policy.token_logp(theta_old, idx)
print("Â =", adv, " (eq. 30: −2/3, 1/3, 1/3)")

# %% [markdown]
# ## 2. Different sequence weights for equal advantages (eq. 39)
#
# After some training $\theta \ne \theta_\text{old}$. Take $\pi_\theta(\text{The}) = 0.3$ and
# $\pi_\theta(\text{20} \mid \text{The answer is}) = 0.6$. GSPO's sequence weight is the
# length-normalised ratio (eq. 44)
#
# $$s_i(\theta) = \Big(\frac{\pi_\theta(\tau_i)}{\pi_{\theta_\text{old}}(\tau_i)}\Big)^{1/|\tau_i|}
#   = \exp\Big(\frac{1}{|\tau_i|}\sum_t \log r_{i,t}\Big).$$

# %%
theta = policy.logits_from_probs(
    {(): {"The": 0.3, "10": 0.7}, ("The", "answer", "is"): {"25": 0.4, "20": 0.6}}
)
logp = policy.token_logp(theta, idx)
s = sequence_log_ratio(logp, old_logp, mask).exp()
print("s (GSPO, eq. 44):", s)
print("Â·s:             ", adv * s, "  ← Â2·s2 ≠ Â3·s3 although Â2 = Â3 (eq. 39)")

# %% [markdown]
# ## 3. One step: the log-odds change (eq. 40–41)
#
# In the linear region each completion's log-probability moves by $\eta\,c\,\hat A_i s_i$ (eq. 40), so
#
# $$\log\frac{\pi_{\theta^+}(\tau_2)}{\pi_{\theta^+}(\tau_3)}
#   \approx \log\frac{\pi_\theta(\tau_2)}{\pi_\theta(\tau_3)}
#   + \eta\,c\,\big(\hat A_2 s_2 - \hat A_3 s_3\big) \qquad\text{(eq. 41)}.$$
#
# DFPO's Min-Replace gives every completion the same weight $\tilde s_i = \min_j \bar s_j$ (eq. 50),
# which removes the $s_2 \ne s_3$ term. We take one exact SGD step ($\eta = 0.01$, no clipping) with
# each objective through `compute_loss` and measure the change of the log-odds on the exact policy:


# %%
def log_odds_change(objective: str, eta: float = 0.01, **params) -> float:
    """Δ log π(τ2)/π(τ3) after one SGD step of size eta on the group {τ1, τ2, τ3} at θ."""
    z = theta.clone().requires_grad_(True)
    loss, _ = compute_loss(
        objective, policy.token_logp(z, idx), old_logp, adv, mask, group, **params, **NO_CLIP
    )
    (grad,) = torch.autograd.grad(loss, z)
    grad = torch.where(policy.valid, grad, torch.zeros_like(grad))
    return policy.equiv_log_odds(theta - eta * grad) - policy.equiv_log_odds(theta)


variants = {
    "GRPO": ("grpo", {}),
    "GSPO": ("gspo", {}),
    "DFPO Min-Replace": ("dfpo", {"transform": "min_replace"}),
    "DFPO Orth-Proj": ("dfpo", {"transform": "orth_proj"}),
}
delta = {name: log_odds_change(obj, **params) for name, (obj, params) in variants.items()}
for name, d in delta.items():
    print(f"{name:17} Δ log-odds = {d:+.3e}")
print(f"\ns-driven part (GSPO − DFPO Min-Replace) = {delta['GSPO'] - delta['DFPO Min-Replace']:+.3e}")

# %% [markdown]
# Read this carefully, because it is the honest version of eq. (41) on this toy:
#
# * **Every objective moves the log-odds by about $-1.1\times10^{-4}$**, GRPO included, which
#   cancels shared tokens exactly. The reason is credit assignment, not coupling: $\tau_2$ shares its
#   first token "The" with the wrong $\tau_1$, so pushing $\tau_1$ down pulls $\tau_2$ down with it.
#   That is the policy gradient doing its job (given these samples, "10" is the safer first token).
# * **The part eq. (41) is about** is the difference between GSPO and DFPO Min-Replace, which share
#   everything except the within-group spread of the weights: $+6.3\times10^{-6}$, about 5 % of
#   the step here. (Its sign is not simply that of $s_2 - s_3$: $\tau_1$'s weight enters through the
#   shared "The" as well, which is why eq. 40's constant $c$ is not one number on this toy.)
# * Orth-Proj changes the weights more than Min-Replace (it rebalances $\tau_1$ against the
#   positives), so its step differs more; cancelling the s-driven term does not make the update
#   smaller or neutral, it makes it *exchangeable*.
#
# ## 4. Many steps: does the equivalent set collapse?
#
# `simulate` trains the toy: each step samples a group of $G = 8$ from $\pi_{\theta_\text{old}}$,
# computes advantages and the loss with `cancellation`, takes 4 inner SGD steps against the frozen
# $\theta_\text{old}$ (so ratios leave 1 and coupling and clipping act), and records exact statistics.
# We compare six variants over 5 seeds. GSPO's own clip range is $\varepsilon = 3\cdot10^{-4} /
# 4\cdot10^{-4}$; the "ε=0.2" variants use GRPO's range instead. DFPO runs the paper's estimator
# (every completion, clipped or not, keeps $\tilde s_i\hat A_i$ on $\nabla\log s_i$; tutorial 5), and
# "GSPO eq. 86" is GSPO's weight $\bar s_i$ under that same estimator with no transform: the control
# that tells the estimator's effect from the transform's.

# %%
E02 = {"epsilon_low": 0.2, "epsilon_high": 0.2}
runs_spec = {
    "GRPO": ("grpo", {}),
    "GSPO": ("gspo", {}),
    "GSPO eq. 86": ("gspo", {"estimator": "paper"}),
    "DFPO Min-Replace": ("dfpo", {"transform": "min_replace"}),
    "GSPO ε=0.2": ("gspo", E02),
    "DFPO Min-Replace ε=0.2": ("dfpo", {"transform": "min_replace", **E02}),
}
SEEDS, STEPS = range(5), 100
runs = {
    name: [simulate(sc, obj, steps=STEPS, seed=seed, **params) for seed in SEEDS]
    for name, (obj, params) in runs_spec.items()
}


def mean_curve(rows_by_seed, key):
    return [statistics.mean(rows[t][key] for rows in rows_by_seed) for t in range(STEPS)]


fig = make_subplots(rows=1, cols=2, subplot_titles=("log π(τ2)/π(τ3)", "equivalent-set entropy"))
for name, rows_by_seed in runs.items():
    steps = [row["step"] for row in rows_by_seed[0]]
    for col, key in ((1, "equiv_log_odds"), (2, "equiv_entropy")):
        fig.add_scatter(
            x=steps,
            y=mean_curve(rows_by_seed, key),
            name=name,
            legendgroup=name,
            showlegend=col == 1,
            row=1,
            col=col,
        )
fig.update_layout(
    title="equivalent_solutions, mean over 5 seeds (G=8, 4 inner epochs, SGD lr 0.5)", height=420
)
fig.update_xaxes(title_text="step")
fig.show()

# %%
print(f"{'variant':24} {'final log-odds':>16} {'final entropy':>16} {'E[R]':>7} {'clip/frac':>10}")
for name, rows_by_seed in runs.items():
    lo = [rows[-1]["equiv_log_odds"] for rows in rows_by_seed]
    h = [rows[-1]["equiv_entropy"] for rows in rows_by_seed]
    reward = statistics.mean(rows[-1]["expected_reward"] for rows in rows_by_seed)
    # clip/frac at the last inner step, over the steps that had a learning signal
    clip = [row["clip/frac"] for rows in rows_by_seed for row in rows if row["zero_adv_group_frac"] < 1.0]
    print(
        f"{name:24} {statistics.mean(lo):+8.3f} ± {statistics.stdev(lo):.3f} "
        f"{statistics.mean(h):8.3f} ± {statistics.stdev(h):.3f} {reward:7.3f} {statistics.mean(clip):10.2f}"
    )

# %% [markdown]
# ## 5. What the toy shows, and what it does not
#
# * **At GSPO's own clip range, GSPO and DFPO differ, and the estimator is why.** With
#   $\varepsilon = 3\cdot10^{-4}$ nearly every sequence is clipped after the first inner step (the
#   `clip/frac` column). GSPO then gives a clipped sequence no gradient, so its later inner steps do
#   little: it learns more slowly and keeps more entropy (−1.20 log-odds, entropy 0.54). DFPO's paper
#   estimator keeps every sequence's gradient, clipped or not, and ends where GRPO does (−2.80, 0.22).
#   The eq. 86 control, the same estimator with no transform, ends at the same place (−2.82, 0.22):
#   the difference from GSPO is the estimator's, not the transform's.
# * **The collapse you see is mostly credit assignment.** GRPO, which cancels shared tokens exactly,
#   collapses the equivalent set the most: from entropy 0.64 to about 0.2 in 100 steps, always
#   towards "10 + 10 = 20 .", because "The" is shared with the wrong answer. The s-driven term of
#   eq. (41) is a few percent of a step (section 3) and drowns in that, and in the sampling noise,
#   over a run: with ε=0.2, GSPO and DFPO Min-Replace end within a standard deviation of each other,
#   and so do the eq. 86 control and DFPO at GSPO's ε. GSPO with its default ε keeps more entropy only
#   because it learns more slowly (most of its inner steps are clipped; see its lower E[R]), not
#   because it cancels better.
# * **What the toy does show exactly** is the mechanism: eq. (39)'s unequal weights and the one-step
#   s-driven part of eq. (41), which DFPO Min-Replace removes (section 3), and, on the shared-prefix
#   toy, eq. (38)'s non-cancelling coefficient (tutorial 2). Whether those per-step terms accumulate
#   into a measurable collapse depends on their sign being systematic, which at language-model
#   scale (many shared tokens, long completions, far larger length differences) is the paper's claim
#   and not something this three-trajectory toy can settle.
#
# ## Exercises
#
# Write the body of each `my_*` function (until you do, it raises `NotImplementedError`), run its
# cell, then run the check cell below it: it prints ✓ or says what is missing or wrong. A worked
# solution is in `tutorials/solutions/03_equivalent_solutions_and_entropy_collapse.py`; try first.
#
# **Exercise 3.1 — sequence weights from trajectory probabilities.** Eq. (44) has two forms of the
# same weight. Write `my_sequence_weights(theta)` that computes $s_i =
# (\pi_\theta(\tau_i)/\pi_{\theta_\text{old}}(\tau_i))^{1/|\tau_i|}$ for the three trajectories from
# whole-trajectory log-probabilities (`policy.traj_logp(logits)`, and `policy.lengths`). The check
# compares with the token-level form `exp(mean_t log r)` that the objectives use.


# %%
def my_sequence_weights(theta: torch.Tensor) -> torch.Tensor:
    """(3,) GSPO sequence weights at θ against θ_old, from whole-trajectory log-probabilities."""
    raise NotImplementedError("Exercise 3.1: replace this line with your code")


# %%
with check("3.1"):
    for probs in (
        {(): {"The": 0.3, "10": 0.7}},
        {(): {"The": 0.6, "10": 0.4}, ("The", "answer", "is"): {"25": 0.1, "20": 0.9}},
    ):
        th = policy.logits_from_probs(probs)
        expected = sequence_log_ratio(policy.token_logp(th, idx), old_logp, mask).exp()
        expect_close(my_sequence_weights(th), expected, "the sequence weights s_i", at=f"at π_θ = {probs}")

# %% [markdown]
# **Exercise 3.2 — the drift of one GSPO run.** Using `simulate`, return the change of the log-odds
# $\log\pi(\tau_2)/\pi(\tau_3)$ over a 60-step GSPO run with ε = 0.2 and seed 3 (final value minus
# the starting value $-\log 2$). The check compares with the exact log-odds of the run's final
# parameters, which it gets from `simulate`'s `callback` (it receives the logits after every step).


# %%
def my_log_odds_drift() -> float:
    """Final minus initial equiv_log_odds of the 60-step GSPO run (ε = 0.2, seed 3)."""
    raise NotImplementedError("Exercise 3.2: replace this line with your code")


# %%
with check("3.2"):
    got = my_log_odds_drift()
    final = {}
    simulate(
        sc,
        "gspo",
        steps=60,
        seed=3,
        epsilon_low=0.2,
        epsilon_high=0.2,
        callback=lambda step, z: final.update(z=z),
    )
    expected = policy.equiv_log_odds(final["z"]) - policy.equiv_log_odds(theta_old)
    expect_close(got, expected, "the change of log π(τ2)/π(τ3) over the run")
