"""The trainer on the tiny Qwen3 (CPU): one step per objective, log-probs at the sampling temperature,
the coefficients are compute_loss's, batching, Lopti, the reward-balanced buffer, truncation, errors.

Exact micro-batching and the cancellation meter's invariants are in ``test_update.py``.
"""

from __future__ import annotations

import contextlib
import math
import zlib

import pytest
import torch
from transformers import AutoModelForCausalLM

import scaledrun.train as tr
from cancellation import compute_loss
from scaledrun.config import RunConfig, load_config
from scaledrun.rollout import generate_rollouts
from scaledrun.runlog import read_metrics
from scaledrun.tasks import format_prompt

from .conftest import LENGTH_REWARD

torch.set_num_threads(1)


def make_cfg(model_dir, out_dir, **kw) -> RunConfig:
    base = dict(
        model=str(model_dir), output_dir=str(out_dir), steps=1, group_size=4, prompts_per_step=2,
        max_new_tokens=8, eval_every=0, save_every=0, warmup_ratio=0.0, num_train=50, num_eval=8,
        reward=LENGTH_REWARD, lr=1e-2,
    )  # fmt: skip
    base.update(kw)
    return RunConfig(**base)


VARIANTS = [
    ("grpo", {}),
    ("grpo_symclip", {}),
    ("gspo", {}),
    ("gspo", {"estimator": "paper"}),
    ("dfpo", {"transform": "min_replace"}),
    ("dfpo", {"transform": "orth_proj"}),
    ("dfpo", {"transform": "orth_proj_pos"}),
    ("dfpo", {"transform": "truncate_rebalance"}),
    ("dfpo", {"estimator": "ppo_clip"}),
]


def _variant_id(objective, params):
    return "-".join([objective, *(str(v) for v in params.values())])


@pytest.mark.parametrize(("objective", "params"), VARIANTS, ids=[_variant_id(*v) for v in VARIANTS])
def test_one_step_per_objective(tiny_model, tmp_path, objective, params):
    cfg = make_cfg(tiny_model, tmp_path / "run", objective=objective, **params)
    result = tr.train(cfg)
    model = result.model
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    base_params = dict(base.named_parameters())
    lora_changed = 0
    for name, p in model.named_parameters():
        if "lora_B" in name:
            # LoRA's B starts at zero: any non-zero entry is the update
            lora_changed += int(p.detach().abs().max() > 0)
        elif "lora_" not in name:
            key = name.replace("base_model.model.", "").replace(".base_layer", "")
            assert torch.equal(p.detach(), base_params[key].detach()), f"base weight {key} changed"
    assert lora_changed > 0
    rows = read_metrics(cfg.output_dir)
    assert [r["step"] for r in rows] == [1]
    assert set(tr.STEP_KEYS) <= set(rows[0])
    assert rows[0]["opt_steps"] == 1.0 and rows[0]["updated"] == 1.0
    assert (tmp_path / "run" / "config.yaml").is_file()
    assert any((tmp_path / "run" / "tb").iterdir())


def _rollout(cfg, model, tokenizer, seed=0, temperature=1.0):
    torch.manual_seed(seed)
    tasks = tr.load_tasks(cfg, "train", cfg.num_train)[: cfg.prompts_per_step]
    batch, stats = generate_rollouts(
        model, tokenizer, [format_prompt(tokenizer, t.prompt) for t in tasks], [t.answer for t in tasks],
        list(range(len(tasks))), num_generations=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
        temperature=temperature, top_p=1.0,
    )  # fmt: skip
    return batch, stats


def _own_logp(model, batch, temperature=1.0):
    """(log π, entropy) at ``temperature`` of the completion tokens, from the logits, one position at a time."""
    am = batch.attention_mask
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=batch.input_ids, attention_mask=am, position_ids=pos).logits.float()
    t = batch.completion_mask.shape[1]
    p = batch.prompt_len
    rows, ents = [], []
    for i in range(len(batch)):
        row, ent = [], []
        for j in range(t):
            lsm = torch.log_softmax(logits[i, p + j - 1] / temperature, -1)
            row.append(lsm[batch.input_ids[i, p + j]])
            ent.append(-(lsm.exp() * lsm).sum())
        rows.append(torch.stack(row))
        ents.append(torch.stack(ent))
    return torch.stack(rows), torch.stack(ents)


def test_old_logprobs_and_entropy_are_those_of_the_sampling_temperature(tiny_model, tmp_path):
    cfg = make_cfg(tiny_model, tmp_path)
    model, tokenizer = tr.load_model_and_tokenizer(cfg)
    model.eval()
    batch, stats = _rollout(cfg, model, tokenizer, temperature=0.6)
    mask = batch.completion_mask
    with torch.no_grad():
        at_t, ent_t = _own_logp(model, batch, 0.6)
        at_1, _ = _own_logp(model, batch, 1.0)
    torch.testing.assert_close(batch.old_logp, at_t * mask, atol=1e-5, rtol=0)
    assert float(((batch.old_logp - at_1) * mask).abs().max()) > 1e-2  # T = 1 would be visibly different
    # the logged entropy: the mean over completion tokens of the sampling policy's entropy
    assert math.isclose(stats["entropy"], float((ent_t * mask).sum() / mask.sum()), rel_tol=1e-5)


def test_first_on_policy_ratio_is_exactly_one_with_temperature_and_lora_dropout(
    tiny_model, tmp_path, monkeypatch
):
    """At T = 0.6 with LoRA dropout 0.05 each step's first (on-policy) mini-batch has every ratio exactly 1.0.

    Exactly, not to a tolerance: the old-log-prob pass (eval mode) and the loss pass (train mode,
    dropout at p = 0) run the same function on the same tensors (same shapes, deterministic CPU
    kernels), so logp − old_logp is 0.0 and exp(0) = 1.0. Step 2 is the one that tests dropout: at
    step 1 LoRA's B is still 0, so the adapter (and its dropout) adds nothing yet. Without
    ``dropout_off`` step 2's ratios are not 1.
    """
    kw = dict(temperature=0.6, lora_dropout=0.05, objective="grpo", steps=2)
    rows = tr.train(make_cfg(tiny_model, tmp_path / "on", **kw)).rows
    for row in rows:  # one mini-batch, one inner epoch: each step's only mini-batch is on-policy
        assert row["ratio/min"] == 1.0 and row["ratio/max"] == 1.0 and row["clip/frac"] == 0.0
    monkeypatch.setattr(tr, "dropout_off", lambda model: contextlib.nullcontext())
    row = tr.train(make_cfg(tiny_model, tmp_path / "off", **kw)).rows[1]
    assert row["ratio/min"] < 1.0 < row["ratio/max"]  # dropout active in the loss pass: the test can fail


def test_minibatch_coefficients_are_compute_loss(tiny_model, tmp_path):
    cfg = make_cfg(tiny_model, tmp_path, objective="grpo", aggregation="token-mean", temperature=0.7)
    model, tokenizer = tr.load_model_and_tokenizer(cfg)
    batch, _ = _rollout(cfg, model, tokenizer, temperature=0.7)
    model.train()
    mask = batch.completion_mask
    adv = torch.linspace(-1.0, 1.0, len(batch))
    idx = torch.arange(len(batch) // 2)  # the first group: a mini-batch
    sub = batch.select(idx)
    # global counts as if another process held the other group
    counts = tr.GlobalCounts(tokens=float(mask.sum()), sequences=float(len(batch)))
    fwd = tr.minibatch_logprobs(model, sub, cfg, tr.micro_batches(len(sub), 0))
    co = tr.minibatch_coefficients(cfg, sub, adv[idx], fwd["logp"].detach(), counts)
    # independently: autograd of compute_loss on log-probs computed here, at T = 0.7
    own, _ = _own_logp(model, sub, 0.7)
    leaf = own.detach().requires_grad_(True)
    loss, _ = compute_loss(
        "grpo", leaf, sub.old_logp, adv[idx], sub.completion_mask, sub.group,
        aggregation="token-mean", token_count=counts.tokens, seq_count=counts.sequences,
    )  # fmt: skip
    loss.backward()
    torch.testing.assert_close(co.coef, -leaf.grad * sub.completion_mask, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(co.loss, loss.detach(), atol=1e-6, rtol=1e-5)
    # on-policy token-mean by hand: c_{i,t} = A_i / N_global, and loss = −Σ m·A / N_global
    by_hand = adv[idx][:, None] * sub.completion_mask / counts.tokens
    torch.testing.assert_close(co.coef, by_hand, atol=1e-6, rtol=1e-5)
    assert math.isclose(float(co.loss), -float(by_hand.sum()), rel_tol=1e-5, abs_tol=1e-7)


class _Minibatches:
    """Records every mini-batch ``cancellation.update.minibatches`` yields to the trainer."""

    def __init__(self, fn):
        self.fn, self.seen = fn, []

    def __call__(self, group, *args, **kw):
        for mb in self.fn(group, *args, **kw):
            self.seen.append((mb, group[mb.rows].clone()))
            yield mb


def _groups_split(seen):
    where: dict[int, set[int]] = {}
    for k, (_, groups) in enumerate(seen):
        for g in groups.tolist():
            where.setdefault(g, set()).add(k)
    return sum(len(v) > 1 for v in where.values())


def test_query_batching_keeps_groups_whole(tiny_model, tmp_path, monkeypatch):
    spy = _Minibatches(tr.minibatches)
    monkeypatch.setattr(tr, "minibatches", spy)
    cfg = make_cfg(
        tiny_model, tmp_path / "q", prompts_per_step=4, num_minibatches=2, inner_epochs=2, batching="query"
    )
    rows = tr.train(cfg).rows
    assert rows[0]["opt_steps"] == 4 and len(spy.seen) == 4
    for epoch in (spy.seen[:2], spy.seen[2:]):
        assert _groups_split(epoch) == 0
        rows_seen = sorted(torch.cat([mb.rows for mb, _ in epoch]).tolist())
        assert rows_seen == list(range(16))  # each completion exactly once per epoch
    spy.seen.clear()
    cfg = make_cfg(tiny_model, tmp_path / "r", prompts_per_step=4, num_minibatches=2, batching="random")
    tr.train(cfg)
    assert _groups_split(spy.seen) > 0  # the random split does scatter groups (fixed seed)


class _RecordingOptimizer:
    """An optimizer that records the gradient of every step and leaves the weights alone."""

    def __init__(self, model):
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.steps: list[dict[str, torch.Tensor]] = []

    def step(self):
        self.steps.append({n: p.grad.detach().clone() for n, p in self.named if p.grad is not None})

    def zero_grad(self, set_to_none=True):
        for _, p in self.named:
            p.grad = None


def _flat(grads):
    return torch.cat([grads[k].double().flatten() for k in sorted(grads)])


@pytest.mark.parametrize("objective", ["grpo", "gspo"])
def test_lopti_stages_are_compute_loss_with_stage_advantages(tiny_model, tmp_path, objective):
    """Each Lopti stage's gradient is compute_loss's with ``lopti_stage_advantages`` (the toy's code).

    The full mask, normaliser and sequence ratio stay; only the advantages outside the stage's token
    set are zeroed. Swapping in the stage's mask (the trainer's old Lopti) gives another gradient.
    """
    from accelerate import Accelerator

    from cancellation.batching import lopti_masks
    from cancellation.update import lopti_stage_advantages

    eta = 0.5
    cfg = make_cfg(tiny_model, tmp_path, objective=objective, lopti_eta=eta, grad_clip=None, epsilon_low=0.2,
                   epsilon_high=0.2)  # fmt: skip
    model, tokenizer = tr.load_model_and_tokenizer(cfg)
    batch, _ = _rollout(cfg, model, tokenizer)
    model.train()
    adv = torch.tensor([1.0, -0.5, 0.3, -0.8, -1.2, 0.4, 0.2, 0.6])
    # the old policy a little off the current one, so gspo's sequence ratio depends on the token set
    batch.old_logp = (
        batch.old_logp + 0.05 * torch.linspace(-1, 1, len(batch))[:, None] * batch.completion_mask
    )
    recorder = _RecordingOptimizer(model)
    res = tr.update(cfg, Accelerator(cpu=True), model, recorder, batch, adv, torch.Generator().manual_seed(0))
    mask = batch.completion_mask
    stages = lopti_stage_advantages(adv, batch.old_logp, mask, eta)
    low, high = lopti_masks(batch.old_logp, mask, eta)
    assert res.opt_steps == len(recorder.steps) == len(stages) == 2 and bool(low.any()) and bool(high.any())
    for k, (stage_adv, stage_mask) in enumerate(zip(stages, (low, high), strict=True)):
        expected = {}
        for swapped in (False, True):
            model.zero_grad(set_to_none=True)
            logp, _ = _own_logp(model, batch)
            m = stage_mask.float() if swapped else mask
            loss, _ = compute_loss(
                objective, logp, batch.old_logp, stage_adv, m, batch.group, epsilon_low=0.2, epsilon_high=0.2
            )
            loss.backward()
            expected[swapped] = {n: p.grad.detach().clone() for n, p in recorder.named if p.grad is not None}
        got, want, other = _flat(recorder.steps[k]), _flat(expected[False]), _flat(expected[True])
        assert float(want.norm()) > 0
        assert float((got - want).norm() / want.norm()) < 1e-5, f"stage {k}"
        assert float((other - want).norm() / want.norm()) > 1e-2  # the mask swap is a different update


def test_reward_balanced_buffer_meets_rho(tiny_model, tmp_path, monkeypatch):
    seen = []
    real_update = tr.update

    def spy(cfg, accelerator, model, optimizer, batch, adv, gen, **kw):
        seen.append(batch.advantages.clone())
        return real_update(cfg, accelerator, model, optimizer, batch, adv, gen, **kw)

    monkeypatch.setattr(tr, "update", spy)
    rho = 0.4
    rows = tr.train(make_cfg(tiny_model, tmp_path / "rb", steps=4, reward_balanced_rho=rho)).rows
    assert sum(r["updated"] for r in rows) == len(seen) >= 1
    for a in seen:
        n = a.numel()
        assert n == 2 * 4  # prompts_per_step whole groups of group_size
        assert int((a > 0).sum()) / n >= rho and int((a < 0).sum()) / n >= rho
    # the buffer never holds more than its capacity
    assert all(r["buffer_groups"] <= tr.BUFFER_CAPACITY * 2 for r in rows)


@pytest.mark.parametrize("truncation", ["mask", "failure_reward", "keep"])
def test_truncation_policies(tiny_model, tmp_path, truncation):
    """What each policy does to the dumped step batch, checked row by row against the raw rewards."""
    dbg = tmp_path / "dbg"
    cfg = make_cfg(
        tiny_model, tmp_path / "run", truncation=truncation, max_new_tokens=4, temperature=1.5, prompts_per_step=4,
        failure_reward=-1.0,
    )  # fmt: skip
    row = tr.train(cfg, debug_dir=dbg).rows[0]
    b = torch.load(dbg / "rank0" / "step_000001_rollouts.pt", weights_only=False)
    cut = b.truncated
    assert 0 < int(cut.sum()) < len(b)  # some completions truncated, not all
    raw = torch.tensor([(zlib.crc32(c.encode()) % 101) / 100.0 for c in b.completions])  # the test reward
    eos_mask = b.attention_mask[:, b.prompt_len :].float()  # through the first EOS, every row
    groups = {g: [i for i, x in enumerate(b.group.tolist()) if x == g] for g in set(b.group.tolist())}
    if truncation == "mask":
        assert float(b.completion_mask[cut].abs().sum()) == 0 and torch.equal(
            b.advantages[cut], torch.zeros_like(b.advantages[cut])
        )
        torch.testing.assert_close(b.rewards, raw)
        dropped = 0
        for rows in groups.values():
            kept = [i for i in rows if not bool(cut[i])]
            dropped += len(kept) < 2
            assert abs(sum(float(b.advantages[i]) for i in kept)) < 1e-5  # Σ Â = 0 over the rows in the loss
        assert row["truncation/dropped_groups"] == dropped
    else:
        torch.testing.assert_close(b.completion_mask, eos_mask)
        want = torch.where(cut, torch.full_like(raw, -1.0), raw) if truncation == "failure_reward" else raw
        torch.testing.assert_close(b.rewards, want)
        for rows in groups.values():
            assert abs(sum(float(b.advantages[i]) for i in rows)) < 1e-5
        assert row["truncation/dropped_groups"] == 0


def test_eval_keys(tiny_model, tmp_path):
    rows = tr.train(make_cfg(tiny_model, tmp_path / "e", steps=2, eval_every=2, num_eval=6, eval_k=2)).rows
    assert "eval/greedy_accuracy" not in rows[0]
    assert 0.0 <= rows[1]["eval/greedy_accuracy"] <= 1.0 and 0.0 <= rows[1]["eval/avg@2"] <= 1.0


def test_missing_model_folder_names_the_field(tmp_path):
    cfg = make_cfg(tmp_path / "no_such_model", tmp_path / "x")
    with pytest.raises(FileNotFoundError, match="`model`"):
        tr.train(cfg)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config", "{tmp}/nope.yaml"], "config file"),
        (["--config", "scaledrun/configs/default.yaml", "--group_size", "1"], "group_size"),
        (["--config", "scaledrun/configs/default.yaml", "--task", "{tmp}/missing.jsonl"], "task"),
        (
            ["--config", "scaledrun/configs/default.yaml", "--resume", "true", "--overwrite", "true"],
            "overwrite",
        ),
    ],
)
def test_cli_errors_print_the_message_without_a_traceback(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        tr.main([a.format(tmp=tmp_path) for a in argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_full_finetune_gradient_checkpointing_and_bf16_options(tiny_model, tmp_path):
    """The model options of the config: full fine-tuning moves the base weights themselves (no adapter);
    gradient checkpointing and bfloat16 give a model in that dtype that still takes a finite update."""
    base = dict(AutoModelForCausalLM.from_pretrained(tiny_model).named_parameters())

    full = tr.train(make_cfg(tiny_model, tmp_path / "full", full_finetune=True, lr=1e-3))
    names = [n for n, _ in full.model.named_parameters()]
    assert not any("lora_" in n for n in names)
    moved = [n for n, p in full.model.named_parameters() if not torch.equal(p.detach(), base[n].detach())]
    assert len(moved) > len(names) // 2

    cfg = make_cfg(tiny_model, tmp_path / "bf16", dtype="bfloat16", gradient_checkpointing=True)
    run = tr.train(cfg)
    # the base weights are bfloat16; PEFT keeps the adapter weights in float32 (autocast_adapter_dtype)
    assert {p.dtype for n, p in run.model.named_parameters() if "lora_" not in n} == {torch.bfloat16}
    assert run.model.base_model.model.is_gradient_checkpointing
    lora_b = [p for n, p in run.model.named_parameters() if "lora_B" in n]
    assert any(float(p.detach().float().abs().max()) > 0 for p in lora_b)
    assert all(bool(torch.isfinite(p.detach().float()).all()) for p in lora_b)
    row = read_metrics(cfg.output_dir)[0]
    assert row["updated"] == 1.0 and math.isfinite(row["loss"])


def test_offpolicy_config_makes_the_objectives_differ(tiny_model, tmp_path):
    """scaledrun/configs/offpolicy.yaml reuses each batch for several optimiser steps: ratios leave 1, the
    clip binds, and GRPO and GRPO-fix take different updates from the same first batch (the default,
    on-policy config gives clip fractions of 0 and identical GRPO / GRPO-fix updates)."""
    weights = {}
    for obj in ("grpo", "grpo_symclip"):
        cfg = load_config(
            "scaledrun/configs/offpolicy.yaml",
            ["--model", str(tiny_model), "--objective", obj, "--steps", "2", "--eval_every", "0",
             "--output_dir", str(tmp_path / obj), "--save_every", "0"],
        )  # fmt: skip
        assert (cfg.inner_epochs, cfg.num_minibatches) == (4, 2)
        run = tr.train(cfg)
        assert max(r["clip/frac"] for r in run.rows) > 0.0
        assert all(r["opt_steps"] == 8 for r in run.rows)
        weights[obj] = torch.cat(
            [p.detach().flatten() for n, p in run.model.named_parameters() if "lora_" in n]
        )
    assert not torch.allclose(weights["grpo"], weights["grpo_symclip"])
