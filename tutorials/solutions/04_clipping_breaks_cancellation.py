"""Solutions to the exercises of tutorial 4 (`tutorials/04_clipping_breaks_cancellation.py`): try them yourself first.

Each function is meant to replace the exercise cell of the same name in the notebook: it uses the
notebook's variables (`policy`, `mask`, ...) and imports, so this file is not run on its own. The
tutorial tests (`tests/tutorials`) run every notebook with these bodies put in its exercise cells.
"""


def my_grpo_net(w: float) -> float:
    """Σ_i ∂J/∂logp of the shared token 'answer' at ratio w (GRPO, ε = 0.2, token-mean over 4 tokens)."""
    n_tokens, eps = 4, 0.2
    if w > 1 + eps:  # τ2 (Â = +1) is clipped; τ1's term -w·logπ is not: coefficient Â_1·w / N
        return -w / n_tokens
    if w < 1 - eps:  # τ1 (Â = -1) is clipped; τ2's term +w·logπ is not
        return w / n_tokens
    return 0.0  # both terms live: (Â_1 + Â_2)·w / N = 0


def my_cancelling_interval(epsilon_low: float, epsilon_high: float) -> tuple[float, float]:
    """(w_lo, w_hi) where GRPO still cancels on the shared token."""
    # inside the clip range both terms depend on θ and cancel; outside it only one of them does (eq. 75-76)
    return (1.0 - epsilon_low, 1.0 + epsilon_high)
