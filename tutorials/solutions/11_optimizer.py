"""Solutions to the exercises of tutorial 11 (`tutorials/11_optimizer.py`): try them yourself first.

Each function is meant to replace the exercise cell of the same name in the notebook: it uses the
notebook's imports (`math`, `torch`), so this file is not run on its own. The tutorial tests
(`tests/tutorials`) run every notebook with these bodies put in its exercise cells.
"""

# ruff: noqa: F821


def my_adam_coast(beta1: float, beta2: float, k: int) -> float:
    """|Δθ| / lr of Adam's update k steps after a single non-zero gradient (zero gradients since)."""
    # after the gradient g at step 1 and k zero gradients: m = β1^k (1 − β1) g, v = β2^k (1 − β2) g²,
    # at step k + 1 the bias corrections are 1 − β^(k+1); |g| cancels in m̂ / √v̂
    m_hat = beta1**k * (1 - beta1) / (1 - beta1 ** (k + 1))
    v_hat = beta2**k * (1 - beta2) / (1 - beta2 ** (k + 1))
    return m_hat / math.sqrt(v_hat)


def my_first_adam_step(grad: torch.Tensor, lr: float, eps: float) -> torch.Tensor:
    """Δθ of torch.optim.Adam's first step (bias-corrected moments) for the gradient `grad`."""
    # step 1: m̂ = g, v̂ = g² (the bias corrections undo the (1 − β) factors), so Δθ = −lr·g/(|g| + ε)
    return -lr * grad / (grad.abs() + eps)
