"""instruments.coupling_lm: Table 1's instruments on a tiny Qwen3, every number recomputed independently.

Independent references: the trainer's own scorer (``scaledrun.rollout.completion_logprobs``) for the
flattened batch; a plain ``torch.autograd.grad`` of one token's log-prob through an ordinary forward for
the per-token scores; the expanded eq. (7) (``proxy_kernel``) for the untied head's kernel; an SGD step
written by hand on a deep copy of the model (or of the output matrix) for the masking effect; the
order of the first-order error in the step size. The tiny model is warm-started for a few dozen steps
only, so what it samples differs between CPUs: every assertion is an identity, a bound or a property
that holds for any batch, never a number one machine's sample happened to give.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import zlib

import pytest
import torch

from cancellation.coupling import (
    coupling_kernel,
    first_order_delta,
    mask_sets,
    proxy_kernel,
    sgd_step,
)
from instruments.coupling import MASK_SETS, PAPER_BOOST_RATE
from instruments.coupling_lm import (
    EMBED_NAME,
    LM_UPDATES,
    LMBatch,
    batch_summary,
    float64_norms,
    is_tied,
    lm_mask_sets,
    lm_table1,
    load_policy,
    markdown_lm_table1,
    max_rel_diff,
    measure_lm,
    sample_lm_batch,
    summarise_lm,
    update_scores,
)
from scaledrun.rewards import REWARDS, register_reward
from scaledrun.rollout import completion_logprobs
from scaledrun.scoring import position_ids_from_mask

from ..conftest import SEED
from ..exactness import FLOAT64_RTOL, close, rounding_tolerance

# exactness: code paths compared in float64 (the RMSNorms too, inside ``float64_norms``) at FLOAT64_RTOL
pytestmark = [pytest.mark.sampling, pytest.mark.exactness]

#: A reward that differs between distinct completions (almost surely), so every group has A ≠ 0.
HASH_REWARD = "test_coupling_lm_hash"
if HASH_REWARD not in REWARDS:

    @register_reward(HASH_REWARD)
    def _hash_reward(prompts, completions, answers):
        return [(zlib.crc32(c.encode()) % 101) / 100.0 for c in completions]


BATCH = {
    "task": "template_decoy",
    "reward": HASH_REWARD,
    "num_prompts": 1,
    "group_size": 4,
    "max_new_tokens": 10,
}


@pytest.fixture(scope="module")
def tiny_path(decoy_model):
    return decoy_model


@pytest.fixture(scope="module")
def policy(tiny_path):
    # the RMSNorms as shipped (float32 inside): ``float64_norms`` is tested on them below
    return load_policy(tiny_path, exact_norms=False)


@pytest.fixture(scope="module")
def batch(policy):
    model, tok = policy
    return sample_lm_batch(model, tok, seed=SEED, temperature=0.7, **BATCH)


@pytest.fixture(scope="module")
def lr0(batch):
    """The step at which the full update's first-order Δ log π is at most 1e-2 (whatever the batch)."""
    with float64_norms(batch.model):
        k = coupling_kernel(update_scores(batch, "full"))
    return 1e-2 / float(first_order_delta(k, batch.coef, 1.0).total.abs().max())


@pytest.fixture(scope="module")
def measured(batch, lr0):
    """Every token a candidate (low_conf=1: the "low_confidence" mask is every other token with c ≠ 0)."""
    return measure_lm(
        batch, lr=lr0, low_conf=1.0, candidate_filter="none", n_candidates=3, candidate_seed=SEED
    )


def _plain_logp(model, b: LMBatch) -> torch.Tensor:
    """(N,) log π(y_j) from an ordinary forward of ``model`` (no functional_call), flattened by hand."""
    out = model(
        input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=position_ids_from_mask(b.attention_mask),
        use_cache=False,
    )  # fmt: skip
    t = b.completion_mask.shape[1]
    logsm = torch.log_softmax(out.logits[:, -t - 1 : -1, :] / b.temperature, dim=-1)
    ids = b.input_ids[:, -t:]
    return torch.stack([logsm[r, p, ids[r, p]] for r, p in zip(b.row.tolist(), b.pos.tolist(), strict=True)])


# ------------------------------------------------------------------------------------------------
# the batch


def test_flattening_matches_the_trainers_scorer(batch):
    b = batch
    t = b.completion_mask.shape[1]

    def scored():  # the trainer's scorer on the batch
        return completion_logprobs(
            b.model,
            b.input_ids,
            b.attention_mask,
            t,
            temperature=b.temperature,
            completion_mask=b.completion_mask,
        )["logp"]

    ref = scored()
    valid = b.completion_mask.bool()
    assert b.n_tokens == int(valid.sum())
    # row-major over the mask: (row, pos) strictly increasing lexicographically
    key = b.row * t + b.pos
    assert bool((key[1:] > key[:-1]).all())
    assert torch.equal(b.tokens, b.input_ids[:, -t:][valid])
    # both forwards run the shipped RMSNorms, which round to float32 (``policy``: exact_norms=False), and
    # may round a norm's output differently (float32 vs float64 norms: 5e-7 measured): the bound is the
    # float32 rounding of a norm's mean over d terms at the log-probs' scale
    d = b.model.config.hidden_size
    tol = rounding_tolerance(float(ref[valid].abs().max()), d, torch.float32)
    torch.testing.assert_close(b.logp, ref[valid], rtol=0, atol=tol)
    # the flattening itself, in float64 (norms included): the scorer's (row, pos) entries at FLOAT64_RTOL
    with float64_norms(b.model), torch.no_grad():
        logits, _ = b._logits()
        ref64 = scored()
    mine = torch.log_softmax(logits, -1).gather(-1, b.completion_ids.unsqueeze(-1)).squeeze(-1)
    assert max_rel_diff(mine[b.row, b.pos], ref64[valid]) <= FLOAT64_RTOL
    torch.testing.assert_close(b.probs_taken, b.logp.exp())
    assert torch.allclose(b.probs.sum(-1), torch.ones(b.n_tokens, dtype=b.probs.dtype))
    assert torch.equal(b.adv_tok, b.advantages[b.row])


def test_full_scores_rows_are_plain_autograd_grads(batch):
    params = list(batch.model.parameters())
    # in float64, norms included (the shipped ones round to float32, which two code paths may do differently)
    with float64_norms(batch.model):
        scores = update_scores(batch, "full")
        assert scores.shape == (batch.n_tokens, sum(p.numel() for p in params))
        logp = _plain_logp(batch.model, batch)
        for j in sorted({0, batch.n_tokens // 2, batch.n_tokens - 1}):
            grads = torch.autograd.grad(logp[j], params, retain_graph=True, allow_unused=True)
            row = torch.cat(
                [
                    (g if g is not None else torch.zeros_like(p)).reshape(-1)
                    for g, p in zip(grads, params, strict=True)
                ]
            )
            assert max_rel_diff(scores[j], row) < FLOAT64_RTOL


# ------------------------------------------------------------------------------------------------
# the kernels


def test_untied_head_kernel_is_the_proxy(batch):
    assert batch.temperature != 1.0  # the proxy's 1/τ² is exercised
    k_untied = coupling_kernel(update_scores(batch, "head_untied"))
    k_proxy = proxy_kernel(batch.hidden, batch.probs, batch.tokens, temperature=batch.temperature)
    assert max_rel_diff(k_untied, k_proxy) <= 1e-9
    assert max_rel_diff(k_proxy, k_untied) <= 1e-9


def test_tied_head_kernel_includes_the_embedding_path(batch):
    model = batch.model
    assert is_tied(model)
    with float64_norms(model):  # two code paths compared: in float64, norms included
        full = update_scores(batch, "full")
        tied = update_scores(batch, "head_tied")
    # the tied matrix's columns of the full scores are its scores (named_parameters order)
    names = [n for n, _ in model.named_parameters()]
    sizes = [p.numel() for _, p in model.named_parameters()]
    start = sum(sizes[: names.index(EMBED_NAME)])
    assert max_rel_diff(full[:, start : start + tied.shape[1]], tied) < FLOAT64_RTOL
    k_tied = coupling_kernel(tied)
    k_untied = coupling_kernel(update_scores(batch, "head_untied"))
    # every tied model: the tied kernel adds the input-embedding path the proxy leaves out
    assert max_rel_diff(k_untied, k_tied) > 1e-3
    # the untied scores are the output use alone: (e_y − π) hᵀ / τ, row by row
    e = torch.nn.functional.one_hot(batch.tokens, batch.probs.shape[1]).to(batch.probs.dtype)
    by_hand = ((e - batch.probs)[:, :, None] * batch.hidden[:, None, :] / batch.temperature).reshape(
        batch.n_tokens, -1
    )
    assert max_rel_diff(update_scores(batch, "head_untied"), by_hand) < 1e-9


def test_float64_norms_patches_every_rmsnorm_and_restores(batch):
    model = batch.model
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    assert norms
    with torch.no_grad():
        before = _plain_logp(model, batch)
        with float64_norms(model) as count:
            assert count == len(norms)
            assert all("forward" in vars(m) for m in norms)
            x = torch.randn(3, norms[0].weight.shape[0], dtype=torch.float64)
            ref = norms[0].weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + norms[0].variance_epsilon)
            assert max_rel_diff(norms[0](x), ref) < FLOAT64_RTOL  # float64 (float32 inside: ~1e-7)
            inside = _plain_logp(model, batch)
        after = _plain_logp(model, batch)
    assert not any("forward" in vars(m) for m in norms)
    assert torch.equal(before, after)
    # the same function up to float32 rounding (of a norm's mean over d terms, at the log-probs' scale)
    d = model.config.hidden_size
    assert float((inside - before).abs().max()) <= rounding_tolerance(float(inside.abs().max()), d)


def test_load_policy_exact_norms_by_default_and_a_lora_checkpoint_merged(tiny_path, batch, tmp_path):
    from peft import LoraConfig, get_peft_model

    model, _ = load_policy(tiny_path)
    assert all("forward" in vars(m) for m in model.modules() if type(m).__name__.endswith("RMSNorm"))
    # a LoRA checkpoint as scaledrun saves one: the adapter (non-zero B) next to adapter_config.json
    base, _ = load_policy(tiny_path)
    peft = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.1)
    ckpt = tmp_path / "run" / "checkpoints" / "step_000004"
    peft.save_pretrained(str(ckpt))
    cfg = json.loads((ckpt / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == str(tiny_path)
    (ckpt / "trainer_state.json").write_text("{}")
    ids, am = batch.input_ids, batch.attention_mask
    pos = position_ids_from_mask(am)
    with torch.no_grad():
        want = peft(input_ids=ids, attention_mask=am, position_ids=pos).logits
        for where in (ckpt, tmp_path / "run"):  # the checkpoint, and the run folder (its newest one)
            merged, tok = load_policy(where)
            assert "lora" not in " ".join(n for n, _ in merged.named_parameters())
            got = merged(input_ids=ids, attention_mask=am, position_ids=pos).logits
            assert max_rel_diff(got, want) < 1e-10 and tok.padding_side == "left"
    (tmp_path / "empty_run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(ValueError, match="no finished checkpoint"):
        load_policy(tmp_path / "empty_run")


# ------------------------------------------------------------------------------------------------
# one SGD step


@pytest.mark.parametrize("update", LM_UPDATES)
def test_first_order_error_is_second_order_in_the_step(batch, lr0, update):
    logp_of, params = batch.logp_fn(update)
    with float64_norms(batch.model):
        k = coupling_kernel(update_scores(batch, update))
        with torch.no_grad():
            base = logp_of(params)
        errs = []
        for lr in (lr0, lr0 / 10):
            actual = sgd_step(logp_of, params, lr)(batch.coef) - base
            errs.append(float(torch.linalg.norm(actual - first_order_delta(k, batch.coef, lr).total)))
    assert errs[1] > 0
    ratio = errs[0] / errs[1]
    assert 30.0 < ratio < 300.0, f"error ratio {ratio} per 10× smaller lr is not ~100 (second order)"


def _hand_step_logp(b: LMBatch, update: str, coef: torch.Tensor, lr: float) -> torch.Tensor:
    """log π of the batch after one SGD ascent step on Σ c_k log π(y_k), written out on a copy."""
    if update == "head_untied":
        w = b.model.get_output_embeddings().weight.detach().clone().requires_grad_(True)

        def logp(weight):
            return torch.log_softmax(b.hidden @ weight.T / b.temperature, -1).gather(-1, b.tokens[:, None])[
                :, 0
            ]

        (g,) = torch.autograd.grad((coef * logp(w)).sum(), [w])
        with torch.no_grad():
            return logp(w + lr * g)
    model = copy.deepcopy(b.model)
    trained = (
        list(model.parameters()) if update == "full" else [dict(model.named_parameters())[EMBED_NAME]]
    )  # the tied matrix serves both uses in the copy too
    with float64_norms(model):
        objective = (coef * _plain_logp(model, b)).sum()
        grads = torch.autograd.grad(objective, trained, allow_unused=True)
        with torch.no_grad():
            for p, g in zip(trained, grads, strict=True):
                if g is not None:
                    p.add_(lr * g)
            return _plain_logp(model, b)


@pytest.mark.parametrize("update", LM_UPDATES)
def test_masking_effect_is_a_hand_written_masked_step(batch, measured, update):
    m = measured
    s = "low_confidence"  # low_conf = 1: every other token with c ≠ 0
    cands = torch.nonzero(m.exact & m.computed[s] & m.nonempty[s]).flatten()
    assert cands.numel()
    j = int(cands[0])
    full = _hand_step_logp(batch, update, batch.coef, m.lr)
    masked = _hand_step_logp(batch, update, batch.coef.masked_fill(m.masks[s][j], 0.0), m.lr)
    me = float(full[j] - masked[j])
    assert me != 0.0
    # ME is a difference of two log-probs: compared at FLOAT64_RTOL of their magnitude (float64, norms too)
    gross = float(full.abs().max())
    assert close(float(m.me[update][s][j]), me, gross=gross)
    # the actual Δ log π of the unmasked step, too (a zero step is the starting point)
    base = _hand_step_logp(batch, update, torch.zeros_like(batch.coef), m.lr)
    torch.testing.assert_close(m.delta[update], full - base, rtol=0, atol=FLOAT64_RTOL * gross)


def test_exact_and_first_order_masking_effects_agree(measured):
    """At a step where Δ log π is ≤ 1e-2, the exact ME is its first-order value to a few percent."""
    for u in LM_UPDATES:
        for s in MASK_SETS:
            sel = measured.exact & measured.computed[s] & measured.nonempty[s]
            me, fo = measured.me[u][s][sel], measured.me_first[u][s][sel]
            if me.numel():
                assert float(torch.linalg.norm(me - fo)) <= 0.1 * float(torch.linalg.norm(fo)) + 1e-15


# ------------------------------------------------------------------------------------------------
# the masks and the summaries


def test_mask_sets_follow_mask_sets_over_the_active_tokens(batch):
    b = dataclasses.replace(batch, coef=batch.coef.clone())
    b.coef[::3] = 0.0  # as a group whose rewards are all equal
    active = b.coef != 0
    masks = lm_mask_sets(b, low_conf=0.6, active_only=True, mask_seed=1)
    n = b.n_tokens
    eye = torch.eye(n, dtype=torch.bool)
    for s in MASK_SETS:
        assert not bool((masks[s] & eye).any())
        assert not bool((masks[s] & ~active[None, :]).any())
    assert torch.equal(masks["both"], masks["same_token"] & masks["low_confidence"])
    assert torch.equal(masks["random"].sum(1), masks["both"].sum(1))
    same = (b.tokens[:, None] == b.tokens[None, :]) & active[None, :] & ~eye
    assert torch.equal(masks["same_token"], same)
    # active_only=False: row j is mask_sets(candidate=j), the generator drawn in token order
    loose = lm_mask_sets(b, low_conf=0.6, active_only=False, mask_seed=1)
    gen = torch.Generator().manual_seed(20_000 + 1)
    for j in range(n):
        ref = mask_sets(b.tokens, b.probs_taken, j, low_conf=0.6, advantages=b.adv_tok, generator=gen)
        for s in MASK_SETS:
            assert torch.equal(loose[s][j], ref[s])


def test_summaries_count_what_they_say(measured):
    m = measured
    rows = summarise_lm(m, update="full")
    for s in MASK_SETS:
        keep = m.exact & m.computed[s]
        me = m.me["full"][s][keep]
        assert rows[s]["n"] == int(keep.sum())
        assert rows[s]["boost_rate"] == pytest.approx(float((me > 0).double().mean()))
        assert rows[s]["mean_boost"] == pytest.approx(float(me.mean()))
        fo_all = m.me_first["full"][s][m.computed[s]]
        assert rows[s]["n_all"] == fo_all.numel()
        assert rows[s]["all_first_order_boost_rate"] == pytest.approx(float((fo_all > 0).double().mean()))
    pos = summarise_lm(m, update="full", candidates="positive", orient_by_sign=True)
    assert all(pos[s]["n"] <= rows[s]["n"] for s in MASK_SETS)
    summary = batch_summary(m)
    assert summary["kernel_distance"]["proxy_vs_head_untied"]["max_rel"] <= 1e-9
    assert summary["kernel_distance"]["proxy_vs_head_tied"]["max_rel"] > 1e-3
    for v in summary["sign_agreement"].values():
        assert 0.0 <= v <= 1.0
    assert summary["sign_agreement"]["proxy_first_vs_head_untied"] == 1.0
    for mass in summary["coupling_mass"].values():
        assert mass["same_token"] + mass["different_token"] == pytest.approx(1.0)
    assert summary["n_params"]["full"] == sum(p.numel() for p in m.batch.model.parameters())
    assert summary["n_params"]["head_tied"] == summary["n_params"]["head_untied"]


def test_lm_table1_result_and_report(tiny_path):
    res = lm_table1(tiny_path, seeds=[SEED], n_candidates=2, **BATCH)
    json.dumps(res)  # serialisable (NaN allowed)
    assert res["tied"] is True
    assert set(res["table"]) == set(LM_UPDATES)
    for u in LM_UPDATES:
        assert set(res["table"][u]) == set(MASK_SETS)
        for s in MASK_SETS:
            row, seed_row = res["table"][u][s], res["per_seed"][0]["sets"][u][s]
            assert row["n"] == seed_row["n"] <= 2
            if row["n"]:
                assert row["boost_rate"] == pytest.approx(seed_row["boost_rate"])
    assert res["n_tokens"] == res["per_seed"][0]["n_tokens"]
    text = markdown_lm_table1(res)
    assert "Table 1" in text and "tied" in text
    assert f"{100 * PAPER_BOOST_RATE['full']['both']:.1f}" in text
    assert text.count("| mask |") == len(LM_UPDATES)


# ------------------------------------------------------------------------------------------------
# bad input


def test_bad_input_errors(batch, measured, tmp_path):
    for lr in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="lr"):
            measure_lm(batch, lr=lr)
    with pytest.raises(TypeError, match="lr"):
        measure_lm(batch, lr="1e-4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown update"):
        measure_lm(batch, updates=("head",))
    with pytest.raises(TypeError, match="updates"):
        measure_lm(batch, updates="full")
    with pytest.raises(ValueError, match="empty"):
        measure_lm(batch, updates=())
    with pytest.raises(ValueError, match="n_candidates"):
        measure_lm(batch, n_candidates=0)
    with pytest.raises(ValueError, match="candidate_filter"):
        measure_lm(batch, candidate_filter="some")
    with pytest.raises(TypeError, match="LMBatch"):
        measure_lm(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not measured"):
        summarise_lm(measure_lm(batch, updates=("head_untied",), n_candidates=1), update="full")
    with pytest.raises(ValueError, match="unknown candidates"):
        summarise_lm(measured, candidates="both")
    with pytest.raises(ValueError, match="unknown ties"):
        summarise_lm(measured, ties="half")
    with pytest.raises(ValueError, match="unknown update"):
        batch.logp_fn("head")
    # conventions are checked before any model is loaded
    missing = tmp_path / "no_model"
    with pytest.raises(ValueError, match="unknown candidates"):
        lm_table1(missing, candidates="x")
    with pytest.raises(ValueError, match="seeds"):
        lm_table1(missing, seeds=[])
    with pytest.raises(ValueError, match="no model"):
        lm_table1(missing, seeds=[0])
