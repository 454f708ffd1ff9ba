"""One rank of ``test_checkpoint.py``'s FSDP2 checkpoint test (``torchrun --nproc_per_node 2``, gloo, CPU).

Usage: ``torchrun --nproc_per_node 2 tests/scaledrun/fsdp_checkpoint_worker.py <model_dir> <out_dir> <lora|full>``.

The tiny Qwen3 (float64, so that every comparison is exact) is ``fully_shard``-ed the way accelerate's
``fsdp2_prepare_model`` does it (each decoder layer, then the root) with AdamW on its trainable
parameters. Run A trains 4 steps and saves a checkpoint after step 2 with ``save_checkpoint``; run B is a
fresh model and optimizer that ``load_checkpoint`` restores from that checkpoint and trains steps 3-4.
Each step's batch is drawn from the global torch RNG, so the RNG state is restored too or the batches
differ. The main process writes both runs' final trainable weights and AdamW moments (gathered, full
tensors) to ``<out_dir>/final_<a|b>.pt`` for the test to compare.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from peft import LoraConfig, get_peft_model
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM

from scaledrun.checkpoint import load_checkpoint, save_checkpoint, trainable_state_dict

LORA = {"r": 4, "lora_alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}
STEPS, SAVE_AT, ROWS, LENGTH, VOCAB = 4, 2, 2, 6, 200


def build(model_dir: str, mode: str):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    if mode == "lora":
        model = get_peft_model(model, LoraConfig(lora_dropout=0.0, **LORA))
    for layer in model.get_decoder().layers if mode == "full" else model.base_model.model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return model, opt, sched


def step(model, opt, sched) -> None:
    ids = torch.randint(0, VOCAB, (ROWS, LENGTH))  # the global RNG: restored by the checkpoint
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()


def final(accelerator, model, opt) -> dict:
    weights = trainable_state_dict(accelerator, model)
    osd = get_optimizer_state_dict(
        model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    return {"weights": weights, "optimizer": osd.get("state", {})}


def main(model_dir: str, out: str, mode: str) -> None:
    accelerator = Accelerator(cpu=True)
    out_dir = Path(out)
    model, opt, sched = build(model_dir, mode)
    for s in range(1, STEPS + 1):
        step(model, opt, sched)
        if s == SAVE_AT:
            ckpt = save_checkpoint(accelerator, model, opt, sched, s, out_dir / "run")
    a = final(accelerator, model, opt)
    model, opt, sched = build(model_dir, mode)
    torch.manual_seed(123)  # a different RNG state: the checkpoint's must be restored
    start, _buffer, _state = load_checkpoint(accelerator, model, opt, sched, ckpt)
    for _ in range(start + 1, STEPS + 1):
        step(model, opt, sched)
    b = final(accelerator, model, opt)
    if accelerator.is_main_process:
        torch.save(a, out_dir / "final_a.pt")
        torch.save(b, out_dir / "final_b.pt")
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main(*sys.argv[1:4])
