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
# 2605.08666). The whole notebook runs in about 40 s on an idle 2-core CPU, nearly all of it section 1's
# warm start (about 18 s) and section 3's two trainer runs (about 13 s); on a CPU busy with other work
# (the test suite running beside it) it has taken 79 s.

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
from exercise_check import (
    check,
    ensure,
    expect_cases,
    expect_close,
    expect_equal,
    forbid,
)  # the exercises' checks
from IPython.display import Markdown, display
from plotly.subplots import make_subplots
from show import report_rows, table  # tables, and quotes of experiments/REPORT.md

# %%
from cancellation import group_advantages
from cancellation.diagnostics import prefix_event_keys, shared_residual, steps_to_threshold
from cancellation.objectives import sequence_log_ratio
from cancellation.update import CancellationMeter, coefficients, event_index
from experiments.stats import markdown_table, paired_difference, summarize_arms
from plots import ARM_COLORS  # one colour per arm, the app's
from scaledrun import train as trainer
from scaledrun.config import RunConfig
from scaledrun.data import load_tasks
from scaledrun.model import build_optimizer, load_model_and_tokenizer
from scaledrun.rewards import compute_rewards, extract_answer, register_reward
from scaledrun.rollout import generate_rollouts
from scaledrun.runlog import read_metrics
from scaledrun.tasks import format_prompt
from scaledrun.tiny import build_tiny
from toymodel import simulate_seeds

# %%
pio.renderers.default = "plotly_mimetype+notebook_connected"
torch.set_num_threads(1)  # tiny tensors on a shared 2-core machine: one thread is fastest by far
torch.set_printoptions(precision=4, sci_mode=False)
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no "Writing model shards" bars
warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm in a kernel without ipywidgets
warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")  # a peft/transformers notice
WORK_DIR = tempfile.TemporaryDirectory(prefix="tutorial08-")  # removed when the kernel exits
WORK = Path(WORK_DIR.name)
#: one colour per arm in every figure and tutorial (the app's `ARM_COLORS`; the trainer's runs by --objective)
COLOR = {**ARM_COLORS, "GRPO (token-mean)": ARM_COLORS["GRPO"]}

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
model, tokenizer = load_model_and_tokenizer(cfg)  # LoRA on every linear layer
optimizer, _ = build_optimizer(cfg, model)
task = load_tasks(cfg, "train", cfg.num_train)[0]
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
coefs, nets, rows = {}, {}, []
for name, (objective, params) in OBJECTIVES.items():
    co = coefficients(objective, logp, batch.old_logp, batch.advantages, mask, group, **params)
    coefs[name] = co.coef
    meter = CancellationMeter(keys, mask, group)
    meter.add(co.coef)
    events = shared_residual(co.coef, keys, mask, min_count=G)
    nets[name] = events.net[events.count == G]  # in position order
    rows.append({"objective": name, "clip/frac": co.metrics["clip/frac"], **meter.totals.residuals(),
                 f"net on each of the {int(prefix_pos.sum())} shared tokens": [f"{v:+.1e}" for v in nets[name].tolist()]})  # fmt: skip
table(rows)

# %%
fig = go.Figure()
for name, c in coefs.items():
    fig.add_bar(name=f"{name} (net {float(nets[name][0]):+.1e})", x=list(range(len(c))), y=c[:, 0].tolist(),
                marker_color=COLOR[name])  # fmt: skip
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

# %% [markdown]
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
table([{"objective (mean over 12 steps)": obj, **{k: sum(r[k] for r in rows) / len(rows) for k in SHOWN}}
       for obj, rows in runs.items()])  # fmt: skip

# %%
fig = make_subplots(
    rows=2,
    cols=2,
    subplot_titles=("reward/mean", "sequence_net_residual", "group_shared_residual", "clip/frac"),
)
for objective, rows in runs.items():
    color = COLOR[objective]
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

# %% [markdown]
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


# %%
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
rows = []
for what, arm, base in (
    ("estimator: control − GSPO", "eq. 86 control", "GSPO"),
    ("transform: DFPO − control", "DFPO Min-Replace", "eq. 86 control"),
):
    for key in (STEPS_KEY, KL_KEY, GSR_KEY):
        d = paired_difference(
            measured[arm][key], measured[base][key], horizon=STEPS if key == STEPS_KEY else None
        )
        rows.append({"effect": what, "measure": key, "Δ": d.mean, "95% CI": f"[{d.low:+.3g}, {d.high:+.3g}]",
                     "seeds +/−/tie": f"{d.n_pos}/{d.n_neg}/{d.n_ties}", "sign p": d.sign_p})  # fmt: skip
table(rows)

# %% [markdown]
# One row needs a second look: the transform's effect on the template KL has a sign-test p far below
# 0.05 while its 95 % CI straddles 0. The two answer different questions. The sign test only counts on
# how many seeds DFPO's KL is below the control's; the CI is about the **mean** difference, which the
# few seeds with large differences decide. The per-seed differences:

# %%
dfpo_m, ctrl_m = measured["DFPO Min-Replace"], measured["eq. 86 control"]
by_seed = {s: dfpo_m[KL_KEY][s] - ctrl_m[KL_KEY][s] for s in ctrl_m[KL_KEY]}
by_seed = {s: v for s, v in by_seed.items() if v == v}  # a seed that never reached 0.9 has no KL there
kl_d = sorted(by_seed.values())
large = [v for v in kl_d if abs(v) >= 0.01]
apart = sum(abs(v) >= 0.01 and dfpo_m[STEPS_KEY][s] != ctrl_m[STEPS_KEY][s] for s, v in by_seed.items())
print(
    f"DFPO − control, template KL at E[R] ≥ 0.9, {len(kl_d)} seeds: lower on {sum(v < 0 for v in kl_d)}, higher on "
    f"{sum(v > 0 for v in kl_d)}; median {kl_d[len(kl_d) // 2]:+.1e}, mean {sum(kl_d) / len(kl_d):+.1e}\n"
    f"{len(large)} seeds differ by 0.01 or more (the control's KL there is about "
    f"{sum(measured['eq. 86 control'][KL_KEY].values()) / SEEDS:.3f}): {sum(v < 0 for v in large)} of them lower, "
    f"{sum(v > 0 for v in large)} higher, from {kl_d[0]:+.3f} to {kl_d[-1]:+.3f}; on {apart} of them the two arms "
    "reached 0.9 at different steps"
)

# %% [markdown]
# DFPO is lower on most seeds, by very little: seed s draws the same uniforms in both arms, one per
# token position, so two arms that take nearly the same steps sample nearly the same completions and
# their KLs differ by little. The few large differences go both ways and decide the mean, whose CI is
# then wide around 0. (The KL is read at the step each arm first reaches 0.9, and two arms reaching it at
# different steps read two different steps of a fast-moving KL: the large differences are on such
# seeds.) Two more reasons not to read the sign test as an effect worth having: it is one of the six
# tests of this table, none adjusted for the others; and `experiments/` asked the same question of 1024
# fresh seeds, fixed in advance, Holm-adjusted with the report's other predictions: the row "DFPO pays
# less learning tax (template KL) than the eq. 86 control" below finds a mean difference of −1.19e-04,
# on DFPO's side, with an interval that excludes 0 but a Holm-adjusted p that does not resolve it. A
# consistent but tiny difference, a small fraction of the KL itself, is what the transform leaves here.

# %%
fig = go.Figure(
    [
        go.Box(
            y=list(measured[name][STEPS_KEY].values()),
            name=name,
            boxpoints="all",
            jitter=0.4,
            marker_color=COLOR[name],
        )
        for name in ARMS
    ]
)
fig.update_layout(
    title="template_task: steps to E[R] ≥ 0.9, one point per seed (64 seeds)", yaxis_title="steps", height=380
)
fig.show()

# %% [markdown]
# Sixty-four seeds give the direction; `experiments/` ran the comparison on 1024 fresh seeds (and the
# language-model sweep of `experiments/lm_power.py` on 30). Its report, quoted as written:

# %%
report_rows("toy_main", "Min-Replace reaches")
report_rows("toy_main", "learning tax")
report_rows("lm_power", "DFPO")

# %% [markdown]
# What it shows, and what it does not:
#
# * **The speed-up is the estimator's.** In the tables above the control, which has no transform,
#   reaches the threshold far sooner than GSPO, seed for seed, and it pays for it with a larger template
#   KL (the learning tax, drift on reward-irrelevant tokens) at the moment it gets there. GSPO's clip
#   silences most sequences after the first inner step; the estimator keeps their gradient, i.e. takes
#   larger steps.
# * **The transform's own effect is the last bit of cancellation.** DFPO takes the control's small
#   group-shared residual to 0 on every seed; its steps to the threshold and its template KL differ
#   from the control's by amounts whose CIs straddle 0 (the KL's sign test on 64 seeds aside, see
#   above; the report on 1024 seeds: not resolved).
# * So on the toy, **the estimator, not the transform, explains DFPO's advantage over GSPO**, and the
#   learning tax goes the "wrong" way (the report: contradicted). On the language model, the report's
#   `lm_power` rows resolve no difference between DFPO and the control, and find DFPO's final avg@k
#   *below* GSPO's.
#
# The Training lab's first screen shows the same toy comparison. The full study (Table 3's ablations,
# group sizes, batching, AR/Lopti, aggregations and clip ranges on hundreds of seeds and the LM
# sweeps) is `make experiments`, written up in `experiments/REPORT.md`.

# %% [markdown]
# ## Exercises
#
# Write the body of each `my_*` function (until you do, it raises `NotImplementedError`), run its
# cell, then run the check cell below it: it prints ✓ or says what is missing or wrong. Each check
# starts from answers worked out by hand (in its comments), then runs your function on 20 random
# cases (fresh every run; the seed is printed when one fails, `TUTORIAL_CHECK_SEED=<seed>` reruns
# them) against its own plain-loop computation. An answer that calls the library or reads the
# notebook's variables is refused: everything it needs comes in as arguments. A worked solution is in
# `tutorials/solutions/08_from_toy_to_lm.py`; try first.
#
# **Exercise 8.1 — the shared prefix by hand.** Write `my_shared_prefix_net(coef, tokens, mask)` that
# takes one group's `(G, T)` coefficients, token ids and mask and returns the net coefficient
# $\sum_i c_{i,t}$ at every position $t$ of the group's common prefix (the positions where every
# completion has a token and all completions agree on every token up to and including $t$), as a
# tensor of shape `(L,)`. The check starts with three hand-made groups, compares with the library's
# whole-group events (`prefix_event_keys` + `shared_residual`) for the four objectives of section 2,
# then runs random groups: identical completions, an empty prefix, a completion that ends early.


# %%
ex81 = [  # the check's groups: (tokens, mask, coef, the nets worked out by hand, what the case tests)
    ([[5, 7, 9, 2], [5, 7, 9, 3], [5, 7, 4, 4]], [[1] * 4] * 3,
     [[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8], [-0.9, -1.0, -1.1, -1.2]], [-0.3, -0.2],
     "three completions diverging at position 2"),
    ([[5, 7, 9, 2], [5, 8, 9, 2]], [[1] * 4] * 2, [[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]], [11.0],
     "completions that agree again at positions 2-3 after diverging at 1: no longer a common prefix"),
    ([[5, 7, 9, 9], [5, 7, 9, 9]], [[1, 1, 1, 1], [1, 1, 0, 0]], [[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 0.0, 0.0]],
     [11.0, 22.0], "a group whose completion 1 ends after 2 tokens (its padding, here the same id 9, is no token)"),
]  # fmt: skip
ex81_lm = []  # section 2's group under each objective: (name, its arguments, the library's nets, tolerance)
for name, c in coefs.items():
    events = shared_residual(c, keys, mask, min_count=G)
    # float32 sums of G terms: two correct orders differ by up to G·Σ|c|·eps (a cancelling net is ~0)
    tol = G * float(c[in_loss].abs().sum(0).max()) * torch.finfo(c.dtype).eps
    ex81_lm.append((name, (c[in_loss], tokens[in_loss], mask[in_loss]), events.net[events.count == G], tol))


# %%
def case_8_1(gen: torch.Generator):
    """A random group for the check: (coef, tokens, mask) and what it holds; the kinds come in turn."""
    kind = gen.initial_seed() % 1000 % 6  # expect_cases seeds its case i with seed·1000 + i
    g, t_max = int(torch.randint(2, 6, (1,), generator=gen)), int(torch.randint(3, 8, (1,), generator=gen))
    coef = torch.randn(g, t_max, generator=gen, dtype=torch.float64)
    split = int(torch.randint(1, t_max, (1,), generator=gen))  # where a completion first differs or ends
    tokens = torch.randint(5, 9, (1, t_max), generator=gen).repeat(g, 1)
    mask = torch.ones(g, t_max, dtype=torch.long)
    if kind == 1:
        tokens[-1, split:] = 4  # the last completion diverges at `split` (no other token is 4)
    elif kind == 2:
        tokens[-1, split] = 4  # ... and agrees again after it
    elif kind == 3:
        mask[0, split:] = 0  # completion 0 ends early; its padding repeats the shared ids
    elif kind == 4:
        tokens[:, 0] = torch.arange(g) + 10
    elif kind == 5:
        coef, tokens, mask, g = coef[:2], tokens[:2], mask[:2], 2
        tokens[1, split:] = 4
    what = ["identical completions", "the last one diverging at {}", "the last one differing at {} only",
            "completion 0 ending after {} tokens (its padding has the shared ids)",
            "completions that differ at their first token (no common prefix)", "diverging at {}"][kind]  # fmt: skip
    return (coef, tokens, mask), f"{g} completions of {t_max} positions, " + what.format(split)


# %%
def my_shared_prefix_net(coef: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(L,) Σ_i coef[i, t] over the group's common prefix t = 0 … L−1."""
    raise NotImplementedError("Exercise 8.1: replace this line with your code")


# %%
with check("8.1"):
    forbid(my_shared_prefix_net, why="find the common prefix with tensor operations")
    for tok, msk, c, want, what in ex81:
        got = my_shared_prefix_net(torch.tensor(c, dtype=torch.float64), torch.tensor(tok), torch.tensor(msk))
        want = torch.tensor(want, dtype=torch.float64)
        expect_close(got, want, "the net coefficients of the common prefix", at=f"for {what}")
    for name, args, want, tol in ex81_lm:
        got = my_shared_prefix_net(*args)
        expect_close(got, want, "the net coefficients of the common prefix", at=f"for {name}", atol=tol)

    def reference(coef, tokens, mask):  # walk the positions until one disagrees or ends
        nets = []
        for t in range(tokens.shape[1]):
            if not all(mask[i, t] and tokens[i, t] == tokens[0, t] for i in range(len(tokens))):
                break
            nets.append(sum(float(coef[i, t]) for i in range(len(tokens))))
        return torch.tensor(nets, dtype=torch.float64)

    expect_cases(my_shared_prefix_net, reference, case_8_1, "the net coefficients of the common prefix")

# %% [markdown]
# **Exercise 8.2 — the signs behind the sign test.** The sign test of `paired_difference` (the
# p-value the module recommends for censored measures) rests on the sign of arm − baseline on every
# seed; the library hands over only their counts. Write `my_signs(arm, baseline)` for two dictionaries
# seed → steps to the threshold (`math.inf` for a seed that never reached it), returning a dictionary
# seed → +1, −1 or 0 (a tie). Pair the values **by seed** (the check hands you the baseline in another
# order), and count two seeds that both never reached the threshold as a tie. The check compares with
# hand-worked signs, then your signs' counts with `paired_difference`'s `n_pos`, `n_neg`, `n_ties` on
# the measured arms, then random seeds against its own comparison.


# %%
# the check's hand-made case: steps to the threshold by seed (inf: never), and the signs worked out by hand
hand_arm = {0: 12.0, 1: math.inf, 2: math.inf, 3: 30.0, 4: 41.0}
hand_base = {0: 12.0, 1: 40.0, 2: math.inf, 3: 25.0, 4: math.inf}
hand_signs = {0: 0, 1: 1, 2: 0, 3: 1, 4: -1}  # equal; never vs 40; both never; 30 > 25; 41 vs never
ex82_arms = []  # the measured arms of section 4: (arm, baseline, the library's (n_pos, n_neg, n_ties))
for arm, base in (("eq. 86 control", "GSPO"), ("DFPO Min-Replace", "eq. 86 control")):
    d = paired_difference(measured[arm][STEPS_KEY], measured[base][STEPS_KEY], horizon=STEPS)
    ex82_arms.append((arm, base, (d.n_pos, d.n_neg, d.n_ties)))


def compare_8_2(got, want, what: str, at: str) -> None:
    ensure(isinstance(got, dict), f"expected a dictionary seed → sign {at}, got {type(got).__name__} {got!r}",
           "wrong type")  # fmt: skip
    ensure(
        sorted(got) == sorted(want),
        f"expected one sign per seed {sorted(want)} {at}, got the keys {sorted(got)}",
    )
    for seed, sign in want.items():
        expect_equal(got[seed], sign, f"the sign of seed {seed}", at=at)


# %%
def case_8_2(gen: torch.Generator):
    """Random steps to the threshold for the check: (arm, baseline) and what they hold; the kinds in turn."""
    kind = gen.initial_seed() % 1000 % 4
    n = int(torch.randint(3, 9, (1,), generator=gen))
    seeds = (torch.randperm(50, generator=gen)[:n] + (100 if kind == 2 else 0)).tolist()  # not 0 … n − 1
    draw = torch.randint(5, 9, (2, n), generator=gen).to(torch.float64)  # few values: ties happen
    draw[torch.rand(2, n, generator=gen) < (0.6 if kind == 1 else 0.2)] = math.inf
    if kind == 3:
        draw[0] = math.inf  # the arm never reached the threshold
    arm = {s: float(v) for s, v in zip(seeds, draw[0], strict=True)}
    baseline = {
        seeds[i]: float(draw[1, i]) for i in torch.randperm(n, generator=gen).tolist()
    }  # another order
    what = [
        "ties and a few never",
        "many seeds that never reached it",
        "seeds from 100 on",
        "an arm that never did",
    ]
    return (arm, baseline), f"{what[kind]}, seeds {sorted(seeds)}"


# %%
def my_signs(arm: dict[int, float], baseline: dict[int, float]) -> dict[int, int]:
    """Seed → sign of arm − baseline (+1, −1, 0 for a tie), matched by seed; inf vs inf is a tie."""
    raise NotImplementedError("Exercise 8.2: replace this line with your code")


# %%
with check("8.2"):
    forbid(my_signs, why="compare the two values of every seed yourself")
    got = my_signs(hand_arm, dict(reversed(list(hand_base.items()))))  # the baseline in another order
    ensure(isinstance(got, dict), f"expected a dictionary seed → sign, got {type(got).__name__} {got!r}",
           "wrong type")  # fmt: skip
    ensure(sorted(got) == sorted(hand_signs), f"expected one sign per seed {sorted(hand_signs)}, got the keys {sorted(got)}")  # fmt: skip
    for seed, sign in hand_signs.items():
        note = " (both never reached: a tie)" if seed == 2 else ""
        expect_equal(got[seed], sign, f"the sign of seed {seed}", at=f"(arm {hand_arm[seed]}, baseline {hand_base[seed]}{note})")  # fmt: skip
    for arm, base, want in ex82_arms:
        signs = list(my_signs(measured[arm][STEPS_KEY], measured[base][STEPS_KEY]).values())
        counts = (signs.count(1), signs.count(-1), signs.count(0))
        expect_equal(counts, want, "the counts of your signs (+1, −1, 0)", at=f"for {arm} vs {base}")

    def reference(arm, baseline):  # compare per seed; inf = inf is a tie
        return {s: 1 if arm[s] > baseline[s] else -1 if arm[s] < baseline[s] else 0 for s in arm}

    expect_cases(my_signs, reference, case_8_2, "the signs", compare=compare_8_2)

# %% [markdown]
# ## 5. On a GPU: the same comparison at language-model scale
#
# Everything above ran on a CPU. With one GPU (an 80 GB H100, say) the trainer runs the same three arms
# on a real model. A recipe, from `scaledrun/config.py`'s `PRESETS` and [docs/trainer.md](../docs/trainer.md):
#
# * **Preset**: `--preset qwen2.5-0.5b-instruct` (bf16, LoRA r 16, lr 1e-5, 256 new tokens; the hub model
#   downloads on first use) on the default `arithmetic` task with `exact_match`, over the off-policy
#   config `scaledrun/configs/offpolicy.yaml`: 4 inner epochs × 2 query-preserved mini-batches, so the
#   ratios leave 1 and the objectives differ (on the on-policy `default.yaml` they cannot).
# * **Objectives**: GSPO (`--objective gspo`), the eq. 86 control (`--objective gspo --estimator
#   paper`) and DFPO Min-Replace (`--objective dfpo`), the three arms of section 4.
# * **Seeds**: at least 3 per arm (`--seed 0..2`), the same seeds in every arm, so that the arms can be
#   paired by seed as in section 4; one seed says nothing (section 3).

# %% [markdown]
# ```bash
# for seed in 0 1 2; do
#   for arm in "gspo:--objective gspo" "control:--objective gspo --estimator paper" "dfpo:--objective dfpo"; do
#     accelerate launch --num_processes 1 --mixed_precision no --dynamo_backend no -m scaledrun.train \
#       --config scaledrun/configs/offpolicy.yaml --preset qwen2.5-0.5b-instruct ${arm#*:} \
#       --seed $seed --output_dir runs/gpu/${arm%%:*}/seed$seed
#   done
# done
# make app          # then the Runs page, folder runs/gpu
# ```
#
# (`--mixed_precision no`: the preset's bf16 is the model's own dtype; for N GPUs,
# `--config_file scaledrun/accelerate/ddp.yaml --num_processes N`, docs/trainer.md.)
#
# **Reading the Runs page.** Point its folder at `runs/gpu`: the runs appear as `gspo/seed0`,
# `control/seed0`, … (an arm / seed layout two levels down). Pick all nine. Its curves are the toy's
# (`reward/mean` and the three cancellation meters, `clip/frac`, …), one line per run; its table
# compares steps to a reward threshold and Jitter₂ side by side. Expect DFPO's `sequence_net_residual`
# at 0 and GSPO's well above it (section 3), the control in between on `group_shared_residual`; whether
# the reward curves separate, compare seed for seed, as section 4 did on the toy.
