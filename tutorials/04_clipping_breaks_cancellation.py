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
# # 4 · Clipping breaks cancellation (DFPO App. F and App. H)
#
# GRPO's token-level weights cancel a token that the whole group shares (tutorials 1 and 2), but
# only as long as every completion applies the **same** function to that token's ratio. PPO-style
# clipping does not: $\min(rA, \operatorname{clip}(r)A)$ picks a different branch for $A > 0$ and
# $A < 0$. Once the shared token's ratio leaves $[1-\varepsilon, 1+\varepsilon]$, one sign is frozen
# and the other is not, and the shared token is pushed (App. F, eq. 75–76). The GRPO-fix of App. H
# clips both signs the same way and restores cancellation (eq. 79–82).

# %%
import math
import statistics

import plotly.io as pio
import torch
from exercise_check import check, ensure, expect_close  # the exercises' check cells (next to this file)
from plotly.subplots import make_subplots

from cancellation import compute_loss
from cancellation.objectives import sign_aware_clip
from toymodel import simulate, theory
from toymodel.scenarios import CLIP_ASYMMETRY, clip_asymmetry_net, clip_asymmetry_policies

pio.renderers.default = "plotly_mimetype+notebook_connected"
torch.set_num_threads(1)  # the toy's tensors are tiny: one thread is fastest
torch.set_printoptions(precision=4, sci_mode=False)
f64 = torch.float64

# %% [markdown]
# ## 1. Clipping depends on the sign of the advantage (eq. 77–78)
#
# For a ratio $r$, an advantage $A$ and $\bar r = \operatorname{clip}(r, 1-\varepsilon, 1+\varepsilon)$,
# the PPO/GRPO term is
#
# $$\min(rA, \bar r A) = \begin{cases} A\cdot\min(r, \bar r), & A \ge 0,\\
#   A\cdot\max(r, \bar r), & A < 0.\end{cases}
# \qquad\text{(eq. 78)}$$
#
# The weight that multiplies $A$, the *sign-aware post-clip weight* (eq. 47), is what
# `cancellation.objectives.sign_aware_clip` computes. When the clip binds, the weight is the constant
# $1 \pm \varepsilon$ and the term has no gradient (`theory.carries_gradient`):

# %%
eps = 0.2
ratios = torch.tensor([0.5, 0.9, 1.0, 1.1, 1.5], dtype=f64)
print(f"{'r':>5} | {'weight (A>0)':>13} {'grad?':>6} | {'weight (A<0)':>13} {'grad?':>6}")
for r in ratios:
    w_pos = float(sign_aware_clip(r[None], torch.tensor([1.0], dtype=f64), eps, eps))
    w_neg = float(sign_aware_clip(r[None], torch.tensor([-1.0], dtype=f64), eps, eps))
    g_pos = theory.carries_gradient(float(r), 1.0, eps, eps)
    g_neg = theory.carries_gradient(float(r), -1.0, eps, eps)
    print(f"{float(r):5.2f} | {w_pos:13.2f} {g_pos!s:>6} | {w_neg:13.2f} {g_neg!s:>6}")

# %% [markdown]
# Inside the range both signs keep the gradient. Above $1+\varepsilon$ only the negative-advantage
# term keeps it ("do not increase a good token further"), below $1-\varepsilon$ only the
# positive one. That asymmetry is the whole story of this tutorial.
#
# ## 2. The toy: one shared token with ratio $w$
#
# `clip_asymmetry` has a first token "answer" (alternative "result") and then a deciding token:
# $\tau_1$ = (answer, 25) with $R = 0$ and $\tau_2$ = (answer, 20) with $R = 1$, so $\hat A = (-1, +1)$.
# `clip_asymmetry_policies(w)` gives a $(\theta, \theta_\text{old})$ pair in which the shared token
# has ratio $w$ and the deciding tokens ratio 1.

# %%
sc = CLIP_ASYMMETRY
policy = sc.policy()
idx = torch.tensor([policy.trajectory_index(("answer", "25")), policy.trajectory_index(("answer", "20"))])
adv = torch.tensor([-1.0, 1.0], dtype=f64)
group = torch.zeros(2, dtype=torch.long)
mask = policy.mask[idx]
print(sc.description)

# %% [markdown]
# ## 3. The group's surrogate and the leftover coefficient (eq. 75–76)
#
# Summing the two terms of the shared token (App. F):
#
# $$C(w) = \hat A_1\,\text{(weight of }\tau_1) + \hat A_2\,\text{(weight of }\tau_2) =
# \begin{cases} A\big((1+\varepsilon) - w\big), & w > 1+\varepsilon\ \text{(eq. 75)}\\
#  0, & w \in [1-\varepsilon, 1+\varepsilon]\\
#  A\big(w - (1-\varepsilon)\big), & w < 1-\varepsilon\ \text{(eq. 76)}\end{cases}$$
#
# The deciding tokens have ratio 1 and cancel in the sum, so on this toy GRPO's whole objective is
# $C(w)/4$ (token-mean over 4 tokens). Its gradient along the shared token's score is
# $w\,C'(w)/4$: the clipped branch is a constant, the unclipped one is not. We compare the real loss
# and autograd (`clip_asymmetry_net`) with the closed forms in `toymodel.theory`:

# %%
print(f"{'w':>5} | {'−4·loss':>9} {'C(w)':>9} | {'net coef':>9} {'w·Cʹ(w)/4':>10} | {'GRPO-fix':>9}")
for w in [0.3, 0.7, 0.9, 1.1, 1.3, 1.5, 1.9]:
    theta, theta_old = clip_asymmetry_policies(w)
    loss, _ = compute_loss(
        "grpo", policy.token_logp(theta, idx), policy.token_logp(theta_old, idx), adv, mask, group
    )
    net, net_fix = clip_asymmetry_net("grpo", w), clip_asymmetry_net("grpo_symclip", w)
    print(
        f"{w:5.2f} | {-4 * float(loss):+9.4f} {theory.clip_surrogate(w):+9.4f} | "
        f"{net:+9.4f} {theory.clip_coefficient(w, norm=4):+10.4f} | {net_fix:+9.4f}"
    )

# %% [markdown]
# ## 4. The fix: symmetric clipping (App. H, eq. 79–82)
#
# GRPO-fix applies one operator to every ratio, whatever the sign of $A$:
#
# $$\mathcal L_\text{sym}(r, A) = A\cdot\varphi(r), \qquad
#   \varphi(r) = \operatorname{clip}(r, 0, 1+\varepsilon)
# \qquad\text{(eq. 79)}.$$
#
# A token that the whole group shares has one ratio $r^\star$, so its terms add up to
# $\varphi(r^\star)\sum_i \hat A_i = 0$ (eq. 82), and the gradient cancels for every $w$ (last column
# above). It is more conservative than GRPO for negative advantages: above $1+\varepsilon$ it stops
# pushing a bad completion down too. In the library it is the objective `grpo_symclip`.
#
# ## 5. The coefficient plot
#
# Left: the group surrogate $C(w)$; right: the net coefficient on the shared token. Markers are
# autograd through the real objectives, lines the closed forms. DAPO's clip-higher
# ($\varepsilon_\text{high} = 0.28$) only moves the upper kink; it does not remove it.

# %%
ws = [0.05 + 0.025 * k for k in range(77)]  # (0, 2): π_old(answer) = 0.5
fig = make_subplots(
    rows=1, cols=2, subplot_titles=("surrogate C(w) (eq. 75/76)", "net ∂J/∂logp of the shared token")
)
fig.add_scatter(
    x=ws, y=[theory.clip_surrogate(w) for w in ws], mode="lines", name="C(w), ε=0.2", row=1, col=1
)
fig.add_scatter(
    x=ws,
    y=[theory.clip_surrogate(w, epsilon_high=0.28) for w in ws],
    mode="lines",
    name="C(w), clip-higher",
    row=1,
    col=1,
)
curves = {
    "GRPO (ε=0.2)": ("grpo", {}, {}),
    "DAPO clip-higher (0.2 / 0.28)": ("grpo", {"epsilon_high": 0.28}, {"epsilon_high": 0.28}),
    "GRPO-fix (symclip)": ("grpo_symclip", {}, None),
}
for name, (objective, params, closed) in curves.items():
    fig.add_scatter(
        x=ws,
        y=[clip_asymmetry_net(objective, w, **params) for w in ws],
        mode="markers",
        name=f"{name} autograd",
        row=1,
        col=2,
    )
    closed_form = (
        [theory.clip_coefficient(w, norm=theory.CA_TOKENS, **closed) for w in ws]
        if closed is not None
        else [theory.symclip_coefficient(w, [-1.0, 1.0], norm=theory.CA_TOKENS) for w in ws]
    )
    fig.add_scatter(x=ws, y=closed_form, mode="lines", name=f"{name} closed form", row=1, col=2)
for col in (1, 2):
    fig.add_vrect(x0=0.8, x1=1.2, fillcolor="green", opacity=0.08, line_width=0, row=1, col=col)
fig.update_xaxes(title_text="ratio w of the shared token")
fig.update_layout(
    title="App. F: GRPO's clip leaves ∓w/4 on a shared token outside [1−ε, 1+ε]; GRPO-fix leaves 0",
    height=450,
)
fig.show()

# %% [markdown]
# ## 6. Does it happen in training?
#
# Under GRPO, in the tabular toy, a token that **every** completion of the only group in the batch
# shares never leaves ratio 1 within a step: its context's gradient is exactly zero while
# cancellation holds (tutorial 1), so nothing moves it, so the clip never binds on it. Clipping can
# only break a group's cancellation once *something else* moves the shared context. With several
# groups per batch (all answering the same prompt), the other groups do exactly that, as other
# prompts sharing weights do in a language model. `simulate` measures `group_shared_residual`: the part of
# the coefficient mass on events shared by a whole group that fails to cancel in the updates it
# actually applied (0 = exact cancellation).

# %%
config = dict(steps=60, num_groups=4, group_size=4, lr=1.0, inner_epochs=16)
print(f"clip_asymmetry, {config}, 3 seeds")
for objective in ("grpo", "grpo_symclip"):
    runs = [simulate(sc, objective, seed=seed, **config) for seed in range(3)]
    # NaN on steps without a whole-group event that got a gradient
    residual = [
        statistics.mean(
            r["group_shared_residual"] for r in rows if not math.isnan(r["group_shared_residual"])
        )
        for rows in runs
    ]
    clip = [statistics.mean(r["clip/frac"] for r in rows if r["zero_adv_group_frac"] < 1.0) for rows in runs]
    reward = [rows[-1]["expected_reward"] for rows in runs]
    print(
        f"  {objective:13} group-shared residual {statistics.mean(residual):.4f}   "
        f"clip/frac {statistics.mean(clip):.3f}   final E[R] {statistics.mean(reward):.3f}"
    )

# %% [markdown]
# GRPO leaves a small but non-zero residual on whole-group events; GRPO-fix leaves exactly zero.
# Be honest about the size: by the last inner step the clip binds on roughly a tenth of the tokens,
# the leak is a few percent of the whole-group coefficient mass, and on this toy it barely changes
# the learning curve. The toy shows
# the mechanism exactly (sections 3–5); how much it costs a language model depends on how often its
# shared tokens leave the clip range, which is larger with more inner epochs, larger learning rates
# and stale rollouts.
#
# ## Exercises
#
# Write the body of each `my_*` function (until you do, it raises `NotImplementedError`), run its
# cell, then run the check cell below it: it prints ✓ or says what is missing or wrong. A worked
# solution is in `tutorials/solutions/04_clipping_breaks_cancellation.py`; try first.
#
# **Exercise 4.1 — the leak from first principles.** For $w > 1+\varepsilon$ only $\tau_1$'s term
# ($\hat A_1 = -1$, weight $w$) depends on $\theta$; for $w < 1-\varepsilon$ only $\tau_2$'s. Write
# `my_grpo_net(w)` returning the net coefficient on the shared token for GRPO with ε = 0.2 on this
# toy (token-mean over its 4 tokens). The check compares it with the library's autograd value.


# %%
def my_grpo_net(w: float) -> float:
    """Σ_i ∂J/∂logp of the shared token 'answer' at ratio w (GRPO, ε = 0.2, token-mean over 4 tokens)."""
    raise NotImplementedError("Exercise 4.1: replace this line with your code")


# %%
with check("4.1"):
    for w in [0.1, 0.5, 0.79, 0.81, 1.0, 1.19, 1.21, 1.6, 1.95]:
        expect_close(
            my_grpo_net(w), clip_asymmetry_net("grpo", w), "GRPO's net coefficient", at=f"at w = {w}"
        )

# %% [markdown]
# **Exercise 4.2 — where does clip-higher still cancel?** With DAPO's $\varepsilon_\text{low} = 0.2$,
# $\varepsilon_\text{high} = 0.28$, return the interval $(w_\text{lo}, w_\text{hi})$ of ratios of the
# shared token inside which GRPO's net coefficient is exactly zero. The check probes the objective
# just inside and just outside your interval.


# %%
def my_cancelling_interval(epsilon_low: float, epsilon_high: float) -> tuple[float, float]:
    """(w_lo, w_hi) where GRPO still cancels on the shared token."""
    raise NotImplementedError("Exercise 4.2: replace this line with your answer")


# %%
with check("4.2"):
    interval = my_cancelling_interval(0.2, 0.28)
    ensure(
        isinstance(interval, (tuple, list)) and len(interval) == 2,
        f"expected a pair (w_lo, w_hi), got {interval!r}",
        kind="wrong type",
    )
    lo, hi = (float(w) for w in interval)
    clip_higher = {"epsilon_low": 0.2, "epsilon_high": 0.28}
    for name, w, inside, verdict in [
        ("w_lo", lo + 1e-6, True, "too low"),
        ("w_hi", hi - 1e-6, True, "too high"),
        ("w_lo", lo - 1e-6, False, "too high"),
        ("w_hi", hi + 1e-6, False, "too low"),
    ]:
        net = clip_asymmetry_net("grpo", w, **clip_higher)
        ensure(
            (net == 0.0) == inside,
            f"{name} = {lo if name == 'w_lo' else hi:g} is {verdict}: at w = {w:.6f}, just "
            f"{'inside' if inside else 'outside'} your interval, GRPO's net coefficient is {net:.6g}",
        )
