"""``python -m tools.first_hour``: the measures of a run, the ranges and the generated page.

The runs themselves are the trainer's (tested in tests/scaledrun); here the rows are written by hand so
that every number the page prints can be checked against a plain computation.
"""

from __future__ import annotations

import json
import math

import pytest

from tools import first_hour as fh


def _rows(reward_end: float, truncated_end: float, eval_end: float) -> list[dict[str, float]]:
    """200 rows: reward 0.2 for steps 1-100 then ``reward_end``; an eval every 20 steps."""
    rows = []
    for step in range(1, fh.STEPS + 1):
        row = {
            "step": step, "reward/mean": 0.2 if step <= 100 else reward_end,
            "clip/low_frac": 0.1 if step % 2 else 0.0, "clip/high_frac": 0.02, "completion_length": 3.0 + step / 100,
            "truncated_frac": truncated_end if step > 190 else 0.0, "entropy": 1.0 - step / 400, "time/step_s": 0.1,
        }  # fmt: skip
        if step % 20 == 0:
            row["eval/greedy_accuracy"] = 0.5 if step < fh.STEPS else eval_end
        rows.append(row)
    return rows


def test_measures_of_a_run_by_hand():
    got = fh.summarize_run(_rows(0.6, 0.25, 0.7))
    assert got["reward_first_quarter"] == pytest.approx(0.2)
    assert got["reward_last10"] == pytest.approx(0.6)
    assert got["eval_first"] == 0.5 and got["eval_last"] == 0.7
    assert got["clip_low_frac"] == pytest.approx(0.05) and got["clip_high_frac"] == pytest.approx(0.02)
    assert got["truncated_last10"] == pytest.approx(0.25)
    assert got["length_last10"] == pytest.approx(3.0 + sum(range(191, 201)) / 1000)
    assert got["entropy_first"] == pytest.approx(1.0 - 1 / 400)
    assert got["entropy_last10"] == pytest.approx(1.0 - sum(range(191, 201)) / 4000)
    assert got["collapsed"] == 0.0
    assert fh.summarize_run(_rows(0.0, 0.9, 0.3))["collapsed"] == 1.0  # mostly truncated
    assert fh.summarize_run(_rows(0.0, 0.0, 0.05))["collapsed"] == 1.0  # accuracy gone


def _work(tmp_path):
    work = tmp_path / "work"
    for isa, acc in (("native", 0.55), ("avx2", 0.48)):
        (work / isa / "model").mkdir(parents=True)
        (work / isa / "model" / "warm_start.json").write_text(
            json.dumps({"losses": [1.0] * (250 if isa == "native" else 300), "accuracy_after": acc})
        )
        for seed in (0, 1):
            for objective, reward in (("grpo", 0.5 + seed / 10), ("grpo_symclip", 0.4 + seed / 10)):
                run = work / isa / f"{objective}-s{seed}"
                run.mkdir()
                rows = _rows(reward, 0.0, 0.6 if isa == "native" else 0.02)
                (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (work / "collapse" / "model").mkdir(parents=True)
    (work / "collapse" / "model-avx2").mkdir(parents=True)
    (work / "collapse" / "model-avx2" / "warm_start.json").write_text(
        json.dumps({"losses": [1.0] * 300, "accuracy_after": 0.17})
    )
    (work / "collapse" / "model" / "warm_start.json").write_text(
        json.dumps({"losses": [1.0] * 300, "accuracy_after": 0.79})
    )
    for trunc, seed, cut in (("mask", 0, 0.9), ("failure_reward", 0, 0.0)):
        rows = _rows(0.0 if cut else 0.5, cut, 0.0 if cut else 0.6)
        for row in rows[-3:]:
            row["truncation/no_update"] = 1.0 if cut else 0.0
        (work / "collapse" / f"grpo-{trunc}-s{seed}").mkdir()
        (work / "collapse" / f"grpo-{trunc}-s{seed}" / "metrics.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows)
        )
    (work / "native" / "grpo-s2").mkdir()  # an unfinished run: left out
    (work / "native" / "grpo-s2" / "metrics.jsonl").write_text(json.dumps(_rows(0.9, 0, 0.9)[0]) + "\n")
    return work


def test_ranges_and_the_page(tmp_path):
    out = tmp_path / "first-hour.md"
    assert fh.main(["--work", str(_work(tmp_path)), "--isas", "native,avx2", "--seeds", "0,1,2", "--report-only",
                    "--out", str(out)]) == 0  # fmt: skip
    data = json.loads(out.with_suffix(".json").read_text())
    assert len(data["runs"]) == 8
    assert data["ranges"]["grpo"]["reward_last10"] == pytest.approx([0.5, 0.6])
    assert data["ranges"]["grpo_symclip"]["reward_last10"] == pytest.approx([0.4, 0.5])
    assert data["ranges"]["grpo"]["collapsed"] == [0.0, 1.0]  # the avx2 runs' accuracy fell to 0.02
    assert data["model_ranges"]["accuracy"] == [0.48, 0.55] and data["model_ranges"]["steps"] == [250, 300]
    # paired by (instruction set, seed): GRPO-fix's reward (0.4 + seed/10) is below GRPO's (0.5 + seed/10)
    assert data["run_seconds"] == pytest.approx([20.0, 20.0])  # 200 steps × 0.1 s
    assert data["pairs"] == 4 and data["symclip_below_grpo"]["reward_last10"] == 4
    assert data["symclip_minus_grpo"]["reward_last10"] == pytest.approx([-0.1, -0.1])
    assert data["symclip_below_grpo"]["clip_high_frac"] == 0  # equal values are not "below"
    page = out.read_text()
    assert (
        "| reward, mean of the last 10 steps (the run's last line) | 0.500 – 0.600 | 0.400 – 0.500 |" in page
    )
    assert "| runs that collapsed (see below) | 2 | 2 |" in page
    assert "| avx2 | 300 | 0.48 |" in page and "do not edit by hand" in page
    assert not math.isnan(data["runs"][0]["entropy_last10"])
    collapse = data["collapse"]  # two finished runs of the collapse study (the other seeds: not run)
    assert collapse["model"] == {"steps": 300, "accuracy": 0.79}
    assert collapse["model_accuracy"] == {"native": 0.79, "avx2": 0.17}
    assert [(r["truncation"], r["collapsed"], r["no_update_steps"]) for r in collapse["runs"]] == [
        ("mask", 1.0, 3),
        ("failure_reward", 0.0, 0),
    ]
    assert "## A collapse, and the truncation policy" in page and "--collapse" in page
    # the prose counts what the tables show: the avx2 runs' accuracy fell to 0.02 (collapsed, none cut);
    # the most truncated of them is the first listed (all tie at 0), GRPO on avx2 with seed 0
    flat = " ".join(page.split())
    assert "4 of the first hour's 8 runs collapsed (2 GRPO, 2 GRPO-fix)." in flat
    assert (
        "It (" not in flat and "The most truncated (GRPO on avx2, seed 0) ended with completions of" in flat
    )
    assert "last held-out greedy accuracy 0.02." in flat
    assert (
        "Under `mask`, GRPO collapsed in 1 of 1 seeds; the worst run ended at reward 0.000 and held-out "
        "accuracy 0.00, with 3 steps in which every completion was truncated" in flat
    )
    assert (
        "none of the 1 collapsed, and their last held-out accuracy was 0.60–0.60 (the model's before" in flat
    )


def test_errors_name_what_to_fix(tmp_path, capsys):
    with pytest.raises(SystemExit):
        fh.main(["--isas", "native,arm"])
    assert "unknown instruction set(s) arm" in capsys.readouterr().err
    (tmp_path / "native" / "model").mkdir(parents=True)
    (tmp_path / "native" / "model" / "warm_start.json").write_text(
        json.dumps({"losses": [1.0], "accuracy_after": 0.5})
    )
    with pytest.raises(SystemExit):
        fh.main(
            ["--work", str(tmp_path), "--isas", "native", "--report-only", "--out", str(tmp_path / "x.md")]
        )
    assert "no finished run" in capsys.readouterr().err
