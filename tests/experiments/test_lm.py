"""``experiments.lm``: the language-model sweep on a tiny slice through the real trainer.

One sweep (2 arms × 1 seed × 3 steps, plus an arm with an invalid override and one that crashes in the
trainer) builds the tiny model once, writes normal run folders, and its study's per-seed values equal the
numbers recomputed by hand from each metrics.jsonl (read with plain json). A second call runs nothing
(no file changes); more steps resume the cut run (rows 1..N exactly once, the first rows unchanged); the
model folder is never rebuilt silently; the Runs page lists and opens the ``arm/seed<k>`` folders.
"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from experiments.lm import ensure_model, run_lm
from experiments.lm_studies import LM_ARMS
from experiments.study import StudyResult
from scaledrun.rewards import REWARDS, register_reward

from ..exactness import rounding_tolerance

#: trains or samples the tiny model (``tests/machines.py`` reruns it as other machines would)
pytestmark = pytest.mark.sampling

PAGE = Path(__file__).resolve().parents[2] / "app/views/runs.py"
#: A reward that varies within almost every group (the barely warm-started model never answers right).
HASH_REWARD = "test_lm_hash"
#: This module, imported by each trainer subprocess (``--import``) so that it knows HASH_REWARD.
THIS_MODULE = "tests.experiments.test_lm"

if HASH_REWARD not in REWARDS:

    @register_reward(HASH_REWARD)
    def _hash_reward(prompts, completions, answers):
        """crc32(completion) % 101 / 100."""
        return [(zlib.crc32(c.encode()) % 101) / 100.0 for c in completions]


#: The smallest runs that still update off-policy: 2 prompts × 4 completions, 2 inner epochs × 2
#: query mini-batches, 8 new tokens (kept, not masked), an eval of 4 prompts at every step.
SMALL = {
    "group_size": 4, "prompts_per_step": 2, "num_minibatches": 2, "inner_epochs": 2, "max_new_tokens": 8,
    "truncation": "keep", "num_train": 8, "num_eval": 4, "eval_every": 1, "eval_k": 2, "save_every": 1,
    "reward": HASH_REWARD,
}  # fmt: skip
WARM = 2
GOOD = {"gspo": LM_ARMS["gspo"], "dfpo_min_replace": LM_ARMS["dfpo_min_replace"]}
ARMS = {
    **GOOD,
    "bad_override": {"objective": "grpo_symclip", "epsilon_low": 0.1},  # grpo_symclip takes no epsilon_low
    "crash": {"objective": "grpo", "lora_target_modules": ["no_such_module"]},  # PEFT raises in the trainer
}
STEPS = 3


def _sweep(root: Path, arms=GOOD, steps=STEPS, messages=None, **kw):
    return run_lm(
        root, arms=arms, seeds=1, steps=steps, overrides=SMALL, imports=[THIS_MODULE], warm_start_steps=WARM,
        progress=(messages.append if messages is not None else None), **kw,
    )  # fmt: skip


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_sweep")
    messages: list[str] = []
    studies = _sweep(root, ARMS, messages=messages, jobs=2)
    return root, studies, messages


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]


def _jitter2(m: list[float]) -> float:
    return sum(abs(m[t + 2] - 2 * m[t + 1] + m[t]) for t in range(len(m) - 2)) / (len(m) - 2)


def _mean(values) -> float:
    v = [x for x in values if x is not None]
    return sum(v) / len(v) if v else math.nan


def test_runs_are_normal_run_folders_and_failures_are_reported(sweep):
    root, studies, messages = sweep
    assert json.loads((root / "model" / "warm_start.json").read_text())["warm_start_steps"] == WARM
    for arm in GOOD:
        run = root / "runs" / arm / "seed0"
        assert [r["step"] for r in _lines(run)] == [1, 2, 3]
        assert (run / "config.yaml").is_file() and (run / "sweep.log").is_file()
        assert (run / "checkpoints").is_dir() and any((run / "checkpoints").iterdir())
    text = "\n".join(messages)
    assert "bad_override/seed0: failed" in text and "epsilon_low" in text
    # the crash is reported with the end of its log, and the other arms finished anyway
    assert "crash/seed0: failed" in text and "exit code" in text and "no_such_module" in text
    assert "no_such_module" in (root / "runs" / "crash" / "seed0" / "sweep.log").read_text()
    (main,) = studies
    assert main.name == "lm_main" and main.baseline == "gspo"
    assert list(main.arms) == list(ARMS)
    assert math.isnan(main.values("crash", "final_reward")["0"])
    assert any("failed" in n and "crash/seed0" in n for n in main.notes)


def test_per_seed_values_equal_the_metrics_files(sweep, tmp_path):
    root, (main,), _ = sweep
    runs = {arm: _lines(root / "runs" / arm / "seed0") for arm in GOOD}
    # step 1 samples the same completions in both arms (same seed, same model: common random numbers)
    assert runs["gspo"][0]["reward/mean"] == runs["dfpo_min_replace"][0]["reward/mean"]
    # the threshold: the mean reward of the first window (min(10, 3) = 3 steps) over both runs + 0.1
    first = [r["reward/mean"] for rows in runs.values() for r in rows]
    threshold = min(0.95, round(sum(first) / len(first) + 0.1, 2))
    assert f"Reward threshold {threshold:.2f}" in main.setting
    for arm, rows in runs.items():
        reward = [r["reward/mean"] for r in rows]
        smooth = [sum(reward[i - 2 : i + 1]) / 3 for i in range(2, len(reward))]  # window min(10, 3) = 3
        hit = [i + 3 for i, v in enumerate(smooth) if v >= threshold]
        acc = [r["eval/greedy_accuracy"] for r in rows]
        avg = [r["eval/avg@2"] for r in rows]
        expected = {
            "steps_to_threshold": float(hit[0]) if hit else math.inf,
            "final_reward": sum(reward) / 3,
            "final_greedy_accuracy": acc[-1],
            "final_avg_at_k": avg[-1],
            "jitter2_reward": _jitter2(reward),
            "jitter2_eval_accuracy": _jitter2(acc),
            "sequence_net_residual": _mean(r["sequence_net_residual"] for r in rows),
            "group_shared_residual": _mean(r["group_shared_residual"] for r in rows),
            "asym": _mean(r["asym"] for r in rows),
            "clip_frac": _mean(r["clip/frac"] for r in rows),
            "flip_rate": _mean(r["flip/rate"] for r in rows),
            "energy_frequent": _mean(r["energy/bucket_0"] for r in rows),
            "time_per_step": _mean(r["time/step_s"] for r in rows),
            "entropy_final": _mean(r["entropy"] for r in rows),
        }
        if "eval/form_entropy" in rows[-1]:  # the trainer's equivalent-solution entropy (template_forms)
            expected["form_entropy_final"] = rows[-1]["eval/form_entropy"]
            # matched reward: the first eval at or after the step the reward's trailing mean reached it
            expected["form_entropy_at_threshold"] = (
                next(r["eval/form_entropy"] for r in rows if r["step"] >= hit[0]) if hit else math.nan
            )
        for key, value in expected.items():
            got = main.values(arm, key).get("0", math.nan)  # a measure no run has is left out
            assert got == pytest.approx(value, rel=1e-12, abs=1e-15) or (
                math.isnan(got) and math.isnan(value)
            ), key
        # the curves: the reward's trailing mean (partial windows at the start) and the residual per step
        curve = main.curves["reward_moving_mean"][arm]
        assert curve["x"] == [1, 2, 3]
        assert curve["seeds"]["0"] == pytest.approx(
            [reward[0], sum(reward[:2]) / 2, sum(reward) / 3], rel=1e-5
        )
        assert main.curves["eval_greedy_accuracy"][arm]["seeds"]["0"] == pytest.approx(acc, rel=1e-5)
    # DFPO cancels at the sequence level whatever the lengths; GSPO does not have to
    # |net| / gross of a group's G·T + G float32 terms (G = 4, T = 8): 0 up to their rounding, as
    # tests/scaledrun/test_update.py's RESIDUAL_TOL (a mean over steps of such residuals), not a fixed 1e-6
    tol = rounding_tolerance(1.0, SMALL["group_size"] * (SMALL["max_new_tokens"] + 1))
    assert main.values("dfpo_min_replace", "sequence_net_residual")["0"] <= tol
    assert main.measure("steps_to_threshold").horizon == STEPS
    # the study survives its JSON round trip and its verdicts are computed, not written
    back = StudyResult.load(main.save(tmp_path / "lm_main.json"))
    assert back.per_seed == main.per_seed or json.dumps(back.to_json()) == json.dumps(main.to_json())
    assert {v.prediction.claim for v in back.verdicts()} == {p.claim for p in main.predictions}


def test_runs_page_lists_and_opens_the_sweep(sweep):
    root, _, _ = sweep
    at = AppTest.from_file(str(PAGE), default_timeout=120)
    at.session_state["runs_dir"] = str(root / "runs")
    at.run()
    assert not at.exception, at.exception
    picker = at.sidebar.multiselect(key="runs")
    assert picker.options == ["dfpo_min_replace/seed0", "gspo/seed0"]  # the crashed run wrote no run files
    table = at.dataframe[0].value
    rewards = [r["reward/mean"] for r in _lines(root / "runs" / "gspo" / "seed0")]
    (metric,) = [m for m in at.metric if m.label.startswith("gspo/seed0 · gspo")]  # the last-10 mean
    assert metric.value == f"{sum(rewards) / len(rewards):.4f}" and len(rewards) == STEPS < 10
    assert table.loc["dfpo_min_replace/seed0 · dfpo min_replace", "steps"] == STEPS


def test_a_second_call_runs_nothing(sweep):
    root, _, _ = sweep
    files = {p: p.stat().st_mtime_ns for p in (root / "runs").rglob("*") if p.is_file()}
    files[root / "model" / "warm_start.json"] = (root / "model" / "warm_start.json").stat().st_mtime_ns
    messages: list[str] = []
    (main,) = _sweep(root, messages=messages)
    assert sum("finished" in m and "skipped" in m for m in messages) == 2, messages
    assert not any(": ran" in m or "resumed" in m for m in messages)
    assert {p: p.stat().st_mtime_ns for p in files} == files  # not one file touched
    assert main.values("gspo", "final_reward")["0"] == pytest.approx(
        sum(r["reward/mean"] for r in _lines(root / "runs" / "gspo" / "seed0")) / 3
    )


def test_more_steps_resume_the_run_once(sweep):
    root, _, _ = sweep
    run = root / "runs" / "gspo" / "seed0"
    before = _lines(run)
    messages: list[str] = []
    _sweep(root, arms={"gspo": GOOD["gspo"]}, steps=STEPS + 2, messages=messages)
    assert any("gspo/seed0: resumed, steps 4-5" in m for m in messages), messages
    after = _lines(run)
    assert [r["step"] for r in after] == [1, 2, 3, 4, 5]  # each step exactly once
    assert after[:3] == before  # the steps already taken are kept as they were
    assert "--resume true" in (run / "sweep.log").read_text()


def test_the_model_is_never_rebuilt_silently(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    record = {"task": "template_forms", "seed": 0, "digits": 2, "ops": "+", "warm_start_steps": 5}
    (folder / "warm_start.json").write_text(json.dumps(record))
    same = ensure_model(folder, warm_start_steps=5, stop_accuracy=None, progress=None)
    assert same == folder  # the same settings: reused
    assert sorted(p.name for p in folder.iterdir()) == ["warm_start.json"]  # nothing was built
    with pytest.raises(ValueError, match=str(folder)) as err:
        ensure_model(folder, warm_start_steps=6, stop_accuracy=None, progress=None)
    assert "warm_start_steps: 5 there, 6 here" in str(err.value)
    with pytest.raises(ValueError, match=str(folder)) as err:
        ensure_model(folder, warm_start_steps=5, stop_accuracy=0.4, progress=None)  # the default stop
    assert "stop_accuracy: None there, 0.4 here" in str(err.value)


def test_the_smallest_slice_end_to_end(sweep, tmp_path):
    """The quick mode's smallest slice, run → save → report: a toy study and this sweep's studies become
    one REPORT.md through the command's ``--report-only`` path; 1-2 seeds give no verdict."""
    from experiments.__main__ import main
    from experiments.toy_studies import run_study

    _, studies, _ = sweep
    out = tmp_path / "results"
    toy = run_study("toy_main", seeds=2, sim_seeds=2, steps=12, metric_seeds=1, progress=None)
    for study in [toy, *studies]:
        study.save(out / f"{study.name}.json")
    report = tmp_path / "REPORT.md"
    assert main(["--report-only", "--out", str(out), "--report", str(report), "--no-png"]) == 0
    text = report.read_text()
    for study in [toy, *studies]:
        assert f"## {study.title}" in text
    assert text.index(f"## {toy.title}") < text.index(f"## {studies[0].title}")  # toy studies first
    assert "· too few seeds" in text and "✅ held" not in text and "❌ contradicted" not in text
    assert (tmp_path / "figures" / f"{studies[0].name}_{next(iter(studies[0].curves))}.html").exists()
