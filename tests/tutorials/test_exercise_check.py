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


# ---------------------------------------------------------------------------- expect_cases: random cases


def _case(gen: torch.Generator) -> tuple[tuple, str]:
    """One random case: a (2, 3) float64 tensor and an int; every 4th case is all zeros."""
    x = torch.randn(2, 3, generator=gen, dtype=f64)
    k = int(torch.randint(1, 4, (1,), generator=gen))
    if int(torch.randint(0, 4, (1,), generator=gen)) == 0:
        return (torch.zeros_like(x), k), "all zeros"
    return (x, k), f"a (2, 3) tensor, k = {k}"


def _reference(x: torch.Tensor, k: int) -> torch.Tensor:
    """k·x by a plain loop."""
    out = torch.zeros_like(x)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = k * float(x[i, j])
    return out


def _drawn(seed: int | None) -> list[tuple[list[float], int]]:
    seen = []

    def learner(x: torch.Tensor, k: int) -> torch.Tensor:
        seen.append((x.flatten().tolist(), k))
        return k * x

    ec.expect_cases(learner, _reference, _case, "k·x", seed=seed)
    return seen


def test_expect_cases_seed_from_the_environment_reproduces_the_cases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUTORIAL_CHECK_SEED", "1234")
    assert ec.check_seed() == 1234
    assert ec.expect_cases(lambda x, k: k * x, _reference, _case, "k·x") == 1234
    first = _drawn(None)
    assert len(first) == 20 and first == _drawn(None) == _drawn(1234)
    assert first != _drawn(1235)
    # each case is drawn from its own generator: case i of seed s is make_case(Generator(s·1000 + i))
    (x, k), _ = _case(torch.Generator().manual_seed(1234 * 1_000 + 7))
    assert first[7] == (x.flatten().tolist(), k)
    monkeypatch.delenv("TUTORIAL_CHECK_SEED")
    seeds = {ec.check_seed() for _ in range(5)}  # a fresh seed per check: five draws of 2^31 collide ~5e-9
    assert len(seeds) == 5 and all(0 <= s < 2**31 for s in seeds)


def test_expect_cases_names_the_case_and_the_seed_of_a_wrong_learner(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def wrong(x: torch.Tensor, k: int) -> torch.Tensor:  # right except when k = 3
        return (k - (k == 3)) * x

    monkeypatch.setenv("TUTORIAL_CHECK_SEED", "77")
    drawn = _drawn(None)
    first_bad = next(i for i, (x, k) in enumerate(drawn) if k == 3 and any(v != 0 for v in x))
    with ec.check("9.13"):
        ec.expect_cases(wrong, _reference, _case, "k·x")
    line = _status(capsys)
    assert line.startswith(
        f"✗ Exercise 9.13: wrong value — k·x on random case {first_bad + 1} of 20 (a (2, 3) tensor, k = 3): "
    ), line
    assert line.endswith(" [random cases of seed 77: set TUTORIAL_CHECK_SEED=77 to rerun them]"), line
    assert "(yours are 0.666667 × the expected values" in line
    monkeypatch.delenv("TUTORIAL_CHECK_SEED")
    with ec.check("9.14"):
        seed = ec.expect_cases(lambda x, k: k * x, _reference, _case, "k·x")
    assert _status(capsys) == "✓ Exercise 9.14: correct"
    with ec.check("9.15"):
        ec.expect_cases(wrong, _reference, _case, "k·x", seed=seed + 1)
    assert f"[random cases of seed {seed + 1}: set TUTORIAL_CHECK_SEED={seed + 1} to rerun them]" in _status(
        capsys
    )


def test_expect_cases_inputs_changed_in_place_do_not_leak(capsys: pytest.CaptureFixture[str]) -> None:
    shared = torch.arange(6, dtype=f64).view(2, 3)
    nested = [torch.ones(2, dtype=f64)]

    def make_case(gen: torch.Generator) -> tuple[tuple, str]:
        return (shared, nested), "the same tensors every case"

    def destructive(x: torch.Tensor, xs: list[torch.Tensor]) -> torch.Tensor:
        out = x.sum() + xs[0].sum()
        x.zero_()  # in place: the reference's copy and the next case's must not see it
        xs[0].mul_(100)
        return out

    with ec.check("9.16"):
        ec.expect_cases(destructive, destructive, make_case, "Σ", seed=0)
    assert _status(capsys) == "✓ Exercise 9.16: correct"  # 15 + 2 each time, not 0 + 200
    assert torch.equal(shared, torch.arange(6, dtype=f64).view(2, 3)) and torch.equal(
        nested[0], torch.ones(2)
    )


def test_expect_cases_custom_compare_and_tolerance(capsys: pytest.CaptureFixture[str]) -> None:
    with ec.check("9.17"):
        ec.expect_cases(lambda x, k: k * x + 1e-7, _reference, _case, "k·x", seed=3, atol=1e-6)
    assert _status(capsys) == "✓ Exercise 9.17: correct"
    with ec.check("9.18"):
        ec.expect_cases(
            lambda x, k: bool(k > 1), lambda x, k: k >= 1, _case, "k ≥ 1", seed=3, compare=ec.expect_equal
        )
    assert "wrong value — k ≥ 1 on random case" in _status(capsys)


# ---------------------------------------------------------------------------------------- forbid: refusals


def _define(tmp_path: Path, source: str, **namespace: object) -> object:
    """The function ``source`` defines, as a notebook cell defines it: its globals ``namespace`` (the
    notebook's), its source readable by ``inspect`` (IPython keeps every cell's source in ``linecache``)."""
    path = tmp_path / f"cell_{abs(hash(source))}.py"
    path.write_text(source)
    scope = {"torch": torch, "math": __import__("math"), **namespace}
    exec(compile(source, str(path), "exec"), scope)
    (name,) = (n for n in scope if n.startswith("my_"))
    return scope[name]


def _cells(tmp_path: Path, *sources: str, **namespace: object) -> dict:
    """Cells run one after another in one notebook namespace, each with its own source file."""
    scope = {"torch": torch, **namespace}
    for source in sources:
        path = tmp_path / f"cell_{abs(hash(source))}.py"
        path.write_text(source)
        exec(compile(source, str(path), "exec"), scope)
    return scope


def _refusal(fn: object, capsys: pytest.CaptureFixture[str], **kwargs: object) -> str:
    with ec.check("9.20"):
        ec.forbid(fn, **kwargs)
    return _status(capsys)


ADV = "def my_adv(r):\n    {body}\n"


@pytest.mark.parametrize(
    ("body", "namespace", "words"),
    [
        ("import cancellation\n    return r", {}, "`my_adv` imports cancellation"),
        (
            "from cancellation.advantages import group_advantages\n    return r",
            {},
            "`my_adv` imports group_advantages, cancellation.advantages",
        ),
        ("import numpy.linalg, os\n    return r", {}, "`my_adv` imports numpy.linalg, os"),
        (
            "return ga(r, torch.zeros_like(r))",
            {"ga": "cancellation.advantages.group_advantages"},
            "`my_adv` uses `ga` from the project's library",
        ),
        (
            "return adv_mod.group_advantages(r, r)",
            {"adv_mod": "cancellation.advantages"},
            "uses `adv_mod` from",
        ),
        ("return sim.run(r)", {"sim": "toymodel.simulate"}, "`my_adv` uses `sim` from the project's library"),
        (
            "return r - expected",
            {"expected": torch.zeros(3)},
            "`my_adv` reads the notebook's variable `expected`",
        ),
        ("return r * scale", {"scale": 2.0}, "reads the notebook's variable `scale`"),
        ("return r + rows[0]", {"rows": [torch.ones(3)]}, "reads the notebook's variable `rows`"),
        (
            "return globals()['answer']",
            {},
            "`my_adv` uses `globals`, which this exercise asks you not to use",
        ),
        ("return eval('r')", {}, "uses `eval`"),
        ("return sys.modules['cancellation'].group_advantages(r, r)", {"sys": "sys"}, "uses `sys`"),
        ("return my_adv.__globals__['expected']", {}, "uses `__globals__`"),
    ],
)
def test_forbid_refuses_each_route_with_its_message(
    body: str, namespace: dict, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib

    def resolve(v: object) -> object:
        if not isinstance(v, str):
            return v
        module, _, attr = v.rpartition(".")
        try:
            return importlib.import_module(v)
        except ImportError:
            return getattr(importlib.import_module(module), attr)

    fn = _define(tmp_path, ADV.format(body=body), **{k: resolve(v) for k, v in namespace.items()})
    line = _refusal(fn, capsys, why="write eq. (1.1) yourself")
    assert line.startswith("✗ Exercise 9.20: refused call — "), line
    assert words in line and line.endswith(": write eq. (1.1) yourself"), line


@pytest.mark.parametrize(
    ("source", "namespace"),
    [
        ("def my_step(p, g):\n    opt = torch.optim.Adam([p])\n    return opt\n", {}),
        ("def my_step(p, g):\n    from torch.optim import Adam\n    return Adam\n", {}),
        ("def my_step(p, g):\n    return Adam([p])\n", {"Adam": torch.optim.Adam}),
        ("def my_step(p, g):\n    return optim.Adam([p])\n", {"optim": torch.optim}),
    ],
)
def test_forbid_refuses_torch_optim_however_named(
    source: str, namespace: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fn = _define(tmp_path, source, **namespace)
    line = _refusal(fn, capsys, refused=("optim",), why="write Adam's step yourself")
    assert line.startswith("✗ Exercise 9.20: refused call — `my_step` "), line
    assert line.endswith(": write Adam's step yourself"), line


def test_forbid_passes_an_honest_answer_and_allowed_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cancellation.advantages import group_advantages

    honest = _define(
        tmp_path,
        "def my_adv(r, valid):\n"
        "    out = torch.zeros_like(r)\n"
        "    for i in range(len(r)):\n"
        "        out[i] = (r[i] - r.mean()) / (r.std() + EPS) if valid[i] else 0.0\n"
        "    return out.clamp(min=-math.inf)\n",
        EPS=1e-6,
        helper_data=torch.ones(2),
    )
    assert _refusal(honest, capsys, allow=("EPS",)) == "✓ Exercise 9.20: correct"
    assert "reads the notebook's variable `EPS`" in _refusal(honest, capsys)
    lib = _define(
        tmp_path, ADV.format(body="return group_advantages(r, r)"), group_advantages=group_advantages
    )
    assert _refusal(lib, capsys, allow=("group_advantages",)) == "✓ Exercise 9.20: correct"
    assert "uses `backward`, which this exercise asks you not to use" in _refusal(
        _define(tmp_path, ADV.format(body="r.sum().backward()\n    return r.grad")),
        capsys,
        refused=("backward",),
    )


def test_forbid_refuses_the_library_reached_around_a_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A default argument, a partial, a dict of the library's functions, a closure, a notebook helper that
    calls the library, the check cell's own reference: each is refused, and the message says which."""
    import functools

    from cancellation.advantages import group_advantages as ga

    routes = [
        (
            "def my_adv(r, f=ga):\n    return f(r, r)\n",
            {"ga": ga},
            "uses `a default argument` from the project's",
        ),
        ("def my_adv(r):\n    return p(r, r)\n", {"p": functools.partial(ga)}, "uses `p` from the project's"),
        ("def my_adv(r):\n    return FNS['a'](r, r)\n", {"FNS": {"a": ga}}, "uses `FNS` from the project's"),
    ]
    for source, namespace, words in routes:
        line = _refusal(_define(tmp_path, source, **namespace), capsys)
        assert line.startswith("✗ Exercise 9.20: refused call — ") and words in line, (source, line)

    for helper, words in [
        (
            "def helper(r):\n    return ga(r, r)\n",
            "`my_adv` calls `helper`, which uses `ga` from the project's library",
        ),
        (
            "def helper(r):\n    return r - expected\n",
            "`my_adv` calls `helper`, which reads the notebook's variable `expected`",
        ),
        ("def helper(r):\n    return 2 * r\n", ""),
    ]:  # a function of the notebook's own (its namespace) is held to the same rules; one that computes passes
        scope = _cells(tmp_path, helper, ADV.format(body="return helper(r)"), ga=ga, expected=torch.ones(2))
        line = _refusal(scope["my_adv"], capsys)
        assert (words in line) if words else line == "✓ Exercise 9.20: correct", line

    closure = _define(
        tmp_path, "def my_make(f):\n    def my_adv(r):\n        return f(r, r)\n    return my_adv\n"
    )(ga)
    assert "uses `f` from the project's library" in _refusal(closure, capsys)

    cell = "with check('9.0'):\n    pass\n\n\ndef my_reference(r):\n    return 2 * r\n"
    reference = _define(tmp_path, cell, check=ec.check)
    capsys.readouterr()
    line = _refusal(_define(tmp_path, ADV.format(body="return reference(r)"), reference=reference), capsys)
    assert "`my_adv` uses `reference`, which a check cell defined" in line, line
    assert _refusal(_define(tmp_path, "def my_adv(r, eps=1e-6):\n    return r + eps\n"), capsys) == (
        "✓ Exercise 9.20: correct"
    )


def test_forbid_looks_inside_the_notebooks_classes_instances_and_lists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A student's routes a review found open: the library kept in a class attribute (staticmethod), called
    from an instance's method, torch.optim in a class attribute, the check cell's reference kept in a list,
    and an attribute fetched by a string (``__getattribute__``): each refused, with what it reached."""
    from cancellation.advantages import group_advantages as ga

    cases = [
        (
            "class Tools:\n    adv = staticmethod(ga)\n",
            "def my_adv(r):\n    return Tools.adv(r, r)\n",
            "uses `Tools.adv` from the project's library",
        ),
        (
            "class T:\n    def f(self, r):\n        return ga(r, r)\n\n\nt = T()\n",
            "def my_adv(r):\n    return t.f(r)\n",
            "calls `t.f`, which uses `ga` from the project's library",
        ),
        (
            "class O:\n    A = torch.optim.AdamW\n",
            "def my_adv(r):\n    return O.A([r])\n",
            "uses `O.A`, which this exercise asks you not to use",
        ),
        (
            "with check('9.0'):\n    def reference(r):\n        return 2 * r\n\n\nrefs = [reference]\n",
            "def my_adv(r):\n    return refs[0](r)\n",
            "uses `refs[0]`, which a check cell defined",
        ),
        ("", "def my_adv(r):\n    return torch.__getattribute__('op' + 'tim')\n", "uses `__getattribute__`"),
    ]
    for setup, answer, words in cases:
        # a notebook's cells run in the namespace of module __main__ (its classes' __module__)
        scope = _cells(
            tmp_path, *([setup] if setup else []), answer, ga=ga, check=ec.check, __name__="__main__"
        )
        capsys.readouterr()  # the setup cell's own check line
        line = _refusal(scope["my_adv"], capsys, refused=("optim",))
        assert line.startswith("✗ Exercise 9.20: refused call — ") and words in line, (setup, line)
    # a class of the notebook's own that computes, and an instance of it, pass
    scope = _cells(
        tmp_path, "class Twice:\n    def f(self, r):\n        return 2 * r\n\n\ntw = Twice()\n",
        "def my_adv(r):\n    return tw.f(r)\n", __name__="__main__",
    )  # fmt: skip
    assert _refusal(scope["my_adv"], capsys) == "✓ Exercise 9.20: correct"
