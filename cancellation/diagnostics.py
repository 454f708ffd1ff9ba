"""Diagnostics of token-gradient cancellation: what the papers measure, as pure functions.

- ``token_coefficients``: each token's effective weight ∂J/∂logp under any registered objective;
- ``prefix_event_keys`` and ``shared_residual``: DFPO's shared context-token events (eq. 71–72) and how
  much of their coefficient mass survives (0: exact cancellation, eq. 2; 1: none);
- ``jitter2`` (DFPO eq. 20) and ``steps_to_threshold`` (DFPO Table 2): training-curve metrics;
- ``softmax_grad_norm`` and ``softmax_grad_norm_bounds``: ‖∂log π(y)/∂z‖ and Lopti's bounds (Lopti paper
  §3.1);
- ``energy_by_bucket``: DFPO eq. (24) with the output-layer gradient proxy of the cancellation-hypothesis
  paper's eq. (6–7);
- ``token_flip_stats``: the cancellation-hypothesis paper's App. C eq. (16), boosted / suppressed / stable
  tokens and the flip rate.

Shapes follow docs/DESIGN.md: ``logp``, ``old_logp``, ``mask``, ``tokens``, ``coef`` (B, T); ``advantages``,
``group`` (B,); ``probs`` (B, T, V).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ._checks import check_1d, check_2d, check_finite, check_group, check_int, check_mask, group_index
from .update import coefficients, event_index, event_sums


def token_coefficients(
    name: str,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    group: Tensor,
    **params: Any,
) -> Tensor:
    """The effective weight ∂J/∂logp_{i,t} of every token (J = −loss), from autograd.

    This is the scalar that multiplies the token's score direction ∇θ log π(y_{i,t}) in the update
    (DFPO eq. 70's "scalar coefficient"), whatever the objective, its clipping, transform and
    aggregation. Two tokens of one shared context-token event have the same score direction (eq. 71),
    so their coefficients add (eq. 72).

    Args:
        name: a registered objective (``cancellation.objectives.objective_names()``).
        logp: (B, T) log π_θ of each sampled token (only its value is used).
        old_logp: (B, T) log π_old of the same tokens.
        advantages: (B,) or (B, T) advantages.
        mask: (B, T) 1 for completion tokens, 0 for padding.
        group: (B,) integer prompt id of each completion.
        **params: passed to ``compute_loss`` (``aggregation``, ``epsilon_low``, ``transform``, ...).
    Returns:
        (B, T) coefficients, 0 on padding.
    """
    return coefficients(name, logp, old_logp, advantages, mask, group, with_metrics=False, **params).coef


def prefix_event_keys(tokens: Tensor, mask: Tensor, group: Tensor) -> Tensor:
    """Ids of DFPO's shared context-token events (eq. 71–72): (exact prefix, token) within a group.

    Keys are equal at (i, t) and (j, u) exactly when i and j are in the same group, t == u, the
    completion tokens before t are identical, and the tokens at t are identical: the same context h*
    and action a*, hence the same score direction g* (eq. 71).

    A masked position inside a prefix counts as a "pad" symbol distinct from every token, so two
    prefixes match only if their masks match too (with the usual right padding, an unmasked position
    has no masked position before it and this never matters).

    Args:
        tokens: (B, T) integer token ids.
        mask: (B, T) 1 for completion tokens, 0 for padding.
        group: (B,) integer prompt id of each completion.
    Returns:
        (B, T) int64 event ids, compact (0..E−1, in no particular meaning), −1 on padding.
    """
    check_2d("tokens", tokens)
    check_int("tokens", tokens)
    b, t_len = tokens.shape
    check_2d("mask", mask, (b, t_len))
    check_group(group, b)
    valid = mask.bool()
    tok = tokens.long()
    ginv, _ = group_index(group)
    raw = torch.empty((b, t_len), dtype=torch.long, device=tokens.device)
    prev = ginv.clone()  # the empty prefix: only the group identifies it
    offset = 0
    for t in range(t_len):
        v = valid[:, t]
        # the state after position t: (group/prefix id before t, is-token flag, token id or 0 on padding)
        rows = torch.stack([prev, v.long(), torch.where(v, tok[:, t], torch.zeros_like(tok[:, t]))], dim=1)
        uniq, inv = torch.unique(rows, dim=0, return_inverse=True)
        raw[:, t] = inv + offset  # distinct across positions t
        offset += uniq.shape[0]
        prev = inv
    keys = torch.full_like(raw, -1)
    if bool(valid.any()):
        keys[valid] = torch.unique(raw[valid], return_inverse=True)[1]
    return keys


@dataclass(frozen=True)
class SharedResidual:
    """Per-event coefficient sums of ``shared_residual`` (events sorted by key).

    Attributes:
        keys: (E,) int64 event ids.
        net: (E,) Σ coef over the event's occurrences (the bracket of DFPO eq. 72).
        gross: (E,) Σ |coef| over the occurrences.
        count: (E,) int64 number of occurrences.
        ratio: (E,) |net| / gross, 0 where gross == 0.
        total: Σ_e |net_e| / Σ_e gross_e over the events with count ≥ min_count; NaN when there is no
            such event or their gross is 0.
    """

    keys: Tensor
    net: Tensor
    gross: Tensor
    count: Tensor
    ratio: Tensor
    total: float


def shared_residual(coef: Tensor, keys: Tensor, mask: Tensor, min_count: int = 2) -> SharedResidual:
    """How much of the shared events' coefficient mass survives cancellation.

    For a shared event S (tokens with the same score direction g*), the update is g*·Σ_{(i,t)∈S} coef_{i,t}
    (DFPO eq. 72); cancellation (eq. 2) means that sum is 0. ``total`` = Σ_e |net_e| / Σ_e gross_e is
    0 when every shared event cancels exactly and 1 when no opposite-sign coefficients meet.

    Args:
        coef: (B, T) token coefficients (e.g. from ``token_coefficients``).
        keys: (B, T) int64 event ids (e.g. from ``prefix_event_keys``); −1 means "no event".
        mask: (B, T) 1 for completion tokens, 0 for padding; masked positions are ignored.
        min_count: events with fewer occurrences are left out of ``total`` (default 2: only events
            actually shared by at least two tokens); every event is still listed.
    Returns:
        a ``SharedResidual``.
    """
    check_2d("coef", coef)
    check_2d("keys", keys, (coef.shape[0], coef.shape[1]))
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        raise ValueError(f"`min_count` must be an int ≥ 1, got {min_count!r}")
    index = event_index(keys, mask)
    check_finite("coef", coef[index.inverse < index.count.shape[0]])
    net, gross = event_sums(coef, index)
    safe = torch.where(gross > 0, gross, torch.ones_like(gross))
    ratio = torch.where(gross > 0, net.abs() / safe, torch.zeros_like(gross))
    shared = index.count >= min_count
    gross_shared = float(gross[shared].sum())
    # DFPO eq. (72): the surviving part of each shared event is |Σ coef|; eq. (2): it is 0 under cancellation
    total = float(net[shared].abs().sum()) / gross_shared if gross_shared > 0 else math.nan
    return SharedResidual(keys=index.keys, net=net, gross=gross, count=index.count, ratio=ratio, total=total)


def _as_float_list(name: str, values: Sequence[float] | Tensor) -> Tensor:
    if isinstance(values, Tensor):
        if values.dim() != 1:
            raise ValueError(f"`{name}` must be a 1-D sequence, got shape {tuple(values.shape)}")
        x = values.detach().to(device="cpu", dtype=torch.float64)
    else:
        try:
            x = torch.tensor([float(v) for v in values], dtype=torch.float64)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"`{name}` must be a sequence of numbers or a 1-D tensor ({exc})") from None
    return x


def jitter2(values: Sequence[float] | Tensor) -> float:
    """DFPO eq. (20): Jitter₂(m) = (1/(T−2)) Σ_{t=1}^{T−2} |m_{t+2} − 2m_{t+1} + m_t|.

    The mean absolute second difference of a training curve: short-term oscillation, blind to a
    steady linear trend.

    Args:
        values: T ≥ 3 curve values (a sequence of floats or a 1-D tensor), no NaN/inf.
    """
    m = _as_float_list("values", values)
    if m.numel() < 3:
        raise ValueError(f"jitter2 needs at least 3 values (a second difference), got {m.numel()}")
    if not bool(torch.isfinite(m).all()):
        raise ValueError("`values` contains NaN/inf: drop or fill the missing steps before computing jitter2")
    # DFPO eq. (20)
    return float((m[2:] - 2.0 * m[1:-1] + m[:-2]).abs().mean())


def steps_to_threshold(
    values: Sequence[float] | Tensor, threshold: float, steps: Sequence[float] | Tensor | None = None
) -> float | None:
    """DFPO Table 2's compute-to-threshold: the first step whose value reaches the threshold.

    Args:
        values: the curve (a sequence or a 1-D tensor); NaN entries never count as reaching it.
        threshold: the level to reach (value ≥ threshold).
        steps: optional x-coordinates (same length: steps, tokens, FLOPs); the index when None.
    Returns:
        ``steps[i]`` (or ``i``) as a float for the first i with values[i] ≥ threshold, None if never.
    """
    v = _as_float_list("values", values)
    if steps is not None:
        s = _as_float_list("steps", steps)
        if s.numel() != v.numel():
            raise ValueError(f"`steps` has {s.numel()} entries but `values` has {v.numel()}")
    hit = torch.nonzero(v >= float(threshold)).flatten()
    if hit.numel() == 0:
        return None
    i = int(hit[0])
    return float(s[i]) if steps is not None else float(i)


def value_at_threshold(
    reward: Sequence[float] | Tensor, values: Sequence[float] | Tensor, threshold: float
) -> float:
    """``values`` at the point where ``reward`` first reaches ``threshold``: a measure "at matched reward".

    Linearly interpolated between position k − 1 and the first position k with reward ≥ threshold
    (``steps_to_threshold``): at k the reward may overshoot the threshold by a whole step's gain. At
    k = 0 (nothing before it) ``values[0]``; NaN when the reward never reaches the threshold. So that a
    run crossing the threshold at its first update is interpolated too, give the series with the initial
    state (step 0, before any update) at position 0, as ``experiments.toy.measure_seed`` does; a series
    that starts after the first update reads that update's value there.
    """
    r, v = _as_float_list("reward", reward), _as_float_list("values", values)
    if r.numel() != v.numel():
        raise ValueError(f"`values` has {v.numel()} entries but `reward` has {r.numel()}")
    k = steps_to_threshold(r, threshold)
    if k is None:
        return math.nan
    k = int(k)
    if k == 0:
        return float(v[0])
    r0, r1 = float(r[k - 1]), float(r[k])
    f = 1.0 if r1 == r0 else (float(threshold) - r0) / (r1 - r0)
    return float(v[k - 1] + f * (v[k] - v[k - 1]))


def trailing_mean(values: Sequence[float] | Tensor, window: int, *, full: bool = False) -> list[float]:
    """The trailing mean over ``window`` values at every position: position i averages the finite
    values among i − window + 1 ... i (NaN values are left out; NaN when none is finite). With
    ``full`` the first ``window − 1`` positions, whose window is partial, are NaN.
    """
    if int(window) < 1:
        raise ValueError(f"`window` must be ≥ 1, got {window}")
    w = int(window)
    if not isinstance(values, Tensor):  # a missing value (None) is a NaN: left out of the means
        values = [math.nan if v is None else v for v in values]
    x = [float(v) for v in _as_float_list("values", values)]
    out = []
    for i in range(len(x)):
        if full and i < w - 1:
            out.append(math.nan)
            continue
        vals = [v for v in x[max(0, i - w + 1) : i + 1] if math.isfinite(v)]
        out.append(sum(vals) / len(vals) if vals else math.nan)
    return out


def softmax_grad_norm(probs: Tensor, tokens: Tensor) -> Tensor:
    """‖e_y − π‖₂, the norm of ∂log π(y)/∂z for softmax logits z (Lopti paper §3.1).

    Args:
        probs: (..., V) softmax probabilities π.
        tokens: (...) integer ids y of the sampled tokens.
    Returns:
        (...) the norms.
    """
    if probs.dim() < 1:
        raise ValueError("`probs` must have shape (..., V)")
    if tuple(tokens.shape) != tuple(probs.shape[:-1]):
        raise ValueError(
            f"`tokens` has shape {tuple(tokens.shape)} but `probs` (..., V) needs (...) = {tuple(probs.shape[:-1])}"
        )
    check_int("tokens", tokens)
    v = probs.shape[-1]
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= v):
        raise ValueError(f"`tokens` holds ids outside [0, V) with V={v}")
    # Lopti paper §3.1: ∂log π(y)/∂z = e_y − π
    diff = (-probs).scatter_add(-1, tokens.long()[..., None], torch.ones_like(probs[..., :1]))
    return torch.linalg.vector_norm(diff, dim=-1)


def softmax_grad_norm_bounds(pi: Tensor, vocab_size: int) -> tuple[Tensor, Tensor]:
    """Lopti's bounds on ‖∂log π(y)/∂z‖ in terms of π = π(y) alone (Lopti paper §3.1).

    ‖e_y − π‖² = (1 − π_y)² + Σ_{k≠y} π_k², and (1−π_y)²/(N−1) ≤ Σ_{k≠y} π_k² ≤ (1−π_y)²: the lower
    bound is attained when the other mass is uniform, the upper one when it sits on a single token.

    Args:
        pi: (...) probabilities of the sampled tokens, in [0, 1].
        vocab_size: N ≥ 2.
    Returns:
        ``(lower, upper)``, each shaped like ``pi``.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"`vocab_size` must be an int ≥ 2, got {vocab_size!r}")
    if not isinstance(pi, Tensor):
        raise TypeError(f"`pi` must be a torch.Tensor, got {type(pi).__name__}")
    if pi.numel() and (bool(torch.isnan(pi).any()) or float(pi.min()) < 0.0 or float(pi.max()) > 1.0):
        raise ValueError("`pi` must hold probabilities in [0, 1]")
    n = vocab_size
    # Lopti paper §3.1: sqrt(N/(N−1))·(1 − π) ≤ ‖∇_z log π‖ ≤ sqrt(2)·(1 − π)
    lower = math.sqrt(n / (n - 1)) * (1.0 - pi)
    upper = math.sqrt(2.0) * (1.0 - pi)
    return lower, upper


def energy_by_bucket(
    coef: Tensor,
    probs: Tensor,
    tokens: Tensor,
    mask: Tensor,
    hidden_norm: Tensor | None = None,
    frequency: Tensor | None = None,
    num_buckets: int = 3,
) -> Tensor:
    """DFPO eq. (24): the share of gradient energy in each token-frequency bucket.

    Each token's gradient norm is the output-layer proxy of the cancellation-hypothesis paper's eq. (6–7):
    the gradient of coef·log π(y) with respect to the unembedding matrix is coef·(e_y − π) hᵀ, whose norm
    is |coef|·‖e_y − π‖·‖h‖.

    Bucketing: token *types* are ranked by frequency, most frequent first (ties: the smaller id first);
    a type gets bucket ⌊num_buckets · (occurrences of the types ranked before it) / (total
    occurrences)⌋, clipped to num_buckets − 1. So bucket 0 holds the most frequent types, each bucket
    about an equal share of the occurrences, and all occurrences of a type share its bucket.

    Args:
        coef: (B, T) token coefficients.
        probs: (B, T, V) the policy's next-token distributions at each position.
        tokens: (B, T) sampled token ids.
        mask: (B, T) 1 for completion tokens, 0 for padding.
        hidden_norm: (B, T) ‖h‖ of the final hidden state at each position (1 when None).
        frequency: (V,) occurrences of each token id (e.g. over a corpus); when None, counted over the
            unmasked tokens of this batch.
        num_buckets: ≥ 1.
    Returns:
        (num_buckets,) energy shares summing to 1 (all zeros when the total energy is 0).
    """
    check_2d("coef", coef)
    b, t_len = coef.shape
    check_2d("tokens", tokens, (b, t_len))
    check_int("tokens", tokens)
    check_mask(mask, (b, t_len))
    if probs.dim() != 3 or tuple(probs.shape[:2]) != (b, t_len):
        raise ValueError(
            f"`probs` must have shape (B, T, V) with (B, T) = {(b, t_len)}, got {tuple(probs.shape)}"
        )
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets < 1:
        raise ValueError(f"`num_buckets` must be an int ≥ 1, got {num_buckets!r}")
    v = probs.shape[2]
    valid = mask.bool()
    tok = torch.where(valid, tokens.long(), torch.zeros_like(tokens, dtype=torch.long))
    if int(tok.min()) < 0 or int(tok.max()) >= v:
        raise ValueError(f"`tokens` holds ids outside [0, V) with V={v} at unmasked positions")
    check_finite("coef", torch.where(valid, coef, torch.zeros_like(coef)))
    if hidden_norm is None:
        h = torch.ones_like(coef)
    else:
        check_2d("hidden_norm", hidden_norm, (b, t_len))
        h = hidden_norm
    if frequency is None:
        freq = torch.bincount(tok[valid], minlength=v).to(torch.float64)
    else:
        check_1d("frequency", frequency, v)
        freq = frequency.detach().to(torch.float64)
        if not bool(torch.isfinite(freq).all()) or bool((freq < 0).any()):
            raise ValueError("`frequency` must hold finite counts ≥ 0")
    total_occ = float(freq.sum())
    if total_occ <= 0:
        raise ValueError("`frequency` sums to 0: no token type has any occurrence to bucket by")
    # rank types by frequency, descending; the stable sort keeps ties in id order
    order = torch.sort(-freq, stable=True).indices
    before = torch.cumsum(freq[order], 0) - freq[order]  # occurrences of the types ranked before
    bucket_sorted = torch.floor(num_buckets * before / total_occ).long().clamp(0, num_buckets - 1)
    bucket_of_type = torch.empty(v, dtype=torch.long, device=freq.device)
    bucket_of_type[order] = bucket_sorted
    # cancellation-hypothesis paper eq. (6)-(7): ‖∇_W (coef·log π(y))‖ = |coef|·‖e_y − π‖·‖h‖
    norms = coef.abs() * softmax_grad_norm(probs, tok) * h
    norms = torch.where(valid, norms, torch.zeros_like(norms))
    energy = torch.zeros(num_buckets, dtype=norms.dtype, device=norms.device)
    energy.index_add_(0, bucket_of_type.to(norms.device)[tok[valid]], norms[valid])
    total = energy.sum()
    if float(total) == 0.0:
        return energy
    # DFPO eq. (24): Energy(B) = Σ_{t∈B} ‖∇ℓ_t‖ / Σ_t ‖∇ℓ_t‖
    return energy / total


#: Keys of ``token_flip_stats``.
FLIP_KEYS = (
    "flip/pos_boosted",
    "flip/pos_suppressed",
    "flip/pos_stable",
    "flip/neg_boosted",
    "flip/neg_suppressed",
    "flip/neg_stable",
    "flip/all_boosted",
    "flip/all_suppressed",
    "flip/all_stable",
    "flip/rate",
)


def token_flip_stats(
    logp_before: Tensor, logp_after: Tensor, advantages: Tensor, mask: Tensor, tau: float = 1e-3
) -> dict[str, float]:
    """Token flipping (cancellation-hypothesis paper App. C eq. 16): boosted, suppressed and stable tokens.

    Δ = logp_after − logp_before per token: boosted if Δ > τ, suppressed if Δ < −τ, stable otherwise.
    Fractions are over the unmasked tokens of the rollouts with Â > 0 (``pos``), Â < 0 (``neg``) and
    of all rollouts (``all``); an empty set gives 0.0. ``flip/rate`` is the fraction of the tokens of
    non-zero-advantage rollouts that moved beyond τ against their rollout's advantage sign
    (suppressed in a positive rollout, boosted in a negative one).

    Args:
        logp_before: (B, T) log π of the sampled tokens before the update.
        logp_after: (B, T) the same after the update.
        advantages: (B,) one advantage per rollout.
        mask: (B, T) 1 for completion tokens, 0 for padding.
        tau: the stability band τ ≥ 0.
    Returns:
        a dict with exactly the keys ``FLIP_KEYS``.
    """
    check_2d("logp_before", logp_before)
    shape = (logp_before.shape[0], logp_before.shape[1])
    check_2d("logp_after", logp_after, shape)
    check_1d("advantages", advantages, shape[0])
    check_2d("mask", mask, shape)
    check_finite("advantages", advantages)
    tau = float(tau)
    if not tau >= 0.0:
        raise ValueError(f"`tau` must be ≥ 0, got {tau}")
    valid = mask.bool()
    zero = torch.zeros_like(logp_before)
    before = torch.where(valid, logp_before, zero)
    after = torch.where(valid, logp_after, zero)
    check_finite("logp_before", before)
    check_finite("logp_after", after)
    # cancellation-hypothesis paper App. C eq. (16): Δ = log π_after − log π_before; boosted Δ > τ,
    # suppressed Δ < −τ
    delta = after - before
    boosted = valid & (delta > tau)
    suppressed = valid & (delta < -tau)
    stable = valid & ~boosted & ~suppressed
    adv = advantages[:, None].expand(shape)
    sets = {"pos": valid & (adv > 0), "neg": valid & (adv < 0), "all": valid}

    def frac(num: Tensor, den: Tensor) -> float:
        d = int(den.sum())
        return int((num & den).sum()) / d if d else 0.0

    out: dict[str, float] = {}
    for name, sel in sets.items():
        out[f"flip/{name}_boosted"] = frac(boosted, sel)
        out[f"flip/{name}_suppressed"] = frac(suppressed, sel)
        out[f"flip/{name}_stable"] = frac(stable, sel)
    flipped = (sets["pos"] & suppressed) | (sets["neg"] & boosted)
    out["flip/rate"] = frac(flipped, sets["pos"] | sets["neg"])
    return out
