"""The default run learns: the tiny model with the default warm start, trained by the default config.

This is the README's run (``python -m scaledrun.tiny --out artifacts/tiny-qwen3`` then ``python -m
scaledrun.train --config scaledrun/configs/default.yaml``), with the suite's seed (``CANCELLATION_TEST_SEED``)
and a temporary output folder. It is ``slow`` (a few minutes on 2 CPU cores); CI runs it. The margin is the one measured over
several seeds (see ``MARGIN``).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from scaledrun.config import load_config
from scaledrun.runlog import read_metrics
from scaledrun.tiny import DEFAULT_STOP_ACCURACY, DEFAULT_WARM_START_STEPS, build_tiny
from scaledrun.train import train

from ..conftest import SEED

#: trains or samples the tiny model (``tests/machines.py`` reruns it as other machines would)
pytestmark = pytest.mark.sampling

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = ROOT / "scaledrun/configs/default.yaml"
#: The mean sampled reward of the last quarter of the steps exceeds the first quarter's by at least this.
#: Measured with this config (200 steps, 32 completions per step) on the default model (warm start stopped
#: at greedy accuracy 0.5), training seeds 0-2 × three instruction sets (``tools/machines.py``:
#: native AVX-512, AVX2, no SIMD; one thread): gains 0.110 / 0.121 / 0.107 (native), 0.095 / 0.114 /
#: 0.112 (AVX2), 0.106 / 0.089 / 0.113 (no SIMD), smallest 0.089; with lr 1e-7 (no learning) the gain is
#: -0.009 to 0.018 on the three. The margin is about half the smallest gain and well above no learning.
MARGIN = 0.05


@pytest.mark.slow
def test_default_config_learns_on_the_tiny_model(tmp_path):
    model = build_tiny(
        tmp_path / "model", "arithmetic", seed=SEED, warm_start_steps=DEFAULT_WARM_START_STEPS,
        stop_accuracy=DEFAULT_STOP_ACCURACY,
    )  # fmt: skip
    cfg = load_config(
        str(DEFAULT_CONFIG),
        [
            "--model",
            str(model),
            "--output_dir",
            str(tmp_path / "run"),
            "--seed",
            str(SEED),
            "--save_every",
            "0",
        ],
    )
    result = train(cfg)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, cfg.steps + 1))
    # the rows returned and the rows logged are the same run
    assert [r["reward/mean"] for r in rows] == pytest.approx([r["reward/mean"] for r in result.rows])
    reward = [r["reward/mean"] for r in rows]
    q = len(reward) // 4
    first, last = statistics.fmean(reward[:q]), statistics.fmean(reward[-q:])
    assert last > first + MARGIN, f"reward did not rise: first quarter {first:.3f}, last quarter {last:.3f}"
