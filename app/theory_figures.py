"""Plotly figure builders of the theory pages (shared prefix, clipping asymmetry, low-probability tokens).

Pure functions: numbers in (already computed by ``toymodel``/``cancellation``), a ``go.Figure`` out.
No Streamlit, no formulas: a page computes, these only draw.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

POS_COLOR = "#2a9d8f"  # Â > 0
NEG_COLOR = "#e76f51"  # Â < 0
NET_COLOR = "#264653"  # their sum
PRED_COLOR = "#e9c46a"  # the paper's closed form
SHADE_COLOR = "rgba(231, 111, 81, 0.12)"

#: below this, a coefficient is shown as 0 (float64 rounding of an exact cancellation is ~1e-17)
ZERO_TOL = 1e-12


def fmt_number(x: float, digits: int = 6) -> str:
    """A coefficient as displayed on the pages: ``digits`` significant digits, exact cancellations as 0."""
    x = float(x)
    if math.isnan(x):
        return "nan"
    if abs(x) < ZERO_TOL:
        return "0"
    return f"{x:.{digits}g}"


def _layout(fig: go.Figure, title: str, height: int = 380) -> go.Figure:
    fig.update_layout(
        title={"text": title, "y": 0.98, "yanchor": "top"},
        height=height,
        margin={"l": 10, "r": 10, "t": 95, "b": 10},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.06, "x": 0},
    )
    return fig


def coefficient_bars(
    steps: Sequence[str],
    first: Sequence[float],
    second: Sequence[float],
    names: tuple[str, str],
    net: Sequence[float] | None = None,
    title: str = "Per-token coefficients ∂J/∂logp",
) -> go.Figure:
    """Grouped bars of two trajectories' per-token coefficients, one group per time step.

    Args:
        steps: one label per time step.
        first, second: the coefficients of the two trajectories at each step (the first has Â < 0).
        names: the two trajectories' legend names.
        net: optional sum of the two at each step (drawn as a marker; None where the step is not shared).
    """
    fig = go.Figure()
    fig.add_bar(x=list(steps), y=list(first), name=names[0], marker_color=NEG_COLOR)
    fig.add_bar(x=list(steps), y=list(second), name=names[1], marker_color=POS_COLOR)
    if net is not None:
        fig.add_scatter(
            x=list(steps),
            y=list(net),
            mode="markers",
            name="net (shared steps)",
            marker={"symbol": "diamond", "size": 13, "color": NET_COLOR},
        )
    fig.add_hline(y=0.0, line_width=1, line_color="gray")
    fig.update_layout(barmode="group", yaxis_title="∂J/∂logp", xaxis_title="time step")
    return _layout(fig, title)


def clip_curves(
    w: Sequence[float],
    curves: Mapping[str, Mapping[str, Sequence[float]]],
    shade: Mapping[str, Sequence[tuple[float, float]]],
    marker_w: float | None = None,
) -> go.Figure:
    """One subplot per objective: the shared token's coefficients of the ±Â trajectories and their sum vs w.

    Args:
        w: (N,) the ratios on the x-axis.
        curves: ``{objective: {"pos": (N,), "neg": (N,), "net": (N,), "prediction": (N,)}}``;
            "prediction" (the paper's closed form for the net) is optional.
        shade: ``{objective: [(x0, x1), ...]}`` x-ranges to shade (where the net does not cancel).
        marker_w: a ratio to mark with a vertical dotted line (the chosen w), or None.
    """
    names = list(curves)
    fig = make_subplots(rows=1, cols=max(1, len(names)), shared_yaxes=True, subplot_titles=names)
    xs = list(w)
    for col, name in enumerate(names, start=1):
        c = curves[name]
        first = col == 1
        for key, label, color, dash in (
            ("pos", "positive trajectory (Â = +A)", POS_COLOR, "solid"),
            ("neg", "negative trajectory (Â = −A)", NEG_COLOR, "solid"),
            ("net", "net (sum)", NET_COLOR, "solid"),
            ("prediction", "paper's closed form", PRED_COLOR, "dash"),
        ):
            if key not in c:
                continue
            fig.add_scatter(
                x=xs,
                y=list(c[key]),
                mode="lines",
                name=label,
                legendgroup=key,
                showlegend=first,
                line={"color": color, "dash": dash, "width": 3 if key == "net" else 2},
                row=1,
                col=col,
            )
        for x0, x1 in shade.get(name, ()):
            if x1 > x0:
                fig.add_vrect(
                    x0=x0, x1=x1, fillcolor=SHADE_COLOR, line_width=0, layer="below", row=1, col=col
                )
        if marker_w is not None and xs and xs[0] <= marker_w <= xs[-1]:
            fig.add_vline(x=marker_w, line_dash="dot", line_color="gray", row=1, col=col)
        fig.update_xaxes(title_text="ratio w of the shared token", row=1, col=col)
    fig.update_yaxes(title_text="∂J/∂logp of the shared token", row=1, col=1)
    fig.add_hline(y=0.0, line_width=1, line_color="gray")
    return _layout(fig, "Shared-token coefficients vs the ratio w (shaded: no cancellation)", height=420)


def grad_norm_scatter(
    pi: Sequence[float],
    norms: Sequence[float],
    grid: Sequence[float],
    lower: Sequence[float],
    upper: Sequence[float],
    vocab: int,
) -> go.Figure:
    """Scatter of ‖e_y − π‖ vs π(y) with Lopti's lower and upper bounds as lines.

    Args:
        pi, norms: one point per draw.
        grid: π values of the bound lines; lower, upper: the bounds on that grid.
        vocab: N, for the legend.
    """
    fig = go.Figure()
    fig.add_scatter(
        x=list(pi),
        y=list(norms),
        mode="markers",
        name="random logits",
        marker={"size": 4, "color": NET_COLOR, "opacity": 0.45},
    )
    fig.add_scatter(
        x=list(grid), y=list(upper), mode="lines", name="upper √2·(1 − π)", line={"color": NEG_COLOR}
    )
    fig.add_scatter(
        x=list(grid),
        y=list(lower),
        mode="lines",
        name=f"lower √(N/(N−1))·(1 − π), N = {vocab}",
        line={"color": POS_COLOR},
    )
    fig.update_layout(xaxis_title="π(y), probability of the sampled token", yaxis_title="‖e_y − π‖")
    return _layout(fig, "Gradient norm at the logits vs token probability", height=400)


def reweighted_scatter(
    pi: Sequence[float],
    base: Sequence[float],
    reweighted: Sequence[float],
    alpha: float,
    eta: float,
) -> go.Figure:
    """Effective gradient magnitude vs π without (α = 0) and with Advantage Reweighting, and Lopti's η.

    Args:
        pi: one π(y) per draw; base, reweighted: the magnitudes at α = 0 and at ``alpha``.
        eta: Lopti's threshold, drawn as a vertical line (low set π < η left, updated first).
    """
    fig = go.Figure()
    fig.add_scatter(
        x=list(pi),
        y=list(base),
        mode="markers",
        name="α = 0 (no reweighting)",
        marker={"size": 4, "color": "gray", "opacity": 0.35},
    )
    fig.add_scatter(
        x=list(pi),
        y=list(reweighted),
        mode="markers",
        name=f"α = {alpha:g}",
        marker={"size": 4, "color": POS_COLOR, "opacity": 0.55},
    )
    fig.add_vline(x=eta, line_dash="dash", line_color=NEG_COLOR)
    fig.add_annotation(
        x=eta, y=1.0, yref="paper", text="← low set: updated first", xanchor="right", showarrow=False
    )
    fig.add_annotation(
        x=eta, y=0.92, yref="paper", text="high set: updated second →", xanchor="left", showarrow=False
    )
    fig.update_layout(
        xaxis_title="π(y)", yaxis_title="|A·(α·π + 1 − α)|·‖e_y − π‖  (A = 1)", xaxis_range=[0.0, 1.0]
    )
    return _layout(
        fig, f"Effective gradient magnitude with Advantage Reweighting; Lopti η = {eta:g}", height=400
    )


__all__ = ["clip_curves", "coefficient_bars", "fmt_number", "grad_norm_scatter", "reweighted_scatter"]
