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
# # 10 · Length and aggregation
#
# Tutorials 1–5 cancelled shared tokens inside groups whose completions all had the same length, or
# used the aggregation each objective ships with. Real completions differ in length, and the
# aggregation, the step that turns per-token terms into one loss, decides how a completion's length
# enters every token's coefficient. This tutorial follows one token that **every** completion of a
# group shares, and asks when its coefficients still cancel:
#
# > GRPO with `token-mean` cancels a shared token whatever the lengths; with `seq-mean-token-mean`
# > it does not once the lengths differ. DFPO keeps $\sum_i \tilde s_i\hat A_i = 0$, but its shared
# > token gets $\sum_i \tilde s_i\hat A_i/|y_i|$ (eq. 72), which is 0 only for equal lengths: with
# > unequal lengths most of its fix is gone.
#
# Equation numbers without a paper name are the DFPO paper's ("Design Conditions for Intra-Group
# Learning of Sequence-Level Rewards", arXiv 2604.13088). Every number comes from `cancellation`
# (the coefficients ∂J/∂logp and the cancellation meters) and `toymodel` (the tabular policy and its
# batched simulator).

# %%
import plotly.graph_objects as go
import plotly.io as pio
import torch
from exercise_check import check, expect_cases, expect_close, expect_equal, forbid, number, reject
from show import table

from cancellation import group_advantages
from cancellation.objectives import dfpo_weights
from cancellation.update import CancellationMeter, coefficients
from plots import ARM_COLORS  # one colour per arm (as in every tutorial)
from toymodel import Scenario, simulate_seeds

pio.renderers.default = "plotly_mimetype+notebook_connected"
torch.set_num_threads(1)  # the toy's tensors are tiny: one thread is fastest
torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## 1. A toy with a shared opener and two lengths
#
# None of the named scenarios has a token that a whole group shares *and* completions of different
# lengths, so we build one as a `toymodel.Scenario` (data only: the support, the rewards and the
# initial probabilities). Every completion starts with an opener, "Sure" (π = 0.9) or "OK", the
# token the group will share. Then it either answers at once ("20" or "25", 3 tokens with the end
# token) or works it out ("10 + 10 = 20", 7 tokens). Reward 1 iff the answer is 20. Working it out
# is right 75 % of the time, answering at once only a third of the time, so the correct completions
# tend to be the long ones, as in reasoning tasks. The twin `equal` pads the short answers with
# four forced "." tokens: the same decisions and rewards, all 7 tokens long. A forced token (the only
# action of its context) has a zero score $e_a - \pi = 0$, so the padding changes only the lengths.


# %%
def length_scenario(pad: bool) -> Scenario:
    """Opener (Sure/OK), then a short answer (3 tokens, or 7 padded with '.') or '10 + 10 = ..' (7)."""
    support, rewards, initial = [], [], {(): {"Sure": 0.9, "OK": 0.1}}
    for op in ("Sure", "OK"):
        initial[(op,)] = {"20": 0.2, "25": 0.4, "10": 0.4}
        initial[(op, "10", "+", "10", "=")] = {"20": 0.75, "25": 0.25}
        for ans in ("20", "25"):
            support.append((op, ans, *(["."] * 4 if pad else []), "<eos>"))
            support.append((op, "10", "+", "10", "=", ans, "<eos>"))
            rewards += [float(ans == "20")] * 2
    name = "equal" if pad else "unequal"
    return Scenario(name, f"opener + short/long answer ({name} lengths)", "tutorial 10", tuple(support),
                    tuple(rewards), initial=initial)  # fmt: skip


scenarios = {"unequal": length_scenario(pad=False), "equal": length_scenario(pad=True)}
policy = scenarios["unequal"].policy()
probs = policy.probs(scenarios["unequal"].initial_logits())
table([{"completion": policy.text(i), "|y|": int(policy.lengths[i]), "R": float(policy.rewards[i]),
        "π": float(probs[i])} for i in range(policy.N)])  # fmt: skip

# %% [markdown]
# ## 2. One group, two aggregations
#
# A group of four that all open with "Sure": two long correct completions, a short wrong one and a
# short correct one. At the first update θ = θ_old, every ratio is 1, and GRPO's coefficient of a
# token of completion $i$ is $\hat A_i/N$ under `token-mean` ($N$ the group's tokens) but
# $\hat A_i/(G\,|y_i|)$ under `seq-mean-token-mean` (each completion's mean first, then the mean over
# completions). `coefficients(objective, logp, old_logp, adv, mask, group, aggregation=...)` gets
# them by autograd through the loss; column 0 is the opener.

# %%
LONG20 = ("Sure", "10", "+", "10", "=", "20", "<eos>")
texts = [LONG20, LONG20, ("Sure", "25", "<eos>"), ("Sure", "20", "<eos>")]
idx = torch.tensor([policy.trajectory_index(t) for t in texts])
group = torch.zeros(4, dtype=torch.long)
adv = group_advantages(policy.rewards[idx], group)
mask, keys = policy.mask[idx], policy.event_keys[idx]
logp = policy.token_logp(scenarios["unequal"].initial_logits(), idx)
coef = {agg: coefficients("grpo", logp, logp, adv, mask, group, aggregation=agg).coef
        for agg in ("token-mean", "seq-mean-token-mean")}  # fmt: skip
table([{"completion": policy.text(int(i)), "|y|": int(mask[k].sum()), "Â": float(adv[k]),
        "c token-mean": float(coef["token-mean"][k, 0]),
        "c seq-mean-token-mean": float(coef["seq-mean-token-mean"][k, 0])}
       for k, i in enumerate(idx)])  # fmt: skip
for agg, c in coef.items():
    print(f"net coefficient of the opener 'Sure', {agg:20}: {float(c[:, 0].sum()):+.6f}")

# %% [markdown]
# Under `token-mean` every token of completion $i$ weighs the same $1/N$, so the opener's net is
# $\frac1N\sum_i\hat A_i = 0$. Under `seq-mean-token-mean` the two long correct completions spread
# their advantage over 7 tokens and the short ones over 3, so the opener gets
# $\frac1G\sum_i \hat A_i/|y_i| = \frac14\big(\frac{0.5}{7}+\frac{0.5}{7}-\frac{1.5}{3}+\frac{0.5}{3}\big)
# = -\frac1{21}$: a push **down** on a token that cannot explain the reward, because the correct
# completions were longer.
#
# The cancellation meter of the toy and the trainer (`CancellationMeter`) measures the same thing
# over the whole batch: `group_shared_residual` is Σ|net| / Σ gross over the events the whole group
# shares (here only the opener), `sequence_net_residual` the same ratio for each completion's total
# coefficient $c_i = \sum_t c_{i,t}$ (the net push on all of a group's completions at once).


# %%
def residuals(c: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, group: torch.Tensor) -> dict:
    """The meter's three residuals of one coefficient tensor (one optimiser step)."""
    meter = CancellationMeter(keys, mask, group)
    meter.add(c)
    return meter.totals.residuals()


for agg, c in coef.items():
    r = residuals(c, keys, mask, group)
    print(f"{agg:20}: group-shared {r['group_shared_residual']:.4f}   "
          f"sequence-net {r['sequence_net_residual']:.4f}")  # fmt: skip

# %% [markdown]
# The two aggregations trade one cancellation for the other: `token-mean` cancels the shared token
# and leaves a net push on the completions ($\sum_i |y_i|\hat A_i \ne 0$), `seq-mean-token-mean`
# cancels the completions' totals ($\sum_i \hat A_i = 0$) and leaves the shared token. With equal
# lengths the two are the same thing.
#
# ## 3. Every objective × aggregation, equal and unequal lengths
#
# After the first optimiser step θ ≠ θ_old and the sequence ratios $s_i$ differ within the group:
# that is where GSPO's sequence coupling breaks cancellation (eq. 13) and DFPO's transform repairs
# it. We move π on the path of the long completions (θ), keep π_old at the initial policy, and take
# the same four decisions in both scenarios. The objectives: GRPO; the **eq. 86 control** (GSPO's
# weight s̄ under DFPO's stop-gradient estimator, no transform) and DFPO (Min-Replace), both at
# ε = 0.2 so that the ratios are not clipped flat.

# %%
EPS = {"epsilon_low": 0.2, "epsilon_high": 0.2}
ARMS = {  # label → (objective, parameters)
    "GRPO token-mean": ("grpo", {"aggregation": "token-mean"}),
    "GRPO seq-mean-token-mean": ("grpo", {"aggregation": "seq-mean-token-mean"}),
    "eq. 86 control seq-mean-token-mean": ("gspo", {"estimator": "paper", **EPS}),
    "DFPO seq-mean-token-mean": ("dfpo", EPS),
    "DFPO token-mean": ("dfpo", {"aggregation": "token-mean", **EPS}),
}
#: each arm in its colour of every tutorial (`plots.ARM_COLORS`; DFPO is Min-Replace, its default
#: transform), `seq-mean-token-mean` hatched or dashed
ARM_OF = {"GRPO": "GRPO", "eq. 86 control": "eq. 86 control", "DFPO": "DFPO Min-Replace"}
COLOR = {label: ARM_COLORS[ARM_OF[label.rsplit(" ", 1)[0]]] for label in ARMS}

# %%
MOVED = {
    ("Sure",): {"20": 0.3, "25": 0.25, "10": 0.45},
    ("Sure", "10", "+", "10", "="): {"20": 0.9, "25": 0.1},
}


def group_batch(sc: Scenario) -> dict:
    """The four decisions of section 2 in scenario ``sc`` (short answers padded in `equal`), at θ and θ_old."""
    pol, old = sc.policy(), sc.initial_logits()
    pad = ["."] * 4 if sc.name == "equal" else []
    ix = torch.tensor([pol.trajectory_index(t if len(t) == 7 else (*t[:2], *pad, "<eos>")) for t in texts])
    new = pol.logits_from_probs(MOVED, base=old)
    return {"logp": pol.token_logp(new, ix), "old_logp": pol.token_logp(old, ix), "mask": pol.mask[ix],
            "keys": pol.event_keys[ix], "adv": group_advantages(pol.rewards[ix], group)}  # fmt: skip


# %%
batches = {name: group_batch(sc) for name, sc in scenarios.items()}
rows, res = [], {}
for arm, (obj, params) in ARMS.items():
    row = {"arm": arm}
    for name, b in batches.items():
        c = coefficients(obj, b["logp"], b["old_logp"], b["adv"], b["mask"], group, **params).coef
        res[arm, name] = residuals(c, b["keys"], b["mask"], group)
        row[f"shared {name}"] = res[arm, name]["group_shared_residual"]
        row[f"seq-net {name}"] = res[arm, name]["sequence_net_residual"]
    rows.append(row)
print("group-shared (the opener) and sequence-net residuals, one group, θ ≠ θ_old:")
table(rows)

# %%
fig = go.Figure()
for arm in ARMS:
    fig.add_bar(name=arm, x=list(scenarios), marker_color=COLOR[arm],
                marker_pattern_shape="/" if "seq-mean" in arm else "",
                y=[res[arm, name]["group_shared_residual"] for name in scenarios])  # fmt: skip
fig.update_layout(title="Residual on the token the whole group shares (one group, θ ≠ θ_old)",
                  yaxis_title="|Σ c| / Σ |c| on the opener", barmode="group", height=380)  # fmt: skip
fig.show()
fix = {n: res["eq. 86 control seq-mean-token-mean", n]["group_shared_residual"]
       - res["DFPO seq-mean-token-mean", n]["group_shared_residual"] for n in scenarios}  # fmt: skip
print(
    f"DFPO's fix (control − DFPO): equal lengths {fix['equal']:+.4f}, unequal lengths {fix['unequal']:+.4f}"
)

# %% [markdown]
# Read the table by rows:
#
# * **GRPO token-mean** cancels the opener for both scenarios (to rounding, ~1e-17); with unequal
#   lengths its sequence-net residual is large.
# * **GRPO seq-mean-token-mean** cancels the opener only when the lengths are equal.
# * **The eq. 86 control** leaves a residual even with equal lengths (its weights $\bar s_i$ differ);
#   **DFPO** removes it (0 for `equal`): that is the fix, eq. 18.
# * With unequal lengths DFPO's residual on the opener is no smaller than the control's; on this
#   group it is larger (the control's unequal weights happened to offset part of the length
#   imbalance, Min-Replace's equal weights do not). The fix (the line above) is gone: it was
#   built for the equal-length condition of eq. 72.
# * **DFPO with `token-mean`** cancels the opener again for any lengths (each token of completion $i$
#   gets $\tilde s_i\hat A_i/N$, and $\sum_i \tilde s_i\hat A_i = 0$), and gives up the sequence-net
#   cancellation instead, as GRPO token-mean does.
#
# ## 4. Why: the $1/|y_i|$ in eq. 72
#
# Under DFPO's estimator, completion $i$'s tokens each get $\tilde s_i\hat A_i/(G|y_i|)$ (eq. 70 with
# the length-normalised ratio of eq. 44). The transform makes $\sum_i\tilde s_i\hat A_i = 0$ (eq. 73),
# the opener's net is $\frac1G\sum_i\tilde s_i\hat A_i/|y_i|$. `dfpo_weights` returns $s$, $\bar s$
# and $\tilde s$:

# %%
b = batches["unequal"]
s, s_bar, s_tilde = dfpo_weights(b["logp"], b["old_logp"], b["adv"], b["mask"], group, **EPS)
lengths = b["mask"].sum(-1)
print("s  =", s, "\ns̄  =", s_bar, "\ns̃  =", s_tilde, "(Min-Replace: the group's smallest s̄)")
print("|y| =", lengths)
print(f"Σ s̃·Â       = {float((s_tilde * b['adv']).sum()):+.2e}   (eq. 73: the completions cancel)")
print(f"Σ s̃·Â/|y|/G = {float((s_tilde * b['adv'] / lengths).sum() / 4):+.6f}   (eq. 72: the opener does not)")
c_dfpo = coefficients("dfpo", b["logp"], b["old_logp"], b["adv"], b["mask"], group, **EPS).coef
print(f"autograd: net coefficient of the opener  {float(c_dfpo[:, 0].sum()):+.6f}")

# %% [markdown]
# Min-Replace sets every $\tilde s_i$ to the group's smallest $\bar s$, so DFPO's opener net is that
# constant times GRPO seq-mean-token-mean's $-\frac1{21}$: the transform cannot see the lengths. The
# paper says as much below eq. 72 ("if the length normalization factors are consistent (or nearly
# so) within this shared event"); with the lengths of real completions they rarely are.
#
# ## 5. In training
#
# `simulate_seeds` trains 12 seeds of each arm for 60 steps (G = 8, 4 inner epochs, SGD lr 0.5) on
# `unequal`, and the control and DFPO also on `equal`. The meter reads the coefficients every
# optimiser step applied; a step contributes to `group_shared_residual` when some event is shared by
# the whole group (the opener, when all 8 open alike; or "10" after it).

# %%
SEEDS, STEPS = 12, 60
runs = {
    arm: simulate_seeds(scenarios["unequal"], obj, SEEDS, steps=STEPS, **p) for arm, (obj, p) in ARMS.items()
}
for arm in ("eq. 86 control seq-mean-token-mean", "DFPO seq-mean-token-mean"):
    obj, p = ARMS[arm]
    runs[arm + " (equal)"] = simulate_seeds(scenarios["equal"], obj, SEEDS, steps=STEPS, **p)


def seed_mean(x: torch.Tensor) -> tuple[float, float]:
    """Mean and std over seeds of each seed's mean over its steps with a value (NaN: no update)."""
    per_seed = torch.nanmean(x, dim=1)
    return float(per_seed.mean()), float(per_seed.std())


# %%
rows = []
for arm, r in runs.items():
    gs, ss = seed_mean(r["group_shared_residual"]), seed_mean(r["sequence_net_residual"])
    rows.append({"arm": arm, "group-shared res.": f"{gs[0]:.3f} ± {gs[1]:.3f}",
                 "sequence-net res.": f"{ss[0]:.3f} ± {ss[1]:.3f}",
                 "E[R] step 20": float(r["expected_reward"][:, 19].mean()),
                 "E[R] final": float(r["expected_reward"][:, -1].mean())})  # fmt: skip
table(rows)
gsr = {arm: seed_mean(r["group_shared_residual"])[0] for arm, r in runs.items()}
fix_equal = gsr["eq. 86 control seq-mean-token-mean (equal)"] - gsr["DFPO seq-mean-token-mean (equal)"]
lost = gsr["DFPO seq-mean-token-mean"]
print(f"DFPO's fix on `equal` (control − DFPO) {fix_equal:.4f}; DFPO's residual on `unequal` {lost:.3f}, "
      f"{lost / fix_equal:.0f}× the fix")  # fmt: skip


# %%
WINDOW = 10  # steps pooled per point of the figures below


def band_figure(metric: str, title: str, y_title: str):
    """Per arm on `unequal`: the median and the 10–90 % band of the values measured in each window of
    WINDOW steps, over every (seed, step) pair with a value; NaN (no value at that step) left out. Each
    arm's points are shifted a little along x and get their own marker, so arms that coincide stay visible."""
    fig, q = go.Figure(), torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    for k, arm in enumerate(ARMS):
        x, mid, band = runs[arm][metric], [], []
        for s in range(0, STEPS, WINDOW):
            if (v := x[:, s : s + WINDOW].flatten()).isnan().all():
                continue
            mid.append(s + (WINDOW + 1) / 2 + 0.8 * (k - 2))
            band.append(torch.quantile(v[~v.isnan()], q).tolist())
        lo, med, hi = zip(*band, strict=True)
        c = COLOR[arm]
        fill = "rgba({},{},{},0.1)".format(*(int(c[i : i + 2], 16) for i in (1, 3, 5)))
        fig.add_scatter(x=mid + mid[::-1], y=list(hi) + list(lo[::-1]), fill="toself", fillcolor=fill, mode="lines",
                        line={"width": 0}, legendgroup=arm, showlegend=False, hoverinfo="skip")  # fmt: skip
        fig.add_scatter(x=mid, y=med, mode="lines+markers", name=arm, legendgroup=arm,
                        marker={"symbol": ("circle", "square", "diamond", "triangle-up", "x")[k], "size": 8},
                        line={"color": c, "dash": "dash" if "seq-mean" in arm else None})  # fmt: skip
    fig.update_layout(title=title, xaxis_title="step", yaxis_title=y_title, height=380)
    return fig


# %%
for arm in ARMS:
    has = ~runs[arm]["group_shared_residual"].isnan()
    share = [f"{float(has[:, s : s + WINDOW].double().mean()):.0%}" for s in range(0, STEPS, WINDOW)]
    print(f"{arm:36} (seed, step) pairs with a whole-group event, per {WINDOW} steps: {' '.join(share)}")
title = (
    f"Residual on whole-group events, unequal lengths (median, 10–90 %; {WINDOW} steps × 12 seeds a point)"
)
band_figure("group_shared_residual", title, "|Σ c| / Σ |c| on whole-group events").show()
band_figure("expected_reward", "Expected reward, unequal lengths (median, 10–90 %)", "E[R]").show()

# %% [markdown]
# The residual is measured only at the steps where some event is shared by the whole group (and the
# step updated): a step without one has no value (NaN), and the printed shares show that this is most
# steps, fewer and fewer as the reward saturates (a group of 8 correct completions has every Â = 0).
# A curve per step would be mostly gaps, and a mean ± std band would dip below 0 for a quantity that
# cannot. So each point pools the values measured in its window of steps over all seeds and draws
# their median and 10–90 % percentiles: what was measured, nothing below 0 (each arm's points are shifted
# a little along the step axis, so that the two token-mean arms, both at 0, stay visible).
#
# In training the table says what the single group said. On `unequal`, GRPO token-mean and DFPO
# token-mean keep the whole-group events at 0 and pay with a sequence-net residual of about 0.2;
# GRPO seq-mean-token-mean, the control and DFPO all leave about 0.15 of the whole-group mass
# uncancelled, DFPO within one seed-std of the control. On `equal`, DFPO's fix is visible (the
# control at 0.004, DFPO at 0) but 34 times smaller than what unequal lengths cost (the line under the
# table). The reward
# curves differ mostly through the step size each aggregation gives the deciding tokens (under
# `seq-mean-token-mean` a short completion's answer token weighs $1/(3G)$ instead of $1/N$), not
# through cancellation. This toy has no reward-irrelevant context whose drift would isolate the
# learning tax (the opener's two subtrees learn at different speeds, so its drift is partly credit
# assignment); tutorial 8 shows the same trade-off on a language model's completions.
#
# ## Exercises
#
# Write the body of each `my_*` function (until you do, it raises `NotImplementedError`), run its
# cell, then run the check cell below it: it prints ✓ or says what is missing or wrong. A worked
# solution is in `tutorials/solutions/10_length_and_aggregation.py`; try first. Each check works a few
# cases by hand, then compares your function with its own computation on 20 random cases (a new seed
# each run; a failure prints it). An answer that calls the project's library (`coefficients`,
# `aggregate`, ...) or reads the notebook's variables is refused: take everything from the arguments.


# %%
SHARED_NET_BY_HAND = [  # 10.1: (Â, |y|, aggregation, the net worked out by hand)
    ([0.5, 0.5, -1.5, 0.5], [7, 7, 3, 3], "token-mean", 0.0),
    ([0.5, 0.5, -1.5, 0.5], [7, 7, 3, 3], "seq-mean-token-mean", -1 / 21),  # ¼(0.5/7+0.5/7−1.5/3+0.5/3)
    ([1.0, -1.0], [2, 4], "seq-mean-token-mean", 0.125),  # ½(1/2 − 1/4)
    ([1.0, -1.0], [2, 4], "token-mean", 0.0),
    ([1.0, -0.5], [2, 4], "token-mean", 1 / 12),  # Σ Â = 0.5 over N = 6 tokens
    ([1.0, -0.5], [2, 4], "seq-mean-token-sum", 0.25),  # Σ Â / G
    ([1.0, -0.5], [2, 4], "seq-mean-token-sum-norm", 0.0625),  # Σ Â / (G·C), C = 4
]


def close_number(got, expected: float, what: str, at: str) -> None:
    """A number (a Python float or a one-element tensor of any float dtype) within float32's rounding."""
    expect_close(number(got, what), expected, what, at=at, atol=1e-7, rtol=1e-6)


# %%
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def shared_net_case(gen: torch.Generator) -> tuple[tuple, str]:
    """One random group for the check of 10.1: case i of 20 is aggregation i % 4, kind of group i % 5."""
    i = gen.initial_seed() % 1000
    agg, kind = AGGREGATIONS[i % 4], ("unequal", "equal", "Σ Â ≠ 0", "all Â = 0", "G = 2")[i % 5]
    g = 2 if kind == "G = 2" else int(torch.randint(3, 9, (1,), generator=gen))
    lengths = torch.randint(1, 12, (g,), generator=gen)
    lengths = lengths[:1].expand(g).clone() if kind == "equal" else lengths
    r = torch.randint(0, 2, (g,), generator=gen).double()
    r[:2] = torch.tensor([0.0, 1.0])  # both rewards present: Â ≠ 0
    adv = (r - r.mean()) / (r.std() + 1e-6)
    if kind == "Σ Â ≠ 0":
        adv = torch.randn(g, generator=gen, dtype=torch.float64)
    if kind == "all Â = 0":
        adv = torch.zeros(g, dtype=torch.float64)
    return (adv, lengths, agg), f"{kind}, G = {g}, |y| = {lengths.tolist()}, {agg}"


# %% [markdown]
# **Exercise 10.1 — the shared token's net coefficient.** At θ = θ_old (every ratio 1), GRPO gives
# a token that every completion of one group contains (at the same context) the net coefficient
# $\sum_i c_{i,t}$. Write `my_shared_net(adv, lengths, aggregation)` for each of the four
# aggregations of `cancellation.aggregation` (the table in its docstring): `"token-mean"`,
# `"seq-mean-token-mean"`, `"seq-mean-token-sum"` and `"seq-mean-token-sum-norm"` (whose constant $C$ is
# here the group's padded length, the longest $|y_i|$), from the advantages and the lengths alone. The
# advantages need not sum to 0 (a group whose completion was dropped after Â was computed).


# %%
def my_shared_net(adv: torch.Tensor, lengths: torch.Tensor, aggregation: str) -> float:
    """Σ_i c_i of a token every completion shares, GRPO at ratio 1, one group; `lengths` (G,) = |y_i|."""
    raise NotImplementedError("Exercise 10.1: replace this line with your code")


# %%
with check("10.1"):
    forbid(
        my_shared_net, ("backward", "autograd", "getattr"), why="write the net from the aggregation's weights"
    )
    slips = {0.25: "token-mean divides by N = Σ|y_i| = 6 tokens, not by G = 2", 0.5: "token-mean divides Σ Â "
             "by N = Σ|y_i| = 6 tokens", 0.0: "Σ Â_i = 0.5 here: the net is Σ Â / N, 0 only when Σ Â = 0"}  # fmt: skip
    for a, n, agg, expected in SHARED_NET_BY_HAND:
        got = my_shared_net(torch.tensor(a, dtype=torch.float64), torch.tensor(n), agg)
        for bad, why in slips.items() if expected == 1 / 12 else ():
            reject(number(got, "the net"), bad, f"the net coefficient at Â = {a}, |y| = {n}: {why}")
        close_number(got, expected, "the net coefficient", at=f"at Â = {a}, |y| = {n}, {agg}")

    def reference(adv, lengths, agg):  # Σ_i Â_i × the weight of one token of completion i
        n, g, c = sum(lengths.tolist()), len(adv), max(lengths.tolist())
        w = {"token-mean": lambda y: 1 / n, "seq-mean-token-mean": lambda y: 1 / (g * y),
             "seq-mean-token-sum": lambda y: 1 / g, "seq-mean-token-sum-norm": lambda y: 1 / (g * c)}[agg]  # fmt: skip
        return sum(a * w(y) for a, y in zip(adv.tolist(), lengths.tolist(), strict=True))

    expect_cases(my_shared_net, reference, shared_net_case, "the net coefficient", compare=close_number)

# %%
COMBINATIONS = [(o, a, n) for o in ("grpo", "dfpo") for a in AGGREGATIONS for n in (True, False)]


def combination_case(gen: torch.Generator) -> tuple[tuple, str]:
    """Case i of the check of 10.2: combination i % 16 (every one of them in 20 cases)."""
    obj, agg, ln = COMBINATIONS[gen.initial_seed() % 1000 % len(COMBINATIONS)]
    return (obj, agg, ln), f"objective={obj!r}, aggregation={agg!r}, length_norm={ln}"


# %% [markdown]
# **Exercise 10.2 — which combinations cancel for any lengths?** Write
# `my_cancels_any_length(objective, aggregation, length_norm)` returning True when a token that a
# whole group shares gets a net coefficient of exactly 0 **for every choice of lengths** (and of θ
# inside the clip range), False otherwise, for each of the four aggregations. `objective` is `"grpo"` or
# `"dfpo"` (paper estimator; `length_norm=False` makes its ratio $s_i = \prod_t r_{i,t}$ instead of
# eq. 44's geometric mean, GRPO ignores it). Reason from the coefficient each token of completion $i$
# gets (how the aggregation weighs it, how $\partial\log s_i/\partial\log\pi_{i,t}$ depends on
# $|y_i|$, and that DFPO's transform makes $\sum_i \tilde s_i\hat A_i = 0$): the check refuses an
# answer that measures it with the library, and tries every combination.


# %%
def my_cancels_any_length(objective: str, aggregation: str, length_norm: bool) -> bool:
    """Does a whole-group shared token cancel exactly for any lengths under this objective/aggregation?"""
    raise NotImplementedError("Exercise 10.2: replace this line with your code")


# %%
with check("10.2"):
    forbid(
        my_cancels_any_length, ("backward", "autograd", "getattr"), why="reason from each token's coefficient"
    )
    # a token of completion i gets (GRPO) Â_i·w_i or (DFPO) s̃_i·Â_i·d_i·|y_i|·w_i, with the aggregation's
    # weight w_i (1/N, 1/(G|y_i|), 1/G, 1/(G·C)) and d_i = ∂log s_i/∂logp = 1/|y_i| (length_norm) or 1;
    # Σ Â_i = Σ s̃_i·Â_i = 0, so it cancels for any lengths iff that factor does not depend on |y_i|
    power = {
        "token-mean": 0,
        "seq-mean-token-mean": -1,
        "seq-mean-token-sum": 0,
        "seq-mean-token-sum-norm": 0,
    }

    def reference(obj, agg, ln):  # the power of |y_i| in the factor is 0
        return power[agg] + (obj == "dfpo" and not ln) == 0

    for obj, agg, ln in COMBINATIONS:
        expected = reference(obj, agg, ln)
        expect_equal(my_cancels_any_length(obj, agg, ln), expected, "cancels for any lengths",
                     at=f"at objective={obj!r}, aggregation={agg!r}, length_norm={ln}"
                     + (" (GRPO has no sequence ratio: length_norm changes nothing)" if obj == "grpo" and not ln else ""))  # fmt: skip
    expect_cases(
        my_cancels_any_length, reference, combination_case, "cancels for any lengths", compare=expect_equal
    )
