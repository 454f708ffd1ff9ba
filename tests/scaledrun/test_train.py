"""The trainer on the tiny Qwen3 (CPU): one step per objective, the loss is compute_loss, batching, Lopti, errors."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

import scaledrun.train as tr
from cancellation import compute_loss
from scaledrun.config import RunConfig
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
    ("dfpo", {"transform": "min_replace"}),
    ("dfpo", {"transform": "orth_proj"}),
    ("dfpo", {"transform": "orth_proj_pos"}),
    ("dfpo", {"transform": "truncate_rebalance"}),
]


@pytest.mark.parametrize(
    ("objective", "params"), VARIANTS, ids=[f"{o}-{p.get('transform', '')}" for o, p in VARIANTS]
)
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
    # the row's reward stats are those of the completions' lengths (the test reward), independently recomputed
    assert (tmp_path / "run" / "config.yaml").is_file()
    assert any((tmp_path / "run" / "tb").iterdir())


def _rollout(cfg, model, tokenizer, seed=0):
    torch.manual_seed(seed)
    tasks = tr.load_tasks(cfg, "train", cfg.num_train)[: cfg.prompts_per_step]
    batch, _ = generate_rollouts(
        model, tokenizer, [format_prompt(tokenizer, t.prompt) for t in tasks], [t.answer for t in tasks],
        list(range(len(tasks))), num_generations=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
        temperature=1.0, top_p=1.0, mask_truncated=False,
    )  # fmt: skip
    return batch


def _own_logp(model, batch):
    """log π of the completion tokens, computed here from the logits (positions skip the left padding)."""
    am = batch.attention_mask
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=batch.input_ids, attention_mask=am, position_ids=pos).logits.float()
    t = batch.completion_mask.shape[1]
    p = batch.prompt_len
    out = torch.zeros(len(batch), t)
    for i in range(len(batch)):
        for j in range(t):
            lsm = torch.log_softmax(logits[i, p + j - 1], -1)
            out[i, j] = lsm[batch.input_ids[i, p + j]]
    return out


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_minibatch_loss_is_compute_loss(tiny_model, tmp_path, aggregation):
    cfg = make_cfg(
        tiny_model, tmp_path, objective="grpo", aggregation=aggregation, group_size=4, prompts_per_step=2
    )
    model, tokenizer = tr.load_model_and_tokenizer(cfg)
    model.eval()
    batch = _rollout(cfg, model, tokenizer)
    with torch.no_grad():
        own = _own_logp(model, batch)
    mask = batch.completion_mask
    # the rollout's old log-probs are the policy's own log-probs of the sampled tokens
    torch.testing.assert_close(batch.old_logp, own * mask, atol=1e-5, rtol=0)
    adv = torch.linspace(-1.0, 1.0, len(batch))
    idx = torch.arange(len(batch) // 2)  # the first group: a mini-batch
    # global counts as if another process held the other group
    n_tok, n_seq = float(mask.sum()), float(len(batch))
    loss, _metrics, _logp, _ = tr.minibatch_loss(
        model, batch, idx, cfg, adv, token_count=n_tok, seq_count=n_seq
    )
    expected, _ = compute_loss(
        "grpo", own[idx] + 0.05, batch.old_logp[idx], adv[idx], mask[idx], batch.group[idx],
        aggregation=aggregation, token_count=n_tok, seq_count=n_seq,
    )  # fmt: skip
    ref, _ = compute_loss(
        "grpo", own[idx], batch.old_logp[idx], adv[idx], mask[idx], batch.group[idx],
        aggregation=aggregation, token_count=n_tok, seq_count=n_seq,
    )  # fmt: skip
    torch.testing.assert_close(loss.detach(), ref, atol=1e-6, rtol=1e-6)
    assert not torch.isclose(expected, ref)  # the comparison is sensitive to the log-probs
    # and the ratio is 1 at the old policy: loss = −Σ m·A / N_global (token-mean) by hand
    if aggregation == "token-mean":
        by_hand = -sum(float(adv[i]) * float(mask[i].sum()) for i in idx.tolist()) / n_tok
    else:
        by_hand = -sum(float(adv[i]) * (1.0 if mask[i].sum() > 0 else 0.0) for i in idx.tolist()) / n_seq
    assert math.isclose(float(loss.detach()), by_hand, rel_tol=1e-5, abs_tol=1e-7)
    # the global normaliser: the two halves' losses (each with the global counts) sum to the whole batch's
    other = torch.arange(len(batch) // 2, len(batch))
    loss2, *_ = tr.minibatch_loss(model, batch, other, cfg, adv, token_count=n_tok, seq_count=n_seq)
    whole, *_ = tr.minibatch_loss(model, batch, torch.arange(len(batch)), cfg, adv)
    torch.testing.assert_close(loss.detach() + loss2.detach(), whole.detach(), atol=1e-6, rtol=1e-6)


class _Spy:
    """Records every minibatch_loss call of the trainer, then runs the real function."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self, model, batch, idx, cfg, advantages, **kw):
        mask = kw.get("mask")
        m = (batch.completion_mask if mask is None else mask)[idx]
        self.calls.append(
            {
                "group": batch.group[idx].clone(),
                "idx": idx.clone(),
                "mask": m.clone(),
                "old_logp": batch.old_logp[idx].clone(),
                "full_mask": batch.completion_mask[idx].clone(),
            }
        )
        return self.fn(model, batch, idx, cfg, advantages, **kw)


def _groups_split(calls):
    where: dict[int, set[int]] = {}
    for k, c in enumerate(calls):
        for g in c["group"].tolist():
            where.setdefault(g, set()).add(k)
    return sum(len(v) > 1 for v in where.values())


def test_query_batching_keeps_groups_whole(tiny_model, tmp_path, monkeypatch):
    spy = _Spy(tr.minibatch_loss)
    monkeypatch.setattr(tr, "minibatch_loss", spy)
    cfg = make_cfg(
        tiny_model, tmp_path / "q", prompts_per_step=4, num_minibatches=2, inner_epochs=2, batching="query"
    )
    rows = tr.train(cfg).rows
    assert rows[0]["opt_steps"] == 4 and len(spy.calls) == 4
    for epoch in (spy.calls[:2], spy.calls[2:]):
        assert _groups_split(epoch) == 0
        rows_seen = sorted(torch.cat([c["idx"] for c in epoch]).tolist())
        assert rows_seen == list(range(16))  # each completion exactly once per epoch
    spy.calls.clear()
    cfg = make_cfg(tiny_model, tmp_path / "r", prompts_per_step=4, num_minibatches=2, batching="random")
    tr.train(cfg)
    assert _groups_split(spy.calls) > 0  # the random split does scatter groups (fixed seed)


def test_lopti_two_stages(tiny_model, tmp_path, monkeypatch):
    spy = _Spy(tr.minibatch_loss)
    monkeypatch.setattr(tr, "minibatch_loss", spy)
    eta = 0.5
    rows = tr.train(make_cfg(tiny_model, tmp_path / "l", lopti_eta=eta, num_minibatches=2)).rows
    plain = tr.train(make_cfg(tiny_model, tmp_path / "p", num_minibatches=2)).rows
    assert plain[0]["opt_steps"] == 2
    assert rows[0]["opt_steps"] == 4  # two optimiser stages of 2 mini-batches each
    low_calls, high_calls = spy.calls[:2], spy.calls[2:4]
    for c in low_calls:  # stage 1: only tokens with π_old < η
        sel = c["mask"].bool()
        assert torch.equal(sel, c["full_mask"].bool() & (c["old_logp"].exp() < eta))
    for c in high_calls:
        sel = c["mask"].bool()
        assert torch.equal(sel, c["full_mask"].bool() & (c["old_logp"].exp() >= eta))


def test_reward_balanced_buffer_meets_rho(tiny_model, tmp_path, monkeypatch):
    seen = []
    real_update = tr.update

    def spy(cfg, accelerator, model, optimizer, batch, adv, gen):
        seen.append(batch.advantages.clone())
        return real_update(cfg, accelerator, model, optimizer, batch, adv, gen)

    monkeypatch.setattr(tr, "update", spy)
    rho = 0.4
    rows = tr.train(make_cfg(tiny_model, tmp_path / "rb", steps=4, reward_balanced_rho=rho)).rows
    assert sum(r["updated"] for r in rows) == len(seen) >= 1
    for a in seen:
        n = a.numel()
        assert n == 2 * 4  # prompts_per_step whole groups of group_size
        assert int((a > 0).sum()) / n >= rho and int((a < 0).sum()) / n >= rho


def test_eval_keys(tiny_model, tmp_path):
    rows = tr.train(make_cfg(tiny_model, tmp_path / "e", steps=2, eval_every=2, num_eval=6, eval_k=2)).rows
    assert "eval/greedy_accuracy" not in rows[0]
    assert 0.0 <= rows[1]["eval/greedy_accuracy"] <= 1.0 and 0.0 <= rows[1]["eval/avg@2"] <= 1.0


def test_missing_model_folder_names_the_field(tmp_path):
    cfg = make_cfg(tmp_path / "no_such_model", tmp_path / "x")
    with pytest.raises(FileNotFoundError, match="`model`"):
        tr.train(cfg)


def test_cli_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="config file"):
        tr.main(["--config", str(tmp_path / "nope.yaml")])
    with pytest.raises(ValueError, match="group_size"):
        tr.main(["--config", "scaledrun/configs/default.yaml", "--group_size", "1"])
    with pytest.raises(ValueError, match="task"):
        tr.main(["--config", "scaledrun/configs/default.yaml", "--task", str(tmp_path / "missing.jsonl")])


def _one_update(cfg, batch, micro_batch_size, monkeypatch):
    """One ``update`` on ``batch`` from the same initial LoRA weights; the minibatch_loss calls it made."""
    from accelerate import Accelerator

    cfg = RunConfig(**{**cfg.__dict__, "micro_batch_size": micro_batch_size})
    model, _ = tr.load_model_and_tokenizer(cfg)  # seeded LoRA init: the same weights each call
    model.train()
    optimizer, _ = tr.build_optimizer(cfg, model)
    spy = _Counts(getattr(tr.minibatch_loss, "fn", tr.minibatch_loss))  # not a previous call's spy
    monkeypatch.setattr(tr, "minibatch_loss", spy)
    grads: dict[str, torch.Tensor] = {}
    res = tr.update(
        cfg, Accelerator(cpu=True), model, optimizer, batch, batch.advantages, torch.Generator().manual_seed(0),
        first_grads=grads,
    )  # fmt: skip
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return res, grads, weights, spy.calls


class _Counts:
    """Records (rows, token_count, seq_count) of each minibatch_loss call, then runs the real function."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self, model, batch, idx, cfg, advantages, **kw):
        self.calls.append((idx.tolist(), kw.get("token_count"), kw.get("seq_count")))
        return self.fn(model, batch, idx, cfg, advantages, **kw)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_gradient_accumulation_equals_one_pass(tiny_model, tmp_path, monkeypatch, aggregation):
    cfg = make_cfg(tiny_model, tmp_path, objective="grpo", aggregation=aggregation)
    model, tokenizer = tr.load_model_and_tokenizer(cfg)
    model.eval()
    batch = _rollout(cfg, model, tokenizer)
    # advantages that differ within every group (so every completion carries gradient)
    batch.advantages = torch.linspace(-1.0, 1.0, len(batch))
    n = len(batch)
    assert n == 8  # 2 groups of 4: micro-batches of 3 split the first group across two passes
    one, g_one, w_one, calls_one = _one_update(cfg, batch, 0, monkeypatch)
    acc, g_acc, w_acc, calls_acc = _one_update(cfg, batch, 3, monkeypatch)
    # the passes: one over all rows vs rows [0..2], [3..5], [6, 7] in order, all with the global counts
    n_tok = float(batch.completion_mask.sum())
    assert calls_one == [(list(range(n)), n_tok, float(n))]
    assert calls_acc == [([0, 1, 2], n_tok, 8.0), ([3, 4, 5], n_tok, 8.0), ([6, 7], n_tok, 8.0)]
    assert one.opt_steps == acc.opt_steps == 1
    # the same gradient (some LoRA weight must have one) and the same weights after the step
    assert set(g_one) == set(g_acc) and any(float(g.abs().max()) > 0 for g in g_one.values())
    for name in g_one:
        torch.testing.assert_close(g_acc[name], g_one[name], atol=1e-6, rtol=1e-6)
    for name in w_one:
        torch.testing.assert_close(w_acc[name], w_one[name], atol=1e-6, rtol=1e-6)
    # metrics and diagnostics cover the whole mini-batch either way
    assert math.isclose(acc.grad_norm, one.grad_norm, rel_tol=1e-5)
    assert set(one.metrics) == set(acc.metrics) and one.metrics
    for key, value in one.metrics.items():
        assert math.isclose(acc.metrics[key], value, rel_tol=1e-5, abs_tol=1e-6) or (
            math.isnan(value) and math.isnan(acc.metrics[key])
        ), key
    # the residual sums over every micro-batch's logp.grad: a gross sum that misses a pass is smaller
    assert one.residual[1] > 0
    for a, b in zip(acc.residual, one.residual, strict=True):
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-9)
    for a, b in zip(acc.energy, one.energy, strict=True):
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-9)
    for key, value in one.flip.items():
        assert math.isclose(acc.flip[key], value, rel_tol=1e-5, abs_tol=1e-6) or math.isnan(value), key


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
