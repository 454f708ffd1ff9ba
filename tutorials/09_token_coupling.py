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
# # 9 · Token coupling
#
# Tutorials 1–8 mostly asked whether the coefficients of shared tokens cancel. This one asks what happens
# to each token's probability after one update, and why it often moves against its own advantage:
# tokens **couple** through the parameters they share. The cancellation-hypothesis paper ("The
# Cancellation Hypothesis in Critic-Free RL: From Outcome Rewards to Token Credits", arXiv 2605.08666;
# docs/papers.md lists it and the other papers) builds the argument from eq. 5 through eq. 10 to its
# Table 1; this tutorial follows it on a small neural policy:
#
# 1. why the tabular toy cannot show coupling across contexts, and what `toymodel.neural.NeuralPolicy`
#    adds;
# 2. eq. 3–5: one SGD step to first order, each token's $\Delta\log\pi$ split into a self-term and a
#    coupling term, checked against the actual step;
# 3. eq. 6–10: the output-layer proxy of the coupling kernel, and why same-token, low-confidence
#    pairs dominate it;
# 4. eq. 11–13: the group update's norm and the advantage-weighted filter;
# 5. Table 1: the Masking Effect and Boost Rate of four masked token sets, next to the paper's;
# 6. the Lopti paper's low-probability tokens, and how they reach the others through shared weights.
#
# **Equation numbers in this tutorial are the cancellation-hypothesis paper's** (not the DFPO paper's,
# the other tutorials' default). The text of the paper we work from lost its typeset equations: every formula
# below was *rebuilt* from the prose around its number, as in `cancellation.coupling`, whose docstrings
# give each rebuilt form. Every number is computed by `cancellation.coupling`, `instruments.coupling`
# and `toymodel`; outside the exercises the notebook re-implements none of them.

# %%
import plotly.graph_objects as go
import plotly.io as pio
import torch
from exercise_check import (
    check,
    ensure,
    expect_cases,
    expect_close,
    expect_equal,
    forbid,
    reject,
)  # the checks
from IPython.display import Markdown, display
from show import table  # aligned tables of the numbers the cells compute

# %%
from cancellation.advantages import reweight_advantages
from cancellation.coupling import (
    coupling_kernel,
    coupling_mass,
    first_order_delta,
    output_overlap,
    per_token_scores,
    proxy_kernel,
    sgd_step,
    surviving_signal,
    update_norm_split,
)
from cancellation.update import coefficients
from instruments.coupling import (
    MASK_SETS,
    PAPER_BOOST_RATE,
    format_table,
    measure,
    sample_batch,
    summarise,
    table_rows,
)

# %%
pio.renderers.default = "plotly_mimetype+notebook_connected"
torch.set_num_threads(1)  # tiny tensors on a shared 2-core machine: one thread is fastest
torch.set_printoptions(precision=3, sci_mode=False)
f64 = torch.float64

# %% [markdown]
# ## 1. The small neural policy, and why the tabular toy is not enough
#
# The paper's eq. 5 couples two tokens $j, k$ of a batch through the **coupling kernel**
# $K_{jk} = \langle g_j, g_k\rangle$, the inner product of their score directions
# $g_j = \nabla_\theta \log\pi_\theta(y_j)$ over all parameters. In the tabular toy of tutorials 1–7
# the parameters are one logit vector per context, so $g_j$ is zero outside the row of token $j$'s
# context $c_j$, where it is $e_{y_j} - \pi_{c_j}$. Hence
#
# $$K^{\text{tab}}_{jk} = \mathbb 1[c_j = c_k]\;\langle e_{y_j} - \pi_j,\; e_{y_k} - \pi_k\rangle:$$
#
# the tabular toy is a network whose hidden state is **one-hot** ($h_j = e_{c_j}$, so
# $\langle h_j, h_k\rangle = \mathbb 1[c_j = c_k]$), and its kernel *is* the output-layer proxy of eq. 7
# (section 3). Two tokens couple only inside one context. In a language model every token shares the
# network's weights, and the same token string uses the same unembedding row wherever it occurs.
#
# `toymodel.neural.NeuralPolicy` puts that into the toy. Over a scenario's support it scores each
# context $c$ by
#
# $$h_c = \tanh(W_1 e_c + b_1), \qquad z_c = W_\text{out}\, h_c, \qquad
#   \pi(\cdot\mid c) = \operatorname{softmax}(z_c \text{ on the tokens that can follow } c),$$
#
# with one embedding $e_c$ per node of the prefix tree (the hidden state depends on the whole prefix, as
# an LM's does), a hidden layer $W_1, b_1$ **shared** by every context, and an **untied** unembedding
# $W_\text{out}$ with one row per token string (19 strings on `template_task`). No output bias, so the
# gradient w.r.t. $W_\text{out}$ is exactly eq. 6's. `instruments.coupling.sample_batch` builds the
# seeded net and samples 4 groups of 8 completions of `template_task` on-policy; its fields are the
# batch's $N$ completion tokens, flattened (`coef` the GRPO coefficients $c_j = \partial J/\partial\log\pi(y_j)$,
# `tokens`, `probs`, `hidden`, `probs_taken` = $\pi_j(y_j)$, ...).

# %%
b = sample_batch("template_task", seed=0, group_size=8, num_groups=4)
net = b.policy
N = b.coef.shape[0]
movable = ~b.forced  # <eos> follows a context with one valid token: π = 1, no step can move it
shapes = {name: tuple(p.shape) for name, p in zip(net.param_names, b.params, strict=True)}
print(f"net: {net.num_params()} parameters {shapes}")
print(f"{net.C} prefix contexts, vocabulary of {net.V} token strings")
print(f"batch: {len(b.idx)} completions, N = {N} tokens ({int(b.forced.sum())} forced <eos>)")
print("rewards per group:", b.rewards.view(4, 8).sum(1).tolist(), "of 8")

# %% [markdown]
# The tabular toy on the same prefix tree (`net.structure` is that `TabularPolicy`), with random
# logits, scored on the **same tokens**: its kernel by autograd (`per_token_scores`, then
# `coupling_kernel`), next to `proxy_kernel` with one-hot hidden states. Then the net's kernel.

# %%
tab = net.structure
gen = torch.Generator().manual_seed(0)
tab_theta = torch.where(tab.valid, torch.randn(tab.valid.shape, generator=gen, dtype=f64), -torch.inf)
valid = b.mask.bool()
ctx = tab.ctx[b.idx][valid]  # (N,) each token's context
z = tab_theta.clone().requires_grad_(True)
k_tab = coupling_kernel(per_token_scores(lambda: tab.token_logp(z, b.idx)[valid], [z]))
one_hot = torch.nn.functional.one_hot(ctx, tab.C).to(f64)
k_tab_proxy = proxy_kernel(one_hot, tab.probs_table(tab_theta)[ctx], tab.act[b.idx][valid])  # y: slot ids
other_ctx = ctx[:, None] != ctx[None, :]
same_tok = b.tokens[:, None] == b.tokens[None, :]
print("tabular: kernel = proxy with one-hot h:", torch.allclose(k_tab, k_tab_proxy, rtol=0, atol=1e-14))
print(f"tabular: K = 0 for every pair in different contexts ({float(other_ctx.double().mean()):.0%} of pairs):",
      bool((k_tab[other_ctx] == 0).all()))  # fmt: skip

scores = per_token_scores(lambda: b.logp_of(b.params), b.params)  # (N, P): row j = g_j
k_full = coupling_kernel(scores)
cross_share = float(k_full[other_ctx].abs().sum() / k_full.abs().sum())
print(f"net: {cross_share:.0%} of Σ|K_jk| is between tokens of different contexts")
print(
    f"same token string in different contexts: mean K_jk = {float(k_tab[same_tok & other_ctx].mean()):.3f} "
    f"(tabular), {float(k_full[same_tok & other_ctx].mean()):.3f} (net)"
)

# %% [markdown]
# ## 2. One step to first order (eq. 3–5)
#
# The paper writes the GRPO update as a weighted token log-likelihood (eq. 2),
# $J(\theta) = \sum_k c_k \log\pi_\theta(y_k)$, with the ratio and clip absorbed into $c_k$ (here on-policy:
# the ratio is 1). One SGD *ascent* step with the coefficients held fixed is (eq. 3)
#
# $$\theta' = \theta + \mathrm{lr}\,\sum_k c_k\, g_k ,$$
#
# and a first-order Taylor expansion of $\log\pi(y_j)$ (eq. 4), $\Delta_j \approx \langle g_j, \theta'-\theta\rangle$,
# splits each token's change in two (eq. 5):
#
# $$\Delta_j \;\approx\; \underbrace{\mathrm{lr}\,c_j K_{jj}}_{\text{self}}
#   \;+\; \underbrace{\mathrm{lr}\sum_{k\ne j} c_k K_{jk}}_{\text{coupling}} .$$
#
# The self-term has the sign of the token's own advantage ($K_{jj} = \lVert g_j\rVert^2 \ge 0$); the
# coupling term is what the rest of the batch does to it. `first_order_delta(kernel, coef, lr)` returns
# both; `sgd_step(logp_of, params, lr)` builds the actual step (from a copy of θ), whose new log-probs
# we compare with it. The error of eq. 4 is second order, so 10× smaller steps should make it ~100×
# smaller:

# %%
deltas = {}
for lr in (1.0, 0.1):
    first = first_order_delta(k_full, b.coef, lr)
    actual = sgd_step(b.logp_of, b.params, lr)(b.coef) - b.logp
    deltas[lr] = (first, actual)
    err = (actual - first.total).abs().max()
    print(
        f"lr = {lr:<4}: max |Δ log π| = {float(actual.abs().max()):.2e}, "
        f"max |actual − first order| = {float(err):.2e}"
    )
ratio = float(
    (deltas[1.0][1] - deltas[1.0][0].total).abs().max() / (deltas[0.1][1] - deltas[0.1][0].total).abs().max()
)
print(f"the error shrinks {ratio:.0f}× for a 10× smaller step")

# %% [markdown]
# At lr = 1 (the default of `instruments.coupling`: plain SGD, $|c| \approx 1/N$) the steps move
# $\log\pi$ by up to about 0.2 and the first-order picture holds to a few per cent. Now the split
# itself: the self-term against the actual change, every movable token one point.

# %%
first, actual = deltas[1.0]
sign_adv = torch.sign(b.adv_tok)
moved = movable & (b.adv_tok != 0)
flipped = float((torch.sign(actual) != sign_adv)[moved].double().mean())
coupling_vs_self = float(first.coupling[movable].abs().mean() / first.self[movable].abs().mean())
print(f"mean |coupling| / mean |self| = {coupling_vs_self:.1f}")
print(f"tokens whose log π moved against their own advantage's sign: {flipped:.0%}")

fig = go.Figure()
for s, name in ((1, "A > 0"), (-1, "A < 0")):
    sel = movable & (sign_adv == s)
    fig.add_scatter(
        x=first.self[sel].tolist(), y=actual[sel].tolist(), mode="markers", name=name, marker={"size": 5}
    )
ends = [float(first.self[movable].min()), float(first.self[movable].max())]
fig.add_scatter(x=ends, y=ends, mode="lines", name="Δ = self-term", line={"dash": "dot", "color": "grey"})
fig.add_hline(y=0, line_width=1, line_color="grey")
fig.add_vline(x=0, line_width=1, line_color="grey")
fig.update_layout(
    title="One SGD step (lr = 1): own term vs actual change",
    xaxis_title="self-term lr·c_j·K_jj",
    yaxis_title="actual Δ log π(y_j)",
    height=380,
)
fig.show()

# %% [markdown]
# Every point off the dotted diagonal was moved by the coupling term, and those in the top-left and
# bottom-right quadrants moved against their own advantage: the paper's **token flipping** (its
# Fig. 1), here produced by the other tokens of one batch. In the tabular toy only tokens of the same
# context could do this.
#
# ## 3. Where the coupling sits: the output-layer proxy (eq. 6–10)
#
# The full kernel needs every token's full gradient. The paper approximates it by the gradient of the
# unembedding $W$ alone. With logits $z = W h$ ($h$ the final hidden state), eq. 6 is
# $\nabla_W \log\pi(y) = (e_y - \pi)\,h^\top$, and with $\langle a b^\top, c d^\top\rangle_F = \langle a,c\rangle\langle b,d\rangle$
# (eq. 7)
#
# $$K^W_{jk} = \langle h_j, h_k\rangle\cdot D_{jk},\qquad
#   D_{jk} = \langle e_{y_j}-\pi_j,\; e_{y_k}-\pi_k\rangle
#         = \mathbb 1[y_j = y_k] - \pi_j(y_k) - \pi_k(y_j) + \langle \pi_j, \pi_k\rangle \quad\text{(eq. 8)}.$$
#
# So coupling needs aligned hidden states **and** overlapping output distributions. Eq. 10 reads
# $D_{jk}$ in two cases:
#
# * $y_j \ne y_k$: only the cross terms remain, $-\pi_j(y_k) - \pi_k(y_j) + \langle\pi_j,\pi_k\rangle$,
#   small when neither distribution puts much mass on the other's token;
# * $y_j = y_k = y$: $D_{jk} = 1 - \pi_j(y) - \pi_k(y) + \langle\pi_j,\pi_k\rangle$, large when **both**
#   tokens have low confidence $\pi(y)$ (at $\pi_j(y), \pi_k(y) < 0.5$ its leading part is positive).
#
# Hence the paper's two conditions: non-negligible coupling is sparse, between **identical,
# low-confidence** tokens. On the net, `proxy_kernel(hidden, probs, tokens)` (eq. 7) is the exact kernel
# of $W_\text{out}$ (no output bias); the full kernel adds the paths through $W_1$, $b_1$ and the
# embeddings:

# %%
head_start = sum(p.numel() for p in b.params[: net.head_slice.start])
k_head = coupling_kernel(scores[:, head_start:])  # the kernel of W_out alone, by autograd
k_proxy = proxy_kernel(b.hidden, b.probs, b.tokens)
print("kernel of W_out (autograd) = proxy of eq. 7:", torch.allclose(k_head, k_proxy, rtol=1e-10, atol=1e-12))
rel = float(torch.linalg.norm(k_full - k_proxy) / torch.linalg.norm(k_full))
print(f"‖K_full − K_proxy‖ / ‖K_full‖ = {rel:.2f}")
proxy_first = first_order_delta(k_proxy, b.coef, 1.0).total
agree = float((torch.sign(proxy_first) == torch.sign(actual))[movable].double().mean())
print(
    f"sign of the proxy's first-order Δ (eq. 9) = sign of the full step's actual Δ for {agree:.0%} of tokens"
)

# %% [markdown]
# The proxy is far from the full kernel in norm on this small net (the unembedding is a small part of
# its parameters; most are the context embeddings) but predicts the direction of most tokens' change,
# which is what the paper's App. D.1 compares. Now $D_{jk}$ itself (`output_overlap`, eq. 8), over the pairs of movable tokens,
# split by eq. 10's two conditions with low confidence $\pi(y) < 0.5$:

# %%
D = output_overlap(b.probs, b.tokens)
low = b.probs_taken < 0.5
both_low = low[:, None] & low[None, :]
pairs = movable[:, None] & movable[None, :] & ~torch.eye(N, dtype=torch.bool)
classes = {
    "same token, both low confidence": same_tok & both_low,
    "same token, not both low": same_tok & ~both_low,
    "different tokens": ~same_tok,
}
fig = go.Figure()
for name, sel in classes.items():
    d = D[sel & pairs]
    print(f"{name:32} {int(d.numel()):6d} pairs   mean D = {float(d.mean()):+.3f}")
    lo, q1, med, q3, hi = torch.quantile(d, torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0], dtype=f64)).tolist()
    fig.add_box(x=[name], q1=[q1], median=[med], q3=[q3], lowerfence=[lo], upperfence=[hi], name=name)
fig.update_layout(
    title="Output overlap D_jk by pair class (eq. 8, 10)", yaxis_title="D_jk", showlegend=False, height=360
)
fig.show()

# %% [markdown]
# Same-token pairs have a large positive overlap, largest when both are unsure. Different tokens
# overlap little *on average*, but two caveats of the toy are visible in the spread: tokens at
# different positions can never be each other's alternatives ($D = 0$ exactly), while synonyms at one
# position share a 3-token softmax, so $\pi_j(y_k)$ is not small and their $D$ is clearly negative (an
# LM's vocabulary has $10^5$ tokens).
#
# How much of the coupling each class carries: `coupling_mass(kernel, coef, tokens, probs_taken)`
# sums the sizes $|c_k K_{jk}|$ of token $k$'s contributions to token $j$ over the ordered pairs
# $j \ne k$ of a class. The same call with a kernel and coefficients of ones gives each class's share
# of the *pairs*, for comparison (forced tokens left out: their gradient is 0).

# %%
mv = movable
args = (b.tokens[mv], b.probs_taken[mv])
ones = torch.ones(int(mv.sum()), dtype=f64)
mass = {
    "share of pairs": coupling_mass(torch.ones(len(ones), len(ones), dtype=f64), ones, *args),
    "full kernel": coupling_mass(k_full[mv][:, mv], b.coef[mv], *args),
    "proxy (eq. 7)": coupling_mass(k_proxy[mv][:, mv], b.coef[mv], *args),
}
keys = ("same_token", "both_low_confidence", "same_token_low_confidence")
print(f"{'':16}" + "".join(f"{k:>28}" for k in keys))
for name, cm in mass.items():
    print(f"{name:16}" + "".join(f"{cm[k]:28.0%}" for k in keys))

# %% [markdown]
# A few per cent of the pairs (same token) carry about half of the proxy's coupling, and the pairs
# that meet both conditions are the densest class. Low confidence alone concentrates little: "both
# low" pairs carry about their share of the pairs, since eq. 10's low-confidence condition matters
# only together with the same token. The full kernel is less concentrated: its paths through the
# embeddings and the hidden layer couple tokens whatever their identity.
#
# ## 4. The group update: norm and filter (eq. 11–13)
#
# Sec. 3.1 moves from tokens to the $G$ rollouts of one query. With response-level scores
# $g_i = \nabla_\theta\log\pi(y_i) = \sum_t \nabla_\theta\log\pi(y_{i,t})$ and group-normalised advantages
# ($\sum_i A_i = 0$), the update $\sum_i A_i g_i$ has (eq. 11)
#
# $$\Big\lVert\sum_i A_i g_i\Big\rVert^2 = \underbrace{\sum_i A_i^2\lVert g_i\rVert^2}_{\text{self}}
#   + \underbrace{\sum_{i\ne k} A_i A_k \langle g_i, g_k\rangle}_{\text{cross}} ,$$
#
# and if every pair overlapped by the same $\kappa > 0$, cross $= \kappa\big((\sum_i A_i)^2 - \sum_i A_i^2\big)
# = -\kappa\sum_i A_i^2$ (eq. 12): overlap shrinks the update. `update_norm_split(response_scores,
# advantages)` computes the two terms; `per_token_scores` gives the $g_i$ when its log-probs are whole
# completions':

# %%
resp_scores = per_token_scores(lambda: net.token_logp(b.params, b.idx).sum(-1), b.params)  # (B, P)
unit = torch.nn.functional.normalize(resp_scores, dim=1)
for q in range(4):
    sel = b.group == q
    split = update_norm_split(resp_scores[sel], b.advantages[sel])
    cos = (unit[sel] @ unit[sel].T)[~torch.eye(8, dtype=torch.bool)]
    print(
        f"group {q}: self {float(split.self):6.1f}  cross {float(split.cross):+7.1f}  "
        f"‖Σ A g‖² / self = {float((split.self + split.cross) / split.self):.2f}   "
        f"mean cos(g_i, g_k) = {float(cos.mean()):+.3f}"
    )

# %% [markdown]
# On this net the rollouts' score directions are nearly orthogonal and the cross term takes either
# sign. That is what on-policy sampling gives on average: $\mathbb E_{y\sim\pi}[g] = \nabla_\theta \sum_y \pi_\theta(y) = 0$,
# so two independent rollouts of one query have $\mathbb E\langle g_i, g_k\rangle = \lVert\mathbb E\,g\rVert^2 = 0$.
# Shared tokens overlap positively, but the alternatives sampled in their place overlap negatively
# (section 3's $D < 0$) and the two balance. Eq. 12's constant $\kappa > 0$ is an idealisation this toy
# does not show.
#
# The filter of eq. 13 needs no such assumption. Let $a_i$ be how strongly rollout $i$ loads on some
# direction $u$. Then the update's signal along it is
#
# $$\sum_i A_i a_i = G\cdot\operatorname{Cov}(A, a) \qquad (\text{since } \textstyle\sum_i A_i = 0):$$
#
# a direction that positive and negative rollouts load equally cancels, one enriched in
# high-advantage rollouts survives. `surviving_signal(advantages, projections)` is the left side. With
# $a_i$ the number of times token string $v$ occurs in rollout $i$, summed over the four groups, for
# GRPO and for a "positive-only" update that keeps only the $A > 0$ rollouts (the paper's Sec. 3.2
# probe):

# %%
tok_ids = net.token_ids(b.idx)  # (B, T) global token ids, −1 on padding
pos_only = b.advantages * (b.advantages > 0)
signal = {"GRPO": [], "positive only": []}
strings = [v for v, name in enumerate(net.vocab) if name != "<eos>"]
for v in strings:
    a = (tok_ids == v).sum(1).to(f64)
    for name, adv in (("GRPO", b.advantages), ("positive only", pos_only)):
        signal[name].append(
            sum(float(surviving_signal(adv[b.group == q], a[b.group == q])) for q in range(4))
        )
g0 = b.group == 0
a0 = (tok_ids == net.vocab.index("correct")).sum(1).to(f64)[g0]
cov = torch.cov(torch.stack([b.advantages[g0], a0]), correction=0)[0, 1]
print(f"eq. 13 on group 0, token 'correct': Σ A_i a_i = {float(surviving_signal(b.advantages[g0], a0)):.4f}, "
      f"G·Cov(A, a) = {8 * float(cov):.4f}")  # fmt: skip
fig = go.Figure()
for name, vals in signal.items():
    fig.add_bar(x=[net.vocab[v] for v in strings], y=vals, name=name)
fig.update_layout(
    title="Signal Σ_i A_i a_i along each token's presence (four groups)",
    yaxis_title="Σ A_i a_i",
    barmode="group",
    height=360,
)
fig.show()

# %% [markdown]
# The template synonyms occur in positive and negative rollouts alike: GRPO's signal on them is small
# and of either sign, while the positive-only update pushes up every one that a positive rollout
# contains. `correct`, which only
# positive rollouts contain, keeps its full signal, and the wrong answers are pushed down. This is
# the paper's "advantage-weighted filter", and the counterpart, on these directions, of tutorial 6's
# shared-token residual.
#
# ## 5. Table 1: the Masking Effect
#
# Sec. 2 tests the coupling structure causally. For a candidate token $j$ and a token set $M_j$
# ($j \notin M_j$), the **Masking Effect** is
#
# $$\mathrm{ME}_j = \log\pi_{\theta'}(y_j) - \log\pi_{\theta'_{-M_j}}(y_j),$$
#
# where $\theta'_{-M_j}$ is the same SGD step with the tokens of $M_j$ removed from the loss (their
# coefficients set to 0). $\mathrm{ME}_j > 0$: the masked tokens boosted $j$. To first order, eq. 5
# gives $\mathrm{ME}_j$ from the kernel too (Exercise 9.2 asks how). Table 1 reports the **Boost Rate** (the
# fraction of candidates with $\mathrm{ME}_j > 0$) and the **Mean Boost** for four sets: random tokens,
# the same token, low-confidence tokens, and tokens meeting both conditions, once for a step on the
# unembedding alone ("LM-head") and once on all parameters ("Full").
#
# `instruments.coupling.measure(batch)` builds the four sets of every candidate (`mask_sets`) and
# computes the exact ME by one masked step per candidate (`masking_effect` with `sgd_step`) and the
# first-order ME from the kernel; `summarise(m, update=...)` turns them into the table. The paper's text
# leaves the conventions open (its low-confidence threshold, its learning rate, whether a mask takes
# tokens of both advantage signs, which tokens are candidates, how a random mask is sized); each is a
# parameter of `instruments.coupling.table1`, whose docstring gives the defaults and why. Defaults
# here: lr = 1, low confidence $\pi < 0.5$, masks of either sign, the random mask as large as the
# "both" mask, candidates the tokens whose "both" set is non-empty.

# %%
m = measure(b)  # both updates, default conventions
tables = {u: summarise(m, update=u) for u in ("full", "head")}
for u, label in (("head", "LM-head"), ("full", "Full")):
    display(Markdown(f"**{label}** (rates in %; `paper_br`: Table 1's Boost Rate)"))
    display(Markdown(format_table(table_rows(tables[u]))))

# %% [markdown]
# On this net the four Boost Rates of the Full update are all near 50 %, far from the paper's 66 / 75 %
# for the same-token and "both" masks (its Full column). One reason is visible in section 4: with masks of either sign, a
# same-token mask holds occurrences from positive **and** negative rollouts, whose pushes on the
# candidate cancel. (Under the LM-head update a random mask often holds only tokens of other
# positions, whose $W_\text{out}$ rows the candidate's softmax does not use: ME = 0 exactly, counted
# as not boosted; `tie_rate` shows how often.) A second reading restricts every mask to the candidate's
# advantage sign (`same_sign=True`) and counts a boost in the direction of the candidate's own
# advantage (`orient_by_sign=True`, i.e. $\mathrm{ME}_j\cdot\operatorname{sign}(A_j) > 0$):

# %%
m_sign = measure(b, same_sign=True)
oriented = {u: summarise(m_sign, update=u, orient_by_sign=True) for u in ("full", "head")}
fig = go.Figure()
bars = {
    "paper, LM-head": PAPER_BOOST_RATE["head"],
    "paper, Full": PAPER_BOOST_RATE["full"],
    "net, Full, either sign": {s: tables["full"]["sets"][s]["boost_rate"] for s in MASK_SETS},
    "net, Full, same sign, oriented": {s: oriented["full"]["sets"][s]["boost_rate"] for s in MASK_SETS},
    "net, LM-head, same sign, oriented": {s: oriented["head"]["sets"][s]["boost_rate"] for s in MASK_SETS},
}
for name, rates in bars.items():
    fig.add_bar(x=list(MASK_SETS), y=[100 * rates[s] for s in MASK_SETS], name=name)
    print(f"{name:34}" + "".join(f"{s:>16} {100 * rates[s]:5.1f}" for s in MASK_SETS))
fig.add_hline(y=50, line_dash="dot", line_color="grey")
fig.update_layout(title="Boost Rate by masked set", yaxis_title="Boost Rate (%)", barmode="group", height=380)
fig.show()

# %% [markdown]
# Honest reading:
#
# * **The coupling structure is real on the net.** The first-order ME agrees with the exact one
#   (`first_order_gap_pp` in the tables is a few points at most), the proxy predicts most directions,
#   and same-token pairs carry a share of the coupling far above their share of the pairs.
# * **Table 1's rates depend on conventions the paper does not state.** With masks of either sign the
#   structured rows sit near 50 %; with masks of the candidate's own sign the "both" row rises to
#   within a few points of the paper's under the Full update and stays further below it under
#   LM-head (the printed rows), while the "same token" row overshoots the paper's and the random rows
#   fall below 50 % (under LM-head mostly through ties). No reading on this one batch reproduces all
#   four rows, and a small tanh net on a template toy is not the paper's LM: read the rates as a map
#   of the choices, not as a replication.
# * `python -m experiments.coupling` (CPU, under a minute) prints this default table, the whole grid of
#   conventions (candidates, mask sign, orientation, update) over seeds 0–2 ranked by distance to the
#   paper's column, and the closest reading (then Sec. 3's value-gap tables, which this tutorial does
#   not cover).
#
# ## 6. Low-probability tokens through shared weights (the Lopti paper)
#
# Tutorial 7's Lopti paper ("Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs", arXiv
# 2505.12929) argues that the score of a low-probability token is large (at the logits,
# $\sqrt{V/(V-1)}\,(1-\pi) \le \lVert\nabla_z\log\pi\rVert \le \sqrt2\,(1-\pi)$ for a softmax over $V$
# tokens), so these tokens
# dominate the update and, **through the parameters all tokens share**, move the high-probability
# tokens too. The tabular toy can show only the first half: its kernel is 0 between contexts
# (section 1). On the net, first each movable token's $\lVert g_j\rVert^2 = K_{jj}$, the diagonal of
# section 1's kernel, and of the proxy (its $W_\text{out}$ part, $\lVert h_j\rVert^2 D_{jj}$), by bins of
# $\pi_j(y_j)$:

# %%
rows = []
for lo, hi in ((0.0, 0.25), (0.25, 0.5), (0.5, 0.75)):
    sel = movable & (b.probs_taken >= lo) & (b.probs_taken < hi)
    rows.append({
        "π_j(y_j)": f"[{lo}, {hi})",
        "tokens": int(sel.sum()),
        "mean K_jj (full)": torch.diagonal(k_full)[sel].mean(),
        "mean K_jj (proxy, W_out)": torch.diagonal(k_proxy)[sel].mean(),
        "mean D_jj = ‖e_y − π_j‖²": torch.diagonal(D)[sel].mean(),
        "mean (1 − π_j)²": ((1 - b.probs_taken[sel]) ** 2).mean(),
    })  # fmt: skip
table(rows, digits=3)
print(f"largest π_j(y_j) of a movable token: {float(b.probs_taken[movable].max()):.2f}")

# %% [markdown]
# Now eq. 5's first-order $\Delta_j$ of every **high**-probability token ($\pi \ge 0.5$, Lopti's η with
# AR) split by where its push comes from: `first_order_delta(k_full, c·1[low])` is what the low tokens
# ($\pi < 0.5$) alone do (all coupling), the same with `c·1[high]` what the high ones do (their
# self-terms included), and with the kernel zeroed inside each context the low tokens' push **across
# contexts**, which the tabular kernel sets to 0. Then the same after Advantage Reweighting
# (`reweight_advantages`, then `coefficients` as `sample_batch` takes them) at Lopti's α = 0.2, and at
# the extreme α = 1:

# %%
logp_bt = net.token_logp(b.params, b.idx).detach()  # (B, T): the old log-probs (on-policy)
low_set, high_set = movable & (b.probs_taken < 0.5), movable & (b.probs_taken >= 0.5)
sources = {"low": (k_full, low_set), "high": (k_full, high_set), "across": (k_full * other_ctx, low_set)}
rows = []
for name, alpha in (("GRPO", None), ("GRPO + AR (α = 0.2)", 0.2), ("GRPO + AR (α = 1)", 1.0)):
    coef = b.coef
    if alpha is not None:
        adv_ar = reweight_advantages(b.advantages, logp_bt, alpha)
        coef = coefficients("grpo", logp_bt, logp_bt, adv_ar, b.mask, b.group, with_metrics=False).coef[valid]
    push = {  # Σ over the high tokens of |first-order Δ log π| (lr = 1) caused by each source
        src: first_order_delta(kernel, coef * sel, 1.0).total[high_set].abs().sum()
        for src, (kernel, sel) in sources.items()
    }
    rows.append({
        "coefficients": name,
        "low share of Σ|c|": coef[low_set].abs().sum() / coef[movable].abs().sum(),
        "high tokens' Σ|Δ| from low": push["low"] / (push["low"] + push["high"]),
        "… across contexts": push["across"] / (push["low"] + push["high"]),
    })  # fmt: skip
print(f"{int(low_set.sum())} low and {int(high_set.sum())} high movable tokens")
table(rows, digits=2)

# %% [markdown]
# The score grows as π falls: mean $K_{jj}$ 9.51 below π = 0.25, 5.63 in [0.25, 0.5), 2.95 in
# [0.5, 0.75) (no movable token is above 0.69: a random net's 3-way softmaxes are flat), and its
# $W_\text{out}$ part follows $D_{jj}$, 1.5–2 times $(1-\pi)^2$ as the bound says for 3 tokens. On the 65
# high tokens, the 127 low ones cause 63 % of the first-order push (26 % through other contexts, the
# part only shared weights can carry); but that is about their 68 % share of $\sum|c|$, so on this batch
# they dominate by number, not beyond it, and Advantage Reweighting at α = 0.2 lowers it only to 62 %
# (46 % even at α = 1). One 224-token batch of a small random net says nothing about an LM's long
# tail, and Lopti's two-stage update (`cancellation.update.Schedule(lopti_eta=...)`) is no
# coefficient transform: with plain SGD its stages sum to the same step to first order, so this split
# cannot show it.
#
# ## Exercises
#
# Write the body of each `my_*` function (until you do, it raises `NotImplementedError`), run its
# cell, then run the check cell below it: it prints ✓ or says what is missing or wrong. A worked
# solution is in `tutorials/solutions/09_token_coupling.py`; try first. Each check works a small case
# by hand, then compares your function with its own computation on 20 random batches (a new seed each
# run; a failure prints it), built as Gram matrices of random score vectors, with forced tokens
# ($g_j = 0$), tokens with $c_j = 0$ and repeated tokens among them. An answer that calls the
# project's library (`first_order_delta`, `sgd_step`, ...) or reads the notebook's variables is
# refused: everything comes in as arguments.


# %%
def coupling_case(gen: torch.Generator) -> tuple[tuple, str]:
    """A random batch for the checks: ((K, c), what it holds); K = G Gᵀ of N random score vectors G."""
    kind = ("a pair", "forced tokens", "c = 0 rows", "repeated tokens", "one sign of c")[
        gen.initial_seed() % 5
    ]
    n = 2 if kind == "a pair" else int(torch.randint(3, 9, (1,), generator=gen))
    g = torch.randn(n, int(torch.randint(2, 6, (1,), generator=gen)), generator=gen, dtype=f64)
    c = torch.randn(n, generator=gen, dtype=f64) / n
    if kind == "forced tokens":
        forced = torch.randperm(n, generator=gen)[: n // 2]
        g[forced], c[forced[0]] = 0.0, 0.0  # one of them also with c = 0
    if kind == "c = 0 rows":
        c[torch.randperm(n, generator=gen)[: n // 2]] = 0.0
    if kind == "repeated tokens":
        g[1:] = g[torch.randint(0, 2, (n - 1,), generator=gen)]  # copies of the first two tokens' scores
    if kind == "one sign of c":
        c = c.abs()
    return (g @ g.T, c), f"{kind}, N = {n}"


# %% [markdown]
# **Exercise 9.1 — predict the flips.** Without taking a step, say which tokens one small SGD step
# (any lr > 0) moves **against their own advantage**: write `my_predicted_flips(kernel, coef)`
# returning an $(N,)$ bool tensor, True for token $j$ when eq. 5's first-order $\Delta_j$ has the
# opposite sign to $c_j$ (the sign of its advantage). A token with $c_j = 0$ has no direction of its
# own, and a token whose $\Delta_j$ is exactly 0 did not move: neither has flipped. Section 2's figure
# counted these tokens after the actual step.


# %%
def my_predicted_flips(kernel: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """(N,) bool: the first-order Δ log π of token j has the opposite sign to c_j (c_j ≠ 0, Δ_j ≠ 0)."""
    raise NotImplementedError("Exercise 9.1: replace this line with your code")


# %%
with check("9.1"):
    forbid(my_predicted_flips, ("backward", "autograd", "getattr"), why="predict from K and c")
    ex_k = torch.tensor([[1.0, 0.8, 0.0, 0.5, 0.0], [0.8, 1.0, 0.1, 0.0, 0.0], [0.0, 0.1, 0.5, 0.0, 0.0],
                         [0.5, 0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]], dtype=f64)  # fmt: skip
    ex_c = torch.tensor([0.1, -0.3, 0.2, 0.0, 0.4], dtype=f64)  # token 3: c = 0; token 4: forced (K row 0)
    got = my_predicted_flips(ex_k, ex_c)  # Δ/lr = (−0.14, −0.2, 0.07, 0.05, 0): only token 0 flips
    what = "the flips of 5 tokens with Δ/lr = (−0.14, −0.2, 0.07, 0.05, 0), c = (0.1, −0.3, 0.2, 0, 0.4)"
    ensure(isinstance(got, torch.Tensor) and got.dtype == torch.bool, f"expected a bool tensor, got {got!r}", "wrong type")  # fmt: skip
    reject(got.double(), torch.zeros(5), f"{what}: no flip predicted; the self-term alone never flips a token, the others' terms do")  # fmt: skip
    reject(got.double(), torch.tensor([1.0, 1, 1, 0, 0]), f"{what}: token 1 moves with its advantage (Δ < 0, c < 0): Δ_j includes the self-term c_j·K_jj")  # fmt: skip
    reject(got.double(), torch.tensor([1.0, 0, 0, 1, 1]), f"{what}: tokens 3 (c = 0) and 4 (Δ = 0, forced) have not flipped")  # fmt: skip
    expect_equal(got.tolist(), [True, False, False, False, False], what)

    def reference(k, c):  # Δ_j = Σ_k c_k K_jk (lr > 0 does not change a sign), against the sign of c_j
        c = c.tolist()
        delta = [sum(c[m] * float(k[j, m]) for m in range(len(c))) for j in range(len(c))]
        return [c[j] != 0 and d != 0 and (d > 0) != (c[j] > 0) for j, d in enumerate(delta)]

    def compare(got, expected, what, at):
        expect_equal([bool(x) for x in got], expected, what, at=at)

    expect_cases(my_predicted_flips, reference, coupling_case, "the predicted flips", compare=compare)


# %%
def masking_case(gen: torch.Generator) -> tuple[tuple, str]:
    """A random batch (`coupling_case`), a step size and a random mask M_j per token (empty, full or random)."""
    (k, c), label = coupling_case(gen)
    n = len(c)
    masked = torch.rand(n, n, generator=gen) < float(torch.rand(1, generator=gen))
    masked[0], masked[-1] = False, True  # an empty mask and one of every other token
    masked.fill_diagonal_(False)
    lr = float(0.1 + 2 * torch.rand(1, generator=gen))
    return (k, c, lr, masked), f"{label}, lr = {lr:.3g}, masks of sizes {masked.sum(1).tolist()}"


# %% [markdown]
# **Exercise 9.2 — the Masking Effect to first order.** Section 5 defines
# $\mathrm{ME}_j = \log\pi_{\theta'}(y_j) - \log\pi_{\theta'_{-M_j}}(y_j)$: the SGD step with every
# token minus the same step with the tokens of $M_j$ removed from the loss. Write
# `my_masking_effect(kernel, coef, lr, masked)` returning the $(N,)$ first-order $\mathrm{ME}_j$ of
# every token from eq. 5, where `masked` is an $(N, N)$ bool tensor whose **row** $j$ marks $M_j$
# (never $j$ itself). Work it out from the two steps' first-order $\Delta_j$. An empty $M_j$ has
# $\mathrm{ME}_j = 0$.


# %%
def my_masking_effect(
    kernel: torch.Tensor, coef: torch.Tensor, lr: float, masked: torch.Tensor
) -> torch.Tensor:
    """(N,) first-order ME_j = Δ_j(all tokens) − Δ_j(the tokens of M_j removed), M_j = row j of `masked`."""
    raise NotImplementedError("Exercise 9.2: replace this line with your code")


# %%
with check("9.2"):
    forbid(my_masking_effect, ("backward", "autograd", "getattr"), why="write it from eq. 5")
    ex_k = torch.tensor([[1.0, 0.8, 0.0], [0.8, 1.0, 0.1], [0.0, 0.1, 0.5]], dtype=f64)
    ex_c = torch.tensor([0.1, -0.3, 0.2], dtype=f64)
    ex_m = torch.tensor([[False, True, False], [True, False, True], [False, False, False]])
    got = my_masking_effect(ex_k, ex_c, 0.5, ex_m)  # M_0 = {1}, M_1 = {0, 2}, M_2 = {}
    # ME_0 = 0.5·(−0.3·0.8) = −0.12, ME_1 = 0.5·(0.1·0.8 + 0.2·0.1) = 0.05, ME_2 = 0
    what = "ME of 3 tokens (lr = 0.5, M_0 = {1}, M_1 = {0, 2}, M_2 = {})"
    reject(got, torch.tensor([0.12, -0.05, 0.0]), f"{what}: the opposite sign; ME is the full step minus the masked one")  # fmt: skip
    reject(got, torch.tensor([0.0, 0.0, -0.015]), f"{what}: you summed over the tokens left in the loss; the masked ones are what the two steps differ by")  # fmt: skip
    reject(got, torch.tensor([-0.12, 0.04, -0.015]), f"{what}: you read M_j from column j of `masked`; it is row j")  # fmt: skip
    reject(got, torch.tensor([-0.24, 0.1, 0.0]), f"{what}: the step size lr is missing")
    expect_close(got, torch.tensor([-0.12, 0.05, 0.0], dtype=f64), what)

    def reference(k, c, lr, masked):  # Δ_j of the full step minus Δ_j of the step without M_j, plain loops
        n = len(c)
        delta = lambda j, keep: lr * sum(float(c[m] * k[j, m]) for m in range(n) if keep[m])  # noqa: E731
        return torch.tensor([delta(j, [True] * n) - delta(j, [not x for x in masked[j].tolist()]) for j in range(n)], dtype=f64)  # fmt: skip

    expect_cases(
        my_masking_effect, reference, masking_case, "the first-order Masking Effect", atol=1e-12, rtol=1e-9
    )
