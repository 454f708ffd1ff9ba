"""Training lab page: the table shows exactly toymodel's numbers for the same arguments and seeds, every
input reruns cleanly, and incompatible choices show the library's message. Also the reusable figure
builders of ``plots`` against plain-loop statistics.

Most tests shrink the run (few steps, one or two seeds) by presetting the widgets' session state before
the first run; the default page (3 objectives × 16 seeds × 100 steps) and the page's 10-seed reference
numbers are ``slow`` tests. At the page's defaults the seeds run through ``toymodel.batched.simulate_seeds``
(one call per objective); Adam, the random split, reward-balanced batching, Lopti, AR and the "Objective
metrics" toggle run each seed with ``simulate``: both paths are checked against ``simulate``'s rows.
"""

from __future__ import annotations

import base64
import json
import math
import re
import statistics
import time
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from app.lab_cost import CONFIRM_ABOVE_S
from app.views.training_lab import DEFAULT_SEEDS, MAX_SEEDS, OBJECTIVE_CURVES
from cancellation.update import RESIDUAL_KEYS
from plots import CURVE_TITLES, curve_figure, seed_band, weight_space_figure
from toymodel import simulate
from toymodel.compare import COLUMNS, summarize_variant

PAGE = Path(__file__).resolve().parents[2] / "app/views/training_lab.py"
#: the page's defaults, as simulate arguments
DEFAULTS = {"group_size": 8, "lr": 0.5, "optimizer": "sgd", "inner_epochs": 4}
#: the first screen: these objectives (label -> simulate arguments, written out here) on template_task
FIRST_SCREEN = {
    "gspo": ("gspo", {}),
    "gspo (paper estimator, eq. 86)": ("gspo", {"estimator": "paper"}),
    "dfpo min_replace": ("dfpo", {"transform": "min_replace"}),
}
#: the summary's residual columns: each seed's mean over the steps that had one, then mean/std over seeds
RESIDUAL_HEADS = {
    "shared_residual": "shared residual",
    "group_shared_residual": "group-shared residual",
    "sequence_net_residual": "sequence-net residual",
}


def _page(**state) -> AppTest:
    at = AppTest.from_file(str(PAGE), default_timeout=120)
    for k, v in {"steps": 8, "seeds": 1, "scenario": "equivalent_solutions", **state}.items():
        at.session_state[k] = v
    return at


def _run(at: AppTest) -> AppTest:
    at.run()
    assert not at.exception, at.exception
    return at


def _table(at: AppTest):
    (df,) = [d for d in at.dataframe if d.editing_mode == "read_only"]
    return df.value


def _traces(at: AppTest, metric: str) -> dict[str, list[float]]:
    """The mean curve (the trace named by its label, not the band) of each variant in ``metric``'s figure."""
    (chart,) = [
        c
        for c in at.get("plotly_chart")
        if json.loads(c.proto.spec)["layout"]["yaxis"]["title"]["text"] == metric
    ]
    out = {}
    for t in json.loads(chart.proto.spec)["data"]:
        if not t["name"].endswith("±1 std"):
            y = t["y"]
            if isinstance(y, dict):  # plotly's typed array
                y = np.frombuffer(base64.b64decode(y["bdata"]), dtype=np.dtype(y["dtype"]))
            out[t["name"]] = [float(v) for v in y]
    return out


def _seed_means(scenario: str, objective: str, seeds: int, steps: int, key: str, **kwargs) -> list[float]:
    """``simulate``'s ``key`` at every step, averaged over seeds 0 … ``seeds`` − 1 (the page's mean curve)."""
    runs = [simulate(scenario, objective, steps=steps, seed=s, **kwargs) for s in range(seeds)]
    return [statistics.mean(rows[t][key] for rows in runs) for t in range(steps)]


def _path(at: AppTest) -> str:
    """Which path the page says ran: ``batched`` or ``simulate``."""
    (caption,) = [c.value for c in at.caption if c.value.startswith("Ran ")]
    return "batched" if caption.startswith("Ran each objective's") else "simulate"


def _mean_std(xs: list[float]) -> tuple[float, float]:
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return math.nan, math.nan
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def test_default_seeds_run_batched():
    at = AppTest.from_file(str(PAGE), default_timeout=300)
    at.session_state["steps"] = 2  # everything else at the page's defaults
    _run(at)
    slider = at.sidebar.slider(key="seeds")
    assert (slider.value, slider.max) == (DEFAULT_SEEDS, MAX_SEEDS) == (16, 256)
    assert _path(at) == "batched"
    assert any(
        c.value.startswith(f"Ran each objective's {DEFAULT_SEEDS} seeds as one batched") for c in at.caption
    )


def test_first_screen_defaults_compare_gspo_the_eq86_control_and_dfpo():
    at = AppTest.from_file(str(PAGE), default_timeout=300)
    at.session_state["steps"], at.session_state["seeds"] = 30, 4  # the rest at the page's defaults
    _run(at)
    assert at.sidebar.selectbox(key="scenario").value == "template_task"
    assert at.sidebar.multiselect(key="variants").value == list(FIRST_SCREEN)
    assert _path(at) == "batched"
    # the curves the page draws (one simulate_seeds call per objective) are simulate's seed means
    reward = _traces(at, "expected_reward")
    for label, (objective, params) in FIRST_SCREEN.items():
        mean = _seed_means("template_task", objective, 4, 30, "expected_reward", **DEFAULTS, **params)
        assert reward[label] == pytest.approx(mean, rel=1e-12)
    # GSPO and DFPO draw different curves: DFPO's estimator keeps the clipped sequences' gradients
    assert reward["dfpo min_replace"][-1] - reward["gspo"][-1] > 0.1
    table = _table(at)
    assert table.loc["gspo", "group-shared residual"] > 0.005  # few whole-group events this early
    assert table.loc["dfpo min_replace", "group-shared residual"] < 1e-9
    assert table.loc["dfpo min_replace", "sequence-net residual"] < 1e-9


def test_new_objective_choices_run_and_show_the_library_numbers():
    choices = {
        "gspo (paper estimator, eq. 86)": ("gspo", {"estimator": "paper"}),
        "gspo (paper estimator, eq. 86) ε=0.2": (
            "gspo",
            {"estimator": "paper", "epsilon_low": 0.2, "epsilon_high": 0.2},
        ),
        "dfpo orth_proj (ppo_clip, trust region)": (
            "dfpo",
            {"transform": "orth_proj", "estimator": "ppo_clip"},
        ),
        "dfpo truncate_rebalance (ppo_clip, trust region)": (
            "dfpo",
            {"transform": "truncate_rebalance", "estimator": "ppo_clip"},
        ),
    }
    at = _run(_page(variants=list(choices), steps=10, scenario="template_task"))
    assert not at.error
    # every choice is offered, each call under one label only
    options = at.sidebar.multiselect(key="variants").options
    assert set(choices) <= set(options) and len(options) == len(set(options))
    table = _table(at)
    for label, (objective, params) in choices.items():
        rows = simulate("template_task", objective, steps=10, seed=0, **DEFAULTS, **params)
        assert table.loc[label, "E[R] final"] == pytest.approx(rows[-1]["expected_reward"], rel=1e-12)
        for key, head in RESIDUAL_HEADS.items():
            want = _mean_std([r[key] for r in rows])[0]
            got = table.loc[label, head]
            assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_sequence_net_residual_is_drawn_and_explained():
    at = _run(_page(variants=["grpo", "dfpo min_replace"], steps=6))
    curves = _traces(at, "sequence_net_residual")
    rows = simulate("equivalent_solutions", "grpo", steps=6, seed=0, **DEFAULTS)
    assert curves["grpo"] == pytest.approx([r["sequence_net_residual"] for r in rows], rel=1e-12, nan_ok=True)
    # equivalent_solutions has completions of 5 and 6 tokens: GRPO's token-mean leaves a net per group,
    # DFPO's c_i = s̃_i·Â_i/B cancels whatever the lengths
    assert max(v for v in curves["grpo"] if not math.isnan(v)) > 1e-3
    assert max(v for v in curves["dfpo min_replace"] if not math.isnan(v)) < 1e-9
    assert any("Sequence-net residual" in c.value and "Σ_t ∂J/∂logp" in c.value for c in at.caption)


def test_comparison_sentence_shows_the_tables_numbers():
    at = _run(_page(variants=list(FIRST_SCREEN), steps=12, seeds=2, scenario="template_task"))
    table = _table(at)
    (text,) = [m.value for m in at.markdown if m.value.startswith("**GSPO / eq. (86) control / DFPO")]

    def triple(head: str, fmt: str) -> str:
        return " / ".join(
            "n/a" if math.isnan(v) else format(v, fmt) for v in table.loc[list(FIRST_SCREEN), head]
        )

    assert f"steps to E[R] ≥ 0.9 {triple('steps to threshold', '.1f')};" in text
    assert f"group-shared residual {triple('group-shared residual', '.4f')};" in text
    assert f"template KL at the threshold {triple('template KL at threshold', '.3f')}." in text
    # the 10-seed reference numbers are shown only at the page's defaults (steps and seeds aside)
    assert any(c.value.startswith("At these defaults with 10 seeds") for c in at.caption)
    at.sidebar.slider(key="inner").set_value(2)
    _run(at)
    assert not any(c.value.startswith("At these defaults with 10 seeds") for c in at.caption)
    at.sidebar.multiselect(key="variants").set_value(["gspo", "dfpo min_replace"])
    _run(at)
    assert not [m for m in at.markdown if m.value.startswith("**GSPO / eq. (86) control")]


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
    for key in RESIDUAL_KEYS:  # the meters summarize_variant lacks: the same per-seed means, by hand
        if key not in expected:
            per_seed = [_mean_std([r[key] for r in rows])[0] for rows in runs]
            expected[key], expected[f"{key}_std"] = _mean_std(per_seed)
    keys = [*COLUMNS, *(k for k in RESIDUAL_KEYS if k not in COLUMNS)]
    row = _table(at).loc["gspo ε=0.2"]
    heads = [c for c in _table(at).columns if not c.endswith("±std") and c != "reached threshold"]
    assert len(heads) == len(keys)
    assert {RESIDUAL_HEADS[k] for k in RESIDUAL_KEYS} <= set(heads)
    for key, head in zip(keys, heads, strict=True):
        for got, want in ((row[head], expected[key]), (row[f"{head} ±std"], expected[f"{key}_std"])):
            assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert row["reached threshold"] == expected["reached_frac"]


@pytest.mark.parametrize("objective_metrics", [False, True])
def test_every_curve_is_drawn_with_one_trace_per_variant_and_band(objective_metrics):
    at = _run(_page(variants=["grpo", "gspo"], seeds=2, steps=6, objective_metrics=objective_metrics))
    charts = at.get("plotly_chart")
    titles = [json.loads(c.proto.spec)["layout"]["yaxis"]["title"]["text"] for c in charts]
    if objective_metrics:  # every seed through simulate: the objective's metrics too
        assert _path(at) == "simulate" and sorted(titles) == sorted(CURVE_TITLES)
    else:  # batched: the metrics simulate_seeds does not compute are left out, and the page says so
        assert _path(at) == "batched"
        assert sorted(titles) == sorted(k for k in CURVE_TITLES if k not in OBJECTIVE_CURVES)
        assert set(OBJECTIVE_CURVES) == {"asym", "clip/low_frac", "clip/high_frac"}
        assert any(
            c.value.startswith("Not drawn: Asym") and "Objective metrics" in c.value for c in at.caption
        )
    for chart in charts:
        names = [t.get("name") for t in json.loads(chart.proto.spec)["data"]]
        assert names == ["grpo ±1 std", "grpo", "gspo ±1 std", "gspo"]


def test_objective_metrics_toggle_draws_simulates_clip_fractions():
    at = _run(_page(variants=["gspo"], seeds=2, steps=6, scenario="template_task"))
    assert _path(at) == "batched"
    batched_reward = _traces(at, "expected_reward")["gspo"]
    at.sidebar.toggle(key="objective_metrics").set_value(True)
    _run(at)
    assert "the objective metrics (Asym, clip fractions)" in next(
        c.value for c in at.caption if c.value.startswith("Ran ")
    )
    for key in ("clip/low_frac", "asym", "expected_reward"):
        want = _seed_means("template_task", "gspo", 2, 6, key, **DEFAULTS)
        assert _traces(at, key)["gspo"] == pytest.approx(want, rel=1e-12, nan_ok=True)
    # the two paths agree where both compute a metric
    assert batched_reward == pytest.approx(_traces(at, "expected_reward")["gspo"], rel=1e-12)


@pytest.mark.parametrize(
    ("state", "simulate_kwargs", "reason"),
    [
        ({"optimizer": "adam", "lr": 0.05}, {"optimizer": "adam", "lr": 0.05}, "the adam optimizer"),
        (
            {"batching": "random", "num_groups": 2, "minibatches": 2},
            {"batching": "random", "num_groups": 2, "num_minibatches": 2},
            "the random mini-batch split",
        ),
    ],
)
def test_fallback_path_runs_each_seed_with_simulate(state, simulate_kwargs, reason):
    at = _run(_page(variants=["grpo", "dfpo min_replace"], seeds=3, steps=5, **state))
    assert not at.error
    assert _path(at) == "simulate"
    assert reason in next(c.value for c in at.caption if c.value.startswith("Ran "))
    assert len(at.get("plotly_chart")) == len(CURVE_TITLES)  # the objective's metrics are drawn
    kwargs = {**DEFAULTS, **simulate_kwargs}
    for label, objective, params in (
        ("grpo", "grpo", {}),
        ("dfpo min_replace", "dfpo", {"transform": "min_replace"}),
    ):
        for key in ("expected_reward", "clip/high_frac"):
            want = _seed_means("equivalent_solutions", objective, 3, 5, key, **kwargs, **params)
            assert _traces(at, key)[label] == pytest.approx(want, rel=1e-12, nan_ok=True)


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
# plots


#: every slider of the run at its maximum (steps, a number input, at its default 100): one rerun took
#: minutes, with no warning, before the page asked first
MAXIMA = {"G": 32, "inner": 16, "seeds": MAX_SEEDS, "num_groups": 16, "minibatches": 16}


def _confirm_buttons(at: AppTest) -> list:
    return [b for b in at.button if b.label.startswith("Run (about")]


def _button_seconds(label: str) -> int:
    m = re.fullmatch(r"Run \(about (\d+) (s|min)\)", label)
    assert m, label
    return int(m[1]) * (60 if m[2] == "min" else 1)


def test_the_defaults_run_at_once_without_asking():
    at = AppTest.from_file(str(PAGE), default_timeout=300)
    _run(at)  # every input at its default: 3 objectives × 16 seeds × 100 steps, batched
    assert not _confirm_buttons(at) and not at.warning
    assert _path(at) == "batched"
    reward = _traces(at, "expected_reward")
    assert list(reward) == list(FIRST_SCREEN) and all(len(v) == 100 for v in reward.values())
    assert list(_table(at).index) == list(FIRST_SCREEN)


@pytest.mark.parametrize(
    ("state", "path_words"),
    [
        (MAXIMA, "batched simulator calls (one per objective not yet run, 256 seeds each)"),
        ({"objective_metrics": True}, "48 per-seed `toymodel.simulate` runs"),  # 3 objectives × 16 seeds
    ],
)
def test_a_long_rerun_shows_its_estimate_and_waits_for_confirmation(state, path_words):
    """With the sliders at their maxima (batched) or the default screen on the per-seed path (Objective
    metrics on) the page says how long the rerun would take and runs nothing until the button is pressed
    (not pressed here: it would take minutes)."""
    at = AppTest.from_file(str(PAGE), default_timeout=60)
    for k, v in state.items():
        at.session_state[k] = v
    start = time.perf_counter()
    _run(at)
    assert time.perf_counter() - start < 30  # the simulation alone takes minutes
    (button,) = _confirm_buttons(at)
    seconds = _button_seconds(button.label)
    assert seconds > CONFIRM_ABOVE_S
    (warning,) = at.warning
    assert warning.value.startswith(
        f"**This rerun would take about {button.label[len('Run (about ') : -1]}**"
    )
    assert path_words in warning.value and "Nothing has run yet." in warning.value
    # nothing ran: no path caption, no curves, no summary table
    assert not [c for c in at.caption if c.value.startswith("Ran ")]
    assert not at.get("plotly_chart") and not at.dataframe
    # a rerun with nothing changed still waits (the button was not pressed)
    _run(at)
    assert _confirm_buttons(at) and not at.get("plotly_chart")


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
    assert _path(at) == "batched" and at.sidebar.slider(key="seeds").value == DEFAULT_SEEDS
    table = _table(at)
    assert list(table.index) == list(FIRST_SCREEN)
    # the first screen shows the difference the papers are about: GSPO (its clip silences most
    # sequences after the first inner step) learns slower and leaves a group-shared residual; DFPO does not
    reward = _traces(at, "expected_reward")
    gap = [d - g for d, g in zip(reward["dfpo min_replace"], reward["gspo"], strict=True)]
    assert max(gap) > 0.2
    assert table.loc["gspo", "steps to threshold"] > 2 * table.loc["dfpo min_replace", "steps to threshold"]
    assert table.loc["gspo", "group-shared residual"] > 0.05
    assert table.loc["dfpo min_replace", "group-shared residual"] < 1e-9


def _paired_se(xs: list[float]) -> float:
    return statistics.stdev(xs) / math.sqrt(len(xs))


@pytest.mark.slow
def test_the_pages_10_seed_numbers_are_what_the_simulator_measures():
    """The caption the page shows at its defaults, re-measured: 10 seeds × 150 steps of each run."""
    at = AppTest.from_file(str(PAGE), default_timeout=300)
    at.session_state["steps"], at.session_state["seeds"] = 2, 1  # steps and seeds do not hide the caption
    _run(at)
    (MEASURED_10_SEEDS,) = [
        c.value for c in at.caption if c.value.startswith("At these defaults with 10 seeds")
    ]
    runs = {
        label: [simulate("template_task", obj, steps=150, seed=s, **DEFAULTS, **params) for s in range(10)]
        for label, (obj, params) in FIRST_SCREEN.items()
    }
    summary = {label: summarize_variant(r, 0.9) for label, r in runs.items()}
    steps = [f"{summary[k]['steps_to_threshold']:.0f}" for k in FIRST_SCREEN]
    assert f"GSPO needs {steps[0]} steps" in MEASURED_10_SEEDS
    assert f"control {steps[1]} and DFPO Min-Replace {steps[2]};" in MEASURED_10_SEEDS
    res = [summary[k]["group_shared_residual"] for k in FIRST_SCREEN]
    assert f"group-shared residual {res[0]:.3f} / {res[1]:.4f} / {res[2]:.3f};" in MEASURED_10_SEEDS
    kl = [summary[k]["template_kl_at_threshold"] for k in FIRST_SCREEN]
    assert f"threshold {kl[0]:.3f} / {kl[1]:.3f} / {kl[2]:.3f}" in MEASURED_10_SEEDS

    def kl_at(rows):
        return next(r["template_kl"] for r in rows if r["expected_reward"] >= 0.9)

    diff = [
        kl_at(d) - kl_at(c)
        for d, c in zip(runs["dfpo min_replace"], runs["gspo (paper estimator, eq. 86)"], strict=True)
    ]
    assert (
        f"paired over seeds: {statistics.mean(diff):.3f} ± {_paired_se(diff):.3f} s.e."
        in MEASURED_10_SEEDS.replace("−", "-")
    )
