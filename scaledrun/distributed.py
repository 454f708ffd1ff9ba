"""The trainer's distributed plumbing: gradient synchronisation, full-parameter contexts, cross-process sums.

Everything here is a no-op in one process; under ``accelerate launch`` it is what DDP, DeepSpeed ZeRO and
FSDP need around the trainer's passes (``scaledrun.train``):

- ``gradient_sync``: a backward pass that reduces gradients across processes only on a mini-batch's last
  micro-batch (DDP's ``no_sync``; DeepSpeed's accumulation boundary);
- ``full_params``: the unwrapped model holding its whole parameters (generation, no-grad passes) under
  ZeRO-3 and FSDP;
- ``global_counts``: a mini-batch's token and sequence counts over all processes, the normalisers of
  its loss (``scaledrun.train``, "Loss normalisation across processes");
- ``sum_list``, ``max_list``, ``any_process``, ``sum_over_processes``, ``mean_over_processes``: element-wise
  reductions every process calls together;
- ``has_accelerator``, ``check_launch``, ``before_prepare`` (``deepspeed_micro_batch``,
  ``fsdp2_bf16_params``): the Accelerator's set-up.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@contextmanager
def gradient_sync(accelerator: Any, model: Any, sync: bool) -> Iterator[None]:
    """Inside: a backward pass that synchronises gradients across processes only when ``sync``.

    DDP: ``accelerator.no_sync`` when not syncing. DeepSpeed: ``Accelerator.backward`` tells the engine
    the accumulation boundary from ``accelerator.sync_gradients`` and runs ``engine.step()`` (its optimizer
    step) whenever it is on, so it is off for every micro-batch but a mini-batch's last, as the HF Trainer
    does; restored to on afterwards.
    """
    state = accelerator.gradient_state
    saved = state.sync_gradients
    state._set_sync_gradients(sync)
    try:
        with nullcontext() if sync else accelerator.no_sync(model):
            yield
    finally:
        state._set_sync_gradients(saved)


def full_params(accelerator: Any, model: Any) -> Any:
    """A context in which the unwrapped model holds its full parameters (generation, no-grad passes).

    DDP and one process: nothing to do. DeepSpeed ZeRO-3 and FSDP shard the parameters: gather them
    (each GPU then holds the whole model for the duration). FSDP2 is recognised by the model itself (a
    ``fully_shard`` root), whatever the accelerator says: ``fsdp2_unsharded``, tested with 2 gloo
    processes on CPU (tests/scaledrun/test_fsdp_train.py); ZeRO-3 (``zero3_gathered``) with 2 CPU processes
    (tests/scaledrun/test_zero3.py). The FSDP1 branch is not run by this project's tests.
    """
    from accelerate.utils import DistributedType
    from torch.distributed.fsdp import FSDPModule

    kind = accelerator.distributed_type
    if kind == DistributedType.DEEPSPEED and accelerator.state.deepspeed_plugin.zero_stage == 3:
        return zero3_gathered(model)
    if isinstance(model, FSDPModule):
        return fsdp2_unsharded(model)
    if kind == DistributedType.FSDP:
        if getattr(accelerator, "is_fsdp2", False):
            raise ValueError(
                f"FSDP2: the prepared model ({type(model).__name__}) is not a fully_shard module: pass the model "
                "that accelerator.prepare returned"
            )
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel.summon_full_params(model, writeback=False, recurse=True)
    return nullcontext()


def fsdp2_init_root(model: Any) -> None:
    """Make ``model`` (the ``fully_shard`` root) FSDP2's root, before any submodule runs a forward.

    FSDP2 picks its root lazily: the first unit whose forward runs. ``generate`` never calls the root's
    forward (PEFT's ``generate`` runs the transformers model inside it), so without this the first unit
    of the decoder would become the root: a tied (embedding, LM head) group raises "FSDP requires a single
    root module", an untied embedding becomes a wrong root and the next root forward raises "FSDP state
    has already been lazily initialized". A no-op once the root is initialised. torch has no public
    call for it (2.13): this is the call the root's first forward makes.
    """
    model._get_fsdp_state()._lazy_init()


@contextmanager
def fsdp2_unsharded(model: Any) -> Iterator[None]:
    """Every ``fully_shard`` unit of ``model`` holds its whole parameters inside (FSDP2), gathered once.

    The root is initialised first (``fsdp2_init_root``), every unit is all-gathered once, and resharding
    after forward is off inside: otherwise each unit's post-forward hook frees its parameters and every
    generated token all-gathers every layer again. Each unit's own setting is restored on the way out,
    then every unit is resharded.
    """
    from torch.distributed.fsdp import FSDPModule

    fsdp2_init_root(model)
    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    states = list({id(s): s for s in (m._get_fsdp_state() for m in modules)}.values())
    saved = [
        (s, s._auto_reshard_after_forward, [g.post_forward_mesh_info for g in s._fsdp_param_groups])
        for s in states
    ]
    try:
        for m in modules:
            m.set_reshard_after_forward(False, recurse=False)
        for m in modules:
            m.unshard()
        yield
    finally:
        for s, auto, infos in saved:
            s._auto_reshard_after_forward = auto
            for g, info in zip(s._fsdp_param_groups, infos, strict=True):
                g.post_forward_mesh_info = info
        for m in modules:
            m.reshard()


@contextmanager
def zero3_gathered(engine: Any) -> Iterator[None]:
    """DeepSpeed ZeRO-3: every parameter gathered, and ZeRO-3's module hooks off, for the call.

    ``GatheredParameters`` alone leaves the hooks ZeRO-3 puts on every module, which fetch and release
    parameters around each submodule's forward, at every generated token. So inside the gathered
    context the hooks are removed (and no parameter is marked in use by a submodule), and they are put
    back by ZeRO-3's own registration before the parameters are released, the way TRL unwraps a ZeRO-3
    model for generation. Tested with 2 CPU processes (tests/scaledrun/test_zero3.py): no all-gather
    during a generate call (212 in the same call without this context), DDP's completions, and the
    training passes after it gather through the restored hooks (the run trains like DDP).
    """
    import deepspeed

    owner = getattr(engine.optimizer, "parameter_offload", engine.optimizer)  # the holder of the hooks
    if owner is None:
        raise RuntimeError(
            "ZeRO-3 generation: the DeepSpeed engine has no optimizer (prepare the model with its optimizer)"
        )
    with deepspeed.zero.GatheredParameters(list(engine.parameters()), modifier_rank=None):
        for module in owner.module.modules():
            external = [p for _, p in getattr(module, "ds_external_parameters", list)()]
            for p in [*module.parameters(recurse=False), *external]:
                p.ds_active_sub_modules.clear()
        for hook in [*owner.forward_hooks, *owner.backward_hooks]:
            hook.remove()
        owner.forward_hooks, owner.backward_hooks = [], []
        try:
            yield
        finally:  # DeepSpeed >= 0.16.4 renamed its registration
            register = getattr(owner, "_register_deepspeed_module", None) or owner._register_hooks_recursively
            register(owner.module)


class LaunchError(RuntimeError):
    """A launch that would not run what it asks for: its accelerate config file, or a setting this device
    cannot run (``check_device_support``)."""


def check_launch(accelerator: Any) -> None:
    """Refuse a DeepSpeed or FSDP launch that Accelerate set up as something else.

    Accelerate sets DeepSpeed and FSDP up only on GPUs: ``accelerate launch --config_file zero3.yaml`` (or
    ``zero2.yaml``, ``fsdp.yaml``) on a machine without one starts plain DDP processes, which would train
    unsharded while the user believes otherwise (and run out of memory where sharding was the point).
    """
    asked = [
        name for name, env in (("DeepSpeed", "ACCELERATE_USE_DEEPSPEED"), ("FSDP", "ACCELERATE_USE_FSDP"))
        if os.environ.get(env, "false").lower() == "true"
    ]  # fmt: skip
    kind = str(accelerator.distributed_type).rsplit(".", 1)[-1]
    got = {"DEEPSPEED": "DeepSpeed", "FSDP": "FSDP"}.get(kind)
    if asked and got not in asked:
        raise LaunchError(
            f"the accelerate config asks for {asked[0]}, but Accelerate set this process up as {kind} "
            f"({accelerator.num_processes} process(es), device {accelerator.device}): Accelerate runs {asked[0]} "
            "only on GPUs. On a machine without a GPU launch with scaledrun/accelerate/ddp.yaml (or "
            "--multi_gpu, gloo) instead"
        )


def before_prepare(accelerator: Any, cfg: Any) -> None:
    """What the Accelerator's plugins need from the run before ``accelerator.prepare``:
    ``deepspeed_micro_batch``, and ``fsdp2_bf16_params`` for full fine-tuning in bfloat16."""
    from .model import master_fp32

    deepspeed_micro_batch(accelerator)
    fsdp2_bf16_params(accelerator, master_fp32(cfg))


def check_device_support(cfg: Any, device: torch.device) -> None:
    """Refuse, before the run folder and the model, a setting that this process's device cannot run.

    ``compile_decode`` (transformers compiles the static cache's decode step on CUDA/XPU only: elsewhere
    it would run eager under that name) and a flash-attention ``attn_implementation`` (the ``flash-attn``
    package, on a GPU). The config itself is device-agnostic (it may be written on a laptop for a GPU
    run), so these are checked here, where the device is known.
    """
    if cfg.compile_decode and device.type not in ("cuda", "xpu"):
        raise LaunchError(
            f"config field `compile_decode`=True: this process runs on {device.type}; transformers compiles "
            "the decode step on a CUDA or XPU device only (elsewhere it would silently run eager): set "
            "compile_decode false here"
        )
    attn = getattr(cfg, "attn_implementation", None)
    if attn in ("flash_attention_2", "flash_attention_3"):
        from transformers.utils import import_utils

        package = {
            "flash_attention_2": "flash-attn",
            "flash_attention_3": "flash-attn 3 (flash_attn_interface)",
        }
        probe = getattr(import_utils, f"is_{attn.replace('attention', 'attn')}_available", None)
        if device.type != "cuda" or probe is None or not probe():
            raise LaunchError(
                f"config field `attn_implementation`={attn!r}: needs a CUDA GPU and the {package[attn]} package "
                f"(this process: {device.type}, package {'found' if probe is not None and probe() else 'not found'}); "
                "use sdpa (transformers' default) or install it"
            )


def deepspeed_micro_batch(accelerator: Any) -> None:
    """DeepSpeed wants ``train_micro_batch_size_per_gpu``; no dataloader is prepared to infer it."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is not None and plugin.is_auto("train_micro_batch_size_per_gpu"):
        plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 1


def fsdp2_bf16_params(accelerator: Any, master_fp32: bool) -> None:
    """FSDP2 and fp32 master weights (``model.master_fp32``): every unshard gathers bfloat16 parameters.

    Called before ``accelerator.prepare``. The trainer sets the policy itself, not
    ``scaledrun/accelerate/fsdp.yaml`` (whose ``mixed_precision`` stays ``'no'``): one yaml serves LoRA
    runs too, whose fp32 adapters must compute in fp32, and Accelerate's ``mixed_precision: bf16`` would
    also reduce gradients in bf16. The policy, ``MixedPrecisionPolicy(param_dtype=bfloat16,
    reduce_dtype=float32)``, goes to the plugin, from which Accelerate's ``fsdp2_prepare_model`` hands it to
    every ``fully_shard`` call: the sharded masters (and the optimizer) stay float32, every all-gather
    (generation inside ``full_params``, each training forward and backward) gathers a bfloat16 copy, 2 B per
    parameter instead of 4 (the whole model during generation: 65.5 GB for Qwen3-32B instead of 131), the
    bfloat16 gradients are reduce-scattered and accumulated across micro-batches in float32. The passes
    still run under the trainer's bfloat16 autocast (``model.compute_precision``): on bfloat16 weights it
    changes nothing but the ops autocast keeps in float32. The passes then compute as a bf16 model does
    (embedding, norms, residual stream in bf16), unlike one process or DDP, whose autocast keeps the fp32
    embedding and norm weights (an fp32 residual stream): verl's FSDP mixed precision does the same. Tested with 2 gloo processes on CPU
    (tests/scaledrun/test_fsdp_train.py, ``full_bf16``): the gathered bytes, greedy tokens and the first
    update's gradients against an unsharded bfloat16 copy accumulating in float32. A no-op for any other run.
    """
    if not master_fp32 or not getattr(accelerator, "is_fsdp2", False):
        return
    from torch.distributed.fsdp import MixedPrecisionPolicy

    plugin = accelerator.state.fsdp_plugin
    wanted = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if plugin.mixed_precision_policy not in (None, wanted):
        raise LaunchError(
            f"full fine-tuning in bfloat16 under FSDP2 sets its own mixed precision ({wanted}), but the launch "
            f"set {plugin.mixed_precision_policy}: use mixed_precision: 'no' in the accelerate config "
            "(scaledrun/accelerate/fsdp.yaml)"
        )
    plugin.mixed_precision_policy = wanted


def has_accelerator() -> bool:
    """Whether a GPU-like device (CUDA/ROCm, XPU, MPS) is visible to this process."""
    if torch.cuda.is_available():
        return True
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return True
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def any_process(accelerator: Any, flag: bool) -> bool:
    """Whether ``flag`` holds on any process (all processes call this together)."""
    return sum_list(accelerator, [1.0 if flag else 0.0])[0] > 0


def sum_list(accelerator: Any, values: list[float]) -> list[float]:
    """Element-wise sum of ``values`` over processes."""
    if accelerator.num_processes == 1:
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=accelerator.device)
    return accelerator.reduce(t, "sum").tolist()


def max_list(accelerator: Any, values: list[float]) -> list[float]:
    """Element-wise maximum of ``values`` over processes."""
    if accelerator.num_processes == 1:
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=accelerator.device)
    return accelerator.reduce(t, "max").tolist()


def sum_over_processes(accelerator: Any, values: dict[str, float]) -> dict[str, float]:
    return dict(zip(values, sum_list(accelerator, list(values.values())), strict=True))


def mean_over_processes(accelerator: Any, values: dict[str, float]) -> dict[str, float]:
    world = accelerator.num_processes
    return {k: v / world for k, v in sum_over_processes(accelerator, values).items()}


@dataclass(frozen=True)
class GlobalCounts:
    """The normalisers of one mini-batch, summed over all processes (see "Loss normalisation")."""

    tokens: float  # unmasked completion tokens
    sequences: float  # completions (rows)


def global_counts(accelerator: Any, mask: Tensor) -> GlobalCounts:
    """The mini-batch's token and sequence counts over all processes; ``mask`` (b, T) is this process's part."""
    local = torch.tensor(
        [float(mask.sum()), float(mask.shape[0])], dtype=torch.float64, device=accelerator.device
    )
    tokens, sequences = accelerator.reduce(local, "sum").tolist()
    return GlobalCounts(tokens=tokens, sequences=sequences)
