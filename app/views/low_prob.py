"""Page 5, Low-probability tokens (Lopti paper, arXiv 2505.12929): why do rare tokens dominate the update?

The gradient of log π(y) at the logits is e_y − π, whose norm lies between two multiples of (1 − π(y))
(``cancellation.diagnostics.softmax_grad_norm`` / ``softmax_grad_norm_bounds``): the rarer the
token, the larger its push on the shared output layer. Advantage Reweighting
(``cancellation.advantages.reweight_advantages``) scales each token's advantage by α·π + 1 − α to damp
them; Lopti (``cancellation.batching.lopti_masks``) updates the low-probability set (π < η) first.
"""

from __future__ import annotations

import math

import streamlit as st
import torch

from app.common import page_header, user_errors
from app.theory_figures import grad_norm_scatter, reweighted_scatter
from cancellation.advantages import reweight_advantages
from cancellation.batching import lopti_masks
from cancellation.diagnostics import softmax_grad_norm, softmax_grad_norm_bounds

#: draws × vocabulary above this would make the page slow (a (draws, N) float64 matrix)
MAX_CELLS = 4_000_000
#: relative slack for "inside the bounds" (float64 rounding of a norm equal to a bound)
BOUND_TOL = 1e-12


@st.cache_data(show_spinner=False, max_entries=32)
def draws_of(vocab: int, draws: int, seed: int) -> tuple[list[float], list[float]]:
    """(π(y), ‖e_y − π‖) for ``draws`` random softmax distributions over ``vocab`` tokens.

    Each draw: N standard-normal logits times a temperature drawn log-uniformly in [0.05, 4·(1 + ln N)]
    (the other tokens' mass goes from near uniform to near one-hot); a token y chosen uniformly; then
    y's logit is shifted so that π(y) is uniform in (0, 1), so the points span the whole π axis for any N.
    """
    gen = torch.Generator().manual_seed(seed)
    top = math.log(4.0 * (1.0 + math.log(vocab)))
    scale = torch.empty(draws, 1, dtype=torch.float64).uniform_(math.log(0.05), top, generator=gen).exp()
    logits = torch.randn(draws, vocab, dtype=torch.float64, generator=gen) * scale
    tokens = torch.randint(0, vocab, (draws,), generator=gen)
    target = torch.rand(draws, dtype=torch.float64, generator=gen).clamp(1e-6, 1.0 - 1e-6)
    # logit of y such that softmax gives π(y) = target: z_y = logit(target) + logsumexp(other logits)
    others = logits.scatter(1, tokens[:, None], -math.inf)
    z_y = target.log() - (-target).log1p() + torch.logsumexp(others, dim=-1)
    probs = torch.softmax(logits.scatter(1, tokens[:, None], z_y[:, None]), dim=-1)
    pi = probs.gather(1, tokens[:, None])[:, 0]
    norms = softmax_grad_norm(probs, tokens)
    return pi.tolist(), norms.tolist()


@st.cache_data(show_spinner=False, max_entries=32)
def bound_lines(vocab: int, points: int = 201) -> tuple[list[float], list[float], list[float]]:
    grid = torch.linspace(0.0, 1.0, points, dtype=torch.float64)
    lower, upper = softmax_grad_norm_bounds(grid, vocab)
    return grid.tolist(), lower.tolist(), upper.tolist()


@st.cache_data(show_spinner=False, max_entries=64)
def analysis(vocab: int, draws: int, seed: int, alpha: float, eta: float) -> dict[str, object]:
    """Everything the page shows for one set of inputs."""
    pi_list, norm_list = draws_of(vocab, draws, seed)
    pi = torch.tensor(pi_list, dtype=torch.float64)
    norms = torch.tensor(norm_list, dtype=torch.float64)
    lower, upper = softmax_grad_norm_bounds(pi, vocab)
    inside = (norms >= lower * (1 - BOUND_TOL) - BOUND_TOL) & (norms <= upper * (1 + BOUND_TOL) + BOUND_TOL)
    # Advantage Reweighting with A = 1 on single-token "completions", π_old = π (the first inner step)
    old_logp = pi.clamp(min=1e-300).log()[:, None]
    ones = torch.ones(pi.shape[0], dtype=torch.float64)
    adv0 = reweight_advantages(ones, old_logp, 0.0)[:, 0]
    adv_a = reweight_advantages(ones, old_logp, alpha)[:, 0]
    low, _ = lopti_masks(old_logp, torch.ones_like(old_logp), eta)
    factor_eta = reweight_advantages(
        torch.ones(1, dtype=torch.float64), torch.tensor([[math.log(eta)]], dtype=torch.float64), alpha
    )
    return {
        "pi": pi_list,
        "norms": norm_list,
        "inside_frac": float(inside.double().mean()),
        "base": (adv0.abs() * norms).tolist(),
        "reweighted": (adv_a.abs() * norms).tolist(),
        "low_frac": float(low.double().mean()),
        "factor_at_eta": float(factor_eta[0, 0]),
    }


page_header(
    "Low-probability tokens",
    "Why do low-probability tokens get the largest gradients, and what do Advantage Reweighting and "
    "Lopti change about that?",
    r"\Big\|\frac{\partial \log\pi(y)}{\partial z}\Big\| = \|e_y-\pi\|,\qquad"
    r"\sqrt{\tfrac{N}{N-1}}\,(1-\pi_y)\ \le\ \|e_y-\pi\|\ \le\ \sqrt{2}\,(1-\pi_y),\qquad"
    r"\hat A_{i,t} \leftarrow \big[\alpha\,\pi_{\text{old}}(o_{i,t}) + 1-\alpha\big]\,\hat A_{i,t}",
    "Lopti paper §3.1: the gradient norm at the logits is ∝ (1 − π); Advantage Reweighting and "
    "Lopti's two-stage update (low set π < η first).",
)

with st.sidebar:
    st.header("Inputs")
    vocab = int(
        st.number_input("vocabulary size N", min_value=2, max_value=200_000, value=50, step=1, key="vocab")
    )
    alpha = st.slider("Advantage Reweighting α", 0.0, 1.0, 0.3, 0.05, key="alpha")
    eta = st.slider("Lopti η (low set: π < η)", 0.01, 1.0, 0.5, 0.01, key="eta")
    draws = int(
        st.number_input(
            "random logit draws", min_value=10, max_value=20_000, value=2000, step=100, key="draws"
        )
    )
    seed = int(st.number_input("seed", min_value=0, max_value=2**31 - 1, value=0, step=1, key="seed"))

if vocab * draws > MAX_CELLS:
    st.error(
        f"N × draws = {vocab:,} × {draws:,} = {vocab * draws:,} logits is too many for an interactive page "
        f"(at most {MAX_CELLS:,}): lower the vocabulary size or the number of draws."
    )
    st.stop()

with user_errors():
    grid, lower, upper = bound_lines(vocab)
    res = analysis(vocab, draws, seed, alpha, eta)

c1, c2, c3 = st.columns(3)
c1.metric("Points inside the bounds", f"{100.0 * res['inside_frac']:.1f}%")
c2.metric("Reweighting factor at π = η", f"{res['factor_at_eta']:.6g}")
c3.metric("Tokens in Lopti's low set (π < η)", f"{100.0 * res['low_frac']:.1f}%")
if res["inside_frac"] < 1.0:
    st.error("Some points fall outside Lopti's bounds: that contradicts Lopti paper §3.1; please report it.")

st.plotly_chart(grad_norm_scatter(res["pi"], res["norms"], grid, lower, upper, vocab), key="norms")
st.caption(
    "Each point: one softmax over N tokens with random logits and temperature, and one token y. The lower "
    "bound is reached when the other mass is uniform, the upper one when it sits on a single token."
)
st.plotly_chart(reweighted_scatter(res["pi"], res["base"], res["reweighted"], alpha, eta), key="reweighted")
st.caption(
    f"With A = 1 and π_old = π. α = {alpha:g} multiplies a token's advantage by α·π + 1 − α: "
    f"{1 - alpha:.3g} at π → 0, 1 at π = 1, so rare tokens are damped most. Lopti splits the tokens at "
    f"η = {eta:g} and updates the low set first, then the high set."
)
