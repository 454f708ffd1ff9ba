"""``experiments.claims``: every prediction a study registers states a claim of the one table, each claim is
written once (no other module types a claim's words or builds a ``Prediction`` of its own), every claim is
used, and every registered prediction's measure and arms exist in the study that registers it.

The registered predictions are matched to the table by a regular expression built from each claim's
sentence (its ``{fields}`` match any words), not by the table's own ``predict``."""

from __future__ import annotations

import ast
import re
import string
from pathlib import Path

import pytest

from experiments import frontier, lm, lm_power, lm_residual, lm_studies
from experiments.claims import CLAIMS, Claim, predict
from experiments.study import Prediction
from experiments.toy_studies import STUDIES

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


def _registered() -> dict[str, tuple[Prediction, ...]]:
    """Every module-level tuple of predictions the studies register, by where it is declared."""
    out = {f"toy_studies.STUDIES[{name!r}]": s.predictions for name, s in STUDIES.items()}
    out["frontier.PREDICTIONS"] = frontier.PREDICTIONS
    out["lm_studies.MAIN_PREDICTIONS"] = lm_studies.MAIN_PREDICTIONS
    out["lm_studies.ABLATION_PREDICTIONS"] = lm_studies.ABLATION_PREDICTIONS
    out["lm_power.PREDICTIONS"] = lm_power.PREDICTIONS
    out["lm_power.BIG_PREDICTIONS"] = lm_power.BIG_PREDICTIONS
    out["lm_residual.PREDICTIONS"] = lm_residual.PREDICTIONS
    return out


def _pattern(text: str) -> re.Pattern[str]:
    """``text`` as a regular expression: its literal parts verbatim, each ``{field}`` any non-empty words."""
    parts = []
    for literal, field, _, _ in string.Formatter().parse(text):
        parts.append(re.escape(literal))
        if field is not None:
            parts.append(".+")
    return re.compile("".join(parts))


def test_every_registered_prediction_states_exactly_one_claim_of_the_table() -> None:
    patterns = {name: _pattern(c.text) for name, c in CLAIMS.items()}
    used = set()
    n = 0
    for where, predictions in _registered().items():
        for p in predictions:
            n += 1
            matches = [
                name
                for name, c in CLAIMS.items()
                if c.source == p.source and patterns[name].fullmatch(p.claim)
            ]
            assert len(matches) == 1, f"{where}: {p.claim!r} ({p.source!r}) matches {matches} in CLAIMS"
            used |= set(matches)
    assert n >= 100  # the seven toy studies, the frontier and the language-model studies
    assert set(CLAIMS) == used, f"claims no study registers: {sorted(set(CLAIMS) - used)}"


def test_no_claim_is_written_twice() -> None:
    # in the table: no two entries share a sentence (a shared claim is one entry whose fields differ)
    texts = [c.text for c in CLAIMS.values()]
    assert len(set(texts)) == len(texts)
    patterns = [_pattern(t) for t in texts]
    # outside it: no other module of experiments/ types a claim's words or builds a Prediction itself
    for path in sorted(EXPERIMENTS.glob("*.py")):
        if path.name == "claims.py":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                typed = [t for t, pat in zip(texts, patterns, strict=True) if pat.fullmatch(node.value)]
                assert not typed, f"{path.name}:{node.lineno} types the claim {typed[0]!r}"
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name):
                assert node.value.id != "Prediction", f"{path.name}:{node.lineno} aliases Prediction"
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Prediction":
                # the one call left is StudyResult.load's, which rebuilds saved predictions from their data
                assert path.name == "study.py" and not node.args, (
                    f"{path.name}:{node.lineno} builds a Prediction"
                )
                assert [k.arg for k in node.keywords] == [None], f"{path.name}:{node.lineno}"


def _instances(claims: dict[str, Claim]) -> set[tuple[str, str]]:
    """The pairs (a, b) of distinct names where claim a's sentence is an instance of claim b's pattern (b's
    ``{fields}`` as wildcards; a's own fields, left as written, are words a wildcard can stand for)."""
    patterns = {name: _pattern(c.text) for name, c in claims.items()}
    return {(a, b) for a, ca in claims.items() for b in claims if a != b and patterns[b].fullmatch(ca.text)}


#: Claims that fit another's pattern yet are different claims: Lopti's low-probability methods against
#: GRPO (``{method}`` reaches ...) and DFPO against GRPO at each arm's best step size (the frontier).
DISTINCT = {("best_faster_than_grpo", "low_prob_faster")}


def test_no_claim_is_an_instance_of_another() -> None:
    # a claim that another one states with a field filled in is the same claim typed twice: it is one
    # entry, with a field for what differs
    assert _instances(CLAIMS) == DISTINCT
    for a, b in DISTINCT:
        assert CLAIMS[a].source != CLAIMS[b].source, (a, b)


def test_the_instance_check_finds_a_claim_typed_twice() -> None:
    # two entries of the table before the claims were merged (issue 32), verbatim: the toy's Jitter₂ claim
    # was the language model's with its curve filled in
    before = {
        "smoother_toy": Claim("DFPO's E[R] curve has lower Jitter₂ than GSPO's", "DFPO, Sec. 6"),
        "smoother_lm": Claim("DFPO's {curve} curve has lower Jitter₂ than GSPO's", "DFPO, Sec. 6, Fig. 2"),
        "sequence_net_vs_gspo": Claim("DFPO {variant}'s sequence-net residual is lower than GSPO's", "s"),
    }
    assert _instances(before) == {("smoother_toy", "smoother_lm")}
    merged = {k: v for k, v in before.items() if k != "smoother_toy"}
    assert _instances(merged) == set()


def _lm_measures(*extra) -> set[str]:
    return set(lm.MEASURE_KEYS) | {m.key for group in extra for m in group}


def test_every_prediction_measure_and_arm_exist_in_its_study() -> None:
    for name, study in STUDIES.items():
        arms = {a.name for a in study.arms}
        for p in study.predictions:
            assert p.measure in study.measures, (name, p.claim, p.measure)
            assert {p.arm, p.baseline} <= arms, (name, p.claim, p.arm, p.baseline)
    chosen = {f"{a.name}@{what}" for a in frontier.ARMS for what in ("best", "tax", "tax20")}
    for p in frontier.PREDICTIONS:
        assert p.measure in frontier.MEASURES and {p.arm, p.baseline} <= chosen, p.claim
    for group, arms, measures in (
        (lm_studies.MAIN_PREDICTIONS, set(lm_studies.MAIN_ARMS), _lm_measures()),
        (
            lm_studies.ABLATION_PREDICTIONS,
            {*lm_studies.ABLATION_ARMS, lm_studies.ABLATION_BASELINE},
            _lm_measures(),
        ),
        (lm_power.PREDICTIONS, set(lm_power.ARMS), _lm_measures(lm_power.START_MEASURES)),
        (lm_power.BIG_PREDICTIONS, set(lm_power.BIG_ARMS), _lm_measures(lm_power.START_MEASURES)),
        (
            lm_residual.PREDICTIONS,
            set(lm_residual.ARMS),
            _lm_measures(lm_power.START_MEASURES, lm_residual.DRIFT_MEASURES),
        ),
    ):
        for p in group:
            assert p.measure in measures and {p.arm, p.baseline} <= arms, (p.claim, p.measure, p.arm)


def test_the_toy_and_the_language_model_share_a_claim_in_their_own_words() -> None:
    # one entry, two bindings: the same source, the sentence filled in with each study's words
    toy = STUDIES["toy_main"].predictions
    (t,) = [
        p
        for p in toy
        if p.measure == "steps_to_threshold" and (p.arm, p.baseline) == ("dfpo_min_replace", "gspo")
    ]
    (m,) = [p for p in lm_studies.MAIN_PREDICTIONS if p.measure == "steps_to_threshold" and p.baseline == "gspo"
            and p.arm == "dfpo_min_replace"]  # fmt: skip
    assert t.claim == "DFPO Min-Replace reaches E[R] ≥ 0.9 in fewer steps than GSPO"
    assert m.claim == "DFPO Min-Replace reaches the reward threshold in fewer steps than GSPO"
    assert t.source == m.source == CLAIMS["faster_than_gspo"].source


def test_a_binding_names_what_is_missing() -> None:
    kw = {"measure": "m", "arm": "a", "baseline": "b", "direction": "lower"}
    p = predict("faster_than_gspo", variant="X", threshold="E[R] ≥ 0.5", **kw)
    assert p.claim == "DFPO X reaches E[R] ≥ 0.5 in fewer steps than GSPO" and p.by_construction is None
    assert (p.source, p.measure, p.arm, p.baseline, p.direction) == (
        CLAIMS["faster_than_gspo"].source,
        "m",
        "a",
        "b",
        "lower",
    )
    with pytest.raises(ValueError, match=r"needs the words \['threshold', 'variant'\], got \['variant'\]"):
        predict("faster_than_gspo", variant="X", **kw)
    with pytest.raises(ValueError, match=r"needs the words \[\], got \['g'\]"):
        predict("asym_vs_gspo", g="2", **kw)
    with pytest.raises(KeyError, match="no claim 'nope'"):
        predict("nope", **kw)
    with pytest.raises(TypeError):  # by keyword only: no positional rows
        Prediction("c", "s", "m", "a", "b", "lower")  # type: ignore[misc]
