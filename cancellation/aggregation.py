"""How per-token loss terms become one scalar (the names verl uses).

Each function takes ``values`` (B, T) and ``mask`` (B, T) and returns a 0-d tensor. The optional
``token_count`` / ``seq_count`` replace the local counts by global ones, which is what makes a loss
split over gradient-accumulation micro-batches or processes sum to the loss of the whole batch
(the trainer passes the global counts; the toy never does).

| mode | formula | TRL ``loss_type`` |
|---|---|---|
| ``token-mean`` | Σ_{i,t} m·v / Σ_{i,t} m | ``bnpo`` (and DAPO) |
| ``seq-mean-token-mean`` | (1/B) Σ_i [Σ_t m·v / max(1, Σ_t m)] | ``grpo`` (GRPO's original) |
| ``seq-mean-token-sum`` | (1/B) Σ_i Σ_t m·v | none |
| ``seq-mean-token-sum-norm`` | (1/B) Σ_i Σ_t m·v / C, C a constant | ``dr_grpo`` with C = max completion length |
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor


def token_mean(
    values: Tensor, mask: Tensor, *, token_count: float | Tensor | None = None, **_: object
) -> Tensor:
    """Mean over all unmasked tokens of the batch (every token weighs the same)."""
    total = (values * mask).sum()
    count = mask.sum() if token_count is None else token_count
    return total / count


def seq_mean_token_mean(
    values: Tensor, mask: Tensor, *, seq_count: float | Tensor | None = None, **_: object
) -> Tensor:
    """Mean over sequences of each sequence's token mean (a fully masked sequence contributes 0)."""
    per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    count = values.shape[0] if seq_count is None else seq_count
    return per_seq.sum() / count


def seq_mean_token_sum(
    values: Tensor, mask: Tensor, *, seq_count: float | Tensor | None = None, **_: object
) -> Tensor:
    """Mean over sequences of each sequence's token sum (longer sequences weigh more)."""
    count = values.shape[0] if seq_count is None else seq_count
    return (values * mask).sum() / count


def seq_mean_token_sum_norm(
    values: Tensor,
    mask: Tensor,
    *,
    norm_constant: float | None = None,
    seq_count: float | Tensor | None = None,
    **_: object,
) -> Tensor:
    """Token sum per sequence divided by a constant C, averaged over sequences (Dr. GRPO).

    ``norm_constant`` defaults to T, the padded length of the batch; pass the maximum completion
    length to match TRL's ``dr_grpo`` whatever the batch's padding. (Older verl divides by T only,
    not by B·T: that is this value times B.)
    """
    c = float(values.shape[-1]) if norm_constant is None else float(norm_constant)
    if c <= 0:
        raise ValueError(f"norm_constant must be > 0, got {norm_constant}")
    count = values.shape[0] if seq_count is None else seq_count
    return (values * mask).sum() / (count * c)


AGGREGATIONS: dict[str, Callable[..., Tensor]] = {
    "token-mean": token_mean,
    "seq-mean-token-mean": seq_mean_token_mean,
    "seq-mean-token-sum": seq_mean_token_sum,
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
}


def aggregate(values: Tensor, mask: Tensor, mode: str = "token-mean", **kwargs: object) -> Tensor:
    """Reduce (B, T) per-token ``values`` to a scalar with the named aggregation ``mode``."""
    try:
        fn = AGGREGATIONS[mode]
    except KeyError:
        raise ValueError(f"unknown aggregation {mode!r}; valid: {', '.join(AGGREGATIONS)}") from None
    return fn(values, mask.to(values.dtype), **kwargs)


def aggregation_names() -> list[str]:
    return list(AGGREGATIONS)


__all__ = [
    "AGGREGATIONS",
    "aggregate",
    "aggregation_names",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
    "token_mean",
]
