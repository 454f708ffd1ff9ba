"""Every tutorial runs top to bottom, as a notebook, and its exercise checks tell right from wrong.

The tutorials ship their exercises unsolved: each exercise cell defines a function ``my_*`` whose body is
``raise NotImplementedError(...)``, and the check cell after it is a ``with check("N.M"):`` block
(``tutorials/exercise_check.py``) that prints exactly one status line and never raises: ``✓ Exercise N.M:
correct``, ``✗ Exercise N.M: not solved yet — ...``, ``✗ Exercise N.M: wrong value — ...`` and so on.
The solutions are in ``tutorials/solutions/<tutorial>.py``, one function per exercise with the
exercise's signature; the notebook never imports them.

Each ``tutorials/NN_*.py`` (jupytext percent format) is converted with ``jupytext.read`` and executed
by ``nbclient`` in one fresh IPython kernel whose working directory is ``tutorials/`` (as Jupyter
does), as one notebook made of:

1. the tutorial exactly as shipped, top to bottom (the learner's run): no cell may raise, and every
   check cell must say "not solved yet";
2. the exercise section again (every code cell from the first exercise cell on) with each exercise
   cell's source replaced by its solution: every check must say "correct";
3. for each deliberately wrong answer in ``WRONG_ANSWERS`` (at least one per tutorial), the exercise
   section again with the solutions except that one answer: its check must say what is wrong (the
   expected words, e.g. "wrong shape"), the others "correct".

The tutorial before the exercises runs once: before 2 and before each 3 the kernel's user namespace
and RNG states are put back to what they were when the exercise section first started (a snapshot
taken then; objects changed in place are not undone, and no exercise section changes one). So 2 is
the notebook with the solutions filled in, as run top to bottom, at the cost of its exercise cells.

The test prints each tutorial's wall time: the learner's run (the target is under 60 s each on the
2-core CI machine) and the extra exercise runs.

The kernel is this interpreter: a ``python3`` kernel spec written by ``ipykernel`` for
``sys.executable`` is put first on ``JUPYTER_PATH``, so a user-level ``python3`` kernel spec that
points at another Python cannot hijack the run.
"""

from __future__ import annotations

import ast
import re
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import jupytext
import nbclient
import nbformat
import pytest
from ipykernel.kernelspec import write_kernel_spec

REPO = Path(__file__).resolve().parents[2]
TUTORIAL_DIR = REPO / "tutorials"
SOLUTION_DIR = TUTORIAL_DIR / "solutions"
TUTORIALS = sorted(TUTORIAL_DIR.glob("[0-9][0-9]_*.py"))
#: per-cell limit; a whole tutorial is meant to take well under a minute
CELL_TIMEOUT_S = 120

CHECK_CELL = re.compile(r'^with check\("(\d+\.\d+)"\):', re.MULTILINE)
STATUS_LINE = re.compile(r"^([✓✗]) Exercise (\d+\.\d+): (.*)$", re.MULTILINE)
NOT_SOLVED = "✗ not solved yet"
CORRECT = "✓ correct"

#: Deliberately wrong answers, each with the words its check must print after "✗ Exercise N.M: ".
WRONG_ANSWERS: dict[str, list[tuple[str, str]]] = {
    "01_advantages_and_score_function": [
        (  # one coefficient per completion instead of per token
            "def my_coefficients(adv, logp, mask):\n    return adv / mask.sum()\n",
            "wrong shape",
        ),
        (  # the token-sum surrogate: no 1/N
            "def my_coefficients(adv, logp, mask):\n    return adv[:, None] * mask\n",
            "wrong value — ∂J/∂logp of every token: ",
        ),
    ],
    "02_shared_prefix_and_sequence_coupling": [
        (  # a sign flip
            "def my_shared_net(rho1, rho2, lam1, lam2):\n"
            "    new, old = shared_prefix_policies(rho1, rho2, lam1, lam2)\n"
            "    lp, olp = policy.token_logp(new, idx), policy.token_logp(old, idx)\n"
            '    c = token_coefficients("gspo", lp, olp, adv, mask, group, length_norm=False, **NO_CLIP)\n'
            "    return -float(c[:, 1].sum())\n",
            "wrong value",
        ),
    ],
    "03_equivalent_solutions_and_entropy_collapse": [
        (  # the product weight Π r, without the 1/|τ| of eq. (44)
            "def my_sequence_weights(theta):\n"
            "    return (policy.traj_logp(theta) - policy.traj_logp(theta_old)).exp()\n",
            "wrong value — the sequence weights s_i at",
        ),
    ],
    "04_clipping_breaks_cancellation": [
        (  # ε_low and ε_high swapped
            "def my_cancelling_interval(epsilon_low, epsilon_high):\n"
            "    return (1.0 - epsilon_high, 1.0 + epsilon_low)\n",
            "wrong value — w_lo = 0.72 is too low",
        ),
        (  # the clipped and the unclipped side confused
            "def my_grpo_net(w):\n    return 0.0 if 0.8 <= w <= 1.2 else (w / 4 if w > 1.2 else -w / 4)\n",
            "wrong value",
        ),
    ],
    "05_dfpo_transforms": [
        ("def my_closest_nonnegative_transform():\n    return 'orth_proj'\n", "wrong value — 'orth_proj'"),
    ],
    "06_batching": [
        (  # the verdict computed but not returned
            "def my_is_balanced(adv, rho):\n"
            "    n = len(adv)\n"
            "    bool((adv > 0).sum() / n >= rho and (adv < 0).sum() / n >= rho)\n",
            "wrong type",
        ),
        (  # half of the split left out
            "def my_sign_split(adv):\n    return [torch.nonzero(adv > 0).flatten()]\n",
            "wrong value — your parts are not a partition",
        ),
    ],
    "07_low_probability_tokens": [
        (  # the gradient of θ itself, which never took part in a backward pass
            "def my_score_norm(i, t):\n"
            "    policy.token_logp(theta.clone().requires_grad_(True), idx[i : i + 1])[0, t].backward()\n"
            "    return float(theta.grad.norm())\n",
            "your code raised AttributeError",
        ),
        ("def my_pi_for_90_percent(alpha):\n    return 0.9\n", "wrong value"),
    ],
    "08_from_toy_to_lm": [
        (  # every position of the completions, not only the common prefix
            "def my_shared_prefix_net(coef, tokens, mask):\n    return coef.sum(0)\n",
            "wrong shape",
        ),
        (  # the mean over the completions instead of the net (sum)
            "def my_shared_prefix_net(coef, tokens, mask):\n"
            "    agree = ((tokens == tokens[0]) & mask.bool()).all(0)\n"
            "    return coef[:, agree.long().cumprod(0).bool()].mean(0)\n",
            "wrong value",
        ),
        (  # inf − inf is NaN: two never-reached seeds are lost instead of tied
            "def my_sign_counts(arm, baseline):\n"
            "    d = [arm[s] - baseline[s] for s in arm]\n"
            "    return sum(x > 0 for x in d), sum(x < 0 for x in d), sum(x == 0 for x in d)\n",
            "wrong value — the counts",
        ),
        (  # paired by position, not by seed
            "def my_sign_counts(arm, baseline):\n"
            "    pairs = list(zip(arm.values(), baseline.values()))\n"
            "    larger = sum(a > b for a, b in pairs)\n"
            "    smaller = sum(a < b for a, b in pairs)\n"
            "    return larger, smaller, len(pairs) - larger - smaller\n",
            "wrong value — the counts",
        ),
    ],
}

#: After the learner's run: remember the namespace and RNG states the exercise section started from.
SNAPSHOT = (
    "get_ipython()._tutorial_test_state = (dict(get_ipython().user_ns), __import__('torch').get_rng_state(), "
    "__import__('random').getstate(), __import__('numpy').random.get_state())"
)
#: Before each further exercise run: put them back (names the section defined are dropped).
RESTORE = """\
def _tutorial_test_restore(ip=get_ipython()):
    ns, torch_rng, py_rng, np_rng = ip._tutorial_test_state
    for name in set(ip.user_ns) - set(ns):
        del ip.user_ns[name]
    ip.user_ns.update(ns)
    __import__("torch").set_rng_state(torch_rng)
    __import__("random").setstate(py_rng)
    __import__("numpy").random.set_state(np_rng)


_tutorial_test_restore()"""


@dataclass(frozen=True)
class Exercise:
    label: str  # "1.2"
    function: str  # "my_event_advantage_sums"
    cell: int  # index of the exercise cell in the notebook
    check: int  # index of its check cell


def find_exercises(nb: nbformat.NotebookNode) -> list[Exercise]:
    """The notebook's exercises, each an exercise cell followed by its check cell (the next code cell)."""
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    exercises = []
    for k, i in enumerate(code):
        body = ast.parse(nb.cells[i].source).body
        if not any(isinstance(n, ast.FunctionDef) and n.name.startswith("my_") for n in body):
            continue
        assert len(body) == 1, f"an exercise cell holds its function only:\n{nb.cells[i].source}"
        assert k + 1 < len(code), f"exercise cell {i} has no check cell after it"
        m = CHECK_CELL.search(nb.cells[code[k + 1]].source)
        assert m, f"the code cell after exercise cell {i} is not a `with check(...)` cell"
        exercises.append(Exercise(m.group(1), body[0].name, i, code[k + 1]))
    return exercises


def solutions(path: Path) -> dict[str, ast.FunctionDef]:
    """The solution functions of one tutorial, by name (their source is ``ast.get_source_segment``)."""
    tree = ast.parse((SOLUTION_DIR / path.name).read_text())
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _signature(node: ast.FunctionDef) -> str:
    return ast.dump(node.args) + ast.dump(node.returns) if node.returns else ast.dump(node.args)


def _stdout(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def _outputs_text(nb: nbformat.NotebookNode) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
            elif "data" in out and "text/plain" in out["data"]:
                parts.append(out["data"]["text/plain"])
    return "".join(parts)


@pytest.fixture(scope="module")
def kernel_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A JUPYTER_PATH entry holding a ``python3`` kernel spec for this interpreter."""
    root = tmp_path_factory.mktemp("jupyter")
    write_kernel_spec(root / "kernels" / "python3")
    return root


def test_tutorials_are_found() -> None:
    """Tutorials 01-07 exist and are numbered without gaps (a later one just extends the list)."""
    names = [p.name for p in TUTORIALS]
    assert len(names) >= 7, names
    assert [n[:2] for n in names] == [f"{i:02d}" for i in range(1, len(names) + 1)], names


def test_kernel_is_this_interpreter(kernel_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tutorials run on the project's environment, not on whatever ``python3`` Jupyter finds first."""
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_path))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import sys; print(sys.executable)")])
    nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3").execute()
    assert _outputs_text(nb).strip() == sys.executable


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_exercises_ship_unsolved_with_solutions(path: Path) -> None:
    """Every exercise cell is a stub that raises NotImplementedError; its solution has its signature."""
    nb = jupytext.read(path)
    exercises = find_exercises(nb)
    number = int(path.name[:2])
    assert [e.label for e in exercises] == [f"{number}.{k}" for k in range(1, len(exercises) + 1)], exercises
    assert len(exercises) >= 1, f"{path.name} has no exercise"
    for e in exercises:
        (func,) = ast.parse(nb.cells[e.cell].source).body
        stmts = func.body
        has_docstring = isinstance(stmts[0], ast.Expr) and isinstance(stmts[0].value, ast.Constant)
        stub = stmts[1:] if has_docstring else stmts
        assert len(stub) == 1 and isinstance(stub[0], ast.Raise), f"{e.function} is not a stub"
        assert "NotImplementedError" in ast.unparse(stub[0]), (
            f"{e.function} does not raise NotImplementedError"
        )
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not re.search(r"\bsolutions\b", cell.source), "a notebook must not use the solutions"

    sol = solutions(path)
    assert sorted(sol) == sorted(e.function for e in exercises), f"tutorials/solutions/{path.name}"
    for e in exercises:
        (func,) = ast.parse(nb.cells[e.cell].source).body
        assert _signature(sol[e.function]) == _signature(func), f"{e.function}: signature differs"

    wrong = WRONG_ANSWERS[path.stem]
    assert wrong, f"{path.name}: no deliberately wrong answer"
    for source, _ in wrong:
        (func,) = ast.parse(source).body
        assert func.name in sol, func.name


#: Tutorial 8 samples from and trains the tiny Qwen3: a ``sampling`` test (``tests/machines.py``).
EXECUTED = [
    pytest.param(p, marks=pytest.mark.sampling) if p.stem == "08_from_toy_to_lm" else p for p in TUTORIALS
]


@pytest.mark.parametrize("path", EXECUTED, ids=[p.stem for p in TUTORIALS])
def test_tutorial_executes(path: Path, kernel_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_path))
    nb = jupytext.read(path)
    exercises = find_exercises(nb)
    label_of = {e.function: e.label for e in exercises}
    solution_src = {
        name: ast.get_source_segment((SOLUTION_DIR / path.name).read_text(), node)
        for name, node in solutions(path).items()
    }
    start = exercises[0].cell
    tail = [(i, c) for i, c in enumerate(nb.cells) if i >= start and c.cell_type == "code"]
    cells = [nbformat.v4.new_code_cell(c.source) if c.cell_type == "code" else c for c in nb.cells]
    cells.insert(start, nbformat.v4.new_code_cell(SNAPSHOT))
    #: run index of every check cell -> (run, label, the words its status line must start with)
    expect: dict[int, tuple[str, str, str]] = {}
    for e in exercises:
        expect[e.check + 1] = ("the learner's notebook", e.label, NOT_SOLVED)
    n_learner = len(cells)

    def add_run(run: str, replace: dict[str, str], wrong: str = "", words: str = "") -> None:
        cells.append(nbformat.v4.new_code_cell(RESTORE))
        for _, c in tail:
            source = c.source
            for e in exercises:
                if c is nb.cells[e.cell]:
                    source = replace[e.function]
            if m := CHECK_CELL.search(source):
                label = m.group(1)
                expect[len(cells)] = (run, label, f"✗ {words}" if label == wrong else CORRECT)
            cells.append(nbformat.v4.new_code_cell(source))

    add_run("the solutions", solution_src)
    for source, words in WRONG_ANSWERS[path.stem]:
        name = ast.parse(source).body[0].name
        add_run(f"wrong answer {name}", {**solution_src, name: source}, label_of[name], words)

    run_nb = nbformat.v4.new_notebook(cells=cells, metadata=nb.metadata)
    client = nbclient.NotebookClient(
        run_nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(TUTORIAL_DIR)}},
    )
    t0 = time.perf_counter()
    client.execute()  # raises CellExecutionError if any cell raises; a check cell never does
    elapsed = time.perf_counter() - t0

    problems = []
    for i, (run, label, words) in expect.items():
        statuses = STATUS_LINE.findall(_stdout(run_nb.cells[i]))
        if len(statuses) != 1 or statuses[0][1] != label:
            problems.append(f"{run}, check {label}: expected one status line, got {statuses}")
            continue
        mark, _, message = statuses[0]
        got = f"{mark} {message}"
        if not got.startswith(words):
            problems.append(f"{run}, check {label}: expected '{words} …', got '{got}'")
    assert not problems, f"{path.name}:\n" + "\n".join(problems)

    learner = [c for c in run_nb.cells[:n_learner] if c.cell_type == "code"]
    learner_s = _seconds(learner[0], learner[-1])
    print(
        f"\n  {path.name}: {elapsed:.1f} s in all; the learner's run {learner_s:.1f} s "
        f"({len(nb.cells)} cells, {len(exercises)} exercises, unsolved), then the exercise section with "
        f"the solutions and with {len(WRONG_ANSWERS[path.stem])} wrong answer(s) "
        f"{elapsed - learner_s:.1f} s"
    )


def _seconds(first: nbformat.NotebookNode, last: nbformat.NotebookNode) -> float:
    """Kernel time from the start of ``first`` to the end of ``last`` (nbclient's recorded timing)."""
    t0 = datetime.fromisoformat(first.metadata.execution["iopub.execute_input"].replace("Z", "+00:00"))
    t1 = datetime.fromisoformat(last.metadata.execution["shell.execute_reply"].replace("Z", "+00:00"))
    return (t1 - t0).total_seconds()
