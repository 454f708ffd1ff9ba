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
# # 3 · Equivalent solutions and entropy collapse (DFPO App. A.3)
#
# Two answers can be equally correct and still be learned at different speeds. The DFPO paper's
# second failure mode is **probability drift between equivalent correct solutions**: when a
# sequence-level objective weights them by different $s_i$, their log-odds move even though their
# advantages are equal, and over many steps one surface form can take all the mass (entropy
# collapse on the equivalent set, Cor. 3.2). This tutorial does eq. (41) first, on one exact step,
# then runs the toy for many steps and is explicit about what the toy does and does not show.

# %%
import math
import statistics

import plotly.io as pio
import torch
from exercise_check import check, expect_cases, expect_close, forbid, number, reject  # the exercises' checks
from plotly.subplots import make_subplots
from show import fmt, report_rows, table  # tables of the cells' numbers; quotes of experiments/REPORT.md

from cancellation import compute_loss, group_advantages
from cancellation.objectives import sequence_log_ratio
from plots import ARM_COLORS, SYMBOLS, seed_band  # arm colours and markers (the app's); mean ± 1 std
from toymodel import simulate
from toymodel.scenarios import EQUIVALENT_SOLUTIONS

pio.renderers.default = "plotly_mimetype+notebook_connected"
torch.set_num_threads(1)  # the toy's tensors are tiny: one thread is fastest
torch.set_printoptions(precision=4, sci_mode=False)
f64 = torch.float64
NO_CLIP = {"epsilon_low": 0.999999, "epsilon_high": 1e9}  # the paper's linear-region analysis

# %% [markdown]
# ## 1. The toy: "What is 10+10?" (eq. 25–30)
#
# $$\tau_1 = \text{"The answer is 25 ."}\ (R=0),\quad \tau_2 = \text{"The answer is 20 ."}\ (R=1),\quad
# \tau_3 = \text{"10 + 10 = 20 ."}\ (R=1).$$
#
# $\tau_2$ and $\tau_3$ form the **equivalent set**: same reward, different length (5 vs 6 tokens)
# and different local likelihood. The tabular policy has two real choices: the first token
# (The / 10) and the answer after "The answer is" (25 / 20). It starts uniform.

# %%
sc = EQUIVALENT_SOLUTIONS
policy = sc.policy()
theta_old = sc.initial_logits()
probs = policy.probs(theta_old)
table(
    [
        {
            "τ": f"τ{i + 1}",
            "text": policy.text(i),
            "|τ|": int(policy.lengths[i]),
            "R": policy.rewards[i],
            "π(τ)": probs[i],
        }
        for i in range(policy.N)
    ]
)
print("\nequivalent set:", [policy.text(int(i)) for i in policy.equivalent])
print("log-odds log π(τ2)/π(τ3):", fmt(policy.equiv_log_odds(theta_old), 6))
print("equivalent-set entropy:   ", fmt(policy.equiv_entropy(theta_old), 6), "(max log 2 = 0.693147)")

# %% [markdown]
# The group $\{\tau_1, \tau_2, \tau_3\}$ with the paper's unscaled advantages (eq. 29–30):

# %%
idx = torch.arange(3)
group = torch.zeros(3, dtype=torch.long)
adv = group_advantages(policy.rewards[idx], group, scale="none")
mask = policy.mask[idx]
old_logp = policy.token_logp(theta_old, idx)
print("Â =", adv, " (eq. 30: −2/3, 1/3, 1/3)")

# %% [markdown]
# ## 2. Different sequence weights for equal advantages (eq. 39)
#
# After some training $\theta \ne \theta_\text{old}$. Take $\pi_\theta(\text{The}) = 0.3$ and
# $\pi_\theta(\text{20} \mid \text{The answer is}) = 0.6$. GSPO's sequence weight is the
# length-normalised ratio (eq. 44)
#
# $$s_i(\theta) = \Big(\frac{\pi_\theta(\tau_i)}{\pi_{\theta_\text{old}}(\tau_i)}\Big)^{1/|\tau_i|}
#   = \exp\Big(\frac{1}{|\tau_i|}\sum_t \log r_{i,t}\Big). \qquad\text{(eq. 44)}$$

# %%
theta = policy.logits_from_probs(
    {(): {"The": 0.3, "10": 0.7}, ("The", "answer", "is"): {"25": 0.4, "20": 0.6}}
)
logp = policy.token_logp(theta, idx)
s = sequence_log_ratio(logp, old_logp, mask).exp()
print("s (GSPO, eq. 44):", s)
print("Â·s:             ", adv * s, "  ← Â2·s2 ≠ Â3·s3 although Â2 = Â3 (eq. 39)")

# %% [markdown]
# ## 3. One step: the log-odds change (eq. 40–41)
#
# In the linear region each completion's log-probability moves by $\eta\,c\,\hat A_i s_i$ (eq. 40), so
#
# $$\log\frac{\pi_{\theta^+}(\tau_2)}{\pi_{\theta^+}(\tau_3)}
#   \approx \log\frac{\pi_\theta(\tau_2)}{\pi_\theta(\tau_3)}
#   + \eta\,c\,\big(\hat A_2 s_2 - \hat A_3 s_3\big) \qquad\text{(eq. 41)}.$$
#
# DFPO's Min-Replace gives every completion the same weight $\tilde s_i = \min_j \bar s_j$ (eq. 50),
# which removes the $s_2 \ne s_3$ term. We take one exact SGD step ($\eta = 0.01$, no clipping) with
# each objective through `compute_loss` and measure the change of the log-odds on the exact policy:


# %%
def log_odds_change(objective: str, eta: float = 0.01, **params) -> float:
    """Δ log π(τ2)/π(τ3) after one SGD step of size eta on the group {τ1, τ2, τ3} at θ."""
    z = theta.clone().requires_grad_(True)
    loss, _ = compute_loss(
        objective, policy.token_logp(z, idx), old_logp, adv, mask, group, **params, **NO_CLIP
    )
    (grad,) = torch.autograd.grad(loss, z)
    grad = torch.where(policy.valid, grad, torch.zeros_like(grad))
    return policy.equiv_log_odds(theta - eta * grad) - policy.equiv_log_odds(theta)


variants = {
    "GRPO": ("grpo", {}),
    "GSPO": ("gspo", {}),
    "DFPO Min-Replace": ("dfpo", {"transform": "min_replace"}),
    "DFPO Orth-Proj": ("dfpo", {"transform": "orth_proj"}),
}
delta = {name: log_odds_change(obj, **params) for name, (obj, params) in variants.items()}
table([{"objective": name, "Δ log-odds (one step)": d} for name, d in delta.items()])
s_driven = delta["GSPO"] - delta["DFPO Min-Replace"]
print(
    f"\ns-driven part (GSPO − DFPO Min-Replace) = {fmt(s_driven)}, {fmt(100 * s_driven / abs(delta['GSPO']), 2)} % of GSPO's step"
)

# %% [markdown]
# Read this carefully, because it is the honest version of eq. (41) on this toy:
#
# * **Every objective moves the log-odds down** (the table: GRPO, GSPO and Min-Replace by
#   $1.1$–$1.2\times10^{-4}$, Orth-Proj by $1.6\times10^{-4}$), GRPO included, which
#   cancels shared tokens exactly. The reason is credit assignment, not coupling: $\tau_2$ shares its
#   first token "The" with the wrong $\tau_1$, so pushing $\tau_1$ down pulls $\tau_2$ down with it.
#   That is the policy gradient doing its job (given these samples, "10" is the safer first token).
# * **The part eq. (41) is about** is the difference between GSPO and DFPO Min-Replace, which share
#   everything except the within-group spread of the weights: the printed s-driven part, a few
#   percent of GSPO's step here. (Its sign is not simply that of $s_2 - s_3$: $\tau_1$'s weight enters through the
#   shared "The" as well, which is why eq. 40's constant $c$ is not one number on this toy.)
# * Orth-Proj changes the weights more than Min-Replace (it rebalances $\tau_1$ against the
#   positives), so its step differs more; cancelling the s-driven term does not make the update
#   smaller or neutral, it makes it *exchangeable*.
#
# ## 4. Many steps: does the equivalent set collapse?
#
# `simulate` trains the toy: each step samples a group of $G = 8$ from $\pi_{\theta_\text{old}}$,
# computes advantages and the loss with `cancellation`, takes 4 inner SGD steps against the frozen
# $\theta_\text{old}$ (so ratios leave 1 and coupling and clipping act), and records exact statistics.
# We compare six variants over 5 seeds. GSPO's own clip range is $\varepsilon = 3\cdot10^{-4} /
# 4\cdot10^{-4}$; the "ε=0.2" variants use GRPO's range instead. DFPO runs the paper's estimator
# (every completion, clipped or not, keeps $\tilde s_i\hat A_i$ on $\nabla\log s_i$; tutorial 5), and
# the "eq. 86 control" is GSPO's weight $\bar s_i$ under that same estimator with no transform: the control
# that tells the estimator's effect from the transform's.

# %%
E02 = {"epsilon_low": 0.2, "epsilon_high": 0.2}
runs_spec = {
    "GRPO": ("grpo", {}),
    "GSPO": ("gspo", {}),
    "eq. 86 control": ("gspo", {"estimator": "paper"}),
    "DFPO Min-Replace": ("dfpo", {"transform": "min_replace"}),
    "GSPO ε=0.2": ("gspo", E02),
    "DFPO Min-Replace ε=0.2": ("dfpo", {"transform": "min_replace", **E02}),
}
SEEDS, STEPS = range(5), 100
runs = {
    name: [simulate(sc, obj, steps=STEPS, seed=seed, **params) for seed in SEEDS]
    for name, (obj, params) in runs_spec.items()
}
ARM_COLOR = {name: ARM_COLORS[name.removesuffix(" ε=0.2")] for name in runs_spec}  # as in every tutorial

# %% [markdown]
# Each curve is the mean over the 5 seeds with a band of ±1 standard deviation (`plots.seed_band`,
# the app's own curves). An arm has the same colour in both panels and in every tutorial
# (`plots.ARM_COLORS`). Several arms end on top of each other, so each also has its own dash and
# marker symbol, and its markers sit on its own steps (every 12th, shifted by 2 per arm): the eq. 86
# control (dashed, open squares, drawn last) runs on DFPO Min-Replace's curve at GSPO's ε, the
# point section 5 makes; the ε = 0.2 arms are dotted and dash-dotted.


# %%
DASH = {"eq. 86 control": "dash", "GSPO ε=0.2": "dot", "DFPO Min-Replace ε=0.2": "dashdot"}


def add_curve(fig, name, rows_by_seed, key, col):
    """The mean of `key` over the seeds and its ±1 std band, in the arm's colour, dash and marker."""
    x, mean, std, _ = seed_band(rows_by_seed, key)
    c, k = ARM_COLOR[name], list(runs_spec).index(name)
    band = dict(
        fill="toself", fillcolor=c, opacity=0.15, line={"width": 0}, hoverinfo="skip", showlegend=False
    )
    fig.add_scatter(
        x=[*x, *x[::-1]], y=[*(mean + std), *(mean - std)[::-1]], legendgroup=name, **band, row=1, col=col
    )
    sizes = [9 if (j - 2 * k) % 12 == 0 else 0 for j in range(len(x))]  # each arm marks its own steps
    fig.add_scatter(
        x=x, y=mean, name=name, legendgroup=name, showlegend=col == 1, row=1, col=col, mode="lines+markers",
        line={"color": c, "dash": DASH.get(name, "solid")}, marker={"symbol": SYMBOLS[k], "size": sizes, "color": c},
    )  # fmt: skip


# %%
fig = make_subplots(rows=1, cols=2, subplot_titles=("log π(τ2)/π(τ3)", "equivalent-set entropy (nats)"))
for name in sorted(runs, key=lambda n: n == "eq. 86 control"):  # the control last, on top of DFPO
    for col, key in ((1, "equiv_log_odds"), (2, "equiv_entropy")):
        add_curve(fig, name, runs[name], key, col)
fig.update_layout(
    title="equivalent_solutions, mean ± 1 std over 5 seeds (G=8, 4 inner epochs, SGD lr 0.5)", height=420
)
fig.update_xaxes(title_text="step")
fig.show()


# %%
def final_row(name, rows_by_seed):
    """Mean ± std over the seeds of the last step's log-odds and entropy, E[R], and the mean clip/frac."""
    lo = [rows[-1]["equiv_log_odds"] for rows in rows_by_seed]
    h = [rows[-1]["equiv_entropy"] for rows in rows_by_seed]
    # clip/frac at the last inner step, over the steps that had a learning signal
    clip = [row["clip/frac"] for rows in rows_by_seed for row in rows if row["zero_adv_group_frac"] < 1.0]
    return {
        "variant": name,
        "final log-odds": f"{statistics.mean(lo):+.2f} ± {statistics.stdev(lo):.2f}",
        "final entropy": f"{statistics.mean(h):.2f} ± {statistics.stdev(h):.2f}",
        "E[R]": statistics.mean(rows[-1]["expected_reward"] for rows in rows_by_seed),
        "clip/frac": statistics.mean(clip),
    }


table([final_row(name, rows_by_seed) for name, rows_by_seed in runs.items()], digits=3)

# %% [markdown]
# ## 5. What the toy shows, and what it does not
#
# Read the table above (5 seeds, so its ± are wide):
#
# * **At GSPO's own clip range, GSPO and DFPO differ, and the estimator is why.** With
#   $\varepsilon = 3\cdot10^{-4}$ nearly every sequence is clipped after the first inner step (the
#   `clip/frac` column). GSPO then gives a clipped sequence no gradient, so its later inner steps do
#   little: it learns more slowly and ends with the largest entropy and the log-odds closest to 0.
#   DFPO's paper estimator keeps every sequence's gradient, clipped or not, and ends where GRPO does.
#   The eq. 86 control, the same estimator with no transform, ends at the same place: the difference
#   from GSPO is the estimator's, not the transform's.
# * **The collapse you see is mostly credit assignment.** GRPO, which cancels shared tokens exactly,
#   collapses the equivalent set about as much as the fastest arms (from the starting entropy 0.636514 printed
#   in section 1), always towards "10 + 10 = 20 .", because "The" is shared with the wrong answer. The
#   s-driven term of eq. (41) is a few percent of a step (section 3) and drowns in that, and in the
#   sampling noise, over a run: with ε=0.2, GSPO and DFPO Min-Replace end within a standard
#   deviation of each other, and so do the eq. 86 control and DFPO at GSPO's ε.
#
# The experiments (`experiments/REPORT.md`, 1024 seeds, the entropy compared at matched reward) decide
# these questions with paired tests. Quoted from its summary of predictions, on the same toy:

# %%
report_rows("toy_aggregation", "coupling")
report_rows("toy_main", "equivalent-set entropy")

# %% [markdown]
# So at matched reward GSPO keeps *more* equivalent-set entropy than DFPO and than GRPO (the
# contradicted rows), and the transform's own effect (DFPO against the eq. 86 control) is either a
# held difference of order $10^{-4}$ nats or not resolved.
#
# **Why "DFPO keeps a higher entropy than GSPO" is contradicted in one study and not resolved in the
# other.** The two rows ask the same words of two different toys, and neither isolates the coupling:
#
# * `toy_aggregation` runs this tutorial's toy. Its equivalent set is two answers, and their drift is
#   mostly credit assignment (τ2 shares "The" with the wrong τ1, section 3), the same for every arm.
#   GSPO runs at its own clip range, which silences most sequences after the first inner step (section
#   5's first point): it takes several times as many steps to reach E[R] ≥ 0.9 and gets there along
#   another path, which on this toy leaves more of the set's entropy at the matched step. That
#   difference is large against the seeds' spread (Δ = −0.04699 nats, interval [−0.04835, −0.04564]
#   over 1024 seeds), so the test decides it, on the other side from the prediction. What it measures
#   is GSPO's estimator (a clipped sequence gets no gradient), not sequence coupling: the comparison that
#   holds the estimator fixed, DFPO against the eq. 86 control, is the held row, a difference of
#   +9.30e-05 nats.
# * `toy_main` runs another toy, `template_task`: completions of one length whose equivalent set is
#   the 243 template forms of the correct answer (about 4 nats of entropy), and whose template choices
#   carry no reward, so nothing pushes the set in a systematic direction, only the noise of the
#   updates (the learning tax). There GSPO's slower path leaves the entropy where DFPO's does up to
#   the noise: Δ = −0.001958 nats with the interval [−0.01256, +0.008641] around 0, a difference smaller
#   than 1024 seeds resolve, so the prediction is neither held nor contradicted.
#
# The toy shows the *mechanism* exactly:
# eq. (39)'s unequal weights and the one-step s-driven part of eq. (41), which DFPO Min-Replace removes
# (section 3), and, on the shared-prefix toy, eq. (38)'s non-cancelling coefficient (tutorial 2).
# Whether those per-step terms accumulate into a measurable collapse depends on their sign being
# systematic, which at language-model scale (many shared tokens, long completions, far larger length
# differences) is the paper's claim and not something this three-trajectory toy can settle.
#
# ## Exercises
#
# Write the body of each `my_*` function (until you do, it raises `NotImplementedError`), run its
# cell, then run the check cell below it: it prints ✓ or says what is missing or wrong. Each check
# runs your function on numbers worked out by hand (its messages name the usual mistakes), then on 20
# random cases (a new seed each run, printed when a case fails; `TUTORIAL_CHECK_SEED=<seed>` reruns
# them) against its own plain-loop computation of the definition. An answer that calls the library
# (`policy` included), or reads the notebook's variables instead of its arguments, is refused before it
# runs. A worked solution is in `tutorials/solutions/03_equivalent_solutions_and_entropy_collapse.py`;
# try first.
#
# **Exercise 3.1 — sequence weights from the tokens.** Eq. (44) has two forms of the same weight:
# $\log\pi_\theta(\tau_i) = \sum_t \log\pi_\theta(a_t \mid h_t)$ over $\tau_i$'s real tokens, so
# $\pi_\theta(\tau_i)/\pi_{\theta_\text{old}}(\tau_i) = \prod_t r_{i,t}$. Write
# `my_sequence_weights(logp, old_logp, mask, length_norm)` that returns the $(B,)$ weights
# $s_i = \prod_t r_{i,t}$ (eq. 11, `length_norm=False`) or GSPO's $s_i = (\prod_t r_{i,t})^{1/|\tau_i|}$
# (`length_norm=True`) from the $(B, T)$ tensors of the tokens' log-probabilities under $\theta$ and
# $\theta_\text{old}$ and the mask ($|\tau_i|$ = row $i$'s real tokens; padding, mask 0, holds values
# that mean nothing). The check feeds it this toy's three trajectories at two $\theta$ worked out by
# hand, then random batches; `sequence_log_ratio`, which computes it in one call, is refused.

# %%
# the check's cases, worked out by hand (θ_old is uniform: π_old(The) = π_old(10) = π_old(25 | …) =
# π_old(20 | …) = 1/2; |τ| = 5, 5, 6): π_θ → Π r of τ1, τ2, τ3
weight_cases = [
    ({(): {"The": 0.3, "10": 0.7}}, [0.6, 0.6, 1.4]),
    ({(): {"The": 0.6, "10": 0.4}, ("The", "answer", "is"): {"25": 0.1, "20": 0.9}}, [0.24, 2.16, 0.8]),
]


# %%
def case_3_1(gen):
    """A random batch for the check: (logp, old_logp, mask, length_norm) and what it holds; padding
    holds random values that are not 0."""
    # expect_cases seeds its case i with seed·1000 + i: the kinds (and the choice below) come in turn
    i = gen.initial_seed() % 1000
    kind, length_norm = i % 5, bool(i // 5 % 2)
    b, t = int(torch.randint(2, 6, (), generator=gen)), int(torch.randint(3, 7, (), generator=gen))
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    lengths[0], lengths[-1] = t, (1 if kind == 1 else lengths[-1])  # one full row; a one-token row
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(f64)
    old_logp = -3 * torch.rand(b, t, generator=gen, dtype=f64)
    logp = old_logp + 0.4 * torch.randn(b, t, generator=gen, dtype=f64)
    if kind == 2:  # θ = θ_old on every real token: s = 1
        logp = torch.where(mask == 1, old_logp, logp)
    elif kind == 3:  # two identical completions
        logp[1], old_logp[1], mask[1], lengths[1] = logp[0], old_logp[0], mask[0], lengths[0]
    elif kind == 4:  # a token masked inside the full row (a tool's output, say): the mask is no prefix
        mask[0, 1] = 0.0
    what = ["unequal lengths", "a one-token row", "θ = θ_old", "identical rows", "a hole in row 0's mask"][
        kind
    ]
    return (logp, old_logp, mask, length_norm), f"length_norm={length_norm}, {what}, mask {mask.tolist()}"


# %%
def my_sequence_weights(
    logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, length_norm: bool
) -> torch.Tensor:
    """(B,) sequence weights: Π_t r over each row's real tokens (length_norm=False) or GSPO's (Π_t r)^(1/|τ|)."""
    raise NotImplementedError("Exercise 3.1: replace this line with your code")


# %%
with check("3.1"):
    forbid(my_sequence_weights, why="sum the log-ratios of each row's real tokens yourself")
    for probs, prod in weight_cases:
        logp_th = policy.token_logp(policy.logits_from_probs(probs), idx)
        gspo = torch.tensor([prod[0] ** (1 / 5), prod[1] ** (1 / 5), prod[2] ** (1 / 6)], dtype=f64)
        prod = torch.tensor(prod, dtype=f64)
        got_prod, got_gspo = (my_sequence_weights(logp_th, old_logp, mask, flag) for flag in (False, True))
        reject(
            got_gspo,
            prod,
            f"GSPO's s_i at π_θ = {probs}: this is Π_t r (eq. 11); eq. 44 takes the |τ_i|-th root",
        )
        for T in (5, 6):
            reject(got_gspo, prod ** (1 / T), f"GSPO's s_i at π_θ = {probs}: every trajectory got the root 1/{T}; each takes its own length |τ_i| (5, 5, 6)")  # fmt: skip
        expect_close(got_prod, prod, "the weights Π_t r", at=f"at π_θ = {probs}")
        expect_close(got_gspo, gspo, "GSPO's weights s_i", at=f"at π_θ = {probs}")

    def reference(logp, old_logp, mask, length_norm):  # row by row, over its real tokens only
        s = torch.zeros(mask.shape[0], dtype=f64)
        for i in range(mask.shape[0]):
            logs = [float(logp[i, t] - old_logp[i, t]) for t in range(mask.shape[1]) if mask[i, t] == 1]
            s[i] = math.exp(sum(logs) / len(logs) if length_norm else sum(logs))
        return s

    expect_cases(my_sequence_weights, reference, case_3_1, "the sequence weights s_i", rtol=1e-9, atol=1e-12)

# %% [markdown]
# **Exercise 3.2 — entropy from log-odds.** The table of section 4 prints each arm's final log-odds
# $\ell = \log\pi(\tau_2)/\pi(\tau_3)$ and final equivalent-set entropy: the second is a function of the
# first. Renormalised over the equivalent set, $\tau_2$ has the share $p = \pi(\tau_2)/(\pi(\tau_2) +
# \pi(\tau_3))$. Write `my_equiv_entropy(log_odds)` returning the entropy (in nats) of the two-answer
# distribution $(p, 1 - p)$ as a number, from $\ell$ alone. (Then check a row of the table with it.)
# The random cases draw $\ell$ in $[-6, 6]$, 0 included.

# %%
# the check's values, worked out by hand: p = 1/(1 + e^(−ℓ)), H = −p·ln p − (1 − p)·ln(1 − p); ℓ = 0: ln 2;
# ℓ = −ln 2: p = 1/3. Then the same in bits, and −p·ln p alone (two wrong answers the check names).
entropy_by_hand = {-2.8: 0.219541, 0.0: 0.693147, -0.6931471805599453: 0.636514, 1.5: 0.475052}
entropy_in_bits = {0.0: 1.0, -0.6931471805599453: 0.918296, -2.8: 0.31673, 1.5: 0.685355}
entropy_one_term = {0.0: 0.346574, -0.6931471805599453: 0.366204, -2.8: 0.163892, 1.5: 0.16467}


# %%
def case_3_2(gen):
    """A random log-odds ℓ for the check, and what it is."""
    i = gen.initial_seed() % 1000
    kind = i % 5
    big = (8 + 22 * float(torch.rand((), generator=gen))) * (1 if i // 5 % 2 else -1)  # a share near 0 or 1
    ell = [
        0.0,
        -6 * float(torch.rand((), generator=gen)),
        6 * float(torch.rand((), generator=gen)),
        4.0,
        big,
    ][kind]
    return (ell,), f"ℓ = {ell:.6g}"


# %%
def my_equiv_entropy(log_odds: float) -> float:
    """Entropy (nats) of (p, 1 − p), p = τ2's share of the equivalent set, from ℓ = log π(τ2)/π(τ3)."""
    raise NotImplementedError("Exercise 3.2: replace this line with your code")


# %%
with check("3.2"):
    forbid(my_equiv_entropy, why="write the two-answer entropy yourself")
    for ell, expected in entropy_by_hand.items():
        got = number(my_equiv_entropy(ell), f"the entropy at ℓ = {ell:g}")
        if ell == -2.8:  # p = e^ℓ = 0.0608 would give 0.229191
            reject(got, 0.229191, "the entropy at ℓ = -2.8 uses p = e^ℓ = π(τ2)/π(τ3); τ2's share of the set is p = e^ℓ/(1 + e^ℓ)", rtol=1e-4)  # fmt: skip
        reject(got, entropy_in_bits[ell], f"the entropy at ℓ = {ell:g} is in bits (log base 2); the toy's entropies are in nats (natural log)", rtol=1e-4)  # fmt: skip
        reject(got, entropy_one_term[ell], f"the entropy at ℓ = {ell:g} is only −p·ln p; the other answer's share 1 − p has its term too", rtol=1e-4)  # fmt: skip
        expect_close(got, expected, "the equivalent-set entropy", at=f"at ℓ = {ell:g}", rtol=1e-5)

    def reference(ell):  # π(τ2) : π(τ3) = e^ℓ : 1, renormalised, then −Σ q·ln q
        weights = [math.exp(ell), 1.0]
        return -sum(w / sum(weights) * math.log(w / sum(weights)) for w in weights)

    def compare(got, expected, what, at):  # a number, float32 or float64
        expect_close(number(got, f"{what} {at}"), expected, what, at=at, rtol=1e-4, atol=1e-6)

    expect_cases(my_equiv_entropy, reference, case_3_2, "the equivalent-set entropy", compare=compare)
