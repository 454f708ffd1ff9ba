"""Checkpoints: the trainable weights, optimizer, scheduler, RNG states, step and reward-balanced buffer.

Layout of ``<output_dir>/checkpoints/step_000008/``::

    adapter_model.safetensors, adapter_config.json   (LoRA: PeftModel.save_pretrained; main process)
    model.safetensors, config.json                    (full fine-tuning: save_pretrained; main process)
    optimizer.pt, scheduler.pt                        (main process; DDP keeps them identical on ranks)
    rng_state_<rank>.pt                               (python, numpy, torch CPU and CUDA RNG; every rank)
    buffer_<rank>.pt                                  (the rank's reward-balanced buffer, if any)
    trainer_state.json                                (step and metadata; written last, so a directory
                                                       without it is an interrupted save and is ignored)

Every file is read with ``torch.load(weights_only=True)`` (``safe_load``): tensors, numbers, strings,
lists, dicts and ``RolloutBatch`` only, so a run folder someone shared cannot run code when resumed;
anything else is refused with an error naming the file. ``save_total_limit`` keeps the newest N
checkpoints (``prune_checkpoints``).

``accelerator.save_state`` is not used for one process or DDP because it always saves the full model
weights (the base model too under LoRA).

Multi-process: under DDP every rank holds the same weights and optimizer state (the test
``tests/scaledrun/test_multiprocess.py`` checks the ranks' adapters are identical and equal the saved
one), so the main process writes them; each rank writes its own RNG state and buffer. Under DeepSpeed
ZeRO / FSDP the weights are gathered with ``accelerator.get_state_dict`` by every rank and written by
the main process, and the sharded optimizer state is saved by every rank with
``accelerator.save_state`` into ``sharded_state/`` (read back with ``accelerator.load_state``). That
branch needs DeepSpeed or FSDP on GPUs and is not exercised by this project's CPU tests.
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
    sharded = is_sharded(accelerator)
    # ZeRO/FSDP: every process takes part in gathering the full state dict
    state_dict = accelerator.get_state_dict(model) if sharded else None
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).save_pretrained(d, state_dict=state_dict, safe_serialization=True)
        if not sharded:  # a sharded optimizer's state_dict() is this rank's shard only: not saved
            torch.save(optimizer.state_dict(), d / "optimizer.pt")
        torch.save(scheduler.state_dict(), d / "scheduler.pt")
    rank = accelerator.process_index
    torch.save(rng_state(), d / f"rng_state_{rank}.pt")
    torch.save(buffer, d / f"buffer_{rank}.pt")
    if sharded:  # every rank writes its shard of the optimizer state
        accelerator.save_state(str(d / "sharded_state"))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        state = {"step": step, "num_processes": accelerator.num_processes, **(extra or {})}
        (d / STATE_FILE).write_text(json.dumps(state, indent=1))
        if save_total_limit is not None:
            prune_checkpoints(output_dir, save_total_limit)
    accelerator.wait_for_everyone()
    return d


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


def is_sharded(accelerator: Any) -> bool:
    """Whether parameters or optimizer state are sharded over processes (DeepSpeed ZeRO, FSDP)."""
    from accelerate.utils import DistributedType

    return accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP)


def _load_weights(model: Any, d: Path) -> None:
    from safetensors.torch import load_file

    adapter = d / "adapter_model.safetensors"
    if adapter.is_file():
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, load_file(str(adapter)))
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise ValueError(f"checkpoint {d}: adapter keys not in the model: {unexpected[:5]}")
        return
    full = d / "model.safetensors"
    if not full.is_file():
        raise FileNotFoundError(
            f"checkpoint {d} holds neither adapter_model.safetensors nor model.safetensors"
        )
    _missing, unexpected = model.load_state_dict(load_file(str(full)), strict=False)
    if unexpected:
        raise ValueError(f"checkpoint {d}: weights not in the model: {unexpected[:5]}")


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
    _load_weights(accelerator.unwrap_model(model), d)
    if (d / "optimizer.pt").is_file():
        optimizer.load_state_dict(safe_load(d / "optimizer.pt"))
    elif (d / "sharded_state").is_dir():  # DeepSpeed ZeRO / FSDP: every rank reads its shard
        accelerator.load_state(str(d / "sharded_state"))
    else:
        accelerator.print(f"checkpoint {d}: no optimizer state; AdamW's moments restart")
    scheduler.load_state_dict(safe_load(d / "scheduler.pt"))
    rank = accelerator.process_index
    set_rng_state(safe_load(d / f"rng_state_{rank}.pt"))
    buffer = safe_load(d / f"buffer_{rank}.pt", map_location=accelerator.device)
    return int(state["step"]), buffer, state
