"""Solutions to the exercises of tutorial 9 (`tutorials/09_token_coupling.py`): try them yourself first.

Each function is meant to replace the exercise cell of the same name in the notebook: it uses the
notebook's imports (`torch`), so this file is not run on its own. The tutorial tests
(`tests/tutorials`) run every notebook with these bodies put in its exercise cells.
"""

# ruff: noqa: F821


def my_predicted_flips(kernel: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """(N,) bool: the first-order Δ log π of token j has the opposite sign to c_j (c_j ≠ 0, Δ_j ≠ 0)."""
    delta = kernel @ coef  # eq. 5 over lr: Δ_j / lr = c_j·K_jj + Σ_{k≠j} c_k·K_jk, the self-term included
    return (delta * coef) < 0  # opposite signs; 0 when c_j = 0 or Δ_j = 0: not a flip


def my_masking_effect(
    kernel: torch.Tensor, coef: torch.Tensor, lr: float, masked: torch.Tensor
) -> torch.Tensor:
    """(N,) first-order ME_j = Δ_j(all tokens) − Δ_j(the tokens of M_j removed), M_j = row j of `masked`."""
    # Δ_j = lr·Σ_k c_k·K_jk; the masked step drops the terms k ∈ M_j, so the difference is those terms
    return lr * (kernel * masked.to(kernel.dtype) * coef[None, :]).sum(-1)
