"""Rollout backends: where completions are sampled. The trainer scores them itself, whatever the backend.

A backend turns left-padded prompt ids into G sampled completions per prompt. It only samples: the old
(and reference) log-probs come from the trainer's own scoring pass (``rollout.score_completions``), so
the ratio π_θ / π_old is exact whichever engine sampled, as long as it sampled from softmax(logits / T)
with the run's top-p and the current weights (``sync_weights`` after every update).

- ``HFBackend``: transformers' ``generate`` on the training model itself (unwrapped; under ZeRO-3/FSDP the
  trainer gathers the parameters around the call), ``batch_size`` rows per call (``generation_batch_size``:
  256 rows × 4,096 tokens at 8B would need ~160 GB of KV cache in one call).
- **The sampling is the run's, and only the run's.** A model folder's ``generation_config.json`` may
  carry sampling settings (``repetition_penalty``, ``no_repeat_ngram_size``, ``min_p``, ``top_k``, ...),
  and ``generate`` fills every setting a call leaves unset from it, even when the call passes its own
  ``GenerationConfig``. That would make π_old a policy other than softmax(logits / T), silently. So for
  the duration of the call the model's generation config is replaced by a clean one that carries only
  the stop and pad ids, and the call passes every sampling setting explicitly (``generation_config``).
- **Stop tokens** (``stop_token_ids``): the tokenizer's EOS ∪ the model's generation-config EOS ids ∪ the
  chat template's end-of-turn token (``<|im_end|>`` for Qwen's ChatML) when the template writes it.
  Qwen instruct checkpoints name ``<|im_end|>`` and ``<|endoftext|>`` in different places; stopping at
  only one of them lets a completion run past the end of its turn.

A vLLM backend (not built: it needs a GPU to build and to measure, and this project has none) would
plug in here: a colocated ``vllm.LLM`` in the same process (``gpu_memory_utilization`` shared with
training), ``generate`` with ``SamplingParams(n=G, temperature=T, top_p=p, max_tokens=...,
stop_token_ids=stop_token_ids(...))``, and ``sync_weights`` loading the policy's (merged LoRA) weights
into the engine after each optimizer step (as TRL's ``vllm_mode="colocate"`` and verl's hybrid engine
do). Because the trainer recomputes π_old itself, vLLM's own log-probs (and its numerical differences
from the training forward pass) never enter the ratio. See docs/rollout-backends.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

#: End-of-turn tokens of the chat templates the trainer knows (ChatML: Qwen, and the tiny model's).
END_OF_TURN_TOKENS = ("<|im_end|>",)


@dataclass(frozen=True)
class Sampling:
    """What one ``generate`` call samples: the run's settings, nothing from the model's files."""

    max_new_tokens: int
    do_sample: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    stop_ids: tuple[int, ...] = ()
    pad_id: int = 0


class RolloutBackend(Protocol):
    """Samples completions; the trainer scores them (``rollout.score_completions``)."""

    name: str

    def generate(
        self, prompt_ids: Tensor, prompt_mask: Tensor, *, num_generations: int, sampling: Sampling
    ) -> Tensor:
        """(B, P) left-padded prompts -> (B·G, T) completion ids, prompt-major (G rows per prompt in turn)."""
        ...

    def sync_weights(self, model: Any) -> None:
        """Called after every update: make the engine sample from ``model``'s current weights."""
        ...


def _hf_model(model: Any) -> Any:
    """The transformers model under PEFT (whose ``generation_config`` ``generate`` reads)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """Tokenizer EOS ∪ generation-config EOS ∪ the chat template's end-of-turn token, in that order."""
    ids: list[int] = []

    def add(value: Any) -> None:
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None and int(v) not in ids:
                ids.append(int(v))

    add(tokenizer.eos_token_id)
    add(getattr(getattr(_hf_model(model), "generation_config", None), "eos_token_id", None))
    template = getattr(tokenizer, "chat_template", None) or ""
    vocab = tokenizer.get_vocab()
    for token in END_OF_TURN_TOKENS:
        if token in template and token in vocab:
            add(vocab[token])
    if not ids:
        raise ValueError(
            "the tokenizer, the generation config and the chat template define no end token: generation "
            "cannot stop (set the tokenizer's eos_token)"
        )
    return ids


def generation_config(sampling: Sampling) -> Any:
    """The ``GenerationConfig`` of one call: every sampling setting explicit and neutral unless asked."""
    from transformers import GenerationConfig

    neutral = dict(
        repetition_penalty=1.0, no_repeat_ngram_size=0, encoder_repetition_penalty=1.0, length_penalty=1.0,
        min_p=None, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0, min_length=0, min_new_tokens=None,
        bad_words_ids=None, suppress_tokens=None, begin_suppress_tokens=None, sequence_bias=None,
        forced_bos_token_id=None, forced_eos_token_id=None, num_beams=1, renormalize_logits=False,
        stop_strings=None, guidance_scale=None, exponential_decay_length_penalty=None,
    )  # fmt: skip
    sample = (
        {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0}
        if sampling.do_sample
        else {"do_sample": False, "temperature": 1.0, "top_p": 1.0, "top_k": 0}
    )
    return GenerationConfig(
        max_new_tokens=sampling.max_new_tokens, eos_token_id=list(sampling.stop_ids),
        pad_token_id=sampling.pad_id, use_cache=True, **sample, **neutral,
    )  # fmt: skip


@contextmanager
def clean_generation_config(model: Any, sampling: Sampling) -> Iterator[None]:
    """Inside, the model's own ``generation_config`` carries only the stop and pad ids (restored after)."""
    from transformers import GenerationConfig

    hf = _hf_model(model)
    saved = hf.generation_config
    hf.generation_config = GenerationConfig(
        eos_token_id=list(sampling.stop_ids), pad_token_id=sampling.pad_id
    )
    try:
        yield
    finally:
        hf.generation_config = saved


class HFBackend:
    """transformers' ``generate`` on the training model, ``batch_size`` rows per call (None: all at once)."""

    name = "hf"

    def __init__(self, model: Any, batch_size: int | None = None) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"generation_batch_size must be ≥ 1 (or None), got {batch_size}")
        self.model, self.batch_size = model, batch_size

    @torch.no_grad()
    def generate(
        self, prompt_ids: Tensor, prompt_mask: Tensor, *, num_generations: int, sampling: Sampling
    ) -> Tensor:
        ids = prompt_ids.repeat_interleave(num_generations, 0)
        am = prompt_mask.repeat_interleave(num_generations, 0)
        step = self.batch_size or ids.shape[0]
        config = generation_config(sampling)
        parts = []
        with clean_generation_config(self.model, sampling):
            for s in range(0, ids.shape[0], step):
                out = self.model.generate(
                    input_ids=ids[s : s + step], attention_mask=am[s : s + step], generation_config=config
                )
                parts.append(out[:, ids.shape[1] :])
        width = max(p.shape[1] for p in parts)  # a chunk whose rows all stopped early is narrower
        return torch.cat(
            [torch.nn.functional.pad(p, (0, width - p.shape[1]), value=sampling.pad_id) for p in parts], 0
        )

    def sync_weights(self, model: Any) -> None:
        """Nothing to do: it samples from the training model itself."""


#: ``rollout_backend`` names.
BACKENDS = {"hf": HFBackend}


def make_backend(name: str, model: Any, batch_size: int | None = None) -> RolloutBackend:
    if name not in BACKENDS:
        raise ValueError(f"config field `rollout_backend`={name!r}: unknown; valid: {', '.join(BACKENDS)}")
    return BACKENDS[name](model, batch_size)
