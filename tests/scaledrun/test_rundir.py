"""Run folders: the lock (with real processes), the start rule, the resume check, cut-off metrics lines."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings
from dataclasses import asdict

import pytest

from scaledrun.config import RunConfig
from scaledrun.rundir import (
    LOCK_FILE,
    RunFolderError,
    RunLock,
    check_resume_config,
    check_start,
    config_differences,
)
from scaledrun.runlog import RunLogger, read_metrics

HOLD = """
import sys, time
from scaledrun.rundir import RunLock
lock = RunLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_a_live_holder_is_named_and_a_dead_one_is_taken_over(tmp_path, capsys):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderError, match=rf"in use by pid {holder.pid} on {socket.gethostname()}"):
            RunLock(tmp_path).acquire()
    finally:
        holder.kill()  # kill -9: the lock file stays behind, its pid is gone
        holder.wait()
    assert (tmp_path / LOCK_FILE).is_file()
    dead = json.loads((tmp_path / LOCK_FILE).read_text())
    pid, started = dead["pid"], dead["started"]
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no Python warning (with its source line) any more
        lock = RunLock(tmp_path).acquire()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"warning: taking over the stale lock {tmp_path / LOCK_FILE}: pid {pid} (started {started}) no longer runs"
    ]
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_lock_from_another_host_is_never_taken_over(tmp_path):
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": "then"}))
    with pytest.raises(RunFolderError, match=r"pid 1 on elsewhere.*delete"):
        RunLock(tmp_path).acquire()


def test_start_refuses_an_existing_run_unless_resuming_or_overwriting(tmp_path):
    check_start(tmp_path, resume=False, overwrite=False)  # empty: fine
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "checkpoints" / "step_000001").mkdir(parents=True)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(
        RunFolderError, match=r"already holds a run \(metrics.jsonl, checkpoints\).*--resume true"
    ):
        check_start(tmp_path, resume=False, overwrite=False)
    check_start(tmp_path, resume=True, overwrite=False)
    assert (tmp_path / "metrics.jsonl").is_file()
    check_start(tmp_path, resume=False, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # only the run's own files go


def test_resume_refuses_a_checkpoint_of_another_experiment(tmp_path):
    saved = asdict(RunConfig(lr=1e-4, objective="grpo"))
    same_math = RunConfig(lr=1e-4, objective="grpo", steps=500, eval_every=7, save_every=3)
    check_resume_config(saved, same_math, tmp_path)
    other = RunConfig(lr=3e-4, objective="dfpo")
    assert config_differences(saved, asdict(other)) == ["lr: 0.0001 -> 0.0003", "objective: 'grpo' -> 'dfpo'"]
    with pytest.raises(RunFolderError, match=r"different config \(lr: 0.0001 -> 0.0003; objective"):
        check_resume_config(saved, other, tmp_path)


def test_resuming_with_other_steps_says_the_schedule_changes_length(tmp_path):
    """The note is true: after loading the scheduler's state, the lr follows the new length's schedule
    (DFPO App. I's warm-up + cosine decay to min_lr_ratio·lr, written out here), not the old one's."""
    import math

    import torch

    from scaledrun.model import build_optimizer

    saved = asdict(RunConfig(steps=10))
    assert check_resume_config(saved, RunConfig(steps=10), tmp_path) == ""
    note = check_resume_config(saved, RunConfig(steps=40), tmp_path)
    assert "steps 10 -> 40" in note and "not the run a fresh 40-step run would be" in note

    def closed_form(cfg, step):
        warm = math.ceil(cfg.warmup_ratio * cfg.steps)
        if step < warm:
            return cfg.lr * step / warm
        progress = (step - warm) / (cfg.steps - warm)
        return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))

    model = torch.nn.Linear(2, 1)
    short, long = RunConfig(steps=10, lr=1e-3), RunConfig(steps=40, lr=1e-3)
    opt, sched = build_optimizer(short, model)
    for _ in range(6):
        opt.step()
        sched.step()
    assert sched.get_last_lr()[0] == pytest.approx(closed_form(short, 6), rel=1e-12)
    opt2, sched2 = build_optimizer(long, model)
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(sched.state_dict())
    opt2.step()
    sched2.step()
    got = sched2.get_last_lr()[0]
    assert got == pytest.approx(closed_form(long, 7), rel=1e-12)
    assert abs(got - closed_form(short, 7)) > 1e-5  # the old schedule would differ


def test_a_cut_off_last_metrics_line_is_dropped_with_a_warning(tmp_path):
    rows = [{"step": s, "loss": 0.5 * s} for s in (1, 2, 3)]
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "lo'
    (tmp_path / "metrics.jsonl").write_text(text)
    with pytest.warns(UserWarning, match="cut-off last line"):
        assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        RunLogger(tmp_path, 10, resume_step=2, tensorboard=False).close()
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        1,
        2,
    ]
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"st\n{"step": 3}\n')
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        read_metrics(tmp_path)


def test_release_is_idempotent_and_the_context_manager_releases(tmp_path):
    with RunLock(tmp_path) as lock:
        assert lock.held and (tmp_path / LOCK_FILE).is_file()
    assert not (tmp_path / LOCK_FILE).exists()
    lock.release()  # a second release is a no-op
    assert not (tmp_path / LOCK_FILE).exists()
