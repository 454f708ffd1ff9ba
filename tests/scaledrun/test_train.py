"""The trainer on the tiny Qwen3 (CPU): one step per objective, log-probs at the sampling temperature,
the coefficients are compute_loss's, batching, Lopti, the reward-balanced buffer, truncation, errors.

Exact micro-batching and the cancellation meter's invariants are in ``test_update.py``.
"""

from __future__ import annotations

import contextlib
import math
import socket
import zlib

import pytest
import torch
from transformers import AutoModelForCausalLM

import scaledrun.train as tr
from cancellation import compute_loss
from cancellation.diagnostics import FLIP_KEYS
from scaledrun.config import RunConfig, load_config
from scaledrun.data import load_tasks
from scaledrun.diagnostics import ENERGY_KEYS, measure_step
from scaledrun.distributed import GlobalCounts
from scaledrun.model import check_model_source, load_model_and_tokenizer
from scaledrun.rewards import REWARDS
from scaledrun.rollout import generate_rollouts, score_completions
from scaledrun.runlog import read_metrics
from scaledrun.tasks import format_prompt

from ..conftest import SEED
from ..exactness import FLOAT64_RTOL, as_float64, max_abs_err, rounding_tolerance
from .conftest import LENGTH_REWARD


def make_cfg(model_dir, out_dir, **kw) -> RunConfig:
    base = dict(
        model=str(model_dir), output_dir=str(out_dir), steps=1, group_size=4, prompts_per_step=2,
        max_new_tokens=8, eval_every=0, save_every=0, warmup_ratio=0.0, num_train=50, num_eval=8,
        reward=LENGTH_REWARD, lr=1e-2, seed=SEED,
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


#: Completion lengths of the chosen batch ``_rollout`` builds (tokens, EOS included; None: no EOS
#: within ``max_new_tokens``, a truncated row): unequal within each group, so rows are padded.
LENGTHS = [[2, 5, 3, 7], [4, 1, 6, None]]


def _rollout(cfg, model, tokenizer, temperature=1.0, lengths=None, first=0):
    """A batch of chosen completions of the first train prompts, scored by the real code at ``temperature``.

    Group k answers prompt k (every odd one with a short preamble, so prompts of unequal length are
    left-padded); row j of a group holds the digit 1 (a token the group shares), then the digits
    (j + i) mod 10 up to its length, then EOS: distinct texts (so the test reward differs within a
    group), unequal lengths and right padding, whatever this machine's model would have sampled. ``scaledrun.rollout.score_completions``
    computes the masks, truncation flags and old log-probs as for sampled completions. ``first``: the
    first train prompt (and group id) used. The rewards are the test reward of each text.
    """
    lengths = LENGTHS if lengths is None else lengths
    width = cfg.max_new_tokens
    assert all(n is None or 1 <= n <= width for row in lengths for n in row)
    tasks = load_tasks(cfg, "train", cfg.num_train)[first : first + len(lengths)]
    digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    prompts, answers, groups, completions = [], [], [], []
    for k, (task, row_lengths) in enumerate(zip(tasks, lengths, strict=True)):
        for j, n in enumerate(row_lengths):
            size = width if n is None else n - 1  # tokens before the EOS
            body = [digits[1], *(digits[(j + i) % 10] for i in range(size - 1))][:size]
            tail = [] if n is None else [eos]
            completions.append(body + tail + [pad] * (width - len(body) - len(tail)))
            prompts.append(format_prompt(tokenizer, ("Quick one. " if k % 2 else "") + task.prompt))
            answers.append(task.answer)
            groups.append(first + k)
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    batch, stats = score_completions(
        model, tokenizer, enc["input_ids"], enc["attention_mask"], torch.tensor(completions),
        prompts=prompts, answers=answers, group_ids=groups, temperature=temperature,
    )  # fmt: skip
    batch.rewards = torch.tensor(REWARDS[LENGTH_REWARD](batch.prompts, batch.completions, batch.answers))
    return batch, stats


def replay_dir(root, cfg, lengths, step=1, rank=None, first=0):
    """Write a chosen batch (``_rollout(lengths=...)``, scored by ``cfg``'s model at its temperature) as
    the batch the trainer replays at ``step`` (``--replay_dir``; ``rank``: that process's only)."""
    model, tokenizer = load_model_and_tokenizer(cfg)
    batch, _ = _rollout(cfg, model, tokenizer, temperature=cfg.temperature, lengths=lengths, first=first)
    folder = root if rank is None else root / f"rank{rank}"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(batch, folder / f"step_{step:06d}_rollouts.pt")
    return root


def _advantage_sum_tol(batch, rows):
    """The rounding bound of Σ_i Â_i over ``rows`` (float32): each Â_i = (r_i − mean)/std carries the mean's
    rounding (a sum of G terms), and the sum adds G more (``tests/exactness.py``)."""
    g = len(rows)
    gross = sum(abs(float(batch.advantages[i])) for i in rows)
    return rounding_tolerance(gross, g * (g + 1), batch.advantages.dtype)


def _own_logp(model, batch, temperature=1.0):
    """(log π, entropy) at ``temperature`` of the completion tokens, from the logits, one position at a time."""
    am = batch.attention_mask
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=batch.input_ids, attention_mask=am, position_ids=pos).logits
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # float64 stays float64
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


def _check_logprobs_at(model, batch, stats, temperature):
    mask = batch.completion_mask
    with torch.no_grad():
        at_t, ent_t = _own_logp(model, batch, temperature)
        at_1, _ = _own_logp(model, batch, 1.0)
    assert batch.old_logp.dtype == torch.float64  # exactness in float64 (tests/exactness.py)
    tol = FLOAT64_RTOL * float(at_t.abs().max())
    torch.testing.assert_close(batch.old_logp, at_t * mask, atol=tol, rtol=0)
    assert float(((batch.old_logp - at_1) * mask).abs().max()) > 1e-2  # T = 1 would be visibly different
    # the logged entropy: the mean over completion tokens of the sampling policy's entropy
    assert math.isclose(stats["entropy"], float((ent_t * mask).sum() / mask.sum()), rel_tol=FLOAT64_RTOL)


@pytest.mark.exactness
def test_old_logprobs_and_entropy_are_those_of_the_sampling_temperature(tiny_model, tmp_path):
    """At T = 0.6, on a chosen batch with left-padded prompts and right-padded completions of unequal
    lengths (and a truncated row), and on what ``generate_rollouts`` samples. The chunked scorer against
    the full logits: model in float64 (``tests/exactness.py``)."""
    cfg = make_cfg(tiny_model, tmp_path)
    model, tokenizer = load_model_and_tokenizer(cfg)
    model.double().eval()
    batch, stats = _rollout(cfg, model, tokenizer, temperature=0.6)
    lengths = batch.completion_mask.sum(1)
    assert len(set(lengths.tolist())) > 1 and bool(batch.truncated.any())  # padding to get right
    assert len(set(batch.attention_mask[:, : batch.prompt_len].sum(1).tolist())) > 1  # and left padding
    _check_logprobs_at(model, batch, stats, 0.6)
    tasks = load_tasks(cfg, "train", cfg.num_train)[: cfg.prompts_per_step]
    torch.manual_seed(SEED)
    sampled, sampled_stats = generate_rollouts(
        model, tokenizer, [format_prompt(tokenizer, t.prompt) for t in tasks], [t.answer for t in tasks],
        list(range(len(tasks))), num_generations=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
        temperature=0.6, top_p=1.0,
    )  # fmt: skip
    _check_logprobs_at(model, sampled, sampled_stats, 0.6)


def test_first_on_policy_ratio_is_exactly_one_with_temperature_and_lora_dropout(
    tiny_model, tmp_path, monkeypatch
):
    """At T = 0.6 with LoRA dropout 0.05 each step's first (on-policy) mini-batch has every ratio exactly 1.0.

    Exactly, not to a tolerance: the old-log-prob pass (eval mode) and the loss pass (train mode,
    dropout at p = 0) run the same function on the same tensors (same shapes, deterministic CPU
    kernels), so logp − old_logp is 0.0 and exp(0) = 1.0. Step 2 is the one that tests dropout: at
    step 1 LoRA's B is still 0, so the adapter (and its dropout) adds nothing yet. Without
    ``dropout_off`` step 2's ratios are not 1.

    The trainer reuses the old log-probs for an on-policy mini-batch (no second pass, ratio 1 by
    construction); the runs below turn that off so that the loss pass is the one that scores.
    """
    kw = dict(temperature=0.6, lora_dropout=0.05, objective="grpo", steps=2)
    rows = tr.train(make_cfg(tiny_model, tmp_path / "reuse", **kw)).rows
    assert all(r["ratio/min"] == 1.0 == r["ratio/max"] for r in rows)
    update = tr.update
    monkeypatch.setattr(tr, "update", lambda *a, **k: update(*a, **{**k, "on_policy": False}))
    rows = tr.train(make_cfg(tiny_model, tmp_path / "on", **kw)).rows
    for row in rows:  # one mini-batch, one inner epoch: each step's only mini-batch is on-policy
        assert row["ratio/min"] == 1.0 and row["ratio/max"] == 1.0 and row["clip/frac"] == 0.0
    monkeypatch.setattr(tr, "dropout_off", lambda model: contextlib.nullcontext())
    row = tr.train(make_cfg(tiny_model, tmp_path / "off", **kw)).rows[1]
    assert row["ratio/min"] < 1.0 < row["ratio/max"]  # dropout active in the loss pass: the test can fail


@pytest.mark.exactness
def test_minibatch_coefficients_are_compute_loss(tiny_model, tmp_path):
    """The trainer's coefficients against autograd of compute_loss and a hand-worked form (float64:
    ``tests/exactness.py``)."""
    cfg = make_cfg(tiny_model, tmp_path, objective="grpo", aggregation="token-mean", temperature=0.7)
    model, tokenizer = load_model_and_tokenizer(cfg)
    model.double()
    batch, _ = _rollout(cfg, model, tokenizer, temperature=0.7)
    batch = as_float64(batch)
    model.train()
    mask = batch.completion_mask
    adv = torch.linspace(-1.0, 1.0, len(batch), dtype=torch.float64)
    idx = torch.arange(len(batch) // 2)  # the first group: a mini-batch
    sub = batch.select(idx)
    # global counts as if another process held the other group
    counts = GlobalCounts(tokens=float(mask.sum()), sequences=float(len(batch)))
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
    assert co.coef.dtype == torch.float64
    # coefficients of order 1/N: compared at FLOAT64_RTOL of the largest; the loss at that of its gross
    tol = FLOAT64_RTOL * float(co.coef.abs().max())
    torch.testing.assert_close(co.coef, -leaf.grad * sub.completion_mask, atol=tol, rtol=0)
    torch.testing.assert_close(co.loss, loss.detach(), atol=FLOAT64_RTOL * float(co.coef.abs().sum()), rtol=0)
    # on-policy token-mean by hand: c_{i,t} = A_i / N_global, and loss = −Σ m·A / N_global
    by_hand = adv[idx][:, None] * sub.completion_mask / counts.tokens
    torch.testing.assert_close(co.coef, by_hand, atol=tol, rtol=0)
    assert math.isclose(
        float(co.loss), -float(by_hand.sum()), rel_tol=0, abs_tol=FLOAT64_RTOL * float(by_hand.abs().sum())
    )


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


@pytest.mark.exactness
@pytest.mark.parametrize("objective", ["grpo", "gspo"])
def test_lopti_stages_are_compute_loss_with_stage_advantages(tiny_model, tmp_path, objective):
    """Each Lopti stage's gradient is compute_loss's with ``lopti_stage_advantages`` (the toy's code).

    The full mask, normaliser and sequence ratio stay; only the advantages outside the stage's token
    set are zeroed. Swapping in the stage's mask (the trainer's old Lopti) gives another gradient.
    Model and batch in float64 (``tests/exactness.py``).
    """
    from accelerate import Accelerator

    from cancellation.batching import lopti_masks
    from cancellation.update import lopti_stage_advantages

    cfg = make_cfg(tiny_model, tmp_path, objective=objective, lopti_eta=0.5, grad_clip=None, epsilon_low=0.2,
                   epsilon_high=0.2)  # fmt: skip
    model, tokenizer = load_model_and_tokenizer(cfg)
    model.double()
    batch, _ = _rollout(cfg, model, tokenizer)
    batch = as_float64(batch)
    model.train()
    adv = torch.tensor([1.0, -0.5, 0.3, -0.8, -1.2, 0.4, 0.2, 0.6], dtype=torch.float64)
    # the old policy a little off the current one, so gspo's sequence ratio depends on the token set
    batch.old_logp = (
        batch.old_logp
        + 0.05 * torch.linspace(-1, 1, len(batch), dtype=torch.float64)[:, None] * batch.completion_mask
    )
    # η halfway between the two middle distinct π_old: both stages hold tokens whatever this model's π are
    pis = batch.old_logp.exp()[batch.completion_mask.bool()].unique()
    eta = float(pis[len(pis) // 2 - 1] + pis[len(pis) // 2]) / 2
    cfg = RunConfig(**{**cfg.__dict__, "lopti_eta": eta})
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
            m = stage_mask.to(mask.dtype) if swapped else mask
            loss, _ = compute_loss(
                objective, logp, batch.old_logp, stage_adv, m, batch.group, epsilon_low=0.2, epsilon_high=0.2
            )
            loss.backward()
            expected[swapped] = {n: p.grad.detach().clone() for n, p in recorder.named if p.grad is not None}
        got, want, other = _flat(recorder.steps[k]), _flat(expected[False]), _flat(expected[True])
        assert float(want.norm()) > 0
        assert max_abs_err(got, want) <= FLOAT64_RTOL * float(want.abs().max()), f"stage {k}"
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


#: Chosen completion lengths of a step with truncated rows (None) at ``max_new_tokens`` 4: group 1
#: keeps a single completion, so masking the truncated ones drops that group.
TRUNCATED_LENGTHS = [[2, None, 3, 4], [None, None, None, 3], [2, 3, 4, 1], [None, 2, 3, None]]


@pytest.mark.parametrize("truncation", ["mask", "failure_reward", "keep"])
def test_truncation_policies(tiny_model, tmp_path, truncation):
    """What each policy does to the dumped step batch, checked row by row against the raw rewards.

    The step trains on a chosen batch (``--replay_dir``) with truncated rows in three of four groups.
    """
    dbg = tmp_path / "dbg"
    cfg = make_cfg(
        tiny_model, tmp_path / "run", truncation=truncation, max_new_tokens=4, temperature=1.5, prompts_per_step=4,
        failure_reward=-1.0,
    )  # fmt: skip
    replay = replay_dir(tmp_path / "replay", cfg, TRUNCATED_LENGTHS)
    row = tr.train(cfg, debug_dir=dbg, replay_dir=replay).rows[0]
    b = torch.load(dbg / "rank0" / "step_000001_rollouts.pt", weights_only=False)
    cut = b.truncated
    assert cut.tolist() == [n is None for lengths in TRUNCATED_LENGTHS for n in lengths]
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
            assert abs(sum(float(b.advantages[i]) for i in kept)) <= _advantage_sum_tol(b, kept)  # Σ Â = 0
        assert row["truncation/dropped_groups"] == dropped == 1
    else:
        torch.testing.assert_close(b.completion_mask, eos_mask)
        want = torch.where(cut, torch.full_like(raw, -1.0), raw) if truncation == "failure_reward" else raw
        torch.testing.assert_close(b.rewards, want)
        for rows in groups.values():
            assert abs(sum(float(b.advantages[i]) for i in rows)) <= _advantage_sum_tol(b, rows)
        assert row["truncation/dropped_groups"] == 0


def test_a_step_whose_completions_are_all_truncated_takes_no_update_and_says_so(tiny_model, tmp_path, capsys):
    """Step 1 replays a batch whose every completion is truncated (masked out of the loss): no optimizer
    step, no loss, ``truncation/no_update`` = 1, the progress bar and the last line say so; step 2 samples
    and trains as usual."""
    cfg = make_cfg(tiny_model, tmp_path / "run", steps=2, max_new_tokens=4)
    replay = replay_dir(tmp_path / "replay", cfg, [[None] * 4, [None] * 4])
    rows = tr.train(cfg, replay_dir=replay).rows
    assert rows[0]["truncated_frac"] == 1.0 and rows[0]["opt_steps"] == 0.0 and math.isnan(rows[0]["loss"])
    assert [r["truncation/no_update"] for r in rows] == [1.0, 0.0 if rows[1]["truncated_frac"] < 1 else 1.0]
    out = capsys.readouterr()
    assert "all completions truncated, no update" in out.err
    assert "WARNING step 1: every completion reached max_new_tokens=4" in out.err
    assert "Raise `max_new_tokens`" in out.err and out.err.count("WARNING step") == 1  # once per run
    cut = int(sum(r["truncation/no_update"] for r in rows))
    assert f"{cut} step{'s' if cut > 1 else ''} with every completion truncated (no update)" in out.out


def test_eval_keys(tiny_model, tmp_path):
    rows = tr.train(make_cfg(tiny_model, tmp_path / "e", steps=2, eval_every=2, num_eval=6, eval_k=2)).rows
    assert "eval/greedy_accuracy" not in rows[0]
    assert 0.0 <= rows[1]["eval/greedy_accuracy"] <= 1.0 and 0.0 <= rows[1]["eval/avg@2"] <= 1.0
    # the flip and energy diagnostics run on the eval cadence (``flip_every`` None): step 2 only
    assert all(math.isnan(rows[0][k]) for k in (*FLIP_KEYS, *ENERGY_KEYS))
    assert all(math.isfinite(rows[1][k]) for k in ("flip/rate", *ENERGY_KEYS))
    # on-policy, one mini-batch: each completion is scored by the old pass and the gradient pass only;
    # step 2 adds the energy pass (before the step) and the flip pass (after it)
    assert [r["score/rows_per_completion"] for r in rows] == [2.0, 4.0]
    assert all(0.0 <= r["score/padding_frac"] < 1.0 for r in rows)


def test_measure_step_cadence():
    cfg = RunConfig(steps=10, eval_every=4)
    assert [s for s in range(1, 11) if measure_step(cfg, s)] == [4, 8, 10]
    cfg = RunConfig(steps=10, eval_every=4, flip_every=3)
    assert [s for s in range(1, 11) if measure_step(cfg, s)] == [3, 6, 9, 10]
    assert not any(measure_step(RunConfig(steps=10, flip_every=0), s) for s in range(1, 11))


def test_missing_model_folder_names_the_field(tmp_path):
    cfg = make_cfg(tmp_path / "no_such_model", tmp_path / "x")
    with pytest.raises(FileNotFoundError, match=r"`model`.*no such folder"):
        tr.train(cfg)


@pytest.fixture
def hub(monkeypatch):
    """The hub settings ``check_model_source`` reads (huggingface_hub reads its env vars at import)."""
    from huggingface_hub import constants

    with socket.socket() as sock:  # a port nothing listens on: a request there is refused at once
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.setattr(constants, "ENDPOINT", closed)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return constants


def test_a_model_name_that_is_no_folder_fails_at_once_naming_the_local_folders(tmp_path, monkeypatch, hub):
    """``--model tiny-qwen3`` (the folder is artifacts/tiny-qwen3): no hub retries, the local folders named."""
    (tmp_path / "artifacts" / "tiny-x").mkdir(parents=True)
    (tmp_path / "artifacts" / "tiny-x" / "config.json").write_text("{}")
    (tmp_path / "artifacts" / "not-a-model").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as err:  # hub unreachable (a closed local port)
        check_model_source("tiny-qwen3")
    assert "cannot be reached" in str(err.value) and "local model folders here: artifacts/tiny-x" in str(
        err.value
    )
    assert "not-a-model" not in str(err.value)
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    with pytest.raises(
        FileNotFoundError, match="HF_HUB_OFFLINE is set; local model folders here: artifacts/tiny-x"
    ):
        check_model_source("tiny-qwen3")
    for path in ("artifacts/tiny-qwen3", "./tiny-qwen3", str(tmp_path / "m"), "a/b/c"):  # paths: no network
        with pytest.raises(
            FileNotFoundError, match=r"no such folder; local model folders here: artifacts/tiny-x"
        ):
            check_model_source(path)
    with pytest.raises(FileNotFoundError, match=r"holds no config\.json"):
        check_model_source("artifacts/not-a-model")
    check_model_source("artifacts/tiny-x")  # a model folder passes
    (tmp_path / "artifacts" / "tiny-x" / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no local model folder here; build the tiny model"):
        check_model_source("tiny-qwen3")


@pytest.mark.parametrize("what", ["model", "task"])
def test_a_refused_run_creates_no_folder(tiny_model, tmp_path, capsys, hub, what):
    """Everything is checked before the run folder is created: a refused run leaves nothing behind."""
    out = tmp_path / "runs" / "new"
    bad = {"model": ["--model", str(tmp_path / "no_model")], "task": ["--task", str(tmp_path / "no.jsonl")]}
    argv = [
        "--config",
        "scaledrun/configs/default.yaml",
        "--model",
        str(tiny_model),
        "--output_dir",
        str(out),
    ]
    with pytest.raises(SystemExit) as exit_info:
        tr.main(argv + bad[what])
    assert exit_info.value.code == 2 and f"`{what}`" in capsys.readouterr().err
    assert not out.exists() and not out.parent.exists()


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


def _changed_fraction(model, base) -> float:
    changed = total = 0
    for n, p in model.named_parameters():
        changed += int((p.detach().float() != base[n].detach().float()).sum())
        total += p.numel()
    return changed / total


@pytest.mark.parametrize("lr", [1e-5, 8e-7])
def test_bf16_full_finetune_keeps_fp32_master_weights(tiny_model, tmp_path, lr):
    """One full fine-tuning step in bfloat16 moves as many weights as in float32 (fp32 master weights,
    bf16 autocast); AdamW on bf16 weights would lose the updates below bf16's resolution."""
    base = dict(AutoModelForCausalLM.from_pretrained(tiny_model).named_parameters())
    runs = {}
    for dtype in ("float32", "bfloat16"):
        cfg = make_cfg(tiny_model, tmp_path / dtype, full_finetune=True, lr=lr, dtype=dtype, warmup_ratio=0.0)
        run = tr.train(cfg)
        assert {p.dtype for p in run.model.parameters()} == {torch.float32}
        runs[dtype] = _changed_fraction(run.model, base)
    # rows of the input embedding whose tokens are not in the batch get no gradient, in both runs
    assert runs["float32"] > 0.5 and runs["bfloat16"] >= 0.99 * runs["float32"], runs
    # the other way, measured here: one AdamW step on the bf16 weights of the same size moves far fewer
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for p in model.parameters():
        p.grad = torch.ones_like(p)  # every weight gets a full-size Adam step, lr · 1
    opt.step()
    assert _changed_fraction(model, before) < 0.5 * runs["bfloat16"]


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
