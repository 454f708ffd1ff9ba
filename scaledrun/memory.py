"""GPU memory per process of every preset, from the models' published shapes: ``python -m scaledrun.memory``.

An estimate from first principles, not a measurement (no GPU ran it). For each preset (``config.PRESETS``)
at its documented launch (``LAUNCHES``: the Accelerate config and the number of processes), in bytes
per GPU:

- **state**: the weights that stay resident. LoRA: the frozen base at the preset's ``dtype`` (2 B for
  bf16), plus the fp32 adapter with its fp32 gradient and AdamW's two fp32 moments (16 B per LoRA
  parameter). Full fine-tuning: fp32 master weights, fp32 gradients, AdamW's two moments (16 B per
  parameter). Divided by the number of processes under FSDP / ZeRO-3 (not under DDP);
- **gen. weights**: under FSDP / ZeRO-3 generation runs with the whole model gathered on every GPU
  (``distributed.full_params``), at the dtype the gather produces (``gathered_bytes``): the base's dtype
  under LoRA; under full fine-tuning in bfloat16 (fp32 masters, ``model.master_fp32``) bf16 under FSDP2,
  whose unshard the trainer sets to bf16 (``distributed.fsdp2_bf16_params``), and the fp32 masters
  themselves under ZeRO-3; 0 under DDP (the weights are already whole);
- **KV cache**: ``layers × kv_heads × head_dim × 2 (K and V) × 2 B`` per token, for
  ``generation_batch_size`` rows (None: all ``prompts_per_step × group_size`` rows at once) of
  ``prompt + max_new_tokens`` tokens (prompt: ``max_prompt_length``, or ``ASSUMED_PROMPT_TOKENS`` when
  the preset sets none);
- **update**: one update pass of ``S`` token slots (``max_tokens_per_micro_batch``; else the rows of one
  micro-batch × (prompt + new tokens)). With gradient checkpointing: the checkpointed hidden state of
  every layer (``layers × S × hidden × 2 B``) plus one layer's activations, recomputed, and their
  gradients (2 × ``S × layer_token_bytes``); without it, every layer's activations. Under FSDP, two
  layers' parameters gathered (the current one and the prefetched one) at the gathered dtype;
- **scorer**: the LM-head chunks of ``scoring.completion_scores``, ``logprob_chunk_tokens × vocab × 4 B``
  for the logits and as much for their softmax;
- ``RESERVE_BYTES`` for the CUDA context, NCCL buffers and the allocator's slack.

The peak is state + max(gen. weights + KV cache, update + scorer) + reserve: generation and the update
run one after the other. ``smallest_launch`` finds the fewest FSDP processes (whole nodes) at which a
preset fits, with overrides such as a smaller ``generation_batch_size``. The old and reference scoring passes run in the update's micro-batch plan
without gradients (``rollout.score_completions``), so they hold less than an update pass.

``layer_token_bytes``, one decoder layer's saved activations per token (bf16, flash/SDPA attention: no
``seq²`` term; the count of "Reducing Activation Recomputation in Large Transformer Models",
arXiv:2205.05198, for Qwen's layer): 2 B × (6·hidden [the two RMSNorms' inputs and outputs, the two
residual sums] + 3·q [q, rotated q, attention output] + 3·kv [k, v, rotated k] + 4·intermediate [gate,
up, SiLU(gate), their product]) + 4 B × 2·hidden (the RMSNorms' fp32 upcasts), where q = heads ×
head_dim and kv = kv_heads × head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import PRESETS, RunConfig
from .model import master_fp32

GB = 1e9
#: The GPU every documented launch line targets.
GPU_BYTES = 80 * GB
#: CUDA context, NCCL buffers and allocator slack, per GPU.
RESERVE_BYTES = 3 * GB
#: The prompt length assumed for a preset without ``max_prompt_length`` (the short synthetic tasks).
ASSUMED_PROMPT_TOKENS = 512
DTYPE_BYTES = {"bfloat16": 2, "float32": 4, "float64": 8}


@dataclass(frozen=True)
class Shape:
    """A Qwen2/2.5/3 decoder's shape, as its ``config.json`` gives it."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool  # Qwen2 / Qwen2.5: biases on q, k, v
    qk_norm: bool  # Qwen3: RMSNorm on each head's q and k

    def layer_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = self.hidden * (q + 2 * kv) + q * self.hidden + (q + 2 * kv) * self.qkv_bias
        norms = 2 * self.hidden + 2 * self.head_dim * self.qk_norm
        return attn + 3 * self.hidden * self.intermediate + norms

    def params(self) -> int:
        """Every parameter: embedding (and the LM head unless tied), the layers, the final norm."""
        emb = self.vocab * self.hidden * (1 if self.tied else 2)
        return emb + self.layers * self.layer_params() + self.hidden

    def lora_params(self, rank: int, targets: list[str]) -> int:
        """LoRA parameters, r × (in + out) for each targeted linear of each layer."""
        q, kv, h, i = (
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.hidden,
            self.intermediate,
        )
        dims = {
            "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
        }  # fmt: skip
        return self.layers * sum(rank * sum(dims[t]) for t in targets)

    def kv_bytes_per_token(self) -> int:
        return self.layers * self.kv_heads * self.head_dim * 2 * 2

    def layer_token_bytes(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 2 * (6 * self.hidden + 3 * q + 3 * kv + 4 * self.intermediate) + 4 * 2 * self.hidden


def _qwen2(h: int, n: int, a: int, kv: int, i: int, v: int, tied: bool) -> Shape:
    return Shape(h, n, a, kv, h // a, i, v, tied, qkv_bias=True, qk_norm=False)


def _qwen3(h: int, n: int, a: int, kv: int, i: int, tied: bool) -> Shape:
    return Shape(h, n, a, kv, 128, i, 151936, tied, qkv_bias=False, qk_norm=True)


#: The published ``config.json`` of each preset's model (hidden_size, num_hidden_layers,
#: num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, tie_word_embeddings; Qwen3:
#: head_dim 128), written here so that nothing downloads. "tiny": ``scaledrun.tiny.MODEL_SHAPE`` at its
#: BPE's target vocabulary of 512 (an upper bound: the arithmetic task's tokenizer learns 282 tokens).
SHAPES: dict[str, Shape] = {
    "Qwen/Qwen2.5-0.5B-Instruct": _qwen2(896, 24, 14, 2, 4864, 151936, tied=True),
    "Qwen/Qwen2.5-1.5B-Instruct": _qwen2(1536, 28, 12, 2, 8960, 151936, tied=True),
    "Qwen/Qwen2.5-7B-Instruct": _qwen2(3584, 28, 28, 4, 18944, 152064, tied=False),
    "Qwen/Qwen2.5-Math-1.5B": _qwen2(1536, 28, 12, 2, 8960, 151936, tied=True),
    "Qwen/Qwen2.5-Math-7B": _qwen2(3584, 28, 28, 4, 18944, 152064, tied=False),
    "Qwen/Qwen3-0.6B": _qwen3(1024, 28, 16, 8, 3072, tied=True),
    "Qwen/Qwen3-1.7B": _qwen3(2048, 28, 16, 8, 6144, tied=True),
    "Qwen/Qwen3-4B": _qwen3(2560, 36, 32, 8, 9728, tied=True),
    "Qwen/Qwen3-8B": _qwen3(4096, 36, 32, 8, 12288, tied=False),
    "Qwen/Qwen3-32B": _qwen3(5120, 64, 64, 8, 25600, tied=False),
    "tiny": Shape(64, 2, 4, 2, 16, 128, 512, tied=True, qkv_bias=False, qk_norm=True),
}


@dataclass(frozen=True)
class Launch:
    """A preset's documented launch: the Accelerate config (``scaledrun/accelerate/<config>.yaml``) and
    the number of processes (one per GPU)."""

    config: str
    processes: int

    @property
    def sharded(self) -> bool:
        return self.config in ("fsdp", "zero3")


#: Each preset's launch line. The 7-8B presets: their comments in ``config.py`` and docs/trainer.md (8 × 80 GB,
#: DDP); ``dfpo_paper``: full fine-tuning of Qwen3-32B on one 8-GPU node under FSDP2; the small presets: DDP
#: (one GPU per process holds everything; the count does not change the per-GPU numbers).
LAUNCHES: dict[str, Launch] = {
    "tiny": Launch("ddp", 1),
    "dfpo_paper": Launch("fsdp", 8),
    "qwen2.5-math-7b": Launch("ddp", 8),
    "qwen3-8b": Launch("ddp", 8),
}


def launch_of(preset: str) -> Launch:
    return LAUNCHES.get(preset, Launch("ddp", 1))


def preset_config(preset: str, **overrides: Any) -> RunConfig:
    return RunConfig(**{"output_dir": "unused", **PRESETS[preset], **overrides})


def gathered_bytes(cfg: RunConfig, launch: Launch) -> int:
    """Bytes per parameter of the weights an FSDP / ZeRO-3 gather produces (generation, each layer's pass).

    LoRA: the base's dtype. Full fine-tuning in bfloat16 keeps fp32 masters (``model.master_fp32``):
    FSDP2 gathers them as bf16 (``distributed.fsdp2_bf16_params``), ZeRO-3 as they are (fp32).
    """
    if master_fp32(cfg):
        return 2 if launch.config == "fsdp" else 4
    return DTYPE_BYTES[cfg.dtype]


def preset_memory(
    preset: str, launch: Launch | None = None, gpu_bytes: float = GPU_BYTES, **overrides: Any
) -> dict[str, Any]:
    """The per-GPU bytes of ``preset`` at its launch (``LAUNCHES``, or ``launch``) with the config fields
    ``overrides``: each part, the peak, whether it fits ``gpu_bytes``."""
    cfg, launch = preset_config(preset, **overrides), launch or launch_of(preset)
    model = "tiny" if preset == "tiny" else cfg.model
    if model not in SHAPES:
        raise ValueError(
            f"preset {preset!r}: no published shape for {model!r} in scaledrun.memory.SHAPES: add it"
        )
    s = SHAPES[model]
    n = launch.processes if launch.sharded else 1
    gathered = gathered_bytes(cfg, launch)
    if cfg.full_finetune:
        state = 16 * s.params() / n
    else:
        state = DTYPE_BYTES[cfg.dtype] * s.params() / n + 16 * s.lora_params(
            cfg.lora_rank, cfg.lora_target_modules
        )
    gen_weights = gathered * s.params() if launch.sharded else 0
    prompt = cfg.max_prompt_length or ASSUMED_PROMPT_TOKENS
    seq = prompt + cfg.max_new_tokens
    rows = cfg.prompts_per_step * cfg.group_size
    kv = s.kv_bytes_per_token() * min(cfg.generation_batch_size or rows, rows) * seq
    if cfg.max_tokens_per_micro_batch:
        tokens = cfg.max_tokens_per_micro_batch
    else:
        tokens = (cfg.micro_batch_size or rows // cfg.num_minibatches) * seq
    layer = tokens * s.layer_token_bytes()
    if cfg.gradient_checkpointing:
        update = s.layers * tokens * s.hidden * 2 + 2 * layer
    else:
        update = s.layers * layer + layer
    if launch.sharded:
        update += 2 * s.layer_params() * gathered
    scorer = cfg.logprob_chunk_tokens * s.vocab * 4 * 2
    peak = state + max(gen_weights + kv, update + scorer) + RESERVE_BYTES
    return {
        "preset": preset, "model": model, "launch": launch, "params": s.params(), "state": state,
        "gen_weights": gen_weights, "kv_cache": kv, "update": update, "scorer": scorer, "peak": peak,
        "fits": peak <= gpu_bytes, "prompt": prompt, "tokens": tokens,
    }  # fmt: skip


def smallest_launch(
    preset: str, per_node: int = 8, max_processes: int = 1024, gpu_bytes: float = GPU_BYTES, **overrides: Any
) -> int | None:
    """The fewest FSDP processes, in whole nodes of ``per_node`` GPUs, at which ``preset`` (with the config
    fields ``overrides``) fits ``gpu_bytes`` per GPU; None up to ``max_processes``."""
    for n in range(per_node, max_processes + 1, per_node):
        if preset_memory(preset, Launch("fsdp", n), gpu_bytes, **overrides)["fits"]:
            return n
    return None


def table() -> str:
    """The markdown table of every preset (GB per GPU)."""
    head = (
        "| preset | model (params) | launch | state | gen. weights | KV cache | update | scorer | peak | "
        "fits 80 GB |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for name in PRESETS:
        m = preset_memory(name)
        la = m["launch"]
        parts = " | ".join(
            f"{m[k] / GB:.1f}" for k in ("state", "gen_weights", "kv_cache", "update", "scorer")
        )
        params = f"{m['params'] / 1e9:.2f} B" if m["params"] >= 1e8 else f"{m['params'] / 1e6:.2f} M"
        lines.append(
            f"| `{name}` | {m['model']} ({params}) | {la.config} × {la.processes} | {parts} | "
            f"{m['peak'] / GB:.1f} | {'yes' if m['fits'] else '**no**'} |"
        )
    return "\n".join(lines)


def main() -> None:
    print("GB per GPU (1 GB = 1e9 bytes); scaledrun/memory.py gives the formulas.")
    print(table())


if __name__ == "__main__":
    main()
