"""One small helper for the tutorials' tables: ``table(rows)`` prints aligned columns.

Like ``exercise_check.py``, this file sits next to the tutorials, which import it from their working
directory. It computes nothing: it only lays out numbers the cells computed with the library.

    table([{"objective": "grpo", "residual": 0.0}, {"objective": "gspo", "residual": 0.304}])

prints

    objective  residual
    grpo       0
    gspo       0.304
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["fmt", "report_rows", "table"]


def fmt(x: Any, digits: int = 4) -> str:
    """A number with ``digits`` significant digits (exact zeros as ``0``, tiny rounding noise kept
    visible in scientific notation), a one-element tensor as its number, anything else as ``str``."""
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return str(x)
    x = float(x)
    if math.isnan(x):
        return "nan"
    if x == 0.0:
        return "0"
    if abs(x) < 1e-3 or abs(x) >= 1e5:
        return f"{x:.{max(digits - 1, 0)}e}"
    return f"{x:.{digits}g}"


def table(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None, *, digits: int = 4
) -> None:
    """Print ``rows`` (dicts) as aligned columns: the keys of the first row, or ``columns``, in order."""
    if not rows:
        print("(no rows)")
        return
    cols = list(columns) if columns is not None else list(rows[0])
    cells = [[fmt(r.get(c, ""), digits) for c in cols] for r in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip())
    for line in cells:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())


#: the experiment report whose "Summary of predictions" table ``report_rows`` quotes
REPORT = Path(__file__).resolve().parents[1] / "experiments" / "REPORT.md"


def report_rows(study: str, *words: str) -> None:
    """Quote ``experiments/REPORT.md``: the rows of its "Summary of predictions" for ``study`` whose
    prediction contains every one of ``words`` (case-insensitive), as a ``table`` of the prediction,
    Δ (arm − baseline), its 95 % interval, the seeds and the verdict. Nothing is recomputed."""
    rows = []
    for line in REPORT.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) != 12 or cells[2] != study:
            continue
        prediction = cells[0].replace("\\|", "|").split(" _(")[0]
        if all(w.lower() in prediction.lower() for w in words):
            rows.append({"prediction (REPORT.md)": prediction, "Δ": cells[4], "95% interval": cells[5],
                         "seeds": cells[6], "verdict": cells[11]})  # fmt: skip
    if not rows:  # a tutorial quoting a row the report no longer has must not go quiet
        raise ValueError(
            f"experiments/REPORT.md has no prediction of study {study!r} containing {list(words)}: "
            "rebuild the report (python -m experiments --report-only) or update the quote"
        )
    table(rows)
