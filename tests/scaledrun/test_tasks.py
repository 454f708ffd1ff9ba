"""Synthetic tasks (deterministic, disjoint splits, correct answers); datasets (files, save_to_disk folders,
folders of data files; splits, dotted columns, messages-format prompts, extra columns); chat formatting;
a save_to_disk dataset through the trainer."""

from __future__ import annotations

import json
import re
import zlib

import pytest

import scaledrun.train as tr
from scaledrun.config import RunConfig
from scaledrun.rewards import REWARDS, register_reward
from scaledrun.runlog import read_metrics
from scaledrun.tasks import (
    SYNTHETIC_DEFAULT_N,
    TASKS,
    Task,
    drop_overlong,
    format_prompt,
    held_out,
    load_task,
    number_to_words,
    reward_columns,
    source_kind,
    source_problems,
    tasks_from_rows,
)
from scaledrun.tiny import CHAT_TEMPLATE, train_tokenizer

from ..conftest import SEED


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


def test_synthetic_tasks_draw_64_when_n_is_none():
    assert SYNTHETIC_DEFAULT_N == 64
    assert load_task("arithmetic", "train", None, seed=2) == load_task("arithmetic", "train", 64, seed=2)


# --------------------------------------------------------------------------------------------
# datasets

QG = {"prompt_field": "question", "answer_field": "gold"}


def _write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _rows(n: int, start: int = 0) -> list[dict]:
    return [{"question": f"q{i}?", "gold": i, "level": i % 3} for i in range(start, start + n)]


def test_a_single_file_is_all_train_and_no_eval_is_held_out_silently(tmp_path):
    path = _write_jsonl(tmp_path / "data.jsonl", _rows(50))
    train = load_task(path, "train", None, seed=0, **QG)
    assert sorted(t.prompt for t in train) == sorted(f"q{i}?" for i in range(50))  # every row
    assert all(t.answer == t.prompt[1:-1] == t.solution for t in train)  # numbers become text
    assert all(t.extra == {"level": int(t.answer) % 3} for t in train)  # the other columns travel along
    with pytest.raises(ValueError, match="no eval split"):
        load_task(path, "eval", None, **QG)
    five = load_task(path, "train", 5, seed=1, **QG)
    assert five == load_task(path, "train", 5, seed=1, **QG) != load_task(path, "train", 5, seed=2, **QG)
    with pytest.raises(ValueError, match="fewer than the 51 asked"):
        load_task(path, "train", 51, **QG)
    with pytest.raises(ValueError, match="no column 'prompt'") as info:
        load_task(path, "train", None)
    assert path in str(info.value) and "question, gold, level" in str(info.value)


def test_eval_fraction_holds_out_by_a_hash_of_the_prompt(tmp_path):
    path = _write_jsonl(tmp_path / "data.jsonl", _rows(200) + _rows(10))  # q0?..q9? twice
    expected = {f"q{i}?" for i in range(200) if zlib.crc32(f"q{i}?".encode()) < 0.25 * 2**32}
    assert 0 < len(expected) < 200
    for seed in (0, 1):
        train = load_task(path, "train", None, seed=seed, eval_fraction=0.25, **QG)
        held = load_task(path, "eval", None, seed=seed, eval_fraction=0.25, **QG)
        assert {t.prompt for t in held} == expected  # the same rows for every seed
        assert {t.prompt for t in train} == {f"q{i}?" for i in range(200)} - expected
        assert len(train) + len(held) == 210  # a duplicated prompt stays on one side, both copies kept
    assert held_out("q7?", 0.25) == ("q7?" in expected)


def test_eval_split_as_a_file(tmp_path):
    train = _write_jsonl(tmp_path / "train.jsonl", _rows(6))
    test = _write_jsonl(tmp_path / "test.jsonl", _rows(3, start=100))
    assert sorted(t.prompt for t in load_task(train, "eval", None, eval_split=test, **QG)) == [
        "q100?", "q101?", "q102?",
    ]  # fmt: skip
    assert len(load_task(train, "train", None, eval_split=test, **QG)) == 6
    (field, why), *_ = source_problems(train, eval_split="test")
    assert field == "eval_split" and "file path" in why and "eval_fraction" in why
    assert source_problems(train, eval_split=str(tmp_path / "nope.jsonl")) == [
        ("eval_split", f"the file {tmp_path / 'nope.jsonl'} does not exist")
    ]
    assert [f for f, _ in source_problems(train, train_split="dev")] == ["train_split"]
    assert [f for f, _ in source_problems(train, eval_split=test, eval_fraction=0.1)] == ["eval_fraction"]


def test_parquet_split_placeholder_needs_an_explicit_eval_split(tmp_path):
    import datasets

    for split, n in (("train", 12), ("eval", 4)):
        datasets.Dataset.from_list(
            [{"prompt": f"{split}{i}", "answer": str(i)} for i in range(n)]
        ).to_parquet(str(tmp_path / f"{split}.parquet"))
    pattern = str(tmp_path / "{split}.parquet")
    assert len(load_task(pattern, "train", None)) == 12
    with pytest.raises(ValueError, match="no eval split"):
        load_task(pattern, "eval", None)  # an `eval` file is not picked up unless named
    held = load_task(pattern, "eval", None, eval_split="eval")
    assert sorted(t.prompt for t in held) == ["eval0", "eval1", "eval2", "eval3"]
    with pytest.raises(ValueError, match="fewer than"):
        load_task(pattern, "eval", 5, eval_split="eval")
    assert source_problems(pattern, eval_split="test") == [
        ("eval_split", f"the task file {tmp_path / 'test.parquet'} does not exist")
    ]
    assert source_problems(pattern, eval_split="train") == [
        ("eval_split", "is the train split: the eval would run on training prompts")
    ]


def _verl_rows(n: int, start: int = 0) -> list[dict]:
    """Rows as verl's parquet files hold them: messages-format prompts, the answer nested."""
    return [
        {
            "data_source": "arith",
            "prompt": [
                {"role": "system", "content": "Answer with a number."},
                {"role": "user", "content": f"What is {i} + 1?"},
            ],
            "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
            "extra_info": {"index": i},
        }
        for i in range(start, start + n)
    ]


def test_save_to_disk_dataset_dict_with_messages_and_nested_answers(tmp_path):
    import datasets

    src = str(tmp_path / "ds")
    datasets.DatasetDict(
        train=datasets.Dataset.from_list(_verl_rows(6)), test=datasets.Dataset.from_list(_verl_rows(2, 50))
    ).save_to_disk(src)
    assert source_kind(src) == "disk"
    answer = {"answer_field": "reward_model.ground_truth"}
    train = sorted(load_task(src, "train", None, **answer), key=lambda t: int(t.answer))
    assert [t.answer for t in train] == ["1", "2", "3", "4", "5", "6"]
    assert train[0].prompt == (
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "What is 0 + 1?"},
    )
    assert train[0].extra == {
        "data_source": "arith", "reward_model": {"style": "rule", "ground_truth": "1"}, "extra_info": {"index": 0},
    }  # fmt: skip
    assert sorted(t.answer for t in load_task(src, "eval", None, eval_split="test", **answer)) == ["51", "52"]
    assert source_problems(src, eval_split="validation") == [
        ("eval_split", f"{src} has no split 'validation'; its splits: train, test")
    ]
    assert [f for f, _ in source_problems(src, train_split="dev")] == ["train_split"]
    assert [f for f, _ in source_problems(src, dataset_config="main")] == ["dataset_config"]
    # a column whose own name holds the dot (what Dataset.flatten writes) is found too
    flat = datasets.Dataset.from_list(_verl_rows(3)).flatten()
    assert "reward_model.ground_truth" in flat.column_names
    assert [t.answer for t in tasks_from_rows(flat, answer_field="reward_model.ground_truth")] == [
        "1",
        "2",
        "3",
    ]


def test_a_saved_single_dataset_is_one_split(tmp_path):
    import datasets

    src = str(tmp_path / "one")
    datasets.Dataset.from_list(_verl_rows(4)).save_to_disk(src)
    assert len(load_task(src, "train", None, answer_field="reward_model.ground_truth")) == 4
    assert "eval_fraction" in dict(source_problems(src, eval_split="test"))["eval_split"]
    assert [f for f, _ in source_problems(src, train_split="dev")] == ["train_split"]


def test_a_folder_of_data_files_reads_splits_by_file_name(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    _write_jsonl(folder / "train.jsonl", _rows(5))
    _write_jsonl(folder / "test.jsonl", _rows(2, start=10))
    assert source_kind(str(folder)) == "folder"
    assert sorted(t.prompt for t in load_task(str(folder), "eval", None, eval_split="test", **QG)) == [
        "q10?", "q11?",
    ]  # fmt: skip
    assert len(load_task(str(folder), "train", None, **QG)) == 5


def test_source_kinds_and_names_that_are_nothing(tmp_path):
    assert source_kind("arithmetic") == "synthetic"
    assert source_kind("openai/gsm8k") == "hub"  # a hub name is not looked up here
    assert source_problems("openai/gsm8k", eval_split="test", dataset_config="main") == []
    for name in ("chess", "./missing", "artifacts/data", str(tmp_path / "nope"), "a/b/c"):
        assert source_kind(name) == "unknown"
        assert [f for f, _ in source_problems(name)] == ["task"]
    assert "valid: arithmetic" in source_problems("chess")[0][1]
    (tmp_path / "data.csv").write_text("prompt,answer\n")
    assert "unsupported file type '.csv'" in source_problems(str(tmp_path / "data.csv"))[0][1]
    assert [f for f, _ in source_problems("arithmetic", eval_split="test")] == ["eval_split"]
    assert [f for f, _ in source_problems("arithmetic", eval_fraction=0.1)] == ["eval_fraction"]
    assert [f for f, _ in source_problems("arithmetic", train_split="dev")] == ["train_split"]


@pytest.mark.parametrize(
    ("row", "answer_field", "match"),
    [
        ({"prompt": [{"role": "user"}], "answer": "1"}, "answer", "string 'role' and 'content'"),
        ({"prompt": [{"role": "user", "content": ["a"]}], "answer": "1"}, "answer", "'role' and 'content'"),
        ({"prompt": "  ", "answer": "1"}, "answer", "the prompt is empty"),
        ({"prompt": 7, "answer": "1"}, "answer", "non-empty string or a list"),
        ({"prompt": "hi", "answer": None}, "answer", r"answer \('answer'\) is empty"),
        ({"prompt": "hi", "answer": [1, 2]}, "answer", "must be text or a number"),
        ({"prompt": "hi", "answer": {"x": 1}}, "answer.y", "no key 'y'"),
    ],
)
def test_bad_rows_name_the_row(row, answer_field, match):
    first = {"prompt": "ok", "answer": {"y": 0} if "." in answer_field else "0"}
    with pytest.raises(ValueError, match=match) as info:
        tasks_from_rows([first, row], answer_field=answer_field, where="my data")
    assert "my data, row 1" in str(info.value)


def test_extra_columns_skip_the_reward_arguments_and_reward_columns_align():
    [task] = tasks_from_rows([{"prompt": "p", "answer": "1", "answers": ["1"], "completions": 0, "level": 2}])
    assert task.extra == {"level": 2}  # `answers`/`completions` would clash with the reward's arguments
    a, b = Task("p", "1", "1", extra={"level": 1, "src": "x"}), Task("q", "2", "2", extra={"level": 2})
    assert reward_columns([a, b, a]) == {"level": [1, 2, 1], "src": ["x", None, "x"]}
    assert reward_columns([Task("p", "1", "1")]) == {}


# --------------------------------------------------------------------------------------------
# chat formatting (a real tokenizer: the tiny model's, trained here in milliseconds)

USER = "<|im_start|>user\nWhat is 1 + 1?<|im_end|>\n"
SYSTEM = "<|im_start|>system\nBe brief.<|im_end|>\n"
ASSISTANT = "<|im_start|>assistant\n"
#: The tiny template plus Qwen3's ``enable_thinking`` switch (its generation prompt when it is false).
THINKING_TEMPLATE = CHAT_TEMPLATE + (
    "{% if add_generation_prompt and enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\n\n</think>\n\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(["What is 1 + 1?", "Be brief.", "system", "user", "assistant"], vocab_size=300)


def test_format_prompt_strings_messages_and_system_prompt(tok):
    assert format_prompt(tok, "What is 1 + 1?") == USER + ASSISTANT
    messages = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1 + 1?"})
    assert format_prompt(tok, messages) == SYSTEM + USER + ASSISTANT
    assert format_prompt(tok, "What is 1 + 1?", system_prompt="Be brief.") == SYSTEM + USER + ASSISTANT
    assert format_prompt(tok, messages[1:], system_prompt="Be brief.") == SYSTEM + USER + ASSISTANT
    with pytest.raises(ValueError, match="system_prompt"):
        format_prompt(tok, messages, system_prompt="Other.")
    with pytest.raises(ValueError, match="may not set tokenize"):
        format_prompt(tok, "hi", chat_template_kwargs={"tokenize": True})


def test_chat_template_kwargs_reach_the_template():
    tok = train_tokenizer(["What is 1 + 1?"], vocab_size=300)
    tok.chat_template = THINKING_TEMPLATE
    prompt = "What is 1 + 1?"
    assert format_prompt(tok, prompt) == USER + ASSISTANT
    no_think = format_prompt(tok, prompt, chat_template_kwargs={"enable_thinking": False})
    assert no_think == USER + ASSISTANT + "<think>\n\n</think>\n\n"
    assert format_prompt(tok, prompt, chat_template_kwargs={"enable_thinking": True}) == USER + ASSISTANT
    tok.chat_template = None
    with pytest.raises(ValueError, match="chat_template"):
        format_prompt(tok, "hi")


def test_format_prompt_on_the_qwen_tokenizer(qwen_tiny_model):
    """Qwen3's own template (``qwen_tiny_model``: Qwen's tokenizer): system prompt and enable_thinking."""
    from transformers import AutoTokenizer

    qwen = AutoTokenizer.from_pretrained(qwen_tiny_model)
    assert format_prompt(qwen, "What is 1 + 1?") == USER + ASSISTANT
    got = format_prompt(qwen, "What is 1 + 1?", "Be brief.", {"enable_thinking": False})
    assert got == SYSTEM + USER + ASSISTANT + "<think>\n\n</think>\n\n"
    assert (
        format_prompt(qwen, "What is 1 + 1?", chat_template_kwargs={"enable_thinking": True})
        == USER + ASSISTANT
    )


def test_qwen3_template_drops_the_reasoning_of_earlier_turns(qwen_tiny_model):
    """Qwen3's template (as its model card says: the history keeps only each answer, not its thinking): an
    earlier assistant turn's ``<think>`` block is dropped, with or without ``enable_thinking``; the prompt
    ends with the generation prompt."""
    from transformers import AutoTokenizer

    qwen = AutoTokenizer.from_pretrained(qwen_tiny_model)
    messages = [
        {"role": "user", "content": "What is 1 + 1?"},
        {"role": "assistant", "content": "<think>\nOne and one.\n</think>\n\n2"},
        {"role": "user", "content": "And 2 + 2?"},
    ]
    history = USER + "<|im_start|>assistant\n2<|im_end|>\n<|im_start|>user\nAnd 2 + 2?<|im_end|>\n"
    assert format_prompt(qwen, messages) == history + ASSISTANT
    no_think = format_prompt(qwen, messages, "Be brief.", {"enable_thinking": False})
    assert no_think == SYSTEM + history + ASSISTANT + "<think>\n\n</think>\n\n"
    # the prompt's tokens: <|im_start|> 151644, "assistant" 77091, "\n" 198, <think> 151667, "\n\n" 271, </think> 151668
    ids = qwen(no_think, add_special_tokens=False)["input_ids"]
    assert ids[-7:] == [151644, 77091, 198, 151667, 271, 151668, 271]


def test_drop_overlong_keeps_prompts_up_to_the_limit(tok):
    short, long = Task("What is 1 + 1?", "2", "2"), Task(" ".join(["What"] * 200), "0", "0")
    # the short prompt formats to 64 characters (at most 64 tokens), the long one to 200 words (≥ 200 tokens)
    kept, dropped = drop_overlong([long, short, long], tok, 100)
    assert kept == [short] and dropped == 2
    n = len(tok(format_prompt(tok, short.prompt), add_special_tokens=False)["input_ids"])
    assert drop_overlong([short], tok, n) == ([short], 0)  # at the limit: kept
    assert drop_overlong([short], tok, n - 1) == ([], 1)


# --------------------------------------------------------------------------------------------
# through the trainer

COLUMN_REWARD = "test_column_match"

if COLUMN_REWARD not in REWARDS:

    @register_reward(COLUMN_REWARD)
    def _column_match(prompts, completions, answers, extra_info, data_source):
        """1.0 where a row came with its own columns: the answer is its ``extra_info.index`` + 1, the
        prompt asks about that index under the dataset's system message, and no long prompt got in."""
        return [
            float(
                a == str(e["index"] + 1) and f"What is {e['index']} + 1?" in p and "Answer with a number." in p
                and "LONG" not in p and d == "arith"
            )
            for p, a, e, d in zip(prompts, answers, extra_info, data_source, strict=True)
        ]  # fmt: skip


def test_a_saved_dataset_through_the_trainer(tiny_model, tmp_path, capsys):
    """save_to_disk DatasetDict, messages-format prompts, nested answers, an explicit eval split, a long
    prompt dropped by max_prompt_length, every row by default; the reward reads the row's own columns
    (it is 1 only when they line up), weighted by 2."""
    import datasets

    long_row = _verl_rows(1, 99)[0]
    long_row["prompt"][1]["content"] = "LONG " * 300  # ≥ 300 tokens; the others format to < 120 characters
    src = str(tmp_path / "ds")
    datasets.DatasetDict(
        train=datasets.Dataset.from_list([*_verl_rows(4), long_row]),
        test=datasets.Dataset.from_list(_verl_rows(3, 50)),
    ).save_to_disk(src)
    cfg = RunConfig(
        model=str(tiny_model), output_dir=str(tmp_path / "run"), task=src,
        answer_field="reward_model.ground_truth", eval_split="test", max_prompt_length=120,
        reward=COLUMN_REWARD, reward_weights=[2.0], truncation="keep", steps=2, group_size=2,
        prompts_per_step=2, max_new_tokens=4, eval_every=2, eval_k=1, save_every=0, warmup_ratio=0.0, seed=SEED,
    )  # fmt: skip
    assert cfg.num_train is None
    tr.train(cfg)
    out = capsys.readouterr().out
    assert "train: dropped 1 of 5 prompts over 120 tokens" in out
    assert "train: 4 prompts from" in out and "eval: 3 prompts from" in out
    rows = read_metrics(cfg.output_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["reward/mean"] for r in rows] == [2.0, 2.0]
    assert [r["reward_failures"] for r in rows] == [0.0, 0.0]
    assert rows[-1]["eval/avg@1"] == 2.0 and rows[-1]["eval/greedy_accuracy"] == 1.0
