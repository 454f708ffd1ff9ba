"""Rollouts: G sampled completions per prompt, their masks and the old policy's log-probs.

A ``RolloutBatch`` holds one flat batch of completions in the shapes of docs/DESIGN.md: the prompt part of
``input_ids`` is left-padded to ``prompt_len`` columns, the completion part (the last T columns) is
right-padded; ``completion_mask``, ``old_logp`` (B, T) refer to the completion part only.

- ``generate_rollouts``: ``model.generate`` (sampling, KV cache, stop at EOS) under ``torch.no_grad``,
  then the completion mask (up to and including the first EOS) and the old log-probs from no-grad
  forward passes of the same policy, in the micro-batch plan the caller gives (the trainer's: the loss's
  passes, bounded by ``max_tokens_per_micro_batch``; the trainer applies its ``truncation`` policy afterwards);
- ``completion_logprobs``: log π of the completion tokens (float32 log_softmax of logits / T), optionally
  the policy's token entropy; the trainer's loss passes use the same function with dropout off
  (``dropout_off``), so the ratio is exactly 1 before the first update;
- ``dropout_off``: a context in which every ``torch.nn.Dropout`` of a model has p = 0 (train mode kept);

The sampling policy and the log-probs
-------------------------------------
Rollouts sample from softmax(logits / T) (``temperature``), truncated to the top-p nucleus. Old,
reference and current log-probs and the entropy are all taken from logits / T, so π_old is the policy
that sampled, as TRL and verl compute it; like them, the top-p truncation is ignored in the log-probs
(π_old renormalises over the whole vocabulary, not over the nucleus). Dropout (LoRA dropout) would make
two passes over the same tokens differ: the old pass runs in eval mode and every policy-gradient pass
runs under ``dropout_off``, so all of them compute the same deterministic function of the weights.
- ``concat_batches`` and ``RolloutBatch.select``: re-padding concatenation and row selection (the
  reward-balanced buffer needs both).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .backends import HFBackend, RolloutBackend, Sampling, stop_token_ids
from .scoring import at_least_float32, completion_scores, position_ids_from_mask

#: Positions per LM-head chunk when a caller does not say (the config's ``logprob_chunk_tokens`` default).
DEFAULT_CHUNK_TOKENS = 128


@dataclass
class RolloutBatch:
    """One batch of completions.

    Attributes:
        input_ids: (B, P + T) prompt (left-padded to P = ``prompt_len``) then completion (right-padded).
        attention_mask: (B, P + T) 1 on real prompt and completion tokens (through the first EOS).
        completion_mask: (B, T) float 1 on the tokens that take part in the loss (through the first EOS;
            the trainer zeroes a truncated completion's row under ``truncation: mask``).
        old_logp: (B, T) float32 log π_old of each completion token (0 on padding).
        group: (B,) int64 global prompt id of each completion.
        advantages: (B,) float32 group-relative advantages (filled by the trainer; zeros until then).
        rewards: (B,) float32 rewards (filled by the trainer; a truncated completion's is
            ``failure_reward`` under ``truncation: failure_reward``).
        truncated: (B,) bool, no EOS within max_new_tokens.
        ref_logp: (B, T) log π_ref (β > 0 only) or None.
        prompts, completions, answers: the texts, one per row.
    """

    input_ids: Tensor
    attention_mask: Tensor
    completion_mask: Tensor
    old_logp: Tensor
    group: Tensor
    advantages: Tensor
    rewards: Tensor
    truncated: Tensor
    ref_logp: Tensor | None
    prompts: list[str]
    completions: list[str]
    answers: list[str]

    @property
    def prompt_len(self) -> int:
        return self.input_ids.shape[1] - self.completion_mask.shape[1]

    @property
    def completion_ids(self) -> Tensor:
        """(B, T) the completion tokens."""
        return self.input_ids[:, self.prompt_len :]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, idx: Tensor) -> RolloutBatch:
        """The rows ``idx`` (int64 indices), in that order."""
        out: dict[str, Any] = {}
        rows = idx.tolist()
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                out[f.name] = v[idx.to(v.device)]
            elif isinstance(v, list):
                out[f.name] = [v[i] for i in rows]
            else:
                out[f.name] = v
        return RolloutBatch(**out)

    def to(self, device: torch.device | str) -> RolloutBatch:
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        return RolloutBatch(**{k: v.to(device) if isinstance(v, Tensor) else v for k, v in kw.items()})


def _pad_cols(x: Tensor, left: int, right: int, value: float) -> Tensor:
    return F.pad(x, (left, right), value=value) if left or right else x


def concat_batches(batches: list[RolloutBatch], pad_token_id: int) -> RolloutBatch:
    """Concatenate batches row-wise, re-padding prompts on the left and completions on the right."""
    if not batches:
        raise ValueError("concat_batches needs at least one batch")
    p = max(b.prompt_len for b in batches)
    t = max(b.completion_mask.shape[1] for b in batches)
    parts: dict[str, list[Any]] = {f.name: [] for f in fields(RolloutBatch)}
    for b in batches:
        lp, rt = p - b.prompt_len, t - b.completion_mask.shape[1]
        parts["input_ids"].append(
            _pad_cols(
                torch.cat(
                    [_pad_cols(b.input_ids[:, : b.prompt_len], lp, 0, pad_token_id), b.completion_ids], 1
                ),
                0,
                rt,
                pad_token_id,
            )
        )
        parts["attention_mask"].append(_pad_cols(b.attention_mask, lp, rt, 0))
        for name in ("completion_mask", "old_logp"):
            parts[name].append(_pad_cols(getattr(b, name), 0, rt, 0.0))
        parts["ref_logp"].append(None if b.ref_logp is None else _pad_cols(b.ref_logp, 0, rt, 0.0))
        for name in ("group", "advantages", "rewards", "truncated"):
            parts[name].append(getattr(b, name))
        for name in ("prompts", "completions", "answers"):
            parts[name].extend(getattr(b, name))
    out: dict[str, Any] = {}
    for k, v in parts.items():
        if k in ("prompts", "completions", "answers"):
            out[k] = v
        elif k == "ref_logp":
            out[k] = None if any(x is None for x in v) else torch.cat(v, 0)
        else:
            out[k] = torch.cat(v, 0)
    return RolloutBatch(**out)


@contextmanager
def dropout_off(model: Any) -> Iterator[None]:
    """Every ``torch.nn.Dropout`` of ``model`` has p = 0 inside (restored after); train mode is kept.

    The policy-gradient passes run under it so that they compute the same function as the old-log-prob
    pass (eval mode): with p = 0 ``torch.nn.functional.dropout`` returns its input unchanged and draws no
    random numbers. Train mode stays on so that gradient checkpointing (active only in train mode) still
    works. Dropout that a model applies through a float argument rather than a module (e.g. an
    ``attention_dropout`` config value given to the attention kernel; 0 in every Qwen config) is not
    covered.
    """
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    saved = [m.p for m in layers]
    for m in layers:
        m.p = 0.0
    try:
        yield
    finally:
        for m, p in zip(layers, saved, strict=True):
            m.p = p


def completion_logprobs(
    model: Any,
    input_ids: Tensor,
    attention_mask: Tensor,
    completion_len: int,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    with_hidden: bool = False,
    completion_mask: Tensor | None = None,
    chunk_tokens: int | None = None,
    padding_free: bool = False,
) -> dict[str, Tensor]:
    """Log-probs of the last ``completion_len`` tokens of ``input_ids`` under ``model`` at ``temperature``.

    Every pass of the trainer goes through here: the bounded chunked scorer
    (``scoring.completion_scores``: the LM head on the scored positions only, ``chunk_tokens`` at a time,
    recomputed in the backward pass). Only the energy diagnostic's ``with_hidden`` takes the full
    (B, T, V) path (the trainer calls it when that tensor is small: ``train.ENERGY_MAX_ELEMENTS``).

    Args:
        model: a causal LM (PEFT-wrapped or not, DDP-wrapped or not).
        input_ids: (B, P + T) token ids; attention_mask: (B, P + T).
        completion_len: T.
        temperature: T of the sampling policy softmax(logits / T) (top-p is not applied: see the module
            docstring).
        with_entropy: also return ``entropy`` (B, T), the policy's entropy at each completion position.
        with_hidden: also return ``probs`` (B, T, V) and ``hidden_norm`` (B, T), ‖h‖ of the final hidden
            state (the energy-by-bucket proxy needs both; costly for a large vocabulary).
        completion_mask: (B, T) the positions to score (None: all); the others get log-prob 0.
        chunk_tokens: positions per chunk of the LM head (None: ``DEFAULT_CHUNK_TOKENS``).
        padding_free: the rows packed into one sequence, padding removed (``scoring.packed_inputs``; config
            ``padding_free``); the same values. ``with_hidden`` (a diagnostic) always runs padded.
    Returns:
        a dict with ``logp`` (B, T) float32 (carries the gradient when grad is enabled) and the extras.
    """
    if not with_hidden:
        return completion_scores(
            model, input_ids, attention_mask, completion_len, temperature=temperature,
            completion_mask=completion_mask, with_entropy=with_entropy,
            chunk_tokens=chunk_tokens or DEFAULT_CHUNK_TOKENS, padding_free=padding_free,
        )  # fmt: skip
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
        output_hidden_states=True,
    )
    # the logit at position k predicts token k + 1: the completion tokens are predicted from P − 1 .. L − 2
    logits = out.logits[:, -completion_len - 1 : -1, :]
    logits = logits.to(at_least_float32(logits.dtype))  # float64 stays float64
    if temperature != 1.0:
        logits = logits / temperature  # the policy that sampled: softmax(logits / T)
    targets = input_ids[:, -completion_len:]
    logsm = torch.log_softmax(logits, dim=-1)
    res = {"logp": logsm.gather(-1, targets.unsqueeze(-1)).squeeze(-1)}
    if completion_mask is not None:
        res["logp"] = res["logp"] * completion_mask
    with torch.no_grad():
        probs = logsm.detach().exp()
        if with_entropy:
            res["entropy"] = -(probs * logsm.detach()).sum(-1)
        res["probs"] = probs
        h = out.hidden_states[-1][:, -completion_len - 1 : -1, :]
        h = h.to(at_least_float32(h.dtype))
        res["hidden_norm"] = h.norm(dim=-1)
    return res


def first_eos_mask(completion_ids: Tensor, eos_ids: list[int]) -> tuple[Tensor, Tensor]:
    """(mask (B, T) float: 1 through the first EOS; truncated (B,) bool: no EOS in the row)."""
    is_eos = torch.zeros_like(completion_ids, dtype=torch.bool)
    for e in eos_ids:
        is_eos |= completion_ids == e
    t = completion_ids.shape[1]
    pos = torch.arange(t, device=completion_ids.device).expand_as(completion_ids)
    first = torch.where(is_eos, pos, torch.full_like(pos, t)).min(dim=1).values
    mask = (pos <= first[:, None]).float()
    return mask, first >= t


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids that end a completion (``backends.stop_token_ids``: tokenizer, generation config, chat template)."""
    return stop_token_ids(model, tokenizer)


@torch.no_grad()
def generate_rollouts(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    answers: list[str],
    group_ids: list[int],
    *,
    num_generations: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    do_sample: bool = True,
    ref_model_ctx: Any = None,
    chunk_size: int | None = None,
    chunk_tokens: int | None = None,
    backend: RolloutBackend | None = None,
    plan: Callable[[RolloutBatch], list[Tensor | None]] | None = None,
    padding_free: bool = False,
) -> tuple[RolloutBatch, dict[str, float]]:
    """G = ``num_generations`` completions for each (already chat-formatted) prompt.

    ``model`` is the unwrapped policy (``accelerator.unwrap_model``). Sampling uses the global torch
    RNG: the trainer seeds it from (seed, step, process) just before, which makes a resumed run sample
    exactly what an uninterrupted one does. ``backend`` samples (default: ``HFBackend(model)``, all rows
    in one call), with exactly the run's settings (``backends.generation_config``: nothing from the
    model's ``generation_config.json``) and the stop tokens of ``backends.stop_token_ids``.
    ``ref_model_ctx``: a zero-argument callable returning a context manager under which ``model`` is the
    reference policy (``model.disable_adapter``); when given, ``ref_logp`` is filled. Old and reference
    log-probs and the entropy are those of logits / ``temperature`` (the sampling policy; top-p ignored,
    as TRL and verl do), scored by the trainer whatever the backend. The completion mask runs through the
    first stop token for every row, truncated or not (``truncated`` marks them). Returns the batch and
    its diagnostics (``entropy``: the mean token entropy of the sampling policy on the sampled tokens;
    ``completion_length``; ``truncated_frac``). ``padding_free``: the scoring passes packed
    (``score_completions``).
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    if tokenizer.padding_side != "left":
        raise ValueError(
            "the tokenizer must pad on the left for generation (tokenizer.padding_side = 'left')"
        )
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    stop = stop_token_ids(model, tokenizer)
    sampling = Sampling(
        max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_p=top_p,
        stop_ids=tuple(stop), pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop[0],
    )  # fmt: skip
    backend = backend or HFBackend(model)
    ids, am = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    completions = backend.generate(ids, am, num_generations=num_generations, sampling=sampling)
    batch, stats = score_completions(
        model, tokenizer, ids.repeat_interleave(num_generations, 0), am.repeat_interleave(num_generations, 0),
        completions,
        prompts=[x for x in prompts for _ in range(num_generations)],
        answers=[a for a in answers for _ in range(num_generations)],
        group_ids=[g for g in group_ids for _ in range(num_generations)],
        temperature=temperature if do_sample else 1.0, ref_model_ctx=ref_model_ctx, chunk_size=chunk_size,
        chunk_tokens=chunk_tokens, plan=plan, padding_free=padding_free,
    )  # fmt: skip
    if was_training:
        model.train()
    return batch, stats


def _score_pass(
    model: Any,
    batch: RolloutBatch,
    rows: Tensor | None,
    temperature: float,
    chunk_tokens: int | None,
    *,
    with_entropy: bool,
    padding_free: bool = False,
) -> dict[str, Tensor]:
    """One scoring forward over ``batch``'s ``rows``, trimmed to their longest prompt and completion.

    ``rows`` None: an empty pass (the first row, nothing scored) that only runs the forward. Returns
    ``logp`` (and ``entropy``) of shape (len(rows), T_k), T_k ≤ T the pass's longest completion.
    """
    p = batch.prompt_len
    idx = torch.zeros(1, dtype=torch.long) if rows is None else rows
    idx = idx.to(batch.input_ids.device)
    am = batch.attention_mask[idx]
    keep_p = int(am[:, :p].sum(1).max())
    keep_t = max(int(am[:, p:].sum(1).max()), 1)
    cmask = batch.completion_mask[idx, :keep_t]
    r = completion_logprobs(
        model, batch.input_ids[idx, p - keep_p : p + keep_t], am[:, p - keep_p : p + keep_t], keep_t,
        temperature=temperature, with_entropy=with_entropy, chunk_tokens=chunk_tokens,
        completion_mask=torch.zeros_like(cmask) if rows is None else cmask, padding_free=padding_free,
    )  # fmt: skip
    return {k: r[k] for k in (("logp", "entropy") if with_entropy else ("logp",))}


@torch.no_grad()
def score_completions(
    model: Any,
    tokenizer: Any,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    *,
    prompts: list[str],
    answers: list[str],
    group_ids: list[int],
    temperature: float,
    ref_model_ctx: Any = None,
    chunk_size: int | None = None,
    chunk_tokens: int | None = None,
    plan: Callable[[RolloutBatch], list[Tensor | None]] | None = None,
    padding_free: bool = False,
) -> tuple[RolloutBatch, dict[str, float]]:
    """The ``RolloutBatch`` of given completions: what ``generate_rollouts`` returns after sampling.

    Args:
        prompt_ids, prompt_mask: (B, P) one left-padded prompt per row (repeated for a group's rows).
        completion_ids: (B, T) the completion tokens; a row ends at its first EOS (whatever follows is
            replaced by padding), a row without EOS is truncated.
        prompts, answers, group_ids: one per row.
        chunk_tokens: LM-head positions per chunk of the scorer (``completion_logprobs``).
        temperature: the sampling policy's T (1.0 for greedy); ``ref_model_ctx``: as in
            ``generate_rollouts``.
        plan: the forward passes of the old (and reference) scoring: called with the batch (its
            ``old_logp`` still zeros), it returns row-index tensors (``None``: an empty pass that scores
            nothing but runs the forward, so every process runs as many); the trainer passes its loss
            plan (``train.plan_micro_batches``: ``micro_batch_size`` or the ``max_tokens_per_micro_batch``
            packing, the same pass count on every process). Without it: consecutive runs of
            ``chunk_size`` rows (None: one pass over all rows). Each pass is trimmed to its own longest
            prompt and completion, so under a token budget no scoring forward holds more token slots than
            the loss passes do.
        padding_free: each pass's rows packed into one sequence, padding removed (config ``padding_free``;
            ``completion_logprobs``): the same log-probs.

    The completion mask, the truncation flags, the old (and reference) log-probs at ``temperature``
    and the diagnostics are computed exactly as for sampled completions, so a test can build the batch
    it needs (chosen lengths, padding, truncated rows) and train on it through the real code.
    """
    device = next(model.parameters()).device
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    if completion_ids.shape[1] == 0:
        raise ValueError("generation produced no tokens: check max_new_tokens > 0")
    if not (len(prompts) == len(answers) == len(group_ids) == completion_ids.shape[0] == prompt_ids.shape[0]):
        raise ValueError(
            f"score_completions: one prompt, answer and group id per completion row; got {len(prompts)}, "
            f"{len(answers)}, {len(group_ids)} for {prompt_ids.shape[0]} prompt and "
            f"{completion_ids.shape[0]} completion rows"
        )
    prompt_ids, prompt_mask, comp = prompt_ids.to(device), prompt_mask.to(device), completion_ids.to(device)
    mask, truncated = first_eos_mask(comp, eos_ids)
    comp = torch.where(mask.bool(), comp, torch.full_like(comp, pad_id))
    input_ids = torch.cat([prompt_ids, comp], 1)
    attention_mask = torch.cat([prompt_mask, mask.long()], 1)
    t, b = comp.shape[1], input_ids.shape[0]
    batch = RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        completion_mask=mask,
        old_logp=torch.zeros_like(mask),
        group=torch.tensor(group_ids, dtype=torch.long, device=device),
        advantages=torch.zeros(b, device=device),
        rewards=torch.zeros(b, device=device),
        truncated=truncated,
        ref_logp=None,
        prompts=list(prompts),
        completions=[""] * b,
        answers=list(answers),
    )
    passes = plan(batch) if plan is not None else list(torch.arange(b).split(chunk_size or max(b, 1)))
    was_training = model.training
    model.eval()
    out: dict[str, Tensor] = {}
    scorers = [("old", nullcontext)] + ([("ref", ref_model_ctx)] if ref_model_ctx is not None else [])
    for rows in passes:  # the reference pass right after the old one over the same rows, as in the loss plan
        for name, ctx in scorers:
            with ctx():
                r = _score_pass(
                    model, batch, rows, temperature, chunk_tokens, with_entropy=name == "old",
                    padding_free=padding_free,
                )  # fmt: skip
            for key, v in r.items():
                k = name if key == "logp" else key
                if k not in out:
                    out[k] = v.new_zeros(b, t)
                if rows is not None:
                    out[k][rows.to(device), : v.shape[1]] = v
    if was_training:
        model.train()
    entropy = out["entropy"]
    batch.old_logp = out["old"] * mask
    batch.ref_logp = out["ref"] * mask if "ref" in out else None
    batch.completions = tokenizer.batch_decode(
        comp.masked_fill(~mask.bool(), pad_id), skip_special_tokens=True
    )
    n_tok = mask.sum()
    stats = {
        "entropy": float((entropy * mask).sum() / n_tok.clamp(min=1)),
        "completion_length": float(mask.sum(1).mean()),
        "truncated_frac": float(truncated.float().mean()),
        "tokens_generated": float(n_tok),
    }
    return batch, stats


@torch.no_grad()
def generate_texts(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    n: int,
    max_new_tokens: int,
    do_sample: bool,
    temperature: float = 1.0,
    top_p: float = 1.0,
    backend: RolloutBackend | None = None,
) -> list[str]:
    """``n`` completions (texts, through the first stop token) of each prompt, prompt-major; for evaluation.

    Sampled with exactly these settings (greedy when ``do_sample`` is false) by ``backend`` (default:
    ``HFBackend(model)``), as ``generate_rollouts``.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    stop = stop_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop[0]
    sampling = Sampling(
        max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_p=top_p,
        stop_ids=tuple(stop), pad_id=pad_id,
    )  # fmt: skip
    backend = backend or HFBackend(model)
    comp = backend.generate(
        enc["input_ids"].to(device), enc["attention_mask"].to(device), num_generations=n, sampling=sampling
    )
    mask, _ = first_eos_mask(comp, stop)
    if was_training:
        model.train()
    return tokenizer.batch_decode(comp.masked_fill(~mask.bool(), pad_id), skip_special_tokens=True)
