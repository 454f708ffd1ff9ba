"""Reward functions ``(prompts, completions, answers, **columns) -> list[float]`` and a crash-proof caller.

Registry ``REWARDS`` (add one with ``@register_reward("name")``):

- ``exact_match``: 1.0 when the completion's answer equals the gold integer, else 0.0. The
  completion's answer is the first integer after the last ``The answer is`` when there is one
  (the ``template`` task), otherwise the last integer of the completion (``extract_answer``);
- ``math_verify``: 1.0 when the last ``\\boxed{...}`` of the completion is mathematically equal to the
  gold answer according to the ``math-verify`` package (``\\frac{1}{2}`` equals ``0.5``), else 0.0; a
  completion without ``\\boxed{}`` gets 0.0;
- ``answer_line``: 1.0 when the text after the completion's last ``Answer:`` (to the end of that line)
  equals the gold answer, else 0.0: the format DAPO-Math-17k's prompts ask for ("Remember to put your
  answer on its own line after \"Answer:\""), which ``math_verify`` scores 0 (no ``\\boxed{}``).
  ``answer_text`` says how the two sides are compared.

Gold answers in GSM8K's form (the worked solution, then ``#### 72``) are read as the text after the last
``####`` by every built-in (``gold_answer``).

Your own reward: a module that registers it (``--import my_rewards``, where ``my_rewards.py`` holds
``@register_reward("my_fn")``), or a file and a function (``--reward_file path.py:my_fn``,
``load_reward_file``; verl's ``custom_reward_function.path`` / ``name``).

A reward function gets the batch's chat-formatted prompts, completions and gold answers (one each per
row), and the dataset's other columns as keyword arguments, one value per row (as TRL's reward
functions do): a function with ``**kwargs`` gets every column, one with named keyword parameters gets
the columns so named, one with neither (the built-ins) gets none. Several rewards combine as a
weighted sum (TRL's ``reward_funcs`` / ``reward_weights``): ``compute_rewards("math_verify,format",
..., weights=[1.0, 0.2])``.

``compute_rewards`` never lets a failing sample crash the run: when a function's batch call raises,
every sample is retried alone, and a sample whose call raises (or returns a value that is not a
finite number) gets ``failure_reward`` for that function and is counted.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: ``fn(prompts, completions, answers, **columns) -> one float per row`` (``columns`` optional).
RewardFn = Callable[..., list[float]]
REWARDS: dict[str, RewardFn] = {}

_INT = re.compile(r"-?\d+")
_ANSWER_IS = "The answer is"
#: GSM8K's gold answers end with ``#### <answer>`` after the worked solution.
_GSM8K_MARK = "####"
#: ``Answer: <text>`` on one line (DAPO-Math's format), case-insensitive; the last one counts.
_ANSWER_LINE = re.compile(r"(?i)answer\s*:[ \t]*([^\n]*)")
#: How to add a reward, quoted by the error for an unknown name.
HOW_TO_REGISTER = (
    "to add your own, decorate it with @scaledrun.rewards.register_reward('my_fn') in a module and pass "
    "--import my_module (its folder on the Python path, e.g. the working directory), or pass "
    "--reward_file path/to/file.py:my_fn"
)


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator: register a reward function under ``name``."""

    def deco(fn: RewardFn) -> RewardFn:
        REWARDS[name] = fn
        return fn

    return deco


def reward_names() -> list[str]:
    return list(REWARDS)


def extract_answer(completion: str) -> str | None:
    """The first integer after the last ``The answer is``, else the last integer of the completion, or None."""
    idx = completion.rfind(_ANSWER_IS)
    if idx >= 0:
        found = _INT.findall(completion[idx + len(_ANSWER_IS) :].replace(",", ""))
        return found[0] if found else None
    found = _INT.findall(completion.replace(",", ""))
    return found[-1] if found else None


def gold_answer(answer: str) -> str:
    """The gold answer to compare with: the text after the last ``####`` (GSM8K's ``... #### 72``), else
    ``answer`` itself, stripped."""
    idx = answer.rfind(_GSM8K_MARK)
    return (answer[idx + len(_GSM8K_MARK) :] if idx >= 0 else answer).strip()


def _same_answer(pred: str | None, gold: str) -> bool:
    if pred is None:
        return False
    gold = gold_answer(gold)
    try:
        return int(pred) == int(gold.replace(",", ""))
    except ValueError:
        return pred.strip() == gold


def _check_lengths(prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str]) -> None:
    if not (len(prompts) == len(completions) == len(answers)):
        raise ValueError(
            f"prompts, completions and answers must have the same length, got "
            f"{len(prompts)}, {len(completions)}, {len(answers)}"
        )


@register_reward("exact_match")
def exact_match(prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str]) -> list[float]:
    """1.0 where ``extract_answer(completion)`` equals the gold answer as an integer, else 0.0."""
    _check_lengths(prompts, completions, answers)
    return [float(_same_answer(extract_answer(c), a)) for c, a in zip(completions, answers, strict=True)]


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (nested braces matched), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


@register_reward("math_verify")
def math_verify(prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str]) -> list[float]:
    """1.0 where the completion's last ``\\boxed{}`` verifies against the gold with ``math-verify``."""
    from math_verify import parse, verify  # sympy-heavy import, only when this reward is used

    _check_lengths(prompts, completions, answers)
    out = []
    for completion, answer in zip(completions, answers, strict=True):
        boxed = last_boxed(completion)
        if boxed is None:
            out.append(0.0)
            continue
        answer = gold_answer(answer)
        gold = parse(answer if "$" in answer or "\\boxed" in answer else f"${answer}$")
        pred = parse(f"${boxed}$")
        out.append(float(bool(gold) and bool(pred) and verify(gold, pred)))
    return out


def answer_text(text: str) -> str:
    """An answer as ``answer_line`` compares it: ``$``, ``\\boxed{}`` and ``\\text{}`` wrappers, spaces,
    a trailing period and thousands separators of a number removed (``$1,234$.`` → ``1234``)."""
    text = text.strip().replace("$", "")
    for wrapper in ("\\boxed{", "\\text{"):
        if text.startswith(wrapper) and text.endswith("}"):
            text = text[len(wrapper) : -1]
    text = text.replace(" ", "").rstrip(".")
    return text.replace(",", "") if re.fullmatch(r"-?\d{1,3}(,\d{3})+", text) else text


def last_answer_line(completion: str) -> str | None:
    """The text after the completion's last ``Answer:`` (case-insensitive) up to the end of its line, or None."""
    found = _ANSWER_LINE.findall(completion)
    return found[-1] if found else None


@register_reward("answer_line")
def answer_line(prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str]) -> list[float]:
    """1.0 where the completion's last ``Answer: ...`` line equals the gold answer (``answer_text`` of
    both; two integers compare as integers, so ``Answer: 034`` matches ``34``), else 0.0."""
    _check_lengths(prompts, completions, answers)
    out = []
    for completion, answer in zip(completions, answers, strict=True):
        line = last_answer_line(completion)
        pred, gold = (None if line is None else answer_text(line)), answer_text(gold_answer(answer))
        if pred is None or not pred:
            out.append(0.0)
        elif re.fullmatch(r"-?\d+", pred) and re.fullmatch(r"-?\d+", gold):
            out.append(float(int(pred) == int(gold)))
        else:
            out.append(float(pred == gold))
    return out


#: Reward files already imported (resolved path → module), so that validating a config twice runs the file once.
_REWARD_FILES: dict[Path, Any] = {}


def absolute_reward_file(spec: str) -> str:
    """``PATH.py:FUNCTION`` with PATH made absolute (``~`` expanded, relative to the working directory), as
    a run's saved config keeps it; a spec not of that form comes back unchanged (``load_reward_file``
    says what is wrong with it)."""
    path_text, sep, name = spec.rpartition(":")
    if not sep or not path_text:
        return spec
    return f"{Path(path_text).expanduser().resolve()}:{name}"


def load_reward_file(spec: str) -> str:
    """Import ``PATH.py:FUNCTION`` and register ``FUNCTION`` under its own name; return that name.

    verl's ``custom_reward_function.path`` / ``name``. The file is imported once per process (its
    folder need not be on the Python path). Raises ``ValueError`` naming what is wrong: the form, a
    missing file, an import that fails, a missing or uncallable function, or a name a built-in or
    another function already holds.
    """
    path_text, sep, name = spec.rpartition(":")
    if not sep or not path_text or not name.isidentifier():
        raise ValueError(f"expected PATH.py:FUNCTION (e.g. my_rewards.py:score), got {spec!r}")
    path = Path(path_text).expanduser()
    if path.suffix != ".py":
        raise ValueError(f"{path_text} is not a .py file; expected PATH.py:FUNCTION")
    if not path.is_file():
        raise ValueError(f"the file {path} does not exist (relative paths start at {Path.cwd()})")
    key = path.resolve()
    module = _REWARD_FILES.get(key)
    if module is None:
        module_name = f"_scaledrun_reward_file_{len(_REWARD_FILES)}_{path.stem}"
        loader_spec = importlib.util.spec_from_file_location(module_name, key)
        assert loader_spec is not None and loader_spec.loader is not None  # a .py file always has one
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as err:
            del sys.modules[module_name]
            raise ValueError(f"importing {path} failed: {type(err).__name__}: {err}") from err
        _REWARD_FILES[key] = module
    fn = getattr(module, name, None)
    if fn is None:
        defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise ValueError(f"{path} defines no {name!r}; its functions: {', '.join(defined) or 'none'}")
    if not callable(fn):
        raise ValueError(f"{path}: {name!r} is a {type(fn).__name__}, not a function")
    held = REWARDS.get(name)
    if held is not None and held is not fn:
        where = "a built-in reward" if getattr(held, "__module__", "") == __name__ else "another reward"
        raise ValueError(f"{path}: the name {name!r} is {where}'s; rename the function")
    REWARDS[name] = fn
    return name


def get_reward(name: str) -> RewardFn:
    """Look a reward function up by name; unknown names list the valid ones and how to register one."""
    try:
        return REWARDS[name]
    except KeyError:
        raise ValueError(f"unknown reward {name!r}; valid: {', '.join(REWARDS)}; {HOW_TO_REGISTER}") from None


def parse_reward_names(spec: str | Sequence[str]) -> list[str]:
    """The reward names of ``spec``: one name, comma-separated names (``"math_verify,format"``) or a list.

    Raises ``ValueError`` for an empty spec or an unknown name (listing the valid ones).
    """
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    names = [str(p).strip() for p in parts]
    if not names or not all(names):
        raise ValueError(f"reward names {spec!r}: expected one or more names separated by commas")
    for name in names:
        get_reward(name)
    return names


def check_weights(names: Sequence[str], weights: Sequence[float] | None) -> list[float]:
    """The weight of each reward (``None``: 1.0 each, TRL's default); a wrong count or a non-finite
    weight raises ``ValueError``."""
    if weights is None:
        return [1.0] * len(names)
    if len(weights) != len(names):
        raise ValueError(
            f"{len(weights)} reward weight(s) for {len(names)} reward(s) ({', '.join(names)}); give one per reward"
        )
    out = [float(w) for w in weights]
    if not all(math.isfinite(w) for w in out):
        raise ValueError(f"reward weights must be finite numbers, got {list(weights)}")
    return out


def _as_reward(value: object) -> float | None:
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _columns_for(fn: RewardFn, columns: Mapping[str, Sequence[Any]]) -> dict[str, Sequence[Any]]:
    """The columns ``fn`` takes as keyword arguments: all with ``**kwargs``, else those it names."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C callable: pass none
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(columns)
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {k: v for k, v in columns.items() if k in params and params[k].kind in named}


def _score(
    name: str,
    prompts: Sequence[str],
    completions: Sequence[str],
    answers: Sequence[str],
    columns: Mapping[str, Sequence[Any]],
) -> list[float | None]:
    """One reward function's values, None where a sample failed (batch call first, then one by one)."""
    fn = get_reward(name)
    kwargs = _columns_for(fn, columns)
    try:
        values = list(fn(prompts, completions, answers, **kwargs))
        if len(values) != len(completions):
            raise ValueError(
                f"reward {name!r} returned {len(values)} values for {len(completions)} completions"
            )
    except Exception as err:  # a failing batch: fall back to one sample at a time
        logger.warning("reward %r failed on the batch (%s); scoring each sample alone", name, err)
        values = []
        for i, (p, c, a) in enumerate(zip(prompts, completions, answers, strict=True)):
            try:
                one = list(fn([p], [c], [a], **{k: [v[i]] for k, v in kwargs.items()}))
                values.append(one[0] if len(one) == 1 else None)
            except Exception as sample_err:
                logger.warning("reward %r failed on one sample: %s", name, sample_err)
                values.append(None)
    return [_as_reward(v) for v in values]


@dataclass
class RewardScores:
    """A batch's rewards: ``rewards`` (the weighted sum, one per row), ``terms`` (each function's own
    values by name, a failed sample's value ``failure_reward``) and ``failures`` (rows where a function failed)."""

    rewards: list[float]
    terms: dict[str, list[float]]
    failures: int


def score_rewards(
    name: str | Sequence[str],
    prompts: Sequence[str],
    completions: Sequence[str],
    answers: Sequence[str],
    failure_reward: float = 0.0,
    *,
    weights: Sequence[float] | None = None,
    columns: Mapping[str, Sequence[Any]] | None = None,
) -> RewardScores:
    """Rewards of a batch (one per row), each function's own values, and how many samples failed.

    Args:
        name: a reward name, comma-separated names, or a list of names (``parse_reward_names``).
        prompts, completions, answers: one per row.
        failure_reward: the value a failed sample gets from the function that failed on it.
        weights: one per reward (None: 1.0 each); the reward of a row is Σ_k w_k · r_k.
        columns: the dataset's other columns, name → one value per row (``tasks.reward_columns``),
            passed to the functions that take them (see the module docstring).

    Each function runs on the whole batch first; if that raises, or returns the wrong number of values,
    each sample runs alone. A sample whose call raises, or whose value is not a finite number, gets
    ``failure_reward`` for that function; the count is of samples with at least one failure (the first
    error of a call is logged).
    """
    names = parse_reward_names(name)
    w = check_weights(names, weights)
    _check_lengths(prompts, completions, answers)
    if not math.isfinite(failure_reward):
        raise ValueError(f"`failure_reward` must be a finite number, got {failure_reward}")
    columns = dict(columns or {})
    for key, values in columns.items():
        if len(values) != len(completions):
            raise ValueError(f"reward column {key!r} has {len(values)} values for {len(completions)} rows")
    per_fn = [_score(n, prompts, completions, answers, columns) for n in names]
    failed = [any(v[i] is None for v in per_fn) for i in range(len(completions))]
    filled = [[float(failure_reward) if x is None else x for x in v] for v in per_fn]
    if len(names) == 1 and weights is None:
        rewards = filled[0]  # one unweighted reward: its values exactly
    else:
        rewards = [sum(wk * v[i] for wk, v in zip(w, filled, strict=True)) for i in range(len(completions))]
    return RewardScores(rewards, dict(zip(names, filled, strict=True)), sum(failed))


def compute_rewards(
    name: str | Sequence[str],
    prompts: Sequence[str],
    completions: Sequence[str],
    answers: Sequence[str],
    failure_reward: float = 0.0,
    *,
    weights: Sequence[float] | None = None,
    columns: Mapping[str, Sequence[Any]] | None = None,
) -> tuple[list[float], int]:
    """``score_rewards``' (rewards, failures): the weighted sum per row and the failed samples' count."""
    scores = score_rewards(
        name, prompts, completions, answers, failure_reward, weights=weights, columns=columns
    )
    return scores.rewards, scores.failures
