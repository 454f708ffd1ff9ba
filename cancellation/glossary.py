"""What each metric of ``compute_loss`` means and which equation it comes from.

``METRIC_DOCS`` maps every key of ``cancellation.METRIC_KEYS`` to ``(meaning, paper reference)``; the
app's About page shows it as a table and the trainer's docs can quote it. A test checks that every
metric key is documented and that no other key is. ``METER_DOCS`` does the same for the cancellation
meters of ``cancellation.update`` (``RESIDUAL_KEYS``, logged by the toy and the trainer), and
``ESTIMATOR_DOCS`` says what each estimator of ``gspo``/``dfpo`` differentiates (the About page shows
all three).

Notation: r = π_θ/π_old per token, s the sequence ratio (GSPO: exp(mean_t log r), DFPO eq. 44), Â the
group-relative advantage, ε_low/ε_high the clip range, w_i the trajectory weight of DFPO eq. (23).
Equation numbers without a paper name are the DFPO paper's (arXiv 2604.13088); docs/papers.md lists the
papers.
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

#: the cancellation meters of ``cancellation.update.CancellationMeter`` (row keys of the toy and the
#: trainer, ``cancellation.update.RESIDUAL_KEYS``) -> (meaning, paper reference)
METER_DOCS: dict[str, tuple[str, str]] = {
    "shared_residual": (
        "Σ|net| / Σ gross of the coefficients ∂J/∂logp the step's optimiser steps applied, per (group, "
        "context/prefix, token) event occurring at least twice in the batch: 0 every shared event "
        "cancels, 1 none does. Events shared by only part of a group keep Σ Â ≠ 0 under every objective "
        "(credit assignment). NaN when no shared event got a non-zero coefficient.",
        "eq. (2), (72)",
    ),
    "group_shared_residual": (
        "The same ratio over the events that every completion of the group contains (Σ Â = 0 there): 0 "
        "for GRPO inside its clip range and for DFPO when the group's lengths are equal; what remains is "
        "what coupling, clipping, length normalisation (α = 1/|y_i| differs between lengths) or a split "
        "group broke.",
        "Prop. 3.1, eq. (9), (13), (72); App. F; cancellation-hypothesis paper Sec. 4",
    ),
    "sequence_net_residual": (
        "Per group, |Σ_i c_i| / Σ_i |c_i| with c_i = Σ_t ∂J/∂logp_{i,t} (a completion's whole "
        "coefficient), summed over groups and optimiser steps: does the group's update cancel as a whole? "
        "Under DFPO (any transform, paper estimator, its seq-mean-token-mean) c_i = s̃_i·Â_i/B and "
        "Σ_i Â_i s̃_i = 0, so it is 0 for any lengths, while the token-level residuals above need equal lengths; under GRPO token-mean "
        "with unequal lengths it is not 0.",
        "eq. (2), (18), (68)",
    ),
}

#: what each estimator of the sequence-level objectives differentiates: a call -> (meaning, reference)
ESTIMATOR_DOCS: dict[str, tuple[str, str]] = {
    'dfpo, estimator="paper" (default)': (
        "The paper's stop-gradient estimator: every trajectory, clipped or not, gets the coefficient "
        "s̃_i·Â_i on ∇log s_i(θ) (s̃ = T(s̄) a constant, the direction that of the unclipped sequence "
        "ratio), so Σ_i Â_i s̃_i = 0 holds on the gradient: a token every completion of an equal-length "
        "group shares gets net coefficient 0, clipped sequences included. No trust region beyond the "
        "value of s̃ (like CISPO).",
        "eq. (16), (59)–(62), (68), (85)–(86), (91)",
    ),
    'dfpo, estimator="ppo_clip"': (
        "A trust-region variant that is not in the paper: s̃ enters as sg(s̃/s̄)·s̄(θ), so a sequence whose "
        "s̄ is clipped gets no gradient. The group constraint no longer holds on the gradient; at GSPO's "
        "ε with several optimiser steps per batch nearly every sequence is clipped and it behaves like GSPO.",
        "eq. (42)–(47) with s̃; not in the paper",
    ),
    'gspo, estimator="paper" (the eq. 86 control)': (
        "GSPO's post-clip weight under the paper's estimator, no transform: every trajectory gets "
        "s̄_i·Â_i·∇log s_i. It keeps the gradients GSPO's clip would silence (larger steps) but not the "
        "constraint Σ Â s̄ = 0: DFPO vs this control is the transform's own effect, GSPO vs this control "
        "the estimator's.",
        "eq. (86)",
    ),
    'gspo, estimator="ppo_clip" (default)': (
        "GSPO's own objective min(s·Â, clip(s)·Â): a sequence whose ratio left the band on the side that "
        "binds gets no gradient (PPO's trust region).",
        "eq. (42)–(44)",
    ),
    "dfpo, stop_grad=False": (
        "Table 3's ablation: Σ_i Â_i·T(s̄(θ))_i differentiated through the transform and through s̄ "
        "(clipped sequences are constant there too). Under seq-mean-token-mean Min-Replace and Orth-Proj "
        "give a gradient of exactly 0.",
        "Table 3; App. C/D",
    ),
}
