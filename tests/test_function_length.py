"""No function over ``MAX_LINES`` lines in the library packages (issue 32: long functions as named steps).

A function's length is its line span: from its ``def`` line to the last line of its body (signature and
docstring included, decorators not; a nested function counts inside its parent and on its own). Read with
``ast`` from the source, so nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The packages held to the limit.
PACKAGES = ("cancellation", "toymodel", "scaledrun")
MAX_LINES = 200


def long_functions(source: str, limit: int = MAX_LINES) -> list[tuple[str, int, int]]:
    """(qualified name, first line, line span) of every function in ``source`` whose span exceeds ``limit``."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    assert child.end_lineno is not None
                    span = child.end_lineno - child.lineno + 1
                    if span > limit:
                        found.append((name, child.lineno, span))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def _function_source(body_lines: int, nested: bool = False) -> str:
    """A function whose span is 1 (its def line) + ``body_lines``; optionally inside a class and ``if``."""
    body = "".join(f"    x{i} = {i}\n" for i in range(body_lines))
    source = "def f():\n" + body
    if nested:
        source = "class C:\n    if True:\n" + "".join(f"        {line}\n" for line in source.splitlines())
    return source


def test_the_measure_counts_the_span_from_def_to_the_last_line():
    # a hand-built function of 1 + n lines: flagged iff 1 + n > limit, under its qualified name
    assert long_functions(_function_source(199)) == []  # 200 lines: at the limit
    assert long_functions(_function_source(200)) == [("f", 1, 201)]
    assert long_functions(_function_source(200, nested=True)) == [("C.f", 3, 201)]
    # a decorator line does not count, a docstring and a multi-line signature do
    src = "@staticmethod\ndef g(\n    a,\n):\n    '''doc\n    more'''\n    return a\n"
    assert long_functions(src, limit=5) == [("g", 2, 6)]
    assert long_functions(src, limit=6) == []


def test_no_function_in_the_library_packages_is_over_the_limit():
    too_long = []
    for package in PACKAGES:
        files = sorted((ROOT / package).rglob("*.py"))
        assert files, f"no Python files under {package}/"
        for path in files:
            for name, line, span in long_functions(path.read_text(encoding="utf-8")):
                too_long.append(f"{path.relative_to(ROOT)}:{line} {name} ({span} lines)")
    assert not too_long, f"functions over {MAX_LINES} lines (split them into named steps): " + "; ".join(
        too_long
    )
