"""Solutions to the exercises of tutorial 1 (`tutorials/01_advantages_and_score_function.py`): try them yourself first.

Each function is meant to replace the exercise cell of the same name in the notebook: it uses the
notebook's variables (`policy`, `mask`, ...) and imports, so this file is not run on its own. The
tutorial tests (`tests/tutorials`) run every notebook with these bodies put in its exercise cells.
"""

# ruff: noqa: F821


def my_coefficients(adv: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) ∂J/∂logp of J = token-mean of Â_i·logp_(i,t), 0 on padding."""
    leaf = logp.detach().clone().requires_grad_(True)
    surrogate = aggregate(adv[:, None] * leaf, mask, "token-mean")
    (grad,) = torch.autograd.grad(surrogate, leaf)
    return grad * mask


def my_event_advantage_sums(adv: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(E,) Σ Â over each event's tokens / N, events sorted by id."""
    valid = mask.bool()
    event_ids, event_of_token = torch.unique(keys[valid], return_inverse=True)  # sorted ids
    adv_of_token = adv[:, None].expand_as(mask)[valid]
    sums = torch.zeros(len(event_ids), dtype=adv.dtype).index_add_(0, event_of_token, adv_of_token)
    return sums / mask.sum()
