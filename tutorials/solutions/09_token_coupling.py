"""Solutions to the exercises of tutorial 9 (`tutorials/09_token_coupling.py`): try them yourself first.

Each function is meant to replace the exercise cell of the same name in the notebook: it uses the
notebook's imports (`torch`), so this file is not run on its own. The tutorial tests
(`tests/tutorials`) run every notebook with these bodies put in its exercise cells.
"""

# ruff: noqa: F821


def my_output_overlap(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(N, N) D_jk = 1[y_j = y_k] − π_j(y_k) − π_k(y_j) + ⟨π_j, π_k⟩ (eq. 8)."""
    same = (tokens[:, None] == tokens[None, :]).to(probs.dtype)  # 1[y_j = y_k]
    cross = probs[:, tokens]  # cross[j, k] = π_j(y_k); its transpose holds π_k(y_j)
    return same - cross - cross.T + probs @ probs.T


def my_first_order_delta(
    kernel: torch.Tensor, coef: torch.Tensor, lr: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(self, coupling), each (N,): lr·c_j·K_jj and lr·Σ_{k≠j} c_k·K_jk (eq. 5)."""
    self_term = lr * coef * torch.diagonal(kernel)
    coupling = lr * (kernel @ coef) - self_term  # the whole row sum, less its k = j term
    return self_term, coupling
