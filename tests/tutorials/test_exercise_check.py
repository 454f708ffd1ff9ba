"""``tutorials/exercise_check.py``: one status line per check, never an exception, a message that says why.

The notebooks exercise the common paths (not solved, wrong shape, wrong value, returned None, an error
in the learner's code) with their own answers in ``test_tutorials.py``; this covers the rest directly.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location(
    "exercise_check", Path(__file__).resolve().parents[2] / "tutorials" / "exercise_check.py"
)
ec = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ec)

f64 = torch.float64


def _status(capsys: pytest.CaptureFixture[str]) -> str:
    lines = capsys.readouterr().out.splitlines()
    assert lines, "no status line"
    return lines[0]


def my_stub() -> float:
    raise NotImplementedError("Exercise 9.9: replace this line with your code")


def test_correct_and_not_solved(capsys: pytest.CaptureFixture[str]) -> None:
    with ec.check("9.1"):
        ec.expect_close(torch.tensor([1.0, 2.0], dtype=f64), torch.tensor([1.0, 2.0], dtype=f64), "x")
    assert _status(capsys) == "✓ Exercise 9.1: correct"
    with ec.check("9.2"):
        my_stub()
    assert _status(capsys).startswith(
        "✗ Exercise 9.2: not solved yet — `my_stub` still raises NotImplementedError"
    )


def test_check_cell_run_before_the_exercise_cell(capsys: pytest.CaptureFixture[str]) -> None:
    with ec.check("9.3"):
        my_undefined()  # type: ignore[name-defined]  # noqa: F821
    assert _status(capsys) == (
        "✗ Exercise 9.3: not solved yet — `my_undefined` is not defined: run the exercise cell above first."
    )


def test_other_errors_are_reported_with_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    def library_call() -> None:
        raise NotImplementedError("not a stub of the learner's")

    with ec.check("9.4"):
        library_call()
    out = capsys.readouterr().out
    assert out.startswith("✗ Exercise 9.4: your code raised NotImplementedError: not a stub")
    assert "Traceback (most recent call last)" in out and "tutorials/exercise_check.py" not in out


def test_keyboard_interrupt_is_not_swallowed() -> None:
    with pytest.raises(KeyboardInterrupt), ec.check("9.5"):
        raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("got", "expected", "words"),
    [
        (None, 1.0, "wrong type — x: your function returned None"),
        ("1.0", 1.0, "wrong type — x: expected a number, got str"),
        (
            torch.ones(3, dtype=torch.float32),
            torch.ones(3, dtype=f64),
            "wrong dtype — x: expected torch.float64",
        ),
        (
            torch.ones(2, 3, dtype=f64),
            torch.ones(3, dtype=f64),
            "wrong shape — x: expected a tensor of shape (3,)",
        ),
        (2.5, 2.0, "wrong value — x: expected 2, got 2.5"),
        (-2.0, 2.0, "wrong value — x: expected 2, got -2 (the opposite sign)"),
        ([1.0, float("nan")], [1.0, 2.0], "wrong value — x: expected [1, 2], got [1, nan]"),
    ],
)
def test_expect_close_says_what_is_wrong(
    got: object, expected: object, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    expected_t = torch.as_tensor(expected, dtype=f64)
    with ec.check("9.6"):
        ec.expect_close(got, expected_t, "x")
    assert _status(capsys).startswith(f"✗ Exercise 9.6: {words}")


def test_expect_close_accepts_numbers_and_one_element_tensors(capsys: pytest.CaptureFixture[str]) -> None:
    with ec.check("9.7"):
        ec.expect_close(0.5, 0.5, "x")
        ec.expect_close(torch.tensor([0.5], dtype=f64), 0.5, "x")
        ec.expect_close(torch.tensor(0.5, dtype=f64), torch.tensor(0.5, dtype=f64), "x")
    assert _status(capsys) == "✓ Exercise 9.7: correct"


def test_large_tensors_name_the_worst_entry_and_a_constant_factor(capsys: pytest.CaptureFixture[str]) -> None:
    expected = torch.arange(1.0, 41.0, dtype=f64).view(8, 5)
    with ec.check("9.8"):
        ec.expect_close(3 * expected, expected, "x", at="at k = 1")
    assert _status(capsys) == (
        "✗ Exercise 9.8: wrong value — x at k = 1: 40 of 40 entries differ; the largest difference is at "
        "index (7, 4): expected 40, got 120 (yours are 3 × the expected values: a missing or extra constant "
        "factor?)"
    )


def test_expect_equal_number_and_ensure(capsys: pytest.CaptureFixture[str]) -> None:
    with ec.check("9.9"):
        ec.expect_equal(torch.tensor(True), True, "verdict")
        ec.expect_equal("a", "a", "name")
        assert ec.number(torch.tensor([0.25]), "p") == 0.25
    assert _status(capsys) == "✓ Exercise 9.9: correct"
    with ec.check("9.10"):
        ec.expect_equal(1, True, "verdict")
    assert _status(capsys) == "✗ Exercise 9.10: wrong type — verdict: expected True or False, got int 1"
    with ec.check("9.11"):
        ec.number(True, "p")
    assert _status(capsys) == "✗ Exercise 9.11: wrong type — p: expected a number, got bool True"
    with ec.check("9.12"):
        ec.ensure(False, "it is not", kind="wrong answer")
    assert _status(capsys) == "✗ Exercise 9.12: wrong answer — it is not"
