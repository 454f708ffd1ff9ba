"""The update loop ``simulate`` runs (``cancellation.update``), tested through the real loop.

- DFPO's invariant (DFPO eq. 18, 68): with the paper's stop-gradient estimator every trajectory gets
  the coefficient s̃_i·Â_i on ∇log s_i, and Σ_i Â_i s̃_i = 0 for every transform, so the net coefficient
  of each group, Σ_i c_i, is 0 for any lengths (``sequence_net_residual``), and a token that every
  completion of an equal-length group shares cancels (``group_shared_residual``): on every updated row,
  at GSPO's clip range (most sequences clipped after the first optimiser step), with 4 inner epochs,
  4 groups and 2 query-preserved mini-batches. The controls show the meters can see a leak: GRPO's
  token-mean with unequal lengths, and DFPO's trust-region variant (``estimator="ppo_clip"``) whose
  clipped sequences get no gradient.
- Lopti as the public code runs it: two stages with the advantages zeroed outside each stage's token
  set (mask, normaliser and sequence ratio unchanged), replayed by hand with autograd.
"""

from __future__ import annotations

import math

import pytest
import torch

from cancellation import TRANSFORMS, compute_loss, group_advantages
from toymodel import simulate
from toymodel.scenarios import get_scenario

from .sampling import draw

#: Every comparison here is between two float64 computations of the same number, at a tolerance well above
#: float64's rounding (the real loop vs the same update by hand): ``tests/exactness.py``.
pytestmark = pytest.mark.exactness

#: the configuration under test: GSPO's default ε, several optimiser steps per batch, query batching
LOOP = dict(steps=30, inner_epochs=4, num_groups=4, num_minibatches=2, batching="query", seed=0)

#: the transforms of DFPO App. B (the project's registry must hold exactly these four)
FOUR = ("min_replace", "orth_proj", "orth_proj_pos", "truncate_rebalance")


def measured(rows: list[dict[str, float]], key: str) -> list[float]:
    """The values of ``key`` on the rows that updated and had something to measure."""
    return [r[key] for r in rows if r["updated"] == 1.0 and not math.isnan(r[key])]


def test_the_four_transforms_are_the_registry() -> None:
    assert set(FOUR) == set(TRANSFORMS)


@pytest.mark.parametrize("transform", FOUR)
@pytest.mark.parametrize("scenario", ["template_task", "shared_prefix"])
def test_dfpo_cancels_through_the_real_loop_under_clipping(scenario: str, transform: str) -> None:
    policy = get_scenario(scenario).policy()
    lengths = policy.mask.sum(-1)
    assert bool((lengths == lengths[0]).all())  # equal lengths: whole-group shared tokens must cancel
    # 60 steps: on shared_prefix a whole group shares an event on only 1-12 of 30 steps (seeds 0-3;
    # seed 0: 5-6 with the per-position draws), 12-13 of 60 on seed 0
    rows = simulate(scenario, "dfpo", transform=transform, **{**LOOP, "steps": 60})
    seq = measured(rows, "sequence_net_residual")
    grp = measured(rows, "group_shared_residual")
    # not vacuous: many steps updated with a signal, and whole-group shared events occurred
    assert len(seq) >= 20 and len(grp) >= 10
    assert max(seq) <= 1e-6
    assert max(grp) <= 1e-6
    # clipping acted: at the last optimiser step of a step, sequences were outside GSPO's band
    assert max(r["clip/frac"] for r in rows if r["updated"] == 1.0) > 0.5


@pytest.mark.parametrize("transform", FOUR)
def test_dfpo_sequence_net_is_zero_with_unequal_lengths(transform: str) -> None:
    lengths = get_scenario("equivalent_solutions").policy().mask.sum(-1)
    assert len(set(lengths.tolist())) > 1
    rows = simulate("equivalent_solutions", "dfpo", transform=transform, **LOOP)
    seq = measured(rows, "sequence_net_residual")
    assert len(seq) >= 10 and max(seq) <= 1e-6
    assert max(r["clip/frac"] for r in rows if r["updated"] == 1.0) > 0.5


def test_grpo_token_mean_with_unequal_lengths_leaves_a_sequence_net() -> None:
    """Token-mean gives c_i ≈ Â_i·|y_i|/N, and Σ_i Â_i·|y_i| ≠ 0 when lengths differ (5, 5, 6 here)."""
    rows = simulate("equivalent_solutions", "grpo", aggregation="token-mean", **LOOP)
    seq = measured(rows, "sequence_net_residual")
    assert len(seq) >= 10
    assert min(seq) > 1e-3 and max(seq) > 0.05


def test_dfpo_trust_region_variant_leaks_on_whole_group_tokens() -> None:
    """``estimator="ppo_clip"``: a clipped sequence gets no gradient, so Σ_i Â_i s̃_i = 0 no longer holds
    on the gradient; the paper's estimator removes exactly that leak (same runs, same seed)."""
    leak = measured(simulate("template_task", "dfpo", estimator="ppo_clip", **LOOP), "group_shared_residual")
    paper = measured(simulate("template_task", "dfpo", **LOOP), "group_shared_residual")
    assert max(leak) > 0.1
    assert max(paper) <= 1e-6


# ---------------------------------------------------------------------------------------------
# Lopti


def _lopti_by_hand(objective: str, params: dict, *, swap_mask: bool = False, **kw) -> torch.Tensor:
    """One simulator step of Lopti by hand (the same generator draws, autograd, plain SGD).

    ``swap_mask=False``: the public Lopti code (advantages zeroed outside the stage's tokens); True:
    the stage's token set used as the loss mask instead (a different update: normaliser and sequence
    ratio over the stage's tokens only), to show that the comparison tells the two apart.
    """
    sc = get_scenario("template_task")
    policy = sc.policy()
    init = sc.initial_logits()
    n = kw["num_groups"] * kw["group_size"]
    gen = torch.Generator().manual_seed(kw["seed"])
    idx = draw(policy, init, n, gen)
    group = torch.arange(kw["num_groups"]).repeat_interleave(kw["group_size"])
    adv = group_advantages(policy.rewards[idx], group)
    mask = policy.mask[idx]
    old_logp = policy.token_logp(init, idx)
    low = (old_logp.exp() < kw["lopti_eta"]) & mask.bool()
    high = mask.bool() & ~low
    assert bool(low.any()) and bool(high.any())  # both stages run
    z = init.clone()
    for stage in (low, high):  # low-probability tokens first
        stage_adv = adv[:, None] * stage
        m = stage.to(mask.dtype) if swap_mask else mask
        for _ in range(kw["inner_epochs"]):
            leaf = z.clone().requires_grad_(True)
            logp = policy.token_logp(leaf, idx) * m
            loss, _ = compute_loss(objective, logp, old_logp * m, stage_adv, m, group, **params)
            (g,) = torch.autograd.grad(loss, leaf)
            z = z - kw["lr"] * torch.where(policy.valid, g, torch.zeros_like(g))
    return z


@pytest.mark.parametrize(
    ("objective", "params"),
    [("grpo", {}), ("gspo", {"epsilon_low": 0.5, "epsilon_high": 0.5})],  # gspo: a band that lets it move
)
def test_lopti_is_two_stages_of_zeroed_advantages(objective: str, params: dict) -> None:
    kw = dict(num_groups=2, group_size=6, inner_epochs=2, lr=0.7, seed=5, lopti_eta=0.4)
    got: list[torch.Tensor] = []
    simulate("template_task", objective, steps=1, callback=lambda s, z: got.append(z), **kw, **params)
    sc = get_scenario("template_task")
    valid = sc.policy().valid
    want = _lopti_by_hand(objective, params, **kw)
    assert torch.allclose(got[0][valid], want[valid], atol=1e-12, rtol=0)
    assert float((got[0] - sc.initial_logits())[valid].abs().max()) > 1e-3  # it did move
    swapped = _lopti_by_hand(objective, params, swap_mask=True, **kw)
    assert float((swapped - got[0])[valid].abs().max()) > 1e-6
