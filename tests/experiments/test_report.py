"""``experiments.study`` (the saved results) and ``experiments.report`` (REPORT.md and its figures).

Hand-made studies with known answers: verdicts from paired differences worked out by hand, the compact
table's means, the JSON round trip of inf/NaN, the files the report writes, and the CLI's
``--report-only`` on saved results.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from experiments.__main__ import _load, main
from experiments.report import compact_table, summary_table, write_report
from experiments.study import MIN_SEEDS, Measure, Prediction, StudyResult, decide

SEEDS = [str(s) for s in range(8)]


def _study(**overrides) -> StudyResult:
    base = {s: float(i + 2) for i, s in enumerate(SEEDS)}  # 2..9
    minus_one = {s: v - 1.0 for s, v in base.items()}  # every pair: −1
    mixed = {s: v + (1.0 if i % 2 else -1.0) for i, (s, v) in enumerate(base.items())}  # ±1, mean 0
    kw = {
        "name": "toy_hand",
        "title": "Hand-made study",
        "question": "Does A beat B?",
        "setting": "made up",
        "baseline": "base",
        "arms": {"base": {"label": "Base"}, "fast": {"label": "Fast"}, "noisy": {"label": "Noisy"}},
        "measures": [
            Measure("steps", "steps to threshold", "lower", horizon=10.0),
            Measure("final", "final reward", "higher"),
        ],
        "per_seed": {
            "base": {"steps": base, "final": {s: 0.5 for s in SEEDS}},
            "fast": {"steps": minus_one, "final": {s: 0.75 for s in SEEDS}},
            "noisy": {"steps": {**mixed, "0": math.inf}, "final": {**{s: 0.5 for s in SEEDS}, "1": math.nan}},
        },
        "curves": {
            "reward": {
                arm: {"x": [1, 2, 3], "seeds": {s: [0.1, 0.2, 0.3] for s in SEEDS}}
                for arm in ("base", "fast")
            }
        },
        "predictions": [
            Prediction(
                claim="fast is faster",
                source="made up, Sec. 1",
                measure="steps",
                arm="fast",
                baseline="base",
                direction="lower",
            ),
            Prediction(
                claim="fast is slower",
                source="made up, Sec. 2",
                measure="steps",
                arm="fast",
                baseline="base",
                direction="higher",
            ),
            Prediction(
                claim="noisy is faster",
                source="made up, Sec. 3",
                measure="steps",
                arm="noisy",
                baseline="base",
                direction="lower",
            ),
            Prediction(
                claim="fast ends higher",
                source="made up, Sec. 4",
                measure="final",
                arm="fast",
                baseline="base",
                direction="higher",
            ),
        ],
        "notes": ["a note"],
    }
    kw.update(overrides)
    return StudyResult(**kw)


#: Student's t, 0.975 quantile with 7 degrees of freedom (a printed table).
T975_7 = 2.364624252


def test_verdicts_follow_the_paired_t_test() -> None:
    v = _study().verdicts()
    # fast − base = −1 on every seed: no spread, the interval is [−1, −1] and p = 0
    assert (v[0].verdict, v[0].diff, v[0].low, v[0].high, v[0].n, v[0].p) == (
        "held",
        -1.0,
        -1.0,
        -1.0,
        8,
        0.0,
    )
    assert v[0].perm_p == pytest.approx(
        2 / 2**8
    )  # exact sign-flip test: only the two one-sign flips are as extreme
    assert v[1].verdict == "contradicted"
    # noisy: seed 0 never reached (counts as the horizon 10: 10 − 2 = +8), the rest alternate ±1
    d = np.array([8.0] + [1.0 if i % 2 else -1.0 for i in range(1, 8)])
    se = d.std(ddof=1) / math.sqrt(8)
    assert v[2].diff == pytest.approx(d.mean())
    assert (v[2].low, v[2].high) == pytest.approx((d.mean() - T975_7 * se, d.mean() + T975_7 * se), abs=1e-8)
    assert v[2].verdict == "not resolved"
    assert (v[3].verdict, v[3].diff) == ("held", 0.25)
    # Holm over the family of four: the adjusted p is the step-down maximum of (m − rank + 1)·p
    raw = [x.p for x in v]
    order = sorted(range(4), key=lambda i: raw[i])
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (4 - rank) * raw[i]))
        assert v[i].p_adj == pytest.approx(running)


def _diff_study(
    d: list[float], *, by_construction: str | None = None, horizon: float | None = None
) -> StudyResult:
    """A study whose only prediction ("b lower than a") has the paired differences ``d``."""
    seeds = [str(i) for i in range(len(d))]
    return StudyResult(
        name="toy_d", title="d", question="q", setting="s", baseline="a",
        arms={"a": {}, "b": {}}, measures=[Measure("m", "m", "lower", horizon)],
        per_seed={"a": {"m": {s: 0.0 for s in seeds}}, "b": {"m": dict(zip(seeds, d, strict=True))}},
        predictions=[Prediction(claim="b is lower", source="made up", measure="m", arm="b", baseline="a", direction="lower", by_construction=by_construction)],
    )  # fmt: skip


def test_holm_across_the_family_can_undo_a_lone_verdict() -> None:
    lone = _diff_study([-1.0, -1.2, -0.2, -0.9, 0.3, -1.1, -0.4, -0.8])
    (v,) = lone.verdicts()
    assert 0.005 < v.p < 0.025 and v.verdict == "held"  # alone it holds
    # beside six predictions with p ≈ 0.47 Holm multiplies the smallest p (0.0085) by 7: 0.06
    family = decide([lone] + [_diff_study([-1.0, 0.5, -0.4, 0.7, -0.9, 0.2, -0.6, 0.1])] * 6)
    assert family[0].p == v.p and family[0].p_adj == pytest.approx(7 * v.p)
    assert family[0].verdict == "not resolved"
    assert [x.verdict for x in decide([lone], adjust="none")] == ["held"]


def test_verdict_edge_cases() -> None:
    # exactly MIN_SEEDS seeds are decided; one fewer are not
    assert _diff_study([-1.0] * MIN_SEEDS).verdicts()[0].verdict == "held"
    short = _diff_study([-1.0] * (MIN_SEEDS - 1)).verdicts()[0]
    assert (short.verdict, short.diff, short.n) == ("too few seeds", -1.0, MIN_SEEDS - 1)
    # ties from seeds that never reached the threshold: both at the horizon, only one seed differs
    tied = _diff_study([0.0] * 7 + [-1.0], horizon=10.0).verdicts()[0]
    assert tied.verdict == "not resolved" and tied.high > 0
    # floating-point noise is a tie, not a difference with a tiny p; tied on every seed, it is decided by
    # construction (out of the family: see test_a_prediction_tied_on_every_seed_leaves_the_holm_family)
    noise = _diff_study([-1e-15] * 8).verdicts()[0]
    assert (noise.verdict, noise.diff, noise.p) == ("tied", 0.0, 1.0)
    # by construction: shown with its difference, never held, left out of the family
    bc = _diff_study([-1.0] * 8, by_construction="zero gradient")
    v = decide([bc, _diff_study([-1.0, -1.2, -0.2, -0.9, 0.3, -1.1, -0.4, -0.8])])
    assert (v[0].verdict, v[0].diff) == ("by construction", -1.0)
    assert v[1].p_adj == v[1].p  # a family of one: nothing to adjust


def test_the_verdict_uses_the_level_the_report_prints(tmp_path) -> None:
    # t = mean/se with p between 0.05 and 0.10: held at 90 %, not at 95 %
    st = _diff_study([-1.0, 0.4, -0.8, -0.3, 0.3, -1.0, -0.2, -0.5])  # p = 0.084
    v95, v90 = st.verdicts(level=0.95)[0], st.verdicts(level=0.90)[0]
    assert 0.05 < v95.p < 0.10 and (v95.verdict, v90.verdict) == ("not resolved", "held")
    text = write_report([st], tmp_path / "R.md", png=False, level=0.90).read_text()
    assert "90% t interval" in text and "below 0.1 and the difference" in text
    assert "✅ held" in text


def test_fewer_than_five_seeds_give_no_verdict() -> None:
    keep = SEEDS[:4]
    small = _study(per_seed={arm: {m: {s: v for s, v in vals.items() if s in keep} for m, vals in d.items()}
                             for arm, d in _study().per_seed.items()})  # fmt: skip
    v = small.verdicts()
    assert [x.verdict for x in v] == ["too few seeds"] * 4
    assert v[0].diff == -1.0 and v[0].n == 4  # the difference is still reported


def test_unknown_arm_measure_or_baseline_is_refused() -> None:
    with pytest.raises(ValueError, match="baseline 'nope'"):
        _study(baseline="nope")
    with pytest.raises(ValueError, match="unknown measure 'x'"):
        _study(
            predictions=[
                Prediction(claim="c", source="s", measure="x", arm="fast", baseline="base", direction="lower")
            ]
        )
    with pytest.raises(ValueError, match="unknown arm 'ghost'"):
        _study(
            predictions=[
                Prediction(
                    claim="c", source="s", measure="steps", arm="ghost", baseline="base", direction="lower"
                )
            ]
        )
    with pytest.raises(ValueError, match="`direction`"):
        Prediction(claim="c", source="s", measure="steps", arm="fast", baseline="base", direction="smaller")


def test_json_round_trip_keeps_inf_and_nan(tmp_path) -> None:
    s = _study()
    t = StudyResult.load(s.save(tmp_path / "s.json"))
    assert t.per_seed["noisy"]["steps"]["0"] == math.inf
    assert math.isnan(t.per_seed["noisy"]["final"]["1"])
    assert t.values("fast", "steps") == s.values("fast", "steps")
    assert t.measures == s.measures and t.predictions == s.predictions
    assert t.verdicts() == s.verdicts()


def test_compact_table_means_by_hand() -> None:
    table = compact_table(_study(), n_boot=500)
    lines = table.splitlines()
    assert lines[0] == "| measure | Base (n=8) | Fast (n=8) | Noisy (n=8) |"
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines[2:]}
    base, fast, noisy = rows["steps to threshold ↓"]
    assert (
        base.startswith("5.5 [") and fast.startswith("4.5 [") and fast.endswith("(8/8)")
    )  # means of 2..9, 1..8
    assert noisy.endswith("(7/8)")
    assert rows["final reward ↑"][1] == "0.75 [0.75, 0.75]"


def test_report_files_and_cli_report_only(tmp_path) -> None:
    out = tmp_path / "results"
    _study().save(out / "toy_hand.json")
    report = tmp_path / "REPORT.md"
    assert main(["--report-only", "--out", str(out), "--report", str(report), "--no-png"]) == 0
    text = report.read_text()
    assert "1 contradicted" in text and "2 held" in text and "1 not resolved" in text
    assert "✅ held" in text and "❌ contradicted" in text
    assert (tmp_path / "figures" / "toy_hand_reward.html").exists()
    assert (tmp_path / "figures" / "plotly.min.js").exists()  # the HTML opens offline
    assert "figures/toy_hand_reward.html" in text


def test_cli_without_results_says_what_to_run(tmp_path, capsys) -> None:
    assert main(["--report-only", "--out", str(tmp_path / "empty"), "--report", str(tmp_path / "R.md")]) == 2
    assert "run `python -m experiments" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("chromium") is None, reason="kaleido's PNG export needs a Chromium")
def test_png_figures(tmp_path) -> None:
    path = write_report([_study()], tmp_path / "REPORT.md", n_boot=200)
    png = tmp_path / "figures" / "toy_hand_reward.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "figures/toy_hand_reward.png" in path.read_text()


def test_cli_refuses_a_job_count_below_one(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as err:
        main(["--jobs", "0", "--report-only", "--out", str(tmp_path)])
    assert err.value.code == 2 and "--jobs must be ≥ 1, got 0" in capsys.readouterr().err


REPO = Path(__file__).resolve().parents[2]


def test_the_committed_report_is_what_the_committed_results_give() -> None:
    """A fresh clone has the per-seed results (``experiments/results/*.json.gz``) that
    ``python -m experiments --report-only`` rebuilds the report from, and they give the committed
    report's summary of verdicts row for row (``--report-only`` itself is run on a hand-made study above)."""
    results = REPO / "experiments" / "results"
    assert sorted(results.glob("*.json.gz")), (
        "experiments/results/*.json.gz (the committed results) are missing"
    )
    studies = _load(results)
    assert {s.name for s in studies} >= {"toy_main", "toy_frontier", "lm_power", "lm_power_big_steps"}
    assert {s.block for s in studies if s.name == "toy_main"} == {"discovery", "confirmation"}
    rows = summary_table(studies).splitlines()
    committed = (REPO / "experiments" / "REPORT.md").read_text().splitlines()
    start = committed.index(rows[0])
    assert committed[start : start + len(rows)] == rows


def _t_quantile_by_bisection(q: float, df: int) -> float:
    """Student's t quantile from its density integrated by Simpson's rule (2,000 panels) and bisection: an
    independent path to the one ``experiments.stats.t_quantile`` takes."""

    def cdf(x: float) -> float:
        c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
        f = lambda t: c * (1 + t * t / df) ** (-(df + 1) / 2)  # noqa: E731
        n, h = 2000, x / 2000
        s = f(0.0) + f(x) + sum((4 if i % 2 else 2) * f(i * h) for i in range(1, n))
        return 0.5 + s * h / 3

    lo, hi = 0.0, 50.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < q else (lo, mid)
    return (lo + hi) / 2


def test_a_prediction_tied_on_every_seed_leaves_the_holm_family(tmp_path) -> None:
    """Every per-seed difference 0 (two arms that took identical steps): the verdict is 'tied', it does not
    count in Holm's m (the other prediction, alone in the family, keeps its raw p), and the report lists
    it apart."""
    tied = _diff_study([0.0] * 8)
    lone = _diff_study([-1.0, -1.2, -0.2, -0.9, 0.3, -1.1, -0.4, -0.8])
    v = decide([tied, lone])
    assert v[0].verdict == "tied" and v[0].diff == 0.0
    assert v[1].p_adj == v[1].p and v[1].verdict == "held"  # m = 1, not 2
    # a tie on all but one seed is a difference, tested in the family (m = 2: Holm doubles the smaller p)
    almost = _diff_study([0.0] * 7 + [-1e-3])
    w = decide([almost, lone])
    assert w[0].verdict == "not resolved" and w[1].p_adj == pytest.approx(2 * w[1].p)
    tied.name = "toy_tied"  # the report keeps one study per name
    text = write_report([tied, lone], tmp_path / "R.md", png=False).read_text()
    assert "**Tied on every seed (decided by construction, not in the Holm family):**" in text
    assert (
        "- toy_tied: b is lower (b vs a, 8 seeds; every measure ties: the two arms took identical steps)"
        in text
    )
    # a tie on this measure only (the arms differ on another measure): listed as a measured tie
    other = dataclasses.replace(tied, measures=[*tied.measures, Measure("m2", "m2", "lower")])
    other.per_seed = {
        "a": {**tied.per_seed["a"], "m2": {"0": 1.0}},
        "b": {**tied.per_seed["b"], "m2": {"0": 2.0}},
    }
    (o,) = other.verdicts()
    assert (o.verdict, o.identical, v[0].identical) == ("tied", False, True)
    assert "1 held, 0 contradicted, 0 not resolved, 1 tied on every seed" in text


def test_the_mde_is_computed_at_the_level_holm_tests_each_prediction_at() -> None:
    """Three predictions with p-values p1 < p2 < p3: Holm tests them at α/3, α/2, α; each MDE is
    (t_{1−a/2, n−1} + t_{0.8, n−1})·sd/√n at its own a, with t quantiles from an independent integration."""
    ds = [
        [-1.0, -1.2, -0.2, -0.9, 0.3, -1.1, -0.4, -0.8],  # p ≈ 0.008: the smallest, tested at α/3
        [-1.0, 0.4, -0.8, -0.3, 0.3, -1.0, -0.2, -0.5],  # p ≈ 0.084: at α/2
        [-1.0, 0.5, -0.4, 0.7, -0.9, 0.2, -0.6, 0.1],  # p ≈ 0.47: at α
    ]
    v = decide([_diff_study(d) for d in ds])
    assert v[0].p < v[1].p < v[2].p
    t80 = _t_quantile_by_bisection(0.8, 7)
    for verdict, d, a in zip(v, ds, (0.05 / 3, 0.05 / 2, 0.05), strict=True):
        x = np.array(d)
        want = (_t_quantile_by_bisection(1 - a / 2, 7) + t80) * x.std(ddof=1) / math.sqrt(8)
        assert verdict.alpha == pytest.approx(a, rel=1e-12)
        assert verdict.mde == pytest.approx(want, rel=1e-6)
    # alone (no adjustment) the smallest is tested at α itself: a smaller MDE
    (alone,) = _diff_study(ds[0]).verdicts()
    x = np.array(ds[0])
    assert alone.mde == pytest.approx((T975_7 + t80) * x.std(ddof=1) / math.sqrt(8), rel=1e-6)
    assert v[0].mde > 1.2 * alone.mde


def test_the_report_prints_the_seed_mean_drift_or_says_a_rerun_is_needed(tmp_path) -> None:
    from experiments.report import CANNOT_TEST, drift_table

    old = _study(name="toy_main", setting="toymodel scenario `template_task`, 12 steps")
    assert "rerun needed" in drift_table(old)
    assert drift_table(_study()) == ""  # not a template study: nothing to say
    new = _study(
        name="toy_main",
        setting="toymodel scenario `template_task`",
        drift={"fast": {"n": 8.0, "drift2": 0.004, "floor": 0.001, "systematic": 0.003, "se": 0.0005,
                        "per_seed2": 0.012}},
    )  # fmt: skip
    table = drift_table(new)
    assert "| Fast | 8 | 0.004 | 0.001 | +0.003 ± 5.00e-04 | 0.012 | 0.25 |" in table  # share 0.003/0.012
    text = write_report([new], tmp_path / "R.md", png=False).read_text()
    assert "## What these studies cannot test" in text
    assert all(c in text for c in CANNOT_TEST)
    assert StudyResult.from_json(new.to_json()).drift == new.drift


def test_a_quick_report_says_what_quick_mode_ran(tmp_path) -> None:
    text = write_report([_study()], tmp_path / "R.md", png=False, mode="quick").read_text()
    # toy_hand's arms ran 8 seeds each (SEEDS): the note reads the count from the results
    assert "**Quick mode.**" in text and "toy_hand 8)" in text
    full = write_report([_study()], tmp_path / "F.md", png=False).read_text()
    assert "**Quick mode.**" not in full
