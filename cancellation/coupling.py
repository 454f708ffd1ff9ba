"""Token-level instruments of the cancellation-hypothesis paper, as pure functions on flat per-token tensors.

The paper: "The Cancellation Hypothesis in Critic-Free RL: From Outcome Rewards to Token Credits"
(arXiv 2605.08666); every equation number below is its. The text of the paper we work from lost its
typeset formulas, so each formula here was *rebuilt* from the prose around its number (each docstring
says so and gives the rebuilt form).

- ``coupling_kernel`` (eq. 5), ``output_overlap`` (eq. 8), ``proxy_kernel`` (eq. 6–7): the coupling kernel
  K_jk = ⟨g_j, g_k⟩ between two tokens' score directions and its output-layer proxy;
- ``first_order_delta`` (eq. 4–5, eq. 9 with the proxy): Δ log π of every token after one SGD step, split
  into its self-term and the coupling term;
- ``mask_sets``, ``first_order_masking_effect``, ``masking_effect``, ``boost_stats`` (Sec. 2's Masking
  Effect and Table 1), ``coupling_mass`` (how the coupling splits by Eq. 10's two conditions);
- ``update_norm_split`` (eq. 11–12) and ``surviving_signal`` (eq. 13): the group update's norm and filter;
- ``counterfactual_value`` (App. E.2, eq. 20): the Monte Carlo counterfactual token value; ``value_gap``
  (Fig. 5): the mean value of boosted minus suppressed tokens, optionally on the top-k by entropy;
- ``per_token_scores``, ``sgd_update``, ``sgd_step`` and ``repeated_sgd``: what a model supplies
  (per-token gradients, one SGD step, several in a row on one batch).

Flat tokens. The N tokens of a batch are its completion tokens flattened row-major over the completion
mask (``x[mask.bool()]`` for a (B, T) tensor ``x``). Names used throughout:

- ``scores`` (N, P): row j is g_j = ∇_θ log π_θ(y_j), the score of token j w.r.t. the P parameters;
- ``coef`` (N,): c_j = ∂J/∂log π(y_j), the coefficient the update gives token j
  (``cancellation.update.coefficients(...).coef[mask.bool()]``);
- ``tokens`` (N,): the sampled token ids y_j; ``probs`` (N, V): the next-token distributions π_j;
  ``probs_taken`` (N,): π_j(y_j); ``hidden`` (N, d): h_j, the input of the unembedding (after the final
  norm).

The update these instruments describe is one SGD *ascent* step on J(θ) = Σ_k c_k log π_θ(y_k) with the
coefficients held constant (rebuilt eq. 2–3): θ' = θ + lr·Σ_k c_k g_k. Everything here is pure torch, keeps
the dtype of its inputs (use float64 for checks), and holds no state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from ._checks import check_finite

# ------------------------------------------------------------------------------------------------
# argument checks (shapes spelled out in this module's names: N tokens, P parameters, V vocabulary)


def _check_tensor(name: str, x: object) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}")


def _check_shape(name: str, x: Tensor, spec: str, ndim: int, shape: Sequence[int | None] = ()) -> None:
    """Raise unless ``x`` has ``ndim`` dims and, where ``shape`` gives a size (not None), that size."""
    _check_tensor(name, x)
    if x.dim() != ndim:
        raise ValueError(f"`{name}` must have shape {spec}, got {tuple(x.shape)}")
    for axis, size in enumerate(shape):
        if size is not None and x.shape[axis] != size:
            raise ValueError(f"`{name}` must have shape {spec}, got {tuple(x.shape)} (axis {axis} ≠ {size})")


def _check_float(name: str, x: Tensor) -> None:
    if not x.is_floating_point():
        raise TypeError(f"`{name}` must be a floating-point tensor, got dtype {x.dtype}")
    check_finite(name, x)


def _check_tokens(name: str, tokens: Tensor, n: int | None = None, vocab: int | None = None) -> None:
    _check_shape(name, tokens, "(N,)", 1, (n,))
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise TypeError(f"`{name}` must hold integer token ids, got dtype {tokens.dtype}")
    if vocab is not None and tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise ValueError(f"`{name}` holds ids outside [0, V) with V={vocab}")


def _check_probs_taken(name: str, p: Tensor, n: int) -> None:
    _check_shape(name, p, "(N,)", 1, (n,))
    _check_float(name, p)
    if p.numel() and (float(p.min()) < 0.0 or float(p.max()) > 1.0):
        raise ValueError(f"`{name}` must hold probabilities in [0, 1]")


def _check_lr(lr: float) -> float:
    if isinstance(lr, bool) or not isinstance(lr, (int, float)):
        raise TypeError(f"`lr` must be a number, got {type(lr).__name__}")
    lr = float(lr)
    if not (math.isfinite(lr) and lr >= 0.0):
        raise ValueError(f"`lr` must be a finite step size ≥ 0 (an ascent step), got {lr}")
    return lr


def _check_low_conf(low_conf: float) -> float:
    if isinstance(low_conf, bool) or not isinstance(low_conf, (int, float)):
        raise TypeError(f"`low_conf` must be a number, got {type(low_conf).__name__}")
    low_conf = float(low_conf)
    if not 0.0 <= low_conf <= 1.0:
        raise ValueError(f"`low_conf` must be a probability threshold in [0, 1], got {low_conf}")
    return low_conf


def _check_kernel_coef(kernel: Tensor, coef: Tensor) -> int:
    _check_shape("coef", coef, "(N,)", 1)
    n = coef.shape[0]
    _check_shape("kernel", kernel, "(N, N)", 2, (n, n))
    _check_float("kernel", kernel)
    _check_float("coef", coef)
    return n


# ------------------------------------------------------------------------------------------------
# the coupling kernel and its output-layer proxy


def coupling_kernel(scores: Tensor) -> Tensor:
    """Eq. (5)'s coupling kernel K_jk = ⟨g_j, g_k⟩ between the score directions of two tokens.

    Rebuilt eq. (5): g_j = ∇_θ log π_θ(y_j) over *all* parameters θ, and K_jk = ⟨g_j, g_k⟩, so that one SGD
    step moves log π(y_j) by lr·Σ_k c_k K_jk to first order (``first_order_delta``).

    Args:
        scores: (N, P) per-token scores, row j = g_j (e.g. from ``per_token_scores``).
    Returns:
        (N, N) the symmetric Gram matrix ``scores @ scores.T``.
    """
    _check_shape("scores", scores, "(N, P)", 2)
    _check_float("scores", scores)
    # eq. (5): K_jk = ⟨g_j, g_k⟩
    return scores @ scores.T


def output_overlap(probs: Tensor, tokens: Tensor) -> Tensor:
    """Eq. (8)'s distributional factor D_jk = ⟨e_{y_j} − π_j, e_{y_k} − π_k⟩ of the proxy kernel.

    Rebuilt eq. (8): expanding the inner product,
    D_jk = 1[y_j = y_k] − π_j(y_k) − π_k(y_j) + ⟨π_j, π_k⟩.
    e_y − π is ∂log softmax(z)_y/∂z (eq. 6), so D_jk is the inner product of two tokens' logit gradients.
    Eq. (10): for y_j ≠ y_k only the small cross terms remain; for y_j = y_k the leading part
    1 − π_j(y) − π_k(y) is large when both tokens have low confidence.

    Args:
        probs: (N, V) the next-token distribution π_j at each token's position.
        tokens: (N,) integer ids y_j of the sampled tokens.
    Returns:
        (N, N) D, symmetric.
    """
    _check_shape("probs", probs, "(N, V)", 2)
    _check_float("probs", probs)
    n, v = probs.shape
    _check_tokens("tokens", tokens, n, v)
    y = tokens.long()
    cross = probs[:, y]  # cross[j, k] = π_j(y_k)
    same = (y[:, None] == y[None, :]).to(probs.dtype)
    # eq. (8): D_jk = 1[y_j = y_k] − π_j(y_k) − π_k(y_j) + ⟨π_j, π_k⟩
    return same - cross - cross.T + probs @ probs.T


def proxy_kernel(hidden: Tensor, probs: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """Eq. (6–7)'s output-layer proxy of the coupling kernel: ⟨h_j, h_k⟩·D_jk / τ².

    Rebuilt eq. (6): with logits z = W h (W the (V, d) unembedding, h the final hidden state, i.e. the
    input of the unembedding after the final norm), ∇_W log π(y) = (e_y − π) hᵀ. Rebuilt eq. (7): by
    ⟨a bᵀ, c dᵀ⟩_F = ⟨a, c⟩⟨b, d⟩, the kernel restricted to W is K^W_jk = ⟨h_j, h_k⟩·D_jk (D: eq. 8,
    ``output_overlap``). This is the exact kernel of the gradient w.r.t. an untied W; a model whose
    unembedding is tied to its input embedding (the tiny Qwen3) also moves W through the embedding
    lookups, which the proxy leaves out. An output bias b would add D_jk (h with a constant 1 appended).

    Temperature: this function does the 1/τ² itself. At sampling temperature τ, log π(y) =
    log softmax(W h / τ)_y, so ∇_W log π(y) = (e_y − π_τ) hᵀ / τ and the kernel carries 1/τ². Pass the
    distributions *at τ* (π_τ = softmax(z / τ)) and ``temperature=τ``; the result is then multiplied by
    1/τ² (nothing to do at τ = 1).

    Args:
        hidden: (N, d) hidden states h_j (input of the unembedding).
        probs: (N, V) distributions π_j at temperature τ.
        tokens: (N,) integer ids y_j.
        temperature: τ > 0, the temperature ``probs`` were computed at.
    Returns:
        (N, N) the proxy kernel.
    """
    _check_shape("hidden", hidden, "(N, d)", 2)
    _check_float("hidden", hidden)
    _check_shape("probs", probs, "(N, V)", 2, (hidden.shape[0], None))
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"`temperature` must be a number, got {type(temperature).__name__}")
    tau = float(temperature)
    if not (math.isfinite(tau) and tau > 0.0):
        raise ValueError(f"`temperature` must be finite and > 0, got {temperature}")
    d = output_overlap(probs, tokens)
    # eq. (7): K_jk ≈ ⟨h_j, h_k⟩·D_jk; the 1/τ² of ∇ log softmax(z/τ)
    return (hidden @ hidden.T) * d / (tau * tau)


# ------------------------------------------------------------------------------------------------
# the first-order change of log π under one SGD step


class FirstOrderDelta(NamedTuple):
    """Eq. (5)'s split of each token's first-order Δ log π, each (N,).

    Attributes:
        self: lr·c_j·K_jj, the token's own term.
        coupling: lr·Σ_{k≠j} c_k·K_jk, what the other tokens of the batch do to it.
        total: self + coupling.
    """

    self: Tensor
    coupling: Tensor
    total: Tensor


def first_order_delta(kernel: Tensor, coef: Tensor, lr: float) -> FirstOrderDelta:
    """Eq. (4–5): the first-order Δ log π(y_j) of every token after one SGD ascent step.

    Rebuilt eq. (3): θ' = θ + lr·Σ_k c_k g_k (the SGD step on J = Σ_k c_k log π(y_k), c held constant).
    Rebuilt eq. (4): Δ_j = log π_θ'(y_j) − log π_θ(y_j) ≈ ⟨g_j, θ' − θ⟩. Rebuilt eq. (5):
    Δ_j ≈ lr·c_j·K_jj + lr·Σ_{k≠j} c_k K_jk. With the output-layer proxy as ``kernel`` this is eq. (9)'s
    proxy delta. The error is O(lr²) (second order in the step).

    Args:
        kernel: (N, N) coupling kernel (``coupling_kernel``, or ``proxy_kernel`` for eq. 9).
        coef: (N,) c = ∂J/∂log π per token (``cancellation.update.coefficients``, flattened over the mask).
        lr: the SGD step size ≥ 0.
    Returns:
        a ``FirstOrderDelta`` (self, coupling, total), each (N,).
    """
    n = _check_kernel_coef(kernel, coef)
    lr = _check_lr(lr)
    diag = torch.diagonal(kernel)
    off = kernel.masked_fill(torch.eye(n, dtype=torch.bool, device=kernel.device), 0.0)
    # eq. (5): self-term lr·c_j·K_jj and coupling term lr·Σ_{k≠j} c_k K_jk
    self_term = lr * coef * diag
    coupling = lr * (off @ coef)
    return FirstOrderDelta(self=self_term, coupling=coupling, total=self_term + coupling)


# ------------------------------------------------------------------------------------------------
# the masking effect (Sec. 2, Table 1)


def mask_sets(
    tokens: Tensor,
    probs_taken: Tensor,
    candidate: int,
    *,
    low_conf: float = 0.5,
    advantages: Tensor | None = None,
    same_sign: bool = False,
    size: int | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """Table 1's four masked token sets M_j of one candidate token j.

    Masking M_j removes its tokens from the loss (``masking_effect``). The sets, over the *eligible*
    tokens (every token except the candidate itself; with ``same_sign`` only those whose advantage has the
    candidate's sign):

    - ``"same_token"``: eligible k with y_k = y_j;
    - ``"low_confidence"``: eligible k with π_k(y_k) < ``low_conf`` (strict: a token at the threshold is not
      low-confidence);
    - ``"both"``: same token AND low confidence (Eq. 10's sparse coupling pattern);
    - ``"random"``: ``size`` eligible tokens drawn uniformly without replacement (Table 1's baseline).

    The candidate is never in its own mask. The paper's text leaves these choices open; the defaults:

    - ``low_conf=0.5``: no threshold survives in the text. Below 0.5 a same-token pair's leading overlap
      1 − π_j(y) − π_k(y) of eq. (8) is positive for sure; at or above it may not be.
    - ``same_sign=False``: masks take tokens of either advantage sign, since Table 1 lists only the Same and
      LowConf conditions. With ``same_sign=True`` (``advantages`` required) only tokens with
      sign(A_k) = sign(A_j) are eligible (a zero advantage matches only zero advantages), for all four sets.
    - ``size=None``: the random mask is as large as ``"both"``, so the random baseline removes as many
      tokens as the structured mask it is compared with. A ``size`` larger than the eligible pool raises.
    - ``generator=None``: torch's global RNG; pass a seeded ``torch.Generator`` for a reproducible draw.
    The candidate's own confidence is not checked: choosing the candidates (e.g. low-confidence ones, as
    eq. 10 needs both tokens low-confidence) is the caller's job.

    Args:
        tokens: (N,) integer token ids y.
        probs_taken: (N,) π(y_k) of each sampled token, in [0, 1].
        candidate: index j in [0, N).
        low_conf: the low-confidence threshold in [0, 1].
        advantages: (N,) per-token advantage (its sign is used), needed when ``same_sign``.
        same_sign: restrict every set to tokens of the candidate's advantage sign.
        size: the random mask's size (default: the size of ``"both"``).
        generator: the random mask's generator.
    Returns:
        {"random", "same_token", "low_confidence", "both"}: each an (N,) bool mask.
    """
    _check_tokens("tokens", tokens)
    n = tokens.shape[0]
    _check_probs_taken("probs_taken", probs_taken, n)
    if isinstance(candidate, bool) or not isinstance(candidate, int):
        raise TypeError(f"`candidate` must be an int index, got {type(candidate).__name__}")
    if not 0 <= candidate < n:
        raise ValueError(f"`candidate` must be in [0, N) with N={n}, got {candidate}")
    low_conf = _check_low_conf(low_conf)
    eligible = torch.ones(n, dtype=torch.bool, device=tokens.device)
    eligible[candidate] = False
    if same_sign:
        if advantages is None:
            raise ValueError("`same_sign=True` needs `advantages` (N,): the sign of each token's advantage")
        _check_shape("advantages", advantages, "(N,)", 1, (n,))
        _check_float("advantages", advantages)
        eligible &= torch.sign(advantages) == torch.sign(advantages[candidate])
    elif advantages is not None:
        _check_shape("advantages", advantages, "(N,)", 1, (n,))
    same = eligible & (tokens == tokens[candidate])
    low = eligible & (probs_taken < low_conf)
    both = same & low
    pool = torch.nonzero(eligible).flatten()
    if size is None:
        k = int(both.sum())
    elif isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"`size` must be an int or None, got {type(size).__name__}")
    else:
        k = size
    if not 0 <= k <= pool.numel():
        raise ValueError(f"`size` must be in [0, {pool.numel()}] (the eligible tokens), got {k}")
    perm_device = generator.device if generator is not None else torch.device("cpu")
    perm = torch.randperm(pool.numel(), generator=generator, device=perm_device)[:k].to(pool.device)
    rand = torch.zeros(n, dtype=torch.bool, device=tokens.device)
    rand[pool[perm]] = True
    return {"random": rand, "same_token": same, "low_confidence": low, "both": both}


def _check_masks(masks: Tensor, n: int, candidates: Tensor | None) -> Tensor:
    """Validate (M, N) masks and return the (M,) long candidate index of each row."""
    if candidates is None:
        _check_shape("masks", masks, "(N, N)", 2, (n, n))
        cand = torch.arange(n, device=masks.device)
    else:
        _check_shape("candidates", candidates, "(M,)", 1)
        if candidates.is_floating_point() or candidates.is_complex() or candidates.dtype == torch.bool:
            raise TypeError(f"`candidates` must hold integer token indices, got dtype {candidates.dtype}")
        if candidates.numel() and (int(candidates.min()) < 0 or int(candidates.max()) >= n):
            raise ValueError(f"`candidates` holds indices outside [0, N) with N={n}")
        _check_shape("masks", masks, "(M, N)", 2, (candidates.shape[0], n))
        cand = candidates.long().to(masks.device)
    if masks.dtype != torch.bool:
        raise TypeError(f"`masks` must be a bool tensor, got dtype {masks.dtype}")
    if cand.numel() and bool(masks[torch.arange(cand.numel(), device=masks.device), cand].any()):
        raise ValueError("`masks` puts a candidate in its own mask: row r must not hold token candidates[r]")
    return cand


def first_order_masking_effect(
    kernel: Tensor, coef: Tensor, masks: Tensor, lr: float, *, candidates: Tensor | None = None
) -> Tensor:
    """The Masking Effect (Sec. 2, Table 1) to first order: ME_j ≈ lr·Σ_{k∈M_j} c_k K_jk.

    ME_j = log π_θ'(y_j) − log π_θ'_{−M_j}(y_j), where θ'_{−M_j} is the same SGD step with the coefficients
    of M_j set to 0 (``masking_effect``). By eq. (5) the two steps differ to first order by the coupling
    the masked tokens exert on j, so ME_j ≈ lr·Σ_{k∈M_j} c_k K_jk; ME_j > 0: the masked tokens boost y_j.

    Args:
        kernel: (N, N) coupling kernel (full, or the proxy: Table 1's "LM-head" column).
        coef: (N,) per-token coefficients c.
        masks: (N, N) bool, row j = M_j (e.g. stacked ``mask_sets(..., candidate=j)[key]``); or (M, N) with
            ``candidates``. A row must not contain its own candidate.
        lr: the SGD step size ≥ 0.
        candidates: None (every token is a candidate, row j ↔ token j) or (M,) the candidate of each row.
    Returns:
        (N,) or (M,) the first-order masking effects.
    """
    n = _check_kernel_coef(kernel, coef)
    lr = _check_lr(lr)
    cand = _check_masks(masks, n, candidates)
    rows = kernel[cand]  # (M, N): K_{j_r, k}
    # Sec. 2's Masking Effect through eq. (5): lr·Σ_{k∈M_j} c_k K_jk
    return lr * (rows * coef[None, :] * masks.to(kernel.dtype)).sum(dim=1)


def masking_effect(
    step: Callable[[Tensor], Tensor], coef: Tensor, masks: Tensor, *, candidates: Tensor | None = None
) -> Tensor:
    """The exact Masking Effect (Sec. 2, Table 1): ME_j = log π_θ'(y_j) − log π_θ'_{−M_j}(y_j).

    θ' is one SGD ascent step on J = Σ_k c_k log π(y_k); θ'_{−M_j} is the same step with the tokens of M_j
    removed from the sum *keeping the normaliser*: their coefficients set to 0, every other coefficient
    unchanged (an aggregation's 1/N stays what it was). ME_j > 0 means the masked tokens would have raised
    log π(y_j) in the unmasked update.

    ``step(coef_vector)`` must start from the same parameters every call (a copy), take one SGD step with
    those coefficients and return the (N,) new log-probs of the taken tokens; ``sgd_step`` builds one for
    any differentiable model. Cost: 1 + M steps (one per candidate).

    Args:
        step: ``(N,) coefficients -> (N,) log π_θ'(y)`` after one step.
        coef: (N,) per-token coefficients c.
        masks: (N, N) bool, row j = M_j; or (M, N) with ``candidates``. A row must not contain its candidate.
        candidates: None (row j ↔ token j) or (M,) the candidate of each row.
    Returns:
        (N,) or (M,) the masking effects.
    """
    _check_shape("coef", coef, "(N,)", 1)
    _check_float("coef", coef)
    n = coef.shape[0]
    cand = _check_masks(masks, n, candidates)

    def run(c: Tensor) -> Tensor:
        out = step(c)
        _check_shape("step(coef)", out, "(N,)", 1, (n,))
        _check_float("step(coef)", out)
        return out

    full = run(coef)
    out = torch.empty(cand.shape[0], dtype=full.dtype, device=full.device)
    for r in range(cand.shape[0]):
        j = int(cand[r])
        masked = run(coef.masked_fill(masks[r].to(coef.device), 0.0))
        # Sec. 2: ME_j = log π_θ'(y_j) − log π_θ'_{−M}(y_j)
        out[r] = full[j] - masked[j]
    return out


class BoostStats(NamedTuple):
    """Table 1's two statistics of a set of masking effects.

    Attributes:
        boost_rate: the fraction of candidates with ME_j > 0 (strictly), in [0, 1].
        mean_boost: the mean of ME_j.
    """

    boost_rate: float
    mean_boost: float


def boost_stats(masking_effect: Tensor) -> BoostStats:
    """Table 1's Boost Rate (fraction of ME_j > 0) and Mean Boost (mean ME_j).

    Zeros: a candidate with ME_j = 0 exactly (e.g. an empty mask, where the two steps are the same step)
    counts in the denominator and as *not* boosted. So a set of masks many of which are empty pulls the
    Boost Rate below the 50% of a random sign; filter such candidates out first if that is not wanted.
    Table 1 reports the rate in percent; this returns a fraction.

    Args:
        masking_effect: (M,) masking effects, M ≥ 1, finite.
    Returns:
        a ``BoostStats`` (boost_rate, mean_boost) of Python floats.
    """
    _check_shape("masking_effect", masking_effect, "(M,)", 1)
    _check_float("masking_effect", masking_effect)
    if masking_effect.numel() == 0:
        raise ValueError("`masking_effect` is empty: no candidate to summarise")
    me = masking_effect.detach()
    # Table 1: Boost Rate = fraction of ME_j > 0; Mean Boost = mean ME_j
    return BoostStats(boost_rate=float((me > 0).to(torch.float64).mean()), mean_boost=float(me.mean()))


def coupling_mass(
    kernel: Tensor, coef: Tensor, tokens: Tensor, probs_taken: Tensor, low_conf: float = 0.5
) -> dict[str, float]:
    """How the coupling of eq. (5) splits between Eq. (10)'s cases: same/different token, low confidence.

    The mass of an ordered pair (j, k), j ≠ k, is m_jk = |c_k K_jk|: the size of token k's contribution to
    token j's first-order Δ log π (eq. 5, over lr). Returned, with S the sum over the pairs named:

    - ``"mass"``: Σ_{j≠k} m_jk (the total, over all ordered pairs);
    - ``"same_token"``: S(y_j = y_k) / mass; ``"different_token"``: S(y_j ≠ y_k) / mass;
    - ``"both_low_confidence"``: S(π_j(y_j) < low_conf and π_k(y_k) < low_conf) / mass;
      ``"not_both_low_confidence"``: the rest / mass;
    - ``"same_token_low_confidence"``: S(same token and both low confidence) / mass.

    Each complementary pair sums to 1. The fractions are NaN when the mass is 0.

    Args:
        kernel: (N, N) coupling kernel (full or proxy).
        coef: (N,) per-token coefficients c.
        tokens: (N,) integer token ids.
        probs_taken: (N,) π(y) of each sampled token.
        low_conf: the low-confidence threshold (strict <), as in ``mask_sets``.
    Returns:
        a dict of floats with the six keys above.
    """
    n = _check_kernel_coef(kernel, coef)
    _check_tokens("tokens", tokens, n)
    _check_probs_taken("probs_taken", probs_taken, n)
    low_conf = _check_low_conf(low_conf)
    # eq. (5): token k contributes lr·c_k K_jk to token j
    m = (kernel * coef[None, :]).abs()
    m = m.masked_fill(torch.eye(n, dtype=torch.bool, device=m.device), 0.0)
    same = tokens[:, None] == tokens[None, :]
    low = probs_taken < low_conf
    both_low = low[:, None] & low[None, :]
    total = float(m.sum())

    def frac(sel: Tensor) -> float:
        return float(m[sel].sum()) / total if total > 0 else math.nan

    return {
        "mass": total,
        "same_token": frac(same),
        "different_token": frac(~same),
        "both_low_confidence": frac(both_low),
        "not_both_low_confidence": frac(~both_low),
        "same_token_low_confidence": frac(same & both_low),
    }


# ------------------------------------------------------------------------------------------------
# cancellation in the group update (Sec. 3.1)


class NormSplit(NamedTuple):
    """Eq. (11)'s split of ‖Σ_i A_i g_i‖², each a 0-d tensor.

    Attributes:
        self: Σ_i A_i² ‖g_i‖².
        cross: Σ_{i≠k} A_i A_k ⟨g_i, g_k⟩.
    """

    self: Tensor
    cross: Tensor


def update_norm_split(response_scores: Tensor, advantages: Tensor) -> NormSplit:
    """Eq. (11): ‖Σ_i A_i g_i‖² = Σ_i A_i²‖g_i‖² (self) + Σ_{i≠k} A_i A_k ⟨g_i, g_k⟩ (cross).

    Rebuilt eq. (11), for one query's G responses with response-level score directions
    g_i = ∇_θ log π(y_i) = Σ_t ∇_θ log π(y_{i,t}) and the group-relative update Σ_i A_i g_i. Rebuilt eq. (12):
    when ⟨g_i, g_k⟩ = κ for every i ≠ k and Σ_i A_i = 0, cross = κ·((Σ_i A_i)² − Σ_i A_i²) = −κ Σ_i A_i²,
    so a positive overlap *shrinks* the update (cancellation as variance reducer).

    Args:
        response_scores: (G, P) row i = g_i.
        advantages: (G,) the responses' advantages A_i.
    Returns:
        a ``NormSplit`` (self, cross); their sum is ‖Σ_i A_i g_i‖².
    """
    _check_shape("response_scores", response_scores, "(G, P)", 2)
    _check_float("response_scores", response_scores)
    g = response_scores.shape[0]
    _check_shape("advantages", advantages, "(G,)", 1, (g,))
    _check_float("advantages", advantages)
    gram = response_scores @ response_scores.T
    a = advantages.to(gram.dtype)
    outer = a[:, None] * a[None, :] * gram
    eye = torch.eye(g, dtype=torch.bool, device=gram.device)
    # eq. (11): self Σ_i A_i²‖g_i‖², cross Σ_{i≠k} A_i A_k ⟨g_i, g_k⟩
    return NormSplit(self=torch.diagonal(outer).sum(), cross=outer.masked_fill(eye, 0.0).sum())


def surviving_signal(advantages: Tensor, projections: Tensor) -> Tensor:
    """Eq. (13): the surviving signal Σ_i A_i a_i along a direction u, a_i = ⟨g_i, u⟩ (rollout i's loading).

    Rebuilt eq. (13): Σ_i A_i a_i = G·Cov(A, a), with the population covariance
    Cov(A, a) = (1/G) Σ_i (A_i − Ā)(a_i − ā). That equality needs Σ_i A_i = 0 (true of group-normalised
    advantages of a whole group, not of a split group: eq. 14); in general
    Σ_i A_i a_i = G·Cov(A, a) + G·Ā·ā. Directions loaded equally by every rollout (a_i constant) then give
    0: they cancel; directions enriched in high-advantage rollouts survive.

    Args:
        advantages: (G,) A_i.
        projections: (G,) a_i.
    Returns:
        0-d tensor Σ_i A_i a_i.
    """
    _check_shape("advantages", advantages, "(G,)", 1)
    _check_float("advantages", advantages)
    _check_shape("projections", projections, "(G,)", 1, (advantages.shape[0],))
    _check_float("projections", projections)
    # eq. (13): Σ_i A_i a_i (= G·Cov(A, a) when Σ_i A_i = 0)
    return (advantages * projections).sum()


# ------------------------------------------------------------------------------------------------
# the counterfactual token value (App. E.2)


def _as_float_tensor(name: str, x: Tensor | float) -> Tensor:
    if isinstance(x, Tensor):
        t = x if x.is_floating_point() else x.to(torch.float64)
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        t = torch.tensor(float(x), dtype=torch.float64)
    else:
        raise TypeError(f"`{name}` must be a torch.Tensor or a number, got {type(x).__name__}")
    check_finite(name, t)
    return t


def counterfactual_value(
    mean_forced: Tensor | float,
    mean_state: Tensor | float,
    pi_a: Tensor | float,
    *,
    min_alt_prob: float = 1e-6,
) -> Tensor:
    """Eq. (20): the counterfactual token value (R̄(s, a) − R̄(s)) / (1 − π(a|s)), element-wise.

    Rebuilt App. E.2. The quantity wanted is Q(s, a) − E[R | s, not a]: how much better taking token a is
    than sampling an alternative from the policy. Since rollouts from s take a with probability π(a|s),
    V(s) = E[R | s] = π(a) Q(s, a) + (1 − π(a)) E[R | s, not a], hence
    Q(s, a) − E[R | s, not a] = (Q(s, a) − V(s)) / (1 − π(a)). The naive difference Q(s, a) − V(s) is
    attenuated by this self-inclusion (by the factor 1 − π(a)); dividing by 1 − π(a) removes it. Eq. (20)
    plugs in the Monte Carlo means R̄(s, a) (continuations forced through a) and R̄(s) (continuations
    sampled from s).

    Guard π → 1: where 1 − π(a|s) ≤ ``min_alt_prob`` the result is NaN (no alternative is ever sampled,
    so E[R | s, not a] is undefined, and the Monte Carlo error is multiplied by 1/(1 − π)). The default
    1e-6 also keeps out π read from a float32 exp(log π): near 1 float32 steps by 6e-8, so such a 1 − π
    below 1e-6 is off by more than 6%. Pass 0.0 to get NaN only where π(a|s) = 1 exactly.

    Args:
        mean_forced: R̄(s, a), a tensor or a number.
        mean_state: R̄(s), broadcastable with it.
        pi_a: π(a|s) in [0, 1], broadcastable with them.
        min_alt_prob: the guard threshold in [0, 1).
    Returns:
        the broadcast tensor of values (NaN where guarded).
    """
    mf = _as_float_tensor("mean_forced", mean_forced)
    ms = _as_float_tensor("mean_state", mean_state)
    pi = _as_float_tensor("pi_a", pi_a)
    if pi.numel() and (float(pi.min()) < 0.0 or float(pi.max()) > 1.0):
        raise ValueError("`pi_a` must hold probabilities in [0, 1]")
    if isinstance(min_alt_prob, bool) or not isinstance(min_alt_prob, (int, float)):
        raise TypeError(f"`min_alt_prob` must be a number, got {type(min_alt_prob).__name__}")
    if not 0.0 <= float(min_alt_prob) < 1.0:
        raise ValueError(f"`min_alt_prob` must be in [0, 1), got {min_alt_prob}")
    try:
        mf, ms, pi = torch.broadcast_tensors(mf, ms, pi)
    except RuntimeError as exc:
        raise ValueError(
            f"`mean_forced` {tuple(mf.shape)}, `mean_state` {tuple(ms.shape)} and `pi_a` {tuple(pi.shape)} "
            f"do not broadcast ({exc})"
        ) from None
    dtype = torch.promote_types(torch.promote_types(mf.dtype, ms.dtype), pi.dtype)
    mf, ms, pi = mf.to(dtype), ms.to(dtype), pi.to(dtype)
    alt = 1.0 - pi
    ok = alt > float(min_alt_prob)
    # App. E.2 eq. (20): (R̄(s, a) − R̄(s)) / (1 − π(a|s))
    value = (mf - ms) / torch.where(ok, alt, torch.ones_like(alt))
    return torch.where(ok, value, torch.full_like(value, math.nan))


class ValueGap(NamedTuple):
    """``value_gap``'s result: the mean value of boosted and of suppressed tokens, and their difference.

    ``gap`` = ``boosted`` − ``suppressed`` (NaN when either set is empty); ``n_boosted`` and
    ``n_suppressed`` count the tokens each mean is taken over (after the entropy top-k restriction).
    """

    gap: float
    boosted: float
    suppressed: float
    n_boosted: int
    n_suppressed: int


def value_gap(
    values: Tensor, delta: Tensor, entropy: Tensor | None = None, top_frac: float = 1.0
) -> ValueGap:
    """Fig. 5's statistic: mean counterfactual value of boosted minus that of suppressed tokens.

    Sec. 3 of the paper: a token is *boosted* when the update raised its log-probability (Δ log π > 0) and
    *suppressed* when it lowered it (Δ log π < 0); tokens with Δ log π = 0 exactly, or whose value is NaN
    (``counterfactual_value``'s guard), are in neither set. Fig. 5(b) restricts to the ``top_frac``
    highest-entropy tokens first: the ⌈top_frac·N⌉ tokens with the largest ``entropy`` (ties broken by
    position, so the subset is deterministic), then splits them by the sign of ``delta``.

    Args:
        values: (N,) counterfactual token values (eq. 20), NaN allowed.
        delta: (N,) Δ log π of the same tokens after the update.
        entropy: (N,) the entropy of each token's next-token distribution; needed when ``top_frac`` < 1.
        top_frac: the fraction of highest-entropy tokens kept, in (0, 1].
    Returns:
        ``ValueGap(gap, boosted, suppressed, n_boosted, n_suppressed)``.
    """
    _check_tensor("values", values)
    _check_shape("values", values, "(N,)", 1)
    if not values.is_floating_point():
        raise TypeError(f"`values` must be a floating-point tensor, got dtype {values.dtype}")
    if bool(torch.isinf(values).any()):
        raise ValueError("`values` contains inf; NaN (no value) is allowed, inf is not")
    n = values.shape[0]
    _check_tensor("delta", delta)
    _check_shape("delta", delta, "(N,)", 1, (n,))
    _check_float("delta", delta)
    if isinstance(top_frac, bool) or not isinstance(top_frac, (int, float)):
        raise TypeError(f"`top_frac` must be a number, got {type(top_frac).__name__}")
    if not 0.0 < float(top_frac) <= 1.0:
        raise ValueError(f"`top_frac` must be in (0, 1], got {top_frac}")
    keep = torch.ones(n, dtype=torch.bool, device=values.device)
    if float(top_frac) < 1.0:
        if entropy is None:
            raise ValueError("`entropy` is needed when `top_frac` < 1 (the top-k is by entropy)")
        _check_tensor("entropy", entropy)
        _check_shape("entropy", entropy, "(N,)", 1, (n,))
        _check_float("entropy", entropy)
        k = math.ceil(float(top_frac) * n)
        # stable sort: equal entropies keep their positions, so the subset does not depend on the backend
        order = torch.sort(-entropy.detach().to(torch.float64), stable=True).indices[:k]
        keep = torch.zeros(n, dtype=torch.bool, device=values.device)
        keep[order] = True
    ok = keep & ~torch.isnan(values)
    boosted, suppressed = ok & (delta > 0), ok & (delta < 0)
    nb, ns = int(boosted.sum()), int(suppressed.sum())
    mb = float(values[boosted].double().mean()) if nb else math.nan
    ms = float(values[suppressed].double().mean()) if ns else math.nan
    return ValueGap(mb - ms, mb, ms, nb, ns)


# ------------------------------------------------------------------------------------------------
# what a model supplies


def per_token_scores(logp_fn: Callable[[], Tensor], params: Sequence[Tensor]) -> Tensor:
    """The per-token score matrix: row j = ∇_params log π(y_j), flattened and concatenated over ``params``.

    One ``torch.autograd.grad`` per token (retaining the graph between them). Memory: the result holds
    N × P floats (P = Σ numel of ``params``), plus the forward graph for the whole loop; for an LM, pass
    only the parameters of interest (e.g. the LoRA adapters) and few tokens. A parameter that a token's
    log-prob does not depend on gets zeros.

    Args:
        logp_fn: zero-argument callable returning the (N,) log-probs of the taken tokens, a differentiable
            function of ``params``.
        params: tensors that require grad, in the order their columns appear.
    Returns:
        (N, P) scores, in ``logp_fn()``'s dtype.
    """
    params = list(params)
    if not params:
        raise ValueError("`params` is empty: pass the tensors to differentiate with respect to")
    for i, p in enumerate(params):
        _check_tensor(f"params[{i}]", p)
        if not p.requires_grad:
            raise ValueError(f"`params[{i}]` does not require grad")
    logp = logp_fn()
    _check_shape("logp_fn()", logp, "(N,)", 1)
    if not logp.requires_grad:
        raise ValueError("`logp_fn()` returned log-probs with no graph: they must depend on `params`")
    _check_float("logp_fn()", logp)
    n = logp.shape[0]
    sizes = [p.numel() for p in params]
    out = torch.zeros((n, sum(sizes)), dtype=logp.dtype, device=logp.device)
    for j in range(n):
        grads = torch.autograd.grad(logp[j], params, retain_graph=j < n - 1, allow_unused=True)
        col = 0
        for gr, size in zip(grads, sizes, strict=True):
            if gr is not None:
                out[j, col : col + size] = gr.reshape(-1).to(out.dtype)
            col += size
    return out


def sgd_update(
    logp_of: Callable[[list[Tensor]], Tensor], params: Sequence[Tensor], coef: Tensor, lr: float
) -> list[Tensor]:
    """One SGD ascent step on J(θ) = Σ_k coef_k log π_θ(y_k): θ' = θ + lr·∇_θ J (eq. 2–3), as new tensors.

    ``params`` are never modified (the step differentiates a detached copy); the coefficients are held
    constant (detached). Returns θ' (detached, same shapes as ``params``), e.g. to take several steps in a
    row; ``sgd_step`` wraps it for ``masking_effect``.

    Args:
        logp_of: maps a list of parameter tensors (same shapes as ``params``) to the (N,) log-probs.
        params: the starting parameters θ.
        coef: (N,) the coefficients c_k.
        lr: the SGD step size ≥ 0.
    """
    lr = _check_lr(lr)
    if not list(params):
        raise ValueError("`params` is empty: pass the parameters the step updates")
    theta = [p.detach().clone().requires_grad_(True) for p in params]
    logp = logp_of(theta)
    _check_tensor("coef", coef)
    _check_shape("coef", coef, "(N,)", 1, (logp.shape[0],))
    # eq. (2)-(3): J = Σ_k c_k log π(y_k), θ' = θ + lr·∇J
    objective = (coef.detach().to(logp.dtype) * logp).sum()
    grads = torch.autograd.grad(objective, theta, allow_unused=True)
    with torch.no_grad():
        return [(t + lr * g if g is not None else t).detach() for t, g in zip(theta, grads, strict=True)]


def repeated_sgd(
    logp_of: Callable[[list[Tensor]], Tensor],
    params: Sequence[Tensor],
    coef_at: Callable[[int, Tensor], Tensor],
    lr: float,
    n_steps: int,
) -> list[Tensor]:
    """``n_steps`` SGD ascent steps in a row on one fixed batch (App. E.2's repeated updates, Fig. 11).

    Step n (0-based) takes θ_{n+1} = ``sgd_update(logp_of, θ_n, coef_at(n, logp_n), lr)`` with logp_n =
    ``logp_of(θ_n)`` detached: ``coef_at`` returns the (N,) coefficients of that step, e.g. always the
    batch's (plain SGD on a fixed linear objective) or recomputed at the current policy (PPO-style
    epochs, the ratio to the batch's old log-probs). ``params`` are never modified.

    Returns:
        the (N,) log-probs after each step, ``[logp_1, ..., logp_n_steps]`` (detached).
    """
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
        raise ValueError(f"`n_steps` must be a positive int, got {n_steps!r}")
    theta = [p.detach().clone() for p in params]
    out: list[Tensor] = []
    with torch.no_grad():
        logp = logp_of(theta).detach()
    for n in range(n_steps):
        theta = sgd_update(logp_of, theta, coef_at(n, logp), lr)
        with torch.no_grad():
            logp = logp_of(theta).detach()
        out.append(logp)
    return out


def sgd_step(
    logp_of: Callable[[list[Tensor]], Tensor], params: Sequence[Tensor], lr: float
) -> Callable[[Tensor], Tensor]:
    """Build ``masking_effect``'s ``step`` for any differentiable model: one SGD ascent step from a copy.

    The returned ``step(coef)`` takes θ' = θ + lr·∇_θ Σ_k coef_k log π_θ(y_k) (eq. 3, ``sgd_update``) from a
    detached copy of ``params`` (so every call starts from the same θ; ``params`` are never modified) and
    returns ``logp_of(θ')`` (N,), detached. For an ``nn.Module``, ``logp_of`` can wrap
    ``torch.func.functional_call(model, dict(zip(names, theta)), inputs)``.

    Args:
        logp_of: maps a list of parameter tensors (same shapes as ``params``) to the (N,) log-probs.
        params: the starting parameters θ.
        lr: the SGD step size ≥ 0.
    Returns:
        ``step: (N,) coef -> (N,) new log-probs``.
    """
    lr = _check_lr(lr)
    base = [p.detach().clone() for p in params]
    if not base:
        raise ValueError("`params` is empty: pass the parameters the step updates")

    def step(coef: Tensor) -> Tensor:
        new = sgd_update(logp_of, base, coef, lr)
        with torch.no_grad():
            return logp_of(new).detach()

    return step


__all__ = [
    "BoostStats",
    "FirstOrderDelta",
    "NormSplit",
    "ValueGap",
    "boost_stats",
    "counterfactual_value",
    "coupling_kernel",
    "coupling_mass",
    "first_order_delta",
    "first_order_masking_effect",
    "mask_sets",
    "masking_effect",
    "output_overlap",
    "per_token_scores",
    "proxy_kernel",
    "repeated_sgd",
    "sgd_step",
    "sgd_update",
    "surviving_signal",
    "update_norm_split",
    "value_gap",
]
