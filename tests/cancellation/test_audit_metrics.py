"""Audit tests of cancellation.objectives against numbers computed independently.

1. ``old_logp`` is a constant: passing the very tensor ``logp`` as ``old_logp`` (on-policy, not
   detached) or any graph-connected tensor must give the gradient of ``old_logp.detach()``, the
   closed-form on-policy gradient, not zero.
2. Every ``METRIC_KEYS`` value of grpo, grpo_symclip, gspo and dfpo against a plain-Python loop over
   rows and tokens (no torch vectorisation), on unequal groups, unequal lengths, asymmetric clip bands
   and ratios placed between 1 − ε_high and 1 − ε_low and between 1 + ε_low and 1 + ε_high.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from torch import Tensor

from cancellation import objectives as obj_mod
from cancellation.objectives import METRIC_KEYS, compute_loss, objective_names

from . import reference as ref

#: Every comparison here is between two code paths in float64, at a tolerance well above its
#: rounding (library vs plain loops and autograd): ``tests/exactness.py``.
pytestmark = pytest.mark.exactness

F64 = torch.float64
TRANSFORMS = ["min_replace", "orth_proj", "orth_proj_pos", "truncate_rebalance"]
#: the ``estimator`` values of the sequence-level objectives (only the default when the keyword is absent)
ESTIMATORS: tuple[str | None, ...] = tuple(getattr(obj_mod, "ESTIMATORS", ())) or (None,)
GROUPS = ((17, 3), (3, 5), (42, 1), (8, 2), (250, 6), (61, 7), (9, 4))  # (prompt id, size)
ZERO_GROUP = 9  # its rewards are all equal: zero advantages


def _configs() -> list[tuple[str, dict]]:
    """(objective, params) for every objective and every transform / estimator of dfpo and gspo."""
    out: list[tuple[str, dict]] = []
    for name in objective_names():
        if name == "dfpo":
            for tr in TRANSFORMS:
                for est in ESTIMATORS:
                    out.append((name, {"transform": tr} | ({"estimator": est} if est else {})))
        elif name == "gspo":
            for est in ESTIMATORS:
                out.append((name, {"estimator": est} if est else {}))
        else:
            out.append((name, {}))
    return out


def _ids(cfg: tuple[str, dict]) -> str:
    return "-".join([cfg[0], *map(str, cfg[1].values())])


# ------------------------------------------------------------------------------------------------
# batches


def _batch(
    seed: int, *, t: int = 9, targets: list[float] | None = None, token_ratios: list[float] | None = None
):
    """Shuffled unequal groups (one of size 1, one with all-zero advantages), lengths 1..t.

    ``targets``: each row's sequence ratio s_i = exp(mean_t log r) is set exactly to a target, cycled
    through separately for rows with Â > 0 and rows with Â < 0 (so each sign meets every target).
    ``token_ratios``: each token's ratio r is drawn from this list instead."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    gids = [g for g, n in GROUPS for _ in range(n)]
    rng.shuffle(gids)
    b = len(gids)
    lengths = [rng.randint(1, t) for _ in range(b)]
    lengths[0], lengths[-1] = t, 1
    mask = torch.tensor([[k < n for k in range(t)] for n in lengths])
    rewards = [0.5 if g == ZERO_GROUP else rng.uniform(0.0, 1.0) for g in gids]
    adv = ref.group_advantages_floats(rewards, gids)
    old = (-torch.rand(b, t, generator=gen, dtype=F64) * 3.0).tolist()
    logp = [[0.0] * t for _ in range(b)]
    counters = {1: 0, -1: 0, 0: 0}
    for i in range(b):
        n = lengths[i]
        if token_ratios is not None:
            lr = [math.log(rng.choice(token_ratios)) for _ in range(n)]
        else:
            sign = (adv[i] > 0) - (adv[i] < 0)
            tgt = targets[(counters[sign] + 3 * sign) % len(targets)]
            counters[sign] += 1
            noise = [rng.gauss(0.0, 0.3) for _ in range(n)]
            mu = sum(noise) / n
            lr = [math.log(tgt) + x - mu for x in noise]
        for k in range(t):
            logp[i][k] = old[i][k] + lr[k] if k < n else 50.0  # garbage on padding
    return (
        torch.tensor(logp, dtype=F64),
        torch.tensor(old, dtype=F64),
        torch.tensor(adv, dtype=F64),
        mask,
        torch.tensor(gids),
    )


# ------------------------------------------------------------------------------------------------
# 1. old_logp is a constant


def _grad(name: str, params: dict, logp: Tensor, old_fn, adv: Tensor, mask: Tensor, group: Tensor) -> Tensor:
    x = logp.detach().clone().requires_grad_(True)
    loss, _ = compute_loss(name, x, old_fn(x), adv, mask, group, **params)
    (g,) = torch.autograd.grad(loss, x)
    return g


@pytest.mark.parametrize("cfg", _configs(), ids=_ids)
def test_old_logp_is_detached_on_policy(cfg: tuple[str, dict]) -> None:
    """On-policy (old_logp is logp itself): r = s = 1, s̄ = 1, s̃ = 1 (zero-sum advantages), so the
    gradient is the score function: −Â_i/N on each token (token-mean, grpo and grpo_symclip) and
    −Â_i/(B·|y_i|) (seq-mean-token-mean, gspo and dfpo). Without the detach it would be 0."""
    name, params = cfg
    logp, _, adv, mask, group = _batch(0, targets=[1.0])
    g_same = _grad(name, params, logp, lambda x: x, adv, mask, group)
    g_det = _grad(name, params, logp, lambda x: x.detach(), adv, mask, group)
    b, t = mask.shape
    n_tok = int(mask.sum())
    lengths = mask.sum(-1).tolist()
    a = adv.tolist()
    want = torch.zeros(b, t, dtype=F64)
    for i in range(b):
        for k in range(t):
            if mask[i, k]:
                want[i, k] = -a[i] / n_tok if name.startswith("grpo") else -a[i] / (b * lengths[i])
    torch.testing.assert_close(g_det, want, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(g_same, want, rtol=1e-12, atol=1e-15)
    assert float(g_same.abs().sum()) > 0.1 * float(want.abs().sum()) > 0


@pytest.mark.parametrize("cfg", _configs(), ids=_ids)
def test_old_logp_is_detached_off_policy(cfg: tuple[str, dict]) -> None:
    """old_logp = logp + c, a tensor on logp's graph: still the gradient with old_logp detached."""
    name, params = cfg
    logp, old, adv, mask, group = _batch(1, targets=[0.97, 0.9995, 1.0, 1.0002, 1.03])
    shift = (old - logp).masked_fill(~mask, 0.0)
    params = params | {"epsilon_low": 0.02, "epsilon_high": 0.02} if name != "grpo_symclip" else params
    g_graph = _grad(name, params, logp, lambda x: x + shift, adv, mask, group)
    g_det = _grad(name, params, logp, lambda x: (x + shift).detach(), adv, mask, group)
    torch.testing.assert_close(g_graph, g_det, rtol=1e-12, atol=1e-15)
    assert float(g_det.abs().sum()) > 0


# ------------------------------------------------------------------------------------------------
# 2. metrics against a plain loop


def _agg_floats(v: list[list[float]], keep: list[list[bool]], mode: str) -> float:
    b, t = len(v), len(v[0])
    lens = [sum(keep[i]) for i in range(b)]
    sums = [sum(v[i][k] for k in range(t) if keep[i][k]) for i in range(b)]
    if mode == "token-mean":
        return sum(sums) / sum(lens)
    if mode == "seq-mean-token-mean":
        return sum(s / max(n, 1) for s, n in zip(sums, lens, strict=True)) / b
    if mode == "seq-mean-token-sum":
        return sum(sums) / b
    if mode == "seq-mean-token-sum-norm":
        return sum(sums) / (b * t)
    raise KeyError(mode)


def _post_clip(x: float, a: float, el: float, eh: float) -> float:
    # DFPO eq. (47) by cases: min(x, 1 + ε_high) for Â ≥ 0, max(x, 1 − ε_low) for Â < 0
    return min(x, 1.0 + eh) if a >= 0 else max(x, 1.0 - el)


def loop_metrics(
    name: str,
    logp: Tensor,
    old: Tensor,
    adv: Tensor,
    mask: Tensor,
    group: Tensor,
    *,
    eps: tuple[float, float],
    aggregation: str,
    transform: str = "min_replace",
    beta: float = 0.0,
    ref_logp: Tensor | None = None,
) -> dict[str, float]:
    """Every METRIC_KEYS value by plain loops over rows and tokens (adv (B,) or (B, T))."""
    el, eh = eps
    lp, ol, keep = logp.tolist(), old.tolist(), mask.bool().tolist()
    b, t = len(lp), len(lp[0])
    a_tok = [[float(adv[i, k]) if adv.dim() == 2 else float(adv[i]) for k in range(t)] for i in range(b)]
    rows = [[k for k in range(t) if keep[i][k]] for i in range(b)]
    r = [[math.exp(lp[i][k] - ol[i][k]) if keep[i][k] else 0.0 for k in range(t)] for i in range(b)]
    a_seq = [sum(a_tok[i][k] for k in rows[i]) / max(len(rows[i]), 1) for i in range(b)]
    log_s = [sum(lp[i][k] - ol[i][k] for k in rows[i]) / len(rows[i]) for i in range(b)]
    s = [math.exp(x) for x in log_s]

    obj = [[0.0] * t for _ in range(b)]
    low = [[False] * t for _ in range(b)]
    high = [[False] * t for _ in range(b)]
    w = [0.0] * b
    for i in range(b):
        for k in rows[i]:
            a, x = a_tok[i][k], r[i][k]
            if name == "grpo":
                obj[i][k] = min(x * a, min(max(x, 1 - el), 1 + eh) * a)
                low[i][k] = x < 1 - el and a < 0
                high[i][k] = x > 1 + eh and a > 0
            elif name == "grpo_symclip":
                obj[i][k] = a * min(max(x, 0.0), 1 + eh)
                high[i][k] = x > 1 + eh
            else:
                low[i][k] = s[i] < 1 - el and a_seq[i] < 0
                high[i][k] = s[i] > 1 + eh and a_seq[i] > 0
                if name == "gspo":
                    obj[i][k] = min(s[i] * a, min(max(s[i], 1 - el), 1 + eh) * a)
        if name == "grpo":
            w[i] = sum(_post_clip(r[i][k], a_tok[i][k], el, eh) for k in rows[i]) / len(rows[i])
        elif name == "grpo_symclip":
            w[i] = sum(min(r[i][k], 1 + eh) for k in rows[i]) / len(rows[i])
        elif name == "gspo":
            w[i] = _post_clip(s[i], a_seq[i], el, eh)
    if name == "dfpo":
        s_bar = torch.tensor([_post_clip(s[i], a_seq[i], el, eh) for i in range(b)], dtype=F64)
        w = ref.REF_TRANSFORMS[transform](s_bar, adv, group).tolist()
        for i in range(b):
            for k in rows[i]:
                obj[i][k] = a_seq[i] * w[i]

    kl = [[0.0] * t for _ in range(b)]
    if beta:
        rl = ref_logp.tolist()
        for i in range(b):
            for k in rows[i]:
                d = rl[i][k] - lp[i][k]
                kl[i][k] = math.exp(d) - d - 1.0
    loss_tok = [[-obj[i][k] + beta * kl[i][k] for k in range(t)] for i in range(b)]
    n_tok = sum(len(x) for x in rows)
    valid_r = [r[i][k] for i in range(b) for k in rows[i]]

    groups = ref.groups_of(group)
    stds, variances, zero = [], [], 0
    for idx in groups.values():
        g = len(idx)
        mu = sum(w[i] for i in idx) / g
        stds.append(math.sqrt(sum((w[i] - mu) ** 2 for i in idx) / g))
        mods = [w[i] * a_seq[i] for i in idx]
        mm = sum(mods) / g
        variances.append(sum((x - mm) ** 2 for x in mods) / g)
        zero += all(a_seq[i] == 0 for i in idx)
    n_low = sum(low[i][k] for i in range(b) for k in rows[i])
    n_high = sum(high[i][k] for i in range(b) for k in rows[i])
    n_any = sum(low[i][k] or high[i][k] for i in range(b) for k in rows[i])
    return {
        "loss": _agg_floats(loss_tok, keep, aggregation),
        "objective": _agg_floats(obj, keep, aggregation),
        "clip/low_frac": n_low / n_tok,
        "clip/high_frac": n_high / n_tok,
        "clip/frac": n_any / n_tok,
        "ratio/mean": sum(valid_r) / n_tok,
        "ratio/min": min(valid_r),
        "ratio/max": max(valid_r),
        "seq_ratio/mean": sum(s) / b,
        "weight/mean": sum(w) / b,
        "weight/group_std": sum(stds) / len(stds),
        "asym": sum(variances) / len(variances),
        "zero_adv_group_frac": zero / len(groups),
        "kl": sum(kl[i][k] for i in range(b) for k in rows[i]) / n_tok,
    }


#: token ratios / sequence ratios spread over every region of both asymmetric bands below:
#: < 0.7, (0.7, 0.9), (0.9, 1.1), (1.1, 1.3), > 1.3
RATIOS = [0.5, 0.75, 0.85, 0.95, 1.0, 1.05, 1.15, 1.25, 1.6]
BANDS = [(0.1, 0.3), (0.3, 0.1)]  # (ε_low, ε_high), asymmetric both ways


def _compare(got: dict[str, float], want: dict[str, float]) -> None:
    assert list(got) == list(METRIC_KEYS)
    assert set(want) == set(METRIC_KEYS)
    for key in METRIC_KEYS:
        assert got[key] == pytest.approx(want[key], rel=1e-10, abs=1e-13), key


def _check_fixture_covers_the_bands(values: list[tuple[float, float]], el: float, eh: float) -> None:
    """The batch has ratios with each sign of Â strictly between the two low and the two high bounds."""
    lo1, lo2 = sorted((1 - el, 1 - eh))
    hi1, hi2 = sorted((1 + el, 1 + eh))
    for sign in (1, -1):
        assert any(lo1 < x < lo2 and sign * a > 0 for x, a in values)
        assert any(hi1 < x < hi2 and sign * a > 0 for x, a in values)


@pytest.mark.parametrize("eps", BANDS)
@pytest.mark.parametrize("name", ["grpo", "grpo_symclip"])
@pytest.mark.parametrize("aggregation", [None, "seq-mean-token-sum"])
def test_token_level_metrics_equal_a_plain_loop(name: str, eps: tuple[float, float], aggregation) -> None:
    logp, old, adv, mask, group = _batch(2, token_ratios=RATIOS)
    r = (logp - old).exp()
    _check_fixture_covers_the_bands(
        [
            (float(r[i, k]), float(adv[i]))
            for i in range(mask.shape[0])
            for k in range(mask.shape[1])
            if mask[i, k]
        ],
        *eps,
    )
    params = {"epsilon_low": eps[0], "epsilon_high": eps[1]} if name == "grpo" else {"epsilon": eps[1]}
    _, got = compute_loss(name, logp, old, adv, mask, group, aggregation=aggregation, **params)
    el = eps[0] if name == "grpo" else 0.0
    want = loop_metrics(
        name, logp, old, adv, mask, group, eps=(el, eps[1]), aggregation=aggregation or "token-mean"
    )
    _compare(got, want)


@pytest.mark.parametrize("eps", BANDS)
@pytest.mark.parametrize("cfg", [c for c in _configs() if c[0] in ("gspo", "dfpo")], ids=_ids)
@pytest.mark.parametrize("aggregation", [None, "token-mean"])
def test_sequence_level_metrics_equal_a_plain_loop(cfg, eps: tuple[float, float], aggregation) -> None:
    name, params = cfg
    logp, old, adv, mask, group = _batch(3, targets=RATIOS)
    s = ((logp - old) * mask).sum(-1) / mask.sum(-1)
    _check_fixture_covers_the_bands([(math.exp(float(s[i])), float(adv[i])) for i in range(len(s))], *eps)
    _, got = compute_loss(
        name,
        logp,
        old,
        adv,
        mask,
        group,
        aggregation=aggregation,
        epsilon_low=eps[0],
        epsilon_high=eps[1],
        **params,
    )
    want = loop_metrics(
        name,
        logp,
        old,
        adv,
        mask,
        group,
        eps=eps,
        aggregation=aggregation or "seq-mean-token-mean",
        transform=params.get("transform", "min_replace"),
    )
    _compare(got, want)
    assert got["weight/group_std"] > 0 and got["clip/low_frac"] > 0 and got["clip/high_frac"] > 0


@pytest.mark.parametrize("name", ["grpo", "grpo_symclip", "gspo", "dfpo"])
def test_metrics_with_kl_equal_a_plain_loop(name: str) -> None:
    logp, old, adv, mask, group = _batch(4, targets=RATIOS)
    gen = torch.Generator().manual_seed(4)
    ref_logp = torch.where(mask, logp + 0.3 * torch.randn(logp.shape, generator=gen, dtype=F64), -1e4)
    el, eh = (0.1, 0.3) if name != "grpo_symclip" else (0.0, 0.3)
    params = {"epsilon_low": el, "epsilon_high": eh} if name != "grpo_symclip" else {"epsilon": eh}
    _, got = compute_loss(name, logp, old, adv, mask, group, beta=0.05, ref_logp=ref_logp, **params)
    agg = "token-mean" if name.startswith("grpo") else "seq-mean-token-mean"
    want = loop_metrics(
        name, logp, old, adv, mask, group, eps=(el, eh), aggregation=agg, beta=0.05, ref_logp=ref_logp
    )
    assert want["kl"] > 0
    _compare(got, want)


@pytest.mark.parametrize("name", ["grpo", "grpo_symclip", "gspo"])
def test_per_token_advantage_metrics_equal_a_plain_loop(name: str) -> None:
    """(B, T) advantages (Advantage Reweighting): Â of the group statistics is the row's token mean."""
    logp, old, adv, mask, group = _batch(5, token_ratios=RATIOS)
    gen = torch.Generator().manual_seed(5)
    adv_t = adv[:, None] * (0.5 + torch.rand(mask.shape, generator=gen, dtype=F64))
    el, eh = (0.1, 0.3) if name != "grpo_symclip" else (0.0, 0.3)
    params = {"epsilon_low": el, "epsilon_high": eh} if name != "grpo_symclip" else {"epsilon": eh}
    _, got = compute_loss(name, logp, old, adv_t, mask, group, **params)
    agg = "token-mean" if name.startswith("grpo") else "seq-mean-token-mean"
    _compare(got, loop_metrics(name, logp, old, adv_t, mask, group, eps=(el, eh), aggregation=agg))
