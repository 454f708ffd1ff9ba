"""Run folders that cannot be lost or mixed: a lock, a start rule, resume checks, orphan-proof workers.

A run folder (``output_dir``) holds one run: ``config.yaml``, ``metrics.jsonl``, ``tb/`` and
``checkpoints/``. The rules, applied by ``scaledrun.train`` before anything is written:

- **one writer**: the main process holds ``<output_dir>/.lock`` (its pid, host and start time) while
  the run writes the folder. A second run on the same folder stops with a message naming the holder.
  A lock left by a process that no longer exists on this host is stale and is taken over (with a
  warning); a lock from another host is never taken over (remove the file if that run is dead);
- **no silent replacement**: a folder that already holds a run is refused unless the run resumes
  (``--resume true``) or replaces it (``--overwrite true``, which deletes the old run's files first);
- **resume only the same experiment**: a checkpoint whose config differs from the new one in a field
  that changes the math is refused, naming the fields (``RESUME_MAY_DIFFER`` lists the fields that may
  change: the number of steps, the eval / save cadence, the output folder and the run flags);
- **workers die with their launcher**: under ``accelerate launch`` each worker watches its parent
  process and exits when it is gone (``kill -9`` of the launcher would otherwise leave the workers
  writing the folder).

``metrics.jsonl`` is kept consistent with the checkpoint by ``scaledrun.runlog``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

LOCK_FILE = ".lock"
#: What a run writes into its folder (``--overwrite`` deletes exactly these).
RUN_FILES = ("config.yaml", "metrics.jsonl", "tb", "checkpoints")
#: Config fields a resumed run may change: they do not change the math of the steps already taken.
RESUME_MAY_DIFFER = frozenset(
    {
        "steps",
        "eval_every",
        "save_every",
        "num_eval",
        "eval_k",
        "output_dir",
        "resume",
        "overwrite",
        "preset",
        "logprob_chunk_tokens",
        "flip_every",
        "save_total_limit",
    }
)


class RunFolderError(RuntimeError):
    """A run folder cannot be used as asked; the message says what to do instead."""


# ------------------------------------------------------------------------------------------------
# the lock


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class RunLock:
    """``<output_dir>/.lock`` held for the lifetime of a run (a context manager; ``release`` is idempotent)."""

    def __init__(self, output_dir: str | Path) -> None:
        self.path = Path(output_dir) / LOCK_FILE
        self.held = False

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is None:  # unreadable or half-written: treat as stale after a moment
                    time.sleep(0.2)
                    holder = self._holder()
                if holder is not None and not self._stale(holder):
                    raise RunFolderError(
                        f"{self.path.parent} is in use by pid {holder.get('pid')} on {holder.get('host')} "
                        f"(since {holder.get('started')}): wait for that run, stop it (kill {holder.get('pid')}), "
                        f"or choose another --output_dir. If that run is dead, delete {self.path}."
                    ) from None
                who = (
                    "a run"
                    if holder is None
                    else f"pid {holder.get('pid')} (started {holder.get('started')})"
                )
                # one plain line, not a Python warning with its source line
                print(
                    f"warning: taking over the stale lock {self.path}: {who} no longer runs", file=sys.stderr
                )
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return self
        raise RunFolderError(f"could not take the lock {self.path}: another run keeps taking it")

    def _holder(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    @staticmethod
    def _stale(holder: dict[str, Any]) -> bool:
        if holder.get("host") != socket.gethostname():
            return False  # cannot tell from here
        try:
            return not _alive(int(holder["pid"]))
        except (KeyError, TypeError, ValueError):
            return True

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


# ------------------------------------------------------------------------------------------------
# start and resume rules


def existing_run(output_dir: str | Path) -> list[str]:
    """The run files already in ``output_dir`` (empty: nothing to lose)."""
    d = Path(output_dir)
    return [name for name in RUN_FILES if (d / name).exists()]


def refuse_existing_run(output_dir: str | Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse a fresh run over an existing one (read only: safe to call before taking the lock)."""
    found = existing_run(output_dir)
    if found and not (resume or overwrite):
        raise RunFolderError(
            f"output_dir {output_dir} already holds a run ({', '.join(found)}): pass --resume true to "
            f"continue it, --overwrite true to delete it and start again, or choose another --output_dir"
        )


def check_start(output_dir: str | Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse to start a fresh run over an existing one; with ``overwrite`` delete the old run's files.

    Call it with the lock held (the trainer also calls ``refuse_existing_run`` before creating anything).
    """
    refuse_existing_run(output_dir, resume=resume, overwrite=overwrite)
    if overwrite and not resume:
        for name in existing_run(output_dir):
            p = Path(output_dir) / name
            shutil.rmtree(p) if p.is_dir() else p.unlink()


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The fields (outside ``RESUME_MAY_DIFFER``) whose values differ, as ``field: saved -> current``."""
    out = []
    for key in sorted(set(saved) | set(current)):
        if key in RESUME_MAY_DIFFER:
            continue
        a, b = saved.get(key, "<absent>"), current.get(key, "<absent>")
        if a != b:
            out.append(f"{key}: {a!r} -> {b!r}")
    return out


def check_resume_config(saved: dict[str, Any] | None, cfg: Any, checkpoint: Path) -> str:
    """Refuse a checkpoint whose config differs from ``cfg`` in a field that changes the math. Returns a
    note for the resume message ("" if none): a run resumed with another ``steps`` keeps the steps it took,
    but the lr schedule (warm-up and cosine decay, sized from ``steps``) follows the new length from there
    on, so the result is not what a fresh run of that length gives."""
    if saved is None:
        return ""
    diff = config_differences(saved, asdict(cfg))
    if diff:
        raise RunFolderError(
            f"cannot resume from {checkpoint}: its run had a different config ("
            + "; ".join(diff)
            + "). Resume with the same values (the run's own: --config "
            + f"{Path(checkpoint).parent.parent / 'config.yaml'} --resume true), or start a new run in "
            "another --output_dir (or --overwrite true to replace this one)"
        )
    before, now = saved.get("steps"), cfg.steps
    if before is None or before == now:
        return ""
    return (
        f"; steps {before} -> {now}: the lr schedule (warm-up, cosine decay) follows {now} steps from here on, "
        f"its first steps followed {before}, so this is not the run a fresh {now}-step run would be"
    )


# ------------------------------------------------------------------------------------------------
# workers die with their launcher


def watch_parent(interval_s: float = 1.0) -> threading.Thread | None:
    """Under a launcher (``LOCAL_RANK`` set), exit this worker when its parent process is gone.

    ``accelerate launch`` / ``torchrun`` start the workers as children of the launcher; ``kill -9`` of the
    launcher gives them no signal, and they would go on writing the run folder. A daemon thread polls
    the parent pid and ends the process (exit code 1) once the worker has been re-parented.
    Returns the thread (None when not under a launcher).
    """
    if "LOCAL_RANK" not in os.environ:
        return None
    parent = os.getppid()

    def run() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                print(
                    f"[rank {os.environ.get('RANK', '?')}] launcher (pid {parent}) is gone: stopping",
                    flush=True,
                )
                os._exit(1)

    t = threading.Thread(target=run, name="watch-launcher", daemon=True)
    t.start()
    return t


__all__ = [
    "RESUME_MAY_DIFFER",
    "RUN_FILES",
    "RunFolderError",
    "RunLock",
    "check_resume_config",
    "check_start",
    "config_differences",
    "existing_run",
    "watch_parent",
]
