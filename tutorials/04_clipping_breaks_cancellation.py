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
from exercise_check import check, ensure, expect_cases, expect_close, forbid, reject  # the exercises' checks
from plotly.subplots import make_subplots
from show import report_rows, table  # tables of the cells' numbers; quotes of experiments/REPORT.md

from cancellation import compute_loss
from cancellation.diagnostics import token_coefficients
from cancellation.objectives import sign_aware_clip
from plots import ARM_COLORS, SYMBOLS  # one colour per arm (the app's) and marker symbols
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
ratios = [0.5, 0.9, 1.0, 1.1, 1.5]


def weight(r: float, a: float) -> float:
    """The sign-aware post-clip weight s̄ of eq. (47) for one ratio and one advantage sign."""
    return float(sign_aware_clip(torch.tensor([r], dtype=f64), torch.tensor([a], dtype=f64), eps, eps))


table(
    [
        {
            "r": r,
            "weight, A>0": weight(r, 1.0),
            "grad?, A>0": theory.carries_gradient(r, 1.0, eps, eps),
            "weight, A<0": weight(r, -1.0),
            "grad?, A<0": theory.carries_gradient(r, -1.0, eps, eps),
        }
        for r in ratios
    ]
)

# %% [markdown]
# Inside the range both signs keep the gradient. Above $1+\varepsilon$ only the negative-advantage
# term keeps it ("do not increase a good token further"), below $1-\varepsilon$ only the
# positive one ("do not decrease a bad token further"). That asymmetry is the whole story of this
# tutorial.
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
rows = []
for w in [0.3, 0.7, 0.9, 1.1, 1.3, 1.5, 1.9]:
    theta, theta_old = clip_asymmetry_policies(w)
    loss, _ = compute_loss(
        "grpo", policy.token_logp(theta, idx), policy.token_logp(theta_old, idx), adv, mask, group
    )
    rows.append(
        {
            "w": w,
            "−4·loss": -4 * float(loss),
            "C(w)": theory.clip_surrogate(w),
            "net coef (autograd)": clip_asymmetry_net("grpo", w),
            "w·Cʹ(w)/4": theory.clip_coefficient(w, norm=4),
            "GRPO-fix net coef": clip_asymmetry_net("grpo_symclip", w),
        }
    )
table(rows)

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
# above). In the library it is the objective `grpo_symclip`.
#
# It is **not** simply "more conservative" than GRPO. For a negative advantage the two differ on both
# sides of the band:
#
# * above $1+\varepsilon$, GRPO keeps pushing a bad token down ($\max(r, 1+\varepsilon) = r$ carries the
#   gradient) while GRPO-fix's $\varphi$ is flat there: GRPO-fix stops;
# * below $1-\varepsilon$, GRPO's $\max(r, 1-\varepsilon) = 1-\varepsilon$ is flat (PPO's lower bound), while
#   GRPO-fix's clip $[0, 1+\varepsilon]$ has **no lower bound**: it keeps pushing the bad token down.
#
# The coefficient $\partial(\text{term})/\partial\log\pi$ of one token, from `token_coefficients`
# (one completion, one token, so no normaliser): at $A = -1$, $r = 0.5$ GRPO gives 0 and GRPO-fix
# $-0.5$.


# %%
def one_token_coefficient(objective: str, r: float, a: float) -> float:
    """∂J/∂logp of a single token with ratio r and advantage a (one completion, one token)."""
    lp = torch.tensor([[math.log(r)]], dtype=f64)
    one = torch.ones(1, 1, dtype=f64)
    return float(
        token_coefficients(
            objective, lp, 0 * lp, torch.tensor([a], dtype=f64), one, torch.zeros(1, dtype=torch.long)
        )
    )


table(
    [
        {
            "r": r,
            **{
                f"{name}, A={a:+.0f}": one_token_coefficient(obj, r, a)
                for a in (1.0, -1.0)
                for name, obj in (("GRPO", "grpo"), ("GRPO-fix", "grpo_symclip"))
            },
        }
        for r in ratios
    ]
)

# %% [markdown]
# For $A > 0$ the two agree; for $A < 0$ they swap which side is frozen. Whether that makes training
# faster or slower is an empirical question; the experiments (`experiments/REPORT.md`) decide it
# with paired tests over 1024 seeds. Quoted from its summary of predictions:

# %%
report_rows("toy_epsilon", "GRPO-fix")
report_rows("toy_frontier", "GRPO-fix")

# %% [markdown]
# The predictions that GRPO-fix is *slower* (more conservative) are contradicted: it reaches the reward
# threshold sooner. The report's clip-range study compares it with an arm that only drops GRPO's lower
# clip as well; in its words:
#
# > Read together: GRPO-fix's clip is [0, 1 + ε] for both signs, GRPO's without the lower clip is
# > [0, 1 + ε] for positive advantages and PPO's upper bound alone for negative ones. A difference
# > against GRPO with none against the no-lower-clip arm says the speed comes from dropping the lower
# > bound, not from the symmetry.
#
# ## 5. The coefficient plot
#
# Left: the group surrogate $C(w)$; right: the net coefficient on the shared token. Markers are
# autograd through the real objectives, lines the closed forms. DAPO's clip-higher
# ($\varepsilon_\text{high} = 0.28$) only moves the upper kink; it does not remove it.

# %%
ws = [0.05 + 0.025 * k for k in range(77)]  # (0, 2): π_old(answer) = 0.5
curves = {  # name: (objective, its ε, where its coefficient jumps)
    "GRPO (ε=0.2)": ("grpo", {}, (0.8, 1.2)),
    "DAPO clip-higher (0.2 / 0.28)": ("grpo", {"epsilon_high": 0.28}, (0.8, 1.28)),
    "GRPO-fix (symclip)": ("grpo_symclip", {}, ()),
}


def closed_form(objective: str, w: float, **params) -> float:
    """App. F's w·Cʹ(w)/4 (GRPO, clip-higher) or App. H's eq. (82) (GRPO-fix), from toymodel.theory."""
    if objective == "grpo_symclip":
        return theory.symclip_coefficient(w, [-1.0, 1.0], norm=theory.CA_TOKENS)
    return theory.clip_coefficient(w, norm=theory.CA_TOKENS, **params)


def with_breaks(xs, ys, jumps):
    """The line's points with a gap (None) where it jumps, so the plot draws no vertical segment there."""
    out_x, out_y = [], []
    for k, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if k and any(xs[k - 1] < j <= x for j in jumps):
            out_x.append(None)
            out_y.append(None)
        out_x.append(x)
        out_y.append(y)
    return out_x, out_y


# %% [markdown]
# Left: the group surrogate $C(w)$, continuous with kinks; right: the net coefficient on the shared
# token, which **jumps** at the kinks (drawn as breaks, not as vertical lines). Markers are autograd
# through the real objectives, lines the closed forms, one colour per objective. GRPO-fix's
# coefficient is 0 for every $w$ (to float rounding; its legend entry says so). The three objectives
# coincide over much of the grid (GRPO and DAPO below $w = 1.2$, all three inside the band), so each
# has its own marker, drawn largest first (GRPO's big circles around DAPO's diamonds around
# GRPO-fix's small squares), and its own dash (GRPO solid, DAPO dashed, GRPO-fix dotted).

# %%
fig = make_subplots(
    rows=1, cols=2, subplot_titles=("surrogate C(w) (eq. 75/76)", "net ∂J/∂logp of the shared token")
)
for i, (name, (objective, params, jumps)) in enumerate(curves.items()):
    c, dash = ARM_COLORS[name.split(" (")[0]], ("solid", "dash", "dot")[i]  # arm colour; a dash per arm
    autograd = [clip_asymmetry_net(objective, w, **params) for w in ws]
    zero = max(abs(y) for y in autograd) < 1e-12  # 0 up to float rounding on the whole grid
    if objective == "grpo":
        fig.add_scatter(x=ws, y=[theory.clip_surrogate(w, **params) for w in ws], mode="lines", line={"color": c, "dash": dash},
                        name=f"C(w), {name}", legendgroup=name, row=1, col=1)  # fmt: skip
    fig.add_scatter(x=ws, y=autograd, mode="markers", marker={"color": c, "symbol": SYMBOLS[i], "size": 15 - 4 * i, "line": {"width": 2}},
                    name=f"{name} autograd" + (": 0 (to rounding)" if zero else ""), legendgroup=name, row=1, col=2)  # fmt: skip
    x, y = with_breaks(ws, [closed_form(objective, w, **params) for w in ws], jumps)
    fig.add_scatter(x=x, y=y, mode="lines", line={"color": c, "dash": dash}, connectgaps=False, name=f"{name} closed form",
                    legendgroup=name, row=1, col=2)  # fmt: skip
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
summary = []
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
    summary.append(
        {
            "objective": objective,
            "group-shared residual": statistics.mean(residual),
            "clip/frac": statistics.mean(clip),
            "final E[R]": statistics.mean(reward),
        }
    )
table(summary)

# %% [markdown]
# GRPO leaves a small but non-zero residual on whole-group events; GRPO-fix's is zero up to float
# rounding (of order 1e-17). Be honest about the size (the table): the clip binds on about a tenth
# of the tokens, the leak is under a tenth of the whole-group coefficient mass, and on this toy the
# final E[R] barely differs. The toy shows
# the mechanism exactly (sections 3–5); how much it costs a language model depends on how often its
# shared tokens leave the clip range, which is larger with more inner epochs, larger learning rates
# and stale rollouts.
#
# ## Exercises
#
# Write the body of each `my_*` function (until you do, it raises `NotImplementedError`), run its
# cell, then run the check cell below it: it prints ✓ or says what is missing or wrong. Each check
# runs your function on numbers worked out by hand (its messages name the usual mistakes), then on 20
# random cases (a new seed each run, printed when a case fails; `TUTORIAL_CHECK_SEED=<seed>` reruns
# them) against its own plain-loop computation of the definition. An answer that calls the library,
# or reads the notebook's variables instead of its arguments, is refused before it runs. A worked
# solution is in `tutorials/solutions/04_clipping_breaks_cancellation.py`; try first.
#
# **Exercise 4.1 — the sign-aware clip (eq. 46–47).** Write `my_sign_aware_clip(r, adv, epsilon_low,
# epsilon_high)` returning, elementwise, the weight $\bar s$ with $\min(rA, \operatorname{clip}(r)A) =
# A\,\bar s$ for both signs of $A$: with $c = \operatorname{clip}(r, 1-\varepsilon_\text{low},
# 1+\varepsilon_\text{high})$, $\bar s = \min(r, c)$ if $A \ge 0$ and $\max(r, c)$ if $A < 0$. `r` and
# `adv` are float64 tensors of one shape (any shape). The check uses an asymmetric range (0.2 / 0.28)
# and numbers worked out by hand, then random ranges, shapes and advantages ($A = 0$ included).


# %%
# the check's case, worked out by hand with the clip range [0.8, 1.28]: A ≥ 0 keeps min(r, c), A < 0 max(r, c)
# (the last two have A = 0, which takes min(r, c) like A > 0); then what three known mistakes give
clip_r = torch.tensor([0.5, 0.5, 0.75, 0.9, 0.9, 1.25, 1.5, 1.5, 1.5, 0.5], dtype=f64)
clip_a = torch.tensor([1.0, -1.0, -1.0, 1.0, -1.0, 1.0, 1.0, -1.0, 0.0, 0.0], dtype=f64)
clip_s_bar = torch.tensor([0.5, 0.8, 0.8, 0.9, 0.9, 1.25, 1.28, 1.5, 1.28, 0.5], dtype=f64)
plain_clip = torch.tensor([0.8, 0.8, 0.8, 0.9, 0.9, 1.25, 1.28, 1.28, 1.28, 0.8], dtype=f64)
signs_swapped = torch.tensor([0.8, 0.5, 0.75, 0.9, 0.9, 1.25, 1.5, 1.28, 1.5, 0.8], dtype=f64)
eps_swapped = torch.tensor([0.5, 0.72, 0.75, 0.9, 0.9, 1.2, 1.2, 1.5, 1.2, 0.5], dtype=f64)


# %%
def case_4_1(gen):
    """A random case for the check: (r, adv, ε_low, ε_high) and what it holds."""
    # expect_cases seeds its case i with seed·1000 + i: the kinds (and the choice below) come in turn
    i = gen.initial_seed() % 1000
    kind = i % 4
    shape = (int(torch.randint(4, 13, (), generator=gen)),) if kind != 3 else (3, 4)
    r = (0.6 * torch.randn(shape, generator=gen, dtype=f64)).exp()  # ratios on both sides of the band
    adv = torch.randn(shape, generator=gen, dtype=f64)
    adv[torch.rand(shape, generator=gen) < 0.25] = 0.0  # A = 0 takes the A ≥ 0 branch
    eps_low, eps_high = (0.05 + 0.4 * torch.rand(2, generator=gen, dtype=f64)).tolist()
    if kind == 1:
        eps_high = eps_low  # a symmetric range
    elif kind == 2:
        eps_low, eps_high = 0.2, 0.28  # DAPO's
    what = ["an asymmetric range", "a symmetric range", "DAPO's 0.2 / 0.28", "a (3, 4) batch"][kind]
    return (r, adv, eps_low, eps_high), f"{what}, ε = ({eps_low:.4g}, {eps_high:.4g}), some A = 0"


# %%
def my_sign_aware_clip(
    r: torch.Tensor, adv: torch.Tensor, epsilon_low: float, epsilon_high: float
) -> torch.Tensor:
    """s̄ of eq. (47), elementwise: min(r, clip(r)) where adv ≥ 0, max(r, clip(r)) where adv < 0."""
    raise NotImplementedError("Exercise 4.1: replace this line with your code")


# %%
with check("4.1"):
    forbid(my_sign_aware_clip, why="write eq. (47) yourself")
    got = my_sign_aware_clip(clip_r, clip_a, 0.2, 0.28)
    ensure(not isinstance(got, torch.Tensor) or got.shape != clip_r.shape or bool(got[clip_a == 0].isfinite().all()),
           f"s̄ at A = 0 (the last two entries) is {got[-2:].tolist() if isinstance(got, torch.Tensor) else got}: dividing "
           "min(rA, cA) by A fails there; write s̄ from r and c (eq. 47), and A = 0 takes min(r, c) like A > 0")  # fmt: skip
    reject(got, plain_clip, "s̄: that is clip(r) for both signs; eq. (47) keeps r where it lies on the side the sign does not clip: min(r, c) for A ≥ 0, max(r, c) for A < 0")  # fmt: skip
    reject(got, signs_swapped, "s̄: min and max are swapped: A ≥ 0 takes min(r, c) (no credit for pushing a good token past 1 + ε), A < 0 takes max(r, c)")  # fmt: skip
    reject(
        got,
        eps_swapped,
        "s̄: ε_low and ε_high are swapped: the range is [1 − ε_low, 1 + ε_high] = [0.8, 1.28]",
    )
    expect_close(got, clip_s_bar, "s̄ (ε_low = 0.2, ε_high = 0.28)")

    def reference(r, adv, epsilon_low, epsilon_high):  # entry by entry: c, then min or max by A's sign
        s_bar = torch.zeros(r.numel(), dtype=r.dtype)
        for j, (x, a) in enumerate(zip(r.flatten().tolist(), adv.flatten().tolist(), strict=True)):
            c = min(max(x, 1.0 - epsilon_low), 1.0 + epsilon_high)
            s_bar[j] = min(x, c) if a >= 0 else max(x, c)
        return s_bar.reshape(r.shape)

    expect_cases(my_sign_aware_clip, reference, case_4_1, "s̄", rtol=1e-12, atol=1e-15)

# %% [markdown]
# **Exercise 4.2 — one token's coefficient, GRPO and GRPO-fix.** Write `my_token_coefficient(r, adv,
# objective)` returning, elementwise, $\partial(\text{term})/\partial\log\pi$ of one token's term (no
# normaliser): for `"grpo"` the term is $\min(rA, \operatorname{clip}(r, 0.8, 1.2)A)$, for
# `"grpo_symclip"` it is $A\cdot\operatorname{clip}(r, 0, 1.2)$ (eq. 79). Use $\partial r/\partial\log\pi =
# r$ and that a clipped branch is a constant (autograd is refused: write the derivative). No ratio in
# the check sits on a clip boundary; the random cases have ratios far on both sides of the band, both
# signs of $A$ and $A = 0$.


# %%
def near_edges(gen, i, adv):
    """Five ratios just inside and just outside the clip edges (1.2, 0.8) and just past DAPO's 1.28, δ = 1e-3
    or 0.05 in turn, with advantages of both signs: where a hard-coded or misplaced edge shows."""
    delta = (1e-3, 0.05)[i // 12 % 2] * (0.5 + float(torch.rand((), generator=gen)))
    near = torch.tensor([1.2 + delta, 1.2 - delta, 0.8 + delta, 0.8 - delta, 1.28 + delta], dtype=f64)
    signs = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0], dtype=f64) * (1 if i % 2 else -1)
    return near, adv.abs().clamp(min=0.1) * signs


# %%
# fmt: off
token_mistakes = {  # what a known slip gives on the check's example (r = 0.5, 0.5, 1, 1, 1.5, 1.5, A = ±1), and what it is
    "grpo_symclip": [([0.0, 0.0, 1.0, -1.0, 0.0, 0.0], "GRPO-fix's clip is clip(r, 0, 1 + ε): it has no lower bound at 1 − ε, so at r = 0.5 the term keeps its gradient r·A for both signs")],
    "grpo": [([1.0, 0.0, 1.0, -1.0, 0.0, -1.0], "∂(r·A)/∂log π = r·A: the coefficient carries the ratio r, not just A"),
             ([0.5, -0.5, 1.0, -1.0, 1.5, -1.5], "r·A everywhere is the unclipped term; where min picks the clipped branch the term is a constant, coefficient 0")],
}
# fmt: on


def case_4_2(gen):
    """A random case for the check: (r, adv, objective) and what it holds; no r within 1e-6 of 0.8, 1.2."""
    i = gen.initial_seed() % 1000
    kind, turn = i % 3, i // 3 % 2
    n = int(torch.randint(8, 13, (), generator=gen))
    r = ((0.8 if kind == 1 else 0.5) * torch.randn(n, generator=gen, dtype=f64)).exp()
    r = torch.where(((r - 0.8).abs() < 1e-6) | ((r - 1.2).abs() < 1e-6), r + 1e-3, r)
    adv = torch.randn(n, generator=gen, dtype=f64)
    if kind == 2:
        adv[::3] = 0.0
    r[:2] = torch.tensor([0.05, 2.0], dtype=f64) + torch.tensor([0.25, 2.0], dtype=f64) * torch.rand(2, generator=gen, dtype=f64)  # fmt: skip
    adv[:2] = adv[:2].abs() * (-1 if i // 6 % 2 else 1)  # the extreme ratios both with A < 0, or both A > 0
    r[2:7], adv[2:7] = near_edges(gen, i, adv[2:7])
    objective = ("grpo", "grpo_symclip")[turn]
    what = ["ratios around the band", "ratios far from 1", "some A = 0"][kind]
    return (r, adv, objective), f"{objective}, {what}"


# %%
def my_token_coefficient(r: torch.Tensor, adv: torch.Tensor, objective: str) -> torch.Tensor:
    """∂(term)/∂log π of each token, term = min(rA, clip(r, 0.8, 1.2)A) or A·clip(r, 0, 1.2)."""
    raise NotImplementedError("Exercise 4.2: replace this line with your code")


# %%
with check("4.2"):
    forbid(my_token_coefficient, ("backward", "autograd"), why="write the derivative of the term yourself")
    ex_r = torch.tensor([0.5, 0.5, 1.0, 1.0, 1.5, 1.5], dtype=f64)
    ex_a = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0], dtype=f64)
    # by hand: GRPO keeps the gradient r·A where min picks r, else 0; GRPO-fix keeps r·A where r < 1.2
    by_hand = {"grpo": [0.5, 0.0, 1.0, -1.0, 0.0, -1.5], "grpo_symclip": [0.5, -0.5, 1.0, -1.0, 0.0, 0.0]}
    for objective, expected in by_hand.items():
        got = my_token_coefficient(ex_r, ex_a, objective)
        for mistake, message in token_mistakes[objective]:
            reject(got, torch.tensor(mistake, dtype=f64), f"{objective}: {message}")
        at = "at r = (0.5, 0.5, 1, 1, 1.5, 1.5), A = ±1"
        expect_close(got, torch.tensor(expected, dtype=f64), f"the coefficients of {objective}", at=at)

    def reference(r, adv, objective):  # entry by entry: r·A where the term follows r, else 0
        coef = torch.zeros_like(r)
        for j, (x, a) in enumerate(zip(r.tolist(), adv.tolist(), strict=True)):
            follows_r = x * a <= min(max(x, 0.8), 1.2) * a if objective == "grpo" else x < 1.2
            coef[j] = x * a if follows_r else 0.0
        return coef

    expect_cases(my_token_coefficient, reference, case_4_2, "the coefficients", rtol=1e-12, atol=1e-15)

# %% [markdown]
# **Exercise 4.3 — where does clip-higher still cancel?** Return the interval $(w_\text{lo},
# w_\text{hi})$ of ratios of the shared token inside which GRPO's net coefficient is exactly zero, for
# a clip range $[1 - \varepsilon_\text{low}, 1 + \varepsilon_\text{high}]$ (DAPO's $\varepsilon_\text{low} =
# 0.2$, $\varepsilon_\text{high} = 0.28$ first). The check probes the objective just inside and just
# outside your interval, then compares with its own search for the edges at random clip ranges.


# %%
def case_4_3(gen):
    """A random clip range (ε_low, ε_high) for the check, and what it is."""
    i = gen.initial_seed() % 1000
    kind = i % 4
    eps_low, eps_high = (0.01 + 0.6 * torch.rand(2, generator=gen, dtype=f64)).tolist()
    if kind == 1:
        eps_high = eps_low
    elif kind == 2:
        eps_low, eps_high = 3e-4, 4e-4  # GSPO's
    elif kind == 3:
        eps_low, eps_high = max(eps_low, eps_high), min(eps_low, eps_high)
    what = ["a random range", "a symmetric range", "GSPO's range", "ε_low > ε_high"][kind]
    return (eps_low, eps_high), f"{what}: (ε_low, ε_high) = ({eps_low:.6g}, {eps_high:.6g})"


def compare_4_3(got, expected, what, at):
    """The check's comparison: a pair of numbers, each within 1e-9 of the edge."""
    ensure(isinstance(got, (tuple, list)) and len(got) == 2, f"{what} {at}: expected a pair, got {got!r}", kind="wrong type")  # fmt: skip
    expect_close(torch.tensor([float(w) for w in got], dtype=f64), torch.tensor(expected, dtype=f64), what, at=at, atol=1e-9)  # fmt: skip


# just inside and just outside each edge of the interval: (edge, offset, inside, what the edge is if not)
probes_4_3 = [("w_lo", 1e-6, True, "too low"), ("w_hi", -1e-6, True, "too high"),
              ("w_lo", -1e-6, False, "too high"), ("w_hi", 1e-6, False, "too low")]  # fmt: skip


# %%
def my_cancelling_interval(epsilon_low: float, epsilon_high: float) -> tuple[float, float]:
    """(w_lo, w_hi) where GRPO still cancels on the shared token."""
    raise NotImplementedError("Exercise 4.3: replace this line with your answer")


# %%
with check("4.3"):
    forbid(my_cancelling_interval, why="work the interval out from eq. (75)-(76)")
    interval = my_cancelling_interval(0.2, 0.28)
    ensure(isinstance(interval, (tuple, list)) and len(interval) == 2, f"expected a pair (w_lo, w_hi), got {interval!r}", kind="wrong type")  # fmt: skip
    edges = dict(zip(("w_lo", "w_hi"), (float(w) for w in interval), strict=True))
    for name, offset, inside, verdict in probes_4_3:
        net = clip_asymmetry_net("grpo", edges[name] + offset, epsilon_low=0.2, epsilon_high=0.28)
        ensure((net == 0.0) == inside, f"{name} = {edges[name]:g} is {verdict}: at w = {edges[name] + offset:.6f}, just {'inside' if inside else 'outside'} your interval, GRPO's net coefficient is {net:.6g}")  # fmt: skip

    def reference(epsilon_low, epsilon_high):  # bisect the edges of the set of w where Â = ±1's terms cancel
        def cancels(w):  # a term min(wA, cA) keeps ∂/∂log π = w·A where it takes the wA branch
            c = min(max(w, 1.0 - epsilon_low), 1.0 + epsilon_high)
            return sum(a * w for a in (-1.0, 1.0) if a * w <= a * c) == 0.0

        edges = []
        for outside, inside in ((1e-12, 1.0), (10.0, 1.0)):
            for _ in range(64):
                mid = (outside + inside) / 2
                outside, inside = (outside, mid) if cancels(mid) else (mid, inside)
            edges.append(inside)
        return tuple(edges)

    expect_cases(my_cancelling_interval, reference, case_4_3, "(w_lo, w_hi)", compare=compare_4_3)
