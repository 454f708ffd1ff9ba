"""Two CPU processes (``accelerate launch --multi_gpu``, gloo) against one process on the same data.

The two-process run dumps, per rank, each step's rollouts (after rewards and advantages), the
gradients of its first optimizer step (after DDP's all-reduce, before clipping) and the trainable
weights after the step (``train``'s ``debug_dir`` hook: ``<dir>/rank<k>/step_<s>_*.pt``). Then:

(a) both ranks hold identical adapters after every step, and the final checkpoint holds them too;
(b) one process replaying the union of the two ranks' rollouts (``replay_dir`` hook: the same
    completions, old log-probs and rewards; each rank's groups are whole, so the union is a set of whole
    groups) computes the same first gradient and the same weights after each step. Both runs are in
    float64 (``--dtype float64``) and agree to ``FLOAT64_RTOL`` (1e-9) relative: the two processes sum
    the gradient in another order than one process (each rank its own rows, then gloo's all-reduce),
    which in float32 differs by a CPU-dependent ~1e-7 (``tests/exactness.py``). This is what the global token count (loss × world size) buys: with per-process token means the
    two-process gradient would be the mean of the two ranks' token means, not the union's token mean;
    the test computes both from one-process runs on each rank's rows alone, checks the gradient equals
    the token-count-weighted one and, when the ranks' token counts differ, not the plain mean.

Every comparison of the two runs carries the ``exactness`` marker; ``test_ddp_config_file_launches``
(that the shipped config launches) stays in float32.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoTokenizer

import scaledrun.train as tr
from scaledrun.config import load_config
from scaledrun.rollout import concat_batches
from scaledrun.runlog import read_metrics

from ..conftest import THREADS
from ..exactness import FLOAT64_RTOL, close, rounding_tolerance
from .conftest import LENGTH_REWARD
from .test_train import replay_dir

REPO = Path(__file__).resolve().parents[2]
#: The two runs of each exactness test are in float64 (``--dtype float64``: ``tests/exactness.py``).
DTYPE = "float64"
#: How far apart the token-count-weighted gradient and the plain mean of the ranks' token means are at
#: least (the ranks' token counts differ by several tokens of 8-token rows: ~1e-2 apart), so that the
#: test tells the two apart whatever the rounding.
MEAN_GAP = 1e-3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ (float64)."""
    a, b = a.double().flatten(), b.double().flatten()
    return float((a - b).norm() / b.norm().clamp(min=1e-300))


def _flat(d: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([d[k].double().flatten() for k in sorted(d)])


def _load(path: Path):
    return torch.load(path, weights_only=False)


def _launch_two(cfg_file: Path, out: Path, dbg: Path, *extra: str) -> None:
    """``accelerate launch --multi_gpu --num_processes 2`` of the trainer on CPU (gloo), with debug dumps."""
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(_free_port()), "-m", "scaledrun.train",
        "--import", "tests.scaledrun.conftest",  # registers the test reward in the launched processes
        "--config", str(cfg_file), "--output_dir", str(out), "--debug_dir", str(dbg), *extra,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def _replay_union(tiny_model, dbg2: Path, replay: Path, steps: int) -> None:
    """Write, per step, the concatenation of the two ranks' dumped rollouts into ``replay``."""
    tok = AutoTokenizer.from_pretrained(tiny_model)
    replay.mkdir()
    for step in range(1, steps + 1):
        parts = [_load(dbg2 / f"rank{k}" / f"step_{step:06d}_rollouts.pt") for k in (0, 1)]
        torch.save(concat_batches(parts, tok.pad_token_id), replay / f"step_{step:06d}_rollouts.pt")


@pytest.mark.slow
@pytest.mark.exactness
def test_two_processes_match_one(tiny_model, tmp_path):
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(
        yaml.safe_dump(
            {
                "model": str(tiny_model),
                "steps": 2,
                "group_size": 4,
                "prompts_per_step": 2,
                "max_new_tokens": 8,
                "eval_every": 0,
                "save_every": 0,
                "warmup_ratio": 0.0,
                "num_train": 50,
                "num_eval": 0,
                "reward": LENGTH_REWARD,
                "lr": 1e-2,
                "objective": "grpo",
                "aggregation": "token-mean",
                "dtype": DTYPE,
            }
        )
    )
    out2, dbg2 = tmp_path / "run2", tmp_path / "debug2"
    _launch_two(cfg_file, out2, dbg2)

    r0, r1 = dbg2 / "rank0", dbg2 / "rank1"
    for step in (1, 2):
        b0, b1 = _load(r0 / f"step_{step:06d}_rollouts.pt"), _load(r1 / f"step_{step:06d}_rollouts.pt")
        # each process generated whole groups of its own prompts: no group id on both ranks
        assert not set(b0.group.tolist()) & set(b1.group.tolist())
        assert len(set(b0.group.tolist())) == 2 and len(b0) == 8
        # (a) identical adapters on both ranks after each step (DDP: same averaged gradient, same AdamW)
        w0 = _load(r0 / f"step_{step:06d}_trainable.pt")
        w1 = _load(r1 / f"step_{step:06d}_trainable.pt")
        assert w0.keys() == w1.keys() and w0
        for k in w0:
            assert torch.equal(w0[k], w1[k]), f"step {step}: {k} differs between ranks"
    # the final checkpoint (written by the main process) holds the ranks' adapter
    ckpt = load_file(str(out2 / "checkpoints" / "step_000002" / "adapter_model.safetensors"))
    w_final = _load(r0 / "step_000002_trainable.pt")
    assert len(ckpt) == len(w_final)
    for k, v in w_final.items():
        assert torch.equal(ckpt[k.replace(".default", "")], v)

    # (b) one process on the union of the two ranks' rollouts of each step
    replay = tmp_path / "replay"
    _replay_union(tiny_model, dbg2, replay, 2)
    dbg1 = tmp_path / "debug1"
    cfg1 = load_config(str(cfg_file), ["--output_dir", str(tmp_path / "run1")])
    tr.train(cfg1, debug_dir=dbg1, replay_dir=replay)
    s0 = dbg1 / "rank0"

    # the union batch is what the single process trained on (same rows as the two ranks together)
    union = _load(s0 / "step_000001_rollouts.pt")
    both = [_load(r / "step_000001_rollouts.pt") for r in (r0, r1)]
    assert union.group.tolist() == both[0].group.tolist() + both[1].group.tolist()

    g2, g1 = _load(r0 / "step_000001_grads.pt"), _load(s0 / "step_000001_grads.pt")
    assert g2.keys() == g1.keys()
    assert float(_flat(g1).abs().max()) > 0, "the first update has a zero gradient: nothing is compared"
    assert _flat(g1).dtype == torch.float64 and g1[next(iter(g1))].dtype == torch.float64
    assert _rel(_flat(g2), _flat(g1)) < FLOAT64_RTOL

    # an independent closed form: one process on each rank's rows alone gives that rank's token mean
    # ∇(S_p / N_p); the union's token mean is Σ_p N_p ∇(S_p / N_p) / Σ_p N_p
    local = []
    for k, part in enumerate(both):
        d = tmp_path / f"replay_rank{k}"
        d.mkdir()
        torch.save(part, d / "step_000001_rollouts.pt")
        cfg_k = load_config(str(cfg_file), ["--output_dir", str(tmp_path / f"run_r{k}"), "--steps", "1"])
        tr.train(cfg_k, debug_dir=tmp_path / f"debug_r{k}", replay_dir=d)
        local.append(_flat(_load(tmp_path / f"debug_r{k}" / "rank0" / "step_000001_grads.pt")))
    n = [float(b.completion_mask.sum()) for b in both]
    expected = (n[0] * local[0] + n[1] * local[1]) / (n[0] + n[1])
    # not at FLOAT64_RTOL: transformers' Qwen3 RMSNorm computes in float32 even in a float64 model, and
    # its backward rounds a loss scaled by 1/N_p (one rank's rows) otherwise than one scaled by 1/N (the
    # union; two processes scale by 2/N, a power of two, and match it exactly): the bound of float32
    # rounding over the Σ N_p tokens the gradient sums (measured ~1e-7 relative; the plain mean is ~7e-2)
    assert _rel(_flat(g2), expected) < rounding_tolerance(1.0, int(sum(n)), torch.float32)
    if n[0] != n[1]:
        # without the global count, DDP would average the two token means: visibly different
        assert _rel((local[0] + local[1]) / 2, expected) > MEAN_GAP

    for step in (1, 2):
        w2 = _load(r0 / f"step_{step:06d}_trainable.pt")
        w1 = _load(s0 / f"step_{step:06d}_trainable.pt")
        assert w2.keys() == w1.keys()
        assert _rel(_flat(w2), _flat(w1)) < FLOAT64_RTOL, f"step {step}: weights differ from one process"


def _budget_with_unequal_passes(chosen: Path) -> int:
    """A token budget under which the two ranks' chosen step-1 batches pack into different numbers of
    micro-batches, so that the trainer must even them out (``packing.balance_bins``)."""
    from scaledrun.packing import RowLengths, pack_rows

    batches = [_load(chosen / f"rank{k}" / "step_000001_rollouts.pt") for k in (0, 1)]
    lengths = [RowLengths.of(b) for b in batches]
    widest = max(int((x.prompt + x.completion).max()) for x in lengths)
    for budget in range(widest, 8 * widest):
        counts = [len(pack_rows(x, b.group, budget)) for x, b in zip(lengths, batches, strict=True)]
        if counts[0] != counts[1]:
            return budget
    raise AssertionError("no budget packs the two ranks' batches into different numbers of passes")


@pytest.mark.slow
@pytest.mark.exactness
@pytest.mark.parametrize("split", ["rows", "tokens"])
def test_two_processes_with_micro_batches_of_one_match_one_process_in_one_pass(tiny_model, tmp_path, split):
    """DFPO (positive QP) in two processes with micro-batches of 1 row, or packed by a token budget under
    which the ranks need different numbers of passes, = one process, whole mini-batches.

    Off-policy (2 inner epochs at GSPO's ε: clipped sequences in the second) and truncated
    completions (4 tokens; step 1 replays a chosen batch on each rank, with truncated rows on both,
    step 2 samples at T = 1.5), both in float64: the first gradient and the weights after every step
    agree to ``FLOAT64_RTOL``, the cancellation meter, summed over the processes, equals one process's
    to ``FLOAT64_RTOL`` of its gross sums (a residual is a net over its gross: compared at the scale 1),
    and DFPO's sequence_net_residual is ≤ 1e-6 (0 on-policy, ~1e-15 in float64; the second inner epoch's
    ratios leave ~1e-10). One
    mini-batch per inner epoch: a split into several would draw different mini-batches in one process
    than in two (several mini-batches are tested in one process, ``test_update.py``).
    """
    cfg = {
        "model": str(tiny_model), "steps": 2, "group_size": 4, "prompts_per_step": 2, "max_new_tokens": 4,
        "temperature": 1.5, "eval_every": 0, "save_every": 0, "warmup_ratio": 0.0, "num_train": 50,
        "num_eval": 0, "reward": LENGTH_REWARD, "lr": 2e-3, "objective": "dfpo", "transform": "orth_proj_pos",
        "inner_epochs": 2, "num_minibatches": 1, "truncation": "mask", "dtype": DTYPE,
    }  # fmt: skip
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg))
    out2, dbg2 = tmp_path / "run2", tmp_path / "debug2"
    chosen = load_config(str(cfg_file), ["--output_dir", str(tmp_path / "unused")])
    for rank, lengths in enumerate(([[2, None, 3, 4], [None, 1, 4, None]], [[3, 2, None, 4], [4, 4, 1, 2]])):
        replay_dir(
            tmp_path / "chosen", chosen, lengths, rank=rank, first=2 * rank
        )  # each rank its own groups
    if split == "rows":
        micro = ["--micro_batch_size", "1"]
    else:  # packed by tokens, a different number of passes on each rank
        micro = ["--max_tokens_per_micro_batch", str(_budget_with_unequal_passes(tmp_path / "chosen"))]
    _launch_two(cfg_file, out2, dbg2, *micro, "--replay_dir", str(tmp_path / "chosen"))
    rows2 = read_metrics(out2)
    assert [r["step"] for r in rows2] == [1, 2]
    for r in rows2:
        assert r["opt_steps"] == 2 and r["sequence_net_residual"] <= 1e-6, r
    assert rows2[0]["clip/frac"] > 0
    truncated = [_load(dbg2 / f"rank{k}" / "step_000001_rollouts.pt").truncated for k in (0, 1)]
    assert [int(t.sum()) for t in truncated] == [3, 1]

    replay = tmp_path / "replay"
    _replay_union(tiny_model, dbg2, replay, 2)
    dbg1 = tmp_path / "debug1"
    cfg1 = load_config(str(cfg_file), ["--output_dir", str(tmp_path / "run1"), "--micro_batch_size", "0"])
    tr.train(cfg1, debug_dir=dbg1, replay_dir=replay)
    g2, g1 = _load(dbg2 / "rank0" / "step_000001_grads.pt"), _load(dbg1 / "rank0" / "step_000001_grads.pt")
    assert g2.keys() == g1.keys() and float(_flat(g1).abs().max()) > 0
    assert g1[next(iter(g1))].dtype == torch.float64
    assert _rel(_flat(g2), _flat(g1)) < FLOAT64_RTOL
    for step in (1, 2):
        w2 = _load(dbg2 / "rank0" / f"step_{step:06d}_trainable.pt")
        w1 = _load(dbg1 / "rank0" / f"step_{step:06d}_trainable.pt")
        assert _rel(_flat(w2), _flat(w1)) < FLOAT64_RTOL, f"step {step}: weights differ from one process"
    rows1 = read_metrics(tmp_path / "run1")
    for a, b in zip(rows1, rows2, strict=True):
        for key in ("sequence_net_residual", "shared_residual", "group_shared_residual"):
            assert close(a[key], b[key], gross=1.0), (a["step"], key, a[key], b[key])


CONFIGS = {"ddp": "MULTI_GPU", "zero2": "DEEPSPEED", "zero3": "DEEPSPEED", "fsdp": "FSDP"}


def test_accelerate_config_files_parse():
    """Each shipped file loads with Accelerate's own config loader, with the intended distributed type."""
    from accelerate.commands.config.config_args import load_config_from_file

    for name, kind in CONFIGS.items():
        path = REPO / "scaledrun" / "accelerate" / f"{name}.yaml"
        cfg = load_config_from_file(str(path))
        assert str(cfg.distributed_type).endswith(kind), (name, cfg.distributed_type)
        assert cfg.num_machines == 1 and cfg.mixed_precision == "no"
        # the DeepSpeed/FSDP files say in their header that they are not run here
        assert name == "ddp" or "NOT RUN HERE" in path.read_text()
    assert (
        load_config_from_file(str(REPO / "scaledrun/accelerate/zero3.yaml")).deepspeed_config["zero_stage"]
        == 3
    )
    zero3 = load_config_from_file(str(REPO / "scaledrun/accelerate/zero3.yaml")).deepspeed_config
    assert zero3["zero3_init_flag"] is True  # a 7-8B model is built sharded, not whole on every rank
    # FSDP2: FSDP1 cannot flatten a bf16 base with PEFT's fp32 adapters
    assert (
        load_config_from_file(str(REPO / "scaledrun/accelerate/fsdp.yaml")).fsdp_config["fsdp_version"] == 2
    )


@pytest.mark.slow
def test_ddp_config_file_launches(tiny_model, tmp_path):
    """``accelerate launch --config_file scaledrun/accelerate/ddp.yaml`` runs two processes (gloo here)."""
    dbg = tmp_path / "debug"
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", "scaledrun/accelerate/ddp.yaml",
        "--num_processes", "2", "--main_process_port", str(_free_port()), "-m", "scaledrun.train",
        "--model", str(tiny_model), "--output_dir", str(tmp_path / "run"), "--steps", "1", "--group_size", "2",
        "--prompts_per_step", "1", "--max_new_tokens", "4", "--eval_every", "0", "--num_eval", "0",
        "--num_train", "8", "--debug_dir", str(dbg),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    w = [_load(dbg / f"rank{k}" / "step_000001_trainable.pt") for k in (0, 1)]
    assert w[0].keys() == w[1].keys() and all(torch.equal(w[0][k], w[1][k]) for k in w[0])
    groups = [set(_load(dbg / f"rank{k}" / "step_000001_rollouts.pt").group.tolist()) for k in (0, 1)]
    assert len(groups[0]) == len(groups[1]) == 1 and not groups[0] & groups[1]


def test_the_cli_closes_its_process_group(tmp_path):
    """``scaledrun.train.main`` ends by destroying the launch's process group (``close_process_group``):
    left to the interpreter's teardown, a gloo worker now and then aborted at exit after a finished run."""
    import torch.distributed as dist

    from scaledrun.train import close_process_group

    close_process_group()  # outside a launch: a no-op
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    assert dist.is_initialized()
    close_process_group()
    assert not dist.is_initialized()
