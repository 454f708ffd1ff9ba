"""Tests that fail on mutations a hand-made mutation run found the suite let through (issue 16 §6): each
asserts a property of the correct code, computed by hand or by an independent plain computation."""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

import scaledrun.rundir as rd
import scaledrun.train as tr
from cancellation import compute_loss
from cancellation.objectives import dfpo_weights
from cancellation.update import CancellationMeter, MeterTotals
from scaledrun.config import RunConfig
from scaledrun.model import load_model_and_tokenizer
from scaledrun.rollout import first_eos_mask, score_completions
from scaledrun.tasks import format_prompt

from ..exactness import close

# ---- run folders


def test_a_refused_lock_does_not_delete_the_holders_lock(tmp_path):
    holder = rd.RunLock(tmp_path).acquire()
    second = rd.RunLock(tmp_path)
    with pytest.raises(rd.RunFolderError):
        second.acquire()
    second.release()  # what the refused run's ``finally`` does
    assert (tmp_path / rd.LOCK_FILE).is_file()
    holder.release()
    assert not (tmp_path / rd.LOCK_FILE).exists()


def test_another_users_live_process_is_alive(monkeypatch):
    """``os.kill(pid, 0)`` on a live process of another user raises PermissionError: it is alive."""

    def kill(pid, sig, error):
        raise error

    monkeypatch.setattr(os, "kill", lambda pid, sig: kill(pid, sig, PermissionError()))
    assert rd._alive(12345)
    monkeypatch.setattr(os, "kill", lambda pid, sig: kill(pid, sig, ProcessLookupError()))
    assert not rd._alive(12345)


#: The fields a resumed run may change: the length of the run, its cadences and flags, and settings
#: that do not change the math (stated here so that adding one to the code is a visible decision).
MAY_DIFFER = {
    "steps", "eval_every", "save_every", "num_eval", "eval_k", "output_dir", "resume", "overwrite", "preset",
    "logprob_chunk_tokens", "flip_every", "save_total_limit",
}  # fmt: skip


def test_every_other_field_is_named_when_it_differs():
    assert rd.RESUME_MAY_DIFFER == MAY_DIFFER
    saved = dataclasses.asdict(RunConfig())
    for name in saved:
        current = {**saved, name: ("<changed>", saved[name])}
        diff = rd.config_differences(saved, current)
        if name in MAY_DIFFER:
            assert diff == [], name
        else:
            assert len(diff) == 1 and diff[0].startswith(f"{name}:"), (name, diff)


def test_a_field_missing_from_the_checkpoint_is_a_difference():
    saved = dataclasses.asdict(RunConfig())
    current = dict(saved)
    del saved["objective"]  # a checkpoint from before the field existed
    assert rd.config_differences(saved, current) == ["objective: '<absent>' -> 'grpo'"]


# ---- rollouts


def test_the_eos_token_is_in_the_loss_mask():
    mask, truncated = first_eos_mask(torch.tensor([[5, 6, 2, 0], [2, 0, 0, 0], [5, 5, 5, 5]]), [2])
    assert mask.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]  # through the EOS, inclusive
    assert truncated.tolist() == [False, False, True]


def test_dropped_groups_count_groups_left_with_one_row():
    group = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    valid = torch.tensor([True, True, True, False, False, False, True, True])
    assert tr.dropped_groups(group, valid) == 2  # group 1 (one row) and group 2 (none)
    assert tr.dropped_groups(group, None) == 0


@pytest.fixture
def chosen(tiny_model):
    """A LoRA policy (adapter still zero) and chosen completions of unequal lengths at T = 0.6."""
    cfg = RunConfig(model=str(tiny_model), temperature=0.6)
    model, tok = load_model_and_tokenizer(cfg)
    digits = [tok.convert_tokens_to_ids(str(d)) for d in range(10)]
    eos, pad = tok.eos_token_id, tok.pad_token_id
    comps = [[digits[1], digits[2], eos, pad, pad], [digits[3], eos, pad, pad, pad], [digits[4]] * 5]
    prompts = [format_prompt(tok, "What is 12+34?")] * 3
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    return model, tok, enc, torch.tensor(comps)


def test_reference_logprobs_are_at_the_sampling_temperature(chosen):
    """With the adapter still zero the reference (adapter off) is the policy: ref == old at T = 0.6."""
    model, tok, enc, comps = chosen
    batch, _ = score_completions(
        model, tok, enc["input_ids"], enc["attention_mask"], comps, prompts=["p"] * 3, answers=["a"] * 3,
        group_ids=[0, 0, 0], temperature=0.6, ref_model_ctx=model.disable_adapter,
    )  # fmt: skip
    assert batch.ref_logp is not None and float(batch.old_logp.abs().sum()) > 0
    assert torch.equal(batch.ref_logp, batch.old_logp)


@pytest.mark.exactness
def test_logged_entropy_averages_over_completion_tokens_only(chosen, tiny_model):
    """The scorer's entropy (chunked, padded) = the full logits' mean over completion tokens, both in
    float64 (``tests/exactness.py``)."""
    model, tok, enc, comps = chosen
    model.double()
    batch, stats = score_completions(
        model, tok, enc["input_ids"], enc["attention_mask"], comps, prompts=["p"] * 3, answers=["a"] * 3,
        group_ids=[0, 0, 0], temperature=0.6,
    )  # fmt: skip
    # LoRA B = 0: the same policy
    plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float64).eval()
    with torch.no_grad():
        out = plain(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    position_ids=(batch.attention_mask.cumsum(-1) - 1).clamp(min=0))  # fmt: skip
    logsm = torch.log_softmax(out.logits[:, -6:-1].double() / 0.6, -1)
    ent = -(logsm.exp() * logsm).sum(-1)
    mask = batch.completion_mask.double()
    assert mask.sum(1).tolist() == [3.0, 2.0, 5.0]
    assert batch.old_logp.dtype == torch.float64
    assert close(stats["entropy"], float((ent * mask).sum() / mask.sum()), gross=1.0)
    assert not math.isclose(stats["entropy"], float(ent.mean()), rel_tol=1e-3)  # padding would change it


# ---- cancellation


def test_an_all_masked_row_takes_no_part_in_its_groups_transform():
    """Valid rows whose s̄ are all above 1 keep the weights they get without the masked row."""
    old = torch.zeros(4, 3)
    logp = torch.tensor([[0.3] * 3, [0.2] * 3, [0.1] * 3, [0.0] * 3])  # s = e^0.3, e^0.2, e^0.1 > 1
    adv = torch.tensor([1.0, -0.5, -0.5, 0.0])
    mask = torch.ones(4, 3)
    mask[3] = 0.0  # row 3: e.g. a truncated completion left out of the loss (its s̄ would be 1)
    group = torch.zeros(4, dtype=torch.long)
    for transform in ("min_replace", "orth_proj", "orth_proj_pos", "truncate_rebalance"):
        kw = dict(transform=transform, epsilon_low=0.5, epsilon_high=0.5)
        _, s_bar, with_row = dfpo_weights(logp, old, adv, mask, group, **kw)
        _, _, without = dfpo_weights(logp[:3], old[:3], adv[:3], mask[:3], group[:3], **kw)
        assert bool((s_bar[:3] > 1).all())
        torch.testing.assert_close(with_row[:3], without, rtol=0, atol=1e-12)


@pytest.mark.parametrize("objective", ["grpo", "gspo", "dfpo"])
def test_epsilon_low_of_one_is_refused(objective):
    logp = torch.zeros(2, 2)
    with pytest.raises(ValueError, match="epsilon_low"):
        compute_loss(objective, logp, logp, torch.tensor([1.0, -1.0]), torch.ones(2, 2),
                     torch.zeros(2, dtype=torch.long), epsilon_low=1.0)  # fmt: skip
    with pytest.raises(ValueError, match="epsilon_low"):
        RunConfig(objective=objective, epsilon_low=1.0)


def test_the_meter_reports_rounding_noise_as_nan():
    tot = MeterTotals(sequence_net=1e-13, sequence_gross=1e-13, shared_net=0.5, shared_gross=1.0)
    res = tot.residuals()
    assert math.isnan(res["sequence_net_residual"]) and res["shared_residual"] == 0.5
    assert math.isnan(res["group_shared_residual"])  # nothing measured at all


def test_the_meter_does_not_count_padding_coefficients():
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    meter = CancellationMeter(torch.full((2, 2), -1), mask, torch.tensor([0, 0]))
    meter.add(torch.tensor([[1.0, 5.0], [-1.0, 0.0]]))  # 5.0 sits on padding
    tot = meter.totals
    assert (tot.sequence_net, tot.sequence_gross) == (0.0, 2.0)  # c = (1, −1): cancels exactly
