"""Solutions to the exercises of tutorial 1 (`tutorials/01_advantages_and_score_function.py`): try them yourself first.

Each function is meant to replace the exercise cell of the same name in the notebook: it uses the
notebook's variables (`policy`, `mask`, ...) and imports, so this file is not run on its own. The
tutorial tests (`tests/tutorials`) run every notebook with these bodies put in its exercise cells.
"""

# ruff: noqa: F821


def my_group_advantages(rewards: torch.Tensor, group: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(B,) Â: (r − mean) / (std + 1e-6) over each group's valid rows; 0 for invalid rows and groups of < 2."""
    adv = torch.zeros_like(rewards)
    for g in torch.unique(group):
        rows = (group == g) & valid
        if int(rows.sum()) < 2:  # no contrast: Â = 0
            continue
        r = rewards[rows]
        adv[rows] = (r - r.mean()) / (r.std() + 1e-6)  # eq. (1.1); torch.std is Bessel-corrected
    return adv


def my_coefficients(adv: torch.Tensor, mask: torch.Tensor, aggregation: str) -> torch.Tensor:
    """(B, T) ∂J/∂logp at ratio 1 for "token-mean" or "seq-mean-token-mean", 0 on padding."""
    if aggregation == "token-mean":  # J = Σ_{i,t} m·Â_i·logp / N
        return adv[:, None] * mask / mask.sum()
    # J = (1/G) Σ_i (1/T_i) Σ_t m·Â_i·logp
    return adv[:, None] * mask / (mask.sum(-1, keepdim=True) * mask.shape[0])


def my_event_nets(adv: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(E,) Σ Â over each event's real tokens / N, events sorted by id."""
    valid = mask.bool()
    event_ids, event_of_token = torch.unique(keys[valid], return_inverse=True)  # sorted ids
    adv_of_token = adv[:, None].expand_as(mask)[valid]
    sums = torch.zeros(len(event_ids), dtype=adv.dtype).index_add_(0, event_of_token, adv_of_token)
    return sums / mask.sum()
