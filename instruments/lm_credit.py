"""Cancellation as hidden credit assignment on the tiny LM: the filter probes and the Monte Carlo token values.

The paper: "The Cancellation Hypothesis in Critic-Free RL" (arXiv 2605.08666), Sec. 3.1–3.2, App. E.1–E.2.
Everything runs on one checkpoint (a saved model folder, which the caller chooses) and one fixed on-policy batch
(``instruments.coupling_lm.sample_lm_batch``); every update is one plain SGD ascent step on
J = Σ_k c_k log π(y_k) over all parameters (``cancellation.coupling.sgd_step`` over ``batch.logp_fn("full")``),
float64, and a token is *boosted* when its Δ log π > 0, *suppressed* when < 0.

§4a, cancellation as a filter (App. E.1). Three updates from the same checkpoint on the same batch: GRPO
(the batch's coefficients), positive-only (the coefficients zeroed on every completion with Â ≤ 0) and
negative-only (zeroed on Â ≥ 0); GRPO = positive-only + negative-only exactly (a completion with Â = 0 has
coefficient 0). The displacement Δ log π is measured on the whole batch, every token, not only those in the
update's loss. Token classes, defined mechanically:

- shared / specific: the token's (exact completion prefix, token) event (``cancellation.diagnostics.
  prefix_event_keys``) occurs in every completion of its group, or not;
- template / number: the token's string has no digit, or has one;
- high / low entropy: among the top ``HIGH_ENTROPY_FRAC`` of the batch's tokens by the entropy of their
  next-token distribution, or not.

Per update and class: the boosted fraction, the mean Δ, and the class's share of the update's boosted mass
Σ max(Δ, 0); and the most boosted tokens.

§4b, the counterfactual token value (App. E.2, eq. 20). For a sample of the batch's tokens (equal numbers
of boosted and suppressed after one GRPO step, as the paper samples them), with state s = prompt +
completion prefix before token a: K continuations from s (mean reward R̄(s)) and K from s + a (R̄(s, a)),
sampled independently, all tokens and both branches in one batched, left-padded ``HFBackend.generate``
call (token ids, never re-tokenised text) with the batch's temperature, top-p 1 and stop tokens; each full
completion (prefix [+ a] + continuation, cut at the batch's ``max_new_tokens`` and its first stop token)
is decoded as the trainer decodes and rewarded by ``scaledrun.rewards.compute_rewards``; the value is
``cancellation.coupling.counterfactual_value(R̄(s, a), R̄(s), π(a|s))`` with π the token's probability in
the batch, its SE √(SE(R̄(s, a))² + SE(R̄(s))²) / (1 − π). Then:

- Fig. 5(a): the value gap (``cancellation.coupling.value_gap``: mean value of boosted − suppressed), over
  the sampled tokens and over those of positive / negative rollouts;
- Fig. 5(b): the gap on the top-k% by entropy of the sampled tokens, k = 10 … 100;
- Fig. 11: the gap after 1 … n repeated GRPO steps on the same fixed batch, boosted / suppressed by the sign
  of the cumulative Δ log π, the values those of the checkpoint (estimated once);
- Fig. 6: the one-step gap vs the sampling budget (group size, number of prompts), a fresh batch and fresh
  value estimates per budget.

Each gap comes with a 95% bootstrap interval (tokens resampled within the boosted and within the
suppressed set; the Monte Carlo noise of each value is inside the token-to-token spread) and its SE.

One choice of ours the paper does not state: the token sample is drawn from the tokens with
π(a|s) ≤ ``max_prob`` (default 0.95). Eq. 20 divides the Monte Carlo difference by 1 − π: with K = 64 per
branch the SE of a value is up to 0.09 / (1 − π), above 1.8 (the whole range of a 0/1 value is [−1, 1])
for π > 0.95, and most tokens of this model have π > 0.99. ``max_prob=1.0`` samples from every token.

Usage::

    result = run_lm_credit(Path("path/to/model"), quick=False)   # quick=True: a small smoke run
    print(markdown_lm_credit(result))
"""

from __future__ import annotations

import itertools
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from cancellation.coupling import counterfactual_value, repeated_sgd, sgd_step, value_gap
from cancellation.diagnostics import prefix_event_keys
from cancellation.update import coefficients, event_index
from instruments.coupling_lm import LMBatch, load_policy, sample_lm_batch

#: The three updates of §4a.
FILTER_UPDATES = ("grpo", "positive_only", "negative_only")
#: The token classes of §4a, in table order.
TOKEN_CLASSES = (
    "all",
    "shared",
    "specific",
    "template",
    "number",
    "high_entropy",
    "low_entropy",
    "template_high",
    "number_high",
)
#: The fraction of a batch's tokens (by entropy) that is "high entropy".
HIGH_ENTROPY_FRAC = 0.2
#: The SGD step size. The tiny model is sharp: at 1e-3 the full-parameter step moves the median token by
#: ~1e-5 and the largest by ~0.25 nats, and doubling it doubles Δ to within ~9% (first-order regime); at
#: 1e-2 single tokens move by several nats.
DEFAULT_LR = 1e-3
#: The entropy fractions of Fig. 5(b).
TOP_FRACS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
#: Fig. 6's "top" subset: the top 25% by entropy (our reading of the paper's top-25% subset).
BUDGET_TOP_FRAC = 0.25
#: Fig. 11's repeated-update modes: "recompute" (coefficients recomputed at the current policy with the
#: batch's advantages and old log-probs, GRPO's clipping included, as PPO-style epochs do) or "fixed"
#: (the first step's coefficients every step).
REPEAT_MODES = ("recompute", "fixed")

_DIGIT = re.compile(r"\d")


# ------------------------------------------------------------------------------------------------
# the batch's prompts and answers


def batch_tasks(
    tokenizer: Any,
    *,
    task: str = "template_decoy",
    split: str = "train",
    num_prompts: int = 2,
    seed: int = 0,
    digits: int = 2,
    ops: str = "+",
) -> tuple[list[str], list[str]]:
    """The chat-formatted prompts and gold answers of ``sample_lm_batch``'s groups (group id g ↔ entry g).

    ``sample_lm_batch`` draws ``synthetic_tasks(task, split, num_prompts, seed=seed, digits, ops)`` and gives
    the i-th problem group id i; this recomputes the same list (call it with the same arguments).
    """
    from scaledrun.tasks import format_prompt, synthetic_tasks

    chosen = synthetic_tasks(task, split, num_prompts, seed=int(seed), digits=digits, ops=ops)
    return [format_prompt(tokenizer, t.prompt) for t in chosen], [t.answer for t in chosen]


# ------------------------------------------------------------------------------------------------
# §4a: the three updates and the token classes


def filter_coefficients(batch: LMBatch) -> dict[str, Tensor]:
    """The (N,) coefficients of the three updates: GRPO (the batch's), positive-only, negative-only.

    Positive-only keeps c_j on the tokens of completions with Â > 0 and is 0 elsewhere; negative-only keeps
    it where Â < 0. A completion with Â = 0 has c = 0 under GRPO, so positive + negative = GRPO.
    """
    c = batch.coef
    zero = torch.zeros_like(c)
    return {
        "grpo": c.clone(),
        "positive_only": torch.where(batch.adv_tok > 0, c, zero),
        "negative_only": torch.where(batch.adv_tok < 0, c, zero),
    }


def base_logp(batch: LMBatch, update: str = "full") -> Tensor:
    """(N,) log π of the batch's tokens through ``batch.logp_fn(update)`` at the checkpoint (no step)."""
    logp_of, params = batch.logp_fn(update)
    with torch.no_grad():
        return logp_of([p.detach() for p in params]).detach()


def displacement(batch: LMBatch, coef: Tensor, lr: float, *, update: str = "full") -> Tensor:
    """(N,) Δ log π of every token of the batch after one SGD ascent step with ``coef`` (``sgd_step``)."""
    logp_of, params = batch.logp_fn(update)
    return sgd_step(logp_of, params, lr)(coef) - base_logp(batch, update)


def _bt(batch: LMBatch, flat: Tensor, fill: float | int = 0) -> Tensor:
    """A flat (N,) tensor scattered back to the batch's (B, T) completion grid (``fill`` elsewhere)."""
    out = torch.full(batch.completion_mask.shape, fill, dtype=flat.dtype)
    out[batch.row, batch.pos] = flat
    return out


def shared_token_mask(tokens: Tensor, mask: Tensor, group: Tensor) -> Tensor:
    """(B, T) bool: the token's (exact prefix, token) event occurs in every completion of its group.

    Events are ``prefix_event_keys`` (same group, same position, identical completion tokens before it,
    same token); a group's completions are its rows with at least one token in ``mask``. False on padding.
    """
    keys = prefix_event_keys(tokens, mask, group)
    index = event_index(keys, mask)
    in_loss = mask.sum(1) > 0
    _, ginv = torch.unique(group, return_inverse=True)
    size = torch.zeros(int(ginv.max()) + 1, dtype=torch.long).index_add_(0, ginv, in_loss.long())
    count = torch.cat([index.count, torch.zeros(1, dtype=torch.long)])  # inverse == E on padding
    occ = count[index.inverse]
    return mask.bool() & (occ == size[ginv][:, None])


def token_classes(batch: LMBatch, high_frac: float = HIGH_ENTROPY_FRAC) -> dict[str, Tensor]:
    """(N,) bool masks of ``TOKEN_CLASSES`` over the batch's flattened tokens (module docstring)."""
    n = batch.n_tokens
    shared = shared_token_mask(batch.completion_ids, batch.completion_mask, batch.group)[batch.row, batch.pos]
    number = torch.tensor([bool(_DIGIT.search(t)) for t in token_strings(batch)], dtype=torch.bool)
    k = math.ceil(float(high_frac) * n)
    order = torch.sort(-batch.entropy.detach(), stable=True).indices[:k]
    high = torch.zeros(n, dtype=torch.bool)
    high[order] = True
    return {
        "all": torch.ones(n, dtype=torch.bool),
        "shared": shared,
        "specific": ~shared,
        "template": ~number,
        "number": number,
        "high_entropy": high,
        "low_entropy": ~high,
        "template_high": ~number & high,
        "number_high": number & high,
    }


def token_strings(batch: LMBatch) -> list[str]:
    """The N tokens as text (each token decoded alone, special tokens kept)."""
    return [batch.tokenizer.decode([t]) for t in batch.tokens.tolist()]


def class_stats(
    delta: Tensor, classes: dict[str, Tensor], probs: Tensor | None = None
) -> dict[str, dict[str, Any]]:
    """Per class: n, boosted fraction, suppressed fraction, mean Δ, share of the boosted mass Σ max(Δ, 0),
    and (given ``probs``, the tokens' π) the class's median π."""
    mass = delta.clamp(min=0)
    total = float(mass.sum())
    out = {}
    for name, m in classes.items():
        n = int(m.sum())
        out[name] = {
            "n": n,
            "frac_boosted": float((delta[m] > 0).double().mean()) if n else math.nan,
            "frac_suppressed": float((delta[m] < 0).double().mean()) if n else math.nan,
            "mean_delta": float(delta[m].mean()) if n else math.nan,
            "boost_mass_share": float(mass[m].sum()) / total if total > 0 else math.nan,
            "median_prob": float(probs[m].median()) if probs is not None and n else math.nan,
        }
    return out


def top_boosted(
    batch: LMBatch,
    delta: Tensor,
    classes: dict[str, Tensor],
    k: int = 10,
    *,
    strings: list[str] | None = None,
) -> list[dict[str, Any]]:
    """The ``k`` tokens with the largest Δ: text, Δ, completion row, position, Â, π and classes."""
    strings = strings if strings is not None else token_strings(batch)
    idx = torch.sort(-delta, stable=True).indices[:k].tolist()
    return [
        {
            "token": strings[j],
            "delta": float(delta[j]),
            "row": int(batch.row[j]),
            "pos": int(batch.pos[j]),
            "adv": float(batch.adv_tok[j]),
            "prob": float(batch.probs_taken[j]),
            "shared": bool(classes["shared"][j]),
            "number": bool(classes["number"][j]),
            "high_entropy": bool(classes["high_entropy"][j]),
        }
        for j in idx
    ]


def filter_probe(batch: LMBatch, *, lr: float = DEFAULT_LR, top_k: int = 10) -> dict[str, Any]:
    """§4a: the three updates' displacement on the whole batch, by token class, and the top boosted tokens.

    Returns ``{"lr", "classes_n": {class: n}, "updates": {update: {"n_in_loss", "norm_coef",
    "classes": class_stats, "top": top_boosted}}, "delta": {update: (N,) list}}``.
    """
    classes = token_classes(batch)
    strings = token_strings(batch)
    logp_of, params = batch.logp_fn("full")
    step = sgd_step(logp_of, params, lr)
    base = base_logp(batch)
    updates: dict[str, Any] = {}
    deltas: dict[str, list[float]] = {}
    for name, coef in filter_coefficients(batch).items():
        delta = step(coef) - base
        updates[name] = {
            "n_in_loss": int((coef != 0).sum()),
            "coef_abs_sum": float(coef.abs().sum()),
            "classes": class_stats(delta, classes, batch.probs_taken.detach()),
            "top": top_boosted(batch, delta, classes, top_k, strings=strings),
        }
        deltas[name] = delta.tolist()
    return {
        "lr": float(lr),
        "classes_n": {k: int(v.sum()) for k, v in classes.items()},
        "updates": updates,
        "delta": deltas,
    }


# ------------------------------------------------------------------------------------------------
# §4b: Monte Carlo counterfactual values


def _stop_and_pad(model: Any, tokenizer: Any) -> tuple[list[int], int]:
    from scaledrun.backends import stop_token_ids

    stop = stop_token_ids(model, tokenizer)
    return stop, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop[0]


def left_pad(states: Sequence[Tensor], pad_id: int) -> tuple[Tensor, Tensor]:
    """1-D token-id states → (S, L) left-padded ids and their attention mask."""
    width = max(int(s.numel()) for s in states)
    ids = torch.full((len(states), width), pad_id, dtype=torch.long)
    am = torch.zeros((len(states), width), dtype=torch.long)
    for i, s in enumerate(states):
        n = int(s.numel())
        if n:
            ids[i, width - n :] = s
            am[i, width - n :] = 1
    return ids, am


def generate_from_states(
    model: Any,
    states: Sequence[Tensor],
    *,
    k: int,
    sampling: Any,
    chunk_rows: int | None = 1024,
) -> Tensor:
    """(S·K, T) continuations of each 1-D id state, state-major (K rows per state), one batched call.

    The states are left-padded (``left_pad``) and handed to ``scaledrun.backends.HFBackend.generate`` with
    ``sampling`` (a ``scaledrun.backends.Sampling``), ``chunk_rows`` rows per ``generate`` call.
    """
    from scaledrun.backends import HFBackend

    ids, am = left_pad(states, sampling.pad_id)
    return HFBackend(model, batch_size=chunk_rows).generate(ids, am, num_generations=k, sampling=sampling)


def state_of(batch: LMBatch, j: int) -> tuple[Tensor, Tensor]:
    """Token j's state s as (the real prompt ids, the completion prefix before j), unpadded 1-D ids."""
    r, p = int(batch.row[j]), int(batch.pos[j])
    plen = batch.input_ids.shape[1] - batch.completion_mask.shape[1]
    prompt = batch.input_ids[r, :plen][batch.attention_mask[r, :plen].bool()]
    return prompt, batch.completion_ids[r, :p]


def state_probs(batch: LMBatch, idx: Tensor) -> Tensor:
    """(n,) π(a|s) recomputed from the left-padded states of tokens ``idx`` alone (a check of the states)."""
    from scaledrun.scoring import position_ids_from_mask

    _, pad = _stop_and_pad(batch.model, batch.tokenizer)
    states = [torch.cat(state_of(batch, j)) for j in idx.tolist()]
    ids, am = left_pad(states, pad)
    with torch.no_grad():
        out = batch.model(
            input_ids=ids, attention_mask=am, position_ids=position_ids_from_mask(am), use_cache=False
        )
    logits = out.logits[:, -1, :] / batch.temperature
    return torch.softmax(logits.double(), -1).gather(-1, batch.tokens[idx].unsqueeze(-1)).squeeze(-1)


def mc_token_values(
    batch: LMBatch,
    idx: Tensor,
    prompts: Sequence[str],
    answers: Sequence[str],
    *,
    reward: str = "exact_match",
    k: int = 64,
    seed: int = 0,
    max_new_tokens: int = 40,
    chunk_rows: int | None = 1024,
    return_completions: bool = False,
) -> dict[str, Any]:
    """Eq. 20 by Monte Carlo for the batch's tokens ``idx``: R̄(s, a), R̄(s), their SEs, the value and its SE.

    For token j (row r, position p, token a): s = the prompt of row r + its completion tokens before p.
    ``k`` continuations from s and ``k`` from s + a, for all tokens and both branches in one batched call
    (``generate_from_states``; the torch RNG seeded with ``seed`` just before), sampled at the batch's
    temperature, top-p 1, with the trainer's stop tokens. The full completion of each continuation (prefix,
    [a,] continuation) is cut at ``max_new_tokens`` tokens (the batch's budget) and at its first stop token,
    decoded as ``scaledrun.rollout.score_completions`` decodes, and rewarded with
    ``compute_rewards(reward, prompts, completions, answers)`` (``prompts``/``answers``: one per group id,
    ``batch_tasks``). The value is ``counterfactual_value(R̄(s, a), R̄(s), π(a|s))`` with π the token's
    probability in the batch (NaN where 1 − π ≤ 1e-6).

    Returns a dict of (n,) float64 tensors ``mean_forced``, ``mean_state``, ``se_forced``, ``se_state``,
    ``pi``, ``value``, ``value_se``; with ``return_completions`` also ``completions_state`` and
    ``completions_forced`` ((n, k, max_new_tokens) ids, padding after the first stop token), ``texts_state``
    and ``texts_forced`` (n lists of k decoded completions) and ``rewards_state``/``rewards_forced`` (n, k).
    """
    from scaledrun.backends import Sampling
    from scaledrun.rewards import compute_rewards
    from scaledrun.rollout import first_eos_mask

    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ValueError(f"`k` must be an int ≥ 2 (an SE needs two draws), got {k!r}")
    idx = idx.long()
    n = int(idx.numel())
    if n == 0:
        empty = torch.empty(0, dtype=torch.float64)
        return {
            key: empty
            for key in ("mean_forced", "mean_state", "se_forced", "se_state", "pi", "value", "value_se")
        }
    model, tokenizer = batch.model, batch.tokenizer
    stop, pad = _stop_and_pad(model, tokenizer)
    prompts_ids, prefixes = zip(*(state_of(batch, j) for j in idx.tolist()), strict=True)
    forced = [
        torch.cat([pre, batch.tokens[j : j + 1]]) for pre, j in zip(prefixes, idx.tolist(), strict=True)
    ]
    comp_prefixes = list(prefixes) + forced  # the completion part of each of the 2n states
    states = [torch.cat([pr, c]) for pr, c in zip(list(prompts_ids) * 2, comp_prefixes, strict=True)]
    budget = max(1, max(max_new_tokens - int(c.numel()) for c in comp_prefixes))
    sampling = Sampling(
        max_new_tokens=budget,
        do_sample=True,
        temperature=batch.temperature,
        top_p=1.0,
        stop_ids=tuple(stop),
        pad_id=pad,
    )
    was_training = model.training
    model.eval()
    torch.manual_seed(int(seed))
    cont = generate_from_states(model, states, k=k, sampling=sampling, chunk_rows=chunk_rows)
    if was_training:
        model.train()
    full = torch.full((2 * n * k, max_new_tokens), pad, dtype=torch.long)
    for i, c in enumerate(comp_prefixes):
        rows = cont[i * k : (i + 1) * k]
        joined = torch.cat([c.expand(k, -1), rows], 1)[:, :max_new_tokens]
        full[i * k : (i + 1) * k, : joined.shape[1]] = joined
    mask, _ = first_eos_mask(full, stop)
    full = full.masked_fill(~mask.bool(), pad)
    texts = tokenizer.batch_decode(full, skip_special_tokens=True)
    groups = [int(batch.group[int(batch.row[j])]) for j in idx.tolist()] * 2
    row_prompts = [prompts[g] for g in groups for _ in range(k)]
    row_answers = [answers[g] for g in groups for _ in range(k)]
    rewards, _failures = compute_rewards(reward, row_prompts, texts, row_answers)
    rew = torch.tensor(rewards, dtype=torch.float64).view(2, n, k)
    means = rew.mean(-1)
    ses = rew.std(-1, unbiased=True) / math.sqrt(k)
    pi = batch.probs_taken[idx].detach().double()
    value = counterfactual_value(means[1], means[0], pi)
    value_se = torch.sqrt(ses[0] ** 2 + ses[1] ** 2) / (1.0 - pi)
    value_se = torch.where(torch.isnan(value), torch.full_like(value_se, math.nan), value_se)
    out: dict[str, Any] = {
        "mean_forced": means[1],
        "mean_state": means[0],
        "se_forced": ses[1],
        "se_state": ses[0],
        "pi": pi,
        "value": value,
        "value_se": value_se,
    }
    if return_completions:
        comp = full.view(2, n, k, max_new_tokens)
        out.update(
            completions_state=comp[0],
            completions_forced=comp[1],
            texts_state=[texts[i * k : (i + 1) * k] for i in range(n)],
            texts_forced=[texts[(n + i) * k : (n + i + 1) * k] for i in range(n)],
            rewards_state=rew[0],
            rewards_forced=rew[1],
        )
    return out


def distinct_states(batch: LMBatch) -> Tensor:
    """(N,) bool: the first token of each distinct (state, token) event of the batch.

    Two completions of one prompt that agree up to a position hold the same state there (the same prompt
    and completion prefix, ``prefix_event_keys``); their tokens at it are one (state, action) pair with one
    counterfactual value, so a sample of tokens takes each event once (duplicates would be counted as
    independent evidence).
    """
    keys = prefix_event_keys(batch.completion_ids, batch.completion_mask, batch.group)[
        batch.completion_mask.bool()
    ]
    _, inverse = torch.unique(keys, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), keys.numel(), dtype=torch.long)
    first = first.scatter_reduce(0, inverse, torch.arange(keys.numel()), reduce="amin")
    out = torch.zeros(keys.numel(), dtype=torch.bool)
    out[first] = True
    return out


def select_tokens(
    delta: Tensor,
    probs_taken: Tensor,
    n: int,
    *,
    max_prob: float = 0.95,
    seed: int = 0,
    distinct: Tensor | None = None,
) -> Tensor:
    """Sorted indices of up to ``n`` tokens: equally many boosted (Δ > 0) and suppressed (Δ < 0), at random.

    Drawn (``torch.Generator`` seeded with ``seed``) from the tokens with π ≤ ``max_prob`` and 1 − π > 1e-6
    (eq. 20's guard), and, when ``distinct`` (N,) bool is given (``distinct_states``), only where it is
    True (one token per (state, token) event); m = min(n // 2, boosted in that pool, suppressed in it) of each.
    """
    pool = (probs_taken <= max_prob) & (1.0 - probs_taken > 1e-6)
    if distinct is not None:
        pool = pool & distinct
    gen = torch.Generator().manual_seed(int(seed))
    b = torch.nonzero(pool & (delta > 0)).flatten()
    s = torch.nonzero(pool & (delta < 0)).flatten()
    m = min(n // 2, int(b.numel()), int(s.numel()))
    pick = torch.cat(
        [b[torch.randperm(b.numel(), generator=gen)[:m]], s[torch.randperm(s.numel(), generator=gen)[:m]]]
    )
    return torch.sort(pick).values


def gap_interval(
    values: Tensor,
    delta: Tensor,
    entropy: Tensor | None = None,
    top_frac: float = 1.0,
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """``value_gap`` with its SE (Welch) and a percentile bootstrap interval (tokens resampled per set).

    Returns ``{"gap", "lo", "hi", "se", "boosted", "suppressed", "n_boosted", "n_suppressed"}`` (NaN
    where a set is empty; lo/hi/se NaN below two tokens in a set).
    """
    g = value_gap(values, delta, entropy, top_frac)
    out: dict[str, Any] = {
        "gap": g.gap,
        "lo": math.nan,
        "hi": math.nan,
        "se": math.nan,
        "boosted": g.boosted,
        "suppressed": g.suppressed,
        "n_boosted": g.n_boosted,
        "n_suppressed": g.n_suppressed,
    }
    if g.n_boosted < 2 or g.n_suppressed < 2:
        return out
    keep = torch.ones_like(values, dtype=torch.bool)
    if top_frac < 1.0:
        kk = math.ceil(float(top_frac) * values.shape[0])
        keep = torch.zeros_like(keep)
        keep[torch.sort(-entropy.detach().double(), stable=True).indices[:kk]] = True  # type: ignore[union-attr]
    ok = keep & ~torch.isnan(values)
    vb = values[ok & (delta > 0)].double().numpy()
    vs = values[ok & (delta < 0)].double().numpy()
    rng = np.random.default_rng(seed)
    boot = rng.choice(vb, (n_boot, vb.size)).mean(1) - rng.choice(vs, (n_boot, vs.size)).mean(1)
    a = (1.0 - level) / 2.0
    out["lo"], out["hi"] = float(np.quantile(boot, a)), float(np.quantile(boot, 1.0 - a))
    out["se"] = float(math.sqrt(vb.var(ddof=1) / vb.size + vs.var(ddof=1) / vs.size))
    return out


def repeated_deltas(
    batch: LMBatch,
    *,
    lr: float = DEFAULT_LR,
    n_steps: int = 5,
    repeat: str = "recompute",
    objective: str = "grpo",
) -> list[Tensor]:
    """The cumulative (N,) Δ log π since the checkpoint after each of ``n_steps`` SGD steps on the batch.

    ``cancellation.coupling.repeated_sgd``; step 1 takes the batch's coefficients. Later steps: ``repeat="recompute"`` recomputes
    the coefficients at the current policy (``cancellation.update.coefficients(objective, logp, old logp,
    Â, mask, group)``, so GRPO's ratio clipping applies); ``"fixed"`` reuses the first step's.
    """
    if repeat not in REPEAT_MODES:
        raise ValueError(f"unknown repeat {repeat!r}; valid: {', '.join(REPEAT_MODES)}")
    logp_of, params = batch.logp_fn("full")
    base = base_logp(batch)
    old_bt = _bt(batch, base)

    def coef_at(n: int, logp: Tensor) -> Tensor:
        if n == 0 or repeat == "fixed":
            return batch.coef
        return coefficients(
            objective, _bt(batch, logp), old_bt, batch.advantages, batch.completion_mask, batch.group,
            with_metrics=False,
        ).coef[batch.row, batch.pos]  # fmt: skip

    return [logp - base for logp in repeated_sgd(logp_of, params, coef_at, lr, n_steps)]


def _value_block(
    model: Any,
    tokenizer: Any,
    *,
    task: str,
    reward: str,
    num_prompts: int,
    group_size: int,
    seed: int,
    max_new_tokens: int,
    temperature: float,
    lr: float,
    n_tokens: int,
    k: int,
    max_prob: float,
    chunk_rows: int | None,
) -> tuple[LMBatch, Tensor, Tensor, dict[str, Any], dict[str, Any]]:
    """Sample a batch, take one GRPO step, pick tokens, estimate their values: (batch, Δ, idx, mc, info)."""
    t0 = time.perf_counter()
    batch = sample_lm_batch(
        model,
        tokenizer,
        task=task,
        reward=reward,
        num_prompts=num_prompts,
        group_size=group_size,
        seed=seed,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
    )
    prompts, answers = batch_tasks(tokenizer, task=task, num_prompts=num_prompts, seed=seed)
    delta = displacement(batch, batch.coef, lr)
    idx = select_tokens(
        delta, batch.probs_taken, n_tokens, max_prob=max_prob, seed=seed, distinct=distinct_states(batch)
    )
    t1 = time.perf_counter()
    mc = mc_token_values(
        batch,
        idx,
        prompts,
        answers,
        reward=reward,
        k=k,
        seed=seed,
        max_new_tokens=max_new_tokens,
        chunk_rows=chunk_rows,
    )
    pool = (batch.probs_taken <= max_prob) & (1.0 - batch.probs_taken > 1e-6) & distinct_states(batch)
    info = {
        "n_batch_tokens": batch.n_tokens,
        "pool": int(pool.sum()),
        "pool_boosted": int((pool & (delta > 0)).sum()),
        "pool_suppressed": int((pool & (delta < 0)).sum()),
        "n_sampled": int(idx.numel()),
        "pass_rate": float(batch.rewards.mean()),
        "groups_mixed": int(
            sum(1 for g in batch.group.unique() if 0 < float(batch.rewards[batch.group == g].mean()) < 1)
        ),
        "seconds_batch": t1 - t0,
        "seconds_mc": time.perf_counter() - t1,
    }
    return batch, delta, idx, mc, info


def _nan_none(x: Any) -> Any:
    """NaN/inf floats → None, recursively (so the result is strict JSON)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _nan_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_nan_none(v) for v in x]
    return x


@dataclass(frozen=True)
class CreditSettings:
    """The settings of one ``run_lm_credit`` run (§4a, §4b, Fig. 6); ``None`` means the default of the mode.

    ``resolved()`` fills each ``None`` with its default for ``quick`` (the full run's in brackets in each
    field's line: quick / full).
    """

    quick: bool = False
    """A small smoke run: the ``None`` defaults below take their quick values."""
    task: str = "template_decoy"
    """The prompt task (``scaledrun.tasks``) of every batch."""
    reward: str = "exact_match"
    """The reward (``scaledrun.rewards``) of the batches and of the Monte Carlo continuations."""
    num_prompts: int = 2
    """Prompts (groups) in the §4a/§4b batch."""
    group_size: int = 8
    """Completions per prompt in the §4a/§4b batch."""
    seed: int = 0
    """The batch's, the token sample's and the continuations' seed."""
    max_new_tokens: int = 40
    """The completions' length cap (the batch's and the continuations')."""
    temperature: float = 1.0
    """The sampling temperature of the batch and the continuations."""
    lr: float = DEFAULT_LR
    """The step size of every plain SGD update."""
    n_tokens: int | None = None
    """Tokens sampled for the Monte Carlo values (quick 8 / full 48)."""
    k: int | None = None
    """Continuations per branch and token (quick 8 / full 64)."""
    max_prob: float = 0.95
    """Only tokens with π(a|s) ≤ ``max_prob`` are sampled (module docstring)."""
    n_steps: int | None = None
    """Repeated GRPO steps of Fig. 11 (quick 2 / full 5)."""
    repeat: str = "recompute"
    """Fig. 11's repeated steps: ``recompute`` the coefficients each step, or keep them ``fixed``."""
    top_fracs: Sequence[float] = TOP_FRACS
    """Fig. 5(b)'s top fractions of the sampled tokens by entropy."""
    budget_group_sizes: Sequence[int] | None = None
    """Fig. 6's group sizes at ``num_prompts`` (quick (4, 8) / full (4, 8, 16))."""
    budget_num_prompts: Sequence[int] | None = None
    """Fig. 6's prompt counts at ``group_size`` (quick (1, 2) / full (1, 2, 4))."""
    budget_seeds: Sequence[int] | None = None
    """Fig. 6's seeds per budget (quick (``seed``,) / full (``seed``, ``seed`` + 1))."""
    budget_n_tokens: int | None = None
    """Tokens sampled per Fig. 6 batch (quick 8 / full 32)."""
    budget_k: int | None = None
    """Continuations per branch and token in Fig. 6 (quick 8 / full 32)."""
    top_k: int = 10
    """The most boosted tokens listed per §4a update."""
    chunk_rows: int | None = 1024
    """Continuation rows per generate call (None: all at once)."""

    def resolved(self) -> CreditSettings:
        """These settings with every ``None`` (and every empty budget list) replaced by its mode's default."""
        quick, seed = self.quick, self.seed
        return replace(
            self,
            n_tokens=self.n_tokens if self.n_tokens is not None else (8 if quick else 48),
            k=self.k if self.k is not None else (8 if quick else 64),
            n_steps=self.n_steps if self.n_steps is not None else (2 if quick else 5),
            budget_group_sizes=tuple(self.budget_group_sizes or ((4, 8) if quick else (4, 8, 16))),
            budget_num_prompts=tuple(self.budget_num_prompts or ((1, 2) if quick else (1, 2, 4))),
            budget_seeds=tuple(self.budget_seeds or ((seed,) if quick else (seed, seed + 1))),
            budget_n_tokens=self.budget_n_tokens
            if self.budget_n_tokens is not None
            else (8 if quick else 32),
            budget_k=self.budget_k if self.budget_k is not None else (8 if quick else 32),
        )

    def record(self) -> dict[str, Any]:
        """The ``settings`` block of the result (of resolved settings)."""
        return {
            "task": self.task,
            "reward": self.reward,
            "num_prompts": self.num_prompts,
            "group_size": self.group_size,
            "seed": self.seed,
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "lr": self.lr,
            "n_tokens": self.n_tokens,
            "k": self.k,
            "max_prob": self.max_prob,
            "n_steps": self.n_steps,
            "repeat": self.repeat,
            "budget_seeds": list(self.budget_seeds or ()),
            "budget_n_tokens": self.budget_n_tokens,
            "budget_k": self.budget_k,
            "budget_top_frac": BUDGET_TOP_FRAC,
            "high_entropy_frac": HIGH_ENTROPY_FRAC,
            "quick": bool(self.quick),
        }


def _filter_stage(
    model: Any, tokenizer: Any, s: CreditSettings
) -> tuple[LMBatch, list[str], list[str], dict]:
    """§4a: sample the batch (checking that ``batch_tasks`` reproduces its prompts and answers) and run the
    filter probe on it. Returns (batch, prompts, answers, the probe's result)."""
    batch = sample_lm_batch(
        model,
        tokenizer,
        task=s.task,
        reward=s.reward,
        num_prompts=s.num_prompts,
        group_size=s.group_size,
        seed=s.seed,
        max_new_tokens=s.max_new_tokens,
        temperature=s.temperature,
    )
    prompts, answers = batch_tasks(tokenizer, task=s.task, num_prompts=s.num_prompts, seed=s.seed)
    from scaledrun.rewards import compute_rewards

    re_rewards, _ = compute_rewards(
        s.reward,
        [prompts[int(g)] for g in batch.group],
        batch.completions,
        [answers[int(g)] for g in batch.group],
    )
    if re_rewards != batch.rewards.tolist():
        raise RuntimeError("batch_tasks does not reproduce the batch's prompts/answers (rewards differ)")
    return batch, prompts, answers, filter_probe(batch, lr=s.lr, top_k=s.top_k)


def _value_stage(batch: LMBatch, prompts: list[str], answers: list[str], s: CreditSettings) -> dict[str, Any]:
    """§4b on the §4a batch: the repeated GRPO steps, the token sample, its Monte Carlo values, and the gaps
    of Fig. 5(a) (with the no-coupling control), Fig. 5(b) and Fig. 11. Returns the result's ``values``,
    ``fig5a``, ``fig5b`` and ``fig11`` blocks."""
    deltas = repeated_deltas(batch, lr=s.lr, n_steps=s.n_steps, repeat=s.repeat)
    delta1 = deltas[0]
    idx = select_tokens(
        delta1,
        batch.probs_taken,
        s.n_tokens,
        max_prob=s.max_prob,
        seed=s.seed,
        distinct=distinct_states(batch),
    )
    mc = mc_token_values(
        batch,
        idx,
        prompts,
        answers,
        reward=s.reward,
        k=s.k,
        seed=s.seed,
        max_new_tokens=s.max_new_tokens,
        chunk_rows=s.chunk_rows,
    )
    pi_check = float((state_probs(batch, idx) - batch.probs_taken[idx]).abs().max()) if idx.numel() else 0.0
    values, ent, d1, adv = mc["value"], batch.entropy[idx].detach(), delta1[idx], batch.adv_tok[idx]
    strings = token_strings(batch)
    pool = (batch.probs_taken <= s.max_prob) & (1.0 - batch.probs_taken > 1e-6) & distinct_states(batch)
    subsets = {"all": torch.ones_like(adv, dtype=torch.bool), "positive": adv > 0, "negative": adv < 0}
    fig5a = {name: gap_interval(values[m], d1[m]) for name, m in subsets.items()}
    # the no-coupling control on the same tokens: each moved by its own term lr·c_j·K_jj alone (K_jj > 0),
    # i.e. boosted = the tokens of positive rollouts (c_j = 0 tokens, of all-equal groups, in neither set)
    fig5a["all, self-only control"] = gap_interval(values, batch.coef[idx])
    fig5b = [{"top_frac": float(f), **gap_interval(values, d1, ent, float(f))} for f in s.top_fracs]
    fig11 = [{"step": n + 1, **gap_interval(values, d[idx])} for n, d in enumerate(deltas)]
    tokens = [
        {
            "token": strings[j],
            "row": int(batch.row[j]),
            "pos": int(batch.pos[j]),
            "adv": float(batch.adv_tok[j]),
            "prob": float(mc["pi"][i]),
            "entropy": float(ent[i]),
            "delta": float(d1[i]),
            "mean_forced": float(mc["mean_forced"][i]),
            "mean_state": float(mc["mean_state"][i]),
            "value": float(values[i]),
            "value_se": float(mc["value_se"][i]),
        }
        for i, j in enumerate(idx.tolist())
    ]
    return {
        "values": {
            "pool": int(pool.sum()),
            "pool_boosted": int((pool & (delta1 > 0)).sum()),
            "pool_suppressed": int((pool & (delta1 < 0)).sum()),
            "n_sampled": int(idx.numel()),
            "pi_check_max_abs": pi_check,
            "mean_value_se": float(mc["value_se"].nanmean()) if idx.numel() else math.nan,
            "tokens": tokens,
        },
        "fig5a": fig5a,
        "fig5b": fig5b,
        "fig11": fig11,
    }


def _budget_stage(model: Any, tokenizer: Any, s: CreditSettings, say: Any) -> list[dict[str, Any]]:
    """Fig. 6: the one-step gap per sampling budget (group sizes at ``num_prompts``, then prompt counts at
    ``group_size``), a fresh batch and fresh values per (budget, seed); a budget on both axes runs once."""
    configs = [("group_size", g, s.num_prompts) for g in s.budget_group_sizes or ()]
    configs += [("num_prompts", s.group_size, m) for m in s.budget_num_prompts or ()]
    budget_seeds = tuple(s.budget_seeds or ())
    cache: dict[tuple[int, int, int], tuple[Tensor, Tensor, Tensor, dict[str, Any]]] = {}
    fig6 = []
    for axis, gs, npr in configs:
        vals, dels, ents, infos = [], [], [], []
        for seed in budget_seeds:
            key = (gs, npr, int(seed))
            if key not in cache:
                say(f"  budget {npr} prompts × {gs} completions, seed {seed}")
                b, dl, ix, m, info = _value_block(
                    model,
                    tokenizer,
                    task=s.task,
                    reward=s.reward,
                    num_prompts=npr,
                    group_size=gs,
                    seed=int(seed),
                    max_new_tokens=s.max_new_tokens,
                    temperature=s.temperature,
                    lr=s.lr,
                    n_tokens=s.budget_n_tokens,
                    k=s.budget_k,
                    max_prob=s.max_prob,
                    chunk_rows=s.chunk_rows,
                )
                cache[key] = (m["value"], dl[ix], b.entropy[ix].detach(), info)
            v, dl, e, info = cache[key]
            vals.append(v)
            dels.append(dl)
            ents.append(e)
            infos.append(info)
        v, dl, e = torch.cat(vals), torch.cat(dels), torch.cat(ents)
        fig6.append(
            {
                "axis": axis,
                "group_size": gs,
                "num_prompts": npr,
                "rollouts": gs * npr,
                "seeds": list(budget_seeds),
                "n_sampled": int(v.numel()),
                "groups_mixed": sum(i["groups_mixed"] for i in infos),
                "groups": npr * len(budget_seeds),
                "gap": gap_interval(v, dl),
                "gap_top": gap_interval(v, dl, e, BUDGET_TOP_FRAC),
            }
        )
    return fig6


def run_lm_credit(
    folder: str | Path,
    settings: CreditSettings | None = None,
    *,
    progress: Any = None,
    **fields: Any,
) -> dict[str, Any]:
    """§4a and §4b on one checkpoint (module docstring); a JSON-serialisable dict (NaN → None).

    ``folder``: a saved model folder (``instruments.coupling_lm.load_policy``: a model, a LoRA checkpoint or
    a run folder).
    ``settings``: a ``CreditSettings`` (its defaults when None); keyword ``fields`` override its fields by
    name (``run_lm_credit(folder, quick=True, k=4)``). ``progress``: called with a line per stage.
    Defaults (``quick``): ``n_tokens`` 48 (8) sampled tokens, ``k`` 64 (8) continuations per branch,
    ``n_steps`` 5 (2) repeated steps, Fig. 6 group sizes (4, 8, 16) ((4, 8)) at ``num_prompts`` and prompt
    counts (1, 2, 4) ((1, 2)) at ``group_size``, budget seeds (``seed``, ``seed`` + 1) ((``seed``,)), 32 (8)
    tokens and 32 (8) continuations per budget batch.

    The stages: ``_filter_stage`` (§4a), ``_value_stage`` (§4b: Fig. 5(a), 5(b), 11), ``_budget_stage``
    (Fig. 6).
    """
    settings = settings if settings is not None else CreditSettings()
    unknown = sorted(set(fields) - {f.name for f in dataclass_fields(CreditSettings)})
    if unknown:
        raise TypeError(
            f"run_lm_credit got unknown setting(s) {', '.join(unknown)}; valid: "
            f"{', '.join(f.name for f in dataclass_fields(CreditSettings))}"
        )
    s = replace(settings, **fields).resolved()
    say = progress or (lambda _m: None)
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    folder = Path(folder)
    model, tokenizer = load_policy(folder)

    say("sampling the batch, §4a filter probe")
    t0 = time.perf_counter()
    batch, prompts, answers, filt = _filter_stage(model, tokenizer, s)
    t_filter = time.perf_counter() - t0

    say(f"§4b: Monte Carlo values of {s.n_tokens} tokens × 2 branches × {s.k} continuations")
    t0 = time.perf_counter()
    values = _value_stage(batch, prompts, answers, s)
    t_mc = time.perf_counter() - t0

    say("Fig. 6: the sampling budget")
    t0 = time.perf_counter()
    fig6 = _budget_stage(model, tokenizer, s, say)
    t_budget = time.perf_counter() - t0

    result = {
        "model": str(folder),
        "settings": s.record(),
        "batch": {
            "n_tokens": batch.n_tokens,
            "rewards": batch.rewards.tolist(),
            "completions": batch.completions,
            "pass_rate": float(batch.rewards.mean()),
        },
        "filter": {k_: v for k_, v in filt.items() if k_ != "delta"},
        **values,
        "fig6": fig6,
        "seconds": {
            "filter": t_filter,
            "values": t_mc,
            "budget": t_budget,
            "total": time.perf_counter() - t_start,
        },
    }
    return _nan_none(result)


# ------------------------------------------------------------------------------------------------
# report


def _f(x: Any, digits: int = 3, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if x != 0 and abs(x) < 10 ** (-digits):
            return f"{x:+.1e}" if signed else f"{x:.1e}"
        return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"
    return str(x)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _gap_cells(g: dict[str, Any]) -> list[str]:
    ci = "–" if g["lo"] is None else f"[{_f(g['lo'], 3, True)}, {_f(g['hi'], 3, True)}]"
    return [
        _f(g["gap"], 3, True),
        ci,
        _f(g["se"]),
        _f(g["boosted"], 3, True),
        _f(g["suppressed"], 3, True),
        f"{g['n_boosted']}/{g['n_suppressed']}",
    ]


_GAP_HEAD = ["gap", "95% bootstrap CI", "SE", "boosted", "suppressed", "n b/s"]


def _tok(s: str) -> str:
    return "`" + s.replace("|", "\\|").replace("`", "'").replace("\n", "\\n") + "`"


def filter_tables(result: dict[str, Any]) -> str:
    """§4a's tables: boosted fraction, mean Δ and boosted-mass share per update and class; top tokens."""
    f = result["filter"]
    ups = f["updates"]
    head = ["class", "n"] + [f"{u} {c}" for u in FILTER_UPDATES for c in ("boosted", "mass")]
    rows = []
    for c in TOKEN_CLASSES:
        row: list[Any] = [c, f["classes_n"][c]]
        for u in FILTER_UPDATES:
            st = ups[u]["classes"][c]
            row += [_f(st["frac_boosted"], 2), _f(st["boost_mass_share"], 2)]
        rows.append(row)
    out = [
        f"Boosted fraction (Δ log π > 0) and share of the update's boosted mass Σ max(Δ, 0) per token class "
        f"(lr {f['lr']:g}, tokens in each loss: "
        + ", ".join(f"{u} {ups[u]['n_in_loss']}" for u in FILTER_UPDATES)
        + ")",
        "",
        _table(head, rows),
        "",
        "Mean Δ log π per class:",
        "",
        _table(
            ["class", "median π", *FILTER_UPDATES],
            [
                [
                    c,
                    _f(ups["grpo"]["classes"][c]["median_prob"], 4),
                    *(_f(ups[u]["classes"][c]["mean_delta"], 4, True) for u in FILTER_UPDATES),
                ]
                for c in TOKEN_CLASSES
            ],
        ),
    ]
    for u in FILTER_UPDATES:
        out += ["", f"Most boosted tokens under {u}:", ""]
        out.append(
            _table(
                ["token", "Δ log π", "row", "pos", "Â", "π", "shared", "number", "high H"],
                [
                    [
                        _tok(t["token"]),
                        _f(t["delta"], 4, True),
                        t["row"],
                        t["pos"],
                        _f(t["adv"], 2, True),
                        _f(t["prob"], 3),
                        _f(t["shared"]),
                        _f(t["number"]),
                        _f(t["high_entropy"]),
                    ]
                    for t in ups[u]["top"]
                ],
            )
        )
    return "\n".join(out)


def value_tables(result: dict[str, Any]) -> str:
    """§4b's tables: Fig. 5(a), 5(b), 11 and 6."""
    s, v = result["settings"], result["values"]
    out = [
        f"{v['n_sampled']} tokens sampled (equal boosted/suppressed after one GRPO step) from the "
        f"{v['pool']} distinct (state, token) events with π ≤ {s['max_prob']} ({v['pool_boosted']} boosted, "
        f"{v['pool_suppressed']} suppressed; completions of one prompt that agree up to a token share its "
        f"state, and each event is taken once) of {result['batch']['n_tokens']} tokens; K = {s['k']} continuations per branch; mean value SE "
        f"{_f(v['mean_value_se'])}; π(a|s) recomputed from the left-padded states differs from the batch's by "
        f"at most {_f(v['pi_check_max_abs'])}.",
        "",
        "Fig. 5(a): mean counterfactual value (eq. 20) of boosted − suppressed tokens after one GRPO step:",
        "",
        _table(["rollouts", *_GAP_HEAD], [[name, *_gap_cells(g)] for name, g in result["fig5a"].items()]),
        "",
        "Fig. 5(b): the gap on the top-k% of the sampled tokens by entropy:",
        "",
        _table(
            ["top k", *_GAP_HEAD], [[f"{100 * r['top_frac']:.0f}%", *_gap_cells(r)] for r in result["fig5b"]]
        ),
        "",
        f"Fig. 11: the gap after n repeated GRPO steps on the fixed batch (repeat={s['repeat']}; cumulative "
        "Δ log π; values at the checkpoint):",
        "",
        _table(["steps", *_GAP_HEAD], [[r["step"], *_gap_cells(r)] for r in result["fig11"]]),
        "",
        f"Fig. 6: the one-step gap vs the sampling budget (seeds {s['budget_seeds']} pooled, "
        f"{s['budget_n_tokens']} tokens and K = {s['budget_k']} per batch; top: the top "
        f"{100 * s['budget_top_frac']:.0f}% by entropy):",
        "",
        _table(
            [
                "axis",
                "prompts × G",
                "mixed groups",
                "gap",
                "95% CI",
                "n b/s",
                "gap top",
                "95% CI top",
                "n b/s top",
            ],
            [
                [
                    r["axis"],
                    f"{r['num_prompts']} × {r['group_size']}",
                    f"{r['groups_mixed']}/{r['groups']}",
                    *(_gap_cells(r["gap"])[i] for i in (0, 1, 5)),
                    *(_gap_cells(r["gap_top"])[i] for i in (0, 1, 5)),
                ]
                for r in result["fig6"]
            ],
        ),
    ]
    return "\n".join(out)


def _sign_word(g: dict[str, Any]) -> str:
    if g["gap"] is None:
        return "undefined (an empty set)"
    if g["lo"] is not None and g["lo"] > 0:
        return "positive, its 95% interval above 0"
    if g["hi"] is not None and g["hi"] < 0:
        return "negative, its 95% interval below 0"
    return f"{'positive' if g['gap'] > 0 else 'negative'} but its 95% interval contains 0"


def _nondecreasing(xs: list[Any]) -> bool:
    return all(x is not None for x in xs) and all(y >= x for x, y in itertools.pairwise(xs))


def findings(result: dict[str, Any]) -> list[str]:
    """A few sentences: what the numbers show against the paper's claims (computed from ``result``)."""
    ups = result["filter"]["updates"]
    out = []

    def mass(u: str, c: str) -> float:
        x = ups[u]["classes"][c]["boost_mass_share"]
        return math.nan if x is None else float(x)

    def frac(u: str, c: str) -> float:
        x = ups[u]["classes"][c]["frac_boosted"]
        return math.nan if x is None else float(x)

    out.append(
        "Filter (Sec. 3.2, App. E.1): the paper predicts positive-only boosts template/shared tokens broadly and "
        "GRPO moves boosted mass to deciding tokens. Here positive-only boosts "
        f"{frac('positive_only', 'template'):.0%} of template and {frac('positive_only', 'shared'):.0%} of shared "
        f"tokens vs GRPO {frac('grpo', 'template'):.0%} and {frac('grpo', 'shared'):.0%}; the boosted mass on "
        f"number tokens is {mass('positive_only', 'number'):.0%} (positive-only) vs {mass('grpo', 'number'):.0%} "
        f"(GRPO), on high-entropy tokens {mass('positive_only', 'high_entropy'):.0%} vs "
        f"{mass('grpo', 'high_entropy'):.0%}, on shared tokens {mass('positive_only', 'shared'):.0%} vs "
        f"{mass('grpo', 'shared'):.0%}. The median π of shared tokens is "
        f"{_f(ups['grpo']['classes']['shared']['median_prob'], 4)} and of template tokens "
        f"{_f(ups['grpo']['classes']['template']['median_prob'], 4)}: where π ≈ 1 log π can hardly rise, so "
        "a class's boosted fraction there reflects Δ of order 1e-6 either way, and the boosted mass is the "
        "more telling measure."
    )
    a = result["fig5a"]["all"]
    out.append(
        f"Value gap (Fig. 5a): boosted − suppressed = {_f(a['gap'], 3, True)} over {a['n_boosted']}+"
        f"{a['n_suppressed']} tokens, {_sign_word(a)}; the paper reports boosted > suppressed."
        + (
            f" The no-coupling control on the same tokens (each moved by its own coefficient alone, so boosted "
            f"= the tokens of positive rollouts) gives {_f(c['gap'], 3, True)}: sorting these tokens by their "
            "rollout's advantage alone, with no cancellation, separates them by value too."
            if (c := result["fig5a"].get("all, self-only control")) and c.get("gap") is not None
            else ""
        )
    )
    b = [r for r in result["fig5b"] if r["gap"] is not None]
    if b:
        best = max(b, key=lambda r: r["gap"])
        out.append(
            f"Fig. 5(b): over k the gap is largest at top {100 * best['top_frac']:.0f}% ({_f(best['gap'], 3, True)}); "
            "the paper's peaks near top 40%. With tens of tokens, the small-k points rest on a handful of tokens."
        )
    e = [r["gap"] for r in result["fig11"]]
    if all(x is not None for x in e) and len(e) > 1:
        se = result["fig11"][0].get("se")
        rise = e[-1] - e[0]
        if se is not None and abs(rise) < se:
            verdict = f"flat: it changes by {_f(rise, 3, True)}, less than one SE ({_f(se, 3)}); the paper reports it growing"
        elif _nondecreasing(e) and rise > 0:
            verdict = "growing, as the paper reports"
        else:
            verdict = "not growing; the paper reports growth"
        out.append(
            f"Fig. 11: the gap over {len(e)} steps runs "
            + ", ".join(_f(x, 3, True) for x in e)
            + f" ({verdict})."
        )
    f6 = result["fig6"]
    for axis in ("group_size", "num_prompts"):
        rows = [r for r in f6 if r["axis"] == axis]
        if rows:
            out.append(
                f"Fig. 6 ({axis}): gap "
                + ", ".join(
                    f"{r['num_prompts']}×{r['group_size']}: {_f(r['gap']['gap'], 3, True)}" for r in rows
                )
                + (
                    " (non-decreasing in the budget, as the paper reports; the intervals overlap)."
                    if _nondecreasing([r["gap"]["gap"] for r in rows])
                    else " (no growth with the budget is seen, the intervals overlap; the paper reports growth)."
                )
            )
    return out


def markdown_lm_credit(result: dict[str, Any], commands: str = "") -> str:
    """A report section: the settings, the §4a and §4b tables, what they show, then ``commands`` (the caller's
    line naming the commands that produce it; left out when empty)."""
    s = result["settings"]
    sec = result["seconds"]
    return "\n".join(
        [
            "## Cancellation as hidden credit assignment on the tiny LM (Sec. 3.2, App. E.1–E.2)",
            "",
            f"Model `{result['model']}`; one batch of {s['num_prompts']} prompts × {s['group_size']} completions "
            f"({s['task']}, reward {s['reward']}, seed {s['seed']}, T = {s['temperature']}, {result['batch']['n_tokens']} "
            f"tokens, pass rate {result['batch']['pass_rate']:.2f}); every update one plain SGD step on all "
            f"parameters, lr {s['lr']:g}, float64.",
            "",
            "### §4a Cancellation as a filter (positive-only / negative-only / GRPO)",
            "",
            filter_tables(result),
            "",
            "### §4b Counterfactual token values (eq. 20, Monte Carlo)",
            "",
            value_tables(result),
            "",
            "### What the numbers show",
            "",
            *(f"- {x}" for x in findings(result)),
            "",
            f"Runtime: filter {sec['filter']:.1f} s, values {sec['values']:.1f} s, budget {sec['budget']:.1f} s, "
            f"total {sec['total']:.1f} s.",
            *(["", commands] if commands else []),
        ]
    )


__all__ = [
    "DEFAULT_LR",
    "FILTER_UPDATES",
    "TOKEN_CLASSES",
    "CreditSettings",
    "base_logp",
    "batch_tasks",
    "class_stats",
    "displacement",
    "filter_coefficients",
    "filter_probe",
    "gap_interval",
    "generate_from_states",
    "left_pad",
    "markdown_lm_credit",
    "mc_token_values",
    "repeated_deltas",
    "run_lm_credit",
    "select_tokens",
    "shared_token_mask",
    "state_of",
    "state_probs",
    "token_classes",
    "token_strings",
]
