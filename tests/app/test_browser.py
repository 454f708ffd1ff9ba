"""Real-browser test: ``streamlit run app/main.py`` driven by Debian's Chromium through playwright.

For each page: open its URL, wait until it has drawn (its plotly figure; see ``PAGES`` for the two
exceptions) and its script run has ended, check that no exception box is shown, then move one sidebar
input by keyboard (focus a slider, ArrowRight; the transforms page has no slider: a number input,
ArrowUp) and wait until a displayed number (``st.metric`` values) or a figure's data changes. About has
no input. The Runs page reads a real tiny run made in the test set-up (``runs_folder``: 12 steps of the
untrained tiny model), passed to the server as ``$CANCELLATION_RUNS_DIR``; its moving-mean window slider
changes the curves, and its side-by-side table must fit the 1,400 px window (no column behind a
scrollbar). A screenshot of each page goes to ``artifacts/screenshots/<page>.png``.

The browser is the system's Chromium (``apt-get install chromium``; ``make setup`` installs it when it
can), never a playwright browser download. The test skips, with the reason, only when no Chromium is
found or playwright cannot launch it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from cancellation import OBJECTIVES, TRANSFORMS
from cancellation.glossary import ESTIMATOR_DOCS, METER_DOCS, METRIC_DOCS
from toymodel.glossary import ROW_DOCS

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
FIGURE, METRIC, TITLE = ".js-plotly-plot", '[data-testid="stMetricValue"]', "h1"
#: (page file stem, url path, what shows that the page has drawn, the sidebar input to move: (widget key,
#: kind) or None). st.navigation derives the url path from the file name; the default page is "/".
#: Drawn: the plotly figure (the transforms page draws its projection for G = 2 or 3; its default group
#: has G = 3), there its st.metric values are waited for; About has neither: its title.
#: The input moves one step by keyboard: a slider with ArrowRight; the transforms page has no slider (its
#: inputs are a data editor, a selectbox and number inputs), so there ε_high's number input takes ArrowUp
#: (0.20 → 0.21, which moves the clipped weight s̄ = min(1.3, 1 + ε_high) of its default group).
PAGES = [
    ("shared_prefix", "", FIGURE, ("rho1", "slider")),
    ("clip_asymmetry", "clip_asymmetry", FIGURE, ("w", "slider")),
    ("transforms", "transforms", METRIC, ("eps_high", "number")),
    ("training_lab", "training_lab", FIGURE, ("seeds", "slider")),
    ("low_prob", "low_prob", FIGURE, ("alpha", "slider")),
    ("token_coupling", "token_coupling", FIGURE, ("lr", "slider")),
    ("runs", "runs", FIGURE, ("window", "slider")),
    ("about", "about", TITLE, None),
]
#: the Runs page reads its default folder from this environment variable (app/views/runs.py); the server
#: gets the folder of ``runs_folder`` (a real 12-step tiny run, so the moving-mean window changes curves)
RUNS_DIR_ENV = "CANCELLATION_RUNS_DIR"
SERVER_START_S = 120  # the first page run imports torch
PAGE_DRAW_MS = 180_000
RERUN_MS = 120_000

# the app's script run has finished (Streamlit marks its root with the script state)
IDLE_JS = """() => document.querySelector('[data-testid="stApp"]')?.getAttribute('data-test-script-state') === 'notRunning'"""
# no element is still a loading placeholder (Streamlit draws tables, charts, ... lazily: a skeleton first)
LOADED_JS = """() => !document.querySelector('[data-testid="stMain"] [data-testid="stSkeleton"]')"""
# each st.dataframe's grid: its content's width and the width it shows (glide-data-grid's scroller)
TABLE_WIDTHS_JS = """() => [...document.querySelectorAll('[data-testid="stDataFrame"] .dvn-scroller')].map(
  e => ({scroll: e.scrollWidth, client: e.clientWidth}))"""
# every displayed st.metric value and every plotly figure's data, as one string
SNAPSHOT_JS = """() => {
  const metrics = [...document.querySelectorAll('[data-testid="stMetricValue"]')].map(e => e.innerText);
  const figures = [...document.querySelectorAll('.js-plotly-plot')].map(e => JSON.stringify(e.data || null));
  return JSON.stringify({metrics, figures});
}"""


def _chromium() -> str | None:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    executable = _chromium()
    if executable is None:
        reason = "browser test skipped: no Chromium found (install Debian's: apt-get install chromium)"
        print(reason)
        pytest.skip(reason)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:  # a dev dependency: a broken set-up, not a reason to skip
        raise RuntimeError("playwright is missing: pip install -e '.[dev]'") from exc
    pw = sync_playwright().start()
    try:
        try:
            chromium = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
        except Exception as exc:  # playwright raises its own Error types for launch failures
            reason = f"browser test skipped: playwright cannot launch {executable}: {exc}".splitlines()[0]
            print(reason)
            pytest.skip(reason)
        yield chromium
        chromium.close()
    finally:
        pw.stop()


@pytest.fixture(scope="module")
def runs_folder(tmp_path_factory) -> Path:
    """A folder with one real run for the Runs page: the tiny model (no warm start), 12 steps of grpo_symclip
    in the folder the README's first hour names (the longest run label it makes: the table must fit).

    When ``$CANCELLATION_RUNS_DIR`` is set, that folder is used instead (e.g. to screenshot a real run).
    """
    if os.environ.get(RUNS_DIR_ENV):
        return Path(os.environ[RUNS_DIR_ENV])
    from scaledrun.config import RunConfig
    from scaledrun.tiny import build_tiny
    from scaledrun.train import train

    root = tmp_path_factory.mktemp("browser_runs")
    model = build_tiny(root / "model", "arithmetic", seed=0, warm_start_steps=0)
    cfg = RunConfig(
        model=str(model), group_size=4, prompts_per_step=2, max_new_tokens=6, truncation="keep",
        steps=12, eval_every=0, save_every=0, num_train=32, num_eval=0, objective="grpo_symclip",
        output_dir=str(root / "runs" / "offpolicy-grpo_symclip"),
    )  # fmt: skip
    train(cfg)
    return root / "runs"


@pytest.fixture(scope="module")
def server(browser, runs_folder, tmp_path_factory) -> Iterator[str]:
    """``streamlit run app/main.py`` on a free port; yields its base URL; killed at teardown."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("streamlit") / "server.log"
    cmd = [
        sys.executable, "-m", "streamlit", "run", "app/main.py",
        "--server.port", str(port),
        "--server.headless", "true",
        "--browser.serverAddress", "localhost",
        "--browser.gatherUsageStats", "false",
        "--server.fileWatcherType", "none",
    ]  # fmt: skip
    with log_path.open("w") as log:
        env = {**os.environ, RUNS_DIR_ENV: str(runs_folder)}
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    base = f"http://localhost:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"streamlit exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{base}/_stcore/health", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"streamlit not healthy after {SERVER_START_S} s:\n{log_path.read_text()[-4000:]}"
                )
            time.sleep(0.25)  # polling the health endpoint
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@pytest.fixture
def page(browser) -> Iterator[object]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    tab = context.new_page()
    yield tab
    context.close()


def _no_exception(tab, name: str) -> None:
    boxes = tab.locator('[data-testid="stException"]')
    assert boxes.count() == 0, f"{name}: the page shows an exception:\n{boxes.first.inner_text()}"


@pytest.mark.parametrize(("name", "url_path", "drawn", "widget"), PAGES, ids=[p[0] for p in PAGES])
def test_page_in_browser(server, page, name, url_path, drawn, widget):
    from playwright.sync_api import expect

    tab = page
    tab.goto(f"{server}/{url_path}", wait_until="domcontentloaded")
    main = tab.locator('[data-testid="stMain"]')
    main.locator(drawn).first.wait_for(state="visible", timeout=PAGE_DRAW_MS)
    tab.wait_for_function(IDLE_JS, timeout=PAGE_DRAW_MS)
    tab.wait_for_function(LOADED_JS, timeout=PAGE_DRAW_MS)
    _no_exception(tab, name)
    sidebar = tab.locator('[data-testid="stSidebar"]')

    if widget is None:
        expect(main.locator("h1").first).to_contain_text("About")
        assert sidebar.get_by_role("slider").count() == 0
        # objectives, transforms, estimators and the three glossaries (metrics, meters, the other
        # simulator rows): drawn tables with their rows
        tables = main.locator('[data-testid="stTable"]')
        expect(tables).to_have_count(6)
        rows = [tables.nth(i).locator("tr").count() - 1 for i in range(6)]  # less the header row
        other_rows = [k for k in ROW_DOCS if k not in METER_DOCS]
        assert rows == [
            len(OBJECTIVES), len(TRANSFORMS), len(ESTIMATOR_DOCS), len(METRIC_DOCS), len(METER_DOCS), len(other_rows),
        ]  # fmt: skip
    else:
        key, kind = widget
        before = tab.evaluate(SNAPSHOT_JS)
        assert before != '{"metrics":[],"figures":[]}', f"{name}: neither a metric nor a figure is shown"
        # a widget with a key carries the CSS class st-key-<key>. Streamlit's slider is a native
        # <input type="range"> (implicit ARIA role "slider", which a CSS [role="slider"] does not match,
        # so playwright's role engine finds it); a number input is an <input>. Both step by keyboard.
        box = sidebar.locator(f".st-key-{key}")
        control = box.get_by_role("slider") if kind == "slider" else box.locator("input")
        expect(control).to_have_count(1)
        old = control.input_value()
        control.focus()
        tab.keyboard.press("ArrowRight" if kind == "slider" else "ArrowUp")
        expect(control).not_to_have_value(old, timeout=RERUN_MS)
        # wait for the rerun: a displayed number or a figure's data differs from before, and the run ended
        tab.wait_for_function(f"(before) => ({SNAPSHOT_JS})() !== before", arg=before, timeout=RERUN_MS)
        tab.wait_for_function(IDLE_JS, timeout=RERUN_MS)
        assert tab.evaluate(SNAPSHOT_JS) != before
        _no_exception(tab, name)

    # the page scrolls inside Streamlit's main container, not the document: grow the viewport to show it all
    height = tab.evaluate("""() => document.querySelector('[data-testid="stMain"]').scrollHeight""")
    tab.set_viewport_size({"width": 1400, "height": max(1000, min(int(height) + 50, 5000))})
    tab.wait_for_function(IDLE_JS, timeout=RERUN_MS)
    tab.wait_for_function(LOADED_JS, timeout=RERUN_MS)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
    if name == "runs":  # the side-by-side table fits: no column (Jitter₂ was) cut off behind a scrollbar
        widths = tab.evaluate(TABLE_WIDTHS_JS)
        assert widths and all(w["scroll"] <= w["client"] + 1 for w in widths), widths
