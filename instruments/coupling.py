"""Table 1 of the cancellation-hypothesis paper on the small neural policy, every open choice a parameter.

The paper: "The Cancellation Hypothesis in Critic-Free RL: From Outcome Rewards to Token Credits"
(arXiv 2605.08666). Sec. 2 defines the Masking Effect of a token set M_j on a candidate token j,
ME_j = log π_θ'(y_j) − log π_θ'_{−M_j}(y_j) (θ' one SGD step on the batch, θ'_{−M_j} the same step with M_j
removed from the loss), and Table 1 reports its Boost Rate (fraction of ME_j > 0) and Mean Boost for four
mask sets (random; same token; low confidence; same token and low confidence) under an LM-head-only
("LM-head") and a full-parameter ("Full") SGD step: Boost Rates ≈ 50.6 / 66.2 / 44.2 / 74.1 % (LM-head)
and 50.2 / 66.4 / 43.0 / 75.0 % (Full). App. D.1 compares the signs of Δ log π under the two updates.

Here the model is ``toymodel.neural.NeuralPolicy`` on a toy scenario (default ``template_task``): a net
whose tokens couple through shared weights (W1, b1, the untied unembedding W_out). One batch is sampled
on-policy, the GRPO coefficients c = ∂J/∂log π come from ``cancellation.update.coefficients`` (ratios 1,
so clipping is inactive) and every instrument is ``cancellation.coupling``'s: ``mask_sets`` builds the
four sets, ``masking_effect`` with ``sgd_step`` gives the exact ME, ``first_order_masking_effect`` the
kernel's prediction lr·Σ_{k∈M_j} c_k K_jk, ``boost_stats`` the two statistics.

The paper's text leaves several choices open; each is a named parameter of ``table1`` (its docstring
gives the default and the reason). ``convention_grid`` runs the table under a grid of them over a few
seeds and ``closest_to_paper`` ranks the readings by the mean absolute difference (percentage points) of
their four seed-averaged Boost Rates from the paper's column (LM-head for ``update="head"``, Full for
``update="full"``).

Sec. 3 ("Cancellation favors tokens with higher value") and App. E.2 compare the tokens the update boosts
(Δ log π > 0) with those it suppresses by their counterfactual token value (App. E.2 eq. 20,
(Q − V)/(1 − π)): ``value_gap_study`` gives Fig. 5 (a: the gap after one step, b: on the top-k% highest
entropy tokens), Fig. 11 (the gap after repeated steps on one fixed batch) and Fig. 6 (the gap vs the
sampling budget) on the neural toy, with the values *exact* (``toymodel.values.exact_token_values``: the
support is enumerated, so there is no Monte Carlo error) and every gap from ``cancellation.coupling.value_gap``.

Run (``experiments/coupling.py``; CPU, about half a minute; prints the default table, the grid ranked by
distance, the closest reading, then the value-gap tables on ``template_task`` and ``shared_prefix``):

    python -m experiments.coupling
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

import torch
from torch import Tensor

from cancellation import group_advantages
from cancellation.coupling import (
    ValueGap,
    boost_stats,
    coupling_kernel,
    coupling_mass,
    first_order_delta,
    first_order_masking_effect,
    mask_sets,
    masking_effect,
    per_token_scores,
    proxy_kernel,
    repeated_sgd,
    sgd_step,
    value_gap,
)
from cancellation.update import coefficients
from toymodel.neural import NeuralPolicy
from toymodel.values import exact_token_values

#: Table 1's four mask sets, in the paper's row order.
MASK_SETS = ("random", "same_token", "low_confidence", "both")
#: Table 1's Boost Rates (fractions) per column: "head" = the LM-head-only update, "full" = all parameters.
PAPER_BOOST_RATE: dict[str, dict[str, float]] = {
    "head": {"random": 0.5060, "same_token": 0.6620, "low_confidence": 0.4420, "both": 0.7412},
    "full": {"random": 0.5021, "same_token": 0.6641, "low_confidence": 0.4304, "both": 0.7500},
}
CANDIDATES = ("all", "positive", "negative")
UPDATES = ("full", "head")
CANDIDATE_FILTERS = ("coupled", "nonempty", "none")
INITS = ("random", "scenario")
TIES = ("count", "drop")

# seed offsets: the net's init, the batch and the random masks draw from three separate generators
_SAMPLE_OFFSET = 10_000
_MASK_OFFSET = 20_000


# ------------------------------------------------------------------------------------------------
# one batch, flattened


@dataclass
class Batch:
    """One on-policy batch of the neural policy, flattened over its N valid tokens.

    Attributes:
        policy: the ``NeuralPolicy``; params: its parameters θ (leaf tensors).
        idx: (B,) trajectory indices; group: (B,) group ids; rewards, advantages: (B,).
        mask: (B, T) 1 on real steps.
        coef: (N,) c_j = ∂J/∂log π(y_j) (``coefficients(...).coef[mask]``).
        tokens: (N,) global token ids y_j; probs: (N, V) π_j; hidden: (N, d) h_j; logp: (N,) log π(y_j);
        probs_taken: (N,) π_j(y_j); adv_tok: (N,) the advantage of token j's rollout.
        forced: (N,) bool, tokens whose context has a single valid token (π = 1: no step can move them).
        fit_kl: the mean KL of the net's fit to the scenario's initial policy (NaN for ``init="random"``).
    """

    policy: NeuralPolicy
    params: list[Tensor]
    idx: Tensor
    group: Tensor
    rewards: Tensor
    advantages: Tensor
    mask: Tensor
    coef: Tensor
    tokens: Tensor
    probs: Tensor
    hidden: Tensor
    logp: Tensor
    probs_taken: Tensor
    adv_tok: Tensor
    forced: Tensor
    fit_kl: float

    def logp_of(self, theta: Sequence[Tensor]) -> Tensor:
        """(N,) log π_θ(y_j) of the batch's tokens under parameters ``theta``."""
        return self.policy.token_logp(theta, self.idx)[self.mask.bool()]


def sample_batch(
    scenario: str = "template_task",
    *,
    seed: int = 0,
    group_size: int = 8,
    num_groups: int = 4,
    context: str | None = "prefix",
    d_embed: int = 8,
    d_hidden: int = 8,
    init: str = "random",
    fit_steps: int = 200,
    objective: str = "grpo",
    aggregation: str | None = None,
    adv_scale: str = "group",
) -> Batch:
    """Build the net (seeded), sample ``num_groups`` groups of ``group_size`` on-policy, take GRPO's coefficients.

    ``init="random"``: the seeded random net (``NeuralPolicy.init_params(seed)``) as is; ``"scenario"``: that
    net fitted (``NeuralPolicy.fit``, ``fit_steps`` Adam steps at lr 0.1) to the scenario's initial policy. Coefficients: on-policy
    (old_logp = logp, so every ratio is 1), ``coefficients(objective, logp, logp, A, mask, group)``.
    """
    if init not in INITS:
        raise ValueError(f"unknown init {init!r}; valid: {', '.join(INITS)}")
    for name, v in (("group_size", group_size), ("num_groups", num_groups)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"`{name}` must be a positive int, got {v!r}")
    policy = NeuralPolicy.from_scenario(scenario, context=context, d_embed=d_embed, d_hidden=d_hidden)
    params = policy.init_params(seed)
    fit_kl = math.nan
    if init == "scenario":
        params, fit_kl = policy.fit(params, policy.scenario_target(), steps=fit_steps, lr=0.1)
    gen = torch.Generator().manual_seed(_SAMPLE_OFFSET + int(seed))
    idx = policy.sample(group_size * num_groups, params, gen)
    group = torch.arange(num_groups).repeat_interleave(group_size)
    return make_batch(
        policy, params, idx, group, objective=objective, aggregation=aggregation, adv_scale=adv_scale,
        fit_kl=fit_kl,
    )  # fmt: skip


def make_batch(
    policy: NeuralPolicy,
    params: list[Tensor],
    idx: Tensor,
    group: Tensor,
    *,
    objective: str = "grpo",
    aggregation: str | None = None,
    adv_scale: str = "group",
    fit_kl: float = math.nan,
) -> Batch:
    """The ``Batch`` of given trajectories ``idx`` (B,) in groups ``group`` (B,) under ``params``.

    ``sample_batch``'s second half (it samples ``idx``, then calls this); use it to build a batch by hand.
    Advantages: ``group_advantages(R, group, scale=adv_scale)``; coefficients on-policy (ratios 1).
    """
    rewards = policy.rewards[idx]
    adv = group_advantages(rewards, group, scale=adv_scale)
    mask = policy.step_mask(idx)
    with torch.no_grad():
        logp_bt = policy.token_logp(params, idx)
        hidden = policy.hidden(params, idx)
        probs = policy.token_probs(params, idx)
    kw: dict[str, Any] = {} if aggregation is None else {"aggregation": aggregation}
    # Sec. 2 eq. (2): the update as a weighted token log-likelihood; on-policy, so old_logp = logp
    coef = coefficients(objective, logp_bt, logp_bt, adv, mask, group, with_metrics=False, **kw).coef
    valid = mask.bool()
    tokens = policy.token_ids(idx)[valid]
    n_valid = policy.valid_vocab.sum(-1)  # (C,) number of tokens each context allows
    return Batch(
        policy=policy,
        params=params,
        idx=idx,
        group=group,
        rewards=rewards,
        advantages=adv,
        mask=mask,
        coef=coef[valid],
        tokens=tokens,
        probs=probs[valid],
        hidden=hidden[valid],
        logp=logp_bt[valid],
        probs_taken=logp_bt[valid].exp(),
        adv_tok=adv[:, None].expand_as(mask)[valid],
        forced=(n_valid[policy.ctx[idx]] == 1)[valid],
        fit_kl=fit_kl,
    )


# ------------------------------------------------------------------------------------------------
# the expensive part: exact and first-order masking effects of every candidate


@dataclass
class Measurement:
    """Masking effects of every token of one batch under one mask convention (``same_sign``, ``low_conf``).

    Attributes:
        batch: the ``Batch``.
        lr: the SGD step size; same_sign, low_conf, candidate_filter: the conventions used.
        masks: {set: (N, N) bool}, row j = M_j of candidate j.
        computed: {set: (N,) bool}, the candidates whose ME was computed (the filter's candidates).
        me: {update: {set: (N,)}} exact ME (NaN where not computed).
        me_first: {update: {set: (N,)}} first-order ME from the update's kernel (NaN where not computed).
        kernels: {"full", "head", "proxy"}: (N, N) K over all parameters, over the output layer, and
            ``proxy_kernel``'s eq. (7).
        delta: {"full", "head"}: (N,) actual Δ log π of the unmasked step; {"full_first", "proxy_first"}:
            first-order Δ log π (eq. 5 / eq. 9).
    """

    batch: Batch
    lr: float
    same_sign: bool
    low_conf: float
    candidate_filter: str
    masks: dict[str, Tensor]
    computed: dict[str, Tensor]
    me: dict[str, dict[str, Tensor]]
    me_first: dict[str, dict[str, Tensor]]
    kernels: dict[str, Tensor]
    delta: dict[str, Tensor]


def _head_logp_of(batch: Batch) -> tuple[Any, list[Tensor]]:
    """``logp_of`` over the output layer alone (the rest of θ frozen at its value) and those parameters."""
    sl = batch.policy.head_slice
    frozen = [p.detach() for p in batch.params]

    def logp_of(head: Sequence[Tensor]) -> Tensor:
        theta = list(frozen)
        theta[sl] = list(head)
        return batch.logp_of(theta)

    return logp_of, [p for p in batch.params[sl]]


def measure(
    batch: Batch,
    *,
    lr: float = 1.0,
    same_sign: bool = False,
    low_conf: float = 0.5,
    candidate_filter: str = "coupled",
    updates: Iterable[str] = UPDATES,
    mask_seed: int = 0,
) -> Measurement:
    """Build the four mask sets of every token and their exact and first-order masking effects.

    Candidates computed: non-forced tokens (a token whose context allows one token has π = 1 and
    ME ≡ 0) that pass ``candidate_filter`` (see ``table1``); under ``"none"`` an empty mask's ME is set to
    exactly 0 (the masked step *is* the full step) without running it. The random masks are drawn in token
    order from a generator seeded with ``mask_seed``.
    """
    if candidate_filter not in CANDIDATE_FILTERS:
        raise ValueError(
            f"unknown candidate_filter {candidate_filter!r}; valid: {', '.join(CANDIDATE_FILTERS)}"
        )
    updates = tuple(updates)
    for u in updates:
        if u not in UPDATES:
            raise ValueError(f"unknown update {u!r}; valid: {', '.join(UPDATES)}")
    n = batch.coef.shape[0]
    gen = torch.Generator().manual_seed(_MASK_OFFSET + int(mask_seed))
    rows: dict[str, list[Tensor]] = {s: [] for s in MASK_SETS}
    for j in range(n):
        sets = mask_sets(
            batch.tokens, batch.probs_taken, j, low_conf=low_conf, advantages=batch.adv_tok,
            same_sign=same_sign, generator=gen,
        )  # fmt: skip
        for s in MASK_SETS:
            rows[s].append(sets[s])
    masks = {s: torch.stack(rows[s]) for s in MASK_SETS}
    nonempty = {s: masks[s].any(dim=1) for s in MASK_SETS}
    movable = ~batch.forced
    if candidate_filter == "coupled":
        computed = {s: movable & nonempty["both"] for s in MASK_SETS}
    elif candidate_filter == "nonempty":
        computed = {s: movable & nonempty[s] for s in MASK_SETS}
    else:
        computed = {s: movable.clone() for s in MASK_SETS}

    # eq. (5) and eq. (7): the kernels over all parameters, over the output layer, and the proxy
    scores = per_token_scores(lambda: batch.logp_of(batch.params), batch.params)
    sizes = [p.numel() for p in batch.params]
    sl = batch.policy.head_slice
    start = sum(sizes[: sl.start])
    k_full = coupling_kernel(scores)
    k_head = coupling_kernel(scores[:, start:])
    k_proxy = proxy_kernel(batch.hidden, batch.probs, batch.tokens)
    kernels = {"full": k_full, "head": k_head, "proxy": k_proxy}

    head_logp_of, head_params = _head_logp_of(batch)
    steps = {
        "full": sgd_step(batch.logp_of, batch.params, lr),
        "head": sgd_step(head_logp_of, head_params, lr),
    }
    base = batch.logp.detach()
    delta = {
        "full": steps["full"](batch.coef) - base,
        "head": steps["head"](batch.coef) - base,
        "full_first": first_order_delta(k_full, batch.coef, lr).total,
        "proxy_first": first_order_delta(k_proxy, batch.coef, lr).total,
    }

    me: dict[str, dict[str, Tensor]] = {}
    me_first: dict[str, dict[str, Tensor]] = {}
    for u in updates:
        me[u], me_first[u] = {}, {}
        for s in MASK_SETS:
            out = torch.full((n,), math.nan, dtype=batch.coef.dtype)
            out_first = torch.full((n,), math.nan, dtype=batch.coef.dtype)
            run = computed[s] & nonempty[s]
            cand = torch.nonzero(run).flatten()
            if cand.numel():
                # Sec. 2: ME_j = log π_θ'(y_j) − log π_θ'_{−M_j}(y_j), exact and to first order
                out[cand] = masking_effect(steps[u], batch.coef, masks[s][cand], candidates=cand)
                out_first[cand] = first_order_masking_effect(
                    kernels[u], batch.coef, masks[s][cand], lr, candidates=cand
                )
            zero = computed[s] & ~nonempty[s]
            out[zero] = 0.0
            out_first[zero] = 0.0
            me[u][s], me_first[u][s] = out, out_first
    return Measurement(
        batch=batch, lr=float(lr), same_sign=bool(same_sign), low_conf=float(low_conf),
        candidate_filter=candidate_filter, masks=masks, computed=computed, me=me, me_first=me_first,
        kernels=kernels, delta=delta,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------
# the cheap part: a table from a measurement


def _frac(x: Tensor) -> float:
    return float(x.to(torch.float64).mean()) if x.numel() else math.nan


def _agree(a: Tensor, b: Tensor) -> float:
    """Fraction of entries where sign(a) = sign(b)."""
    return _frac(torch.sign(a) == torch.sign(b))


def candidate_mask(batch: Batch, candidates: str, orient_by_sign: bool) -> Tensor:
    """(N,) bool: the tokens counted as candidates (before the mask filter of ``measure``).

    ``"all"``: every token; ``"positive"`` / ``"negative"``: tokens of rollouts with A > 0 / A < 0. With
    ``orient_by_sign`` a token with A = 0 has no sign to orient by and is dropped.
    """
    if candidates not in CANDIDATES:
        raise ValueError(f"unknown candidates {candidates!r}; valid: {', '.join(CANDIDATES)}")
    a = batch.adv_tok
    sel = {"all": torch.ones_like(a, dtype=torch.bool), "positive": a > 0, "negative": a < 0}[candidates]
    if orient_by_sign:
        sel = sel & (a != 0)
    return sel


def summarise(
    m: Measurement,
    *,
    update: str = "full",
    candidates: str = "all",
    orient_by_sign: bool = False,
    ties: str = "count",
) -> dict[str, Any]:
    """Table 1 from a ``Measurement``: per mask set Boost Rate, Mean Boost and their first-order versions.

    ``ties="count"``: a candidate with ME = 0 exactly (its masked tokens cannot reach it, e.g. under the
    head update, tokens whose W_out rows its softmax does not use) counts as not boosted, as
    ``boost_stats`` does; ``"drop"``: such candidates are left out of both the exact and first-order rates.

    Returns a dict: ``sets`` {set: {n, tie_rate (fraction of the selected candidates with ME = 0 exactly),
    boost_rate, mean_boost, first_order_boost_rate, first_order_mean_boost, first_order_gap (first-order −
    actual Boost Rate), first_order_sign_agreement, mean_mask_size}}, ``sign_agreement`` (the proxy vs the full update, over the non-forced tokens),
    ``coupling_mass`` and ``coupling_mass_proxy`` (``coupling_mass`` of the update's kernel and of the
    proxy), ``kernel_rel_diff`` (‖K_full − K_proxy‖_F / ‖K_full‖_F), and sizes.
    """
    if update not in m.me:
        raise ValueError(f"update {update!r} was not measured; measured: {', '.join(m.me)}")
    if ties not in TIES:
        raise ValueError(f"unknown ties {ties!r}; valid: {', '.join(TIES)}")
    b = m.batch
    sel = candidate_mask(b, candidates, orient_by_sign)
    sign = torch.sign(b.adv_tok) if orient_by_sign else torch.ones_like(b.adv_tok)
    sets: dict[str, dict[str, float]] = {}
    for s in MASK_SETS:
        keep = sel & m.computed[s]
        zero = keep & (m.me[update][s] == 0)
        tie_rate = float(zero.sum()) / float(keep.sum()) if bool(keep.any()) else math.nan
        if ties == "drop":
            keep = keep & ~zero
        # Sec. 2 / Table 1: oriented ME_j·sign(A_j) when orient_by_sign
        me = (m.me[update][s] * sign)[keep]
        fo = (m.me_first[update][s] * sign)[keep]
        row: dict[str, float] = {
            "n": int(keep.sum()),
            "tie_rate": tie_rate,
            "mean_mask_size": _frac(m.masks[s][keep].sum(1)),
        }
        if me.numel():
            st, st1 = boost_stats(me), boost_stats(fo)
            row.update(
                boost_rate=st.boost_rate, mean_boost=st.mean_boost, first_order_boost_rate=st1.boost_rate,
                first_order_mean_boost=st1.mean_boost, first_order_gap=st1.boost_rate - st.boost_rate,
                first_order_sign_agreement=_agree(me, fo),
            )  # fmt: skip
        else:
            for k in ("boost_rate", "mean_boost", "first_order_boost_rate", "first_order_mean_boost",
                      "first_order_gap", "first_order_sign_agreement"):  # fmt: skip
                row[k] = math.nan
        sets[s] = row
    mov = ~b.forced
    d = {k: v[mov] for k, v in m.delta.items()}
    kf, kp = m.kernels["full"], m.kernels["proxy"]
    return {
        "update": update,
        "candidates": candidates,
        "orient_by_sign": orient_by_sign,
        "ties": ties,
        "same_sign": m.same_sign,
        "low_conf": m.low_conf,
        "lr": m.lr,
        "candidate_filter": m.candidate_filter,
        "n_tokens": int(b.coef.shape[0]),
        "n_movable": int(mov.sum()),
        "n_params": b.policy.num_params(),
        "fit_kl": b.fit_kl,
        "sets": sets,
        "sign_agreement": {
            "proxy_first_vs_full_first": _agree(d["proxy_first"], d["full_first"]),
            "proxy_first_vs_full_actual": _agree(d["proxy_first"], d["full"]),
            "full_first_vs_full_actual": _agree(d["full_first"], d["full"]),
            "head_actual_vs_full_actual": _agree(d["head"], d["full"]),
        },
        "coupling_mass": coupling_mass(m.kernels[update], b.coef, b.tokens, b.probs_taken, m.low_conf),
        "coupling_mass_proxy": coupling_mass(kp, b.coef, b.tokens, b.probs_taken, m.low_conf),
        "kernel_rel_diff": float(torch.linalg.norm(kf - kp) / torch.linalg.norm(kf)),
    }


def table1(
    scenario: str = "template_task",
    *,
    seed: int = 0,
    group_size: int = 8,
    num_groups: int = 4,
    lr: float = 1.0,
    objective: str = "grpo",
    aggregation: str | None = None,
    adv_scale: str = "group",
    candidates: str = "all",
    same_sign: bool = False,
    low_conf: float = 0.5,
    orient_by_sign: bool = False,
    update: str = "full",
    ties: str = "count",
    candidate_filter: str = "coupled",
    context: str | None = "prefix",
    init: str = "random",
    d_embed: int = 8,
    d_hidden: int = 8,
) -> dict[str, Any]:
    """Table 1 of arXiv 2605.08666 on the neural toy: one batch, one SGD step, four mask sets.

    Conventions (the paper's open choices), default and reason:

    - ``scenario="template_task"``: shared template tokens of mixed confidence (0.7/0.2/0.1) in every
      rollout of both advantage signs, the toy closest to the paper's LM batches.
    - ``seed=0``: seeds the net's init, the batch (offset 10 000) and the random masks (offset 20 000).
    - ``group_size=8``: the paper's 8 responses per prompt (App. B). ``num_groups=4``: small, to keep the
      exact masked steps cheap (N ≈ 224 tokens); the toy has one prompt, so the groups are 4 independent
      groups of it.
    - ``lr=1.0``: plain SGD, no momentum (App. D.2: Adam's first step is sign descent and hides the per-token
      magnitudes). The paper's value is not recoverable from its text and is an LM's anyway; here, with
      token-mean coefficients |c| ≈ 1/N, lr = 1 moves log π by ~1e-2, in the regime where the kernel's
      first-order prediction holds (``first_order_gap`` reports how well).
    - ``objective="grpo"``, ``aggregation=None`` (its token-mean), ``adv_scale="group"``: the paper's GRPO with
      DAPO's token-level loss (App. B). On-policy, so the ratio is 1 and clipping is inactive.
    - ``candidates="all"``: every token (Table 1 does not restrict them); ``"positive"`` / ``"negative"``: only
      tokens of rollouts with A > 0 / A < 0. Tokens whose context allows one token are never candidates.
    - ``same_sign=False``: masks take tokens of either advantage sign (Table 1 lists only the Same and
      LowConf conditions); True: only tokens of the candidate's sign (``mask_sets``).
    - ``low_conf=0.5``: below it, a same-token pair's leading overlap 1 − π_j − π_k of eq. (8) is positive
      for sure (``mask_sets``'s default; the paper's threshold is not in its text).
    - ``orient_by_sign=False``: ME > 0 is a boost, as the paper defines it; True: ME·sign(A_j), i.e. the
      masked tokens pushed j the way its own advantage does (A_j = 0 candidates dropped).
    - ``update="full"``: all parameters (Table 1's Full column); ``"head"``: W_out only (LM-head column,
      App. D.1's "updating only the unembedding matrix").
    - ``ties="count"``: a candidate with ME = 0 exactly counts as not boosted (Table 1's Boost Rate is the
      fraction of candidates boosted); ``"drop"`` leaves them out (``summarise``).
    - ``candidate_filter="coupled"``: only candidates whose "both" set is non-empty, so the four rows count
      the same candidates and the random mask (as large as "both", ``mask_sets``'s default) is non-empty;
      ``"nonempty"``: per set, candidates whose mask is non-empty; ``"none"``: every candidate, an empty mask
      giving ME = 0 (counted as not boosted by ``boost_stats``).
    - ``context="prefix"``: one embedding per prefix-tree node, so equal token strings after different
      prefixes have different hidden states but one W_out row, as in an LM (None: the scenario's own
      contexts; ``template_task``'s are positions, a 280-parameter net).
    - ``init="random"``: the seeded LeCun-scaled net as is. Every prefix node has its own random embedding,
      so one token string has different confidences in different contexts (π(y) spreads over ~0.2–0.6), as
      in an LM. ``"scenario"`` fits the net to the scenario's initial policy (0.7/0.2/0.1 on template
      positions); then every context at one position has the same distribution, a token's confidence is
      the same wherever it occurs, and "same token" equals "both" by construction for every candidate
      whose "both" set is non-empty.
    - ``d_embed = d_hidden = 8``: a few hundred shared weights (W1, b1, W_out).

    Returns:
        ``summarise``'s dict plus ``scenario``, ``seed`` and ``expected_reward``.
    """
    batch = sample_batch(
        scenario, seed=seed, group_size=group_size, num_groups=num_groups, context=context,
        d_embed=d_embed, d_hidden=d_hidden, init=init, objective=objective, aggregation=aggregation,
        adv_scale=adv_scale,
    )  # fmt: skip
    m = measure(
        batch, lr=lr, same_sign=same_sign, low_conf=low_conf, candidate_filter=candidate_filter,
        updates=(update,), mask_seed=seed,
    )  # fmt: skip
    out = summarise(m, update=update, candidates=candidates, orient_by_sign=orient_by_sign, ties=ties)
    out.update(scenario=scenario, seed=seed, expected_reward=batch.policy.expected_reward(batch.params))
    return out


# ------------------------------------------------------------------------------------------------
# the grid of conventions


def _flat(row: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    for s in MASK_SETS:
        st = summary["sets"][s]
        row[f"n_{s}"] = st["n"]
        row[f"br_{s}"] = st["boost_rate"]
        row[f"mb_{s}"] = st["mean_boost"]
        row[f"fo_br_{s}"] = st["first_order_boost_rate"]
        row[f"tie_{s}"] = st["tie_rate"]
    sa = summary["sign_agreement"]
    row["proxy_vs_full_first"] = sa["proxy_first_vs_full_first"]
    row["proxy_vs_full_actual"] = sa["proxy_first_vs_full_actual"]
    row["head_vs_full_actual"] = sa["head_actual_vs_full_actual"]
    return row


def convention_grid(
    scenario: str = "template_task",
    *,
    seeds: Sequence[int] = (0, 1, 2),
    candidates: Sequence[str] = CANDIDATES,
    same_sign: Sequence[bool] = (False, True),
    orient_by_sign: Sequence[bool] = (False, True),
    updates: Sequence[str] = UPDATES,
    **fixed: Any,
) -> list[dict[str, Any]]:
    """Table 1 under every combination of the conventions given, one row per (convention, seed).

    One batch per seed and one ``measure`` per (seed, same_sign) serve every candidates × orient × update
    reading (they only select and orient the same masking effects). ``fixed`` goes to ``sample_batch``
    (group_size, num_groups, context, init, objective, ...), ``measure`` (lr, low_conf, candidate_filter)
    and ``summarise`` (ties) as in ``table1``.

    Returns:
        rows with keys scenario, seed, candidates, same_sign, orient_by_sign, update and per mask set
        ``n_<set>``, ``br_<set>`` (Boost Rate), ``mb_<set>`` (Mean Boost), ``fo_br_<set>`` (first-order
        Boost Rate), ``tie_<set>`` (fraction with ME = 0 exactly), plus the sign agreements ``proxy_vs_full_first``, ``proxy_vs_full_actual``,
        ``head_vs_full_actual``.
    """
    measure_keys = {"lr", "low_conf", "candidate_filter"}
    ties = fixed.pop("ties", "count")
    m_kw = {k: v for k, v in fixed.items() if k in measure_keys}
    b_kw = {k: v for k, v in fixed.items() if k not in measure_keys}
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        batch = sample_batch(scenario, seed=seed, **b_kw)
        for ss in same_sign:
            m = measure(batch, same_sign=ss, updates=tuple(updates), mask_seed=seed, **m_kw)
            for cand, orient, upd in product(candidates, orient_by_sign, updates):
                summary = summarise(m, update=upd, candidates=cand, orient_by_sign=orient, ties=ties)
                row = {"scenario": scenario, "seed": seed, "candidates": cand, "same_sign": ss,
                       "orient_by_sign": orient, "update": upd}  # fmt: skip
                rows.append(_flat(row, summary))
    return rows


CONVENTION_KEYS = ("candidates", "same_sign", "orient_by_sign", "update")


def paper_distance(boost_rates: dict[str, float], update: str) -> float:
    """Mean |Boost Rate − paper's| over the four sets, in percentage points (paper column by ``update``)."""
    ref = PAPER_BOOST_RATE[update]
    return sum(abs(100.0 * boost_rates[s] - 100.0 * ref[s]) for s in MASK_SETS) / len(MASK_SETS)


def closest_to_paper(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Average each convention's rows over seeds and rank the conventions by ``paper_distance``.

    A seed where a set has no candidate (NaN) is left out of that set's average. Returns one row per
    convention (the ``CONVENTION_KEYS``, ``seeds``, ``br_<set>`` seed means, ``n_<set>`` totals,
    ``distance_pp``), closest first; a convention with a set never measured gets distance NaN, ranked last.
    """
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in CONVENTION_KEYS), []).append(r)
    out = []
    for key, rs in groups.items():
        agg: dict[str, Any] = dict(zip(CONVENTION_KEYS, key, strict=True))
        agg["seeds"] = len(rs)
        rates = {}
        for s in MASK_SETS:
            vals = [r[f"br_{s}"] for r in rs if not math.isnan(r[f"br_{s}"])]
            rates[s] = sum(vals) / len(vals) if vals else math.nan
            agg[f"br_{s}"] = rates[s]
            agg[f"n_{s}"] = sum(r[f"n_{s}"] for r in rs)
        agg["distance_pp"] = paper_distance(rates, agg["update"])
        out.append(agg)
    return sorted(out, key=lambda r: (math.isnan(r["distance_pp"]), r["distance_pp"]))


#: columns ``format_table`` prints in percent (fractions in the rows)
RATE_PREFIXES = ("br_", "fo_br_", "tie_")
RATE_KEYS = frozenset(
    {"boost_rate", "paper_br", "first_order_boost_rate", "tie_rate", "proxy_vs_full_first",
     "proxy_vs_full_actual", "head_vs_full_actual"}
)  # fmt: skip
#: value-gap columns (``value_rows``): printed with four decimals, signed except the SEs
VALUE_KEYS = frozenset({"gap", "gap_se", "gap_top", "gap_top_se", "boosted", "suppressed"})


def _fmt(key: str, v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        if key.startswith(RATE_PREFIXES) or key in RATE_KEYS:
            return f"{100.0 * v:.1f}"
        if key.startswith("mb_") or key in ("mean_boost", "first_order_mean_boost"):
            return f"{v:.2e}"
        if key in VALUE_KEYS:
            return f"{v:.4f}" if key.endswith("_se") else f"{v:+.4f}"
        return f"{v:.2f}"
    return str(v)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A markdown table of ``rows`` (columns: the keys of the first row, or ``columns``).

    Rates (``RATE_KEYS``, keys starting with ``RATE_PREFIXES``) print in percent with one decimal, Mean
    Boosts (``mb_*``, ``mean_boost``) in scientific notation, values and value gaps (``VALUE_KEYS``) with
    four decimals, other floats with two decimals, NaN as "–".
    """
    if not rows:
        return "(no rows)"
    cols = list(columns) if columns is not None else list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(c, r.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)


def table_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """``table1``'s result as Table 1's four rows (for ``format_table``), with the paper's Boost Rate beside."""
    ref = PAPER_BOOST_RATE[result["update"]]
    return [
        {
            "mask": s,
            "n": st["n"],
            "boost_rate": st["boost_rate"],
            "paper_br": ref[s],
            "mean_boost": st["mean_boost"],
            "first_order_boost_rate": st["first_order_boost_rate"],
            "first_order_gap_pp": 100.0 * st["first_order_gap"],
            "tie_rate": st["tie_rate"],
            "mask_size": st["mean_mask_size"],
        }
        for s, st in result["sets"].items()
    ]


# ------------------------------------------------------------------------------------------------
# the value gap (Sec. 3 "Cancellation favors tokens with higher value", App. E.2; Fig. 5, 6, 11)

#: how ``value_gap_study`` repeats updates on one fixed batch (Fig. 11), see its docstring
REPEAT_MODES = ("recompute", "fixed")
#: Fig. 5(b)'s entropy fractions: the top 10%, 20%, ..., 100% highest-entropy tokens
TOP_FRACS = tuple(k / 10 for k in range(1, 11))
#: the rollout subsets of Fig. 5(a): every token, tokens of rollouts with A > 0, with A < 0
VALUE_SUBSETS = ("all", "positive", "negative")
#: the scenarios ``main`` prints the value gap of: the default one and one with a choice at every step
VALUE_SCENARIOS = ("template_task", "shared_prefix")


def batch_token_values(batch: Batch, params: list[Tensor] | None = None) -> Tensor:
    """(N,) the exact counterfactual value (App. E.2 eq. 20) of the batch's N flattened tokens.

    Row-major over ``batch.mask``, the order of ``batch.tokens``. The trajectory distribution is the net's
    under ``params`` (default ``batch.params``, the policy that sampled the batch), enumerated over the
    support (``toymodel.values.exact_token_values``); a forced token (its prefix has one continuation) is NaN.
    """
    theta = batch.params if params is None else params
    with torch.no_grad():
        traj_probs = batch.policy.probs([p.detach() for p in theta])
    return exact_token_values(batch.policy, traj_probs, batch.idx).value[batch.mask.bool()]


def token_entropy(batch: Batch) -> Tensor:
    """(N,) the entropy (nats) of each token's next-token distribution π_j (``batch.probs``), 0·log 0 = 0."""
    p = batch.probs.detach()
    logp = torch.where(p > 0, p.log(), torch.zeros_like(p))
    return -(p * logp).sum(-1)


def _stats(xs: Sequence[float]) -> dict[str, float]:
    """Mean and standard error (sample std / √n) of the non-NaN ``xs``, and their count n."""
    v = [float(x) for x in xs if not math.isnan(float(x))]
    n = len(v)
    if not n:
        return {"mean": math.nan, "se": math.nan, "n": 0}
    mean = sum(v) / n
    se = math.sqrt(sum((x - mean) ** 2 for x in v) / (n - 1) / n) if n > 1 else math.nan
    return {"mean": mean, "se": se, "n": n}


def _subset_gaps(values: Tensor, delta: Tensor, adv_tok: Tensor) -> dict[str, ValueGap]:
    """Fig. 5(a): ``value_gap`` over every token and over the tokens of positive / negative rollouts."""
    sel = {
        "all": torch.ones_like(adv_tok, dtype=torch.bool),
        "positive": adv_tok > 0,
        "negative": adv_tok < 0,
    }
    return {k: value_gap(values[m], delta[m]) for k, m in sel.items()}


def seed_value_gaps(
    batch: Batch,
    *,
    lr: float = 1.0,
    top_fracs: Sequence[float] = TOP_FRACS,
    n_steps: int = 5,
    repeat: str = "recompute",
    budget_top_frac: float = 0.25,
    objective: str = "grpo",
    aggregation: str | None = None,
) -> dict[str, Any]:
    """Every value gap of one batch (``value_gap_study`` averages these over seeds).

    Values and entropies are those of the batch's (start) policy; Δ log π is measured on the batch's own
    tokens. Returns ``{"fig5a": {subset: ValueGap}, "self_only": ValueGap, "fig5b": {top_frac: ValueGap}, "fig11": [ValueGap of
    steps 1..n_steps], "budget": (gap of every token, gap on the top ``budget_top_frac`` by entropy)}``.
    ``lr``, ``n_steps``, ``repeat``: as in ``value_gap_study``; ``objective`` and ``aggregation`` recompute the
    coefficients under ``repeat="recompute"`` and must be those the batch was built with.
    """
    if repeat not in REPEAT_MODES:
        raise ValueError(f"unknown repeat {repeat!r}; valid: {', '.join(REPEAT_MODES)}")
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
        raise ValueError(f"`n_steps` must be a positive int, got {n_steps!r}")
    values = batch_token_values(batch)
    entropy = token_entropy(batch)
    base = batch.logp.detach()
    valid = batch.mask.bool()
    kw: dict[str, Any] = {} if aggregation is None else {"aggregation": aggregation}
    with torch.no_grad():
        old_bt = batch.policy.token_logp([p.detach() for p in batch.params], batch.idx)

    def coef_at(n: int, logp: Tensor) -> Tensor:
        if repeat == "fixed" or n == 0:
            return batch.coef  # on-policy (ratio 1): the first step of either mode
        cur_bt = torch.zeros_like(old_bt)
        cur_bt[valid] = logp
        # the GRPO surrogate at the current policy, ratio to the batch's old log-probs (clipping applies)
        return coefficients(
            objective, cur_bt, old_bt, batch.advantages, batch.mask, batch.group, with_metrics=False, **kw
        ).coef[valid]

    logps = repeated_sgd(batch.logp_of, batch.params, coef_at, lr, n_steps)
    # Fig. 11: boosted / suppressed by the cumulative Δ log π since the start policy
    steps = [value_gap(values, logp - base) for logp in logps]
    delta1 = logps[0] - base
    return {
        "fig5a": _subset_gaps(values, delta1, batch.adv_tok),
        # the no-coupling control: each token moved by its own term lr·c_j·K_jj alone (K_jj > 0), so boosted
        # = the tokens of positive rollouts; the gap above it is what coupling (cancellation) adds
        "self_only": value_gap(values, batch.coef),
        "fig5b": {float(k): value_gap(values, delta1, entropy, k) for k in top_fracs},
        "fig11": steps,
        "budget": (steps[0], value_gap(values, delta1, entropy, budget_top_frac)),
    }


def value_gap_study(
    scenario: str = "template_task",
    *,
    seeds: Sequence[int] = tuple(range(8)),
    group_size: int = 8,
    num_groups: int = 4,
    lr: float = 1.0,
    top_fracs: Sequence[float] = TOP_FRACS,
    n_steps: int = 5,
    repeat: str = "recompute",
    budget_group_sizes: Sequence[int] = (2, 4, 8, 16),
    budget_num_groups: Sequence[int] = (1, 2, 4, 8),
    budget_top_frac: float = 0.25,
    objective: str = "grpo",
    aggregation: str | None = None,
    context: str | None = "prefix",
    init: str = "random",
    d_embed: int = 8,
    d_hidden: int = 8,
    quick: bool = False,
) -> dict[str, Any]:
    """Fig. 5, 11 and 6 of arXiv 2605.08666 on the neural toy: do GRPO-boosted tokens have higher value?

    Per seed one on-policy batch (``sample_batch``: the seeded net, ``num_groups`` groups of ``group_size``),
    the exact counterfactual value of each token at the batch's policy (``batch_token_values``, App. E.2
    eq. 20), the entropy of its next-token distribution (``token_entropy``), and the GRPO step(s) on the
    batch with all parameters (``cancellation.coupling.sgd_step``, θ' = θ + lr·Σ_k c_k g_k, the Full update).
    Every gap is ``cancellation.coupling.value_gap`` (mean value of boosted minus suppressed tokens,
    boosted: Δ log π > 0). Each setting's gap is averaged over ``seeds`` (a seed whose gap is NaN, e.g. no
    suppressed token, is left out) and reported as mean, SE (sample std / √n) and n.

    - Fig. 5(a): after one step, over every token and over the tokens of positive / negative rollouts
      (the paper: boosted > suppressed "regardless of whether they originate from positive or negative
      rollouts"). The paper samples equal numbers of boosted and suppressed tokens and estimates values by
      Monte Carlo; here every token is used and the values are exact.
    - The no-coupling control (``self_only``, ours): the gap when each token moves by its own term
      lr·c_j·K_jj alone, i.e. boosted = the tokens of positive rollouts; ``coupling_adds`` = the Fig. 5(a)
      gap minus it, paired by seed: what the coupling between tokens (cancellation) adds to the gap.
    - Fig. 5(b): the same step, the gap on the ⌈k·N⌉ highest-entropy tokens for k in ``top_fracs``.
    - Fig. 11: ``n_steps`` repeated updates on the same fixed batch. Our reading (the text does not say):
      boosted / suppressed by the sign of the *cumulative* Δ log π since the start policy, values at the
      START policy (the batch's tokens keep the value they had when sampled). ``repeat="recompute"``
      (default): advantages fixed, the coefficients recomputed at the current policy by
      ``cancellation.update.coefficients`` (ratio to the batch's old log-probs, so GRPO's clipping applies
      once a ratio leaves [1 − ε, 1 + ε]), as PPO-style epochs over one batch do; ``"fixed"``: plain SGD
      with the first step's coefficients held fixed (J = Σ c_k log π linear, no clipping).
    - Fig. 6: the one-step gap (every token, and the top ``budget_top_frac`` by entropy: our reading of
      the paper's "top-25%" subset) vs the sampling budget, ``group_size`` over ``budget_group_sizes`` at
      ``num_groups`` fixed and ``num_groups`` over ``budget_num_groups`` at ``group_size`` fixed.

    Defaults: ``lr=1.0`` and the net's conventions as ``table1`` (its docstring gives the reasons); 8 seeds,
    5 repeated steps and budgets up to 16 × 4 and 8 × 8 rollouts keep one study at a few seconds.
    ``quick=True``: a smoke-test slice of the same study: the first 3 seeds, at most 3 repeated steps, and
    only the first and last value of each budget axis.

    Returns:
        ``{"scenario", "seeds", "group_size", "num_groups", "lr", "repeat", "n_steps", "budget_top_frac",
        "fig5a": {subset: {"gap"|"boosted"|"suppressed": {mean, se, n}}}, "fig5b": {top_frac: {mean, se,
        n}}, "fig11": {step: {mean, se, n}}, "fig6": [{axis, group_size, num_groups, gap: {...}, gap_top:
        {...}}], "per_seed": {seed: ``seed_value_gaps``'s dict}}``.
    """
    if repeat not in REPEAT_MODES:
        raise ValueError(f"unknown repeat {repeat!r}; valid: {', '.join(REPEAT_MODES)}")
    seeds = tuple(int(s) for s in seeds)
    if not seeds:
        raise ValueError("`seeds` is empty: pass at least one seed")
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
        raise ValueError(f"`n_steps` must be a positive int, got {n_steps!r}")
    if quick:
        seeds, n_steps = seeds[:3], min(n_steps, 3)
        budget_group_sizes = tuple(dict.fromkeys(budget_group_sizes[:1] + budget_group_sizes[-1:]))
        budget_num_groups = tuple(dict.fromkeys(budget_num_groups[:1] + budget_num_groups[-1:]))
    b_kw: dict[str, Any] = dict(
        context=context, init=init, d_embed=d_embed, d_hidden=d_hidden, objective=objective,
        aggregation=aggregation,
    )  # fmt: skip
    g_kw: dict[str, Any] = dict(
        lr=lr, top_fracs=top_fracs, n_steps=n_steps, repeat=repeat, budget_top_frac=budget_top_frac,
        objective=objective, aggregation=aggregation,
    )  # fmt: skip
    per_seed = {
        seed: seed_value_gaps(
            sample_batch(scenario, seed=seed, group_size=group_size, num_groups=num_groups, **b_kw), **g_kw
        )
        for seed in seeds
    }
    fig5a = {
        sub: {
            key: _stats([getattr(r["fig5a"][sub], key) for r in per_seed.values()])
            for key in ("gap", "boosted", "suppressed")
        }
        for sub in VALUE_SUBSETS
    }
    self_only = _stats([r["self_only"].gap for r in per_seed.values()])
    coupling_adds = _stats([r["fig5a"]["all"].gap - r["self_only"].gap for r in per_seed.values()])
    fig5b = {float(k): _stats([r["fig5b"][float(k)].gap for r in per_seed.values()]) for k in top_fracs}
    fig11 = {n + 1: _stats([r["fig11"][n].gap for r in per_seed.values()]) for n in range(n_steps)}

    # Fig. 6: one step per (budget, seed); only the first step and the budget's top-k are needed
    one = {**g_kw, "n_steps": 1, "top_fracs": ()}
    fig6 = []
    for axis, gs_ng in (
        ("group_size", [(g, num_groups) for g in budget_group_sizes]),
        ("num_groups", [(group_size, m) for m in budget_num_groups]),
    ):
        for gs, ng in gs_ng:
            if (gs, ng) == (group_size, num_groups):
                gaps = [r["budget"] for r in per_seed.values()]
            else:
                gaps = [
                    seed_value_gaps(
                        sample_batch(scenario, seed=seed, group_size=gs, num_groups=ng, **b_kw), **one
                    )["budget"]
                    for seed in seeds
                ]
            fig6.append(
                {"axis": axis, "group_size": gs, "num_groups": ng, "gap": _stats([g[0].gap for g in gaps]),
                 "gap_top": _stats([g[1].gap for g in gaps])}
            )  # fmt: skip
    return {
        "scenario": scenario, "seeds": seeds, "group_size": group_size, "num_groups": num_groups,
        "lr": float(lr), "repeat": repeat, "n_steps": n_steps, "budget_top_frac": float(budget_top_frac),
        "fig5a": fig5a, "self_only": self_only, "coupling_adds": coupling_adds, "fig5b": fig5b,
        "fig11": fig11, "fig6": fig6, "per_seed": per_seed,
    }  # fmt: skip


def value_rows(result: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """``value_gap_study``'s result as four tables of rows for ``format_table``: fig5a, fig5b, fig11, fig6.

    Each row has ``gap`` (seed mean), ``gap_se`` and ``seeds`` (the seeds averaged); Fig. 5(a) adds the mean
    ``boosted`` and ``suppressed`` values, Fig. 6 the gap on the top-k by entropy (``gap_top``, ``gap_top_se``).
    """

    def cols(prefix: str, st: dict[str, float]) -> dict[str, Any]:
        return {prefix: st["mean"], f"{prefix}_se": st["se"]}

    fig5a = [
        {"rollouts": sub, **cols("gap", st["gap"]), "boosted": st["boosted"]["mean"],
         "suppressed": st["suppressed"]["mean"], "seeds": st["gap"]["n"]}
        for sub, st in result["fig5a"].items()
    ]  # fmt: skip
    if "self_only" in result:
        fig5a.append({"rollouts": "all, self-only control", **cols("gap", result["self_only"]),
                      "boosted": math.nan, "suppressed": math.nan, "seeds": result["self_only"]["n"]})  # fmt: skip
        fig5a.append({"rollouts": "all, what coupling adds", **cols("gap", result["coupling_adds"]),
                      "boosted": math.nan, "suppressed": math.nan, "seeds": result["coupling_adds"]["n"]})  # fmt: skip
    fig5b = [
        {"top_frac": f"{100.0 * float(k):.0f}%", **cols("gap", st), "seeds": st["n"]}
        for k, st in result["fig5b"].items()
    ]
    fig11 = [{"steps": n, **cols("gap", st), "seeds": st["n"]} for n, st in result["fig11"].items()]
    fig6 = [
        {"axis": r["axis"], "group_size": r["group_size"], "num_groups": r["num_groups"],
         **cols("gap", r["gap"]), **cols("gap_top", r["gap_top"]), "seeds": r["gap"]["n"]}
        for r in result["fig6"]
    ]  # fmt: skip
    return {"fig5a": fig5a, "fig5b": fig5b, "fig11": fig11, "fig6": fig6}


def format_value_tables(result: dict[str, Any]) -> str:
    """The four value-gap tables of ``value_gap_study``'s result as markdown, with headings."""
    rows = value_rows(result)
    head = (
        f"{result['scenario']}, seeds {result['seeds'][0]}-{result['seeds'][-1]} ({len(result['seeds'])}), "
        f"{result['group_size']} × {result['num_groups']} rollouts, lr {result['lr']:g}"
    )
    top = f"{100.0 * result['budget_top_frac']:.0f}%"
    return "\n\n".join(
        [
            f"#### Fig. 5(a): value of boosted − suppressed tokens after one GRPO step ({head})",
            format_table(rows["fig5a"]),
            "#### Fig. 5(b): the gap on the top-k% highest-entropy tokens",
            format_table(rows["fig5b"]),
            f"#### Fig. 11: the gap after n repeated steps on the fixed batch (repeat={result['repeat']}; "
            "cumulative Δ log π, values at the start policy)",
            format_table(rows["fig11"]),
            f"#### Fig. 6: the gap vs sampling budget (gap_top: top {top} by entropy)",
            format_table(rows["fig6"]),
        ]
    )


__all__ = [
    "CANDIDATES",
    "CANDIDATE_FILTERS",
    "CONVENTION_KEYS",
    "MASK_SETS",
    "PAPER_BOOST_RATE",
    "REPEAT_MODES",
    "TOP_FRACS",
    "UPDATES",
    "VALUE_KEYS",
    "VALUE_SCENARIOS",
    "VALUE_SUBSETS",
    "Batch",
    "Measurement",
    "batch_token_values",
    "candidate_mask",
    "closest_to_paper",
    "convention_grid",
    "format_table",
    "format_value_tables",
    "make_batch",
    "measure",
    "paper_distance",
    "sample_batch",
    "seed_value_gaps",
    "summarise",
    "table1",
    "table_rows",
    "token_entropy",
    "value_gap_study",
    "value_rows",
]
