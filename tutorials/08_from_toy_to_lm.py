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
# # 8 · From the toy to a language model
#
# Tutorials 1–7 worked on the tabular toy, where every probability is exact and every context has
# its own logits. The math they called, `cancellation`, does not know that: it sees a flat batch of
# completions as `(B, T)` tensors (`logp`, `old_logp`, `mask`) with one reward and one group id per
# row. This tutorial makes the same calls on completions of a language model and then trains one:
#
# 1. a tiny Qwen3 built offline, one group of sampled completions, their rewards and $\hat A$;
# 2. the same `cancellation.update.coefficients` call as the toy's on those completions, for GRPO,
#    GSPO and DFPO, read by the same cancellation meters, and what differs from the toy;
# 3. a short `scaledrun` run of DFPO and of GSPO on CPU, its `metrics.jsonl` read back;
# 4. one experiment's result explained: the toy's main comparison over 64 seeds with the statistics
#    of `experiments.stats`.
#
# Equation numbers are the DFPO paper's ("Design Conditions for Intra-Group Learning of
# Sequence-Level Rewards", arXiv 2604.13088); docs/papers.md lists it and the other papers, among
# them the cancellation-hypothesis paper ("The Cancellation Hypothesis in Critic-Free RL", arXiv
# 2605.08666). The whole notebook runs in under a minute on a 2-core
# CPU, about half of it section 1's warm start.

# %%
import json
import math
import os
import tempfile
import time
import warnings
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio
import torch
from exercise_check import check, ensure, expect_close, expect_equal  # the exercises' check cells
from IPython.display import Markdown, display
from plotly.subplots import make_subplots

from cancellation import group_advantages
from cancellation.diagnostics import event_index, prefix_event_keys, shared_residual, steps_to_threshold
from cancellation.objectives import sequence_log_ratio
from cancellation.update import RESIDUAL_KEYS, CancellationMeter, coefficients
from experiments.stats import markdown_table, paired_difference, summarize_arms
from scaledrun import train as trainer
from scaledrun.config import RunConfig
from scaledrun.rewards import compute_rewards, extract_answer, register_reward
from scaledrun.rollout import generate_rollouts
from scaledrun.runlog import read_metrics
from scaledrun.tasks import format_prompt
from scaledrun.tiny import build_tiny
from toymodel import simulate_seeds

pio.renderers.default = "plotly_mimetype+notebook_connected"
torch.set_num_threads(1)  # tiny tensors on a shared 2-core machine: one thread is fastest by far
torch.set_printoptions(precision=4, sci_mode=False)
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no "Writing model shards" bars
warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm in a kernel without ipywidgets
warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")  # a peft/transformers notice
WORK_DIR = tempfile.TemporaryDirectory(prefix="tutorial08-")  # removed when the kernel exits
WORK = Path(WORK_DIR.name)

# %% [markdown]
# ## 1. A tiny language model and one group of completions
#
# `scaledrun.tiny.build_tiny` trains a byte-level BPE tokenizer on the task's text and builds a tiny
# `Qwen3ForCausalLM` (2 layers, hidden 64), then warm-starts it by supervised teacher forcing, all
# locally (nothing downloads). The task is `template`: 2-digit additions answered with a long
# template, `Let me compute 37 + 11. The sum of 37 and 11 is 48. The answer is 48.`, so that the
# completions of one prompt share many tokens, the setting where cancellation matters (DFPO Sec. 3).
# We give it 150 warm-start steps (the trainer's default model gets 300 on the shorter `arithmetic`
# task; `experiments/lm.py` gives its template model 600).

# %%
t0 = time.perf_counter()
MODEL_DIR = build_tiny(WORK / "tiny-qwen3", task="template", warm_start_steps=150, num_eval=16)
record = json.loads((MODEL_DIR / "warm_start.json").read_text())
print(
    f"{record['num_parameters']:,} parameters, vocabulary {record['vocab_size']}; warm-start loss "
    f"{record['losses'][0]:.2f} -> {record['losses'][-1]:.2f}; greedy accuracy on 16 held-out prompts "
    f"{record['accuracy_before']:.2f} -> {record['accuracy_after']:.2f} ({time.perf_counter() - t0:.0f} s)"
)

# %% [markdown]
# At this budget the model has learned the template but not the arithmetic: its greedy accuracy is
# about 0. With the trainer's `exact_match` reward every completion would score 0, every group's
# $\hat A$ would be 0 and there would be nothing to cancel. So this tutorial scores completions with a
# *shaped* reward registered for the purpose: 1 for the right answer, falling linearly to 0 at 100
# away, 0 without an answer (it reads the answer with the trainer's own `extract_answer`, the integer
# after "The answer is"). Real runs use `exact_match` on a better warm-started model; the cancellation
# machinery does not care which reward made $\hat A$.


# %%
@register_reward("answer_distance")
def answer_distance(prompts: list[str], completions: list[str], answers: list[str]) -> list[float]:
    """1 for the right answer, linearly less to 0 at a distance of 100; 0 when there is no answer."""
    out = []
    for completion, answer in zip(completions, answers, strict=True):
        pred = extract_answer(completion)
        out.append(0.0 if pred is None else max(0.0, 1.0 - abs(int(pred) - int(answer)) / 100))
    return out


# %% [markdown]
# Now the trainer's own code path for one step, for one prompt: the run configuration (`RunConfig`,
# the fields of `python -m scaledrun.train --help`), the model with its LoRA adapter and the AdamW
# optimiser as the trainer builds them, the first training prompt, and
# `scaledrun.rollout.generate_rollouts`, which samples $G = 8$ completions at temperature 1, masks
# each through its first end-of-sequence token and computes $\log\pi_\text{old}$ of every sampled
# token from logits / T in one no-grad pass. Then the rewards, the `truncation` policy (a completion
# cut at `max_new_tokens` leaves the loss and its group's advantages) and `group_advantages`, exactly
# as `scaledrun.train` does them.

# %%
cfg = RunConfig(  # warmup_ratio 0: with a warm-up the trainer's scheduler starts the optimiser at lr 0
    model=str(MODEL_DIR), task="template", reward="answer_distance", max_new_tokens=48, warmup_ratio=0.0
)
model, tokenizer = trainer.load_model_and_tokenizer(cfg)  # LoRA on every linear layer
optimizer, _ = trainer.build_optimizer(cfg, model)
task = trainer.load_tasks(cfg, "train", cfg.num_train)[0]
torch.manual_seed(0)
batch, roll = generate_rollouts(
    model, tokenizer, [format_prompt(tokenizer, task.prompt)], [task.answer], [0],
    num_generations=cfg.group_size, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
    top_p=cfg.top_p,
)  # fmt: skip
rewards, failures = compute_rewards(cfg.reward, batch.prompts, batch.completions, batch.answers)
batch.rewards = torch.tensor(rewards)
valid = trainer.apply_truncation(cfg, batch)  # None, or the rows that stay in the loss
batch.advantages = group_advantages(batch.rewards, batch.group, valid=valid)
mask, group, tokens = batch.completion_mask, batch.group, batch.completion_ids

print(f"prompt: {task.prompt!r}   (answer {task.answer})")
print(f"{'i':>2} {'tokens':>6} {'reward':>6} {'Â':>6}  completion")
for i, text in enumerate(batch.completions):
    print(f"{i:2d} {int(mask[i].sum()):6d} {rewards[i]:6.2f} {float(batch.advantages[i]):+6.2f}  {text!r}")

# %% [markdown]
# The completions follow the template and get the numbers wrong in different ways, so the rewards
# differ and $\hat A$ is spread over both signs (Σ Â = 0 within the group, tutorial 1). Their
# lengths differ too, which the toy's completions never do. A completion that reached
# `max_new_tokens` without its end token (if one did) shows 0 tokens and $\hat A = 0$: under the
# default `truncation: mask` it leaves the loss and its group's advantages, and the others still
# sum to 0.
#
# **Which tokens do they share?** A token's score direction $\nabla_\theta\log\pi(a\mid h)$ depends on
# its whole context $h$, i.e. the prompt and every completion token before it. Two tokens are the
# *same event* (DFPO eq. 71: same context $h^*$, same token $a^*$, hence the same score direction)
# only if everything before them is identical. `prefix_event_keys` gives each (group, exact prefix,
# token) one id; the events that every completion of the group contains are the ones where
# $\sum_i\hat A_i = 0$ can cancel.

# %%
keys = prefix_event_keys(tokens, mask, group)
in_loss = mask.sum(1) > 0
G = int(in_loss.sum())  # completions in the loss
events = event_index(keys, mask)  # every event of the batch and how often it occurs
whole_keys = events.keys[events.count == G]  # the events all G completions contain
ref = int(torch.nonzero(in_loss)[0])  # a completion in the loss
prefix_pos = torch.isin(keys[ref], whole_keys)
print("events every completion shares:", tokenizer.convert_ids_to_tokens(tokens[ref, prefix_pos].tolist()))

answer_id = tokenizer(" answer", add_special_tokens=False)["input_ids"][0]
where = (tokens == answer_id) & mask.bool()
print(
    f"the token ' answer' occurs in {int(where.any(1).sum())} of {G} completions, at "
    f"{torch.nonzero(where)[:, 1].unique().numel()} different positions, as "
    f"{keys[where].unique().numel()} different events"
)

# %% [markdown]
# Only the opening words are shared by prefix (`Let me compute`, plus the space token before the
# first digit when every completion writes it): at the first operand's digits the completions
# diverge, and from there on a template token like ` answer`, textually the same in most
# completions, follows a different prefix in each, so it is a different event in each. That is the first difference from the toy,
# whose `template_task` positions are contexts shared by *every* completion by construction.
#
# ## 2. The same call as the toy
#
# The toy computes the coefficients $c_{i,t} = \partial J/\partial\log\pi(y_{i,t})$ of a whole
# mini-batch with one `cancellation.update.coefficients` call, backpropagates them to its logits and
# steps; the trainer does the same, with the log-probs of an LM forward pass
# (`scaledrun.train.policy_logprobs`, log-softmax of logits / T) and the surrogate
# $-\sum_{i,t} c_{i,t}\log\pi_\theta(y_{i,t})$, whose gradient is $-\nabla_\theta J$ (the chain rule).
# Four such optimiser steps of GRPO on this group, as PPO-style inner epochs take them, move the
# policy away from $\pi_\text{old}$:

# %%
for _ in range(4):
    logp = trainer.policy_logprobs(model, batch, cfg)["logp"]
    co = coefficients("grpo", logp.detach(), batch.old_logp, batch.advantages, mask, group)
    trainer.surrogate(logp, co.coef, mask, world=1).backward()  # ∇θ of −Σ c·logp = −∇θ J
    optimizer.step()
    optimizer.zero_grad()
with torch.no_grad():
    logp = trainer.policy_logprobs(model, batch, cfg)["logp"]
ratio = (logp - batch.old_logp).exp()[mask.bool()]
print(f"token ratios r in [{float(ratio.min()):.2f}, {float(ratio.max()):.2f}]")
print("sequence ratios s_i (eq. 44):", sequence_log_ratio(logp, batch.old_logp, mask).exp())

# %% [markdown]
# Now the coefficients each objective would apply at this $\theta$, against the same $\pi_\text{old}$,
# and the meters that the toy and the trainer read (`CancellationMeter`, fed the coefficients of
# each optimiser step; here one):
#
# * `shared_residual`: Σ|net| / Σ gross over events that occur at least twice;
# * `group_shared_residual`: the same over events that *every* completion of the group contains,
#   here the opening tokens printed above;
# * `sequence_net_residual`: per group $|\sum_i c_i| / \sum_i |c_i|$ with $c_i = \sum_t c_{i,t}$, the
#   completions' whole coefficients.
#
# GRPO uses `token-mean` (every token divided by the batch's token count), GSPO and DFPO
# `seq-mean-token-mean` (each completion's tokens divided by its length, eq. 42), each objective's
# own default. The eq. 86 control, GSPO's post-clip weights under DFPO's estimator without the
# transform (tutorial 5), comes back in section 4.

# %%
OBJECTIVES = {
    "GRPO (token-mean)": ("grpo", {}),
    "GSPO": ("gspo", {}),
    "eq. 86 control": ("gspo", {"estimator": "paper"}),
    "DFPO Min-Replace": ("dfpo", {"transform": "min_replace"}),
}
coefs, nets = {}, {}
print(
    f"{'objective':20} {'clip/frac':>9} {'shared':>7} {'group-shared':>12} {'sequence-net':>12}   "
    f"net on each of the {int(prefix_pos.sum())} shared tokens"
)
for name, (objective, params) in OBJECTIVES.items():
    co = coefficients(objective, logp, batch.old_logp, batch.advantages, mask, group, **params)
    coefs[name] = co.coef
    meter = CancellationMeter(keys, mask, group)
    meter.add(co.coef)
    res = meter.totals.residuals()
    events = shared_residual(co.coef, keys, mask, min_count=G)
    nets[name] = events.net[events.count == G]  # in position order
    print(
        f"{name:20} {co.metrics['clip/frac']:9.2f} "
        + " ".join(f"{res[k]:{w}.4f}" for k, w in zip(RESIDUAL_KEYS, (7, 12, 12), strict=True))
        + f"   {[f'{v:+.1e}' for v in nets[name].tolist()]}"
    )

fig = go.Figure()
for name, c in coefs.items():
    fig.add_bar(name=f"{name} (net {float(nets[name][0]):+.1e})", x=list(range(len(c))), y=c[:, 0].tolist())
fig.update_layout(
    barmode="group",
    title=f"∂J/∂logp of the first shared token ({tokenizer.decode(tokens[ref, :1])!r}), per completion",
    xaxis_title="completion i",
    yaxis_title="coefficient",
    height=380,
)
fig.show()

# %% [markdown]
# The call and the meters are the toy's; what they find differs from the toy in three ways:
#
# * **GRPO with `token-mean` cancels the shared tokens, not the completions.** The shared tokens have
#   the same ratio in every completion (same context, same token) and every token is divided by the
#   same count, so their coefficients are $\hat A_i r/N$ and the net is $\frac rN\sum_i\hat A_i = 0$ (the
#   printed nets are float32 rounding) as long as the ratio is inside the clip range (tutorial 4). But a
#   whole completion gets $c_i = \hat A_i\sum_t r_{i,t}/N \approx \hat A_i\,|y_i|/N$: longer completions
#   weigh more, and with unequal lengths $\sum_i c_i \ne 0$ even when every ratio is 1 (in the toy,
#   whose completions have equal lengths, only unequal ratios make it non-zero).
# * **DFPO cancels the completions, not the shared tokens.** Under the paper's estimator completion $i$
#   gets $\tilde s_i\hat A_i$ on $\nabla\log s_i$, spread as $\tilde s_i\hat A_i/(B\,|y_i|)$ over its
#   $|y_i|$ tokens (eq. 44, 68): $c_i = \tilde s_i\hat A_i/B$ and $\sum_i c_i = 0$ by the transform's
#   $\sum_i\hat A_i\tilde s_i = 0$ (eq. 73), whatever the clip and the lengths. On a shared token the
#   factor $1/|y_i|$ differs between completions, so the net there is not 0 (the README's "α = 1/|y_i|").
#   The eq. 86 control is close to DFPO here: its post-clip weights $\bar s_i$ differ only by
#   about ε.
# * **GSPO's clip silences sequences.** With GSPO's ε = 3e-4 / 4e-4 and ratios already moved by four
#   steps, the clip binds on most completions, which then get no gradient at all; the few that keep
#   one do not balance. That is the residual DFPO's estimator removes.
#
# And one thing no meter here sees: the model's parameters are **shared by every token**. Two
# different events (` answer` after two different prefixes) have different score directions that
# still overlap, since both run through the same weights, so their updates interact although no
# meter counts them as shared. The meters
# measure eq. (72)'s exact events; the toy has nothing else (every context has its own logits), the LM
# has much else (tutorial 7's low-probability tokens act through the same shared layers).
#
# ## 3. A tiny run of the trainer
#
# `scaledrun.train.main` is `python -m scaledrun.train` as a function. We run the off-policy
# configuration (`scaledrun/configs/offpolicy.yaml`: 4 prompts × 8 completions per step, 4 inner
# epochs × 2 query-preserved mini-batches, so 8 optimiser steps against one $\pi_\text{old}$ and
# the ratios leave 1) on our model and reward for 12 steps, once with `--objective dfpo` and once
# with `--objective gspo`, each into its own run folder. `--eval_every 0` skips the held-out
# evaluation; `--warmup_ratio 0` because a 12-step run has no room for a warm-up (its first step
# would have learning rate 0).

# %%
OFFPOLICY = Path(trainer.__file__).parent / "configs" / "offpolicy.yaml"
runs = {}
for objective in ("dfpo", "gspo"):
    out_dir = WORK / f"offpolicy-{objective}"
    trainer.main(
        ["--config", str(OFFPOLICY), "--model", str(MODEL_DIR), "--task", "template",
         "--reward", "answer_distance", "--max_new_tokens", "48", "--objective", objective,
         "--steps", "12", "--warmup_ratio", "0", "--eval_every", "0", "--output_dir", str(out_dir)]
    )  # fmt: skip
    runs[objective] = read_metrics(out_dir)  # one dict per step, from <out_dir>/metrics.jsonl

print(f"\n{len(runs['dfpo'][0])} keys per row, e.g. {sorted(runs['dfpo'][0])[:6]} ...")
SHOWN = (
    "reward/mean",
    "sequence_net_residual",
    "group_shared_residual",
    "clip/frac",
    "clip/low_frac",
    "clip/high_frac",
)
print(f"{'mean over 12 steps':20}" + "".join(f"{k:>22}" for k in SHOWN))
for objective, rows in runs.items():
    print(f"{objective:20}" + "".join(f"{sum(r[k] for r in rows) / len(rows):22.4f}" for k in SHOWN))

# %%
fig = make_subplots(
    rows=2,
    cols=2,
    subplot_titles=("reward/mean", "sequence_net_residual", "group_shared_residual", "clip/frac"),
)
for (objective, rows), color in zip(runs.items(), ("#1f77b4", "#d62728"), strict=True):
    steps = [r["step"] for r in rows]
    for k, key in enumerate(("reward/mean", "sequence_net_residual", "group_shared_residual", "clip/frac")):
        fig.add_scatter(
            x=steps, y=[r[key] for r in rows], name=objective, line={"color": color},
            showlegend=k == 0, row=k // 2 + 1, col=k % 2 + 1,
        )  # fmt: skip
fig.update_layout(title="The trainer's metrics.jsonl, read back: DFPO vs GSPO, off-policy config", height=520)
fig.update_xaxes(title_text="step", row=2)
fig.show()

# %% [markdown]
# Reading the rows:
#
# * **`sequence_net_residual` is 0 for DFPO at every step and about 0.4 for GSPO.** It is the meter of
#   section 2, summed over the step's 8 optimiser steps. Each of DFPO's optimiser steps sees whole
#   groups (query-preserved mini-batches) and gives each completion $c_i = \tilde s_i\hat A_i/B$ with
#   $\sum_i\hat A_i\tilde s_i = 0$ per group, so every group's completions cancel in every step, clipped
#   ones included. GSPO's clip removes the gradient of every sequence whose ratio has left its
#   $[1-\varepsilon, 1+\varepsilon]$ in the direction of its advantage, and after the first optimiser
#   step that is most of them (`clip/frac`); the survivors are not balanced.
# * **`group_shared_residual` is not 0 for DFPO** (nor for GSPO, where it is larger): the shared
#   opening tokens get $\tilde s_i\hat A_i/(B|y_i|)$, unequal across completions of unequal length,
#   as in section 2.
# * **The clip fractions are of the last mini-batch** of each step. Under the paper's estimator DFPO's
#   clip only bounds the weights' values; it never silences a completion (tutorial 5), which is why a
#   high `clip/frac` does not raise DFPO's sequence-net residual.
# * **Twelve steps say nothing about learning.** The reward moves with the prompts drawn (4 per step);
#   whether DFPO or GSPO learns faster on the LM needs longer runs and several seeds. The README's
#   "GSPO vs DFPO on the tiny model" (60 steps, one seed each) warns that at this learning rate the
#   paper's estimator, which keeps no trust region, lost reward; the language-model sweep of
#   `experiments/lm.py` (`make experiments`, written up in `experiments/REPORT.md`) runs the arms on
#   many seeds.
#
# The Runs page of the explorer (`make app`) reads run folders like these two.
#
# ## 4. One experiment's result: where the speed-up comes from
#
# DFPO changes two things at once relative to GSPO (tutorial 5): **the estimator** (every completion,
# clipped or not, keeps a gradient) and **the transform** ($\sum_i\hat A_i\tilde s_i = 0$). The eq. 86
# control has the first without the second, so on the toy's `template_task`
#
# * GSPO → control measures the estimator's effect, and
# * control → DFPO measures the transform's.
#
# `toymodel.simulate_seeds` trains all seeds of one arm as one batched computation (per seed it equals
# `simulate`, tested to 1e-6), 64 seeds × 150 steps each at the Training lab's defaults (G = 8, 4 inner
# SGD epochs at lr 0.5, GSPO's ε). Seed $s$ draws the same random numbers in every arm (common random
# numbers), so the arms are compared **per seed**.

# %%
ARMS = {
    "GSPO": ("gspo", {}),
    "eq. 86 control": ("gspo", {"estimator": "paper"}),
    "DFPO Min-Replace": ("dfpo", {"transform": "min_replace"}),
}
SEEDS, STEPS, THRESHOLD = 64, 150, 0.9
toy = {
    name: simulate_seeds("template_task", obj, SEEDS, steps=STEPS, **params)
    for name, (obj, params) in ARMS.items()
}
STEPS_KEY, KL_KEY, GSR_KEY = "steps to E[R] ≥ 0.9", "template KL at E[R] ≥ 0.9", "group-shared residual"


def per_seed(result: dict[str, torch.Tensor]) -> dict[str, dict[int, float]]:
    """One arm's per-seed measures, keyed by seed: steps to the threshold (inf: never), KL there, residual."""
    out = {STEPS_KEY: {}, KL_KEY: {}, GSR_KEY: {}}
    for i, seed in enumerate(result["seed"].tolist()):
        hit = steps_to_threshold(result["expected_reward"][i], THRESHOLD, result["step"][i])
        out[STEPS_KEY][seed] = math.inf if hit is None else hit
        out[KL_KEY][seed] = math.nan if hit is None else float(result["template_kl"][i, int(hit) - 1])
        out[GSR_KEY][seed] = float(result["group_shared_residual"][i].nanmean())  # NaN: no update that step
    return out


measured = {name: per_seed(result) for name, result in toy.items()}
rows = summarize_arms(measured, baseline="GSPO", horizons={STEPS_KEY: STEPS})
display(Markdown(markdown_table(rows)))

# %% [markdown]
# `summarize_arms` gives each arm's mean with a percentile-bootstrap 95 % CI and each arm's paired
# difference to the baseline (GSPO), with the exact sign test's p and the paired bootstrap's. A seed
# that never reaches E[R] ≥ 0.9 counts as the horizon (150 steps; `reached` says how many did), so a
# mean of steps is a restricted mean. The transform's own effect needs the control as the baseline:

# %%
for what, arm, base in (
    ("estimator: control − GSPO", "eq. 86 control", "GSPO"),
    ("transform: DFPO − control", "DFPO Min-Replace", "eq. 86 control"),
):
    for key in (STEPS_KEY, KL_KEY, GSR_KEY):
        d = paired_difference(
            measured[arm][key], measured[base][key], horizon=STEPS if key == STEPS_KEY else None
        )
        print(
            f"{what:26} {key:26} Δ = {d.mean:+9.4g}  95% CI [{d.low:+.3g}, {d.high:+.3g}]  "
            f"seeds +/−/tie {d.n_pos:2d}/{d.n_neg:2d}/{d.n_ties:2d}  sign p {d.sign_p:.2g}"
        )

fig = go.Figure(
    [
        go.Box(y=list(measured[name][STEPS_KEY].values()), name=name, boxpoints="all", jitter=0.4)
        for name in ARMS
    ]
)
fig.update_layout(
    title="template_task: steps to E[R] ≥ 0.9, one point per seed (64 seeds)", yaxis_title="steps", height=380
)
fig.show()

# %% [markdown]
# What it shows, and what it does not:
#
# * **The speed-up is the estimator's.** The control, which has no transform, reaches the threshold
#   about four times sooner than GSPO on every seed, and it pays for it: a template KL (the learning
#   tax, drift on reward-irrelevant tokens) several times GSPO's at the moment it gets there. GSPO's
#   clip silences most sequences after the first inner step; the estimator keeps their gradient,
#   i.e. takes larger steps.
# * **The transform's own effect is the last bit of cancellation.** DFPO takes the control's small
#   group-shared residual (its $\bar s_i$ stay within about ε of each other) to 0, on every seed. The
#   steps to the threshold do not change (as many seeds faster as slower, many tied). DFPO's template
#   KL is lower on more seeds than not (the sign test's p is small), but the mean difference is
#   about 1 % of the control's KL, with a bootstrap CI around 0: if the transform lowers the learning
#   tax here, it is by a small amount.
# * So on the toy, **the estimator, not the transform, explains DFPO's advantage over GSPO**, and the
#   learning tax goes the "wrong" way: faster learning, more drift. That DFPO's faster learning
#   comes from cancelling the shared tokens is not what this measurement supports; whether the
#   transform adds something at language-model scale, where lengths differ and the parameters are
#   shared (section 2), is what the LM sweep asks.
#
# The README's "Measured results" (10 seeds, `python -m toymodel template_task --compare`) and the
# Training lab's first screen state the same. The full study, with Table 3's ablations, group sizes,
# batching, AR/Lopti, aggregations and clip ranges on hundreds of seeds and the LM sweep, is
# `make experiments`, written up in `experiments/REPORT.md`.
#
# ## Exercises
#
# Write the body of each `my_*` function (until you do, it raises `NotImplementedError`), run its
# cell, then run the check cell below it: it prints ✓ or says what is missing or wrong. A worked
# solution is in `tutorials/solutions/08_from_toy_to_lm.py`; try first.
#
# **Exercise 8.1 — the shared prefix by hand.** Write `my_shared_prefix_net(coef, tokens, mask)` that
# takes one group's `(G, T)` coefficients, token ids and mask and returns the net coefficient
# $\sum_i c_{i,t}$ at every position $t$ of the group's common prefix (the positions where every
# completion has a token and all completions agree on every token up to and including $t$), as a
# tensor of shape `(L,)`. The check compares with the library's whole-group events
# (`prefix_event_keys` + `shared_residual`) for the four objectives of section 2.


# %%
def my_shared_prefix_net(coef: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(L,) Σ_i coef[i, t] over the group's common prefix t = 0 … L−1."""
    raise NotImplementedError("Exercise 8.1: replace this line with your code")


# %%
with check("8.1"):
    for name, c in coefs.items():
        events = shared_residual(c, keys, mask, min_count=G)
        expected = events.net[events.count == G]  # events every completion contains, in position order
        got = my_shared_prefix_net(c[in_loss], tokens[in_loss], mask[in_loss])
        expect_close(got, expected, "the net coefficients of the common prefix", at=f"for {name}", atol=1e-7)

# %% [markdown]
# **Exercise 8.2 — count the seeds.** The sign test of `paired_difference` (the p-value the module
# recommends for censored measures) rests on three counts: the seeds where the arm is larger than the
# baseline, smaller, and tied. Write `my_sign_counts(arm, baseline)` for two dictionaries seed →
# steps to the threshold, `math.inf` for a seed that never reached it. Pair the values **by seed**
# (the check hands you the baseline in another order), and count two seeds that both never reached
# the threshold as a tie. The check compares with `paired_difference`'s `n_pos`, `n_neg`, `n_ties` on
# the measured arms (every seed reached the threshold there) and on two hand-made arms of a 50-step
# run in which some seeds never did.


# %%
def my_sign_counts(arm: dict[int, float], baseline: dict[int, float]) -> tuple[int, int, int]:
    """(seeds with arm > baseline, seeds with arm < baseline, ties), matched by seed."""
    raise NotImplementedError("Exercise 8.2: replace this line with your code")


# %%
with check("8.2"):
    cases = [
        (measured[arm][STEPS_KEY], measured[base][STEPS_KEY], STEPS, f"for {arm} vs {base}")
        for arm, base in (("eq. 86 control", "GSPO"), ("DFPO Min-Replace", "eq. 86 control"))
    ]
    hand_arm = {0: 12.0, 1: math.inf, 2: math.inf, 3: 30.0, 4: 41.0}
    hand_base = {0: 12.0, 1: 40.0, 2: math.inf, 3: 25.0, 4: math.inf}
    cases.append((hand_arm, hand_base, 50, f"for the hand-made arms {hand_arm} vs {hand_base}"))
    for arm, base, horizon, at in cases:
        d = paired_difference(arm, base, horizon=horizon)
        got = my_sign_counts(arm, dict(reversed(list(base.items()))))
        ensure(
            isinstance(got, (tuple, list)) and len(got) == 3,
            f"expected a tuple of three counts, got {type(got).__name__} {got!r}",
            kind="wrong type",
        )
        expect_equal(
            tuple(int(x) for x in got),
            (d.n_pos, d.n_neg, d.n_ties),
            "the counts (larger, smaller, tied)",
            at=at,
        )
