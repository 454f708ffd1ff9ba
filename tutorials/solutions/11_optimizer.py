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


def my_adamw(
    theta: torch.Tensor,
    grads: torch.Tensor,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
) -> torch.Tensor:
    """θ after len(grads) steps of AdamW (bias-corrected moments, decoupled weight decay) from `theta`."""
    beta1, beta2 = betas
    theta = theta.clone()
    m, v = torch.zeros_like(theta), torch.zeros_like(theta)
    for t, g in enumerate(grads, start=1):
        theta = theta * (1 - lr * weight_decay)  # the decoupled decay, before Adam's step
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
        theta = theta - lr * m_hat / (v_hat.sqrt() + eps)
    return theta
