"""Plain-loop reference implementations that the tests of ``cancellation/`` compare against.

Written from the papers (equation numbers refer to the DFPO paper, "Design Conditions for Intra-Group
Learning of Sequence-Level Rewards: Token Gradient Cancellation", arXiv 2604.13088; docs/papers.md lists
the papers) and from how TRL's ``GRPOTrainer._compute_loss`` and verl's ``compute_policy_loss`` /
``agg_loss`` compute their losses. Nothing here imports or calls ``cancellation``: every quantity is
rebuilt with Python loops over groups, sequences and tokens.

Two kinds of functions:

- pure-float helpers (``*_floats``) that work on Python lists, for values only;
- loop-built torch losses: each term is a 0-d tensor combined with scalar torch ops, so that
  ``torch.autograd.grad`` differentiates the loop-built loss and gives the reference gradient.
  Branch decisions (which clip branch, which element is the minimum, which active set) are taken on
  Python floats, exactly as one would write the piecewise formula by hand.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from torch import Tensor

# TRL's ``loss_type`` and the verl aggregation name it corresponds to.
TRL_TO_VERL = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm"}


# ------------------------------------------------------------------------------------------------
# groups


def groups_of(group: Sequence[int] | Tensor) -> dict[int, list[int]]:
    """Prompt id -> the batch indices of its completions (ids in order of first appearance)."""
    ids = group.tolist() if isinstance(group, Tensor) else list(group)
    out: dict[int, list[int]] = {}
    for i, g in enumerate(ids):
        out.setdefault(int(g), []).append(i)
    return out


# ------------------------------------------------------------------------------------------------
# advantages


def group_advantages_floats(
    rewards: Sequence[float],
    group: Sequence[int],
    scale: str = "group",
    eps: float = 1e-6,
    unbiased: bool = True,
) -> list[float]:
    """GRPO's group-relative advantage (DFPO eq. 43) with a plain loop over groups.

    ``scale="group"``: (r − mean_g) / (std_g + eps); ``"batch"``: divided by the std of the whole batch;
    ``"none"``: r − mean_g. A group without any reward variation carries no signal: its advantages are 0.
    """
    rewards = [float(r) for r in rewards]
    out = [0.0] * len(rewards)
    if scale == "batch":
        n = len(rewards)
        mu = sum(rewards) / n
        if n > 1:
            ss = sum((r - mu) ** 2 for r in rewards)
            batch_std = math.sqrt(ss / ((n - 1) if unbiased else n))
        else:
            batch_std = 0.0
    for idx in groups_of(group).values():
        vals = [rewards[i] for i in idx]
        if max(vals) == min(vals):
            continue  # all equal (or a group of one): exactly zero
        n = len(vals)
        mu = sum(vals) / n
        if scale == "none":
            denom = 1.0
        elif scale == "group":
            ss = sum((v - mu) ** 2 for v in vals)
            denom = math.sqrt(ss / ((n - 1) if unbiased else n)) + eps
        else:
            denom = batch_std + eps
        for i in idx:
            out[i] = (rewards[i] - mu) / denom
    return out


def reweight_floats(advantages: list, old_logp: list[list[float]], alpha: float) -> list[list[float]]:
    """Lopti's Advantage Reweighting A·[α·π_old + (1 − α)] per token (``advantages`` (B,) or (B, T))."""
    out = []
    for i, row in enumerate(old_logp):
        out_row = []
        for t, lp in enumerate(row):
            a = advantages[i][t] if isinstance(advantages[i], list) else advantages[i]
            out_row.append(a * (alpha * math.exp(lp) + 1.0 - alpha))
        out.append(out_row)
    return out


# ------------------------------------------------------------------------------------------------
# aggregation (verl's ``agg_loss`` names and TRL's ``loss_type`` names)


def reduce(
    values: Tensor,
    mask: Tensor,
    mode: str,
    *,
    norm_constant: float | None = None,
    token_count: float | None = None,
    seq_count: float | None = None,
) -> Tensor:
    """Reduce (B, T) per-token ``values`` to a 0-d tensor with a loop over sequences and tokens.

    verl names: ``token-mean`` Σ m·v / Σ m; ``seq-mean-token-mean`` (1/B) Σ_i mean_t; ``seq-mean-token-sum``
    (1/B) Σ_i Σ_t; ``seq-mean-token-sum-norm`` Σ / (B·C). TRL names: ``grpo`` (per-sequence mean over
    ``mask.sum(-1).clamp(min=1)``, then ``.mean()``), ``bnpo`` (Σ / clamp(Σ m, 1)), ``dr_grpo``
    (Σ / (B · max_completion_length), ``norm_constant`` being the max completion length).
    ``token_count`` / ``seq_count`` replace N = Σ m and B.
    """
    b, t_len = values.shape
    keep = mask.bool().tolist()
    seq_sums, seq_lens = [], []
    for i in range(b):
        acc = values.new_zeros(())
        n = 0
        for t in range(t_len):
            if keep[i][t]:
                acc = acc + values[i, t]
                n += 1
        seq_sums.append(acc)
        seq_lens.append(n)
    total = values.new_zeros(())
    for acc in seq_sums:
        total = total + acc
    n_tok = sum(seq_lens)
    n_seq = b if seq_count is None else seq_count
    if mode == "token-mean":
        return total / (n_tok if token_count is None else token_count)
    if mode == "bnpo":
        return total / max(n_tok, 1)
    if mode in ("seq-mean-token-mean", "grpo"):
        acc = values.new_zeros(())
        for s, n in zip(seq_sums, seq_lens, strict=True):
            acc = acc + (s / n if n > 0 else s * 0.0)
        return acc / (n_seq if mode == "seq-mean-token-mean" else b)
    if mode == "seq-mean-token-sum":
        return total / n_seq
    if mode in ("seq-mean-token-sum-norm", "dr_grpo"):
        c = float(t_len) if norm_constant is None else float(norm_constant)
        return total / ((n_seq if mode == "seq-mean-token-sum-norm" else b) * c)
    raise KeyError(mode)


def sequence_weight_in_loss(mask: Tensor, mode: str, norm_constant: float | None = None) -> list[float]:
    """κ_i: the factor with which a per-sequence constant term enters ``reduce`` (Σ_i κ_i·term_i)."""
    lens = [int(x) for x in mask.bool().sum(-1).tolist()]
    b, t_len = mask.shape
    n_tok = sum(lens)
    if mode == "token-mean":
        return [n / n_tok for n in lens]
    if mode == "seq-mean-token-mean":
        return [(1.0 / b if n > 0 else 0.0) for n in lens]
    if mode == "seq-mean-token-sum":
        return [n / b for n in lens]
    c = float(t_len) if norm_constant is None else float(norm_constant)
    return [n / (b * c) for n in lens]


# ------------------------------------------------------------------------------------------------
# per-token surrogates (TRL ``_compute_loss`` / verl ``compute_policy_loss``), loop-built


def _adv(advantages: Tensor, i: int, t: int) -> float:
    return float(advantages[i, t]) if advantages.dim() == 2 else float(advantages[i])


def _stack(rows: list[list[Tensor]]) -> Tensor:
    return torch.stack([torch.stack(r) for r in rows])


def grpo_per_token_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float
) -> Tensor:
    """(B, T) −min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A) per unmasked token (0 on padding)."""
    keep = mask.bool().tolist()
    rows = []
    for i in range(logp.shape[0]):
        row = []
        for t in range(logp.shape[1]):
            if not keep[i][t]:
                row.append(logp.new_zeros(()))
                continue
            a = _adv(advantages, i, t)
            r = torch.exp(logp[i, t] - old_logp[i, t].detach())
            c = torch.clamp(r, 1.0 - eps_low, 1.0 + eps_high)
            row.append(-torch.minimum(r * a, c * a))
        rows.append(row)
    return _stack(rows)


def symclip_per_token_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, eps: float
) -> Tensor:
    """(B, T) −A·clip(r, 0, 1 + ε) per unmasked token (DFPO eq. 80)."""
    keep = mask.bool().tolist()
    rows = []
    for i in range(logp.shape[0]):
        row = []
        for t in range(logp.shape[1]):
            if not keep[i][t]:
                row.append(logp.new_zeros(()))
                continue
            r = torch.exp(logp[i, t] - old_logp[i, t].detach())
            row.append(-_adv(advantages, i, t) * torch.clamp(r, 0.0, 1.0 + eps))
        rows.append(row)
    return _stack(rows)


def sequence_ratios(logp: Tensor, old_logp: Tensor, mask: Tensor, length_norm: bool = True) -> list[Tensor]:
    """s_i as 0-d tensors: exp of the masked mean (GSPO, eq. 44) or sum (Π_t r, eq. 11) of log r."""
    keep = mask.bool().tolist()
    out = []
    for i in range(logp.shape[0]):
        acc = logp.new_zeros(())
        n = 0
        for t in range(logp.shape[1]):
            if keep[i][t]:
                acc = acc + (logp[i, t] - old_logp[i, t].detach())
                n += 1
        out.append(torch.exp(acc / max(n, 1) if length_norm else acc))
    return out


def gspo_per_token_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float,
    eps_high: float,
    length_norm: bool = True,
) -> Tensor:
    """(B, T) −min(s_i·A, clip(s_i)·A), the sequence term broadcast to every unmasked token of i."""
    s = sequence_ratios(logp, old_logp, mask, length_norm)
    keep = mask.bool().tolist()
    rows = []
    for i in range(logp.shape[0]):
        c = torch.clamp(s[i], 1.0 - eps_low, 1.0 + eps_high)
        row = []
        for t in range(logp.shape[1]):
            if not keep[i][t]:
                row.append(logp.new_zeros(()))
                continue
            a = _adv(advantages, i, t)
            row.append(-torch.minimum(s[i] * a, c * a))
        rows.append(row)
    return _stack(rows)


def k3_per_token(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    """(B, T) Schulman's k3 estimator exp(ref − logp) − (ref − logp) − 1 (TRL's ``per_token_kl``)."""
    keep = mask.bool().tolist()
    rows = []
    for i in range(logp.shape[0]):
        row = []
        for t in range(logp.shape[1]):
            if not keep[i][t]:
                row.append(logp.new_zeros(()))
                continue
            d = ref_logp[i, t].detach() - logp[i, t]
            row.append(torch.exp(d) - d - 1.0)
        rows.append(row)
    return _stack(rows)


# ------------------------------------------------------------------------------------------------
# DFPO: sign-aware post-clip weights (eq. 47) and the group transforms (App. B), per group


def post_clip_float(s: float, a: float, eps_low: float, eps_high: float) -> float:
    """s̄ of eq. (47) written out: min(s, clip(s)) = min(s, 1 + ε_high) for A ≥ 0, max(s, 1 − ε_low) for A < 0."""
    return min(s, 1.0 + eps_high) if a >= 0 else max(s, 1.0 - eps_low)


def post_clip(s: Tensor, a: float, eps_low: float, eps_high: float) -> Tensor:
    """Tensor version of ``post_clip_float``: the clipped branch is a constant (no gradient)."""
    if a >= 0 and float(s.detach()) > 1.0 + eps_high:
        return s.new_tensor(1.0 + eps_high)
    if a < 0 and float(s.detach()) < 1.0 - eps_low:
        return s.new_tensor(1.0 - eps_low)
    return s


def is_clipped(s: float, a: float, eps_low: float, eps_high: float) -> bool:
    """Whether s̄ is the constant clip bound (no gradient reaches the sequence)."""
    return (a >= 0 and s > 1.0 + eps_high) or (a < 0 and s < 1.0 - eps_low)


def ref_min_replace(w: Tensor, adv: Tensor, group: Tensor) -> Tensor:
    """DFPO eq. (50): each weight becomes its group's minimum (the minimum picked by a float loop)."""
    out: list[Tensor | None] = [None] * w.shape[0]
    vals = w.detach().tolist()
    for idx in groups_of(group).values():
        j_min = idx[0]
        for j in idx[1:]:
            if vals[j] < vals[j_min]:
                j_min = j
        for i in idx:
            out[i] = w[j_min]
    return torch.stack(out)


def ref_orth_proj(w: Tensor, adv: Tensor, group: Tensor) -> Tensor:
    """DFPO eq. (18): s̃ = s − (Âᵀs / ‖Â‖²)·Â per group (unchanged when Â = 0)."""
    out: list[Tensor | None] = [None] * w.shape[0]
    a = adv.tolist()
    for idx in groups_of(group).values():
        dot = w.new_zeros(())
        norm2 = 0.0
        for i in idx:
            dot = dot + a[i] * w[i]
            norm2 += a[i] * a[i]
        for i in idx:
            out[i] = w[i] - (dot / norm2) * a[i] if norm2 > 0 else w[i]
    return torch.stack(out)


def ref_truncate_rebalance(w: Tensor, adv: Tensor, group: Tensor, floor: float = 1e-6) -> Tensor:
    """DFPO eq. (52)-(55) per group: floor at ε, then scale the side that overshoots Âᵀs⁺ = 0."""
    out: list[Tensor | None] = [None] * w.shape[0]
    vals, a = w.detach().tolist(), adv.tolist()
    for idx in groups_of(group).values():
        # eq. (52)
        s_plus = {i: (w[i] if vals[i] >= floor else w.new_tensor(floor)) for i in idx}
        p_sum = w.new_zeros(())
        n_sum = w.new_zeros(())
        for i in idx:
            if a[i] > 0:
                p_sum = p_sum + a[i] * s_plus[i]
            elif a[i] < 0:
                n_sum = n_sum + (-a[i]) * s_plus[i]
        # eq. (53)
        delta = float(p_sum.detach()) - float(n_sum.detach())
        for i in idx:
            if delta > 0 and a[i] > 0:
                out[i] = s_plus[i] * (n_sum / p_sum)  # eq. (55) α
            elif delta < 0 and a[i] < 0:
                out[i] = s_plus[i] * (p_sum / n_sum)  # eq. (55) β
            else:
                out[i] = s_plus[i]
    return torch.stack(out)


def brute_force_qp_floats(
    s: Sequence[float], a: Sequence[float], tol: float = 1e-12
) -> tuple[list[float], tuple[int, ...]]:
    """Exact solution of DFPO eq. (51) for one group by enumerating every support set.

    For a support S (v_j = 0 off S), min ½‖v − s‖² s.t. Âᵀv = 0 is an equality-constrained least
    squares problem with the closed form v_S = s_S − λ·Â_S, λ = Â_Sᵀs_S / ‖Â_S‖² (λ = 0 when Â_S = 0).
    The QP's unique optimum solves that problem on its own support, so the best feasible candidate
    (v_S ≥ 0) over all 2^G supports is the optimum. Returns (v, S).
    """
    g = len(s)
    best_obj, best_v, best_set = math.inf, None, ()
    for size in range(g + 1):
        for sub in itertools.combinations(range(g), size):
            n2 = sum(a[j] * a[j] for j in sub)
            lam = sum(a[j] * s[j] for j in sub) / n2 if n2 > 0 else 0.0
            v = [0.0] * g
            for j in sub:
                v[j] = s[j] - lam * a[j]
            if any(x < -tol for x in v):
                continue
            obj = sum((v[j] - s[j]) ** 2 for j in range(g))
            if obj < best_obj:
                best_obj, best_v, best_set = obj, v, sub
    assert best_v is not None
    return best_v, best_set


def ref_orth_proj_pos(w: Tensor, adv: Tensor, group: Tensor) -> Tensor:
    """DFPO eq. (51) per group: the support from ``brute_force_qp_floats``, v rebuilt with torch ops."""
    out: list[Tensor | None] = [None] * w.shape[0]
    vals, a = w.detach().tolist(), adv.tolist()
    for idx in groups_of(group).values():
        _, support = brute_force_qp_floats([vals[i] for i in idx], [a[i] for i in idx])
        members = [idx[k] for k in support]
        n2 = sum(a[i] * a[i] for i in members)
        lam = w.new_zeros(())
        if n2 > 0:
            for i in members:
                lam = lam + a[i] * w[i]
            lam = lam / n2
        for i in idx:
            out[i] = w[i] - lam * a[i] if i in members else w[i] * 0.0
    return torch.stack(out)


REF_TRANSFORMS = {
    "min_replace": ref_min_replace,
    "orth_proj": ref_orth_proj,
    "orth_proj_pos": ref_orth_proj_pos,
    "truncate_rebalance": ref_truncate_rebalance,
}


def dfpo_weights(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    group: Tensor,
    transform: str,
    eps_low: float,
    eps_high: float,
    length_norm: bool = True,
) -> tuple[list[Tensor], Tensor, Tensor]:
    """(s_i, s̄, s̃): sequence ratios, post-clip weights (eq. 47), transformed weights (App. B)."""
    s = sequence_ratios(logp, old_logp, mask, length_norm)
    a = advantages.tolist()
    s_bar = torch.stack([post_clip(s[i], a[i], eps_low, eps_high) for i in range(len(s))])
    return s, s_bar, REF_TRANSFORMS[transform](s_bar, advantages, group)


def dfpo_per_token_loss(s_tilde: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """(B, T) −Â_i·s̃_i (eq. 49 with s̄ → s̃) broadcast to every unmasked token of sequence i."""
    keep = mask.bool().tolist()
    a = advantages.tolist()
    rows = []
    for i in range(mask.shape[0]):
        rows.append(
            [(-a[i] * s_tilde[i]) if keep[i][t] else s_tilde.new_zeros(()) for t in range(mask.shape[1])]
        )
    return _stack(rows)


# ------------------------------------------------------------------------------------------------
# metrics


def asym_floats(
    weights: Sequence[float], advantages: Sequence[float], group: Sequence[int] | Tensor
) -> float:
    """DFPO eq. (23): population variance of w_i·Â_i within each group, averaged over groups."""
    per_group = []
    for idx in groups_of(group).values():
        mods = [weights[i] * advantages[i] for i in idx]
        mu = sum(mods) / len(mods)
        per_group.append(sum((m - mu) ** 2 for m in mods) / len(mods))
    return sum(per_group) / len(per_group)
