"""Page 7, Runs: how did real LM runs of ``scaledrun`` (GRPO, GRPO-fix, GSPO, DFPO) train?

Pick a folder that holds run folders (each written by ``python -m scaledrun.train``: a ``metrics.jsonl``
and a ``config.yaml``), then one or more runs. The curves are ``plots.curve_figure`` with
``{run label: [rows]}`` (one run per label, so no seed band), on the same row keys as the toy's training
lab where they exist (``scaledrun.train.STEP_KEYS``). The headline is each run's reward as its last line
reports it, the mean of its last 10 steps (``scaledrun.runlog.last_steps_mean``; one step's reward ranked
two runs the wrong way round); the table compares the runs side by side with
``cancellation.diagnostics.steps_to_threshold`` and ``jitter2`` (DFPO Table 2, eq. 20), in columns short
enough to fit a 1,500 px window (the run's label names its objective and transform). Steps to threshold
reads the reward's trailing mean over full windows only (a partial window at the start of a run is one or
a few noisy steps, not a level the run has reached); the threshold defaults to one relative to the picked
runs' rewards (``auto_threshold``), since a fixed one can lie below where every run starts. The cancellation
meters (``cancellation.update.RESIDUAL_KEYS``) are drawn beside the other curves; the energy and
token-flip diagnostics, which the trainer measures on one mini-batch of each step, get their own section.

The folder input's default is the environment variable ``CANCELLATION_RUNS_DIR`` when set (the browser
test points it at a fixture run), else ``runs/`` (the trainer's default ``output_dir`` is ``runs/tiny``).
The folder may also be one run folder: that run is then the one run offered, under its own name; run
folders two levels down (a sweep's ``<arm>/seed<k>``, ``experiments/lm.py`` and ``lm_power.py``) are offered as ``arm/seed<k>``. A new
folder starts with its first runs picked (a selection never outlives the folder it was made in). A folder that
does not exist, is a file or holds no run folder is said so on the page, naming it, with the commands (the
README's quick start) that build the tiny model and train a first run into it.
"""

from __future__ import annotations

import math
import os
import shlex
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st
import yaml

from app.common import page_header
from cancellation.diagnostics import jitter2, steps_to_threshold, trailing_mean
from plots import CURVE_TITLES, curve_figure
from scaledrun.runlog import SUMMARY_STEPS, last_steps_mean

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
    "sequence_net_residual": CURVE_TITLES["sequence_net_residual"],
    "asym": CURVE_TITLES["asym"],
    "clip/low_frac": CURVE_TITLES["clip/low_frac"],
    "clip/high_frac": CURVE_TITLES["clip/high_frac"],
    "entropy": ("Token entropy of π_old on sampled tokens", "mean per token"),
    "kl": ("KL to the reference (k3)", "only when β > 0"),
    "completion_length": ("Completion length (tokens)", "mean per completion"),
}

#: the trainer's diagnostics measured on one mini-batch per step (``scaledrun.train``): key → (title, reference)
DIAGNOSTIC_CURVES: dict[str, tuple[str, str]] = {
    "energy/bucket_0": ("Energy share, most frequent tokens (first mini-batch)", "DFPO eq. (24)"),
    "energy/bucket_1": ("Energy share, middle-frequency tokens (first mini-batch)", "DFPO eq. (24)"),
    "energy/bucket_2": ("Energy share, rarest tokens (first mini-batch)", "DFPO eq. (24)"),
    "flip/rate": (
        "Token-flip rate against the advantage's sign (last mini-batch)",
        "Cancellation-hypothesis paper App. C eq. (16)",
    ),
}
#: every key the page can draw
ALL_CURVES = {**RUN_CURVES, **DIAGNOSTIC_CURVES}

#: why DFPO's token-level residuals need not be 0 while its sequence-net residual is
RESIDUAL_NOTE = (
    "Cancellation meters: Σ|net| / Σ gross of the coefficients ∂J/∂logp that the step's optimiser steps "
    "applied. Under DFPO the token-level residuals (shared, group-shared) can be non-zero when a group's "
    "completions differ in length: GSPO's length normalisation α = 1/|y_i| gives every token of completion "
    "i the coefficient s̃_i·Â_i/|y_i|, so a token that completions of different lengths share gets unequal "
    "coefficients and Σ_i s̃_i·Â_i/|y_i| ≠ 0, although Σ_i s̃_i·Â_i = 0. The sequence-net residual sums "
    "each completion's coefficients first (c_i = Σ_t ∂J/∂logp_{i,t} = s̃_i·Â_i/B) and is 0 under DFPO "
    "with any transform; under GRPO's token-mean with unequal lengths it is not."
)
DIAGNOSTICS_NOTE = (
    "Measured on one mini-batch per step, not on the whole step: energy/bucket_k (eq. 24, the output-layer "
    "proxy |coef|·‖e_y − π‖·‖h‖, buckets by token frequency, 0 = most frequent) on the first mini-batch of "
    "each step (it needs that mini-batch's (B, T, V) probabilities; NaN when they would be too large); "
    "the token-flip rate (cancellation-hypothesis paper App. C) on the last mini-batch only, comparing its "
    "log-probs before and after its own update."
)


class RunError(ValueError):
    """A run folder whose files cannot be read (the message names the file and what is wrong)."""


def _is_run(p: Path) -> bool:
    return (p / METRICS_FILE).is_file() and (p / CONFIG_FILE).is_file()


def find_runs(folder: Path) -> list[Path]:
    """The run folders in ``folder`` (itself included): directories holding metrics.jsonl and config.yaml,
    one level down, or two levels down inside a sub-folder that is not a run itself (a sweep's
    ``<arm>/seed<k>`` folders, ``experiments/lm.py``)."""
    candidates = [folder]
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        candidates.append(sub)
        if not _is_run(sub):
            candidates += sorted(p for p in sub.iterdir() if p.is_dir())
    return [p for p in candidates if _is_run(p)]


def run_names(folder: Path, found: list[Path]) -> dict[str, Path]:
    """{name shown in the picker: run folder}: a sub-folder by its path under ``folder`` (``arm/seed0`` two
    levels down), ``folder`` itself by its own name (``.`` only if a sub-folder has that name too)."""
    own = folder.resolve().name or str(folder.resolve())
    subs = {p.relative_to(folder).as_posix() for p in found if p != folder}
    names = {}
    for p in found:
        name = p.relative_to(folder).as_posix() if p != folder else (own if own not in subs else ".")
        names[name] = p
    return names


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
    """The rows with every curve key replaced by its trailing mean over ``window`` rows (NaNs skipped;
    a row whose own value is NaN stays NaN)."""
    if window <= 1:
        return rows
    out = [dict(r) for r in rows]
    for k in ALL_CURVES:
        means = trailing_mean([r.get(k, math.nan) for r in rows], window)
        for r, new, m in zip(rows, out, means, strict=True):
            if k in r:
                new[k] = m if math.isfinite(r[k]) else math.nan
    return out


def window_means(rows: list[dict[str, float]], key: str, window: int) -> tuple[list[float], list[float]]:
    """(steps, values): the trailing mean of ``key`` over ``window`` rows, at the rows whose window is full.

    A row's window is itself and the ``window − 1`` rows before it; the first ``window − 1`` rows have a
    partial window and give nothing (their "mean" would be one or a few noisy steps). NaN values are left
    out of a mean; a window without a finite value, or a row whose own value is NaN, gives nothing.
    """
    window = max(1, int(window))
    means = trailing_mean([r.get(key, math.nan) for r in rows], window, full=True)
    steps, values = [], []
    for r, m in zip(rows, means, strict=True):
        if math.isfinite(r.get(key, math.nan)) and math.isfinite(m):
            steps.append(r["step"])
            values.append(m)
    return steps, values


def auto_threshold(curves: list[list[float]]) -> float | None:
    """The default reward threshold for ``curves`` (each run's full-window reward means): halfway from the
    highest starting level (a run's first full-window mean) to the best level any run reaches, so that no
    run counts as having reached it at its start unless it starts at the best level. None: no full window."""
    curves = [c for c in curves if c]
    if not curves:
        return None
    start, best = max(c[0] for c in curves), max(max(c) for c in curves)
    return start + 0.5 * (best - start)


def summary_row(label: str, rows: list[dict[str, float]], threshold: float | None, window: int):
    """One table row, keyed by ``label`` (which names the objective and transform): steps, the reward's mean
    over the last full window, the last held-out greedy accuracy, steps to threshold (the reward's
    full-window trailing mean; NaN when never reached, when there is no threshold or the run is shorter
    than the window), Jitter₂ (the raw reward). Short column names: the table fits a 1,500 px window."""
    _, reward = curve(rows, "reward/mean")
    steps, smooth = window_means(rows, "reward/mean", window)
    _, greedy = curve(rows, "eval/greedy_accuracy")
    reached = steps_to_threshold(smooth, threshold, steps) if smooth and threshold is not None else None
    return {
        "run": label,
        "steps": int(rows[-1]["step"]),
        f"reward, last {window}": smooth[-1] if smooth else math.nan,
        "last eval accuracy": greedy[-1] if greedy else math.nan,
        "steps to threshold": math.nan if reached is None else reached,
        "Jitter₂ reward": jitter2(reward) if len(reward) >= 3 else math.nan,
    }


def final_reward(label: str, rows: list[dict[str, float]]) -> tuple[str, str, str]:
    """(label, value, help) of a run's headline ``st.metric``: its reward/mean averaged over the last
    ``SUMMARY_STEPS`` steps (fewer in a shorter run, as the label says) as the trainer's last line reports
    it (``scaledrun.runlog.last_steps_mean``), with the last step's own value in the help. The label starts
    with the run's name: four metrics side by side cut a long label's end."""
    mean, n = last_steps_mean(rows)
    _, reward = curve(rows, "reward/mean")
    last = f"{reward[-1]:.4f}" if reward else "—"
    return (
        f"{label} · mean of the last {n} steps",
        f"{mean:.4f}" if n else "—",
        f"up to step {rows[-1]['step']:.0f}; the last step alone: {last}",
    )


#: the repository root: the commands below name the tiny model's folder and the config relative to it
REPO_ROOT = Path(__file__).resolve().parents[2]
#: the run folder the commands below write (its name under the folder of runs)
EXAMPLE_RUN = "offpolicy-grpo"


def no_runs_message(folder_text: str, folder: Path) -> tuple[str, str]:
    """(kind, markdown): why ``folder`` (typed as ``folder_text``) offers no run; kind ``error`` (it does not
    exist, or is a file) or ``warning`` (a folder without run folders)."""
    where = f"`{folder_text or '.'}`"
    if str(folder.resolve()) != folder_text:
        where += f" (`{folder.resolve()}`)"
    if not folder.exists():
        return "error", (
            f"The folder {where} does not exist. Enter the folder that holds your run folders in the "
            "sidebar, or make a first run into this one with the commands below (the trainer creates it)."
        )
    if not folder.is_dir():
        return "error", f"{where} is a file, not a folder. Enter the folder that holds your run folders."
    return "warning", (
        f"No runs were found in the folder {where}. A run is a folder with `{METRICS_FILE}` and "
        f"`{CONFIG_FILE}`, as `python -m scaledrun.train` writes into its `--output_dir`; this page lists the "
        "run folders inside the folder you enter (and inside its sub-folders, as a sweep's `arm/seed0`). "
        "To make one, use the commands below."
    )


def how_to_make_a_run(folder: Path) -> str:
    """The two commands (run from the repository root) that build the tiny model and train one run into
    ``folder/offpolicy-grpo`` (as in the README's quick start); ``folder`` absolute unless it is relative to
    the repository root already (the app started there)."""
    runs = folder if folder.is_absolute() or Path.cwd().resolve() == REPO_ROOT else folder.resolve()
    out = shlex.quote((runs / EXAMPLE_RUN).as_posix())
    return (
        "# 1. the tiny Qwen3 model and its tokenizer (skip if artifacts/tiny-qwen3 exists)\n"
        "python -m scaledrun.tiny --out artifacts/tiny-qwen3\n"
        "# 2. one GRPO run, 200 steps, into a folder under the folder of runs\n"
        f"python -m scaledrun.train --config scaledrun/configs/offpolicy.yaml --objective grpo --output_dir {out}"
    )


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
    found = find_runs(folder) if folder.is_dir() else []

if not found:  # said on the page itself, with the commands that make a run here
    kind, message = no_runs_message(folder_text, folder)
    (st.error if kind == "error" else st.warning)(message)
    if not folder.exists() or folder.is_dir():
        st.markdown("**Make a first run**")
        st.code(how_to_make_a_run(folder), language="bash")
        st.caption(
            "Run these from the repository root (the tiny model's folder and the config are relative to it), "
            "as in the README's quick start: the first builds the tiny model once, the second trains 200 steps "
            f"of GRPO on it on the CPU. Then rerun this page: the run is listed as `{EXAMPLE_RUN}`. Each run "
            "needs its own folder under the folder of runs (`--objective gspo --output_dir "
            "…/offpolicy-gspo` for a second one to compare); `python -m scaledrun.train --help` lists every "
            "option."
        )
    st.stop()

with st.sidebar:
    names = run_names(folder, found)
    # the picks belong to a folder: a new folder starts with its first runs (a kept selection would be
    # filtered to nothing by the new options); the same folder whose runs changed keeps the picks that remain
    listing = (str(folder.resolve()), tuple(names))
    if st.session_state.get("runs_listing") != listing:
        before = st.session_state.get("runs_listing")
        same_folder = before is None or before[0] == listing[0]
        kept = [n for n in st.session_state.get("runs", []) if n in names] if same_folder else []
        st.session_state["runs"] = kept or list(names)[:4]
        st.session_state["runs_listing"] = listing
    picked = st.multiselect("Runs", list(names), key="runs")
    window = st.slider(
        "Moving mean over steps", 1, 50, 10, key="window",
        help="Curves: the trailing mean over this many steps. Steps to threshold uses full windows only.",
    )  # fmt: skip
    threshold_in = st.number_input(
        "Reward threshold", value=None, step=0.05, format="%.3f", key="threshold", placeholder="auto",
        help="Steps to threshold: the first step whose reward/mean, as a trailing mean over a full window, "
        "reaches this. Empty (the default): auto, halfway from the highest starting level of the picked "
        "runs (each run's first full-window mean) to the best level any of them reaches, so that no run "
        "has reached it at its start and the runs that get further reach it first. Type a value for a "
        "fixed threshold; clear it to go back to auto.",
    )  # fmt: skip

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

st.subheader(f"Reward, mean of the last {SUMMARY_STEPS} steps")
cols = st.columns(min(len(runs), 4))
for i, (label, (rows, _)) in enumerate(runs.items()):
    name, value, note = final_reward(label, rows)
    cols[i % len(cols)].metric(name, value, help=note)
st.caption(
    f"As each run's last line reports it (`python -m scaledrun.train`: reward R, mean of the last "
    f"{SUMMARY_STEPS} steps). One step's reward/mean averages a few groups only: compare runs by this mean, "
    "and by the curves below, not by their last step."
)

st.subheader("Side by side")
if threshold_in is None:
    threshold = auto_threshold([window_means(r, "reward/mean", int(window))[1] for r, _ in runs.values()])
    how = (
        f"auto = {threshold:.3f}, halfway from the highest starting level of these runs to the best level "
        "any of them reaches (full-window trailing means)"
        if threshold is not None
        else f"auto: none, no run has a full window of {window} steps (lower the moving-mean window)"
    )
else:
    threshold = float(threshold_in)
    how = f"{threshold:g}, as entered"
table = pd.DataFrame([summary_row(lbl, r, threshold, int(window)) for lbl, (r, _) in runs.items()])
st.dataframe(
    table.set_index("run"),
    key="summary",
    column_config={
        f"reward, last {window}": st.column_config.NumberColumn(format="%.4f"),
        "last eval accuracy": st.column_config.NumberColumn(format="%.3f"),
        "Jitter₂ reward": st.column_config.NumberColumn(format="%.4f"),
    },
)
st.caption(
    f"Steps to threshold: the first step whose reward/mean, as a trailing mean over a full window of {window} "
    f"steps (that step and the {window - 1} before it), reaches the threshold: {how}. Empty: never, or the run "
    f"is shorter than the window (so is 'reward, last {window}', the reward's mean over the last full window). "
    "Last eval accuracy: the held-out greedy accuracy of the run's last eval. Jitter₂ (eq. 20) of the raw per-step "
    "reward/mean."
)

st.subheader(f"Curves (trailing mean over {window} steps)")
if window > 1:
    st.caption(f"The first {window - 1} points of each curve average the fewer steps there are so far.")
smoothed = {label: moving_mean(rows, int(window)) for label, (rows, _) in runs.items()}


def draw(curves: dict[str, tuple[str, str]]) -> list[str]:
    """Two columns of curve figures, one per key with a finite value in some run; returns the keys drawn."""
    cols = st.columns(2)
    shown = [k for k in curves if any(curve(r, k)[0] for r, _ in runs.values())]
    for i, key in enumerate(shown):
        title, ref = curves[key]
        # only the rows that have the key: sparse keys (eval every N steps) then draw as connected lines
        with_key = {
            lbl: [[r for r in rows if math.isfinite(r.get(key, math.nan))]] for lbl, rows in smoothed.items()
        }
        cols[i % 2].plotly_chart(curve_figure(with_key, key, title=f"{title} · {ref}"), key=f"curve_{key}")
    return shown


shown = draw(RUN_CURVES)
st.caption(RESIDUAL_NOTE)
st.subheader("Diagnostics on one mini-batch per step")
st.caption(DIAGNOSTICS_NOTE)
shown += draw(DIAGNOSTIC_CURVES)
missing = [k for k in ALL_CURVES if k not in shown]
if missing:
    st.caption(f"Not drawn (no finite value in these runs): {', '.join(missing)}.")
