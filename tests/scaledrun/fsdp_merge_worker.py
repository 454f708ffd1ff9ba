"""One rank of ``test_backends_fast.py``'s FSDP2 test (``torchrun --nproc_per_node 2``, gloo, CPU):
``rollout_merge`` inside the trainer's ``full_params`` on a tiny PEFT Qwen3 ``fully_shard``-ed as
``accelerator.prepare`` shards it under ``scaledrun/accelerate/fsdp.yaml`` (``fsdp_train_worker.shard``).

Usage: ``torchrun --nproc_per_node 2 tests/scaledrun/fsdp_merge_worker.py <out_dir> <model_dir> <dtype>``.
Each rank writes ``<out_dir>/merge_rank<r>.pt``: ``plain`` / ``merged``, this rank's greedy completions
through ``HFBackend`` inside ``full_params`` without and with ``merge``; ``before`` / ``after``, every
base (non-LoRA) parameter gathered in full before and after the merged call; ``merge_err``, ``delta_max``:
inside ``full_params`` and ``merged_adapter``, layer 0's q_proj weight against base + scale·B·A, and that
delta's largest entry; ``restored``: that weight equals its base again after ``merged_adapter``, still inside
the gather (FSDP2 discards writes to the gathered copy when it reshards, so ``after`` alone would not see a
missing restore).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from fsdp_train_worker import QUESTIONS, config, full, load, shard

from scaledrun.backends import HFBackend, Sampling, merged_adapter, stop_token_ids
from scaledrun.distributed import full_params
from scaledrun.model import load_tokenizer
from scaledrun.tasks import format_prompt


def main(out: str, model_dir: str, dtype: str) -> None:
    accelerator = Accelerator(cpu=True)
    cfg = config(model_dir, dtype, Path(out) / "merge")
    tokenizer = load_tokenizer(cfg)
    model = shard(accelerator, load(cfg))
    unwrapped = accelerator.unwrap_model(model)
    prompts = [format_prompt(tokenizer, q) for q in QUESTIONS[accelerator.process_index]]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    sampling = Sampling(
        max_new_tokens=6, do_sample=False, stop_ids=tuple(stop_token_ids(unwrapped, tokenizer)),
        pad_id=tokenizer.pad_token_id,
    )  # fmt: skip
    base = lambda: full({n: p for n, p in model.named_parameters() if "lora_" not in n})  # noqa: E731
    res = {"before": base()}
    for key, merge in (("plain", False), ("merged", True)):
        with full_params(accelerator, model):
            res[key] = HFBackend(unwrapped, merge=merge).generate(
                enc["input_ids"], enc["attention_mask"], num_generations=2, sampling=sampling
            )
    # inside the gather, merged: layer 0's q_proj weight is base + scale·B·A of the gathered tensors
    with full_params(accelerator, model):
        layer = unwrapped.base_model.model.model.layers[0].self_attn.q_proj
        w0 = layer.base_layer.weight.detach().clone()
        delta = layer.scaling["default"] * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
        with merged_adapter(unwrapped):
            res["merge_err"] = float((layer.base_layer.weight - (w0 + delta)).abs().max())
        res["delta_max"] = float(delta.abs().max())
        res["restored"] = torch.equal(layer.base_layer.weight, w0)  # inside the gather, before any reshard
    res["after"] = base()
    torch.save(res, Path(out) / f"merge_rank{accelerator.process_index}.pt")
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main(*sys.argv[1:])
