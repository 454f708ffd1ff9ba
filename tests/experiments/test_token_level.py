"""The report's token-level section: saved per part, rebuilt by ``--report-only``, numbers read off the result."""

from __future__ import annotations

import pytest

from experiments.__main__ import main
from experiments.token_level import RESULT_FILE, load, markdown, run_token_level, toy_values_summary


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    result = run_token_level(out, out / "lm", quick=True, parts=("toy_values",), progress=None)
    return out, result


def test_a_part_is_saved_as_it_finishes_and_loads_back(saved) -> None:
    out, result = saved
    assert (out / RESULT_FILE).is_file()
    loaded = load(out)
    assert loaded is not None and set(loaded) == {"mode", "seconds", "toy_values"}
    assert loaded["mode"] == "quick" and loaded["seconds"]["toy_values"] > 0
    for sc, res in loaded["toy_values"].items():
        assert res["scenario"] == sc and "per_seed" not in res  # per-seed tuples stay out of the file
        assert res["fig5a"]["all"]["gap"]["mean"] == pytest.approx(
            result["toy_values"][sc]["fig5a"]["all"]["gap"]["mean"], abs=1e-12
        )
    assert load(out / "nowhere") is None


def test_the_section_prints_the_saved_numbers(saved) -> None:
    out, _ = saved
    res = load(out)
    text = markdown(res)
    assert text.startswith("## Token-level instruments")
    for sc, r in res["toy_values"].items():
        # the sentence is the result's own numbers, rounded to three decimals
        a, ctrl, adds = r["fig5a"]["all"]["gap"], r["self_only"], r["coupling_adds"]
        assert f"On `{sc}`: boosted − suppressed {a['mean']:+.3f} ± {a['se']:.3f}" in text
        assert f"gives {ctrl['mean']:+.3f} ± {ctrl['se']:.3f} and coupling adds {adds['mean']:+.3f}" in text
        assert toy_values_summary(r) in text
        # what coupling adds is, per seed, the coupled gap minus the control's: so on average too
        assert adds["mean"] == pytest.approx(a["mean"] - ctrl["mean"], abs=1e-9)
    assert "`python -m experiments.coupling`" in text and "quick mode" in text


def test_report_only_appends_the_section(saved, tmp_path) -> None:
    out, _ = saved
    from tests.experiments.test_report import _study

    _study().save(out / "toy_hand.json")
    report = tmp_path / "REPORT.md"
    assert main(["--report-only", "--out", str(out), "--report", str(report), "--no-png"]) == 0
    text = report.read_text()
    assert "## Token-level instruments" in text
    assert text.index("## Token-level instruments") > text.index("## Summary of predictions")


def test_unknown_part_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown part"):
        run_token_level(tmp_path, tmp_path, parts=("toy_table2",), progress=None)
    assert not (tmp_path / RESULT_FILE).exists()


def test_a_partial_run_keeps_the_other_parts(tmp_path) -> None:
    import json

    first = run_token_level(tmp_path, tmp_path, quick=True, parts=("toy_values",), progress=None)
    saved = json.loads((tmp_path / RESULT_FILE).read_text())
    saved["toy_table1"] = {"marker": 1}  # as if an earlier run had made it
    saved["seconds"]["toy_table1"] = 2.0
    (tmp_path / RESULT_FILE).write_text(json.dumps(saved))
    again = run_token_level(tmp_path, tmp_path, quick=True, parts=("toy_values",), progress=None)
    assert again["toy_table1"] == {"marker": 1} and again["seconds"]["toy_table1"] == 2.0
    assert load(tmp_path)["toy_table1"] == {"marker": 1}
    assert set(first["toy_values"]) == set(again["toy_values"])
    # another mode starts afresh: quick results never mix into a full file
    (tmp_path / RESULT_FILE).write_text(json.dumps({**saved, "mode": "full"}))
    fresh = run_token_level(tmp_path, tmp_path, quick=True, parts=("toy_values",), progress=None)
    assert "toy_table1" not in fresh


def test_report_only_with_the_token_level_part_alone(saved, tmp_path) -> None:
    out, _ = saved
    alone = tmp_path / "results"
    (alone / RESULT_FILE).parent.mkdir(parents=True)
    (alone / RESULT_FILE).write_text((out / RESULT_FILE).read_text())
    report = tmp_path / "REPORT.md"
    assert main(["--report-only", "--out", str(alone), "--report", str(report), "--no-png"]) == 0
    text = report.read_text()
    assert "token-level section only" in text and "## Token-level instruments" in text
