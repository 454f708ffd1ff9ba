"""Rollout backends: where completions are sampled. The trainer scores them itself, whatever the backend.

A backend turns left-padded prompt ids into G sampled completions per prompt. It only samples: the old
(and reference) log-probs come from the trainer's own scoring pass (``rollout.score_completions``), so
the ratio π_θ / π_old is exact whichever engine sampled, as long as it sampled from softmax(logits / T)
with the run's top-p and the current weights (``sync_weights`` after every update).

- ``HFBackend``: transformers' ``generate`` on the training model itself (unwrapped; under ZeRO-3/FSDP the
  trainer gathers the parameters around the call), ``batch_size`` rows per call (``generation_batch_size``:
  256 rows × 4,096 tokens at 8B would need ~160 GB of KV cache in one call).
- ``rollout_merge`` (``merged_adapter``): the LoRA adapter merged into the base weights for the
  ``generate`` call (one matmul per layer instead of three: about half the kernel launches of a decode
  step), and the base restored **bit-exactly** after it: the exact base tensors of every merged layer are
  saved before merging and copied back, never unmerged by arithmetic (merge + unmerge in bf16 drifts).
  The reference policy (adapter disabled) is therefore always the base. Inside the trainer's
  ``full_params`` (ZeRO-3/FSDP gather), since the trainer calls the backend there.
- ``generation_cache="static"``: transformers' static KV cache, ``max_cache_len`` = prompt + new tokens
  rounded up to ``CACHE_LEN_MULTIPLE``, every call (the last chunk and evaluation too) padded with dummy
  rows to ``batch_size`` rows (dropped after), so a compiled decode sees the same shapes and compiles
  once per cache length; ``compile_decode`` compiles the decode step (transformers' ``CompileConfig``,
  CUDA graphs), on a CUDA/XPU device only (refused on CPU, where transformers does not compile it).
- ``PagedBackend`` (``rollout_backend: paged``): transformers' continuous batching
  (``generate_batch``: a paged KV cache, the G samples of one prompt forked from its prefix), on the
  same model, LoRA layers included.
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

import contextlib
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
        else {
            "do_sample": False,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": None,
        }  # greedy: no top-k to warn about
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


#: The static cache's length is prompt + new tokens rounded up to a multiple of this: transformers keeps
#: the longest length seen (``_previous_max_cache_length``), so a compiled decode recompiles only when a
#: step's prompts are longer than every earlier step's by more than the rounding.
CACHE_LEN_MULTIPLE = 64
#: ``generation_cache`` values.
CACHES = ("dynamic", "static")


def _lora_layers(model: Any) -> list[Any]:
    """PEFT's LoRA layers of ``model`` (empty when it has no adapter)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # pragma: no cover - peft is a dependency
        return []
    return [m for m in model.modules() if isinstance(m, LoraLayer)]


@contextmanager
def merged_adapter(model: Any) -> Iterator[None]:
    """Inside, the active LoRA adapter is merged into the base weights; after, the base is bit-identical.

    The base layer's own parameters (weight, bias) of every LoRA layer are cloned before ``merge`` and
    copied back after, and PEFT's bookkeeping (``merged_adapters``) is reset: nothing relies on unmerge
    arithmetic, which in bf16 does not give the base back. The delta is computed in the weights' own
    dtype with autocast off (a bf16 autocast would round the fp32 master weights' delta to bf16).
    Costs one copy of every adapted base weight for the duration (all linear layers of an 8B: ~15 GB
    in bf16). Raises if the model has no LoRA layer (``rollout_merge`` with ``full_finetune``).
    """
    layers = _lora_layers(model)
    if not layers:
        raise ValueError(
            "config field `rollout_merge`=True: the model has no LoRA adapter to merge (full_finetune "
            "trains the weights themselves); set rollout_merge false"
        )
    saved: list[tuple[Any, dict[str, Tensor]]] = []
    try:
        with torch.no_grad():
            for layer in layers:
                if layer.merged:
                    raise RuntimeError(f"LoRA layer {type(layer).__name__} is already merged: nested merge")
                base = layer.get_base_layer()
                saved.append(
                    (layer, {n: p.detach().clone() for n, p in base.named_parameters(recurse=False)})
                )
            devices = {p.device.type for _, ps in saved for p in ps.values()}
            with contextlib.ExitStack() as stack:
                for kind in devices:
                    stack.enter_context(torch.autocast(kind, enabled=False))
                for layer, _ in saved:
                    layer.merge()
        yield
    finally:
        with torch.no_grad():
            for layer, params in saved:
                base = layer.get_base_layer()
                for name, p in base.named_parameters(recurse=False):
                    p.data.copy_(params[name])
                layer.merged_adapters.clear()


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


class HFBackend:
    """transformers' ``generate`` on the training model, ``batch_size`` rows per call (None: all at once).

    ``merge``: the LoRA adapter merged for the call (``merged_adapter``). ``cache``: ``dynamic`` or
    ``static`` (rows padded to ``batch_size`` per call, see the module docstring). ``compile_decode``:
    compile the static cache's decode step (CUDA/XPU only).
    """

    name = "hf"

    def __init__(
        self,
        model: Any,
        batch_size: int | None = None,
        *,
        merge: bool = False,
        cache: str = "dynamic",
        compile_decode: bool = False,
    ) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"generation_batch_size must be ≥ 1 (or None), got {batch_size}")
        if cache not in CACHES:
            raise ValueError(
                f"config field `generation_cache`={cache!r}: unknown value; valid: {', '.join(CACHES)}"
            )
        if compile_decode and cache != "static":
            raise ValueError(
                "config field `compile_decode`=True: needs generation_cache static (a dynamic cache changes "
                "shape every step and cannot be compiled once)"
            )
        if compile_decode and _device(model).type not in ("cuda", "xpu"):
            raise ValueError(
                f"config field `compile_decode`=True: the model is on {_device(model).type}; transformers "
                "compiles the decode step on a CUDA or XPU device only (on CPU it would silently run eager); "
                "set compile_decode false"
            )
        if merge and not _lora_layers(model):
            raise ValueError(
                "config field `rollout_merge`=True: the model has no LoRA adapter to merge; set it false"
            )
        self.model, self.batch_size = model, batch_size
        self.merge, self.cache, self.compile_decode = merge, cache, compile_decode

    def _config(self, sampling: Sampling, prompt_len: int) -> Any:
        config = generation_config(sampling)
        if self.cache == "static":
            from transformers import CompileConfig

            need = prompt_len + sampling.max_new_tokens
            config.cache_implementation = "static"
            config.max_cache_len = -(-need // CACHE_LEN_MULTIPLE) * CACHE_LEN_MULTIPLE
            # transformers compiles a static cache's decode by itself on a GPU: only when asked
            config.disable_compile = not self.compile_decode
            if self.compile_decode:
                config.compile_config = CompileConfig(fullgraph=True, mode="reduce-overhead")
        return config

    @torch.no_grad()
    def generate(
        self, prompt_ids: Tensor, prompt_mask: Tensor, *, num_generations: int, sampling: Sampling
    ) -> Tensor:
        ids = prompt_ids.repeat_interleave(num_generations, 0)
        am = prompt_mask.repeat_interleave(num_generations, 0)
        rows = ids.shape[0]
        step = self.batch_size or rows
        config = self._config(sampling, ids.shape[1])
        parts = []
        merged = merged_adapter(self.model) if self.merge else contextlib.nullcontext()
        with clean_generation_config(self.model, sampling), merged:
            for s in range(0, rows, step):
                chunk_ids, chunk_am = ids[s : s + step], am[s : s + step]
                n = chunk_ids.shape[0]
                if self.cache == "static" and n < step:
                    # dummy rows (copies of the chunk's last row) so every call has ``step`` rows; dropped
                    chunk_ids = torch.cat([chunk_ids, chunk_ids[-1:].expand(step - n, -1)], 0)
                    chunk_am = torch.cat([chunk_am, chunk_am[-1:].expand(step - n, -1)], 0)
                out = self.model.generate(
                    input_ids=chunk_ids, attention_mask=chunk_am, generation_config=config
                )
                parts.append(out[:n, ids.shape[1] :])
        return _pad_cat(parts, sampling.pad_id)

    def sync_weights(self, model: Any) -> None:
        """Nothing to do: it samples from the training model itself."""


def _pad_cat(parts: list[Tensor], pad_id: int) -> Tensor:
    """Row-wise concatenation, each part right-padded with ``pad_id`` to the widest."""
    width = max(p.shape[1] for p in parts)  # a chunk whose rows all stopped early is narrower
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1]), value=pad_id) for p in parts], 0)


#: Tokens per page of the paged KV cache.
PAGE_SIZE = 32


class PagedBackend:
    """transformers' continuous batching (``generate_batch``) on the training model: a paged KV cache
    sized for the call's rows, the G samples of a prompt forked from it (``num_return_sequences``),
    at most ``batch_size`` requests per forward pass (None: all). Sampling settings: temperature and
    top-p only (the run's), an unsupported logits processor is an error, not dropped; the sampler's
    seed is drawn from torch's global generator, so a seeded run is reproducible (its per-process
    offset is the data-parallel rank), and that generator is left as one draw advanced it."""

    name = "paged"

    def __init__(self, model: Any, batch_size: int | None = None, *, merge: bool = False, **_: Any) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"generation_batch_size must be ≥ 1 (or None), got {batch_size}")
        hf = _hf_model(model)
        if not callable(getattr(hf, "generate_batch", None)):
            raise ValueError(
                f"config field `rollout_backend`='paged': {type(hf).__name__} has no generate_batch "
                "(transformers' continuous batching, transformers ≥ 5)"
            )
        if merge and not _lora_layers(model):
            raise ValueError(
                "config field `rollout_merge`=True: the model has no LoRA adapter to merge; set it false"
            )
        self.model, self.batch_size, self.merge = model, batch_size, merge

    @torch.no_grad()
    def generate(
        self, prompt_ids: Tensor, prompt_mask: Tensor, *, num_generations: int, sampling: Sampling
    ) -> Tensor:
        from transformers import ContinuousBatchingConfig

        inputs = [row[m.bool()].tolist() for row, m in zip(prompt_ids, prompt_mask, strict=True)]
        rows = len(inputs) * num_generations
        config = generation_config(sampling)
        config.num_return_sequences = num_generations
        # the cache sized for this call's rows (each row's prompt + new tokens): left to transformers it is
        # sized from free memory, which on a CPU took 11.6 GB and 13 s for 9 tiny-model requests (2026-11-28)
        pages = -(-(max(map(len, inputs)) + sampling.max_new_tokens) // PAGE_SIZE)
        cb = ContinuousBatchingConfig(
            page_size=PAGE_SIZE, num_blocks=rows * pages + 1, max_requests_per_batch=self.batch_size or rows,
            max_batch_tokens=max(sum(map(len, inputs)), rows), drop_unsupported_processors=False,
            seed=int(torch.randint(2**31 - 1, ())),
        )  # fmt: skip
        hf = _hf_model(self.model)
        attn = hf.config._attn_implementation
        merged = merged_adapter(self.model) if self.merge else contextlib.nullcontext()
        try:
            # generate_batch reseeds torch's global generator (``torch.manual_seed(seed + dp_rank)``): forked,
            # so the caller's random stream only loses the one draw of ``seed`` above
            device = _device(self.model)
            forked = torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])
            with clean_generation_config(self.model, sampling), merged, forked:
                out = hf.generate_batch(
                    inputs, generation_config=config, continuous_batching_config=cb, warmup=False
                )
        finally:
            if (
                hf.config._attn_implementation != attn
            ):  # continuous batching may switch it; the trainer's back
                hf.set_attn_implementation(attn)
        # generate_batch logs failures and returns what finished: every request must be there, error-free
        order = [
            key
            for i in range(len(inputs))
            for key in [f"req_{i}", *(f"req_{i}__child#{c}" for c in range(num_generations - 1))]
        ]
        missing = [k for k in order if k not in out or out[k].error is not None]
        if missing:
            errors = {k: (out[k].error if k in out else "no result") for k in missing}
            raise RuntimeError(
                f"continuous batching (generate_batch) failed for {len(missing)} rows: {errors}"
            )
        parts = [torch.tensor([out[k].generated_tokens], dtype=prompt_ids.dtype) for k in order]
        return _pad_cat(parts, sampling.pad_id).to(prompt_ids.device)

    def sync_weights(self, model: Any) -> None:
        """Nothing to do: it samples from the training model itself."""


#: ``rollout_backend`` names.
BACKENDS = {"hf": HFBackend, "paged": PagedBackend}


def make_backend(
    name: str,
    model: Any,
    batch_size: int | None = None,
    *,
    merge: bool = False,
    cache: str = "dynamic",
    compile_decode: bool = False,
) -> RolloutBackend:
    """The ``rollout_backend`` named ``name`` on ``model`` (``rollout_merge``, ``generation_cache``,
    ``compile_decode``: ``HFBackend``; the paged backend takes ``merge`` and refuses the others)."""
    if name not in BACKENDS:
        raise ValueError(f"config field `rollout_backend`={name!r}: unknown; valid: {', '.join(BACKENDS)}")
    if name == "paged" and (cache != "dynamic" or compile_decode):
        raise ValueError(
            "config field `generation_cache`/`compile_decode`: the paged backend has its own paged cache; "
            "leave generation_cache dynamic and compile_decode false with rollout_backend paged"
        )
    return BACKENDS[name](model, batch_size, merge=merge, cache=cache, compile_decode=compile_decode)


def run_backend(cfg: Any, model: Any) -> RolloutBackend:
    """The run's rollout backend (``make_backend`` with the config's ``rollout_backend``,
    ``generation_batch_size``, ``rollout_merge``, ``generation_cache`` and ``compile_decode``): the one
    the trainer's rollouts and its evaluation both use."""
    return make_backend(
        cfg.rollout_backend, model, cfg.generation_batch_size, merge=cfg.rollout_merge,
        cache=cfg.generation_cache, compile_decode=cfg.compile_decode,
    )  # fmt: skip
