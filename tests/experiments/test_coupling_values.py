"""instruments.coupling's value gap (arXiv 2605.08666 Sec. 3, App. E.2; Fig. 5, 6, 11), recomputed by hand.

Independent references: the SGD step applied by hand (copy θ, add lr·∇_θ Σ_k c_k log π(y_k), recompute
log π with the model); boosted / suppressed split by a plain loop over the tokens; the top-k by entropy by
a plain sort; token entropies by a plain loop. Every assertion is an identity or a property every correct
run has (never what one sampled batch happened to give): the sign test uses a batch built by hand, where
the sign is certain.
"""

from __future__ import annotations

import math

import pytest
import torch

from instruments.coupling import (
    Batch,
    batch_token_values,
    format_value_tables,
    make_batch,
    sample_batch,
    seed_value_gaps,
    token_entropy,
    value_gap_study,
    value_rows,
)
from toymodel.neural import NeuralPolicy
from toymodel.values import exact_token_values

# exactness: the library's value gaps against a hand step and plain loops, in float64 (the neural toy) at 1e-12;
# a Δ within 1e-10 of 0 (its side of the split is rounding) skips (``_skip_if_near_zero``)
pytestmark = pytest.mark.exactness

SMALL = {"group_size": 4, "num_groups": 2}


def hand_step(batch: Batch, theta: list[torch.Tensor], coef: torch.Tensor, lr: float) -> list[torch.Tensor]:
    """θ + lr·∇_θ Σ_k c_k log π_θ(y_k), by one autograd call."""
    th = [p.detach().clone().requires_grad_(True) for p in theta]
    logp = batch.policy.token_logp(th, batch.idx)[batch.mask.bool()]
    grads = torch.autograd.grad((coef.detach() * logp).sum(), th)
    return [(p + lr * g).detach() for p, g in zip(th, grads, strict=True)]


def hand_logp(batch: Batch, theta: list[torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return batch.policy.token_logp(theta, batch.idx)[batch.mask.bool()]


def plain_gap(values: list[float], delta: list[float], keep: list[bool] | None = None) -> float:
    """Mean value of tokens with Δ > 0 minus that of tokens with Δ < 0 (NaN values skipped), by a loop."""
    up, down = [], []
    for j, (v, d) in enumerate(zip(values, delta, strict=True)):
        if math.isnan(v) or (keep is not None and not keep[j]):
            continue
        if d > 0:
            up.append(v)
        elif d < 0:
            down.append(v)
    if not up or not down:
        return math.nan
    return sum(up) / len(up) - sum(down) / len(down)


def _skip_if_near_zero(values: torch.Tensor, delta: torch.Tensor) -> None:
    """A Δ within rounding of 0 could take either sign on another code path: such a batch proves nothing."""
    valued = ~torch.isnan(values)
    if bool((delta[valued].abs() < 1e-10).any()):
        pytest.skip("a valued token has |Δ log π| < 1e-10: its side of the split is rounding")


@pytest.mark.parametrize("scenario", ["template_task", "shared_prefix"])
def test_batch_token_values_is_exact_token_values_flattened(scenario: str) -> None:
    batch = sample_batch(scenario, seed=3, **SMALL)
    m = batch.mask.bool()
    with torch.no_grad():
        probs = batch.policy.probs(batch.params)
    want = exact_token_values(batch.policy, probs, batch.idx).value[m]
    got = batch_token_values(batch)
    assert got.shape == batch.tokens.shape and got.dtype == torch.float64
    torch.testing.assert_close(got, want, equal_nan=True, atol=0, rtol=0)
    # under other parameters: the values of those parameters' trajectory distribution
    other = batch.policy.init_params(99)
    with torch.no_grad():
        probs2 = batch.policy.probs(other)
    want2 = exact_token_values(batch.policy, probs2, batch.idx).value[m]
    torch.testing.assert_close(batch_token_values(batch, other), want2, equal_nan=True, atol=0, rtol=0)
    # row-major over the mask: token j's value is that of its (row, step)
    rows, steps = torch.nonzero(m, as_tuple=True)
    full = exact_token_values(batch.policy, probs, batch.idx).value
    torch.testing.assert_close(got, full[rows, steps], equal_nan=True, atol=0, rtol=0)


def test_token_entropy_by_a_loop() -> None:
    batch = sample_batch("template_task", seed=1, **SMALL)
    h = token_entropy(batch)
    for j in range(batch.probs.shape[0]):
        want = -sum(float(p) * math.log(float(p)) for p in batch.probs[j] if float(p) > 0)
        assert float(h[j]) == pytest.approx(want, abs=1e-12)
    assert bool((h[batch.forced] == 0).all())


@pytest.mark.parametrize("scenario", ["template_task", "shared_prefix"])
def test_seed_gap_equals_a_plain_recomputation(scenario: str) -> None:
    seed, lr = 2, 1.0
    res = value_gap_study(
        scenario, seeds=(seed,), lr=lr, n_steps=2, repeat="fixed", budget_group_sizes=(),
        budget_num_groups=(), **SMALL,
    )  # fmt: skip
    per = res["per_seed"][seed]
    batch = sample_batch(scenario, seed=seed, **SMALL)
    values = batch_token_values(batch)
    theta1 = hand_step(batch, batch.params, batch.coef, lr)
    delta = hand_logp(batch, theta1) - batch.logp
    _skip_if_near_zero(values, delta)
    v, d = values.tolist(), delta.tolist()
    adv = batch.adv_tok.tolist()
    assert per["fig5a"]["all"].gap == pytest.approx(plain_gap(v, d), abs=1e-12, nan_ok=True)
    assert per["fig5a"]["positive"].gap == pytest.approx(
        plain_gap(v, d, [a > 0 for a in adv]), abs=1e-12, nan_ok=True
    )
    assert per["fig5a"]["negative"].gap == pytest.approx(
        plain_gap(v, d, [a < 0 for a in adv]), abs=1e-12, nan_ok=True
    )
    # the no-coupling control: boosted = tokens of positive rollouts, suppressed = of negative ones
    assert per["self_only"].gap == pytest.approx(
        plain_gap(v, [1.0 if a > 0 else (-1.0 if a < 0 else 0.0) for a in adv]), abs=1e-12, nan_ok=True
    )
    # Fig. 5(b) at 40%: the ⌈0.4·N⌉ largest entropies, ties by position, by a plain sort
    ent = token_entropy(batch).tolist()
    n = len(ent)
    order = sorted(range(n), key=lambda j: (-ent[j], j))[: math.ceil(0.4 * n)]
    keep = [j in set(order) for j in range(n)]
    assert per["fig5b"][0.4].gap == pytest.approx(plain_gap(v, d, keep), abs=1e-12, nan_ok=True)
    # Fig. 11, fixed coefficients: two hand steps with the same c, split by the cumulative Δ
    theta2 = hand_step(batch, theta1, batch.coef, lr)
    delta2 = hand_logp(batch, theta2) - batch.logp
    _skip_if_near_zero(values, delta2)
    assert per["fig11"][1].gap == pytest.approx(plain_gap(v, delta2.tolist()), abs=1e-12, nan_ok=True)
    assert per["fig11"][0].gap == per["fig5a"]["all"].gap
    # the study's seed mean of one seed is that seed's gap, with no SE
    assert res["fig5a"]["all"]["gap"]["mean"] == per["fig5a"]["all"].gap
    assert res["coupling_adds"]["mean"] == pytest.approx(per["fig5a"]["all"].gap - per["self_only"].gap)
    assert math.isnan(res["fig5a"]["all"]["gap"]["se"])


def test_recompute_mode_steps_with_the_clipped_surrogate_at_the_current_policy() -> None:
    """Step 2 of ``repeat="recompute"``: coefficients of GRPO at θ1 (ratio to θ0), applied by hand."""
    from cancellation.update import coefficients

    seed, lr = 4, 30.0  # a large step, so some ratios leave the clip range on step 2
    batch = sample_batch("shared_prefix", seed=seed, **SMALL)
    per = seed_value_gaps(batch, lr=lr, n_steps=2, repeat="recompute")
    values = batch_token_values(batch)
    theta1 = hand_step(batch, batch.params, batch.coef, lr)
    with torch.no_grad():
        old = batch.policy.token_logp(batch.params, batch.idx)
        cur = batch.policy.token_logp(theta1, batch.idx)
    m = batch.mask.bool()
    coef2 = coefficients(
        "grpo", cur, old, batch.advantages, batch.mask, batch.group, with_metrics=False
    ).coef[m]
    theta2 = hand_step(batch, theta1, coef2, lr)
    delta2 = hand_logp(batch, theta2) - batch.logp
    _skip_if_near_zero(values, delta2)
    assert per["fig11"][1].gap == pytest.approx(
        plain_gap(values.tolist(), delta2.tolist()), abs=1e-12, nan_ok=True
    )


def test_study_properties_every_run_has() -> None:
    seeds = (0, 1, 2)
    res = value_gap_study(
        "template_task", seeds=seeds, n_steps=2, budget_group_sizes=(2, 4), budget_num_groups=(1, 2),
        **SMALL,
    )  # fmt: skip
    for seed in seeds:
        per = res["per_seed"][seed]
        # the top-k sweep at k = 100% is the all-token gap
        assert per["fig5b"][1.0] == per["fig5a"]["all"]
        assert per["fig11"][0] == per["fig5a"]["all"]
        assert per["budget"][0] == per["fig5a"]["all"]
        # positive- and negative-rollout tokens partition the tokens with A ≠ 0
        a, p, n = (per["fig5a"][k] for k in ("all", "positive", "negative"))
        assert p.n_boosted + n.n_boosted <= a.n_boosted and p.n_suppressed + n.n_suppressed <= a.n_suppressed
        # a top-k subset never counts more tokens than the whole batch
        for k, g in per["fig5b"].items():
            assert g.n_boosted <= a.n_boosted and g.n_suppressed <= a.n_suppressed, k
    for k, st in res["fig5b"].items():
        gaps = [res["per_seed"][s]["fig5b"][k].gap for s in seeds]
        ok = [g for g in gaps if not math.isnan(g)]
        assert st["n"] == len(ok)
        if ok:
            assert st["mean"] == pytest.approx(sum(ok) / len(ok), abs=1e-15)
    # the budget row of the default setting reuses the seeds' own batches
    row = next(r for r in res["fig6"] if r["axis"] == "group_size" and r["group_size"] == SMALL["group_size"])
    assert row["gap"] == res["fig5a"]["all"]["gap"]
    rows = value_rows(res)
    assert [r["top_frac"] for r in rows["fig5b"]] == [f"{10 * k}%" for k in range(1, 11)]
    assert len(rows["fig11"]) == 2 and len(rows["fig6"]) == 4
    text = format_value_tables(res)
    assert "Fig. 5(a)" in text and "Fig. 11" in text and "Fig. 6" in text


@pytest.mark.parametrize("init_seed", [0, 1, 2, 3, 4])
def test_a_hand_built_batch_where_the_sign_is_certain(init_seed: int) -> None:
    """One group {answer 20 (R=1), answer 25 (R=0)} on clip_asymmetry: the gap is > 0 whatever the net.

    A = (+a, −a), a > 0; GRPO's token-mean gives c = A/4 per token. The two 'answer' tokens share one context and
    one token, so their coefficients cancel exactly and the update ascends J = (log π(20|answer) −
    log π(25|answer))/4, the log-odds of a 2-way softmax: for a small step it rises (first order: lr/4·‖∇‖²),
    so '20' is boosted and '25' suppressed. Their exact values: 20 after 'answer' is Q − E[R | answer, not 20]
    = 1 − 0 = +1, '25' is −1. Whichever side the two 'answer' tokens (value v ∈ [−1, 1]) fall on, the gap is
    ≥ 2/3: boosted {20, answer×2}, suppressed {25} gives (1 + 2v)/3 + 1; boosted {20}, suppressed
    {25, answer×2} gives 1 − (−1 + 2v)/3.
    """
    pol = NeuralPolicy.from_scenario("clip_asymmetry")
    params = pol.init_params(init_seed)
    st = pol.structure
    idx = torch.tensor([st.trajectory_index(("answer", "20")), st.trajectory_index(("answer", "25"))])
    batch = make_batch(pol, params, idx, torch.zeros(2, dtype=torch.long))
    a = float(batch.advantages[0])
    assert a > 0 and float(batch.advantages[1]) == -a
    values = batch_token_values(batch)
    assert float(values[1]) == pytest.approx(1.0, abs=1e-12) and float(values[3]) == pytest.approx(
        -1.0, abs=1e-12
    )
    per = seed_value_gaps(batch, lr=1e-3, n_steps=1, top_fracs=(1.0,))
    g = per["fig5a"]["all"]
    assert g.gap >= 2.0 / 3.0 - 1e-12
    assert g.n_boosted >= 1 and g.n_suppressed >= 1
    # within the positive rollout, '20' is boosted; within the negative one, '25' is suppressed
    assert per["fig5a"]["positive"].n_boosted >= 1 and per["fig5a"]["negative"].n_suppressed >= 1


def test_bad_arguments() -> None:
    batch = sample_batch("shared_prefix", seed=0, **SMALL)
    with pytest.raises(ValueError, match="repeat"):
        seed_value_gaps(batch, repeat="adam")
    with pytest.raises(ValueError, match="n_steps"):
        seed_value_gaps(batch, n_steps=0)
    with pytest.raises(ValueError, match="repeat"):
        value_gap_study("shared_prefix", repeat="adam")
    with pytest.raises(ValueError, match="seeds"):
        value_gap_study("shared_prefix", seeds=())
    with pytest.raises(ValueError, match="n_steps"):
        value_gap_study("shared_prefix", n_steps=0)


def test_quick_is_a_slice_of_the_study() -> None:
    res = value_gap_study("shared_prefix", quick=True, **SMALL)
    assert res["seeds"] == (0, 1, 2) and list(res["fig11"]) == [1, 2, 3]
    assert [(r["group_size"], r["num_groups"]) for r in res["fig6"]] == [(2, 2), (16, 2), (4, 1), (4, 8)]
