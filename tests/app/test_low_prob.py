"""AppTest of page 5 (Low-probability tokens): the displayed numbers are the library's for the same inputs.

References are computed here from the plotted points with the library (``softmax_grad_norm_bounds``,
``reweight_advantages``, ``lopti_masks``) and from the Lopti paper's formulas (α·η + 1 − α).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

from cancellation.advantages import reweight_advantages
from cancellation.batching import lopti_masks
from cancellation.diagnostics import softmax_grad_norm_bounds

from .pages import loaded, metric_text

PAGE = str(Path(__file__).resolve().parents[2] / "app/views/low_prob.py")
INSIDE = "Points inside the bounds"
FACTOR = "Reweighting factor at π = η"
LOW = "Tokens in Lopti's low set (π < η)"


@pytest.fixture
def at() -> AppTest:
    return loaded(PAGE)


def metric(app: AppTest, label: str) -> str:
    return metric_text(app, label)


def charts(app: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in app.get("plotly_chart")]


def assert_numbers_match(app: AppTest) -> None:
    assert not app.exception
    s = app.sidebar
    vocab, draws = int(s.number_input(key="vocab").value), int(s.number_input(key="draws").value)
    alpha, eta = float(s.slider(key="alpha").value), float(s.slider(key="eta").value)
    # the reweighting factor at π = η: the library's, and the Lopti paper's α·η + 1 − α
    lib = reweight_advantages(
        torch.ones(1, dtype=torch.float64), torch.tensor([[math.log(eta)]], dtype=torch.float64), alpha
    )
    assert float(metric(app, FACTOR)) == pytest.approx(float(lib[0, 0]), rel=1e-5)
    assert float(metric(app, FACTOR)) == pytest.approx(alpha * eta + 1 - alpha, rel=1e-5)
    # every plotted point lies within Lopti's bounds for this N (and the page says 100%)
    norms_fig, reweighted_fig = charts(app)
    points = norms_fig["data"][0]
    pi = torch.tensor(points["x"], dtype=torch.float64)
    norms = torch.tensor(points["y"], dtype=torch.float64)
    assert pi.numel() == draws
    assert float(pi.min()) > 0.0 and float(pi.max()) < 1.0
    assert float(pi.max() - pi.min()) > 0.5  # the draws span the π axis
    lower, upper = softmax_grad_norm_bounds(pi, vocab)
    assert bool((norms >= lower - 1e-12).all()) and bool((norms <= upper + 1e-12).all())
    assert metric(app, INSIDE) == "100.0%"
    # the second figure: |A·(α·π + 1 − α)|·‖e_y − π‖ with A = 1, from the library's reweighting
    old_logp = pi.log()[:, None]
    ones = torch.ones_like(pi)
    base = reweight_advantages(ones, old_logp, 0.0)[:, 0].abs() * norms
    rew = reweight_advantages(ones, old_logp, alpha)[:, 0].abs() * norms
    assert reweighted_fig["data"][0]["y"] == pytest.approx(base.tolist(), rel=1e-12)
    assert reweighted_fig["data"][1]["y"] == pytest.approx(rew.tolist(), rel=1e-12)
    vlines = [s["x0"] for s in reweighted_fig["layout"]["shapes"] if s["type"] == "line"]
    assert vlines == [pytest.approx(eta)]
    # Lopti's low set, from the library's split of the plotted tokens
    low, _ = lopti_masks(old_logp, torch.ones_like(old_logp), eta)
    assert float(metric(app, LOW).rstrip("%")) == pytest.approx(100 * float(low.double().mean()), abs=0.051)


def test_default_page_matches_the_library(at: AppTest) -> None:
    assert_numbers_match(at)
    assert float(metric(at, FACTOR)) == pytest.approx(0.3 * 0.5 + 0.7)


@pytest.mark.parametrize(("key", "value"), [("alpha", 0.8), ("eta", 0.15), ("alpha", 0.0), ("eta", 1.0)])
def test_each_slider_reruns_and_keeps_numbers_right(at: AppTest, key: str, value: float) -> None:
    at.sidebar.slider(key=key).set_value(value).run()
    assert_numbers_match(at)


@pytest.mark.parametrize(("key", "value"), [("vocab", 2), ("vocab", 1500), ("draws", 300), ("seed", 7)])
def test_each_number_input_reruns_and_keeps_numbers_right(at: AppTest, key: str, value: int) -> None:
    before = charts(at)[0]["data"][0]["x"]
    at.sidebar.number_input(key=key).set_value(value).run()
    assert not at.error
    assert_numbers_match(at)
    assert charts(at)[0]["data"][0]["x"] != before  # new draws


def test_too_many_logits_shows_a_message_not_a_traceback(at: AppTest) -> None:
    at.sidebar.number_input(key="vocab").set_value(200_000).run()
    assert not at.exception
    assert at.error and "too many" in at.error[0].value and "lower" in at.error[0].value
    assert not at.metric
    at.sidebar.number_input(key="draws").set_value(10).run()  # 2·10⁶ logits: fine again
    assert not at.error
    assert_numbers_match(at)


@pytest.mark.parametrize(
    "settings",
    [{"alpha": 1.0, "eta": 0.01}, {"alpha": 0.0, "eta": 1.0}],
)
def test_extreme_slider_values_do_not_crash(at: AppTest, settings: dict[str, float]) -> None:
    for key, value in settings.items():
        at.sidebar.slider(key=key).set_value(value)
    at.sidebar.number_input(key="vocab").set_value(2)
    at.run()
    assert not at.error
    assert_numbers_match(at)
