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

import plotly.io as pio
import torch
from exercise_check import check, ensure, expect_cases, expect_close, expect_equal, forbid, number  # checks
from show import report_rows, table  # tables, and quotes of experiments/REPORT.md

from cancellation import group_advantages
from cancellation.batching import reward_balanced_select, split_minibatches
from cancellation.diagnostics import shared_residual, steps_to_threshold, token_coefficients
from experiments.stats import paired_difference
from plots import curve_figure  # the app's mean ± 1 std seed curves, one colour per arm (ARM_COLORS)
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
rows = []
for mode in ("random", "query"):
    parts = split_minibatches(group, 4, mode=mode, generator=torch.Generator().manual_seed(1))
    rows.append({"mode": mode, "groups in each mini-batch": [group[p].tolist() for p in parts],
                 "first-epoch whole-group residual": first_epoch_residual(parts)})  # fmt: skip
table(rows)

# %% [markdown]
# A random split leaves most of the whole-group mass uncancelled. The reason is the paper's **local
# imbalance** (eq. 14): inside one mini-batch only part of a group is present, and its advantages no
# longer sum to zero, so the shared tokens of that part get a net push with the sign of the partial
# sum. Later mini-batches do not undo it exactly either: the optimiser has already moved, so their
# ratios and score directions differ (the paper's "optimization drift").

# %%
parts = split_minibatches(group, 4, mode="random", generator=torch.Generator().manual_seed(1))
table(
    [
        {"mini-batch": k, "local Σ Â per group": {int(g): round(float(adv[mb][group[mb] == g].sum()), 3)
                                                  for g in group[mb].unique()}}
        for k, mb in enumerate(parts)
    ]
)  # fmt: skip

# %% [markdown]
# ## 3. In training
#
# `simulate` runs the same comparison over whole runs (4 groups of 4 per step, 4 mini-batches, 4
# inner epochs, GRPO, 40 steps), 10 seeds per arm, and measures the residuals on the updates it
# actually applies.

# %%
SEEDS, STEPS = range(10), 40
runs = {
    f"{'query-preserved' if mode == 'query' else mode} mini-batches": [
        simulate(
            sc, "grpo", steps=STEPS, seed=seed, num_groups=4, group_size=4, num_minibatches=4, batching=mode
        )
        for seed in SEEDS
    ]
    for mode in ("random", "query")
}


# %%
def mean_std(per_seed: list[float]) -> str:
    """'mean ± sample std' over the seeds."""
    return f"{statistics.mean(per_seed):.3g} ± {statistics.stdev(per_seed):.3g}"


def run_mean(rows: list[dict], key: str) -> float:
    """One run's mean of ``key`` over the steps that have it (a step without a gradient has NaN)."""
    return statistics.fmean(r[key] for r in rows if r[key] == r[key])


table(
    [
        {"arm": arm, "group-shared res.": mean_std([run_mean(rows, "group_shared_residual") for rows in rs]),
         "shared res.": mean_std([run_mean(rows, "shared_residual") for rows in rs]),
         "E[R] final": mean_std([rows[-1]["expected_reward"] for rows in rs]),
         "template KL final": mean_std([rows[-1]["template_kl"] for rows in rs])}
        for arm, rs in runs.items()
    ]
)  # fmt: skip
print("(mean ± std over the 10 seeds; a residual is first averaged over each run's steps)")

# %% [markdown]
# The residual difference is large: query-preserved mini-batches keep whole-group events at almost
# 0, random ones leave most of their mass. (The small remainder under query-preserved batching is
# clipping: other groups move the shared contexts until a ratio leaves the clip range, tutorial 4.
# The `shared res.` column includes events shared by only part of a group, which no batching
# cancels: that part is credit assignment.) The
# curves, mean ± 1 std over the 10 seeds (`plots.curve_figure`, the app's own, which draws each arm
# in its colour of `plots.ARM_COLORS`):

# %%
curve_figure(runs, "group_shared_residual", title="Group-shared residual, mean ± 1 std over 10 seeds",
             height=360).show()  # fmt: skip
curve_figure(runs, "template_kl", title="Template KL (learning tax), mean ± 1 std over 10 seeds",
             height=360).show()  # fmt: skip

# %% [markdown]
# The template KL curves' means differ, but their bands overlap widely: the seed-to-seed spread is as
# large as the gap. The paired difference (same seed in both arms) says how much of the gap is real:

# %%
kl = {arm: [rows[-1]["template_kl"] for rows in rs] for arm, rs in runs.items()}
d = paired_difference(kl["random mini-batches"], kl["query-preserved mini-batches"])
print(f"template KL at step {STEPS}, random − query-preserved, paired over 10 seeds: "
      f"{d.mean:+.3f}, 95% CI [{d.low:+.3f}, {d.high:+.3f}], seeds +/−: {d.n_pos}/{d.n_neg}")  # fmt: skip

# %% [markdown]
# Ten seeds cannot tell a cost from noise here. `experiments/` ran this comparison (32 completions per
# step, 2 mini-batches, 100 steps) on 256 fresh seeds; its report, quoted as written:

# %%
report_rows("toy_batching", "query-preserved")

# %% [markdown]
# The residual difference holds; a difference in speed or final reward was not found (the report's
# results table for this study also lists the template KL at E[R] ≥ 0.9 per arm, with overlapping
# CIs). The broken events are a minority of all shared events here, and on this toy the drift they
# cause largely averages out over steps.
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
table([{"group": g, "rewards": buffer_rewards[buffer_group == g].int().tolist()} for g in range(5)])
rows = []
for rho, k in ((0.25, 2), (0.25, 3), (0.4, 3)):
    sel = reward_balanced_select(buffer_adv, buffer_group, rho, k)
    rows.append(
        {
            "ρ": rho,
            "groups wanted": k,
            "selected": None if sel is None else sorted(set(buffer_group[sel].tolist())),
        }
    )
table(rows)

# %% [markdown]
# In training (`equivalent_solutions`, whose reward saturates quickly, 2 groups of 4 per step, 5
# seeds × 100 steps):

# %%
rb = {
    rho: [
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
    for rho in (None, 0.25)
}

# %%
rows = []
for rho, rs in rb.items():
    hits = [
        steps_to_threshold([r["expected_reward"] for r in rows_], 0.9, [r["step"] for r in rows_])
        for rows_ in rs
    ]
    rows.append({
        "ρ": "off" if rho is None else rho,
        "updates": statistics.mean(sum(r["updated"] for r in rows_) for rows_ in rs),
        "with signal": statistics.mean(sum(r["updated"] and r["zero_adv_group_frac"] < 1 for r in rows_) for rows_ in rs),
        "zero-Â groups per update": statistics.mean(r["zero_adv_group_frac"] for rows_ in rs for r in rows_ if r["updated"]),
        "steps→0.9": statistics.mean(hits),
        "equiv. entropy": statistics.mean(rows_[-1]["equiv_entropy"] for rows_ in rs),
    })  # fmt: skip
table(rows)
zero_frac = rows[0]["zero-Â groups per update"]

# %% [markdown]
# Reward-balanced batching turns a run of mostly empty updates (without it, the `zero-Â groups per
# update` column: most groups in an update had $\hat A \equiv 0$ once the reward saturated) into fewer
# updates that all carry signal, and reaches the threshold about as fast here. Honest caveat: with
# group-relative advantages **every group that carries signal already contains both signs**, so on
# whole-group events it adds no cancellation that GRPO did not already have. Its effect is on the
# composition of the batch (no all-zero groups diluting the token-mean, both signs for the
# *cross-group* coupling that the paper analyses at LM scale), which the tabular toy, with no
# parameters shared across prompts, cannot show. On `template_task` over 256 seeds the report
# finds it slower, not faster:

# %%
print(f"without reward-balanced batching, {zero_frac:.0%} of the groups in an update had Â ≡ 0")
report_rows("toy_batching", "reward-balanced")

# %% [markdown]
# ## Exercises
#
# Write the body of each `my_*` function (until you do, it raises `NotImplementedError`), run its
# cell, then run the check cell below it: it prints ✓ or says what is missing or wrong. Each check
# first compares with answers worked out by hand (in its comments), then runs your function on 20
# random batches (fresh every run; the seed is printed when one fails, `TUTORIAL_CHECK_SEED=<seed>`
# reruns them) against its own plain-loop count: Σ Â ≠ 0, Â = 0 rows, groups of two, ρ on the
# boundary. An answer that calls the library or reads the notebook's variables is refused. A worked
# solution is in `tutorials/solutions/06_batching.py`; try first.
#
# **Exercise 6.1 — break cancellation on purpose.** The paper verifies the failure mode by splitting
# the batch **by advantage sign**: all $\hat A > 0$ completions of the batch, whatever their group, in
# one mini-batch, the rest ($\hat A \le 0$) in another. Write `my_sign_split(adv, group)` returning
# those two index tensors, in that order (`group` is there because the usual splits follow it; this
# one does not). The check also measures the first-epoch whole-group residual of your split of
# section 1's batch with the library: with no opposite signs ever in one step, no shared event can
# cancel (residual 1).


# %%
# the check's hand-made batch: three groups of 4, the middle one all Â = 0, and its split worked out by hand
adv_ex = torch.tensor([0.87, -0.87, 0.87, -0.87, 0.0, 0.0, 0.0, 0.0, 1.5, -0.5, -0.5, -0.5], dtype=f64)
group_ex = torch.arange(3).repeat_interleave(4)
split_ex = [[0, 2, 8], [1, 3, 4, 5, 6, 7, 9, 10, 11]]


def compare_6_1(got, want, what: str, at: str) -> None:
    ensure(isinstance(got, (list, tuple)) and all(isinstance(p, torch.Tensor) for p in got),
           f"expected a list of index tensors {at}, got {type(got).__name__}", "wrong type")  # fmt: skip
    ensure(all(p.ndim == 1 for p in got), f"index tensors of shapes {[tuple(p.shape) for p in got]} {at}: expected "
           "1-D tensors of indices (torch.nonzero returns a (k, 1) tensor: flatten it)", "wrong shape")  # fmt: skip
    per_group = all(len(set(group_ex[p].tolist())) == 1 for p in got) if at.startswith("for") else False
    ensure(len(got) == 2, f"{len(got)} mini-batches: a split by sign has exactly 2, every Â > 0 completion of the "
           "batch in the first and the rest in the second"
           + (" (yours keep one group per mini-batch: the split by sign mixes the groups)" if per_group else "")
           + f", an empty one included ({at})")  # fmt: skip
    expect_equal(sorted(got[0].tolist()), want[0], "the first mini-batch (Â > 0)", at=at)
    expect_equal(sorted(got[1].tolist()), want[1], "the second mini-batch (Â ≤ 0, Â = 0 included)", at=at)


# %%
def case_6_1(gen: torch.Generator):
    """A random batch for the check: (Â, group) and what it holds; the kinds come in turn."""
    kind = gen.initial_seed() % 1000 % 5  # expect_cases seeds its case i with seed·1000 + i
    sizes = torch.randint(2, 6, (int(torch.randint(2, 5, (1,), generator=gen)),), generator=gen)
    group = torch.repeat_interleave(torch.arange(len(sizes)), sizes)
    adv = torch.randn(len(group), generator=gen, dtype=f64)
    if kind == 0:  # Σ Â > 0 with some 0 < Â < mean: a split at the batch's mean is not a split at 0
        adv = adv.abs() * torch.where(torch.rand(len(adv), generator=gen) < 0.7, 1.0, -0.2).to(f64)
        adv[0], adv[-1] = 0.05, 3.0
        return (adv, group), f"Σ Â = {float(adv.sum()):.3g} ≠ 0, groups of sizes {sizes.tolist()}"
    if kind == 1:  # a whole group with Â = 0 (all-equal rewards) and another Â = 0 row
        adv[group == 0], adv[-1] = 0.0, 0.0
        return (
            adv,
            group,
        ), f"a group of all-equal rewards (Â = 0) and another Â = 0 row, sizes {sizes.tolist()}"
    if kind == 2:  # groups of exactly two rows, their rows interleaved
        group = (torch.arange(len(group)) // 2)[torch.randperm(len(group), generator=gen)]
        return (adv, group), "groups of exactly two rows, their rows interleaved"
    if kind == 3:
        return (-adv.abs(), group), "no Â > 0 completion (the first index tensor is empty)"
    return (adv, group.flip(0)), f"groups of sizes {sizes.tolist()}, listed from the last"


# %%
def my_sign_split(adv: torch.Tensor, group: torch.Tensor) -> list[torch.Tensor]:
    """[indices with Â > 0, indices with Â ≤ 0] of the whole batch."""
    raise NotImplementedError("Exercise 6.1: replace this line with your code")


# %%
with check("6.1"):
    forbid(my_sign_split, why="split by the sign of Â with tensor operations")
    compare_6_1(my_sign_split(adv_ex, group_ex), split_ex, "the split", f"for Â = {adv_ex.tolist()}")
    expect_close(
        first_epoch_residual(my_sign_split(adv, group)),
        1.0,
        "the first-epoch whole-group residual of your split",
    )

    def reference(adv, group):  # a plain loop over the batch
        pos = [i for i in range(len(adv)) if float(adv[i]) > 0]
        return [pos, [i for i in range(len(adv)) if i not in pos]]

    expect_cases(my_sign_split, reference, case_6_1, "the split", compare=compare_6_1)

# %% [markdown]
# **Exercise 6.2 — the balance condition.** Write `my_balance(adv, rho)` returning, for one update
# batch, the positive fraction $N_\text{pos}/|\mathcal B|$, the negative fraction
# $N_\text{neg}/|\mathcal B|$ and whether the paper's condition holds (both $\ge \rho$). A completion
# with $\hat A = 0$ is neither positive nor negative, but it is in the batch: it counts in
# $|\mathcal B|$.


# %%
ex62 = [  # the check's batches, by hand: (Â, ρ) -> (N_pos/|B|, N_neg/|B|, verdict)
    ([1.0, 1.0, -1.0, -1.0], 0.5, (0.5, 0.5, True)),
    ([0.0, 0.0, 0.5, -0.5], 0.3, (0.25, 0.25, False)),  # two Â = 0: 1 positive and 1 negative of 4
    ([0.0] * 4 + [0.87, -0.87, 0.87, -0.87], 0.25, (0.25, 0.25, True)),
    ([1.5, -0.5, -0.5, -0.5], 0.25, (0.25, 0.75, True)),
    ([1.5, -0.5, -0.5, -0.5], 0.3, (0.25, 0.75, False)),
    ([0.5, 0.5, 0.5, -1.5], 0.3, (0.75, 0.25, False)),  # N_pos/|B| ≥ ρ, N_neg/|B| < ρ
]


def compare_6_2(got, want, what: str, at: str) -> None:
    ensure(isinstance(got, (tuple, list)) and len(got) == 3,
           f"expected (pos. fraction, neg. fraction, verdict) {at}, got {got!r}", "wrong type")  # fmt: skip
    expect_close(number(got[0], "N_pos/|B|"), want[0], "N_pos/|B|", at=at)
    expect_close(number(got[1], "N_neg/|B|"), want[1], "N_neg/|B|", at=at)
    expect_equal(got[2], want[2], "the verdict", at=at)


# %%
def case_6_2(gen: torch.Generator):
    """A random batch for the check: (Â, ρ) and what it holds; the kinds come in turn."""
    kind = gen.initial_seed() % 1000 % 5
    b = [4, 8, 16][int(torch.randint(0, 3, (1,), generator=gen))]  # fractions k/b are exact in float32 too
    adv = torch.randn(b, generator=gen, dtype=f64)
    if kind == 0:
        adv[torch.randperm(b, generator=gen)[: b // 2]] = 0.0
        return (adv, 0.2), f"{b} rows, half of them Â = 0 (neither sign, but in |B|), ρ = 0.2"
    if kind == 1:  # ρ exactly the smaller fraction: ≥ holds
        rho = min(int((adv > 0).sum()), int((adv < 0).sum())) / b
        return (adv, rho), f"ρ = {rho}, exactly the smaller fraction (≥ holds), {b} rows"
    if kind in (2, 3):  # one row of one sign, the rest of the other: Σ Â ≠ 0
        adv = adv.abs() * (1 if kind == 2 else -1)
        adv[0] = -1.0 if kind == 2 else 1.0
        return (adv, 0.25), f"one Â {'<' if kind == 2 else '>'} 0 row of {b} (Σ Â ≠ 0), ρ = 0.25"
    rho = float(torch.rand(1, generator=gen)) * 0.5
    return (adv, rho), f"{b} random Â, ρ = {rho:.3g}"


# %%
def my_balance(adv: torch.Tensor, rho: float) -> tuple[float, float, bool]:
    """(N_pos / |B|, N_neg / |B|, both ≥ ρ) for one update batch (cancellation-hypothesis paper, Sec. 4)."""
    raise NotImplementedError("Exercise 6.2: replace this line with your code")


# %%
with check("6.2"):
    forbid(my_balance, why="count the signs with tensor operations")
    for a, rho, want in ex62:
        at = f"at Â = {a}, ρ = {rho}" + (" (Â = 0 is neither sign, but counts in |B|)" if 0.0 in a else "")
        at += (
            " (N_pos/|B| ≥ ρ but N_neg/|B| < ρ: the condition needs both)" if want[0] >= rho > want[1] else ""
        )
        compare_6_2(my_balance(torch.tensor(a, dtype=f64), rho), want, "the balance", at)

    def reference(adv, rho):  # a plain count
        n_pos, n_neg = sum(1 for a in adv.tolist() if a > 0), sum(1 for a in adv.tolist() if a < 0)
        return n_pos / len(adv), n_neg / len(adv), n_pos / len(adv) >= rho and n_neg / len(adv) >= rho

    expect_cases(my_balance, reference, case_6_2, "the balance", compare=compare_6_2)
