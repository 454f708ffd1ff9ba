"""Synthetic tasks (deterministic, disjoint splits, correct answers) and JSONL/Parquet task files."""

from __future__ import annotations

import json
import re

import pytest

from scaledrun.tasks import TASKS, format_prompt, load_task, number_to_words


@pytest.mark.parametrize("name", list(TASKS))
def test_deterministic_for_a_seed_and_disjoint_splits(name):
    a = load_task(name, "train", 300, seed=3)
    assert a == load_task(name, "train", 300, seed=3)
    assert a != load_task(name, "train", 300, seed=4)
    assert len(set(a)) == 300
    train = {t.prompt for s in range(3) for t in load_task(name, "train", 300, seed=s)}
    held = {t.prompt for s in range(3) for t in load_task(name, "eval", 100, seed=s)}
    assert not train & held


def _operands(prompt: str) -> tuple[int, str, int]:
    a, op, b = re.search(r"(\d+) ([+-]) (\d+)", prompt).groups()
    return int(a), op, int(b)


def test_arithmetic_answers_are_the_integer_results():
    tasks = load_task("arithmetic", "train", 200, seed=0, digits=3, ops="+-")
    ops = set()
    for t in tasks:
        a, op, b = _operands(t.prompt)
        ops.add(op)
        assert 100 <= a <= 999 and 100 <= b <= 999
        assert t.answer == str(a + b if op == "+" else a - b) == t.solution
        assert int(t.answer) >= 0
    assert ops == {"+", "-"}


def test_number_to_words_hand_worked():
    assert number_to_words(7) == "seven"
    assert number_to_words(40) == "forty"
    assert number_to_words(45) == "forty-five"
    assert number_to_words(305) == "three hundred five"
    assert number_to_words(1999) == "one thousand nine hundred ninety-nine"


def test_arithmetic_words_spells_the_operands():
    words_to_int = {number_to_words(i): i for i in range(100)}
    for t in load_task("arithmetic_words", "eval", 50, seed=1, ops="+-"):
        m = re.fullmatch(r"What is (.+) (plus|minus) (.+)\?", t.prompt)
        a, b = words_to_int[m.group(1)], words_to_int[m.group(3)]
        assert t.answer == str(a + b if m.group(2) == "plus" else a - b)
        assert not re.search(r"\d", t.prompt)


def test_template_solution_states_the_answer_twice():
    for t in load_task("template", "train", 20, seed=0, ops="+"):
        a, _, b = _operands(t.prompt)
        assert t.answer == str(a + b)
        assert (
            t.solution
            == f"Let me compute {a} + {b}. The sum of {a} and {b} is {a + b}. The answer is {a + b}."
        )


def test_too_many_problems_for_the_space_is_an_error():
    # 1-digit addition has 100 problems, about 80 in the train split
    with pytest.raises(ValueError, match="fewer than"):
        load_task("arithmetic", "train", 150, digits=1, ops="+")
    with pytest.raises(ValueError, match="valid: arithmetic"):
        load_task("chess", "train", 5)
    with pytest.raises(ValueError, match="split"):
        load_task("arithmetic", "test", 5)


def _rows(n: int) -> list[dict]:
    return [{"question": f"q{i}?", "gold": i} for i in range(n)]


def test_jsonl_file_split_by_hash_and_fields(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _rows(50)) + "\n")
    train = load_task(str(path), "train", None, seed=0, prompt_field="question", answer_field="gold")
    held = load_task(str(path), "eval", None, seed=0, prompt_field="question", answer_field="gold")
    assert len(train) + len(held) == 50 and not {t.prompt for t in train} & {t.prompt for t in held}
    assert all(t.answer == t.prompt[1:-1] for t in train + held)  # answers converted to text
    assert load_task(
        str(path), "train", 5, seed=1, prompt_field="question", answer_field="gold"
    ) == load_task(str(path), "train", 5, seed=1, prompt_field="question", answer_field="gold")
    with pytest.raises(ValueError, match="no field 'prompt'") as info:
        load_task(str(path), "train", None)
    assert str(path) in str(info.value)


def test_parquet_file_with_split_placeholder(tmp_path):
    import datasets

    for split, n in (("train", 12), ("eval", 4)):
        datasets.Dataset.from_list(
            [{"prompt": f"{split}{i}", "answer": str(i)} for i in range(n)]
        ).to_parquet(str(tmp_path / f"{split}.parquet"))
    pattern = str(tmp_path / "{split}.parquet")
    assert len(load_task(pattern, "train", None)) == 12
    held = load_task(pattern, "eval", None)
    assert sorted(t.prompt for t in held) == ["eval0", "eval1", "eval2", "eval3"]
    with pytest.raises(ValueError, match="fewer than"):
        load_task(pattern, "eval", 5)


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="is empty") as info:
        load_task(str(empty), "train", None)
    assert str(empty) in str(info.value)
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"broken\.jsonl"):
        load_task(str(broken), "train", None)
    with pytest.raises(FileNotFoundError, match=r"missing\.jsonl"):
        load_task(str(tmp_path / "missing.jsonl"), "train", None)


def test_format_prompt_uses_the_chat_template():
    class Tok:
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert tokenize is False and add_generation_prompt is True
            return "|".join(m["role"] + ":" + m["content"] for m in messages) + "|assistant:"

    assert format_prompt(Tok(), "What is 1 + 1?") == "user:What is 1 + 1?|assistant:"

    class NoTemplate:
        chat_template = None

    with pytest.raises(ValueError, match="chat_template"):
        format_prompt(NoTemplate(), "hi")
