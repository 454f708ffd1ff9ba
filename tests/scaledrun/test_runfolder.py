"""Run folders through the real trainer: nothing lost, nothing mixed, a safe first hour.

In-process runs of ``scaledrun.train.main`` on the tiny model, and real processes where the case is about
processes: a lock held by another live process, and ``kill -9`` of ``accelerate launch`` (its two workers
must stop, and the run resumes from its last checkpoint).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import yaml

import scaledrun.train as tr
from scaledrun.checkpoint import latest_checkpoint
from scaledrun.rundir import RunFolderError
from scaledrun.runlog import read_metrics

from ..conftest import THREADS
from .test_multiprocess import REPO, _free_port
from .test_train import make_cfg


def _argv(cfg) -> list[str]:
    out = []
    for k, v in vars(cfg).items():
        if v is None or isinstance(v, list):
            continue
        out += [f"--{k}", str(v).lower() if isinstance(v, bool) else str(v)]
    return out


def test_a_used_folder_is_refused_unless_resumed_or_overwritten(tiny_model, tmp_path, capsys):
    out = tmp_path / "run"
    cfg = make_cfg(tiny_model, out, steps=2, save_every=1)
    tr.main(_argv(cfg))
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"run {out}: 2 new steps up to step 2, reward ") and " s" in line
    # the same command again: refused, nothing touched
    before = (out / "metrics.jsonl").read_text()
    with pytest.raises(SystemExit) as e:
        tr.main(_argv(cfg))
    assert e.value.code == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (out / "metrics.jsonl").read_text() == before
    # --overwrite: a fresh run, the old checkpoints are gone
    tr.main([*_argv(make_cfg(tiny_model, out, steps=1, save_every=0)), "--overwrite", "true"])
    assert [r["step"] for r in read_metrics(out)] == [1]
    assert latest_checkpoint(out).name == "step_000001"
    assert not (out / "checkpoints" / "step_000002").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--generation_cache", "static", "--generation_batch_size", "4", "--compile_decode", "true"],
         "config field `compile_decode`=True: this process runs on cpu"),
        (["--attn_implementation", "flash_attention_2"], "config field `attn_implementation`='flash_attention_2'"),
    ],
)  # fmt: skip
def test_a_setting_this_device_cannot_run_is_refused_before_the_folder(
    tiny_model, tmp_path, capsys, extra, message
):
    """``compile_decode`` and flash attention on this CPU: ``error: ...``, exit 2, no run folder, no traceback
    (before, ``compile_decode`` raised from the backend after the model loaded and left the folder behind)."""
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        tr.main([*_argv(make_cfg(tiny_model, out, steps=1)), *extra])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err
    assert not out.exists()


def _quoted_reward(rows) -> str:
    """The run's last line's reward, by hand: the mean of the last 10 logged steps of the whole run."""
    tail = [r["reward/mean"] for r in rows][-10:]
    return f"reward {sum(tail) / len(tail):.3f} (mean of the last {len(tail)} step{'s' if len(tail) > 1 else ''})"


def test_resume_refuses_another_experiments_checkpoint_and_keeps_metrics_consistent(
    tiny_model, tmp_path, capsys
):
    out = tmp_path / "run"
    tr.train(make_cfg(tiny_model, out, steps=2, save_every=1))
    with pytest.raises(
        RunFolderError, match=rf"lr: 0.01 -> 0.02.*--config {out / 'config.yaml'} --resume true"
    ):
        tr.train(make_cfg(tiny_model, out, steps=3, save_every=1, lr=2e-2, resume=True))
    # an orphan row past the checkpoint and a cut-off line (a kill while writing): dropped on resume
    (out / "checkpoints" / "step_000002" / "trainer_state.json").unlink()  # step 2's save never finished
    with (out / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "los')
    with pytest.warns(UserWarning, match="cut-off last line"):
        res = tr.train(make_cfg(tiny_model, out, steps=3, save_every=1, resume=True))  # more steps: allowed
    assert len(res.rows) == 2  # steps 2 and 3 again from the step-1 checkpoint
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]
    # the last line quotes the run's reward (step 1, before the resume, included), as the Runs page does
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert f"2 new steps up to step 3, {_quoted_reward(read_metrics(out))}" in line, line


HOLD = """
import sys, time
from scaledrun.rundir import RunLock
RunLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(120)
"""


def test_a_second_run_on_a_busy_folder_names_the_holder(tiny_model, tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderError, match=rf"in use by pid {holder.pid}"):
            tr.train(make_cfg(tiny_model, out))
    finally:
        holder.kill()
        holder.wait()
    assert not (out / "metrics.jsonl").exists()


@pytest.mark.slow
def test_kill_9_of_the_launcher_stops_its_workers_and_the_run_resumes(tiny_model, tmp_path):
    out = tmp_path / "run"
    cfg = make_cfg(tiny_model, out, steps=400, save_every=2)
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(yaml.safe_dump({k: v for k, v in vars(cfg).items() if k != "output_dir"}))
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(_free_port()), "-m", "scaledrun.train",
        "--import", "tests.scaledrun.conftest", "--config", str(cfg_file), "--output_dir", str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "PYTHONPATH": str(REPO)}
    launcher = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while latest_checkpoint(out) is None:  # wait until the run has saved a checkpoint
            assert launcher.poll() is None, "the launch ended early"
            assert time.time() < deadline, "no checkpoint after 240 s"
            time.sleep(0.5)
        workers = [
            p
            for p in psutil.Process(launcher.pid).children(recursive=True)
            if "scaledrun.train" in " ".join(p.cmdline())
        ]
        assert len(workers) == 2
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        _gone, alive = psutil.wait_procs(workers, timeout=30)
        assert not alive, f"workers still running 30 s after the launcher died: {[p.pid for p in alive]}"
    finally:
        for p in psutil.Process().children(recursive=True):
            p.kill()
    # the lock is released (a worker whose peer died fails in a collective and unwinds) or left stale
    # (a worker that exits straight away): either way the resume below must take the folder
    step = json.loads((latest_checkpoint(out) / "trainer_state.json").read_text())["step"]
    # the same launch with --resume true (same number of processes) continues from the last checkpoint
    again = [*cmd, "--resume", "true", "--steps", str(step + 1)]
    again[again.index("--main_process_port") + 1] = str(_free_port())
    proc = subprocess.run(again, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"run {out}: 1 new step up to step {step + 1}, {_quoted_reward(read_metrics(out))}" in proc.stdout
    assert not (out / ".lock").exists()
    assert [r["step"] for r in read_metrics(out)] == list(range(1, step + 2))
