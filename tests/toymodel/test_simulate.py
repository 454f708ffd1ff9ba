"""The simulator: reproducibility, stable rows, the inner loop replayed by hand, reward-balanced
batching and Lopti, the exact zero-advantage shortcut, the optimisers, ``summarize``.

Hand replays re-derive the update with autograd through ``TabularPolicy.token_logp`` and
``compute_loss`` (not the simulator's closed-form backward), from the same generator draws: one step's
B × T uniforms sampled token by token by a plain loop (``tests/toymodel/sampling.py``).
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from cancellation import compute_loss, group_advantages
from toymodel import ROW_KEYS, simulate, summarize
from toymodel.compare import VARIANTS, compare, format_table, summarize_variant
from toymodel.scenarios import EQUIVALENT_SOLUTIONS, TEMPLATE_TASK, get_scenario

from .sampling import draw


def same_rows(a: list[dict[str, float]], b: list[dict[str, float]]) -> bool:
    if len(a) != len(b):
        return False
    for ra, rb in zip(a, b, strict=True):
        for k in ROW_KEYS:
            x, y = ra[k], rb[k]
            if not (x == y or (math.isnan(x) and math.isnan(y))):
                return False
    return True


def test_same_seed_gives_identical_rows() -> None:
    kw = dict(steps=25, num_groups=2, num_minibatches=2, batching="random", inner_epochs=2)
    a = simulate("template_task", "gspo", seed=3, **kw)
    b = simulate("template_task", "gspo", seed=3, **kw)
    c = simulate("template_task", "gspo", seed=4, **kw)
    assert same_rows(a, b)
    assert not same_rows(a, c)


@pytest.mark.parametrize(
    "config",
    [
        dict(objective="grpo"),
        dict(objective="gspo", num_groups=2, num_minibatches=2, batching="query"),
        dict(objective="grpo", reward_balanced_rho=0.25, group_size=4),
        dict(objective="gspo", lopti_eta=0.4, ar_alpha=0.3),
        dict(objective="dfpo", transform="orth_proj", optimizer="adam"),
        dict(objective="grpo_symclip", adv_scale="none", aggregation="seq-mean-token-sum"),
    ],
)
def test_every_row_has_the_same_keys(config: dict) -> None:
    config = dict(config)
    obj = config.pop("objective")
    rows = simulate("template_task", obj, steps=6, **config)
    assert len(rows) == 6
    assert all(tuple(r) == ROW_KEYS for r in rows)
    assert [r["step"] for r in rows] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert all(isinstance(v, float) for r in rows for v in r.values())


def _replay(scenario_name: str, objective: str, *, group_size: int, inner_epochs: int, lr: float, seed: int,
            lopti_eta: float | None = None, ar_alpha: float | None = None, **params) -> torch.Tensor:  # fmt: skip
    """One simulator step by hand: the same draws, autograd through token_logp, plain SGD."""
    sc = get_scenario(scenario_name)
    policy = sc.policy()
    init = sc.initial_logits()
    gen = torch.Generator().manual_seed(seed)
    idx = draw(policy, init, group_size, gen)
    group = torch.zeros(group_size, dtype=torch.long)
    adv = group_advantages(policy.rewards[idx], group)
    mask = policy.mask[idx]
    old_logp = policy.token_logp(init, idx)
    adv_tok = adv[:, None].expand_as(old_logp)
    if ar_alpha is not None:
        # Lopti paper §4.1: A·[α·π_old + (1 − α)]
        adv_tok = adv_tok * (ar_alpha * old_logp.exp() + (1 - ar_alpha))
    if lopti_eta is not None:
        low = (old_logp.exp() < lopti_eta) & mask.bool()
        stages = [adv_tok * low, adv_tok * (mask.bool() & ~low)]
    else:
        stages = [adv_tok if ar_alpha is not None else adv]
    z = init.clone()
    for stage_adv in stages:
        for _ in range(inner_epochs):
            leaf = z.clone().requires_grad_(True)
            loss, _ = compute_loss(
                objective, policy.token_logp(leaf, idx), old_logp, stage_adv, mask, group, **params
            )
            (g,) = torch.autograd.grad(loss, leaf)
            z = z - lr * torch.where(policy.valid, g, torch.zeros_like(g))
    return z


def _sim_logits(scenario_name: str, objective: str, **kw) -> torch.Tensor:
    got: list[torch.Tensor] = []
    simulate(scenario_name, objective, steps=1, callback=lambda step, z: got.append(z), **kw)
    return got[0]


@pytest.mark.exactness  # the loop vs a replay in float64 (tests/exactness.py)
@pytest.mark.parametrize(
    ("objective", "extra"),
    [
        ("grpo", {}),
        ("gspo", {"epsilon_low": 0.5, "epsilon_high": 0.5}),
        ("dfpo", {"transform": "min_replace", "epsilon_low": 0.5, "epsilon_high": 0.5}),
        ("grpo", {"lopti_eta": 0.4}),
        ("gspo", {"ar_alpha": 0.3, "epsilon_low": 0.5, "epsilon_high": 0.5}),
        ("grpo", {"lopti_eta": 0.5, "ar_alpha": 0.3}),
    ],
)
def test_one_step_matches_a_hand_replay(objective: str, extra: dict) -> None:
    kw = dict(group_size=6, inner_epochs=3, lr=0.7, seed=5)
    want = _replay("template_task", objective, **kw, **extra)
    got = _sim_logits("template_task", objective, **kw, **extra)
    valid = TEMPLATE_TASK.policy().valid
    assert torch.allclose(got[valid], want[valid], atol=1e-12, rtol=0)
    assert bool(torch.isneginf(got[~valid]).all())
    assert float((got - TEMPLATE_TASK.initial_logits())[valid].abs().max()) > 1e-3  # it did move


@pytest.mark.exactness  # the loop vs a replay in float64 (tests/exactness.py)
@pytest.mark.parametrize(
    ("objective", "extra"),
    [
        ("grpo", {}),
        ("gspo", {"epsilon_low": 0.5, "epsilon_high": 0.5}),
        ("gspo", {}),
        ("dfpo", {"transform": "orth_proj", "epsilon_low": 0.5, "epsilon_high": 0.5}),
    ],
)
def test_shared_residual_row_measures_the_applied_updates(objective: str, extra: dict) -> None:
    """The row's residuals: Σ|net| / Σ gross of the coefficients each inner step applied, by a dict loop."""
    kw = dict(group_size=8, inner_epochs=3, lr=0.7, seed=11)
    sc = get_scenario("template_task")
    policy = sc.policy()
    init = sc.initial_logits()
    gen = torch.Generator().manual_seed(kw["seed"])
    idx = draw(policy, init, kw["group_size"], gen)
    group = torch.zeros(kw["group_size"], dtype=torch.long)
    adv = group_advantages(policy.rewards[idx], group)
    assert bool(adv.any())
    mask = policy.mask[idx]
    old_logp = policy.token_logp(init, idx)
    n_actions = policy.valid.sum(-1)
    z = init.clone()
    net_abs = gross = full_net = full_gross = seq_net = seq_gross = 0.0
    for _ in range(kw["inner_epochs"]):
        leaf = z.clone().requires_grad_(True)
        logp = policy.token_logp(leaf, idx)
        loss, _ = compute_loss(objective, logp, old_logp, adv, mask, group, **extra)
        (g_logp,) = torch.autograd.grad(loss, logp, retain_graph=True)
        events: dict[tuple[int, int], list[float]] = {}
        for i in range(idx.shape[0]):
            for t in range(mask.shape[1]):
                c, a = int(policy.ctx[idx[i], t]), int(policy.act[idx[i], t])
                if mask[i, t] and int(n_actions[c]) > 1:
                    events.setdefault((c, a), []).append(-float(g_logp[i, t]))
        for coefs in events.values():
            if len(coefs) >= 2:
                net_abs += abs(sum(coefs))
                gross += sum(abs(x) for x in coefs)
            if len(coefs) == kw["group_size"]:  # every completion of the group holds the event
                full_net += abs(sum(coefs))
                full_gross += sum(abs(x) for x in coefs)
        # one group: |Σ_i c_i| and Σ_i |c_i| with c_i = Σ_t ∂J/∂logp_{i,t} (forced steps included)
        c = [
            -sum(float(g_logp[i, t]) for t in range(mask.shape[1]) if mask[i, t]) for i in range(idx.shape[0])
        ]
        seq_net += abs(sum(c))
        seq_gross += sum(abs(x) for x in c)
        (g,) = torch.autograd.grad(loss, leaf)
        z = z - kw["lr"] * torch.where(policy.valid, g, torch.zeros_like(g))
    row = simulate("template_task", objective, steps=1, **kw, **extra)[0]
    for key, num, den in (
        ("shared_residual", net_abs, gross),
        ("group_shared_residual", full_net, full_gross),
        ("sequence_net_residual", seq_net, seq_gross),
    ):
        if den == 0:
            assert math.isnan(row[key])
        else:
            assert row[key] == pytest.approx(num / den, abs=1e-12)


@pytest.mark.exactness  # the loop vs a replay in float64 (tests/exactness.py)
def test_group_shared_residual_is_zero_exactly_where_the_math_says() -> None:
    """template_task (every completion has 7 tokens): whole-group events cancel under GRPO inside its clip
    range (eq. 9) and under DFPO Min-Replace/Orth-Proj (eq. 73, equal lengths); not under unclipped GSPO
    (eq. 13), nor under GRPO when groups are split across random mini-batches (cancellation-hypothesis
    paper Sec. 4)."""
    kw = dict(steps=15, group_size=8, inner_epochs=2, lr=0.05, seed=2)
    no_clip = {"epsilon_low": 0.999999, "epsilon_high": 1e9}

    def resid(objective: str, **extra) -> list[float]:
        rows = simulate("template_task", objective, **{**kw, **extra})
        return [r["group_shared_residual"] for r in rows if not math.isnan(r["group_shared_residual"])]

    grpo = resid("grpo", epsilon_low=0.5, epsilon_high=0.5)
    assert grpo and max(grpo) < 1e-12
    for transform in ("min_replace", "orth_proj"):
        assert max(resid("dfpo", transform=transform, **no_clip)) < 1e-12
    assert min(resid("gspo", **no_clip)) > 1e-6
    split = resid(
        "grpo", num_groups=2, num_minibatches=4, batching="random", epsilon_low=0.5, epsilon_high=0.5
    )
    assert max(split) > 0.1
    kept = resid("grpo", num_groups=2, num_minibatches=2, batching="query", epsilon_low=0.5, epsilon_high=0.5)
    assert max(kept) < 1e-12


def test_lopti_runs_two_stages_low_probability_first() -> None:
    kw = dict(group_size=6, inner_epochs=2, lr=0.7, seed=5)
    lopti = _sim_logits("template_task", "grpo", lopti_eta=0.4, **kw)
    valid = TEMPLATE_TASK.policy().valid
    # the two stages in the other order give a different result (stage 2's ratios carry stage 1's drift)
    sc = TEMPLATE_TASK
    policy = sc.policy()
    init = sc.initial_logits()
    gen = torch.Generator().manual_seed(5)
    idx = draw(policy, init, 6, gen)
    group = torch.zeros(6, dtype=torch.long)
    adv = group_advantages(policy.rewards[idx], group)[:, None]
    mask = policy.mask[idx]
    old_logp = policy.token_logp(init, idx)
    low = (old_logp.exp() < 0.4) & mask.bool()
    assert bool(low.any()) and bool((mask.bool() & ~low).any())
    z = init.clone()
    for sel in (mask.bool() & ~low, low):  # high first: the wrong order
        for _ in range(2):
            leaf = z.clone().requires_grad_(True)
            loss, _ = compute_loss("grpo", policy.token_logp(leaf, idx), old_logp, adv * sel, mask, group)
            (g,) = torch.autograd.grad(loss, leaf)
            z = z - 0.7 * torch.where(policy.valid, g, torch.zeros_like(g))
    assert float((z - lopti)[valid].abs().max()) > 1e-6
    # and a single stage (plain GRPO) differs too; only at second order (here ~9e-5): to first order
    # every token gets the same number of steps either way, since the two stages partition the tokens
    plain = _sim_logits("template_task", "grpo", **kw)
    assert float((plain - lopti)[valid].abs().max()) > 1e-6


def test_reward_balanced_updates_only_when_the_buffer_meets_rho() -> None:
    # G = 2, one group per update, ρ = 0.5: an update needs a group with one correct and one wrong
    # answer, i.e. a sampled mean reward of exactly 0.5 (the buffer never holds such a group: it is
    # consumed on arrival). Pure groups wait in the FIFO buffer, capped at 16 groups.
    rows = simulate("equivalent_solutions", "grpo", steps=80, group_size=2, reward_balanced_rho=0.5, seed=1)
    buffered = 0
    n_updates = 0
    for prev, row in zip([None, *rows[:-1]], rows, strict=True):
        mixed = row["sampled_reward"] == 0.5
        assert row["updated"] == (1.0 if mixed else 0.0)
        if not mixed:
            buffered = min(buffered + 1, 16)
            if prev is not None:
                assert row["expected_reward"] == prev["expected_reward"]  # nothing moved
            assert math.isnan(row["shared_residual"]) and math.isnan(row["asym"])
        else:
            n_updates += 1
        assert row["buffer_groups"] == buffered
    assert 0 < n_updates < len(rows)
    assert max(r["buffer_groups"] for r in rows) == 16


def test_dfpo_with_per_token_advantages_raises() -> None:
    with pytest.raises(ValueError, match="dfpo needs one advantage per completion"):
        simulate("equivalent_solutions", "dfpo", steps=2, ar_alpha=0.2)
    with pytest.raises(ValueError, match="dfpo needs one advantage per completion"):
        simulate("equivalent_solutions", "dfpo", steps=2, lopti_eta=0.4)


def test_invalid_arguments_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown objective"):
        simulate("equivalent_solutions", "ppo", steps=1)
    with pytest.raises(ValueError, match="unknown optimizer"):
        simulate("equivalent_solutions", "grpo", steps=1, optimizer="rmsprop")
    with pytest.raises(ValueError, match="unknown batching"):
        simulate("equivalent_solutions", "grpo", steps=1, batching="token")
    with pytest.raises(ValueError, match="unknown scenario"):
        simulate("nope", "grpo", steps=1)
    with pytest.raises(ValueError, match="num_minibatches"):
        simulate("equivalent_solutions", "grpo", steps=1, num_minibatches=2, batching="query")
    with pytest.raises(TypeError, match="unknown parameter"):
        simulate("equivalent_solutions", "grpo", steps=1, epsilon_middle=0.1)


def test_zero_advantage_shortcut_is_exact() -> None:
    # lr = 2 saturates the reward fast, so most later steps have all-zero advantages and are skipped
    kw = dict(steps=60, lr=2.0, num_groups=2, num_minibatches=2, batching="random", inner_epochs=2, seed=2)
    fast = simulate("equivalent_solutions", "gspo", **kw)
    slow = simulate("equivalent_solutions", "gspo", _skip_zero_advantage=False, **kw)
    assert same_rows(fast, slow)
    assert sum(r["zero_adv_group_frac"] == 1.0 for r in fast) > 10


def test_unused_slots_stay_minus_inf_under_both_optimizers() -> None:
    """The −inf slots of the logits table get zero gradient, so neither optimiser may move them."""
    policy = EQUIVALENT_SOLUTIONS.policy()
    for optimizer in ("sgd", "adam"):
        seen: list[torch.Tensor] = []
        simulate("equivalent_solutions", "grpo", steps=20, optimizer=optimizer, seed=3,
                 callback=lambda step, logits, seen=seen: seen.append(logits))  # fmt: skip
        final = seen[-1]
        assert bool(torch.isneginf(final[~policy.valid]).all())
        assert bool(torch.isfinite(final[policy.valid]).all())
        assert not torch.equal(final[policy.valid], EQUIVALENT_SOLUTIONS.initial_logits()[policy.valid])


@pytest.mark.exactness  # the loop vs a replay in float64 (tests/exactness.py)
def test_rows_report_the_post_update_policy() -> None:
    snaps: list[torch.Tensor] = []
    rows = simulate("template_task", "grpo", steps=5, callback=lambda s, z: snaps.append(z))
    policy = TEMPLATE_TASK.policy()
    init = TEMPLATE_TASK.initial_logits()
    ids = TEMPLATE_TASK.template_context_ids()
    for row, z in zip(rows, snaps, strict=True):
        assert row["expected_reward"] == pytest.approx(policy.expected_reward(z), abs=1e-14)
        assert row["entropy"] == pytest.approx(policy.entropy(z), abs=1e-12)
        assert row["template_kl"] == pytest.approx(policy.kl_to(z, init, ids), abs=1e-14)
    eq = simulate("equivalent_solutions", "grpo", steps=3)
    assert all(r["template_kl"] == 0.0 for r in eq)


def test_summarize_by_hand() -> None:
    def run(vals):
        return [{"step": float(i + 1), "m": float(v)} for i, v in enumerate(vals)]

    runs = [run([0.1, 0.5, 0.6, 0.9]), run([0.2, 0.3, 0.95, 0.97]), run([0.0, 0.1, 0.2, 0.3])]
    out = summarize(runs, "m", threshold=0.9)
    assert out["final_mean"] == pytest.approx((0.9 + 0.97 + 0.3) / 3)
    assert out["final_std"] == pytest.approx(statistics.stdev([0.9, 0.97, 0.3]))
    # DFPO eq. (20) by hand: mean |m[t+2] − 2m[t+1] + m[t]|
    j = [
        (abs(0.6 - 1.0 + 0.1) + abs(0.9 - 1.2 + 0.5)) / 2,
        (abs(0.95 - 0.6 + 0.2) + abs(0.97 - 1.9 + 0.3)) / 2,
        0.0,
    ]
    assert out["jitter2_mean"] == pytest.approx(sum(j) / 3)
    assert out["steps_to_threshold"] == [4.0, 3.0, None]
    assert out["reached_frac"] == pytest.approx(2 / 3)
    assert out["steps_mean"] == pytest.approx(3.5)
    with pytest.raises(ValueError, match="unknown metric"):
        summarize(runs, "nope")


# ---------------------------------------------------------------------------------------------
# multi-seed runs (slow)


def test_summarize_variant_on_hand_made_runs() -> None:
    """Learning tax at the threshold, steps-to-threshold and the residual mean, by hand."""

    def run(rewards: list[float], kls: list[float], resid: list[float]) -> list[dict[str, float]]:
        return [
            {"step": float(i + 1), "expected_reward": r, "equiv_entropy": 0.5, "equiv_log_odds": 0.0,
             "template_kl": k, "shared_residual": q, "group_shared_residual": q / 2,
             "sequence_net_residual": q / 4}
            for i, (r, k, q) in enumerate(zip(rewards, kls, resid, strict=True))
        ]  # fmt: skip

    a = run([0.5, 0.95, 0.97, 0.99], [0.0, 0.1, 0.2, 0.3], [0.2, math.nan, 0.4, 0.6])  # reaches 0.9 at step 2
    b = run([0.5, 0.6, 0.8, 0.92], [0.0, 0.3, 0.5, 0.7], [0.1, 0.1, 0.1, 0.1])  # at step 4
    c = run([0.5, 0.5, 0.5, 0.5], [0.0, 0.0, 0.0, 0.9], [math.nan] * 4)  # never
    out = summarize_variant([a, b, c], threshold=0.9)
    assert out["steps_to_threshold"] == pytest.approx(3.0)
    assert out["reached_frac"] == pytest.approx(2 / 3)
    assert out["template_kl_at_threshold"] == pytest.approx((0.1 + 0.7) / 2)
    assert out["template_kl"] == pytest.approx((0.3 + 0.7 + 0.9) / 3)
    assert out["shared_residual"] == pytest.approx(((0.2 + 0.4 + 0.6) / 3 + 0.1) / 2)
    assert out["group_shared_residual"] == pytest.approx(out["shared_residual"] / 2)
    assert out["sequence_net_residual"] == pytest.approx(out["shared_residual"] / 4)
    assert out["expected_reward_std"] == pytest.approx(statistics.stdev([0.99, 0.92, 0.5]))
    table = format_table([{"variant": "x", **out}])
    assert "| x |" in table and "(67% reached)" in table


def test_compare_rows_equal_separate_simulate_runs() -> None:
    variants = {"grpo": ("grpo", {}), "dfpo": ("dfpo", {"transform": "orth_proj", "epsilon_low": 0.2})}
    rows = compare("equivalent_solutions", variants, seeds=2, steps=6, group_size=4, inner_epochs=2)
    for row, (objective, params) in zip(rows, variants.values(), strict=True):
        runs = [simulate("equivalent_solutions", objective, steps=6, seed=s, group_size=4, inner_epochs=2, **params)
                for s in range(2)]  # fmt: skip
        want = summarize_variant(runs, 0.9)
        for k, v in want.items():
            assert (math.isnan(v) and math.isnan(row[k])) or row[k] == v, k


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["equivalent_solutions", "template_task"])
def test_multi_seed_runs_respect_what_the_math_guarantees(scenario: str) -> None:
    steps, seeds = 150, 4  # every row must satisfy the bounds: 4 seeds × 150 steps × 10 variants is plenty
    sc = get_scenario(scenario)
    policy = sc.policy()
    n_equiv = len(sc.equivalent)
    summaries = []
    for label, (obj, params) in VARIANTS.items():
        runs = [simulate(scenario, obj, steps=steps, seed=s, **params) for s in range(seeds)]
        for rows in runs:
            for r in rows:
                # guaranteed: probabilities valid, entropies within their bounds, KL ≥ 0, all finite
                assert 0.0 <= r["expected_reward"] <= 1.0
                assert 0.0 <= r["entropy"] <= math.log(policy.N) + 1e-12
                assert -1e-12 <= r["equiv_entropy"] <= math.log(n_equiv) + 1e-12
                assert r["template_kl"] >= 0.0
                assert r["updated"] == 1.0
                residuals = ("shared_residual", "group_shared_residual", "sequence_net_residual")
                for k in ROW_KEYS:
                    if k not in (*residuals, "pos_high_up"):  # NaN when no shared event got a coefficient
                        assert math.isfinite(r[k]), k
                for k in (*residuals, "pos_high_up"):  # pos_high_up: NaN without a high-prob. positive token
                    assert math.isnan(r[k]) or -1e-12 <= r[k] <= 1.0 + 1e-12
        if scenario == "equivalent_solutions":
            assert all(r["template_kl"] == 0.0 for rows in runs for r in rows)
        summaries.append({"variant": label, **summarize_variant(runs, 0.9)})
    # the README's table on fewer seeds (``python -m toymodel SCENARIO --compare --seeds 4 --steps 150`` prints it)
    print(f"\n{scenario}: {seeds} seeds × {steps} steps, G=8, 4 inner epochs, SGD lr=0.5 (defaults)")
    print(format_table(summaries))


def _fig3_by_hand(scenario: str, seed: int, group_size: int, num_groups: int, **kw) -> tuple[float, int]:
    """``pos_high_up`` of step 1 by a plain loop: replay the step's draw, sign the advantages by the group
    mean, and count high-probability tokens of positive completions whose log π went up."""
    from toymodel.scenarios import get_scenario

    sc = get_scenario(scenario)
    pol = sc.policy()
    after: dict[int, torch.Tensor] = {}
    rows = simulate(scenario, "grpo", steps=1, seed=seed, group_size=group_size, num_groups=num_groups,
                    callback=lambda s, lg: after.setdefault(s, lg), **kw)  # fmt: skip
    lsm0 = torch.log_softmax(sc.initial_logits(), -1)
    lsm1 = torch.log_softmax(after[1], -1)
    idx = draw(pol, sc.initial_logits(), group_size * num_groups, torch.Generator().manual_seed(seed))
    r = pol.rewards[idx].tolist()
    up = count = 0
    for b, i in enumerate(idx.tolist()):
        g = b // group_size
        mean = sum(r[g * group_size : (g + 1) * group_size]) / group_size
        if not r[b] > mean:
            continue
        for t in range(pol.mask.shape[1]):
            c, a = int(pol.ctx[i, t]), int(pol.act[i, t])
            if not pol.mask[i, t] or int(pol.valid[c].sum()) < 2 or lsm0[c, a] < math.log(0.5):
                continue
            count += 1
            up += bool(lsm1[c, a] > lsm0[c, a])
    got = rows[0]["pos_high_up"]
    if count == 0:
        assert math.isnan(got)
        return math.nan, 0
    assert got == up / count
    return got, count


def test_pos_high_up_is_lopti_fig3_by_a_plain_loop():
    values = [_fig3_by_hand("template_task", seed, 8, 2) for seed in range(12)]
    assert sum(n for _, n in values) > 0
    # both directions occur: some high-probability tokens of positive completions go down under GRPO
    assert any(0.0 <= v < 1.0 for v, n in values if n) and any(v > 0.0 for v, n in values if n)
    # no positive completion (all rewards equal: Â = 0 everywhere) gives NaN, not 0
    rows = simulate("template_task", "grpo", steps=1, seed=0, group_size=1)
    assert math.isnan(rows[0]["pos_high_up"])
