"""The project's import graph (issue 32): packages import only downward, no circle, nothing private across.

The graph is read from the source with ``ast`` (nothing is imported), and it counts every import statement,
including those inside functions: a lazy import is still a dependency, and a circle closed by one is still a
circle (it only fails later, at call time). An import names the most specific project module it reaches
(``from cancellation.update import coefficients`` → ``cancellation.update``; ``from instruments import
coupling`` → ``instruments.coupling``; ``from cancellation import group_advantages`` → ``cancellation``).
Imports of other distributions (torch, plotly, transformers, ...) are not part of the graph.

Three rules, each a test:

- **layers** (``LAYERS``, the order docs/DESIGN.md draws): a package imports only packages of a lower layer,
  never one of its own layer (so ``toymodel`` and ``scaledrun`` stay independent of each other, and so do
  ``experiments`` and ``app``) nor one above;
- **no module circle**: the module graph has no strongly connected component of more than one module;
- **nothing private across packages**: no ``from a.b import _x`` and no import of a module ``_m`` from
  another package (inside one package, ``_checks`` and the like are shared on purpose).

The three checks are first run on a small hand-written tree with one known fault each, so a checker that
stopped seeing faults would fail here rather than pass the project.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: The project's packages from the bottom up. A package may import only packages of a lower layer.
#: ``cancellation``: the math; ``toymodel`` (the tabular toy), ``scaledrun`` (the LM trainer) and ``plots``
#: (plotly figures) each on the math alone; ``instruments``: the token-level measurements on the toy's
#: neural policy and on a saved LM; ``experiments`` (studies, statistics, report) and ``app`` (Streamlit);
#: ``tutorials`` and ``benchmarks``, folders of scripts on top of everything.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cancellation",),
    ("toymodel", "scaledrun", "plots"),
    ("instruments", "tools"),
    ("experiments", "app"),
    ("tutorials", "benchmarks"),
)

#: Folders of scripts rather than packages (no ``__init__.py``): their files import each other by bare
#: name (a tutorial's ``from exercise_check import check``), from their own working directory.
SCRIPT_FOLDERS = ("tutorials", "benchmarks")


@dataclass(frozen=True)
class Edge:
    """One import statement: ``source`` imports ``target`` (module names) at ``line`` of ``path``."""

    source: str
    target: str
    path: Path
    line: int
    names: tuple[str, ...]  # the names a ``from`` import takes (empty for ``import x``)


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """{dotted module name: file} of every ``.py`` file under ``root / package`` for each package."""
    out: dict[str, Path] = {}
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def _resolve(name: str, modules: Mapping[str, Path]) -> str | None:
    """The longest prefix of the dotted ``name`` that is a project module, or None (another distribution)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_edges(modules: Mapping[str, Path], script_folders: Sequence[str] = SCRIPT_FOLDERS) -> list[Edge]:
    """Every import statement of every module (inside functions too) that reaches another project module."""
    edges: list[Edge] = []
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        top = mod.split(".")[0]
        # a script imports its folder's other files by bare name
        local = top if top in script_folders else None

        def resolve(name: str, local: str | None = local) -> str | None:
            hit = _resolve(f"{local}.{name}", modules) if local is not None else None
            return hit if hit is not None and hit != local else _resolve(name, modules)

        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = resolve(alias.name)
                    if target is not None and target != mod:
                        edges.append(Edge(mod, target, path, node.lineno, ()))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    full = ".".join([*base, node.module] if node.module else base)
                else:
                    full = node.module or ""
                for alias in node.names:
                    # ``from pkg import submodule`` reaches the submodule, ``from pkg import name`` the package
                    target = resolve(f"{full}.{alias.name}") or resolve(full)
                    if target is not None and target != mod:
                        edges.append(Edge(mod, target, path, node.lineno, (alias.name,)))
    return edges


def _package(module: str) -> str:
    return module.split(".")[0]


def _where(edge: Edge, root: Path) -> str:
    return f"{edge.path.relative_to(root)}:{edge.line}"


def circles(edges: Iterable[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return sorted(found)


def circle_report(component: Sequence[str], edges: Iterable[Edge], root: Path) -> str:
    """The import statements that join the modules of one circle, each with its file and line."""
    inside = set(component)
    lines = [
        f"  {e.source} -> {e.target} ({_where(e, root)})"
        for e in edges
        if e.source in inside and e.target in inside
    ]
    return "circle " + " <-> ".join(component) + ":\n" + "\n".join(sorted(set(lines)))


def upward_imports(edges: Iterable[Edge], layers: Sequence[Sequence[str]], root: Path) -> list[str]:
    """Each import of a package of the same or a higher layer, as ``file:line: a -> b (layers i, j)``."""
    layer = {pkg: i for i, group in enumerate(layers) for pkg in group}
    bad = []
    for e in edges:
        a, b = _package(e.source), _package(e.target)
        if a != b and layer[b] >= layer[a]:
            bad.append(
                f"{_where(e, root)}: {e.source} imports {e.target} (layer {layer[a]} -> layer {layer[b]})"
            )
    return sorted(set(bad))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(edges: Iterable[Edge], root: Path) -> list[str]:
    """Each private name or private module that one package takes from another."""
    bad = []
    for e in edges:
        if _package(e.source) == _package(e.target):
            continue
        names = [n for n in e.names if _private(n)]
        names += [p for p in e.target.split(".") if _private(p)]
        if names:
            bad.append(f"{_where(e, root)}: {e.source} takes {', '.join(names)} from {e.target}")
    return sorted(set(bad))


@functools.cache
def _project() -> tuple[dict[str, Path], list[Edge]]:
    packages = [pkg for group in LAYERS for pkg in group]
    modules = module_files(REPO, packages)
    return modules, import_edges(modules)


# ------------------------------------------------------------------------------------------------
# the checker on a hand-written tree with one known fault of each kind


def _write(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_the_checker_finds_a_lazy_circle_an_upward_import_and_a_private_name(tmp_path) -> None:
    _write(
        tmp_path,
        {
            "low/__init__.py": "from .a import f\n",
            "low/a.py": "import torch\n\ndef f():\n    from .b import g  # lazy: closes the circle\n    return g\n",
            "low/b.py": "from low.a import f\nfrom low import _shared\n",
            "low/_shared.py": "",
            "high/__init__.py": "",
            "high/x.py": "from low.b import _helper\nimport low._shared\nfrom low import a\n",
            "high/y.py": "import high.x\n",
            "scripts/run.py": "from helper import h\n",
            "scripts/helper.py": "def h():\n    import high.y\n",
        },
    )
    layers = (("low",), ("high",), ("scripts",))
    modules = module_files(tmp_path, ["low", "high", "scripts"])
    assert set(modules) == {
        "low", "low.a", "low.b", "low._shared", "high", "high.x", "high.y", "scripts.run", "scripts.helper",
    }  # fmt: skip
    edges = import_edges(modules, script_folders=("scripts",))
    pairs = {(e.source, e.target) for e in edges}
    assert pairs == {
        ("low", "low.a"),
        ("low.a", "low.b"),  # inside f, counted
        ("low.b", "low.a"),
        ("low.b", "low._shared"),
        ("high.x", "low.b"),
        ("high.x", "low._shared"),
        ("high.x", "low.a"),
        ("high.y", "high.x"),
        ("scripts.run", "scripts.helper"),  # a bare name, resolved inside the script folder
        ("scripts.helper", "high.y"),
    }  # torch is another distribution: no edge
    assert circles(edges) == [["low.a", "low.b"]]
    assert "low/a.py:4" in circle_report(["low.a", "low.b"], edges, tmp_path)
    assert upward_imports(edges, layers, tmp_path) == []
    # the same tree with scripts below high: its import of high is now upward
    swapped = upward_imports(edges, (("low",), ("scripts",), ("high",)), tmp_path)
    assert swapped == ["scripts/helper.py:2: scripts.helper imports high.y (layer 1 -> layer 2)"]
    # one layer for low and high: importing a package of one's own layer counts as upward
    same = upward_imports(edges, (("low", "high"), ("scripts",)), tmp_path)
    assert [s.split(":")[0] for s in same] == ["high/x.py", "high/x.py", "high/x.py"]
    assert private_imports(edges, tmp_path) == [
        "high/x.py:1: high.x takes _helper from low.b",
        "high/x.py:2: high.x takes _shared from low._shared",
    ]  # low.b's own ``from low import _shared`` stays inside its package


# ------------------------------------------------------------------------------------------------
# the project


def test_every_package_has_a_layer() -> None:
    """A new top-level package (a folder with ``__init__.py``) or script folder must be placed in ``LAYERS``."""
    declared = {pkg for group in LAYERS for pkg in group}
    assert len(declared) == sum(len(group) for group in LAYERS), "a package is in two layers"
    found = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests"}
    found |= {name for name in SCRIPT_FOLDERS if (REPO / name).is_dir()}
    assert found == declared, (
        f"packages without a layer: {sorted(found - declared)}; layers without a package: "
        f"{sorted(declared - found)} (tests/test_import_graph.py LAYERS, and docs/DESIGN.md)"
    )


def test_the_graph_sees_top_level_and_lazy_imports() -> None:
    """The graph is not vacuous: imports known from the source are in it, a lazy one included."""
    modules, edges = _project()
    assert len(modules) > 100
    pairs = {(e.source, e.target) for e in edges}
    assert (
        "app.views.token_coupling",
        "instruments.coupling",
    ) in pairs  # ``from instruments import coupling``
    assert ("experiments.report", "plots") in pairs
    assert ("cancellation.diagnostics", "cancellation.update") in pairs
    # inside ``instruments.coupling_lm.sample_lm_batch``: ``from scaledrun.rollout import generate_rollouts``
    assert ("instruments.coupling_lm", "scaledrun.rollout") in pairs
    assert ("tutorials.09_token_coupling", "tutorials.exercise_check") in pairs  # a bare name


def test_packages_import_only_downward() -> None:
    _, edges = _project()
    bad = upward_imports(edges, LAYERS, REPO)
    assert not bad, "imports of a package of the same or a higher layer (LAYERS):\n" + "\n".join(bad)


def test_no_module_circle() -> None:
    _, edges = _project()
    found = circles(edges)
    assert not found, "\n".join(circle_report(c, edges, REPO) for c in found)


def test_no_private_name_crosses_a_package() -> None:
    _, edges = _project()
    bad = private_imports(edges, REPO)
    assert not bad, "private names imported from another package:\n" + "\n".join(bad)


def design_table(text: str) -> dict[str, tuple[int, set[str]]]:
    """{package: (layer, packages it imports)} from docs/DESIGN.md's table under "Which package imports which"."""
    section = text.split("## Which package imports which", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[int, set[str]]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].isdigit():
            imports = set() if "nothing" in cells[2] else {c.strip(" `") for c in cells[2].split(",")}
            rows[cells[1].strip("`")] = (int(cells[0]), imports)
    return rows


def test_design_md_draws_this_graph() -> None:
    """docs/DESIGN.md's table has one row per package, in its layer, with exactly the packages it imports."""
    _, edges = _project()
    table = design_table((REPO / "docs" / "DESIGN.md").read_text())
    layer = {pkg: i for i, group in enumerate(LAYERS) for pkg in group}
    imports: dict[str, set[str]] = {pkg: set() for pkg in layer}
    for e in edges:
        if _package(e.source) != _package(e.target):
            imports[_package(e.source)].add(_package(e.target))
    assert {pkg: row[0] for pkg, row in table.items()} == layer, "DESIGN.md's layers differ from LAYERS"
    wrong = {
        pkg: (sorted(table[pkg][1]), sorted(got)) for pkg, got in imports.items() if table[pkg][1] != got
    }
    assert not wrong, f"DESIGN.md's imports column (written, read from the code): {wrong}"


def test_design_table_parser_on_a_hand_written_table() -> None:
    text = (
        "# x\n\n## Which package imports which\n\nprose\n\n| layer | package | imports |\n|---|---|---|\n"
        "| 0 | `a` | nothing of the project |\n| 1 | `b` | `a` |\n| 2 | `c` | `a`, `b` |\n\n## Next\n\n| 9 | `z` | `a` |\n"
    )
    assert design_table(text) == {"a": (0, set()), "b": (1, {"a"}), "c": (2, {"a", "b"})}
