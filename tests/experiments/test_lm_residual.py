"""``experiments.lm_residual``: the study where the eq. 86 control's residual is large, on a tiny slice
through the real trainer.

One small study (2 arms × 1 probe seed, 1 fresh seed, 3 steps) builds the tiny ``template_decoy`` model;
what it returns is recomputed from the run folders with plain json: the setting each run was given
(ε 0.2, α = 1, one lr), the speed threshold fixed from the probe block alone (and applied to the
confirmation block), the template drift from the warm start's own eval, and the predictions.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from experiments.lm import THRESHOLD_GAIN
from experiments.lm_power import start_eval
from experiments.lm_residual import ARMS, LR, PREDICTIONS, Sizes, run_residual
from experiments.study import CONFIRM_FIRST_SEED

from .test_lm import SMALL, THIS_MODULE

pytestmark = pytest.mark.sampling

SIZES = Sizes(probe_seeds=(0,), seeds=1, steps=3)


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_residual")
    messages: list[str] = []
    studies = run_residual(
        root, sizes=SIZES, overrides=SMALL, imports=[THIS_MODULE], warm_start_steps=2, jobs=2,
        progress=messages.append,
    )  # fmt: skip
    return root, studies, messages


def test_setting_blocks_and_threshold_from_the_probe_block(study):
    root, studies, messages = study
    assert [(s.name, s.block, s.first_seed) for s in studies] == [
        ("lm_residual", "discovery", 0),
        ("lm_residual", "confirmation", CONFIRM_FIRST_SEED),
    ]
    for folder, seed in (("probe", 0), ("main", CONFIRM_FIRST_SEED)):
        for arm in ARMS:
            saved = yaml.safe_load((root / folder / "runs" / arm / f"seed{seed}/config.yaml").read_text())
            assert saved["epsilon_low"] == saved["epsilon_high"] == 0.2 and saved["length_norm"] is False
            assert saved["lr"] == LR and saved["task"] == "template_decoy" and saved["seed"] == seed
    # the threshold: the probe block's mean sampled reward over steps 1..3 (both arms) + the gain
    probe = [r["reward/mean"] for arm in ARMS for r in _rows(root / "probe/runs" / arm / "seed0")]
    want = min(0.95, round(sum(probe) / len(probe) + THRESHOLD_GAIN, 2))
    assert f"speed threshold from the probe block: {want:.2f}" in messages
    for st in studies:
        assert f"Reward threshold {want:.2f} (fixed from the probe block" in st.setting
        for arm in ARMS:
            # steps to it, by hand: the first step whose trailing 3-step mean (full window) reaches it
            seed = st.first_seed
            rows = _rows(
                root / ("probe" if st.block == "discovery" else "main") / "runs" / arm / f"seed{seed}"
            )
            r = [x["reward/mean"] for x in rows]
            hit = [s + 1 for s in range(2, len(r)) if sum(r[s - 2 : s + 1]) / 3 >= want]
            got = st.per_seed[arm]["steps_to_threshold"][str(seed)]
            assert got == (hit[0] if hit else math.inf)


def test_template_drift_is_measured_from_the_warm_start(study):
    root, studies, _ = study
    cfg = yaml.safe_load((root / "main/runs" / ARMS[0] / f"seed{CONFIRM_FIRST_SEED}/config.yaml").read_text())
    start = start_eval(str(root / "model"), [0, CONFIRM_FIRST_SEED], cfg, [THIS_MODULE])
    for st in studies:
        seed = str(st.first_seed)
        for arm in ARMS:
            rows = _rows(
                root / ("probe" if st.block == "discovery" else "main") / "runs" / arm / f"seed{seed}"
            )
            last = [r for r in rows if "eval/head_logprob" in r][-1]
            head0 = start[int(seed)]["eval/head_logprob"]
            assert head0 < 0 and last["step"] == SIZES.steps
            ms = st.per_seed[arm]
            assert ms["start_head_logprob"][seed] == head0
            assert ms["head_drift"][seed] == pytest.approx(last["eval/head_logprob"] - head0, abs=1e-12)
            assert ms["head_drift_abs"][seed] == abs(ms["head_drift"][seed])
    assert [p.claim for p in studies[1].predictions] == [p.claim for p in PREDICTIONS]
    assert {p.baseline for p in PREDICTIONS} == {"gspo_eq86"} and {p.arm for p in PREDICTIONS} == {
        "dfpo_min_replace"
    }


def test_second_call_runs_nothing(study):
    root, first, _ = study
    messages: list[str] = []
    again = run_residual(root, sizes=SIZES, overrides=SMALL, imports=[THIS_MODULE], warm_start_steps=2,
                         progress=messages.append)  # fmt: skip
    runs = [m for m in messages if m.startswith("[")]
    assert runs and all("finished" in m for m in runs), runs
    assert [s.per_seed for s in again] == [s.per_seed for s in first]
