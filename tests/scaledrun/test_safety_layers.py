"""The trainer's second safety layers, each tested alone (issue 26 §4): a mutation of one of them passed
every other test, because the layer in front of it (or a happy path) hid it.

- ``completion_scores`` returns the model's output, not the head's own result: hooks that wrappers put on
  a forward's outputs (DeepSpeed ZeRO-3 passes them through an autograd function that re-gathers the
  parameters in the backward; DDP with ``find_unused_parameters`` through ``_DDPSink``) must see the
  backward;
- the chunked head's matmul runs in the autocast dtype under autocast (as the head's own would);
- a bfloat16 full fine-tune runs its passes under bfloat16 autocast (``compute_precision``), read off
  inside the model's forward;
- the clean generation config is installed: a ``num_return_sequences`` in the model's generation config
  does not multiply the rows;
- generation in chunks of unequal widths: the narrower chunk is padded with the pad id, nothing cropped.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

import scaledrun.train as tr
from scaledrun.backends import HFBackend, Sampling, stop_token_ids
from scaledrun.config import RunConfig
from scaledrun.model import compute_precision, master_fp32
from scaledrun.scoring import _compute_dtype, chunked_token_logprob, completion_scores
from scaledrun.tasks import format_prompt

from ..exactness import FLOAT64_RTOL
from .test_scoring import TAU, T, batch, lora, plain_scores, tiny_qwen3
from .test_train import make_cfg

# ---- completion_scores: the backward goes through the model's outputs


class _Seen(torch.autograd.Function):
    """The identity, counting its backward calls (what ZeRO-3's ``PreBackwardFunction`` is, minus the gather)."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        _Seen.calls += 1
        return g


@pytest.mark.exactness
def test_completion_scores_returns_the_models_output_so_output_hooks_see_the_backward():
    """A forward hook on the outermost model replaces ``logits`` by a new tensor (as ZeRO-3's and DDP's
    output hooks do): the scores returned are that tensor, the backward runs through the hook's function
    once, and the gradient is the plain full-logits one."""
    model = lora(tiny_qwen3(torch.float64))
    ids, att, mask = batch()
    returned = []

    def hook(module, args, kwargs, out):
        out.logits = _Seen.apply(out.logits)
        returned.append(out.logits)
        return out

    handle = model.register_forward_hook(hook, with_kwargs=True)
    try:
        _Seen.calls = 0
        res = completion_scores(model, ids, att, T, temperature=TAU, completion_mask=mask, chunk_tokens=7)
        assert len(returned) == 1 and res["logp"] is returned[0]
        model.zero_grad(set_to_none=True)
        (res["logp"] * mask).sum().backward()
        assert _Seen.calls == 1
        got = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    finally:
        handle.remove()
    model.zero_grad(set_to_none=True)
    ref, _ = plain_scores(model, ids, att, T, TAU)
    (ref * mask).sum().backward()
    for n, p in model.named_parameters():
        if p.requires_grad:
            scale = float(p.grad.abs().max())
            assert scale > 0 and float((got[n] - p.grad).abs().max()) <= FLOAT64_RTOL * scale, n


# ---- the chunk's matmul under autocast


def _exact_bf16_operands(n: int, d: int, vocab: int):
    """h (n, d) and W (V, d) float32 whose entries are k/8, |k| ≤ 8: bfloat16 holds them exactly, every
    product is a multiple of 1/64 and every partial sum of a logit (|·| ≤ d) fits float32's mantissa, so
    the float32 logits are the exact ones L in any summation order, and bfloat16 logits are round(L)."""
    gen = torch.Generator().manual_seed(3)
    h = torch.randint(-8, 9, (n, d), generator=gen).float() / 8
    w = torch.randint(-8, 9, (vocab, d), generator=gen).float() / 8
    return h, w


@pytest.mark.exactness
def test_the_chunk_matmul_runs_in_the_autocast_dtype():
    """Under bfloat16 autocast the scorer's logits are the head's bfloat16 ones (float32 operands): its
    log-probs are log_softmax(bf16(L) / τ) to float32 rounding, and differ from the float32 logits'."""
    n, d, vocab = 12, 64, 97
    h, w = _exact_bf16_operands(n, d, vocab)
    y = torch.arange(n) * 7 % vocab
    exact = h.double() @ w.double().t()  # L, exactly
    with torch.autocast("cpu", dtype=torch.bfloat16):
        head = F.linear(h, w)  # what the LM head computes under autocast
        got, _ = chunked_token_logprob(h, w, None, y, temperature=TAU, chunk_tokens=5)
        inside = _compute_dtype(h)
    assert head.dtype == torch.bfloat16 and torch.equal(head.double(), exact.to(torch.bfloat16).double())

    def reference(logits):
        return torch.log_softmax(logits / TAU, -1).gather(-1, y[:, None]).squeeze(-1)

    want = reference(exact.to(torch.bfloat16).double())
    other = reference(exact)  # the float32 path's (exact) logits
    # float32 rounding of z/τ − max (gross 2·max|z|/τ) and of the logsumexp (V terms ≤ 1), twice over
    gross = 2 * float(exact.abs().max()) / TAU + vocab
    tol = 2 * gross * torch.finfo(torch.float32).eps
    assert float((got.double() - want).abs().max()) <= tol
    assert float((other - want).abs().max()) > 100 * tol  # the two dtypes are told apart
    assert (inside, _compute_dtype(h)) == (torch.bfloat16, torch.float32)


# ---- compute_precision: bfloat16 full fine-tuning computes under bfloat16 autocast


@pytest.mark.parametrize(
    ("full_finetune", "dtype", "autocast"),
    [
        (True, "bfloat16", True),
        (True, "float32", False),
        (False, "bfloat16", False),
        (False, "float32", False),
    ],
)
def test_compute_precision_is_bf16_autocast_exactly_for_bf16_full_finetuning(full_finetune, dtype, autocast):
    cfg = RunConfig(model="unused", output_dir="unused", full_finetune=full_finetune, dtype=dtype)
    assert master_fp32(cfg) is autocast
    with compute_precision(cfg, torch.device("cpu")):
        assert torch.is_autocast_enabled("cpu") is autocast
        if autocast:
            assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")


def test_a_bf16_full_finetune_runs_its_passes_in_bf16(tiny_model, tmp_path, monkeypatch):
    """One step of a bfloat16 full fine-tune: float32 weights, and every forward pass of a linear layer
    (generation, old log-probs, the update) computes a bfloat16 output, read off in a forward hook."""
    seen = []
    real = tr.load_model

    def load(cfg):
        model = real(cfg)
        q = model.model.layers[0].self_attn.q_proj
        q.register_forward_hook(
            lambda m, args, out: seen.append((m.weight.dtype, out.dtype, torch.is_grad_enabled()))
        )
        return model

    monkeypatch.setattr(tr, "load_model", load)
    cfg = make_cfg(
        tiny_model, tmp_path / "run", full_finetune=True, dtype="bfloat16", lr=1e-5, max_new_tokens=4
    )
    row = tr.train(cfg).rows[0]
    assert row["opt_steps"] == 1.0
    assert {w for w, _, _ in seen} == {torch.float32}
    assert {o for _, o, _ in seen} == {torch.bfloat16}
    assert any(g for _, _, g in seen)  # the update's pass with the graph is among them


# ---- the clean generation config


#: The tiny model's task (2-digit addition): sums of two and of three digits, so greedy completions of
#: unequal lengths.
SUMS = [(37, 11), (21, 78), (64, 59), (12, 34), (88, 97), (5, 61), (70, 8), (45, 55)]


@pytest.fixture
def loaded(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    return model, tok, [format_prompt(tok, f"What is {a} + {b}?") for a, b in SUMS]


def _encode(tok, prompts):
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc["input_ids"], enc["attention_mask"]


@pytest.mark.parametrize("batch_size", [None, 3])
def test_num_return_sequences_in_the_models_config_does_not_multiply_rows(loaded, batch_size):
    """``num_return_sequences`` 2 in the model's generation config (``generate`` would fill the call's
    unset field from it): still G rows per prompt, the same ones as with a clean config (same seed)."""
    model, tok, prompts = loaded
    ids, am = _encode(tok, prompts[:3])
    stop = stop_token_ids(model, tok)
    sampling = Sampling(max_new_tokens=6, temperature=1.5, stop_ids=tuple(stop), pad_id=tok.pad_token_id)
    torch.manual_seed(0)
    want = HFBackend(model, batch_size).generate(ids, am, num_generations=2, sampling=sampling)
    model.generation_config.num_return_sequences = 2
    torch.manual_seed(0)
    got = HFBackend(model, batch_size).generate(ids, am, num_generations=2, sampling=sampling)
    assert got.shape[0] == 3 * 2
    assert torch.equal(got, want)
    assert model.generation_config.num_return_sequences == 2  # restored after the call


def test_generation_chunks_of_unequal_widths_are_padded_with_the_pad_id(loaded):
    """One prompt per ``generate`` call (greedy): chunks whose rows stop at different lengths. The result
    is as wide as the widest chunk; each row holds its chunk's tokens, left-aligned, then the pad id."""
    model, tok, prompts = loaded
    ids, am = _encode(tok, prompts)
    stop = stop_token_ids(model, tok)
    pad = tok.pad_token_id
    sampling = Sampling(max_new_tokens=6, do_sample=False, stop_ids=tuple(stop), pad_id=pad)
    calls = []
    real = model.generate

    def recording(**kw):
        out = real(**kw)
        calls.append(out[:, kw["input_ids"].shape[1] :].clone())
        return out

    model.generate = recording
    try:
        got = HFBackend(model, batch_size=2).generate(ids, am, num_generations=2, sampling=sampling)
    finally:
        model.generate = real
    widths = [c.shape[1] for c in calls]
    assert len(calls) == len(prompts) and len(set(widths)) > 1, widths  # chunks of unequal widths
    assert got.shape == (2 * len(prompts), max(widths))
    for k, chunk in enumerate(calls):
        rows = got[2 * k : 2 * k + 2]
        assert torch.equal(rows[:, : widths[k]], chunk), k  # nothing cropped, nothing moved
        assert bool((rows[:, widths[k] :] == pad).all()), k
