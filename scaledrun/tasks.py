"""Verifiable tasks: synthetic ones generated offline from a seed, or rows of a dataset.

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

Synthetic splits: a problem belongs to the eval split when ``crc32("a op b") % 5 == 0`` and to the
train split otherwise, so train and eval are disjoint for every seed; the seed only decides which
problems of a split are drawn and in what order. Subtraction keeps the larger operand first (no
negative results). ``n=None`` draws ``SYNTHETIC_DEFAULT_N`` (64) problems.

Datasets (``load_task(source, ...)`` for any ``source`` that is not a synthetic task name), read with
the ``datasets`` library; nothing is downloaded unless ``source`` is a hub name:

- a ``.jsonl``/``.json``/``.parquet`` file (``datasets.load_dataset("json" | "parquet", data_files=...)``,
  offline); ``{split}`` in the path (``data/{split}.jsonl``) reads one file per split name;
- a local folder written by ``save_to_disk`` (``datasets.load_from_disk``; a ``DatasetDict`` is read
  by split name, a single ``Dataset`` is one split), or any other local folder of data files
  (``datasets.load_dataset(folder, split=...)``, split names from the file names);
- otherwise a hub dataset name (``datasets.load_dataset(name, dataset_config, split=...)``; split
  strings such as ``train[:1000]`` work there).

Splits of a dataset (the roles ``"train"`` and ``"eval"``): the train role reads ``train_split``; the
eval role reads ``eval_split`` (a split name of the same dataset, or the path of a file), or, with
``eval_fraction`` instead, the rows of the train split whose prompt hashes below that fraction (the
train role then leaves them out: disjoint, the same rows for every seed, duplicates of a prompt on
one side). With neither the dataset has no eval rows: nothing is held out silently
(``has_eval_source``).

Columns: ``prompt_field`` and ``answer_field`` name columns, dotted for nested ones
(``reward_model.ground_truth`` reads ``row["reward_model"]["ground_truth"]``, as in verl's parquet
files; a column whose own name holds the dot, as ``Dataset.flatten`` writes, is found too). A prompt is
a string (one user message) or a list of ``{"role", "content"}`` messages given to the chat template
as they are. Every other column travels with the task (``Task.extra``) to the reward functions as a
keyword argument (``reward_columns``), as TRL's reward functions receive the dataset's columns.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Valid ``split`` values (the roles a task list plays).
SPLITS = ("train", "eval")
#: File suffixes ``load_task`` reads, and the ``datasets`` builder for each.
FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
#: One in ``EVAL_MOD`` synthetic problems (by hash) is held out for evaluation.
EVAL_MOD = 5
#: Problems a synthetic task draws when ``n`` is None (the tiny run's ``num_train``).
SYNTHETIC_DEFAULT_N = 64
#: Names of the reward functions' positional arguments: a dataset column so named is not passed on.
RESERVED_COLUMNS = ("prompts", "completions", "answers")
#: ``apply_chat_template`` arguments ``format_prompt`` sets itself (or that would change what it
#: returns): not allowed in ``chat_template_kwargs``.
RESERVED_TEMPLATE_KWARGS = (
    "conversation", "tokenize", "add_generation_prompt", "continue_final_message", "return_dict",
    "return_tensors", "return_assistant_tokens_mask",
)  # fmt: skip
#: Files that mark a ``save_to_disk`` folder: a ``DatasetDict`` and a single ``Dataset``.
_DISK_DICT, _DISK_DATASET = "dataset_dict.json", "state.json"

#: A chat message, ``{"role": ..., "content": ...}``.
Message = dict[str, str]


@dataclass(frozen=True)
class Task:
    """One verifiable example.

    ``prompt``: the user message (before the chat template), or a tuple of chat messages
    (``{"role", "content"}`` dicts) given to the template as they are; ``answer``: the gold answer the
    reward compares with; ``solution``: a reference completion (the supervised warm start's target;
    equal to ``answer`` except for the ``template`` tasks, where it is the full answer template);
    ``forms``: every equally correct reference completion (``solution`` first) when a task has several
    surface forms of the same answer (``template_forms``), empty otherwise (then ``solution`` is the
    only one); ``decoys``: plausible wrong completions that the tiny model's supervised warm start
    also trains on, beside the references (``template_decoy``), so that RL starts from a policy that
    puts mass on a wrong branch after a shared head; never a reference; ``extra``: the dataset row's other columns (empty for synthetic tasks), given to the
    reward functions as keyword arguments. ``prompt`` and ``extra`` take part in equality, not in
    the hash (messages and column values need not be hashable).
    """

    prompt: str | tuple[Message, ...] = field(hash=False)
    answer: str
    solution: str
    forms: tuple[str, ...] = ()
    decoys: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False)

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


def _template_decoy(a: int, op: str, b: int) -> Task:
    """``template_forms`` plus one decoy: the same head, then a wrong shortcut (only the tens are
    combined), e.g. ``Let me compute 37 + 45. Adding the tens of 37 and 45 gives 70. The answer is 70.``
    It is wrong unless both units digits are 0 (``+``) or equal (``-``)."""
    base = _template_forms(a, op, b)
    tens = (a // 10 + b // 10) * 10 if op == "+" else (a // 10 - b // 10) * 10
    decoy = f"Let me compute {a} {op} {b}. Adding the tens of {a} and {b} gives {tens}. The answer is {tens}."
    if op == "-":
        decoy = f"Let me compute {a} {op} {b}. Subtracting the tens of {b} from {a} gives {tens}. The answer is {tens}."
    return Task(base.prompt, base.answer, base.solution, base.forms, (decoy,))


#: Synthetic task name → builder of one Task from (a, op, b).
TASKS: dict[str, Callable[[int, str, int], Task]] = {
    "arithmetic": _arithmetic,
    "arithmetic_words": _arithmetic_words,
    "template": _template,
    "template_forms": _template_forms,
    "template_decoy": _template_decoy,
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
# datasets: where the rows come from


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")


def is_task_file(name_or_path: str) -> bool:
    """Whether ``name_or_path`` names a file (by its suffix) rather than a synthetic task or a folder."""
    return Path(name_or_path).suffix.lower() in FILE_BUILDERS


def task_files(path: str, splits: Sequence[str] = SPLITS) -> dict[str, Path]:
    """The file each split name reads from a file source (``{split}`` in the path: one file per split)."""
    return {s: Path(path.replace("{split}", s)).expanduser() for s in splits}


def _looks_local(name: str) -> bool:
    """Whether a name that does not exist here was meant as a local path (a hub name is ``owner/name``)."""
    path = Path(name)
    return (
        is_task_file(name) or path.is_absolute() or name.startswith((".", "~")) or name.endswith("/")
        or len(path.parts) != 2 or path.parts[0] in ("artifacts", "runs")
    )  # fmt: skip


def source_kind(source: str) -> str:
    """How ``source`` is read: ``synthetic`` (a ``TASKS`` name), ``file``, ``disk`` (a ``save_to_disk``
    folder), ``folder`` (another local folder: its data files), ``hub`` (``owner/name``), or ``unknown``."""
    if source in TASKS:
        return "synthetic"
    if is_task_file(source):
        return "file"
    path = Path(source).expanduser()
    if path.is_dir():
        return "disk" if (path / _DISK_DICT).is_file() or (path / _DISK_DATASET).is_file() else "folder"
    return "unknown" if _looks_local(source) else "hub"


def _disk_splits(source: str) -> list[str] | None:
    """The split names of a ``save_to_disk`` DatasetDict folder; None for a single saved Dataset."""
    marker = Path(source).expanduser() / _DISK_DICT
    return list(json.loads(marker.read_text())["splits"]) if marker.is_file() else None


def _one_split(source: str) -> bool:
    """Whether ``source`` is a single split (a file without ``{split}``, a saved single Dataset)."""
    kind = source_kind(source)
    return (kind == "file" and "{split}" not in source) or (kind == "disk" and _disk_splits(source) is None)


def has_eval_source(task: str, eval_split: str | None = None, eval_fraction: float | None = None) -> bool:
    """Whether the task has eval rows: synthetic tasks always; a dataset only through ``eval_split`` or
    ``eval_fraction`` (a dataset is never split silently)."""
    return task in TASKS or eval_split is not None or eval_fraction is not None


def source_problems(
    task: str,
    train_split: str = "train",
    eval_split: str | None = None,
    eval_fraction: float | None = None,
    dataset_config: str | None = None,
) -> list[tuple[str, str]]:
    """What is wrong with a task source, as (config field, why) pairs; empty when nothing is.

    Local sources are checked on disk (files, split names of a saved DatasetDict); a hub name is not
    looked up (no network here).
    """
    kind = source_kind(task)
    if kind == "unknown":
        path = Path(task).expanduser()
        if path.is_file():
            why = f"unsupported file type {path.suffix!r}; valid: {', '.join(FILE_BUILDERS)}"
        elif "/" in task or task.startswith((".", "~")):
            why = f"no such file or folder: {task}"
        else:
            why = (
                f"unknown task; valid: {', '.join(TASKS)}, a path ending in {', '.join(FILE_BUILDERS)}, a "
                "folder written by `save_to_disk` or of data files, or a hub dataset as owner/name"
            )
        return [("task", why)]
    if kind == "synthetic":
        out = []
        if train_split != "train":
            out.append(
                ("train_split", "synthetic tasks have the splits train and eval only; leave it at 'train'")
            )
        for name, value in (("eval_split", eval_split), ("eval_fraction", eval_fraction)):
            if value is not None:
                out.append(
                    (name, "synthetic tasks have their own held-out split (a hash of the problem); unset it")
                )
        if dataset_config is not None:
            out.append(("dataset_config", "only hub datasets have configurations; unset it"))
        return out
    out = []
    if dataset_config is not None and kind != "hub":
        out.append(
            ("dataset_config", f"only hub datasets have configurations, and {task} is local; unset it")
        )
    if eval_split is not None and eval_fraction is not None:
        out.append(("eval_fraction", "set `eval_split` or `eval_fraction`, not both"))
    if eval_split is not None and eval_split == train_split:
        out.append(("eval_split", "is the train split: the eval would run on training prompts"))
    one = _one_split(task)
    if one and train_split != "train":
        out.append(
            ("train_split", f"{task} is one split (a single file or a saved Dataset); leave it at 'train'")
        )
    if kind == "file" and "{split}" in task:
        file = task_files(task, [train_split])[train_split]
        if not file.is_file():
            out.append(("task", f"the task file {file} (split {train_split!r}) does not exist"))
    elif kind == "file" and not Path(task).expanduser().is_file():
        out.append(("task", f"the task file {Path(task).expanduser()} does not exist"))
    splits = _disk_splits(task) if kind == "disk" else None
    if splits is not None and train_split not in splits:
        out.append(("train_split", f"{task} has no split {train_split!r}; its splits: {', '.join(splits)}"))
    if eval_split is not None:
        if is_task_file(eval_split):
            if "{split}" in eval_split:
                out.append(("eval_split", "is one file; a `{split}` pattern belongs in `task`"))
            elif not Path(eval_split).expanduser().is_file():
                out.append(("eval_split", f"the file {Path(eval_split).expanduser()} does not exist"))
        elif one:
            out.append(
                (
                    "eval_split",
                    f"{task} is one split (a single file or a saved Dataset): give a file path "
                    f"({', '.join(FILE_BUILDERS)}) or use `eval_fraction`",
                )
            )
        elif kind == "file":
            file = task_files(task, [eval_split])[eval_split]
            if not file.is_file():
                out.append(("eval_split", f"the task file {file} does not exist"))
        elif splits is not None and eval_split not in splits:
            out.append(("eval_split", f"{task} has no split {eval_split!r}; its splits: {', '.join(splits)}"))
    return out


def _read(source: str, split: str | None, dataset_config: str | None) -> tuple[Any, str]:
    """One split of ``source`` as a ``datasets.Dataset``, and how to name it in errors."""
    import datasets  # heavy import, only when a dataset is used

    kind = source_kind(source)
    path = Path(source).expanduser()
    if kind == "file":
        file = Path(source.replace("{split}", split or "")).expanduser() if "{split}" in source else path
        if not file.is_file():
            raise FileNotFoundError(f"task file {file} does not exist")
        if file.stat().st_size == 0:
            raise ValueError(f"task file {file} is empty: it holds no rows")
        builder = FILE_BUILDERS[file.suffix.lower()]
        where = f"task file {file}"

        def load() -> Any:
            return datasets.load_dataset(builder, data_files=str(file), split="train")

    elif kind == "disk":
        splits = _disk_splits(source)
        if splits is not None and split not in splits:
            raise ValueError(f"dataset {source} has no split {split!r}; its splits: {', '.join(splits)}")
        where = f"dataset {source}" + (f" (split {split})" if splits is not None else "")

        def load() -> Any:
            loaded = datasets.load_from_disk(str(path))
            return loaded[split] if splits is not None else loaded

    elif kind in ("folder", "hub"):
        where = f"{'dataset folder' if kind == 'folder' else 'hub dataset'} {source} (split {split})"

        def load() -> Any:
            return datasets.load_dataset(
                str(path) if kind == "folder" else source, dataset_config, split=split
            )

    else:
        raise ValueError(dict(source_problems(source))["task"])
    try:
        ds = load()
    except Exception as err:  # datasets' own errors can be bare; say which source failed
        raise ValueError(f"{where} could not be read: {err!r}") from err
    if len(ds) == 0:
        raise ValueError(f"{where} is empty: it holds no rows")
    return ds, where


# --------------------------------------------------------------------------------------------
# datasets: rows to tasks


def _column(name: str, columns: Sequence[str]) -> str | None:
    """The column a (dotted) field starts in: the name itself if a column is so named, else its first part."""
    if name in columns:
        return name
    head = name.split(".")[0]
    return head if head in columns else None


class MissingKey(KeyError):
    """A dotted field's key is not where the field says: ``str()`` names the key, where it was looked
    for and the keys found there."""

    def __str__(self) -> str:
        return str(self.args[0])


def _lookup(row: Mapping[str, Any], name: str) -> Any:
    """``row[name]``, or the nested value a dotted ``name`` points at (``MissingKey`` naming the missing
    key and the keys found at that level)."""
    if name in row:
        return row[name]
    value: Any = row
    parts = name.split(".")
    for depth, part in enumerate(parts):
        where = "the row" if depth == 0 else repr(".".join(parts[:depth]))
        if not isinstance(value, Mapping):
            raise MissingKey(f"{where} is a {type(value).__name__}, not a mapping with a key {part!r}")
        if part not in value:
            raise MissingKey(f"{where} has no key {part!r}; its keys: {', '.join(map(str, value)) or 'none'}")
        value = value[part]
    return value


def _as_prompt(value: Any, where: str) -> str | tuple[Message, ...]:
    """A prompt cell as a string or a tuple of messages (``None`` values of a message dropped)."""
    if isinstance(value, str):
        if not value.strip():
            raise ValueError(f"{where}: the prompt is empty")
        return value
    if isinstance(value, Sequence) and value and all(isinstance(m, Mapping) for m in value):
        messages = []
        for m in value:
            if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ValueError(
                    f"{where}: every message of a messages-format prompt needs a string 'role' and "
                    f"'content', got {dict(m)!r}"
                )
            messages.append({k: v for k, v in m.items() if v is not None})
        return tuple(messages)
    raise ValueError(
        f"{where}: a prompt must be a non-empty string or a list of {{'role', 'content'}} messages, "
        f"got {type(value).__name__} {value!r:.80}"
    )


def tasks_from_rows(
    rows: Any, prompt_field: str = "prompt", answer_field: str = "answer", where: str = "dataset"
) -> list[Task]:
    """One ``Task`` per row of ``rows`` (a ``datasets.Dataset``, or a list of dicts), in order.

    ``prompt_field``/``answer_field`` may be dotted (nested columns). The answer is turned into text
    (a number becomes its ``str``); every other column goes into ``Task.extra``, except the prompt's
    and the answer's own columns (a nested field's parent column stays) and ``RESERVED_COLUMNS``.
    """
    columns = list(rows.column_names) if hasattr(rows, "column_names") else list(rows[0]) if rows else []
    for name, what in ((prompt_field, "prompt_field"), (answer_field, "answer_field")):
        if _column(name, columns) is None:
            raise ValueError(
                f"{where} has no column {name!r} (columns: {', '.join(columns)}); set `{what}` to the right "
                "column (dotted for a nested one, e.g. reward_model.ground_truth)"
            )
    skip = {f for f in (prompt_field, answer_field) if f in columns} | set(RESERVED_COLUMNS)
    out: list[Task] = []
    for i, row in enumerate(rows):
        at = f"{where}, row {i}"
        values = {}
        for name, what in ((prompt_field, "prompt_field"), (answer_field, "answer_field")):
            try:
                values[what] = _lookup(row, name)
            except MissingKey as err:
                raise ValueError(f"{at}: `{what}`={name!r}: {err}; set `{what}` to the right key") from None
        prompt, answer = values["prompt_field"], values["answer_field"]
        if answer is None:
            raise ValueError(f"{at}: the answer ({answer_field!r}) is empty")
        if not isinstance(answer, (str, int, float)):
            raise ValueError(
                f"{at}: the answer ({answer_field!r}) must be text or a number, got {type(answer).__name__}; "
                "point `answer_field` at one value (other columns reach the rewards as keyword arguments)"
            )
        text = str(answer)
        extra = {k: v for k, v in row.items() if k not in skip}
        out.append(Task(_as_prompt(prompt, f"{at} ({prompt_field!r})"), text, text, extra=extra))
    return out


def held_out(prompt: str | Sequence[Message], fraction: float) -> bool:
    """Whether ``eval_fraction`` = ``fraction`` holds this prompt out for evaluation.

    crc32 of the prompt's text (of its messages' JSON for a messages-format prompt) below
    ``fraction`` · 2³²: about that share of the distinct prompts, the same for every seed and row order.
    """
    key = prompt if isinstance(prompt, str) else json.dumps(list(prompt), sort_keys=True, ensure_ascii=False)
    return zlib.crc32(key.encode()) < fraction * 2**32


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
    train_split: str = "train",
    eval_split: str | None = None,
    eval_fraction: float | None = None,
    dataset_config: str | None = None,
) -> list[Task]:
    """``n`` examples of a synthetic task or a dataset for the role ``split``, deterministic for ``seed``.

    Args:
        name_or_path: a name in ``TASKS``, a ``.jsonl``/``.json``/``.parquet`` path (``{split}`` in it is
            replaced by the split name), a local dataset folder, or a hub dataset ``owner/name``.
        split: ``"train"`` or ``"eval"`` (disjoint).
        n: how many examples, a seeded sample (``None``: every row of a dataset's split;
            ``SYNTHETIC_DEFAULT_N`` problems of a synthetic task).
        seed: which examples and their order.
        prompt_field, answer_field: the dataset's columns (dotted for nested ones).
        digits, ops: operand digits and operators of the synthetic tasks.
        train_split: the split name the train role reads.
        eval_split: what the eval role reads: a split name of the dataset, or a file path.
        eval_fraction: instead of ``eval_split``, hold out the train split's rows whose prompt hashes
            below this fraction (``held_out``).
        dataset_config: a hub dataset's configuration (``load_dataset``'s ``name``).

    A dataset without ``eval_split`` and ``eval_fraction`` has no eval rows: asking for them raises.
    """
    _check_split(split)
    problems = source_problems(name_or_path, train_split, eval_split, eval_fraction, dataset_config)
    if problems:
        name, why = problems[0]
        raise ValueError(f"`{name}`: {why}")
    if name_or_path in TASKS:
        return synthetic_tasks(
            name_or_path, split, SYNTHETIC_DEFAULT_N if n is None else n, seed, digits, ops
        )
    if split == "eval" and not has_eval_source(name_or_path, eval_split, eval_fraction):
        raise ValueError(
            f"{name_or_path} has no eval split: set `eval_split` (a split name or a file) or `eval_fraction`"
        )
    if split == "eval" and eval_split is not None:
        source, name = (eval_split, None) if is_task_file(eval_split) else (name_or_path, eval_split)
    else:
        source, name = name_or_path, train_split
    ds, where = _read(source, name, dataset_config)
    tasks = tasks_from_rows(ds, prompt_field, answer_field, where)
    if eval_fraction is not None:
        tasks = [t for t in tasks if held_out(t.prompt, eval_fraction) == (split == "eval")]
        if not tasks:
            raise ValueError(f"{where}: `eval_fraction`={eval_fraction} leaves no {split} rows")
    random.Random(seed).shuffle(tasks)
    if n is None:
        return tasks
    if n > len(tasks):
        raise ValueError(f"{where} has {len(tasks)} {split} rows, fewer than the {n} asked")
    return tasks[:n]


# --------------------------------------------------------------------------------------------
# prompts and reward columns


def prompt_messages(prompt: str | Sequence[Message], system_prompt: str | None = None) -> list[Message]:
    """The chat messages of a prompt: a string becomes one user message, messages stay as they are;
    ``system_prompt`` goes first as a system message (a prompt with its own system message and a
    ``system_prompt`` is an error: which one to keep is the user's call)."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    if system_prompt is not None:
        if messages and messages[0].get("role") == "system":
            raise ValueError(
                "the prompt has its own system message and `system_prompt` is set; unset `system_prompt` "
                "(or remove the dataset's system messages)"
            )
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def format_prompt(
    tokenizer: Any,
    prompt: str | Sequence[Message],
    system_prompt: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The prompt as the model sees it: ``prompt_messages`` through the tokenizer's chat template, with
    the generation prompt (the assistant turn's header) at the end.

    ``chat_template_kwargs`` go to ``apply_chat_template`` and from there to the template (e.g. Qwen3's
    ``{"enable_thinking": False}``); ``RESERVED_TEMPLATE_KWARGS`` are refused.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the tokenizer has no `chat_template`; use an instruct/chat checkpoint or set tokenizer.chat_template"
        )
    kwargs = dict(chat_template_kwargs or {})
    reserved = [k for k in RESERVED_TEMPLATE_KWARGS if k in kwargs]
    if reserved:
        raise ValueError(f"`chat_template_kwargs` may not set {', '.join(reserved)}: format_prompt sets them")
    return tokenizer.apply_chat_template(
        prompt_messages(prompt, system_prompt), tokenize=False, add_generation_prompt=True, **kwargs
    )


def prompt_lengths(
    tokenizer: Any,
    prompts: Sequence[str | Sequence[Message]],
    system_prompt: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    batch: int = 1024,
) -> list[int]:
    """Tokens of each chat-formatted prompt (``format_prompt``, no special tokens added: what the rollouts feed)."""
    texts = [format_prompt(tokenizer, p, system_prompt, chat_template_kwargs) for p in prompts]
    out: list[int] = []
    for i in range(0, len(texts), batch):
        out += [len(ids) for ids in tokenizer(texts[i : i + batch], add_special_tokens=False)["input_ids"]]
    return out


def drop_overlong(
    tasks: Sequence[Task],
    tokenizer: Any,
    max_prompt_length: int,
    system_prompt: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[list[Task], int]:
    """The tasks whose chat-formatted prompt has at most ``max_prompt_length`` tokens, in order, and how
    many were dropped (verl's ``filter_overlong_prompts``)."""
    lengths = prompt_lengths(tokenizer, [t.prompt for t in tasks], system_prompt, chat_template_kwargs)
    kept = [t for t, n in zip(tasks, lengths, strict=True) if n <= max_prompt_length]
    return kept, len(tasks) - len(kept)


def reward_columns(tasks: Sequence[Task]) -> dict[str, list[Any]]:
    """The tasks' extra columns as reward keyword arguments: name → one value per task (None where a
    task lacks the column); ``{}`` for synthetic tasks."""
    names = dict.fromkeys(k for t in tasks for k in t.extra)
    return {k: [t.extra.get(k) for t in tasks] for k in names}
