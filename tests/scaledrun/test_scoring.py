"""The chunked scorer (``scaledrun.scoring``) against the plain full-logits computation.

The reference is written here, independently: the model's full logits, float32, divided by τ,
``log_softmax``, ``gather`` (and −Σ p log p for the entropy), autograd through all of it.

- ``ChunkedTokenLogprob`` alone: values, entropy and the gradients wrt h, W and the bias, for chunks of 1,
  7 and more than N positions (the values do not depend on the chunk).
- ``completion_scores`` on a tiny random Qwen3 (tied embeddings) at τ = 0.6: log-probs and entropy with
  left-padded prompts, right-padded completions and a fully masked row (0 there), gradients wrt every
  trainable parameter of a LoRA model and of a full fine-tune (the tied W gets the head's gradient too),
  through DDP and FSDP2 (one process, gloo), and every objective's ``compute_loss`` and its gradients.
- Memory: no tensor autograd saves and no tensor alive at any moment (forward and backward) holds more
  than one chunk's logits (plus one temporary of the same size); the reference does hold the whole
  (B, L, V) logits, so the meters can see them.
- Errors: a head that is not an ``nn.Linear`` (LoRA on ``lm_head``), a model that soft-caps its logits
  (Gemma 2), a forward without ``logits_to_keep`` (TrOCR), bad arguments; the head's forward is restored
  even when the model raises.

Tolerances (``tests/exactness.py``): the float64 model is scored in float64 by both the chunked scorer
and the reference, compared at ``FLOAT64_RTOL``; the float32 cases (the trainer's usual dtype) compare
at the rounding bound of the head's sums (``TOL``): the chunk's matmul and logsumexp sum in another
order than the full ones, and which order runs depends on the CPU.
"""

from __future__ import annotations

import copy
import math
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from cancellation import compute_loss, objective_names
from scaledrun.scoring import chunked_token_logprob, completion_scores, position_ids_from_mask
from scaledrun.tiny import make_model

from ..conftest import SEED
from ..exactness import FLOAT64_RTOL, rounding_tolerance
from .test_update import OBJECTIVES, _id

#: The chunked scorer against the full logits: two code paths (``make test-machines`` runs the whole
#: module; its error and memory checks take seconds).
pytestmark = pytest.mark.exactness

#: Vocabulary of the tiny test model: a prime no other dimension of the model or the batch equals, so a
#: tensor whose last dimension is V is a tensor of logits (or of their gradient).
VOCAB = 97
#: The sampling temperature of the comparisons.
TAU = 0.6
#: prompt columns P and completion columns T of the test batch.
P, T = 5, 7
#: chunk sizes: one position, a size that leaves a partial last chunk, and more than all the positions.
CHUNKS = [1, 7, 1000]
#: A bound on Σ_k |h_k·W_vk| / τ, the gross of the test batch's logits (5.8-6.3 for seeds 0-3;
#: ``test_values_and_entropy_match_the_full_logits`` checks it).
LOGIT_GROSS = 10.0
#: The tolerance on values and on gradients (relative, norm-wise) per model dtype. float32: a log-prob is
#: z_y/τ − logsumexp(z/τ), each logit a sum of d = 64 products of gross ≤ ``LOGIT_GROSS`` and the
#: logsumexp a sum over V terms: the rounding bound of those sums (``rounding_tolerance``, 1e-4). The
#: gradients (norm-wise relative) are held to the same bound.
TOL = {torch.float64: FLOAT64_RTOL, torch.float32: rounding_tolerance(LOGIT_GROSS, 64 + VOCAB)}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_qwen3(dtype: torch.dtype) -> torch.nn.Module:
    """A random tiny Qwen3 (``scaledrun.tiny``'s shape, tied embeddings) with moderately peaked logits.

    The default init (std 0.02) gives almost uniform next-token distributions; std 0.05 for the (tied)
    embeddings gives entropies between ~1.3 and ~4.1 nats of ln 97 = 4.57 (seeds 0-5), logits of order 1-5.
    """
    model = make_model(VOCAB, 0, 1, SEED)
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.randn(VOCAB, 64, generator=gen) * 0.05)
    return model.to(dtype).train()


def lora(model: torch.nn.Module) -> torch.nn.Module:
    """PEFT LoRA on every linear layer of the blocks, B ≠ 0 (PEFT's init B = 0 would zero A's gradient)."""
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(
        copy.deepcopy(model), LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS)
    )
    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.1)
    return peft_model


def batch(rows: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids (B, P + T), attention_mask, completion_mask (B, T)) of random tokens.

    Row 0: prompt left-padded by 2; row 1: completion right-padded after 4 tokens; row 2: attended but
    not scored (a masked, e.g. truncated, row); the others: full.
    """
    gen = torch.Generator().manual_seed(SEED + 2)
    ids = torch.randint(2, VOCAB, (rows, P + T), generator=gen)
    att = torch.ones_like(ids)
    att[0, :2] = 0
    att[1, P + 4 :] = 0
    ids[att == 0] = 0
    mask = att[:, P:].float()
    mask[2] = 0.0
    return ids, att, mask


def plain_scores(model, ids, att, t, tau):
    """The reference: full logits -> float32 (float64 stays) -> / τ -> log_softmax -> gather; entropy −Σ p log p."""
    out = model(input_ids=ids, attention_mask=att, position_ids=position_ids_from_mask(att), use_cache=False)
    logits = out.logits[:, -t - 1 : -1]
    logsm = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)) / tau, dim=-1)
    logp = logsm.gather(-1, ids[:, -t:, None]).squeeze(-1)
    entropy = -(logsm.exp() * logsm).sum(-1).detach()
    return logp, entropy


def logit_gross(model, ids, att, t, tau) -> float:
    """max over the completion positions and the vocabulary of Σ_k |h_k·W_vk| / τ."""
    with torch.no_grad():
        out = model(
            input_ids=ids, attention_mask=att, position_ids=position_ids_from_mask(att), use_cache=False,
            output_hidden_states=True,
        )  # fmt: skip
        h = out.hidden_states[-1][:, -t - 1 : -1].double()
        return float((h.abs() @ model.lm_head.weight.double().abs().T).max()) / tau


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ (0 when both are 0)."""
    a, b = a.double(), b.double()
    if float(b.norm()) == 0.0:
        return float(a.norm())
    return float((a - b).norm() / b.norm())


def grads(model, loss_of) -> dict[str, torch.Tensor]:
    """Gradients of ``loss_of(model)`` wrt every trainable parameter (DDP's ``module.`` prefix dropped,
    FSDP2's DTensors gathered)."""
    model.zero_grad(set_to_none=True)
    loss_of(model).backward()
    out = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None, name
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            out[name.removeprefix("module.")] = g.detach().clone()
    model.zero_grad(set_to_none=True)
    return out


def assert_same_grads(got, want, tol, nonzero=True):
    assert got.keys() == want.keys() and want
    for name in want:
        assert float(want[name].abs().max()) > 0 or not nonzero, name  # every parameter takes part
        assert rel_err(got[name], want[name]) <= tol, (name, rel_err(got[name], want[name]))


# --------------------------------------------------------------------------------------------
# the autograd Function alone


@pytest.mark.parametrize("tau", [TAU, 1.0])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_function_is_log_softmax_and_its_gradient(chunk, tau):
    gen = torch.Generator().manual_seed(SEED)
    n, d = 23, 16
    h = torch.randn(n, d, generator=gen, dtype=torch.float64).requires_grad_()
    w = (torch.randn(VOCAB, d, generator=gen, dtype=torch.float64) * 0.5).requires_grad_()
    b = torch.randn(VOCAB, generator=gen, dtype=torch.float64).requires_grad_()
    y = torch.randint(0, VOCAB, (n,), generator=gen)
    coef = torch.randn(n, generator=gen)

    logsm = torch.log_softmax(F.linear(h, w, b) / tau, dim=-1)  # float64 throughout, as the scorer
    ref = logsm.gather(-1, y[:, None]).squeeze(-1)
    ref_entropy = -(logsm.exp() * logsm).sum(-1)
    ref_grads = torch.autograd.grad((coef * ref).sum(), (h, w, b))

    logp, entropy = chunked_token_logprob(h, w, b, y, temperature=tau, chunk_tokens=chunk, with_entropy=True)
    assert logp.dtype == entropy.dtype == torch.float64 and logp.shape == entropy.shape == (n,)
    assert not entropy.requires_grad
    tol = FLOAT64_RTOL * float(ref.abs().max())
    torch.testing.assert_close(logp, ref.detach(), rtol=0, atol=tol)
    torch.testing.assert_close(entropy, ref_entropy.detach(), rtol=0, atol=tol)
    got = torch.autograd.grad((coef * logp).sum(), (h, w, b))
    for g, r in zip(got, ref_grads, strict=True):
        assert rel_err(g, r) <= FLOAT64_RTOL
    # without the entropy: the same log-probs
    alone, none = chunked_token_logprob(h, w, b, y, temperature=tau, chunk_tokens=chunk)
    assert none is None and torch.equal(alone, logp)


def test_function_checks_its_inputs():
    h, w, y = torch.zeros(3, 4), torch.zeros(VOCAB, 4), torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="temperature"):
        chunked_token_logprob(h, w, None, y, temperature=0.0)
    with pytest.raises(ValueError, match="logprob_chunk_tokens"):
        chunked_token_logprob(h, w, None, y, chunk_tokens=0)
    with pytest.raises(ValueError, match="share d"):
        chunked_token_logprob(h, torch.zeros(VOCAB, 5), None, y)
    with pytest.raises(ValueError, match="targets"):
        chunked_token_logprob(h, w, None, y[:2])


# --------------------------------------------------------------------------------------------
# completion_scores on the tiny Qwen3


@pytest.fixture(scope="module")
def models():
    """{dtype: the tiny Qwen3 in that dtype}; the tests never change their weights."""
    return {dtype: tiny_qwen3(dtype) for dtype in TOL}


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
def test_values_and_entropy_match_the_full_logits(models, dtype, chunk):
    model = models[dtype]
    assert model.config.tie_word_embeddings
    ids, att, mask = batch()
    with torch.no_grad():
        ref, ref_entropy = plain_scores(model, ids, att, T, TAU)
        got = completion_scores(
            model, ids, att, T, temperature=TAU, completion_mask=mask, with_entropy=True, chunk_tokens=chunk
        )
        every = completion_scores(model, ids, att, T, temperature=TAU, chunk_tokens=chunk)
    assert got.keys() == {"logp", "entropy"} and every.keys() == {"logp"}
    assert got["logp"].dtype == got["entropy"].dtype == torch.promote_types(dtype, torch.float32)
    assert got["logp"].shape == (4, T)
    assert 0.5 < float(ref_entropy.min()) and float(ref_entropy.max()) < math.log(VOCAB) - 0.1  # not uniform
    assert logit_gross(model, ids, att, T, TAU) <= LOGIT_GROSS  # what TOL's float32 bound assumes
    tol = TOL[dtype] * (float(ref.abs().max()) if dtype == torch.float64 else 1.0)
    torch.testing.assert_close(got["logp"], ref * mask, rtol=0, atol=tol)
    torch.testing.assert_close(got["entropy"], ref_entropy * mask, rtol=0, atol=tol)
    assert float(got["logp"][mask == 0].abs().max()) == 0.0 == float(got["entropy"][mask == 0].abs().max())
    torch.testing.assert_close(every["logp"], ref, rtol=0, atol=tol)  # no mask: every position, padding too
    assert "forward" not in model.lm_head.__dict__  # the head is itself again


def _weighted_loss(scorer, chunk):
    """loss = Σ_bt c_bt · logp_bt over the scored positions, fixed random c."""
    ids, att, mask = batch()
    coef = torch.randn(mask.shape, generator=torch.Generator().manual_seed(SEED + 3)) * mask

    def loss_of(model):
        if scorer == "plain":
            logp, _ = plain_scores(model, ids, att, T, TAU)
        else:
            logp = completion_scores(
                model, ids, att, T, temperature=TAU, completion_mask=mask, chunk_tokens=chunk
            )["logp"]
        return (coef.to(logp.dtype) * logp).sum()

    return loss_of


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
def test_lora_gradients_match(models, dtype, chunk):
    model = lora(models[dtype])
    want = grads(model, _weighted_loss("plain", chunk))
    assert len(want) == 2 * 2 * len(LORA_TARGETS)  # A and B of every target, both layers
    assert_same_grads(grads(model, _weighted_loss("chunked", chunk)), want, TOL[dtype])


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
def test_full_finetune_gradients_match_with_tied_embeddings(models, dtype, chunk):
    model = models[dtype]
    assert model.lm_head.weight is model.model.embed_tokens.weight  # W is trained through both uses
    want = grads(model, _weighted_loss("plain", chunk))
    assert "model.embed_tokens.weight" in want
    assert_same_grads(grads(model, _weighted_loss("chunked", chunk)), want, TOL[dtype])


def test_a_batch_with_nothing_scored_gives_zeros_and_zero_gradients(models):
    """The trainer's empty pass (a process with no unmasked token still runs a forward and backward so
    that collectives match): N = 0 scored positions, logp 0, a backward that gives zero gradients."""
    model = lora(models[torch.float32])
    ids, att, mask = batch()
    res = completion_scores(
        model, ids, att, T, temperature=TAU, completion_mask=torch.zeros_like(mask), with_entropy=True
    )
    assert float(res["logp"].abs().max()) == 0.0 == float(res["entropy"].abs().max())
    res["logp"].sum().backward()
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert all(p.grad is not None and float(p.grad.abs().max()) == 0.0 for p in trainable)
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("mode", ["bfloat16", "autocast"])
def test_bfloat16_and_autocast_match_within_bfloat16_rounding(models, mode):
    """A bfloat16 model, and a float32 one under CPU autocast to bfloat16: the head's matmul runs in
    bfloat16 (into the low-precision buffer), then float32. The two scorers' bfloat16 matmuls may round
    differently (another blocking): compared at bfloat16's resolution (2^-8 relative, logits of order 5)."""
    model = lora(tiny_qwen3(torch.bfloat16) if mode == "bfloat16" else models[torch.float32])
    ids, att, mask = batch()
    on = mode == "autocast"
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=on):
        want = grads(model, _weighted_loss("plain", 7))
        got = grads(model, _weighted_loss("chunked", 7))
        with torch.no_grad():
            ref, ref_entropy = plain_scores(model, ids, att, T, TAU)
            res = completion_scores(
                model, ids, att, T, temperature=TAU, completion_mask=mask, with_entropy=True, chunk_tokens=7
            )
    torch.testing.assert_close(res["logp"], ref * mask, rtol=0, atol=5e-2)
    torch.testing.assert_close(res["entropy"], ref_entropy * mask, rtol=0, atol=5e-2)
    assert_same_grads(got, want, 5e-2)


@pytest.fixture
def process_group(tmp_path):
    """A one-process gloo group (the test's own, destroyed after; an existing one is used as it is)."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_gradients_through_ddp(models, process_group):
    """The call goes through DDP's forward (its gradient hooks fire): the same gradients as unwrapped."""
    from torch.nn.parallel import DistributedDataParallel

    model = lora(models[torch.float64])
    want = grads(model, _weighted_loss("plain", 7))
    wrapped = DistributedDataParallel(model)
    assert_same_grads(grads(wrapped, _weighted_loss("chunked", 7)), want, FLOAT64_RTOL)


def test_gradients_through_fsdp2(models, process_group):
    """FSDP2 (``fully_shard``) swaps the parameters for unsharded ones only inside the root's forward,
    where the chunked head runs: full fine-tune, tied embeddings, the same gradients."""
    from torch.distributed.fsdp import fully_shard

    model = copy.deepcopy(models[torch.float64])
    want = grads(model, _weighted_loss("plain", 7))
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    assert_same_grads(grads(model, _weighted_loss("chunked", 7)), want, FLOAT64_RTOL)


def test_objectives_give_the_same_loss_and_gradients(models):
    """Every objective variant of the trainer's tests (each registered objective, the DFPO transforms),
    off-policy so that clipping acts: ``compute_loss`` of either scorer's log-probs, same loss and ∇θ."""
    assert {name for name, _ in OBJECTIVES} == set(objective_names())
    model = lora(models[torch.float64])
    ids, att, mask = batch(8)
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    advantages = torch.tensor([1.2, -0.3, 0.5, -1.4, -0.9, 1.1, 0.6, -0.8], dtype=torch.float64)  # Σ = 0
    delta = torch.tensor([0.06, -0.04, 0.01, -0.06, 0.05, -0.02, 0.03, -0.05], dtype=torch.float64)
    with torch.no_grad():
        old_logp = (plain_scores(model, ids, att, T, TAU)[0] - delta[:, None]) * mask
    for objective, params in OBJECTIVES:
        losses = {}

        def loss_of(m, scorer, objective=objective, params=params, losses=losses):
            if scorer == "plain":
                logp = plain_scores(m, ids, att, T, TAU)[0]
            else:
                logp = completion_scores(
                    m, ids, att, T, temperature=TAU, completion_mask=mask, chunk_tokens=5
                )
                logp = logp["logp"]
            loss, _ = compute_loss(objective, logp, old_logp, advantages, mask, group, **params)
            losses[scorer] = float(loss.detach())
            return loss

        want = grads(model, lambda m, f=loss_of: f(m, "plain"))
        got = grads(model, lambda m, f=loss_of: f(m, "chunked"))
        assert abs(losses["chunked"] - losses["plain"]) <= FLOAT64_RTOL, _id((objective, params))
        # Table 3's no-stop-grad ablation: Σ_i Â_i·T(s̄)_i = 0 for every θ, so no gradient (test_update.py)
        assert_same_grads(got, want, FLOAT64_RTOL, nonzero=params.get("stop_grad") is not False)


# --------------------------------------------------------------------------------------------
# memory: one chunk of logits at a time


class LiveVocabTensors(TorchDispatchMode):
    """Records every tensor an op returns whose last dimension is the vocabulary (logits, their
    probabilities, their gradient): the largest one, and the peak bytes of those alive at once (by
    storage; a storage is alive until the tensor that first held it is freed). ``skip``: storages not
    to count (the weight W itself, whose transpose has V columns)."""

    def __init__(self, vocab: int, skip: set[int]):
        super().__init__()
        self.vocab, self.skip = vocab, skip
        self.live: dict[int, int] = {}
        self.peak = self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if not (isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-1] == self.vocab):
                continue
            key = t.untyped_storage().data_ptr()
            if key in self.skip:
                continue
            self.largest = max(self.largest, t.numel() * t.element_size())
            if key not in self.live:
                self.live[key] = t.untyped_storage().nbytes()
                weakref.finalize(t, self.live.pop, key, None)
                self.peak = max(self.peak, sum(self.live.values()))
        return out


@pytest.mark.parametrize("with_entropy", [False, True])
def test_forward_and_backward_hold_one_chunk_of_logits(models, with_entropy):
    """Full fine-tune (W gets a gradient too), 18 scored positions in chunks of 4 (a partial last one)."""
    model, chunk = models[torch.float32], 4
    ids, att, mask = batch()
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    one_chunk = chunk * VOCAB * 4  # float32 bytes
    assert int(mask.sum()) == 18
    with LiveVocabTensors(VOCAB, skip) as forward:
        res = completion_scores(
            model,
            ids,
            att,
            T,
            temperature=TAU,
            completion_mask=mask,
            with_entropy=with_entropy,
            chunk_tokens=chunk,
        )
    with LiveVocabTensors(VOCAB, skip) as backward:
        res["logp"].sum().backward()
    model.zero_grad(set_to_none=True)
    # never more than one chunk's logits in one tensor; alive at once: the chunk's logits, and with the
    # entropy one temporary (exp) of the same size; the backward turns the logits into their gradient in place
    assert forward.largest == backward.largest == one_chunk
    assert forward.peak <= (2 if with_entropy else 1) * one_chunk
    assert backward.peak <= one_chunk
    with LiveVocabTensors(VOCAB, skip) as meter:  # the meter sees the reference's full logits
        plain_scores(model, ids, att, T, TAU)[0].sum().backward()
    model.zero_grad(set_to_none=True)
    assert meter.largest >= 4 * (P + T) * VOCAB * 4


def test_autograd_saves_no_logits(models):
    """What the backward keeps from the forward (``saved_tensors_hooks``): nothing with V columns, where
    the reference keeps its (B, T, V) log-softmax."""
    model = lora(models[torch.float32])
    ids, att, mask = batch()

    def saved_shapes(fn):
        shapes = []

        def pack(t):
            shapes.append(tuple(t.shape))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        return [s for s in shapes if s and s[-1] == VOCAB]

    chunked = saved_shapes(
        lambda: completion_scores(model, ids, att, T, temperature=TAU, completion_mask=mask)
    )
    assert chunked == []
    plain = saved_shapes(lambda: plain_scores(model, ids, att, T, TAU))
    assert any(len(s) == 3 and s[0] * s[1] >= 4 * T for s in plain)


# --------------------------------------------------------------------------------------------
# what it refuses


def test_a_lora_wrapped_head_is_refused(models):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(copy.deepcopy(models[torch.float32]), LoraConfig(r=2, target_modules=["lm_head"]))
    ids, att, _ = batch()
    with pytest.raises(ValueError, match=r"nn\.Linear.*lora_target_modules"):
        completion_scores(model, ids, att, T)


def test_a_model_that_softcaps_its_logits_is_refused():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8,
    )  # fmt: skip
    assert config.final_logit_softcapping is not None  # Gemma 2's default
    ids, att, _ = batch()
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        completion_scores(Gemma2ForCausalLM(config), ids, att, T)


def test_a_forward_without_logits_to_keep_is_refused():
    from transformers import TrOCRConfig, TrOCRForCausalLM

    config = TrOCRConfig(
        vocab_size=VOCAB, d_model=16, decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=32
    )
    ids, att, _ = batch()
    with pytest.raises(ValueError, match="logits_to_keep"):
        completion_scores(TrOCRForCausalLM(config), ids, att, T)


def test_bad_arguments_name_what_to_fix(models):
    model = models[torch.float32]
    ids, att, mask = batch()
    with pytest.raises(ValueError, match="completion_len"):
        completion_scores(model, ids, att, P + T)
    with pytest.raises(ValueError, match="completion_mask"):
        completion_scores(model, ids, att, T, completion_mask=mask[:, 1:])
    with pytest.raises(ValueError, match="temperature"):
        completion_scores(model, ids, att, T, temperature=-1.0)
    with pytest.raises(ValueError, match="logprob_chunk_tokens"):
        completion_scores(model, ids, att, T, chunk_tokens=0)
    with pytest.raises(ValueError, match="attention_mask"):
        completion_scores(model, ids, att[:, 1:], T)


def test_the_head_is_restored_when_the_model_raises(models):
    model = models[torch.float32]
    ids, att, _ = batch()
    bad = ids.clone()
    bad[0, -1] = VOCAB + 5  # no such token: the embedding raises inside the forward
    with pytest.raises(IndexError):
        completion_scores(model, bad, att, T)
    assert "forward" not in model.lm_head.__dict__
    with torch.no_grad():
        assert model(input_ids=ids, attention_mask=att).logits.shape == (4, P + T, VOCAB)
