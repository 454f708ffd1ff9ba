"""Solutions to the exercises of tutorial 2 (`tutorials/02_shared_prefix_and_sequence_coupling.py`): try them yourself first.

Each function is meant to replace the exercise cell of the same name in the notebook: it uses the
notebook's variables (`policy`, `mask`, ...) and imports, so this file is not run on its own. The
tutorial tests (`tests/tutorials`) run every notebook with these bodies put in its exercise cells.
"""

# ruff: noqa: F821


def my_coefficients(rho1: float, rho2: float, lam1: float, lam2: float, objective: str) -> torch.Tensor:
    """(2, 3) c_(i,t) of the group {τ1, τ2} for "grpo" (token-mean) or "seq" (s = Π r, 1/G)."""
    ratios = torch.tensor([[rho1, rho2, lam1], [rho1, rho2, lam2]], dtype=torch.float64)  # eq. (35)-(36)
    adv = torch.tensor([[-1.0], [1.0]], dtype=torch.float64)  # eq. (32), A = 1
    if objective == "grpo":  # J = (1/N) Σ_{i,t} r_(i,t)·Â_i and ∂r/∂log π = r
        return adv * ratios / ratios.numel()
    s = ratios.prod(-1, keepdim=True)  # eq. (37): s_i = ρ1·ρ2·λ_i, and ∂s_i/∂log π_t = s_i for every t
    return (adv * s / 2).expand(2, 3)


def my_prefix_net(adv: torch.Tensor, rho1: float, rho2: float, lam: torch.Tensor, length_norm: bool) -> float:
    """Σ_i ∂J/∂logp_(i,1) on the shared first token, J = (1/G) Σ_i s_i·Â_i."""
    s = rho1 * rho2 * lam  # Π_t r_(i,t)
    per_token = 1.0
    if length_norm:  # s_i = (Π_t r)^(1/3): ∂s_i/∂log π_t = s_i/3
        s = s ** (1 / 3)
        per_token = 1 / 3
    return float((adv * s).sum() * per_token / len(adv))
