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
# # 1 · Group-relative advantages and the score function
#
# GRPO-style training samples a **group** of $G$ completions for one prompt, scores each with one
# reward, and turns the rewards into advantages $\hat A_i$ by comparing each completion with its
# group. This tutorial follows one group from its rewards to the update of every token, on a policy
# small enough to print in full, and shows the property everything else in this series is about:
#
# > Because $\sum_i \hat A_i = 0$ inside a group, the gradient contributions of a token that every
# > completion of the group shares **cancel exactly** (DFPO eq. 2, 9).
#
# Equation numbers without a paper name are the DFPO paper's ("Design Conditions for Intra-Group
# Learning of Sequence-Level Rewards: Token Gradient Cancellation", arXiv 2604.13088); `docs/papers.md`
# lists it and the other papers the project implements.
#
# Every code cell calls the project's library: `cancellation` (the math, pure torch) and `toymodel`
# (a tabular softmax policy on which every probability is exact). Nothing is re-implemented here.

# %%
import math

import plotly.graph_objects as go
import plotly.io as pio
import torch
from exercise_check import check, ensure, expect_cases, expect_close, forbid, reject  # the exercises' checks
from show import fmt, table  # aligned tables of the numbers the cells compute

from cancellation import compute_loss, group_advantages
from cancellation.diagnostics import shared_residual, softmax_grad_norm, token_coefficients
from cancellation.glossary import METER_DOCS
from cancellation.update import CancellationMeter
from toymodel import get_scenario
from toymodel.glossary import ROW_DOCS

pio.renderers.default = "plotly_mimetype+notebook_connected"  # JupyterLab, VS Code and classic Jupyter
torch.set_num_threads(1)  # the toy's tensors are tiny: one thread is fastest
torch.set_printoptions(precision=4, sci_mode=False)
f64 = torch.float64

# %% [markdown]
# ## 1. From a group of rewards to $\hat A$
#
# GRPO's advantage (DFPO eq. 43) standardises each reward within its group:
#
# $$\hat A_i = \frac{r_i - \operatorname{mean}_j r_j}{\operatorname{std}_j r_j + \epsilon}
# \qquad\text{(1.1)}$$
#
# `group_advantages(rewards, group)` computes it for a flat batch in which `group[i]` is the prompt
# id of completion $i$ (the project's data layout, see the README). Here is one group of eight
# completions with a 0/1 reward:

# %%
rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0], dtype=f64)
group = torch.zeros(8, dtype=torch.long)
adv = group_advantages(rewards, group)
print("Â      =", adv)
print("Σ Â    =", fmt(adv.sum()))

# %% [markdown]
# Correct completions get $\hat A > 0$, wrong ones $\hat A < 0$, and the advantages **sum to zero**
# (a printed remainder of order 1e-16 is float rounding): that is what subtracting the group mean does, whatever the
# scaling. The toy problems of the
# paper's Appendix A use the unscaled version $\hat A_i = r_i - \operatorname{mean}_j r_j$ (eq. 29),
# `scale="none"`:

# %%
print("eq. 29 (no std):", group_advantages(rewards, group, scale="none"))

# %% [markdown]
# A batch usually holds many prompts. Each group is centred on its own mean, so each group sums to
# zero on its own; a group whose rewards are all equal carries no signal and gets exactly zero.

# %%
rewards2 = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0], dtype=f64)
group2 = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
adv2 = group_advantages(rewards2, group2)
rows = [
    {
        "group": g,
        "rewards": " ".join(fmt(x) for x in rewards2[group2 == g]),
        "Â": " ".join(fmt(x) for x in adv2[group2 == g]),
        "Σ Â": adv2[group2 == g].sum(),
    }
    for g in range(3)
]
table(rows)

# %% [markdown]
# Real batches also hold rows that must not be trained on (a completion cut off at the length limit,
# say). `group_advantages(..., valid=...)` leaves such a row out of its group's mean and std and gives
# it $\hat A = 0$, so the rows that are trained on still sum to zero in every group. A group left with
# a single valid row has nothing to compare it with and gets 0. (Exercise 1.1 asks you to write this.)

# %%
valid2 = torch.tensor([True, True, True, False, True, True, True, True, True, False, False, False])
adv2v = group_advantages(rewards2, group2, valid=valid2)
table(
    [
        {"row": i, "group": int(group2[i]), "reward": rewards2[i], "valid": bool(valid2[i]), "Â": adv2v[i]}
        for i in range(12)
    ]
)

# %% [markdown]
# ## 2. The policy and the score of one token
#
# The toy policy is tabular: one softmax (one logit vector $z_h$) per context $h$. The scenario
# `shared_prefix` is the paper's App. A.2 example: completions of three tokens
# (answer/result, is/was, 25/20/30), reward 1 iff the last token is "20". In the prefix tree a
# context is the exact prefix before a step, so two tokens with the same context and the same value
# are literally the same event.

# %%
sc = get_scenario("shared_prefix")
policy = sc.policy()
logits = sc.initial_logits()  # (C, K): one logit vector per context, −inf in unused slots
print(sc.description, "\n")
table(
    [
        {
            "context": " ".join(row["context"]) or "<start>",
            "token": row["token"],
            "π(token | context)": row["prob"],
        }
        for row in policy.context_table(logits)
    ]
)

# %% [markdown]
# The **score** of token $a$ at context $h$ is $\nabla_\theta \log \pi_\theta(a \mid h)$. For a softmax
# over logits $z_h$ it is
#
# $$\nabla_{z_h}\log\pi(a \mid h) = e_a - \pi(\cdot \mid h) \qquad\text{(1.2)}$$
#
# on that context's logits and zero everywhere else. Autograd through `TabularPolicy.token_logp`
# shows it for the token "20" after "answer is":

# %%
tau = torch.tensor([policy.trajectory_index(("answer", "is", "20"))])
z = logits.clone().requires_grad_(True)
policy.token_logp(z, tau)[0, 2].backward()  # log π("20" | "answer is")
h = policy.context_id(("answer", "is"))
print("actions at 'answer is':", policy.actions[h])
print("∇_z log π(20 | answer is) on that context:", z.grad[h])
print("π(· | answer is):                         ", policy.probs_table(logits)[h])
print("rows of the gradient that are non-zero:   ", torch.nonzero(z.grad.abs().sum(-1)).flatten().tolist())

# %% [markdown]
# The gradient is $e_{20} - \pi = (0, 1, 0) - (0.3, 0.3, 0.4)$, and only on the context the token was
# emitted in. Its length $\lVert e_a - \pi\rVert$ shrinks as $\pi(a)$ grows (tutorial 7 is about
# that); the library has it as `softmax_grad_norm`:

# %%
probs_h = policy.probs_table(logits)[h][None, :]
print("‖e_20 − π‖ =", fmt(softmax_grad_norm(probs_h, torch.tensor([1])), 6))
print("autograd   =", fmt(z.grad[h].norm(), 6))

# %% [markdown]
# ## 3. The policy gradient of a group
#
# GRPO's objective for one group is a weighted sum over every token of every completion (eq. 1, here
# with `token-mean`'s normalisation $1/N$, $N$ the number of tokens, in place of the paper's $1/G$):
#
# $$\mathcal J(\theta) = \frac{1}{N}\sum_{i=1}^{G}\sum_{t=1}^{T_i} \omega_{i,t}(\theta)\,\hat A_i,
# \qquad \omega_{i,t} = \frac{\pi_\theta(a_t^{(i)} \mid h_t^{(i)})}
#   {\pi_{\theta_\text{old}}(a_t^{(i)} \mid h_t^{(i)})}
# \;\text{(clipped)}. \qquad\text{(1.3)}$$
#
# Its gradient is one scalar per token times that token's score (eq. 70):
#
# $$\nabla_\theta \mathcal J = \sum_{i,t} c_{i,t}\,\nabla_\theta \log\pi_\theta(a_t^{(i)} \mid h_t^{(i)}),
# \qquad c_{i,t} = \frac{\partial \mathcal J}{\partial \log\pi_\theta(a_t^{(i)} \mid h_t^{(i)})}.
# \qquad\text{(1.4)}$$
#
# `token_coefficients` gets every $c_{i,t}$ by autograd through the real loss (`compute_loss`). We
# sample a group of 8 from the policy and look at the first update, where $\theta = \theta_\text{old}$
# so every ratio is 1.

# %%
gen = torch.Generator().manual_seed(0)
idx = policy.sample(8, logits, generator=gen)  # (8,) trajectory indices
grp = torch.zeros(8, dtype=torch.long)
r = policy.rewards[idx]
a_hat = group_advantages(r, grp)
mask = policy.mask[idx]
logp = policy.token_logp(logits, idx)  # (8, 3) log π of each sampled token
old_logp = logp.detach()  # on-policy: θ_old = θ
loss, metrics = compute_loss("grpo", logp, old_logp, a_hat, mask, grp)
coef = token_coefficients("grpo", logp, old_logp, a_hat, mask, grp)
print(f"loss = {fmt(loss)}   ratio/mean = {fmt(metrics['ratio/mean'])}")

# %%
table(
    [
        {
            "completion": policy.text(int(idx[i])),
            "R": r[i],
            "Â": a_hat[i],
            **{f"c_(i,{t + 1})": coef[i, t] for t in range(3)},
        }
        for i in range(8)
    ]
)

# %% [markdown]
# At ratio 1 every token of completion $i$ gets $c_{i,t} = \hat A_i / N$ ($N = 24$ tokens here): the
# whole completion is pushed up or down with its advantage. (The loss value is 0 up to float rounding: at ratio 1 it is
# $-\frac1N\sum_{i,t}\hat A_i$, and the advantages sum to zero over completions of equal length. Only
# its gradient matters.)
#
# ## 4. Identical tokens cancel (eq. 2, 9)
#
# Two tokens with the same context and the same value have the **same** score direction
# $g^\star = \nabla_\theta\log\pi(a^\star \mid h^\star)$. Their contributions to the update add into one
# vector $g^\star \cdot \sum c_{i,t}$ (eq. 72). Intra-group cancellation (eq. 2) means that sum is 0.
# For GRPO's token-mean it follows from $\sum_i \hat A_i = 0$ whenever every completion of the group
# contains the token with the same ratio $\rho$ (eq. 9, with this notebook's $1/N$):
#
# $$\frac{1}{N}\big(\hat A_1 \rho + \hat A_2 \rho + \dots\big)\nabla_\theta\log\pi(a^\star \mid h^\star)
# = \frac{\rho}{N}\Big(\sum_i \hat A_i\Big)\nabla_\theta\log\pi(a^\star \mid h^\star) = 0. \qquad\text{(1.5)}$$
#
# > **Words this series uses.** An **event** is one (group, context, token) pair: the tokens of an
# > event have the same score direction, so their coefficients add (eq. 72). A **whole-group event** is
# > an event that every completion of its group contains (Prop. 3.1's $E_{t^\star}$): there
# > $\sum_i \hat A_i = 0$ applies. The three **residuals** measure what is left of the coefficients
# > after adding them up; the **template KL** is the learning tax. Their definitions, as the app's
# > glossary (About page) words them, are printed below. An objective is **exchangeable** when it
# > treats the completions of a group alike (the same weight function of the same ratio for every
# > completion), so a whole-group event's coefficients are the same multiple of each $\hat A_i$ and
# > add up to 0.

# %%
glossary = {
    key: METER_DOCS[key] for key in ("shared_residual", "group_shared_residual", "sequence_net_residual")
}
glossary["template_kl"] = ROW_DOCS["template_kl"]
for key, (meaning, equation) in glossary.items():
    print(f"{key}  ({equation})\n    {meaning}\n")

# %% [markdown]
# A hand-made group in which every completion starts with "answer is" makes eq. (1.5) visible.
# `shared_residual` sums the coefficients per event (`policy.event_keys`: one id per
# context-token pair):

# %%
texts = [("answer", "is", "25"), ("answer", "is", "20"), ("answer", "is", "30"), ("answer", "is", "20")]
idx4 = torch.tensor([policy.trajectory_index(t) for t in texts])
grp4 = torch.zeros(4, dtype=torch.long)
adv4 = group_advantages(policy.rewards[idx4], grp4)
logp4 = policy.token_logp(logits, idx4)
coef4 = token_coefficients("grpo", logp4, logp4.detach(), adv4, policy.mask[idx4], grp4)
res4 = shared_residual(coef4, policy.event_keys[idx4], policy.mask[idx4])
print("Â =", adv4)
print("coefficients (rows: completions, columns: t = 1, 2, 3):\n", coef4)


# %%
def event_rows(res):
    """One row per event of a `shared_residual` result: its context, token, count, net and gross."""
    rows = []
    for key, n, net, gross in zip(res.keys, res.count, res.net, res.gross, strict=True):
        c, k = divmod(int(key), policy.K)
        rows.append(
            {
                "context": " ".join(policy.context_keys[c]) or "<start>",
                "token": policy.actions[c][k],
                "count": int(n),
                "net Σc": net,
                "gross Σ|c|": gross,
            }
        )
    return rows


table(event_rows(res4))

# %% [markdown]
# "answer" and "is" are shared by all four completions: their net coefficient is exactly 0. The last
# token "20" is shared by the two correct completions only, and their coefficients add up (both
# positive): that is the **credit** the reward assigns to "20", not a failure of cancellation.
#
# The three residuals say the same: `CancellationMeter` (what the toy and the trainer log) gives 0 on
# the whole-group events ("answer", "is") and for the completions' sums, while the shared residual,
# which also counts the two-completion event "20", is not 0: it is 20's credit, not a leak.

# %%
meter = CancellationMeter(policy.event_keys[idx4], policy.mask[idx4], grp4)
meter.add(coef4)
table([{"residual": k, "value": v} for k, v in meter.totals.residuals().items()])

# %% [markdown]
# The same statement on the parameters: the gradient of the loss with respect to the logits of the
# shared contexts is exactly zero, so one SGD step leaves $\pi(\text{answer})$ and
# $\pi(\text{is} \mid \text{answer})$ unchanged.

# %%
z = logits.clone().requires_grad_(True)
loss4, _ = compute_loss("grpo", policy.token_logp(z, idx4), logp4.detach(), adv4, policy.mask[idx4], grp4)
loss4.backward()
for key in [(), ("answer",), ("answer", "is")]:
    c = policy.context_id(key)
    print(f"∂loss/∂z at {' '.join(key) or '<start>':10}:", z.grad[c, : len(policy.actions[c])])

# %% [markdown]
# ## 5. Without $\sum \hat A = 0$ the shared tokens move
#
# Plain REINFORCE with the raw reward as the weight (no baseline) has $\sum_i r_i > 0$, so the shared
# prefix gets a net push even though it cannot explain which completion was right. In expectation
# over many batches this is harmless (the baseline does not change the expected gradient), but every
# single update moves tokens that carry no credit. That per-update drift is what the DFPO paper calls
# the **learning tax** (App. E). Group-relative advantages remove it from the tokens a whole group
# shares; the rest of this series is about the objectives and implementation details that bring it
# back, and about their fixes.

# %%
raw = policy.rewards[idx4]  # no baseline: Σ weights = 2
coef_raw = token_coefficients("grpo", logp4, logp4.detach(), raw, policy.mask[idx4], grp4)
meter_raw = CancellationMeter(policy.event_keys[idx4], policy.mask[idx4], grp4)
meter_raw.add(coef_raw)
print("weights:", raw.tolist(), " Σ =", fmt(raw.sum()))
table(
    [
        {
            "weights": "Â (group-relative)",
            "net c(answer)": coef4[:, 0].sum(),
            "net c(is)": coef4[:, 1].sum(),
            "group-shared residual": meter.totals.residuals()["group_shared_residual"],
        },
        {
            "weights": "raw reward",
            "net c(answer)": coef_raw[:, 0].sum(),
            "net c(is)": coef_raw[:, 1].sum(),
            "group-shared residual": meter_raw.totals.residuals()["group_shared_residual"],
        },
    ]
)

# %%
fig = go.Figure(
    [
        go.Bar(
            name="Â (group-relative): exactly 0",
            x=["answer", "is"],
            y=[float(coef4[:, t].sum()) for t in (0, 1)],
        ),
        go.Bar(name="raw reward", x=["answer", "is"], y=[float(coef_raw[:, t].sum()) for t in (0, 1)]),
    ]
)
fig.update_layout(
    title="Net coefficient of the shared prefix tokens (one group of 4)",
    yaxis_title="Σ_i c_(i,t)",
    barmode="group",
    height=350,
)
fig.show()

# %% [markdown]
# ## Exercises
#
# Write the body of each `my_*` function (until you do, it raises `NotImplementedError`), run its
# cell, then run the check cell below it: it prints ✓ or says what is missing or wrong. Each check
# runs your function on an example worked out by hand (its messages name the usual mistakes), then on
# 20 random cases (a new seed each run; the seed is printed when a case fails, and
# `TUTORIAL_CHECK_SEED=<seed>` reruns the same cases) against its own plain-loop computation of the
# definition, so an answer right on the example only does not pass. An answer that calls the library
# (`cancellation`, `toymodel`), autograd, or reads the notebook's variables instead of its arguments is
# refused before it runs. A worked solution is in
# `tutorials/solutions/01_advantages_and_score_function.py`; try first.
#
# **Exercise 1.1 — masked group advantages.** Write eq. (1.1) yourself: `my_group_advantages(rewards,
# group, valid)` returns the $(B,)$ tensor $\hat A$ for a batch whose groups have different sizes, any
# ids and appear in any order, where only the rows with `valid` True enter their group's mean and std
# (Bessel-corrected, as `torch.std`; $\epsilon = 10^{-6}$). A row that is not valid gets $\hat A = 0$, and
# so does every row of a group with fewer than two valid rows (a group with exactly two valid rows has a
# std and counts).

# %%
# the check's example, worked out by hand: groups of sizes 5, 3, 2, interleaved; group 0's valid rewards
# 1,0,0,1: mean 1/2, std √(1/3), Â = ±(1/2)/√(1/3) = ±0.866025; group 1: 0,1,1: mean 2/3, std √(1/3),
# Â = −1.154701, 0.577350, 0.577350; group 2: one valid row. Then two known mistakes on the valid rows:
# every row counted, and the population std.
ex11 = {
    "rewards": torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0], dtype=f64),
    "group": torch.tensor([0, 1, 0, 2, 0, 1, 0, 2, 1, 0]),
    "valid": torch.tensor([True] * 7 + [False, True, False]),
    "by_hand": torch.tensor(
        [0.866025, -1.154701, -0.866025, 0, -0.866025, 0.577350, 0.866025, 0, 0.577350, 0], dtype=f64
    ),
    "all_rows": torch.tensor(
        [0.730297, -1.154701, -1.095445, 0.707107, -1.095445, 0.577350, 0.730297, 0.577350], dtype=f64
    ),
    "population": torch.tensor([1.0, -1.414214, -1.0, 0, -1.0, 0.707107, 1.0, 0.707107], dtype=f64),
}


# %%
def case_1_1(gen):
    """A random batch for the check: three groups (ids 7, 2, 5, shuffled) of 2-5 rows, and what it holds."""
    # expect_cases seeds its case i with seed·1000 + i: the kinds (and the choice below) come in turn
    i = gen.initial_seed() % 1000
    kind = i % 5
    sizes = torch.randint(2, 6, (3,), generator=gen).tolist()
    group = torch.tensor([g for g, n in zip((7, 2, 5), sizes, strict=True) for _ in range(n)])
    group = group[torch.randperm(len(group), generator=gen)]
    rewards = torch.randint(2, (len(group),), generator=gen).to(f64)
    valid = torch.rand(len(group), generator=gen) < 0.75
    first = (group == group[0]).nonzero().flatten()  # the rows of one group, which the kind shapes
    valid[first] = False
    if kind == 0:
        valid[first[:2]], rewards[first[0]] = True, 1.0 - rewards[first[1]]
    elif kind == 1:  # all-equal (dyadic, so its mean is exact) valid rewards; its other rows not valid
        valid[first[:2]], rewards[first[:2]] = True, 1.0
    elif kind == 2:  # one valid row in one group
        valid[first[0]] = True
    elif kind == 3:  # rewards this close make ε = 1e-6 a visible part of std + ε
        rewards = 0.5 + 1e-3 * torch.rand(len(group), generator=gen, dtype=f64)
        valid[first] = True
    labels = ["a group with exactly two valid rows", "a valid group whose rewards are all equal",
              "a group with one valid row", "continuous rewards within 1e-3 of each other", "a group with no valid row"]  # fmt: skip
    return (rewards, group, valid), f"{labels[kind]}; group sizes {sizes}, some rows not valid"


# %%
def my_group_advantages(rewards: torch.Tensor, group: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(B,) Â: (r − mean) / (std + 1e-6) over each group's valid rows; 0 for invalid rows and groups of < 2."""
    raise NotImplementedError("Exercise 1.1: replace this line with your code")


# %%
with check("1.1"):
    forbid(my_group_advantages, why="write eq. (1.1) yourself, from the arguments")
    got = my_group_advantages(ex11["rewards"], ex11["group"], ex11["valid"])
    if isinstance(got, torch.Tensor) and got.shape == ex11["valid"].shape:
        reject(got[ex11["valid"]], ex11["all_rows"], "Â: the rows with valid = False took part in their group's mean and std; leave them out (and give them Â = 0)")  # fmt: skip
        reject(got[ex11["valid"]], ex11["population"], "Â: you divided by the population std (1/n); GRPO uses torch.std's Bessel-corrected one (1/(n − 1))")  # fmt: skip
        ensure(bool(torch.isfinite(got).all()), f"Â has NaN or inf: {got}. A group with one valid row has no std (n − 1 = 0): it carries no contrast, give it Â = 0")  # fmt: skip
    expect_close(got, ex11["by_hand"], "Â of every row", rtol=1e-5, atol=1e-6)

    def reference(rewards, group, valid):  # eq. (1.1) from its definition, one group at a time
        adv = torch.zeros_like(rewards)
        for g in set(group.tolist()):
            rows = [i for i in range(len(group)) if group[i] == g and valid[i]]
            if len(rows) >= 2:
                mean = sum(float(rewards[i]) for i in rows) / len(rows)
                std = math.sqrt(sum((float(rewards[i]) - mean) ** 2 for i in rows) / (len(rows) - 1))
                for i in rows:
                    adv[i] = (float(rewards[i]) - mean) / (std + 1e-6)
        return adv

    expect_cases(my_group_advantages, reference, case_1_1, "Â of every row", rtol=1e-9, atol=1e-12)

# %% [markdown]
# **Exercise 1.2 — the coefficients at ratio 1, in closed form.** At $\theta = \theta_\text{old}$ every
# ratio is 1, so eq. (1.3) has the gradient of the surrogate $\sum_{i,t}\hat A_i\log\pi_\theta(a^{(i)}_t \mid
# h^{(i)}_t)$ divided by the aggregation's normaliser. Write `my_coefficients(adv, mask, aggregation)`
# returning the $(B, T)$ tensor $c_{i,t}$ of eq. (1.4) for two aggregations (the `aggregate` modes of
# `cancellation.aggregation`): `"token-mean"` (divide by the number $N$ of real tokens) and
# `"seq-mean-token-mean"` (each completion's mean over its own $T_i$ tokens, then the mean over the
# $G$ completions of the batch). Padding (mask 0) is not in the loss. The check's batches have unequal
# lengths and padding, and advantages that need not sum to 0; write the closed form (autograd through a
# loss is refused).

# %%
# the check's example, worked out by hand: T_i = 4, 2, 3, so N = 9 and G = 3
ex12 = {
    "adv": torch.tensor([1.0, -0.5, -0.5], dtype=f64),
    "mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=f64),
    "token-mean": torch.tensor([[1 / 9] * 4, [-1 / 18] * 2 + [0, 0], [-1 / 18] * 3 + [0]], dtype=f64),
    "seq-mean-token-mean": torch.tensor(
        [[1 / 12] * 4, [-1 / 12] * 2 + [0, 0], [-1 / 18] * 3 + [0]], dtype=f64
    ),
}


# %%
def case_1_2(gen):
    """A random batch for the check: (adv, mask, aggregation) and what it holds."""
    i = gen.initial_seed() % 1000
    kind, turn = i % 4, i // 4 % 2
    b, t = (int(n) for n in torch.randint(2, 6, (2,), generator=gen))
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    lengths[0] = t if kind < 3 else 1  # one full-length completion, or one of a single token
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(f64)
    adv = torch.randn(b, generator=gen, dtype=f64)
    if kind == 1:
        adv -= adv.mean()  # Σ Â = 0
    elif kind == 2:
        adv[::2] = 0.0  # zero-advantage rows
    aggregation = ("token-mean", "seq-mean-token-mean")[turn]
    what = ["Σ Â ≠ 0", "Σ Â = 0", "zero-advantage rows", "a one-token completion"][kind]
    return (adv, mask, aggregation), f"{aggregation}, lengths {lengths.tolist()}, {what}"


# %%
def my_coefficients(adv: torch.Tensor, mask: torch.Tensor, aggregation: str) -> torch.Tensor:
    """(B, T) ∂J/∂logp at ratio 1 for "token-mean" or "seq-mean-token-mean", 0 on padding."""
    raise NotImplementedError("Exercise 1.2: replace this line with your code")


# %%
with check("1.2"):
    forbid(my_coefficients, ("backward", "autograd"), why="write the closed form of ∂J/∂logp yourself")
    for mode, other in [("token-mean", "seq-mean-token-mean"), ("seq-mean-token-mean", "token-mean")]:
        got = my_coefficients(ex12["adv"], ex12["mask"], mode)
        ensure(not isinstance(got, torch.Tensor) or got.shape != ex12["mask"].shape or bool((got[ex12["mask"] == 0] == 0).all()),
               f"{mode}: your coefficients are not 0 on padding (mask = 0): {got}. Padding is not in the loss: multiply by the mask")  # fmt: skip
        hint = "Â_i/(G·T_i)" if mode == "token-mean" else "Â_i/N"
        reject(got, ex12[other], f"{mode}: these are the other aggregation's coefficients ({hint})")
        expect_close(got, ex12[mode], "∂J/∂logp of every token", at=f"for {mode}")

    def reference(adv, mask, aggregation):  # c_(i,t) token by token, from the two definitions
        b, t = mask.shape
        n = sum(float(m) for m in mask.flatten())
        coef = torch.zeros(b, t, dtype=adv.dtype)
        for i in range(b):
            t_i = sum(float(m) for m in mask[i])
            for j in range(t):
                if mask[i, j] == 1:
                    coef[i, j] = adv[i] / n if aggregation == "token-mean" else adv[i] / (t_i * b)
        return coef

    expect_cases(my_coefficients, reference, case_1_2, "∂J/∂logp of every token", rtol=1e-9, atol=1e-15)

# %% [markdown]
# **Exercise 1.3 — which events cancel?** Under token-mean at ratio 1 an event $S$'s net coefficient is
# $\frac1N\sum_{(i,t)\in S}\hat A_i$ (eq. 72 with exercise 1.2's $c_{i,t}$). Write
# `my_event_nets(adv, keys, mask)` returning it for every event that has a real token (mask 1), in the
# order of the sorted event ids (`keys[i, t]` is the event of token $(i, t)$; padding carries a key
# too, which means nothing). An event cancels exactly when its tokens' advantages sum to zero.
#
# *Hint:* `torch.unique(keys[mask.bool()], return_inverse=True)` and `index_add_`.

# %%
# the check's example: padding keys 12, 16, 13 (16 only on padding); event 14 twice among row 2's real
# tokens. By hand, events 10..14: 10 (all three rows) (1 − 1/2 − 1/2)/9 = 0, 11 (rows 0, 1) (1/2)/9, 12 and
# 13 (row 0) 1/9, 14 (row 2, two tokens) 2·(−1/2)/9. Then what the padding counted in gives (ids 10–14, 16).
ex13 = {
    "adv": torch.tensor([1.0, -0.5, -0.5], dtype=f64),
    "mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=f64),
    "keys": torch.tensor([[10, 11, 12, 13], [10, 11, 12, 16], [10, 14, 14, 13]]),
    "by_hand": torch.tensor([0.0, 1 / 18, 1 / 9, 1 / 9, -1 / 9], dtype=f64),
    "with_padding": torch.tensor([0.0, 1 / 18, 1 / 18, 1 / 18, -1 / 9, -1 / 18], dtype=f64),
}


# %%
def case_1_3(gen):
    """A random batch for the check: (adv, keys, mask) and what it holds; ids are shuffled, so the first
    appearance is not the sorted order."""
    i = gen.initial_seed() % 1000
    kind = i % 4
    b, t = (int(n) for n in torch.randint(2, 6, (2,), generator=gen))
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    lengths[int(torch.randint(b, (), generator=gen))] = t
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(f64)
    keys = 100 + torch.randperm(40, generator=gen)[torch.randint(8, (b, t), generator=gen)]
    adv = torch.randn(b, generator=gen, dtype=f64)
    if kind == 0:  # a whole-group event (every first token) with Σ Â = 0: it cancels
        keys[:, 0], adv = 7, adv - adv.mean()
    elif kind == 1:  # two identical completions, and a zero-advantage row
        keys[1], mask[1], adv[-1] = keys[0], mask[0], 0.0
    elif kind == 2:  # every padding position carries an id no real token has
        keys[mask == 0] = 999
    what = ["a whole-group event, Σ Â = 0", "identical completions, a zero-advantage row",
            "ids only on padding", "padding ids shared with real tokens, Σ Â ≠ 0"][kind]  # fmt: skip
    return (adv, keys, mask), f"{what}; lengths {lengths.tolist()}"


# %%
def my_event_nets(adv: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(E,) Σ Â over each event's real tokens / N, events sorted by id."""
    raise NotImplementedError("Exercise 1.3: replace this line with your code")


# %%
with check("1.3"):
    forbid(my_event_nets, why="sum the advantages per event yourself")
    got = my_event_nets(ex13["adv"], ex13["keys"], ex13["mask"])
    reject(got, [0.0, 1 / 18, 1 / 9, 1 / 9, -1 / 18], "the net of event 14 counts row 2 once, but the event is two of its real tokens: sum Â over the tokens, not over the completions")  # fmt: skip
    reject(got, ex13["with_padding"], "the nets of events 12 and 13 count the padding positions that carry their keys: keep only mask = 1")  # fmt: skip
    reject(got, ex13["with_padding"] * 9 / 12, "the nets count the padding positions (and divide by B·T = 12, not N = 9): keep only mask = 1")  # fmt: skip
    ensure(not isinstance(got, torch.Tensor) or got.shape != (6,), f"6 nets for 5 events: {got}. Event 16 is only on padding (row 1's last position), it has no real token: take the ids from keys[mask = 1]", "wrong shape")  # fmt: skip
    expect_close(got, ex13["by_hand"], "Σ Â / N of every event (ids 10–14)")

    def reference(adv, keys, mask):  # every real token adds its completion's Â to its event's sum
        nets = {}
        for i in range(mask.shape[0]):
            for j in range(mask.shape[1]):
                if mask[i, j] == 1:
                    nets[int(keys[i, j])] = nets.get(int(keys[i, j]), 0.0) + float(adv[i])
        n = sum(float(m) for m in mask.flatten())
        return torch.tensor([nets[k] / n for k in sorted(nets)], dtype=adv.dtype)

    expect_cases(my_event_nets, reference, case_1_3, "Σ Â / N of every event (sorted by id)", atol=1e-12)
