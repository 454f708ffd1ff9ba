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
- ``has_accelerator``, ``deepspeed_micro_batch``: the Accelerator's set-up.
"""

from __future__ import annotations

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
    (each GPU then holds the whole model for the duration). The ZeRO-3/FSDP branches are not exercised
    by this project's CPU tests (see ``scaledrun/accelerate/*.yaml``).
    """
    from accelerate.utils import DistributedType

    kind = accelerator.distributed_type
    if kind == DistributedType.DEEPSPEED and accelerator.state.deepspeed_plugin.zero_stage == 3:
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)
    if kind == DistributedType.FSDP:
        if getattr(accelerator, "is_fsdp2", False):
            return _fsdp2_unsharded(model)
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel.summon_full_params(model, writeback=False, recurse=True)
    return nullcontext()


@contextmanager
def _fsdp2_unsharded(model: Any) -> Iterator[None]:
    """Every ``fully_shard`` module of ``model`` holds its whole parameters inside (FSDP2)."""
    from torch.distributed.fsdp import FSDPModule

    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in modules:
        m.unshard()
    try:
        yield
    finally:
        for m in modules:
            m.reshard()


def deepspeed_micro_batch(accelerator: Any) -> None:
    """DeepSpeed wants ``train_micro_batch_size_per_gpu``; no dataloader is prepared to infer it."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is not None and plugin.is_auto("train_micro_batch_size_per_gpu"):
        plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 1


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
