"""instruments.coupling: Table 1 of arXiv 2605.08666 on the neural toy, every number recomputed by hand.

Independent references: per-token gradients from a plain autograd loop; the SGD step applied by hand
(copy θ, add lr·Σ_k c_k g_k with the masked coefficients, recompute log π with the model); the first-order
masking effect lr·Σ_{k∈M_j} c_k K_jk by a double loop over K_jk = ⟨g_j, g_k⟩; the proxy kernel of eq. (7)
from its expanded formula. Nothing here is a number copied from a run: every assertion is an identity, a
sign relation, or a bound that holds for any batch.
"""

from __future__ import annotations

import math

import pytest
import torch

import instruments.coupling as coupling_experiment
from instruments.coupling import (
    MASK_SETS,
    PAPER_BOOST_RATE,
    Batch,
    Measurement,
    closest_to_paper,
    convention_grid,
    format_table,
    measure,
    paper_distance,
    sample_batch,
    summarise,
    table1,
)

# exactness: the library's masking effects, kernels and steps against plain loops, all in float64 (the neural toy)
# at 1e-9 relative / 1e-12 absolute; every sign compared is >= 1e-4 from 0 (measured), far above float64 rounding
pytestmark = pytest.mark.exactness

TINY = {"group_size": 4, "num_groups": 2}


def _tiny_seed() -> int:
    """The first seed whose tiny batch has tokens of both advantage signs (so every convention bites)."""
    for seed in range(50):
        b = sample_batch(seed=seed, **TINY)
        if bool((b.adv_tok > 0).any()) and bool((b.adv_tok < 0).any()):
            return seed
    raise AssertionError("no tiny batch with both advantage signs in 50 seeds")


@pytest.fixture(scope="module")
def tiny() -> tuple[int, Batch, Measurement]:
    seed = _tiny_seed()
    batch = sample_batch(seed=seed, **TINY)
    return seed, batch, measure(batch, lr=1.0, mask_seed=seed)


def token_grads(batch: Batch, which: list[int]) -> torch.Tensor:
    """(N, P) row k = ∇ log π(y_k) w.r.t. the parameters ``which`` (flattened, concatenated), one autograd
    call per token."""
    params = [batch.params[i] for i in which]
    logp = batch.policy.token_logp(batch.params, batch.idx)[batch.mask.bool()]
    rows = []
    for k in range(logp.shape[0]):
        gs = torch.autograd.grad(logp[k], params, retain_graph=True, allow_unused=True)
        rows.append(
            torch.cat(
                [
                    (g if g is not None else torch.zeros_like(p)).reshape(-1)
                    for g, p in zip(gs, params, strict=True)
                ]
            )
        )
    return torch.stack(rows)


def hand_step_logp(
    batch: Batch, grads: torch.Tensor, coef: torch.Tensor, lr: float, which: list[int]
) -> torch.Tensor:
    """(N,) log π after θ' = θ + lr·Σ_k c_k g_k on the parameters ``which`` (the others copied unchanged)."""
    theta = [p.detach().clone() for p in batch.params]
    direction = lr * (coef[:, None] * grads).sum(0)
    col = 0
    for i in which:
        n = theta[i].numel()
        theta[i] = theta[i] + direction[col : col + n].reshape(theta[i].shape)
        col += n
    with torch.no_grad():
        return batch.policy.token_logp(theta, batch.idx)[batch.mask.bool()]


def _which(batch: Batch, update: str) -> list[int]:
    n = len(batch.params)
    return list(range(n)) if update == "full" else list(range(n))[batch.policy.head_slice]


@pytest.mark.parametrize("update", ["full", "head"])
def test_exact_masking_effect_and_boost_rate_by_hand(
    tiny: tuple[int, Batch, Measurement], update: str
) -> None:
    _, batch, m = tiny
    which = _which(batch, update)
    grads = token_grads(batch, which)
    c = batch.coef.detach()
    full = hand_step_logp(batch, grads, c, m.lr, which)
    summary = summarise(m, update=update)
    for s in MASK_SETS:
        cand = torch.nonzero(m.computed[s]).flatten().tolist()
        assert cand, f"no candidate for {s}"
        hand = []
        for j in cand:
            masked = hand_step_logp(batch, grads, c.masked_fill(m.masks[s][j], 0.0), m.lr, which)
            hand.append(float(full[j] - masked[j]))  # Sec. 2: ME_j
        got = m.me[update][s][cand]
        assert torch.allclose(got, torch.tensor(hand, dtype=got.dtype), atol=1e-12, rtol=1e-9)
        st = summary["sets"][s]
        assert st["n"] == len(cand)
        assert st["boost_rate"] == pytest.approx(sum(v > 0 for v in hand) / len(hand), abs=1e-12)
        assert st["mean_boost"] == pytest.approx(sum(hand) / len(hand), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("update", ["full", "head"])
def test_first_order_boost_rate_by_double_loop(tiny: tuple[int, Batch, Measurement], update: str) -> None:
    _, batch, m = tiny
    which = _which(batch, update)
    g = token_grads(batch, which).tolist()
    c = batch.coef.tolist()
    n = len(c)
    kern = [[sum(a * b for a, b in zip(g[j], g[k], strict=True)) for k in range(n)] for j in range(n)]
    summary = summarise(m, update=update)
    for s in MASK_SETS:
        cand = torch.nonzero(m.computed[s]).flatten().tolist()
        fo = []
        for j in cand:
            row = m.masks[s][j].tolist()
            # lr·Σ_{k∈M_j} c_k K_jk
            fo.append(m.lr * sum(c[k] * kern[j][k] for k in range(n) if row[k]))
        got = m.me_first[update][s][cand]
        assert torch.allclose(got, torch.tensor(fo, dtype=got.dtype), atol=1e-12, rtol=1e-9)
        rate = sum(v > 0 for v in fo) / len(fo)
        st = summary["sets"][s]
        assert st["first_order_boost_rate"] == pytest.approx(rate, abs=1e-12)
        assert st["first_order_gap"] == pytest.approx(rate - st["boost_rate"], abs=1e-12)


def test_head_update_moves_only_the_unembedding(
    tiny: tuple[int, Batch, Measurement], monkeypatch: pytest.MonkeyPatch
) -> None:
    seed, batch, _ = tiny
    before = [p.detach().clone() for p in batch.params]
    pol = batch.policy
    n_head = len(pol.param_names[pol.head_slice])
    # tag every model evaluation with the step (head or full) that made it
    current: dict[str, str | None] = {"tag": None}
    seen: list[tuple[str | None, list[torch.Tensor]]] = []
    real_sgd_step = coupling_experiment.sgd_step

    def tagged_sgd_step(logp_of, params, lr):  # type: ignore[no-untyped-def]
        tag = "head" if len(params) == n_head else "full"
        step = real_sgd_step(logp_of, params, lr)

        def wrapped(coef: torch.Tensor) -> torch.Tensor:
            current["tag"] = tag
            try:
                return step(coef)
            finally:
                current["tag"] = None

        return wrapped

    orig = pol.token_logp

    def recording(params, idx=None):  # type: ignore[no-untyped-def]
        seen.append((current["tag"], [p.detach().clone() for p in params]))
        return orig(params, idx)

    monkeypatch.setattr(coupling_experiment, "sgd_step", tagged_sgd_step)
    monkeypatch.setattr(pol, "token_logp", recording)
    m = measure(batch, updates=("head",), mask_seed=seed)
    head = [theta for tag, theta in seen if tag == "head"]
    n_masked = sum(int((m.computed[s] & m.masks[s].any(1)).sum()) for s in MASK_SETS)
    assert len(head) >= n_masked  # every masked head step went through the tagged step
    for theta in head:
        for i in range(
            pol.head_slice.start
        ):  # e, W1, b1: every θ the head step evaluates carries them as they were
            assert torch.equal(theta[i], before[i])
    assert any(not torch.equal(theta[3], before[3]) for theta in head)  # W_out moved
    assert any(
        not torch.equal(theta[1], before[1]) for tag, theta in seen if tag == "full"
    )  # the full step moves W1
    monkeypatch.undo()
    assert all(torch.equal(p.detach(), q) for p, q in zip(batch.params, before, strict=True))


def test_orient_by_sign_flips_negative_candidates(tiny: tuple[int, Batch, Measurement]) -> None:
    _, _, m = tiny
    for update in ("full", "head"):
        neg = summarise(m, update=update, candidates="negative")
        neg_o = summarise(m, update=update, candidates="negative", orient_by_sign=True)
        pos = summarise(m, update=update, candidates="positive")
        pos_o = summarise(m, update=update, candidates="positive", orient_by_sign=True)
        for s in MASK_SETS:
            a, b = neg["sets"][s], neg_o["sets"][s]
            if a["n"] == 0:
                continue
            assert b["mean_boost"] == pytest.approx(-a["mean_boost"], rel=1e-12, abs=1e-18)
            # oriented boost = ME < 0: the complement of ME > 0 and of the exact ties
            assert b["boost_rate"] == pytest.approx(1.0 - a["boost_rate"] - a["tie_rate"], abs=1e-12)
            assert pos["sets"][s] == pos_o["sets"][s]
    # orientation drops candidates with no advantage sign; "all" = positive + negative + zero
    all_ = summarise(m, candidates="all")["sets"]["both"]["n"]
    all_o = summarise(m, candidates="all", orient_by_sign=True)["sets"]["both"]["n"]
    n_pos = summarise(m, candidates="positive")["sets"]["both"]["n"]
    n_neg = summarise(m, candidates="negative")["sets"]["both"]["n"]
    assert all_o == n_pos + n_neg <= all_


def test_ties_drop_removes_exact_zeros(tiny: tuple[int, Batch, Measurement]) -> None:
    _, _, m = tiny
    for update in ("full", "head"):
        a = summarise(m, update=update)["sets"]
        b = summarise(m, update=update, ties="drop")["sets"]
        for s in MASK_SETS:
            assert b[s]["n"] == a[s]["n"] - round(a[s]["tie_rate"] * a[s]["n"])
            if b[s]["n"]:
                # the boosted count is the same; only the denominator shrinks
                assert b[s]["boost_rate"] * b[s]["n"] == pytest.approx(
                    a[s]["boost_rate"] * a[s]["n"], abs=1e-9
                )


def test_same_sign_masks_hold_the_candidates_sign(tiny: tuple[int, Batch, Measurement]) -> None:
    seed, batch, m = tiny
    m2 = measure(batch, same_sign=True, updates=("full",), mask_seed=seed)
    sign = torch.sign(batch.adv_tok)
    changed = False
    for s in MASK_SETS:
        for j in range(batch.coef.shape[0]):
            row = m2.masks[s][j]
            assert bool((sign[row] == sign[j]).all())
            changed |= not torch.equal(row, m.masks[s][j])
    assert changed  # the batch has both signs, so some mask loses tokens


def test_coupled_filter_compares_the_same_candidates(tiny: tuple[int, Batch, Measurement]) -> None:
    _, batch, m = tiny
    cand = m.computed["both"]
    for s in MASK_SETS:
        assert torch.equal(m.computed[s], cand)
    assert bool(m.masks["both"][cand].any(1).all())
    assert torch.equal(m.masks["random"].sum(1), m.masks["both"].sum(1))  # random as large as "both"
    assert not bool(cand[batch.forced].any())  # a token with π = 1 is never a candidate
    # the sets nest: both ⊂ same token, both ⊂ low confidence
    assert not bool((m.masks["both"] & ~m.masks["same_token"]).any())
    assert not bool((m.masks["both"] & ~m.masks["low_confidence"]).any())
    n = summarise(m)["sets"]
    assert len({n[s]["n"] for s in MASK_SETS}) == 1


def test_sign_agreement_recomputed(tiny: tuple[int, Batch, Measurement]) -> None:
    _, batch, m = tiny
    c = batch.coef.detach()
    h, p, y = batch.hidden, batch.probs, batch.tokens.tolist()
    n = len(y)
    # eq. (7)-(8) expanded: K^W_jk = ⟨h_j, h_k⟩·(1[y_j = y_k] − π_j(y_k) − π_k(y_j) + ⟨π_j, π_k⟩)
    proxy = torch.zeros(n, n, dtype=torch.float64)
    for j in range(n):
        for k in range(n):
            d = float(y[j] == y[k]) - float(p[j, y[k]]) - float(p[k, y[j]]) + float(p[j] @ p[k])
            proxy[j, k] = float(h[j] @ h[k]) * d
    g = token_grads(batch, _which(batch, "full"))
    full_first = m.lr * (g @ g.T) @ c
    proxy_first = m.lr * proxy @ c
    full_actual = hand_step_logp(batch, g, c, m.lr, _which(batch, "full")) - batch.logp
    gh = token_grads(batch, _which(batch, "head"))
    head_actual = hand_step_logp(batch, gh, c, m.lr, _which(batch, "head")) - batch.logp
    mov = ~batch.forced

    def agree(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((torch.sign(a[mov]) == torch.sign(b[mov])).double().mean())

    sa = summarise(m)["sign_agreement"]
    assert sa["proxy_first_vs_full_first"] == pytest.approx(agree(proxy_first, full_first), abs=1e-12)
    assert sa["proxy_first_vs_full_actual"] == pytest.approx(agree(proxy_first, full_actual), abs=1e-12)
    assert sa["head_actual_vs_full_actual"] == pytest.approx(agree(head_actual, full_actual), abs=1e-12)
    # a forced token (π = 1) never moves under either step
    assert float(m.delta["full"][batch.forced].abs().max()) == 0.0


def test_first_order_error_is_second_order_in_lr(tiny: tuple[int, Batch, Measurement]) -> None:
    seed, batch, _ = tiny
    errs = []
    for lr in (0.2, 0.1):
        mm = measure(batch, lr=lr, updates=("full",), mask_seed=seed)
        errs.append(
            max(
                float((mm.me["full"][s] - mm.me_first["full"][s]).abs().nan_to_num(0).max())
                for s in MASK_SETS
            )
        )
    # halving the step divides the O(lr²) remainder by about 4
    assert 3.0 < errs[0] / errs[1] < 5.0


def test_table1_is_deterministic_and_seed_dependent(tiny: tuple[int, Batch, Measurement]) -> None:
    seed, _, _ = tiny
    a = table1(seed=seed, update="head", **TINY)
    b = table1(seed=seed, update="head", **TINY)
    assert a == b
    c = table1(seed=seed + 1, update="head", **TINY)
    assert c["sets"] != a["sets"]
    for s in MASK_SETS:
        st = a["sets"][s]
        assert 0.0 <= st["boost_rate"] <= 1.0 and 0.0 <= st["tie_rate"] <= 1.0
    cm = a["coupling_mass"]
    assert cm["same_token"] + cm["different_token"] == pytest.approx(1.0, abs=1e-12)


def test_grid_rows_and_readings(tiny: tuple[int, Batch, Measurement]) -> None:
    seed, _, _ = tiny
    rows = convention_grid(seeds=(seed,), **TINY)
    assert len(rows) == 3 * 2 * 2 * 2
    keys = {(r["candidates"], r["same_sign"], r["orient_by_sign"], r["update"]) for r in rows}
    assert len(keys) == len(rows)
    by = {(r["candidates"], r["same_sign"], r["orient_by_sign"], r["update"]): r for r in rows}
    for ss in (False, True):
        for u in ("full", "head"):
            # orientation is the identity on positive candidates
            p0, p1 = by[("positive", ss, False, u)], by[("positive", ss, True, u)]
            assert all(p0[f"br_{s}"] == p1[f"br_{s}"] or math.isnan(p0[f"br_{s}"]) for s in MASK_SETS)
    ranked = closest_to_paper(rows)
    assert len(ranked) == len(rows)
    d = [r["distance_pp"] for r in ranked if not math.isnan(r["distance_pp"])]
    assert d == sorted(d)
    for r in ranked:
        rates = {s: r[f"br_{s}"] for s in MASK_SETS}
        if not math.isnan(r["distance_pp"]):
            assert r["distance_pp"] == pytest.approx(paper_distance(rates, r["update"]), abs=1e-12)


def test_closest_to_paper_on_hand_made_rows() -> None:
    def row(update: str, cand: str, rates: dict[str, float], seed: int) -> dict[str, object]:
        r: dict[str, object] = {"seed": seed, "candidates": cand, "same_sign": False, "orient_by_sign": False,
                                "update": update}  # fmt: skip
        for s in MASK_SETS:
            r[f"br_{s}"] = rates[s]
            r[f"n_{s}"] = 10
        return r

    exact = PAPER_BOOST_RATE["head"]
    off = {s: v + 0.1 for s, v in PAPER_BOOST_RATE["full"].items()}
    rows = [
        row("full", "all", off, 0),
        row("full", "all", off, 1),
        row("head", "positive", {**exact, "both": exact["both"] + 0.02}, 0),
        row("head", "positive", {**exact, "both": exact["both"] - 0.02}, 1),  # seed mean = the paper
        row("head", "negative", {**exact, "random": math.nan}, 0),
    ]
    ranked = closest_to_paper(rows)
    assert (ranked[0]["candidates"], ranked[0]["update"]) == ("positive", "head")
    assert ranked[0]["distance_pp"] == pytest.approx(0.0, abs=1e-9)
    assert ranked[1]["distance_pp"] == pytest.approx(10.0, abs=1e-9)  # 0.1 off on all four sets
    assert math.isnan(ranked[2]["distance_pp"])  # a set never measured ranks last
    text = format_table(ranked, ["candidates", "update", "br_both", "distance_pp"])
    lines = text.splitlines()
    assert len(lines) == 2 + len(ranked)
    assert f"{100 * exact['both']:.1f}" in lines[2]
