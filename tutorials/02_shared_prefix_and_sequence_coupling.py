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
# # 2 · Shared prefixes and sequence coupling (DFPO App. A.2)
#
# Tutorial 1 showed that GRPO's token-level weights make a token that the whole group shares cancel:
# every completion multiplies it by the **same** ratio, and $\sum_i \hat A_i = 0$ does the rest.
# Sequence-level objectives (GSPO and its relatives) weight every token of completion $i$ by one
# sequence ratio $s_i$ built from **all** its tokens. Then a shared token inherits a factor from the
# other tokens of its completion (here the ones after it), and that factor differs between
# completions. This tutorial works
# through the paper's minimal example (App. A.2, eq. 32–38) step by step, with every number computed
# twice: by autograd through the real loss on the tabular policy, and by the paper's closed form
# (`toymodel.theory`).

# %%
import plotly.graph_objects as go
import plotly.io as pio
import torch
from exercise_check import check, expect_cases, expect_close, forbid, number, reject  # the exercises' checks
from show import fmt, table  # aligned tables of the numbers the cells compute

from cancellation import compute_loss
from cancellation.diagnostics import token_coefficients
from cancellation.objectives import sequence_log_ratio
from plots import ARM_COLORS, SYMBOLS  # one colour per arm (the app's) and marker symbols
from toymodel import theory
from toymodel.scenarios import SHARED_PREFIX, shared_prefix_net, shared_prefix_policies

pio.renderers.default = "plotly_mimetype+notebook_connected"
torch.set_num_threads(1)  # the toy's tensors are tiny: one thread is fastest
torch.set_printoptions(precision=4, sci_mode=False)
f64 = torch.float64
#: clipping off: clip(s, 1 − 0.999999, 1 + 1e9) never binds for the ratios used here (App. A's setting)
NO_CLIP = {"epsilon_low": 0.999999, "epsilon_high": 1e9}

# %% [markdown]
# ## 1. The group: "answer is 25" vs "answer is 20"
#
# Two completions of length $T = 3$ share their first two tokens (eq. 33–34):
#
# $$\tau_1 = (\text{answer}, \text{is}, \text{25}),\ R = 0 \qquad
#   \tau_2 = (\text{answer}, \text{is}, \text{20}),\ R = 1,$$
#
# with advantages $\hat A_1 = -A$, $\hat A_2 = +A$ (eq. 32). After some training, $\pi_\theta$ differs
# from $\pi_{\theta_\text{old}}$. The shared steps have the same ratio in both completions; the last
# steps do not (eq. 35–36):
#
# $$r_{1,1} = r_{2,1} = \rho_1,\quad r_{1,2} = r_{2,2} = \rho_2,
#   \quad r_{1,3} = \lambda_1,\quad r_{2,3} = \lambda_2.$$
#
# `shared_prefix_policies(ρ1, ρ2, λ1, λ2)` builds a pair $(\theta, \theta_\text{old})$ of tabular
# policies with exactly these ratios (the leftover probability goes to the alternatives result /
# was / 30).

# %%
rho1, rho2, lam1, lam2 = 1.1, 0.9, 1.3, 0.7
A = 1.0
policy = SHARED_PREFIX.policy()
idx = torch.tensor(
    [policy.trajectory_index(("answer", "is", "25")), policy.trajectory_index(("answer", "is", "20"))]
)
theta, theta_old = shared_prefix_policies(rho1, rho2, lam1, lam2)
logp = policy.token_logp(theta, idx)
old_logp = policy.token_logp(theta_old, idx)
mask = policy.mask[idx]
adv = torch.tensor([-A, A], dtype=f64)  # eq. (32)
group = torch.zeros(2, dtype=torch.long)
print("token ratios r_(i,t) (rows τ1, τ2):\n", (logp - old_logp).exp())

# %% [markdown]
# ## 2. Token-level weights cancel (GRPO, eq. 9)
#
# GRPO multiplies each token by its own ratio. The two shared steps get $\hat A_1\rho_t + \hat A_2\rho_t
# = 0$; only the last, distinct tokens carry a gradient. (Clipping is switched off everywhere in this
# tutorial, as in the paper's linear-region analysis; tutorial 4 is about what clipping does.)

# %%
coef_grpo = token_coefficients("grpo", logp, old_logp, adv, mask, group, **NO_CLIP)
print("GRPO coefficients ∂J/∂logp (rows τ1, τ2; columns t = 1, 2, 3):\n", coef_grpo)
print("net on the shared steps t = 1, 2:", coef_grpo[:, :2].sum(0))

# %% [markdown]
# ## 3. Sequence coupling does not (eq. 11–13, 37–38)
#
# The plain sequence-level objective weights completion $i$ by the product of its ratios (eq. 11,
# 31): $\mathcal J_\text{seq} = \frac1G\sum_i s_i \hat A_i$ with $s_i = \prod_t r_{i,t}$, so
#
# $$s_1 = \rho_1\rho_2\lambda_1,\qquad s_2 = \rho_1\rho_2\lambda_2 \qquad\text{(eq. 37)}.$$
#
# Since $\partial s_i / \partial \log\pi(a_t) = s_i$ for every token of completion $i$, both shared
# steps get the coefficient $\hat A_i s_i / G$ from each completion, and the sum is
#
# $$\hat A_1 s_1 + \hat A_2 s_2 = A\rho_1\rho_2(\lambda_2 - \lambda_1) \qquad\text{(eq. 38)}$$
#
# (times $1/G$): non-zero as soon as the two **last** tokens moved differently. The reward depends
# only on the last token, yet the update pushes "answer" and "is". In the library this is
# `gspo` with `length_norm=False` (s = Π r) and GSPO's sequence aggregation.

# %%
s_prod = sequence_log_ratio(logp, old_logp, mask, length_norm=False).exp()
print("s = Π_t r (eq. 37):", s_prod, "  ρ1ρ2λ =", [fmt(rho1 * rho2 * lam1), fmt(rho1 * rho2 * lam2)])
coef_seq = token_coefficients("gspo", logp, old_logp, adv, mask, group, length_norm=False, **NO_CLIP)
print("\ncoefficients, s = Π r:\n", coef_seq)
net_seq, eq38 = float(coef_seq[:, 0].sum()), theory.eq38_coefficient(rho1, rho2, lam1, lam2, A)
print("\nnet on shared step t = 1 (autograd):      ", fmt(net_seq))
print("eq. (38)/G (toymodel.theory):             ", fmt(eq38), f"  (difference {fmt(net_seq - eq38, 2)})")
print("eq. (38) itself, A·ρ1·ρ2·(λ2 − λ1):       ", fmt(theory.eq38_surrogate(rho1, rho2, lam1, lam2, A)))

# %% [markdown]
# GSPO proper uses the length-normalised ratio $s_i = (\prod_t r_{i,t})^{1/T_i}$ (eq. 44). Each token
# then gets $\hat A_i s_i/(G\,T_i)$ (eq. 58), and the shared steps keep
# $\frac{A}{G T}(s_2 - s_1)$: smaller, same structure, still non-zero.

# %%
coef_gspo = token_coefficients("gspo", logp, old_logp, adv, mask, group, **NO_CLIP)
net_gspo, closed = float(coef_gspo[:, 0].sum()), theory.eq38_gspo_coefficient(rho1, rho2, lam1, lam2, A)
print("net on t = 1, GSPO (autograd): ", fmt(net_gspo))
print("closed form (A/(G·T))(s2 − s1):", fmt(closed), f"  (difference {fmt(net_gspo - closed, 2)})")

# %% [markdown]
# ## 4. The same numbers for many settings, and DFPO
#
# `shared_prefix_net(objective, ρ1, ρ2, λ1, λ2, **params)` runs exactly the computation above
# (autograd through `compute_loss`, summed over the group on the shared steps) and
# `theory.shared_prefix_closed_form` gives the paper's prediction for the same arguments. DFPO
# replaces GSPO's weights by group-transformed ones with $\sum_i \tilde s_i \hat A_i = 0$ (eq. 73;
# tutorial 5), which puts the cancellation back.

# %%
settings = [(1.1, 0.9, 1.3, 0.7), (0.95, 1.15, 0.6, 1.8), (1.5, 0.5, 2.0, 1.0), (0.3, 1.7, 0.2, 3.0)]
variants = {
    "GRPO": ("grpo", {}),
    "GSPO s=Πr": ("gspo", {"length_norm": False}),
    "GSPO": ("gspo", {}),
    "DFPO Min-Replace": ("dfpo", {"transform": "min_replace"}),
    "DFPO Orth-Proj": ("dfpo", {"transform": "orth_proj"}),
}
rows = []
for setting in settings:
    for name, (objective, params) in variants.items():
        net = shared_prefix_net(objective, *setting, **params, **NO_CLIP)[0]
        paper = theory.shared_prefix_closed_form(objective, *setting, **params, **NO_CLIP).value
        assert abs(net - paper) < 1e-12
        rows.append({"ρ1, ρ2, λ1, λ2": setting, "objective": name, "autograd": net, "paper": paper})
table(rows)

# %% [markdown]
# Autograd and the closed form agree to machine precision (the `assert` in the cell checks it; a
# value like 1e-17 is float rounding). A picture of eq. (38): fix $\rho_1, \rho_2, \lambda_1$ and
# move $\lambda_2$. The sequence-coupled objectives leave a coefficient proportional to
# $\lambda_2 - \lambda_1$ on the shared prefix; GRPO and DFPO stay at 0. Three series lie on top of
# each other at 0, so each has its own marker (the largest drawn first) and the legend says which
# ones are 0 on the whole grid (to float rounding, below 1e-12).

# %%
lam2_grid = [0.2 + 0.05 * k for k in range(37)]  # up to 2.0: keeps 0.3·(λ1 + λ2) < 1
nets = {
    name: [shared_prefix_net(objective, rho1, rho2, lam1, l2, **params, **NO_CLIP)[0] for l2 in lam2_grid]
    for name, (objective, params) in variants.items()
}
fig = go.Figure()
for i, (name, ys) in enumerate(nets.items()):
    zero = max(abs(y) for y in ys) < 1e-12  # 0 up to float rounding on the whole grid
    fig.add_scatter(
        x=lam2_grid,
        y=ys,
        mode="markers",
        name=f"{name} (autograd)" + (": 0 (to rounding)" if zero else ""),
        marker={
            "color": ARM_COLORS[name],
            "symbol": SYMBOLS[i],
            "size": 16 - 2 * i,
            "line": {"width": 2, "color": ARM_COLORS[name]},
        },
    )

# %%
fig.add_scatter(
    x=lam2_grid,
    y=[theory.eq38_coefficient(rho1, rho2, lam1, l2) for l2 in lam2_grid],
    mode="lines",
    line={"color": ARM_COLORS["GSPO s=Πr"]},
    name="eq. (38)/G (GSPO s=Πr, closed form)",
)
fig.add_scatter(
    x=lam2_grid,
    y=[theory.eq38_gspo_coefficient(rho1, rho2, lam1, l2) for l2 in lam2_grid],
    mode="lines",
    line={"color": ARM_COLORS["GSPO"]},
    name="(A/(G·T))(s2 − s1) (GSPO, closed form)",
)
fig.add_vline(x=lam1, line_dash="dot", annotation_text="λ2 = λ1")
fig.update_layout(
    title=f"Net coefficient on the shared prefix step (ρ1={rho1}, ρ2={rho2}, λ1={lam1})",
    xaxis_title="λ2 (ratio of the last token of τ2)",
    yaxis_title="Σ_i ∂J/∂logp_(i,1)",
    height=420,
)
fig.show()

# %% [markdown]
# ## 5. What a non-zero coefficient does to the policy (Prop. 3.1)
#
# A net coefficient $c^\star \ne 0$ on "answer" moves the root softmax by $\eta\,c^\star(e_\text{answer}
# - \pi)$. Proposition 3.1 says the distribution at that context then drifts by
# $\mathrm{KL}(\pi_{\theta^+}\Vert\pi_\theta) = \tfrac12\eta^2 g^\top F g + O(\eta^3) > 0$ (eq. 3): a change
# of the policy on a context whose choice the reward never asked for. One plain SGD step on each
# objective, measured exactly with `policy.context_kl`:

# %%
root = policy.context_id(())


def root_kl_after_one_step(objective: str, eta: float, **params) -> float:
    """KL(π_θ+(·|<start>) ‖ π_θ(·|<start>)) after one SGD step of size eta on `objective`'s loss."""
    z = theta.clone().requires_grad_(True)
    loss, _ = compute_loss(
        objective, policy.token_logp(z, idx), old_logp, adv, mask, group, **params, **NO_CLIP
    )
    (grad,) = torch.autograd.grad(loss, z)
    grad = torch.where(policy.valid, grad, torch.zeros_like(grad))  # unused (−inf) slots stay put
    return float(policy.context_kl(theta - eta * grad, theta)[root])


rows = []
for name, (objective, params) in variants.items():
    kl1 = root_kl_after_one_step(objective, 0.1, **params)
    kl2 = root_kl_after_one_step(objective, 0.2, **params)
    rows.append(
        {"objective": name, "KL, η = 0.1": kl1, "KL, η = 0.2": kl2, "ratio": kl2 / kl1 if kl1 > 0 else "—"}
    )
table(rows)

# %% [markdown]
# GRPO and DFPO leave the root distribution exactly where it was; the sequence-coupled objectives
# move it, and doubling the step quadruples the drift, the $\eta^2$ of eq. (3). Over many steps
# these drifts add up as the learning tax. (Whether they add up or average out depends on whether
# the sign of $\lambda_2 - \lambda_1$ is systematic; tutorial 3 looks at what a multi-step run shows.)
#
# ## Exercises
#
# Write the body of each `my_*` function (until you do, it raises `NotImplementedError`), run its
# cell, then run the check cell below it: it prints ✓ or says what is missing or wrong. Each check
# runs your function on numbers worked out by hand (its messages name the usual mistakes), then on 20
# random cases (a new seed each run, printed when a case fails; `TUTORIAL_CHECK_SEED=<seed>` reruns
# them) against its own plain-loop computation of the definition. An answer that calls the library,
# autograd, or reads the notebook's variables instead of its arguments is refused before it runs. A
# worked solution is in `tutorials/solutions/02_shared_prefix_and_sequence_coupling.py`; try first.
#
# **Exercise 2.1 — every token's coefficient, off $\theta_\text{old}$.** For the group
# $\{\tau_1, \tau_2\}$ of section 1 ($\hat A = (-1, +1)$, no clipping) write
# `my_coefficients(ρ1, ρ2, λ1, λ2, objective)` returning the $(2, 3)$ tensor $c_{i,t} = \partial\mathcal
# J/\partial\log\pi_\theta(a^{(i)}_t)$ (float64; rows $\tau_1, \tau_2$, columns $t = 1, 2, 3$) for
# `"grpo"` (token-mean over the $N = 6$ tokens: $\mathcal J = \frac1N\sum_{i,t} r_{i,t}\hat A_i$) and
# for `"seq"` (the product weight of eq. 11: $\mathcal J = \frac1G\sum_i s_i\hat A_i$,
# $s_i = \prod_t r_{i,t}$). Use $\partial r/\partial\log\pi = r$ (autograd is refused: write the
# derivative). The check compares with numbers worked out by hand at two settings the cells above do
# not print, then with random ratios.

# %%
# the check's numbers, worked out by hand: (ρ1, ρ2, λ1, λ2) = (1.2, 0.75, 1.4, 0.6): GRPO c = Â_i·r_(i,t)/6;
# s_1 = 1.26, s_2 = 0.54; (0.4, 1.6, 2.0, 0.5): s_1 = 1.28, s_2 = 0.32; "seq" c = Â_i·s_i/2 on every token
ex21 = {
    ((1.2, 0.75, 1.4, 0.6), "grpo"): [[-0.2, -0.125, -1.4 / 6], [0.2, 0.125, 0.1]],
    ((1.2, 0.75, 1.4, 0.6), "seq"): [[-0.63] * 3, [0.27] * 3],
    ((0.4, 1.6, 2.0, 0.5), "grpo"): [[-0.4 / 6, -1.6 / 6, -2.0 / 6], [0.4 / 6, 1.6 / 6, 0.5 / 6]],
    ((0.4, 1.6, 2.0, 0.5), "seq"): [[-0.64] * 3, [0.16] * 3],
}


# %%
def case_2_1(gen):
    """Random ratios (ρ1, ρ2, λ1, λ2) in (0.2, 3) and an objective for the check, and what they are."""
    # expect_cases seeds its case i with seed·1000 + i: the kinds (and the choice below) come in turn
    i = gen.initial_seed() % 1000
    kind, turn = i % 4, i // 4 % 2
    rho1, rho2, lam1, lam2 = (0.2 + 2.8 * torch.rand(4, generator=gen, dtype=f64)).tolist()
    if kind == 1:
        lam2 = lam1  # identical ratios on the last tokens too
    elif kind == 2:
        rho1 = rho2 = 1.0  # the shared steps unmoved
    elif kind == 3:
        rho1, rho2, lam1, lam2 = 1.0, 1.0, 1.0, lam2  # only τ2's last token moved
    objective = ("grpo", "seq")[turn]
    what = ["random ratios", "λ1 = λ2", "ρ1 = ρ2 = 1", "every ratio 1 but λ2"][kind]
    return (rho1, rho2, lam1, lam2, objective), f"{objective}, {what}: {(rho1, rho2, lam1, lam2)}"


# %%
def my_coefficients(rho1: float, rho2: float, lam1: float, lam2: float, objective: str) -> torch.Tensor:
    """(2, 3) c_(i,t) of the group {τ1, τ2} for "grpo" (token-mean) or "seq" (s = Π r, 1/G)."""
    raise NotImplementedError("Exercise 2.1: replace this line with your code")


# %%
with check("2.1"):
    forbid(my_coefficients, ("backward", "autograd"), why="write ∂J/∂log π with ∂r/∂log π = r yourself")
    sign = torch.tensor([[-1.0], [1.0]], dtype=f64)
    for (setting, objective), expected in ex21.items():
        got = my_coefficients(*setting, objective)
        ratios = torch.tensor([setting[:3], [*setting[:2], setting[3]]], dtype=f64)
        reject(got, sign / 6 * torch.ones(2, 3, dtype=f64), f"{objective}: these are the coefficients at ratio 1 (tutorial 1); off θ_old each term carries its ratio, ∂(r·Â)/∂log π = r·Â")  # fmt: skip
        for n in (2, 6) if objective == "seq" else ():
            reject(got, sign * ratios / n, "seq: each token of τ_i got its own ratio r_(i,t); under s_i = Π_t r_(i,t) every token of τ_i gets the whole s_i: ∂s_i/∂log π_t = s_i")  # fmt: skip
        at = f"at (ρ1, ρ2, λ1, λ2) = {setting}"
        expect_close(got, torch.tensor(expected, dtype=f64), f"c_(i,t) of {objective}", at=at)

    def reference(rho1, rho2, lam1, lam2, objective):  # token by token, from the two surrogates
        ratios, signs, coef = (
            [[rho1, rho2, lam1], [rho1, rho2, lam2]],
            [-1.0, 1.0],
            torch.zeros(2, 3, dtype=f64),
        )
        for i in range(2):
            s_i = ratios[i][0] * ratios[i][1] * ratios[i][2]
            for t in range(3):
                coef[i, t] = signs[i] * ratios[i][t] / 6 if objective == "grpo" else signs[i] * s_i / 2
        return coef

    expect_cases(my_coefficients, reference, case_2_1, "c_(i,t)", rtol=1e-9, atol=1e-15)

# %% [markdown]
# Sum your `"seq"` columns 1 and 2 over the two rows and you have eq. (38)/G; sum your `"grpo"` ones
# and you have eq. (9)'s 0.
#
# **Exercise 2.2 — eq. (38) for a group of $G$.** Eq. (38) is for two completions. Take a group of $G$
# completions of length 3 that all start with the two shared tokens (ratios $\rho_1$, $\rho_2$) and
# end with different last tokens (ratios $\lambda_i$), with advantages $\hat A_i$. Write
# `my_prefix_net(adv, ρ1, ρ2, lam, length_norm)` returning the net coefficient $\sum_i c_{i,1}$ on the
# first shared token under $\mathcal J = \frac1G\sum_i s_i\hat A_i$, where $s_i = \prod_t r_{i,t}$
# (`length_norm=False`, eq. 11) or GSPO's $s_i = (\prod_t r_{i,t})^{1/3}$ (`length_norm=True`, eq. 44).
# `adv` and `lam` are float64 tensors of shape $(G,)$; return a number. The random cases include groups
# of two, zero advantages, equal $\lambda_i$, and advantages that do not sum to 0 (raw rewards, say):
# do not rely on $\sum_i \hat A_i = 0$.

# %%
# the check's numbers, worked out by hand with ρ1·ρ2 = 1.2·0.75 = 0.9: s = 0.9·λ = (1.17, 0.63, 0.9, 1.08)
# for Π r, and Σ_i Â_i s_i = −1.755 + 1.305 = −0.45; GSPO: s_i = (0.9·λ_i)^(1/3) and ∂s_i/∂log π_t = s_i/3
ex22 = {
    "adv": torch.tensor([-1.5, 0.5, 0.5, 0.5], dtype=f64),
    "lam": torch.tensor([1.3, 0.7, 1.0, 1.2], dtype=f64),
    False: -0.45 / 4,
    True: (-1.5 * 1.17 ** (1 / 3) + 0.5 * (0.63 ** (1 / 3) + 0.9 ** (1 / 3) + 1.08 ** (1 / 3))) / (3 * 4),
}


# %%
def case_2_2(gen):
    """A random group for the check: (adv, ρ1, ρ2, lam, length_norm) and what it holds."""
    i = gen.initial_seed() % 1000
    kind, turn = i % 4, i // 4 % 2
    g = 2 if kind == 0 else int(torch.randint(3, 7, (), generator=gen))
    adv = torch.randn(g, generator=gen, dtype=f64)
    adv = adv - adv.mean() if kind < 2 else adv
    lam = 0.2 + 2.8 * torch.rand(g, generator=gen, dtype=f64)
    if kind == 1:
        lam[:] = lam[0]  # every last token moved alike
    elif kind == 2:
        adv = torch.randint(2, (g,), generator=gen).to(f64)  # raw 0/1 rewards: Σ ≠ 0, zero rows
    rho1, rho2 = (0.3 + 1.7 * torch.rand(2, generator=gen, dtype=f64)).tolist()
    length_norm = bool(turn)
    what = ["a group of two", "equal λ_i", "raw 0/1 rewards (Σ ≠ 0)", "Σ Â ≠ 0"][kind]
    return (adv, rho1, rho2, lam, length_norm), f"length_norm={length_norm}, {what}, G = {g}"


# %%
def my_prefix_net(adv: torch.Tensor, rho1: float, rho2: float, lam: torch.Tensor, length_norm: bool) -> float:
    """Σ_i ∂J/∂logp_(i,1) on the shared first token, J = (1/G) Σ_i s_i·Â_i."""
    raise NotImplementedError("Exercise 2.2: replace this line with your code")


# %%
with check("2.2"):
    forbid(my_prefix_net, ("backward", "autograd"), why="write the net coefficient yourself")
    for length_norm in (False, True):
        what = f"the net coefficient with length_norm={length_norm}"
        got = number(my_prefix_net(ex22["adv"], 1.2, 0.75, ex22["lam"], length_norm), what)
        reject(got, 0.0, f"{what}: 0 is GRPO's answer (eq. 9); a sequence weight multiplies the shared token by each completion's own s_i")  # fmt: skip
        reject(got, (-1.5 * 1.3 + 0.5 * 2.9) / 4, f"{what}: s_i = ρ1·ρ2·λ_i, the shared steps' ratios are part of every completion's weight")  # fmt: skip
        reject(got, 3 * ex22[True], f"{what}: the 1/|τ_i| = 1/3 of ∂s_i/∂log π_t = s_i/|τ_i| is missing")
        expect_close(got, ex22[length_norm], what)

    def reference(adv, rho1, rho2, lam, length_norm):  # each completion's ∂(s_i·Â_i/G)/∂log π_1
        total = 0.0
        for i in range(len(adv)):
            s_i = rho1 * rho2 * float(lam[i])
            total += float(adv[i]) * (s_i ** (1 / 3) / 3 if length_norm else s_i) / len(adv)
        return total

    def compare(got, expected, what, at):  # a number, whatever float type computed it
        expect_close(number(got, f"{what} {at}"), expected, what, at=at, rtol=1e-6, atol=1e-9)

    expect_cases(
        my_prefix_net, reference, case_2_2, "the net coefficient on the shared first token", compare=compare
    )
