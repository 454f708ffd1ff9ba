"""The report: saved ``StudyResult`` s → ``REPORT.md`` with tables, verdicts and plotly figures.

Nothing here runs an experiment; ``write_report`` reads what the studies saved (``experiments.study``) and
renders it, so the report can be rebuilt from the JSON files alone (``python -m experiments --report-only``).

Per study the report gives: the question and the setting; a compact table (one row per arm, the mean
and 95 % bootstrap CI of each measure; censored measures say how many seeds reached); the verdict of
every prediction it tests (paired difference arm − baseline matched by seed, its CI and the exact sign
test's p, ``experiments.study``); its notes; its figures; and, folded, the full table of paired
differences against the study's baseline (``experiments.stats.summarize_arms``).

Figures: one per (study, curve): each arm's mean across seeds with a band of ± 1.96 standard errors of
that mean (a normal 95 % band per x; the tables' CIs are bootstrap), as an HTML file (plotly.js written
once next to them, so the files open offline) and a PNG (plotly's ``write_image`` through kaleido, which
needs a Chromium; without one the PNGs are skipped and the report says why), plus one "forest" figure
of every prediction's paired difference with its CI.
"""

from __future__ import annotations

import datetime as _dt
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.figures import _rgba, color

from .stats import _fmt_ci, fmt_p, fmt_value, markdown_table, summarize_arms
from .study import MIN_SEEDS, VERDICTS, StudyResult, Verdict

#: The bootstrap resamples of the report's tables (seeded: the report is reproducible).
N_BOOT = 4000
VERDICT_MARK = {"held": "✅ held", "contradicted": "❌ contradicted", "not resolved": "➖ not resolved",
                "too few seeds": "· too few seeds", "not measured": "· not measured"}  # fmt: skip


# --------------------------------------------------------------------------------------------------
# tables


def _values_by_label(study: StudyResult) -> tuple[dict[str, dict[str, dict[str, float]]], dict[str, float]]:
    per_seed = {
        arm: {m.label: study.values(arm, m.key) for m in study.measures if study.values(arm, m.key)}
        for arm in study.arms
    }
    horizons = {m.label: m.horizon for m in study.measures if m.horizon is not None}
    return per_seed, horizons


def compact_table(study: StudyResult, *, n_boot: int = N_BOOT) -> str:
    """One row per measure, one column per arm: ``mean [CI]`` (censored: ``k/n`` seeds reached added)."""
    per_seed, horizons = _values_by_label(study)
    rows = summarize_arms(
        per_seed, None, n_boot=n_boot, horizons=horizons, measures=[m.label for m in study.measures]
    )
    cell = {(r.arm, r.measure): r for r in rows}
    arms = list(study.arms)
    seeds = {arm: max((r.n for (a, _), r in cell.items() if a == arm), default=0) for arm in arms}
    header = ["measure", *[f"{study.arms[a].get('label', a)} (n={seeds[a]})" for a in arms]]
    lines = ["| " + " | ".join(h.replace("|", "\\|") for h in header) + " |", "|---|" + "---:|" * len(arms)]
    for m in study.measures:
        cells = [_arrow(m.label, m.better)]
        for arm in arms:
            r = cell.get((arm, m.label))
            if r is None or r.n == 0:
                cells.append("n/a")
                continue
            text = f"{fmt_value(r.mean)} {_fmt_ci(r.ci_low, r.ci_high)}"
            if r.n_reached is not None:
                text += f" ({r.n_reached}/{r.n})"
            cells.append(text)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _arrow(label: str, better: str | None) -> str:
    return label + {"lower": " ↓", "higher": " ↑"}.get(better or "", "")


def full_table(study: StudyResult, *, n_boot: int = N_BOOT) -> str:
    """Every (measure, arm) with its paired difference against the study's baseline."""
    per_seed, horizons = _values_by_label(study)
    rows = summarize_arms(
        per_seed, study.baseline, n_boot=n_boot, horizons=horizons, measures=[m.label for m in study.measures]
    )
    return markdown_table(rows)


def verdict_table(verdicts: Sequence[Verdict], study_names: Sequence[str] | None = None) -> str:
    """The predictions, their paired difference (arm − baseline) with CI, sign-test p and verdict."""
    if not verdicts:
        return ""
    header = ["prediction", "source", *(["study"] if study_names else []), "Δ (arm − baseline)", "95 % CI", "seeds",
              "sign p", "verdict"]  # fmt: skip
    lines = [
        "| " + " | ".join(header) + " |",
        "|---|---|" + ("---|" if study_names else "") + "---:|---:|---:|---:|---|",
    ]
    for i, v in enumerate(verdicts):
        p = v.prediction
        cells = [p.claim, p.source, *([study_names[i]] if study_names else []), fmt_value(v.diff, signed=True),
                 _fmt_ci(v.low, v.high, signed=True), str(v.n), fmt_p(v.sign_p), VERDICT_MARK[v.verdict]]  # fmt: skip
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# figures


def _band(seeds: dict[str, Sequence[Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean across seeds per x and the ± 1.96·SE band (NaN/None values skipped per x)."""
    rows = [
        np.array([np.nan if v is None else float(v) for v in vals], dtype=float) for vals in seeds.values()
    ]
    width = max((len(r) for r in rows), default=0)
    mat = np.full((len(rows), width), np.nan)
    for i, r in enumerate(rows):
        mat[i, : len(r)] = r
    n = np.sum(np.isfinite(mat), axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.nanmean(np.where(np.isfinite(mat), mat, np.nan), axis=0) if len(rows) else np.array([])
        sd = (
            np.nanstd(np.where(np.isfinite(mat), mat, np.nan), axis=0, ddof=1)
            if len(rows) > 1
            else np.zeros(width)
        )
        se = np.where(n > 1, sd / np.sqrt(np.maximum(n, 1)), 0.0)
    return mean, mean - 1.96 * se, mean + 1.96 * se


def curve_figure(study: StudyResult, curve: str) -> Any:
    """Each arm's mean curve across seeds with its ± 1.96 SE band."""
    import plotly.graph_objects as go

    fig = go.Figure()
    arms = study.curves.get(curve, {})
    for i, arm in enumerate(a for a in study.arms if a in arms):
        data = arms[arm]
        x = np.asarray(data["x"], dtype=float)
        mean, lo, hi = _band(data["seeds"])
        k = min(len(x), len(mean))
        x, mean, lo, hi = x[:k], mean[:k], lo[:k], hi[:k]
        colour = color(i)  # the app's palette: an arm looks the same here and on the Runs page
        label = study.arms[arm].get("label", arm)
        fig.add_trace(
            go.Scatter(
                x=np.concatenate([x, x[::-1]]),
                y=np.concatenate([hi, lo[::-1]]),
                fill="toself",
                fillcolor=_rgba(colour, 0.15),
                line={"width": 0},
                hoverinfo="skip",
                showlegend=False,
                legendgroup=arm,
            )
        )
        fig.add_trace(
            go.Scatter(
                x=x, y=mean, name=f"{label} (n={len(data['seeds'])})", line={"color": colour}, legendgroup=arm
            )
        )
    fig.update_layout(
        title=f"{curve.replace('_', ' ')}<br><sup>{study.title} (mean across seeds, band ± 1.96 SE)</sup>",
        xaxis_title="step",
        yaxis_title=curve.replace("_", " "),
        template="plotly_white",
        width=1000,
        height=600,
        legend={"orientation": "h", "yanchor": "top", "y": -0.15, "xanchor": "left", "x": 0},
    )
    return fig


def forest_figure(verdicts: Sequence[Verdict], study_names: Sequence[str]) -> Any:
    """Every prediction's paired difference with its 95 % CI, coloured by verdict (one row each)."""
    import plotly.graph_objects as go

    colours = {
        "held": "#2CA02C",
        "contradicted": "#D62728",
        "not resolved": "#7F7F7F",
        "not measured": "#BBBBBB",
    }
    fig = go.Figure()
    labels = []
    for v, study in zip(verdicts, study_names, strict=True):
        labels.append(
            f"{study}: {v.prediction.arm} vs {v.prediction.baseline}, {v.prediction.measure} ({v.prediction.direction})"
        )
    for verdict, colour in colours.items():
        idx = [i for i, v in enumerate(verdicts) if v.verdict == verdict and v.diff is not None]
        if not idx:
            continue
        fig.add_trace(
            go.Scatter(
                x=[_signed_scale(verdicts[i]) for i in idx],
                y=[labels[i] for i in idx],
                mode="markers",
                marker={"color": colour, "size": 9},
                error_x={
                    "type": "data",
                    "symmetric": False,
                    "array": [_signed_scale(verdicts[i], "high") - _signed_scale(verdicts[i]) for i in idx],
                    "arrayminus": [
                        _signed_scale(verdicts[i]) - _signed_scale(verdicts[i], "low") for i in idx
                    ],
                },
                name=verdict,
            )
        )
    fig.add_vline(x=0, line={"color": "black", "width": 1})
    fig.update_layout(
        title="Each prediction: paired difference arm − baseline with its 95 % CI<br>"
        "<sup>each row divided by its largest |bound| so units differ freely; left of 0: the arm is lower</sup>",
        xaxis_title="scaled difference (sign kept)",
        template="plotly_white",
        width=1100,
        height=max(400, 26 * len(verdicts) + 150),
        yaxis={"autorange": "reversed", "categoryorder": "array", "categoryarray": labels},
    )
    return fig


def _signed_scale(v: Verdict, which: str = "diff") -> float:
    """A prediction's difference (or CI bound) divided by the largest |bound| of its row, so rows of
    different units share one axis; the sign (and so the verdict) is unchanged."""
    scale = max(abs(v.low or 0.0), abs(v.high or 0.0), abs(v.diff or 0.0)) or 1.0
    return float(getattr(v, which) or 0.0) / scale


def save_figure(fig: Any, stem: Path, png: bool) -> tuple[Path, Path | None, str | None]:
    """Write ``stem.html`` (plotly.js once in the same folder) and, when asked, ``stem.png``.

    Returns the HTML path, the PNG path (None when not written) and why not (None when written).
    """
    stem.parent.mkdir(parents=True, exist_ok=True)
    html = stem.with_suffix(".html")
    fig.write_html(html, include_plotlyjs="directory", full_html=True)
    if not png:
        return html, None, "PNG export switched off"
    try:
        fig.write_image(stem.with_suffix(".png"), scale=1)
    except Exception as err:  # kaleido missing, no Chromium: the HTML is still there
        return html, None, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return html, stem.with_suffix(".png"), None


# --------------------------------------------------------------------------------------------------
# the report


def write_report(
    studies: Sequence[StudyResult],
    path: str | Path,
    *,
    figures_dir: str | Path | None = None,
    png: bool = True,
    command: str = "python -m experiments",
    mode: str = "full",
    n_boot: int = N_BOOT,
    preamble: str = "",
) -> Path:
    """Render ``studies`` into the markdown report at ``path`` and its figures (default ``<path's folder>/figures``)."""
    path = Path(path)
    fig_dir = Path(figures_dir) if figures_dir is not None else path.parent / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    all_verdicts: list[Verdict] = []
    all_names: list[str] = []
    sections: list[str] = []
    png_problem: str | None = None
    for study in studies:
        verdicts = study.verdicts(n_boot=n_boot)
        all_verdicts += verdicts
        all_names += [study.name] * len(verdicts)
        parts = [
            f"## {study.title}\n",
            f"**Question.** {study.question}\n",
            f"**Setting.** {study.setting}\n",
        ]
        parts.append(
            "**Results** (mean and 95 % bootstrap CI over seeds; ↓/↑: which way is better; (k/n): seeds that "
            "reached the threshold):\n"
        )
        parts.append(compact_table(study, n_boot=n_boot))
        if verdicts:
            parts.append("**Predictions** (paired by seed: arm − baseline):\n")
            parts.append(verdict_table(verdicts))
        if study.notes:
            parts.append("**Notes.**\n\n" + "\n".join(f"- {n}" for n in study.notes) + "\n")
        for curve in study.curves:
            html, png_path, why = save_figure(
                curve_figure(study, curve), fig_dir / f"{study.name}_{curve}", png
            )
            png_problem = png_problem or why
            rel_html = _rel(html, path.parent)
            if png_path is not None:
                parts.append(
                    f"![{study.title}: {curve}]({_rel(png_path, path.parent)})  \n[interactive]({rel_html})\n"
                )
            else:
                parts.append(f"Figure: [{study.title}: {curve} (interactive HTML)]({rel_html})\n")
        parts.append(
            f"<details><summary>All measures with paired differences against {study.arms[study.baseline].get('label', study.baseline)}</summary>\n\n"
            + full_table(study, n_boot=n_boot)
            + "\n</details>\n"
        )
        parts.append(f"_Wall time of this study: {study.seconds / 60:.1f} min._\n")
        sections.append("\n".join(parts))

    counts = {v: sum(x.verdict == v for x in all_verdicts) for v in VERDICTS}
    head = [
        "# Cancellation Lab: experiment report\n",
        f"Generated by `{command}` ({mode} mode) on {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, "
        f"{platform.machine()} CPU, Python {platform.python_version()}. Every number below is computed from the "
        f"saved per-seed results in this folder; rebuild the report alone with "
        f"`python -m experiments --report-only`. Each figure is a PNG (the repository keeps these) and an "
        f"interactive HTML file written next to it by the command.\n",
        preamble,
        "## Summary of predictions\n",
        f"{counts['held']} held, {counts['contradicted']} contradicted, {counts['not resolved']} not resolved "
        f"(the 95 % CI of the paired difference contains 0), {counts['too few seeds']} with fewer than "
        f"{MIN_SEEDS} seeds, {counts['not measured']} not measured, "
        f"out of {len(all_verdicts)}. A prediction *holds* when the whole 95 % paired-bootstrap CI of "
        f"arm − baseline lies on the predicted side of 0, and is *contradicted* when it lies on the other side.\n",
        verdict_table(all_verdicts, all_names),
    ]
    if all_verdicts:
        html, png_path, why = save_figure(
            forest_figure(all_verdicts, all_names), fig_dir / "predictions", png
        )
        png_problem = png_problem or why
        head.append(
            f"![every prediction's paired difference]({_rel(png_path, path.parent)})  \n[interactive]({_rel(html, path.parent)})\n"
            if png_path is not None
            else f"Figure: [every prediction's paired difference (interactive HTML)]({_rel(html, path.parent)})\n"
        )
    if png_problem and png:
        head.append(f"_PNG figures were not written ({png_problem}); the HTML figures were._\n")
    text = "\n".join(head) + "\n" + "\n\n".join(sections)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _rel(p: Path, base: Path) -> str:
    try:
        return str(p.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(p)


__all__ = [
    "compact_table",
    "curve_figure",
    "forest_figure",
    "full_table",
    "save_figure",
    "verdict_table",
    "write_report",
]
