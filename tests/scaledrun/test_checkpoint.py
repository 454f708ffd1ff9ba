"""Checkpoints: a killed-and-resumed run equals an uninterrupted one; what a checkpoint holds."""
# ruff: noqa: NPY002  (the test checks the legacy global numpy RNG the checkpoint saves)

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import scaledrun.train as tr
from scaledrun.checkpoint import checkpoint_dir, latest_checkpoint, rng_state, set_rng_state
from scaledrun.runlog import read_metrics

from .test_train import make_cfg


def _comparable(row):
    return {k: v for k, v in row.items() if not k.startswith("time/")}


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if not (a[k] == b[k] or (a[k] != a[k] and b[k] != b[k])):  # equal, or both NaN
            raise AssertionError(f"{k}: {a[k]} != {b[k]}")


@pytest.mark.parametrize("rho", [None, 0.4], ids=["plain", "reward_balanced"])
def test_resume_equals_uninterrupted(tiny_model, tmp_path, rho):
    """With ``rho`` the reward-balanced buffer holds groups at the step-4 checkpoint: resume restores them."""
    kw = dict(steps=8, save_every=4, num_minibatches=2, lr=5e-3, warmup_ratio=0.25, reward_balanced_rho=rho)
    full = tmp_path / "full"
    tr.train(make_cfg(tiny_model, full, **kw))
    # the "killed" run: the same run stopped right after its step-4 checkpoint (later files removed)
    killed = tmp_path / "killed"
    shutil.copytree(full, killed)
    shutil.rmtree(checkpoint_dir(killed, 8))
    lines = (killed / "metrics.jsonl").read_text().splitlines()
    (killed / "metrics.jsonl").write_text("\n".join(lines[:5]) + "\n")  # steps 1-4 and a torn step 5
    assert latest_checkpoint(killed) == checkpoint_dir(killed, 4)
    resumed = tr.train(make_cfg(tiny_model, killed, resume=True, **kw))
    assert len(resumed.rows) == 4  # steps 5..8 only
    rows_full, rows_res = read_metrics(full), read_metrics(killed)
    assert [r["step"] for r in rows_res] == list(range(1, 9))
    if rho is not None:  # the buffer matters: groups were waiting at the checkpoint, and some update ran
        assert rows_full[3]["buffer_groups"] > 0 and sum(r["updated"] for r in rows_full[4:]) >= 1
    for a, b in zip(rows_full, rows_res, strict=True):
        _same(_comparable(a), _comparable(b))
    wa = load_file(str(checkpoint_dir(full, 8) / "adapter_model.safetensors"))
    wb = load_file(str(checkpoint_dir(killed, 8) / "adapter_model.safetensors"))
    assert wa.keys() == wb.keys() and len(wa) > 0
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    # the adapter did train: some B is non-zero
    assert any(float(v.abs().max()) > 0 for k, v in wa.items() if "lora_B" in k)


def test_checkpoint_contents(tiny_model, tmp_path):
    out = tmp_path / "run"
    tr.train(make_cfg(tiny_model, out, steps=2, save_every=1, reward_balanced_rho=0.5))
    d = checkpoint_dir(out, 2)
    for name in (
        "adapter_model.safetensors",
        "optimizer.pt",
        "scheduler.pt",
        "rng_state_0.pt",
        "buffer_0.pt",
    ):
        assert (d / name).is_file(), name
    assert json.loads((d / "trainer_state.json").read_text())["step"] == 2
    opt = torch.load(d / "optimizer.pt", weights_only=False)
    assert opt["param_groups"][0]["lr"] > 0
    # an interrupted save (no trainer_state.json) is not a checkpoint
    (d / "trainer_state.json").unlink()
    assert latest_checkpoint(out) == checkpoint_dir(out, 1)


def test_rng_state_round_trip():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    state = rng_state()
    a = (random.random(), float(np.random.rand()), float(torch.rand(())))
    set_rng_state(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == a


def test_save_total_limit_keeps_the_newest_checkpoints(tiny_model, tmp_path):
    out = tmp_path / "run"
    tr.train(make_cfg(tiny_model, out, steps=4, save_every=1, save_total_limit=2))
    assert sorted(d.name for d in (out / "checkpoints").iterdir()) == ["step_000003", "step_000004"]
    assert latest_checkpoint(out) == checkpoint_dir(out, 4)


def test_a_checkpoint_or_replay_file_carrying_code_is_refused(tiny_model, tmp_path):
    """Files are loaded with ``weights_only=True``: a pickled callable (it could run code when loaded) is
    refused with an error naming the file, on resume and on replay; the trainer's own files load."""
    import os

    out = tmp_path / "run"
    tr.train(make_cfg(tiny_model, out, steps=2, save_every=1))
    tr.train(make_cfg(tiny_model, out, steps=3, save_every=1, resume=True))  # its own files: fine
    bad = checkpoint_dir(out, 3) / "rng_state_0.pt"
    state = torch.load(bad, weights_only=False)
    torch.save({**state, "hook": os.system}, bad)
    with pytest.raises(ValueError, match=r"rng_state_0\.pt: refused to load"):
        tr.train(make_cfg(tiny_model, out, steps=4, save_every=1, resume=True))
    replay = tmp_path / "replay"
    replay.mkdir()
    torch.save({"batch": print}, replay / "step_000001_rollouts.pt")
    with pytest.raises(ValueError, match=r"step_000001_rollouts\.pt: refused to load"):
        tr.train(make_cfg(tiny_model, tmp_path / "r2", steps=1), replay_dir=replay)
