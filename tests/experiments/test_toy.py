"""``experiments.toy`` and ``experiments.toy_studies``: the toy studies' smallest slices run and round-trip
through JSON, and their per-seed measures equal an independent computation (a plain loop over
``toymodel.simulate`` rows, Jitter₂'s formula by hand, samples = steps × G × groups), with common random
numbers across the arms of a study."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from experiments.study import CONFIRM_FIRST_SEED, StudyResult
from experiments.toy import (
    THRESHOLD,
    Sizes,
    initial_values,
    measure_seed,
    result_path,
    run_arm,
    template_drift,
    template_probs_of,
)
from experiments.toy_studies import STUDIES, run_study, run_toy
from toymodel import get_scenario, simulate, simulate_seeds

#: The smallest slice of a study: 2 seeds (per path), 12 steps, 1 seed of objective metrics.
SLICE = {"seeds": 2, "sim_seeds": 2, "steps": 12, "metric_seeds": 1, "progress": None}


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _jitter2_by_hand(m: list[float]) -> float:
    """DFPO eq. (20): (1/(T−2)) Σ_{t=1}^{T−2} |m_{t+2} − 2m_{t+1} + m_t|, as a plain loop."""
    total = 0.0
    for t in range(len(m) - 2):
        total += abs(m[t + 2] - 2.0 * m[t + 1] + m[t])
    return total / (len(m) - 2)


@pytest.mark.parametrize("name", list(STUDIES))
def test_each_study_slice_runs_and_round_trips(name: str, tmp_path) -> None:
    study = run_study(name, **SLICE)
    spec = STUDIES[name]
    assert study.name == name and list(study.arms) == [a.name for a in spec.arms]
    assert study.baseline in study.arms and study.predictions and study.setting
    # every arm has every measure it can have, one value per seed of its path
    for arm in spec.arms:
        values = study.per_seed[arm.name]
        assert set(values["steps_to_threshold"]) == {"0", "1"}
        assert set(values["final_reward"]) == {"0", "1"}
    # the curves: ≤ 100 points, one list per seed, as long as x
    for curve in spec.curves:
        for data in study.curves[curve].values():
            assert data["x"] == list(range(1, 13))
            assert all(len(v) == 12 for v in data["seeds"].values())
    path = study.save(tmp_path / f"{name}.json")
    back = StudyResult.load(path)
    assert back.per_seed.keys() == study.per_seed.keys()
    for arm, measures in study.per_seed.items():
        assert back.per_seed[arm].keys() == measures.keys()
        for key, vals in measures.items():
            assert back.per_seed[arm][key].keys() == vals.keys()
            assert all(_same(back.per_seed[arm][key][s], v) for s, v in vals.items()), (arm, key)
    assert [m.key for m in back.measures] == [m.key for m in study.measures]
    assert back.measure("steps_to_threshold").horizon == 12.0
    assert back.predictions == study.predictions and back.notes == study.notes
    assert back.verdicts() == study.verdicts()


@pytest.mark.exactness  # the batched toy against one seed's own run, both float64, at 1e-9 / 1e-12
def test_measures_equal_a_plain_loop_over_simulate_rows() -> None:
    """steps-to-threshold, matched-reward and matched-step values, residuals, Asym and Jitter₂ of the batched
    arms equal a plain loop over each seed's own ``simulate`` run (an independent path)."""
    steps = 40
    spec = STUDIES["toy_main"]
    three = tuple(spec.arm(n) for n in ("gspo", "gspo_eq86", "dfpo_min_replace"))
    spec = dataclasses.replace(spec, arms=three, predictions=())  # three of its arms, as configured there
    study = spec.run(seeds=3, sim_seeds=3, steps=steps, metric_seeds=2, progress=None)
    reached = 0
    # step 0, the initial policy, by hand: 0.7/0.2/0.1 on each of 5 template positions, 0.3 on "correct"
    h = -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1))
    step0 = {"expected_reward": 0.3, "template_kl": 0.0, "equiv_entropy": 5 * h}
    for arm_name in ("gspo", "gspo_eq86", "dfpo_min_replace"):
        arm = STUDIES["toy_main"].arm(arm_name)
        got = study.per_seed[arm_name]
        for seed in range(3):
            rows = simulate("template_task", arm.objective, steps=steps, seed=seed, **arm.run_kwargs())
            s = str(seed)
            hit, prev = None, step0
            for row in rows:  # the first step whose exact E[R] reaches the threshold
                if row["expected_reward"] >= THRESHOLD:
                    hit = row
                    break
                prev = row
            if hit is None:
                assert got["steps_to_threshold"][s] == math.inf
                assert got["samples_to_threshold"][s] == math.inf
                assert math.isnan(got["template_kl_at_threshold"][s])
                assert math.isnan(got["equiv_entropy_at_threshold"][s])
            else:
                reached += 1
                assert got["steps_to_threshold"][s] == hit["step"]
                assert got["samples_to_threshold"][s] == hit["step"] * 8 * 1  # steps × G × groups
                # matched reward: the straight line between the step before (step 0 for a crossing at
                # step 1) and the crossing step, at 0.9
                f = (THRESHOLD - prev["expected_reward"]) / (hit["expected_reward"] - prev["expected_reward"])
                for key in ("template_kl", "equiv_entropy"):
                    want = prev[key] + f * (hit[key] - prev[key])
                    assert got[f"{key}_at_threshold"][s] == pytest.approx(want, abs=1e-9)
            assert got["final_reward"][s] == pytest.approx(rows[-1]["expected_reward"], abs=1e-9)
            assert got["reward_at_step_20"][s] == pytest.approx(rows[19]["expected_reward"], abs=1e-9)
            assert got["template_kl_at_step_20"][s] == pytest.approx(rows[19]["template_kl"], abs=1e-9)
            er = [r["expected_reward"] for r in rows]
            assert got["jitter2_expected_reward"][s] == pytest.approx(_jitter2_by_hand(er), abs=1e-9)
            sr = [r["sampled_reward"] for r in rows]
            assert got["jitter2_sampled_reward"][s] == pytest.approx(_jitter2_by_hand(sr), abs=1e-12)
            gsr = [r["group_shared_residual"] for r in rows if not math.isnan(r["group_shared_residual"])]
            assert got["group_shared_residual"][s] == pytest.approx(sum(gsr) / len(gsr), abs=1e-9)
            # Asym: simulate on the first metric_seeds seeds only, mean over steps with a learning signal
            if seed < 2:
                sig = [r["asym"] for r in rows if r["updated"] == 1.0 and r["zero_adv_group_frac"] < 1.0]
                assert got["asym"][s] == pytest.approx(sum(sig) / len(sig), abs=1e-12)
            else:
                assert s not in got["asym"]
    assert (
        reached >= 3
    )  # the threshold branch was exercised (the eq. 86 control and DFPO reach it by step ~25)
    assert study.per_seed["gspo"]["steps_to_threshold"]["0"] == math.inf  # GSPO needs ~80 steps: censored


def test_measure_seed_by_hand() -> None:
    """A hand-made 4-step run: threshold crossing, censoring at the sample budget, matched values, Jitter₂."""
    nan = math.nan
    cols = {
        "step": [1.0, 2.0, 3.0, 4.0],
        "updated": [1.0, 1.0, 0.0, 1.0],
        "expected_reward": [0.5, 0.95, 0.8, 0.92],
        "sampled_reward": [0.0, 1.0, 0.5, 0.5],
        "equiv_entropy": [1.0, 0.9, 0.8, 0.7],
        "template_kl": [0.0, 0.1, 0.2, 0.3],
        "equiv_log_odds": [0.0, -0.1, -0.2, -0.3],
        "shared_residual": [0.4, nan, nan, 0.2],
        "group_shared_residual": [nan, nan, nan, nan],
        "sequence_net_residual": [0.1, 0.3, nan, 0.2],
        "zero_adv_group_frac": [0.0, 1.0, 0.0, 0.5],
        "asym": [0.5, 0.0, nan, 0.25],
        "clip/frac": [0.1, 0.0, nan, 0.3],
        "clip/low_frac": [0.0, 0.0, nan, 0.1],
        "clip/high_frac": [0.1, 0.0, nan, 0.2],
    }
    cols = {k: torch.tensor(v, dtype=torch.float64).numpy() for k, v in cols.items()}
    m = measure_seed(cols, samples_per_step=16, sample_budget=64, early_step=3)
    assert m["steps_to_threshold"] == 2.0 and m["samples_to_threshold"] == 32.0
    assert m["final_reward"] == 0.92 and m["reward_at_step_3"] == 0.8
    assert m["reward_at_sample_budget"] == 0.92  # 64 samples = step 4 at 16 a step
    # matched reward is interpolated at E[R] = 0.9 between step 1 (0.5) and step 2 (0.95): 8/9 of the way
    assert m["equiv_entropy_at_threshold"] == pytest.approx(1.0 - 0.1 * 8 / 9, abs=1e-15)
    assert m["template_kl_at_threshold"] == pytest.approx(0.1 * 8 / 9, abs=1e-15)
    assert m["equiv_entropy_at_step_3"] == 0.8 and m["template_kl_final"] == 0.3
    assert m["equiv_log_odds_final"] == -0.3
    # |0.8 − 1.9 + 0.5| = 0.6 and |0.92 − 1.6 + 0.95| = 0.27
    assert m["jitter2_expected_reward"] == pytest.approx((0.6 + 0.27) / 2, abs=1e-15)
    assert m["jitter2_sampled_reward"] == pytest.approx(
        (1.5 + 0.5) / 2, abs=1e-15
    )  # |0.5 − 2 + 0|, |0.5 − 1 + 1|
    assert m["shared_residual"] == pytest.approx(0.3) and math.isnan(m["group_shared_residual"])
    assert m["sequence_net_residual"] == pytest.approx(0.2)
    assert m["update_frac"] == 0.75
    # steps 1 and 4 had a signal (step 2: every group zero-advantage; step 3: no update)
    assert m["asym"] == pytest.approx(0.375) and m["clip_frac"] == pytest.approx(0.2)
    # the same run with a budget of 16 samples: step 2's 32 samples exceed it (not reached within it)
    m = measure_seed(cols, samples_per_step=16, sample_budget=16, early_step=9)
    assert m["samples_to_threshold"] == math.inf and m["steps_to_threshold"] == 2.0
    assert math.isnan(m["reward_at_step_9"]) and m["reward_at_sample_budget"] == 0.5
    # never reached: inf, and NaN at matched reward
    cols["expected_reward"] = cols["expected_reward"] * 0.5
    m = measure_seed(cols, samples_per_step=16, sample_budget=64, early_step=3)
    assert m["steps_to_threshold"] == math.inf and m["samples_to_threshold"] == math.inf
    assert math.isnan(m["template_kl_at_threshold"]) and math.isnan(m["equiv_entropy_at_threshold"])


def test_group_size_samples_budget_and_gains() -> None:
    """samples = steps × G, censored at the G = 2 arms' whole run; E[R] after the budget; the gain formula."""
    steps = 60
    study = run_study("toy_group_size", seeds=2, sim_seeds=2, steps=steps, progress=None)
    budget = steps * 2
    assert study.measure("samples_to_threshold").horizon == budget
    finite_gains = 0
    for g in (2, 4, 8, 16):
        for prefix in ("gspo", "gspo_eq86", "dfpo"):
            got = study.per_seed[f"{prefix}_G{g}"]
            for s, st in got["steps_to_threshold"].items():
                want = st * g if st * g <= budget else math.inf
                assert got["samples_to_threshold"][s] == want
        arm = STUDIES["toy_group_size"].arm(f"dfpo_G{g}")
        for seed in range(2):
            rows = simulate("template_task", "dfpo", steps=steps, seed=seed, **arm.run_kwargs())
            got = study.per_seed[f"dfpo_G{g}"]
            assert got["reward_at_sample_budget"][str(seed)] == pytest.approx(
                rows[budget // g - 1]["expected_reward"], abs=1e-9
            )
            mine = got["steps_to_threshold"][str(seed)]
            ctrl = study.per_seed[f"gspo_eq86_G{g}"]["steps_to_threshold"][str(seed)]
            gain = got["gain_vs_control"][str(seed)]
            if math.isfinite(mine) and math.isfinite(ctrl):
                finite_gains += 1
                assert gain == pytest.approx(1.0 - mine / ctrl, abs=1e-15)
            else:
                assert math.isnan(gain)
    assert finite_gains >= 4


def test_common_random_numbers_across_arms() -> None:
    """Two arms of a study with the same seed draw the same samples at step 1 (batched path), and every
    per-seed arm of toy_batching sees the same first-step groups (their sampled reward is equal)."""
    spec = STUDIES["toy_main"]
    first = {}
    for name in ("grpo", "gspo", "dfpo_orth_proj_pos", "dfpo_scale_half"):
        arm = spec.arm(name)
        res = simulate_seeds(
            "template_task", arm.objective, [0, 1, 2], steps=2, return_samples=True, **arm.run_kwargs()
        )
        first[name] = res["samples"][:, 0]
    for name, samples in first.items():
        assert torch.equal(samples, first["grpo"]), name
    assert not torch.equal(first["grpo"][0], first["grpo"][1])  # different seeds, different draws
    bt = STUDIES["toy_batching"]
    step1 = {}
    for arm in bt.arms:
        runs = run_arm(arm, bt.scenario, [0, 1, 2], 2, per_seed=True)
        step1[arm.name] = {s: cols["sampled_reward"][0] for s, cols in runs.items()}
    for name, by_seed in step1.items():
        assert by_seed == step1["grpo_random"], name


def test_run_toy_saves_each_study_and_refuses_unknown_names(tmp_path, monkeypatch) -> None:
    tiny = Sizes(seeds=2, sim_seeds=2, steps=6, metric_seeds=1, curve_seeds=1)
    for name in ("toy_low_prob", "toy_aggregation"):
        monkeypatch.setitem(STUDIES, name, dataclasses.replace(STUDIES[name], quick=tiny))
    out = run_toy(tmp_path, quick=True, only=["toy_low_prob", "toy_aggregation"], progress=None)
    assert [(s.name, s.block) for s in out] == [
        ("toy_low_prob", "discovery"), ("toy_low_prob", "confirmation"),
        ("toy_aggregation", "discovery"), ("toy_aggregation", "confirmation"),
    ]  # fmt: skip
    for s in out:
        first = 0 if s.block == "discovery" else CONFIRM_FIRST_SEED
        back = StudyResult.load(result_path(tmp_path, s.name, s.block))
        assert back.block == s.block and back.first_seed == first
        arm = "grpo" if s.name == "toy_low_prob" else "grpo_seqmean"
        # the blocks share no seed: discovery 0, 1; confirmation 10000, 10001
        assert back.per_seed[arm]["final_reward"].keys() == {str(first), str(first + 1)}
        assert all(list(d["seeds"]) == [str(first)] for c in back.curves.values() for d in c.values())
        assert back.predictions == list(STUDIES[s.name].predictions)  # the same predictions in both blocks
    with pytest.raises(ValueError, match=r"unknown toy study.*toy_nope.*toy_main"):
        run_toy(tmp_path, only=["toy_nope"])


@pytest.mark.exactness  # the batched toy against one seed's own run, both float64, at 1e-9 / 1e-12
def test_confirmation_block_runs_fresh_seeds_with_the_same_arms() -> None:
    d = run_study("toy_main", block="discovery", **SLICE)
    c = run_study("toy_main", block="confirmation", **SLICE)
    assert (d.block, d.first_seed, c.block, c.first_seed) == (
        "discovery",
        0,
        "confirmation",
        CONFIRM_FIRST_SEED,
    )
    assert list(c.arms) == list(d.arms) and c.predictions == d.predictions
    assert set(c.per_seed["gspo"]["final_reward"]) == {str(CONFIRM_FIRST_SEED), str(CONFIRM_FIRST_SEED + 1)}
    # a confirmation seed equals the batched toy run on that seed directly
    arm = STUDIES["toy_main"].arm("dfpo_min_replace")
    direct = simulate_seeds(
        "template_task", arm.objective, [CONFIRM_FIRST_SEED], steps=12, **arm.run_kwargs()
    )
    assert c.per_seed["dfpo_min_replace"]["final_reward"][str(CONFIRM_FIRST_SEED)] == pytest.approx(
        float(direct["expected_reward"][0, -1]), abs=1e-12
    )
    with pytest.raises(ValueError, match="`block` must be one of"):
        run_study("toy_main", block="holdout", **SLICE)


def test_initial_values_are_the_scenarios_initial_policy_by_hand() -> None:
    """Step 0 of the matched-reward series: template_task's 0.7/0.2/0.1 synonyms at 5 positions and 0.3 on
    the correct answer; equivalent_solutions' two correct answers at 1/4 and 1/2 of the mass (E[R] 0.75)."""
    t = initial_values("template_task")
    h = -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1))
    assert t["expected_reward"] == pytest.approx(0.3, abs=1e-12)
    assert t["equiv_entropy"] == pytest.approx(5 * h, abs=1e-12)  # the synonyms' entropies add up
    assert t["equiv_log_odds"] == pytest.approx(5 * math.log(0.7 / 0.2), abs=1e-12)  # all-first vs all-second
    assert t["template_kl"] == 0.0
    e = initial_values("equivalent_solutions")
    assert e["expected_reward"] == pytest.approx(0.75, abs=1e-12)
    assert e["equiv_entropy"] == pytest.approx(-(math.log(1 / 3) / 3 + 2 * math.log(2 / 3) / 3), abs=1e-12)
    assert e["equiv_log_odds"] == pytest.approx(math.log(0.5), abs=1e-12)


def test_matched_reward_interpolates_from_step_0() -> None:
    """A run that crosses E[R] = 0.9 at its first step is read between step 0 (the initial policy) and step 1;
    without the initial values the series starts at step 1 and reads step 1's value (the old behaviour)."""
    cols = {
        "step": [1.0, 2.0],
        "updated": [1.0, 1.0],
        "expected_reward": [0.96, 0.99],
        "sampled_reward": [1.0, 1.0],
        "equiv_entropy": [3.0, 2.9],
        "template_kl": [2.0, 2.5],
        "equiv_log_odds": [1.0, 1.5],
        "shared_residual": [0.1, 0.1],
        "group_shared_residual": [0.1, 0.1],
        "sequence_net_residual": [0.1, 0.1],
    }
    cols = {k: torch.tensor(v, dtype=torch.float64).numpy() for k, v in cols.items()}
    init = {"expected_reward": 0.3, "template_kl": 0.0, "equiv_entropy": 4.0, "equiv_log_odds": 6.0}
    m = measure_seed(cols, samples_per_step=8, sample_budget=100, early_step=1, initial=init)
    f = (0.9 - 0.3) / (0.96 - 0.3)  # 10/11 of the way from step 0 to step 1
    assert m["template_kl_at_threshold"] == pytest.approx(f * 2.0, abs=1e-15)
    assert m["equiv_entropy_at_threshold"] == pytest.approx(4.0 - f * 1.0, abs=1e-15)
    assert m["equiv_log_odds_at_threshold"] == pytest.approx(6.0 - f * 5.0, abs=1e-15)
    assert m["steps_to_threshold"] == 1.0  # the speed is still counted in updates
    old = measure_seed(cols, samples_per_step=8, sample_budget=100, early_step=1)
    assert old["template_kl_at_threshold"] == 2.0


def test_template_drift_by_hand() -> None:
    """Drift vectors (1, 0), (0, 1), (1, 1): seed mean (2/3, 2/3), drift² 8/9; per-coordinate sample variance
    1/3, floor (1/3 + 1/3)/3 = 2/9; systematic = Σ_{s≠t} x_s·x_t / (n(n − 1)) = (0 + 1 + 1)·2/6 = 2/3."""
    d = template_drift(
        torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64).numpy(), n_boot=50
    )
    assert d["n"] == 3
    assert d["drift2"] == pytest.approx(8 / 9, abs=1e-15)
    assert d["floor"] == pytest.approx(2 / 9, abs=1e-15)
    assert d["systematic"] == pytest.approx(2 / 3, abs=1e-15)
    assert d["per_seed2"] == pytest.approx(4 / 3, abs=1e-15)  # (1 + 1 + 2) / 3
    assert d["se"] > 0
    same = template_drift(torch.ones(4, 3, dtype=torch.float64).numpy(), n_boot=20)  # no spread: no floor
    assert (same["drift2"], same["floor"], same["systematic"], same["se"]) == (3.0, 0.0, 3.0, 0.0)
    with pytest.raises(ValueError, match="n ≥ 2"):
        template_drift(torch.ones(1, 3).numpy())


def test_study_drift_equals_a_plain_loop_over_each_seeds_final_policy() -> None:
    """The study's seed-mean template drift: the batched arm's final template probabilities (read from
    simulate_seeds) equal each seed's own simulate run's (its callback), and the study-level numbers equal
    a plain loop over those per-seed vectors."""
    spec = STUDIES["toy_main"]
    arms = tuple(spec.arm(n) for n in ("gspo_eq86", "dfpo_min_replace"))
    spec = dataclasses.replace(spec, arms=arms, baseline="gspo_eq86", predictions=())
    steps, n = 15, 4
    study = spec.run(seeds=n, sim_seeds=n, steps=steps, metric_seeds=0, progress=None)
    sc = get_scenario("template_task")
    p0 = torch.softmax(sc.initial_logits().to(torch.float64), -1)[:5].flatten().tolist()  # 5 contexts × 3
    assert template_probs_of("template_task", sc.initial_logits()).tolist() == pytest.approx(p0, abs=1e-15)
    for arm in arms:
        batched = run_arm(arm, "template_task", range(n), steps, template_probs=True)
        vecs = []
        for seed in range(n):
            seen: list[torch.Tensor] = []  # every step's logits, in order
            simulate("template_task", arm.objective, steps=steps, seed=seed,
                     callback=lambda _k, lg, out=seen: out.append(lg), **arm.run_kwargs())  # fmt: skip
            assert len(seen) == steps
            probs = torch.softmax(seen[-1].to(torch.float64), -1)[:5].flatten().tolist()
            assert batched[seed]["template_probs_final"].tolist() == pytest.approx(probs, abs=1e-6)
            vecs.append([a - b for a, b in zip(probs, p0, strict=True)])
        mean = [sum(v[j] for v in vecs) / n for j in range(15)]
        drift2 = sum(m * m for m in mean)
        floor = sum(sum((v[j] - mean[j]) ** 2 for v in vecs) / (n - 1) for j in range(15)) / n
        got = study.drift[arm.name]
        assert got["n"] == n
        assert got["drift2"] == pytest.approx(drift2, rel=1e-5, abs=1e-12)
        assert got["floor"] == pytest.approx(floor, rel=1e-5, abs=1e-12)
        assert got["systematic"] == pytest.approx(drift2 - floor, rel=1e-4, abs=1e-10)
    assert drift2 > 0  # the arms learned: the template moved
    back = StudyResult.from_json(study.to_json())
    assert back.drift == study.drift
