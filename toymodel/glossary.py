"""What each row key of ``toymodel.simulate`` means that is not an objective metric.

``ROW_DOCS`` maps every key of ``toymodel.ROW_KEYS`` that is not in ``cancellation.METRIC_KEYS`` to
``(meaning, paper reference)`` (the metrics are documented in ``cancellation.glossary.METRIC_DOCS``).
The app's About page shows both; a test checks that the two together document exactly ``ROW_KEYS``.
The meanings follow ``toymodel.simulate``'s module docstring. Equation numbers without a paper name
are the DFPO paper's (arXiv 2604.13088); docs/papers.md lists the papers, among them the
cancellation-hypothesis paper (batching).
"""

from __future__ import annotations

#: row key -> (meaning, paper reference)
ROW_DOCS: dict[str, tuple[str, str]] = {
    "step": ("Training step (1-based); the row is taken after this step's updates.", "—"),
    "updated": (
        "1 if the step updated the parameters, 0 when reward-balanced batching deferred the update.",
        "Cancellation-hypothesis paper Sec. 4 (reward-balanced batching)",
    ),
    "buffer_groups": (
        "Groups waiting in the reward-balanced buffer after the step (0 without reward-balanced batching).",
        "Cancellation-hypothesis paper Sec. 4 (reward-balanced batching)",
    ),
    "sampled_reward": ("Mean reward of the groups sampled this step.", "—"),
    "expected_reward": (
        "Exact expected reward E_π[R] of the current policy, by enumeration of every trajectory.",
        "App. A (toy problems)",
    ),
    "entropy": ("Exact trajectory entropy of the current policy (nats), by enumeration.", "App. A"),
    "equiv_entropy": (
        "Entropy (nats) of π renormalised over the equivalent correct answers (same reward, different "
        "surface form): 0 means collapse onto one of them (entropy collapse).",
        "App. A.1/A.3, eq. (39)–(41)",
    ),
    "equiv_log_odds": (
        "log π(τa) − log π(τb) for the first two equivalent correct answers: its drift is the "
        "probability drift between equally good answers.",
        "App. A.3, eq. (41) (left side)",
    ),
    "template_kl": (
        "Exact Σ_h d_θ(h)·KL(π_θ(·|h) ‖ π_init(·|h)) over the scenario's template contexts: the "
        "learning tax (the exact policy gradient there is 0); 0 when the scenario has none.",
        "App. E/G (learning tax), Prop. 3.1",
    ),
    "shared_residual": (
        "Σ|net| / Σ gross of the coefficients the step's optimiser steps applied, per (group, context, "
        "token) event occurring at least twice in the batch: 0 every shared event cancels, 1 none does. "
        "Events shared by only part of a group keep Σ Â ≠ 0 under every objective (credit assignment). "
        "NaN when no shared event got a non-zero coefficient.",
        "eq. (2), (72)",
    ),
    "group_shared_residual": (
        "The same ratio over the events that every completion of the group contains (Σ Â = 0 there): "
        "exactly 0 for GRPO inside its clip range and for DFPO (the paper's estimator, every transform, "
        "clipped sequences included) with equal lengths; what remains is what coupling, clipping, length "
        "normalisation or a split group broke.",
        "Prop. 3.1, eq. (9), (13), (72); App. F; cancellation-hypothesis paper Sec. 4",
    ),
    "sequence_net_residual": (
        "Σ_groups |Σ_i c_i| / Σ_groups Σ_i |c_i| with c_i = Σ_t ∂J/∂logp_{i,t}, the total coefficient of "
        "completion i in the step's optimiser steps: the push left on what every completion of a group "
        "shares. DFPO's paper estimator gives c_i ∝ s̃_i·Â_i with Σ_i Â_i s̃_i = 0, so it is 0 for any "
        "lengths (with its default length-normalised ratio and seq-mean-token-mean, and groups kept whole "
        "by the mini-batches); GRPO's token-mean with unequal lengths is not. NaN without an update.",
        "eq. (2), (18), (68), (72)",
    ),
    "pos_high_up": (
        "Of the batch's tokens at a real choice in completions with Â > 0 and π_old ≥ 0.5, the fraction whose "
        "probability went up over the step's updates (NaN when there are none; the per-seed loop only). "
        "Plain GRPO lets low-probability tokens' larger gradients push some of them down.",
        "Lopti paper Fig. 3",
    ),
}
