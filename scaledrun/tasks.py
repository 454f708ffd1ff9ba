"""Verifiable tasks: synthetic ones generated offline from a seed, or JSONL/Parquet files.

Built-in synthetic tasks (``TASKS``), all with the integer result as the gold answer text:

- ``arithmetic``: ``What is 37 + 45?`` → ``82``; multi-digit addition/subtraction in digits;
- ``arithmetic_words``: the same problems with the operands written in words
  (``What is thirty-seven plus forty-five?``), the answer still the integer in digits;
- ``template``: the same problems, but the reference completion is a longer answer template
  (``Let me compute 37 + 45. The sum of 37 and 45 is 82. The answer is 82.``), so the completions
  of a group share many template tokens (the setting where cancellation matters, DFPO Sec. 3);
- ``template_forms``: the ``template`` prompts with two equally correct reference completions
  (``Task.forms``) that share the template's prefix and suffix and differ in one middle clause:
  ``Let me compute 37 + 45. The sum of 37 and 45 is 82. The answer is 82.`` and
  ``Let me compute 37 + 45. Adding 37 and 45 gives 82. The answer is 82.`` (subtraction:
  ``The difference of 73 and 45 is 28.`` / ``Subtracting 45 from 73 gives 28.``). ``exact_match`` gives
  both reward 1, so how a policy splits its mass between them (the equivalent-solution entropy, the
  trainer's ``eval/form_entropy``) is measurable; which form is the ``solution`` (form 0) carries no
  meaning, and the tiny model's warm start trains on both forms of every problem equally.

Splits: a problem belongs to the eval split when ``crc32("a op b") % 5 == 0`` and to the train split
otherwise, so train and eval are disjoint for every seed; the seed only decides which problems of
a split are drawn and in what order. Subtraction keeps the larger operand first (no negative
results).

Files: ``load_task("data.jsonl", ...)`` reads a JSONL (``.json``/``.jsonl``) or Parquet file with
``datasets.load_dataset("json" | "parquet", data_files=...)``, all local. A path containing
``{split}`` (``data/{split}.jsonl``) reads one file per split; a single file is split with the same
hash rule on the prompt text.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Valid ``split`` values.
SPLITS = ("train", "eval")
#: File suffixes ``load_task`` reads, and the ``datasets`` builder for each.
FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
#: One in ``EVAL_MOD`` problems (by hash) is held out for evaluation.
EVAL_MOD = 5


@dataclass(frozen=True)
class Task:
    """One verifiable example.

    ``prompt``: the user message (before the chat template); ``answer``: the gold answer the reward
    compares with; ``solution``: a reference completion (the supervised warm start's target; equal to
    ``answer`` except for the ``template`` tasks, where it is the full answer template); ``forms``: every
    equally correct reference completion (``solution`` first) when a task has several surface forms of
    the same answer (``template_forms``), empty otherwise (then ``solution`` is the only one).
    """

    prompt: str
    answer: str
    solution: str
    forms: tuple[str, ...] = ()

    @property
    def references(self) -> tuple[str, ...]:
        """The reference completions: ``forms`` if given, else ``(solution,)``."""
        return self.forms or (self.solution,)


# --------------------------------------------------------------------------------------------
# synthetic tasks

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen".split()
)
_ONES += "sixteen seventeen eighteen nineteen".split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ((10**9, "billion"), (10**6, "million"), (1000, "thousand"), (100, "hundred"))
_OP_WORDS = {"+": "plus", "-": "minus"}


def number_to_words(n: int) -> str:
    """English words for an integer: ``345`` → ``three hundred forty-five``, ``-7`` → ``minus seven``."""
    if n < 0:
        return "minus " + number_to_words(-n)
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + ("-" + _ONES[ones] if ones else "")
    for value, name in _SCALES:
        if n >= value:
            head, rest = divmod(n, value)
            return f"{number_to_words(head)} {name}" + (f" {number_to_words(rest)}" if rest else "")
    raise AssertionError("unreachable")


def _operands(rng: random.Random, digits: int, ops: str) -> tuple[int, str, int]:
    lo, hi = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1
    a, b, op = rng.randint(lo, hi), rng.randint(lo, hi), rng.choice(ops)
    if op == "-" and b > a:
        a, b = b, a
    return a, op, b


def _in_split(key: str, split: str) -> bool:
    held_out = zlib.crc32(key.encode()) % EVAL_MOD == 0
    return held_out if split == "eval" else not held_out


def _result(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def _arithmetic(a: int, op: str, b: int) -> Task:
    ans = str(_result(a, op, b))
    return Task(f"What is {a} {op} {b}?", ans, ans)


def _arithmetic_words(a: int, op: str, b: int) -> Task:
    ans = str(_result(a, op, b))
    return Task(f"What is {number_to_words(a)} {_OP_WORDS[op]} {number_to_words(b)}?", ans, ans)


def _template(a: int, op: str, b: int) -> Task:
    ans = str(_result(a, op, b))
    kind = "sum" if op == "+" else "difference"
    solution = f"Let me compute {a} {op} {b}. The {kind} of {a} and {b} is {ans}. The answer is {ans}."
    prompt = f"Compute {a} {op} {b}. Explain briefly and end with 'The answer is N.'"
    return Task(prompt, ans, solution)


def _template_forms(a: int, op: str, b: int) -> Task:
    ans = str(_result(a, op, b))
    head, tail = f"Let me compute {a} {op} {b}.", f"The answer is {ans}."
    if op == "+":
        middles = (f"The sum of {a} and {b} is {ans}.", f"Adding {a} and {b} gives {ans}.")
    else:
        middles = (f"The difference of {a} and {b} is {ans}.", f"Subtracting {b} from {a} gives {ans}.")
    forms = tuple(f"{head} {m} {tail}" for m in middles)
    prompt = f"Compute {a} {op} {b}. Explain briefly and end with 'The answer is N.'"
    return Task(prompt, ans, forms[0], forms)


#: Synthetic task name → builder of one Task from (a, op, b).
TASKS: dict[str, Callable[[int, str, int], Task]] = {
    "arithmetic": _arithmetic,
    "arithmetic_words": _arithmetic_words,
    "template": _template,
    "template_forms": _template_forms,
}


def synthetic_tasks(
    name: str, split: str, n: int, seed: int = 0, digits: int = 2, ops: str = "+-"
) -> list[Task]:
    """``n`` distinct problems of the synthetic task ``name`` from ``split``, deterministic for ``seed``."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid: {', '.join(TASKS)}")
    _check_split(split)
    if digits < 1:
        raise ValueError(f"`digits` must be ≥ 1, got {digits}")
    if not ops or set(ops) - set(_OP_WORDS):
        raise ValueError(f"`ops` must be a non-empty string of '+' and '-', got {ops!r}")
    if n < 0:
        raise ValueError(f"`n` must be ≥ 0, got {n}")
    # the split's problems are drawn by rejection from a stream that depends on (seed, split) only
    rng = random.Random(f"{seed}/{split}")
    seen: set[tuple[int, str, int]] = set()
    out: list[Task] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 50 * n + 10_000:
            raise ValueError(
                f"task {name!r} ({digits} digit(s), ops {ops!r}) has only about {len(out)} distinct {split} "
                f"problems, fewer than the {n} asked; ask for fewer or use more digits"
            )
        a, op, b = _operands(rng, digits, ops)
        key = (a, op, b)
        if key in seen or not _in_split(f"{a} {op} {b}", split):
            continue
        seen.add(key)
        out.append(TASKS[name](a, op, b))
    return out


# --------------------------------------------------------------------------------------------
# files


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")


def task_files(path: str) -> dict[str, Path]:
    """The file each split reads from a task path (``{split}`` in the path gives one file per split)."""
    return {s: Path(path.replace("{split}", s)) for s in SPLITS}


def is_task_file(name_or_path: str) -> bool:
    """Whether ``name_or_path`` names a file (by its suffix) rather than a synthetic task."""
    return Path(name_or_path).suffix.lower() in FILE_BUILDERS


def _load_file(
    path: str, split: str, n: int | None, seed: int, prompt_field: str, answer_field: str
) -> list[Task]:
    import datasets  # heavy import, only when a file is used

    file = task_files(path)[split]
    suffix = file.suffix.lower()
    if suffix not in FILE_BUILDERS:
        raise ValueError(
            f"task file {file}: unsupported suffix {suffix!r}; valid: {', '.join(FILE_BUILDERS)}"
        )
    if not file.is_file():
        raise FileNotFoundError(f"task file {file} does not exist")
    if file.stat().st_size == 0:
        raise ValueError(f"task file {file} is empty: it holds no rows")
    try:
        ds = datasets.load_dataset(FILE_BUILDERS[suffix], data_files=str(file), split="train")
    except Exception as err:  # datasets' own errors can be bare; say which file failed
        raise ValueError(f"task file {file} could not be read as {FILE_BUILDERS[suffix]}: {err!r}") from err
    if len(ds) == 0:
        raise ValueError(f"task file {file} is empty: it holds no rows")
    for field in (prompt_field, answer_field):
        if field not in ds.column_names:
            raise ValueError(
                f"task file {file} has no field {field!r} (columns: {', '.join(ds.column_names)}); "
                "set `prompt_field`/`answer_field` to the right column"
            )
    rows: list[Task] = []
    for i, row in enumerate(ds):
        prompt, answer = row[prompt_field], row[answer_field]
        if prompt is None or answer is None:
            raise ValueError(
                f"task file {file}, row {i}: field {prompt_field!r} or {answer_field!r} is empty"
            )
        rows.append(Task(str(prompt), str(answer), str(answer)))
    if "{split}" not in path:
        rows = [t for t in rows if _in_split(t.prompt, split)]
        if not rows:
            raise ValueError(f"task file {file} has no {split} rows (one prompt in {EVAL_MOD} goes to eval)")
    random.Random(seed).shuffle(rows)
    if n is None:
        return rows
    if n > len(rows):
        raise ValueError(f"task file {file} has {len(rows)} {split} rows, fewer than the {n} asked")
    return rows[:n]


def load_task(
    name_or_path: str,
    split: str,
    n: int | None,
    seed: int = 0,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    *,
    digits: int = 2,
    ops: str = "+-",
) -> list[Task]:
    """``n`` examples of a synthetic task or a JSONL/Parquet file, deterministic for ``seed``.

    Args:
        name_or_path: a name in ``TASKS`` or a ``.jsonl``/``.json``/``.parquet`` path (``{split}`` in
            the path is replaced by the split name).
        split: ``"train"`` or ``"eval"`` (disjoint).
        n: how many examples (``None``: all rows of a file; required for synthetic tasks).
        seed: which examples and their order.
        prompt_field, answer_field: the file's columns (ignored for synthetic tasks).
        digits, ops: operand digits and operators of the synthetic tasks.
    """
    _check_split(split)
    if name_or_path in TASKS:
        if n is None:
            raise ValueError("synthetic tasks need `n`, the number of examples")
        return synthetic_tasks(name_or_path, split, n, seed, digits, ops)
    if is_task_file(name_or_path):
        return _load_file(name_or_path, split, n, seed, prompt_field, answer_field)
    raise ValueError(
        f"unknown task {name_or_path!r}; valid: {', '.join(TASKS)}, or a path ending in {', '.join(FILE_BUILDERS)}"
    )


def format_prompt(tokenizer: Any, prompt: str) -> str:
    """The prompt as the model sees it: one user turn through the tokenizer's chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the tokenizer has no `chat_template`; use an instruct/chat checkpoint or set tokenizer.chat_template"
        )
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )
