"""The app's entry point: ``app/main.py`` runs its default page, and navigation reaches every page."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]
MAIN = ROOT / "app/main.py"
#: the page files ``app/main.py`` registers, the default page first
PAGES = [
    "shared_prefix.py",
    "clip_asymmetry.py",
    "transforms.py",
    "training_lab.py",
    "low_prob.py",
    "token_coupling.py",
    "runs.py",
    "about.py",
]


@pytest.fixture(scope="module")
def titles() -> dict[str, str]:
    """Each page's title when it runs on its own (not through main.py)."""
    out = {}
    for page in PAGES:
        at = AppTest.from_file(str(ROOT / "app/views" / page), default_timeout=120)
        at.run()
        assert not at.exception, page
        out[page] = at.title[0].value
    return out


def test_every_registered_page_file_exists():
    text = MAIN.read_text()
    for page in PAGES:
        assert f'"{page}"' in text
        assert (ROOT / "app/views" / page).is_file()


def test_pages_have_distinct_titles(titles):
    # so that a title identifies the page that ran
    assert len(set(titles.values())) == len(PAGES)


def test_main_runs_the_default_page(titles):
    at = AppTest.from_file(str(MAIN), default_timeout=120)
    at.run()
    assert not at.exception
    assert at.title[0].value == titles["shared_prefix.py"]


@pytest.mark.parametrize("page", PAGES)
def test_main_switches_to_each_page(page, titles):
    at = AppTest.from_file(str(MAIN), default_timeout=120)
    at.run()
    assert not at.exception
    at.switch_page(f"views/{page}").run()
    assert not at.exception, page
    # the page that ran is the one asked for: its title, as when it runs alone
    assert at.title[0].value == titles[page]
