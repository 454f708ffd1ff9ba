"""Tests of cancellation.objectives: every loss and gradient against a loop-built reference (reference.py),
following how TRL's GRPOTrainer._compute_loss and verl's compute_policy_loss / agg_loss compute them, and
against the DFPO paper's closed forms (eq. 47-49, App. C/D, App. F eq. 75-76, App. H eq. 80-82)."""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

from cancellation.advantages import reweight_advantages
from cancellation.objectives import METRIC_KEYS, OBJECTIVES, compute_loss, sign_aware_clip
from tests.exactness import rounding_tolerance

from . import reference as ref

#: Every comparison here is between two code paths in float64, at a tolerance well above its
#: rounding (library vs plain loops and the paper's closed forms): ``tests/exactness.py``.
pytestmark = pytest.mark.exactness

F64 = torch.float64
TRANSFORM_NAMES = ["min_replace", "orth_proj", "orth_proj_pos", "truncate_rebalance"]
GROUPS = ((17, 3), (3, 4), (42, 1), (8, 2))  # (prompt id, group size): unequal, non-contiguous ids


@dataclass
class Batch:
    logp: Tensor
    old_logp: Tensor
    adv: Tensor
    mask: Tensor
    group: Tensor


def make_batch(
    seed: int,
    *,
    t: int = 7,
    token_spread: float = 0.6,
    seq_log_ratio: tuple[float, float] | None = None,
    groups: tuple[tuple[int, int], ...] = GROUPS,
) -> Batch:
    """A shuffled batch of unequal groups with varied lengths, zero-sum advantages (eq. 43 by loop) and
    garbage on the padding (it must never leak). With ``seq_log_ratio=(lo, hi)`` the token log-ratios of
    sequence i are re-centred so that their masked mean, log s_i, is a prescribed value spread over [lo, hi]."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    gids = [gid for gid, n in groups for _ in range(n)]
    rng.shuffle(gids)
    b = len(gids)
    lengths = [rng.randint(1, t) for _ in range(b)]
    lengths[0], lengths[-1] = t, 1
    mask = torch.tensor([[tt < n for tt in range(t)] for n in lengths])
    old = -torch.rand(b, t, generator=gen, dtype=F64) * 3.0
    noise = torch.randn(b, t, generator=gen, dtype=F64) * token_spread
    if seq_log_ratio is not None:
        targets = [seq_log_ratio[0] + (seq_log_ratio[1] - seq_log_ratio[0]) * k / (b - 1) for k in range(b)]
        rng.shuffle(targets)
        for i in range(b):
            n = lengths[i]
            row_mean = float(noise[i, :n].sum()) / n
            noise[i, :n] += targets[i] - row_mean
    logp = torch.where(mask, old + noise, torch.full_like(old, 50.0))
    old = torch.where(mask, old, torch.full_like(old, -30.0))
    rewards = [rng.uniform(0.0, 1.0) for _ in range(b)]
    adv = torch.tensor(ref.group_advantages_floats(rewards, gids), dtype=F64)
    return Batch(logp, old, adv, mask, torch.tensor(gids))


def loss_grad(fn, logp: Tensor) -> tuple[Tensor, Tensor]:
    """(loss, ∂loss/∂logp) of ``fn(logp)`` on a fresh leaf copy of logp."""
    x = logp.detach().clone().requires_grad_(True)
    loss = fn(x)
    (g,) = torch.autograd.grad(loss, x)
    return loss.detach(), g


def run(name: str, bt: Batch, **kw):
    return lambda x: compute_loss(name, x, bt.old_logp, bt.adv, bt.mask, bt.group, **kw)[0]


def assert_close(a: Tensor, b: Tensor, tol: float = 1e-11) -> None:
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


# aggregation under test, the reference's name for it (verl or TRL), norm constant
AGG_CASES = [
    ("seq-mean-token-mean", "grpo", None),  # TRL loss_type="grpo"
    ("token-mean", "bnpo", None),  # TRL loss_type="bnpo"
    ("seq-mean-token-sum-norm", "dr_grpo", 12.0),  # TRL loss_type="dr_grpo", max_completion_length=12
    ("seq-mean-token-sum", "seq-mean-token-sum", None),
    ("seq-mean-token-sum-norm", "seq-mean-token-sum-norm", None),
]


def _agg_kwargs(norm: float | None) -> dict:
    return {} if norm is None else {"norm_constant": norm}


def test_registry() -> None:
    assert sorted(OBJECTIVES) == sorted(["grpo", "grpo_symclip", "gspo", "dfpo"])


# ------------------------------------------------------------------------------------------------
# GRPO: token-level clipped surrogate with clip-higher


def _grpo_coverage(bt: Batch, el: float, eh: float) -> set[str]:
    seen = set()
    r = (bt.logp - bt.old_logp).exp()
    for i in range(r.shape[0]):
        a = float(bt.adv[i])
        for t in range(r.shape[1]):
            if not bt.mask[i, t]:
                continue
            x = float(r[i, t])
            if x > 1 + eh:
                seen.add("high_clipped" if a > 0 else "high_unclipped" if a < 0 else "zero")
            elif x < 1 - el:
                seen.add("low_clipped" if a < 0 else "low_unclipped" if a > 0 else "zero")
    return seen


@pytest.mark.parametrize(("agg", "ref_name", "norm"), AGG_CASES)
@pytest.mark.parametrize("seed", range(2))
def test_grpo_equals_trl_surrogate(agg: str, ref_name: str, norm: float | None, seed: int) -> None:
    el, eh = 0.2, 0.28
    bt = make_batch(seed)
    assert {"high_clipped", "high_unclipped", "low_clipped", "low_unclipped"} <= _grpo_coverage(bt, el, eh)
    kw = {"epsilon_low": el, "epsilon_high": eh, **_agg_kwargs(norm)}
    got = loss_grad(run("grpo", bt, aggregation=agg, **kw), bt.logp)
    want = loss_grad(
        lambda x: ref.reduce(
            ref.grpo_per_token_loss(x, bt.old_logp, bt.adv, bt.mask, el, eh),
            bt.mask,
            ref_name,
            norm_constant=norm,
        ),
        bt.logp,
    )
    assert_close(got[0], want[0])
    assert_close(got[1], want[1])
    assert float(got[1][~bt.mask].abs().sum()) == 0.0


def test_grpo_default_aggregation_is_token_mean_and_default_eps() -> None:
    bt = make_batch(3)
    got = loss_grad(run("grpo", bt), bt.logp)
    want = loss_grad(
        lambda x: ref.reduce(
            ref.grpo_per_token_loss(x, bt.old_logp, bt.adv, bt.mask, 0.2, 0.2), bt.mask, "bnpo"
        ),
        bt.logp,
    )
    assert_close(got[0], want[0])
    assert_close(got[1], want[1])


def test_grpo_per_token_advantages() -> None:
    """(B, T) advantages from Advantage Reweighting: each token uses its own A_t."""
    bt = make_batch(4)
    adv2 = reweight_advantages(bt.adv, bt.old_logp, 0.3)
    got = loss_grad(
        lambda x: compute_loss("grpo", x, bt.old_logp, adv2, bt.mask, bt.group, epsilon_high=0.28)[0], bt.logp
    )
    want = loss_grad(
        lambda x: ref.reduce(
            ref.grpo_per_token_loss(x, bt.old_logp, adv2, bt.mask, 0.2, 0.28), bt.mask, "bnpo"
        ),
        bt.logp,
    )
    assert_close(got[0], want[0])
    assert_close(got[1], want[1])


# ------------------------------------------------------------------------------------------------
# GSPO: sequence-level importance ratio


def _seq_categories(bt: Batch, el: float, eh: float, length_norm: bool = True) -> set[str]:
    s = [float(x) for x in ref.sequence_ratios(bt.logp, bt.old_logp, bt.mask, length_norm)]
    out = set()
    for i, si in enumerate(s):
        a = float(bt.adv[i])
        if ref.is_clipped(si, a, el, eh):
            out.add("clipped")
        elif 1 - el <= si <= 1 + eh:
            out.add("inside")
        else:
            out.add("outside_unclipped")
    return out


@pytest.mark.parametrize(("agg", "ref_name", "norm"), AGG_CASES)
def test_gspo_equals_sequence_level_is_with_clipping(agg: str, ref_name: str, norm: float | None) -> None:
    el, eh = 3e-4, 4e-4  # GSPO's defaults
    bt = make_batch(5, token_spread=0.3, seq_log_ratio=(-2e-3, 2e-3))
    assert _seq_categories(bt, el, eh) == {"clipped", "inside", "outside_unclipped"}
    got = loss_grad(run("gspo", bt, aggregation=agg, **_agg_kwargs(norm)), bt.logp)
    want = loss_grad(
        lambda x: ref.reduce(
            ref.gspo_per_token_loss(x, bt.old_logp, bt.adv, bt.mask, el, eh),
            bt.mask,
            ref_name,
            norm_constant=norm,
        ),
        bt.logp,
    )
    assert_close(got[0], want[0])
    assert_close(got[1], want[1])
    assert float(got[1].abs().sum()) > 0


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_gspo_without_clipping_active(agg: str) -> None:
    el, eh = 0.5, 0.6
    bt = make_batch(6, token_spread=0.3, seq_log_ratio=(-0.3, 0.3))
    assert _seq_categories(bt, el, eh) == {"inside"}
    got = loss_grad(run("gspo", bt, aggregation=agg, epsilon_low=el, epsilon_high=eh), bt.logp)
    want = loss_grad(
        lambda x: ref.reduce(ref.gspo_per_token_loss(x, bt.old_logp, bt.adv, bt.mask, el, eh), bt.mask, agg),
        bt.logp,
    )
    assert_close(got[0], want[0])
    assert_close(got[1], want[1])
    # unclipped, seq-mean-token-mean: ∂loss/∂logp_{i,t} = −Â_i s_i / (B |y_i|) (DFPO eq. 66)
    if agg == "seq-mean-token-mean":
        s = ref.sequence_ratios(bt.logp, bt.old_logp, bt.mask)
        b = bt.mask.shape[0]
        for i in range(b):
            n = int(bt.mask[i].sum())
            coef = -float(bt.adv[i]) * float(s[i]) / (b * n)
            assert_close(got[1][i, :n], torch.full((n,), coef, dtype=F64))


@pytest.mark.parametrize(("el", "eh", "lim"), [(0.5, 0.6, 0.05), (3e-4, 4e-4, 1e-3)])
def test_gspo_without_length_norm_is_product_of_token_ratios(el: float, eh: float, lim: float) -> None:
    bt = make_batch(7, token_spread=0.02)
    # scale log-ratios so that Σ_t log r lies in a useful range
    bt.logp = torch.where(bt.mask, bt.old_logp + (bt.logp - bt.old_logp) * (lim / 0.02), bt.logp)
    s_loop = []
    for i in range(bt.mask.shape[0]):
        prod = 1.0
        for t in range(bt.mask.shape[1]):
            if bt.mask[i, t]:
                prod *= math.exp(float(bt.logp[i, t] - bt.old_logp[i, t]))
        s_loop.append(prod)
    _, metrics = compute_loss(
        "gspo",
        bt.logp,
        bt.old_logp,
        bt.adv,
        bt.mask,
        bt.group,
        length_norm=False,
        epsilon_low=el,
        epsilon_high=eh,
    )
    assert metrics["seq_ratio/mean"] == pytest.approx(sum(s_loop) / len(s_loop), rel=1e-12)
    got = loss_grad(run("gspo", bt, length_norm=False, epsilon_low=el, epsilon_high=eh), bt.logp)
    want = loss_grad(
        lambda x: ref.reduce(
            ref.gspo_per_token_loss(x, bt.old_logp, bt.adv, bt.mask, el, eh, length_norm=False),
            bt.mask,
            "seq-mean-token-mean",
        ),
        bt.logp,
    )
    assert_close(got[0], want[0])
    assert_close(got[1], want[1])


def test_gspo_per_token_advantages() -> None:
    bt = make_batch(8, token_spread=0.3, seq_log_ratio=(-2e-3, 2e-3))
    adv2 = reweight_advantages(bt.adv, bt.old_logp, 0.2)
    got = loss_grad(lambda x: compute_loss("gspo", x, bt.old_logp, adv2, bt.mask, bt.group)[0], bt.logp)
    want = loss_grad(
        lambda x: ref.reduce(
            ref.gspo_per_token_loss(x, bt.old_logp, adv2, bt.mask, 3e-4, 4e-4), bt.mask, "seq-mean-token-mean"
        ),
        bt.logp,
    )
    assert_close(got[0], want[0])
    assert_close(got[1], want[1])


# ------------------------------------------------------------------------------------------------
# GRPO-fix: symmetric clipping (App. H)


@pytest.mark.parametrize("agg", ["seq-mean-token-sum", "token-mean", "seq-mean-token-mean"])
def test_grpo_symclip_equals_eq80(agg: str) -> None:
    eps = 0.2
    bt = make_batch(9)
    got = loss_grad(run("grpo_symclip", bt, aggregation=agg, epsilon=eps), bt.logp)
    want = loss_grad(
        lambda x: ref.reduce(ref.symclip_per_token_loss(x, bt.old_logp, bt.adv, bt.mask, eps), bt.mask, agg),
        bt.logp,
    )
    assert_close(got[0], want[0])
    assert_close(got[1], want[1])
    if agg == "seq-mean-token-sum":
        # DFPO eq. (81): ∂J/∂logp_{i,t} = Â_i·r_{i,t}·(1/B) inside, 0 where r > 1 + ε, for both signs
        b = bt.mask.shape[0]
        r = (bt.logp - bt.old_logp).exp()
        clipped_signs = set()
        for i in range(b):
            for t in range(bt.mask.shape[1]):
                if not bt.mask[i, t]:
                    continue
                x, a = float(r[i, t]), float(bt.adv[i])
                dj = 0.0 if x > 1 + eps else a * x / b
                if x > 1 + eps:
                    clipped_signs.add(a > 0)
                assert float(-got[1][i, t]) == pytest.approx(dj, rel=1e-12, abs=1e-15)
        assert clipped_signs == {True, False}


# ------------------------------------------------------------------------------------------------
# eq. (47)-(49): the sign-aware rewrite


def test_sign_aware_clip_is_exact() -> None:
    el, eh = 0.2, 0.28
    ss = [0.05, 0.5, 1 - el, 0.9, 1.0, 1.1, 1 + eh, 1.5, 4.0]
    aa = [-2.0, -0.5, -1e-9, 0.0, 1e-9, 0.5, 2.0]
    s = torch.tensor([x for x in ss for _ in aa], dtype=F64)
    a = torch.tensor([y for _ in ss for y in aa], dtype=F64)
    s_bar = sign_aware_clip(s, a, el, eh)
    for k in range(s.shape[0]):
        x, y = float(s[k]), float(a[k])
        c = min(max(x, 1 - el), 1 + eh)
        # eq. (48) == eq. (49), exactly
        assert y * float(s_bar[k]) == min(x * y, c * y)
        assert float(s_bar[k]) == ref.post_clip_float(x, y, el, eh)


# ------------------------------------------------------------------------------------------------
# App. F eq. (75)/(76) and App. H eq. (82) directly on the objective


def _shared_token_batch(w: float, a: float) -> Batch:
    """G = 2, Â = (−A, +A), T = 3; both sequences share token t = 1 with ratio w, the others have ratio 1."""
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -2.0, -0.5]], dtype=F64)
    logp = old.clone()
    logp[:, 1] += math.log(w)
    return Batch(
        logp, old, torch.tensor([-a, a], dtype=F64), torch.ones(2, 3, dtype=torch.bool), torch.tensor([0, 0])
    )


@pytest.mark.parametrize("w", [1.5, 2.3, 0.6, 0.3, 1.1, 0.9])
@pytest.mark.parametrize(("agg", "factor"), [("seq-mean-token-sum", 2.0), ("seq-mean-token-mean", 6.0)])
def test_clipping_asymmetry_app_f(w: float, agg: str, factor: float) -> None:
    """App. F: with ε_low = ε_high = ε, G = 2 and Â = (−A, +A) sharing a token of ratio w.

    Eq. (75)/(76) give the group's summed surrogate of the shared token, Σ_i min(wÂ_i, w̄Â_i):
    A((1+ε) − w) for w > 1+ε, A(w − (1−ε)) for w < 1−ε, 0 inside (eq. 9). The tokens with ratio 1 add
    Σ_i Â_i = 0, so this is also the whole group objective. ``factor`` undoes the aggregation:
    seq-mean-token-sum divides by G = 2, seq-mean-token-mean by G·T = 6, so J_group = −factor·loss.

    Gradient: the coefficient of ∇θ log π(a*|h*) is Σ_i ∂J_group/∂logp_{i,1}. Since ∂/∂logp = w·∂/∂w
    (r = exp(logp − old)), it is w·d/dw of eq. (75)/(76): −A·w for w > 1+ε (only the negative sample, still
    unclipped, moves), +A·w for w < 1−ε (only the positive one moves), 0 inside. Non-zero outside the
    range: the cancellation of eq. (9) fails. Under grpo_symclip (eq. 80) the same sum is exactly 0 (eq. 82).
    """
    eps, a = 0.2, 0.7
    bt = _shared_token_batch(w, a)
    kw = {"aggregation": agg, "epsilon_low": eps, "epsilon_high": eps}
    loss, g = loss_grad(run("grpo", bt, **kw), bt.logp)
    w_exact = float((bt.logp[0, 1] - bt.old_logp[0, 1]).exp())
    if w > 1 + eps:
        value, coef = a * ((1 + eps) - w_exact), -a * w_exact  # eq. (75)
    elif w < 1 - eps:
        value, coef = a * (w_exact - (1 - eps)), a * w_exact  # eq. (76)
    else:
        value, coef = 0.0, 0.0  # eq. (9)
    assert float(-factor * loss) == pytest.approx(value, abs=1e-12)
    assert float(-factor * (g[0, 1] + g[1, 1])) == pytest.approx(coef, abs=1e-12)
    # tokens with ratio 1 cancel within the group under grpo too
    assert float(g[0, 0] + g[1, 0]) == pytest.approx(0.0, abs=1e-15)

    sym_loss, sym_g = loss_grad(run("grpo_symclip", bt, aggregation=agg, epsilon=eps), bt.logp)
    # Σ_i Â_i φ = 0 up to the rounding of the aggregation's sums: 6 terms of at most A·max(w, 1) each
    assert abs(float(sym_loss)) <= rounding_tolerance(6 * a * max(w, 1.0), 6, F64)
    assert float(sym_g[0, 1] + sym_g[1, 1]) == 0.0  # eq. (82), exactly
    if w > 1 + eps:
        assert float(sym_g[:, 1].abs().sum()) == 0.0  # both sequences clipped alike


# ------------------------------------------------------------------------------------------------
# DFPO


def _dfpo_reference(bt: Batch, transform: str, el: float, eh: float, length_norm: bool = True):
    s, s_bar, s_tilde = ref.dfpo_weights(
        bt.logp, bt.old_logp, bt.adv, bt.mask, bt.group, transform, el, eh, length_norm
    )
    return [float(x) for x in s], s_bar.detach().tolist(), s_tilde.detach().tolist()


def _dfpo_stopgrad_grad(
    bt: Batch, transform: str, agg: str, el: float, eh: float, estimator: str = "paper"
) -> tuple[float, Tensor]:
    """Closed form of the stop-gradient estimator: loss = −Σ_i κ_i Â_i s̃_i and
    ∂loss/∂logp_{i,t} = −κ_i Â_i s̃_i ∂log s_i/∂logp_{i,t} = −κ_i Â_i s̃_i / |y_i| on every token of every
    sequence, clipped or not (the paper's estimator, eq. 16/68/86/91: the unclipped direction ∇log s_i);
    under the ``ppo_clip`` variant the direction is ∇log s̄_i, 0 on a clipped sequence (s̄_i a constant).
    κ_i is the aggregation's weight of sequence i (1/B for seq-mean-token-mean, |y_i|/N for token-mean)."""
    s, _, s_tilde = _dfpo_reference(bt, transform, el, eh)
    kappa = ref.sequence_weight_in_loss(bt.mask, agg)
    a = bt.adv.tolist()
    loss = -sum(k * ai * st for k, ai, st in zip(kappa, a, s_tilde, strict=True))
    grad = torch.zeros_like(bt.logp)
    for i in range(len(s)):
        n = int(bt.mask[i].sum())
        if estimator == "paper" or not ref.is_clipped(s[i], a[i], el, eh):
            grad[i, :n] = -kappa[i] * a[i] * s_tilde[i] / n
    return loss, grad


def _dfpo_batch(seed: int) -> Batch:
    return make_batch(seed, token_spread=0.4, seq_log_ratio=(-0.45, 0.45))


@pytest.mark.parametrize("transform", TRANSFORM_NAMES)
@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("estimator", [None, "paper", "ppo_clip"])
def test_dfpo_stop_grad_gradient(transform: str, agg: str, seed: int, estimator: str | None) -> None:
    el, eh = 0.2, 0.28
    bt = _dfpo_batch(seed)
    assert _seq_categories(bt, el, eh) == {"clipped", "inside", "outside_unclipped"}
    est = {} if estimator is None else {"estimator": estimator}
    loss, g = loss_grad(
        run("dfpo", bt, aggregation=agg, transform=transform, epsilon_low=el, epsilon_high=eh, **est), bt.logp
    )
    want_loss, want_g = _dfpo_stopgrad_grad(bt, transform, agg, el, eh, estimator or "paper")
    assert float(loss) == pytest.approx(want_loss, abs=1e-12)
    assert_close(g, want_g)
    if agg == "seq-mean-token-mean":
        # loss value = −(1/B) Σ Â_i s̃_i
        _, _, s_tilde = _dfpo_reference(bt, transform, el, eh)
        b = bt.mask.shape[0]
        assert float(loss) == pytest.approx(
            -sum(float(bt.adv[i]) * s_tilde[i] for i in range(b)) / b, abs=1e-12
        )


def test_dfpo_defaults_are_min_replace_gspo_eps_seq_mean_token_mean() -> None:
    bt = make_batch(12, token_spread=0.3, seq_log_ratio=(-2e-3, 2e-3))
    assert _seq_categories(bt, 3e-4, 4e-4) == {"clipped", "inside", "outside_unclipped"}
    loss, g = loss_grad(run("dfpo", bt), bt.logp)
    want_loss, want_g = _dfpo_stopgrad_grad(bt, "min_replace", "seq-mean-token-mean", 3e-4, 4e-4)
    assert float(loss) == pytest.approx(want_loss, abs=1e-12)
    assert_close(g, want_g)


@pytest.mark.parametrize("transform", TRANSFORM_NAMES)
@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum"])
def test_dfpo_no_stop_grad_equals_autograd_through_reference(transform: str, agg: str) -> None:
    el, eh = 0.2, 0.28
    bt = _dfpo_batch(3)
    got = loss_grad(
        run(
            "dfpo", bt, aggregation=agg, transform=transform, stop_grad=False, epsilon_low=el, epsilon_high=eh
        ),
        bt.logp,
    )

    def reference(x: Tensor) -> Tensor:
        _, _, s_tilde = ref.dfpo_weights(x, bt.old_logp, bt.adv, bt.mask, bt.group, transform, el, eh)
        return ref.reduce(ref.dfpo_per_token_loss(s_tilde, bt.adv, bt.mask), bt.mask, agg)

    want = loss_grad(reference, bt.logp)
    assert_close(got[0], want[0])
    assert_close(got[1], want[1], tol=1e-10)


@pytest.mark.parametrize("transform", ["min_replace", "orth_proj"])
def test_dfpo_no_stop_grad_loss_is_identically_zero_under_seq_mean_token_mean(transform: str) -> None:
    """Finding: Table 3's "no stop-grad" ablation learns nothing under seq-mean-token-mean.

    With zero-sum group advantages, seq-mean-token-mean weighs every sequence's term −Â_i s̃_i by the same
    1/B, so the loss is −(1/B) Σ_groups Σ_i Â_i s̃_i. Min-Replace makes s̃ constant in the group (Σ Â_i·const
    = const·Σ Â_i = 0) and Orth-Proj makes Σ Â_i s̃_i = 0 by construction (eq. 63): the loss is 0 for every θ,
    so its gradient through the transform is 0 too. The ablation only learns through aggregations that weigh
    sequences unequally (token-mean, seq-mean-token-sum with unequal lengths). With stop-gradient the value
    is still 0 but the gradient is not (App. D: Σ s̃Â = 0 does not imply a zero gradient).
    """
    el, eh = 0.2, 0.28
    bt = _dfpo_batch(4)
    kw = {"transform": transform, "epsilon_low": el, "epsilon_high": eh}
    loss, g = loss_grad(run("dfpo", bt, aggregation="seq-mean-token-mean", stop_grad=False, **kw), bt.logp)
    # zero up to the rounding of Σ Â_i (·s̃_i, s̃ < 2 here; its derivative too) over the batch's tokens
    zero = rounding_tolerance(2 * float(bt.adv.abs().sum()), int(bt.mask.sum()), F64)
    assert abs(float(loss)) <= zero
    assert float(g.abs().max()) <= zero
    _, g_tok = loss_grad(run("dfpo", bt, aggregation="token-mean", stop_grad=False, **kw), bt.logp)
    assert float(g_tok.abs().max()) > 1e-3
    loss_sg, g_sg = loss_grad(
        run("dfpo", bt, aggregation="seq-mean-token-mean", stop_grad=True, **kw), bt.logp
    )
    assert abs(float(loss_sg)) <= zero
    assert float(g_sg.abs().max()) > 1e-3


@pytest.mark.parametrize("transform", TRANSFORM_NAMES)
@pytest.mark.parametrize("stop_grad", [True, False])
def test_dfpo_zero_advantage_group_contributes_nothing(transform: str, stop_grad: bool) -> None:
    el, eh = 0.2, 0.28
    bt = _dfpo_batch(5)
    zero_gid = 3
    bt.adv = torch.where(bt.group == zero_gid, torch.zeros_like(bt.adv), bt.adv)
    loss, g = loss_grad(
        run("dfpo", bt, transform=transform, stop_grad=stop_grad, epsilon_low=el, epsilon_high=eh), bt.logp
    )
    assert float(g[bt.group == zero_gid].abs().sum()) == 0.0
    # the loss is the other groups' −(1/B) Σ Â_i s̃_i alone
    _, _, s_tilde = _dfpo_reference(bt, transform, el, eh)
    b = bt.mask.shape[0]
    others = [i for i in range(b) if int(bt.group[i]) != zero_gid]
    assert float(loss) == pytest.approx(-sum(float(bt.adv[i]) * s_tilde[i] for i in others) / b, abs=1e-12)


@pytest.mark.parametrize("transform", TRANSFORM_NAMES)
@pytest.mark.parametrize("stop_grad", [True, False])
def test_dfpo_one_sided_groups(transform: str, stop_grad: bool) -> None:
    """Advantages passed by hand, not zero-sum: a group all ≥ 0 (with an Â = 0), a group all < 0."""
    el, eh = 0.2, 0.28
    bt = make_batch(6, token_spread=0.4, seq_log_ratio=(-0.45, 0.45), groups=((5, 3), (9, 2), (2, 3)))
    hand = {5: [0.7, 0.0, 1.3], 9: [-0.4, -1.0], 2: [1.0, -0.5, -0.5]}
    pos = {k: 0 for k in hand}
    adv = []
    for gid in bt.group.tolist():
        adv.append(hand[gid][pos[gid]])
        pos[gid] += 1
    bt.adv = torch.tensor(adv, dtype=F64)
    kw = {"transform": transform, "stop_grad": stop_grad, "epsilon_low": el, "epsilon_high": eh}
    loss, g = loss_grad(run("dfpo", bt, **kw), bt.logp)
    assert torch.isfinite(loss) and bool(torch.isfinite(g).all())
    _, metrics = compute_loss("dfpo", bt.logp, bt.old_logp, bt.adv, bt.mask, bt.group, **kw)
    assert all(math.isfinite(v) for v in metrics.values())
    if stop_grad:
        want_loss, want_g = _dfpo_stopgrad_grad(bt, transform, "seq-mean-token-mean", el, eh)
        assert float(loss) == pytest.approx(want_loss, abs=1e-12)
        assert_close(g, want_g)
    else:

        def reference(x: Tensor) -> Tensor:
            _, _, s_tilde = ref.dfpo_weights(x, bt.old_logp, bt.adv, bt.mask, bt.group, transform, el, eh)
            return ref.reduce(
                ref.dfpo_per_token_loss(s_tilde, bt.adv, bt.mask), bt.mask, "seq-mean-token-mean"
            )

        want = loss_grad(reference, bt.logp)
        assert_close(loss, want[0])
        assert_close(g, want[1], tol=1e-10)


def _boundary_batch(log_r0: float) -> Batch:
    old = torch.tensor([[-1.0], [-2.0]], dtype=F64)
    logp = old + torch.tensor([[log_r0], [0.05]], dtype=F64)
    return Batch(
        logp,
        old,
        torch.tensor([1.0, -1.0], dtype=F64),
        torch.ones(2, 1, dtype=torch.bool),
        torch.tensor([0, 0]),
    )


@pytest.mark.parametrize("transform", TRANSFORM_NAMES)
def test_dfpo_clip_boundary_and_clipped_sequences_stay_clipped(transform: str) -> None:
    """``ppo_clip`` variant: s̄ exactly at 1 + ε_high with Â > 0: a finite gradient, between the two
    one-sided limits (0 from outside, the unclipped coefficient from inside). Beyond the boundary:
    exactly zero gradient (the paper's estimator instead keeps it: see the test below)."""
    x = float(torch.exp(torch.tensor(0.1, dtype=F64)))
    eh = x - 1.0  # exact: 1 + (x − 1) == x for x in [1, 2]
    assert 1.0 + eh == x
    bt = _boundary_batch(0.1)
    kw = {"transform": transform, "epsilon_low": 0.2, "epsilon_high": eh, "estimator": "ppo_clip"}
    _, g = loss_grad(run("dfpo", bt, **kw), bt.logp)
    assert bool(torch.isfinite(g).all())
    _, _, s_tilde = _dfpo_reference(bt, transform, 0.2, eh)
    inside = -1.0 * s_tilde[0] / 2  # −Â_0 s̃_0 / (B |y_0|)
    assert min(0.0, inside) - 1e-15 <= float(g[0, 0]) <= max(0.0, inside) + 1e-15

    for stop_grad in (True, False):
        beyond = _boundary_batch(0.1 + 1e-3)
        _, g2 = loss_grad(run("dfpo", beyond, stop_grad=stop_grad, **kw), beyond.logp)
        assert float(g2[0, 0]) == 0.0


# ------------------------------------------------------------------------------------------------
# KL


@pytest.mark.parametrize("name", ["grpo", "grpo_symclip", "gspo", "dfpo"])
@pytest.mark.parametrize("agg", [None, "token-mean", "seq-mean-token-sum"])
def test_kl_term(name: str, agg: str | None) -> None:
    bt = make_batch(13, token_spread=0.3, seq_log_ratio=(-2e-3, 2e-3))
    gen = torch.Generator().manual_seed(0)
    ref_logp = torch.where(
        bt.mask, bt.logp + 0.3 * torch.randn(bt.logp.shape, generator=gen, dtype=F64), -1e4
    )
    beta = 0.04
    ref_agg = agg or ("token-mean" if name.startswith("grpo") else "seq-mean-token-mean")
    base = loss_grad(run(name, bt, aggregation=agg), bt.logp)
    with_kl = loss_grad(run(name, bt, aggregation=agg, beta=beta, ref_logp=ref_logp), bt.logp)
    kl = loss_grad(lambda x: ref.reduce(ref.k3_per_token(x, ref_logp, bt.mask), bt.mask, ref_agg), bt.logp)
    assert_close(with_kl[0] - base[0], beta * kl[0])
    assert_close(with_kl[1] - base[1], beta * kl[1])
    _, metrics = compute_loss(
        name, bt.logp, bt.old_logp, bt.adv, bt.mask, bt.group, aggregation=agg, beta=beta, ref_logp=ref_logp
    )
    assert metrics["kl"] == pytest.approx(
        float(ref.reduce(ref.k3_per_token(bt.logp, ref_logp, bt.mask), bt.mask, "bnpo"))
    )
    assert metrics["loss"] == pytest.approx(float(with_kl[0]), abs=1e-14)


@pytest.mark.parametrize("name", ["grpo", "grpo_symclip", "gspo", "dfpo"])
def test_padding_never_leaks(name: str) -> None:
    """NaN / huge values on padded positions of logp, old_logp and ref_logp leave loss and gradient finite."""
    bt = make_batch(14, token_spread=0.3, seq_log_ratio=(-2e-3, 2e-3))
    pad = ~bt.mask
    bt.logp = torch.where(pad, torch.full_like(bt.logp, float("nan")), bt.logp)
    bt.old_logp = torch.where(pad, torch.full_like(bt.logp, -1e30), bt.old_logp)
    ref_logp = torch.where(pad, torch.full_like(bt.logp, 1e4), bt.old_logp)
    loss, g = loss_grad(run(name, bt, beta=0.1, ref_logp=ref_logp), bt.logp)
    assert torch.isfinite(loss) and bool(torch.isfinite(g).all())
    assert float(g[pad].abs().sum()) == 0.0


def test_kl_needs_ref_logp() -> None:
    bt = make_batch(0)
    for name in OBJECTIVES:
        with pytest.raises(ValueError, match="beta > 0 needs `ref_logp`"):
            compute_loss(name, bt.logp, bt.old_logp, bt.adv, bt.mask, bt.group, beta=0.1)
    with pytest.raises(ValueError, match="ref_logp"):
        compute_loss(
            "grpo", bt.logp, bt.old_logp, bt.adv, bt.mask, bt.group, beta=0.1, ref_logp=bt.logp[:, :3]
        )


# ------------------------------------------------------------------------------------------------
# metrics


@pytest.mark.parametrize("name", ["grpo", "grpo_symclip", "gspo", "dfpo"])
def test_metrics_keys_and_finiteness(name: str) -> None:
    bt = make_batch(15, token_spread=0.3, seq_log_ratio=(-2e-3, 2e-3))
    loss, metrics = compute_loss(name, bt.logp, bt.old_logp, bt.adv, bt.mask, bt.group)
    assert list(metrics) == list(METRIC_KEYS)
    assert all(type(v) is float and math.isfinite(v) for v in metrics.values())
    assert metrics["loss"] == float(loss)
    assert metrics["objective"] == pytest.approx(-float(loss), abs=1e-15)
    assert metrics["kl"] == 0.0
    loss2, none = compute_loss(name, bt.logp, bt.old_logp, bt.adv, bt.mask, bt.group, with_metrics=False)
    assert none == {} and float(loss2) == float(loss)


@pytest.mark.parametrize("transform", TRANSFORM_NAMES)
def test_asym_dfpo(transform: str) -> None:
    """Eq. (23) with w_i = s̃_i (the transformed weight)."""
    el, eh = 0.2, 0.28
    bt = _dfpo_batch(16)
    _, m = compute_loss(
        "dfpo",
        bt.logp,
        bt.old_logp,
        bt.adv,
        bt.mask,
        bt.group,
        transform=transform,
        epsilon_low=el,
        epsilon_high=eh,
    )
    _, _, s_tilde = _dfpo_reference(bt, transform, el, eh)
    assert m["asym"] == pytest.approx(
        ref.asym_floats(s_tilde, bt.adv.tolist(), bt.group), rel=1e-10, abs=1e-15
    )
    if transform == "min_replace":
        assert m["asym"] > 0  # s̃ constant per group, but Var(const·Â) = const²·Var(Â) ≠ 0
    assert m["weight/mean"] == pytest.approx(sum(s_tilde) / len(s_tilde), rel=1e-12)


def test_asym_gspo_grpo_symclip() -> None:
    """Eq. (23) with w_i = s̄_i for gspo; for the token-level objectives w_i is (documented choice) the
    sequence's mean post-clip token weight: mean_t s̄(r_{i,t}) for grpo, mean_t clip(r_{i,t}, 0, 1+ε) for symclip."""
    el, eh = 0.2, 0.28
    bt = make_batch(17, token_spread=0.4, seq_log_ratio=(-0.45, 0.45))
    adv = bt.adv.tolist()
    b, t = bt.mask.shape
    s = [float(x) for x in ref.sequence_ratios(bt.logp, bt.old_logp, bt.mask)]
    _, m = compute_loss(
        "gspo", bt.logp, bt.old_logp, bt.adv, bt.mask, bt.group, epsilon_low=el, epsilon_high=eh
    )
    s_bar = [ref.post_clip_float(s[i], adv[i], el, eh) for i in range(b)]
    assert m["asym"] == pytest.approx(ref.asym_floats(s_bar, adv, bt.group), rel=1e-10)
    assert m["seq_ratio/mean"] == pytest.approx(sum(s) / b, rel=1e-12)

    r = (bt.logp - bt.old_logp).exp().tolist()
    w_grpo, w_sym = [], []
    for i in range(b):
        toks = [r[i][k] for k in range(t) if bt.mask[i, k]]
        w_grpo.append(sum(ref.post_clip_float(x, adv[i], el, eh) for x in toks) / len(toks))
        w_sym.append(sum(min(x, 1 + eh) for x in toks) / len(toks))
    _, m = compute_loss(
        "grpo", bt.logp, bt.old_logp, bt.adv, bt.mask, bt.group, epsilon_low=el, epsilon_high=eh
    )
    assert m["asym"] == pytest.approx(ref.asym_floats(w_grpo, adv, bt.group), rel=1e-10)
    _, m = compute_loss("grpo_symclip", bt.logp, bt.old_logp, bt.adv, bt.mask, bt.group, epsilon=eh)
    assert m["asym"] == pytest.approx(ref.asym_floats(w_sym, adv, bt.group), rel=1e-10)


def _hand_batch(ratios: list[list[float]], lengths: list[int], adv: list[float], group: list[int]) -> Batch:
    t = max(len(r) for r in ratios)
    old = torch.full((len(ratios), t), -1.0, dtype=F64)
    logp = old.clone()
    for i, row in enumerate(ratios):
        for k, x in enumerate(row):
            logp[i, k] += math.log(x)
    mask = torch.tensor([[k < n for k in range(t)] for n in lengths])
    return Batch(logp, old, torch.tensor(adv, dtype=F64), mask, torch.tensor(group))


def test_clip_fractions_token_level_by_hand() -> None:
    # ε_low = 0.2, ε_high = 0.28; 10 unmasked tokens
    # seq 0, Â = +1:  r = 1.5 (high-clipped), 1.0, 0.5 (low but Â > 0: not clipped)
    # seq 1, Â = −1:  r = 0.5 (low-clipped), 1.5 (high but Â < 0: not clipped), [pad]
    # seq 2, Â = +.5: r = 2.0 (high-clipped), 1.1, 0.79 (not clipped)
    # seq 3, Â = 0:   r = 1.0, 3.0 (Â = 0: never clipped), [pad]      (group 9: all-zero advantages)
    bt = _hand_batch(
        [[1.5, 1.0, 0.5], [0.5, 1.5, 7.0], [2.0, 1.1, 0.79], [1.0, 3.0, 7.0]],
        [3, 2, 3, 2],
        [1.0, -1.0, 0.5, 0.0],
        [4, 4, 6, 9],
    )
    _, m = compute_loss(
        "grpo", bt.logp, bt.old_logp, bt.adv, bt.mask, bt.group, epsilon_low=0.2, epsilon_high=0.28
    )
    assert m["clip/high_frac"] == pytest.approx(2 / 10)
    assert m["clip/low_frac"] == pytest.approx(1 / 10)
    assert m["clip/frac"] == pytest.approx(3 / 10)
    assert m["ratio/mean"] == pytest.approx((1.5 + 1.0 + 0.5 + 0.5 + 1.5 + 2.0 + 1.1 + 0.79 + 1.0 + 3.0) / 10)
    assert m["ratio/min"] == pytest.approx(0.5)
    assert m["ratio/max"] == pytest.approx(3.0)
    assert m["zero_adv_group_frac"] == pytest.approx(1 / 3)
    # symmetric clipping ε = 0.2: every r > 1.2 whatever the sign: 1.5, 1.5, 2.0, 3.0
    _, m = compute_loss("grpo_symclip", bt.logp, bt.old_logp, bt.adv, bt.mask, bt.group, epsilon=0.2)
    assert m["clip/high_frac"] == pytest.approx(4 / 10)
    assert m["clip/low_frac"] == 0.0
    assert m["clip/frac"] == pytest.approx(4 / 10)


@pytest.mark.parametrize("name", ["gspo", "dfpo"])
def test_clip_fractions_sequence_level_by_hand(name: str) -> None:
    # one token ratio per sequence repeated, so s_i = that ratio; ε = (0.2, 0.28); 10 unmasked tokens
    # seq 0 (3 tokens), Â = +1,  s = 1.5: high-clipped -> 3 tokens
    # seq 1 (2 tokens), Â = −1,  s = 0.5: low-clipped  -> 2 tokens
    # seq 2 (3 tokens), Â = +.5, s = 1.1: inside
    # seq 3 (2 tokens), Â = −.5, s = 3.0: outside but Â < 0: not clipped
    # seq 4 (2 tokens), Â = 0,   s = 2.0: Â = 0 is never counted as clipped (its term is 0 anyway)
    bt = _hand_batch(
        [[1.5] * 3, [0.5, 0.5, 9.0], [1.1] * 3, [3.0, 3.0, 9.0], [2.0, 2.0, 9.0]],
        [3, 2, 3, 2, 2],
        [1.0, -1.0, 0.5, -0.5, 0.0],
        [1, 1, 2, 2, 7],
    )
    _, m = compute_loss(
        name, bt.logp, bt.old_logp, bt.adv, bt.mask, bt.group, epsilon_low=0.2, epsilon_high=0.28
    )
    assert m["clip/high_frac"] == pytest.approx(3 / 12)
    assert m["clip/low_frac"] == pytest.approx(2 / 12)
    assert m["clip/frac"] == pytest.approx(5 / 12)
    assert m["seq_ratio/mean"] == pytest.approx((1.5 + 0.5 + 1.1 + 3.0 + 2.0) / 5)
    assert m["zero_adv_group_frac"] == pytest.approx(1 / 3)


def test_zero_adv_group_frac() -> None:
    bt = make_batch(18)
    for gid in (17, 8):
        bt.adv = torch.where(bt.group == gid, torch.zeros_like(bt.adv), bt.adv)
    bt.adv = torch.where(bt.group == 3, -bt.adv.abs() - 0.1, bt.adv)  # one-sided negative: not a zero group
    # groups: 17 (zeroed), 3 (all < 0), 42 (a group of one: Â = 0), 8 (zeroed) -> 3 of 4
    for name in OBJECTIVES:
        _, m = compute_loss(name, bt.logp, bt.old_logp, bt.adv, bt.mask, bt.group)
        assert m["zero_adv_group_frac"] == pytest.approx(3 / 4)


# ------------------------------------------------------------------------------------------------
# bad input


def test_bad_input_errors() -> None:
    bt = make_batch(19)
    args = (bt.logp, bt.old_logp, bt.adv, bt.mask, bt.group)
    b, t = bt.logp.shape
    with pytest.raises(ValueError, match=r"unknown objective 'ppo'; valid: .*grpo.*grpo_symclip.*gspo.*dfpo"):
        compute_loss("ppo", *args)
    with pytest.raises(
        ValueError, match="parameter `transform`='orth': unknown value; valid: min_replace, orth_proj"
    ):
        compute_loss("dfpo", *args, transform="orth")
    with pytest.raises(
        ValueError, match="unknown aggregation 'mean'; valid: token-mean, seq-mean-token-mean"
    ):
        compute_loss("grpo", *args, aggregation="mean")
    with pytest.raises(ValueError, match="old_logp"):
        compute_loss("grpo", bt.logp, bt.old_logp[:, :-1], bt.adv, bt.mask, bt.group)
    with pytest.raises(ValueError, match="mask"):
        compute_loss("grpo", bt.logp, bt.old_logp, bt.adv, bt.mask[:-1], bt.group)
    with pytest.raises(ValueError, match="advantages"):
        compute_loss("gspo", bt.logp, bt.old_logp, bt.adv[:-1], bt.mask, bt.group)
    with pytest.raises(ValueError, match="advantages"):
        compute_loss("grpo", bt.logp, bt.old_logp, torch.zeros(b, t + 1, dtype=F64), bt.mask, bt.group)
    with pytest.raises(ValueError, match="group"):
        compute_loss("grpo", bt.logp, bt.old_logp, bt.adv, bt.mask, bt.group[:-1])
    with pytest.raises(TypeError, match=r"group.*integer"):
        compute_loss("grpo", bt.logp, bt.old_logp, bt.adv, bt.mask, bt.group.double())
    with pytest.raises(ValueError, match=r"logp.*shape"):
        compute_loss("grpo", bt.logp[0], bt.old_logp, bt.adv, bt.mask, bt.group)
    nan_adv = bt.adv.clone()
    nan_adv[2] = float("nan")
    for name in OBJECTIVES:
        with pytest.raises(ValueError, match=r"advantages.*NaN"):
            compute_loss(name, bt.logp, bt.old_logp, nan_adv, bt.mask, bt.group)
        with pytest.raises(ValueError, match="`mask` selects no token"):
            compute_loss(name, bt.logp, bt.old_logp, bt.adv, torch.zeros_like(bt.mask), bt.group)
        with pytest.raises(
            TypeError, match=rf"objective '{name}' got unknown parameter\(s\): colour, temprature"
        ):
            compute_loss(name, *args, temprature=1.0, colour="red")
    nan_old = bt.old_logp.clone()
    nan_old[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"old_logp.*NaN"):
        compute_loss("grpo", bt.logp, nan_old, bt.adv, bt.mask, bt.group)
    with pytest.raises(ValueError, match=r"dfpo needs one advantage per completion, shape \(B,\)"):
        compute_loss("dfpo", bt.logp, bt.old_logp, bt.adv[:, None].expand(b, t), bt.mask, bt.group)
    with pytest.raises(
        ValueError, match=re.escape("objective 'grpo' parameter `epsilon_low`=1.5: must be in [0, 1)")
    ):
        compute_loss("grpo", *args, epsilon_low=1.5)
    with pytest.raises(
        ValueError, match=re.escape("objective 'grpo_symclip' parameter `epsilon`=-0.1: must be ≥ 0")
    ):
        compute_loss("grpo_symclip", *args, epsilon=-0.1)
    with pytest.raises(TypeError, match=r"unknown parameter\(s\): epsilon"):
        compute_loss("grpo", *args, epsilon=0.2)  # grpo's clip range is epsilon_low / epsilon_high


def test_group_asym_equals_a_plain_loop_on_shuffled_unequal_groups() -> None:
    from cancellation.objectives import group_asym

    gen = torch.Generator().manual_seed(7)
    group = torch.tensor([5, 2, 5, 9, 2, 2, 9, 5, 11])
    w = torch.rand(9, generator=gen, dtype=torch.float64) + 0.5
    a = torch.randn(9, generator=gen, dtype=torch.float64)
    assert float(group_asym(w, a, group)) == pytest.approx(
        ref.asym_floats(w.tolist(), a.tolist(), group), rel=1e-12
    )
    with pytest.raises(ValueError, match="advantages"):
        group_asym(w, a[:3], group)


# ------------------------------------------------------------------------------------------------
# the paper's stop-gradient estimator on a hand-worked clipped group (DFPO eq. 16/68/86/91)


def _clipped_group() -> tuple[Batch, list[float], list[float]]:
    """One group of 4 equal-length (3-token) completions; token 0 is the same context-token pair in all
    four (a whole-group shared token). With ε = 0.2 and the sequence log-ratios below, rows 0 and 3 are
    clipped on the side that binds: s̄ = (1.2, 0.9, 1.1, 0.8) by hand (eq. 47)."""
    old = torch.tensor([[-1.0, -0.5, -2.0]] * 4, dtype=F64)
    log_s = [math.log(1.5), math.log(0.9), math.log(1.1), math.log(0.6)]
    logp = old + torch.tensor([[v, v, v] for v in log_s], dtype=F64)
    adv = torch.tensor([1.2, -0.4, 0.6, -1.4], dtype=F64)
    s_bar = [1.2, 0.9, 1.1, 0.8]  # Â ≥ 0: min(s, 1.2); Â < 0: max(s, 0.8)
    return (
        Batch(logp, old, adv, torch.ones(4, 3, dtype=torch.bool), torch.zeros(4, dtype=torch.long)),
        log_s,
        s_bar,
    )


def _hand_transform(name: str, s_bar: list[float], adv: list[float]) -> list[float]:
    if name == "min_replace":  # eq. (50)
        return [min(s_bar)] * len(s_bar)
    dot = sum(a * s for a, s in zip(adv, s_bar, strict=True))
    n2 = sum(a * a for a in adv)
    proj = [s - dot / n2 * a for s, a in zip(s_bar, adv, strict=True)]  # eq. (18)
    if name == "orth_proj" or min(proj) >= 0:  # here every projected weight stays positive
        return proj
    raise AssertionError("the hand-worked group keeps positive weights")


@pytest.mark.parametrize("transform", TRANSFORM_NAMES)
def test_dfpo_paper_estimator_hand_worked_clipped_group(transform: str) -> None:
    bt, _, s_bar = _clipped_group()
    a = bt.adv.tolist()
    if transform == "truncate_rebalance":
        # eq. (52)-(55) by hand: δ = Σ Â s̄ = 1.44 − 0.36 + 0.66 − 1.12 = 0.62 > 0, so the positive side is
        # scaled by α = 1.48 / 2.10
        alpha = (0.36 + 1.12) / (1.44 + 0.66)
        s_tilde = [s_bar[0] * alpha, s_bar[1], s_bar[2] * alpha, s_bar[3]]
    else:
        s_tilde = _hand_transform("orth_proj" if transform == "orth_proj_pos" else transform, s_bar, a)
    assert sum(ai * st for ai, st in zip(a, s_tilde, strict=True)) == pytest.approx(0.0, abs=1e-12)
    kw = {"transform": transform, "epsilon_low": 0.2, "epsilon_high": 0.2}
    _, g = loss_grad(run("dfpo", bt, **kw), bt.logp)
    coef = -g  # ∂J/∂logp
    b, length = 4, 3
    for i in range(b):
        want = s_tilde[i] * a[i] / (length * b)  # s̃_i·Â_i·α_{i,t}/B with α = 1/|y_i|
        for t in range(length):
            assert float(coef[i, t]) == pytest.approx(want, abs=1e-12)
    assert abs(float(coef[0, 0])) > 0.05 and abs(float(coef[3, 0])) > 0.05  # clipped rows keep a gradient
    # the shared token: net coefficient exactly 0
    assert float(coef[:, 0].sum()) == pytest.approx(0.0, abs=1e-15)
    # the trust-region variant silences the clipped rows, and the shared token no longer cancels
    _, g_tr = loss_grad(run("dfpo", bt, estimator="ppo_clip", **kw), bt.logp)
    assert float(g_tr[0].abs().sum()) == 0.0 and float(g_tr[3].abs().sum()) == 0.0
    assert abs(float(g_tr[:, 0].sum())) > 1e-3


def test_gspo_paper_estimator_is_eq_86() -> None:
    """estimator='paper': every row gets s̄_i·Â_i·∇log s_i (eq. 86), clipped rows too; the value is eq. (42)'s."""
    bt, _, s_bar = _clipped_group()
    a = bt.adv.tolist()
    kw = {"epsilon_low": 0.2, "epsilon_high": 0.2}
    loss, g = loss_grad(run("gspo", bt, estimator="paper", **kw), bt.logp)
    loss_clip, g_clip = loss_grad(run("gspo", bt, **kw), bt.logp)
    assert float(loss) == pytest.approx(-sum(ai * s for ai, s in zip(a, s_bar, strict=True)) / 4, abs=1e-12)
    assert float(loss) == pytest.approx(float(loss_clip), abs=1e-12)
    for i in range(4):
        assert float(-g[i, 1]) == pytest.approx(s_bar[i] * a[i] / 12, abs=1e-12)
    # GSPO's own objective silences the two clipped rows; the unclipped rows agree
    assert float(g_clip[0].abs().sum()) == 0.0 and float(g_clip[3].abs().sum()) == 0.0
    assert_close(g_clip[1:3], g[1:3])
    # no transform: the shared token does not cancel (Σ Â s̄ = 0.62 ≠ 0)
    assert float(-g[:, 0].sum()) == pytest.approx(0.62 / 12, abs=1e-12)


def test_unknown_estimator_names_the_valid_ones() -> None:
    bt, _, _ = _clipped_group()
    for name in ("gspo", "dfpo"):
        with pytest.raises(ValueError, match=r"estimator.*paper, ppo_clip"):
            compute_loss(name, bt.logp, bt.old_logp, bt.adv, bt.mask, bt.group, estimator="clip")


@pytest.mark.parametrize("transform", TRANSFORM_NAMES)
def test_dfpo_rows_outside_the_loss_take_no_part_in_the_transform(transform: str) -> None:
    """A row with an all-zero mask (a truncated completion left out of the loss, Â = 0) changes nobody's s̃."""
    bt, _, _ = _clipped_group()
    kw = {"transform": transform, "epsilon_low": 0.2, "epsilon_high": 0.2}
    _, g = loss_grad(run("dfpo", bt, **kw), bt.logp)
    # add a fifth row to the group with s = 1 (it would lower Min-Replace's minimum if it took part) and
    # a tiny ratio (s̄ = 0.8 for either sign) on a zero mask
    extra = Batch(
        torch.cat([bt.logp, bt.old_logp[:1] - 3.0]),
        torch.cat([bt.old_logp, bt.old_logp[:1]]),
        torch.cat([bt.adv, torch.zeros(1, dtype=F64)]),
        torch.cat([bt.mask, torch.zeros(1, 3, dtype=torch.bool)]),
        torch.zeros(5, dtype=torch.long),
    )
    _, g5 = loss_grad(run("dfpo", extra, aggregation="token-mean", **kw), extra.logp)
    _, g4 = loss_grad(run("dfpo", bt, aggregation="token-mean", **kw), bt.logp)
    assert_close(g5[:4], g4)
    assert float(g5[4].abs().sum()) == 0.0
    assert g.shape == g4.shape
