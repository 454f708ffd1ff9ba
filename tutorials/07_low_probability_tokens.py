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
# # 7 · Low-probability tokens
#
# The previous tutorials asked whether the coefficients of shared tokens cancel. This one looks at
# the other factor of every token's update, its score $\nabla\log\pi$, whose **size** depends on the
# token's probability. "Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs" (arXiv
# 2505.12929; "the Lopti paper" below and in docs/papers.md) shows that in a softmax the gradient of a
# token is roughly proportional to $1 - \pi$, so rare tokens get long levers, and proposes two fixes:
# **Advantage Reweighting** and **Lopti**. All three pieces are in `cancellation`; the toy lets us
# look at them exactly.

# %%
import math
import statistics

import plotly.graph_objects as go
import plotly.io as pio
import torch
from exercise_check import check, expect_cases, expect_close, forbid, number, reject  # the exercises' checks
from show import report_rows, table  # tables, and quotes of experiments/REPORT.md

from cancellation import group_advantages, reweight_advantages
from cancellation.batching import lopti_masks
from cancellation.diagnostics import (
    softmax_grad_norm,
    softmax_grad_norm_bounds,
    steps_to_threshold,
    token_coefficients,
)
from plots import ARM_COLORS, PALETTE  # one colour per arm (as in every tutorial); the palette
from toymodel import get_scenario, simulate

pio.renderers.default = "plotly_mimetype+notebook_connected"
torch.set_num_threads(1)  # the toy's tensors are tiny: one thread is fastest
torch.set_printoptions(precision=3, sci_mode=False)
f64 = torch.float64

# %% [markdown]
# ## 1. The $(1-\pi)$ bound (Lopti paper §3.1)
#
# For logits $z$ and $\pi = \operatorname{softmax}(z)$, $\nabla_z\log\pi_y = e_y - \pi$, so
# $\lVert\nabla_z\log\pi_y\rVert^2 = (1-\pi_y)^2 + \sum_{k\ne y}\pi_k^2$, and with $N$ tokens
#
# $$\sqrt{\tfrac{N}{N-1}}\,(1-\pi_y) \;\le\; \lVert\nabla_z\log\pi_y\rVert \;\le\; \sqrt2\,(1-\pi_y).$$
#
# `softmax_grad_norm(probs, tokens)` is the left-hand norm, `softmax_grad_norm_bounds(pi, N)` the two
# bounds. A cloud of random 5-token distributions and tokens:

# %%
gen = torch.Generator().manual_seed(0)
N = 5
probs = torch.softmax(2.0 * torch.randn(400, N, generator=gen, dtype=f64), dim=-1)
tokens = torch.randint(0, N, (400,), generator=gen)
norms = softmax_grad_norm(probs, tokens)
pi_y = probs.gather(-1, tokens[:, None]).squeeze(-1)
grid = torch.linspace(0, 1, 101, dtype=f64)
lower, upper = softmax_grad_norm_bounds(grid, N)
fig = go.Figure()
fig.add_scatter(x=pi_y.tolist(), y=norms.tolist(), mode="markers", name="‖e_y − π‖ (random π, y)",
                marker={"size": 4, "color": PALETTE[4]})  # fmt: skip
fig.add_scatter(
    x=grid.tolist(), y=lower.tolist(), mode="lines", name="√(N/(N−1))·(1 − π)", line_color=PALETTE[5]
)
fig.add_scatter(x=grid.tolist(), y=upper.tolist(), mode="lines", name="√2·(1 − π)", line_color=PALETTE[6])
fig.update_layout(
    title="Gradient of log π_y w.r.t. the logits, N = 5", xaxis_title="π_y", yaxis_title="norm", height=380
)
fig.show()
low_b, up_b = softmax_grad_norm_bounds(pi_y, N)
print("every point inside the bounds:", bool(((norms >= low_b - 1e-12) & (norms <= up_b + 1e-12)).all()))

# %% [markdown]
# A token the model already believes ($\pi \to 1$) gets a tiny gradient, whatever its advantage; an
# unlikely one gets a gradient of length about 1. In a language model the logit gradient is then
# pushed through the network's Jacobians, which the paper assumes well-conditioned, so the same
# $(1-\pi)$ factor survives at every layer (Lopti paper §3.3). The tabular toy has no layers: each context
# is its own softmax, and the bound is the whole story.
#
# ## 2. Who moves the update on the toy
#
# `template_task` with four groups of 8. The template synonyms start at 0.7 / 0.2 / 0.1, the
# deciding token at 0.3 / 0.35 / 0.35. Each token's contribution to the update is its coefficient
# times its score, with norm $|c_{i,t}|\cdot\lVert e_{a} - \pi(\cdot\mid h)\rVert$ (autograd agrees, see
# Exercise 7.1 for a whole completion). We split the tokens with Lopti's threshold $\eta = 0.5$ (`lopti_masks`) into low-
# and high-probability ones and add up their contributions:

# %%
sc = get_scenario("template_task")
policy = sc.policy()
theta = sc.initial_logits()
idx = policy.sample(32, theta, generator=torch.Generator().manual_seed(0))
group = torch.arange(4).repeat_interleave(8)
adv = group_advantages(policy.rewards[idx], group)
mask = policy.mask[idx]
old_logp = policy.token_logp(theta, idx)
ctx, act = policy.ctx[idx], policy.act[idx]
score_norm = softmax_grad_norm(policy.probs_table(theta)[ctx], act) * mask  # (B, T) ‖e_a − π(·|h)‖
low, high = lopti_masks(old_logp, mask, eta=0.5)
print(
    f"tokens: {int(low.sum())} with π_old < 0.5, {int(high.sum())} with π_old ≥ 0.5 (incl. 32 forced <eos>)"
)

# %% [markdown]
# A token's share of the update is $|c_{i,t}|\cdot\lVert e_a - \pi\rVert$ over the batch's sum:


# %%
def update_share(advantages: torch.Tensor) -> tuple[float, float]:
    """Share of Σ |c|·‖e − π‖ (the update's token contributions) from the low / high tokens."""
    coef = token_coefficients("grpo", old_logp, old_logp, advantages, mask, group)
    contrib = coef.abs() * score_norm
    total = float(contrib.sum())
    return float(contrib[low].sum()) / total, float(contrib[high].sum()) / total


share_grpo = update_share(adv)
print(
    f"GRPO: low-probability tokens carry {share_grpo[0]:.0%} of the update, "
    f"high-probability {share_grpo[1]:.0%}"
)

# %% [markdown]
# Fewer than half of the tokens carry most of the update. Note that the $(1-\pi)$ factor is not
# the only reason: a low-probability token here is often the deciding token, whose completions
# carry the largest $|\hat A|$.
#
# ## 3. Advantage Reweighting
#
# AR scales each token's advantage by its old probability (Lopti paper §4.1, eq. 4):
#
# $$\hat A_{i,t} \leftarrow \big[\alpha\,\pi_{\theta_\text{old}}(o_{i,t}) + (1-\alpha)\big]\,\hat A_{i,t},
#   \qquad \alpha\in[0,1],$$
#
# so a token with $\pi \approx 0$ keeps $(1-\alpha)$ of its advantage and one with $\pi \approx 1$ all of
# it; the product with the $(1-\pi)$ lever becomes flatter in $\pi$. `reweight_advantages(adv,
# old_logp, alpha)` returns the $(B, T)$ per-token advantages (Lopti's code: α = 0.2 alone).

# %%
adv_ar = reweight_advantages(adv, old_logp, alpha=0.2)
share_ar = update_share(adv_ar)
print(f"GRPO + AR(α=0.2): low {share_ar[0]:.0%}, high {share_ar[1]:.0%}   (GRPO: low {share_grpo[0]:.0%})")

coef_grpo = token_coefficients("grpo", old_logp, old_logp, adv, mask, group)
coef_ar = token_coefficients("grpo", old_logp, old_logp, adv_ar, mask, group)
pi_old = old_logp.exp()[mask.bool()]
fig = go.Figure()
for name, coef in (("GRPO", coef_grpo), ("GRPO + AR (α=0.2)", coef_ar)):
    per_token = (coef.abs() * score_norm)[mask.bool()] / coef_grpo.abs()[mask.bool()]  # every Â ≠ 0 here
    fig.add_scatter(
        x=pi_old.tolist(), y=per_token.tolist(), mode="markers", name=name, marker_color=ARM_COLORS[name]
    )
fig.update_layout(
    title="Update contribution per unit |Â|, by the token's old probability",
    xaxis_title="π_old(token)",
    yaxis_title="|c|·‖e − π‖ / |c_GRPO|",
    height=360,
)
fig.show()

# %% [markdown]
# The AR factor depends only on the token's own old probability, so every occurrence of one
# (context, token) event gets the same factor: **AR does not break the cancellation of whole-group
# events** ($\sum_i f\hat A_i = f\sum_i\hat A_i = 0$). It changes how the non-shared tokens are weighted
# against each other.
#
# ## 4. Lopti: update the low-probability tokens first
#
# Lopti (Lopti paper §4.2) splits the tokens at $\eta$ and runs two updates per step: first with the
# advantages of the high-probability tokens zeroed (only $\pi_\text{old} < \eta$ tokens speak), then,
# on the updated model, with the low-probability tokens zeroed, reusing the same old log-probs (so
# the second stage's ratios include the first stage's drift). The high-probability tokens thus get
# an update in which the rare tokens cannot drown them. `lopti_masks` gives the two sets, and
# `simulate(..., lopti_eta=η)` runs the two stages:

# %%
stage1 = adv[:, None] * low  # per-token advantages of stage 1: only π_old < η
stage2 = adv[:, None] * high  # stage 2: only π_old ≥ η
print("stage 1 tokens:", int((stage1 != 0).sum()), "  stage 2 tokens:", int((stage2 != 0).sum()))
print("together they are GRPO's advantages:", torch.equal(stage1 + stage2, adv[:, None] * mask))

# %% [markdown]
# ## 5. In training, and what the toy can and cannot show
#
# Six seeds of 100 steps on `template_task` (G = 8, 4 inner epochs, SGD lr 0.5), with the defaults
# of Lopti's public code: AR α = 0.2 alone, Lopti η = 0.4 alone, α = 0.3 with η = 0.5 together.

# %%
variants = {
    "GRPO": {},
    "GRPO + AR (α=0.2)": {"ar_alpha": 0.2},
    "GRPO + Lopti (η=0.4)": {"lopti_eta": 0.4},
    "GRPO + AR + Lopti": {"ar_alpha": 0.3, "lopti_eta": 0.5},
}
runs = {
    name: [simulate(sc, "grpo", steps=100, seed=seed, **params) for seed in range(6)]
    for name, params in variants.items()
}


# %%
def mean_std(per_seed: list[float]) -> str:
    """'mean ± sample std' over the seeds."""
    return f"{statistics.mean(per_seed):.3f} ± {statistics.stdev(per_seed):.3f}"


def hit(rows: list[dict]) -> float:
    """The first step with E[R] ≥ 0.9 (every seed here gets there)."""
    return steps_to_threshold([r["expected_reward"] for r in rows], 0.9, [r["step"] for r in rows])


table(
    [
        {"variant": name, "E[R] final": mean_std([rows[-1]["expected_reward"] for rows in rs]),
         "steps→0.9": mean_std([hit(rows) for rows in rs]),
         "template KL final": mean_std([rows[-1]["template_kl"] for rows in rs]),
         "group-shared res.": statistics.mean(r["group_shared_residual"] for rows in rs for r in rows
                                              if r["group_shared_residual"] >= 0)}
        for name, rs in runs.items()
    ]
)  # fmt: skip

# %% [markdown]
# Six seeds give a first look; `experiments/` ran the same arms on 256 fresh seeds. Its report,
# quoted as written:

# %%
report_rows("toy_low_prob", "Advantage Reweighting")
report_rows("toy_low_prob", "Lopti")

# %% [markdown]
# Honest reading:
#
# * **No benefit shows up on this toy.** In the report AR and AR + Lopti reach the threshold a few
#   steps *later* than GRPO and end marginally lower (contradicted), and Lopti alone is not
#   distinguishable from GRPO (not resolved). AR's advantages are smaller on average, hence its
#   later arrival. All variants keep whole-group events cancelled (the table's last column: 0 up to
#   rounding), as section 3 predicts.
# * **Why the toy cannot show the Lopti paper's effect.** Its argument is that the long levers of rare tokens,
#   propagated through layers **shared by all tokens**, steer the probabilities of the frequent
#   tokens (their §3.4: updating only the lowest-probability quartile reproduces most of the full
#   update). In the tabular toy every context has its own logits, so a rare token can only move the
#   probabilities of its own context's alternatives. What the toy does show exactly is the lever
#   itself (section 1), how much of a batch's update the rare tokens carry (section 2), and what
#   AR and Lopti do to the weights (sections 3–4).

# %% [markdown]
# ## Exercises
#
# Write the body of each `my_*` function (until you do, it raises `NotImplementedError`), run its
# cell, then run the check cell below it: it prints ✓ or says what is missing or wrong. Each check
# first compares with answers worked out by hand (in its comments), then runs your function on 20
# random cases (fresh every run; the seed is printed when one fails, `TUTORIAL_CHECK_SEED=<seed>`
# reruns them) against its own computation. An answer that calls the library or reads the notebook's
# variables is refused: everything it needs comes in as arguments. A worked solution is in
# `tutorials/solutions/07_low_probability_tokens.py`; try first.
#
# **Exercise 7.1 — a whole completion's lever by autograd.** Write
# `my_sequence_score_norm(token_logp, theta, mask)` returning $\lVert\nabla_\theta\log\pi(y)\rVert$, the
# norm of the gradient of one completion's log-probability $\sum_t\log\pi(a_t\mid h_t)$ with respect to
# the whole logit table $\theta$, by autograd: `token_logp(z)` returns the completion's `(T,)` token
# log-probabilities at logits `z` (on the toy, `policy.token_logp(z, idx[i : i + 1])[0]`), and `mask`
# `(T,)` marks its real tokens (what `token_logp` gives at a padding position is no token's). The
# library has no call for it. The check works the toy's completions out by hand: every position of
# the toy is its own context, so the tokens' gradients sit in different rows of $\theta$ and the
# squared norm is the sum of the tokens' $\lVert e_a - \pi\rVert^2$. Its random tables can visit a
# context twice.


# %%
# the check by hand: ‖e_a − π‖² = (1 − π_a)² + Σ_{k≠a} π_k² in the toy's rows at θ: template 0.7 / 0.2 / 0.1,
# deciding token 0.3 / 0.35 / 0.35, forced <eos> 1 (a zero gradient); keyed by the token's π
SQ = {0.7: 0.3**2 + 0.2**2 + 0.1**2, 0.2: 0.8**2 + 0.7**2 + 0.1**2, 0.1: 0.9**2 + 0.7**2 + 0.2**2,
      0.3: 0.7**2 + 0.35**2 + 0.35**2, 0.35: 0.65**2 + 0.3**2 + 0.35**2, 1.0: 0.0}  # fmt: skip


def as_number(got, want, what: str, at: str, atol: float = 1e-12) -> None:
    """The check's comparison of a number (a float, or a one-element tensor of any float dtype)."""
    expect_close(number(got, what), want, what, at=at, atol=atol)


def toy_logp(i: int):
    """Completion i's token log-probabilities as a function of the logits z (the toy's, for the check)."""
    return lambda z: policy.token_logp(z, idx[i : i + 1])[0]


# %%
def case_7_1(gen: torch.Generator):
    """A random tabular policy for the check: (token_logp, θ, mask) and what it holds; the kinds in turn."""
    kind = gen.initial_seed() % 1000 % 4  # expect_cases seeds its case i with seed·1000 + i
    n_ctx, n_act, t_max = (
        int(torch.randint(lo, hi, (1,), generator=gen)) for lo, hi in ((3, 6), (2, 5), (3, 7))
    )
    theta_ = 1.5 * torch.randn(n_ctx, n_act, generator=gen, dtype=f64)
    ctx = torch.randperm(n_ctx, generator=gen).repeat(3)[:t_max]  # one context per position (while they last)
    act = torch.randint(0, n_act, (t_max,), generator=gen)
    mask_ = torch.ones(t_max, dtype=f64)
    if kind == 1:
        ctx = torch.randint(0, 2, (t_max,), generator=gen)
    elif kind == 2:
        mask_[t_max // 2 :] = 0.0
    elif kind == 3:
        theta_[ctx[0], act[0]] += 12.0

    def token_logp(z, ctx=ctx, act=act):  # the case's policy: one softmax row per context
        return torch.log_softmax(z, -1)[ctx, act]

    token_logp.ctx, token_logp.act = ctx, act  # for the check's reference only
    what = ["every token in its own context", "tokens that share a context (their gradients add in one row)",
            "padding after the first half (token_logp still returns a log π there)", "a token with π ≈ 1"][kind]  # fmt: skip
    return (token_logp, theta_, mask_), f"{what}, T = {t_max}, {n_ctx} contexts × {n_act} tokens"


# %%
def my_sequence_score_norm(token_logp, theta: torch.Tensor, mask: torch.Tensor) -> float:
    """‖∇_θ Σ_t mask_t · log π(a_t | h_t)‖ at θ, by autograd through `token_logp`."""
    raise NotImplementedError("Exercise 7.1: replace this line with your code")


# %%
with check("7.1"):
    forbid(my_sequence_score_norm, allow=("backward", "autograd"), why="differentiate with autograd")
    for i in (0, 1, 2, 17, 31):
        pis = [round(p, 2) for p in old_logp[i].exp()[mask[i].bool()].tolist()]
        got = number(my_sequence_score_norm(toy_logp(i), theta.detach().clone(), mask[i].clone()), "the norm")
        want = math.sqrt(sum(SQ[p] for p in pis))
        expect_close(got, want, "‖∇_θ log π(y_i)‖", at=f"for completion {i} (its tokens' π: {pis})")

    def reference(
        token_logp, theta, mask
    ):  # ∇_z log softmax(z)_a = e_a − π in the token's row, added per row
        grad = [[0.0] * theta.shape[1] for _ in range(theta.shape[0])]
        for t in (t for t in range(len(mask)) if mask[t]):
            c, a = int(token_logp.ctx[t]), int(token_logp.act[t])
            z = [math.exp(float(v)) for v in theta[c]]
            for k in range(len(z)):
                grad[c][k] += (k == a) - z[k] / sum(z)
        return math.sqrt(sum(v * v for row in grad for v in row))

    expect_cases(my_sequence_score_norm, reference, case_7_1, "‖∇_θ log π(y)‖", compare=as_number)

# %% [markdown]
# **Exercise 7.2 — where AR puts the longest lever.** Section 1 gave a token's lever, the size of its
# score, as about $(1-\pi)$; Advantage Reweighting (section 3) multiplies its advantage by
# $\alpha\pi_\text{old} + (1-\alpha)$. So at $\theta = \theta_\text{old}$ a token's share of the update,
# per unit $|\hat A|$, is about $f(\pi) = (\alpha\pi + 1 - \alpha)(1 - \pi)$. Write
# `my_lever_peak(alpha)` returning the probability $\pi \in [0, 1]$ at which $f$ is largest, for any
# $\alpha \in [0, 1]$. Then read your answer: up to which α do the rarest tokens still carry the longest
# lever, and is the Lopti paper's α = 0.2 beyond it?


# %%
# the check by hand: f(π) = (1 − α) + (2α − 1)π − απ², a parabola opening down (α > 0) with its top at
# π* = (2α − 1)/(2α): at α = 0.75 that is 1/3, at α = 1 it is 1/2 (f = π(1 − π)); for α ≤ 1/2 the top is at
# π* ≤ 0, so on [0, 1] f only falls and its largest value is at π = 0 (α = 0.2: π* = −1.5).
# Each: (α, the peak, [(what a known slip gives, what it is)])
ex72 = [
    (0.2, 0.0, [(-1.5, "−1.5 is the top of the parabola, outside [0, 1]: on [0, 1] f falls from π = 0 on, so "
                       "its largest value there is at π = 0"),
                (0.5, "0.5 maximises απ(1 − π): AR's factor keeps 1 − α of every advantage")]),
    (0.75, 1 / 3, [(0.5, "0.5 maximises απ(1 − π): AR's factor keeps 1 − α of every advantage"),
                   (1.0, "AR's factor alone grows with π, but the lever (1 − π) falls")]),
    (1.0, 0.5, []),
]  # fmt: skip


def case_7_2(gen: torch.Generator):
    """A random α for the check, and what it is: ≤ 1/2, above, 1/2 itself, near 1, near 0, in turn."""
    u = float(torch.rand(1, generator=gen, dtype=f64))
    alpha = (0.5 * u, 0.5 + 0.5 * u, 0.5, 0.9 + 0.1 * u, 1e-3 * u)[gen.initial_seed() % 1000 % 5]
    return (alpha,), f"α = {alpha:.6g}"


# %%
def my_lever_peak(alpha: float) -> float:
    """The π in [0, 1] that maximises (α·π + 1 − α)·(1 − π)."""
    raise NotImplementedError("Exercise 7.2: replace this line with your answer")


# %%
with check("7.2"):
    forbid(my_lever_peak, why="work out where f is largest")
    for alpha, want, slips in ex72:
        pi = number(my_lever_peak(alpha), "π")
        for bad, message in slips:
            reject(pi, bad, f"the peak at α = {alpha}: {message}")
        expect_close(pi, want, "the peak π", at=f"at α = {alpha}", atol=1e-6)

    def reference(alpha):  # a ternary search of the concave f on [0, 1]
        lo, hi = 0.0, 1.0
        for _ in range(200):
            a, b = lo + (hi - lo) / 3, hi - (hi - lo) / 3
            if (alpha * a + 1 - alpha) * (1 - a) < (alpha * b + 1 - alpha) * (1 - b):
                lo = a
            else:
                hi = b
        return (lo + hi) / 2

    expect_cases(
        my_lever_peak,
        reference,
        case_7_2,
        "the peak π",
        compare=lambda *a, **k: as_number(*a, **k, atol=1e-6),
    )
