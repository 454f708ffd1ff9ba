"""Log-probs of completion tokens without the (B, T, V) logits: one bounded, chunked LM-head scorer.

Every log-prob pass of the trainer (old, reference, loss, flips, eval) needs, for each completion
token y_t, log π(y_t | y_<t) = z_y/τ − logsumexp_v(z_v/τ) with z = W h + b the LM head's logits and τ
the sampling temperature, and some passes the policy's entropy. The plain way (full logits, an fp32
copy, a copy divided by τ, a full log_softmax, probs·log-probs for the entropy) holds several
(B, T, V) float32 tensors at once, and autograd keeps the log-softmax for the backward: with Qwen's
vocabulary (V = 151,936) one (B, T, V) fp32 copy at B = 2, T = 512 is already 0.6 GB.

- ``ChunkedTokenLogprob`` (an ``torch.autograd.Function``; ``chunked_token_logprob`` calls it): the
  log-probs of N positions from their hidden states h (N, d) and the head's weight W (V, d) (+ bias),
  ``chunk_tokens`` positions at a time. Each chunk's logits are computed in the model's dtype (as the
  head computes them), taken to float32, divided by τ and reduced in place to the target's log-prob,
  the logsumexp and (optionally) the entropy, in buffers that every chunk reuses. The forward saves
  only h, W, the targets and the N logsumexps; the backward recomputes each chunk's logits and turns
  them in place into ∂loss/∂z = g·(onehot(y) − softmax(z/τ))/τ, from which it forms ∂/∂h (and ∂/∂W,
  ∂/∂b when they require grad: full fine-tuning, tied embeddings). Memory beyond the model's own: one
  (chunk, V) float32 buffer of logits, a second one for exp(z) in the forward with entropy, and a
  (chunk, V) buffer in the model's dtype when that is not float32 (``tests/scaledrun/test_scoring.py``
  counts them), whatever B and T; with ``chunk_tokens`` 128 and Qwen's vocabulary 78 MB per float32
  buffer (``benchmarks/scoring_memory.py`` measures the passes). A Python loop over chunks under plain
  autograd would not bound the backward: autograd keeps every chunk's log-softmax until it runs.
- ``completion_scores``: ``completion_logprobs``'s log-probs (and entropy) of the last T tokens through
  ``ChunkedTokenLogprob``. The call goes through the model as the trainer holds it (DDP's, FSDP's and
  DeepSpeed's forward wrappers, PEFT), so gradient synchronisation and parameter gathering happen as in
  any forward pass: for the duration of the call the output-embedding module's ``forward`` is replaced
  by one that does the chunked computation itself, and the model is called with ``logits_to_keep=T + 1``
  so that only the completion positions reach the head. Computing inside the head's forward is what
  makes it robust to sharding: FSDP (1 and 2) and ZeRO-3 hold the unsharded weight only inside the
  forward of the module that owns it, and re-gather it for the backward through hooks on that forward's
  outputs, which here are the log-probs themselves.
- ``completion_scores(..., padding_free=True)``: the same values from one packed sequence (``packed_inputs``):
  the rows' real tokens one after another (batch dimension 1), ``position_ids`` restarting at 0 for each
  row and no attention mask, from which transformers builds the packed-sequence (block-diagonal causal)
  mask (``masking_utils.find_packed_sequence_indices``: eager, sdpa) or flash-attention's variable-length
  kernel (``flash_attention_2``). ``logits_to_keep`` is then the 1-D tensor of the positions that score a
  completion token, so the head (the same replacement) still sees only the scored positions.

What is assumed of the model
----------------------------
A Hugging Face causal LM whose forward takes ``logits_to_keep`` and computes its logits as
``get_output_embeddings()(last_hidden_states[:, -logits_to_keep:])`` (padding-free: with a 1-D tensor
``logits_to_keep``, ``last_hidden_states[:, logits_to_keep]``, as transformers' ``slice_logits_to_keep``
does; the packed-sequence masks from ``position_ids`` are checked with transformers 5.24), where the output
embeddings are an
``nn.Linear`` (tied to the input embeddings or not) with floating-point weights, and applies nothing to
the logits afterwards. True for Qwen2 / Qwen2.5 / Qwen3 (dense and MoE) and Llama. A model that rescales
or soft-caps its logits (``final_logit_softcapping``: Gemma 2/3; ``logit_scale``: Cohere;
``logits_scaling``: Granite; ``lm_head_multiplier``, ``output_multiplier``), a quantised head
(bitsandbytes), a head that PEFT wraps (LoRA on ``lm_head``, ``modules_to_save``) or a tensor-parallel
head (a DTensor weight inside the forward) gets a ``ValueError`` saying so, as does a forward without
``logits_to_keep``. DDP and FSDP2 are tested (one process); FSDP1 and DeepSpeed ZeRO-3 rely on the same
hooks but are not exercised here. The values are exact: they do not depend on ``chunk_tokens`` beyond
float rounding (the chunk's matmul and reductions may sum in another order than the full one).

Mixed precision: under ``torch.autocast`` the chunk's matmul runs in the autocast dtype (as the head's
would), with W cast once per pass, not per chunk. The gradient of W is accumulated in float32 over the
chunks (a (V, d) float32 buffer, only when W requires grad) and cast to W's dtype at the end. A float64
model (no autocast) is scored in float64 throughout: its buffers, log-probs, entropy and accumulators
are float64, so that the exactness tests (``tests/exactness.py``) compare two code paths where rounding
cannot decide the comparison.

References for the idea (read, not copied): TRL's ``ChunkedLogProbFunction`` (``trl.kernels``) and
verl's ``logprobs_from_logits``; Liger-Kernel's fused linear cross-entropy.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

#: Config fields of models that change the logits after the LM head (``completion_scores`` refuses them):
#: a soft cap (Gemma 2/3) or a multiplier (Cohere, Granite, Falcon-H1, ...). A value of None (or 1 for a
#: multiplier) means "not applied".
LOGIT_TRANSFORM_FIELDS = (
    "final_logit_softcapping",
    "logit_scale",
    "logits_scaling",
    "lm_head_multiplier",
    "output_multiplier",
)


def _compute_dtype(h: Tensor) -> torch.dtype:
    """The dtype the head's matmul runs in: the autocast dtype under autocast, else h's own dtype."""
    device_type = h.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return h.dtype


def at_least_float32(compute: torch.dtype) -> torch.dtype:
    """The dtype of log-probs, rewards and their reductions: float32, or float64 for a float64 model (the
    exactness tests run the trainer in float64, where rounding cannot decide a comparison)."""
    return torch.promote_types(compute, torch.float32)


class _ChunkLogits:
    """Reusable (chunk, V) buffers: each chunk's z/τ in float32 (float64 for a float64 model) is written
    into the same memory.

    The matmul runs in the compute dtype, as the head computes it (``addmm`` with the bias, as
    ``F.linear`` does), into a buffer of that dtype when it is not the result's, then is copied over.
    Reusing the buffers costs nothing on a GPU (its caching allocator reuses memory anyway) and spares the
    CPU a fresh mapping, zero-filled page by page, for every chunk.
    """

    def __init__(self, rows: int, vocab: int, dtype: torch.dtype, device: torch.device, temperature: float):
        result = at_least_float32(dtype)
        self.z = torch.empty(rows, vocab, dtype=result, device=device)
        self.low = None if dtype == result else torch.empty(rows, vocab, dtype=dtype, device=device)
        self.temperature = temperature

    def __call__(self, h_c: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """(c, V) float32 z/τ of the chunk h_c (c, d): a view of the buffer, valid until the next call."""
        c = h_c.shape[0]
        z = self.z[:c]
        out = z if self.low is None else self.low[:c]
        if bias is None:
            torch.mm(h_c, weight.t(), out=out)
        else:
            torch.addmm(bias, h_c, weight.t(), out=out)
        if self.low is not None:
            z.copy_(out)
        if self.temperature != 1.0:
            z.div_(self.temperature)  # the policy that sampled: softmax(z / τ)
        return z


def _check_settings(temperature: float, chunk_tokens: int) -> None:
    if not (temperature > 0 and temperature != float("inf")):
        raise ValueError(f"`temperature` must be a finite number > 0, got {temperature}")
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise ValueError(
            f"`chunk_tokens` (config `logprob_chunk_tokens`) must be an int ≥ 1, got {chunk_tokens!r}"
        )


class ChunkedTokenLogprob(torch.autograd.Function):
    """log softmax((h W^T + b) / τ)[y] for N positions, ``chunk_tokens`` positions at a time.

    Forward inputs: ``hidden`` (N, d), ``weight`` (V, d), ``bias`` (V,) or None, ``targets`` (N,) int64,
    ``temperature`` τ > 0, ``chunk_tokens`` ≥ 1, ``with_entropy``. Outputs: ``logp`` (N,) float32 (float64
    for a float64 model, as every float32 below) and ``entropy`` (N,) float32 (−Σ_v p_v log p_v of softmax(z/τ); not differentiable) or None.

    Saved for the backward: hidden, weight, bias, targets and the (N,) float32 logsumexp of z/τ; the
    backward recomputes each chunk's logits. Gradients: hidden, and weight / bias when they require it.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        temperature: float,
        chunk_tokens: int,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor | None]:
        n = hidden.shape[0]
        dtype = _compute_dtype(hidden)
        device_type = hidden.device.type
        w = weight.to(dtype)  # once per pass (a no-op without autocast)
        b = None if bias is None else bias.to(dtype)
        logp = torch.empty(n, dtype=at_least_float32(dtype), device=hidden.device)
        lse = torch.empty_like(logp)
        entropy = torch.empty_like(logp) if with_entropy else None
        rows = min(chunk_tokens, n)
        logits = _ChunkLogits(rows, weight.shape[0], dtype, hidden.device, temperature)
        e_buf = torch.empty_like(logits.z) if with_entropy else None
        with torch.autocast(device_type, enabled=False):
            for start in range(0, n, chunk_tokens):
                sl = slice(start, min(start + chunk_tokens, n))
                z = logits(hidden[sl].to(dtype), w, b)  # (c, V) float32 z/τ
                m = z.amax(dim=-1, keepdim=True)
                z.sub_(m)  # z − max: exp cannot overflow (log_softmax does the same)
                target = z.gather(-1, targets[sl, None]).squeeze(-1)  # z_y / τ − max
                if with_entropy:
                    e = torch.exp(z, out=e_buf[: z.shape[0]])  # the one temporary of the chunk
                    s = e.sum(-1)
                    # H = log s − Σ_v e_v (z_v − m) / s  (= −Σ p log p with p = e / s)
                    entropy[sl] = s.log() - e.mul_(z).sum(-1) / s
                else:
                    s = z.exp_().sum(-1)
                log_s = s.log()
                logp[sl] = target - log_s  # (z_y/τ − max) − log Σ exp(z/τ − max), as log_softmax
                lse[sl] = m.squeeze(-1) + log_s  # logsumexp_v z_v / τ
        del logits, e_buf
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature = temperature
        ctx.chunk_tokens = chunk_tokens
        ctx.dtype = dtype
        ctx.set_materialize_grads(False)
        if entropy is not None:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_logp: Tensor | None, _grad_entropy: Tensor | None) -> tuple[Any, ...]:
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        none = (None,) * 4
        if grad_logp is None or not (need_h or need_w or need_b):
            return (None, None, None, *none)
        n = hidden.shape[0]
        dtype, temperature = ctx.dtype, ctx.temperature
        w = weight.to(dtype)
        b = None if bias is None else bias.to(dtype)
        acc = at_least_float32(dtype)
        grad_logp = grad_logp.to(acc)
        grad_h = torch.empty_like(hidden) if need_h else None
        # float32 (float64) accumulators over the chunks (the same tensor as the result for such a weight)
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
        logits = _ChunkLogits(min(ctx.chunk_tokens, n), weight.shape[0], dtype, hidden.device, temperature)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, n, ctx.chunk_tokens):
                sl = slice(start, min(start + ctx.chunk_tokens, n))
                h_c = hidden[sl].to(dtype)
                g = grad_logp[sl]
                z = logits(h_c, w, b)  # recomputed: (c, V) float32 z/τ
                # ∂logp_y/∂z = (onehot(y) − softmax(z/τ)) / τ, times the incoming gradient g
                g_tau = g / temperature if temperature != 1.0 else g
                dz = z.sub_(lse[sl, None]).exp_().mul_(-g_tau[:, None])
                dz[torch.arange(dz.shape[0], device=dz.device), targets[sl]] += g_tau
                if grad_h is not None:
                    dz_low = dz if logits.low is None else logits.low[: dz.shape[0]].copy_(dz)
                    grad_h[sl] = (dz_low @ w).to(hidden.dtype)
                if grad_w is not None:
                    grad_w.addmm_(dz.t(), h_c.to(acc))
                if grad_b is not None:
                    grad_b += dz.sum(0)
        del logits
        return (
            grad_h,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            *none,
        )


def chunked_token_logprob(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 128,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """``ChunkedTokenLogprob`` with its inputs checked: (logp (N,), entropy (N,) or None), float32.

    Args:
        hidden: (N, d) hidden states of the scored positions; weight: (V, d) the LM head;
        bias: (V,) or None; targets: (N,) int64 token ids in [0, V).
        temperature: τ of softmax(z / τ); chunk_tokens: positions per chunk (peak memory ∝ chunk × V).
    """
    _check_settings(temperature, chunk_tokens)
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden (N, d) and weight (V, d) must share d, got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"bias must have shape (V,) = ({weight.shape[0]},), got {tuple(bias.shape)}")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets must have shape (N,) = ({hidden.shape[0]},), got {tuple(targets.shape)}")
    return ChunkedTokenLogprob.apply(
        hidden, weight, bias, targets.long(), float(temperature), chunk_tokens, with_entropy
    )


# --------------------------------------------------------------------------------------------
# the model side: route the head's input through the chunked scorer


def _base_model(model: Any) -> Any:
    """The transformers model inside DDP / FSDP / DeepSpeed / ``torch.compile`` and PEFT wrappers."""
    from accelerate.utils import extract_model_from_parallel

    inner = extract_model_from_parallel(model)  # keep_fp32_wrapper=True: modifies nothing
    return inner.get_base_model() if hasattr(inner, "get_base_model") else inner


def _scoring_head(base: Any) -> torch.nn.Linear:
    """The output-embedding module, after checking that the chunked scorer computes what it computes."""
    name = type(base).__name__
    get_head = getattr(base, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not isinstance(head, torch.nn.Linear):
        raise ValueError(
            f"completion_scores needs a causal LM whose output embeddings (`get_output_embeddings()`) are an "
            f"nn.Linear; {name} has {type(head).__name__} (PEFT wraps `lm_head`? leave it out of "
            f"`lora_target_modules` and `modules_to_save`)"
        )
    if not head.weight.dtype.is_floating_point:
        raise ValueError(
            f"completion_scores needs a floating-point LM head; {name}'s `lm_head` weight is {head.weight.dtype} "
            f"(a quantised head?)"
        )
    if "logits_to_keep" not in inspect.signature(base.forward).parameters:
        raise ValueError(
            f"completion_scores needs a model whose forward takes `logits_to_keep`; {name}.forward does not"
        )
    config = getattr(base, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for field in LOGIT_TRANSFORM_FIELDS:
        value = getattr(text_config, field, None)
        if value is not None and not (field != "final_logit_softcapping" and value == 1):
            raise ValueError(
                f"completion_scores assumes the logits are the LM head's output, but {name}'s config sets "
                f"`{field}` = {value}: the model transforms its logits after the head"
            )
    return head


def _is_dtensor(x: Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return False
    return isinstance(x, DTensor)


@contextmanager
def _head_forward(head: torch.nn.Module, forward: Callable[[Tensor], Tensor]) -> Iterator[None]:
    """``head.forward`` is ``forward`` inside (module hooks still run around it); the old one is restored."""
    had_own = "forward" in head.__dict__  # e.g. accelerate's device-map hooks set an instance forward
    old = head.__dict__.get("forward")
    head.forward = forward
    try:
        yield
    finally:
        if had_own:
            head.forward = old
        else:
            del head.forward


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """(B, L) positions that skip left padding, as ``generate`` computes them for a left-padded batch."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def packed_inputs(
    input_ids: Tensor, attention_mask: Tensor, completion_len: int, scored: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """One packed sequence of the rows' real tokens: (ids (1, N), position_ids (1, N), keep (K,)).

    Row r's tokens where ``attention_mask`` is 1, in order, follow row r − 1's; ``position_ids`` count
    0, 1, … within each row (what the padded pass's ``position_ids_from_mask`` gives its real tokens), and
    ``keep`` holds, for each ``scored`` (B, T) completion token in row-major order, the packed index of the
    token before it in its row (whose hidden state predicts it). A scored token must be real and have a
    real token before it in its row.
    """
    real = attention_mask.bool()
    within = real.long().cumsum(1) - 1  # each real token's index within its row
    lengths = real.sum(1)
    offset = lengths.cumsum(0) - lengths  # where each row starts in the packed sequence
    t = completion_len
    if bool((scored & ~real[:, -t:]).any()):
        raise ValueError(
            "padding-free scoring: a scored completion token is padding (attention_mask 0 where "
            "completion_mask is 1)"
        )
    comp_within = within[:, -t:]
    if bool((scored & (comp_within < 1)).any()):
        raise ValueError(
            "padding-free scoring: a scored completion token has no real token before it in its row"
        )
    keep = (offset[:, None] + comp_within - 1)[scored]
    return input_ids[real][None], within[real][None], keep


def completion_scores(
    model: Any,
    input_ids: Tensor,
    attention_mask: Tensor,
    completion_len: int,
    *,
    temperature: float = 1.0,
    completion_mask: Tensor | None = None,
    with_entropy: bool = False,
    chunk_tokens: int = 128,
    padding_free: bool = False,
) -> dict[str, Tensor]:
    """log π (and the entropy) of the last ``completion_len`` tokens of ``input_ids`` at ``temperature``.

    The same values as ``rollout.completion_logprobs`` (log_softmax(logits / τ) of each completion token)
    at the scored positions, without ever holding more than ``chunk_tokens`` positions' logits.

    Args:
        model: a causal LM as the trainer holds it (PEFT-wrapped or not, DDP / FSDP / DeepSpeed-wrapped or
            not); it is called through its outermost forward. See the module docstring for what it must be.
        input_ids: (B, L) prompt then completion; attention_mask: (B, L).
        completion_len: T ≥ 1, the completion's length (the last T columns); L > T.
        temperature: τ of the sampling policy softmax(logits / τ).
        completion_mask: (B, T) 1 where the token is scored, 0 elsewhere (its log-prob and entropy are 0
            and carry no gradient); None scores all B·T positions.
        with_entropy: also return the policy's entropy at each scored position.
        chunk_tokens: scored positions per chunk of the LM head (config ``logprob_chunk_tokens``).
        padding_free: run the model on one packed sequence of the rows' real tokens (``packed_inputs``)
            instead of the padded (B, L) batch (config ``padding_free``); the same values.
    Returns:
        ``logp`` (B, T) float32 (carries the gradient when grad is enabled), and with ``with_entropy``
        ``entropy`` (B, T) float32 (no gradient); both 0 at positions not scored.
    """
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"input_ids and attention_mask must both be (B, L), got {tuple(input_ids.shape)} and "
            f"{tuple(attention_mask.shape)}"
        )
    rows, length = input_ids.shape
    t = completion_len
    if not 1 <= t < length:
        raise ValueError(
            f"`completion_len` must be in [1, L − 1] = [1, {length - 1}] (a completion token is scored from the "
            f"position before it), got {t}"
        )
    if completion_mask is not None and completion_mask.shape != (rows, t):
        raise ValueError(
            f"`completion_mask` must be (B, T) = ({rows}, {t}), got {tuple(completion_mask.shape)}"
        )
    _check_settings(temperature, chunk_tokens)
    head = _scoring_head(_base_model(model))
    targets = input_ids[:, -t:]
    scored = torch.ones_like(targets, dtype=torch.bool) if completion_mask is None else completion_mask.bool()
    result: dict[str, Tensor] = {}
    if padding_free:
        ids, positions, keep_index = packed_inputs(input_ids, attention_mask, t, scored)
        expected = (1, keep_index.numel())
        inputs = {"input_ids": ids, "attention_mask": None, "position_ids": positions}
        to_keep: int | Tensor = keep_index
    else:
        expected = (rows, t + 1)
        inputs = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids_from_mask(attention_mask),
        }
        to_keep = t + 1

    def score(hidden: Tensor) -> Tensor:
        """The head's replacement: hidden (B, T + 1, d) (packed: (1, K, d), the K scored positions) ->
        logp (B, T) float32 (the model's ``logits``)."""
        if hidden.shape[:2] != expected:
            raise ValueError(
                f"the model gave its LM head hidden states of shape {tuple(hidden.shape)}, not {expected} + (d,): "
                f"its forward does not slice by `logits_to_keep` as completion_scores assumes"
            )
        if _is_dtensor(head.weight):
            raise ValueError(
                "completion_scores needs the LM head's whole weight inside its forward; it is a DTensor here "
                "(tensor parallelism?)"
            )
        keep = scored.to(hidden.device)
        if padding_free:
            h = hidden[0]  # (N, d): exactly the scored positions, in row-major order
        else:
            # the hidden state at position k predicts token k + 1: positions L − T − 1 .. L − 2 score the T tokens
            h = hidden[:, :t][keep]  # (N, d)
        y = targets.to(hidden.device)[keep]
        logp_n, ent_n = chunked_token_logprob(
            h,
            head.weight,
            head.bias,
            y,
            temperature=temperature,
            chunk_tokens=chunk_tokens,
            with_entropy=with_entropy,
        )
        zeros = torch.zeros(keep.shape, dtype=logp_n.dtype, device=hidden.device)
        if ent_n is not None:
            result["entropy"] = zeros.masked_scatter(keep, ent_n)
        logp = zeros.masked_scatter(keep, logp_n)
        result["logp"] = logp
        return logp

    with _head_forward(head, score):
        out = model(**inputs, use_cache=False, logits_to_keep=to_keep)
    if "logp" not in result:
        raise ValueError(
            f"{type(_base_model(model)).__name__}'s forward did not call its output embeddings module: "
            f"completion_scores cannot score it"
        )
    if out.logits.shape != (rows, t):
        raise ValueError(
            "the model changed the LM head's output before returning it (logits post-processing?): "
            "completion_scores cannot score it"
        )
    # through the model's outputs (DDP, ZeRO-3 and FSDP hook the forward's outputs for the backward)
    res = {"logp": out.logits}
    if with_entropy:
        res["entropy"] = result["entropy"]
    return res
