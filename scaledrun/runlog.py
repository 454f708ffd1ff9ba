"""Run logging: JSON lines (``metrics.jsonl``), TensorBoard (``tb/``) and a tqdm bar, main process only.

(Named ``runlog`` so that it does not shadow the standard library's ``logging``.)

Each ``log(step, row)`` appends one JSON object ``{"step": step, **row}`` to ``<output_dir>/metrics.jsonl``
(NaN written as ``null``; eval metrics, ``eval/...``, are in the row of the step they follow) and one
scalar per key to TensorBoard. On resume the file is truncated to the
rows with ``step ≤`` the checkpoint's step, so a killed-and-resumed run has exactly one row per step;
a last line cut off by a kill (not valid JSON) is dropped with a warning, there and in ``read_metrics``.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import RunConfig

METRICS_FILE = "metrics.jsonl"
#: a run's reward as its last line (``scaledrun.train``) and the app's Runs page report it: the mean over
#: this many last steps (one step's reward/mean is the mean of a few groups: too noisy to rank runs by)
SUMMARY_STEPS = 10


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _parse_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON rows of ``path``; a cut-off *last* line is dropped with a warning, any other bad line raises."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    rows = []
    for k, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            if k < len(lines) - 1:
                raise ValueError(
                    f"{path}: line {k + 1} is not valid JSON ({err}); fix or remove it"
                ) from None
            warnings.warn(
                f"{path}: dropped a cut-off last line (the run was killed while writing it)", stacklevel=3
            )
    return rows


def read_metrics(output_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of ``<output_dir>/metrics.jsonl`` (null read back as NaN)."""
    path = Path(output_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return [{k: (math.nan if v is None else v) for k, v in row.items()} for row in _parse_lines(path)]


def last_steps_mean(
    rows: list[dict[str, Any]], key: str = "reward/mean", n: int = SUMMARY_STEPS
) -> tuple[float, int]:
    """(mean, count): the mean of ``key`` over the last ``n`` rows, leaving out rows where it is missing or
    NaN, and how many values it averages; (NaN, 0) when none has one. The run's last line quotes it."""
    tail = [float(r[key]) for r in rows[-n:] if key in r and math.isfinite(float(r[key]))]
    return (math.fsum(tail) / len(tail), len(tail)) if tail else (math.nan, 0)


class RunLogger:
    """Writes metrics on the main process; a no-op elsewhere (``enabled=False``)."""

    def __init__(
        self,
        output_dir: str | Path,
        total_steps: int,
        enabled: bool = True,
        resume_step: int = 0,
        tensorboard: bool = True,
    ) -> None:
        self.enabled = enabled
        self.path = Path(output_dir) / METRICS_FILE
        self.writer = None
        self.bar = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_file():
            # the checkpoint's rows only: no duplicate after a resume, no orphan row past the checkpoint
            keep = [row for row in _parse_lines(self.path) if row["step"] <= resume_step]
            self.path.write_text("".join(json.dumps(row) + "\n" for row in keep))
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(Path(output_dir) / "tb"), purge_step=resume_step + 1)
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total_steps, initial=resume_step, desc="train", dynamic_ncols=True)

    def log(self, step: int, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        rec = {"step": step, **{k: _clean(float(v)) for k, v in row.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        if self.writer is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and math.isfinite(float(v)):
                    self.writer.add_scalar(k, float(v), step)
        if self.bar is not None:
            post = {k: f"{row[k]:.3f}" for k in ("reward/mean", "accuracy", "loss") if k in row}
            no_update = row.get("truncation/no_update") == 1.0
            if no_update:  # no loss to show: say why
                post.pop("loss", None)
                post["note"] = "all completions truncated, no update"
            self.bar.set_postfix(post, refresh=False)
            self.bar.update(1)
            if no_update:
                self.bar.refresh()  # shown even when it falls between two of tqdm's timed refreshes

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.bar is not None:
            self.bar.close()


def run_summary(
    out_dir: Path,
    rows: list[dict[str, float]],
    start: int,
    seconds: float,
    history: list[dict[str, Any]] | None = None,
) -> str:
    """The one line a run ends with: folder, steps, final reward, last eval, steps without an update, time.

    ``rows`` are this call's new steps; ``history`` all of the run's rows (``metrics.jsonl``, steps before
    a resume included; default ``rows``): the reward is the mean of its last ``SUMMARY_STEPS`` steps, the
    number the Runs page shows, whether or not the run was resumed in between.
    """
    if not rows:
        return f"run {out_dir}: nothing to do (already at its last step), {seconds:.0f} s"
    reward, tail = last_steps_mean(history if history else rows)
    evals = [r for r in rows if "eval/greedy_accuracy" in r]
    last_eval = f"last eval greedy accuracy {evals[-1]['eval/greedy_accuracy']:.3f}" if evals else "no eval"
    cut = sum(r.get("truncation/no_update", 0.0) == 1.0 for r in rows)
    no_update = (
        f", {cut} step{'s' if cut != 1 else ''} with every completion truncated (no update)" if cut else ""
    )
    steps = f"{len(rows)} new step{'s' if len(rows) != 1 else ''} up to step {len(rows) + start}"
    return (
        f"run {out_dir}: {steps}, reward {reward:.3f} (mean of the last {tail} step{'s' if tail != 1 else ''}), "
        f"{last_eval}{no_update}, {seconds:.0f} s"
    )


def truncation_warning(cfg: RunConfig, step: int) -> str:
    """What the run prints (once) at the first step whose every completion was truncated and masked."""
    return (
        f"WARNING step {step}: every completion reached max_new_tokens={cfg.max_new_tokens} without an end "
        f"token and `truncation: {cfg.truncation}` masked them all: this step trains on nothing. Raise "
        "`max_new_tokens` (a thinking model needs thousands of tokens), or turn thinking off "
        "(`chat_template_kwargs: {enable_thinking: false}` for Qwen3), or set `truncation: failure_reward` "
        "so that truncated completions are punished instead of dropped."
    )


def score_stats(totals: dict[str, float]) -> dict[str, float]:
    """``score/*`` of a step from its summed counts: rows scored (all passes), per completion, padding."""
    return {
        "score/rows": totals["rows_scored"],
        "score/rows_per_completion": totals["rows_scored"] / max(totals["rows"], 1.0),
        "score/padding_frac": 1.0 - totals["tokens"] / totals["slots"] if totals["slots"] > 0 else math.nan,
    }
