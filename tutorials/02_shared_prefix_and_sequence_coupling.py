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
from exercise_check import check, expect_close, number  # the exercises' check cells (next to this file)

from cancellation import compute_loss
from cancellation.diagnostics import token_coefficients
from cancellation.objectives import sequence_log_ratio
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
print("s = Π_t r (eq. 37):", s_prod, "  ρ1ρ2λ =", [rho1 * rho2 * lam1, rho1 * rho2 * lam2])
coef_seq = token_coefficients("gspo", logp, old_logp, adv, mask, group, length_norm=False, **NO_CLIP)
print("\ncoefficients, s = Π r:\n", coef_seq)
print("\nnet on shared step t = 1 (autograd):      ", float(coef_seq[:, 0].sum()))
print("eq. (38)/G (toymodel.theory):             ", theory.eq38_coefficient(rho1, rho2, lam1, lam2, A))
print("eq. (38) itself, A·ρ1·ρ2·(λ2 − λ1):       ", theory.eq38_surrogate(rho1, rho2, lam1, lam2, A))

# %% [markdown]
# GSPO proper uses the length-normalised ratio $s_i = (\prod_t r_{i,t})^{1/T_i}$ (eq. 44). Each token
# then gets $\hat A_i s_i/(G\,T_i)$ (eq. 58), and the shared steps keep
# $\frac{A}{G T}(s_2 - s_1)$: smaller, same structure, still non-zero.

# %%
coef_gspo = token_coefficients("gspo", logp, old_logp, adv, mask, group, **NO_CLIP)
print("net on t = 1, GSPO (autograd):", float(coef_gspo[:, 0].sum()))
print("closed form (A/(G·T))(s2 − s1):", theory.eq38_gspo_coefficient(rho1, rho2, lam1, lam2, A))

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
    "DFPO min": ("dfpo", {"transform": "min_replace"}),
    "DFPO orth": ("dfpo", {"transform": "orth_proj"}),
}
print(f"{'ρ1, ρ2, λ1, λ2':22}" + "".join(f"{name:>22}" for name in variants))
print(f"{'':22}" + "".join(f"{'autograd / paper':>22}" for _ in variants))
for setting in settings:
    cells = []
    for objective, params in variants.values():
        net = shared_prefix_net(objective, *setting, **params, **NO_CLIP)[0]
        paper = theory.shared_prefix_closed_form(objective, *setting, **params, **NO_CLIP).value
        assert abs(net - paper) < 1e-12
        cells.append(f"{net:+.4f} / {paper:+.4f}")
    print(f"{setting!s:22}" + "".join(f"{c:>22}" for c in cells))

# %% [markdown]
# Autograd and the closed form agree to machine precision (the `assert` in the cell checks it; a
# "−0.0000" is a rounding error of order 1e-17). A
# picture of eq. (38): fix $\rho_1, \rho_2, \lambda_1$ and move $\lambda_2$. The sequence-coupled
# objectives leave a coefficient proportional to $\lambda_2 - \lambda_1$ on the shared prefix;
# GRPO and DFPO stay at 0.

# %%
lam2_grid = [0.2 + 0.05 * k for k in range(37)]  # up to 2.0: keeps 0.3·(λ1 + λ2) < 1
fig = go.Figure()
for name, (objective, params) in variants.items():
    nets = [shared_prefix_net(objective, rho1, rho2, lam1, l2, **params, **NO_CLIP)[0] for l2 in lam2_grid]
    fig.add_scatter(x=lam2_grid, y=nets, mode="markers", name=f"{name} (autograd)")
fig.add_scatter(
    x=lam2_grid,
    y=[theory.eq38_coefficient(rho1, rho2, lam1, l2) for l2 in lam2_grid],
    mode="lines",
    name="eq. (38)/G",
)
fig.add_scatter(
    x=lam2_grid,
    y=[theory.eq38_gspo_coefficient(rho1, rho2, lam1, l2) for l2 in lam2_grid],
    mode="lines",
    name="(A/(G·T))(s2 − s1)",
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


for name, (objective, params) in variants.items():
    kl1, kl2 = (
        root_kl_after_one_step(objective, 0.1, **params),
        root_kl_after_one_step(objective, 0.2, **params),
    )
    ratio = f"{kl2 / kl1:.3f}" if kl1 > 0 else "  —  "
    print(f"{name:10}  KL at <start> after η=0.1: {kl1:.3e}   η=0.2: {kl2:.3e}   ratio {ratio}")

# %% [markdown]
# GRPO and DFPO leave the root distribution exactly where it was; the sequence-coupled objectives
# move it, and doubling the step quadruples the drift, the $\eta^2$ of eq. (3). Over many steps
# these drifts add up as the learning tax. (Whether they add up or average out depends on whether
# the sign of $\lambda_2 - \lambda_1$ is systematic; tutorial 3 looks at what a multi-step run shows.)
#
# ## Exercises
#
# Write the body of each `my_*` function (until you do, it raises `NotImplementedError`), run its
# cell, then run the check cell below it: it prints ✓ or says what is missing or wrong. A worked
# solution is in `tutorials/solutions/02_shared_prefix_and_sequence_coupling.py`; try first.
#
# **Exercise 2.1 — eq. (38) from the coefficients.** Write `my_shared_net(ρ1, ρ2, λ1, λ2)` returning
# the net coefficient of the shared step $t = 2$ ("is") under the product-weight objective
# (`gspo` with `length_norm=False`, no clipping), computed from `token_coefficients` on the
# two-completion group. The check compares it with the paper's closed form, eq. (38)/G.


# %%
def my_shared_net(rho1: float, rho2: float, lam1: float, lam2: float) -> float:
    """Σ_i ∂J/∂logp_(i,2) for the group {τ1, τ2}, from `token_coefficients`."""
    raise NotImplementedError("Exercise 2.1: replace this line with your code")


# %%
with check("2.1"):
    for setting in [(1.1, 0.9, 1.3, 0.7), (0.4, 1.6, 2.0, 0.5), (1.9, 1.05, 0.9, 1.1)]:
        expect_close(
            my_shared_net(*setting),
            theory.eq38_coefficient(*setting),
            "the shared step's net coefficient",
            at=f"at (ρ1, ρ2, λ1, λ2) = {setting}",
        )

# %% [markdown]
# **Exercise 2.2 — when does GSPO cancel?** For $\rho_1 = 1.2$, $\rho_2 = 0.8$, $\lambda_1 = 0.9$, find
# the $\lambda_2$ for which GSPO (length-normalised, no clipping) leaves **no** net coefficient on the
# shared prefix. (Eq. 13 and Cor. 3.3: cancellation under sequence coupling needs $u_1 = u_2$, a
# set of measure zero.)


# %%
def my_cancelling_lambda2(rho1: float, rho2: float, lam1: float) -> float:
    """The λ2 that makes GSPO's shared-prefix coefficient vanish (a number or a formula)."""
    raise NotImplementedError("Exercise 2.2: replace this line with your answer")


# %%
with check("2.2"):
    l2 = number(my_cancelling_lambda2(1.2, 0.8, 0.9), "λ2")
    net = shared_prefix_net("gspo", 1.2, 0.8, 0.9, l2, **NO_CLIP)[0]  # step 1 ("answer"); step 2 is equal
    expect_close(net, 0.0, "GSPO's net coefficient on the shared prefix", at=f"at λ2 = {l2}")
