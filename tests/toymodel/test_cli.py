"""``python -m toymodel``: bad values end in argparse errors naming the option (exit code 2, no traceback);
the tables show full headers, columns that fit their values, "n/a" for NaN and for a std over one seed,
and every number equals the library's (``simulate``/``summarize``) for the same arguments; ``--json`` is
strict JSON with NaN as null.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import toymodel.__main__ as cli
from toymodel import simulate, summarize
from toymodel.compare import format_table

ROOT = Path(__file__).resolve().parents[2]
#: a short dfpo run with two seeds: shared_residual has values, group_shared_residual is NaN on most steps
ARGS = ["template_task", "--objective", "dfpo", "--transform", "orth_proj", "--steps", "5", "--every", "1"]


def _main(argv: list[str], capsys) -> str:
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert not err
    return out


def _usage_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert not out and "Traceback" not in err
    return err


def _tables(out: str) -> list[tuple[list[str], list[list[str]], list[str]]]:
    """Each table of the output: (header cells, rows of cells, the raw lines: header, rule, rows)."""
    lines = out.splitlines()
    found = []
    for i, line in enumerate(lines):
        if i and set(line.strip()) == {"─"}:
            header, body = lines[i - 1], []
            for row in lines[i + 1 :]:
                if not row.strip():
                    break
                body.append(row)
            found.append((header.split(), [r.split() for r in body], [header, line, *body]))
    return found


def _right_edges(line: str) -> list[int]:
    return [m.end() for m in re.finditer(r"\S+", line)]


def _cell(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.4f}"


# ---------------------------------------------------------------------------------------------------
# usage errors


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "argument --steps: must be ≥ 1, got 0"),
        (
            ["--group-size", "1"],
            "argument --group-size: must be ≥ 2, got 1: a group of one completion is its own group's mean, "
            "so every advantage is 0 and nothing learns",
        ),
    ],
)
def test_real_cli_exits_2_with_the_option_named(argv, message):
    """The reported edges, through the real command line: no traceback about rows_by_seed, no silent run."""
    proc = subprocess.run(
        [sys.executable, "-m", "toymodel", "template_task", "--objective", "grpo", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and "rows_by_seed" not in proc.stderr
    assert not proc.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "-3"], "argument --steps: must be ≥ 1, got -3"),
        (["--steps", "1.5"], "argument --steps: expected a whole number, got '1.5'"),
        (["--group-size", "0"], "argument --group-size: must be ≥ 2, got 0"),
        (["--seeds", "0"], "argument --seeds: must be ≥ 1, got 0"),
        (["--inner-epochs", "0"], "argument --inner-epochs: must be ≥ 1, got 0"),
        (["--num-groups", "0"], "argument --num-groups: must be ≥ 1, got 0"),
        (["--num-minibatches", "0"], "argument --num-minibatches: must be ≥ 1, got 0"),
        (["--every", "0"], "argument --every: must be ≥ 1, got 0"),
        (["--lr", "0"], "argument --lr: must be a finite number > 0, got 0"),
        (["--lr", "nan"], "argument --lr: must be a finite number > 0, got nan"),
        (["--threshold", "inf"], "argument --threshold: must be a finite number, got inf"),
    ],
)
def test_bad_values_are_usage_errors(argv, message, capsys):
    err = _usage_error(["template_task", "--objective", "grpo", *argv], capsys)
    assert message in err and "usage: python -m toymodel" in err


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--group-size", "1"]])
def test_json_mode_gets_the_same_errors(argv, capsys):
    err = _usage_error(["template_task", "--objective", "grpo", "--json", *argv], capsys)
    assert f"argument {argv[0]}" in err


def test_compare_refuses_objective_options(capsys):
    err = _usage_error(["template_task", "--compare", "--transform", "orth_proj", "--no-clip"], capsys)
    assert "--transform, --no-clip would be ignored" in err


# ---------------------------------------------------------------------------------------------------
# tables


def test_step_table_has_full_headers_and_the_library_means(capsys):
    out = _main([*ARGS, "--seeds", "2"], capsys)
    runs = [simulate("template_task", "dfpo", steps=5, seed=s, transform="orth_proj") for s in (0, 1)]
    (head, rows, raw), _ = _tables(out)
    assert head == ["step", *cli.TABLE_KEYS]  # nothing cut to 10 characters
    assert [r[0] for r in rows] == [str(i) for i in range(1, 6)]
    for i, row in enumerate(rows):
        for key, cell in zip(cli.TABLE_KEYS, row[1:], strict=True):
            xs = [r[i][key] for r in runs if not math.isnan(r[i][key])]
            assert cell == _cell(statistics.mean(xs) if xs else math.nan), (i, key)
    # every value is right-aligned under its header
    edges = [_right_edges(line) for line in raw[:1] + raw[2:]]
    assert all(e == edges[0] for e in edges)
    assert not re.search(r"\bnan\b", out, re.IGNORECASE)
    # the residual NaN is shown as n/a, and the data does have such steps
    assert any(math.isnan(r[i]["group_shared_residual"]) for r in runs for i in range(5))


def test_summary_equals_summarize_and_std_over_one_seed_is_na(capsys):
    out = _main(ARGS, capsys)
    runs = [simulate("template_task", "dfpo", steps=5, seed=0, transform="orth_proj")]
    _, (head, rows, _) = _tables(out)
    assert head == ["metric", "final", "±", "std", "Jitter₂"]
    assert [r[0] for r in rows] == list(cli.SUMMARY_KEYS)
    for row in rows:
        s = summarize(runs, row[0])
        assert row[1] == _cell(s["final_mean"]) and row[3] == _cell(s["jitter2_mean"])
        assert row[2] == "n/a"  # a std over one seed, which summarize reports as 0.0
    assert "± 0.0000" not in out
    # the final group-shared residual does not exist (no event shared by the whole group): n/a, not nan
    assert math.isnan(summarize(runs, "group_shared_residual")["final_mean"])
    assert rows[cli.SUMMARY_KEYS.index("group_shared_residual")][1] == "n/a"
    assert "steps to expected_reward ≥ 0.9: n/a (no seed reached it in 5 steps)" in out


def test_summary_std_and_steps_to_threshold_over_seeds(capsys):
    out = _main([*ARGS, "--seeds", "3", "--threshold", "0.4"], capsys)
    runs = [simulate("template_task", "dfpo", steps=5, seed=s, transform="orth_proj") for s in range(3)]
    _, (_, rows, _) = _tables(out)
    for row in rows:
        s = summarize(runs, row[0])
        finite = [r[-1][row[0]] for r in runs if not math.isnan(r[-1][row[0]])]
        assert row[2] == (_cell(s["final_std"]) if len(finite) > 1 else "n/a"), row
    reward = summarize(runs, "expected_reward", threshold=0.4)
    reached = [h for h in reward["steps_to_threshold"] if h is not None]
    assert reached, "the test needs a threshold some seed reaches"
    assert (
        f"steps to expected_reward ≥ 0.4: {_cell(reward['steps_mean'])} (mean over the {len(reached)} of 3 seed(s)"
        in out
    )


def test_large_values_widen_their_column(capsys, monkeypatch):
    """A value far wider than the old 10-character columns keeps every column aligned, nothing cut."""
    real = cli.simulate

    def scaled(*args, **kwargs):
        rows = real(*args, **kwargs)
        for r in rows:
            r["equiv_log_odds"] *= 1e7
            r["ratio/mean"] = 1e15
        return rows

    monkeypatch.setattr(cli, "simulate", scaled)
    out = _main(ARGS, capsys)
    (head, rows, raw), _ = _tables(out)
    runs = [scaled("template_task", "dfpo", steps=5, seed=0, transform="orth_proj")]
    col = head.index("equiv_log_odds")
    for i, row in enumerate(rows):
        assert row[col] == f"{runs[0][i]['equiv_log_odds']:.4f}"
        assert abs(float(row[col])) > 1e7
        assert row[head.index("ratio/mean")] == "1.0000e+15"
    edges = [_right_edges(line) for line in raw[:1] + raw[2:]]
    assert all(e == edges[0] for e in edges)


def test_json_is_strict_with_nan_as_null(capsys):
    out = _main([*ARGS, "--json"], capsys)

    def no_constants(name):
        raise AssertionError(f"{name} in --json output")

    data = json.loads(out, parse_constant=no_constants)
    runs = [simulate("template_task", "dfpo", steps=5, seed=0, transform="orth_proj")]
    assert data["summary"]["group_shared_residual"]["final_mean"] is None
    for got, want in zip(data["rows"][0], runs[0], strict=True):
        for k, v in want.items():
            assert got[k] == (None if math.isnan(v) else v), k


def test_compare_with_one_seed_says_na_for_the_std(capsys):
    out = _main(["equivalent_solutions", "--compare", "--seeds", "1", "--steps", "3"], capsys)
    assert "± n/a" in out and "± 0.000 " not in out and not re.search(r"\bnan\b", out, re.IGNORECASE)


def test_format_table_std_over_the_seeds_that_reached_the_threshold():
    row = {"variant": "x", "reached_frac": 0.5}
    for c in ("expected_reward", "equiv_entropy", "equiv_log_odds", "template_kl", "jitter2"):
        row |= {c: 0.5, f"{c}_std": 0.1}
    for c in ("shared_residual", "group_shared_residual", "sequence_net_residual"):
        row |= {c: math.nan, f"{c}_std": math.nan}
    row |= {"steps_to_threshold": 12.0, "steps_to_threshold_std": 0.0}
    row |= {"template_kl_at_threshold": 0.2, "template_kl_at_threshold_std": 0.0}
    table = format_table([row], seeds=2)  # one of two seeds reached it: no std
    assert "| 12.0 ± n/a (50% reached) |" in table and "| 0.200 ± n/a |" in table
    assert "| 0.500 ± 0.100 |" in table and "| n/a |" in table
    assert "12.0 ± 0.0 (50% reached)" in format_table([row])  # without seeds: as before
