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
# # 6 · Batching: keep groups together, keep signs balanced
#
# Cancellation is a property of **one update**: the positive and negative completions of a group
# must meet in the same gradient for their shared tokens to cancel. Two common implementation
# details can prevent that even when the objective is perfectly exchangeable (GRPO inside its clip
# range). The cancellation-hypothesis paper ("The Cancellation Hypothesis in Critic-Free RL: From
# Outcome Rewards to Token Credits", arXiv 2605.08666; docs/papers.md lists the papers) names both
# and their fixes (Sec. 4):
#
# 1. **Random mini-batches** scatter a group over several optimiser steps → *query-preserved
#    mini-batching* keeps every completion of a prompt in one mini-batch.
# 2. **Sign-unbalanced batches** (reward sparse or saturated) lack the counterparts that cancel →
#    *reward-balanced batching* defers the update until both signs are represented.
#
# Everything is measured with the shared-token residual: the part of the coefficient mass on
# events shared by a whole group that survives in the updates (0 = exact cancellation).

# %%
import statistics

import plotly.graph_objects as go
import plotly.io as pio
import torch
from exercise_check import check, ensure, expect_close, expect_equal  # the exercises' check cells

from cancellation import group_advantages
from cancellation.batching import reward_balanced_select, split_minibatches
from cancellation.diagnostics import shared_residual, steps_to_threshold, token_coefficients
from toymodel import get_scenario, simulate

pio.renderers.default = "plotly_mimetype+notebook_connected"
torch.set_num_threads(1)  # the toy's tensors are tiny: one thread is fastest
torch.set_printoptions(precision=3, sci_mode=False)
f64 = torch.float64

# %% [markdown]
# ## 1. A batch of four groups
#
# `template_task`: five template positions (3 synonyms each, reward-irrelevant) and one deciding
# token. Its contexts are positions, shared by every completion, like an LM's weights. We sample 4
# prompts × 4 completions.

# %%
sc = get_scenario("template_task")
policy = sc.policy()
theta = sc.initial_logits()
G, N_GROUPS = 4, 4
idx = policy.sample(G * N_GROUPS, theta, generator=torch.Generator().manual_seed(0))
group = torch.arange(N_GROUPS).repeat_interleave(G)
adv = group_advantages(policy.rewards[idx], group)
mask = policy.mask[idx]
logp = policy.token_logp(theta, idx)
print("Â per group (rows):\n", adv.view(N_GROUPS, G))

# %% [markdown]
# Events are (group, position, token) triples; forced steps (one action, zero score) are left out.
# An event that all $G$ completions of its group contain is a **whole-group** event: there
# $\sum_i \hat A_i = 0$ and GRPO's coefficients cancel exactly (tutorial 1).

# %%
free = policy.valid.sum(-1)[policy.ctx[idx]] > 1
keys = torch.where(free, policy.event_keys[idx] + group[:, None] * policy.C * policy.K, -1)


def first_epoch_residual(parts: list[torch.Tensor]) -> float:
    """Whole-group residual of GRPO's first inner epoch, one optimiser step per mini-batch in `parts`.

    Each step's coefficients come from the mini-batch alone (θ = θ_old, as in the first epoch);
    their per-event sums are taken per step, since a later step cannot cancel an earlier one.
    """
    net = gross = 0.0
    for mb in parts:
        coef = torch.zeros_like(logp)
        coef[mb] = token_coefficients("grpo", logp[mb], logp[mb].detach(), adv[mb], mask[mb], group[mb])
        res = shared_residual(coef, keys, mask, min_count=G)  # events counted over the whole batch
        whole = res.count == G
        net += float(res.net[whole].abs().sum())
        gross += float(res.gross[whole].sum())
    return net / gross


print("one step on the whole batch:", first_epoch_residual([torch.arange(G * N_GROUPS)]))

# %% [markdown]
# ## 2. Random vs query-preserved mini-batches
#
# PPO-style training splits the batch into mini-batches and steps the optimiser after each one.
# `split_minibatches(group, k, mode="random")` is what most frameworks do; `mode="query"` keeps each
# group whole (cancellation-hypothesis paper Sec. 4).

# %%
for mode in ("random", "query"):
    parts = split_minibatches(group, 4, mode=mode, generator=torch.Generator().manual_seed(1))
    print(f"{mode:7} mini-batches hold groups {[group[p].tolist() for p in parts]}")
    print(f"        first-epoch whole-group residual: {first_epoch_residual(parts):.3f}")

# %% [markdown]
# A random split leaves most of the whole-group mass uncancelled. The reason is the paper's **local
# imbalance** (eq. 14): inside one mini-batch only part of a group is present, and its advantages no
# longer sum to zero, so the shared tokens of that part get a net push with the sign of the partial
# sum. Later mini-batches do not undo it exactly either: the optimiser has already moved, so their
# ratios and score directions differ (the paper's "optimization drift").

# %%
parts = split_minibatches(group, 4, mode="random", generator=torch.Generator().manual_seed(1))
for k, mb in enumerate(parts):
    sums = {int(g): round(float(adv[mb][group[mb] == g].sum()), 3) for g in group[mb].unique()}
    print(f"mini-batch {k}: local Σ Â per group {sums}")

# %% [markdown]
# ## 3. In training
#
# `simulate` runs the same comparison over whole runs (4 groups per step, 4 mini-batches, 4 inner
# epochs, GRPO), and measures `group_shared_residual` on the updates it actually applies.

# %%
SEEDS = range(6)
runs = {}
for mode in ("random", "query"):
    runs[mode] = [
        simulate(
            sc, "grpo", steps=60, seed=seed, num_groups=4, group_size=4, num_minibatches=4, batching=mode
        )
        for seed in SEEDS
    ]
print(f"{'batching':9} {'group-shared res.':>18} {'shared res.':>12} {'E[R] final':>11} {'template KL':>15}")
for mode, rows_by_seed in runs.items():
    # NaN (no whole-group event with a gradient in that step) is dropped by the >= 0 test
    gsr = statistics.mean(
        r["group_shared_residual"] for rows in rows_by_seed for r in rows if r["group_shared_residual"] >= 0
    )
    sr = statistics.mean(
        r["shared_residual"] for rows in rows_by_seed for r in rows if r["shared_residual"] >= 0
    )
    reward = statistics.mean(rows[-1]["expected_reward"] for rows in rows_by_seed)
    kl = [rows[-1]["template_kl"] for rows in rows_by_seed]
    kl_text = f"{statistics.mean(kl):.3f} ± {statistics.stdev(kl):.3f}"
    print(f"{mode:9} {gsr:18.3f} {sr:12.3f} {reward:11.3f} {kl_text:>15}")

fig = go.Figure()
for mode, rows_by_seed in runs.items():
    fig.add_scatter(
        x=list(range(1, 61)),
        y=[statistics.mean(rows[t]["template_kl"] for rows in rows_by_seed) for t in range(60)],
        name=f"{mode} mini-batches",
    )
fig.update_layout(
    title="Template KL (learning tax), mean of 6 seeds", xaxis_title="step", yaxis_title="KL", height=350
)
fig.show()

# %% [markdown]
# The residual difference is large: query-preserved mini-batches keep whole-group events at (almost)
# 0, random ones leave most of their mass. (The small remainder under query-preserved batching is
# clipping: other groups move the shared contexts until a ratio leaves the clip range, tutorial 4.)
# What the toy does **not** show is a clear downstream cost: the template KL (the exact learning
# tax) differs by less than its seed-to-seed spread (the ± column; over 10 seeds we measured
# 0.19 ± 0.16 random vs 0.18 ± 0.10 query-preserved), and the reward ends at the same value. The
# broken events are a minority of all shared events here, and on this toy the drift they cause
# largely averages out over steps. (The `shared residual` column includes events shared by only part
# of a group, which no batching cancels: that part is credit assignment.)
#
# ## 4. Reward-balanced batching
#
# When a prompt is too easy or too hard, every completion gets the same reward, $\hat A = 0$, and the
# group carries no signal. A batch of mostly such groups has few positive/negative counterparts.
# The cancellation-hypothesis paper's remedy: keep rollouts in a buffer and update only on a selection
# $\mathcal B$ of whole groups with
#
# $$\frac{N_\text{pos}(\mathcal B)}{|\mathcal B|} \ge \rho
#   \quad\text{and}\quad \frac{N_\text{neg}(\mathcal B)}{|\mathcal B|} \ge \rho.$$
#
# `reward_balanced_select(advantages, group, rho, num_groups)` picks whole groups greedily (oldest
# first on ties) or returns None (keep accumulating):

# %%
buffer_rewards = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 1, 1, 1, 1, 1, 1, 0, 1, 0, 0], dtype=f64)
buffer_group = torch.tensor([0] * 4 + [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4)
buffer_adv = group_advantages(buffer_rewards, buffer_group)
for g in range(5):
    print(f"group {g}: rewards {buffer_rewards[buffer_group == g].int().tolist()}")
for rho, k in ((0.25, 2), (0.25, 3), (0.4, 3)):
    sel = reward_balanced_select(buffer_adv, buffer_group, rho, k)
    chosen = None if sel is None else sorted(set(buffer_group[sel].tolist()))
    print(f"ρ = {rho}, {k} groups -> {chosen}")

# %% [markdown]
# In training (`equivalent_solutions`, whose reward saturates quickly, 2 groups of 4 per step):

# %%
print(f"{'ρ':>5} {'updates':>8} {'with signal':>12} {'zero-Â groups':>14} {'steps→0.9':>10} {'equiv. H':>9}")
for rho in (None, 0.25):
    rb = [
        simulate(
            "equivalent_solutions",
            "grpo",
            steps=100,
            seed=s,
            num_groups=2,
            group_size=4,
            reward_balanced_rho=rho,
        )
        for s in range(5)
    ]
    updates = statistics.mean(sum(r["updated"] for r in rows) for rows in rb)
    signal = statistics.mean(
        sum(1 for r in rows if r["updated"] and r["zero_adv_group_frac"] < 1) for rows in rb
    )
    zero_frac = statistics.mean(r["zero_adv_group_frac"] for rows in rb for r in rows if r["updated"])
    hits = [
        steps_to_threshold([r["expected_reward"] for r in rows], 0.9, [r["step"] for r in rows])
        for rows in rb
    ]
    entropy = statistics.mean(rows[-1]["equiv_entropy"] for rows in rb)
    steps = statistics.mean(hits)
    print(f"{rho!s:>5} {updates:8.1f} {signal:12.1f} {zero_frac:14.2f} {steps:10.1f} {entropy:9.3f}")

# %% [markdown]
# Reward-balanced batching turns a run of mostly empty updates (88 % of the groups in an update had
# $\hat A \equiv 0$ once the reward saturated) into fewer updates that all carry signal, and reaches the
# threshold about as fast. Honest caveat: with group-relative advantages **every group that carries
# signal already contains both signs**, so on whole-group events it adds no cancellation that GRPO did
# not already have. Its effect is on the composition of the batch (no all-zero groups diluting the
# token-mean, both signs for the *cross-group* coupling that the paper analyses at LM scale), which the
# tabular toy, with no parameters shared across prompts, cannot show.
#
# ## Exercises
#
# Write the body of each `my_*` function (until you do, it raises `NotImplementedError`), run its
# cell, then run the check cell below it: it prints ✓ or says what is missing or wrong. A worked
# solution is in `tutorials/solutions/06_batching.py`; try first.
#
# **Exercise 6.1 — break cancellation on purpose.** The paper verifies the failure mode by splitting each
# batch **by advantage sign**: all $\hat A > 0$ completions in one mini-batch, the rest in another.
# Write `my_sign_split(adv)` returning those two index tensors. The check measures the first-epoch
# whole-group residual of your split with the library: with no opposite signs ever in one step, no
# shared event can cancel (residual 1).


# %%
def my_sign_split(adv: torch.Tensor) -> list[torch.Tensor]:
    """[indices with Â > 0, indices with Â ≤ 0]."""
    raise NotImplementedError("Exercise 6.1: replace this line with your code")


# %%
with check("6.1"):
    parts = my_sign_split(adv)
    ensure(
        isinstance(parts, (list, tuple)) and all(isinstance(p, torch.Tensor) for p in parts),
        f"expected a list of index tensors, got {type(parts).__name__}",
        kind="wrong type",
    )
    ensure(
        torch.equal(torch.cat(parts).long().sort().values, torch.arange(len(adv))),
        "your parts are not a partition of the batch (every index 0 … N−1 exactly once)",
    )
    expect_close(first_epoch_residual(parts), 1.0, "the first-epoch whole-group residual of your split")

# %% [markdown]
# **Exercise 6.2 — the balance condition.** Write `my_is_balanced(adv, rho)` that says whether one
# update batch satisfies the paper's condition: the fraction of positive advantages and the fraction of
# negative advantages are both at least ρ, counting every completion (zero-advantage ones included)
# in the denominator. The check asks the library's selector for the same verdict: treating the whole
# batch as one group, `reward_balanced_select` can only select all of it or nothing.


# %%
def my_is_balanced(adv: torch.Tensor, rho: float) -> bool:
    """The cancellation-hypothesis paper's condition (Sec. 4) on one update batch."""
    raise NotImplementedError("Exercise 6.2: replace this line with your code")


# %%
with check("6.2"):
    batches = [adv, buffer_adv, buffer_adv[:12], buffer_adv[4:12], buffer_adv[:4]]
    for rho in (0.1, 0.2, 0.25, 0.3, 0.4, 0.45, 0.5):
        for batch in batches:
            library = (
                reward_balanced_select(batch, torch.zeros(len(batch), dtype=torch.long), rho, 1) is not None
            )
            expect_equal(
                my_is_balanced(batch, rho),
                library,
                "the verdict",
                at=f"at ρ = {rho} for Â = {[round(a, 3) for a in batch.tolist()]}",
            )
