"""Page 7, Runs: how did real LM runs of ``scaledrun`` (GRPO, GRPO-fix, GSPO, DFPO) train?

Pick a folder that holds run folders (each written by ``python -m scaledrun.train``: a ``metrics.jsonl``
and a ``config.yaml``), then one or more runs. The curves are ``app.figures.curve_figure`` with
``{run label: [rows]}`` (one run per label, so no seed band), on the same row keys as the toy's training
lab where they exist (``scaledrun.train.STEP_KEYS``); the table compares the runs side by side with
``cancellation.diagnostics.steps_to_threshold`` and ``jitter2`` (DFPO Table 2, eq. 20).

The folder input's default is the environment variable ``CANCELLATION_RUNS_DIR`` when set (the browser
test points it at a fixture run), else ``runs/`` (the trainer's default ``output_dir`` is ``runs/tiny``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st
import yaml

from app.common import page_header
from app.figures import CURVE_TITLES, curve_figure
from cancellation.diagnostics import jitter2, steps_to_threshold

#: environment variable naming the default runs folder
RUNS_DIR_ENV = "CANCELLATION_RUNS_DIR"
DEFAULT_RUNS_DIR = "runs"
METRICS_FILE, CONFIG_FILE = "metrics.jsonl", "config.yaml"

#: row key of scaledrun's metrics → (title, paper reference); keys shared with the toy keep its titles
RUN_CURVES: dict[str, tuple[str, str]] = {
    "reward/mean": ("Mean sampled reward (the toy's E[R] analogue)", "DFPO eq. (43) rewards"),
    "eval/greedy_accuracy": ("Held-out greedy accuracy", "evaluation every eval_every steps"),
    "shared_residual": CURVE_TITLES["shared_residual"],
    "group_shared_residual": CURVE_TITLES["group_shared_residual"],
    "asym": CURVE_TITLES["asym"],
    "clip/low_frac": CURVE_TITLES["clip/low_frac"],
    "clip/high_frac": CURVE_TITLES["clip/high_frac"],
    "entropy": ("Token entropy of π_old on sampled tokens", "mean per token"),
    "kl": ("KL to the reference (k3)", "only when β > 0"),
    "completion_length": ("Completion length (tokens)", "mean per completion"),
}


class RunError(ValueError):
    """A run folder whose files cannot be read (the message names the file and what is wrong)."""


def find_runs(folder: Path) -> list[Path]:
    """The run folders in ``folder`` (itself included): directories holding metrics.jsonl and config.yaml."""
    candidates = [folder, *sorted(p for p in folder.iterdir() if p.is_dir())]
    return [p for p in candidates if (p / METRICS_FILE).is_file() and (p / CONFIG_FILE).is_file()]


@st.cache_data(show_spinner=False, max_entries=256)
def load_run(path: str, mtime: float) -> tuple[list[dict[str, float]], dict[str, Any]]:
    """(rows, config) of the run folder ``path``; ``mtime`` (of metrics.jsonl) keys the cache.

    Raises:
        RunError: a line of metrics.jsonl that is not a JSON object with a numeric ``step``, a
            non-numeric value, an empty metrics file, or a config.yaml that is not a mapping.
    """
    import json

    folder = Path(path)
    rows: list[dict[str, float]] = []
    for n, line in enumerate((folder / METRICS_FILE).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{folder / METRICS_FILE}, line {n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RunError(
                f"{where} is not valid JSON ({exc.msg}): is the file truncated or edited?"
            ) from exc
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int | float):
            raise RunError(f"{where}: expected a JSON object with a numeric 'step' key")
        row: dict[str, float] = {}
        for k, v in rec.items():
            if v is None:
                row[k] = math.nan  # the trainer writes NaN (a step without an update) as null
            elif isinstance(v, int | float) and not isinstance(v, bool):
                row[k] = float(v)
            else:
                raise RunError(f"{where}: the value of {k!r} is {v!r}, not a number")
        rows.append(row)
    if not rows:
        raise RunError(f"{folder / METRICS_FILE} has no rows yet: has the run made its first step?")
    try:
        config = yaml.safe_load((folder / CONFIG_FILE).read_text()) or {}
    except yaml.YAMLError as exc:
        raise RunError(f"{folder / CONFIG_FILE} is not valid YAML: {exc}") from exc
    if not isinstance(config, dict):
        raise RunError(f"{folder / CONFIG_FILE}: expected a mapping of field: value")
    return rows, config


def run_label(name: str, config: dict[str, Any]) -> str:
    """``folder · objective[ transform]``."""
    obj = str(config.get("objective", "?"))
    if config.get("transform"):
        obj += f" {config['transform']}"
    return f"{name} · {obj}"


def curve(rows: list[dict[str, float]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of ``key`` over the rows that have a finite value for it."""
    pts = [(r["step"], r[key]) for r in rows if key in r and math.isfinite(r[key])]
    return [p[0] for p in pts], [p[1] for p in pts]


def moving_mean(rows: list[dict[str, float]], window: int) -> list[dict[str, float]]:
    """The rows with every curve key replaced by its trailing mean over ``window`` rows (NaNs skipped)."""
    if window <= 1:
        return rows
    out = []
    for i, r in enumerate(rows):
        recent = rows[max(0, i - window + 1) : i + 1]
        new = dict(r)
        for k in RUN_CURVES:
            vals = [x[k] for x in recent if k in x and math.isfinite(x[k])]
            if k in r:
                new[k] = sum(vals) / len(vals) if vals and math.isfinite(r[k]) else math.nan
        out.append(new)
    return out


def summary_row(
    label: str, rows: list[dict[str, float]], config: dict[str, Any], threshold: float, window: int
):
    """One table row: config, final values, steps to threshold (smoothed reward), Jitter₂ (raw reward)."""
    steps, reward = curve(rows, "reward/mean")
    _, smooth = curve(moving_mean(rows, window), "reward/mean")
    _, greedy = curve(rows, "eval/greedy_accuracy")
    reached = steps_to_threshold(smooth, threshold, steps) if smooth else None
    return {
        "run": label,
        "objective": config.get("objective"),
        "transform": config.get("transform") or "—",
        "steps": int(rows[-1]["step"]),
        "final reward/mean": reward[-1] if reward else math.nan,
        f"mean reward, last {window}": smooth[-1] if smooth else math.nan,
        "final greedy accuracy": greedy[-1] if greedy else math.nan,
        "steps to threshold": math.nan if reached is None else reached,
        "Jitter₂ reward": jitter2(reward) if len(reward) >= 3 else math.nan,
    }


page_header(
    "Runs",
    "Did the language-model runs learn, and did their shared-token gradients cancel as the objective promises?",
    r"\mathrm{Jitter}_2(m) = \frac{1}{T-2}\sum_{t=1}^{T-2}\left|m_{t+2} - 2m_{t+1} + m_t\right|\quad\text{(20)},"
    r"\qquad \mathrm{Asym} = \mathrm{Var}_i(w_i\hat A_i)\quad\text{(23)}",
    "Runs of `python -m scaledrun.train` (metrics.jsonl + config.yaml per folder). Keys as in the toy: "
    "DFPO eq. (2)/(72) residuals, eq. (23) Asym, eq. (46)–(47) clip fractions; Table 2 steps-to-threshold.",
)

with st.sidebar:
    folder_text = st.text_input(
        "Folder of run folders",
        value=os.environ.get(RUNS_DIR_ENV, DEFAULT_RUNS_DIR),
        key="runs_dir",
        help=f"A folder whose sub-folders are runs (or a run folder itself). Default: ${RUNS_DIR_ENV} or runs/.",
    )
    folder = Path(folder_text).expanduser()
    if not folder.is_dir():
        st.error(
            f"The folder `{folder_text}` does not exist. Enter the folder that holds your run folders "
            "(the parent of a trainer's `output_dir`, e.g. `runs`)."
        )
        st.stop()
    found = find_runs(folder)
    if not found:
        st.warning(
            f"No runs in `{folder_text}`: a run is a folder with `{METRICS_FILE}` and `{CONFIG_FILE}`, as "
            "`python -m scaledrun.train --output_dir <folder>/<name>` writes. Train one, or pick another folder."
        )
        st.stop()
    names = {("." if p == folder else p.name): p for p in found}
    picked = st.multiselect("Runs", list(names), default=list(names)[:4], key="runs")
    window = st.slider("Moving mean over steps", 1, 50, 10, key="window")
    threshold = st.number_input(
        "Reward threshold", min_value=0.0, max_value=1.0, value=0.35, step=0.05, key="threshold"
    )

if not picked:
    st.info("Pick one or more runs in the sidebar.")
    st.stop()

runs: dict[str, tuple[list[dict[str, float]], dict[str, Any]]] = {}
for name in picked:
    path = names[name]
    try:
        rows, config = load_run(str(path), (path / METRICS_FILE).stat().st_mtime)
        runs[run_label(name, config)] = (rows, config)
    except (RunError, OSError) as exc:
        st.error(f"Run `{name}` cannot be read: {exc}")
if not runs:
    st.stop()

st.subheader("Final values")
cols = st.columns(min(len(runs), 4))
for i, (label, (rows, _)) in enumerate(runs.items()):
    _, reward = curve(rows, "reward/mean")
    cols[i % len(cols)].metric(
        f"final reward/mean · {label}",
        f"{reward[-1]:.4f}" if reward else "—",
        help=f"step {rows[-1]['step']:.0f}",
    )

st.subheader("Side by side")
table = pd.DataFrame([summary_row(lbl, r, c, float(threshold), int(window)) for lbl, (r, c) in runs.items()])
st.dataframe(table.set_index("run"), key="summary")
st.caption(
    f"Steps to threshold: the first step whose reward/mean, as a trailing mean over {window} steps, reaches "
    f"{threshold:g} (empty: never). Jitter₂ (eq. 20) of the raw per-step reward/mean."
)

st.subheader(f"Curves (trailing mean over {window} steps)")
smoothed = {label: moving_mean(rows, int(window)) for label, (rows, _) in runs.items()}
cols = st.columns(2)
shown = [k for k in RUN_CURVES if any(curve(r, k)[0] for r, _ in runs.values())]
for i, key in enumerate(shown):
    title, ref = RUN_CURVES[key]
    # only the rows that have the key: sparse keys (eval every N steps) then draw as connected lines
    with_key = {
        lbl: [[r for r in rows if math.isfinite(r.get(key, math.nan))]] for lbl, rows in smoothed.items()
    }
    cols[i % 2].plotly_chart(curve_figure(with_key, key, title=f"{title} · {ref}"), key=f"curve_{key}")
missing = [k for k in RUN_CURVES if k not in shown]
if missing:
    st.caption(f"Not drawn (no finite value in these runs): {', '.join(missing)}.")
