"""The run's data: the train and eval tasks of a config, read and checked before the run folder or the model.

``train`` (``scaledrun.train``) checks the task's files first (``check_task_source``), then loads the tasks
with the cheap tokenizer alone and chat-formats their prompts (``load_data``): a missing column or key,
``num_train`` above the rows, a prompt the chat template refuses is a ``DataError`` naming the field to
fix, before anything is written or the model loads. ``step_prompts`` deals each step's prompts to the
processes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import RunConfig
from .rollout import RolloutBatch
from .tasks import (
    TASKS,
    Task,
    drop_overlong,
    format_prompt,
    has_eval_source,
    is_task_file,
    load_task,
    source_problems,
)


def check_task_source(cfg: RunConfig) -> None:
    """The task's local files and folders (and a saved DatasetDict's split names) must exist before the
    run folder is touched (``tasks.source_problems``; a hub dataset is checked when it loads)."""
    for name, why in source_problems(
        cfg.task, cfg.train_split, cfg.eval_split, cfg.eval_fraction, cfg.dataset_config
    ):
        raise FileNotFoundError(f"config field `{name}`={getattr(cfg, name)!r}: {why}")


def load_tasks(
    cfg: RunConfig, split: str, n: int | None, tokenizer: Any = None, log: Callable[[str], None] = print
) -> list[Task]:
    """The ``split`` (``train``/``eval``) tasks of ``cfg``: ``n`` of them, a seeded sample (None: every row
    of a dataset, 64 problems of a synthetic task), prompts over ``max_prompt_length`` tokens dropped.

    A dataset without ``eval_split``/``eval_fraction`` has no eval tasks (``[]``, and ``log`` says so).
    ``n`` above a dataset's train rows is an error; an eval split with fewer than ``n`` rows gives them
    all. ``tokenizer`` is needed only with ``max_prompt_length``.
    """
    synthetic = cfg.task in TASKS
    if split == "eval" and not has_eval_source(cfg.task, cfg.eval_split, cfg.eval_fraction):
        log(f"no eval: {cfg.task} has no eval split (set `eval_split` or `eval_fraction` to evaluate)")
        return []
    tasks = load_task(
        cfg.task, split, n if synthetic else None, cfg.seed, cfg.prompt_field, cfg.answer_field,
        digits=cfg.digits, ops=cfg.ops, train_split=cfg.train_split, eval_split=cfg.eval_split,
        eval_fraction=cfg.eval_fraction, dataset_config=cfg.dataset_config,
    )  # fmt: skip
    rows = len(tasks)
    if cfg.max_prompt_length is not None:
        if tokenizer is None:
            raise ValueError("load_tasks: `max_prompt_length` is set, so the tokenizer is needed")
        tasks, dropped = drop_overlong(
            tasks, tokenizer, cfg.max_prompt_length, cfg.system_prompt, cfg.chat_template_kwargs
        )
        if dropped:
            limit = cfg.max_prompt_length
            log(f"{split}: dropped {dropped} of {rows} prompts over {limit} tokens (max_prompt_length)")
        if not tasks:
            raise ValueError(
                f"config field `max_prompt_length`={cfg.max_prompt_length}: every {split} prompt is longer"
            )
    if synthetic:
        return tasks
    knob = "num_train" if split == "train" else "num_eval"
    if n is not None and n > len(tasks):
        if split == "train":
            raise ValueError(
                f"config field `num_train`={n}: the train split has only {len(tasks)} prompts; ask for at "
                "most that many, or none (--num_train none: every row)"
            )
        log(f"eval: the eval split has {len(tasks)} prompts, fewer than num_eval={n}: using them all")
    tasks = tasks[:n] if n is not None else tasks
    log(f"{split}: {len(tasks)} prompts from {task_source(cfg, split)} ({knob}={n})")
    return tasks


def task_source(cfg: RunConfig, split: str) -> str:
    """Where the ``split`` (``train``/``eval``) rows of a dataset come from, as the logs name it."""
    if split == "eval" and cfg.eval_split is not None:
        return cfg.eval_split if is_task_file(cfg.eval_split) else f"{cfg.task} (split {cfg.eval_split})"
    if split == "eval":
        return f"{cfg.task} (the prompts eval_fraction={cfg.eval_fraction} holds out)"
    return cfg.task if cfg.train_split == "train" else f"{cfg.task} (split {cfg.train_split})"


class DataError(ValueError):
    """The task data cannot be used as configured (a column, a key, ``num_train``, a prompt); the message
    names the field to fix."""


@dataclass
class RunData:
    """The run's prompts, loaded and checked before the run folder or the model: the train and eval
    tasks, and each train prompt as the model sees it (by ``id`` of its task)."""

    train: list[Task]
    eval: list[Task]
    formatted: dict[int, str]


def load_data(cfg: RunConfig, tokenizer: Any, log: Callable[[str], None] = print) -> RunData:
    """The train and eval tasks of ``cfg`` (``load_tasks``), their prompts chat-formatted; every mistake in
    the data (a missing column or key, ``num_train`` above the rows, a prompt the template refuses) is a
    ``DataError`` naming what to fix."""
    try:
        train_tasks = load_tasks(cfg, "train", cfg.num_train, tokenizer, log)
        eval_tasks = (
            load_tasks(cfg, "eval", cfg.num_eval, tokenizer, log)
            if cfg.eval_every > 0 and cfg.num_eval > 0
            else []
        )
        formatted = {
            id(t): format_prompt(tokenizer, t.prompt, cfg.system_prompt, cfg.chat_template_kwargs)
            for t in train_tasks
        }
    except (ValueError, KeyError) as err:
        raise DataError(str(err)) from err
    return RunData(train_tasks, eval_tasks, formatted)


def step_prompts(
    tasks: list[Task], step: int, per_process: int, rank: int, world: int, seed: int
) -> list[tuple[int, Task]]:
    """This process's (global prompt id, task) pairs of ``step`` (1-based): whole groups per process.

    The prompt stream is the task list in a new seeded permutation each epoch; the global id (its
    position in the stream) is unique over the run, so buffered groups never share ids.
    """
    n = len(tasks)
    out = []
    for i in range(per_process):
        k = (step - 1) * world * per_process + rank * per_process + i
        perm = list(range(n))
        random.Random(seed * 7919 + k // n).shuffle(perm)
        out.append((k, tasks[perm[k % n]]))
    return out


def replay_file(replay_dir: Path, rank: int, step: int) -> Path | None:
    """The batch this process replays at ``step``: its own rank's file first, then the shared one."""
    name = f"step_{step:06d}_rollouts.pt"
    for path in (replay_dir / f"rank{rank}" / name, replay_dir / name):
        if path.is_file():
            return path
    return None


def replay_stats(batch: RolloutBatch) -> dict[str, float]:
    """The rollout diagnostics of a replayed batch (no sampler: ``entropy`` is NaN)."""
    lengths = batch.attention_mask[:, batch.prompt_len :].float().sum(1)
    return {
        "entropy": math.nan,
        "completion_length": float(lengths.mean()),
        "truncated_frac": float(batch.truncated.float().mean()),
        "tokens_generated": float(lengths.sum()),
    }
