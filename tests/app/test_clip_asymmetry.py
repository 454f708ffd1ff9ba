"""AppTest of page 2 (Clipping asymmetry): the displayed numbers are the library's for the same inputs.

References are computed here: ``token_coefficients`` on a two-row batch built in the test, the
toy's ``clip_asymmetry_net`` (token-mean over its 4 tokens, hence ×4 for the page's bare sum), and
eq. (75)/(76)'s closed form from ``toymodel.theory``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

from cancellation.diagnostics import token_coefficients
from toymodel.scenarios import clip_asymmetry_net
from toymodel.theory import clip_coefficient

from .pages import loaded, metric_text

PAGE = str(Path(__file__).resolve().parents[2] / "app/views/clip_asymmetry.py")


@pytest.fixture
def at() -> AppTest:
    return loaded(PAGE)


def metric(app: AppTest, label: str) -> float:
    return float(metric_text(app, label))


def pair_net(name: str, w: float, a: float, **params) -> float:
    """Net ∂J/∂logp of a token shared by Â = (−A, +A), as the plain sum of the pair's terms."""
    logp = torch.full((2, 1), math.log(w), dtype=torch.float64)
    coef = token_coefficients(
        name,
        logp,
        torch.zeros_like(logp),
        torch.tensor([-a, a], dtype=torch.float64),
        torch.ones_like(logp),
        torch.zeros(2, dtype=torch.long),
        aggregation="seq-mean-token-sum",
        seq_count=1,
        **params,
    )
    return float(coef.sum())


def inputs(app: AppTest) -> tuple[float, float, float]:
    s = app.sidebar
    return float(s.slider(key="w").value), float(s.slider(key="A").value), float(s.slider(key="eps").value)


def assert_numbers_match(app: AppTest) -> None:
    assert not app.exception
    w, a, eps = inputs(app)
    grpo = pair_net("grpo", w, a, epsilon_low=eps, epsilon_high=eps)
    fix = pair_net("grpo_symclip", w, a, epsilon=eps)
    assert metric(app, "Net coefficient, GRPO") == pytest.approx(grpo, rel=1e-5, abs=1e-12)
    assert metric(app, "Net coefficient, GRPO-fix") == pytest.approx(fix, rel=1e-5, abs=1e-12)
    assert metric(app, "Net coefficient, GRPO-fix") == 0.0  # eq. (82)
    # eq. (75)/(76) converted to ∂/∂log π: w·C'(w)
    assert metric(app, "Eq. (75)/(76) prediction, GRPO") == pytest.approx(
        clip_coefficient(w, a, eps, eps), rel=1e-5, abs=1e-12
    )
    assert metric(app, "Eq. (82) prediction, GRPO-fix") == 0.0


def test_default_page_matches_the_library_and_the_toy(at: AppTest) -> None:
    assert_numbers_match(at)
    w, a, eps = inputs(at)
    assert (w, a, eps) == (1.5, 1.0, 0.2)
    # the toy's own batch (token-mean over 4 tokens) gives the same number / 4
    assert metric(at, "Net coefficient, GRPO") == pytest.approx(
        4 * clip_asymmetry_net("grpo", w, a), rel=1e-5
    )
    assert metric(at, "Net coefficient, GRPO") == pytest.approx(-1.5, rel=1e-5)  # −A·w, eq. (75)


def test_curves_are_the_library_coefficients(at: AppTest) -> None:
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    traces = {(t["xaxis"] if "xaxis" in t else "x", t["name"]): t for t in spec["data"]}
    # first subplot is GRPO (x), second GRPO-fix (x2)
    grpo_net = traces[("x", "net (sum)")]
    fix_net = traces[("x2", "net (sum)")]
    eps, a = 0.2, 1.0
    for k in range(0, len(grpo_net["x"]), 37):
        w = grpo_net["x"][k]
        assert grpo_net["y"][k] == pytest.approx(
            pair_net("grpo", w, a, epsilon_low=eps, epsilon_high=eps), abs=1e-12
        )
        assert fix_net["y"][k] == pytest.approx(pair_net("grpo_symclip", w, a, epsilon=eps), abs=1e-12)
    pos, neg = traces[("x", "positive trajectory (Â = +A)")], traces[("x", "negative trajectory (Â = −A)")]
    assert [p + n for p, n in zip(pos["y"], neg["y"], strict=True)] == pytest.approx(grpo_net["y"], abs=1e-14)
    # the non-cancelling region is shaded on the GRPO subplot (x): [w_min, 1 − ε] and [1 + ε, w_max]
    rects = [(s["xref"], s["x0"], s["x1"]) for s in spec["layout"]["shapes"] if s["type"] == "rect"]
    assert rects == [("x", grpo_net["x"][0], pytest.approx(0.8)), ("x", pytest.approx(1.2), 2.0)]


@pytest.mark.parametrize(
    ("key", "value"), [("eps", 0.35), ("A", 2.2), ("w_max", 3.5), ("w", 0.55), ("w", 1.1)]
)
def test_each_slider_reruns_and_keeps_numbers_right(at: AppTest, key: str, value: float) -> None:
    at.sidebar.slider(key=key).set_value(value).run()
    assert_numbers_match(at)


def test_objective_multiselect(at: AppTest) -> None:
    at.sidebar.multiselect(key="objectives").set_value(["GRPO-fix"]).run()
    assert not at.exception
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert [a["text"] for a in spec["layout"]["annotations"]] == ["GRPO-fix"]
    assert_numbers_match(at)
    at.sidebar.multiselect(key="objectives").set_value([]).run()
    assert not at.exception
    assert at.warning and "at least one objective" in at.warning[0].value
    assert_numbers_match(at)  # the numbers at w are still shown


@pytest.mark.parametrize(
    "settings",
    [
        {"eps": 0.0, "w": 0.01},
        {"eps": 0.95, "w": 5.0, "w_max": 5.0},
        {"A": 0.1, "w_max": 1.1, "w": 3.0},
        {"A": 3.0, "eps": 0.0, "w": 1.0},
    ],
)
def test_extreme_slider_values_do_not_crash(at: AppTest, settings: dict[str, float]) -> None:
    for key, value in settings.items():
        at.sidebar.slider(key=key).set_value(value)
    at.run()
    assert not at.error
    assert_numbers_match(at)
