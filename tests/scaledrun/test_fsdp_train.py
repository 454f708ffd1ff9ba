"""FSDP2 that starts (issue 27): the trainer's generation, scoring, update and checkpoint functions on a
tiny PEFT Qwen3 ``fully_shard``-ed by accelerate's own ``fsdp2_prepare_model``, tied and untied, in two
gloo processes on CPU (``tests/scaledrun/fsdp_train_worker.py``), against the same model unsharded (DDP).

Before ``scaledrun.distributed.fsdp2_unsharded`` initialised the FSDP root, generation (which never runs
the root's forward) raised "FSDP requires a single root module" on the tied (embedding, LM head, norm)
unit, and an untied run failed in its first step; with resharding after forward left on, every generated
token all-gathered every layer again.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scaledrun.config import RunConfig

from ..conftest import THREADS
from ..exactness import FLOAT64_RTOL, max_abs_err, rounding_tolerance

REPO = Path(__file__).resolve().parents[2]
#: The worker's AdamW learning rate and torch's AdamW eps: the first step moves a weight by
#: lr·g/(|g| + eps), whose change with g is at most lr/eps.
LR, ADAM_EPS = 1e-2, 1e-8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def untied_model(tiny_model, tmp_path_factory):
    """The tiny Qwen3 with its own LM head: the embedding plus 0.01·N(0, 1) noise, saved untied."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out = tmp_path_factory.mktemp("tiny_untied") / "model"
    config = AutoConfig.from_pretrained(tiny_model)
    config.tie_word_embeddings = False
    model = AutoModelForCausalLM.from_pretrained(tiny_model, config=config)
    embedding = model.get_input_embeddings().weight
    with torch.no_grad():
        noise = torch.randn(embedding.shape, generator=torch.Generator().manual_seed(0))
        model.get_output_embeddings().weight.copy_(embedding + 0.01 * noise)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(out)
    GenerationConfig.from_pretrained(tiny_model).save_pretrained(out)
    return out


def _run_worker(tmp_path: Path, specs: list[str]) -> None:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
        str(REPO / "tests" / "scaledrun" / "fsdp_train_worker.py"), str(tmp_path), *specs,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def _check(tmp_path: Path, name: str, tied: bool, dtype: torch.dtype) -> None:
    """One model's results on both ranks (see the worker's docstring for the keys)."""
    for rank in (0, 1):
        r = torch.load(tmp_path / f"{name}_rank{rank}.pt", weights_only=True)
        assert r["tied"] is tied
        # generation through the backend: the unsharded model's greedy tokens, each unit gathered once
        assert r["greedy"].shape == r["greedy_ref"].shape and torch.equal(r["greedy"], r["greedy_ref"])
        # ≥ 2 forward passes (a row of ≥ 2 tokens): resharding after forward would re-gather every layer
        assert int((r["greedy"] != r["pad_id"]).sum(1).max()) >= 2, r["greedy"]
        assert 1 <= r["all_gathers"] <= r["units"], (r["all_gathers"], r["units"])
        assert r["units"] == (
            4 if tied else 5
        )  # 2 layers, the root, (embed+head+norm) or embed and (head+norm)
        # sampled completions and their old log-probs: the same full weights, the same passes
        assert torch.equal(r["completions"], r["completions_ref"])
        assert max_abs_err(r["old_logp"], r["old_logp_ref"]) == 0.0
        # the first optimizer step's LoRA gradients (reduce-scattered vs all-reduced across the 2 ranks)
        grads, ref = r["grads"], r["grads_ref"]
        assert grads.keys() == ref.keys() and len(ref) == 2 * 2 * len(
            RunConfig().lora_target_modules
        )  # A, B; 2 layers
        assert all(".lora_" in k and v.dtype == dtype for k, v in grads.items())
        gross = max(float(v.abs().max()) for v in ref.values())
        assert gross > 0 and all(float(v.abs().max()) > 0 for v in ref.values())  # A has a gradient too
        # float64: FLOAT64_RTOL; float32 adapters: two orders of a sum of 4 terms (2 ranks × 2 micro-batches,
        # reduced per micro-batch by FSDP, after the last by DDP)
        tol = FLOAT64_RTOL * gross if dtype == torch.float64 else 2 * rounding_tolerance(gross, 4, dtype)
        assert tol <= 1e-6
        for k in ref:
            assert max_abs_err(grads[k], ref[k]) <= tol, (k, max_abs_err(grads[k], ref[k]), tol)
        if rank == 0:  # the main process gathers the weights after that step
            assert r["weights"].keys() == ref.keys()
            for k in ref:
                assert max_abs_err(r["weights"][k], r["weights_ref"][k]) <= LR * tol / ADAM_EPS, k
        if "final_a" in r and rank == 0:  # resumed from step 2's checkpoint = uninterrupted, bit for bit
            a, b = r["final_a"], r["final_b"]
            assert a.keys() == b.keys() == ref.keys()
            for k in a:
                assert torch.equal(a[k], b[k]), k


@pytest.mark.exactness
def test_fsdp2_generation_update_and_resume_tied_and_untied_float64(tiny_model, untied_model, tmp_path):
    """float64, tied and untied: greedy tokens and old log-probs equal to the unsharded model's, at most
    one all-gather per FSDP unit for a whole generate call, LoRA gradients equal to FLOAT64_RTOL, and a
    resume from a checkpoint equal to the uninterrupted run."""
    _run_worker(tmp_path, [f"tied={tiny_model}:float64:resume", f"untied={untied_model}:float64:resume"])
    _check(tmp_path, "tied", True, torch.float64)
    _check(tmp_path, "untied", False, torch.float64)


@pytest.mark.exactness
def test_fsdp2_generation_and_update_bfloat16_base_float32_lora(tiny_model, untied_model, tmp_path):
    """A bfloat16 base with float32 LoRA (PEFT's adapter dtype), tied and untied: generation and one
    update, gradients at the rounding tolerance of a 2-rank mean in float32."""
    _run_worker(tmp_path, [f"tied={tiny_model}:bfloat16", f"untied={untied_model}:bfloat16"])
    _check(tmp_path, "tied", True, torch.float32)
    _check(tmp_path, "untied", False, torch.float32)


def _check_full_bf16(tmp_path: Path, name: str, tied: bool) -> None:
    """Full fine-tuning in bfloat16 (fp32 masters) under FSDP2 (see the worker's ``run_full``)."""
    for rank in (0, 1):
        r = torch.load(tmp_path / f"{name}_rank{rank}.pt", weights_only=True)
        assert r["tied"] is tied
        # generation holds the whole model in bfloat16: 2 B × every parameter, at every forward of the call
        assert len(r["gen_bytes"]) >= 2  # the prefill and at least one decoding step
        assert set(r["gen_params"]) == {r["ref_params"]}
        assert set(r["gen_bytes"]) == {2 * r["ref_params"]}
        assert set(r["gen_dtypes"]) == {("torch.bfloat16",)}
        assert r["master_dtypes"] == ["torch.float32"]  # the sharded masters the optimizer steps
        assert torch.equal(r["greedy"], r["greedy_ref"])
        assert int((r["greedy"] != r["pad_id"]).sum(1).max()) >= 2, r["greedy"]
        # the first step's gradients: FSDP2 reduce-scatters each process's bf16 micro-batch gradients in
        # float32 and accumulates them in float32; the reference sums the same bf16 gradients (a plain
        # bf16 copy of the masters, same passes) in float32. Two orders of one float32 sum of the
        # terms = 2 processes × MICRO_BATCHES differ by at most terms × eps(float32) × Σ|terms|
        # (rounding_tolerance, element by element; the halving is exact). A bf16 rounding anywhere in
        # between (a gradient summed in bf16, weights gathered at another dtype) is 2^-8 relative: far over it.
        grads, ref, gross = r["grads"], r["grads_ref"], r["grads_gross"]
        assert grads.keys() == ref.keys() and len(ref) > 0
        assert all(v.dtype == torch.float32 for v in grads.values())
        assert all(float(v.abs().max()) > 0 for v in ref.values())
        terms = 2 * MICRO_BATCHES
        for k in ref:
            tol = gross[k] * terms * torch.finfo(torch.float32).eps
            assert bool(((grads[k] - ref[k]).abs() <= tol).all()), (k, max_abs_err(grads[k], ref[k]))


#: micro-batches in the worker's first optimizer step: 2 prompts × 2 completions per process, 2 a micro-batch.
MICRO_BATCHES = 2


@pytest.mark.exactness
def test_fsdp2_full_finetune_bfloat16_generates_from_bf16_weights(tiny_model, untied_model, tmp_path):
    """Full fine-tuning in bfloat16 keeps float32 masters; under FSDP2 the trainer's
    ``fsdp2_bf16_params`` makes every unshard gather bfloat16 copies: during a generate call the model
    holds 2 B per parameter (not 4), and the first update's gradients equal an unsharded bf16 copy's,
    summed in float32. Tied and untied."""
    _run_worker(tmp_path, [f"tied={tiny_model}:bfloat16:full", f"untied={untied_model}:bfloat16:full"])
    _check_full_bf16(tmp_path, "tied", True)
    _check_full_bf16(tmp_path, "untied", False)


def _fsdp2_setup(policy=None):
    """What ``before_prepare`` reads of an FSDP2 accelerator: its flag and its real plugin."""
    from types import SimpleNamespace

    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, mixed_precision_policy=policy)
    return SimpleNamespace(is_fsdp2=True, state=SimpleNamespace(fsdp_plugin=plugin)), plugin


def test_before_prepare_sets_bf16_unshard_for_master_fp32_runs_only(tiny_model, tmp_path):
    """The trainer's ``before_prepare``: full fine-tuning in bfloat16 gets FSDP2's bf16-param / fp32-reduce
    policy; LoRA and float32 full fine-tuning keep the launch's (none); another policy is refused."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from scaledrun.distributed import LaunchError, before_prepare

    def cfg(**kw):
        return RunConfig(model=str(tiny_model), output_dir=str(tmp_path), **kw)

    acc, plugin = _fsdp2_setup()
    before_prepare(acc, cfg(full_finetune=True, dtype="bfloat16"))
    assert plugin.mixed_precision_policy == MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float32
    )
    for kw in ({"dtype": "bfloat16"}, {"full_finetune": True, "dtype": "float32"}):
        acc, plugin = _fsdp2_setup()
        before_prepare(acc, cfg(**kw))
        assert plugin.mixed_precision_policy is None, kw
    acc, _ = _fsdp2_setup(MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16))
    with pytest.raises(LaunchError, match="mixed_precision: 'no'"):
        before_prepare(acc, cfg(full_finetune=True, dtype="bfloat16"))
