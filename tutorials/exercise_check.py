"""The tutorials' exercise checks: run your answer, say what is right or wrong, never stop the notebook.

Every exercise of a tutorial is a function ``my_*`` that you write, followed by a check cell of the form

    with check("1.1"):
        expect_close(my_coefficients(a_hat, logp, mask), expected, "∂J/∂logp")

The ``with check(...)`` block prints exactly one status line and never raises, so the notebook runs on
to the end whatever state your answers are in:

- ``✓ Exercise 1.1: correct``
- ``✗ Exercise 1.1: not solved yet — `my_coefficients` still raises NotImplementedError ...`` (or is not
  defined yet: run the exercise cell first)
- ``✗ Exercise 1.1: wrong shape — ...`` / ``wrong value — ... expected ..., got ...`` / ``wrong type — ...``
- ``✗ Exercise 1.1: your code raised TypeError: ...`` followed by the traceback, to debug from.

This file sits next to the tutorials, which import it from their working directory (Jupyter starts a
notebook's kernel in the notebook's folder). It knows nothing about the answers: the check cells
compute the expected values with the library. The solutions are in ``tutorials/solutions/``.
"""

from __future__ import annotations

import ast
import copy
import dis
import functools
import inspect
import linecache
import math
import numbers
import os
import secrets
import sys
import textwrap
import traceback
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = [
    "Wrong", "check", "ensure", "expect_cases", "expect_close", "expect_equal", "forbid", "number", "reject",
    "switched_off",
]  # fmt: skip

#: tensors with at most this many entries are printed in full in a "wrong value" message
_PRINT_NUMEL = 16


class Wrong(Exception):
    """An answer that runs but is not right; its message says what is wrong (raised by the helpers)."""


@contextmanager
def check(exercise: str) -> Iterator[None]:
    """Run the block, then print one status line for ``exercise``; an exception in the block never escapes.

    ``NotImplementedError`` raised by a ``my_*`` function is "not solved yet"; a :class:`Wrong` from one
    of the ``expect_*`` helpers is a wrong answer (its message says how); any other exception is an
    error in your code, printed with its traceback.
    """
    label = f"Exercise {exercise}"
    try:
        yield
    except NotImplementedError as err:
        name = _innermost_function(err)
        if not name.startswith("my_"):
            _report_error(label, err)
            return
        print(
            f"✗ {label}: not solved yet — `{name}` still raises NotImplementedError. Write its body in the "
            "exercise cell above, run that cell, then run this check again."
        )
    except NameError as err:
        name = getattr(err, "name", None) or ""
        if not name.startswith("my_"):
            _report_error(label, err)
            return
        print(f"✗ {label}: not solved yet — `{name}` is not defined: run the exercise cell above first.")
    except Wrong as err:
        print(f"✗ {label}: {err}")
    except Exception as err:
        _report_error(label, err)
    else:
        print(f"✓ {label}: correct")


def ensure(condition: bool, message: str, kind: str = "wrong value") -> None:
    """Raise :class:`Wrong` ("<kind> — <message>") unless ``condition`` holds."""
    if not condition:
        raise Wrong(f"{kind} — {message}")


def number(value: Any, what: str) -> float:
    """``value`` as a float, or :class:`Wrong` saying that the answer is not a number."""
    if value is None:
        raise Wrong(f"wrong type — {what}: your function returned None (did it forget to `return`?)")
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise Wrong(f"wrong type — {what}: expected a number, got {type(value).__name__} {value!r}")
    return float(value)


def expect_close(
    got: Any, expected: Any, what: str, *, at: str = "", atol: float = 1e-12, rtol: float = 1e-5
) -> None:
    """``got`` matches ``expected`` (a tensor or a number) in type, shape, dtype and value (``torch.allclose``).

    ``what`` names the quantity and ``at`` the case being checked (e.g. ``"at w = 1.21"``); both appear
    in the message. A float answer may be a Python number, a one-element tensor or a tensor.
    """
    where = f"{what} {at}".strip()
    exp = expected if isinstance(expected, torch.Tensor) else torch.tensor(expected, dtype=torch.float64)
    if got is None:
        raise Wrong(f"wrong type — {where}: your function returned None (did it forget to `return`?)")
    if not isinstance(got, torch.Tensor):
        if exp.ndim == 0 and not isinstance(got, numbers.Real):
            raise Wrong(f"wrong type — {where}: expected a number, got {type(got).__name__}")
        try:
            got = torch.as_tensor(got, dtype=exp.dtype)
        except (TypeError, ValueError, RuntimeError):
            raise Wrong(
                f"wrong type — {where}: expected {_describe(exp)}, got {type(got).__name__}"
            ) from None
    if exp.ndim == 0 and got.numel() == 1:
        got = got.reshape(())
    if got.shape != exp.shape:
        raise Wrong(
            f"wrong shape — {where}: expected {_describe(exp)}, got a tensor of shape {tuple(got.shape)}"
        )
    if got.dtype != exp.dtype:
        raise Wrong(
            f"wrong dtype — {where}: expected {exp.dtype}, got {got.dtype} (the toy computes in float64; "
            "keep the dtype of the tensors you start from)"
        )
    got = got.detach()
    if torch.allclose(got, exp, rtol=rtol, atol=atol):
        return
    message = f"wrong value — {where}: "
    if exp.numel() <= _PRINT_NUMEL:
        message += f"expected {_fmt(exp)}, got {_fmt(got)}"
    else:
        bad = ~torch.isclose(got, exp, rtol=rtol, atol=atol)
        diff = torch.where(bad, (got - exp).abs().nan_to_num(math.inf), torch.zeros_like(exp))
        index = tuple(int(i) for i in torch.unravel_index(diff.argmax(), exp.shape))
        message += (
            f"{int(bad.sum())} of {exp.numel()} entries differ; the largest difference is at index {index}: "
            f"expected {_fmt(exp[index])}, got {_fmt(got[index])}"
        )
    raise Wrong(message + _hint(got, exp, rtol, atol))


def expect_equal(got: Any, expected: Any, what: str, *, at: str = "") -> None:
    """``got == expected`` for exact answers (a bool, a string, an int)."""
    where = f"{what} {at}".strip()
    if got is None:
        raise Wrong(f"wrong type — {where}: your function returned None (did it forget to `return`?)")
    if isinstance(expected, bool):
        if isinstance(got, torch.Tensor) and got.numel() == 1 and got.dtype == torch.bool:
            got = bool(got)
        elif type(got).__name__ == "bool_":  # numpy's
            got = bool(got)
        if not isinstance(got, bool):
            raise Wrong(f"wrong type — {where}: expected True or False, got {type(got).__name__} {got!r}")
    if got != expected:
        raise Wrong(f"wrong value — {where}: expected {expected!r}, got {got!r}")


def reject(got: Any, mistake: Any, message: str, *, atol: float = 1e-12, rtol: float = 1e-5) -> None:
    """Raise :class:`Wrong` ("wrong value — <message>") when ``got`` equals ``mistake``, the value a known
    mistake gives (hand-written in the check cell), so the message can say what the mistake is.

    Call it before :func:`expect_close`. It does nothing when ``got`` cannot be compared with ``mistake``
    (another type or shape: ``expect_close`` reports those).
    """
    try:
        bad = mistake if isinstance(mistake, torch.Tensor) else torch.tensor(mistake, dtype=torch.float64)
        value = got.detach() if isinstance(got, torch.Tensor) else torch.as_tensor(got, dtype=bad.dtype)
    except (TypeError, ValueError, RuntimeError):
        return
    if value.numel() != bad.numel() or (value.shape != bad.shape and bad.numel() != 1):
        return
    if not (value.dtype.is_floating_point or value.dtype == bad.dtype):
        return
    if torch.allclose(value.reshape(bad.shape).to(bad.dtype), bad, rtol=rtol, atol=atol):
        raise Wrong(f"wrong value — {message}")


@contextmanager
def switched_off(namespace: dict[str, Any], *names: str) -> Iterator[None]:
    """Inside the block, each of ``names`` in ``namespace`` (the notebook's ``globals()``) raises
    :class:`Wrong` ("wrong approach — ..."): an exercise that asks you to write the math yourself
    switches off the library function that would hand the answer over in one call. Put it inside
    ``check(...)``: ``with check("1.1"):`` then ``    with switched_off(globals(), "group_advantages"):``.
    """
    saved = {name: namespace[name] for name in names if name in namespace}
    # the same function reached another way (`import cancellation.coupling as cc; cc.output_overlap`, a
    # package re-export) is switched off too: every loaded module of its package that holds it by that name
    elsewhere: list[tuple[Any, str]] = []
    for name, obj in saved.items():
        package = getattr(obj, "__module__", None)
        if not package:
            continue
        top = package.split(".")[0]
        for mod_name, mod in list(sys.modules.items()):
            if (mod_name == top or mod_name.startswith(top + ".")) and getattr(mod, name, None) is obj:
                elsewhere.append((mod, name))

    def off(name: str) -> Any:
        def stub(*args: Any, **kwargs: Any) -> Any:
            raise Wrong(
                f"wrong approach — `{name}` hands the answer over in one call and is switched off during "
                "this check: write the formula yourself (a few tensor operations)"
            )

        return stub

    for name in names:
        namespace[name] = off(name)
    for mod, name in elsewhere:
        setattr(mod, name, namespace[name])
    try:
        yield
    finally:
        for mod, name in elsewhere:
            setattr(mod, name, saved[name])
        for name in names:
            if name in saved:
                namespace[name] = saved[name]
            else:
                namespace.pop(name, None)


#: The environment variable that fixes the random cases' seed (to rerun a failing check exactly).
SEED_VARIABLE = "TUTORIAL_CHECK_SEED"


def check_seed() -> int:
    """The seed of a check's random cases: ``$TUTORIAL_CHECK_SEED`` when set, else a fresh one each run."""
    value = os.environ.get(SEED_VARIABLE)
    return int(value) if value else secrets.randbelow(2**31)


def expect_cases(
    learner: Callable[..., Any],
    reference: Callable[..., Any],
    make_case: Callable[[torch.Generator], tuple[tuple, str]],
    what: str,
    *,
    n: int = 20,
    seed: int | None = None,
    compare: Callable[..., None] | None = None,
    **tolerance: float,
) -> int:
    """``learner`` agrees with ``reference`` on ``n`` seeded random cases; returns the seed used.

    ``make_case(generator)`` draws one case: ``(args, label)``, the positional arguments of both functions
    and a few words saying what the case is made of (e.g. ``"a group with exactly two valid rows"``), so
    a failure names it. ``reference`` is the check's own, independent computation (plain loops over the
    definition), not the library's and not the solution's. Each function gets its own copy of the
    arguments (an answer that changes its inputs in place cannot change the reference's). ``compare(got,
    expected, what, at=...)`` defaults to :func:`expect_close` with ``tolerance``. The seed is
    :func:`check_seed`'s unless given; every failure prints it, and ``TUTORIAL_CHECK_SEED=<seed>`` reruns
    the same cases.
    """
    base = check_seed() if seed is None else int(seed)
    compare = compare or (lambda got, exp, what, at: expect_close(got, exp, what, at=at, **tolerance))
    for i in range(n):
        generator = torch.Generator().manual_seed(base * 1_000 + i)
        args, label = make_case(generator)
        expected = reference(*_copied(args))
        got = learner(*_copied(args))
        try:
            compare(got, expected, what, at=f"on random case {i + 1} of {n} ({label})")
        except Wrong as err:
            raise Wrong(
                f"{err} [random cases of seed {base}: set {SEED_VARIABLE}={base} to rerun them]"
            ) from None
    return base


def _copied(args: tuple) -> tuple:
    """Each argument copied, tensors inside containers too (``copy.deepcopy``; an argument it cannot copy,
    e.g. a module or a model, is passed as it is)."""
    out = []
    for a in args:
        try:
            out.append(a.clone() if isinstance(a, torch.Tensor) else copy.deepcopy(a))
        except Exception:
            out.append(a)
    return tuple(out)


#: The project's packages: an exercise asks you to write what they compute, so an answer may not call them
#: (unless the exercise lists the name in ``allow``).
PROJECT_PACKAGES = (
    "cancellation",
    "toymodel",
    "plots",
    "instruments",
    "tools",
    "scaledrun",
    "experiments",
    "app",
)
#: Names an answer never needs and that would reach around the exercise (the notebook's globals, other
#: modules' contents, code run from strings).
ALWAYS_REFUSED = (
    "globals", "locals", "vars", "eval", "exec", "compile", "__import__", "importlib", "sys", "inspect",
    "builtins", "__builtins__", "gc", "get_ipython", "__dict__", "__globals__", "__getattribute__",
    "__getattr__", "getattr", "setattr", "delattr",
)  # fmt: skip


def forbid(
    fn: Callable[..., Any], refused: tuple[str, ...] = (), *, allow: tuple[str, ...] = (), why: str = ""
) -> None:
    """Refuse an answer ``fn`` that gets its result another way than the exercise asks (:class:`Wrong`,
    "refused call — ..."), by reading its source and its names, before it runs:

    - a name or attribute in ``refused`` (e.g. ``"backward"``, ``"optim"``, ``"autograd"``), or in
      ``ALWAYS_REFUSED`` (``globals``, ``eval``, ``sys``, ...);
    - an import inside the function, or a global of the notebook that is (or lives in) one of the
      project's packages (``PROJECT_PACKAGES``: ``compute_loss``, a module alias, ...), unless listed in
      ``allow``;
    - a global of the notebook that holds data (a tensor, an array, a number, a container of them),
      unless listed in ``allow``: the expected values, or anything computed for the check, are not
      readable; take what you need as an argument.

    ``why`` is added to the message (what the exercise asks you to write yourself).
    """
    tail = f": {why}" if why else ""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        tree = None  # no source (a builtin, a lambda in a string): the names below still apply
    if tree is not None:
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + (
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
                )
                if any(name.split(".")[0] not in ("math", "torch", "numpy") for name in names) or any(
                    name.startswith(("torch.optim", "torch.autograd")) for name in names
                ):
                    raise Wrong(f"refused call — `{fn.__name__}` imports {', '.join(names)}{tail}")
            name = (
                node.id
                if isinstance(node, ast.Name)
                else node.attr
                if isinstance(node, ast.Attribute)
                else None
            )
            if name is not None and name not in allow and (name in refused or name in ALWAYS_REFUSED):
                raise Wrong(
                    f"refused call — `{fn.__name__}` uses `{name}`, which this exercise asks you not to use{tail}"
                )
    _refuse_reach(fn, f"`{fn.__name__}`", tuple(refused), tuple(allow), tail, set())


def _refuse_reach(
    fn: Callable[..., Any],
    who: str,
    refused: tuple[str, ...],
    allow: tuple[str, ...],
    tail: str,
    seen: set[int],
) -> None:
    """Refuse what ``fn`` reaches by name: its globals, its default arguments and its closure, and through
    the notebook's own functions it calls, what they reach (``who`` says by which path)."""
    seen.add(id(fn))
    namespace = getattr(fn, "__globals__", {})
    code = getattr(fn, "__code__", None)
    reached = [(name, namespace[name]) for name in sorted(_global_names(code)) if name in namespace]
    defaults = tuple(getattr(fn, "__defaults__", None) or ()) + tuple(
        (getattr(fn, "__kwdefaults__", None) or {}).values()
    )
    reached += [("a default argument", value) for value in defaults]
    closure = zip(code.co_freevars if code else (), getattr(fn, "__closure__", None) or (), strict=False)
    reached += [(name, cell.cell_contents) for name, cell in closure if _has_contents(cell)]
    for name, value in [item for pair in reached for item in _unpacked(*pair, namespace)]:
        if name in allow:
            continue
        if name in refused or set(_module_of(value).split(".")) & set(refused):
            raise Wrong(f"refused call — {who} uses `{name}`, which this exercise asks you not to use{tail}")
        if _from_project(value):
            raise Wrong(
                f"refused call — {who} uses `{name}` from the project's library, which computes what the "
                f"exercise asks you to write{tail}"
            )
        if _is_data(value) and not (name == "a default argument" and isinstance(value, numbers.Number)):
            raise Wrong(
                f"refused call — {who} reads the notebook's variable `{name}`: take what you need as an argument "
                f"(the check calls your function on its own cases){tail}"
            )
        if isinstance(value, types.FunctionType) and _defined_in_a_check_cell(value):
            raise Wrong(
                f"refused call — {who} uses `{name}`, which a check cell defined (the check's own reference or "
                f"data): write the computation yourself{tail}"
            )
        if isinstance(value, types.FunctionType) and value.__globals__ is namespace and id(value) not in seen:
            _refuse_reach(value, f"{who} calls `{name}`, which", refused, allow, tail, seen)


def _unpacked(name: str, value: Any, namespace: dict[str, Any], depth: int = 0) -> list[tuple[str, Any]]:
    """``value`` and what it holds by name, for the checks of ``_refuse_reach``: the items of a list, tuple,
    set or dict, and the attributes of a class defined in the notebook or of an instance of one (its
    functions, static and class methods, properties and instance attributes), two levels deep; a library
    function kept in a class attribute or a list is the library all the same."""
    out = [(name, value)]
    if depth >= 2:
        return out
    notebook = namespace.get("__name__", "__main__")
    items: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        items = [(f"{name}[{k!r}]", v) for k, v in list(value.items())[:50]]
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = [(f"{name}[{i}]", v) for i, v in enumerate(list(value)[:50])]
    else:
        cls = value if isinstance(value, type) else type(value)
        if getattr(cls, "__module__", None) == notebook:
            attrs = {
                k: v for klass in cls.__mro__ if klass.__module__ == notebook for k, v in vars(klass).items()
            }
            if not isinstance(value, type):
                attrs.update(getattr(value, "__dict__", {}))
            for k, v in attrs.items():
                if k.startswith("__") and k.endswith("__"):
                    continue
                v = (
                    v.__func__
                    if isinstance(v, (staticmethod, classmethod))
                    else v.fget
                    if isinstance(v, property)
                    else v
                )
                items.append((f"{name}.{k}", v))
    for item_name, item in items:
        out += _unpacked(item_name, item, namespace, depth + 1)
    return out


def _has_contents(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018  (an empty cell raises)
    except ValueError:
        return False
    return True


def _module_of(value: Any) -> str:
    module = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
    return module if isinstance(module, str) else ""


def _defined_in_a_check_cell(fn: types.FunctionType) -> bool:
    """``fn`` was defined in a notebook cell that holds a ``with check(...)`` block (IPython keeps each
    cell's source in ``linecache``)."""
    source = "".join(linecache.getlines(fn.__code__.co_filename))
    return any(line.startswith("with check(") for line in source.splitlines())


def _global_names(code: types.CodeType | None) -> set[str]:
    """The global names a function (and the functions, lambdas and comprehensions inside it) reads."""
    if code is None:
        return set()
    # the names it loads as globals, not its attribute names (`mask.shape` is no read of a global `shape`)
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _from_project(value: Any, depth: int = 0) -> bool:
    """``value`` is (or lives in) one of the project's packages, or holds such a thing: a
    ``functools.partial`` of one, a container of them (a dict of the library's functions)."""
    if _module_of(value).split(".")[0] in PROJECT_PACKAGES:
        return True
    if depth < 2 and isinstance(value, functools.partial):
        return _from_project(value.func, depth + 1)
    if depth < 2 and isinstance(value, (list, tuple, dict, set, frozenset)):
        items = list(value.values() if isinstance(value, dict) else value)[:50]
        return any(_from_project(v, depth + 1) for v in items)
    return False


def _is_data(value: Any) -> bool:
    if isinstance(value, (torch.Tensor, numbers.Number)) and not isinstance(value, bool):
        return True
    if type(value).__module__ == "numpy" and hasattr(value, "shape"):
        return True
    if isinstance(value, (list, tuple, dict, set)):
        items = value.values() if isinstance(value, dict) else value
        return any(_is_data(v) for v in list(items)[:50])
    return False


def _describe(t: torch.Tensor) -> str:
    return "a number" if t.ndim == 0 else f"a tensor of shape {tuple(t.shape)}"


def _fmt(t: torch.Tensor) -> str:
    if t.ndim == 0:
        return f"{t.item():.6g}"
    return "[" + ", ".join(_fmt(row) for row in t) + "]"


def _hint(got: torch.Tensor, exp: torch.Tensor, rtol: float, atol: float) -> str:
    """A pointer for two common slips: the opposite sign, a missing or extra constant factor."""
    if not bool(torch.isfinite(got).all()) or float(exp.abs().max()) <= atol:
        return ""
    if torch.allclose(got, -exp, rtol=rtol, atol=atol):
        return " (the opposite sign)"
    if exp.dtype == torch.float64 and torch.allclose(got.to(torch.float64), exp, rtol=1e-5, atol=1e-6):
        return " (equal to about 6 digits: a step computed in float32? keep your inputs' float64 throughout)"
    if exp.numel() > 1 and exp.dtype.is_floating_point:
        c = float((got * exp).sum() / (exp * exp).sum())
        if c != 0.0 and torch.allclose(got, c * exp, rtol=rtol, atol=atol):
            return f" (yours are {c:.6g} × the expected values: a missing or extra constant factor?)"
    return ""


def _innermost_function(err: BaseException) -> str:
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_name if tb is not None else "?"


def _report_error(label: str, err: Exception) -> None:
    print(f"✗ {label}: your code raised {type(err).__name__}: {err}   (traceback below)")
    tb = err.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:  # start at the check cell
        tb = tb.tb_next
    traceback.print_exception(type(err), err, tb, file=sys.stdout)
