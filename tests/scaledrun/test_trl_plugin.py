"""The TRL plug-in (``scaledrun.trl_plugin``): one step equals one step of ``scaledrun.train``, and of TRL's own loss.

Both trainers start from the same weights (the tiny Qwen3, full fine-tuning, so no adapter initialisation
differs) and train on the same completions: ``scaledrun.train`` replays a chosen batch (``--replay_dir``),
TRL gets the same prompt and completion tokens from a ``rollout_func`` (TRL's own hook for custom
generation) and the same rewards. Model and batch run in float64 and gradients are compared at
``FLOAT64_RTOL`` of their largest entry (``tests/exactness.py``): AdamW's first step moves a weight by
about lr·g/(|g| + eps), which turns any gradient difference near |g| ~ eps into a visible weight
difference, so the gradients are the primary comparison; the weights after the step are compared too, at
1e-6 as the issue asks (in float64 the two gradients agree to ~1e-15, far inside it). The prompts have
equal token lengths: TRL's forward passes give a left-padded prompt no position ids, scaledrun's do.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

import scaledrun.train as tr
from cancellation import group_advantages
from cancellation.batching import split_minibatches
from cancellation.update import RESIDUAL_KEYS
from scaledrun.config import ObjectiveConfig, class_field_docs
from scaledrun.data import load_tasks
from scaledrun.model import load_model_and_tokenizer
from scaledrun.rollout import score_completions
from scaledrun.runlog import read_metrics
from scaledrun.tasks import format_prompt
from scaledrun.trl_plugin import (
    CancellationGRPOConfig,
    CancellationGRPOTrainer,
    check_layout,
    trl_loss_settings,
)

from ..conftest import SEED
from ..exactness import FLOAT64_RTOL, close, max_abs_err, rounding_tolerance
from .test_train import make_cfg

pytestmark = pytest.mark.exactness
REPO = Path(__file__).resolve().parents[2]

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is TRL's experimental hook

#: Completion lengths (tokens, EOS included) of the two groups of 4: unequal, so rows are right-padded.
LENGTHS = [[2, 5, 3, 7], [4, 1, 6, 3]]
#: Rewards, exact in float32 (TRL holds rewards in float32) and distinct within each group.
REWARDS = [[0.0, 0.25, 1.0, 0.5], [0.75, 0.0, 0.5, 1.0]]
#: Small enough that AdamW's amplification of float32-level gradient differences stays below ``WEIGHT_TOL``
#: (a first AdamW step moves every weight by up to lr, whatever |g|: see ``adamw_first_step_bound``).
LR = 1e-5
#: The learning rate of the two-step runs: large enough that the second step's ratios are off 1 by a few %.
LR_ITER = 1e-3
G = 4

#: (name, objective fields) of every objective the plug-in is compared on. ε 0.03 with two iterations clips
#: some tokens (sequences) in the second one and leaves others in the band.
OBJECTIVES = [
    ("grpo", {"objective": "grpo"}),
    ("gspo", {"objective": "gspo"}),
    ("eq86", {"objective": "gspo", "estimator": "paper"}),
    ("dfpo-min_replace", {"objective": "dfpo", "transform": "min_replace"}),
    ("dfpo-orth_proj", {"objective": "dfpo", "transform": "orth_proj"}),
    ("grpo_symclip", {"objective": "grpo_symclip"}),
    ("ar", {"objective": "grpo", "ar_alpha": 0.3}),
]


def _replay_batch(cfg):
    """The chosen batch: 2 prompts of equal token length × 4 completions (``LENGTHS``, each ending in EOS),
    scored by ``cfg``'s model (float64) with the trainer's own code; rewards ``REWARDS``."""
    model, tokenizer = load_model_and_tokenizer(cfg)
    tasks = load_tasks(cfg, "train", cfg.num_train)
    by_len: dict[int, list] = {}
    for t in tasks:
        text = format_prompt(tokenizer, t.prompt)
        by_len.setdefault(len(tokenizer(text, add_special_tokens=False)["input_ids"]), []).append((text, t))
    pair = next(v for v in by_len.values() if len({text for text, _ in v}) >= 2)
    pair = [pair[0], next(p for p in pair if p[0] != pair[0][0])]
    digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    width = cfg.max_new_tokens
    prompts, answers, groups, completions = [], [], [], []
    for k, ((text, task), row_lengths) in enumerate(zip(pair, LENGTHS, strict=True)):
        for j, n in enumerate(row_lengths):
            body = [digits[1], *(digits[(j + i) % 10] for i in range(n - 2))][: n - 1]
            completions.append(body + [eos] + [pad] * (width - n))
            prompts.append(text)
            answers.append(task.answer)
            groups.append(k)
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    assert bool(enc["attention_mask"].all())  # equal lengths: no left padding
    batch, _ = score_completions(
        model, tokenizer, enc["input_ids"], enc["attention_mask"], torch.tensor(completions),
        prompts=prompts, answers=answers, group_ids=groups, temperature=1.0,
    )  # fmt: skip
    batch.rewards = torch.tensor([r for row in REWARDS for r in row], dtype=torch.float64)
    return batch


def _sr_cfg(tiny_model, out, fields, iterations, micro, lr):
    return make_cfg(
        tiny_model, out, dtype="float64", full_finetune=True, truncation="keep", min_lr_ratio=1.0, grad_clip=None,
        lr=lr, inner_epochs=iterations, micro_batch_size=micro, **fields,
    )  # fmt: skip


def run_scaledrun(tiny_model, tmp_path, fields, iterations=1, micro=0, lr=LR, monkeypatch=None):
    """(the chosen batch, gradients of each optimizer step, weights after the step) of ``scaledrun.train``.

    The gradients: the debug dump's first step (``--debug_dir``), or, with ``monkeypatch``, every step's, read
    by a step pre-hook on the trainer's own AdamW (``build_optimizer`` wrapped, not replaced)."""
    cfg = _sr_cfg(tiny_model, tmp_path / "sr", fields, iterations, micro, lr)
    replay = tmp_path / "replay"
    replay.mkdir(exist_ok=True)
    batch = _replay_batch(cfg)
    torch.save(batch, replay / "step_000001_rollouts.pt")
    steps: list[dict[str, torch.Tensor]] = []
    if monkeypatch is not None:
        build = tr.build_optimizer

        def recording(cfg, model):
            optimizer, scheduler = build(cfg, model)
            names = {id(p): n for n, p in model.named_parameters()}

            def record(opt, args, kwargs):
                grads = {names[id(p)]: p.grad.detach().clone() for g in opt.param_groups for p in g["params"]}
                steps.append(grads)

            optimizer.register_step_pre_hook(record)
            return optimizer, scheduler

        monkeypatch.setattr(tr, "build_optimizer", recording)
    tr.train(cfg, debug_dir=tmp_path / "dbg", replay_dir=replay)
    if not steps:
        steps.append(torch.load(tmp_path / "dbg" / "rank0" / "step_000001_grads.pt"))
    weights = torch.load(tmp_path / "dbg" / "rank0" / "step_000001_trainable.pt")
    return batch, steps, weights


class _Grab:
    """Records the gradients of every optimizer step: a step pre-hook on the trainer's optimizer (registered
    when training begins), so a step the plug-in takes itself (a Lopti stage) is recorded too."""

    def __init__(self):
        self.grads: list[dict[str, torch.Tensor]] = []

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kw):
        names = {id(p): n for n, p in model.named_parameters()}
        raw = getattr(optimizer, "optimizer", optimizer)

        def record(opt, a, k):
            grads = {names[id(p)]: p.grad.detach().clone() for g in opt.param_groups for p in g["params"]}
            self.grads.append(grads)

        raw.register_step_pre_hook(record)


def run_trl(tiny_model, tmp_path, batch, fields, *, plugin=True, iterations=1, spg=1, ga=None, **kw):
    """(gradients of each optimizer step, weights after training, trainer) of TRL's GRPOTrainer (``plugin``:
    CancellationGRPOTrainer) on ``batch``'s prompts, completions and rewards. ``ga``: gradient accumulation
    steps (default ``spg``: one optimizer step per generation); ``kw``: ``trl`` (TRL's own loss settings),
    ``lr``, ``peft`` (a LoraConfig), ``order`` (the groups' order in the dataset), ``processes`` (launched:
    the generation batch is split between them), other GRPOConfig fields."""
    trl, lr, peft, order = kw.pop("trl", None), kw.pop("lr", LR), kw.pop("peft", None), kw.pop("order", None)
    eval_dataset, processes = kw.pop("eval_dataset", None), kw.pop("processes", 1)
    extra = kw
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model, padding_side="left")
    texts = list(dict.fromkeys(batch.prompts))
    texts = texts if order is None else [texts[k] for k in order]  # the dataset's (the generation's) order
    p = batch.prompt_len
    rows_of = {t: [i for i in range(len(batch)) if batch.prompts[i] == t] for t in texts}
    completion = [
        batch.completion_ids[i][batch.completion_mask[i].bool()].tolist() for i in range(len(batch))
    ]
    reward_of = {(batch.prompts[i], tuple(completion[i])): float(batch.rewards[i]) for i in range(len(batch))}

    def rollout(prompts, trainer):
        seen: dict[str, int] = {}
        prompt_ids, completion_ids = [], []
        for text in prompts:
            i = rows_of[text][seen.get(text, 0)]
            seen[text] = seen.get(text, 0) + 1
            prompt_ids.append(batch.input_ids[i, :p][batch.attention_mask[i, :p].bool()].tolist())
            completion_ids.append(completion[i])
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    def replayed_reward(prompts, completions, completion_ids, **_):
        return [reward_of[(t, tuple(ids))] for t, ids in zip(prompts, completion_ids, strict=True)]

    per_device = len(batch) // (spg * processes)
    common = dict(
        output_dir=str(tmp_path / ("plugin" if plugin else "trl")), use_cpu=True, bf16=False,
        per_device_train_batch_size=per_device, gradient_accumulation_steps=ga or spg, steps_per_generation=spg,
        num_generations=G, num_iterations=iterations, max_completion_length=batch.completion_mask.shape[1],
        temperature=1.0, learning_rate=lr, lr_scheduler_type="constant", max_grad_norm=0.0, weight_decay=0.0,
        optim="adamw_torch", max_steps=iterations * spg // (ga or spg), shuffle_dataset=False, logging_steps=1, save_strategy="no",
        report_to="none", disable_tqdm=True, dataloader_num_workers=0, seed=0, mask_truncated_completions=False,
    )  # fmt: skip
    common.update(extra)
    if plugin:
        args = CancellationGRPOConfig(**common, **fields)
        cls = CancellationGRPOTrainer
    else:
        args = GRPOConfig(**common, **trl)
        cls = GRPOTrainer
    grab = type("Grab", (_Grab, TrainerCallback), {})()
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float64)
    trainer = cls(
        model=model, reward_funcs=replayed_reward, args=args, train_dataset=Dataset.from_dict({"prompt": texts}),
        processing_class=tokenizer, rollout_func=rollout, peft_config=peft, eval_dataset=eval_dataset,
        callbacks=[grab],
    )  # fmt: skip
    trainer.train()
    weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    return grab.grads, weights, trainer


def _assert_same(got: dict, want: dict, what: str, tol: float):
    assert set(got) == set(want), what
    err = max(max_abs_err(got[n], want[n]) for n in want)
    assert err <= tol, f"{what}: max |Δ| {err:.3g} > {tol:.3g}"


def grad_tolerance(grads: dict, batch, vocab: int | None = None) -> float:
    """The rounding bound of the gradients compared: TRL scores every token with its float32 log-softmax
    over the vocabulary (``trl.kernels.chunked_logprob``, float32 whatever the model's dtype), and the
    gradient sums the tokens' terms: ``rounding_tolerance(max |g|, V × tokens, float32)``."""
    scale = max(float(t.abs().max()) for t in grads.values())
    assert scale > 0, "all-zero gradient"
    vocab = vocab or next(t.shape[0] for n, t in grads.items() if "embed_tokens" in n)
    return rounding_tolerance(scale, vocab * int(batch.completion_mask.sum()), torch.float32)


#: The weights after the training, as the issue asks (absolute).
WEIGHT_TOL = 1e-6
#: AdamW's ε (torch's and TRL's ``adam_epsilon`` default, which both trainers use).
ADAM_EPS = 1e-8


def adamw_first_step_bound(g: torch.Tensor, tol: float) -> torch.Tensor:
    """Per entry, how far two first AdamW steps (no weight decay) can land apart when their gradients differ
    by at most ``tol``: a first step moves a weight by −lr·g/(|g| + ε) (bias-corrected m and v), whose slope
    in g is ε/(|g| + ε)², so the bound is lr·tol·ε/(max(|g| − tol, 0) + ε)², and never more than 2·lr."""
    slope = ADAM_EPS / ((g.abs() - tol).clamp(min=0) + ADAM_EPS) ** 2
    return (LR * tol * slope).clamp(max=2 * LR)


def _assert_first_step(weights: dict, sr_weights: dict, sr_grads: dict, tol: float, what: str):
    for n, g in sr_grads.items():
        err = (weights[n].double() - sr_weights[n].double()).abs()
        bound = adamw_first_step_bound(g.double(), tol) + 1e-12  # + float64 rounding of w + Δw
        assert bool((err <= bound).all()), (
            f"{what}: {n} off by {float((err - bound).max()):.3g} beyond the bound"
        )


def _logged(trainer) -> dict:
    """TRL's logged metrics of the (first) optimizer step."""
    return next(row for row in trainer.state.log_history if "cancellation/shared_residual" in row)


@pytest.mark.parametrize(("name", "fields"), OBJECTIVES, ids=[n for n, _ in OBJECTIVES])
def test_trl_plugin_one_step_equals_scaledrun(tiny_model, tmp_path, name, fields):
    batch, (sr_grads,), sr_weights = run_scaledrun(tiny_model, tmp_path, fields)
    grads, weights, trainer = run_trl(tiny_model, tmp_path, batch, fields)
    assert len(grads) == 1
    tol = grad_tolerance(sr_grads, batch)
    _assert_same(grads[0], sr_grads, f"{name}: gradients", tol)
    _assert_first_step(weights, sr_weights, sr_grads, tol, f"{name}: weights after the step")
    # the meter and the clip fractions in TRL's metrics: scaledrun's values for the same coefficients (ratios of
    # sums of |c| whose terms carry TRL's float32 log-probs: the gradient's relative tolerance)
    row, sr_row = _logged(trainer), read_metrics(tmp_path / "sr")[0]
    rel = tol / max(float(t.abs().max()) for t in sr_grads.values())
    for key in (*RESIDUAL_KEYS, "clip/low_frac", "clip/high_frac", "asym", "loss"):
        assert close(row[f"cancellation/{key}"], sr_row[key], 1.0, rtol=rel), (
            key,
            row[f"cancellation/{key}"],
            sr_row[key],
        )


@pytest.mark.parametrize(("name", "fields"), OBJECTIVES, ids=[n for n, _ in OBJECTIVES])
def test_trl_plugin_accumulation_and_iterations_equal_scaledrun(
    tiny_model, tmp_path, monkeypatch, name, fields
):
    """``steps_per_generation`` 2 (one group per micro-batch, accumulated) and ``num_iterations`` 2 against
    ``micro_batch_size`` 4 and ``inner_epochs`` 2: both optimizer steps' gradients. ``LR_ITER`` moves the
    weights enough that the second step's ratios are off 1 (by a few %), so clipping and the transforms act
    there (another transform, or GSPO's eq. 86 control in place of DFPO, is off by several times the
    tolerance: ``test_trl_plugin_second_step_tells_dfpo_from_the_control``). The second step's gradients are taken at weights that already differ by AdamW's amplification of the first
    step's float32 differences (up to ~6e-6 here: the weights after two steps are not compared at 1e-6 for
    that reason, docs/plugins.md); those move them by less than 1e-6 of the tolerance's scale."""
    batch, sr_steps, _ = run_scaledrun(
        tiny_model, tmp_path, fields, iterations=2, micro=G, lr=LR_ITER, monkeypatch=monkeypatch
    )
    grads, _, _ = run_trl(tiny_model, tmp_path, batch, fields, iterations=2, spg=2, lr=LR_ITER)
    assert len(grads) == len(sr_steps) == 2
    for k in range(2):
        _assert_same(
            grads[k], sr_steps[k], f"{name}: step {k + 1} gradients", grad_tolerance(sr_steps[k], batch)
        )


def test_trl_plugin_second_step_tells_dfpo_from_the_control(tiny_model, tmp_path, monkeypatch):
    """The negative control of the test above: its off-policy second step is where the objectives differ, so
    the plug-in running the eq. 86 control (or Orth-Proj) in place of DFPO Min-Replace must land > 4× the
    tolerance away from scaledrun's Min-Replace gradient, while the first step (on-policy, ratio 1: they
    coincide) agrees."""
    fields = dict(OBJECTIVES)["dfpo-min_replace"]
    batch, sr_steps, _ = run_scaledrun(
        tiny_model, tmp_path, fields, iterations=2, micro=G, lr=LR_ITER, monkeypatch=monkeypatch
    )
    tol = grad_tolerance(sr_steps[1], batch)
    for other in ("dfpo-orth_proj", "eq86"):
        grads, _, _ = run_trl(
            tiny_model, tmp_path, batch, dict(OBJECTIVES)[other], iterations=2, spg=2, lr=LR_ITER
        )
        _assert_same(
            grads[0],
            sr_steps[0],
            f"{other}: step 1 (on-policy) gradients",
            grad_tolerance(sr_steps[0], batch),
        )
        off = max(max_abs_err(grads[1][n], sr_steps[1][n]) for n in sr_steps[1])
        # measured here: Orth-Proj 19.7 ×, the control 7.9 × the tolerance (a loose bound: the parity above
        # agrees to ~2e-7, thousands of times closer)
        assert off > 4 * tol, f"{other} vs Min-Replace at step 2: max |Δ| {off:.3g} is not > 4 × {tol:.3g}"


def test_trl_plugin_two_optimizer_steps_per_generation_equal_scaledrun(tiny_model, tmp_path, monkeypatch):
    """``steps_per_generation`` 2 with ``gradient_accumulation_steps`` 1: two optimizer steps per generation,
    one whole group each, against ``num_minibatches`` 2 (query batching). The plug-in keeps the generation
    order, so the TRL dataset lists the prompts in the order scaledrun's split draws them (its generator
    replayed: ``step_seed``, as ``scaledrun.train`` seeds it). DFPO Orth-Proj: the second step is off-policy."""
    fields = {"objective": "dfpo", "transform": "orth_proj"}
    batch, sr_steps, _ = run_scaledrun(
        tiny_model, tmp_path, {**fields, "num_minibatches": 2}, lr=LR_ITER, monkeypatch=monkeypatch
    )
    generator = torch.Generator().manual_seed(tr.step_seed(SEED, 1, 0) + 1)
    parts = split_minibatches(batch.group, 2, "query", generator)
    order = [int(batch.group[rows[0]]) for rows in parts]
    grads, _, _ = run_trl(tiny_model, tmp_path, batch, fields, spg=2, ga=1, lr=LR_ITER, order=order)
    assert len(grads) == len(sr_steps) == 2
    for k in range(2):
        _assert_same(grads[k], sr_steps[k], f"step {k + 1} gradients", grad_tolerance(sr_steps[k], batch))


#: Lopti alone, with Advantage Reweighting and with GSPO; η is set per batch (``_lopti_eta``).
LOPTI = [
    ("lopti", {"objective": "grpo"}),
    ("lopti-ar", {"objective": "grpo", "ar_alpha": 0.3}),
    ("lopti-gspo", {"objective": "gspo"}),
]


def _lopti_eta(tiny_model, tmp_path) -> float:
    """η inside the widest gap between consecutive π_old of the chosen batch's middle half: both of Lopti's
    stages hold tokens on every machine and seed (a fixed η could leave one empty), and no token lies near η
    (TRL's π_old carries float32 rounding: a token within it of η could land in the other stage)."""
    batch = _replay_batch(_sr_cfg(tiny_model, tmp_path / "eta", {}, 1, 0, LR))
    probs = batch.old_logp[batch.completion_mask.bool()].exp().sort().values
    n = probs.numel()
    lo, hi = n // 4, max(3 * n // 4, n // 4 + 1)
    gaps = probs[lo + 1 : hi + 1] - probs[lo:hi]
    k = lo + int(gaps.argmax())
    assert float(probs[k + 1] - probs[k]) > 1e-4 * float(probs[k + 1])  # far from float32 rounding
    return float(probs[k] + probs[k + 1]) / 2


@pytest.mark.parametrize("spg", [1, 2])
@pytest.mark.parametrize(("name", "fields"), LOPTI, ids=[n for n, _ in LOPTI])
def test_trl_plugin_lopti_stages_equal_scaledrun(tiny_model, tmp_path, monkeypatch, name, fields, spg):
    """Lopti's two stages are two optimizer steps in both trainers (the plug-in takes the first inside TRL's
    step): both steps' gradients, in one pass and accumulated over 2 micro-batches; the second stage's
    log-probs are those of the weights the first stage moved (``LR_ITER``)."""
    fields = {**fields, "lopti_eta": _lopti_eta(tiny_model, tmp_path)}
    batch, sr_steps, _ = run_scaledrun(
        tiny_model, tmp_path, fields, micro=G if spg == 2 else 0, lr=LR_ITER, monkeypatch=monkeypatch
    )
    grads, _, _ = run_trl(tiny_model, tmp_path, batch, fields, spg=spg, lr=LR_ITER)
    assert len(grads) == len(sr_steps) == 2
    for k in range(2):
        tol = grad_tolerance(sr_steps[k], batch)
        _assert_same(grads[k], sr_steps[k], f"{name}: stage {k + 1} gradients", tol)


#: (objective fields, TRL's loss under accumulation) of the two objectives TRL's own loss computes. Token-mean
#: is TRL's ``bnpo`` in one micro-batch; under accumulation ``bnpo`` averages the micro-batches' token means
#: (equal only when they hold as many tokens), and ``dapo`` divides by the generation batch's token count: the
#: token-mean. GSPO's seq-mean-token-mean is ``grpo`` with the sequence ratio, exact under accumulation.
TRL_OWN = [
    ({"objective": "grpo", "adv_scale": "none"}, "dapo"),
    ({"objective": "gspo", "adv_scale": "none"}, "grpo"),
]


@pytest.mark.parametrize(("fields", "accumulated_loss"), TRL_OWN, ids=["grpo", "gspo"])
def test_trl_plugin_equals_trl_own_loss(tiny_model, tmp_path, fields, accumulated_loss):
    """The plug-in against TRL's own GRPOTrainer at ``trl_loss_settings`` (adv_scale none: TRL's advantages,
    r − mean of dyadic rewards, are then exactly ours). Both score through the same float32 kernel, which also
    accumulates the LM head's (here the tied embedding's) gradient in float32: the float32 tolerance, in one
    micro-batch and accumulated over 2 micro-batches for 2 iterations (TRL shuffles the rows first), every
    optimizer step's gradients and the final weights."""
    batch, _, _ = run_scaledrun(tiny_model, tmp_path, fields)  # the chosen batch
    trl = trl_loss_settings(ObjectiveConfig(**fields))
    mine, my_weights, _ = run_trl(tiny_model, tmp_path, batch, fields)
    theirs, their_weights, _ = run_trl(tiny_model, tmp_path, batch, fields, plugin=False, trl=trl)
    _assert_same(mine[0], theirs[0], "one micro-batch: gradients", grad_tolerance(theirs[0], batch))
    _assert_same(my_weights, their_weights, "one micro-batch: weights", WEIGHT_TOL)

    trl = {**trl, "loss_type": accumulated_loss}
    mine, my_weights, _ = run_trl(tiny_model, tmp_path, batch, fields, iterations=2, spg=2)
    theirs, their_weights, _ = run_trl(
        tiny_model, tmp_path, batch, fields, plugin=False, trl=trl, iterations=2, spg=2
    )
    assert len(mine) == len(theirs) == 2
    for k in range(2):
        _assert_same(mine[k], theirs[k], f"step {k + 1}: gradients", grad_tolerance(theirs[k], batch))
    _assert_same(my_weights, their_weights, "weights after both steps", WEIGHT_TOL)


# ------------------------------------------------------------------------------------------------
# TRL's features pass through; settings that would bypass the objective are refused


def _config(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=8, num_generations=4
    )
    return CancellationGRPOConfig(**{**base, **kw})


def test_trl_plugin_leaves_vllm_and_trainer_settings_untouched(tmp_path):
    """Every GRPOConfig field but the three it maps (``epsilon``, ``epsilon_high``, ``scale_rewards``) keeps the
    value GRPOConfig itself gives it: vLLM (server and colocate), PEFT-related and checkpointing settings."""
    from trl import GRPOConfig

    for kw in (
        dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.35, vllm_tensor_parallel_size=1,
             vllm_importance_sampling_mode="sequence_truncate", gradient_checkpointing=True),
        dict(use_vllm=True, vllm_mode="server", vllm_server_host="10.0.0.2", vllm_server_port=8001,
             vllm_importance_sampling_correction=False, steps_per_generation=4, gradient_accumulation_steps=2),
    ):  # fmt: skip
        base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=8,
                    num_generations=4, **kw)  # fmt: skip
        ours, theirs = CancellationGRPOConfig(**base, objective="dfpo"), GRPOConfig(**base)
        for f in dataclasses.fields(GRPOConfig):
            if f.name in ("epsilon", "epsilon_high", "scale_rewards"):
                continue
            assert getattr(ours, f.name) == getattr(theirs, f.name), f.name
        for name, value in kw.items():
            assert getattr(ours, name) == value


def test_trl_plugin_config_parses_from_the_command_line(tmp_path):
    """TRL's ``TrlParser`` (an ``HfArgumentParser``) reads the objective fields by name, and ``--help`` shows
    the docstrings declared once in ``ObjectiveConfig``."""
    from trl import TrlParser

    parser = TrlParser((CancellationGRPOConfig,))
    (args,) = parser.parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--use_cpu", "true", "--bf16", "false", "--per_device_train_batch_size",
         "8", "--num_generations", "4", "--objective", "dfpo", "--transform", "orth_proj", "--epsilon_high", "0.01"]
    )  # fmt: skip
    assert (args.objective, args.transform, args.epsilon_high, args.epsilon_low) == (
        "dfpo",
        "orth_proj",
        0.01,
        None,
    )
    assert args.objective_params() == {"epsilon_high": 0.01, "length_norm": True, "transform": "orth_proj",
                                       "stop_grad": True}  # fmt: skip
    help_text = " ".join(parser.format_help().split())
    assert " ".join(class_field_docs(ObjectiveConfig)["transform"].split()) in help_text


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"loss_type": "bnpo"}, "`loss_type`"),
        ({"importance_sampling_level": "sequence"}, "`importance_sampling_level`"),
        ({"delta": 4.0}, "`delta`"),
        ({"top_entropy_quantile": 0.2}, "`top_entropy_quantile`"),
        ({"entropy_coef": 0.01}, "`entropy_coef`"),
        ({"off_policy_mask_threshold": 0.5}, "`off_policy_mask_threshold`"),
        ({"multi_objective_aggregation": "normalize_then_sum"}, "`multi_objective_aggregation`"),
        ({"beta": 0.04}, "use_bias_correction_kl=False"),
        ({"scale_rewards": "batch"}, "adv_scale='batch' is what scale_rewards='batch' means"),
        ({"scale_rewards": False}, "adv_scale='none' is what scale_rewards=False means"),
        ({"epsilon": 0.28}, "objective 'grpo' does not take it"),
        ({"objective": "dfpo", "epsilon": 0.2}, "TRL's lower clip is `epsilon_low` here"),
        ({"objective": "dfpo", "transform": "orth"}, "`transform`='orth': unknown value"),
        ({"per_device_train_batch_size": 2, "steps_per_generation": 2}, "split between optimizer steps"),
        ({"steps_per_generation": 3, "gradient_accumulation_steps": 2}, "span two generation batches"),
    ],
    ids=lambda v: "-".join(map(str, v)) if isinstance(v, dict) else None,
)
def test_trl_plugin_refuses_settings_that_bypass_the_objective(tmp_path, kw, named):
    with pytest.raises(ValueError) as err:
        _config(tmp_path, **kw)
    assert named in str(err.value)


def test_trl_plugin_refuses_a_group_split_between_processes():
    """TRL itself accepts 2 rows per process × 2 processes for groups of 4 (its check is on the global
    generation batch); the plug-in refuses it, naming the settings that keep groups whole."""
    args = SimpleNamespace(
        per_device_train_batch_size=2,
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        num_generations=4,
    )
    with pytest.raises(ValueError, match="split between processes") as err:
        check_layout(args)
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations"):
        assert name in str(err.value)
    check_layout(
        SimpleNamespace(**{**vars(args), "per_device_train_batch_size": 4})
    )  # whole groups: accepted


def test_trl_plugin_trains_a_peft_adapter_with_gradient_checkpointing(tiny_model, tmp_path):
    """PEFT and gradient checkpointing pass through: TRL wraps the model in the adapter (the base weights do
    not move, every LoRA B does), and checkpointing recomputes the forward without changing the gradients
    (DFPO Orth-Proj, two iterations so the second step is off-policy)."""
    from peft import LoraConfig

    fields = {"objective": "dfpo", "transform": "orth_proj"}
    batch, _, _ = run_scaledrun(tiny_model, tmp_path, fields)  # the chosen batch
    lora = dict(r=4, lora_alpha=8.0, target_modules=["q_proj", "v_proj"])
    runs = {
        ckpt: run_trl(
            tiny_model, tmp_path / str(ckpt), batch, fields, iterations=2, spg=2, lr=LR_ITER,
            peft=LoraConfig(**lora), gradient_checkpointing=ckpt,
        )
        for ckpt in (False, True)
    }  # fmt: skip
    grads, weights, trainer = runs[True]
    assert trainer.model.is_gradient_checkpointing
    assert set(grads[0]) == {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert grads[0] and all("lora_" in n for n in grads[0])
    base = dict(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float64).named_parameters())
    for name, value in weights.items():
        if "lora_B" in name:
            assert float(value.abs().max()) > 0, name  # B starts at 0: the update moved it
        elif "lora_" not in name:
            key = name.replace("base_model.model.", "").replace(".base_layer", "")
            assert torch.equal(value, base[key].detach()), name
    for k in range(2):
        tol = grad_tolerance(grads[k], batch, vocab=trainer.model.config.vocab_size)
        _assert_same(grads[k], runs[False][0][k], f"step {k + 1}: checkpointed", tol)


def test_trl_plugin_eval_loss_is_the_objective_on_the_eval_batch(tiny_model, tmp_path):
    """TRL's evaluation (``eval_dataset``) scores the objective on each eval batch alone, with this
    project's advantages: on-policy (no old log-probs, ratio 1) GRPO's token-mean loss is −Σ_i Â_i·|y_i| / Σ_i |y_i|."""
    from datasets import Dataset

    fields = {"objective": "grpo"}
    batch, _, _ = run_scaledrun(tiny_model, tmp_path, fields)
    texts = list(dict.fromkeys(batch.prompts))
    _, _, trainer = run_trl(
        tiny_model, tmp_path, batch, fields, eval_dataset=Dataset.from_dict({"prompt": texts}),
        eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=len(batch), num_generations_eval=G,
    )  # fmt: skip
    adv = group_advantages(batch.rewards, batch.group, scale="group")
    lengths = batch.completion_mask.sum(-1).double()
    want = -float((adv * lengths).sum() / lengths.sum())
    got = next(row["eval_loss"] for row in trainer.state.log_history if "eval_loss" in row)
    assert close(got, want, float((adv.abs() * lengths).sum() / lengths.sum()), rtol=FLOAT64_RTOL), (
        got,
        want,
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(("name", "fields"), [OBJECTIVES[4]], ids=[OBJECTIVES[4][0]])
def test_trl_plugin_two_processes_equal_one(tiny_model, tmp_path, name, fields):
    """Two DDP processes (gloo), one group each, against one process accumulating the two groups as two
    micro-batches: both optimizer steps' gradients (2 iterations: the second off-policy), the coefficients
    normalised by the global counts and DDP's mean undone (×W). DFPO Orth-Proj: each process's transform sees
    its group whole (about 7 s)."""
    batch, _, _ = run_scaledrun(tiny_model, tmp_path, fields)  # the chosen batch
    torch.save(batch, tmp_path / "batch.pt")
    one, _, _ = run_trl(tiny_model, tmp_path / "one", batch, fields, iterations=2, spg=2, lr=LR_ITER)
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(_free_port()), "-m", "tests.scaledrun.trl_plugin_worker", str(tiny_model),
        str(tmp_path / "batch.pt"), str(tmp_path / "two.pt"), str(tmp_path / "two"), json.dumps(fields), "2", "1",
        str(LR_ITER),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "ACCELERATE_USE_CPU": "true"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    two = torch.load(tmp_path / "two.pt")
    assert len(one) == len(two) == 2
    for k in range(2):
        _assert_same(two[k], one[k], f"{name}: step {k + 1} gradients", grad_tolerance(one[k], batch))
