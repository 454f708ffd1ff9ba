"""Training lab page: the table shows exactly toymodel's numbers for the same arguments and seeds, every
input reruns cleanly, and incompatible choices show the library's message. Also the reusable figure
builders of ``app/figures.py`` against plain-loop statistics.

Most tests shrink the run (few steps, one or two seeds) by presetting the widgets' session state before
the first run; the default page (3 objectives × 3 seeds × 100 steps) is the ``slow`` test.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.figures import CURVE_TITLES, curve_figure, seed_band, weight_space_figure
from toymodel import simulate
from toymodel.compare import COLUMNS, summarize_variant

PAGE = Path(__file__).resolve().parents[2] / "app/views/training_lab.py"
#: the page's defaults, as simulate arguments
DEFAULTS = {"group_size": 8, "lr": 0.5, "optimizer": "sgd", "inner_epochs": 4}


def _page(**state) -> AppTest:
    at = AppTest.from_file(str(PAGE), default_timeout=120)
    for k, v in {"steps": 8, "seeds": 1, **state}.items():
        at.session_state[k] = v
    return at


def _run(at: AppTest) -> AppTest:
    at.run()
    assert not at.exception, at.exception
    return at


def _table(at: AppTest):
    (df,) = [d for d in at.dataframe if d.editing_mode == "read_only"]
    return df.value


def test_final_reward_equals_simulate_last_row():
    at = _run(_page(variants=["grpo", "dfpo orth_proj_pos"], steps=12))
    assert not at.error
    table = _table(at)
    rows = simulate("equivalent_solutions", "grpo", steps=12, seed=0, **DEFAULTS)
    assert table.loc["grpo", "E[R] final"] == pytest.approx(rows[-1]["expected_reward"], rel=1e-12)
    rows = simulate("equivalent_solutions", "dfpo", steps=12, seed=0, transform="orth_proj_pos", **DEFAULTS)
    assert table.loc["dfpo orth_proj_pos", "E[R] final"] == pytest.approx(
        rows[-1]["expected_reward"], rel=1e-12
    )
    assert table.loc["grpo", "E[R] final ±std"] == 0.0  # one seed


def test_summary_equals_summarize_variant_over_seeds():
    at = _run(_page(variants=["gspo ε=0.2"], seeds=2, steps=10, scenario="template_task", G=4))
    runs = [
        simulate("template_task", "gspo", steps=10, seed=s, **{**DEFAULTS, "group_size": 4},
                 epsilon_low=0.2, epsilon_high=0.2)
        for s in range(2)
    ]  # fmt: skip
    expected = summarize_variant(runs, 0.9)
    row = _table(at).loc["gspo ε=0.2"]
    heads = [c for c in _table(at).columns if not c.endswith("±std") and c != "reached threshold"]
    assert len(heads) == len(COLUMNS)
    for key, head in zip(COLUMNS, heads, strict=True):
        for got, want in ((row[head], expected[key]), (row[f"{head} ±std"], expected[f"{key}_std"])):
            assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert row["reached threshold"] == expected["reached_frac"]


def test_every_curve_is_drawn_with_one_trace_per_variant_and_band():
    at = _run(_page(variants=["grpo", "gspo"], seeds=2, steps=6))
    charts = at.get("plotly_chart")
    assert len(charts) == len(CURVE_TITLES)
    for chart in charts:
        names = [t.get("name") for t in json.loads(chart.proto.spec)["data"]]
        assert names == ["grpo ±1 std", "grpo", "gspo ±1 std", "gspo"]


@pytest.mark.parametrize(
    ("widget", "key", "value"),
    [
        ("selectbox", "scenario", "template_task"),
        ("selectbox", "scenario", "clip_asymmetry"),
        ("multiselect", "variants", ["grpo_symclip", "dfpo truncate_rebalance"]),
        ("slider", "G", 2),
        ("slider", "G", 1),
        ("number_input", "lr", 2.0),
        ("selectbox", "optimizer", "adam"),
        ("slider", "inner", 1),
        ("number_input", "steps", 3),
        ("slider", "seeds", 2),
        ("slider", "num_groups", 3),
        ("slider", "minibatches", 2),  # with 3 groups (set below)
        ("radio", "batching", "random"),
        ("toggle", "rb_on", True),
        ("toggle", "lopti_on", True),
        ("toggle", "ar_on", True),
        ("number_input", "threshold", 0.8),
    ],
)
def test_changing_each_input_reruns(widget, key, value):
    at = _run(_page(variants=["grpo"], steps=4, num_groups=3))
    w = getattr(at.sidebar, widget)(key=key)
    w.select(value) if widget == "selectbox" else w.set_value(value)
    _run(at)
    assert not at.error, at.error
    if key == "G" and value == 1:
        assert "every advantage is 0" in at.warning[0].value


def test_reward_balanced_lopti_and_ar_values_reach_simulate():
    at = _run(_page(variants=["gspo"], steps=6, num_groups=2, rb_on=True, lopti_on=True, ar_on=True))
    at.sidebar.slider(key="rho").set_value(0.4)
    at.sidebar.slider(key="eta").set_value(0.6)
    at.sidebar.slider(key="alpha").set_value(0.3)
    at.sidebar.radio(key="batching").set_value("random")
    at.sidebar.slider(key="minibatches").set_value(2)
    _run(at)
    rows = simulate(
        "equivalent_solutions", "gspo", steps=6, seed=0, num_groups=2, reward_balanced_rho=0.4,
        lopti_eta=0.6, ar_alpha=0.3, batching="random", num_minibatches=2, **DEFAULTS,
    )  # fmt: skip
    assert _table(at).loc["gspo", "E[R] final"] == pytest.approx(rows[-1]["expected_reward"], rel=1e-12)


def test_optimizer_change_resets_the_learning_rate():
    at = _run(_page(variants=["grpo"], steps=3))
    at.sidebar.selectbox(key="optimizer").select("adam")
    _run(at)
    assert at.sidebar.number_input(key="lr").value == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("state", "message"),
    [
        (
            {"variants": ["grpo", "dfpo min_replace"], "ar_on": True},
            "dfpo needs one advantage per completion",
        ),
        ({"variants": ["dfpo orth_proj"], "lopti_on": True}, "dfpo needs one advantage per completion"),
        ({"variants": ["grpo"], "minibatches": 3, "num_groups": 2}, "num_minibatches"),
    ],
)
def test_incompatible_choices_show_the_library_error(state, message):
    at = _run(_page(steps=3, **state))
    assert at.error and message in at.error[0].value
    assert not at.get("plotly_chart")


def test_no_objective_selected():
    at = _run(_page(variants=[]))
    assert "Pick at least one objective" in at.info[0].value


# ------------------------------------------------------------------------------------------------
# app/figures.py


def test_seed_band_is_the_plain_mean_and_sample_std():
    nan = math.nan
    runs = [
        [{"step": 1, "m": 1.0}, {"step": 2, "m": 2.0}, {"step": 3, "m": 5.0}],
        [{"step": 1, "m": 3.0}, {"step": 2, "m": nan}, {"step": 3, "m": 4.0}],
        [{"step": 1, "m": 2.5}, {"step": 2, "m": nan}],  # a shorter run
    ]
    x, mean, std, n = seed_band(runs, "m")
    assert x.tolist() == [1.0, 2.0, 3.0]
    assert n.tolist() == [3, 1, 2]
    assert mean.tolist() == pytest.approx([statistics.mean([1.0, 3.0, 2.5]), 2.0, 4.5])
    assert std.tolist() == pytest.approx(
        [statistics.stdev([1.0, 3.0, 2.5]), 0.0, statistics.stdev([5.0, 4.0])]
    )
    _, mean, std, n = seed_band([[{"step": 1, "m": nan}]], "m")
    assert n.tolist() == [0] and math.isnan(mean[0]) and math.isnan(std[0])


def test_curve_figure_traces():
    runs = {"a": [[{"step": 1, "m": 1.0}, {"step": 2, "m": 3.0}]] * 2, "b": [[{"step": 1, "m": 0.0}]]}
    fig = curve_figure(runs, "m", title="t")
    assert [t.name for t in fig.data] == ["a ±1 std", "a", "b"]  # no band for a single run
    assert list(fig.data[1].y) == [1.0, 3.0]


def test_weight_space_figure_geometry():
    adv, s_bar = [0.5, -1.0, 0.5], [1.2, 0.9, 0.7]
    fig = weight_space_figure(adv, s_bar, {"t": [1.0, 1.0, 1.0]})
    mesh = fig.data[0]
    assert mesh.type == "mesh3d" and len(mesh.i) > 0
    for v in zip(mesh.x, mesh.y, mesh.z, strict=True):  # every vertex lies on Âᵀv = 0
        assert abs(sum(a * c for a, c in zip(adv, v, strict=True))) < 1e-12
    fig2 = weight_space_figure([1.0, -1.0], [1.2, 0.9], {"t": [1.0, 1.0]})
    line = next(t for t in fig2.data if t.name == "Âᵀv = 0")
    assert all(abs(x - y) < 1e-12 for x, y in zip(line.x, line.y, strict=True))  # Âᵀv = 0 is v₁ = v₂
    with pytest.raises(ValueError, match="G = 2 or 3"):
        weight_space_figure([1.0, -1.0, 1.0, -1.0], [1.0] * 4, {})
    with pytest.raises(ValueError, match="every advantage is 0"):
        weight_space_figure([0.0, 0.0], [1.0, 1.0], {})


@pytest.mark.slow
def test_default_page_loads_with_the_default_objectives():
    at = AppTest.from_file(str(PAGE), default_timeout=600)
    _run(at)
    assert not at.error
    assert list(_table(at).index) == ["grpo", "gspo", "dfpo min_replace"]
