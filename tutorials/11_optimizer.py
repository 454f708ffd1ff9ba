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
# # 11 · The optimiser: SGD and Adam
#
# Every tutorial so far measured cancellation on the **gradient**: the coefficients
# $c_{i,t} = \partial\mathcal J/\partial\log\pi$ and their net per shared event. With plain SGD the
# update is the gradient times the learning rate, so a context whose gradient cancels does not move.
# Language models are trained with Adam(W), whose update of each parameter is
#
# $$\Delta\theta = -\,\text{lr}\cdot\frac{\hat m}{\sqrt{\hat v}+\epsilon},\qquad
# m \leftarrow \beta_1 m + (1-\beta_1)g,\quad v \leftarrow \beta_2 v + (1-\beta_2)g^2$$
#
# ($\hat m$, $\hat v$ bias-corrected). Two consequences for cancellation, which this tutorial shows on
# the tabular toy:
#
# > 1. a context whose gradient cancels exactly at this step still moves, through $\hat m$ (the
# >    earlier steps' gradients);
# > 2. a small residual is not a small step: Adam divides by $\sqrt{\hat v}$, so its first step is
# >    $\text{lr}\cdot\operatorname{sign}(g)$ whatever $|g|$ (sign descent).
#
# Equation numbers without a paper name are the DFPO paper's ("Design Conditions for Intra-Group
# Learning of Sequence-Level Rewards", arXiv 2604.13088). The "cancellation-hypothesis paper" is
# "The Cancellation Hypothesis in Critic-Free RL: From Outcome Rewards to Token Credits" (arXiv
# 2605.08666). The gradients come from `cancellation`, the policy and the training runs from
# `toymodel`; the optimisers are `torch.optim`'s, as in `toymodel.simulate`.

# %%
import math

import plotly.graph_objects as go
import plotly.io as pio
import torch
from exercise_check import check, expect_cases, expect_close, forbid, number, reject  # the checks
from show import table

from cancellation import compute_loss, group_advantages
from cancellation.diagnostics import steps_to_threshold, value_at_threshold
from plots import ARM_COLORS  # one colour per arm (as in every tutorial)
from toymodel import get_scenario, simulate_seeds

pio.renderers.default = "plotly_mimetype+notebook_connected"
torch.set_num_threads(1)  # the toy's tensors are tiny: one thread is fastest
torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## 1. Two steps, two optimisers
#
# `template_task` (tutorial 3): five template positions of three synonyms each, then the deciding
# token and `<eos>`; context = position, so every completion shares the template softmaxes, like a
# language model's weights. Two hand-made groups of eight, one after the other:
#
# * group A: all eight start with "Let's" (position 0 is shared by the whole group, its GRPO gradient
#   cancels exactly), position 1 is mixed: the correct and the wrong completions chose "compute",
#   "calculate" and "evaluate" nearly alike, so its gradient is small;
# * group B: all eight also share "compute" at position 1, so **position 1's gradient is exactly 0**
#   at the second step.
#
# `gradient` is GRPO's gradient on the (C, K) logits (autograd through `compute_loss`, one group,
# θ = θ_old); `train` applies a list of groups with one `torch.optim` optimiser, recomputing the
# gradient at the current logits before each step.

# %%
sc = get_scenario("template_task")
policy = sc.policy()
T1 = ("the", "sum", ":")
WORDS_A = ("compute", "compute", "calculate", "evaluate", "compute", "calculate", "calculate", "evaluate")
ANSWERS = ("correct",) * 4 + ("wrong_a", "wrong_b") * 2
group_a = [("Let's", w, *T1, a) for w, a in zip(WORDS_A, ANSWERS, strict=True)]
group_b = [("Let's", "compute", *T1, a) for a in ANSWERS]
for name, texts in (("A", group_a), ("B", group_b)):
    print(f"group {name}:", " | ".join(" ".join(t[1:2] + t[-1:]) for t in texts))


# %%
def gradient(z: torch.Tensor, texts: list) -> torch.Tensor:
    """(C, K) ∂loss/∂logits of GRPO on one group at θ = θ_old = z (0 in unused slots)."""
    idx = torch.tensor([policy.trajectory_index((*t, "<eos>")) for t in texts])
    group = torch.zeros(len(texts), dtype=torch.long)
    leaf = z.detach().clone().requires_grad_(True)
    logp = policy.token_logp(leaf, idx)
    adv = group_advantages(policy.rewards[idx], group)
    compute_loss("grpo", logp, logp.detach(), adv, policy.mask[idx], group)[0].backward()
    return leaf.grad.nan_to_num(0.0)


# %%
def train(kind: str, lr: float, groups: list) -> tuple[list, list]:
    """Apply the groups' gradients one step each with torch.optim SGD or Adam; per step (grad, Δz)."""
    z = sc.initial_logits()
    opt = torch.optim.SGD([z], lr=lr) if kind == "sgd" else torch.optim.Adam([z], lr=lr)
    grads, moves = [], []
    for texts in groups:
        g = gradient(z, texts)
        before = z.detach().clone()
        z.grad = g
        opt.step()
        grads.append(g)
        moves.append((z.detach() - before).nan_to_num(0.0))  # −inf slots stay −inf: Δ = 0
    return grads, moves


# %%
LR = {"sgd": 0.5, "adam": 0.02}  # toymodel's SGD default, and the Adam lr that learns as fast (section 3)
results = {kind: train(kind, lr, [group_a, group_b]) for kind, lr in LR.items()}
grads = results["sgd"][0]
rows = []
for c in range(policy.C - 1):  # the last context (<eos>) is forced: its score is always 0
    row = {
        "position": c,
        "|g| step 1": float(grads[0][c].abs().max()),
        "|g| step 2": float(grads[1][c].abs().max()),
    }
    for kind, (_, moves) in results.items():
        for step in (0, 1):
            row[f"{kind} |Δz| {step + 1} /lr"] = float(moves[step][c].abs().max()) / LR[kind]
    rows.append(row)
table(rows)

# %% [markdown]
# (Each entry is the largest $|\,\cdot\,|$ over the context's three logits; the moves are in units
# of each optimiser's learning rate.)
#
# * **Positions 0, 2–4** (shared by the whole group in both steps): GRPO's gradient cancels, to
#   rounding (2e-18, from the standardised advantages). SGD does not move them (0.5 × 2e-18 is lost
#   when added to a logit of order 1); Adam moves them by about 2e-10 lr: its moments start at 0, and
#   a gradient far below ε = 1e-8 stays far below a step.
# * **Position 1** (mixed in A, shared in B): at step 2 its gradient is 0 (to rounding). SGD leaves
#   it; **Adam moves it by 0.67 lr**, two thirds of a full step: $\hat m$ remembers step 1.
#   Exercise 11.1 derives the 0.67.
# * **Step 1 under Adam**: position 1's gradient is a quarter of the deciding token's (position 5),
#   yet both move by lr: Adam's first step is $\Delta z = -\text{lr}\cdot g/(|g|+\epsilon)$ per logit
#   ($\hat m = g$ and $\hat v = g^2$ after one step), the sign descent of the cancellation-hypothesis
#   paper's App. D.3. Under SGD they move in proportion to their gradients.
#
# ## 2. A residual is not a small step
#
# The same sign descent applies to what the earlier tutorials called a residual. A shared event
# whose coefficients nearly cancel (a clipped sequence, a length mismatch, tutorial 10) leaves a
# gradient $\delta$ on its context. SGD moves it by lr·δ; Adam's first step by lr·δ/(δ + ε), which
# is a full lr for any δ ≫ ε = 1e-8. One `torch.optim.Adam` step on one logit per residual size:

# %%
rows = []
for delta in (1.0, 1e-2, 1e-4, 1e-6, 1e-8, 1e-10):
    for kind, make in (("sgd", torch.optim.SGD), ("adam", torch.optim.Adam)):
        p = torch.zeros(1, dtype=torch.float64, requires_grad=True)
        opt = make([p], lr=1.0)
        p.grad = torch.tensor([delta], dtype=torch.float64)
        opt.step()
        rows.append({"residual δ": delta, "optimiser": kind, "|Δθ| / lr": float(p.detach().abs())})
table(rows)

# %% [markdown]
# Under SGD the update shrinks with the residual; under Adam a residual of 1e-6 of the gradient scale
# gets the same first step as a gradient of 1, and only below ε does the step shrink. Later steps
# mix the history ($\hat v$ remembers large gradients, which then damp small ones), but the point
# stands: with Adam **"almost cancels" does not mean "almost does not move"**; only exact 0 at every
# step so far does.
#
# ## 3. In training: the learning tax under SGD and Adam
#
# The template contexts of `template_task` carry no reward information (the exact policy gradient
# on them is 0 for every θ), so their KL drift from the initial policy is learning tax (App. E/G).
# Their sampled gradients are noise: credit assignment from groups that do not share a synonym,
# plus nothing from groups that do (GRPO cancels those exactly). `simulate_seeds` trains 16 seeds of
# GRPO and of DFPO (ε = 0.2) for 80 steps (G = 8, 4 inner epochs) with SGD lr 0.5 and with Adam
# lr 0.02, chosen so that both reach E[R] ≥ 0.9 after about 20 steps.

# %%
SEEDS, STEPS = 16, 80
ARMS = {  # label → (objective, parameters, optimiser)
    "GRPO, SGD": ("grpo", {}, "sgd"),
    "GRPO, Adam": ("grpo", {}, "adam"),
    "DFPO ε=0.2, SGD": ("dfpo", {"epsilon_low": 0.2, "epsilon_high": 0.2}, "sgd"),
    "DFPO ε=0.2, Adam": ("dfpo", {"epsilon_low": 0.2, "epsilon_high": 0.2}, "adam"),
}
runs = {arm: simulate_seeds(sc, obj, SEEDS, steps=STEPS, optimizer=opt, lr=LR[opt], **p)
        for arm, (obj, p, opt) in ARMS.items()}  # fmt: skip

# %%
rows = []
for arm, r in runs.items():
    er, kl = r["expected_reward"], r["template_kl"]
    hits = [h for s in range(SEEDS) if (h := steps_to_threshold(er[s], 0.9, r["step"][s])) is not None]
    at_09 = torch.tensor([value_at_threshold(er[s], kl[s], 0.9) for s in range(SEEDS)])
    gsr = torch.nanmean(r["group_shared_residual"], dim=1)
    rows.append({"arm": arm, "steps→0.9": sum(hits) / len(hits), "reached": len(hits),
                 "KL at E[R]≥0.9": float(at_09.nanmean()),
                 "KL final": f"{float(kl[:, -1].mean()):.3f} ± {float(kl[:, -1].std()):.3f}",
                 "E[R] final": float(er[:, -1].mean()), "group-shared res.": float(gsr.nanmean())})  # fmt: skip
table(rows)
kl_ratio = float(
    runs["GRPO, Adam"]["template_kl"][:, -1].mean() / runs["GRPO, SGD"]["template_kl"][:, -1].mean()
)
print(f"GRPO's final template KL, Adam / SGD: {kl_ratio:.1f}×")


# %%
def curves(metric: str, title: str):
    """Per arm and step: the median over the 16 seeds and the 10–90 % band (what the seeds measured: a KL
    band never dips below 0); the optimiser's colour (`ARM_COLORS`), DFPO dashed."""
    fig, q = go.Figure(), torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    for arm, r in runs.items():
        lo, med, hi = torch.quantile(r[metric], q, dim=0).tolist()  # (3, STEPS): over the seeds
        step, c = r["step"][0].tolist(), ARM_COLORS[arm.rsplit(", ", 1)[1]]  # "SGD" or "Adam"
        fill = "rgba({},{},{},0.15)".format(*(int(c[k : k + 2], 16) for k in (1, 3, 5)))
        fig.add_scatter(x=step + step[::-1], y=hi + lo[::-1], fill="toself", fillcolor=fill, mode="lines",
                        line={"width": 0}, legendgroup=arm, showlegend=False, hoverinfo="skip")  # fmt: skip
        fig.add_scatter(x=step, y=med, mode="lines", name=arm, legendgroup=arm,
                        line={"color": c, "dash": "dash" if arm.startswith("DFPO") else None})  # fmt: skip
    fig.update_layout(title=title, xaxis_title="step", height=380)
    return fig


curves("template_kl", "Template KL drift (learning tax): median and 10–90 % over 16 seeds").show()
curves("expected_reward", "Expected reward: median and 10–90 % over 16 seeds").show()

# %% [markdown]
# At the same speed and with the same exact cancellation of whole-group events (residual 0 in every
# arm), Adam's template drifts several times further than SGD's, and it keeps drifting while the
# reward saturates, when more and more of SGD's steps have a zero gradient (a group of 8 correct
# completions has every Â = 0). The choice between GRPO and DFPO
# changes the drift far less than the choice of optimiser.
#
# ## 4. How much of Adam's drift happens at zero gradient
#
# The simulator does not expose its gradients, so we run the same loop by hand for a few steps: one
# group of 8 per step, one inner epoch (θ = θ_old, so GRPO cancels whole-group events exactly), and
# record every (step, template context) whose gradient is exactly 0: every completion chose the
# same synonym there, or every advantage was 0.


# %%
def drift_at_zero_gradient(kind: str, steps: int = 40, seed: int = 0) -> tuple[int, float, float]:
    """Run GRPO (G = 8, one inner epoch); (zero-gradient pairs, their share of the template's |Δz|, E[R])."""
    z, gen, tmpl = sc.initial_logits(), torch.Generator().manual_seed(seed), sc.template_context_ids()
    opt = torch.optim.SGD([z], lr=LR[kind]) if kind == "sgd" else torch.optim.Adam([z], lr=LR[kind])
    n_zero, moved_zero, moved = 0, 0.0, 0.0
    for _ in range(steps):
        texts = [policy.trajectories[i][:-1] for i in policy.sample(8, z.detach(), generator=gen)]
        before, z.grad = z.detach().clone(), gradient(z, texts)
        zero = (z.grad[tmpl] == 0).all(-1)
        opt.step()
        move = (z.detach() - before).nan_to_num(0.0)[tmpl].abs().sum(-1)
        n_zero, moved_zero, moved = (
            n_zero + int(zero.sum()),
            moved_zero + float(move[zero].sum()),
            moved + float(move.sum()),
        )
    return n_zero, moved_zero / moved, policy.expected_reward(z.detach())


# %%
for kind in LR:
    n_zero, share, er = drift_at_zero_gradient(kind)
    print(f"{kind:4}: {n_zero} of 200 (step, template context) pairs had gradient exactly 0; "
          f"they carry {share:.1%} of the template's movement (E[R] after 40 steps {er:.2f})")  # fmt: skip

# %% [markdown]
# Under SGD those pairs carry nothing, by construction. Under Adam they carry a visible part of the
# drift, and the rest of Adam's extra drift is the second effect: the noise gradients of the template
# (small next to the deciding token's) are scaled up to steps of about lr each.
#
# ## 5. What this means for the papers' claims
#
# * DFPO's argument (eq. 2, 9, 72) and the cancellation-hypothesis paper's are statements about the
#   **gradient**: a shared event whose coefficients sum to 0 contributes nothing to $\nabla\mathcal J$.
#   Under SGD that is nothing to the update, which is what our meters and the toy's first-order
#   checks (tutorial 3, eq. 40) assume.
# * Their LM runs train with an adaptive optimiser: the cancellation-hypothesis paper's runs use
#   verl, whose actor optimiser is AdamW by default; DFPO's appendix lists a learning rate of 8e-7
#   with warmup and cosine decay but names no optimiser (neither paper's text says "AdamW" for its
#   main runs). Under Adam(W) an exact cancellation at one step removes that step's contribution to
#   $m$ and $v$, not the update (section 1), and a small residual is not a small update (section 2).
#   So a gradient-level residual (our meters, eq. 72) says which events the objective stops pushing,
#   not how far the optimiser moves them. DFPO's App. E.1 (2) makes a related point: ineffective
#   gradients pollute Adam's moment estimates.
# * The cancellation-hypothesis paper runs its masked-update instruments (Table 1, Fig. 3) with plain
#   SGD **on purpose** (App. D.3): Adam's first step is sign descent and would wash out the per-token
#   magnitudes it measures. Its instruments measure the gradient; its training runs use Adam(W). On the
#   toy the two settings differ several-fold in learning tax at equal speed (section 3).
# * What this tutorial does not measure: each context of the tabular toy has its own logits, so Adam
#   normalises each context separately. In a language model a parameter's $\hat v$ mixes the
#   gradients of every token that uses it; how much that weakens or keeps the two effects above is a
#   question for a model with shared weights, not answered here.
#
# ## Exercises
#
# Write the body of each `my_*` function (until you do, it raises `NotImplementedError`), run its
# cell, then run the check cell below it: it prints ✓ or says what is missing or wrong. A worked
# solution is in `tutorials/solutions/11_optimizer.py`; try first. Each check works a case by hand,
# then compares your function with its own computation on 20 random cases (a new seed each run; a
# failure prints it). Write the optimiser's arithmetic yourself: an answer that uses `torch.optim`,
# autograd or the project's library is refused.


# %%
def coast_case(gen: torch.Generator) -> tuple[tuple, str]:
    """One random case of 11.1: torch's betas, a low β1, a low β2, both low; k from 1 to 40."""
    kind = gen.initial_seed() % 4
    b1 = 0.9 if kind in (0, 2) else float(0.3 + 0.65 * torch.rand(1, generator=gen))
    b2 = 0.999 if kind in (0, 1) else float(0.5 + 0.49 * torch.rand(1, generator=gen))
    k = int(torch.randint(1, 41, (1,), generator=gen))
    return (b1, b2, k), f"β = ({b1:.4g}, {b2:.4g}), k = {k}"


# %% [markdown]
# **Exercise 11.1 — Adam's coast.** One logit gets a gradient $g \neq 0$ ($|g| \gg \epsilon$) at its
# first Adam step and exactly 0 at every step after. Write `my_adam_coast(beta1, beta2, k)` returning
# $|\Delta\theta|/\text{lr}$ of the step $k$ steps later (ignore ε). It does not depend on $|g|$. The
# check works torch's defaults β = (0.9, 0.999) by hand ($k = 1$ is section 1's 0.67), then other
# betas.


# %%
def my_adam_coast(beta1: float, beta2: float, k: int) -> float:
    """|Δθ| / lr of Adam's update k steps after a single non-zero gradient (zero gradients since)."""
    raise NotImplementedError("Exercise 11.1: replace this line with your code")


# %%
with check("11.1"):
    forbid(my_adam_coast, ("optim", "autograd", "backward", "getattr"), why="write Adam's moments yourself")
    by_hand = {1: 0.670058, 2: 0.517957, 5: 0.309077, 20: 0.0628728}  # m̂_k/√v̂_k, worked out by hand
    for k, expected in by_hand.items():
        got = number(my_adam_coast(0.9, 0.999, k), "the step")
        expect_close(got, expected, "Adam's step (in units of lr) k steps after the last non-zero gradient",
                     at=f"at k = {k}", rtol=1e-5)  # fmt: skip

    def reference(b1, b2, k):  # Adam's moments step by step: g = 1 at step 1, then k zeros
        m = v = 0.0
        for g in [1.0] + [0.0] * k:
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        return m / (1 - b1 ** (k + 1)) / math.sqrt(v / (1 - b2 ** (k + 1)))

    def compare(got, expected, what, at):
        expect_close(number(got, what), expected, what, at=at, atol=1e-12, rtol=1e-5)

    expect_cases(my_adam_coast, reference, coast_case, "Adam's coasting step / lr", compare=compare)


# %%
def adamw_case(gen: torch.Generator) -> tuple[tuple, str]:
    """One random case of 11.2: P = 4 parameters over 2 to 8 steps, of one of five kinds."""
    kind = ("random", "one gradient then 0", "never a gradient", "below ε", "no decay")[
        gen.initial_seed() % 5
    ]
    steps = int(torch.randint(2, 9, (1,), generator=gen))
    theta = torch.randn(4, generator=gen, dtype=torch.float64)
    grads = torch.randn(steps, 4, generator=gen, dtype=torch.float64)
    grads[:, 0] = 0.0  # a parameter that never gets a gradient
    grads[1:] *= kind != "one gradient then 0"
    grads *= (kind != "never a gradient") * (1e-9 if kind == "below ε" else 1.0)
    b1, b2 = (
        float(0.5 + 0.45 * torch.rand(1, generator=gen)),
        float(0.8 + 0.199 * torch.rand(1, generator=gen)),
    )
    lr, eps = (
        float(0.01 + 0.2 * torch.rand(1, generator=gen)),
        10.0 ** -int(torch.randint(6, 9, (1,), generator=gen)),
    )
    wd = 0.0 if kind == "no decay" else float(0.5 * torch.rand(1, generator=gen))
    label = f"{kind}, {steps} steps, lr = {lr:.3g}, β = ({b1:.3g}, {b2:.4g}), ε = {eps:.0e}, λ = {wd:.3g}"
    return (theta, grads, lr, (b1, b2), eps, wd), label


# %% [markdown]
# **Exercise 11.2 — where a cancelled parameter ends up under AdamW.** Language models are trained with
# AdamW, which adds *decoupled* weight decay λ to Adam: at every step it first multiplies each
# parameter by $(1 - \text{lr}\,\lambda)$, then takes Adam's step (the moments see the gradient only,
# not the decay). Write `my_adamw(theta, grads, lr, betas, eps, weight_decay)` returning the parameters
# (a tensor like `theta`) after one step per row of `grads` (shape (steps, P): row $t$ is step $t$'s
# gradient), as `torch.optim.AdamW` would leave them. Think of a logit whose gradient cancels after
# its first step: it still moves, by the coast of 11.1 and by the decay, and one whose gradient is 0
# at every step only decays. The check works two steps by hand, then compares with its own run on
# random cases (other betas, no decay, gradients that vanish or stay 0, gradients below ε).


# %%
def my_adamw(
    theta: torch.Tensor,
    grads: torch.Tensor,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
) -> torch.Tensor:
    """θ after len(grads) steps of AdamW (bias-corrected moments, decoupled weight decay) from `theta`."""
    raise NotImplementedError("Exercise 11.2: replace this line with your code")


# %%
with check("11.2"):
    forbid(my_adamw, ("optim", "autograd", "backward", "getattr"), why="write AdamW's step yourself")
    theta = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    grads = torch.tensor([[1e-3, 0.0, 0.3], [0.0, 0.0, 0.0]], dtype=torch.float64)
    got = my_adamw(theta, grads, 0.1, (0.9, 0.999), 1e-8, 0.1)
    # step 1: θ·0.99 = (0.99, −1.98, 0.495), then −0.1·g/(|g| + ε) = (−0.099999, 0, −0.1);
    # step 2: θ·0.99, then −0.1·m̂/(√v̂ + ε) with m̂/√v̂ = 0.670058·sign(g) (11.1's coast; ε counts at 1e-3)
    by_hand = torch.tensor([0.814096112, -1.9602, 0.324044181], dtype=torch.float64)
    what = "θ after two AdamW steps (lr 0.1, λ 0.1)"
    reject(got, torch.tensor([0.800465203, -1.800166496, 0.324974365]), f"{what}: the decay went into the gradient (Adam's L2 weight_decay); AdamW's is decoupled: θ·(1 − lr·λ), the moments see g only")  # fmt: skip
    reject(got, torch.tensor([0.815756151, -1.9602, 0.325704239]), f"{what}: the decay came after Adam's step; AdamW multiplies θ by (1 − lr·λ) first")  # fmt: skip
    reject(got, torch.tensor([0.382476143, -1.9602, -0.107762257]), f"{what}: m and v are not bias-corrected (divide by 1 − β^t, t the step from 1)")  # fmt: skip
    expect_close(got, by_hand, what, rtol=1e-8)

    def reference(theta, grads, lr, betas, eps, weight_decay):  # torch's AdamW, one step per row
        p = theta.clone().requires_grad_(True)
        opt = torch.optim.AdamW([p], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        for g in grads:
            p.grad = g.clone()
            opt.step()
        return p.detach()

    expect_cases(my_adamw, reference, adamw_case, "θ after AdamW's steps", rtol=1e-9, atol=1e-12)
