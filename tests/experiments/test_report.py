"""``experiments.study`` (the saved results) and ``experiments.report`` (REPORT.md and its figures).

Hand-made studies with known answers: verdicts from paired differences worked out by hand, the compact
table's means, the JSON round trip of inf/NaN, the files the report writes, and the CLI's
``--report-only`` on saved results.
"""

from __future__ import annotations

import math
import shutil

import pytest

from experiments.__main__ import main
from experiments.report import compact_table, write_report
from experiments.study import Measure, Prediction, StudyResult

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
            Prediction("fast is faster", "made up, Sec. 1", "steps", "fast", "base", "lower"),
            Prediction("fast is slower", "made up, Sec. 2", "steps", "fast", "base", "higher"),
            Prediction("noisy is faster", "made up, Sec. 3", "steps", "noisy", "base", "lower"),
            Prediction("fast ends higher", "made up, Sec. 4", "final", "fast", "base", "higher"),
        ],
        "notes": ["a note"],
    }
    kw.update(overrides)
    return StudyResult(**kw)


def test_verdicts_follow_the_paired_difference() -> None:
    v = _study().verdicts(n_boot=2000)
    # fast − base = −1 on every seed: the CI is [−1, −1]
    assert (v[0].verdict, v[0].diff, v[0].low, v[0].high, v[0].n) == ("held", -1.0, -1.0, -1.0, 8)
    assert v[0].sign_p == pytest.approx(2 * 0.5**8)  # exact sign test, 8 of 8 negative
    assert v[1].verdict == "contradicted"
    # noisy: seed 0 never reached (counts as the horizon 10: 10 − 2 = +8), the rest alternate ±1
    diffs = [8.0] + [1.0 if i % 2 else -1.0 for i in range(1, 8)]
    assert v[2].diff == pytest.approx(sum(diffs) / 8)
    assert v[2].verdict == "not resolved" and v[2].low < 0 < v[2].high
    assert (v[3].verdict, v[3].diff) == ("held", 0.25)


def test_fewer_than_five_seeds_give_no_verdict() -> None:
    keep = SEEDS[:4]
    small = _study(per_seed={arm: {m: {s: v for s, v in vals.items() if s in keep} for m, vals in d.items()}
                             for arm, d in _study().per_seed.items()})  # fmt: skip
    v = small.verdicts(n_boot=500)
    assert [x.verdict for x in v] == ["too few seeds"] * 4
    assert v[0].diff == -1.0 and v[0].n == 4  # the difference is still reported


def test_unknown_arm_measure_or_baseline_is_refused() -> None:
    with pytest.raises(ValueError, match="baseline 'nope'"):
        _study(baseline="nope")
    with pytest.raises(ValueError, match="unknown measure 'x'"):
        _study(predictions=[Prediction("c", "s", "x", "fast", "base", "lower")])
    with pytest.raises(ValueError, match="unknown arm 'ghost'"):
        _study(predictions=[Prediction("c", "s", "steps", "ghost", "base", "lower")])
    with pytest.raises(ValueError, match="`direction`"):
        Prediction("c", "s", "steps", "fast", "base", "smaller")


def test_json_round_trip_keeps_inf_and_nan(tmp_path) -> None:
    s = _study()
    t = StudyResult.load(s.save(tmp_path / "s.json"))
    assert t.per_seed["noisy"]["steps"]["0"] == math.inf
    assert math.isnan(t.per_seed["noisy"]["final"]["1"])
    assert t.values("fast", "steps") == s.values("fast", "steps")
    assert t.measures == s.measures and t.predictions == s.predictions
    assert [x.verdict for x in t.verdicts(n_boot=500)] == [x.verdict for x in s.verdicts(n_boot=500)]


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
