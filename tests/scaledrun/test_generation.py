"""Generation that samples exactly the run's policy (``scaledrun.backends``): no setting leaks from a
model's generation config, the stop tokens are the union of every end token, rows are generated in
chunks of ``generation_batch_size``. Each test runs on the tiny model's own tokenizer and on Qwen's real
one (``qwen_tiny_model``: Qwen3's special tokens, chat template and end tokens)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from scaledrun.backends import (
    BACKENDS,
    HFBackend,
    Sampling,
    generation_config,
    make_backend,
    stop_token_ids,
)
from scaledrun.config import RunConfig
from scaledrun.rollout import first_eos_mask, generate_texts, score_completions
from scaledrun.tasks import format_prompt

#: Every test here samples a tiny model (on either tokenizer).
pytestmark = pytest.mark.sampling

PROMPTS = ["What is 12+34?", "What is 5+61?", "What is 70+8?"]


def _load(path):
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    return model, tok, [format_prompt(tok, p) for p in PROMPTS]


@pytest.fixture(scope="module", params=["tiny_model", "qwen_tiny_model"])
def _loaded_once(request):
    return _load(request.getfixturevalue(request.param))


@pytest.fixture
def loaded(_loaded_once):
    """(model, tokenizer, chat-formatted PROMPTS) of the tiny model on its own tokenizer, then on Qwen's:
    copies, which a test may change (loading Qwen's 151k-token tokenizer takes seconds)."""
    model, tok, prompts = _loaded_once
    return copy.deepcopy(model), copy.deepcopy(tok), list(prompts)


LEAKY = {"repetition_penalty": 3.0, "no_repeat_ngram_size": 1, "min_p": 0.3}


def _encode(tok, prompts):
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc["input_ids"], enc["attention_mask"]


@pytest.mark.parametrize("do_sample", [False, True])
def test_a_models_generation_settings_do_not_leak_into_sampling(loaded, do_sample):
    """With repetition_penalty 3.0, no_repeat_ngram_size 1 and min_p 0.3 in the model's generation config,
    the backend samples exactly what it samples from a model with a clean config (same seed); the plain
    ``generate`` call honours the leaky settings (no token twice in a completion: no_repeat_ngram_size 1)."""
    model, tok, prompts = loaded
    ids, am = _encode(tok, prompts)
    stop = stop_token_ids(model, tok)
    sampling = Sampling(max_new_tokens=24, do_sample=do_sample, stop_ids=tuple(stop), pad_id=tok.pad_token_id)
    clean = HFBackend(model)
    torch.manual_seed(0)
    want = clean.generate(ids, am, num_generations=4, sampling=sampling)
    for key, value in LEAKY.items():
        setattr(model.generation_config, key, value)
    torch.manual_seed(0)
    got = HFBackend(model).generate(ids, am, num_generations=4, sampling=sampling)
    assert torch.equal(got, want)
    assert model.generation_config.repetition_penalty == 3.0  # restored after the call
    # the leak is real: generate fills what a call leaves unset from the model's config
    torch.manual_seed(0)
    plain = model.generate(
        input_ids=ids.repeat_interleave(4, 0), attention_mask=am.repeat_interleave(4, 0), max_new_tokens=24,
        do_sample=do_sample, eos_token_id=stop, pad_token_id=tok.pad_token_id,
    )[:, ids.shape[1] :]  # fmt: skip
    mask, _ = first_eos_mask(plain, stop)
    for row, m in zip(plain, mask, strict=True):
        tokens = row[m.bool()].tolist()
        assert len(tokens) == len(set(tokens)), tokens


def test_generation_config_sets_every_sampling_field():
    cfg = generation_config(
        Sampling(max_new_tokens=7, temperature=0.6, top_p=0.95, stop_ids=(2, 5), pad_id=3)
    )
    assert (cfg.do_sample, cfg.temperature, cfg.top_p, cfg.top_k) == (True, 0.6, 0.95, 0)
    assert (cfg.repetition_penalty, cfg.no_repeat_ngram_size, cfg.num_beams) == (1.0, 0, 1)
    assert cfg.eos_token_id == [2, 5] and cfg.pad_token_id == 3 and cfg.max_new_tokens == 7
    greedy = generation_config(Sampling(max_new_tokens=7, do_sample=False, temperature=0.6))
    assert greedy.do_sample is False and greedy.temperature == 1.0


def test_stop_tokens_are_the_union_of_every_end_token(loaded):
    model, tok, _ = loaded
    vocab = tok.get_vocab()
    im_end, eot = vocab["<|im_end|>"], vocab["<|endoftext|>"]
    assert tok.eos_token == "<|im_end|>" and "<|im_end|>" in tok.chat_template
    model.generation_config.eos_token_id = [eot]
    assert stop_token_ids(model, tok) == [im_end, eot]  # tokenizer, then the generation config
    # a tokenizer whose EOS is <|endoftext|> still stops at the template's end of turn
    tok.eos_token = "<|endoftext|>"
    model.generation_config.eos_token_id = None
    assert stop_token_ids(model, tok) == [eot, im_end]
    # and the completion mask runs through the first of them
    comp = torch.tensor([[7, 8, eot, 9], [7, im_end, 9, 9], [7, 8, 9, 9]])
    mask, truncated = first_eos_mask(comp, stop_token_ids(model, tok))
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    assert truncated.tolist() == [False, False, True]


def test_rows_are_generated_in_chunks(loaded):
    """``generation_batch_size`` rows per ``generate`` call; the chunks' completions are assembled in
    order and padded to the widest."""
    model, tok, prompts = loaded
    ids, am = _encode(tok, [prompts[0]] * 2)
    stop = stop_token_ids(model, tok)
    sampling = Sampling(max_new_tokens=12, do_sample=False, stop_ids=tuple(stop), pad_id=tok.pad_token_id)
    calls = []
    real = model.generate

    def recording(**kw):
        out = real(**kw)
        calls.append((kw["input_ids"].shape[0], out[:, kw["input_ids"].shape[1] :]))
        return out

    model.generate = recording
    try:
        whole = HFBackend(model).generate(ids, am, num_generations=3, sampling=sampling)
        assert [n for n, _ in calls] == [6]
        calls.clear()
        chunked = HFBackend(model, batch_size=4).generate(ids, am, num_generations=3, sampling=sampling)
        assert [n for n, _ in calls] == [4, 2]
    finally:
        model.generate = real
    width = max(out.shape[1] for _, out in calls)
    assert chunked.shape == (6, width)
    assert torch.equal(chunked[:4, : calls[0][1].shape[1]], calls[0][1])
    assert torch.equal(chunked[4:, : calls[1][1].shape[1]], calls[1][1])
    assert whole.shape[0] == 6 and all(
        torch.equal(whole[0], row) for row in whole
    )  # one call, identical rows


def test_generate_texts_with_a_chunked_backend(loaded):
    model, tok, prompts = loaded
    a = generate_texts(model, tok, prompts, n=2, max_new_tokens=10, do_sample=False)
    b = generate_texts(
        model, tok, prompts, n=2, max_new_tokens=10, do_sample=False, backend=HFBackend(model, 1)
    )
    # greedy: a prompt's two rows agree (in one call, and each alone)
    assert len(a) == len(b) == 6 and a[0] == a[1] and b[0] == b[1] and b[4] == b[5]


def test_backend_names_and_errors(loaded):
    model, _, _ = loaded
    assert set(BACKENDS) == {"hf", "paged"} and isinstance(make_backend("hf", model, 4), HFBackend)
    with pytest.raises(ValueError, match="rollout_backend"):
        make_backend("vllm", model)
    with pytest.raises(ValueError, match="rollout_backend"):
        RunConfig(rollout_backend="vllm")
    with pytest.raises(ValueError, match="generation_batch_size"):
        HFBackend(model, 0)
    assert isinstance(model.generation_config, GenerationConfig)


def test_qwen_stops_at_either_end_token_and_keeps_the_think_block(qwen_tiny_model):
    """Qwen's tokenizer and Qwen3's generation config: the stop tokens are <|im_end|> (151645, the
    tokenizer's EOS) then <|endoftext|> (151643, the generation config's second); a completion's mask runs
    through the first of them, its text keeps the ``<think>`` block (not a special token in Qwen3) and
    drops the end token; a completion cut inside its think block is truncated."""
    model, tok, prompts = _load(qwen_tiny_model)
    assert stop_token_ids(model, tok) == [151645, 151643]
    think = tok("<think>\nadd\n</think>\n\n46", add_special_tokens=False)["input_ids"]
    assert think[0] == 151667 and 151668 in think
    pad = tok.pad_token_id
    rows = [
        [*think, 151645, 19, 19],  # ends at <|im_end|>; what follows is not part of the completion
        think[:3] + [151643] + [19] * (len(think) - 1),  # ends at <|endoftext|> inside the think block
        [*think, 19, 19, 19],  # no end token: truncated
    ]
    enc = tok([prompts[0]] * 3, return_tensors="pt", padding=True, add_special_tokens=False)
    batch, _ = score_completions(
        model, tok, enc["input_ids"], enc["attention_mask"], torch.tensor(rows),
        prompts=[prompts[0]] * 3, answers=["46"] * 3, group_ids=[0, 0, 0], temperature=1.0,
    )  # fmt: skip
    n = len(think)
    assert batch.completion_mask.sum(1).tolist() == [n + 1, 4, n + 3]
    assert batch.truncated.tolist() == [False, False, True]
    assert batch.completions[0] == "<think>\nadd\n</think>\n\n46"
    assert batch.completions[1] == tok.decode(think[:3]) and batch.completions[1].startswith("<think>\n")
    assert batch.completions[2] == "<think>\nadd\n</think>\n\n46444"
    assert batch.input_ids[0, enc["input_ids"].shape[1] + n + 1 :].tolist() == [
        pad,
        pad,
    ]  # after EOS: padding
