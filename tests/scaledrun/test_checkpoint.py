"""Checkpoints: a killed-and-resumed run equals an uninterrupted one; what a checkpoint holds."""
# ruff: noqa: NPY002  (the test checks the legacy global numpy RNG the checkpoint saves)

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import scaledrun.train as tr
from scaledrun.checkpoint import checkpoint_dir, latest_checkpoint, rng_state, set_rng_state
from scaledrun.runlog import read_metrics

from ..conftest import THREADS
from .test_train import make_cfg

REPO = Path(__file__).resolve().parents[2]
#: Bytes a checkpoint may hold besides its tensors' data: RNG states (~16 KB a rank), the scheduler,
#: buffer, JSON and PEFT's README, pickle and safetensors headers. Far below the tiny base model's bytes
#: (checked), so a checkpoint that leaked base weights would exceed it.
OVERHEAD_BYTES = 64 * 1024
#: The default LoRA targets of ``RunConfig`` (every linear layer of a Qwen block).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _linear_shapes(model_dir) -> dict[str, tuple[int, int]]:
    """(in, out) features of a Qwen3 block's linear layers, from the model's config.json."""
    c = json.loads((model_dir / "config.json").read_text())
    h, q, kv = (
        c["hidden_size"],
        c["num_attention_heads"] * c["head_dim"],
        c["num_key_value_heads"] * c["head_dim"],
    )
    i = c["intermediate_size"]
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}  # fmt: skip


def _lora_params(model_dir, rank: int, targets) -> int:
    """LoRA's parameter count in closed form: r·(in + out) per wrapped linear layer (A is r×in, B out×r)."""
    c = json.loads((model_dir / "config.json").read_text())
    shapes = _linear_shapes(model_dir)
    return c["num_hidden_layers"] * sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets)


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _optimizer_tensors(opt: dict) -> list[torch.Tensor]:
    """AdamW's moments (the per-parameter ``step`` counters are scalars, counted apart)."""
    return [v for s in opt["state"].values() for k, v in s.items() if k in ("exp_avg", "exp_avg_sq")]


def _folder_bytes(d) -> int:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file())


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


def test_a_lora_checkpoint_holds_the_adapter_and_its_optimizer_state_only(tiny_model, tmp_path):
    """No base weight is written: every tensor is a LoRA A or B, as many parameters as r·(in + out) over
    the wrapped layers (from the model's config), AdamW's two moments of the same size, and the folder's
    bytes are those tensors' plus a small overhead, below the base model's own bytes."""
    out = tmp_path / "run"
    tr.train(make_cfg(tiny_model, out, steps=1, save_every=1))
    d = checkpoint_dir(out, 1)
    assert not (d / "model.safetensors").exists()
    n = _lora_params(tiny_model, 8, LORA_TARGETS)
    adapter = load_file(str(d / "adapter_model.safetensors"))
    assert all(".lora_A." in k or ".lora_B." in k for k in adapter), sorted(adapter)[:5]
    assert sum(v.numel() for v in adapter.values()) == n
    assert _tensor_bytes(adapter.values()) == 4 * n  # float32
    opt = torch.load(d / "optimizer.pt", weights_only=True)
    assert len(opt["state"]) == len(adapter)  # one entry per A and B, none for the base
    moments = _optimizer_tensors(opt)
    assert sum(v.numel() for v in moments) == 2 * n and _tensor_bytes(moments) == 8 * n
    base_bytes = _tensor_bytes(load_file(str(tiny_model / "model.safetensors")).values())
    assert OVERHEAD_BYTES < base_bytes
    assert 12 * n <= _folder_bytes(d) <= 12 * n + OVERHEAD_BYTES


def test_a_full_fine_tuning_checkpoint_holds_every_weight(tiny_model, tmp_path):
    out = tmp_path / "run"
    tr.train(make_cfg(tiny_model, out, steps=1, save_every=1, full_finetune=True))
    d = checkpoint_dir(out, 1)
    assert not (d / "adapter_model.safetensors").exists()
    base = load_file(str(tiny_model / "model.safetensors"))
    saved = load_file(str(d / "model.safetensors"))
    assert saved.keys() == base.keys()
    assert all(saved[k].shape == base[k].shape for k in base)
    assert any(not torch.equal(saved[k], base[k]) for k in base)  # trained
    n = sum(v.numel() for v in base.values())
    assert (
        sum(v.numel() for v in _optimizer_tensors(torch.load(d / "optimizer.pt", weights_only=True))) == 2 * n
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: "full" (full fine-tuning, every weight sharded and trainable) is left out of the suite: its 2-process run
#: aborts in native code in about 1 run in 8 on this machine (rank 1: "terminate called without an active
#: exception", then SIGSEGV, after the resume's model load; the LoRA case never did in 20 runs). Run it
#: by hand with FSDP_FULL_CHECKPOINT=1 while that is open.
MODES = ["lora", "full"] if os.environ.get("FSDP_FULL_CHECKPOINT") == "1" else ["lora"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_fsdp2_checkpoint_saves_trainable_weights_and_optimizer_shards_and_resumes_exactly(
    tiny_model, tmp_path, mode
):
    """Two gloo processes on CPU, the tiny Qwen3 (tied embeddings) ``fully_shard``-ed per layer and at
    the root (``tests/scaledrun/fsdp_checkpoint_worker.py``): a resume from the step-2 checkpoint ends
    with the same weights and AdamW moments as the uninterrupted 4-step run (float64, bit for bit).
    LoRA: the checkpoint holds the adapter (r·(in + out) per wrapped layer, float64) and each rank's
    shard of the two moments, no base weight; full fine-tuning: every weight of the model."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
        str(REPO / "tests" / "scaledrun" / "fsdp_checkpoint_worker.py"), str(tiny_model), str(tmp_path), mode,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    a = torch.load(tmp_path / "final_a.pt", weights_only=True)
    b = torch.load(tmp_path / "final_b.pt", weights_only=True)
    assert a["weights"].keys() == b["weights"].keys() and len(a["weights"]) > 0
    for k in a["weights"]:
        assert torch.equal(a["weights"][k], b["weights"][k]), k
    assert a["optimizer"].keys() == b["optimizer"].keys() == a["weights"].keys()
    for k, s in a["optimizer"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(s[name], b["optimizer"][k][name]), (k, name)
    d = checkpoint_dir(tmp_path / "run", 2)
    shards = [torch.load(d / f"optimizer_{r}.pt", weights_only=True) for r in (0, 1)]
    moments = sum(sum(v.numel() for v in _optimizer_tensors(o)) for o in shards)
    base = load_file(str(tiny_model / "model.safetensors"))
    assert not (d / "optimizer.pt").exists() and not (d / "sharded_state").exists()
    if mode == "lora":
        from .fsdp_checkpoint_worker import LORA

        assert not (d / "model.safetensors").exists()
        n = _lora_params(tiny_model, LORA["r"], LORA["target_modules"])
        adapter = load_file(str(d / "adapter_model.safetensors"))
        assert all(".lora_A." in k or ".lora_B." in k for k in adapter), sorted(adapter)[:5]
        assert sum(v.numel() for v in adapter.values()) == n and _tensor_bytes(adapter.values()) == 8 * n
        assert sum(v.numel() for v in a["weights"].values()) == n  # the tied LM head is not gathered
    else:
        saved = load_file(str(d / "model.safetensors"))
        assert saved.keys() == base.keys()
        n = sum(v.numel() for v in base.values())
    assert moments == 2 * n  # the two ranks' shards of both moments, nothing more
