"""AppTest of the Token coupling page: the numbers it shows are the library's for the same inputs.

The references are recomputed here from the sidebar's values: the batch with
``instruments.coupling.sample_batch``, the output-layer kernel from per-token scores over W_out alone
(``per_token_scores`` + ``coupling_kernel``) against ``proxy_kernel`` (eq. 6-8), the masking effects with
``measure`` and the Boost Rate by a plain count, the value gap (Fig. 5) by a plain loop over the exact
token values (``batch_token_values``) and the actual Δ log π of the step.
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

from cancellation.coupling import coupling_kernel, per_token_scores, proxy_kernel
from instruments import coupling as xc

from ..exactness import FLOAT64_RTOL
from .pages import loaded, metric_text

PAGE = str(Path(__file__).resolve().parents[2] / "app/views/token_coupling.py")
MAXDIFF = "max |K^W − proxy|"
MEAN_BOOST = "Mean Boost"
GAP = "value gap (boosted − suppressed)"
BOOSTED, SUPPRESSED = "mean value, boosted", "mean value, suppressed"
SET_LABEL = {
    "random": "random (as many tokens as 'both')",
    "same_token": "same token",
    "low_confidence": "low confidence",
    "both": "same token & low confidence (Eq. 10)",
}


@pytest.fixture
def at() -> AppTest:
    return loaded(PAGE)


def inputs(app: AppTest) -> dict[str, Any]:
    s = app.sidebar
    return {
        "scenario": s.selectbox(key="scenario").value,
        "seed": int(s.number_input(key="seed").value),
        "group_size": int(s.slider(key="group_size").value),
        "num_groups": int(s.slider(key="num_groups").value),
        "lr": float(s.slider(key="lr").value),
        "update": s.radio(key="update").value,
        "same_sign": bool(s.toggle(key="same_sign").value),
        "low_conf": float(s.slider(key="low_conf").value),
        "set": s.selectbox(key="set").value,
    }


def decode(arr: Any) -> np.ndarray:
    """A plotly array from the figure JSON: a list, or a base64 typed array ``{dtype, bdata, shape}``."""
    if isinstance(arr, dict):
        out = np.frombuffer(base64.b64decode(arr["bdata"]), dtype=np.dtype(arr["dtype"]).newbyteorder("<"))
        if "shape" in arr:
            out = out.reshape([int(d) for d in str(arr["shape"]).split(",")])
        return out
    return np.asarray(arr, dtype=float)


def chart(app: AppTest, key: str) -> dict:
    found = [json.loads(c.proto.spec) for c in app.get("plotly_chart") if c.proto.id.endswith(f"-{key}")]
    assert len(found) == 1, key
    return found[0]


def boost_rate_label(app: AppTest) -> str:
    return f"Boost Rate: {SET_LABEL[inputs(app)['set']]}"


def reference(app: AppTest) -> dict[str, Any]:
    """Everything the page shows, recomputed from the sidebar's inputs."""
    p = inputs(app)
    batch = xc.sample_batch(
        p["scenario"], seed=p["seed"], group_size=p["group_size"], num_groups=p["num_groups"]
    )
    # eq. (6)-(8): the exact kernel of W_out alone against the proxy built from h and π
    head = batch.params[batch.policy.head_slice]
    scores = per_token_scores(lambda: batch.logp_of(batch.params), head)
    k_head = coupling_kernel(scores)
    k_proxy = proxy_kernel(batch.hidden, batch.probs, batch.tokens)
    m = xc.measure(
        batch, lr=p["lr"], same_sign=p["same_sign"], low_conf=p["low_conf"], updates=(p["update"],),
        mask_seed=p["seed"],
    )  # fmt: skip
    # Table 1's Boost Rate of the chosen set: a plain count over the measured candidates
    sel = m.computed[p["set"]]
    me = m.me[p["update"]][p["set"]][sel].tolist()
    rate = sum(1 for x in me if x > 0) / len(me) if me else math.nan
    mean_boost = sum(me) / len(me) if me else math.nan
    # Fig. 5: mean exact value of the tokens the step raised minus of those it lowered (plain loop)
    values = xc.batch_token_values(batch).tolist()
    delta = m.delta[p["update"]].tolist()
    up = [v for v, d in zip(values, delta, strict=True) if d > 0 and not math.isnan(v)]
    down = [v for v, d in zip(values, delta, strict=True) if d < 0 and not math.isnan(v)]
    boosted = sum(up) / len(up) if up else math.nan
    suppressed = sum(down) / len(down) if down else math.nan
    # the no-coupling control: tokens of positive rollouts against those of negative ones (plain loop)
    adv = batch.adv_tok.tolist()
    pos = [v for v, a in zip(values, adv, strict=True) if a > 0 and not math.isnan(v)]
    neg = [v for v, a in zip(values, adv, strict=True) if a < 0 and not math.isnan(v)]
    control = (sum(pos) / len(pos) - sum(neg) / len(neg)) if pos and neg else math.nan
    return {
        "inputs": p,
        "k_head": k_head,
        "k_proxy": k_proxy,
        "k_full": m.kernels["full"],
        "maxdiff": float((m.kernels["head"] - m.kernels["proxy"]).abs().max()),
        "n_candidates": len(me),
        "boost_rate": rate,
        "mean_boost": mean_boost,
        "boosted": boosted,
        "suppressed": suppressed,
        "control": control,
        "delta": m.delta[p["update"]],
        "forced": batch.forced,
    }


def pct(text: str) -> float:
    return float(text.rstrip("%")) / 100.0


def assert_numbers_match(app: AppTest) -> dict[str, Any]:
    assert not app.exception
    assert not app.error
    ref = reference(app)
    p = ref["inputs"]
    # section 1: the proxy equals the exact output-layer kernel (untied, bias-free W_out), up to rounding
    # (float64 kernels: two code paths at FLOAT64_RTOL of the kernel's scale, as each entry is a sum of such terms)
    scale = float(ref["k_proxy"].abs().max())
    torch.testing.assert_close(ref["k_head"], ref["k_proxy"], rtol=0, atol=FLOAT64_RTOL * scale)
    shown = float(metric_text(app, MAXDIFF))
    assert shown == pytest.approx(ref["maxdiff"], rel=1e-2)
    assert shown < 1e-10
    # the heat maps draw those kernels (float32), in batch order
    for key, k in (
        ("kernel_full", ref["k_full"]),
        ("kernel_head", ref["k_head"]),
        ("kernel_proxy", ref["k_proxy"]),
    ):
        z = decode(chart(app, key)["data"][0]["z"])
        np.testing.assert_allclose(z, k.numpy(), rtol=1e-5, atol=1e-6 * float(k.abs().max()))
    # section 2: the actual Δ log π of the movable tokens is the step's
    movable = ~ref["forced"]
    fig = chart(app, "delta")
    ys = np.concatenate([decode(t["y"]) for t in fig["data"] if t["name"] != "y = x"])
    np.testing.assert_allclose(np.sort(ys), np.sort(ref["delta"][movable].numpy()), rtol=1e-12, atol=1e-15)
    # section 3: Boost Rate and Mean Boost of the chosen set, and the paper's rate beside
    assert metric_text(app, "candidates") == str(ref["n_candidates"])
    assert pct(metric_text(app, boost_rate_label(app))) == pytest.approx(ref["boost_rate"], abs=6e-4)
    assert float(metric_text(app, MEAN_BOOST)) == pytest.approx(ref["mean_boost"], rel=1e-3)
    paper = xc.PAPER_BOOST_RATE[p["update"]][p["set"]]
    assert pct(metric_text(app, f"Paper's Boost Rate ({p['update']} column)")) == pytest.approx(
        paper, abs=6e-4
    )
    table = app.dataframe[0].value
    row = table[table["mask set"] == SET_LABEL[p["set"]]].iloc[0]
    assert pct(row["Boost Rate"]) == pytest.approx(ref["boost_rate"], abs=6e-4)
    assert list(table["paper (Table 1)"]) == [
        f"{100 * xc.PAPER_BOOST_RATE[p['update']][s]:.1f}%" for s in xc.MASK_SETS
    ]
    # section 4: the value gap of boosted vs suppressed tokens
    assert float(metric_text(app, BOOSTED)) == pytest.approx(ref["boosted"], rel=1e-3)
    assert float(metric_text(app, SUPPRESSED)) == pytest.approx(ref["suppressed"], rel=1e-3)
    assert float(metric_text(app, GAP)) == pytest.approx(ref["boosted"] - ref["suppressed"], rel=1e-3)
    assert float(metric_text(app, "no-coupling control's gap")) == pytest.approx(ref["control"], rel=1e-3)
    added = ref["boosted"] - ref["suppressed"] - ref["control"]
    assert float(metric_text(app, "what coupling adds (gap − control)")) == pytest.approx(
        added, rel=1e-3, abs=1e-4
    )
    return ref


@pytest.mark.exactness  # the app's kernels and steps against the library's, float64
def test_default_page_matches_the_library(at: AppTest) -> None:
    ref = assert_numbers_match(at)
    p = ref["inputs"]
    assert (p["scenario"], p["group_size"], p["num_groups"], p["set"]) == ("template_task", 8, 4, "both")
    # at the defaults the boosted tokens have the higher value (Sec. 3's claim, on this batch)
    assert ref["boosted"] > ref["suppressed"]
    # the four sets and the paper's rates beside them; the top-k curve ends at the whole batch's gap
    assert len(at.dataframe[0].value) == 4
    curve = chart(at, "topk")["data"][0]
    assert decode(curve["x"])[-1] == pytest.approx(1.0)
    assert decode(curve["y"])[-1] == pytest.approx(ref["boosted"] - ref["suppressed"], rel=1e-9)


@pytest.mark.parametrize(
    ("kind", "key", "value"),
    [
        ("selectbox", "set", "same_token"),
        ("radio", "update", "head"),
        ("slider", "lr", 2.5),
        ("toggle", "same_sign", True),
        ("selectbox", "scenario", "shared_prefix"),
    ],
)
@pytest.mark.exactness  # the app's kernels and steps against the library's, float64
def test_each_input_reruns_and_keeps_numbers_right(at: AppTest, kind: str, key: str, value: object) -> None:
    before = {m.label: m.value for m in at.metric}
    getattr(at.sidebar, kind)(key=key).set_value(value).run()
    assert_numbers_match(at)
    after = {m.label: m.value for m in at.metric}
    assert after != before


def test_marks_and_order_change_the_heat_maps(at: AppTest) -> None:
    fig = chart(at, "kernel_full")
    labels = fig["data"][0]["x"]
    marks = decode(fig["data"][1]["z"]).astype(bool)
    # default marks: same token string and both π(y) < 0.5, never a token with itself
    tokens = [label.split(" ", 1)[1] for label in labels]
    batch = xc.sample_batch()
    low = (batch.probs_taken < 0.5).tolist()
    n = len(labels)
    expected = np.array(
        [[j != k and tokens[j] == tokens[k] and low[j] and low[k] for k in range(n)] for j in range(n)]
    )
    np.testing.assert_array_equal(marks, expected)
    # in batch order, a line before the first token of every group but the first (G = 8 rollouts each)
    first = [int(batch.mask[: 8 * g].sum()) for g in (1, 2, 3)]
    vertical = sorted(sh["x0"] for sh in fig["layout"]["shapes"] if sh["x0"] == sh["x1"])
    assert vertical == [f - 0.5 for f in first]
    assert labels[first[0]].startswith("r8.") and labels[first[0] - 1].startswith("r7.")
    at.sidebar.radio(key="marks").set_value("none").run()
    assert not at.exception
    assert len(chart(at, "kernel_full")["data"]) == 1
    at.sidebar.radio(key="order").set_value("token string").run()
    assert not at.exception
    sorted_labels = chart(at, "kernel_full")["data"][0]["x"]
    assert sorted(sorted_labels) == sorted(labels) and sorted_labels != labels
    assert [label.split(" ", 1)[1] for label in sorted_labels] == sorted(tokens)
    assert not chart(at, "kernel_full")["layout"].get("shapes")  # group lines only in batch order


def test_no_candidate_shows_a_message(at: AppTest) -> None:
    at.sidebar.slider(key="low_conf").set_value(0.0).run()
    assert not at.exception
    assert len(at.error) == 1 and "No candidate" in at.error[0].value and "Raise" in at.error[0].value
    assert not [m for m in at.metric if m.label.startswith("Boost Rate")]
    at.sidebar.slider(key="low_conf").set_value(0.5).run()
    assert not at.error


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"group_size": 2, "num_groups": 1}, "same reward"),
        ({"group_size": 16, "num_groups": 8}, "too many"),
    ],
)
def test_bad_batch_shows_an_error_not_a_traceback(at: AppTest, settings: dict[str, int], words: str) -> None:
    for key, value in settings.items():
        at.sidebar.slider(key=key).set_value(value)
    at.run()
    assert not at.exception
    assert len(at.error) == 1 and words in at.error[0].value
    assert not at.metric and not at.get("plotly_chart")
