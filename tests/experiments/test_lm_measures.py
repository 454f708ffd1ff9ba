"""``experiments.lm``'s reward threshold and per-seed measures on hand-made metrics rows (no model).

The rewards are multiples of 1/8, so every trailing mean and start level below is exact in binary and a
curve can sit exactly on the threshold: "reaches" is ``>=``, checked where it differs from ``>``.
"""

from __future__ import annotations

import math

from experiments.lm import measure_run, start_threshold


def _rows(rewards, evals=None):
    """Metrics rows of steps 1..len(rewards); ``evals``: step → (greedy accuracy, form entropy)."""
    rows = [{"step": s, "reward/mean": r} for s, r in enumerate(rewards, start=1)]
    for step, (acc, ent) in (evals or {}).items():
        rows[step - 1].update({"eval/greedy_accuracy": acc, "eval/form_entropy": ent})
    return rows


def test_steps_to_threshold_counts_a_trailing_mean_exactly_at_it():
    # window 2 (full windows only): trailing means —, 0.625, 0.5, 0.625, 0.75, 1.0 at steps 1..6; the
    # threshold 0.75 is reached exactly at step 5 (step 1's partial window, 1.0, does not count)
    rewards = [1.0, 0.25, 0.75, 0.5, 1.0, 1.0]
    assert sum(rewards[3:5]) / 2 == 0.75
    m = measure_run(_rows(rewards), steps=6, threshold=0.75, window=2)
    assert m["steps_to_threshold"] == 5.0
    # just above the level the curve reaches at step 5: the next full window (1.0) is the first
    assert (
        measure_run(_rows(rewards), steps=6, threshold=0.75 + 2**-10, window=2)["steps_to_threshold"] == 6.0
    )
    # never reached: right-censored
    assert (
        measure_run(_rows(rewards), steps=6, threshold=1.0 + 2**-10, window=2)["steps_to_threshold"]
        == math.inf
    )


def test_matched_reward_takes_the_eval_at_the_threshold_step():
    # evals at steps 3, 5, 6; the threshold is reached at step 5, so the eval of step 5 is the match
    rewards = [1.0, 0.25, 0.75, 0.5, 1.0, 1.0, 1.0]  # step 7 lies past `steps` and is not read
    evals = {3: (0.25, 1.5), 5: (0.5, 0.75), 6: (0.625, 0.5)}
    m = measure_run(_rows(rewards, evals), steps=6, threshold=0.75, window=2)
    assert m["form_entropy_at_threshold"] == 0.75
    assert m["form_entropy_final"] == 0.5 and m["final_greedy_accuracy"] == 0.625
    assert m["final_reward"] == 4.5 / 6  # the mean of steps 1..6 (fewer than FINAL_STEPS = 10)


def test_start_threshold_averages_steps_up_to_the_window_over_all_runs():
    # window 2: steps 1 and 2 of both runs, (0.75 + 0.25 + 0.5 + 0.625) / 4 = 17/32 = 0.53125; step 3
    # (0 and 1) is left out; threshold round(0.63125, 2) = 0.63
    runs = {("a", 0): _rows([0.75, 0.25, 0.0]), ("b", 0): _rows([0.5, 0.625, 1.0])}
    assert start_threshold(runs, window=2) == (0.53125, 0.63)


def test_start_threshold_is_capped_at_0_95():
    # start 0.875: 0.975 rounds to 0.97 or 0.98, above the cap; start 1.0 would ask for 1.1, which no
    # reward in [0, 1] reaches; start 0.84375 stays below the cap (0.94375 → 0.94)
    assert start_threshold({("a", 0): _rows([0.75, 1.0])}, window=2) == (0.875, 0.95)
    assert start_threshold({("a", 0): _rows([1.0, 1.0])}, window=2) == (1.0, 0.95)
    assert start_threshold({("a", 0): _rows([0.6875, 1.0])}, window=2) == (0.84375, 0.94)
    start, thr = start_threshold({}, window=2)  # no complete run
    assert math.isnan(start) and math.isnan(thr)
