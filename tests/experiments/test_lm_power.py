"""``experiments.lm_power``: the language-model study with power, on a tiny slice through the real trainer.

The lr rule is checked on hand-made numbers; one small study (3 arms × 2 lrs probe, 1 fresh seed, 2 steps)
builds the tiny ``template_decoy`` model, and what it returns is recomputed from the run folders with
plain json: the lr each arm's probe chose, the discovery block (the probe runs at those lrs), the bigger
steps' lr, and the warm start's eval that every gain is measured from (its form mass against a plain
teacher-forced loop on the seed's own eval prompts). A second call runs nothing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from experiments.lm import THRESHOLD_GAIN
from experiments.lm_power import (
    ARMS,
    BIG_ARMS,
    BIG_STEP_FACTOR,
    FULL,
    LR_TIE_MARGIN,
    PREDICTIONS,
    Sizes,
    choose_lr,
    next_lr,
    run_power,
    start_eval,
)
from experiments.study import CONFIRM_FIRST_SEED
from scaledrun.tasks import format_prompt, load_task

from .test_lm import SMALL, THIS_MODULE

pytestmark = pytest.mark.sampling

LRS = (1e-4, 1e-3)
SIZES = Sizes(probe_seeds=(0,), lrs=LRS, seeds=1, big_seeds=1, steps=2)


def test_choose_lr_rule():
    assert choose_lr({1e-4: [0.2, 0.4], 2e-4: [0.35, 0.35], 4e-4: [0.1, 0.5]}) == 2e-4  # 0.3, 0.35, 0.3
    assert choose_lr({1e-4: [0.3], 2e-4: [0.3]}) == 1e-4  # a tie goes to the smaller lr
    # within the tie margin (0.01) of the best is a tie: 0.310 against 0.312 (the first study's GSPO)
    assert choose_lr({1e-4: [0.310], 2e-4: [0.312]}) == 1e-4
    assert choose_lr({1e-4: [0.300], 2e-4: [0.312]}) == 2e-4  # 0.012 apart: past the margin
    assert choose_lr({1e-4: [0.310], 2e-4: [0.312]}, margin=0.0) == 2e-4
    assert choose_lr({1e-4: [0.2, 0.2], 2e-4: [0.9, math.nan]}) == 1e-4  # a failed run makes its lr the worst
    with pytest.raises(ValueError, match="no learning rate has a finished probe run"):
        choose_lr({1e-4: [math.nan], 2e-4: []})


def test_probe_extends_until_the_best_lr_is_bracketed():
    rising = {1e-4: [0.2], 2e-4: [0.3], 4e-4: [0.35]}
    assert next_lr(rising, extended=0, max_extend=2) == 8e-4  # the best is the largest: double it
    assert next_lr({**rising, 8e-4: [0.4]}, extended=1, max_extend=2) == 1.6e-3
    assert next_lr({**rising, 8e-4: [0.4], 1.6e-3: [0.5]}, extended=2, max_extend=2) is None  # at most 2
    assert next_lr({**rising, 8e-4: [0.1]}, extended=1, max_extend=2) is None  # bracketed: 4e-4 wins
    assert next_lr({2e-4: [0.3]}, extended=0, max_extend=2) is None  # one lr: nothing to bracket


def test_probe_extends_downwards_when_the_smallest_lr_is_chosen():
    """The rerun's control and DFPO: 1e-4 best by far of 1e-4, 2e-4, 4e-4 (0.61, 0.58, 0.28): halve it."""
    falling = {1e-4: [0.61], 2e-4: [0.58], 4e-4: [0.28]}
    assert next_lr(falling, extended=0, max_extend=2) == 5e-5
    assert next_lr({**falling, 5e-5: [0.62]}, extended=1, max_extend=2) == 2.5e-5  # still the smallest
    assert next_lr({**falling, 5e-5: [0.62], 2.5e-5: [0.63]}, extended=2, max_extend=2) is None  # at most 2
    assert next_lr({**falling, 5e-5: [0.5]}, extended=1, max_extend=2) is None  # bracketed: 1e-4 wins
    # a tie with the smallest (within the margin) chooses the smallest, so the probe looks below it too
    assert next_lr({1e-4: [0.605], 2e-4: [0.61], 4e-4: [0.3]}, extended=0, max_extend=2) == 5e-5
    assert next_lr({1e-4: [0.2], 2e-4: [0.1]}, extended=0, max_extend=2) == 5e-5


def test_the_full_study_is_sized_as_the_referee_asked():
    """≥ 100 steps (at 30, 16-22 of 30 seeds per arm were censored), ≥ 30 fresh seeds, entropy at a fixed
    step (at matched reward it is measured only on the seeds that reach the threshold, a selection)."""
    assert FULL.steps >= 100 and FULL.seeds >= 30 and FULL.big_seeds >= 30
    entropy = [p for p in PREDICTIONS if "entropy" in p.measure]
    assert entropy and all(p.measure == "form_entropy_final" for p in entropy)


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_power")
    messages: list[str] = []
    studies = run_power(
        root, sizes=SIZES, overrides=SMALL, imports=[THIS_MODULE], warm_start_steps=2, jobs=2,
        progress=messages.append,
    )  # fmt: skip
    return root, studies, messages


def test_blocks_lrs_and_discovery_runs(study):
    root, studies, _ = study
    assert [(s.name, s.block, s.first_seed) for s in studies] == [
        ("lm_power", "discovery", 0),
        ("lm_power", "confirmation", CONFIRM_FIRST_SEED),
        ("lm_power_big_steps", "confirmation", CONFIRM_FIRST_SEED),
    ]
    disc, conf, big = studies
    assert (
        "the lr its probe chose and 1 fresh seed:" in conf.question
    )  # the study's own size, not the full one
    for arm in ARMS:
        # the chosen lr, by hand: the highest mean sampled reward over the probe run's steps (ties: smaller)
        means = {lr: sum(r["reward/mean"] for r in _rows(root / "probe/runs" / f"{arm}@lr{lr:g}/seed0")) / 2
                 for lr in LRS}  # fmt: skip
        want = min(lr for lr in LRS if means[lr] >= max(means.values()) - LR_TIE_MARGIN)
        for st in (disc, conf):
            assert st.arms[arm]["config"]["lr"] == want and st.arms[arm]["label"].endswith(f"lr {want:g}")
        # the discovery block is the probe run at that lr; the confirmation block a fresh seed
        probe_rows = _rows(root / "probe/runs" / f"{arm}@lr{want:g}/seed0")
        assert disc.per_seed[arm]["final_reward"] == {"0": pytest.approx(means[want], abs=1e-12)}
        assert means[want] == pytest.approx(sum(r["reward/mean"] for r in probe_rows) / 2, abs=0)
        fresh = _rows(root / "main/runs" / arm / f"seed{CONFIRM_FIRST_SEED}")
        assert conf.per_seed[arm]["final_reward"][str(CONFIRM_FIRST_SEED)] == pytest.approx(
            sum(r["reward/mean"] for r in fresh) / 2, abs=1e-12
        )
        saved = yaml.safe_load(
            (root / "main/runs" / arm / f"seed{CONFIRM_FIRST_SEED}/config.yaml").read_text()
        )
        assert (
            saved["lr"] == want and saved["task"] == "template_decoy" and saved["seed"] == CONFIRM_FIRST_SEED
        )
    # the speed threshold: the discovery block's mean sampled reward of steps 1..2, + the gain, for every block
    chosen = {a: disc.arms[a]["config"]["lr"] for a in ARMS}
    first = [
        r["reward/mean"] for a in ARMS for r in _rows(root / "probe/runs" / f"{a}@lr{chosen[a]:g}/seed0")
    ]
    thr = min(0.95, round(sum(first) / len(first) + THRESHOLD_GAIN, 2))
    for st in studies:
        assert f"Reward threshold {thr:.2f} (fixed from the discovery block" in st.setting
    big_lr = BIG_STEP_FACTOR * max(conf.arms[a]["config"]["lr"] for a in BIG_ARMS)

    assert list(big.arms) == list(BIG_ARMS) and {big.arms[a]["config"]["lr"] for a in BIG_ARMS} == {big_lr}
    for arm in BIG_ARMS:
        saved = yaml.safe_load(
            (root / "big/runs" / arm / f"seed{CONFIRM_FIRST_SEED}/config.yaml").read_text()
        )
        assert saved["lr"] == big_lr
    assert {p.baseline for p in big.predictions} == {"gspo_eq86"}
    assert len(conf.predictions) > len(big.predictions)
    # wall time: what the runs' logs say they took (every attempt), over the 2 parallel jobs
    for st, folder in ((conf, "main"), (big, "big")):
        logs = list((root / folder).glob("runs/*/seed*/sweep.log"))
        logged = [float(line.split("after ")[1].split(" s")[0]) for log in logs
                  for line in log.read_text().splitlines() if line.startswith("=== exit code")]  # fmt: skip
        assert len(logged) == len(st.arms) and st.seconds == pytest.approx(sum(logged) / 2, rel=1e-12)


def test_gains_are_measured_from_the_warm_start(study):
    root, studies, _ = study
    model = str(root / "model")
    seeds = [0, CONFIRM_FIRST_SEED]
    start = start_eval(
        model,
        seeds,
        {**yaml.safe_load((root / "main/runs/gspo" / f"seed{seeds[1]}/config.yaml").read_text())},
        [THIS_MODULE],
    )
    for st in studies:
        for arm, ms in st.per_seed.items():
            for seed, final in ms["final_avg_at_k"].items():
                s = start[int(seed)]["eval/avg@2"]
                assert ms["start_avg_at_k"][seed] == s and ms["avg_at_k_gain"][seed] == final - s, arm
                g = start[int(seed)]["eval/greedy_accuracy"]
                assert ms["greedy_gain"][seed] == ms["final_greedy_accuracy"][seed] - g
    # the eval curves start at step 0 from the warm start's eval, then the run's own evals
    for st in studies:
        for entry in st.curves["eval_greedy_accuracy"].values():
            assert entry["x"] == [0, 1, 2]  # SMALL evaluates every step; 2 steps
            for seed, ys in entry["seeds"].items():
                assert ys[0] == pytest.approx(start[int(seed)]["eval/greedy_accuracy"], rel=1e-3, abs=1e-9)
    # the start eval is the untrained model on the seed's own eval prompts: its form mass by a plain loop
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    net = AutoModelForCausalLM.from_pretrained(model).eval()
    for seed in seeds:
        mass = 0.0
        tasks = load_task("template_decoy", "eval", SMALL["num_eval"], seed=seed, digits=2, ops="+")
        for t in tasks:
            p = tok(format_prompt(tok, t.prompt), add_special_tokens=False)["input_ids"]
            for form in t.forms:
                c = tok(form, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                with torch.no_grad():
                    logits = net(torch.tensor([p + c])).logits[0].double()
                lp = sum(torch.log_softmax(logits[len(p) + j - 1], -1)[y].item() for j, y in enumerate(c))
                mass += math.exp(lp)
        assert start[seed]["eval/form_mass"] == pytest.approx(mass / len(tasks), rel=1e-5), seed


def test_second_call_runs_nothing(study):
    root, first, _ = study
    messages: list[str] = []
    again = run_power(
        root,
        sizes=SIZES,
        overrides=SMALL,
        imports=[THIS_MODULE],
        warm_start_steps=2,
        progress=messages.append,
    )
    runs = [m for m in messages if m.startswith("[")]
    assert runs and all("finished" in m for m in runs), runs
    assert [s.per_seed for s in again] == [s.per_seed for s in first]
