"""About / glossary page: the tables show exactly the library's glossaries and objectives; the tutorials
section lists what ``tutorials/`` holds (or says they are not written yet)."""

from __future__ import annotations

import shutil
from pathlib import Path

from streamlit.testing.v1 import AppTest

from cancellation import OBJECTIVES, TRANSFORMS
from cancellation.glossary import ESTIMATOR_DOCS, METER_DOCS, METRIC_DOCS
from cancellation.objectives import ESTIMATORS
from cancellation.update import RESIDUAL_KEYS
from toymodel.glossary import ROW_DOCS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "app/views/about.py"


def _run(page: Path) -> AppTest:
    at = AppTest.from_file(str(page), default_timeout=60)
    at.run()
    assert not at.exception
    return at


def _tables(at: AppTest) -> dict[str, list[dict]]:
    """Each table's records, keyed by its first column's name."""
    out = {}
    for table in at.table:
        df = table.value
        out.setdefault(df.columns[0], []).append(df.to_dict("records"))
    return out


def test_about_loads_and_shows_the_glossaries():
    at = _run(PAGE)
    assert at.title[0].value == "About / glossary"
    tables = _tables(at)
    metric_tables = tables["metric"]
    assert len(metric_tables) == 3
    shown = {r["metric"]: (r["meaning"], r["equation"]) for t in metric_tables for r in t}
    rows = {k: v for k, v in ROW_DOCS.items() if k not in METER_DOCS}
    assert shown == {**METRIC_DOCS, **METER_DOCS, **rows}
    # one table per glossary, no key shown twice: the meters in their own table, not among the rows
    assert {r["metric"] for r in metric_tables[0]} == set(METRIC_DOCS)
    assert [r["metric"] for r in metric_tables[1]] == list(METER_DOCS)
    assert {r["metric"] for r in metric_tables[2]} == set(rows)
    assert sum(len(t) for t in metric_tables) == len(shown)


def test_meter_and_estimator_glossaries_cover_the_library():
    # every meter the toy and the trainer log is documented, and nothing else
    assert list(METER_DOCS) == list(RESIDUAL_KEYS)
    # every estimator of gspo and dfpo, the eq. (86) control and Table 3's ablation have an entry
    for objective in ("gspo", "dfpo"):
        for est in ESTIMATORS:
            assert [k for k in ESTIMATOR_DOCS if k.startswith(f'{objective}, estimator="{est}"')], (
                objective,
                est,
            )
    assert any("eq. 86" in k for k in ESTIMATOR_DOCS) and "dfpo, stop_grad=False" in ESTIMATOR_DOCS
    for key, (meaning, reference) in {**METER_DOCS, **ESTIMATOR_DOCS}.items():
        assert meaning.strip() and reference.strip(), key
    (estimators,) = _tables(_run(PAGE))["estimator"]
    assert {r["estimator"]: (r["meaning"], r["equation"]) for r in estimators} == ESTIMATOR_DOCS


def test_about_lists_every_objective_and_transform():
    tables = _tables(_run(PAGE))
    (objectives,) = tables["objective"]
    assert [r["objective"] for r in objectives] == list(OBJECTIVES)
    assert all(r["paper"] and r["defaults"] for r in objectives)
    (transforms,) = tables["transform"]
    assert [r["transform"] for r in transforms] == list(TRANSFORMS)


def test_about_tutorials_section_matches_the_folder():
    at = _run(PAGE)
    folder = ROOT / "tutorials"
    notebooks = (
        sorted(p.name for p in folder.glob("*.py") if not p.name.startswith("_")) if folder.is_dir() else []
    )
    text = " ".join(m.value for m in at.markdown) + " ".join(i.value for i in at.info)
    if notebooks:
        for name in notebooks:
            assert f"tutorials/{name}" in text
    else:
        assert "The tutorials are not written yet" in text


def test_about_lists_tutorials_with_their_first_markdown_line(tmp_path):
    # the page finds tutorials/ two levels above itself: copy it into a fake repository layout
    page = tmp_path / "app/views/about.py"
    page.parent.mkdir(parents=True)
    shutil.copy(PAGE, page)
    tut = tmp_path / "tutorials"
    tut.mkdir()
    (tut / "02_clipping.py").write_text(
        "# ---\n# jupyter:\n#   jupytext:\n#     formats: py:percent\n# ---\n\n"
        "# %%\nimport torch\n\n# %% [markdown]\n#\n# ## Clipping leaks: App. F by hand\n#\n# More text.\n"
    )
    (tut / "01_shared_prefix.py").write_text(
        "# %% [markdown]\n# # Shared prefix, step by step\n\n# %%\nx = 1\n"
    )
    (tut / "03_plain.py").write_text('"""A plain script without markdown cells."""\nx = 1\n')
    (tut / "_helpers.py").write_text("# %% [markdown]\n# # not a tutorial\n")
    (tut / "notes.txt").write_text("not a notebook")

    at = _run(page)
    text = "\n".join(m.value for m in at.markdown)
    assert not [i for i in at.info if "not written yet" in i.value]
    lines = [line for line in text.splitlines() if line.startswith("- `tutorials/")]
    assert lines == [
        "- `tutorials/01_shared_prefix.py`: Shared prefix, step by step",
        "- `tutorials/02_clipping.py`: Clipping leaks: App. F by hand",
        "- `tutorials/03_plain.py`: A plain script without markdown cells.",
    ]


def test_about_says_tutorials_are_missing_when_the_folder_is_empty(tmp_path):
    page = tmp_path / "app/views/about.py"
    page.parent.mkdir(parents=True)
    shutil.copy(PAGE, page)
    (tmp_path / "tutorials").mkdir()
    at = _run(page)
    assert any("The tutorials are not written yet" in i.value for i in at.info)
