"""The report: saved ``StudyResult`` s → ``REPORT.md`` with tables, verdicts and plotly figures.

Nothing here runs an experiment; ``write_report`` reads what the studies saved (``experiments.study``) and
renders it, so the report can be rebuilt from the JSON files alone (``python -m experiments --report-only``).

Per study the report gives: the question and the setting; a compact table (one row per measure, one
column per arm: the mean and 95 % bootstrap CI; censored measures say how many seeds reached); the
seed-mean template drift where the study has one (``drift_table``); the verdict of every prediction it
tests (paired difference arm − baseline matched by seed, its t interval, the MDE at the level Holm tests
it at, the t test's p, its Holm-adjusted p and the exact sign-flip p, ``experiments.study``); its notes;
its figures; and, folded, the full table of paired differences against the study's baseline
(``experiments.stats.summarize_arms``). After the studies: what they cannot test (``CANNOT_TEST``).

Figures: one per (study, curve): each arm's mean across seeds with a band of ± 1.96 standard errors of
that mean (a normal 95 % band per x; the tables' CIs are bootstrap), as an HTML file (plotly.js written
once next to them, so the files open offline) and a PNG (plotly's ``write_image`` through kaleido, which
needs a Chromium; without one the PNGs are skipped and the report says why), plus one "forest" figure
of every prediction's paired difference with its CI.
"""

from __future__ import annotations

import datetime as _dt
import math
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from plots import color, rgba

from .stats import _fmt_ci, fmt_p, fmt_value, markdown_table, summarize_arms
from .study import (
    CONFIRM_FIRST_SEED,
    EXACT_MAX,
    MIN_SEEDS,
    POWER,
    TOL,
    VERDICTS,
    StudyResult,
    Verdict,
    decide,
)

#: The bootstrap resamples of the report's tables (seeded: the report is reproducible).
N_BOOT = 4000
VERDICT_MARK = {"held": "✅ held", "contradicted": "❌ contradicted", "not resolved": "➖ not resolved",
                "tied": "· tied on every seed (decided by construction)", "by construction": "· by construction",
                "too few seeds": "· too few seeds", "not measured": "· not measured"}  # fmt: skip
#: The verdicts decided by a test (members of the Holm family).
DECIDED = ("held", "contradicted", "not resolved")


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


def verdict_table(
    verdicts: Sequence[Verdict],
    study_names: Sequence[str] | None = None,
    discovery: Sequence[Verdict | None] | None = None,
) -> str:
    """The predictions: the deciding block's paired difference (arm − baseline) with its t interval, the
    seeds, the minimal detectable effect at the level the prediction is tested at (its Holm step's,
    ``Verdict.alpha``) and that level, the t test's p, its Holm-adjusted p, the exact sign-flip p and the
    verdict; with ``discovery``, the discovery block's difference and interval beside it."""
    if not verdicts:
        return ""
    lvl = f"{verdicts[0].level:.0%}"
    header = ["prediction", "source", *(["study"] if study_names else []),
              *([f"discovery Δ [{lvl} CI] (n)"] if discovery else []), "Δ (arm − baseline)", f"{lvl} t interval",
              "seeds", "MDE (at level)", "p", "Holm p", "sign-flip p", "verdict"]  # fmt: skip
    align = ["---", "---", *(["---"] if study_names else []), *(["---:"] if discovery else []),
             "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    for i, v in enumerate(verdicts):
        p = v.prediction
        claim = p.claim + (f" _(by construction: {p.by_construction})_" if p.by_construction else "")
        cells = [claim, p.source, *([study_names[i]] if study_names else [])]
        if discovery:
            d = discovery[i]
            cells.append(
                "n/a" if d is None or d.diff is None
                else f"{fmt_value(d.diff, signed=True)} {_fmt_ci(d.low, d.high, signed=True)} ({d.n})"
            )  # fmt: skip
        mde = fmt_value(v.mde) + (f" (α {v.alpha:.2g})" if v.mde is not None and v.alpha is not None else "")
        cells += [fmt_value(v.diff, signed=True), _fmt_ci(v.low, v.high, signed=True), str(v.n), mde,
                  fmt_p(v.p), fmt_p(v.p_adj) if v.verdict in DECIDED else "—",
                  fmt_p(v.perm_p), VERDICT_MARK[v.verdict] + ("" if v.block == "confirmation" or not discovery
                  else " (one block, none to confirm on)")]  # fmt: skip
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def grid_table(study: StudyResult) -> str:
    """A sweep's grid (``StudyResult.grid``), one table per arm: rows lr, columns inner epochs, each cell
    the mean steps to the threshold (reached fraction when below 1) and the mean template KL there."""
    if not study.grid:
        return ""
    out = []
    for arm in dict.fromkeys(r["arm"] for r in study.grid):
        rows = [r for r in study.grid if r["arm"] == arm]
        epochs = sorted({r["inner_epochs"] for r in rows})
        lrs = sorted({r["lr"] for r in rows})
        cell = {(r["lr"], r["inner_epochs"]): r for r in rows}
        lines = [f"**{arm}** (cell: mean steps to E[R] ≥ 0.9; reached fraction when < 1; template KL at matched "
                 "reward)\n", "| lr | " + " | ".join(f"{e} epochs" for e in epochs) + " |",
                 "|---:|" + "---:|" * len(epochs)]  # fmt: skip
        for lr in lrs:
            cells = []
            for e in epochs:
                r = cell.get((lr, e))
                if r is None:
                    cells.append("")
                    continue
                text = fmt_value(r["steps_mean"])
                if r["reached"] is not None and r["reached"] < 1:
                    text += f" ({r['reached']:.0%})"
                text += f"; KL {fmt_value(r['template_kl'])}"
                cells.append(text)
            lines.append(f"| {lr:g} | " + " | ".join(cells) + " |")
        out.append("\n".join(lines) + "\n")
    return "\n".join(out)


def drift_table(study: StudyResult) -> str:
    """The study-level template drift after the last step, one row per arm (``StudyResult.drift``,
    ``experiments.toy.template_drift``); a line saying a rerun is needed when a toy study on
    ``template_task`` was saved before the measure existed; empty for a study without a template."""
    if not study.drift:
        if study.name.startswith("toy_") and "template_task" in study.setting:
            return (
                "**Seed-mean template drift** (the systematic part of the drift, DFPO App. G): not in these saved "
                "results, which predate the measure; rerun needed (`python -m experiments --only toy`).\n"
            )
        return ""
    lines = [
        "**Seed-mean template drift after the last step** (DFPO App. G, Sec. 3.3; a study-level measure, not "
        "per seed). Δπ_s = π_s − π_0 on the template contexts' actions; *seed-mean drift²* ‖mean_s Δπ_s‖²; "
        "*sampling floor* Σ Var_s(Δπ_s)/n, what the seed-mean drift² averages when every seed drifts by a "
        "zero-mean amount; *systematic* = drift² − floor (unbiased for ‖E Δπ‖², ± its bootstrap SE over "
        "seeds); *per-seed drift²* mean_s ‖Δπ_s‖², the systematic plus the zero-mean part, which is what the "
        "per-seed template KL grows with.\n",
        "| arm | seeds | seed-mean drift² | sampling floor | systematic ± SE | per-seed drift² | systematic share |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for arm in [a for a in study.arms if a in study.drift]:
        d = study.drift[arm]
        share = d["systematic"] / d["per_seed2"] if d.get("per_seed2") else math.nan
        lines.append(
            f"| {study.arms[arm].get('label', arm)} | {int(d['n'])} | {fmt_value(d['drift2'])} | "
            f"{fmt_value(d['floor'])} | {fmt_value(d['systematic'], signed=True)} ± {fmt_value(d['se'])} | "
            f"{fmt_value(d['per_seed2'])} | {fmt_value(share)} |"
        )
    return "\n".join(lines) + "\n"


#: What the studies cannot test, printed in every report (the per-study notes say the rest).
CANNOT_TEST = (
    "Benchmark accuracy at 32B scale (DFPO Tables 1-4), long reasoning and GPU-hour savings: the toy's exact "
    "E[R] and the tiny Qwen3's held-out accuracy on one synthetic task are their only analogues, and the "
    "toy's `template_task` has equal lengths (`toy_aggregation` has unequal ones).",
    "DFPO App. K: the toy tests the directions K.2-K.4 predict for Min-Replace against the eq. 86 control "
    "(slower, fewer clipped sequences), not the bias itself: no study records the per-group weight "
    "dispersion s̄_i − s̄_min or the bias vector of eq. 92, so K.5's trust-region bound is not checked, and "
    "K.3's 'shifted optimal point' cannot show on the toy, whose E[R] saturates near 1 in every arm.",
    "DFPO App. G (Corollary G.1): the non-zero *expected* drift of template tokens is measured as the "
    "seed-mean template drift after the last step of the toy studies on `template_task` (a study-level "
    "number with a bootstrap SE, not a per-seed paired test, so it has no verdict), not at matched reward; "
    "the per-seed template KL mixes it with zero-mean scatter. The language-model studies do not measure "
    "the seed-mean drift.",
    "Batching on the language model: query-preserved vs random mini-batches and reward-balanced batching "
    "(cancellation-hypothesis paper Sec. 4) are tested on the toy only (`toy_batching`); the trainer has the "
    "options (`num_minibatches`, `reward_balanced_rho`) but no language-model study runs them, and on the "
    "toy the reward saturates within ~10 steps, after which a balanced selection is rare.",
    "Lopti and Advantage Reweighting on the language model: tested on the toy only (`toy_low_prob`); the "
    "trainer has `lopti_eta` and `ar_alpha` but no language-model study runs them. On the toy a token shares "
    "only its context's logits, so the paper's mechanism (low-probability tokens' large gradients dominating "
    "parameters shared with high-probability ones) has few shared parameters to act through.",
    "Trainer-only diagnostics: token-flip rates (cancellation-hypothesis paper App. C) and Energy by frequency "
    "bucket (DFPO eq. 24) are not computed by the toy.",
)


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
                fillcolor=rgba(colour, 0.15),
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
        "tied": "#17BECF",
        "not measured": "#BBBBBB",
        "by construction": "#9467BD",
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


def _blocks(studies: Sequence[StudyResult]) -> list[tuple[StudyResult | None, StudyResult | None]]:
    """(discovery, confirmation) per study name, in the order the names first appear."""
    by_name: dict[str, dict[str, StudyResult]] = {}
    for st in studies:
        by_name.setdefault(st.name, {})[st.block] = st
    return [(b.get("discovery"), b.get("confirmation")) for b in by_name.values()]


def frontier_figure(study: StudyResult) -> Any:
    """A sweep's settings as points (mean steps to the threshold, mean template KL), one colour per arm,
    each arm's Pareto frontier as a line and its chosen settings ringed."""
    import plotly.graph_objects as go

    fig = go.Figure()
    chosen = {(c["config"]["objective"], c["config"].get("lr"), c["config"].get("inner_epochs"), k.split("@")[0])
              for k, c in study.arms.items()}  # fmt: skip
    for i, arm in enumerate(dict.fromkeys(r["arm"] for r in study.grid)):
        rows = [
            r for r in study.grid if r["arm"] == arm and r["template_kl"] is not None and r["reached"] == 1.0
        ]
        if not rows:
            continue
        colour = color(i)
        fig.add_trace(go.Scatter(
            x=[r["steps_mean"] for r in rows], y=[r["template_kl"] for r in rows], mode="markers", name=arm,
            marker={"color": colour, "size": 7, "line": {"width": [3 if any(c[3] == arm and c[1] == r["lr"] and
                    c[2] == r["inner_epochs"] for c in chosen) else 0 for r in rows], "color": "black"}},
            text=[f"lr {r['lr']:g} × {r['inner_epochs']} epochs" for r in rows], legendgroup=arm,
        ))  # fmt: skip
        front, best_kl = [], math.inf
        for r in sorted(rows, key=lambda r: (r["steps_mean"], r["template_kl"])):
            if r["template_kl"] < best_kl:
                front.append(r)
                best_kl = r["template_kl"]
        fig.add_trace(go.Scatter(x=[r["steps_mean"] for r in front], y=[r["template_kl"] for r in front],
                                 mode="lines", line={"color": colour}, showlegend=False, legendgroup=arm))  # fmt: skip
    fig.update_layout(
        title="Learning tax against speed, every setting of the sweep (discovery block)<br><sup>settings where "
        "every seed reached E[R] ≥ 0.9; line: each arm's frontier (least tax at each speed); ringed: chosen</sup>",
        xaxis_title="mean steps to E[R] ≥ 0.9", yaxis_title="mean template KL at E[R] = 0.9",
        xaxis_type="log", template="plotly_white", width=1000, height=600,
    )  # fmt: skip
    return fig


def _figure_line(fig: Any, stem: Path, png: bool, title: str, base: Path) -> tuple[str, str | None]:
    html, png_path, why = save_figure(fig, stem, png)
    if png_path is not None:
        return f"![{title}]({_rel(png_path, base)})  \n[interactive]({_rel(html, base)})\n", why
    return f"Figure: [{title} (interactive HTML)]({_rel(html, base)})\n", why


def report_verdicts(
    studies: Sequence[StudyResult], *, level: float = 0.95
) -> tuple[list[Verdict], list[str], list[Verdict | None]]:
    """The report's verdicts: every prediction decided on its study's deciding block (confirmation when
    there is one) as one Holm family; the study name of each; and its discovery-block verdict (a second
    family, for comparison; None for a study with one block)."""
    pairs = _blocks(studies)
    deciding = [conf or disc for disc, conf in pairs]
    decided = decide(deciding, level=level)
    explored = decide([disc for disc, conf in pairs if conf is not None and disc is not None], level=level)
    disc_of: dict[tuple[str, str], Verdict] = {}
    i = 0
    for disc, conf in pairs:
        if conf is not None and disc is not None:
            for v in explored[i : i + len(disc.predictions)]:
                disc_of[(disc.name, v.prediction.claim)] = v
            i += len(disc.predictions)
    names = [st.name for st in deciding for _ in st.predictions]
    side = [disc_of.get((n, v.prediction.claim)) for n, v in zip(names, decided, strict=True)]
    return decided, names, side


def summary_table(studies: Sequence[StudyResult], *, level: float = 0.95) -> str:
    """The report's summary of every prediction (``report_verdicts``, ``verdict_table``)."""
    decided, names, side = report_verdicts(studies, level=level)
    return verdict_table(decided, names, discovery=side if any(x is not None for x in side) else None)


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
    level: float = 0.95,
    appendix: str = "",
) -> Path:
    """Render ``studies`` into the markdown report at ``path`` and its figures (default ``<path's folder>/figures``).

    A study saved on two blocks of seeds (``StudyResult.block``) is decided on its confirmation block and
    shows its discovery block beside it; a study with one block is decided on that block. Every decided
    prediction of the report is one family for Holm's adjustment (``experiments.study.decide``); the
    discovery blocks form a second family, shown for comparison. ``appendix``: markdown appended after the
    studies (the token-level section, ``experiments.token_level.markdown``)."""
    path = Path(path)
    fig_dir = Path(figures_dir) if figures_dir is not None else path.parent / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    pairs = _blocks(studies)
    deciding = [conf or disc for disc, conf in pairs]
    decided, names, side = report_verdicts(studies, level=level)
    sections: list[str] = []
    png_problem: str | None = None
    pos = 0
    for (disc, conf), study in zip(pairs, deciding, strict=True):
        verdicts = decided[pos : pos + len(study.predictions)]
        disc_side = side[pos : pos + len(study.predictions)]
        pos += len(study.predictions)
        parts = [
            f"## {study.title}\n",
            f"**Question.** {study.question}\n",
            f"**Setting.** {study.setting}\n",
        ]
        if conf is not None and disc is not None:
            parts.append(f"**Discovery block.** {disc.setting}\n")
        parts.append(
            f"**Results{' (confirmation block)' if conf is not None else ''}** (mean and 95 % bootstrap CI over "
            "seeds; ↓/↑: which way is better; (k/n): seeds that reached the threshold):\n"
        )
        parts.append(compact_table(study, n_boot=n_boot))
        drift = drift_table(study)
        if drift:
            parts.append(drift)
        if verdicts:
            parts.append(
                "**Predictions** (paired by seed: arm − baseline; decided on the "
                f"{'confirmation' if conf is not None else 'only'} block, Holm-adjusted over the report):\n"
            )
            parts.append(verdict_table(verdicts, discovery=disc_side if conf is not None else None))
        if study.grid:
            parts.append("**The sweep (discovery block).**\n\n" + grid_table(study))
            line, why = _figure_line(frontier_figure(study), fig_dir / f"{study.name}_frontier", png,
                                     f"{study.title}: frontier", path.parent)  # fmt: skip
            parts.append(line)
            png_problem = png_problem or why
        if study.notes:
            parts.append("**Notes.**\n\n" + "\n".join(f"- {n}" for n in study.notes) + "\n")
        for curve in study.curves:
            line, why = _figure_line(curve_figure(study, curve), fig_dir / f"{study.name}_{curve}", png,
                                     f"{study.title}: {curve}", path.parent)  # fmt: skip
            parts.append(line)
            png_problem = png_problem or why
        if conf is not None and disc is not None:
            parts.append(
                "<details><summary>Discovery block: results</summary>\n\n" + compact_table(disc, n_boot=n_boot)
                + "\n</details>\n"
            )  # fmt: skip
        parts.append(
            f"<details><summary>All measures with paired differences against {study.arms[study.baseline].get('label', study.baseline)}</summary>\n\n"
            + full_table(study, n_boot=n_boot)
            + "\n</details>\n"
        )
        seconds = sum(st.seconds for st in (disc, conf) if st is not None)
        parts.append(f"_Wall time of this study: {seconds / 60:.1f} min._\n")
        sections.append("\n".join(parts))

    counts = {v: sum(x.verdict == v for x in decided) for v in VERDICTS}
    alpha = 1 - level
    head = [
        "# Cancellation Lab: experiment report\n",
        f"Generated by `{command}` ({mode} mode) on {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, "
        f"{platform.machine()} CPU, Python {platform.python_version()}. Every number below is computed from the "
        f"saved per-seed results in this folder; rebuild the report alone with "
        f"`python -m experiments --report-only`. Each figure is a PNG (the repository keeps these) and an "
        f"interactive HTML file written next to it by the command.\n",
        preamble,
        *([_quick_note(deciding)] if mode == "quick" else []),
        "## How a prediction is decided\n",
        "Each prediction is a paired comparison, arm − baseline matched by seed (common random numbers). A "
        "toy study runs twice: on a *discovery* block of seeds (0, 1, ...), explored freely while the studies "
        f"were designed, and on a *confirmation* block of fresh seeds (from {CONFIRM_FIRST_SEED:,}) with the "
        "same arms and predictions fixed in code before it ran; its verdict is decided on the confirmation "
        "block, and the discovery block's difference is shown beside it. The language-model study's discovery "
        "block is its learning-rate probe (the probe's runs at each arm's chosen lr), its confirmation block "
        "fresh seeds; a study with one block is decided on it. The test is the paired t test (its interval is "
        "printed; it "
        "keeps its 5 % error rate at 5, 10 and 20 seeds, where the percentile bootstrap's does not; "
        "`tests/experiments/test_stats.py` measures both), with the exact sign-flip permutation p beside it "
        f"as a distribution-free check in studies of up to {EXACT_MAX} seeds (above, the t test's normal "
        f"approximation holds). Differences within {TOL:g} are ties. The p-values of all "
        f"{sum(x.verdict in ('held', 'contradicted', 'not resolved') for x in decided)} decided predictions "
        f"are adjusted together with Holm's step-down method; a prediction *holds* when its Holm-adjusted p is "
        f"below {alpha:g} and the difference is on the predicted side, and is *contradicted* when it is below "
        f"{alpha:g} on the other side. MDE: the minimal detectable effect, the true difference a t test "
        f"would detect with {POWER:.0%} power at the seeds' spread, at the level the prediction is actually "
        f"tested at (printed beside it): Holm tests the j-th smallest of the m p-values at {alpha:g}/(m − j + 1), "
        f"so a family member's MDE is larger than at {alpha:g} (predictions outside the family: at {alpha:g}). "
        "Predictions decided by how an arm is built are shown as *by construction*, and predictions whose arms "
        "tie on every seed (every per-seed difference within the tie tolerance: the two arms took identical "
        "steps) as *tied on every seed*; both are left out of the counts and of the family.\n",
        "## Summary of predictions\n",
        f"{counts['held']} held, {counts['contradicted']} contradicted, {counts['not resolved']} not resolved, "
        f"{counts['tied']} tied on every seed, {counts['by construction']} by construction, "
        f"{counts['too few seeds']} with fewer than {MIN_SEEDS} seeds, {counts['not measured']} not measured, "
        f"out of {len(decided)}.\n",
        summary_table(studies, level=level),
        _tied_list(decided, names),
    ]
    if decided:
        line, why = _figure_line(forest_figure(decided, names), fig_dir / "predictions", png,
                                 "every prediction's paired difference", path.parent)  # fmt: skip
        head.append(line)
        png_problem = png_problem or why
    if png_problem and png:
        head.append(f"_PNG figures were not written ({png_problem}); the HTML figures were._\n")
    cannot = "## What these studies cannot test\n\n" + "\n".join(f"- {c}" for c in CANNOT_TEST) + "\n"
    text = "\n".join(head) + "\n" + "\n\n".join([*sections, cannot, *([appendix] if appendix else [])])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _quick_note(studies: Sequence[StudyResult]) -> str:
    """What a quick-mode report ran, read from its results (the fixed wording below describes full mode)."""
    sizes = []
    for st in studies:
        n = max((len(v) for arm in st.per_seed.values() for v in arm.values()), default=0)
        sizes.append(f"{st.name} {n}")
    return (
        "**Quick mode.** This report checks the pipeline, not the papers: every study ran its smallest slice "
        "(fewer steps, and the largest number of seeds any arm of its deciding block ran: "
        + ", ".join(sizes)
        + "), so most predictions have too few seeds or no power. Where the text below speaks of the full "
        "runs (1,024 fresh seeds, the language model's probe and its 30 fresh seeds per arm), each study's "
        "Setting line says what this run actually did.\n"
    )


def _tied_list(decided: Sequence[Verdict], names: Sequence[str]) -> str:
    """The predictions tied on every seed, listed apart from the tested ones (empty when none)."""
    tied = [(n, v) for n, v in zip(names, decided, strict=True) if v.verdict == "tied"]
    if not tied:
        return ""

    def why(v: Verdict) -> str:
        if v.identical:
            return "every measure ties: the two arms took identical steps"
        return "only this measure ties: the arms differ on other measures, so this tie was measured, not built in"

    return (
        "**Tied on every seed (decided by construction, not in the Holm family):** every per-seed difference is "
        "within the tie tolerance, so there is nothing to test.\n\n"
        + "\n".join(f"- {n}: {v.prediction.claim} ({v.prediction.arm} vs {v.prediction.baseline}, {v.n} seeds; "
                     f"{why(v)})" for n, v in tied)
        + "\n"
    )  # fmt: skip


def _rel(p: Path, base: Path) -> str:
    try:
        return str(p.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(p)


__all__ = [
    "CANNOT_TEST",
    "compact_table",
    "curve_figure",
    "drift_table",
    "forest_figure",
    "full_table",
    "report_verdicts",
    "save_figure",
    "summary_table",
    "verdict_table",
    "write_report",
]
