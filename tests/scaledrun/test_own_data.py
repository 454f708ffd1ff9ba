"""Your own data and reward (docs/trainer.md, "Train on your own data"): each recipe on a small local file
in that dataset's format, run through ``scaledrun.train.main`` on an untrained tiny model, and every data
or config mistake refused before anything is created.

The runs' rewards are recomputed from the completions each step dumped (``--debug_dir``), by a plain
re-implementation of the reward, and compared with the batch's rewards and the logged
``rewards/<name>/mean``; the built-in rewards' scoring is checked on hand-worked completions.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pandas as pd
import pytest
import torch

import scaledrun.train as tr
from scaledrun.config import RunConfig
from scaledrun.rewards import REWARDS, answer_line, exact_match, load_reward_file, math_verify
from scaledrun.runlog import read_metrics
from scaledrun.tiny import build_tiny

from ..conftest import SEED

# its runs sample from a model: the assertions hold for any samples, and `make test-machines` checks so
pytestmark = pytest.mark.sampling

DEFAULT_YAML = str(Path(__file__).resolve().parents[2] / "scaledrun" / "configs" / "default.yaml")
#: DAPO-Math-17k's prompt around each problem (its parquet's ``prompt[0]["content"]``).
DAPO_HEAD = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_TAIL = '\n\nRemember to put your answer on its own line after "Answer:".'
BOXED_SYSTEM = "Reason step by step and put the final answer in \\boxed{}."
#: The reward file of the verl recipe: the completion's length in characters plus the gold / 100, so
#: every row's value is known from its text and its gold answer.
REWARD_FILE = """
def score(prompts, completions, answers, extra_info=None):
    return [len(c) + float(a) / 100 for c, a in zip(completions, answers)]
"""


def score_by_hand(completion: str, answer: str) -> float:
    return len(completion) + int(answer) / 100


@pytest.fixture(scope="module")
def raw_model(tmp_path_factory):
    """An untrained tiny model (no warm start: these tests check the plumbing of data and rewards)."""
    return build_tiny(tmp_path_factory.mktemp("own_data") / "model", "arithmetic", seed=SEED)


def run_args(model, out, *extra, steps=2):
    return [
        "--config", DEFAULT_YAML, "--model", str(model), "--output_dir", str(out), "--steps", str(steps),
        "--group_size", "4", "--prompts_per_step", "2", "--max_new_tokens", "8", "--eval_every", "0",
        "--save_every", "0", "--seed", str(SEED), *map(str, extra),
    ]  # fmt: skip


def dumped_batches(debug_dir, steps, first=1):
    return [
        torch.load(Path(debug_dir) / "rank0" / f"step_{s:06d}_rollouts.pt", weights_only=False)
        for s in range(first, first + steps)
    ]


# --------------------------------------------------------------------------------------------
# the datasets' formats


def verl_rows(n):
    """verl's parquet layout: chat-format ``prompt``, ``reward_model.ground_truth``, ``extra_info``."""
    return [
        {
            "data_source": "toy",
            "prompt": [{"role": "user", "content": f"What is {10 + i} + {20 + i}?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(30 + 2 * i)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(n)
    ]


def gsm8k_rows(n, first=0):
    """openai/gsm8k (config main): ``question``, and ``answer`` = worked solution + ``#### N``."""
    return [
        {
            "question": f"Tom has {i} apples and buys {i + 3} more. How many apples does he have?",
            "answer": f"Tom has {i} + {i + 3} = <<{i}+{i + 3}={2 * i + 3}>>{2 * i + 3} apples.\n#### {2 * i + 3}",
        }
        for i in range(first, first + n)
    ]


def dapo_rows(n):
    """DAPO-Math-17k: verl's layout, its prompt asking for ``Answer: N``, integer ground truths."""
    return [
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": f"{DAPO_HEAD}Find {i} times {i + 1}.{DAPO_TAIL}"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": str(i * (i + 1)), "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": f"id-{i}"},
        }
        for i in range(n)
    ]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --------------------------------------------------------------------------------------------
# the built-in rewards on hand-worked completions


@pytest.mark.parametrize(
    ("completion", "gold", "reward"),
    [
        ("6 times 7 is 42.\nAnswer: 42", "42", 1.0),
        ("Answer: 41\nWait, that is wrong.\nAnswer: 42", "42", 1.0),  # the last Answer: line counts
        ("Answer: 42\nno, Answer: 41", "42", 0.0),
        ("answer:42", "42", 1.0),  # case and spacing
        ("Answer: $1,234$.", "1234", 1.0),  # $, a trailing period and thousands separators
        ("Answer: \\boxed{034}", "34", 1.0),  # two integers compare as integers
        ("Answer: 42 apples", "42", 0.0),  # the whole rest of the line is the answer
        ("Answer:\n42", "42", 0.0),  # the answer must be on the Answer: line
        ("The answer is 42.", "42", 0.0),  # no Answer: line
        ("\\boxed{42}", "42", 0.0),
        ("Answer: \\frac{1}{2}", "\\frac{1}{2}", 1.0),
        ("Answer: 18", "Half of 36 is 18.\n#### 18", 1.0),  # a GSM8K gold answer
    ],
)
def test_answer_line_hand_worked(completion, gold, reward):
    assert answer_line(["p"], [completion], [gold]) == [reward]


def test_gsm8k_gold_answers_are_read_after_the_hashes():
    gold = (
        "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"
    )
    completions = ["So 72 clips.", "So 24 clips.", "The total is \\boxed{72}.", "The total is \\boxed{24}."]
    assert exact_match(["p"] * 4, completions, [gold] * 4) == [1.0, 0.0, 1.0, 0.0]
    assert math_verify(["p"] * 4, completions, [gold] * 4) == [0.0, 0.0, 1.0, 0.0]  # no \boxed: 0


def test_reward_file_registers_the_function_and_errors_name_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text(
        "def grade(prompts, completions, answers):\n    return [2.0] * len(completions)\n"
    )
    assert load_reward_file("mine.py:grade") == "grade" and REWARDS["grade"]([""], ["x"], ["1"]) == [2.0]
    cfg = RunConfig(reward_file="mine.py:grade")  # reward left at its default: the file's function is it
    # the path is kept absolute (a resume from another folder finds the same file)
    assert (cfg.reward, cfg.reward_file) == ("grade", f"{(tmp_path / 'mine.py').resolve()}:grade")
    assert RunConfig(reward_file=cfg.reward_file).reward_file == cfg.reward_file
    assert RunConfig(reward="exact_match,grade", reward_file="mine.py:grade").reward == "exact_match,grade"
    with pytest.raises(
        ValueError, match=r"does not name `reward_file`'s function 'grade': add it \(math_verify,grade\)"
    ):
        RunConfig(reward="math_verify", reward_file="mine.py:grade")
    (tmp_path / "clash.py").write_text("def exact_match(prompts, completions, answers):\n    return [0.0]\n")
    (tmp_path / "broken.py").write_text("import not_a_module_anywhere\n")
    for spec, match in [
        ("mine.py", "expected PATH.py:FUNCTION"),
        ("mine.txt:grade", "not a .py file"),
        ("nope.py:grade", r"the file nope.py does not exist \(relative paths start at"),
        ("mine.py:grad", "defines no 'grad'; its functions: grade"),
        ("clash.py:exact_match", "the name 'exact_match' is a built-in reward's; rename the function"),
        ("broken.py:f", "importing broken.py failed: ModuleNotFoundError"),
    ]:
        with pytest.raises(ValueError, match=match):
            load_reward_file(spec)
    assert REWARDS["exact_match"] is exact_match


# --------------------------------------------------------------------------------------------
# the recipes, run


def test_verl_parquet_with_a_reward_file_and_resume(raw_model, tmp_path, monkeypatch, capsys):
    """verl's layout (chat-format prompts, nested gold answers) and a reward in a file: the batch's rewards
    and ``rewards/score/mean`` are the file's function of the dumped completions; a resume finds the file."""
    monkeypatch.chdir(tmp_path)
    pd.DataFrame(verl_rows(6)).to_parquet(tmp_path / "train.parquet")
    (tmp_path / "my_reward.py").write_text(REWARD_FILE)
    out, dbg = tmp_path / "runs" / "verl", tmp_path / "dbg"
    argv = run_args(
        raw_model, out, "--task", tmp_path / "train.parquet", "--answer_field", "reward_model.ground_truth",
        "--reward_file", "my_reward.py:score", "--num_train", "none", "--debug_dir", dbg,
    )  # fmt: skip
    tr.main(argv)
    rows = read_metrics(out)
    golds = {r["reward_model"]["ground_truth"] for r in verl_rows(6)}
    for row, batch in zip(rows, dumped_batches(dbg, 2), strict=True):
        assert set(batch.answers) <= golds  # the nested gold answers
        assert all("What is 1" in p and "<|im_start|>user" in p for p in batch.prompts)  # the messages
        by_hand = [score_by_hand(c, a) for c, a in zip(batch.completions, batch.answers, strict=True)]
        assert batch.rewards.tolist() == pytest.approx(by_hand, rel=1e-6)
        assert row["rewards/score/mean"] == pytest.approx(statistics.fmean(by_hand), rel=1e-6)
        assert row["reward/mean"] == pytest.approx(statistics.fmean(by_hand), rel=1e-6)
    saved = (out / "config.yaml").read_text()
    assert (
        "reward: score\n" in saved
        and f"reward_file: {(tmp_path / 'my_reward.py').resolve()}:score\n" in saved
    )
    # the saved config names the file by its absolute path: a resume from another folder, which holds a
    # different my_reward.py, continues the run with the run's own file
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "my_reward.py").write_text(REWARD_FILE.replace("return [", "return [123.0 + 0 * "))
    monkeypatch.chdir(other)
    dbg3 = tmp_path / "dbg3"
    cmd = ["--config", str(out / "config.yaml"), "--steps", "3", "--save_every", "0", "--resume", "true"]
    tr.main([*cmd, "--debug_dir", str(dbg3)])
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]
    (batch,) = dumped_batches(dbg3, 1, first=3)
    by_hand = [score_by_hand(c, a) for c, a in zip(batch.completions, batch.answers, strict=True)]
    assert batch.rewards.tolist() == pytest.approx(by_hand, rel=1e-6)
    # the relative name from that folder is another file: not the same experiment, refused
    with pytest.raises(SystemExit) as e:
        tr.main([*cmd, "--steps", "4", "--reward_file", "my_reward.py:score"])
    assert e.value.code == 2
    # (in this process the other file's `score` also clashes with the registered one; either names it)
    assert "reward_file" in capsys.readouterr().err


def test_gsm8k_jsonl_with_boxed_answers_and_an_eval_file(raw_model, tmp_path, capsys):
    """GSM8K's columns (``question``, ``answer`` ending in ``#### N``), a system prompt asking for
    ``\\boxed{}``, ``math_verify``; the eval log line names the eval file."""
    train = write_jsonl(tmp_path / "gsm8k_train.jsonl", gsm8k_rows(5))
    test = write_jsonl(tmp_path / "gsm8k_test.jsonl", gsm8k_rows(3, first=20))
    out, dbg = tmp_path / "gsm8k", tmp_path / "dbg"
    tr.main(run_args(
        raw_model, out, "--task", train, "--prompt_field", "question", "--answer_field", "answer",
        "--reward", "math_verify", "--system_prompt", BOXED_SYSTEM, "--eval_split", test,
        "--eval_every", "2", "--num_eval", "8", "--debug_dir", dbg,
    ))  # fmt: skip
    printed = capsys.readouterr().out
    assert f"train: 5 prompts from {train} (num_train=None)" in printed
    assert f"eval: 3 prompts from {test} (num_eval=8)" in printed
    rows = read_metrics(out)
    for row, batch in zip(rows, dumped_batches(dbg, 2), strict=True):
        assert all(p.startswith(f"<|im_start|>system\n{BOXED_SYSTEM}<|im_end|>") for p in batch.prompts)
        assert all("\n#### " in a for a in batch.answers)  # the whole GSM8K answer reaches the reward
        # 1 exactly where the completion boxes the number after ####: plain string checks
        by_hand = [
            float(f"\\boxed{{{a.rsplit('#### ', 1)[1]}}}" in c)
            for c, a in zip(batch.completions, batch.answers, strict=True)
        ]
        assert batch.rewards.tolist() == by_hand
        assert row["rewards/math_verify/mean"] == pytest.approx(statistics.fmean(by_hand))
    assert "eval/greedy_accuracy" in rows[1]


def test_dapo_math_answer_line_and_a_weighted_second_reward(raw_model, tmp_path, monkeypatch):
    """DAPO-Math's layout and ``answer_line``, weighted with a reward of an ``--import``ed module: the
    sum is Σ w·r, and each function's mean is logged beside it."""
    pd.DataFrame(dapo_rows(6)).to_parquet(tmp_path / "dapo.parquet")
    (tmp_path / "dapo_rewards.py").write_text(
        "from scaledrun.rewards import register_reward\n\n\n"
        "@register_reward('short')\n"
        "def short(prompts, completions, answers):\n"
        "    return [1.0 / (1 + len(c)) for c in completions]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out, dbg = tmp_path / "dapo", tmp_path / "dbg"
    tr.main([
        "--import", "dapo_rewards",
        *run_args(
            raw_model, out, "--task", tmp_path / "dapo.parquet", "--answer_field", "reward_model.ground_truth",
            "--reward", "answer_line,short", "--reward_weights", "1.0", "0.5", "--debug_dir", dbg,
        ),
    ])  # fmt: skip
    for row, batch in zip(read_metrics(out), dumped_batches(dbg, 2), strict=True):
        assert all(DAPO_TAIL.strip() in p for p in batch.prompts)
        right = [
            float(c.strip().endswith(f"Answer: {a}"))
            for c, a in zip(batch.completions, batch.answers, strict=True)
        ]
        short = [1.0 / (1 + len(c)) for c in batch.completions]
        assert batch.rewards.tolist() == pytest.approx(
            [r + 0.5 * s for r, s in zip(right, short, strict=True)], rel=1e-6
        )
        assert row["rewards/answer_line/mean"] == pytest.approx(statistics.fmean(right))
        assert row["rewards/short/mean"] == pytest.approx(statistics.fmean(short), rel=1e-6)


# --------------------------------------------------------------------------------------------
# mistakes: error: ..., exit 2, nothing created, the model never loaded


def _refused(argv, capsys, monkeypatch):
    def model_loaded(cfg):
        raise AssertionError("the model was loaded before the data was checked")

    monkeypatch.setattr(tr, "load_model", model_loaded)
    with pytest.raises(SystemExit) as info:
        tr.main(argv)
    err = capsys.readouterr().err
    # the last line (datasets may draw a progress bar above it)
    assert info.value.code == 2 and err.splitlines()[-1].startswith("error: ") and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--answer_field", "reward_model.ground_truht"],
         "`answer_field`='reward_model.ground_truht': 'reward_model' has no key 'ground_truht'; its keys: style, ground_truth"),
        ([], "has no column 'answer' (columns: data_source, prompt, ability, reward_model, extra_info); set `answer_field`"),
        (["--answer_field", "reward_model.ground_truth", "--prompt_field", "question"],
         "has no column 'question'"),
        (["--answer_field", "reward_model.ground_truth", "--prompt_field", "prompt.content"],
         "`prompt_field`='prompt.content': 'prompt' is a list, not a mapping with a key 'content'"),
        (["--answer_field", "reward_model.ground_truth", "--num_train", "7"],
         "`num_train`=7: the train split has only 6 prompts; ask for at most that many, or none"),
        (["--answer_field", "reward_model.ground_truth", "--system_prompt", "x", "--max_prompt_length", "3"],
         "`max_prompt_length`=3: every train prompt is longer"),
    ],
)  # fmt: skip
def test_data_mistakes_exit_2_before_anything_is_created(
    raw_model, tmp_path, capsys, monkeypatch, extra, message
):
    pd.DataFrame(verl_rows(6)).to_parquet(tmp_path / "train.parquet")
    out = tmp_path / "runs" / "new"
    err = _refused(
        run_args(raw_model, out, "--task", tmp_path / "train.parquet", *extra), capsys, monkeypatch
    )
    assert message in err
    assert not out.exists() and not out.parent.exists()


@pytest.mark.parametrize(
    ("yaml_text", "argv", "message"),
    [
        ("lr: [0.1\nsteps: 2\n", [], "is not valid YAML"),
        ("steps: 2\n", ["--import", "no_such_reward_module"], "--import no_such_reward_module: no module"),
        ("steps: 2\n", ["--reward", "my_fn"], "--import my_module"),
        (
            "steps: 2\n",
            ["--reward_file", "nowhere.py:fn"],
            "`reward_file`='nowhere.py:fn': the file nowhere.py",
        ),
    ],
)
def test_config_and_reward_mistakes_exit_2(
    raw_model, tmp_path, capsys, monkeypatch, yaml_text, argv, message
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text(yaml_text)
    out = tmp_path / "runs" / "new"
    err = _refused(
        ["--config", "run.yaml", "--model", str(raw_model), "--output_dir", str(out), *argv],
        capsys,
        monkeypatch,
    )
    assert message in err
    assert not out.exists() and not out.parent.exists()


def test_help_lists_the_options_outside_the_config(capsys):
    with pytest.raises(SystemExit) as info:
        tr.main(["--help"])
    printed = capsys.readouterr().out
    assert info.value.code == 0
    for option in ("--config PATH.yaml", "--import MODULE", "--reward_file REWARD_FILE", "--debug_dir DIR"):
        assert option in printed
