"""Plotly figures shared by the app, the report and the tutorials: training curves over seeds, the arm
colours, DFPO's weight-space picture and the token-coupling pictures.

The curve builders take ``{label: [run, run, ...]}`` where a run is a list of rows (dicts with a
``"step"`` key and metric keys), exactly what ``toymodel.simulate`` returns; the Runs page of the LM
trainer reuses them for its JSON-lines logs, which carry the same keys.

Nothing here computes a paper quantity: the curves plot the rows as given (mean over seeds with a
±1 sample-std band) and the weight-space picture draws points that ``cancellation`` computed.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

#: metric key → (title, paper reference), for the training curves
CURVE_TITLES: dict[str, tuple[str, str]] = {
    "expected_reward": ("Expected reward E[R]", "exact, by enumeration"),
    "equiv_entropy": ("Entropy on the equivalent-correct set", "App. A.3, eq. (41)"),
    "equiv_log_odds": ("Log-odds of the two equivalent answers", "App. A.3, eq. (39)–(41)"),
    "template_kl": ("Template KL drift (learning tax)", "App. E/G"),
    "shared_residual": ("Shared-event residual Σ|net| / Σ gross", "eq. (2), (72)"),
    "group_shared_residual": ("Residual on events the whole group shares", "Prop. 3.1, eq. (9), (13)"),
    "sequence_net_residual": ("Sequence-net residual Σ_g|Σ_i c_i| / Σ_g Σ_i|c_i|", "eq. (2), (18), (68)"),
    "asym": ("Asym: Var_i(w_i Â_i)", "eq. (23)"),
    "clip/low_frac": ("Lower-clip fraction (Â < 0)", "eq. (46)–(47); App. F eq. (75)"),
    "clip/high_frac": ("Upper-clip fraction (Â > 0)", "eq. (46)–(47); App. F eq. (76)"),
}

#: one colour per label, in order (plotly's default qualitative palette)
PALETTE = (
    "#636EFA",
    "#EF553B",
    "#00CC96",
    "#AB63FA",
    "#FFA15A",
    "#19D3F3",
    "#FF6692",
    "#B6E880",
    "#FF97FF",
    "#FECB52",
)

#: one colour per arm, the same in every tutorial and on the Training lab's curves: label → a PALETTE
#: colour. There are more arms than colours, so two arms share one only where no figure draws both. A
#: label that combines an arm with a setting (an aggregation, ε = 0.2) takes its arm's colour and a
#: dash or pattern of its own.
ARM_COLORS: dict[str, str] = {
    "GSPO": PALETTE[0],  # GSPO, the eq. 86 control and DFPO in the order of the Training lab's first screen
    "eq. 86 control": PALETTE[1],
    "DFPO Min-Replace": PALETTE[2],
    "GRPO": PALETTE[3],
    "GRPO-fix": PALETTE[4],
    "DFPO ppo_clip": PALETTE[5],
    "GSPO s=Πr": PALETTE[6],
    "DFPO positive QP": PALETTE[7],
    "DFPO truncate-rebalance": PALETTE[8],
    "DFPO Orth-Proj": PALETTE[9],
    # arms that never share a figure with the arm above of the same colour
    "DAPO clip-higher": PALETTE[5],
    "DFPO (no stop-grad)": PALETTE[6],
    "DFPO (scale by 0.5)": PALETTE[7],
    "GRPO + AR (α=0.2)": PALETTE[5],
    "GRPO + Lopti (η=0.4)": PALETTE[6],
    "GRPO + AR + Lopti": PALETTE[8],
    "query-preserved mini-batches": PALETTE[0],
    "random mini-batches": PALETTE[1],
    "SGD": PALETTE[8],
    "Adam": PALETTE[9],
}
#: the same arms under the app's labels (``toymodel.compare.VARIANTS``, the Training lab's own, and the
#: LM trainer's ``--objective``)
ARM_COLORS.update(
    {
        alias: ARM_COLORS[arm]
        for alias, arm in {
            "grpo": "GRPO",
            "grpo_symclip": "GRPO-fix",
            "gspo": "GSPO",
            "gspo eq.86": "eq. 86 control",
            "gspo (paper estimator, eq. 86)": "eq. 86 control",
            "dfpo": "DFPO Min-Replace",
            "dfpo min_replace": "DFPO Min-Replace",
            "dfpo orth_proj": "DFPO Orth-Proj",
            "dfpo orth_proj_pos": "DFPO positive QP",
            "dfpo truncate_rebalance": "DFPO truncate-rebalance",
            "dfpo min_replace ppo_clip": "DFPO ppo_clip",
            "dfpo min_replace (ppo_clip, trust region)": "DFPO ppo_clip",
        }.items()
    }
)

#: the weight-space picture's colours and the words the Group transforms page's caption uses for them: the
#: line Âᵀv = 0 (G = 2), the plane Âᵀv = 0 (G = 3) and the edges of its part where v ≥ 0 (G = 3, eq. 51)
LINE_COLOR, LINE_COLOR_WORD = "gray", "grey"
PLANE_COLOR, PLANE_COLOR_WORD = "lightskyblue", "light-blue"
ORTHANT_COLOR, ORTHANT_COLOR_WORD = "#2CA02C", "green"

#: marker symbols per transform, so coinciding points stay visible (drawn largest first)
SYMBOLS = ("circle-open", "diamond-open", "square-open", "x-thin-open", "cross-thin-open", "star-open")


Row = Mapping[str, float]
Run = Sequence[Row]


def color(i: int) -> str:
    """The i-th colour of ``PALETTE`` (cycling)."""
    return PALETTE[i % len(PALETTE)]


def arm_colors(labels: Iterable[str]) -> dict[str, str]:
    """label → colour for one figure: ``ARM_COLORS``' colour for an arm it names, and for every other
    label the next ``PALETTE`` colour that none of those arms uses (in order, cycling)."""
    labels = list(labels)
    taken = {ARM_COLORS[label] for label in labels if label in ARM_COLORS}
    free = [c for c in PALETTE if c not in taken] or list(PALETTE)
    others = [label for label in labels if label not in ARM_COLORS]
    return {label: ARM_COLORS.get(label) or free[others.index(label) % len(free)] for label in labels}


def rgba(hex_color: str, alpha: float) -> str:
    """``"#rrggbb"`` as a plotly ``"rgba(r,g,b,alpha)"`` string (a band's fill in its curve's colour)."""
    h = hex_color.lstrip("#")
    return f"rgba({int(h[0:2], 16)},{int(h[2:4], 16)},{int(h[4:6], 16)},{alpha})"


def seed_band(runs: Sequence[Run], metric: str, x_key: str = "step") -> tuple[np.ndarray, ...]:
    """Mean and ±1 sample std of ``metric`` over runs, aligned on ``x_key``.

    Runs may have different lengths (a real run that stopped early); each x gets the mean over the runs
    that have a finite value there, and the std over them (ddof 1; 0 with one value). Rows without the
    metric, or with a NaN (a step without an update), are left out.

    Returns:
        (x, mean, std, n): arrays over the sorted distinct x values; ``n`` counts the runs used at each x
        (mean and std are NaN where it is 0).
    """
    xs = sorted({float(r[x_key]) for run in runs for r in run if x_key in r})
    pos = {x: j for j, x in enumerate(xs)}
    vals = np.full((len(runs), len(xs)), np.nan)
    for i, run in enumerate(runs):
        for r in run:
            v = r.get(metric)
            if v is not None and x_key in r:
                vals[i, pos[float(r[x_key])]] = float(v)
    vals[~np.isfinite(vals)] = np.nan
    n = np.sum(~np.isnan(vals), axis=0)
    with warnings.catch_warnings():
        # columns with fewer finite values than needed give NaN (then replaced below), on purpose
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(vals, axis=0)
        std = np.nanstd(vals, axis=0, ddof=1)
    std = np.where(n > 1, std, np.where(n == 1, 0.0, np.nan))
    return np.asarray(xs), mean, std, n


def curve_figure(
    runs_by_label: Mapping[str, Sequence[Run]],
    metric: str,
    *,
    title: str | None = None,
    x_key: str = "step",
    height: int = 300,
) -> go.Figure:
    """One metric over steps: the mean over each label's runs, with a shaded ±1 std band.

    Args:
        runs_by_label: label → runs (one list of rows per seed).
        metric: the row key to plot.
        title: the figure title (``CURVE_TITLES`` or the key when None).
        x_key: the row key of the x-axis.
        height: figure height in pixels.
    """
    traces: list[go.Scatter] = []
    any_value = False
    colors = arm_colors(runs_by_label)  # an arm the tutorials draw keeps its colour here
    for label, runs in runs_by_label.items():
        x, mean, std, n = seed_band(runs, metric, x_key)
        any_value = any_value or bool(n.any())
        c = colors[label]
        if len(runs) > 1:
            upper, lower = mean + std, mean - std
            band_x = np.concatenate([x, x[::-1]])
            band_y = np.concatenate([upper, lower[::-1]])
            ok = np.isfinite(band_y)
            traces.append(
                go.Scatter(
                    x=band_x[ok],
                    y=band_y[ok],
                    fill="toself",
                    fillcolor=rgba(c, 0.18),
                    line={"width": 0},
                    hoverinfo="skip",
                    showlegend=False,
                    legendgroup=label,
                    name=f"{label} ±1 std",
                )
            )
        traces.append(
            go.Scatter(
                x=x,
                y=mean,
                mode="lines",
                line={"color": c, "width": 2},
                name=label,
                legendgroup=label,
                connectgaps=False,
            )
        )
    if title is None:
        name, ref = CURVE_TITLES.get(metric, (metric, ""))
        title = f"{name} ({ref})" if ref else name
    fig = go.Figure(traces)
    fig.update_layout(
        title={"text": title, "font": {"size": 14}},
        height=height,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        xaxis_title=x_key,
        yaxis_title=metric,
        legend={"orientation": "h", "y": -0.25},
        hovermode="x unified",
    )
    if not any_value:
        fig.add_annotation(
            text="n/a: no run has a value for this metric",
            showarrow=False,
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.5,
        )
    return fig


def weight_space_figure(
    advantages: Sequence[float],
    s_bar: Sequence[float],
    s_tilde: Mapping[str, Sequence[float]],
    *,
    height: int = 480,
) -> go.Figure:
    """DFPO App. B's picture for G = 2 (plane) or G = 3 (3-D): where each transform moves s̄.

    Draws the constraint set {v : Âᵀv = 0} (a line for G = 2, a plane for G = 3), the non-negative
    orthant of eq. (51), the post-clip weights s̄ and each transform's s̃, with an arrow (G = 2) or a
    segment (G = 3) from s̄ to s̃.

    Args:
        advantages: (G,) Â, not all zero.
        s_bar: (G,) post-clip weights s̄ (eq. 47).
        s_tilde: transform name → (G,) s̃.
    Raises:
        ValueError: unless G is 2 or 3, or if every advantage is 0 (no constraint to draw).
    """
    a = np.asarray(advantages, dtype=float)
    sb = np.asarray(s_bar, dtype=float)
    pts = {k: np.asarray(v, dtype=float) for k, v in s_tilde.items()}
    g = a.shape[0]
    if g not in (2, 3):
        raise ValueError(f"the weight-space picture needs G = 2 or 3, got G = {g}")
    norm = float(np.linalg.norm(a))
    if norm == 0.0:
        raise ValueError("every advantage is 0: there is no constraint Âᵀv = 0 to draw")
    allpts = np.vstack([sb, *pts.values()])
    hi = max(1.5, 1.25 * float(allpts.max()))
    lo = min(-0.2 * hi, 1.25 * float(allpts.min()))  # Orth-Proj's s̃ may be negative
    if g == 2:
        return _plane_figure(a / norm, sb, pts, (lo, hi), height)
    return _space_figure(a / norm, sb, pts, (lo, hi), height)


def _plane_figure(
    a: np.ndarray, sb: np.ndarray, pts: Mapping[str, np.ndarray], lim: tuple[float, float], height: int
) -> go.Figure:
    lo, hi = lim
    reach = hi - lo
    d = np.array([-a[1], a[0]])  # direction of the line Âᵀv = 0
    t = np.array([-2.0 * reach, 2.0 * reach])
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[0, 2 * reach, 2 * reach, 0], y=[0, 0, 2 * reach, 2 * reach], mode="lines", fill="toself",
            fillcolor="rgba(0,160,0,0.08)", line={"width": 0}, hoverinfo="skip", name="v ≥ 0 (eq. 51)",
        )
    )  # fmt: skip
    fig.add_trace(
        go.Scatter(
            x=t * d[0], y=t * d[1], mode="lines", line={"color": LINE_COLOR, "dash": "dash"}, name="Âᵀv = 0"
        )
    )
    for i, v in enumerate(pts.values()):
        c = color(i)
        if not np.allclose(v, sb):
            fig.add_annotation(
                x=v[0], y=v[1], ax=sb[0], ay=sb[1], xref="x", yref="y", axref="x", ayref="y",
                showarrow=True, arrowhead=3, arrowsize=1.2, arrowwidth=1.5, arrowcolor=c, text="",
                standoff=6,
            )  # fmt: skip
    fig.add_trace(
        go.Scatter(
            x=[sb[0]], y=[sb[1]], mode="markers", marker={"size": 10, "color": "black"}, name="s̄ (eq. 47)"
        )
    )
    n = len(pts)
    for i, (name, v) in enumerate(pts.items()):
        fig.add_trace(
            go.Scatter(
                x=[v[0]], y=[v[1]], mode="markers", name=f"s̃ {name}",
                marker={"size": 22 - 3 * i if n < 6 else 12, "color": color(i), "symbol": SYMBOLS[i % len(SYMBOLS)],
                        "line": {"width": 2.5, "color": color(i)}},
            )
        )  # fmt: skip
    fig.update_layout(
        height=height,
        margin={"l": 10, "r": 10, "t": 30, "b": 10},
        xaxis={"title": "v₁", "range": [lo, hi], "zeroline": True},
        yaxis={"title": "v₂", "range": [lo, hi], "zeroline": True, "scaleanchor": "x", "scaleratio": 1},
    )
    return fig


def _space_figure(
    a: np.ndarray, sb: np.ndarray, pts: Mapping[str, np.ndarray], lim: tuple[float, float], height: int
) -> go.Figure:
    lo, hi = lim
    corners = plane_in_cube(a, lo, hi)  # the plane Âᵀv = 0 inside the drawn cube: a convex polygon
    fig = go.Figure()
    if len(corners) >= 3:
        # a fan of triangles from the polygon's centre (vertex 0) to each side
        verts = np.vstack([corners.mean(axis=0), corners])
        m = len(corners)
        fig.add_trace(
            go.Mesh3d(
                x=verts[:, 0], y=verts[:, 1], z=verts[:, 2],
                i=[0] * m, j=[1 + q for q in range(m)], k=[1 + (q + 1) % m for q in range(m)],
                opacity=0.35, color=PLANE_COLOR, name="Âᵀv = 0", showlegend=True, hoverinfo="skip",
            )
        )  # fmt: skip
    # the part of the plane where v ≥ 0 (the positive QP's feasible set, eq. 51): its two boundary rays
    rays = orthant_rays(a)
    for n_ray, r in enumerate(rays):
        end = r * (hi / float(r.max()))  # to the cube's far faces
        fig.add_trace(
            go.Scatter3d(
                x=[0.0, end[0]], y=[0.0, end[1]], z=[0.0, end[2]], mode="lines",
                line={"color": ORTHANT_COLOR, "width": 5}, name="edge of v ≥ 0 on the plane (eq. 51)",
                legendgroup="orthant", showlegend=n_ray == 0, hoverinfo="skip",
            )
        )  # fmt: skip
    fig.add_trace(
        go.Scatter3d(
            x=[sb[0]], y=[sb[1]], z=[sb[2]], mode="markers", marker={"size": 6, "color": "black"},
            name="s̄ (eq. 47)",
        )
    )  # fmt: skip
    for i, (name, v) in enumerate(pts.items()):
        c = color(i)
        fig.add_trace(
            go.Scatter3d(
                x=[sb[0], v[0]], y=[sb[1], v[1]], z=[sb[2], v[2]], mode="lines+markers",
                line={"color": c, "width": 6}, marker={"size": [0, 7 - i if len(pts) < 6 else 5], "color": c},
                name=f"s̃ {name}",
            )
        )  # fmt: skip
    axis = {"range": [lo, hi]}
    fig.update_layout(
        height=height,
        margin={"l": 0, "r": 0, "t": 30, "b": 0},
        scene={
            "xaxis": {**axis, "title": "v₁"},
            "yaxis": {**axis, "title": "v₂"},
            "zaxis": {**axis, "title": "v₃"},
            "aspectmode": "cube",
            "camera": {"eye": dict(zip("xyz", plane_eye(a).tolist(), strict=True))},
        },
    )
    return fig


def plane_in_cube(normal: np.ndarray, lo: float, hi: float, tol: float = 1e-12) -> np.ndarray:
    """(m, 3): the corners, in order around it, of the polygon where the plane normalᵀv = 0 cuts the cube
    [lo, hi]³ (lo < 0 < hi): the plane's crossings with the cube's 12 edges."""
    n = np.asarray(normal, dtype=float)
    pts: list[np.ndarray] = []
    for k in range(3):  # edges along axis k: the other two coordinates at lo or hi
        if abs(n[k]) <= tol:
            continue
        i, j = (q for q in range(3) if q != k)
        for vi in (lo, hi):
            for vj in (lo, hi):
                vk = -(n[i] * vi + n[j] * vj) / n[k]
                if lo - tol <= vk <= hi + tol:
                    v = np.empty(3)
                    v[i], v[j], v[k] = vi, vj, min(max(vk, lo), hi)
                    if not any(np.allclose(v, w) for w in pts):
                        pts.append(v)
    if len(pts) < 3:
        return np.zeros((0, 3))
    poly = np.vstack(pts)
    centre = poly.mean(axis=0)
    # order by angle around the centre, in the plane's own coordinates
    helper = np.eye(3)[int(np.argmin(np.abs(n)))]
    u1 = np.cross(n, helper)
    u2 = np.cross(n, u1)
    rel = poly - centre
    return poly[np.argsort(np.arctan2(rel @ u2, rel @ u1))]


def plane_eye(normal: np.ndarray, distance: float = 2.5) -> np.ndarray:
    """The camera eye (plotly ``scene.camera.eye``, from the centre of the cube) that shows the plane
    normalᵀv = 0 face-on enough to see it: along the cube diagonal (±1, ±1, ±1) closest to the normal, so
    that every axis stays equally readable, as in plotly's default view, and looking from above (v₃ > 0).

    Plotly's default eye (1.25, 1.25, 1.25) looks down the diagonal (1, 1, 1), which lies in the plane when
    Σ Â = 0 (always, for group-relative advantages), so the plane is seen edge-on. The diagonal sign(normal)
    has |cos| = ‖normal‖₁ / (√3 ‖normal‖₂) with the normal: ≥ √(2/3) ≈ 0.82 when Σ normal = 0, ≥ 1/√3 for
    any normal. ``distance``: a little further than the default eye's 2.17, so that the whole cube fits a
    480-pixel-high figure.
    """
    n = np.asarray(normal, dtype=float)
    sigma = np.where(n >= 0.0, 1.0, -1.0)
    if sigma[2] < 0:  # the same line of sight from the other side of the plane: from above
        sigma = -sigma
    return distance * sigma / np.sqrt(3.0)


def orthant_rays(normal: np.ndarray, tol: float = 1e-12) -> list[np.ndarray]:
    """The extreme rays of {v ≥ 0 : normalᵀv = 0} in 3-D (unit vectors; none when the plane meets v ≥ 0
    only at 0): the plane's lines in the coordinate planes v_k = 0, kept where they run inside v ≥ 0."""
    n = np.asarray(normal, dtype=float)
    rays: list[np.ndarray] = []
    for k in range(3):
        d = np.cross(n, np.eye(3)[k])
        if np.linalg.norm(d) <= tol:  # the plane is v_k = 0 itself: its rays come from the other k
            continue
        d /= np.linalg.norm(d)
        for r in (d, -d):
            if np.all(r >= -tol) and not any(np.allclose(r, x) for x in rays):
                rays.append(np.clip(r, 0.0, None))
    return rays


# ------------------------------------------------------------------------------------------------
# token coupling (the cancellation-hypothesis paper, arXiv 2605.08666): the Token coupling page's figures

#: colours of the token-coupling figures: a positive advantage, a negative one, zero, marked pairs
ADV_POS_COLOR, ADV_NEG_COLOR, ADV_ZERO_COLOR = "#2a9d8f", "#e76f51", "#999999"
MARK_COLOR = "rgba(20, 20, 20, 0.55)"


def kernel_scale(kernel: np.ndarray, quantile: float = 0.99) -> float:
    """The colour range ±zmax of a kernel heat map: a high quantile of the off-diagonal |K| (1 if all are 0).

    The diagonal K_jj = ‖g_j‖² (the self-terms) and a few strongly coupled pairs are far larger than most
    couplings; scaling by the 99th percentile of the off-diagonal entries keeps the rest visible and lets
    those saturate.
    """
    k = np.asarray(kernel, dtype=float)
    off = np.abs(k[~np.eye(k.shape[0], dtype=bool)]) if k.shape[0] > 1 else np.zeros(0)
    top = float(np.quantile(off, quantile)) if off.size else 0.0
    if top <= 0.0:
        top = float(off.max()) if off.size else 0.0
    return top if top > 0.0 else 1.0


def kernel_heatmap(
    kernel: np.ndarray,
    labels: Sequence[str],
    title: str,
    *,
    marks: np.ndarray | None = None,
    mark_name: str = "marked pairs",
    boundaries: Sequence[int] = (),
    height: int = 380,
) -> go.Figure:
    """An (N, N) kernel as a heat map over the batch's tokens (row j, column k), red > 0 > blue.

    Args:
        kernel: (N, N) values (drawn as float32).
        labels: N distinct token labels, the axes' categories (row 0 at the top).
        title: the figure title.
        marks: optional (N, N) bool: pairs drawn with a dark translucent overlay (a second heat map trace
            named ``mark_name``, 1 on the marked pairs, 0 transparent).
        boundaries: token indices where a new group starts (a thin line before each).
        height: in pixels.
    """
    k = np.asarray(kernel, dtype=float)
    zmax = kernel_scale(k)
    labels = list(labels)
    fig = go.Figure(
        go.Heatmap(
            z=k.astype(np.float32),
            x=labels,
            y=labels,
            zmin=-zmax,
            zmax=zmax,
            colorscale="RdBu_r",
            name="K",
            colorbar={"thickness": 10, "len": 0.8},
            hovertemplate="j: %{y}<br>k: %{x}<br>value: %{z:.4g}<extra></extra>",
        )
    )
    if marks is not None:
        fig.add_trace(
            go.Heatmap(
                z=np.asarray(marks, dtype=bool).astype(np.uint8),
                x=labels,
                y=labels,
                zmin=0,
                zmax=1,
                colorscale=[[0.0, "rgba(0, 0, 0, 0)"], [1.0, MARK_COLOR]],
                showscale=False,
                hoverinfo="skip",
                name=mark_name,
            )
        )
    line = {"color": "black", "width": 1}
    n = len(labels)
    shapes = [
        shape
        for b in boundaries
        for shape in (
            {"type": "line", "x0": b - 0.5, "x1": b - 0.5, "y0": -0.5, "y1": n - 0.5, "line": line},
            {"type": "line", "y0": b - 0.5, "y1": b - 0.5, "x0": -0.5, "x1": n - 0.5, "line": line},
        )
    ]
    fig.update_layout(
        title={"text": title, "font": {"size": 14}},
        height=height,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        xaxis={"type": "category", "showticklabels": False, "title": "token k", "constrain": "domain"},
        yaxis={
            "type": "category",
            "autorange": "reversed",
            "showticklabels": False,
            "title": "token j",
            "scaleanchor": "x",
            "constrain": "domain",
        },
        shapes=shapes,
    )
    return fig


def _by_sign(adv: Sequence[float]) -> list[tuple[str, str, np.ndarray]]:
    a = np.asarray(adv, dtype=float)
    return [
        ("A > 0", ADV_POS_COLOR, a > 0),
        ("A < 0", ADV_NEG_COLOR, a < 0),
        ("A = 0", ADV_ZERO_COLOR, a == 0),
    ]


def delta_scatter(
    first_order: Sequence[float],
    actual: Sequence[float],
    labels: Sequence[str],
    adv: Sequence[float],
    title: str,
    height: int = 400,
) -> go.Figure:
    """Actual Δ log π (y) against its first-order prediction (x), one point per token, with y = x.

    Args:
        first_order, actual: (N,) Δ log π of each token, predicted and measured.
        labels: N token labels (hover); adv: (N,) each token's rollout advantage (the colour).
    """
    x, y = np.asarray(first_order, dtype=float), np.asarray(actual, dtype=float)
    lab = np.asarray(list(labels), dtype=object)
    fig = go.Figure()
    for name, c, sel in _by_sign(adv):
        if sel.any():
            fig.add_scatter(
                x=x[sel], y=y[sel], mode="markers", name=name, text=lab[sel],
                marker={"size": 6, "color": c, "opacity": 0.7},
                hovertemplate="%{text}<br>first order: %{x:.4g}<br>actual: %{y:.4g}<extra></extra>",
            )  # fmt: skip
    both = np.concatenate([x, y]) if x.size else np.zeros(1)
    lo, hi = float(both.min()), float(both.max())
    fig.add_scatter(
        x=[lo, hi], y=[lo, hi], mode="lines", name="y = x", line={"color": "gray", "dash": "dash"},
        hoverinfo="skip",
    )  # fmt: skip
    fig.update_layout(
        title={"text": title, "font": {"size": 14}},
        height=height,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        xaxis_title="first-order Δ log π (eq. 5)",
        yaxis_title="actual Δ log π after the step",
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


def self_coupling_scatter(
    self_term: Sequence[float],
    coupling: Sequence[float],
    labels: Sequence[str],
    adv: Sequence[float],
    title: str,
    height: int = 400,
) -> go.Figure:
    """Each token's coupling term (y) against its self-term (x) of eq. (5), with the line y = −x.

    Below y = −x (for a positive self-term) the other tokens undo more than the token's own push.
    """
    x, y = np.asarray(self_term, dtype=float), np.asarray(coupling, dtype=float)
    lab = np.asarray(list(labels), dtype=object)
    fig = go.Figure()
    for name, c, sel in _by_sign(adv):
        if sel.any():
            fig.add_scatter(
                x=x[sel], y=y[sel], mode="markers", name=name, text=lab[sel],
                marker={"size": 6, "color": c, "opacity": 0.7},
                hovertemplate="%{text}<br>self: %{x:.4g}<br>coupling: %{y:.4g}<extra></extra>",
            )  # fmt: skip
    span = float(np.abs(np.concatenate([x, y])).max()) if x.size else 1.0
    fig.add_scatter(
        x=[-span, span], y=[span, -span], mode="lines", name="coupling = −self (Δ = 0)",
        line={"color": "gray", "dash": "dot"}, hoverinfo="skip",
    )  # fmt: skip
    fig.update_layout(
        title={"text": title, "font": {"size": 14}},
        height=height,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        xaxis_title="self-term lr·c_j·K_jj",
        yaxis_title="coupling term lr·Σ_{k≠j} c_k K_jk",
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


def masking_histogram(
    exact: Sequence[float], first_order: Sequence[float], title: str, height: int = 360
) -> go.Figure:
    """Overlaid histograms of the candidates' exact and first-order Masking Effects, and the line ME = 0."""
    fig = go.Figure()
    fig.add_histogram(x=np.asarray(exact, dtype=float), name="exact ME (two SGD steps)", opacity=0.65,
                      marker_color=PALETTE[0], nbinsx=40)  # fmt: skip
    fig.add_histogram(x=np.asarray(first_order, dtype=float), name="first order lr·Σ_{k∈M} c_k K_jk",
                      opacity=0.45, marker_color=PALETTE[1], nbinsx=40)  # fmt: skip
    fig.add_vline(x=0.0, line_dash="dash", line_color="black")
    fig.update_layout(
        barmode="overlay",
        title={"text": title, "font": {"size": 14}},
        height=height,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        xaxis_title="Masking Effect ME_j (> 0: the masked tokens boost j)",
        yaxis_title="candidates",
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


def value_gap_bars(
    boosted: float, suppressed: float, n_boosted: int, n_suppressed: int, height: int = 340
) -> go.Figure:
    """Two bars: the mean counterfactual value of the boosted and of the suppressed tokens (Fig. 5)."""
    fig = go.Figure(
        go.Bar(
            x=[f"boosted (Δ log π > 0, n = {n_boosted})", f"suppressed (Δ log π < 0, n = {n_suppressed})"],
            y=[boosted, suppressed],
            marker_color=[ADV_POS_COLOR, ADV_NEG_COLOR],
            hovertemplate="%{x}<br>mean value: %{y:.4g}<extra></extra>",
        )
    )
    fig.add_hline(y=0.0, line_color="gray")
    fig.update_layout(
        title={"text": "Mean counterfactual token value (eq. 20)", "font": {"size": 14}},
        height=height,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        yaxis_title="mean value",
    )
    return fig


def topk_gap_curve(fractions: Sequence[float], gaps: Sequence[float], height: int = 340) -> go.Figure:
    """The value gap (boosted − suppressed) on the top fraction of tokens by entropy (Fig. 5b)."""
    fig = go.Figure(
        go.Scatter(
            x=np.asarray(fractions, dtype=float),
            y=np.asarray(gaps, dtype=float),
            mode="lines+markers",
            name="value gap",
            line={"color": PALETTE[0]},
            hovertemplate="top %{x:.0%} by entropy<br>gap: %{y:.4g}<extra></extra>",
        )
    )
    fig.add_hline(y=0.0, line_color="gray", line_dash="dash")
    fig.update_layout(
        title={"text": "Value gap on the top-k tokens by entropy (Fig. 5b)", "font": {"size": 14}},
        height=height,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        xaxis={"title": "fraction of tokens kept (highest entropy first)", "tickformat": ".0%"},
        yaxis_title="boosted − suppressed mean value",
    )
    return fig
