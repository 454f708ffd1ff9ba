"""Paths of the training loop beyond the happy one (issue 26 §4), each on chosen batches (``--replay_dir``)
or a reward that does not depend on what the model samples:

- the on-policy shortcut (the first optimizer step takes its coefficients from the old log-probs, no
  forward pass) is off for a replayed batch and for a reward-balanced one: their old log-probs need not
  be the current weights';
- the all-truncated warning is printed once per run, and not at a step where the reward-balanced buffer
  is still filling (no update batch is not an update batch with nothing in the loss).
"""

from __future__ import annotations

import math
import shutil

import pytest
import torch

import scaledrun.train as tr
from scaledrun.rewards import REWARDS, register_reward

from .test_train import make_cfg, replay_dir

#: A reward that gives 1 to the first row of every group of 4 and 0 to the others (the trainer scores
#: the whole step batch, groups in order): every group has both advantage signs, whatever was sampled.
FIRST_OF_GROUP = "test_first_of_group"

if FIRST_OF_GROUP not in REWARDS:

    @register_reward(FIRST_OF_GROUP)
    def _first_of_group(prompts, completions, answers):
        return [1.0 if i % 4 == 0 else 0.0 for i in range(len(completions))]


#: Completion lengths of the replayed batches (no truncated row).
LENGTHS = [[2, 5, 3, 7], [4, 1, 6, 3]]
#: ``micro_batch_size`` 3: a mini-batch of 8 rows is 3 passes, so an update that scores its coefficients
#: runs each row twice (no-grad passes, then the passes with the graph) and an on-policy one once.
MICRO = 3
#: The shift of a replayed batch's old log-probs: its ratios on the first optimizer step are e^SHIFT.
SHIFT = 0.1


@pytest.mark.exactness
def test_a_replayed_batch_is_scored_again(tiny_model, tmp_path):
    """A replayed batch whose old log-probs are the current weights' minus 0.1 (as if scored by other
    weights): the update scores it again, so every ratio is e^0.1, and each row runs twice."""
    cfg = make_cfg(tiny_model, tmp_path / "run", micro_batch_size=MICRO, grad_clip=None)
    replay = replay_dir(tmp_path / "replay", cfg, LENGTHS)
    path = replay / "step_000001_rollouts.pt"
    batch = torch.load(path, weights_only=False)
    batch.old_logp = batch.old_logp - SHIFT * batch.completion_mask
    torch.save(batch, path)
    row = tr.train(cfg, replay_dir=replay).rows[0]
    assert row["opt_steps"] == 1.0
    assert row["score/rows"] == 2 * 8  # replayed: no old pass; the update: 8 rows without, 8 with the graph
    # the current log-probs equal the unshifted old ones up to the float32 rounding of two passes over
    # other batch shapes (1e-3 of a log-prob leaves a wide margin; reused, every ratio would be 1)
    for key in ("ratio/min", "ratio/max"):
        assert math.isclose(row[key], math.exp(SHIFT), rel_tol=1e-3), (key, row[key])


@pytest.mark.parametrize("rho", [None, 0.2])
def test_a_reward_balanced_batch_is_scored_again(tiny_model, tmp_path, rho):
    """One sampled step (every group has both advantage signs: ``FIRST_OF_GROUP``). Without the buffer the
    update is on-policy: 8 rows for the old log-probs + 8 for the gradient. With it (ρ = 0.2: the step's
    2 groups, 2 of 8 rows positive, are selected at once) the update batch is the buffer's: 8 + 8 + 8."""
    cfg = make_cfg(
        tiny_model, tmp_path / "run", micro_batch_size=MICRO, reward=FIRST_OF_GROUP, truncation="keep",
        reward_balanced_rho=rho,
    )  # fmt: skip
    row = tr.train(cfg).rows[0]
    assert row["updated"] == 1.0 and row["opt_steps"] == 1.0
    assert row["score/rows"] == (2 if rho is None else 3) * 8


def _all_truncated(root, cfg, steps):
    """A replay folder whose steps 1..``steps`` are the same batch of truncated completions only."""
    replay = replay_dir(root, cfg, [[None] * 4, [None] * 4])
    for step in range(2, steps + 1):
        shutil.copy(replay / "step_000001_rollouts.pt", replay / f"step_{step:06d}_rollouts.pt")
    return replay


def test_the_all_truncated_warning_is_printed_once_per_run(tiny_model, tmp_path, capsys):
    cfg = make_cfg(tiny_model, tmp_path / "run", steps=3, max_new_tokens=4)
    rows = tr.train(cfg, replay_dir=_all_truncated(tmp_path / "replay", cfg, 3)).rows
    assert [r["truncation/no_update"] for r in rows] == [1.0, 1.0, 1.0]
    err = capsys.readouterr().err
    assert err.count("WARNING step") == 1 and "WARNING step 1:" in err


def test_no_truncation_warning_while_the_buffer_fills(tiny_model, tmp_path, capsys):
    """Replayed groups whose rewards are all equal (zero advantages): the reward-balanced buffer never
    has a selection, so no step has an update batch; no step is an all-truncated one either."""
    cfg = make_cfg(tiny_model, tmp_path / "run", steps=2, reward_balanced_rho=0.4)
    replay = replay_dir(tmp_path / "replay", cfg, LENGTHS)
    path = replay / "step_000001_rollouts.pt"
    batch = torch.load(path, weights_only=False)
    batch.rewards = torch.zeros_like(batch.rewards)
    torch.save(batch, path)
    batch.group = batch.group + 2  # step 2: two more groups (the same completions)
    torch.save(batch, replay / "step_000002_rollouts.pt")
    rows = tr.train(cfg, replay_dir=replay).rows
    assert [r["updated"] for r in rows] == [0.0, 0.0]
    assert [r["buffer_groups"] for r in rows] == [2.0, 4.0]
    assert [r["truncation/no_update"] for r in rows] == [0.0, 0.0]
    assert "WARNING step" not in capsys.readouterr().err
