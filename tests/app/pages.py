"""Helpers the page tests share: run a page once, read a displayed metric by its label."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest


def loaded(page: Path | str) -> AppTest:
    """The page run once with its default inputs (asserting it raised nothing)."""
    app = AppTest.from_file(str(page), default_timeout=60)
    app.run()
    assert not app.exception
    return app


def metric_text(app: AppTest, label: str) -> str:
    """The displayed value of the one ``st.metric`` with this label."""
    found = [m for m in app.metric if m.label == label]
    assert len(found) == 1, [m.label for m in app.metric]
    return found[0].value
