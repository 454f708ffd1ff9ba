"""DeepSpeed ZeRO-3 (and ZeRO-2) run the trainer (issue 27, item 2): two gloo processes on CPU under
``scaledrun/accelerate/zero3.yaml`` (``zero2.yaml``) against the same run under DDP.

Accelerate sets DeepSpeed up only on GPUs, so the launch goes through ``tests/scaledrun/zero3_cpu_launch.py``,
which changes Accelerate's backend choice to gloo and the trainer's GPU check, then runs the trainer's own
``main``: ``accelerator.prepare`` builds a real ZeRO-3 engine (parameters partitioned, ``zero3_init_flag``),
and the rollouts, scoring passes, update, checkpoints and resume are the trainer's code. DeepSpeed trains in
float32 (its engine casts a float64 model to float32), so the comparisons with DDP are float32 ones; both runs
sum the same micro-batches, ZeRO-3 reduce-scattering and DDP all-reducing them.

What is asserted:

- generation inside ``distributed.zero3_gathered`` issues no all-gather at all (the parameters are gathered
  once before the call and ZeRO-3's hooks are off: with the hooks left on and no gathering, the same call
  issued 212 all-gathers here), and samples exactly DDP's completions from the same weights;
- the old log-probs of step 1 equal DDP's to float32 rounding of the logsumexp over the vocabulary;
- the LoRA weights after the first optimizer step equal DDP's: Adam's first step moves every weight by
  about lr·sign(g), so a ZeRO-3 gradient that missed a micro-batch or a rank would move weights by O(lr);
  the tolerance, lr·1e-3, is crossed by a rounding-level difference only for a weight whose gradient is
  within ~1e3 × Adam's eps (1e-8) of zero (measured here: the two runs' step-1 weights are bit-identical);
- ZeRO-2's first step gives the same weights too;
- a checkpoint holds the adapter and each rank's ZeRO shard of its optimizer state (no full weights), and a
  run resumed from step 1's checkpoint ends bit-identical to the uninterrupted run.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ..conftest import THREADS
from ..exactness import max_abs_err, rounding_tolerance
from .conftest import LENGTH_REWARD

pytest.importorskip("deepspeed", reason="DeepSpeed is in the `dev` extra: `make setup` installs it")

REPO = Path(__file__).resolve().parents[2]
LR = 1e-2
ARGS = [
    "--steps", "2", "--prompts_per_step", "2", "--group_size", "4", "--max_new_tokens", "8",
    "--eval_every", "0", "--num_eval", "0", "--save_every", "1", "--micro_batch_size", "2",
    "--warmup_ratio", "0", "--lr", str(LR), "--import", "tests.scaledrun.conftest", "--reward", LENGTH_REWARD,
]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(launch: list[str], *args: str, env: dict[str, str] | None = None) -> str:
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", *launch, "--num_processes", "2",
        "--main_process_port", str(_free_port()), *args,
    ]  # fmt: skip
    full_env = {
        **os.environ,
        "OMP_NUM_THREADS": str(THREADS),
        "PYTHONPATH": str(REPO),
        "DS_ACCELERATOR": "cpu",
    }
    proc = subprocess.run(
        cmd, cwd=REPO, env={**full_env, **(env or {})}, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stdout


def _zero3(model: Path, out: Path, *extra: str, env: dict[str, str] | None = None, stage: int = 3) -> str:
    launcher = ["--config_file", f"scaledrun/accelerate/zero{stage}.yaml"]
    script = str(REPO / "tests" / "scaledrun" / "zero3_cpu_launch.py")
    return _launch(launcher, script, "--model", str(model), *ARGS, "--output_dir", str(out), *extra, env=env)


def _adapter(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / f"step_{step:06d}" / "adapter_model.safetensors")


@pytest.mark.slow
@pytest.mark.exactness
def test_zero3_and_zero2_train_like_ddp_zero3_generates_without_gathers_and_resumes(tiny_model, tmp_path):
    z3, ddp, counts = tmp_path / "zero3", tmp_path / "ddp", tmp_path / "counts"
    counts.mkdir()
    _zero3(tiny_model, z3, "--debug_dir", str(tmp_path / "dz3"), env={"ZERO3_COUNT_DIR": str(counts)})
    ddp_launch = ["--multi_gpu", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    _launch(
        ddp_launch, "-m", "scaledrun.train", "--model", str(tiny_model), *ARGS, "--output_dir", str(ddp),
        "--debug_dir", str(tmp_path / "dddp"),
    )  # fmt: skip

    # generation: no all-gather inside any generate call (2 steps: at least 2 calls per rank)
    for rank in (0, 1):
        calls = json.loads((counts / f"rank{rank}.json").read_text())
        assert len(calls) >= 2 and calls == [0] * len(calls), calls

    # step 1, both ranks: DDP's completions exactly, and its old log-probs to float32 rounding
    vocab = len(json.loads((Path(tiny_model) / "tokenizer.json").read_text())["model"]["vocab"])
    for rank in (0, 1):
        a = torch.load(tmp_path / "dz3" / f"rank{rank}" / "step_000001_rollouts.pt", weights_only=False)
        b = torch.load(tmp_path / "dddp" / f"rank{rank}" / "step_000001_rollouts.pt", weights_only=False)
        assert torch.equal(a.completion_ids, b.completion_ids)
        assert a.old_logp.dtype == torch.float32  # DeepSpeed's engine trains in float32
        gross = float(b.old_logp.abs().max())
        assert max_abs_err(a.old_logp, b.old_logp) <= rounding_tolerance(gross, vocab)

    # the first optimizer step: DDP's LoRA weights; the step moved them (B starts at 0)
    w_z3, w_ddp = _adapter(z3, 1), _adapter(ddp, 1)
    assert w_z3.keys() == w_ddp.keys() and all(".lora_" in k for k in w_ddp)
    assert max(float(w_ddp[k].abs().max()) for k in w_ddp if "lora_B" in k) > 0.5 * LR
    for k in w_ddp:
        assert max_abs_err(w_z3[k], w_ddp[k]) <= 1e-3 * LR, (k, max_abs_err(w_z3[k], w_ddp[k]))

    # ZeRO-2 (optimizer state and gradients sharded, parameters whole): the same first step
    _zero3(tiny_model, tmp_path / "zero2", "--steps", "1", stage=2)
    w_z2 = _adapter(tmp_path / "zero2", 1)
    assert w_z2.keys() == w_ddp.keys()
    for k in w_ddp:
        assert max_abs_err(w_z2[k], w_ddp[k]) <= 1e-3 * LR, (k, max_abs_err(w_z2[k], w_ddp[k]))

    # the checkpoint: the adapter, and each rank's ZeRO optimizer shard; no full weights anywhere
    ckpt = z3 / "checkpoints" / "step_000001"
    lora = sum(v.numel() for v in w_z3.values())
    base = sum(v.numel() for v in load_file(Path(tiny_model) / "model.safetensors").values())
    assert lora < base / 4
    for path in ckpt.rglob("*"):
        if path.is_file() and path.suffix in (".pt", ".safetensors", ".bin"):
            assert path.stat().st_size < 4 * base, path  # the base in float32 would be 4 × base bytes
    shards = sorted(p.name for p in ckpt.rglob("*optim_states.pt"))
    assert len(shards) == 2, shards

    # resume: step 1's checkpoint, then step 2 = the uninterrupted run's step 2, bit for bit
    resumed = tmp_path / "resumed"
    shutil.copytree(z3, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000002")
    out = _zero3(tiny_model, resumed, "--resume")
    assert "resumed from" in out and "step 1" in out
    a, b = _adapter(z3, 2), _adapter(resumed, 2)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_deepspeed_config_without_gpu_is_refused_not_run_as_ddp(tiny_model, tmp_path):
    """A plain ``accelerate launch --config_file zero3.yaml`` on a machine without GPUs: Accelerate would set
    the processes up as DDP; the trainer refuses, naming the launch to use instead, before any run folder."""
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", "scaledrun/accelerate/zero3.yaml",
        "--num_processes", "2", "--main_process_port", str(_free_port()), "-m", "scaledrun.train",
        "--model", str(tiny_model), "--steps", "1", "--output_dir", str(tmp_path / "run"),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "PYTHONPATH": str(REPO), "DS_ACCELERATOR": "cpu"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "error: the accelerate config asks for DeepSpeed" in proc.stderr, proc.stderr[-3000:]
    # the trainer's own message, not a traceback of it (the launcher prints its own for the failed child)
    assert "scaledrun/accelerate/ddp.yaml" in proc.stderr and "LaunchError" not in proc.stderr
    assert not (tmp_path / "run").exists()
