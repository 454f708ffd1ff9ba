"""Checkpoints: the trainable weights, optimizer, scheduler, RNG states, step and reward-balanced buffer.

Layout of ``<output_dir>/checkpoints/step_000008/``::

    adapter_model.safetensors, adapter_config.json   (LoRA: the adapter only; main process)
    model.safetensors, config.json                    (full fine-tuning: every weight; main process)
    optimizer.pt                                      (one process / DDP: main process)
    optimizer_<rank>.pt                               (FSDP: each rank's shard of the optimizer state)
    sharded_state/                                    (DeepSpeed ZeRO: ``accelerator.save_state`` without
                                                       the frozen parameters)
    scheduler.pt                                      (main process)
    rng_state_<rank>.pt                               (python, numpy, torch CPU and CUDA RNG; every rank)
    buffer_<rank>.pt                                  (the rank's reward-balanced buffer, if any)
    trainer_state.json                                (step and metadata; written last, so a directory
                                                       without it is an interrupted save and is ignored)

Only trainable parameters are saved, on every path: under LoRA the frozen base is never written (it is
the model the run names, loaded again on resume), so a checkpoint holds the adapter (its parameters × 4
bytes in fp32) and AdamW's two moments of the same size, whatever the base's size. The optimizer is
built on the trainable parameters only (``build_optimizer``), so its state is the adapter's too.

Every file is read with ``torch.load(weights_only=True)`` (``safe_load``): tensors, numbers, strings,
lists, dicts and ``RolloutBatch`` only, so a run folder someone shared cannot run code when resumed;
anything else is refused with an error naming the file. ``save_total_limit`` keeps the newest N
checkpoints (``prune_checkpoints``).

``accelerator.save_state`` is not used for one process, DDP or FSDP because it always saves the full
model weights (the base model too under LoRA).

Multi-process: under DDP every rank holds the same weights and optimizer state (the test
``tests/scaledrun/test_multiprocess.py`` checks the ranks' adapters are identical and equal the saved
one), so the main process writes them; each rank writes its own RNG state and buffer.

FSDP (detected on the model, so a model ``fully_shard``-ed by hand counts too): FSDP2 gathers the
trainable parameters alone, one at a time (``DTensor.full_tensor``, a full CPU copy on the main
process), and the main process writes them as above; each rank writes its own shard of the optimizer
state (its local tensors, ``optimizer_<rank>.pt``), which a resume with the same number of processes
puts back into the same shards (``DTensor.from_local`` on each parameter's mesh). A resume reads the
full trainable tensors on every rank and shards them with ``set_model_state_dict``. Tested with 2 gloo
processes on CPU, LoRA of the tied tiny Qwen3 (``tests/scaledrun/test_checkpoint.py -k fsdp``); full
fine-tuning passes too but its 2-process run aborts in native code about 1 run in 8, so the suite runs it
only with ``FSDP_FULL_CHECKPOINT=1``. FSDP1 (not used by the shipped configs, not tested) goes through ``get_model_state_dict``
with ``ignore_frozen_params``, filtered by name (it keeps a frozen tied LM head otherwise).

DeepSpeed ZeRO: the trainable parameters alone are gathered (``deepspeed.zero.GatheredParameters``, one
parameter at a time, under ZeRO-3; whole already under ZeRO-1/2) and written by the main process; the sharded optimizer state goes through
``accelerator.save_state(..., exclude_frozen_parameters=True)`` into ``sharded_state/`` and comes back
with ``accelerator.load_state(..., load_module_strict=False)``. DeepSpeed is not installed here: that
branch is not run by this project's tests.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

_STEP_DIR = re.compile(r"^step_(\d+)$")
STATE_FILE = "trainer_state.json"


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"step_{step:06d}"


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The complete checkpoint with the highest step under ``output_dir``, or None."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return None
    best: tuple[int, Path] | None = None
    for d in root.iterdir():
        m = _STEP_DIR.match(d.name)
        if m and (d / STATE_FILE).is_file() and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), d)
    return None if best is None else best[1]


def rng_state() -> dict[str, Any]:
    """The process's RNG states, as tensors, numbers and tuples (loadable with ``weights_only=True``)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()  # noqa: NPY002 (the global state libraries use)
    state = {
        "python": random.getstate(),
        "numpy": {
            "name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }  # fmt: skip
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    n = state["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state((n["name"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))  # noqa: NPY002
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    accelerator: Any,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    step: int,
    output_dir: str | Path,
    buffer: Any = None,
    extra: dict[str, Any] | None = None,
    save_total_limit: int | None = None,
) -> Path:
    """Save everything a resumed run needs after ``step`` completed steps; returns the directory."""
    d = checkpoint_dir(output_dir, step)
    if accelerator.is_main_process:
        d.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    rank = accelerator.process_index
    fsdp, deepspeed = is_fsdp(model), _is_deepspeed(accelerator)
    # FSDP / ZeRO: every process takes part in gathering the trainable parameters (never the frozen base)
    state_dict = trainable_state_dict(accelerator, model) if (fsdp or deepspeed) else None
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).save_pretrained(d, state_dict=state_dict, safe_serialization=True)
        if not (fsdp or deepspeed):  # DDP keeps the optimizer state identical on every rank
            torch.save(optimizer.state_dict(), d / "optimizer.pt")
        torch.save(scheduler.state_dict(), d / "scheduler.pt")
    if fsdp:  # every rank writes its own shard of the optimizer state
        torch.save(_local_optimizer_state(optimizer), d / f"optimizer_{rank}.pt")
    elif deepspeed:  # every rank writes its shard of the optimizer state; the frozen weights are left out
        accelerator.save_state(str(d / "sharded_state"), exclude_frozen_parameters=True)
    torch.save(rng_state(), d / f"rng_state_{rank}.pt")
    torch.save(buffer, d / f"buffer_{rank}.pt")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        state = {"step": step, "num_processes": accelerator.num_processes, **(extra or {})}
        (d / STATE_FILE).write_text(json.dumps(state, indent=1))
        if save_total_limit is not None:
            prune_checkpoints(output_dir, save_total_limit)
    accelerator.wait_for_everyone()
    return d


def is_fsdp(model: Any) -> bool:
    """Whether ``model`` (or a submodule) is sharded by FSDP: ``fully_shard`` (FSDP2) or the FSDP1 wrapper."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    return any(isinstance(m, (FSDPModule, FullyShardedDataParallel)) for m in model.modules())


def _fsdp1(model: Any) -> bool:
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FullyShardedDataParallel

    return any(isinstance(m, FullyShardedDataParallel) for m in model.modules())


def _clean(name: str) -> str:
    """A parameter name without the wrappers' prefixes (FSDP1, activation checkpointing, torch.compile)."""
    for wrapper in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(wrapper, "")
    return name


def _is_deepspeed(accelerator: Any) -> bool:
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.DEEPSPEED


def _zero3(accelerator: Any) -> bool:
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return _is_deepspeed(accelerator) and plugin is not None and plugin.zero_stage == 3


def trainable_state_dict(accelerator: Any, model: Any) -> dict[str, torch.Tensor]:
    """The trainable parameters as full CPU tensors on the main process (an empty dict elsewhere under
    FSDP), keyed by the unwrapped model's parameter names; every process must call it (it gathers).

    Under LoRA that is the adapter alone: the frozen base is neither gathered nor returned.
    """
    unwrapped = accelerator.unwrap_model(model)
    named = [(n, p) for n, p in unwrapped.named_parameters() if p.requires_grad]
    if _fsdp1(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # ``ignore_frozen_params`` keeps a frozen tied LM head (a duplicate name): filtered by name
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        sd = get_model_state_dict(model, options=opts)
        keep = {_clean(n) for n, _ in named}
        return {k: v for k, v in sd.items() if _clean(k) in keep}
    if is_fsdp(model):  # FSDP2: each trainable DTensor gathered in turn, on every rank in the same order
        from torch.distributed.tensor import DTensor

        out = {}
        for n, p in named:
            full = p.full_tensor() if isinstance(p, DTensor) else p
            if accelerator.is_main_process:
                out[n] = full.detach().cpu().clone()
        return out
    if _zero3(accelerator):  # one parameter gathered at a time (full fine-tuning: never the whole model)
        import deepspeed

        out = {}
        for n, p in named:
            with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
                if accelerator.is_main_process:
                    out[n] = p.detach().cpu().clone()
        return out
    return {n: p.detach().cpu().clone() for n, p in named}  # ZeRO-1/2: the parameters are whole


def _local_optimizer_state(optimizer: Any) -> dict[str, Any]:
    """This rank's optimizer state with every DTensor (FSDP2) replaced by its local shard."""
    from torch.distributed.tensor import DTensor

    sd = getattr(optimizer, "optimizer", optimizer).state_dict()
    state = {
        i: {k: v.to_local().cpu() if isinstance(v, DTensor) else v for k, v in s.items()}
        for i, s in sd["state"].items()
    }
    return {**sd, "state": state}


def _load_local_optimizer_state(optimizer: Any, sd: dict[str, Any], path: Path) -> None:
    """Put the shard ``_local_optimizer_state`` saved back into the optimizer (DTensors rebuilt on each
    parameter's mesh and placements); a shard of another shape is refused, naming the file."""
    from torch.distributed.tensor import DTensor

    opt = getattr(optimizer, "optimizer", optimizer)
    params = [p for g in opt.param_groups for p in g["params"]]
    if len(params) != sum(len(g["params"]) for g in sd["param_groups"]):
        raise ValueError(f"{path}: saved for another set of trainable parameters than this run's")
    state = {}
    for i, s in sd["state"].items():
        p, out = params[int(i)], {}
        for k, v in s.items():
            if isinstance(p, DTensor) and isinstance(v, torch.Tensor) and v.dim() > 0:
                local = p.to_local()
                if v.shape != local.shape:
                    raise ValueError(
                        f"{path}: optimizer state {k} of parameter {i} has shape {tuple(v.shape)}, this "
                        f"rank's shard {tuple(local.shape)}: resume with the same sharding"
                    )
                v = DTensor.from_local(
                    v.to(local.device), p.device_mesh, p.placements, run_check=False, shape=p.shape,
                    stride=p.stride(),
                )  # fmt: skip
            out[k] = v
        state[i] = out
    opt.load_state_dict({**sd, "state": state})


def prune_checkpoints(output_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints under ``output_dir``; return the deleted."""
    import shutil

    root = Path(output_dir) / "checkpoints"
    done = sorted(
        (int(m.group(1)), d)
        for d in (root.iterdir() if root.is_dir() else [])
        if (m := _STEP_DIR.match(d.name)) and (d / STATE_FILE).is_file()
    )
    gone = [d for _, d in done[: max(0, len(done) - keep)]]
    for d in gone:
        shutil.rmtree(d)
    return gone


def safe_load(path: str | Path, map_location: Any = "cpu") -> Any:
    """``torch.load`` with ``weights_only=True`` (and ``RolloutBatch`` allowed), or a clear refusal.

    Checkpoints and replay files hold tensors, numbers, strings, lists, dicts and ``RolloutBatch``; a file
    that carries any other Python object (a pickled function or class could run code when loaded) is
    refused, naming the file.
    """
    import pickle

    from .rollout import RolloutBatch

    try:
        with torch.serialization.safe_globals([RolloutBatch]):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(
            f"{path}: refused to load: it holds Python objects other than tensors, numbers, strings and "
            f"RolloutBatch (loading it would run code it carries): {str(err).splitlines()[0]}. Only load run "
            "folders you trust; this trainer never writes such files."
        ) from None


def checkpoint_config(d: str | Path) -> dict[str, Any] | None:
    """The run config a checkpoint was saved with (None for checkpoints saved before it was recorded)."""
    return json.loads((Path(d) / STATE_FILE).read_text()).get("config")


def _load_weights(accelerator: Any, model: Any, d: Path) -> None:
    """The trainable weights of checkpoint ``d`` into ``model`` (prepared: DDP, FSDP or DeepSpeed)."""
    from safetensors.torch import load_file

    unwrapped = accelerator.unwrap_model(model)
    adapter = d / "adapter_model.safetensors"
    full = d / "model.safetensors"
    if not adapter.is_file() and not full.is_file():
        raise FileNotFoundError(
            f"checkpoint {d} holds neither adapter_model.safetensors nor model.safetensors"
        )
    if not (is_fsdp(model) or _zero3(accelerator)):  # the parameters are whole on every process
        if adapter.is_file():
            from peft import set_peft_model_state_dict

            result = set_peft_model_state_dict(unwrapped, load_file(str(adapter)))
            unexpected = getattr(result, "unexpected_keys", [])
            if unexpected:
                raise ValueError(f"checkpoint {d}: adapter keys not in the model: {unexpected[:5]}")
            return
        _missing, unexpected = unwrapped.load_state_dict(load_file(str(full)), strict=False)
        if unexpected:
            raise ValueError(f"checkpoint {d}: weights not in the model: {unexpected[:5]}")
        return
    # sharded parameters: the trainable ones, by the model's names, from the full tensors every rank reads
    names = _trainable_names(unwrapped)
    weights = load_file(str(adapter if adapter.is_file() else full))
    if adapter.is_file():
        weights = _adapter_to_model_keys(unwrapped, weights, names, d)
    missing = sorted(set(names) - set(weights))
    if missing:
        raise ValueError(f"checkpoint {d}: trainable weights missing: {missing[:5]}")
    if is_fsdp(model):  # torch shards the full tensors into the parameters
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        opts = StateDictOptions(full_state_dict=True, strict=False)
        set_model_state_dict(model, {k: weights[k] for k in names}, options=opts)
        return
    import deepspeed  # ZeRO-3: one parameter gathered at a time, rank 0's copy kept

    params = dict(unwrapped.named_parameters())
    for k in names:
        with deepspeed.zero.GatheredParameters([params[k]], modifier_rank=0), torch.no_grad():
            params[k].copy_(weights[k])


def _trainable_names(unwrapped: Any) -> list[str]:
    return [_clean(n) for n, p in unwrapped.named_parameters() if p.requires_grad]


def _adapter_to_model_keys(
    unwrapped: Any, adapter: dict[str, torch.Tensor], names: list[str], d: Path
) -> dict[str, torch.Tensor]:
    """An adapter file's keys (PEFT's, without the adapter name) mapped to the model's parameter names,
    by PEFT's own ``get_peft_model_state_dict`` applied to the names."""
    from peft import get_peft_model_state_dict

    marks = {n: torch.empty(0) for n in names}  # distinct objects: PEFT returns them under its keys
    by_id = {id(t): n for n, t in marks.items()}
    peft_keys = {k: by_id[id(t)] for k, t in get_peft_model_state_dict(unwrapped, state_dict=marks).items()}
    unexpected = sorted(set(adapter) - set(peft_keys))
    if unexpected:
        raise ValueError(f"checkpoint {d}: adapter keys not in the model: {unexpected[:5]}")
    return {peft_keys[k]: v for k, v in adapter.items()}


def load_checkpoint(
    accelerator: Any, model: Any, optimizer: Any, scheduler: Any, d: str | Path
) -> tuple[int, Any, dict[str, Any]]:
    """Restore a checkpoint saved by ``save_checkpoint``; returns (step, buffer, trainer state)."""
    d = Path(d)
    state = json.loads((d / STATE_FILE).read_text())
    if state.get("num_processes", 1) != accelerator.num_processes:
        raise ValueError(
            f"checkpoint {d} was saved by {state['num_processes']} processes, this run has "
            f"{accelerator.num_processes}: resume with the same number of processes (the buffers are per rank)"
        )
    rank = accelerator.process_index
    _load_weights(accelerator, model, d)
    if (d / "optimizer.pt").is_file():
        optimizer.load_state_dict(safe_load(d / "optimizer.pt"))
    elif (d / f"optimizer_{rank}.pt").is_file():  # FSDP: every rank reads its own shard
        _load_local_optimizer_state(
            optimizer, safe_load(d / f"optimizer_{rank}.pt"), d / f"optimizer_{rank}.pt"
        )
    elif (d / "sharded_state").is_dir():  # DeepSpeed ZeRO: every rank reads its shard
        accelerator.load_state(str(d / "sharded_state"), load_module_strict=False)
    else:
        accelerator.print(f"checkpoint {d}: no optimizer state; AdamW's moments restart")
    scheduler.load_state_dict(safe_load(d / "scheduler.pt"))
    set_rng_state(safe_load(d / f"rng_state_{rank}.pt"))
    buffer = safe_load(d / f"buffer_{rank}.pt", map_location=accelerator.device)
    return int(state["step"]), buffer, state
