"""``tutorials/show.py``'s table: aligned columns, numbers with significant digits, exact zeros as 0."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location(
    "tutorial_show", Path(__file__).resolve().parents[2] / "tutorials" / "show.py"
)
assert _spec is not None and _spec.loader is not None
show = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(show)


def test_fmt_rounds_to_significant_digits_and_keeps_tiny_values_visible() -> None:
    assert show.fmt(0.19999999999999998) == "0.2"
    assert show.fmt(0.0) == "0" and show.fmt(-0.0) == "0"
    assert show.fmt(-1.6e-4) == "-1.600e-04"  # not rounded away to 0
    assert show.fmt(torch.tensor(0.30412)) == "0.3041"
    assert show.fmt(float("nan")) == "nan"
    assert show.fmt(True) == "True" and show.fmt("gspo") == "gspo"


def test_table_aligns_columns_in_the_given_order(capsys) -> None:
    show.table([{"arm": "grpo", "residual": 0.0}, {"arm": "gspo", "residual": 0.304}], ["residual", "arm"])
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["residual  arm", "0         grpo", "0.304     gspo"]
    show.table([])
    assert capsys.readouterr().out == "(no rows)\n"


def test_report_rows_quotes_the_report_and_refuses_a_missing_row(capsys) -> None:
    show.report_rows("toy_main")
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("prediction (REPORT.md)") and len(out) > 1
    report = show.REPORT.read_text(encoding="utf-8")
    for line in out[1:]:  # every quoted prediction is a row of the report's summary
        assert line.split("  ")[0].strip()[:40] in report
    with pytest.raises(ValueError, match="no prediction of study 'toy_main'"):
        show.report_rows("toy_main", "no such words anywhere")
