"""The DFPO paper's closed forms for the toy problems, as small functions of the paper's symbols.

These are the numbers the paper *predicts*; ``toymodel.scenarios.shared_prefix_net`` and
``clip_asymmetry_net`` (autograd through ``cancellation``) are what the code *does*. The tests
(``tests/toymodel/test_theory.py``) check that the two agree on a grid of inputs, and the app shows
them side by side.

Conventions. A "coefficient" is ∂J/∂logp of one token (``cancellation.diagnostics.token_coefficients``):
the scalar multiplying its score direction ∇θ log π (DFPO eq. 70). On a shared context-token event
the tokens' coefficients add (eq. 72): that sum is the "net coefficient". The papers' surrogates
carry no aggregation factor; the toy's objectives do (``seq-mean-token-mean``: 1/G for a
sequence-level term, GSPO eq. 42; ``token-mean``: 1/(number of tokens)), so the coefficient forms
take it as an argument.

App. A.2 (shared prefix, G = 2, T = 3; Â1 = −A, Â2 = +A, eq. 32; ratios ρ1, ρ2 shared, λ1, λ2 not,
eq. 35-36):

- ``eq38_surrogate``: Σ_i Â_i s_i = A·ρ1·ρ2·(λ2 − λ1) for s_i = Π_t r_{i,t} (eq. 37-38);
- ``eq38_coefficient``: its per-token version on each shared step, A·ρ1·ρ2·(λ2 − λ1)/G;
- ``eq38_gspo_coefficient``: GSPO's length-normalised version (A/(G·T))·(s2 − s1), s_i = (ρ1ρ2λ_i)^{1/T};
- ``shared_event_coefficient``: eq. (72) in general (what DFPO's transforms zero via eq. 73);
- ``dfpo_shared_prefix_coefficient``: eq. (72) with DFPO's s̃ from ``cancellation.transforms``;
- ``paper_estimator_coefficient``: eq. (72) under the paper's stop-gradient estimator (eq. 68/86),
  where every trajectory, clipped or not, keeps its coefficient w_i·Â_i/(G·|y_i|);
- ``shared_prefix_closed_form``: the paper's prediction for any objective, same arguments as
  ``shared_prefix_net``.

App. F (clip asymmetry, a shared token with ratio w, Â = (−A, +A)):

- ``clip_surrogate``: C(w) of eq. (75)/(76), the group's aggregated clipped surrogate;
- ``clip_coefficient``: its gradient along ∇log π, w·C'(w) (the clipped branch is constant);
- ``symclip_coefficient``: App. H eq. (82), Σ_i Â_i·∂φ(w)/∂log w, 0 when Σ Â = 0;
- ``clip_asymmetry_closed_form``: the prediction for ``clip_asymmetry_net``'s arguments.

Estimators (``cancellation.objectives.ESTIMATORS``). ``gspo`` and ``dfpo`` take ``estimator``:
``"ppo_clip"`` (GSPO's default) differentiates the clipped surrogate, so a trajectory whose clip binds
is a constant and drops out; ``"paper"`` (DFPO's default, eq. 16/59-62/68/86/91) gives every
trajectory the constant coefficient w_i·Â_i on ∇log s_i, clipped or not (w = s̄ for gspo, s̃ for dfpo).

Kinks. The clipped forms use the sign-aware rule of eq. (47)-(49) (``carries_gradient``): a term
whose clip binds is a constant and drops out of the gradient. At a kink (a ratio exactly at
1 + ε_high or 1 − ε_low, compared in floating point exactly as the objective compares it) the
derivative does not exist, and these functions take the side that autograd takes there: the term
counts as unclipped, since ``torch.clamp`` passes the gradient at its bounds and ``torch.minimum``/
``torch.maximum`` split it between two equal arguments whose derivatives are then equal. That holds
for every closed form here (``carries_gradient``, ``clip_coefficient``, ``symclip_coefficient``,
``eq38_coefficient``, ``eq38_gspo_coefficient``, ``dfpo_shared_prefix_coefficient``; tested at the
kinks and either side). The branch is decided on the float ratio a function is given: a caller whose
objective sees a ratio that rounds differently (e.g. exp(log w), or a ratio of two softmaxes) can sit
one ulp on the other side of the bound, where the coefficient jumps.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from cancellation.objectives import ESTIMATORS, OBJECTIVES, default_params, params_class, sign_aware_clip
from cancellation.params import DfpoParams, GrpoParams, GrpoSymclipParams, check_field
from cancellation.transforms import get_transform

#: The shared-prefix toy's group size and trajectory length (App. A.2: τ1, τ2, three tokens each).
SP_GROUP_SIZE = 2
SP_LENGTH = 3
#: The clip-asymmetry toy's token count (two trajectories of two tokens: token-mean divides by 4).
CA_TOKENS = 4


class ClosedForm(NamedTuple):
    """A paper prediction: its value, which equation gives it, and one sentence on why."""

    value: float
    equation: str
    why: str


# ----------------------------------------------------------------------------------------------
# helpers


def _check_advantage(advantage: float) -> float:
    a = float(advantage)
    if not (math.isfinite(a) and a >= 0.0):
        raise ValueError(
            f"advantage A must be a finite number ≥ 0 (eq. 32: Â2 = −Â1 = A > 0), got {advantage}"
        )
    return a


def _check_eps(
    epsilon_low: float | None, epsilon_high: float | None, objective: str = "grpo"
) -> tuple[float, float]:
    """The clip range, checked by ``objective``'s parameter class (one check, one message); None means
    'no clipping on that side'."""
    cls = params_class(objective)
    lo = math.inf if epsilon_low is None else float(check_field(cls, "epsilon_low", epsilon_low))  # type: ignore[arg-type]
    hi = math.inf if epsilon_high is None else float(check_field(cls, "epsilon_high", epsilon_high))  # type: ignore[arg-type]
    return lo, hi


def _check_positive(**values: float) -> None:
    for name, v in values.items():
        if not (math.isfinite(float(v)) and float(v) > 0.0):
            raise ValueError(f"{name} must be a finite ratio > 0, got {v}")


def carries_gradient(
    weight: float, advantage: float, epsilon_low: float | None, epsilon_high: float | None
) -> bool:
    """Whether min(w·Â, clip(w, 1 − ε_low, 1 + ε_high)·Â) depends on w (DFPO eq. 47-49).

    By eq. (48)-(49) the term is Â·s̄ with the sign-aware s̄ of eq. (47): s̄ = min(w, c) for Â ≥ 0,
    max(w, c) for Â < 0. It is the constant c·Â (no gradient) exactly when the clip binds on the
    side that the sign selects: Â > 0 and w > 1 + ε_high, or Â < 0 and w < 1 − ε_low. ``None``
    disables that side. A weight exactly at the boundary (w == 1 + ε_high or w == 1 − ε_low in
    floating point) counts as unclipped, which is what autograd of the objective gives there: the
    clip is strict (``>``, ``<``) on both sides.
    """
    lo, hi = _check_eps(epsilon_low, epsilon_high)
    w, a = float(weight), float(advantage)
    if a > 0:
        return not w > 1.0 + hi
    if a < 0:
        return not w < 1.0 - lo
    return True


# ----------------------------------------------------------------------------------------------
# App. A.2: the shared prefix


def eq38_surrogate(rho1: float, rho2: float, lam1: float, lam2: float, advantage: float = 1.0) -> float:
    """Σ_i Â_i s_i for the product weights s_i = Π_t r_{i,t} of the shared-prefix group (DFPO eq. 38).

    With Â = (−A, +A) (eq. 32) and s_i = ρ1·ρ2·λ_i (eq. 37), this is the scalar that multiplies
    the shared prefix's score direction; it is 0 only if λ1 = λ2.
    """
    _check_positive(rho1=rho1, rho2=rho2, lam1=lam1, lam2=lam2)
    a = _check_advantage(advantage)
    # DFPO eq. (38): Â1·s1 + Â2·s2 = (−A)·ρ1ρ2λ1 + A·ρ1ρ2λ2 = A·ρ1·ρ2·(λ2 − λ1)
    return a * rho1 * rho2 * (lam2 - lam1)


def eq38_coefficient(
    rho1: float,
    rho2: float,
    lam1: float,
    lam2: float,
    advantage: float = 1.0,
    *,
    group_size: int = SP_GROUP_SIZE,
    epsilon_low: float | None = None,
    epsilon_high: float | None = None,
) -> float:
    """Net ∂J/∂logp on each shared prefix step for s_i = Π_t r_{i,t}: eq. (38)/G.

    J = (1/G) Σ_i Â_i s_i (eq. 11; ``seq-mean-token-mean`` gives the 1/G) and ∂s_i/∂logp_{i,t} = s_i,
    so both tokens of a shared step get Â_i s_i/G and their sum is eq. (38)/G. With a clip range
    (``epsilon_low``/``epsilon_high``, None = no clipping), a trajectory whose sign-aware clip binds
    (eq. 47-49) is a constant and drops out.
    """
    _check_positive(rho1=rho1, rho2=rho2, lam1=lam1, lam2=lam2)
    a = _check_advantage(advantage)
    g = _check_group_size(group_size)
    s1, s2 = rho1 * rho2 * lam1, rho1 * rho2 * lam2  # DFPO eq. (37)
    if carries_gradient(s1, -a, epsilon_low, epsilon_high) and carries_gradient(
        s2, a, epsilon_low, epsilon_high
    ):
        # DFPO eq. (38) with the 1/G of eq. (11)
        return eq38_surrogate(rho1, rho2, lam1, lam2, a) / g
    # DFPO eq. (72) with the clipped (constant) trajectory left out, eq. (47)-(49)
    return shared_event_coefficient(
        [s1, s2], [-a, a], [1, 1], _active([s1, s2], [-a, a], epsilon_low, epsilon_high), g
    )


def eq38_gspo_coefficient(
    rho1: float,
    rho2: float,
    lam1: float,
    lam2: float,
    advantage: float = 1.0,
    *,
    group_size: int = SP_GROUP_SIZE,
    length: int = SP_LENGTH,
    epsilon_low: float | None = None,
    epsilon_high: float | None = None,
) -> float:
    """Net ∂J/∂logp on each shared prefix step for GSPO's s_i = (ρ1·ρ2·λ_i)^{1/T}: (A/(G·T))·(s2 − s1).

    GSPO's length-normalised weight (eq. 44) has ∂s_i/∂logp_{i,t} = s_i/T (eq. 58), so eq. (38)'s
    structure becomes (1/(G·T))·(Â1 s1 + Â2 s2). Clipping as in ``eq38_coefficient``.
    """
    _check_positive(rho1=rho1, rho2=rho2, lam1=lam1, lam2=lam2)
    a = _check_advantage(advantage)
    g = _check_group_size(group_size)
    t = _check_group_size(length, "length")
    # DFPO eq. (44): s_i = (Π_t r_{i,t})^{1/T} = (ρ1·ρ2·λ_i)^{1/T}
    s1, s2 = (rho1 * rho2 * lam1) ** (1.0 / t), (rho1 * rho2 * lam2) ** (1.0 / t)
    active = _active([s1, s2], [-a, a], epsilon_low, epsilon_high)
    if all(active):
        # DFPO eq. (38) with eq. (58)'s 1/T: (A/(G·T))·(s2 − s1)
        return a / (g * t) * (s2 - s1)
    return shared_event_coefficient([s1, s2], [-a, a], [t, t], active, g)


def _check_group_size(g: int, name: str = "group_size") -> int:
    if isinstance(g, bool) or not isinstance(g, int) or g < 1:
        raise ValueError(f"{name} must be an int ≥ 1, got {g!r}")
    return g


def _active(
    weights: Sequence[float],
    advantages: Sequence[float],
    epsilon_low: float | None,
    epsilon_high: float | None,
) -> list[bool]:
    return [
        carries_gradient(w, a, epsilon_low, epsilon_high) for w, a in zip(weights, advantages, strict=True)
    ]


def shared_event_coefficient(
    weights: Sequence[float],
    advantages: Sequence[float],
    lengths: Sequence[float],
    active: Sequence[bool] | None = None,
    group_size: int | None = None,
) -> float:
    """DFPO eq. (72): the net coefficient of a shared event, (1/G)·Σ_i w_i·Â_i/|y_i| over its tokens.

    Each trajectory i in the list contributes one token to the event. ``weights`` are the sequence
    weights multiplying its score direction (s_i for GSPO, s̃_i for DFPO, eq. 70); ``lengths`` the
    |y_i| of eq. (70) (1 for a product weight, whose ∂s/∂logp = s carries no 1/T); ``active`` marks
    the trajectories whose weight carries a gradient (default: all; a clipped one is a constant,
    eq. 47-49). ``group_size`` is G (default: the number of trajectories). Eq. (73) makes this 0
    when every trajectory is active and the lengths are equal.
    """
    w = [float(x) for x in weights]
    a = [float(x) for x in advantages]
    n = [float(x) for x in lengths]
    act = [True] * len(w) if active is None else [bool(x) for x in active]
    if not (len(w) == len(a) == len(n) == len(act)) or not w:
        raise ValueError(
            f"weights, advantages, lengths and active need one entry per trajectory, got "
            f"{len(w)}, {len(a)}, {len(n)}, {len(act)}"
        )
    if any(not x > 0 for x in n):
        raise ValueError(f"lengths must be > 0, got {n}")
    g = len(w) if group_size is None else _check_group_size(group_size)
    # DFPO eq. (72): g*·Σ_{(i,t)∈S} s̃_i·Â_i/|y_i|, with the 1/G of eq. (70)
    return sum(wi * ai / ni for wi, ai, ni, on in zip(w, a, n, act, strict=True) if on) / g


def _check_estimator(estimator: str) -> str:
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; valid: {', '.join(ESTIMATORS)}")
    return estimator


def paper_estimator_coefficient(
    weights: Sequence[float],
    advantages: Sequence[float],
    epsilon_low: float | None,
    epsilon_high: float | None,
    length: int,
    group_size: int | None = None,
) -> float:
    """GSPO under the paper's estimator (eq. 86): eq. (72) with the post-clip weights s̄ and no term dropped.

    Every trajectory gets the constant coefficient s̄_i·Â_i on ∇log s_i (s̄ the sign-aware clip of
    eq. 47, clipped or not), i.e. s̄_i·Â_i/(G·T) on each of its tokens (``length`` = T; 1 for the
    product weight). There is no kink: s̄ is continuous in s.
    """
    lo, hi = _check_eps(epsilon_low, epsilon_high, "gspo")
    w = [float(x) for x in weights]
    a = [float(x) for x in advantages]
    # DFPO eq. (47): s̄ = min(s, 1 + ε_high) for Â ≥ 0, max(s, 1 − ε_low) for Â < 0
    s_bar = [min(wi, 1.0 + hi) if ai >= 0 else max(wi, 1.0 - lo) for wi, ai in zip(w, a, strict=True)]
    # DFPO eq. (86) summed over the event's tokens, eq. (72)
    return shared_event_coefficient(s_bar, a, [length] * len(w), None, group_size)


def dfpo_shared_prefix_coefficient(
    transform: str,
    rho1: float,
    rho2: float,
    lam1: float,
    lam2: float,
    advantage: float = 1.0,
    *,
    length_norm: bool = DfpoParams.length_norm,
    epsilon_low: float = DfpoParams.epsilon_low,  # type: ignore[assignment]
    epsilon_high: float = DfpoParams.epsilon_high,  # type: ignore[assignment]
    estimator: str = DfpoParams.estimator,
) -> float:
    """DFPO's net coefficient on each shared prefix step: eq. (72) with the transformed weights s̃.

    s_i from eq. (37) (``length_norm=False``) or eq. (44); s̄ = the sign-aware clip of eq. (47)
    (``cancellation.objectives.sign_aware_clip``); s̃ = the group transform (``cancellation.transforms``).

    - ``estimator="paper"`` (DFPO's default; eq. 59-62, 68, 91): token t of trajectory i gets
      s̃_i·Â_i·∂log s_i/∂logp_t/G = s̃_i·Â_i/(G·T) (1/G for the product weight), clipped or not, so by
      eq. (73) (every transform makes Σ_i Â_i s̃_i = 0) the net is 0 whatever the clip does.
    - ``estimator="ppo_clip"``: the gradient goes through s̄, so a trajectory whose clip binds drops
      out (eq. 47-49) and the net is 0 only while no clip binds.
    """
    _check_positive(rho1=rho1, rho2=rho2, lam1=lam1, lam2=lam2)
    a = _check_advantage(advantage)
    fn = get_transform(transform)
    t = SP_LENGTH if length_norm else 1
    # DFPO eq. (37) (product) / eq. (44) (length-normalised)
    s = torch.tensor([rho1 * rho2 * lam1, rho1 * rho2 * lam2], dtype=torch.float64) ** (1.0 / t)
    adv = torch.tensor([-a, a], dtype=torch.float64)  # DFPO eq. (32)
    # DFPO eq. (47): the sign-aware post-clip weight s̄
    s_bar = sign_aware_clip(s, adv, float(epsilon_low), float(epsilon_high))
    # DFPO eq. (50)/(18)/(51)/(52)-(55): the group transform
    s_tilde = fn(s_bar, adv, torch.zeros(2, dtype=torch.long))
    if _check_estimator(estimator) == "paper":
        active = [True, True]  # DFPO eq. (68): every trajectory keeps s̃_i·Â_i on ∇log s_i
    else:
        active = _active(s.tolist(), adv.tolist(), epsilon_low, epsilon_high)
    # DFPO eq. (72) (eq. 73 makes it 0 when both are active)
    return shared_event_coefficient(s_tilde.tolist(), adv.tolist(), [t, t], active, SP_GROUP_SIZE)


#: Defaults of each objective's parameters, for the closed forms: read from the objective's dataclass
#: (``cancellation.params``), the defaults its loss uses.
_DEFAULTS: dict[str, dict[str, Any]] = {
    name: default_params(name) for name in ("grpo", "grpo_symclip", "gspo", "dfpo")
}
#: Each one's own aggregation, read from its loss's signature (the registry), as ``toymodel.batched`` does.
_DEFAULT_AGGREGATION = {
    name: str(inspect.signature(OBJECTIVES[name]).parameters["aggregation"].default) for name in _DEFAULTS
}


def _params(objective: str, params: dict[str, Any]) -> dict[str, Any]:
    if objective not in _DEFAULTS:
        raise ValueError(f"no closed form for objective {objective!r}; valid: {', '.join(_DEFAULTS)}")
    p = dict(params)
    agg = p.pop("aggregation", None)
    if agg is not None and agg != _DEFAULT_AGGREGATION[objective]:
        raise ValueError(
            f"the closed forms assume {objective}'s own aggregation {_DEFAULT_AGGREGATION[objective]!r}, "
            f"got {agg!r}"
        )
    unknown = sorted(set(p) - set(_DEFAULTS[objective]))
    if unknown:
        raise ValueError(
            f"no closed form for {objective} with parameter(s) {', '.join(unknown)}; "
            f"supported: {', '.join(_DEFAULTS[objective])}"
        )
    out = {**_DEFAULTS[objective], **p}
    params_class(objective)(**out)  # type: ignore[misc]  # the ranges and choices: the objective's own check
    if objective == "dfpo" and not out["stop_grad"]:
        raise ValueError("the closed form of eq. (72) assumes DFPO's stop-gradient (stop_grad=True)")
    return out


def shared_prefix_closed_form(
    objective: str,
    rho1: float,
    rho2: float,
    lam1: float,
    lam2: float,
    advantage: float = 1.0,
    **params: Any,
) -> ClosedForm:
    """The paper's prediction for ``toymodel.scenarios.shared_prefix_net(objective, ...)[0]``.

    Same arguments (``params`` as passed to the objective, with its defaults; the objective's own
    aggregation). The net coefficient of step 1 (ratio ρ1); step 2 is the same with ρ2 for
    the token-level objectives and identical for the sequence-level ones.

    - ``grpo``: eq. (9) inside [1 − ε_low, 1 + ε_high] (0); outside, eq. (75)/(76) with w = ρ1
      (``clip_coefficient``, token-mean over the 2·3 tokens);
    - ``grpo_symclip``: eq. (82), 0;
    - ``gspo``: eq. (38)/G (``length_norm=False``) or (A/(G·T))·(s2 − s1) (eq. 44), with clipping
      (``estimator="ppo_clip"``, its default); ``estimator="paper"``: eq. (86), (1/(G·T))·Σ_i s̄_i·Â_i;
    - ``dfpo``: eq. (72)-(73) with the transform's s̃: 0 under the paper's estimator (its default),
      0 unless a clip binds under ``estimator="ppo_clip"``.
    """
    p = _params(objective, params)
    a = _check_advantage(advantage)
    _check_positive(rho1=rho1, rho2=rho2, lam1=lam1, lam2=lam2)
    n_tok = SP_GROUP_SIZE * SP_LENGTH
    if objective == "grpo":
        lo, hi = p["epsilon_low"], p["epsilon_high"]
        value = clip_coefficient(rho1, a, lo, hi, norm=n_tok)
        if value == 0.0:
            return ClosedForm(
                0.0,
                "eq. (9)",
                "GRPO's token ratio of a shared step is the same for both trajectories, inside the clip "
                "range both terms are live, so the coefficients are (ρ1/N)·(Â1 + Â2) = 0.",
            )
        return ClosedForm(
            value,
            "eq. (75)/(76), w = ρ1, /N",
            "ρ1 is outside the clip range: the sign-dependent min/clip freezes one trajectory's term and not "
            "the other's, so the shared step keeps w·C'(w)/N = ∓A·ρ1/6 (token-mean over N = 6 tokens).",
        )
    if objective == "grpo_symclip":
        value = symclip_coefficient(rho1, [-a, a], p["epsilon"], norm=n_tok)
        return ClosedForm(
            value,
            "eq. (82)",
            "symmetric clipping φ(r) = clip(r, 0, 1 + ε) does not depend on the sign of Â, so the shared step "
            "gets φ'(ρ1)·ρ1·(Â1 + Â2)/N = 0.",
        )
    lo, hi = p["epsilon_low"], p["epsilon_high"]
    length_norm = bool(p["length_norm"])
    estimator = str(p["estimator"])
    if objective == "gspo" and estimator == "paper":
        t = SP_LENGTH if length_norm else 1
        s = _sp_weights(rho1, rho2, lam1, lam2, length_norm)
        value = paper_estimator_coefficient(s, [-a, a], lo, hi, t, SP_GROUP_SIZE)
        return ClosedForm(
            value,
            "eq. (86) in eq. (72)",
            "the paper's estimator keeps every trajectory's s̄_i·Â_i on ∇log s_i, clipped or not, so the "
            "shared steps get Σ_i s̄_i·Â_i/(G·T): s̄ still carries each trajectory's own last-token λ.",
        )
    if objective == "gspo":
        if length_norm:
            value = eq38_gspo_coefficient(rho1, rho2, lam1, lam2, a, epsilon_low=lo, epsilon_high=hi)
            form = "eq. (38), length-normalised s = (Π r)^(1/T) (eq. 44)"
            what = "(A/(G·T))·(s2 − s1)"
        else:
            value = eq38_coefficient(rho1, rho2, lam1, lam2, a, epsilon_low=lo, epsilon_high=hi)
            form = "eq. (38), product s = Π r (eq. 11), /G"
            what = "A·ρ1·ρ2·(λ2 − λ1)/G"
        s = _sp_weights(rho1, rho2, lam1, lam2, length_norm)
        if all(_active(s, [-a, a], lo, hi)):
            why = (
                f"each sequence weight carries the λ of its own last token, so the shared steps keep {what}, "
                "which is 0 only when λ1 = λ2."
            )
        else:
            why = (
                f"a sequence weight is clipped (eq. 47-49: its term is a constant), so only the other "
                f"trajectory's Â_i·s_i/(G{'·T' if length_norm else ''}) is left (eq. 72)."
            )
        return ClosedForm(value, form, why)
    # dfpo
    value = dfpo_shared_prefix_coefficient(
        str(p["transform"]),
        rho1,
        rho2,
        lam1,
        lam2,
        a,
        length_norm=length_norm,
        epsilon_low=lo,
        epsilon_high=hi,
        estimator=estimator,
    )
    s = _sp_weights(rho1, rho2, lam1, lam2, length_norm)
    if estimator == "paper":
        return ClosedForm(
            value,
            "eq. (68), (72)-(73)",
            f"the paper's estimator gives every trajectory, clipped or not, s̃_i·Â_i on ∇log s_i; "
            f"{p['transform']} makes Σ_i Â_i s̃_i = 0 (eq. 73) and both have the same length, so the "
            "shared event's coefficient Σ s̃_i Â_i/(G·|y_i|) is 0.",
        )
    if all(_active(s, [-a, a], lo, hi)):
        return ClosedForm(
            value,
            "eq. (72)-(73)",
            f"{p['transform']} makes Σ_i Â_i s̃_i = 0 (eq. 73) and both trajectories have the same length, "
            "so the shared event's coefficient Σ s̃_i Â_i/(G·|y_i|) is 0.",
        )
    return ClosedForm(
        value,
        "eq. (72), clipped term dropped",
        "a sign-aware clip binds (eq. 47): that trajectory's s̄ is a constant with no gradient, so eq. (73)'s "
        "balance Σ Â_i s̃_i = 0 no longer reaches the shared tokens; only the other s̃_i·Â_i/(G·T) is left.",
    )


def _sp_weights(rho1: float, rho2: float, lam1: float, lam2: float, length_norm: bool) -> list[float]:
    t = SP_LENGTH if length_norm else 1
    # DFPO eq. (37) / eq. (44)
    return [(rho1 * rho2 * lam1) ** (1.0 / t), (rho1 * rho2 * lam2) ** (1.0 / t)]


# ----------------------------------------------------------------------------------------------
# App. F / App. H: clipping asymmetry on a shared token


def clip_surrogate(
    w: float,
    advantage: float = 1.0,
    epsilon_low: float = GrpoParams.epsilon_low,  # type: ignore[assignment]
    epsilon_high: float = GrpoParams.epsilon_high,  # type: ignore[assignment]
) -> float:
    """C(w): the group's clipped surrogate Â1·min(w, ·) + Â2·min(w, ·) on a shared token (eq. 75/76).

    Â = (−A, +A). For w > 1 + ε the positive trajectory is clipped to 1 + ε (eq. 75), for w < 1 − ε
    the negative one to 1 − ε (eq. 76); inside, both are w and the sum is 0.
    """
    _check_positive(w=w)
    a = _check_advantage(advantage)
    lo, hi = _check_eps(epsilon_low, epsilon_high)
    if w > 1.0 + hi:
        # DFPO eq. (75): Â1·w + Â2·w̄ = A((1 + ε) − w)
        return a * ((1.0 + hi) - w)
    if w < 1.0 - lo:
        # DFPO eq. (76): Â1·w̄ + Â2·w = A(w − (1 − ε))
        return a * (w - (1.0 - lo))
    return 0.0


def clip_coefficient(
    w: float,
    advantage: float = 1.0,
    epsilon_low: float = GrpoParams.epsilon_low,  # type: ignore[assignment]
    epsilon_high: float = GrpoParams.epsilon_high,  # type: ignore[assignment]
    norm: float = 1.0,
) -> float:
    """Net ∂J/∂logp of the shared token: C(w)'s gradient along ∇log π, w·C'(w)/norm (eq. 75/76).

    ∇θ w = w·∇θ log π, so ∂C/∂log π = w·C'(w). The clipped branch is a constant, so C'(w) = −A for
    w > 1 + ε (eq. 75: only the negative trajectory's −A·w moves), +A for w < 1 − ε (eq. 76), 0
    inside (eq. 9). ``norm`` is the aggregation's divisor (4 for the toy's token-mean over 4 tokens,
    6 on the shared-prefix toy, 1 for the bare sum).
    """
    _check_positive(w=w, norm=norm)
    a = _check_advantage(advantage)
    lo, hi = _check_eps(epsilon_low, epsilon_high)
    if w > 1.0 + hi:
        dc = -a  # d/dw of eq. (75)
    elif w < 1.0 - lo:
        dc = a  # d/dw of eq. (76)
    else:
        dc = 0.0
    # DFPO eq. (75)/(76) along ∇log π: ∂C/∂log π = w·C'(w)
    return w * dc / norm


def symclip_coefficient(
    w: float, advantages: Sequence[float], epsilon: float = GrpoSymclipParams.epsilon, norm: float = 1.0
) -> float:
    """App. H eq. (82): net ∂J/∂logp of a token shared by the group under GRPO-fix.

    Every trajectory's term is Â_i·φ(w), φ(r) = clip(r, 0, 1 + ε) (eq. 79), so the shared token gets
    ∂φ/∂log w·Σ_i Â_i/norm = w·1[w ≤ 1 + ε]·Σ_i Â_i/norm: 0 whenever the advantages sum to 0.
    """
    _check_positive(w=w, norm=norm)
    eps = check_field(params_class("grpo_symclip"), "epsilon", epsilon)  # type: ignore[arg-type]
    dphi = w if not w > 1.0 + eps else 0.0  # ∂φ(w)/∂log w, eq. (79)
    # DFPO eq. (82): φ'(r*)·(Σ_i Â_i)·∇log π
    return dphi * math.fsum(float(x) for x in advantages) / norm


def clip_asymmetry_closed_form(objective: str, w: float, advantage: float = 1.0, **params: Any) -> ClosedForm:
    """The paper's prediction for ``toymodel.scenarios.clip_asymmetry_net(objective, w, advantage, ...)``.

    The toy's batch has 2 trajectories of 2 tokens and the token-level objectives use token-mean,
    so the prediction is eq. (75)/(76)'s w·C'(w)/4 (``grpo``) or eq. (82)'s 0 (``grpo_symclip``).
    """
    if objective not in ("grpo", "grpo_symclip"):
        raise ValueError(f"no App. F closed form for objective {objective!r}; valid: grpo, grpo_symclip")
    p = _params(objective, params)
    a = _check_advantage(advantage)
    if objective == "grpo":
        value = clip_coefficient(w, a, p["epsilon_low"], p["epsilon_high"], norm=CA_TOKENS)
        eq = "eq. (9)" if value == 0.0 else ("eq. (75)" if w > 1.0 else "eq. (76)")
        return ClosedForm(
            value, eq, "w·C'(w)/4: the clipped branch is constant, only the unclipped term moves."
        )
    value = symclip_coefficient(w, [-a, a], p["epsilon"], norm=CA_TOKENS)
    return ClosedForm(value, "eq. (82)", "φ does not depend on the sign of Â, so the terms cancel.")


__all__ = [
    "CA_TOKENS",
    "SP_GROUP_SIZE",
    "SP_LENGTH",
    "ClosedForm",
    "carries_gradient",
    "clip_asymmetry_closed_form",
    "clip_coefficient",
    "clip_surrogate",
    "dfpo_shared_prefix_coefficient",
    "eq38_coefficient",
    "eq38_gspo_coefficient",
    "eq38_surrogate",
    "paper_estimator_coefficient",
    "shared_event_coefficient",
    "shared_prefix_closed_form",
    "symclip_coefficient",
]
