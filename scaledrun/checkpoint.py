"""Checkpoints: the trainable weights, optimizer, scheduler, RNG states, step and reward-balanced buffer.

Layout of ``<output_dir>/checkpoints/step_000008/``::

    adapter_model.safetensors, adapter_config.json   (LoRA: PeftModel.save_pretrained; main process)
    model.safetensors, config.json                    (full fine-tuning: save_pretrained; main process)
    optimizer.pt, scheduler.pt                        (main process; DDP keeps them identical on ranks)
    rng_state_<rank>.pt                               (python, numpy, torch CPU and CUDA RNG; every rank)
    buffer_<rank>.pt                                  (the rank's reward-balanced buffer, if any)
    trainer_state.json                                (step and metadata; written last, so a directory
                                                       without it is an interrupted save and is ignored)

``accelerator.save_state`` is not used because it always saves the full model weights (the base model
too under LoRA).

Multi-process: under DDP every rank holds the same weights and optimizer state (the test
``tests/scaledrun/test_multiprocess.py`` checks the ranks' adapters are identical and equal the saved
one), so the main process writes them; each rank writes its own RNG state and buffer. Under DeepSpeed
ZeRO / FSDP (not exercised by the CPU tests) the weights are gathered with
``accelerator.get_state_dict`` by every rank and written by the main process; the sharded optimizer
state is *not* saved (no ``optimizer.pt``), so a resumed sharded run restarts AdamW's moments.
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
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),  # noqa: NPY002 (the global state libraries use)
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])  # noqa: NPY002
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
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        state = {"step": step, "num_processes": accelerator.num_processes, **(extra or {})}
        (d / STATE_FILE).write_text(json.dumps(state, indent=1))
    accelerator.wait_for_everyone()
    return d


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
        optimizer.load_state_dict(torch.load(d / "optimizer.pt", map_location="cpu", weights_only=False))
    else:  # saved under DeepSpeed ZeRO / FSDP: AdamW's moments restart
        accelerator.print(f"checkpoint {d}: no optimizer.pt (sharded run); the optimizer state restarts")
    scheduler.load_state_dict(torch.load(d / "scheduler.pt", map_location="cpu", weights_only=False))
    rank = accelerator.process_index
    set_rng_state(torch.load(d / f"rng_state_{rank}.pt", weights_only=False))
    buffer = torch.load(d / f"buffer_{rank}.pt", map_location=accelerator.device, weights_only=False)
    return int(state["step"]), buffer, state
