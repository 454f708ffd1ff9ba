"""Padding-free scoring passes (config ``padding_free``): one packed sequence per pass, the padded values.

- ``scoring.packed_inputs`` on a hand-worked batch: the real tokens in order, positions restarting at 0
  per row, the index of the position that predicts each scored token; bad masks name what is wrong.
- ``completion_scores(..., padding_free=True)`` against the padded pass on a tiny Qwen3 (LoRA): log-probs,
  entropy and the gradients of a weighted sum, in float64 at ``FLOAT64_RTOL`` (``tests/exactness.py``)
  and in float32 at a rounding bound; the packed pass under ``eager`` against the padded one under
  ``sdpa`` (transformers builds the packed-sequence mask for both from ``position_ids``).
- Rows do not see each other: changing every token of one row leaves the others' packed log-probs as
  they were, while the same packed sequence with positions that do not restart (so no packed mask)
  gives other values.
- The trainer: ``score_completions`` (old and reference log-probs) and one ``update`` (its gradient,
  metrics and meter) padded and padding-free, in float64; the token budget of
  ``max_tokens_per_micro_batch`` counts real tokens (hand-worked plans); a training step with
  ``padding_free`` runs every old, reference and loss pass packed (one ``packed_inputs`` call per pass).
- ``attn_implementation``: validated, and given to ``from_pretrained``.
"""

from __future__ import annotations

import pytest
import torch

import scaledrun.train as tr
from scaledrun.config import RunConfig
from scaledrun.model import load_model
from scaledrun.packing import RowLengths, balance_bins, pack_rows
from scaledrun.rollout import score_completions
from scaledrun.scoring import completion_scores, packed_inputs

from ..exactness import FLOAT64_RTOL, rounding_tolerance
from .test_scoring import LOGIT_GROSS, VOCAB, assert_same_grads, grads, lora, tiny_qwen3
from .test_train import _flat, _RecordingOptimizer
from .test_update import _float64_setup, _same_update

#: prompt columns P and completion columns T of the test batch; τ of the comparisons.
P, T = 5, 7
TAU = 0.6
#: The float32 tolerance (values, and gradients norm-wise) of packed against padded. Beyond the head's sums
#: (``test_scoring``'s bound: d = 64 products and a logsumexp over V) the two passes may sum in another
#: order in every layer: the attention scores (head_dim 16), the softmax and the weighted sum over at most
#: P + T keys, o_proj (64), the MLP (64 and 128); the bound of all those sums at the logits' gross.
LAYERS, HEAD_DIM, FFN = 2, 16, 128
TOL32 = rounding_tolerance(LOGIT_GROSS, 64 + VOCAB + LAYERS * (HEAD_DIM + 2 * (P + T) + 64 + 64 + FFN))


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids (4, P + T), attention_mask, completion_mask (4, T)) of random tokens, padding included.

    Row 0: prompt left-padded by 2; row 1: completion right-padded after 4 tokens; row 2: attended but
    not scored (a truncated row); row 3: both paddings (1 left, completion of 2). The padding columns hold
    random tokens too: no pass may read them.
    """
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(2, VOCAB, (4, P + T), generator=gen)
    att = torch.ones_like(ids)
    att[0, :2] = 0
    att[1, P + 4 :] = 0
    att[3, :1] = 0
    att[3, P + 2 :] = 0
    mask = att[:, P:].float()
    mask[2] = 0.0
    return ids, att, mask


@pytest.fixture(scope="module")
def models():
    """A LoRA tiny Qwen3 (B ≠ 0) per dtype, sdpa attention."""
    return {dtype: lora(tiny_qwen3(dtype)) for dtype in (torch.float64, torch.float32)}


def scores(model, ids, att, mask, padding_free, **kw):
    return completion_scores(
        model, ids, att, T, temperature=TAU, completion_mask=mask, with_entropy=True,
        padding_free=padding_free, **kw,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# the packed inputs


def test_packed_inputs_by_hand():
    ids = torch.tensor([[0, 11, 12, 13, 14, 0], [21, 22, 23, 24, 0, 0]])  # P = 3, T = 3
    att = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]])
    scored = torch.tensor([[True, True, False], [True, False, False]])
    packed, positions, keep = packed_inputs(ids, att, 3, scored)
    assert packed.tolist() == [[11, 12, 13, 14, 21, 22, 23, 24]]
    assert positions.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]
    # row 0 scores 13 (packed 2, from 1) and 14 (3, from 2); row 1 scores 24 (packed 7, from 6)
    assert keep.tolist() == [1, 2, 6]
    with pytest.raises(ValueError, match="is padding"):
        packed_inputs(ids, att, 3, torch.tensor([[True, True, True], [True, False, False]]))
    no_prompt = torch.tensor([[0, 0, 0, 1, 1, 0], [1, 1, 1, 1, 0, 0]])
    with pytest.raises(ValueError, match="no real token before it"):
        packed_inputs(ids, no_prompt, 3, scored)


# --------------------------------------------------------------------------------------------
# packed = padded


@pytest.mark.exactness
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_packed_logprobs_and_entropy_equal_padded(models, dtype):
    model = models[dtype]
    ids, att, mask = batch()
    with torch.no_grad():
        padded = scores(model, ids, att, mask, False)
        packed = scores(model, ids, att, mask, True, chunk_tokens=3)
    assert packed["logp"].shape == (4, T) and packed["logp"].dtype == torch.promote_types(
        dtype, torch.float32
    )
    assert float(padded["logp"][0].abs().min()) > 0.1  # row 0 is scored everywhere
    tol = FLOAT64_RTOL * float(padded["logp"].abs().max()) if dtype == torch.float64 else TOL32
    for key in ("logp", "entropy"):
        torch.testing.assert_close(packed[key], padded[key], rtol=0, atol=tol)
        assert float(packed[key][mask == 0].abs().max()) == 0.0  # padding and the unscored row
    assert "forward" not in model.base_model.model.lm_head.__dict__  # the head is itself again


@pytest.mark.exactness
def test_packed_under_eager_equals_padded_under_sdpa(models):
    """float32: transformers' eager attention takes its softmax in float32 whatever the model's dtype (a
    float64 model's eager pass differs from its sdpa one by ~1e-7 of a log-prob, padded or not)."""
    model = models[torch.float32]
    ids, att, mask = batch()
    with torch.no_grad():
        padded = scores(model, ids, att, mask, False)
        model.base_model.model.set_attn_implementation("eager")
        try:
            assert model.base_model.model.config._attn_implementation == "eager"
            packed = scores(model, ids, att, mask, True)
        finally:
            model.base_model.model.set_attn_implementation("sdpa")
    torch.testing.assert_close(packed["logp"], padded["logp"], rtol=0, atol=TOL32)


@pytest.mark.exactness
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_packed_gradients_equal_padded(models, dtype):
    model = models[dtype]
    ids, att, mask = batch()
    coef = torch.randn(mask.shape, generator=torch.Generator().manual_seed(12)) * mask

    def loss_of(padding_free):
        return lambda m: (coef.to(dtype) * scores(m, ids, att, mask, padding_free)["logp"]).sum()

    want = grads(model, loss_of(False))
    got = grads(model, loss_of(True))
    assert len(want) == 2 * 2 * 7  # LoRA A and B of 7 targets in both layers, every one nonzero
    assert_same_grads(got, want, FLOAT64_RTOL if dtype == torch.float64 else TOL32)


@pytest.mark.exactness
def test_rows_do_not_see_each_other(models):
    """Every token of row 1 changed: the other rows' packed log-probs stay; positions that do not restart
    (one long sequence, no packed mask) give the later rows other values."""
    model = models[torch.float64]
    ids, att, mask = batch()
    other = ids.clone()
    other[1] = (ids[1] + 7) % (VOCAB - 2) + 2
    assert bool((other[1] != ids[1]).all())
    with torch.no_grad():
        before = scores(model, ids, att, mask, True)["logp"]
        after = scores(model, other, att, mask, True)["logp"]
        tol = FLOAT64_RTOL * float(before.abs().max())
        keep_rows = [0, 2, 3]
        torch.testing.assert_close(after[keep_rows], before[keep_rows], rtol=0, atol=tol)
        assert float((after[1] - before[1]).abs().max()) > 0.01  # row 1 itself did change
        # the control: the same packed tokens with positions 0 .. N − 1 attend across rows
        packed, _, keep = packed_inputs(ids, att, T, mask.bool())
        run_on = torch.arange(packed.shape[1])[None]
        logits = model(input_ids=packed, position_ids=run_on, attention_mask=None, use_cache=False).logits
        logsm = torch.log_softmax(logits[0, keep] / TAU, -1)
        logp = logsm.gather(-1, ids[:, -T:][mask.bool()][:, None]).squeeze(-1)
    want = before[mask.bool()]
    rows = torch.arange(4)[:, None].expand(4, T)[mask.bool()]
    assert float((logp - want)[rows == 0].abs().max()) <= tol  # the first row sees nothing before it anyway
    assert float((logp - want)[rows == 3].abs().max()) > 0.01


# --------------------------------------------------------------------------------------------
# the trainer's passes


@pytest.fixture(scope="module")
def setup(tiny_model, tmp_path_factory):
    """``test_update``'s float64 model (LoRA) and off-policy batch of 2 groups of 4 (unequal lengths,
    a truncated row), its LoRA B ≠ 0 (PEFT's init B = 0 would make the reference pass the policy's)."""
    cfg, accelerator, model, batch = _float64_setup(tiny_model, tmp_path_factory.mktemp("pf"))
    gen = torch.Generator().manual_seed(13)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.1)
    return cfg, accelerator, model, batch


@pytest.mark.exactness
def test_scoring_passes_equal_padded(setup):
    """``score_completions``' old and reference passes (the trainer's token-budget plan), padded and
    padding-free: the same log-probs, entropy and masks (float64)."""
    cfg, accelerator, model, batch = setup
    from scaledrun.model import load_tokenizer

    tokenizer = load_tokenizer(cfg)
    p = batch.prompt_len
    widest = int(batch.attention_mask.sum(1).max())
    out = {}
    for padding_free in (False, True):
        c = RunConfig(
            **{**cfg.__dict__, "max_tokens_per_micro_batch": 2 * widest, "padding_free": padding_free}
        )
        out[padding_free] = score_completions(
            model, tokenizer, batch.input_ids[:, :p], batch.attention_mask[:, :p], batch.completion_ids,
            prompts=batch.prompts, answers=batch.answers, group_ids=batch.group.tolist(), temperature=0.7,
            ref_model_ctx=model.disable_adapter, plan=lambda b, c=c: tr.plan_micro_batches(accelerator, c, b),
            padding_free=padding_free,
        )  # fmt: skip
    (a, sa), (b, sb) = out[False], out[True]
    assert torch.equal(a.completion_mask, b.completion_mask) and float(a.completion_mask.sum()) > 0
    tol = FLOAT64_RTOL * float(a.old_logp.abs().max())
    torch.testing.assert_close(b.old_logp, a.old_logp, rtol=0, atol=tol)
    torch.testing.assert_close(b.ref_logp, a.ref_logp, rtol=0, atol=tol)
    assert float((a.old_logp - a.ref_logp).abs().max()) > 0  # the adapter is on in one, off in the other
    assert abs(sa["entropy"] - sb["entropy"]) <= FLOAT64_RTOL * sa["entropy"]


@pytest.mark.exactness
@pytest.mark.parametrize("budget", [0, 2], ids=["one-pass", "budget"])
def test_update_gradient_equals_padded(setup, budget):
    """One ``update`` (DFPO and GRPO) padded and padding-free: the same gradient, metrics and meter."""
    cfg, accelerator, model, batch = setup
    widest = int(batch.attention_mask.sum(1).max())
    for objective, params in [("grpo", {"epsilon_low": 0.03, "epsilon_high": 0.03}), ("dfpo", {})]:
        res = {}
        for padding_free in (False, True):
            c = RunConfig(**{
                **cfg.__dict__, "objective": objective, **params, "padding_free": padding_free,
                "max_tokens_per_micro_batch": budget * widest or None,
            })  # fmt: skip
            recorder = _RecordingOptimizer(model)
            r = tr.update(
                c, accelerator, model, recorder, batch, batch.advantages, torch.Generator().manual_seed(0)
            )
            assert r.opt_steps == len(recorder.steps) == 1
            res[padding_free] = (r, _flat(recorder.steps[0]))
        (whole, g_whole), (got, g) = res[False], res[True]
        assert float(g_whole.abs().max()) > 0
        _same_update(got, whole, g, g_whole, (objective, budget))
        real = float(batch.attention_mask.sum())
        assert got.tokens == real and got.slots == real < whole.slots  # no padding slot in a packed pass


# --------------------------------------------------------------------------------------------
# the token budget counts real tokens


def test_budget_counts_real_tokens_by_hand():
    """Prompts (3, 1, 2, 2), completions (1, 4, 2, 2), groups {0, 1}, {2, 3}, budget 9.

    Padded: group 0 costs 2 · (3 + 4) = 14 > 9, so it is cut into [1] and [0]; [2, 3] costs 8; no two
    units share a bin (3 · 6 = 18, 3 · 5 = 15). Real tokens: group 0 is 4 + 5 = 9 ≤ 9, group 1 8, 17 together.
    """
    lengths = RowLengths(prompt=torch.tensor([3, 1, 2, 2]), completion=torch.tensor([1, 4, 2, 2]))
    group = torch.tensor([0, 0, 1, 1])
    assert lengths.real_tokens([0, 1]) == 9 and lengths.padded_tokens([0, 1]) == 14
    padded = pack_rows(lengths, group, 9)
    packed = pack_rows(lengths, group, 9, padding_free=True)
    assert [b.tolist() for b in padded] == [[1], [0], [2, 3]]
    assert [b.tolist() for b in packed] == [[0, 1], [2, 3]]
    assert all(lengths.real_tokens(b) <= 9 for b in packed)


def test_balancing_splits_the_bin_with_most_real_tokens():
    """Bins [0, 1] (prompts 1, 1; completions 6, 1: 9 real tokens, 14 padded slots) and [2, 3] (3 + 3
    each: 12 and 12) made 3: padded splits the first, padding-free the second."""
    lengths = RowLengths(prompt=torch.tensor([1, 1, 3, 3]), completion=torch.tensor([6, 1, 3, 3]))
    bins = [torch.tensor([0, 1]), torch.tensor([2, 3])]
    padded = balance_bins(bins, 3, lengths)
    packed = balance_bins(bins, 3, lengths, padding_free=True)
    assert [b.tolist() for b in padded] == [[0], [1], [2, 3]]
    assert [b.tolist() for b in packed] == [[0, 1], [2], [3]]


# --------------------------------------------------------------------------------------------
# the attention kernel


def test_attn_implementation_is_validated_and_loaded(tiny_model, tmp_path):
    with pytest.raises(ValueError, match=r"attn_implementation.*valid: eager, sdpa, flash_attention_2"):
        RunConfig(attn_implementation="flash")
    for impl, want in [("eager", "eager"), (None, "sdpa")]:
        cfg = RunConfig(model=str(tiny_model), output_dir=str(tmp_path), attn_implementation=impl)
        assert load_model(cfg).base_model.model.config._attn_implementation == want


def test_the_trainer_runs_every_policy_pass_packed(tiny_model, tmp_path, monkeypatch):
    """One training step with ``padding_free`` (β > 0, a token budget, 2 inner epochs so the loss pass
    scores again): every old, reference and loss pass goes through ``packed_inputs`` (recorded, not
    replaced), one call per planned pass; without it, none does."""
    import scaledrun.scoring as scoring

    calls: list[int] = []
    real = scoring.packed_inputs

    def recording(input_ids, attention_mask, completion_len, scored):
        calls.append(input_ids.shape[0])
        return real(input_ids, attention_mask, completion_len, scored)

    monkeypatch.setattr(scoring, "packed_inputs", recording)
    planned: list[int] = []
    plan = tr.plan_micro_batches
    monkeypatch.setattr(
        tr, "plan_micro_batches", lambda a, c, s: planned.append(len(r := plan(a, c, s))) or r
    )
    kw = dict(
        model=str(tiny_model), steps=1, group_size=4, prompts_per_step=2, max_new_tokens=8, eval_every=0,
        save_every=0, warmup_ratio=0.0, num_train=50, num_eval=8, beta=0.05, inner_epochs=2,
        max_tokens_per_micro_batch=40,
    )  # fmt: skip
    tr.train(RunConfig(**kw, output_dir=str(tmp_path / "padded")))
    assert calls == [] and planned
    planned.clear()
    row = tr.train(RunConfig(**kw, output_dir=str(tmp_path / "packed"), padding_free=True)).rows[0]
    rollout, *updates = planned  # the scoring plan, then one per mini-batch of each inner epoch
    assert len(updates) == 2 and rollout > 1  # the budget splits the step's 8 rows
    # old + reference per scoring pass; inner epoch 1 reuses the old log-probs (on-policy), so its passes
    # run once (backward), epoch 2's twice (no-grad log-probs, then backward) — or once when it is one pass
    second = updates[1] if updates[1] == 1 else 2 * updates[1]
    assert len(calls) == 2 * rollout + updates[0] + second, (calls, rollout, updates)
    assert row["score/padding_frac"] == 0.0
