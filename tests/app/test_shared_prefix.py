"""AppTest of page 1 (Shared prefix): the displayed numbers are the library's for the same inputs.

References are computed here, independently of the page's code: the net from
``toymodel.scenarios.shared_prefix_net`` (autograd), the closed form from ``toymodel.theory``'s
eq. (38) functions, and the bars from ``token_coefficients`` on the toy's policies.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

from cancellation.diagnostics import token_coefficients
from toymodel.scenarios import SHARED_PREFIX, shared_prefix_net, shared_prefix_policies
from toymodel.theory import eq38_coefficient, eq38_gspo_coefficient

from .pages import loaded, metric_text

PAGE = str(Path(__file__).resolve().parents[2] / "app/views/shared_prefix.py")
NET = "Net coefficient on the shared prefix (t=1)"
CLOSED = "Eq. (38) closed form"

#: the page's objective labels -> (objective, params) at clip range ε (the brief's mapping, written out here)
CALLS = {
    "GRPO": lambda e: ("grpo", {"epsilon_low": e, "epsilon_high": e}),
    "GRPO-fix": lambda e: ("grpo_symclip", {"epsilon": e}),
    "GSPO": lambda e: ("gspo", {"epsilon_low": e, "epsilon_high": e}),
    "GSPO (Π r, eq. 11)": lambda e: ("gspo", {"length_norm": False, "epsilon_low": e, "epsilon_high": e}),
    "GSPO (paper estimator, eq. 86)": lambda e: (
        "gspo",
        {"estimator": "paper", "epsilon_low": e, "epsilon_high": e},
    ),
    "DFPO min_replace": lambda e: ("dfpo", {"transform": "min_replace", "epsilon_low": e, "epsilon_high": e}),
    "DFPO orth_proj": lambda e: ("dfpo", {"transform": "orth_proj", "epsilon_low": e, "epsilon_high": e}),
    "DFPO orth_proj_pos": lambda e: (
        "dfpo",
        {"transform": "orth_proj_pos", "epsilon_low": e, "epsilon_high": e},
    ),
    "DFPO truncate_rebalance": lambda e: (
        "dfpo",
        {"transform": "truncate_rebalance", "epsilon_low": e, "epsilon_high": e},
    ),
    "DFPO min_replace (ppo_clip, trust region)": lambda e: (
        "dfpo",
        {"transform": "min_replace", "estimator": "ppo_clip", "epsilon_low": e, "epsilon_high": e},
    ),
}


@pytest.fixture
def at() -> AppTest:
    return loaded(PAGE)


def metric(app: AppTest, label: str) -> float:
    return float(metric_text(app, label))


def inputs(app: AppTest) -> tuple[str, float, float, float, float, float, float]:
    s = app.sidebar
    return (
        s.selectbox(key="objective").value,
        *(float(s.slider(key=k).value) for k in ("rho1", "rho2", "lam1", "lam2", "A", "eps")),
    )


def library_net(
    label: str, rho1: float, rho2: float, lam1: float, lam2: float, a: float, eps: float
) -> float:
    name, params = CALLS[label](eps)
    return shared_prefix_net(name, rho1, rho2, lam1, lam2, advantage=a, **params)[0]


def assert_numbers_match(app: AppTest) -> None:
    assert not app.exception
    label, *values = inputs(app)
    expected = library_net(label, *values)
    assert metric(app, NET) == pytest.approx(expected, rel=1e-5, abs=1e-12)


def test_default_page_shows_the_library_net_and_eq38(at: AppTest) -> None:
    label, rho1, rho2, lam1, lam2, a, eps = inputs(at)
    assert label == "GSPO"
    net = shared_prefix_net("gspo", rho1, rho2, lam1, lam2, advantage=a, epsilon_low=eps, epsilon_high=eps)[0]
    assert metric(at, NET) == pytest.approx(net, rel=1e-5)
    # GSPO's length-normalised eq. (38): (A/(G·T))·(s2 − s1); no clip binds at the defaults
    closed = eq38_gspo_coefficient(rho1, rho2, lam1, lam2, a, epsilon_low=eps, epsilon_high=eps)
    assert metric(at, CLOSED) == pytest.approx(closed, rel=1e-5)
    assert abs(closed) > 1e-3
    assert any("length-normalised" in c.value for c in at.caption)


def test_bars_are_the_token_coefficients_of_both_trajectories(at: AppTest) -> None:
    _, rho1, rho2, lam1, lam2, a, eps = inputs(at)
    policy = SHARED_PREFIX.policy()
    idx = torch.tensor(
        [policy.trajectory_index(("answer", "is", "25")), policy.trajectory_index(("answer", "is", "20"))]
    )
    new, old = shared_prefix_policies(rho1, rho2, lam1, lam2)
    coef = token_coefficients(
        "gspo",
        policy.token_logp(new, idx),
        policy.token_logp(old, idx),
        torch.tensor([-a, a], dtype=torch.float64),
        policy.mask[idx],
        torch.zeros(2, dtype=torch.long),
        epsilon_low=eps,
        epsilon_high=eps,
    )
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    bars = [t for t in spec["data"] if t["type"] == "bar"]
    assert len(bars) == 2
    assert bars[0]["y"] == pytest.approx(coef[0].tolist(), abs=1e-14)
    assert bars[1]["y"] == pytest.approx(coef[1].tolist(), abs=1e-14)


@pytest.mark.parametrize(
    ("key", "value"),
    [("rho1", 1.45), ("rho2", 0.55), ("lam1", 0.4), ("lam2", 1.9), ("A", 2.5), ("eps", 0.05)],
)
def test_each_slider_reruns_and_keeps_numbers_right(at: AppTest, key: str, value: float) -> None:
    at.sidebar.slider(key=key).set_value(value).run()
    assert float(at.sidebar.slider(key=key).value) == pytest.approx(value)
    assert_numbers_match(at)


@pytest.mark.parametrize("label", list(CALLS))
def test_every_objective(at: AppTest, label: str) -> None:
    at.sidebar.selectbox(key="objective").select(label).run()
    assert_numbers_match(at)
    _, rho1, rho2, lam1, lam2, a, eps = inputs(at)
    closed = metric(at, CLOSED)
    if label.startswith(("GRPO", "DFPO")):
        # eq. (9) (GRPO inside its clip range), eq. (82), eq. (73): the paper predicts exact cancellation
        assert closed == 0.0
    elif label == "GSPO (Π r, eq. 11)":
        assert closed == pytest.approx(
            eq38_coefficient(rho1, rho2, lam1, lam2, a, epsilon_low=eps, epsilon_high=eps), rel=1e-5
        )


def test_clipped_grpo_shows_eq75_and_clipped_gspo_drops_a_trajectory(at: AppTest) -> None:
    at.sidebar.slider(key="rho1").set_value(1.6).run()
    at.sidebar.selectbox(key="objective").select("GRPO").run()
    assert_numbers_match(at)
    # eq. (75) converted: −A·ρ1/6 (token-mean over 6 tokens)
    assert metric(at, CLOSED) == pytest.approx(-1.6 / 6, rel=1e-5)
    assert metric(at, NET) == pytest.approx(-1.6 / 6, rel=1e-5)
    at.sidebar.selectbox(key="objective").select("GSPO (Π r, eq. 11)").run()
    assert_numbers_match(at)
    assert metric(at, CLOSED) == pytest.approx(metric(at, NET), rel=1e-5)


def test_a_binding_sequence_clip_separates_the_estimators(at: AppTest) -> None:
    # λ2 = 1.9: τ2's GSPO ratio s2 = (ρ1ρ2λ2)^(1/3) passes 1 + ε (Â2 = +A), τ1's stays inside
    at.sidebar.slider(key="lam2").set_value(1.9).run()
    _, rho1, rho2, lam1, lam2, a, eps = inputs(at)
    s1, s2 = (rho1 * rho2 * lam1) ** (1 / 3), (rho1 * rho2 * lam2) ** (1 / 3)
    assert s2 > 1 + eps and 1 - eps < s1 < 1 + eps
    g, t = 2, 3
    rows = {r["objective"]: r for r in at.dataframe[0].value.to_dict("records")}
    # by hand (eq. 72): GSPO and DFPO's ppo_clip variant drop τ2, so only τ1's −A·s1/(G·T) is left (for
    # min_replace s̃1 = min(s̄1, s̄2) = s1); the eq. (86) control keeps both s̄_i·Â_i/(G·T), s̄2 = 1 + ε;
    # DFPO under the paper's estimator keeps both with Σ Â s̃ = 0
    expected = {
        "GSPO": -a * s1 / (g * t),
        "DFPO min_replace (ppo_clip, trust region)": -a * s1 / (g * t),
        "GSPO (paper estimator, eq. 86)": a * ((1 + eps) - s1) / (g * t),
        "DFPO min_replace": 0.0,
        "DFPO orth_proj": 0.0,
    }
    for label, value in expected.items():
        assert rows[label]["net t=1 (autograd)"] == pytest.approx(value, abs=1e-12), label
        assert rows[label]["closed form (t=1)"] == pytest.approx(value, abs=1e-12), label
    # a ppo_clip row whose clip binds is labelled as DFPO's trust-region row is: the clipped term dropped
    for label in ("GSPO", "GSPO (Π r, eq. 11)", "DFPO min_replace (ppo_clip, trust region)"):
        assert rows[label]["equation"] == "eq. (72), clipped term dropped", label
    assert rows["GSPO (paper estimator, eq. 86)"]["equation"].startswith("eq. (86)")
    assert "clipped" not in rows["DFPO min_replace"]["equation"]
    at.sidebar.selectbox(key="objective").select("GSPO").run()
    assert any(c.value.startswith("**eq. (72), clipped term dropped**") for c in at.caption)
    assert_numbers_match(at)


def test_table_lists_every_objectives_net(at: AppTest) -> None:
    _, rho1, rho2, lam1, lam2, a, eps = inputs(at)
    df = at.dataframe[0].value
    assert list(df["objective"]) == list(CALLS)
    for _, row in df.iterrows():
        name, params = CALLS[row["objective"]](eps)
        nets = shared_prefix_net(name, rho1, rho2, lam1, lam2, advantage=a, **params)
        assert row["net t=1 (autograd)"] == pytest.approx(nets[0], abs=1e-14)
        assert row["net t=2 (autograd)"] == pytest.approx(nets[1], abs=1e-14)
        assert row["closed form (t=1)"] == pytest.approx(nets[0], abs=1e-12)
        assert row["cancels"] == ("yes" if max(abs(nets[0]), abs(nets[1])) < 1e-12 else "no")


def test_unreachable_lambdas_show_a_message_not_a_traceback(at: AppTest) -> None:
    at.sidebar.slider(key="lam1").set_value(3.0).run()  # 0.3·(3.0 + 0.7) ≥ 1
    assert not at.exception
    assert at.error and "not reachable" in at.error[0].value and "λ1" in at.error[0].value
    assert not at.metric
    at.sidebar.slider(key="lam1").set_value(1.0).run()
    assert not at.error
    assert_numbers_match(at)


@pytest.mark.parametrize(
    "settings",
    [
        {"rho1": 0.05, "rho2": 1.95, "eps": 0.0},
        {"rho1": 1.95, "rho2": 0.05, "lam1": 0.05, "lam2": 3.25, "eps": 0.95},
        {"lam1": 3.25, "lam2": 0.05, "A": 3.0},
        {"A": 0.1, "eps": 0.95},
    ],
)
def test_extreme_slider_values_do_not_crash(at: AppTest, settings: dict[str, float]) -> None:
    for key, value in settings.items():
        at.sidebar.slider(key=key).set_value(value)
    at.run()
    for label in ("GRPO", "GSPO (Π r, eq. 11)", "DFPO orth_proj_pos"):
        at.sidebar.selectbox(key="objective").select(label).run()
        assert not at.exception
        assert not at.error
        assert_numbers_match(at)
