"""Every tutorial runs top to bottom, as a notebook, in this environment.

Each ``tutorials/NN_*.py`` (jupytext percent format) is converted with ``jupytext.read`` and executed
by ``nbclient`` in a fresh IPython kernel whose working directory is the repository root. A cell that
raises fails the test, and every exercise ends with a check cell (``assert torch.allclose(...)``
against the library's answer), so a wrong exercise solution fails it too. The test also checks that
every exercise check actually ran (it prints "✓ correct") and prints each tutorial's wall time (the
target is under 60 s each on the 2-core CI machine).

The kernel is this interpreter: a ``python3`` kernel spec written by ``ipykernel`` for
``sys.executable`` is put first on ``JUPYTER_PATH``, so a user-level ``python3`` kernel spec that
points at another Python cannot hijack the run.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import jupytext
import nbclient
import nbformat
import pytest
from ipykernel.kernelspec import write_kernel_spec

REPO = Path(__file__).resolve().parents[2]
TUTORIALS = sorted((REPO / "tutorials").glob("[0-9][0-9]_*.py"))
#: per-cell limit; a whole tutorial is meant to take well under a minute
CELL_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def kernel_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A JUPYTER_PATH entry holding a ``python3`` kernel spec for this interpreter."""
    root = tmp_path_factory.mktemp("jupyter")
    write_kernel_spec(root / "kernels" / "python3")
    return root


def _outputs_text(nb: nbformat.NotebookNode) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
            elif "data" in out and "text/plain" in out["data"]:
                parts.append(out["data"]["text/plain"])
    return "".join(parts)


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
def test_tutorial_executes(path: Path, kernel_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_path))
    nb = jupytext.read(path)
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    n_checks = len(re.findall(r"✓ correct", source))
    assert n_checks >= 1, f"{path.name} has no exercise check cell (one printing '✓ correct')"

    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(REPO)}},
    )
    t0 = time.perf_counter()
    client.execute()  # raises CellExecutionError if any cell raises (a failed check included)
    elapsed = time.perf_counter() - t0

    text = _outputs_text(nb)
    assert text.count("✓ correct") == n_checks, (
        f"{path.name}: {n_checks} exercise check(s) in the source, "
        f"{text.count('✓ correct')} printed '✓ correct'"
    )
    print(f"\n  {path.name}: {elapsed:.1f} s ({len(nb.cells)} cells, {n_checks} exercise check(s))")
