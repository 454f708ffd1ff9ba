"""Group-relative objectives as registered pure functions.

Every objective has the signature::

    fn(logp, old_logp, advantages, mask, group, *, aggregation="token-mean", **params) -> (loss, metrics)

- ``logp``: (B, T) log π_θ of each sampled token (carries the gradient);
- ``old_logp``: (B, T) log π_old of the same tokens (no gradient);
- ``advantages``: (B,) one per completion, or (B, T) per token (Advantage Reweighting);
- ``mask``: (B, T) 1 for completion tokens, 0 for padding;
- ``group``: (B,) integer prompt id of each completion.

``loss`` is the negative objective (minimising it ascends J); ``metrics`` is a flat dict of floats
with the same keys for every objective (see ``METRIC_KEYS``). The clip range ``epsilon_low`` /
``epsilon_high`` (grpo, gspo, dfpo) is a float or a (B,) tensor, one ε per row (elementwise).

Each objective's parameters are declared once, as a frozen dataclass of ``cancellation.params``
(``register(name, params=...)``): their names, defaults (what the loss uses when one is left out), valid
values and one line of documentation. ``scaledrun.config``, the toy's theory and CLI and the TRL plug-in
read them from ``params_class(name)``.

An objective is built in three separate layers (docs/DESIGN.md): weights (token ratios r, sequence ratio
s, clipping), an optional group transform (``transforms``), and aggregation (``aggregation``).
Sequence-level objectives broadcast their per-sequence term to every token of the sequence, so
``seq-mean-token-mean`` gives exactly (1/G) Σ_i term_i, GSPO's eq. (42); this is also how TRL and
verl implement sequence-level importance sampling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ._checks import check_1d, check_2d, check_finite, check_group, check_mask, group_index, group_sum
from .aggregation import aggregate, aggregation_names
from .params import ESTIMATORS as ESTIMATORS  # re-exported: its home is cancellation.params
from .params import DfpoParams, GrpoParams, GrpoSymclipParams, GspoParams, ObjectiveParams
from .transforms import get_transform

#: Metric keys every objective returns (the toy, the trainer's logs and the app share them).
METRIC_KEYS = (
    "loss",
    "objective",
    "clip/low_frac",
    "clip/high_frac",
    "clip/frac",
    "ratio/mean",
    "ratio/min",
    "ratio/max",
    "seq_ratio/mean",
    "weight/mean",
    "weight/group_std",
    "asym",
    "zero_adv_group_frac",
    "kl",
)

Objective = Callable[..., tuple[Tensor, dict[str, float]]]
OBJECTIVES: dict[str, Objective] = {}
#: Each registered objective's parameter class (``cancellation.params``); objectives without one take none.
PARAMS: dict[str, type[ObjectiveParams]] = {}


def register(name: str, params: type[ObjectiveParams] | None = None) -> Callable[[Objective], Objective]:
    """Decorator: register an objective under ``name``, with its parameters' dataclass ``params``.

    The objective reads its parameters with ``take_params(name, params)`` (the defaults, the checks).
    ``params`` itself is left unchanged: the registry holds a subclass of it whose ``objective`` is
    ``name`` (so the same class registered for two objectives names each in its own messages).
    """

    def deco(fn: Objective) -> Objective:
        OBJECTIVES[name] = fn
        PARAMS.pop(name, None)
        if params is not None:
            attrs = {"objective": name, "__module__": params.__module__, "__qualname__": params.__qualname__}
            PARAMS[name] = type(params.__name__, (params,), attrs)
        return fn

    return deco


def objective_names() -> list[str]:
    return list(OBJECTIVES)


def params_class(name: str) -> type[ObjectiveParams] | None:
    """The parameter dataclass of objective ``name`` (None: an objective registered without one)."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; valid: {', '.join(OBJECTIVES)}")
    return PARAMS.get(name)


def default_params(name: str) -> dict[str, Any]:
    """``{field: default}`` of objective ``name``'s parameters, in declaration order ({} if it has none)."""
    cls = params_class(name)
    return {} if cls is None else dataclasses.asdict(cls())


def take_params(name: str, params: dict[str, Any]) -> Any:
    """Pop objective ``name``'s declared parameters from ``params`` into its dataclass (defaults, checks)."""
    cls = PARAMS[name]
    return cls(**{f.name: params.pop(f.name) for f in dataclasses.fields(cls) if f.name in params})


# --------------------------------------------------------------------------------------------
# layer 1: weights


def _log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """(B, T) log r = logp − sg(old_logp), set to 0 on padding (whatever the padding holds)."""
    return torch.where(mask.bool(), logp - old_logp.detach(), torch.zeros_like(logp))


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, length_norm: bool = True) -> Tensor:
    """log s_i: (B,) the mean (GSPO) or sum (plain sequence IS) of the token log-ratios."""
    log_r = _log_ratio(logp, old_logp, mask)
    # DFPO eq. (44): s_i = exp((1/|y_i|) Σ_t log r_{i,t});  eq. (11)/(31): s_i = Π_t r_{i,t}
    return _masked_mean(log_r, mask) if length_norm else log_r.sum(-1)


def sign_aware_clip(
    weights: Tensor, advantages: Tensor, epsilon_low: float | Tensor, epsilon_high: float | Tensor
) -> Tensor:
    """The sign-aware post-clip weight s̄ (DFPO eq. 47), elementwise.

    min(w·A, clip(w)·A) == A·s̄ exactly for both signs of A (eq. 48–49). The ε may be floats or
    tensors broadcastable to ``weights`` (both of the same kind, as ``_eps`` returns them).
    """
    # DFPO eq. (46): c = clip(w, 1 − ε_low, 1 + ε_high)
    clipped = weights.clamp(1.0 - epsilon_low, 1.0 + epsilon_high)
    # DFPO eq. (47): s̄ = min(w, c) if Â ≥ 0 else max(w, c)
    return torch.where(advantages >= 0, torch.minimum(weights, clipped), torch.maximum(weights, clipped))


# --------------------------------------------------------------------------------------------
# shared tail: KL, aggregation, metrics


class _Stats(NamedTuple):
    """Metric-only quantities of one objective call (computed only when metrics are asked for).

    ``weights`` (B,) is w_i, the trajectory-level weight of eq. (23): the (transformed) post-clip
    sequence weight for sequence-level objectives, the mean post-clip token weight otherwise.
    """

    token_ratio: Tensor  # (B, T) r
    seq_ratio: Tensor  # (B,) s
    weights: Tensor  # (B,) w_i
    low_clipped: Tensor  # (B, T) bool
    high_clipped: Tensor  # (B, T) bool


def group_asym(weights: Tensor, advantages: Tensor, group: Tensor) -> Tensor:
    """DFPO eq. (23), averaged over groups: the within-group variance of the modulation w_i·Â_i.

    Args:
        weights: (B,) trajectory weights w_i (s̄ for GSPO, s̃ for DFPO, ...).
        advantages: (B,) one advantage per completion.
        group: (B,) integer prompt ids.
    Returns:
        a 0-d tensor: the mean over groups of the population variance (divide by G) of w_i·Â_i.
    """
    check_1d("weights", weights)
    check_1d("advantages", advantages, weights.shape[0])
    check_group(group, weights.shape[0])
    inverse, n_groups = group_index(group)
    counts = group_sum(torch.ones_like(weights), inverse, n_groups)
    # DFPO eq. (23): Asym = Var_i(w_i Â_i) within a group
    mod = weights * advantages
    mod_mean = group_sum(mod, inverse, n_groups) / counts
    return (group_sum((mod - mod_mean[inverse]) ** 2, inverse, n_groups) / counts).mean()


def _validate(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, group: Tensor) -> None:
    check_2d("logp", logp)
    shape = (logp.shape[0], logp.shape[1])
    check_2d("old_logp", old_logp, shape)
    check_mask(mask, shape)
    if advantages.dim() == 1:
        check_1d("advantages", advantages, shape[0])
    else:
        check_2d("advantages", advantages, shape)
    check_group(group, shape[0])
    check_finite("advantages", advantages)
    check_finite("old_logp", torch.where(mask.bool(), old_logp, torch.zeros_like(old_logp)))


def _eps(p: Any, logp: Tensor) -> tuple[float, float] | tuple[Tensor, Tensor]:
    """The clip range of parameters ``p`` (checked there): two floats, or two (B,) tensors, one ε per row,
    when either is given as a 1-D tensor.

    Per-row ε lets one flat batch hold rows with different clip ranges (the batched toy's per-seed ε);
    the other is then broadcast to (B,). Use ``_col`` to apply them to (B, T) or (B, 1) tensors.
    """
    e_low, e_high = p.epsilon_low, p.epsilon_high
    if not any(isinstance(e, Tensor) for e in (e_low, e_high)):
        return e_low, e_high
    b = logp.shape[0]
    rows = []
    for name, e in (("epsilon_low", e_low), ("epsilon_high", e_high)):
        e = torch.as_tensor(e, dtype=logp.dtype, device=logp.device).detach()
        if e.dim() > 1 or (e.dim() == 1 and e.shape[0] != b):
            raise ValueError(
                f"`{name}` must be a number or a (B,) tensor with B={b}, got shape {tuple(e.shape)}"
            )
        rows.append(e.expand(b))
    lo, hi = rows
    return lo, hi


def _col(eps: float | Tensor) -> float | Tensor:
    """A per-row (B,) ε as a (B, 1) column (broadcasts over the tokens); a float as it is."""
    return eps[:, None] if isinstance(eps, Tensor) else eps


def _finish(
    name: str,
    per_token_obj: Tensor,
    *,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    group: Tensor,
    aggregation: str,
    params: dict[str, Any],
    stats: Callable[[], _Stats] | None,
) -> tuple[Tensor, dict[str, float]]:
    """Aggregate −objective (+ β·KL), and compute the shared metrics from ``stats()``.

    ``stats`` is None when the caller wants no metrics (nothing metric-only is computed then).
    """
    beta = float(params.pop("beta", 0.0))
    ref_logp = params.pop("ref_logp", None)
    agg_kwargs = {k: params.pop(k) for k in ("norm_constant", "token_count", "seq_count") if k in params}
    if params:
        raise TypeError(f"objective {name!r} got unknown parameter(s): {', '.join(sorted(params))}")
    per_token_loss = -per_token_obj
    kl = None
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs `ref_logp`, the (B, T) log-probs of the reference policy")
        check_2d("ref_logp", ref_logp, tuple(logp.shape))
        # 0 on padding, whatever the padding holds (exp of a huge padded difference would give inf·0 = NaN)
        delta = torch.where(mask.bool(), ref_logp.detach() - logp, torch.zeros_like(logp))
        # k3 estimator (Schulman): KL(π_θ‖π_ref) ≈ exp(ref − logp) − (ref − logp) − 1 per token
        kl = delta.exp() - delta - 1.0
        per_token_loss = per_token_loss + beta * kl
    loss = aggregate(per_token_loss, mask, aggregation, **agg_kwargs)
    if stats is None:
        return loss, {}
    with torch.no_grad():
        token_ratio, seq_ratio, weights, low_clipped, high_clipped = stats()
        m = mask.to(logp.dtype)
        n_tok = m.sum()
        adv_seq = advantages if advantages.dim() == 1 else _masked_mean(advantages, m)
        inverse, n_groups = group_index(group)
        counts = group_sum(torch.ones_like(adv_seq), inverse, n_groups)
        w = weights.detach()
        w_mean = group_sum(w, inverse, n_groups) / counts
        w_std = (group_sum((w - w_mean[inverse]) ** 2, inverse, n_groups) / counts).sqrt()
        zero_groups = group_sum((adv_seq != 0).to(m.dtype), inverse, n_groups) == 0
        valid = mask.bool()
        r = token_ratio.detach()[valid]
        metrics = {
            "loss": loss.detach(),
            "objective": aggregate(per_token_obj.detach(), mask, aggregation, **agg_kwargs),
            "clip/low_frac": (low_clipped & valid).sum() / n_tok,
            "clip/high_frac": (high_clipped & valid).sum() / n_tok,
            "clip/frac": ((low_clipped | high_clipped) & valid).sum() / n_tok,
            "ratio/mean": r.mean(),
            "ratio/min": r.min(),
            "ratio/max": r.max(),
            "seq_ratio/mean": seq_ratio.detach().mean(),
            "weight/mean": w.mean(),
            "weight/group_std": w_std.mean(),
            "asym": group_asym(w, adv_seq, group),
            "zero_adv_group_frac": zero_groups.to(m.dtype).mean(),
            "kl": (kl.detach() * m).sum() / n_tok if kl is not None else torch.zeros(()),
        }
        return loss, {k: float(v) for k, v in metrics.items()}


# --------------------------------------------------------------------------------------------
# the objectives


@register("grpo", params=GrpoParams)
def grpo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    group: Tensor,
    *,
    aggregation: str = "token-mean",
    with_metrics: bool = True,
    **params: Any,
) -> tuple[Tensor, dict[str, float]]:
    """GRPO's token-level clipped surrogate, with clip-higher (DAPO).

    Params: ``GrpoParams`` (``epsilon_low`` 0.2, ``epsilon_high`` 0.2; DAPO uses 0.28), ``beta``,
    ``ref_logp``, ``norm_constant``.
    """
    e_low, e_high = _eps(take_params("grpo", params), logp)
    e_low, e_high = _col(e_low), _col(e_high)  # per-row ε broadcast over the tokens
    adv = advantages if advantages.dim() == 2 else advantages[:, None]
    log_r = _log_ratio(logp, old_logp, mask)
    ratio = log_r.exp()
    clipped = ratio.clamp(1.0 - e_low, 1.0 + e_high)
    # DFPO eq. (77): min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A), per token
    obj = torch.minimum(ratio * adv, clipped * adv)

    def stats() -> _Stats:
        m = mask.to(ratio.dtype)
        weights = _masked_mean(sign_aware_clip(ratio, adv.expand_as(ratio), e_low, e_high), m)
        low = (ratio < 1.0 - e_low) & (adv < 0)
        high = (ratio > 1.0 + e_high) & (adv > 0)
        return _Stats(ratio, _masked_mean(log_r, m).exp(), weights, low, high)

    return _finish(
        "grpo", obj, logp=logp, old_logp=old_logp, advantages=advantages, mask=mask, group=group,
        aggregation=aggregation, params=params, stats=stats if with_metrics else None,
    )  # fmt: skip


@register("grpo_symclip", params=GrpoSymclipParams)
def grpo_symclip(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    group: Tensor,
    *,
    aggregation: str = "token-mean",
    with_metrics: bool = True,
    **params: Any,
) -> tuple[Tensor, dict[str, float]]:
    """GRPO-fix: symmetric clipping A·clip(r, 0, 1 + ε), the same operator for both signs of A.

    Params: ``GrpoSymclipParams`` (``epsilon`` 0.2, the usual GRPO clip), ``beta``, ``ref_logp``,
    ``norm_constant``.
    """
    eps = take_params("grpo_symclip", params).epsilon
    adv = advantages if advantages.dim() == 2 else advantages[:, None]
    log_r = _log_ratio(logp, old_logp, mask)
    ratio = log_r.exp()
    # DFPO App. H eq. (79)-(80): φ(r) = clip(r, 0, 1 + ε);  term = Â·φ(r)
    phi = ratio.clamp(0.0, 1.0 + eps)
    obj = adv * phi

    def stats() -> _Stats:
        m = mask.to(ratio.dtype)
        high = ratio > 1.0 + eps
        return _Stats(ratio, _masked_mean(log_r, m).exp(), _masked_mean(phi, m), torch.zeros_like(high), high)

    return _finish(
        "grpo_symclip", obj, logp=logp, old_logp=old_logp, advantages=advantages, mask=mask, group=group,
        aggregation=aggregation, params=params, stats=stats if with_metrics else None,
    )  # fmt: skip


def _sequence_weights(
    logp: Tensor, old_logp: Tensor, mask: Tensor, length_norm: bool
) -> tuple[Tensor, Tensor, Callable[[], Tensor]]:
    """(mask as float, s (B,), a function giving the (B, T) token ratios for the metrics)."""
    m = mask.to(logp.dtype)
    log_s = sequence_log_ratio(logp, old_logp, m, length_norm)
    return m, log_s.exp(), lambda: _log_ratio(logp.detach(), old_logp, m).exp()


def _score_function_term(weight: Tensor, advantages: Tensor, s: Tensor) -> Tensor:
    """(B,) Â_i·sg(w_i / s_i)·s_i(θ): value Â_i·w_i, gradient Â_i·w_i·∇log s_i (w_i a constant).

    This is the stop-gradient estimator of DFPO eq. (16)/(59)-(62)/(68)/(85)-(86)/(91): every
    trajectory, clipped or not, moves along the direction of its *unclipped* sequence ratio, scaled by
    the constant w_i. ``s > 0`` always (an exponential), so the quotient is finite.
    """
    # DFPO eq. (68)/(86): ∇J = Σ_i w_i·Â_i·∇log s_i(θ), with w_i = s̄_i (GSPO) or s̃_i (DFPO) held constant
    return advantages * (weight.detach() / s.detach()) * s


@register("gspo", params=GspoParams)
def gspo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    group: Tensor,
    *,
    aggregation: str = "seq-mean-token-mean",
    with_metrics: bool = True,
    **params: Any,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO: one clipped, length-normalised sequence ratio per completion (DFPO eq. 42-44).

    Params (``GspoParams``): ``epsilon_low`` (3e-4) and ``epsilon_high`` (4e-4), GSPO's defaults; ``length_norm``
    (True: s = exp(mean_t log r), eq. 44; False: s = Π_t r, the plain sequence-coupled weight of
    eq. 11/31 that App. A's closed forms use); ``estimator``; ``beta``, ``ref_logp``, ``norm_constant``.

    ``estimator``:

    - ``"ppo_clip"`` (default, GSPO's own objective): min(s·Â, clip(s)·Â), eq. (42). A sequence whose
      ratio left the band on the side that binds gets no gradient (PPO's trust region).
    - ``"paper"``: DFPO's baseline under the paper's stop-gradient estimator, eq. (86): every
      trajectory, clipped or not, gets the coefficient s̄_i·Â_i on ∇log s_i(θ), s̄ the sign-aware
      post-clip weight (eq. 47) held constant. Its value equals eq. (42)'s; its gradient keeps the
      sequences the clip would silence, i.e. it takes larger steps. It is DFPO without a transform:
      compare DFPO with this variant to tell the transform's own effect from the estimator's.

    With (B, T) advantages (``ppo_clip`` only), each token's term is min(s·A_t, clip(s)·A_t).
    """
    p = take_params("gspo", params)
    e_low, e_high = _eps(p, logp)
    length_norm, estimator = p.length_norm, p.estimator
    m, s, token_ratio = _sequence_weights(logp, old_logp, mask, length_norm)
    if estimator == "paper":
        if advantages.dim() != 1:
            raise ValueError(
                "gspo with estimator='paper' needs one advantage per completion, shape (B,); per-token "
                "(B, T) advantages (Advantage Reweighting, Lopti) work with estimator='ppo_clip'"
            )
        # DFPO eq. (47): the sign-aware post-clip weight, a constant here
        s_bar = sign_aware_clip(s.detach(), advantages, e_low, e_high)
        obj = _score_function_term(s_bar, advantages, s)[:, None].expand_as(logp)
    else:
        adv = advantages if advantages.dim() == 2 else advantages[:, None]
        s_tok = s[:, None]
        clipped = s_tok.clamp(1.0 - _col(e_low), 1.0 + _col(e_high))
        # DFPO eq. (42): min(s_i·Â_i, clip(s_i, 1 − ε, 1 + ε)·Â_i), broadcast to the tokens of sequence i
        obj = torch.minimum(s_tok * adv, clipped * adv).expand_as(logp)

    def stats() -> _Stats:
        adv_seq = advantages if advantages.dim() == 1 else _masked_mean(advantages, m)
        low = ((s < 1.0 - e_low) & (adv_seq < 0))[:, None].expand_as(logp)
        high = ((s > 1.0 + e_high) & (adv_seq > 0))[:, None].expand_as(logp)
        return _Stats(token_ratio(), s, sign_aware_clip(s, adv_seq, e_low, e_high), low, high)

    return _finish(
        "gspo", obj, logp=logp, old_logp=old_logp, advantages=advantages, mask=mask, group=group,
        aggregation=aggregation, params=params, stats=stats if with_metrics else None,
    )  # fmt: skip


def dfpo_weights(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    group: Tensor,
    *,
    transform: str = DfpoParams.transform,
    epsilon_low: float | Tensor = DfpoParams.epsilon_low,
    epsilon_high: float | Tensor = DfpoParams.epsilon_high,
    length_norm: bool = DfpoParams.length_norm,
) -> tuple[Tensor, Tensor, Tensor]:
    """DFPO's weights of one batch: ``(s, s̄, s̃)``, each (B,), differentiable as far as the math is.

    s is the sequence ratio (eq. 44, or Π_t r without ``length_norm``), s̄ the sign-aware post-clip
    weight (eq. 47), s̃ = T(s̄) the transformed weight (eq. 17/18/50-55). A row with no unmasked token
    (e.g. a truncated completion left out of the loss) takes no part in its group's transform: it
    keeps s̃ = s̄ and does not change the other rows' weights.
    """
    _, s, _ = _sequence_weights(logp, old_logp, mask, length_norm)
    # DFPO eq. (47): sign-aware post-clip weight
    s_bar = sign_aware_clip(s, advantages, epsilon_low, epsilon_high)
    # rows outside the loss form groups of their own (ids past every real id), so no transform sees them
    empty = mask.sum(-1) == 0
    if bool(empty.any()):
        solo = group.max() + 1 + torch.arange(group.shape[0], device=group.device)
        group = torch.where(empty, solo, group)
    s_tilde = get_transform(transform)(s_bar, advantages, group)
    return s, s_bar, s_tilde


@register("dfpo", params=DfpoParams)
def dfpo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    group: Tensor,
    *,
    aggregation: str = "seq-mean-token-mean",
    with_metrics: bool = True,
    **params: Any,
) -> tuple[Tensor, dict[str, float]]:
    """DFPO: GSPO's sign-aware post-clip weight s̄ (eq. 47), then a group transform s̃ = T(s̄) (App. B).

    Params (``DfpoParams``): ``transform`` (``min_replace`` default, ``orth_proj``, ``orth_proj_pos``,
    ``truncate_rebalance``); ``estimator`` (``"paper"``); ``stop_grad`` (True);
    ``epsilon_low``/``epsilon_high`` (GSPO's 3e-4 / 4e-4); ``length_norm`` (True); ``beta``,
    ``ref_logp``, ``norm_constant``.

    What is differentiated:

    - ``estimator="paper"`` (default; eq. 16, 59-62, 68, 85-86, 91): every trajectory i, clipped or
      not, gets the score-function coefficient s̃_i·Â_i on ∇log s_i(θ) (so s̃_i·Â_i/|y_i| on each
      ∇log π(y_{i,t}) with the length-normalised s): s̃ is a constant (its value is T(s̄)), the
      direction is that of the *unclipped* sequence ratio. With the transform's constraint
      Σ_i Â_i s̃_i = 0 (eq. 18; Min-Replace: s̃ constant in the group and Σ_i Â_i = 0), a token that
      every completion of an equal-length group shares gets a net coefficient of exactly 0, clipped
      sequences included. This is what the paper writes. It keeps no PPO-style trust region beyond
      the value of s̃ (like CISPO): clipping only bounds the weight, it never silences a gradient.
    - ``estimator="ppo_clip"`` (a trust-region variant that is *not* in the paper): s̃ enters as
      sg(s̃_i / s̄_i)·s̄_i(θ), value s̃_i, gradient s̃_i·Â_i·∇log s̄_i, so a sequence whose s̄ is clipped
      (a constant) gets no gradient, as in PPO/GSPO. The group constraint then no longer holds on
      the gradient: with GSPO's ε and several optimiser steps per batch nearly every sequence is
      clipped and this variant behaves like GSPO.
    - ``stop_grad=False`` (Table 3's "no stop-grad" ablation): the objective Σ_i Â_i·T(s̄(θ))_i is
      differentiated through the transform and through s̄ (so clipped sequences are constant there
      too, and Min-Replace's gradient reaches only the group's arg-min row). ``estimator`` is
      ignored then.

    Needs one advantage per completion: (B, T) advantages raise, since the transforms act on the
    group's advantage vector.
    """
    if advantages.dim() != 1:
        raise ValueError(
            "dfpo needs one advantage per completion, shape (B,), because its group transforms act on the "
            "group's advantage vector; per-token (B, T) advantages (Advantage Reweighting) work with grpo, "
            "grpo_symclip and gspo"
        )
    p = take_params("dfpo", params)
    e_low, e_high = _eps(p, logp)
    length_norm, transform, estimator, stop_grad = p.length_norm, p.transform, p.estimator, p.stop_grad
    kw = dict(transform=transform, epsilon_low=e_low, epsilon_high=e_high, length_norm=length_norm)
    if not stop_grad:
        # Table 3 ablation: gradient through T and s̄
        s, _, s_tilde = dfpo_weights(logp, old_logp, advantages, mask, group, **kw)
        seq_obj = advantages * s_tilde
    else:
        s, s_bar, s_tilde = dfpo_weights(logp, old_logp, advantages, mask, group, **kw)
        s_tilde_value = s_tilde.detach()
        if estimator == "paper":
            seq_obj = _score_function_term(s_tilde_value, advantages, s)
        else:
            # trust-region variant: s̃ = sg(s̃ / s̄)·s̄(θ) (s̄ > 0 always, so the ratio is finite)
            seq_obj = advantages * (s_tilde_value / s_bar.detach()) * s_bar
    # DFPO eq. (49) with s̄ replaced by s̃: Â_i·s̃_i, broadcast to the tokens of sequence i
    obj = seq_obj[:, None].expand_as(logp)

    def stats() -> _Stats:
        low = ((s < 1.0 - e_low) & (advantages < 0))[:, None].expand_as(logp)
        high = ((s > 1.0 + e_high) & (advantages > 0))[:, None].expand_as(logp)
        token_ratio = _log_ratio(logp.detach(), old_logp, mask).exp()
        return _Stats(token_ratio, s.detach(), s_tilde.detach(), low, high)

    return _finish(
        "dfpo", obj, logp=logp, old_logp=old_logp, advantages=advantages, mask=mask, group=group,
        aggregation=aggregation, params=params, stats=stats if with_metrics else None,
    )  # fmt: skip


def compute_loss(
    name: str,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    group: Tensor,
    *,
    aggregation: str | None = None,
    with_metrics: bool = True,
    **params: Any,
) -> tuple[Tensor, dict[str, float]]:
    """Validate the inputs and run the objective registered as ``name``.

    ``aggregation`` defaults to the objective's own (``token-mean`` for the token-level objectives,
    ``seq-mean-token-mean`` for gspo and dfpo, as in their papers). ``with_metrics=False`` skips the
    metrics (the simulator's inner epochs use it for speed).
    """
    try:
        fn = OBJECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown objective {name!r}; valid: {', '.join(OBJECTIVES)}") from None
    if aggregation is not None and aggregation not in aggregation_names():
        raise ValueError(f"unknown aggregation {aggregation!r}; valid: {', '.join(aggregation_names())}")
    _validate(logp, old_logp, advantages, mask, group)
    if aggregation is not None:
        params["aggregation"] = aggregation
    return fn(logp, old_logp, advantages, mask, group, with_metrics=with_metrics, **params)
