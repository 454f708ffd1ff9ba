"""The papers' claims the studies test, each written once: the one table (``CLAIMS``) every study's
predictions are bound from.

A ``Claim`` is a sentence and the paper section it cites; a study turns it into a ``Prediction`` by binding
it to its own measure, arms and direction (``predict``). Where the toy and the language-model studies test
the same claim in their own terms, the sentence has ``{fields}`` that each binding fills: the threshold
("E[R] ≥ 0.9" on the toy, "the reward threshold" on the language model), the outcome ("E[R]", "avg@k"),
the entropy ("equivalent-set entropy", "form entropy") or the DFPO variant; the claim and its source stay
one entry. A claim a study states for each of several arms (each group size, each low-probability method)
has a field for that too. The saved studies carry the bound sentence and source (``Prediction.claim``, ``.source``), so
an entry's words are data: changing one changes what a study registered.

Sources are cited by title and arXiv id; ``docs/papers.md`` is the one table of the papers, and these
strings follow it.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from .study import Prediction

# --------------------------------------------------------------------------------------------------
# sources

#: "Design Conditions for Intra-Group Learning of Sequence-Level Rewards: Token Gradient Cancellation".
DFPO = "DFPO, 'Design Conditions for Intra-Group Learning of Sequence-Level Rewards' (arXiv 2604.13088)"
#: The public review of DFPO: does the gain come from restored cancellation, or from smaller steps?
REVIEW = "public review of DFPO (arXiv 2604.13088): the controlled ablation against the same estimator"
#: "The Cancellation Hypothesis in Critic-Free RL: From Outcome Rewards to Token Credits" (arXiv 2605.08666).
CANCEL = "cancellation-hypothesis paper, 'The Cancellation Hypothesis in Critic-Free RL' (arXiv 2605.08666)"
#: "Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs".
LOPTI = "Lopti, 'Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs' (arXiv 2505.12929)"
DAPO = "DAPO (arXiv 2503.14476)"
#: A hypothesis of this project, not of a paper.
EARLIER_RUN = "Cancellation Lab: the hypothesis of an earlier tabular run"

#: The sections the claims cite, written once for every study (toy, frontier, language model).
SRC_SPEED = f"{DFPO}, Sec. 4.5 Prediction 1 (eq. 19); Sec. 6 Table 2"
SRC_JITTER = f"{DFPO}, Sec. 4.5 Prediction 2 (eq. 20-21); Sec. 6, Fig. 2"
SRC_ACCURACY = f"{DFPO}, Sec. 4.5 Prediction 3 (eq. 22); Table 1"
SRC_ENTROPY = (
    f"{DFPO}, Prop. 3.1; Sec. 4.4; App. A.3 eq. 39-41 (entropy collapse between equivalent solutions)"
)
SRC_CONTROL = f"{REVIEW}; {DFPO}, App. K eq. 86"
SRC_TAX = f"{DFPO}, Sec. 4.4; App. E, G (learning tax)"
SRC_CANCEL = f"{DFPO}, Sec. 4.4 (eq. 17-18); App. B"
SRC_GROUP_SIZE = f"{DFPO}, Sec. 6.2 Table 4"
SRC_COUPLING = f"{DFPO}, eq. 13; App. A.2 eq. 38"
SRC_SYMCLIP_SLOWER = f"{DFPO}, App. H.3 (eq. 79)"
#: DFPO Sec. 6.1: the transform lowers eq. 24's energy on high-frequency token buckets (less learning tax).
SRC_ENERGY = f"{DFPO}, Sec. 6.1 (eq. 24)"
#: DFPO App. K.2-K.4: Min-Replace only shrinks coefficients (φ_i = s̄_min/s̄_i ≤ 1, eq. 87-88): "smaller
#: effective step sizes, potentially slowing convergence" against the eq. 86 control, its baseline.
SRC_SHRINK = f"{DFPO}, App. K.2-K.4 (eq. 86-88, 92): Min-Replace's conservative shrinkage slows convergence"
#: DFPO App. K.4 (2): "clipping/KL constraints trigger less frequently".
SRC_CLIP_LESS = f"{DFPO}, App. K.4 (2): Min-Replace suppresses tail ratios, so clipping triggers less often"
SRC_GROUP_SHARED = f"{DFPO}, Sec. 4.4 (eq. 17-18); Prop. 3.1"
SRC_TABLE3 = f"{DFPO}, Sec. 6.2 Table 3"
SRC_EQUIV = f"{DFPO}, Prop. 3.1; App. A.3 eq. 39-41"
#: DFPO App. E.1 (2): the moments of Adam carry what a step did not cancel.
SRC_ADAM = f"{DFPO}, App. E.1 (2): uncancelled gradients pollute Adam's moment estimates"
SRC_QUERY_BATCH = f"{CANCEL}, Sec. 4 (query-preserved mini-batching, eq. 14; Table 2)"
SRC_REWARD_BALANCED = f"{CANCEL}, Sec. 4 (reward-balanced batching; Table 2)"
SRC_LOPTI = f"{LOPTI}, Sec. 4.1-4.2, 5"
SRC_LOPTI_FIG3 = f"{LOPTI}, Sec. 4.2, Fig. 3"


# --------------------------------------------------------------------------------------------------
# the table


@dataclass(frozen=True)
class Claim:
    """A claim in words (``text``; its ``{fields}`` are filled by each study that binds it) and the paper
    section that states it (``source``)."""

    text: str
    source: str

    @property
    def fields(self) -> frozenset[str]:
        """The names of ``text``'s ``{fields}``."""
        return frozenset(f for _, f, _, _ in string.Formatter().parse(self.text) if f is not None)

    def say(self, **words: str) -> str:
        """``text`` with its fields filled from ``words`` (every field, and nothing else)."""
        if set(words) != self.fields:
            raise ValueError(
                f"claim {self.text!r} needs the words {sorted(self.fields)}, got {sorted(words)}"
            )
        return self.text.format(**words) if self.fields else self.text


#: Every claim a study tests, by name: ``predict`` binds one to a study's measure and arms.
CLAIMS: dict[str, Claim] = {
    # ---- DFPO against GSPO and the eq. 86 control (toy_main, lm_main and the studies that pick from it)
    "faster_than_gspo": Claim("DFPO {variant} reaches {threshold} in fewer steps than GSPO", SRC_SPEED),
    "faster_than_control": Claim(
        "DFPO {variant} reaches {threshold} in fewer steps than the eq. 86 control (credit to the transform)",
        SRC_CONTROL,
    ),
    "shrink_slower_than_control": Claim(
        "DFPO Min-Replace reaches E[R] ≥ 0.9 later than the eq. 86 control (Min-Replace shrinks every "
        "non-minimal weight: smaller effective steps)",
        SRC_SHRINK,
    ),
    "clips_less_than_control": Claim(
        "DFPO Min-Replace triggers clipping less often than the eq. 86 control (clip fraction, {setting})",
        SRC_CLIP_LESS,
    ),
    "smoother_than_gspo": Claim("DFPO's {curve} curve has lower Jitter₂ than GSPO's", SRC_JITTER),
    "ends_higher_than_gspo": Claim("DFPO ends with a higher {outcome} than GSPO", SRC_ACCURACY),
    "ends_higher_than_control": Claim(
        "DFPO ends with a higher {outcome} than the eq. 86 control", SRC_CONTROL
    ),
    "entropy_vs_gspo": Claim("DFPO keeps a higher {entropy} than GSPO at matched reward", SRC_ENTROPY),
    "entropy_vs_control": Claim(
        "DFPO keeps a higher {entropy} than the eq. 86 control at matched reward", f"{SRC_ENTROPY}; {REVIEW}"
    ),
    "final_entropy_vs_gspo": Claim(
        "DFPO keeps a higher form entropy than GSPO at the end (less equivalent-solution collapse)",
        SRC_ENTROPY,
    ),
    "final_entropy_vs_control": Claim(
        "DFPO keeps a higher form entropy than the eq. 86 control at the end", f"{SRC_ENTROPY}; {REVIEW}"
    ),
    "tax_vs_gspo": Claim("DFPO pays less learning tax (template KL) than GSPO at matched reward", SRC_TAX),
    "tax_vs_control": Claim(
        "DFPO pays less learning tax (template KL) than the eq. 86 control at matched reward",
        f"{SRC_TAX}; {REVIEW}",
    ),
    "asym_vs_gspo": Claim("DFPO's transform lowers Asym relative to GSPO", f"{DFPO}, Sec. 6.1 (eq. 23)"),
    "group_shared_vs_gspo": Claim(
        "DFPO {variant} cancels on tokens the whole group shares, GSPO does not (group-shared residual)",
        SRC_GROUP_SHARED,
    ),
    "group_shared_vs_control": Claim(
        "DFPO leaves a lower group-shared residual than the eq. 86 control", SRC_CANCEL
    ),
    "sequence_net_vs_gspo": Claim("DFPO {variant}'s sequence-net residual is lower than GSPO's", SRC_CANCEL),
    "energy_vs_gspo": Claim(
        "DFPO puts a smaller share of gradient energy on the most frequent tokens than GSPO", SRC_ENERGY
    ),
    "energy_vs_control": Claim(
        "DFPO puts a smaller share of gradient energy on the most frequent tokens than the eq. 86 control",
        SRC_ENERGY,
    ),
    # ---- DFPO's ablations (toy_main: Table 3; lm_ablations: the estimator and the batching)
    "ends_higher_than_no_stop_grad": Claim("DFPO ends higher than its no-stop-grad ablation", SRC_TABLE3),
    "faster_than_no_stop_grad": Claim(
        "DFPO reaches E[R] ≥ 0.9 sooner than its no-stop-grad ablation", SRC_TABLE3
    ),
    "ends_higher_than_half": Claim(
        "DFPO ends higher than the global 0.5 scaling (not just a smaller step)", SRC_TABLE3
    ),
    "faster_than_half": Claim("DFPO reaches E[R] ≥ 0.9 sooner than the global 0.5 scaling", SRC_TABLE3),
    "faster_than_ppo_clip": Claim(
        "DFPO with the paper's estimator reaches the threshold sooner than its ppo_clip variant (clipped "
        "sequences keep their gradient)",
        f"{DFPO}, App. K eq. 68, 85-86",
    ),
    "ppo_clip_sequence_net": Claim(
        "The ppo_clip variant leaves a larger sequence-net residual (clipped sequences drop out of the "
        "cancellation)",
        f"{DFPO}, App. K eq. 68",
    ),
    # ---- GRPO-fix against GRPO
    "grpo_fix_group_shared": Claim(
        "GRPO-fix leaves a lower group-shared residual than GRPO",
        f"{DFPO}, App. F eq. 75-76; App. H eq. 79-82",
    ),
    "grpo_fix_ends_higher": Claim(
        "GRPO-fix ends with a higher E[R] than GRPO at ε 0.2",
        f"{DFPO}, Table 1 (GRPO-fix > GRPO, final accuracy)",
    ),
    # ---- toy_group_size (DFPO Table 4)
    "faster_than_gspo_at_g": Claim(
        "G = {g}: DFPO reaches E[R] ≥ 0.9 in fewer steps than GSPO", SRC_GROUP_SIZE
    ),
    "faster_than_control_at_g": Claim(
        "G = {g}: DFPO reaches E[R] ≥ 0.9 in fewer steps than the eq. 86 control", SRC_CONTROL
    ),
    "gain_vs_gspo_grows": Claim(
        "DFPO's relative gain over GSPO is larger at G = {g} than at G = 2", SRC_GROUP_SIZE
    ),
    "gain_vs_control_grows": Claim(
        "DFPO's relative gain over the eq. 86 control is larger at G = 16 than at G = 2",
        f"{SRC_GROUP_SIZE}; {REVIEW}",
    ),
    # ---- toy_batching and lm_ablations (cancellation-hypothesis paper Sec. 4)
    "query_group_shared": Claim(
        "{objective}: query-preserved mini-batches leave a lower group-shared residual than random ones",
        SRC_QUERY_BATCH,
    ),
    "query_faster": Claim(
        "{objective}: query-preserved mini-batches reach {threshold} sooner than random ones", SRC_QUERY_BATCH
    ),
    "query_ends_higher": Claim(
        "GRPO: query-preserved mini-batches end higher than random ones", SRC_QUERY_BATCH
    ),
    "balanced_faster": Claim(
        "{objective}: reward-balanced batching (ρ = {rho}) reaches E[R] ≥ 0.9 sooner", SRC_REWARD_BALANCED
    ),
    "balanced_ends_higher": Claim(
        "GRPO: reward-balanced batching (ρ = 0.25) ends higher", SRC_REWARD_BALANCED
    ),
    # ---- toy_low_prob (Lopti)
    "low_prob_faster": Claim("{method} reaches E[R] ≥ 0.9 in fewer steps than GRPO", SRC_LOPTI),
    "low_prob_early": Claim("{method} has a higher E[R] than GRPO at step {k} (same budget)", SRC_LOPTI),
    "low_prob_ends_higher": Claim("{method} ends with a higher E[R] than GRPO", SRC_LOPTI),
    "low_prob_high_up": Claim(
        "{method} updates more high-probability tokens of positive completions upwards than GRPO",
        SRC_LOPTI_FIG3,
    ),
    # ---- toy_aggregation (equivalent solutions of unequal length)
    "length_norm_drifts": Claim(
        "{objective}: 1/|y| normalisation drifts the equivalent set more than Dr. GRPO's constant (lower "
        "entropy at matched reward)",
        EARLIER_RUN,
    ),
    "coupling_drifts": Claim(
        "Sequence coupling drifts the equivalent set: DFPO keeps a higher entropy than GSPO at matched reward "
        "({aggregation})",
        SRC_EQUIV,
    ),
    "coupling_alone_drifts": Claim(
        "Sequence coupling alone (same estimator): DFPO keeps a higher entropy than the eq. 86 control at "
        "matched reward (seq-mean-token-mean)",
        f"{SRC_EQUIV}; {REVIEW}",
    ),
    "grpo_entropy_vs_gspo": Claim(
        "GRPO (no sequence coupling) keeps a higher equivalent-set entropy than GSPO at matched reward",
        SRC_EQUIV,
    ),
    # ---- toy_epsilon (the clip range, bigger steps)
    "gspo_residual_rises": Claim(
        "GSPO's group-shared residual rises with ε (sequence weights spread inside a wider band)",
        SRC_COUPLING,
    ),
    "control_residual_rises": Claim(
        "The eq. 86 control's group-shared residual rises with ε (coupling alone, no clip silencing)",
        SRC_COUPLING,
    ),
    "cancels_at_wide_eps": Claim(
        "DFPO cancels at ε = 0.2 where GSPO does not (group-shared residual)", f"{DFPO}, Sec. 4.4 eq. 17-18"
    ),
    "transform_cancels_at_wide_eps": Claim(
        "DFPO's transform cancels at ε = 0.2 where the eq. 86 control does not", f"{DFPO}, Sec. 4.4; {REVIEW}"
    ),
    "grpo_leaks_less_wide": Claim(
        "GRPO's clip asymmetry leaks less at a wider ε (sequence-net residual)", f"{DFPO}, App. F eq. 75-76"
    ),
    "grpo_asym_falls_wide": Claim("GRPO's Asym falls at a wider ε", f"{DFPO}, App. F; Sec. 6.1 (eq. 23)"),
    "grpo_fix_leaks_less": Claim(
        "GRPO-fix leaks less than GRPO at ε 0.2 (sequence-net residual)", f"{DFPO}, App. H eq. 79-82"
    ),
    "grpo_fix_lower_asym": Claim(
        "GRPO-fix has a lower Asym than GRPO at ε 0.2", f"{DFPO}, App. H; Sec. 6.1 (eq. 23)"
    ),
    "grpo_fix_slower": Claim(
        "GRPO-fix reaches E[R] ≥ 0.9 later than GRPO at ε 0.2 (symmetric clipping is more conservative, "
        "slower)",
        SRC_SYMCLIP_SLOWER,
    ),
    "entropy_vs_control_wide": Claim(
        "DFPO keeps a higher equivalent-set entropy than the eq. 86 control at ε 0.2, where the transform acts "
        "(matched reward)",
        f"{SRC_ENTROPY}; {REVIEW}",
    ),
    "clip_higher_entropy": Claim(
        "Clip-higher keeps a higher equivalent-set entropy than GRPO", f"{DAPO}, Sec. 3.1 (Clip-Higher)"
    ),
    "faster_than_gspo_paper_eps": Claim(
        "DFPO reaches E[R] ≥ 0.9 sooner than GSPO at the paper's ε", SRC_SPEED
    ),
    "tax_vs_control_big_steps": Claim(
        "With bigger steps, DFPO pays less learning tax (template KL at matched reward) than the eq. 86 control "
        "at the paper's ε (credit to the transform)",
        f"{DFPO}, App. G; {REVIEW}",
    ),
    "tax_vs_control_wide": Claim(
        "With bigger steps, DFPO pays less learning tax than the eq. 86 control at ε 0.2 (credit to the "
        "transform)",
        f"{DFPO}, App. G; {REVIEW}",
    ),
    "shrink_slower_wide": Claim(
        "With bigger steps, DFPO Min-Replace reaches E[R] ≥ 0.9 later than the eq. 86 control at ε 0.2 "
        "(its shrinkage: smaller effective steps)",
        SRC_SHRINK,
    ),
    "grpo_fix_entropy": Claim(
        "GRPO-fix keeps a higher equivalent-set entropy than GRPO at ε 0.2, matched reward (symmetric "
        "clipping: 'slower updates but more stability')",
        f"{SRC_SYMCLIP_SLOWER}; {SRC_ENTROPY}",
    ),
    # ---- toy_optimizer (Adam)
    "adam_faster_than_control": Claim(
        "Under Adam, DFPO reaches E[R] ≥ 0.9 in fewer steps than the eq. 86 control",
        f"{SRC_ADAM}; {SRC_CONTROL}",
    ),
    "adam_smoother_than_control": Claim(
        "Under Adam, DFPO's E[R] curve has lower Jitter₂ than the eq. 86 control's (fewer oscillations)",
        SRC_ADAM,
    ),
    "adam_tax_vs_control": Claim(
        "Under Adam, DFPO pays less learning tax than the eq. 86 control at matched reward",
        f"{SRC_ADAM}; {SRC_TAX}",
    ),
    "adam_entropy_vs_control": Claim(
        "Under Adam, DFPO keeps a higher equivalent-set entropy than the eq. 86 control at matched reward",
        f"{SRC_ADAM}; {SRC_ENTROPY}",
    ),
    "adam_faster_than_gspo": Claim(
        "Under Adam, DFPO reaches E[R] ≥ 0.9 in fewer steps than GSPO", f"{SRC_ADAM}; {SRC_SPEED}"
    ),
    # ---- toy_frontier (each arm at its own best step size, and at equal speed)
    "best_faster_than_gspo": Claim(
        "At each arm's best step size, DFPO reaches E[R] ≥ 0.9 in fewer steps than GSPO", SRC_SPEED
    ),
    "best_faster_than_control": Claim(
        "At each arm's best step size, DFPO reaches E[R] ≥ 0.9 in fewer steps than the eq. 86 control",
        f"{SRC_SPEED}; {REVIEW}",
    ),
    "best_faster_than_grpo": Claim(
        "At each arm's best step size, DFPO reaches E[R] ≥ 0.9 in fewer steps than GRPO", SRC_SPEED
    ),
    "best_grpo_fix_slower": Claim(
        "At each arm's best step size, GRPO-fix is slower than GRPO (symmetric clipping is more conservative)",
        SRC_SYMCLIP_SLOWER,
    ),
    "equal_speed_tax_vs_gspo": Claim(
        "At equal speed, DFPO pays less learning tax (template KL at matched reward) than GSPO", SRC_TAX
    ),
    "equal_speed_tax_vs_control": Claim(
        "At equal speed, DFPO pays less learning tax than the eq. 86 control", f"{SRC_TAX}; {REVIEW}"
    ),
    "equal_speed_entropy_vs_control": Claim(
        "At equal speed, DFPO keeps a higher equivalent-set entropy than the eq. 86 control",
        f"{SRC_ENTROPY}; {REVIEW}",
    ),
    "equal_speed_entropy_vs_gspo": Claim(
        "At equal speed, DFPO keeps a higher equivalent-set entropy than GSPO", SRC_ENTROPY
    ),
    "speed20_tax_vs_gspo": Claim(
        "At equal speed of about 20 steps, DFPO pays less learning tax than GSPO", SRC_TAX
    ),
    "speed20_tax_vs_control": Claim(
        "At equal speed of about 20 steps, DFPO pays less learning tax than the eq. 86 control",
        f"{SRC_TAX}; {REVIEW}",
    ),
    "speed20_entropy_vs_control": Claim(
        "At equal speed of about 20 steps, DFPO keeps a higher equivalent-set entropy than the eq. 86 control",
        f"{SRC_ENTROPY}; {REVIEW}",
    ),
    # ---- lm_residual (ε 0.2, α = 1: the control's residual is large)
    "head_drifts_less": Claim(
        "DFPO's shared head drifts less from the warm start than the eq. 86 control's (the head's tokens "
        "get a net-zero coefficient under DFPO, the control's residual pushes them)",
        f"{DFPO}, Sec. 3.3; App. G (systematic drift of shared tokens)",
    ),
}


def predict(
    name: str,
    *,
    measure: str,
    arm: str,
    baseline: str,
    direction: str,
    by_construction: str | None = None,
    **words: str,
) -> Prediction:
    """The prediction that ``arm``'s ``measure`` is ``direction`` (``"lower"``/``"higher"``) than
    ``baseline``'s, stating claim ``name`` of ``CLAIMS`` (its fields filled from ``words``) with its source;
    ``by_construction``: why the arms' construction decides it (``Prediction.by_construction``)."""
    if name not in CLAIMS:
        raise KeyError(f"no claim {name!r} in experiments.claims.CLAIMS; add it there (the one table)")
    claim = CLAIMS[name]
    return Prediction(
        claim=claim.say(**words),
        source=claim.source,
        measure=measure,
        arm=arm,
        baseline=baseline,
        direction=direction,
        by_construction=by_construction,
    )


__all__ = ["CLAIMS", "Claim", "predict"]
