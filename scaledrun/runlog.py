"""Run logging: JSON lines (``metrics.jsonl``), TensorBoard (``tb/``) and a tqdm bar, main process only.

(Named ``runlog`` so that it does not shadow the standard library's ``logging``.)

Each ``log(step, row)`` appends one JSON object ``{"step": step, **row}`` to ``<output_dir>/metrics.jsonl``
(NaN written as ``null``; eval metrics, ``eval/...``, are in the row of the step they follow) and one
scalar per key to TensorBoard. On resume the file is truncated to the
rows with ``step ≤`` the checkpoint's step, so a killed-and-resumed run has exactly one row per step.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def read_metrics(output_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of ``<output_dir>/metrics.jsonl`` (null read back as NaN)."""
    path = Path(output_dir) / METRICS_FILE
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            rows.append({k: (math.nan if v is None else v) for k, v in json.loads(line).items()})
    return rows


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
            keep = [
                r
                for r in self.path.read_text().splitlines()
                if r.strip() and json.loads(r)["step"] <= resume_step
            ]
            self.path.write_text("".join(line + "\n" for line in keep))
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
            post = {k: row[k] for k in ("reward/mean", "accuracy", "loss") if k in row}
            self.bar.set_postfix({k: f"{v:.3f}" for k, v in post.items()}, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.bar is not None:
            self.bar.close()
