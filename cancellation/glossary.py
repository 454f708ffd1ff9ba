"""What each metric of ``compute_loss`` means and which equation it comes from.

``METRIC_DOCS`` maps every key of ``cancellation.METRIC_KEYS`` to ``(meaning, paper reference)``; the
app's About page shows it as a table and the trainer's docs can quote it. A test checks that every
metric key is documented and that no other key is.

Notation: r = π_θ/π_old per token, s the sequence ratio (GSPO: exp(mean_t log r), DFPO eq. 44), Â the
group-relative advantage, ε_low/ε_high the clip range, w_i the trajectory weight of DFPO eq. (23).
Equation numbers without a paper name are the DFPO paper's (arXiv 2604.13088).
"""

from __future__ import annotations

#: metric key -> (meaning, paper reference)
METRIC_DOCS: dict[str, tuple[str, str]] = {
    "loss": (
        "The aggregated value that is minimised: −objective + β·KL (the KL term only when β > 0).",
        "per-token terms eq. (77) grpo, (79)–(80) grpo_symclip, (42) gspo, (49) dfpo; KL: k3 estimator",
    ),
    "objective": (
        "The aggregated surrogate objective J without the KL term (loss = −objective when β = 0).",
        "eq. (77) grpo, (79)–(80) grpo_symclip, (42) gspo, (49) with s̃ dfpo",
    ),
    "clip/low_frac": (
        "Fraction of tokens whose gradient the lower clip removes: ratio (r, or s for the sequence "
        "objectives) below 1 − ε_low with Â < 0. Always 0 for grpo_symclip, which has no lower clip.",
        "eq. (46)–(47), (77); App. F eq. (75)",
    ),
    "clip/high_frac": (
        "Fraction of tokens whose gradient the upper clip removes: ratio above 1 + ε_high with Â > 0 "
        "(for grpo_symclip: r > 1 + ε for either sign of Â).",
        "eq. (46)–(47), (77); App. F eq. (76); App. H eq. (79)–(80)",
    ),
    "clip/frac": (
        "Fraction of tokens clipped by either side (clip/low_frac + clip/high_frac).",
        "eq. (77); App. F eq. (75)–(76)",
    ),
    "ratio/mean": (
        "Mean token ratio r = π_θ/π_old over the unmasked tokens (1 at the first inner step).",
        "eq. (77): r_{i,t}",
    ),
    "ratio/min": ("Smallest token ratio r over the unmasked tokens.", "eq. (77): r_{i,t}"),
    "ratio/max": ("Largest token ratio r over the unmasked tokens.", "eq. (77): r_{i,t}"),
    "seq_ratio/mean": (
        "Mean sequence ratio s over the completions: exp(mean_t log r) (length-normalised, GSPO), "
        "or Π_t r with length_norm=False.",
        "eq. (44); eq. (11)/(31) for Π r",
    ),
    "weight/mean": (
        "Mean trajectory weight w_i: s̃ (transformed) for dfpo, the post-clip s̄ for gspo, the mean "
        "post-clip token weight for grpo and grpo_symclip.",
        "eq. (47) s̄, eq. (17)/(18)/(50)–(55) s̃, eq. (23) w_i",
    ),
    "weight/group_std": (
        "Within-group standard deviation of w_i, averaged over groups: 0 means every completion of a "
        "group gets the same weight (Min-Replace), so shared tokens cancel as in eq. (9).",
        "eq. (13), (17)/(50), (23)",
    ),
    "asym": (
        "Within-group (population) variance of w_i·Â_i, averaged over groups; at ratio 1 it is the "
        "variance of Â. Transforms lower it by changing w_i.",
        "eq. (23)",
    ),
    "zero_adv_group_frac": (
        "Fraction of groups whose advantages are all 0 (all rewards equal, or a group of one): no "
        "learning signal from them.",
        "group-relative advantage Â (GRPO); eq. (2) holds trivially there",
    ),
    "kl": (
        "Mean per-token k3 estimate of KL(π_θ ‖ π_ref): exp(ref − logp) − (ref − logp) − 1; 0 when β = 0.",
        "k3 estimator (Schulman), as in GRPO's KL penalty",
    ),
}
