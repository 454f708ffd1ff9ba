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
import plotly.graph_objects as go
import plotly.io as pio
import torch
from exercise_check import check, expect_close  # the exercises' check cells (next to this file)

from cancellation import aggregate, compute_loss, group_advantages  # noqa: F401 (aggregate: exercise 1.1)
from cancellation.diagnostics import shared_residual, softmax_grad_norm, token_coefficients
from toymodel import get_scenario

pio.renderers.default = "plotly_mimetype+notebook_connected"  # JupyterLab, VS Code and classic Jupyter
torch.set_num_threads(1)  # the toy's tensors are tiny: one thread is fastest
torch.set_printoptions(precision=4, sci_mode=False)
f64 = torch.float64

# %% [markdown]
# ## 1. From a group of rewards to $\hat A$
#
# GRPO's advantage (DFPO eq. 43) standardises each reward within its group:
#
# $$\hat A_i = \frac{r_i - \operatorname{mean}_j r_j}{\operatorname{std}_j r_j + \epsilon}.$$
#
# `group_advantages(rewards, group)` computes it for a flat batch in which `group[i]` is the prompt
# id of completion $i$ (the project's data layout, see the README). Here is one group of eight
# completions with a 0/1 reward:

# %%
rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0], dtype=f64)
group = torch.zeros(8, dtype=torch.long)
adv = group_advantages(rewards, group)
print("Â      =", adv)
print("Σ Â    =", float(adv.sum()))

# %% [markdown]
# Correct completions get $\hat A > 0$, wrong ones $\hat A < 0$, and the advantages **sum to zero**:
# that is what subtracting the group mean does, whatever the scaling. The toy problems of the
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
for g in range(3):
    print(f"group {g}: rewards {rewards2[group2 == g].tolist()} -> Â {adv2[group2 == g].tolist()}")
    print(f"         Σ Â = {float(adv2[group2 == g].sum()):+.1e}")

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
for row in policy.context_table(logits):
    print(f"  π({row['token']!r:9} | {' '.join(row['context']) or '<start>':12}) = {row['prob']:.2f}")

# %% [markdown]
# The **score** of token $a$ at context $h$ is $\nabla_\theta \log \pi_\theta(a \mid h)$. For a softmax
# over logits $z_h$ it is $e_a - \pi(\cdot \mid h)$ on that context's logits and zero everywhere else.
# Autograd through `TabularPolicy.token_logp` shows it for the token "20" after "answer is":

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
print("‖e_20 − π‖ =", float(softmax_grad_norm(probs_h, torch.tensor([1]))))
print("autograd   =", float(z.grad[h].norm()))

# %% [markdown]
# ## 3. The policy gradient of a group
#
# GRPO's objective for one group is a weighted sum over every token of every completion (eq. 1, here
# with `token-mean`'s normalisation $1/N$, $N$ the number of tokens, in place of the paper's $1/G$):
#
# $$\mathcal J(\theta) = \frac{1}{N}\sum_{i=1}^{G}\sum_{t=1}^{T_i} \omega_{i,t}(\theta)\,\hat A_i,
# \qquad \omega_{i,t} = \frac{\pi_\theta(a_t^{(i)} \mid h_t^{(i)})}
#   {\pi_{\theta_\text{old}}(a_t^{(i)} \mid h_t^{(i)})}
# \;\text{(clipped)},$$
#
# Its gradient is one scalar per token times that token's score (eq. 70):
#
# $$\nabla_\theta \mathcal J = \sum_{i,t} c_{i,t}\,\nabla_\theta \log\pi_\theta(a_t^{(i)} \mid h_t^{(i)}),
# \qquad c_{i,t} = \frac{\partial \mathcal J}{\partial \log\pi_\theta(a_t^{(i)} \mid h_t^{(i)})}.$$
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
print(f"loss = {float(loss):+.4f}   ratio/mean = {metrics['ratio/mean']:.3f}\n")
print(f"{'completion':16} {'R':>3} {'Â':>7} | coefficients c_(i,t)")
for i in range(8):
    cs = "  ".join(f"{float(c):+.4f}" for c in coef[i])
    print(f"{policy.text(int(idx[i])):16} {float(r[i]):3.0f} {float(a_hat[i]):+7.3f} | {cs}")

# %% [markdown]
# At ratio 1 every token of completion $i$ gets $c_{i,t} = \hat A_i / N$ ($N = 24$ tokens here): the
# whole completion is pushed up or down with its advantage. (The loss value is 0: at ratio 1 it is
# $-\frac1N\sum_{i,t}\hat A_i$, and the advantages sum to zero over completions of equal length. Only
# its gradient matters.)
#
# ## 4. Identical tokens cancel (eq. 2, 9)
#
# Two tokens with the same context and the same value have the **same** score direction
# $g^\star = \nabla_\theta\log\pi(a^\star \mid h^\star)$. Their contributions to the update add into one
# vector $g^\star \cdot \sum c_{i,t}$ (eq. 72). Intra-group cancellation (eq. 2) means that sum is 0.
# For GRPO it follows from $\sum_i \hat A_i = 0$ whenever every completion of the group contains the
# token with the same ratio $\rho$ (eq. 9):
#
# $$\frac{1}{G}\big(\hat A_1 \rho + \hat A_2 \rho + \dots\big)\nabla_\theta\log\pi(a^\star \mid h^\star)
# = \frac{\rho}{G}\Big(\sum_i \hat A_i\Big)\nabla_\theta\log\pi(a^\star \mid h^\star) = 0.$$
#
# A hand-made group in which every completion starts with "answer is" makes this visible.
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
print("\nper event: count, net Σc, gross Σ|c|")
for key, n, net, gross in zip(res4.keys, res4.count, res4.net, res4.gross, strict=True):
    c, k = divmod(int(key), policy.K)
    ctx = " ".join(policy.context_keys[c]) or "<start>"
    print(f"  ({ctx!r:13}, {policy.actions[c][k]!r:8})  {int(n)}  {float(net):+.4f}  {float(gross):.4f}")
print("\nshared residual Σ|net| / Σ gross over shared events:", res4.total)

# %% [markdown]
# "answer" and "is" are shared by all four completions: their net coefficient is exactly 0. The last
# token "20" is shared by the two correct completions only, and their coefficients add up (both
# positive): that is the **credit** the reward assigns to "20", not a failure of cancellation.
#
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
res_raw = shared_residual(coef_raw, policy.event_keys[idx4], policy.mask[idx4])
print("weights:", raw.tolist(), " Σ =", float(raw.sum()))
print("net coefficient of 'answer', 'is':", coef_raw[:, 0].sum().item(), coef_raw[:, 1].sum().item())
print("shared residual:", res_raw.total)

fig = go.Figure(
    [
        go.Bar(name="Â (group-relative)", x=["answer", "is"], y=[float(coef4[:, t].sum()) for t in (0, 1)]),
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
# cell, then run the check cell below it: it prints ✓ or says what is missing or wrong. A worked
# solution is in `tutorials/solutions/01_advantages_and_score_function.py`; try first.
#
# **Exercise 1.1 — predict the coefficients.** At $\theta = \theta_\text{old}$ every ratio is 1, so
# GRPO's token-mean objective has the same gradient as the plain policy-gradient surrogate
# $\frac1N\sum_{i,t}\hat A_i \log\pi_\theta(a^{(i)}_t \mid h^{(i)}_t)$. Write `my_coefficients`
# returning the $(B, T)$ tensor $\partial\mathcal J/\partial\log\pi$ of that surrogate. The check
# compares it with GRPO's coefficients from `token_coefficients`.
#
# *Hint:* autograd through `aggregate(adv[:, None] * leaf, mask, "token-mean")` on a leaf copy of
# `logp`, or the closed form you can read off the token-mean.


# %%
def my_coefficients(adv: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) ∂J/∂logp of J = token-mean of Â_i·logp_(i,t), 0 on padding."""
    raise NotImplementedError("Exercise 1.1: replace this line with your code")


# %%
with check("1.1"):
    got = my_coefficients(a_hat, logp, mask)
    expected = token_coefficients("grpo", logp, old_logp, a_hat, mask, grp)
    expect_close(got, expected, "∂J/∂logp of every token")

# %% [markdown]
# **Exercise 1.2 — which events cancel?** For the sampled group of section 3, compute for every
# event (context-token pair, `policy.event_keys[idx]`) the sum of the advantages of the tokens in
# it, $\sum_{(i,t) \in S}\hat A_i$, divided by the number of tokens $N$. Return one value per event,
# in the order of `shared_residual(...).keys` (sorted event ids). The check compares your numbers
# with the net coefficients of GRPO's actual gradient: an event cancels exactly when its tokens'
# advantages sum to zero.
#
# *Hint:* `torch.unique(keys[mask.bool()], return_inverse=True)` and `index_add_`.


# %%
def my_event_advantage_sums(adv: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(E,) Σ Â over each event's tokens / N, events sorted by id."""
    raise NotImplementedError("Exercise 1.2: replace this line with your code")


# %%
with check("1.2"):
    keys = policy.event_keys[idx]
    got = my_event_advantage_sums(a_hat, keys, mask)
    expected = shared_residual(coef, keys, mask).net
    expect_close(got, expected, "Σ Â / N of every event")
