"""``scaledrun.runlog.last_steps_mean``: the reward a run's last line and the app's Runs page report."""

from __future__ import annotations

import math

from scaledrun.runlog import SUMMARY_STEPS, last_steps_mean


def test_last_steps_mean_by_hand():
    rows = [{"step": s, "reward/mean": float(s)} for s in range(1, 13)]  # rewards 1..12
    # the last 10 rows: 3..12, mean (3 + 12) / 2 = 7.5
    assert SUMMARY_STEPS == 10
    assert last_steps_mean(rows) == (7.5, 10)
    # a NaN and a missing value inside the window are left out, not counted: 3..10 and 12 without 6, 11
    rows[5]["reward/mean"] = math.nan  # step 6
    del rows[10]["reward/mean"]  # step 11
    assert last_steps_mean(rows) == ((3 + 4 + 5 + 7 + 8 + 9 + 10 + 12) / 8, 8)
    # a shorter run: all of its steps; another key and window
    assert last_steps_mean(rows[:3]) == (2.0, 3)
    assert last_steps_mean([{"step": 1, "x": 4.0}, {"step": 2, "x": 6.0}], key="x", n=1) == (6.0, 1)


def test_last_steps_mean_without_a_value_is_nan():
    mean, n = last_steps_mean([{"step": 1, "reward/mean": math.nan}, {"step": 2}])
    assert math.isnan(mean) and n == 0
    mean, n = last_steps_mean([])
    assert math.isnan(mean) and n == 0
