"""Group transforms page (DFPO App. B): every displayed number equals the library's for the same group.

Edits of the data editor go through AppTest's documented route for keyed editors: the edit state
(``edited_rows``/``added_rows``/``deleted_rows``) is assigned on ``at.session_state["group"]`` before
``run()``, exactly what the browser sends when a user edits cells.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from PIL import ImageColor
from streamlit.testing.v1 import AppTest

from cancellation import TRANSFORMS, compute_loss, group_advantages
from cancellation.objectives import sign_aware_clip

PAGE = Path(__file__).resolve().parents[2] / "app/views/transforms.py"
DEFAULT_R = [1.0, 0.0, 0.0]
DEFAULT_S = [1.3, 1.05, 0.7]


def _run(at: AppTest | None = None) -> AppTest:
    at = at or AppTest.from_file(str(PAGE), default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    return at


def _metric(at: AppTest, label: str) -> float:
    (m,) = [m for m in at.metric if m.label == label]
    return float(m.value)


def _pop_var(xs: list[float]) -> float:
    mu = sum(xs) / len(xs)
    return sum((x - mu) ** 2 for x in xs) / len(xs)


def _expected(rewards, s, scale="group", eps_low=0.2, eps_high=0.2, floor=1e-6):
    """The library's numbers for one group, computed here directly (and Asym by a plain loop)."""
    r = torch.tensor(rewards, dtype=torch.float64)
    w = torch.tensor(s, dtype=torch.float64)
    g = torch.zeros(len(rewards), dtype=torch.long)
    adv = group_advantages(r, g, scale=scale)
    s_bar = sign_aware_clip(w, adv, eps_low, eps_high)
    tilde = {
        k: (fn(s_bar, adv, g, floor=floor) if k == "truncate_rebalance" else fn(s_bar, adv, g))
        for k, fn in TRANSFORMS.items()
    }
    return {
        "adv": adv.tolist(),
        "s_bar": s_bar.tolist(),
        "tilde": {k: v.tolist() for k, v in tilde.items()},
        "sum_bar": sum(a * b for a, b in zip(adv.tolist(), s_bar.tolist(), strict=True)),
        "sums": {
            k: sum(a * b for a, b in zip(adv.tolist(), v.tolist(), strict=True)) for k, v in tilde.items()
        },
        "asym_before": _pop_var([a * b for a, b in zip(adv.tolist(), s_bar.tolist(), strict=True)]),
        "asym_after": {
            k: _pop_var([a * b for a, b in zip(adv.tolist(), v.tolist(), strict=True)])
            for k, v in tilde.items()
        },
    }


def _results(at: AppTest):
    """The read-only results table (the others are the editor and the shared-token table)."""
    (table,) = [d for d in at.dataframe if d.editing_mode == "read_only" and "Â" in d.value.columns]
    return table.value


def _nets(at: AppTest):
    """The shared-token table: one row per estimator, one column per weight (GSPO's s̄, each s̃)."""
    (table,) = [d for d in at.dataframe if d.value.index.name == "estimator"]
    return table.value


def _assert_page_matches(at: AppTest, exp: dict) -> None:
    # metrics are shown with 6 decimals
    assert _metric(at, "Σ Â s̄ (GSPO)") == pytest.approx(exp["sum_bar"], abs=1e-6)
    for k in TRANSFORMS:
        assert _metric(at, f"Σ Â s̃ — {k}") == pytest.approx(exp["sums"][k], abs=1e-6)
        assert _metric(at, f"Asym after — {k}") == pytest.approx(exp["asym_after"][k], abs=1e-6)
    assert _metric(at, "Asym before: s̄ (GSPO)") == pytest.approx(exp["asym_before"], abs=1e-6)
    # the results table holds full precision
    table = _results(at)
    assert table["Â"].tolist() == pytest.approx(exp["adv"], abs=1e-12)
    assert table["s̄ (eq. 47)"].tolist() == pytest.approx(exp["s_bar"], abs=1e-12)
    for k in TRANSFORMS:
        assert table[f"s̃ {k}"].tolist() == pytest.approx(exp["tilde"][k], abs=1e-12)


def test_defaults_load_and_match_the_library():
    at = _run()
    assert at.title[0].value == "Group transforms"
    assert at.data_editor(key="group").value["s"].tolist() == DEFAULT_S
    exp = _expected(DEFAULT_R, DEFAULT_S)
    _assert_page_matches(at, exp)
    # the transforms that enforce the constraint reach Σ Â s̃ = 0, GSPO's s̄ does not (hand check)
    assert abs(exp["sum_bar"]) > 0.1
    assert all(abs(v) < 1e-9 for v in exp["sums"].values())
    assert not at.error and not at.warning and not at.info


def test_defaults_show_the_projection_and_orth_proj_moving_asym():
    """The first screen shows what the page is about: the projection is drawn (G = 3) and Orth-Proj's
    Asym differs from GSPO's, read from the page's own metrics (it would not move with equal |Â_i|)."""
    at = _run()
    assert len(_results(at)) == 3
    assert {"mesh3d", "scatter3d"} <= _chart_types(at)
    before = _metric(at, "Asym before: s̄ (GSPO)")
    after = _metric(at, "Asym after — orth_proj")
    assert abs(after - before) > 0.05, (before, after)
    (m,) = [m for m in at.metric if m.label == "Asym after — orth_proj"]
    assert float(m.delta) == pytest.approx(after - before, abs=2e-6)
    # the reason, from the page's own Â column: the |Â_i| differ
    adv = _results(at)["Â"].tolist()
    assert max(map(abs, adv)) - min(map(abs, adv)) > 0.5
    # and the clip binds on some completions but not all (both cases are on the first screen)
    assert sorted(_results(at)["clip binds"].tolist()) == ["no", "yes", "yes"]


def test_orth_proj_asym_does_not_move_with_equal_advantage_magnitudes():
    """The caption's claim: with every |Â_i| equal (here rewards 1, 0, 1, 0), Orth-Proj leaves Asym as is."""
    at = _run()
    _edit(at, added=[{"reward": 1.0, "s": 0.9}])
    assert _metric(at, "Asym after — orth_proj") == pytest.approx(
        _metric(at, "Asym before: s̄ (GSPO)"), abs=1e-6
    )
    assert "needs G ≤ 3" in at.info[0].value  # G = 4: no picture


def test_asym_equals_the_dfpo_and_gspo_metrics():
    """The page's Asym equals compute_loss's own asym metric of dfpo (each transform) and gspo."""
    at = _run()
    r = torch.tensor(DEFAULT_R, dtype=torch.float64)
    s = torch.tensor(DEFAULT_S, dtype=torch.float64)
    g = torch.zeros(len(DEFAULT_R), dtype=torch.long)
    adv = group_advantages(r, g)
    logp = s.log()[:, None]
    zeros, ones = torch.zeros_like(logp), torch.ones_like(logp)
    eps = {"epsilon_low": 0.2, "epsilon_high": 0.2}
    _, m = compute_loss("gspo", logp, zeros, adv, ones, g, **eps)
    assert _metric(at, "Asym before: s̄ (GSPO)") == pytest.approx(m["asym"], abs=1e-6)
    for k in TRANSFORMS:
        _, m = compute_loss("dfpo", logp, zeros, adv, ones, g, transform=k, **eps)
        assert _metric(at, f"Asym after — {k}") == pytest.approx(m["asym"], abs=1e-6)


@pytest.mark.parametrize(("eps_low", "eps_high"), [(0.2, 0.2), (0.05, 0.5), (0.3, 0.01)])
def test_shared_token_net_under_both_estimators(eps_low, eps_high):
    """G·Σ_i ∂J/∂log s_i by hand: the paper estimator keeps every completion's w_i·Â_i (w = s̄ for the
    eq. 86 control, s̃ for DFPO), ppo_clip drops the completions whose sign-aware clip binds."""
    at = _run()
    at.sidebar.number_input(key="eps_low").set_value(eps_low)
    at.sidebar.number_input(key="eps_high").set_value(eps_high)
    _run(at)
    exp = _expected(DEFAULT_R, DEFAULT_S, eps_low=eps_low, eps_high=eps_high)
    adv, s, s_bar = exp["adv"], DEFAULT_S, exp["s_bar"]
    binds = [(a > 0 and w > 1 + eps_high) or (a < 0 and w < 1 - eps_low) for a, w in zip(adv, s, strict=True)]
    assert _results(at)["clip binds"].tolist() == ["yes" if b else "no" for b in binds]
    table = _nets(at)
    paper, ppo = table.iloc[0], table.iloc[1]
    assert table.index[0].startswith("paper") and table.index[1].startswith("ppo_clip")
    assert paper["GSPO (no transform)"] == pytest.approx(sum(a * b for a, b in zip(adv, s_bar, strict=True)))
    assert ppo["GSPO (no transform)"] == pytest.approx(
        sum(a * w for a, w, b in zip(adv, s, binds, strict=True) if not b), abs=1e-12
    )
    for k in TRANSFORMS:
        tilde = exp["tilde"][k]
        assert paper[k] == pytest.approx(0.0, abs=1e-12)  # Σ Â s̃ = 0 on the gradient
        assert ppo[k] == pytest.approx(
            sum(a * t for a, t, b in zip(adv, tilde, binds, strict=True) if not b), abs=1e-12
        )
    if any(binds):  # a binding clip breaks the balance under ppo_clip (orth_proj's s̃ is not constant)
        assert abs(ppo["orth_proj"]) > 1e-3


@pytest.mark.parametrize("scale", ["batch", "none"])
def test_changing_the_advantage_scale(scale):
    at = _run()
    at.sidebar.selectbox(key="scale").select(scale)
    _run(at)
    _assert_page_matches(at, _expected(DEFAULT_R, DEFAULT_S, scale=scale))


def test_changing_clip_range_and_floor():
    at = _run()
    at.sidebar.number_input(key="eps_low").set_value(0.05)
    _run(at)
    _assert_page_matches(at, _expected(DEFAULT_R, DEFAULT_S, eps_low=0.05))
    at.sidebar.number_input(key="eps_high").set_value(0.5)
    _run(at)
    _assert_page_matches(at, _expected(DEFAULT_R, DEFAULT_S, eps_low=0.05, eps_high=0.5))
    at.sidebar.number_input(key="floor").set_value(1.1)
    _run(at)
    exp = _expected(DEFAULT_R, DEFAULT_S, eps_low=0.05, eps_high=0.5, floor=1.1)
    _assert_page_matches(at, exp)
    # hand check: s̄ = (1.3, 1.05, 0.95), so the floor 1.1 lifts two weights and changes the result
    assert exp["s_bar"] == pytest.approx([1.3, 1.05, 0.95])
    default_floor = _expected(DEFAULT_R, DEFAULT_S, eps_low=0.05, eps_high=0.5)["tilde"]["truncate_rebalance"]
    assert exp["tilde"]["truncate_rebalance"] != pytest.approx(default_floor)


def test_extreme_inputs_do_not_crash():
    at = _run()
    at.sidebar.number_input(key="eps_low").set_value(0.999)
    at.sidebar.number_input(key="eps_high").set_value(10.0)
    at.sidebar.number_input(key="floor").set_value(10.0)
    _run(at)
    _assert_page_matches(at, _expected(DEFAULT_R, DEFAULT_S, eps_low=0.999, eps_high=10.0, floor=10.0))
    at.sidebar.number_input(key="eps_low").set_value(0.0)
    at.sidebar.number_input(key="eps_high").set_value(0.0)
    at.sidebar.number_input(key="floor").set_value(0.0)
    _run(at)
    _assert_page_matches(at, _expected(DEFAULT_R, DEFAULT_S, eps_low=0.0, eps_high=0.0, floor=0.0))


def _edit(at: AppTest, edited=None, added=None, deleted=None) -> AppTest:
    at.session_state["group"] = {
        "edited_rows": edited or {},
        "added_rows": added or [],
        "deleted_rows": deleted or [],
    }
    return _run(at)


def test_editing_cells_adding_and_deleting_rows():
    at = _run()
    _edit(at, edited={0: {"reward": 0.5}, 2: {"s": 2.0}}, added=[{"reward": 0.25, "s": 1.1}], deleted=[1])
    rewards, s = [0.5, 0.0, 0.25], [1.3, 2.0, 1.1]
    table = _results(at)
    assert table["R"].tolist() == rewards and table["s"].tolist() == s
    _assert_page_matches(at, _expected(rewards, s))


def _chart_types(at: AppTest) -> set[str]:
    (chart,) = at.get("plotly_chart")
    return {t.get("type", "scatter") for t in json.loads(chart.proto.spec)["data"]}


def test_picture_for_g2_and_g3_only():
    at = _run()
    _edit(at, deleted=[2])  # G = 2
    _assert_page_matches(at, _expected(DEFAULT_R[:2], DEFAULT_S[:2]))
    assert _chart_types(at) == {"scatter"}
    at = _run()  # G = 3: the default
    _assert_page_matches(at, _expected(DEFAULT_R, DEFAULT_S))
    assert {"mesh3d", "scatter3d"} <= _chart_types(at)
    _edit(at, added=[{"reward": 1.0, "s": 0.9}])  # G = 4: no picture, and the page says why
    _assert_page_matches(at, _expected([*DEFAULT_R, 1.0], [*DEFAULT_S, 0.9]))
    assert not at.get("plotly_chart")
    assert "needs G ≤ 3" in at.info[0].value and "G = 4" in at.info[0].value


def test_all_equal_rewards_warns_and_everything_is_zero():
    at = _run()
    _edit(at, edited={0: {"reward": 0.0}})
    assert "every transform leaves the loss term Σ Â s̃ at 0" in at.warning[0].value.replace("Every", "every")
    assert "nothing is projected" in at.warning[0].value
    for k in TRANSFORMS:
        assert _metric(at, f"Σ Â s̃ — {k}") == 0.0
    assert _metric(at, "Σ Â s̄ (GSPO)") == 0.0
    assert not at.get("plotly_chart")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"edited_rows": {1: {"s": 0.0}}}, "must be > 0"),
        ({"edited_rows": {2: {"s": -0.5}}}, "must be > 0"),
        ({"edited_rows": {0: {"s": None}}}, "empty or non-numeric sequence weight"),
        ({"edited_rows": {2: {"reward": None}}}, "empty or non-numeric reward"),
        ({"deleted_rows": [1, 2]}, "group of one completion"),
        ({"deleted_rows": [0, 1, 2]}, "The group is empty"),
    ],
)
def test_bad_groups_show_an_error(edit, message):
    at = _run()
    _edit(at, **{k.removesuffix("_rows"): v for k, v in edit.items()})
    assert not at.exception
    assert at.error and message in at.error[0].value
    assert not at.metric  # nothing computed from a bad group


#: colour words a caption may use, each with a test on the trace's actual colour (RGB, 0-255)
COLOUR_WORDS = {
    "grey": lambda r, g, b: max(r, g, b) - min(r, g, b) < 20,
    "light-blue": lambda r, g, b: b == max(r, g, b) and b - r > 40 and min(r, g, b) > 110,
    "green": lambda r, g, b: g == max(r, g, b) and g - max(r, b) > 60,
}


def _word_matches(word: str, plotly_color: str) -> bool:
    """The caption's colour word describes the trace's colour (a CSS name or a hex string)."""
    assert word in COLOUR_WORDS, word
    return COLOUR_WORDS[word](*ImageColor.getrgb(plotly_color)[:3])


def _figure(at: AppTest) -> dict:
    (chart,) = at.get("plotly_chart")
    return json.loads(chart.proto.spec)


def _picture_caption(at: AppTest) -> str:
    (caption,) = [c.value for c in at.caption if "is Âᵀv = 0" in c.value]
    return caption


@pytest.mark.parametrize(
    "edit",
    [
        {},  # the default group: Â ∝ (2, −1, −1)
        {"edited": {1: {"reward": 1.0}}},  # two right, one wrong: Â ∝ (1, 1, −2)
        {"edited": {1: {"reward": 0.5}, 2: {"reward": 1.0}, 0: {"reward": 0.0}}},  # Â ∝ (−1, 0, 1)
        {"edited": {0: {"reward": 0.2}, 1: {"reward": 0.9}, 2: {"reward": 0.4, "s": 1.5}}},
    ],
)
def test_the_3d_picture_looks_at_the_plane_and_its_caption_says_what_is_drawn(edit):
    """Plotly's default eye (1.25, 1.25, 1.25) looks along (1, 1, 1), which lies in the plane Âᵀv = 0
    (Σ Â = 0), so the plane was seen edge-on; the page's camera looks along a direction within ~60° of the
    normal Â. The caption names the plane's colour and the lines that bound v ≥ 0, as drawn."""
    at = _run()
    if edit:
        _edit(at, **edit)
    adv = _results(at)["Â"].tolist()
    assert abs(sum(adv)) < 1e-9  # so (1, 1, 1) lies in the plane
    spec = _figure(at)
    scene = spec["layout"]["scene"]
    # the eye is in the scene's normalised coordinates: a direction in v-space only if the axes are equal
    assert scene["xaxis"]["range"] == scene["yaxis"]["range"] == scene["zaxis"]["range"]
    assert scene["aspectmode"] == "cube"
    eye = scene.get("camera", {}).get("eye", {"x": 1.25, "y": 1.25, "z": 1.25})  # plotly's default
    e = [eye["x"], eye["y"], eye["z"]]
    cos = (
        abs(sum(a * x for a, x in zip(adv, e, strict=True))) / math.dist(adv, [0] * 3) / math.dist(e, [0] * 3)
    )
    assert cos >= 0.5, (e, adv)
    # the caption's colours are the traces' colours, and it claims nothing that is not drawn
    caption = _picture_caption(at)
    (plane,) = [t for t in spec["data"] if t["type"] == "mesh3d"]
    assert _word_matches(re.search(r"The ([\w-]+) plane is Âᵀv = 0", caption)[1], plane["color"])
    assert "shaded" not in caption and "grey" not in caption
    edges = [t for t in spec["data"] if t["type"] == "scatter3d" and t["name"].startswith("edge of v ≥ 0")]
    assert len(edges) == 2
    word = re.search(r"the two ([\w-]+) lines from the origin bound its part where v ≥ 0", caption)[1]
    for t in edges:
        assert _word_matches(word, t["line"]["color"])
        start, end = (list(p) for p in zip(t["x"], t["y"], t["z"], strict=True))
        assert start == [0.0, 0.0, 0.0]
        assert min(end) >= 0.0 and max(end) > 0.1  # a ray into v ≥ 0 …
        assert abs(sum(a * x for a, x in zip(adv, end, strict=True))) < 1e-9  # … inside the plane
    assert _word_matches("light-blue", "lightskyblue") and not _word_matches("grey", "lightskyblue")


def test_the_2d_picture_caption_names_the_lines_colour():
    at = _run()
    _edit(at, deleted=[2])  # G = 2
    spec = _figure(at)
    (line,) = [t for t in spec["data"] if t.get("name") == "Âᵀv = 0"]
    caption = _picture_caption(at)
    match = re.search(r"The dashed ([\w-]+) line is Âᵀv = 0", caption)
    assert match and line["line"]["dash"] == "dash" and _word_matches(match[1], line["line"]["color"])
    (quadrant,) = [t for t in spec["data"] if t.get("fill") == "toself"]  # the shaded v ≥ 0 the caption names
    assert "green-shaded quadrant is v ≥ 0" in caption and quadrant["name"] == "v ≥ 0 (eq. 51)"
