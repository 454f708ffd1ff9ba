"""DFPO's group transforms (App. B): map a group's weight vector to new weights.

Every transform is a pure, vectorised function ``(weights, advantages, group) -> weights`` on a whole
batch of many groups (no Python loop over groups):

- ``weights``: (B,) sequence weights, in DFPO the sign-aware post-clip weights s̄ (eq. 47);
- ``advantages``: (B,) one advantage per completion;
- ``group``: (B,) integer prompt id of each completion.

They are differentiable torch functions; the objective decides whether to stop the gradient
(DFPO's convention, App. C/D) or not (Table 3's "no stop-grad" ablation).

``TRANSFORMS`` holds DFPO's four transforms, each of which makes Σ_i Â_i s̃_i = 0 per group (Min-Replace
with zero-sum advantages). ``ABLATIONS`` holds the ablation ``scale_half`` (Table 3's "DFPO (scale by
0.5)"), which does not: it is kept out of ``TRANSFORMS`` so that code enumerating DFPO's transforms
(the app, the tutorials, their tests of Σ Â s̃ = 0) does not pick it up. ``get_transform`` (hence
``dfpo(transform=...)``) resolves both.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ._checks import check_1d, check_finite, check_group, group_index, group_sum


def _check(weights: Tensor, advantages: Tensor, group: Tensor) -> tuple[Tensor, int]:
    check_1d("weights", weights)
    b = weights.shape[0]
    check_1d("advantages", advantages, b)
    check_group(group, b)
    check_finite("weights", weights)
    check_finite("advantages", advantages)
    return group_index(group)


def min_replace(weights: Tensor, advantages: Tensor, group: Tensor) -> Tensor:
    """Min-Replace: every weight of a group becomes the group's smallest weight.

    Groups whose advantages are all zero are transformed the same way (their loss term is zero
    whatever the weights).
    """
    inverse, n = _check(weights, advantages, group)
    # DFPO eq. (50): s̄_min = min_j s̄_j,  s̃_i = s̄_min for every i in the group
    gmin = torch.full((n,), float("inf"), dtype=weights.dtype, device=weights.device)
    gmin = gmin.scatter_reduce(0, inverse, weights, reduce="amin", include_self=True)
    return gmin[inverse]


def orth_proj(weights: Tensor, advantages: Tensor, group: Tensor) -> Tensor:
    """Orth-Proj: remove from each group's weight vector its component along the advantage vector.

    Afterwards Σ_i s̃_i Â_i = 0 in every group (eq. 63). The result may be negative. A group whose
    advantages are all zero has nothing to project out and keeps its weights.
    """
    inverse, n = _check(weights, advantages, group)
    dot = group_sum(advantages * weights, inverse, n)
    norm2 = group_sum(advantages * advantages, inverse, n)
    coef = torch.where(
        norm2 > 0, dot / torch.where(norm2 > 0, norm2, torch.ones_like(norm2)), torch.zeros_like(dot)
    )
    # DFPO eq. (18): s̃ = s − (Âᵀs / ‖Â‖²) Â
    return weights - coef[inverse] * advantages


def _padded(values: Tensor, inverse: Tensor, n: int, fill: float) -> tuple[Tensor, Tensor]:
    """Lay (B,) values out as (n_groups, G_max), padded with ``fill``; also return each item's slot."""
    order = torch.argsort(inverse, stable=True)
    counts = torch.bincount(inverse, minlength=n)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(inverse)
    slot[order] = torch.arange(inverse.numel(), device=inverse.device) - starts[inverse[order]]
    gmax = int(counts.max())
    out = torch.full((n, gmax), fill, dtype=values.dtype, device=values.device)
    out[inverse, slot] = values
    return out, slot


def orth_proj_pos(weights: Tensor, advantages: Tensor, group: Tensor) -> Tensor:
    """Positive Orth-Proj: the exact solution of DFPO's non-negative QP, per group.

    DFPO eq. (51): s̃ = argmin_v ½‖v − s̄‖² s.t. Âᵀv = 0, v ≥ 0.

    Solved exactly, not iteratively. The KKT conditions give v = max(s̄ − λÂ, 0) for the multiplier λ
    that zeroes f(λ) = Σ_i Â_i max(s̄_i − λÂ_i, 0). f is continuous, piecewise linear and
    non-increasing, with breakpoints λ_i = s̄_i / Â_i. We evaluate f at every breakpoint of the group
    (an O(G²) tensor op per group, all groups at once), bracket the root between two adjacent
    breakpoints, read off the active set there, and solve the linear piece for λ in closed form.

    Corner cases (each one tested):
    - all advantages zero: the constraint is void, s̃ = s̄ (clamped at 0: max(s̄_i, 0));
    - one-sided groups (some non-zero Â, all of one sign): Σ_i Â_i v_i = 0 with v ≥ 0 forces
      v_i = 0 wherever Â_i ≠ 0, so the feasible set is that face and the optimum is exactly
      v_i = 0 (Â_i ≠ 0), v_i = max(s̄_i, 0) (Â_i = 0). There f has one sign everywhere and its
      roots form a half-line that ends at the extreme breakpoint, where rounding in f can leave no
      bracket at all (then λ = 0 and v = s̄, infeasible), so this case is set explicitly rather
      than read off the root search;
    - completions with Â_i = 0 always keep their weight (max(s̄_i, 0)).
    """
    inverse, n = _check(weights, advantages, group)
    s, _ = _padded(weights, inverse, n, 0.0)  # (n, G)
    a, slot = _padded(advantages, inverse, n, 0.0)
    nz = a != 0
    safe_a = torch.where(nz, a, torch.ones_like(a))
    bp = torch.where(nz, s / safe_a, torch.full_like(s, float("nan")))  # breakpoints λ_j, (n, G)

    # f at every breakpoint: f[g, j] = Σ_i a[g,i] · max(s[g,i] − bp[g,j]·a[g,i], 0)
    resid = s[:, None, :] - bp[:, :, None] * a[:, None, :]  # (n, G_j, G_i)
    f = (a[:, None, :] * resid.clamp(min=0)).sum(-1)  # (n, G_j); NaN where j has no breakpoint
    inf = torch.full_like(bp, float("inf"))
    lo = torch.where(nz & (f >= 0), bp, -inf).amax(-1)  # largest breakpoint with f ≥ 0
    hi = torch.where(nz & (f < 0), bp, inf).amin(-1)  # smallest breakpoint with f < 0
    # a point strictly inside the bracket, where the active set is constant
    mid = torch.where(
        torch.isfinite(lo) & torch.isfinite(hi),
        0.5 * (lo + hi),
        torch.where(torch.isfinite(lo), lo + 1.0, hi - 1.0),
    )
    mid = torch.where(
        torch.isfinite(mid), mid, torch.zeros_like(mid)
    )  # no breakpoint at all: λ is irrelevant
    active = nz & (s - mid[:, None] * a > 0)
    num = (a * s * active).sum(-1)
    den = (a * a * active).sum(-1)
    # on the bracket f(λ) = Σ_active Â_i s̄_i − λ Σ_active Â_i²; f ≡ 0 there when nothing is active
    lam = torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), lo)
    lam = torch.where(torch.isfinite(lam), lam, torch.zeros_like(lam))
    # KKT stationarity: v = max(s̄ − λÂ, 0)
    v = (s - lam[:, None] * a).clamp(min=0)
    # one-sided groups: the only feasible points have v_i = 0 wherever Â_i ≠ 0 (rows with Â_i = 0 keep
    # max(s̄_i, 0), which v already holds since λ·0 = 0)
    one_sided = (a > 0).any(-1) ^ (a < 0).any(-1)
    v = torch.where(one_sided[:, None] & nz, torch.zeros_like(v), v)
    return v[inverse, slot]


def truncate_rebalance(weights: Tensor, advantages: Tensor, group: Tensor, floor: float = 1e-6) -> Tensor:
    """Truncate-and-rebalance: DFPO's closed-form, one-step approximation of the positive QP.

    Step 1 floors the weights at ``floor`` (eq. 52); step 2 scales one sign side of the group so
    that Σ Â s̃ = 0 (eq. 53–55). With both signs present α, β ∈ (0, 1]; in a one-sided group the
    only way to reach Σ Â s̃ = 0 is to scale that side to 0 (α or β = 0), which is what this does.
    """
    inverse, n = _check(weights, advantages, group)
    # DFPO eq. (52): s⁺ = max(s̄, ϵ·1)
    s_pos = weights.clamp(min=floor)
    pos = advantages > 0
    neg = advantages < 0
    p_sum = group_sum(torch.where(pos, advantages * s_pos, torch.zeros_like(s_pos)), inverse, n)
    n_sum = group_sum(torch.where(neg, -advantages * s_pos, torch.zeros_like(s_pos)), inverse, n)
    # DFPO eq. (53): δ = Âᵀ s⁺
    delta = p_sum - n_sum
    one = torch.ones_like(p_sum)
    # DFPO eq. (55): α = −Σ_N Â s⁺ / Σ_P Â s⁺ (used when δ > 0), β = −Σ_P Â s⁺ / Σ_N (−Â) s⁺ (δ < 0)
    alpha = torch.where(delta > 0, n_sum / torch.where(delta > 0, p_sum, one), one)
    beta = torch.where(delta < 0, p_sum / torch.where(delta < 0, n_sum, one), one)
    # DFPO eq. (54): scale the positive side by α or the negative side by β
    scale = torch.where(pos, alpha[inverse], torch.where(neg, beta[inverse], torch.ones_like(s_pos)))
    return s_pos * scale


def scale_half(weights: Tensor, advantages: Tensor, group: Tensor) -> Tensor:
    """DFPO Table 3's "DFPO (scale by 0.5)" ablation: s̃_i = 0.5·s̄_i, a global scaling instead of a group transform.

    The paper replaces eq. (50) by s̃_i(θ) ≜ 0.5·s̄_i(θ) "to rule out the explanation that performance
    gains are merely due to smaller updates" (Sec. 6.2). It keeps the within-group spread of s̄, so
    Σ_i Â_i s̃_i = 0.5·Σ_i Â_i s̄_i ≠ 0 in general: under the paper's estimator it is GSPO's eq. (86)
    baseline at half the step. An ablation, not one of DFPO's transforms (``ABLATIONS``, not ``TRANSFORMS``).
    """
    _check(weights, advantages, group)
    # DFPO Table 3: s̃_i ≜ 0.5·s̄_i (replacing eq. 50)
    return 0.5 * weights


TRANSFORMS: dict[str, Callable[..., Tensor]] = {
    "min_replace": min_replace,
    "orth_proj": orth_proj,
    "orth_proj_pos": orth_proj_pos,
    "truncate_rebalance": truncate_rebalance,
}

#: Ablations of DFPO's transforms (Table 3), resolved by ``get_transform`` but not part of ``TRANSFORMS``.
ABLATIONS: dict[str, Callable[..., Tensor]] = {
    "scale_half": scale_half,
}


def get_transform(name: str) -> Callable[..., Tensor]:
    """Look a transform (``TRANSFORMS``) or an ablation (``ABLATIONS``) up by name; unknown names list the valid ones."""
    fn = TRANSFORMS.get(name) or ABLATIONS.get(name)
    if fn is None:
        valid = ", ".join([*TRANSFORMS, *ABLATIONS])
        raise ValueError(f"unknown transform {name!r}; valid: {valid}")
    return fn
