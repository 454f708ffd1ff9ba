"""Reward functions ``(prompts, completions, answers) -> list[float]`` and a crash-proof caller.

Registry ``REWARDS`` (add one with ``@register_reward("name")``):

- ``exact_match``: 1.0 when the completion's answer equals the gold integer, else 0.0. The
  completion's answer is the first integer after the last ``The answer is`` when there is one
  (the ``template`` task), otherwise the last integer of the completion (``extract_answer``);
- ``math_verify``: 1.0 when the last ``\\boxed{...}`` of the completion is mathematically equal to the
  gold answer according to the ``math-verify`` package (``\\frac{1}{2}`` equals ``0.5``), else 0.0; a
  completion without ``\\boxed{}`` gets 0.0.

``compute_rewards`` calls one by name and never lets a failing sample crash the run: when the batch
call raises, every sample is retried alone, and a sample whose call raises (or returns a value that
is not a finite number) gets ``failure_reward`` and is counted.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence

logger = logging.getLogger(__name__)

RewardFn = Callable[[Sequence[str], Sequence[str], Sequence[str]], list[float]]
REWARDS: dict[str, RewardFn] = {}

_INT = re.compile(r"-?\d+")
_ANSWER_IS = "The answer is"


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


def _same_answer(pred: str | None, gold: str) -> bool:
    if pred is None:
        return False
    try:
        return int(pred) == int(gold.strip().replace(",", ""))
    except ValueError:
        return pred.strip() == gold.strip()


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
        gold = parse(answer if "$" in answer or "\\boxed" in answer else f"${answer}$")
        pred = parse(f"${boxed}$")
        out.append(float(bool(gold) and bool(pred) and verify(gold, pred)))
    return out


def get_reward(name: str) -> RewardFn:
    """Look a reward function up by name; unknown names list the valid ones."""
    try:
        return REWARDS[name]
    except KeyError:
        raise ValueError(f"unknown reward {name!r}; valid: {', '.join(REWARDS)}") from None


def _as_reward(value: object) -> float | None:
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def compute_rewards(
    name: str,
    prompts: Sequence[str],
    completions: Sequence[str],
    answers: Sequence[str],
    failure_reward: float = 0.0,
) -> tuple[list[float], int]:
    """Rewards of a batch, and how many samples failed.

    The reward function runs on the whole batch first; if that raises, or returns the wrong number of
    values, each sample runs alone. A sample whose call raises, or whose value is not a finite number,
    gets ``failure_reward`` and counts as a failure (the first error of a call is logged).
    """
    fn = get_reward(name)
    _check_lengths(prompts, completions, answers)
    if not math.isfinite(failure_reward):
        raise ValueError(f"`failure_reward` must be a finite number, got {failure_reward}")
    try:
        values = list(fn(prompts, completions, answers))
        if len(values) != len(completions):
            raise ValueError(
                f"reward {name!r} returned {len(values)} values for {len(completions)} completions"
            )
    except Exception as err:  # a failing batch: fall back to one sample at a time
        logger.warning("reward %r failed on the batch (%s); scoring each sample alone", name, err)
        values = []
        for p, c, a in zip(prompts, completions, answers, strict=True):
            try:
                one = list(fn([p], [c], [a]))
                values.append(one[0] if len(one) == 1 else None)
            except Exception as sample_err:
                logger.warning("reward %r failed on one sample: %s", name, sample_err)
                values.append(None)
    rewards: list[float] = []
    failures = 0
    for v in values:
        x = _as_reward(v)
        if x is None:
            failures += 1
            x = float(failure_reward)
        rewards.append(x)
    return rewards, failures
