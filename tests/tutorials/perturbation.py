"""Perturbed solutions: a solution with one small slip, which an exercise's random-case check must reject.

Host side (``candidates``): every single-site perturbation of a solution function's AST, in a seeded
order: one numeric constant changed (an int by ±1, a float by ×1.5 or +1), one comparison flipped
(``>`` ↔ ``>=``, ``<`` ↔ ``<=``), one ``+`` ↔ ``-`` or ``*`` ↔ ``/`` (a binary operation or an augmented
assignment), one reduction or bound replaced by its twin (``sum`` ↔ ``mean``, ``min`` ↔ ``max``,
``minimum`` ↔ ``maximum``, ``argmin`` ↔ ``argmax``, ...).

Kernel side (``wrap``, ``pick``, ``set_check_seed``): ``test_tutorials.py`` loads this file into a private
module of the tutorial's kernel (``get_ipython()._tutorial_perturb``), not into the notebook's namespace.
During the solutions run, ``wrap(name)`` puts a recorder around the solution ``name`` and ``hook_cases()``
one around ``expect_cases``: every call of the solution made by the check's random cases is kept with
its output. ``pick(name, sources)`` then runs each candidate on those recorded inputs and picks the first
that never raises and gives a clearly different output somewhere (a candidate that is the same function
on every input the check draws, e.g. a constant in a branch no case reaches, is skipped; the printed
counts say how many). In a run of its own, with the checks' random cases of another seed,
``hook_cases(name, source)`` then hands the chosen candidate to the check's random cases only (its
hand-worked example sees the solution): the check must say ✗, on its random cases alone.
"""

from __future__ import annotations

import ast
import copy
import functools
import json
import random
import signal
from dataclasses import dataclass
from typing import Any

# ----------------------------------------------------------------------------------------------- host side

_FLIP = {ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Lt: ast.LtE, ast.LtE: ast.Lt}
_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult}
#: a method or function replaced by its twin (``r.sum()`` → ``r.mean()``, ``torch.minimum`` → ``torch.maximum``)
_TWIN = {
    "sum": "mean", "mean": "sum", "min": "max", "max": "min", "minimum": "maximum", "maximum": "minimum",
    "amin": "amax", "amax": "amin", "argmin": "argmax", "argmax": "argmin", "clamp_min": "clamp_max",
    "clamp_max": "clamp_min",
}  # fmt: skip


@dataclass(frozen=True)
class Candidate:
    source: str  # the perturbed function, as ``ast.unparse`` writes it
    change: str  # "line 7: `a + 1e-06` → `a + 1.000001`" (lines of the unparsed solution)


def candidates(solution_source: str, rng: random.Random) -> list[Candidate]:
    """Every single-site perturbation of the function in ``solution_source`` (its docstring left alone),
    shuffled by ``rng``."""
    original = ast.unparse(ast.parse(solution_source))
    tree = ast.parse(original)
    (func,) = tree.body
    body = func.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    sites: list[tuple[ast.AST, str, Any]] = []  # (node, field, new value)
    for node in (n for stmt in body for n in ast.walk(stmt)):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            if isinstance(node.value, int):
                sites += [(node, "value", node.value + 1), (node, "value", node.value - 1)]
            else:
                sites += [(node, "value", node.value + 1.0)]
                if node.value != 0:
                    sites += [(node, "value", node.value * 1.5)]
        elif isinstance(node, ast.Compare):
            for k, op in enumerate(node.ops):
                if type(op) in _FLIP:
                    ops = list(node.ops)
                    ops[k] = _FLIP[type(op)]()
                    sites.append((node, "ops", ops))
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _SWAP:
            sites.append((node, "op", _SWAP[type(node.op)]()))
        elif isinstance(node, ast.Attribute) and node.attr in _TWIN:
            sites.append((node, "attr", _TWIN[node.attr]))
        elif isinstance(node, ast.Name) and node.id in ("min", "max"):
            sites.append((node, "id", _TWIN[node.id]))
    out = []
    for node, field, new in sites:
        old = getattr(node, field)
        setattr(node, field, new)
        source = ast.unparse(tree)
        setattr(node, field, old)
        if source == original:
            continue
        changed = [
            (i, a, b)
            for i, (a, b) in enumerate(zip(original.splitlines(), source.splitlines(), strict=True), 1)
            if a != b
        ]
        (line, a, b), *_ = changed
        out.append(Candidate(source, f"line {line}: `{a.strip()}` → `{b.strip()}`"))
    rng.shuffle(out)
    return out


# --------------------------------------------------------------------------------------------- kernel side

#: recorded calls of each wrapped solution made by ``expect_cases``: name -> [((args, kwargs), output)]
CALLS: dict[str, list] = {}
#: whether an ``expect_cases`` call is running (its calls are the random cases; the others, the check's
#: hand-worked example, are not recorded)
STATE = {"in_cases": False}
#: the most calls kept per exercise, and the seconds one call of a candidate may take
MAX_CALLS = 200
CALL_TIMEOUT_S = 5.0
#: "clearly different": beyond every check's tolerance (the checks compare at rtol ≤ 1e-5)
RTOL = 1e-3


def _user_ns() -> dict:
    from IPython import get_ipython

    return get_ipython().user_ns


def _copy(value: Any) -> Any:
    try:
        return copy.deepcopy(value)
    except Exception:
        return value


class _Record:
    """What a recorder keeps (an object, not a list or a number, so ``forbid`` sees no data in its closure)."""

    def __init__(self, fn: Any, calls: list) -> None:
        self.fn, self.calls = fn, calls

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        if not STATE["in_cases"] or len(self.calls) >= MAX_CALLS:
            return self.fn(*args, **kwargs)
        before = _copy((args, kwargs))
        result = self.fn(*args, **kwargs)
        self.calls.append((before, _copy(result)))
        return result


def wrap(name: str) -> None:
    """Put a recorder around the notebook's ``name``; the check sees the same function (its source, its
    name): the recorder reads no global and holds no data, so ``forbid`` finds only the solution's names."""
    ns = _user_ns()
    record = _Record(ns[name], CALLS.setdefault(name, []))

    def recorder(*args: Any, **kwargs: Any) -> Any:
        return record(args, kwargs)

    ns[name] = functools.update_wrapper(recorder, ns[name])


def hook_cases(name: str | None = None, source: str | None = None) -> None:
    """Put a hook around the notebook's ``expect_cases`` (after the run's RESTORE put the original back).

    Without arguments it marks the random cases for ``wrap``'s recorder. With ``name`` and ``source`` it
    makes the random cases see the perturbed function ``source`` defines, while everything else in the
    check cell (the hand-worked example, ``forbid``) sees the solution: the check's verdict is then its
    random cases' alone."""
    import linecache

    ns = _user_ns()
    if "expect_cases" not in ns:
        return
    original, state = ns["expect_cases"], STATE
    code = None
    if name is not None and source is not None:
        filename = f"<perturbed {name}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        code = compile(source, filename, "exec")

    def cases(learner: Any, *args: Any, **kwargs: Any) -> Any:
        state["in_cases"] = True
        current = ns.get(name) if name else None
        if code is not None:  # defined now, in the notebook's namespace (its globals), after the solution
            exec(code, ns)
            perturbed = ns[name]
            learner = perturbed if learner is current else learner
        try:
            return original(learner, *args, **kwargs)
        finally:
            state["in_cases"] = False
            if code is not None:
                ns[name] = current

    ns["expect_cases"] = functools.update_wrapper(cases, original)


def set_check_seed(seed: int | None) -> None:
    """``TUTORIAL_CHECK_SEED`` for the checks that follow (``None``: a fresh one per check again)."""
    import os

    if seed is None:
        os.environ.pop("TUTORIAL_CHECK_SEED", None)
    else:
        os.environ["TUTORIAL_CHECK_SEED"] = str(seed)


def same(a: Any, b: Any) -> bool:
    """``a`` is ``b`` up to ``RTOL`` (tensors: shape, dtype and values; containers item by item)."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            try:
                a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
            except (TypeError, ValueError, RuntimeError):
                return False
            if a.numel() != 1 or b.numel() != 1:
                return False
            a, b = a.reshape(()), b.reshape(())
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        a, b = a.detach(), b.detach()
        if not (a.is_floating_point() or a.is_complex()):
            return bool(torch.equal(a, b))
        a, b = a.to(torch.float64), b.to(torch.float64)
        finite = b[torch.isfinite(b)]
        scale = float(finite.abs().max()) if finite.numel() else 0.0
        return bool(torch.allclose(a, b, rtol=RTOL, atol=RTOL * 1e-3 * (1.0 + scale), equal_nan=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return same(torch.tensor(float(a), dtype=torch.float64), torch.tensor(float(b), dtype=torch.float64))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:
        return False


class _TimeUp(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _TimeUp


def pick(name: str, sources: list[str]) -> None:
    """Print ``PERTURB {"name", "index", "calls", "equivalent", "raised"}``: ``index`` is the first of
    ``sources`` that differs from the recorded solution on some recorded call and raises on none (``-1``
    when none does); ``equivalent`` and ``raised`` count the candidates skipped before it."""
    calls = CALLS.get(name, [])
    ns = _user_ns()
    verdict = {"name": name, "index": -1, "calls": len(calls), "equivalent": 0, "raised": 0}
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for index, source in enumerate(sources):
            scope = dict(ns)
            exec(compile(source, f"<perturbed {name} #{index}>", "exec"), scope)
            fn = scope[name]
            differs = raised = False
            for (args, kwargs), expected in calls:
                args, kwargs = _copy(args), _copy(kwargs)
                signal.setitimer(signal.ITIMER_REAL, CALL_TIMEOUT_S)
                try:
                    got = fn(*args, **kwargs)
                except Exception:
                    raised = True
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                if raised:
                    break
                differs = differs or not same(got, expected)
            if raised:
                verdict["raised"] += 1
            elif not differs:
                verdict["equivalent"] += 1
            else:
                verdict["index"] = index
                break
    finally:
        signal.signal(signal.SIGALRM, previous)
    print("PERTURB " + json.dumps(verdict))
