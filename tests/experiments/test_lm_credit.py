"""``instruments.lm_credit``: the filter probes and the Monte Carlo token values on a tiny template_decoy model.

Every assertion holds for any correct run whatever tokens the model samples: exact identities (the three
updates' coefficients), a hand-written SGD step against the library's, hand-made token tensors, a reward
built so that a forced token guarantees it, and greedy (deterministic) decoding for the padding check.
"""

from __future__ import annotations

import copy
import json
import math
import zlib
from types import SimpleNamespace

import pytest
import torch

from cancellation.coupling import counterfactual_value
from cancellation.diagnostics import prefix_event_keys
from experiments.lm_credit import COMMANDS_TEXT
from instruments.coupling_lm import load_policy, sample_lm_batch
from instruments.lm_credit import (
    FILTER_UPDATES,
    TOKEN_CLASSES,
    batch_tasks,
    displacement,
    distinct_states,
    filter_coefficients,
    gap_interval,
    generate_from_states,
    markdown_lm_credit,
    mc_token_values,
    repeated_deltas,
    run_lm_credit,
    select_tokens,
    shared_token_mask,
    state_of,
    state_probs,
    token_classes,
)
from scaledrun.backends import Sampling, stop_token_ids
from scaledrun.rewards import REWARDS, register_reward
from scaledrun.rollout import first_eos_mask
from scaledrun.scoring import position_ids_from_mask

from ..conftest import SEED
from ..exactness import FLOAT64_RTOL

# exactness: the library's steps against hand-written ones, the model in float64 (``load_policy``: its norms
# too), each Δ log π compared at FLOAT64_RTOL of the log-probs it is a difference of
pytestmark = [pytest.mark.sampling, pytest.mark.exactness]

#: A reward that varies within almost every group, so the advantages have both signs.
HASH_REWARD = "test_lm_credit_hash"
#: A reward paying 1 iff the completion contains ``MARKER["text"]`` (set by the test that uses it).
MARKER_REWARD = "test_lm_credit_marker"
MARKER: dict[str, str] = {"text": "\x00"}
MAX_NEW = 24

if HASH_REWARD not in REWARDS:

    @register_reward(HASH_REWARD)
    def _hash_reward(prompts, completions, answers):
        return [(zlib.crc32(c.encode()) % 101) / 100.0 for c in completions]


if MARKER_REWARD not in REWARDS:

    @register_reward(MARKER_REWARD)
    def _marker_reward(prompts, completions, answers):
        return [1.0 if MARKER["text"] in c else 0.0 for c in completions]


@pytest.fixture(scope="module")
def folder(decoy_model):
    return decoy_model


@pytest.fixture(scope="module")
def batch(folder):
    model, tokenizer = load_policy(folder)
    return sample_lm_batch(
        model, tokenizer, reward=HASH_REWARD, num_prompts=2, group_size=4, seed=SEED, max_new_tokens=MAX_NEW
    )


def test_filter_coefficients_hand_made():
    coef = torch.tensor([0.5, -0.25, 0.0, 0.0, 0.125, -1.0], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, 0.0, 0.0, -2.0, -2.0], dtype=torch.float64)
    c = filter_coefficients(SimpleNamespace(coef=coef, adv_tok=adv))
    assert set(c) == set(FILTER_UPDATES)
    assert torch.equal(c["grpo"], coef)
    assert torch.equal(c["positive_only"], torch.tensor([0.5, -0.25, 0, 0, 0, 0], dtype=torch.float64))
    assert torch.equal(c["negative_only"], torch.tensor([0, 0, 0, 0, 0.125, -1.0], dtype=torch.float64))


def test_filter_coefficients_on_the_batch(batch):
    c = filter_coefficients(batch)
    pos, neg = batch.adv_tok > 0, batch.adv_tok < 0
    assert bool(pos.any()) and bool(neg.any())  # the hash reward differs within each group
    assert torch.equal(c["grpo"], batch.coef)
    assert torch.equal(c["positive_only"][pos], batch.coef[pos])
    assert bool((c["positive_only"][~pos] == 0).all())
    assert torch.equal(c["negative_only"][neg], batch.coef[neg])
    assert bool((c["negative_only"][~neg] == 0).all())
    # a completion with Â = 0 carries no GRPO coefficient, so the two halves add up to GRPO exactly
    assert bool((batch.coef[batch.adv_tok == 0] == 0).all())
    assert torch.equal(c["positive_only"] + c["negative_only"], batch.coef)


def _hand_logp(model, batch):
    """(N,) log π of the batch's tokens by a plain forward pass of ``model``."""
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=position_ids_from_mask(batch.attention_mask),
        use_cache=False,
    )
    t = batch.completion_mask.shape[1]
    logits = out.logits[:, -t - 1 : -1, :] / batch.temperature
    logp = torch.log_softmax(logits, -1).gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)
    return logp[batch.completion_mask.bool()]


@pytest.mark.parametrize("update", ["grpo", "positive_only"])
def test_displacement_is_a_plain_sgd_step(batch, update):
    lr = 1e-3
    coef = filter_coefficients(batch)[update]
    got = displacement(batch, coef, lr)
    model = copy.deepcopy(batch.model)
    model.zero_grad(set_to_none=True)
    before = _hand_logp(model, batch)
    (coef * before).sum().backward()
    with torch.no_grad():
        for p in model.parameters():  # the tied embedding once, with the gradient of both uses
            if p.grad is not None:
                p += lr * p.grad
        after = _hand_logp(model, batch)
    want = after - before.detach()
    assert got.shape == (batch.n_tokens,)
    assert float(want.abs().max()) > 0
    tol = FLOAT64_RTOL * float(before.abs().max())  # Δ = after − before: rounding at the log-probs' scale
    torch.testing.assert_close(got, want, rtol=0, atol=tol)
    # the batch's own model is untouched
    torch.testing.assert_close(_hand_logp(batch.model, batch).detach(), batch.logp, rtol=0, atol=tol)


def test_repeated_deltas_first_step_is_the_displacement(batch):
    deltas = repeated_deltas(batch, lr=1e-3, n_steps=2, repeat="fixed")
    tol = FLOAT64_RTOL * float(batch.logp.abs().max())  # Δ log π at the log-probs' scale
    torch.testing.assert_close(deltas[0], displacement(batch, batch.coef, 1e-3), rtol=0, atol=tol)
    # fixed coefficients: two steps are the second step from the first step's parameters, so they differ
    assert float((deltas[1] - deltas[0]).abs().max()) > 0


def test_shared_token_mask_hand_made():
    tokens = torch.tensor(
        [
            [1, 2, 3, 4],
            [1, 2, 5, 6],
            [1, 2, 3, 0],
            [1, 9, 3, 7],
            [4, 4, 4, 4],
            [4, 4, 8, 8],
            [7, 7, 0, 0],
        ]
    )
    mask = torch.tensor(
        [
            [1, 1, 1, 1],
            [1, 1, 1, 1],
            [1, 1, 1, 0],
            [1, 1, 1, 1],
            [1, 1, 1, 1],
            [0, 0, 0, 0],
            [1, 1, 0, 0],
        ]
    )
    group = torch.tensor([0, 0, 5, 5, 2, 2, 3])
    want = torch.tensor(
        [
            [1, 1, 0, 0],  # group 0: the common prefix "1 2"
            [1, 1, 0, 0],
            [1, 0, 0, 0],  # group 5: only the first token (position 2's "3" follows other prefixes)
            [1, 0, 0, 0],
            [1, 1, 1, 1],  # group 2: its other row has no token, so the one completion shares everything
            [0, 0, 0, 0],
            [1, 1, 0, 0],  # group 3: one completion
        ],
        dtype=torch.bool,
    )
    assert torch.equal(shared_token_mask(tokens, mask, group), want)


def test_token_classes_partition(batch):
    cl = token_classes(batch)
    assert set(cl) == set(TOKEN_CLASSES)
    n = batch.n_tokens
    assert torch.equal(cl["shared"] ^ cl["specific"], torch.ones(n, dtype=torch.bool))
    assert torch.equal(cl["template"] ^ cl["number"], torch.ones(n, dtype=torch.bool))
    assert int(cl["high_entropy"].sum()) == math.ceil(0.2 * n)
    assert float(batch.entropy[cl["high_entropy"]].min()) >= float(batch.entropy[cl["low_entropy"]].max())
    # the first completion token is the same event in every completion of a group only if all agree on it
    first = batch.pos == 0
    for j in torch.nonzero(first).flatten().tolist():
        same = batch.tokens[first & (batch.group[batch.row] == batch.group[batch.row[j]])]
        assert bool(cl["shared"][j]) == bool((same == batch.tokens[j]).all())


def test_select_tokens_is_balanced():
    delta = torch.tensor([0.1, -0.2, 0.3, -0.4, 0.5, 0.0, -0.1, 0.2, -0.3], dtype=torch.float64)
    probs = torch.tensor([0.5, 0.5, 0.99, 0.4, 0.3, 0.2, 0.9, 0.1, 0.5], dtype=torch.float64)
    idx = select_tokens(delta, probs, 10, max_prob=0.95, seed=3)
    assert torch.equal(idx, torch.sort(idx).values)
    assert (
        int((delta[idx] > 0).sum()) == int((delta[idx] < 0).sum()) == 3
    )  # 3 boosted, 4 suppressed in the pool
    assert bool((probs[idx] <= 0.95).all())
    assert int(select_tokens(delta, probs, 2, max_prob=0.95, seed=3).numel()) == 2


def test_gap_interval_hand_made():
    values = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, math.nan], dtype=torch.float64)
    delta = torch.tensor([0.1, 0.2, 0.3, -0.1, -0.2, 0.5], dtype=torch.float64)
    g = gap_interval(values, delta)
    assert g["gap"] == 1.0 and g["lo"] == 1.0 and g["hi"] == 1.0 and g["se"] == 0.0
    assert (g["n_boosted"], g["n_suppressed"]) == (3, 2)


def test_states_and_their_probability(batch):
    idx = torch.arange(0, batch.n_tokens, max(1, batch.n_tokens // 7))
    for j in idx.tolist():
        prompt, prefix = state_of(batch, j)
        assert int(prefix.numel()) == int(batch.pos[j])
        r = int(batch.row[j])
        real = batch.input_ids[r][batch.attention_mask[r].bool()]
        assert torch.equal(
            torch.cat([prompt, prefix, batch.tokens[j : j + 1]]), real[: prompt.numel() + prefix.numel() + 1]
        )
    torch.testing.assert_close(state_probs(batch, idx), batch.probs_taken[idx], rtol=0, atol=1e-9)


def test_batched_left_padded_generation_matches_one_at_a_time(batch):
    model, tokenizer = batch.model, batch.tokenizer
    stop = stop_token_ids(model, tokenizer)
    sampling = Sampling(
        max_new_tokens=10, do_sample=False, stop_ids=tuple(stop), pad_id=tokenizer.pad_token_id
    )
    # states of different lengths: different rows, different positions
    js = [0, int(batch.n_tokens // 2), batch.n_tokens - 1]
    states = [torch.cat(state_of(batch, j)) for j in js]
    assert len({int(s.numel()) for s in states}) > 1
    together = generate_from_states(model, states, k=1, sampling=sampling)
    for i, s in enumerate(states):
        alone = generate_from_states(model, [s], k=1, sampling=sampling)
        m1, _ = first_eos_mask(together[i : i + 1], stop)
        m2, _ = first_eos_mask(alone, stop)
        a = together[i][m1[0].bool()]
        b = alone[0][m2[0].bool()]
        assert torch.equal(a, b), (a, b)


def test_mc_values_with_a_reward_the_token_guarantees(batch):
    tok = batch.tokenizer
    texts = [tok.decode([t]) for t in batch.tokens.tolist()]
    special = set(tok.all_special_ids)
    # a token whose text is a plain word (letters only, no spacing that decoding could clean up)
    cands = [
        j
        for j, s in enumerate(texts)
        if int(batch.tokens[j]) not in special and s.strip().isalpha() and s == s.strip()
    ] or [j for j, s in enumerate(texts) if int(batch.tokens[j]) not in special and s.strip().isalnum()]
    assert cands
    j = cands[len(cands) // 2]
    MARKER["text"] = texts[j]
    k = 16
    prompts, answers = batch_tasks(tok, num_prompts=2, seed=SEED)
    idx = torch.tensor([j, 0])
    mc = mc_token_values(
        batch,
        idx,
        prompts,
        answers,
        reward=MARKER_REWARD,
        k=k,
        seed=1,
        max_new_tokens=MAX_NEW,
        return_completions=True,
    )
    assert mc["mean_forced"][0] == 1.0  # every forced completion contains the token's text
    assert mc["se_forced"][0] == 0.0
    stop = stop_token_ids(batch.model, tok)
    for i, jj in enumerate(idx.tolist()):
        p = int(batch.pos[jj])
        prefix = batch.completion_ids[int(batch.row[jj]), :p]
        for name in ("completions_state", "completions_forced"):
            ids = mc[name][i]
            assert ids.shape == (k, MAX_NEW)
            assert torch.equal(ids[:, :p], prefix.expand(k, -1))  # continuations start with the state
        assert bool((mc["completions_forced"][i][:, p] == batch.tokens[jj]).all())
        # R̄(s): the fraction of the state's completions, decoded here, that contain the marker
        ids = mc["completions_state"][i]
        mask, _ = first_eos_mask(ids, stop)
        hits = [
            MARKER["text"] in tok.decode(row[m.bool()], skip_special_tokens=True)
            for row, m in zip(ids, mask, strict=True)
        ]
        assert mc["mean_state"][i] == sum(hits) / k
    want = counterfactual_value(mc["mean_forced"], mc["mean_state"], batch.probs_taken[idx])
    torch.testing.assert_close(mc["value"], want, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(mc["pi"], batch.probs_taken[idx])


def test_distinct_states_keeps_one_token_per_state_event(batch):
    d = distinct_states(batch)
    keys = prefix_event_keys(batch.completion_ids, batch.completion_mask, batch.group)[
        batch.completion_mask.bool()
    ]
    # by a plain loop: a token is kept iff no earlier token has its key
    seen, want = set(), []
    for k in keys.tolist():
        want.append(k not in seen)
        seen.add(k)
    assert d.tolist() == want
    # the sampler never takes two tokens of one event
    delta = torch.linspace(-1, 1, d.numel(), dtype=torch.float64)
    idx = select_tokens(delta, torch.full_like(delta, 0.5), d.numel(), distinct=d)
    assert len(set(keys[idx].tolist())) == idx.numel() and bool(d[idx].all())


def test_run_lm_credit_quick(folder):
    res = run_lm_credit(
        folder, quick=True, reward=HASH_REWARD, max_new_tokens=MAX_NEW, n_tokens=6, k=4, budget_k=4,
        budget_n_tokens=4, budget_group_sizes=(4,), budget_num_prompts=(1,), n_steps=2,
    )  # fmt: skip
    json.dumps(res, allow_nan=False)  # strict JSON
    assert set(res["filter"]["updates"]) == set(FILTER_UPDATES)
    for u in FILTER_UPDATES:
        cl = res["filter"]["updates"][u]["classes"]
        assert cl["all"]["n"] == res["batch"]["n_tokens"]
        assert cl["shared"]["n"] + cl["specific"]["n"] == cl["all"]["n"]
    assert len(res["fig5b"]) == 10 and len(res["fig11"]) == 2
    assert [r["axis"] for r in res["fig6"]] == ["group_size", "num_prompts"]
    assert res["values"]["n_sampled"] % 2 == 0 and res["values"]["n_sampled"] <= 6
    assert res["values"]["pi_check_max_abs"] < 1e-9
    # the no-coupling control by a plain loop over the saved tokens: positive-rollout minus negative-rollout
    toks = [t for t in res["values"]["tokens"] if t["value"] is not None]
    pos = [t["value"] for t in toks if t["adv"] > 0]
    neg = [t["value"] for t in toks if t["adv"] < 0]
    control = res["fig5a"]["all, self-only control"]
    if pos and neg:
        assert control["gap"] == pytest.approx(sum(pos) / len(pos) - sum(neg) / len(neg), abs=1e-12)
    assert (control["n_boosted"], control["n_suppressed"]) == (len(pos), len(neg))
    md = markdown_lm_credit(res, COMMANDS_TEXT)
    assert md.endswith("\n\n" + COMMANDS_TEXT) and markdown_lm_credit(res) == md[: -len(COMMANDS_TEXT) - 2]
    for head in (
        "§4a",
        "§4b",
        "Fig. 5(a)",
        "Fig. 5(b)",
        "Fig. 11",
        "Fig. 6",
        "python -m experiments.lm_credit",
    ):
        assert head in md
