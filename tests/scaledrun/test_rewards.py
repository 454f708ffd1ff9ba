"""Reward registry: exact match, math-verify, and failures that never crash the batch."""

from __future__ import annotations

import pytest

from scaledrun.rewards import (
    REWARDS,
    compute_rewards,
    extract_answer,
    get_reward,
    last_boxed,
    register_reward,
)


def test_extract_answer_hand_worked():
    assert extract_answer("82") == "82"
    assert extract_answer("I think 12, no, 82") == "82"
    assert extract_answer("The sum of 37 and 45 is 81. The answer is 82.") == "82"
    assert extract_answer("The answer is 82. Later I said 99") == "82"
    assert extract_answer("The answer is -7") == "-7"
    assert extract_answer("1,024") == "1024"
    assert extract_answer("no number") is None


def test_exact_match_compares_integers():
    completions = ["82", " 82 ", "The answer is 82.", "81", "", "The answer is 8.", "082"]
    expected = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    got = REWARDS["exact_match"]([""] * 7, completions, ["82"] * 7)
    assert got == expected


def test_last_boxed_matches_nested_braces():
    assert last_boxed(r"so \boxed{1} then \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"
    assert last_boxed("no box") is None
    assert last_boxed(r"\boxed{\frac{1}{2}") is None  # unclosed


def test_math_verify_equivalent_and_wrong_pairs():
    completions = [
        r"The result is \boxed{0.5}.",
        r"\boxed{\frac{2}{4}}",
        r"\boxed{x + 1}",
        r"\boxed{\sqrt{4}}",
        r"\boxed{0.33}",
        r"\boxed{3}",
        "0.5 without a box",
    ]
    answers = [r"\frac{1}{2}", "0.5", "1 + x", "2", r"\frac{1}{3}", "2", "0.5"]
    assert REWARDS["math_verify"]([""] * 7, completions, answers) == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


def test_a_raising_sample_gets_the_failure_reward_and_is_counted():
    @register_reward("_test_fragile")
    def fragile(prompts, completions, answers):
        out = []
        for c in completions:
            if c == "boom":
                raise RuntimeError("cannot score")
            out.append(1.0 if c == "ok" else 0.0)
        return out

    try:
        rewards, failures = compute_rewards(
            "_test_fragile", ["p"] * 4, ["ok", "boom", "no", "ok"], ["a"] * 4, -1.0
        )
        assert (rewards, failures) == ([1.0, -1.0, 0.0, 1.0], 1)
        assert compute_rewards("_test_fragile", ["p"] * 2, ["ok", "no"], ["a"] * 2, -1.0) == ([1.0, 0.0], 0)
    finally:
        del REWARDS["_test_fragile"]


def test_non_finite_values_count_as_failures():
    @register_reward("_test_nan")
    def nan_reward(prompts, completions, answers):
        return [float("nan") if c == "x" else 0.5 for c in completions]

    try:
        assert compute_rewards("_test_nan", ["p"] * 3, ["a", "x", "b"], ["a"] * 3, 0.0) == (
            [0.5, 0.0, 0.5],
            1,
        )
    finally:
        del REWARDS["_test_nan"]


def test_unknown_reward_and_length_mismatch():
    with pytest.raises(ValueError, match="valid: exact_match, math_verify"):
        get_reward("bleu")
    with pytest.raises(ValueError, match="same length"):
        compute_rewards("exact_match", ["p"], ["a", "b"], ["1", "2"])
    with pytest.raises(ValueError, match="failure_reward"):
        compute_rewards("exact_match", ["p"], ["a"], ["1"], float("nan"))


# --------------------------------------------------------------------------------------------
# several rewards, weights, dataset columns


@pytest.fixture
def registered():
    """Register test rewards for one test, then remove them."""
    names: list[str] = []

    def add(name, fn):
        register_reward(name)(fn)
        names.append(name)

    yield add
    for name in names:
        del REWARDS[name]


def test_weighted_sum_of_several_rewards(registered):
    registered("_test_len", lambda prompts, completions, answers: [float(len(c)) for c in completions])
    completions = ["82", "The answer is 81.", "x"]
    answers = ["82", "81", "5"]
    # exact_match: 1, 1, 0; length: 2, 17, 1
    for spec in ("exact_match,_test_len", " exact_match , _test_len ", ["exact_match", "_test_len"]):
        rewards, failures = compute_rewards(spec, ["p"] * 3, completions, answers, weights=[1.0, 0.5])
        assert (rewards, failures) == ([1.0 + 1.0, 1.0 + 8.5, 0.0 + 0.5], 0)
    # no weights: 1.0 each (TRL's default)
    assert compute_rewards("exact_match,_test_len", ["p"] * 3, completions, answers)[0] == [3.0, 18.0, 1.0]
    # one reward and no weights: exactly the function's values (the single-reward path is unchanged)
    assert compute_rewards("exact_match", ["p"] * 3, completions, answers) == ([1.0, 1.0, 0.0], 0)
    assert compute_rewards("exact_match", ["p"] * 3, completions, answers, weights=[-2.0])[0] == [
        -2.0,
        -2.0,
        0.0,
    ]


def test_reward_names_and_weights_are_checked():
    with pytest.raises(ValueError, match="unknown reward 'bleu'; valid: exact_match, math_verify"):
        compute_rewards("exact_match,bleu", ["p"], ["1"], ["1"])
    with pytest.raises(ValueError, match="one or more names"):
        compute_rewards("exact_match,", ["p"], ["1"], ["1"])
    with pytest.raises(ValueError, match="2 reward weight"):
        compute_rewards("exact_match", ["p"], ["1"], ["1"], weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        compute_rewards("exact_match,math_verify", ["p"], ["1"], ["1"], weights=[1.0, float("inf")])
    with pytest.raises(ValueError, match="column 'level' has 1 values for 2 rows"):
        compute_rewards("exact_match", ["p"] * 2, ["1", "2"], ["1", "2"], columns={"level": [1]})


def test_columns_reach_the_functions_that_take_them(registered):
    seen: dict[str, dict] = {}

    def takes_all(prompts, completions, answers, **kwargs):
        seen["all"] = kwargs
        return [float(lv) for lv in kwargs["level"]]

    def takes_level(prompts, completions, answers, level):
        seen["named"] = {"level": level}
        return [10.0 * lv for lv in level]

    registered("_test_all", takes_all)
    registered("_test_level", takes_level)
    columns = {"level": [1, 2], "src": ["a", "b"]}
    rewards, failures = compute_rewards(
        "_test_all,_test_level,exact_match", ["p", "q"], ["7", "8"], ["7", "0"], columns=columns
    )
    assert (rewards, failures) == ([1.0 + 10.0 + 1.0, 2.0 + 20.0 + 0.0], 0)
    assert seen == {"all": columns, "named": {"level": [1, 2]}}  # exact_match, taking none, got none


def test_a_failure_costs_only_that_functions_term(registered):
    def fragile(prompts, completions, answers, level):
        if "boom" in completions:
            raise RuntimeError("cannot score")
        return [float(lv) for lv in level]  # alone, each sample gets its own column value

    registered("_test_fragile_level", fragile)
    rewards, failures = compute_rewards(
        "exact_match,_test_fragile_level", ["p"] * 3, ["1", "boom", "3"], ["1", "2", "0"], -1.0,
        weights=[1.0, 2.0], columns={"level": [5, 6, 7]},
    )  # fmt: skip
    assert (rewards, failures) == ([1.0 + 10.0, 0.0 - 2.0, 0.0 + 14.0], 1)
