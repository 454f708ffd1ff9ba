"""One rank of ``test_fsdp_train.py`` (``torchrun --nproc_per_node 2``, gloo, CPU): the trainer's own
generation, scoring, update and checkpoint functions on a tiny PEFT Qwen3 ``fully_shard``-ed by
accelerate's own ``fsdp2_prepare_model``, against the same model unsharded (DDP, the trainer's tested
multi-process path).

Usage: ``torchrun --nproc_per_node 2 tests/scaledrun/fsdp_train_worker.py <out_dir> <name>=<model_dir>:<dtype>
[:resume|:full] ...``.

``accelerate launch`` with ``use_cpu`` runs plain DDP (Accelerate picks FSDP only on GPUs), so the model
is sharded the way ``accelerator.prepare`` shards it under ``scaledrun/accelerate/fsdp.yaml``
(``fsdp2_prepare_model`` with that file's plugin: each decoder layer, the embedding or the tied
(embedding, LM head, final norm) group, the root) and the accelerator is the CPU one. For each model
each rank writes ``<out_dir>/<name>_rank<r>.pt``:

- ``greedy`` / ``greedy_ref``: this rank's greedy completions through ``HFBackend`` inside ``full_params``
  (sharded) and from the unsharded model; ``all_gathers``: the all-gathers issued during that call (a
  counting wrapper around the real collective); ``units``: the number of FSDP units (``fully_shard``
  calls, a grouped call counted once); ``tied``: whether the LM head is the embedding;
- ``old_logp`` / ``old_logp_ref``: ``generate_rollouts``' scored log-probs of sampled completions;
- ``grads`` / ``grads_ref``: ``update``'s first optimizer step's gradients (``first_grads``, full
  tensors) on that batch with random advantages (uniform − 0.25), two micro-batches, the chunked scorer at 3 positions;
  ``weights`` / ``weights_ref``: the trainable weights after that step (``trainable_state_dict``);
- with ``resume``: ``final_a`` (3 trainer-like steps, a checkpoint after step 2) and ``final_b`` (a fresh
  sharded model resumed from it by ``load_checkpoint``, then step 3), the trainable weights at the end.

With ``full`` (full fine-tuning in bfloat16: float32 master weights, ``model.master_fp32``) the model is
sharded with the trainer's ``distributed.fsdp2_bf16_params`` policy and compared with an unsharded
bfloat16 copy of the same masters (a plain module, no DDP: its gradients are summed across processes here,
in float32), which computes the way FSDP2's bf16 unshard does: ``gen_bytes`` / ``gen_params`` /
``gen_dtypes``: the bytes, parameter count and dtypes of the model's (deduplicated) parameters at each
forward of one greedy generate call inside ``full_params`` (``ref_params``: the reference's count);
``greedy`` / ``greedy_ref``; ``grads``: the first optimizer step's gradients (float32, full tensors);
``grads_ref``: the reference's per-micro-batch bfloat16 gradients of each process, accumulated in float32
by a tensor hook and summed over the 2 processes in float32, halved (the mean FSDP2's reduce-scatter
takes); ``grads_gross``: the same sum of their absolute values (the scale of the rounding bound);
``master_dtypes``: the dtypes of the sharded parameters after the step.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import fsdp2_prepare_model
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from scaledrun.backends import HFBackend, Sampling, stop_token_ids
from scaledrun.checkpoint import load_checkpoint, save_checkpoint, trainable_state_dict
from scaledrun.config import RunConfig
from scaledrun.distributed import fsdp2_bf16_params, full_params
from scaledrun.model import build_optimizer, compute_precision, load_model, load_tokenizer
from scaledrun.rollout import generate_rollouts
from scaledrun.tasks import format_prompt
from scaledrun.train import step_seed, update

QUESTIONS = (
    ["What is 12 + 34?", "What is 7 + 58?"],
    ["What is 40 + 41?", "What is 3 + 9?"],
)  # rank 0's, rank 1's: different rows per process
GROUP, NEW_TOKENS = 2, 6


def config(model_dir: str, dtype: str, out: Path, full_finetune: bool = False) -> RunConfig:
    return RunConfig(
        model=model_dir, dtype=dtype, lora_rank=4, lora_alpha=8.0, seed=0, group_size=GROUP,
        max_new_tokens=NEW_TOKENS, micro_batch_size=2, logprob_chunk_tokens=3, grad_clip=None, lr=1e-2,
        steps=3, warmup_ratio=0.0, output_dir=str(out), full_finetune=full_finetune,
    )  # fmt: skip


def load(cfg: RunConfig):
    """``load_model`` with LoRA's B drawn at random (PEFT starts it at 0, where every A has a zero gradient)."""
    model = load_model(cfg)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=generator, dtype=torch.float64))
    return model


def shard(accelerator: Accelerator, model, master_fp32: bool = False):
    """``model`` prepared as ``accelerator.prepare`` does under ``scaledrun/accelerate/fsdp.yaml``, after
    the trainer's ``fsdp2_bf16_params`` (bfloat16 unshards for ``master_fp32`` runs)."""
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap", reshard_after_forward=True,
        cpu_ram_efficient_loading=False, state_dict_type="FULL_STATE_DICT",
    )  # fmt: skip
    prep = SimpleNamespace(
        state=SimpleNamespace(fsdp_plugin=plugin), mixed_precision="no", is_fsdp2=True,
        is_main_process=accelerator.is_main_process, device=accelerator.device,
    )  # fmt: skip
    fsdp2_bf16_params(prep, master_fp32)
    return fsdp2_prepare_model(prep, model)


class CountAllGathers:
    """Counts the outermost calls of the all-gather collectives FSDP2 issues (they run as usual)."""

    NAMES = ("all_gather_single", "all_gather_into_tensor")

    def __init__(self) -> None:
        self.calls, self.depth, self.saved = 0, 0, {}

    def __enter__(self):
        for name in self.NAMES:
            real = getattr(dist, name, None)
            if real is None:
                continue
            self.saved[name] = real

            def wrapper(*args, _real=real, **kwargs):
                self.calls += self.depth == 0
                self.depth += 1
                try:
                    return _real(*args, **kwargs)
                finally:
                    self.depth -= 1

            setattr(dist, name, wrapper)
        return self

    def __exit__(self, *exc) -> None:
        for name, real in self.saved.items():
            setattr(dist, name, real)


def full(tensors: dict) -> dict:
    """Full CPU tensors (DTensor shards gathered: every process calls it, in the same order)."""
    return {
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().clone()
        for k, v in tensors.items()
    }


def rollouts(cfg: RunConfig, accelerator, model, tokenizer, *, do_sample: bool):
    rank = accelerator.process_index
    prompts = [format_prompt(tokenizer, q) for q in QUESTIONS[rank]]
    with full_params(accelerator, model):
        batch, _ = generate_rollouts(
            accelerator.unwrap_model(model), tokenizer, prompts, ["0"] * len(prompts),
            [2 * rank + k for k in range(len(prompts))], num_generations=GROUP, max_new_tokens=NEW_TOKENS,
            temperature=cfg.temperature, top_p=1.0, do_sample=do_sample, chunk_tokens=cfg.logprob_chunk_tokens,
            backend=HFBackend(accelerator.unwrap_model(model), cfg.generation_batch_size),
        )  # fmt: skip
    # advantages that do not sum to 0 in a group: a confident model samples a group's rows alike, and
    # group-relative advantages would then cancel the gradient exactly
    generator = torch.Generator().manual_seed(7 + rank)
    batch.rewards = torch.rand(len(batch), generator=generator, dtype=torch.float64).to(batch.old_logp.dtype)
    batch.advantages = batch.rewards - 0.25
    return batch


def train_step(cfg, accelerator, model, optimizer, scheduler, tokenizer, step: int, first_grads=None) -> None:
    """One trainer step: sampled rollouts inside ``full_params``, then ``update`` (as ``train._train``)."""
    seed = step_seed(cfg.seed, step, accelerator.process_index)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed + 1)
    batch = rollouts(cfg, accelerator, model, tokenizer, do_sample=True)
    with compute_precision(cfg, accelerator.device):
        update(
            cfg, accelerator, model, optimizer, batch, batch.advantages, generator, first_grads=first_grads,
            measure=False,
        )  # fmt: skip
    scheduler.step()


def run(accelerator: Accelerator, out: Path, name: str, spec: str) -> None:
    model_dir, dtype, *rest = spec.split(":")
    if "full" in rest:
        run_full(accelerator, out, name, model_dir, dtype)
        return
    cfg = config(model_dir, dtype, out / name)
    tokenizer = load_tokenizer(cfg)
    rank = accelerator.process_index
    res: dict = {}

    ref = load(cfg)
    ref_opt, ref_sched = build_optimizer(cfg, ref)
    ref, ref_opt = accelerator.prepare(ref, ref_opt)  # DDP: the unsharded reference
    model = shard(accelerator, load(cfg))
    optimizer, scheduler = build_optimizer(cfg, model)
    unwrapped = accelerator.unwrap_model(model)
    res["tied"] = unwrapped.get_output_embeddings().weight is unwrapped.get_input_embeddings().weight
    res["units"] = len({m._get_fsdp_state() for m in model.modules() if isinstance(m, FSDPModule)})

    # 1. greedy generation through the backend, sharded (all-gathers counted) and unsharded
    prompts = [format_prompt(tokenizer, q) for q in QUESTIONS[rank]]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    stop = stop_token_ids(unwrapped, tokenizer)
    sampling = Sampling(
        max_new_tokens=NEW_TOKENS, do_sample=False, stop_ids=tuple(stop), pad_id=tokenizer.pad_token_id
    )
    with CountAllGathers() as count, full_params(accelerator, model):
        res["greedy"] = HFBackend(unwrapped).generate(
            enc["input_ids"], enc["attention_mask"], num_generations=1, sampling=sampling
        )
    res["all_gathers"] = count.calls
    res["pad_id"] = tokenizer.pad_token_id
    res["greedy_ref"] = HFBackend(accelerator.unwrap_model(ref)).generate(
        enc["input_ids"], enc["attention_mask"], num_generations=1, sampling=sampling
    )

    # 2. sampled rollouts scored by the trainer, then one update: the first step's gradients and weights
    for key, m, opt in (("", model, optimizer), ("_ref", ref, ref_opt)):
        torch.manual_seed(step_seed(cfg.seed, 1, rank))
        batch = rollouts(cfg, accelerator, m, tokenizer, do_sample=True)
        res["old_logp" + key] = batch.old_logp.detach().cpu()
        res["completions" + key] = batch.completion_ids.cpu()
        grads: dict = {}
        with compute_precision(cfg, accelerator.device):
            update(
                cfg, accelerator, m, opt, batch, batch.advantages, torch.Generator().manual_seed(1),
                first_grads=grads, measure=False,
            )  # fmt: skip
        res["grads" + key] = full(grads)
        res["weights" + key] = trainable_state_dict(accelerator, m)
    del ref, ref_opt, ref_sched

    # 3. a checkpoint after step 2 of 3 and a resume from it, against the uninterrupted run
    if "resume" in rest:
        model = shard(accelerator, load(cfg))
        optimizer, scheduler = build_optimizer(cfg, model)
        for step in (1, 2, 3):
            train_step(cfg, accelerator, model, optimizer, scheduler, tokenizer, step)
            if step == 2:
                ckpt = save_checkpoint(accelerator, model, optimizer, scheduler, step, out / name / "run")
        res["final_a"] = trainable_state_dict(accelerator, model)
        model = shard(accelerator, load(cfg))
        optimizer, scheduler = build_optimizer(cfg, model)
        start, _, _ = load_checkpoint(accelerator, model, optimizer, scheduler, ckpt)
        train_step(cfg, accelerator, model, optimizer, scheduler, tokenizer, start + 1)
        res["final_b"] = trainable_state_dict(accelerator, model)
    torch.save(res, out / f"{name}_rank{rank}.pt")


def _params(model) -> list:
    return list({id(p): p for p in model.parameters()}.values())  # a tied weight once


def run_full(accelerator: Accelerator, out: Path, name: str, model_dir: str, dtype: str) -> None:
    """Full fine-tuning in bfloat16 (fp32 masters) under FSDP2 against an unsharded bf16 copy (see the top)."""
    cfg = config(model_dir, dtype, out / name, full_finetune=True)
    tokenizer = load_tokenizer(cfg)
    rank = accelerator.process_index
    res: dict = {}

    masters = load(cfg)
    assert {p.dtype for p in masters.parameters()} == {torch.float32}, "master_fp32 loads float32"
    ref = load(cfg)  # the bf16 copy of the parameters FSDP2's unshard computes with; buffers stay as they
    for p in ref.parameters():  # are (``.to(bfloat16)`` would round the rotary inv_freq too, FSDP2 does not)
        p.data = p.data.to(torch.bfloat16)
    ref_opt, _ = build_optimizer(cfg, ref)
    res["ref_params"] = sum(p.numel() for p in _params(ref))
    model = shard(accelerator, masters, master_fp32=True)
    optimizer, _ = build_optimizer(cfg, model)
    unwrapped = accelerator.unwrap_model(model)
    res["tied"] = unwrapped.get_output_embeddings().weight is unwrapped.get_input_embeddings().weight

    # 1. one greedy generate call: the bytes the model's parameters hold at each forward inside it
    prompts = [format_prompt(tokenizer, q) for q in QUESTIONS[rank]]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    sampling = Sampling(
        max_new_tokens=NEW_TOKENS, do_sample=False, stop_ids=tuple(stop_token_ids(unwrapped, tokenizer)),
        pad_id=tokenizer.pad_token_id,
    )  # fmt: skip
    seen: list[tuple[int, int, tuple[str, ...]]] = []

    def record(*_):
        ps = _params(unwrapped)
        seen.append(
            (
                sum(p.numel() * p.element_size() for p in ps),
                sum(p.numel() for p in ps),
                tuple(sorted({str(p.dtype) for p in ps})),
            )
        )

    hook = unwrapped.get_output_embeddings().register_forward_pre_hook(record)
    with compute_precision(cfg, accelerator.device), full_params(accelerator, model):
        res["greedy"] = HFBackend(unwrapped).generate(
            enc["input_ids"], enc["attention_mask"], num_generations=1, sampling=sampling
        )
    hook.remove()
    res["gen_bytes"], res["gen_params"], res["gen_dtypes"] = zip(*seen, strict=True)
    with compute_precision(cfg, accelerator.device):
        res["greedy_ref"] = HFBackend(ref).generate(
            enc["input_ids"], enc["attention_mask"], num_generations=1, sampling=sampling
        )
    res["pad_id"] = tokenizer.pad_token_id

    # 2. the same sampled batch, one update each; the reference's bf16 micro-batch gradients summed in fp32
    acc = {n: torch.zeros(p.shape, dtype=torch.float32) for n, p in ref.named_parameters()}
    absacc = {n: torch.zeros(p.shape, dtype=torch.float32) for n, p in ref.named_parameters()}
    first: dict = {}

    def add(g, n):
        acc[n] += g.float()
        absacc[n] += g.float().abs()
        return g

    hooks = [p.register_hook(lambda g, n=n: add(g, n)) for n, p in ref.named_parameters()]

    def snapshot(*_):
        if not first:
            first.update({n: (acc[n].clone(), absacc[n].clone()) for n in acc})

    hooks.append(ref_opt.register_step_pre_hook(snapshot))
    torch.manual_seed(step_seed(cfg.seed, 1, rank))
    batch = rollouts(cfg, accelerator, model, tokenizer, do_sample=True)
    grads: dict = {}
    with compute_precision(cfg, accelerator.device):
        update(
            cfg, accelerator, model, optimizer, batch, batch.advantages, torch.Generator().manual_seed(1),
            first_grads=grads, measure=False,
        )  # fmt: skip
        update(
            cfg, accelerator, ref, ref_opt, batch, batch.advantages, torch.Generator().manual_seed(1),
            measure=False,
        )  # fmt: skip
    for h in hooks:
        h.remove()
    res["grads"] = full(grads)
    res["grads_ref"], res["grads_gross"] = {}, {}
    for n, (g, a) in first.items():
        both = torch.stack([g, a])
        dist.all_reduce(both)  # float32 sums over the 2 processes
        res["grads_ref"][n], res["grads_gross"][n] = both[0] / 2, both[1] / 2
    res["master_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    torch.save(res, out / f"{name}_rank{rank}.pt")


def main(out: str, *specs: str) -> None:
    accelerator = Accelerator(cpu=True)
    for spec in specs:
        name, model_spec = spec.split("=", 1)
        run(accelerator, Path(out), name, model_spec)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main(*sys.argv[1:])
