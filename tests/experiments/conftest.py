"""Fixtures shared by the experiments' tests."""

from __future__ import annotations

import pytest

from scaledrun.tiny import build_tiny

from ..conftest import SEED


@pytest.fixture(scope="session")
def decoy_model(tmp_path_factory):
    """A tiny Qwen3 warm-started for 40 steps on ``template_decoy`` (the token-level instruments' task), built
    once for every test that needs one (``test_coupling_lm``, ``test_lm_credit``)."""
    return build_tiny(
        tmp_path_factory.mktemp("decoy") / "model",
        "template_decoy",
        seed=SEED,
        warm_start_steps=40,
        num_eval=4,
    )
