"""One study's results as data: arms, per-seed measures, curves and the predictions it tests.

Every experiment (a toy grid, a language-model sweep) produces ``StudyResult`` objects and saves them as
JSON (``StudyResult.save``); the report (``experiments.report``) reads them back and writes the tables,
the verdicts and the figures. Keeping this boundary as plain data means a study can be re-run, resumed
or replaced without touching the report, and the report can be rebuilt from saved results alone.

Verdicts (``decide``). A prediction says that ``arm`` has a lower (or higher) value of ``measure``
than ``baseline``. The per-seed differences d_s = arm_s − baseline_s (matched by seed; a censored
measure counts a never-reached seed as the horizon; |d_s| ≤ ``TOL`` is an exact tie) are tested with the
paired t test (``experiments.stats.paired_t``: the p-value and the t interval printed; exact under
normal differences at any n, where the percentile bootstrap's 95 % CI excludes a true 0 in 17 % of
runs at n = 5) and, as a distribution-free check printed beside it, the exact sign-flip permutation
test (``stats.signflip_p``, exact, for studies of up to ``EXACT_MAX`` seeds). The p-values of a report's *family* of predictions are adjusted together
with Holm's step-down method (``decide(..., adjust="holm")``), and the verdict reads the adjusted p at
the level α = 1 − ``level`` that the report prints. Holm tests the j-th smallest of the m p-values at
α/(m − j + 1); each family member's minimal detectable effect (``Verdict.mde``) is computed at that level,
the one it is actually tested at (``Verdict.alpha``), not at α:

- ``held``: adjusted p < α and the mean difference is on the predicted side;
- ``contradicted``: adjusted p < α and the mean difference is on the other side;
- ``not resolved``: adjusted p ≥ α (p = α exactly, an interval that ends at 0, is not resolved);
- ``tied``: every per-seed difference is a tie (|d_s| ≤ ``TOL``: the two arms take identical steps, e.g.
  GRPO and GRPO-fix when no ratio leaves the clip range): decided by construction, so it is left out of
  the family (it does not count in Holm's m) and listed apart;
- ``by construction``: the prediction is decided by how the arm is built (``Prediction.by_construction``
  says why, e.g. an ablation whose gradient is identically 0); its difference is shown, and it is left
  out of the family and of the held/contradicted counts;
- ``too few seeds``: fewer than ``MIN_SEEDS`` seeds have both values (quick mode's slices); the
  difference is still shown;
- ``not measured``: the arm, the baseline or the measure is missing, or no seed has both.

Blocks. A study runs on a *discovery* block of seeds (0, 1, ...; explored freely while the studies were
designed) and, in full mode, on a *confirmation* block of disjoint seeds (``CONFIRM_FIRST_SEED`` on)
with the same arms and the same predictions, fixed in code before that block ran. The report decides
every verdict on the confirmation block when a study has one, and shows both blocks.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .stats import DIRECTIONS, holm, paired_difference, t_quantile
from .stats import decide as decide_pair

#: Significant digits of the curves' values in the saved JSON (they only draw figures; per-seed measures
#: are saved at full precision).
CURVE_DIGITS = 5
VERDICTS = (
    "held",
    "contradicted",
    "not resolved",
    "tied",
    "by construction",
    "too few seeds",
    "not measured",
)
#: Paired differences at most this large (in the measure's unit) are ties: floating-point noise between
#: two arms that take identical steps must not become a "significant" difference.
TOL = 1e-9
#: The first seed of a study's confirmation block (its discovery block starts at 0).
CONFIRM_FIRST_SEED = 10_000
BLOCKS = ("discovery", "confirmation")
#: The sign-flip permutation p is computed (exactly, over all 2^n flips) up to this many seeds; above it
#: the t test's normal approximation holds and a Monte Carlo p would cost seconds per prediction.
EXACT_MAX = 20
#: The power of the minimal detectable effect the report prints (``Verdict.mde``).
POWER = 0.8
#: A verdict needs at least this many seeds with both arms measured (the t test is exact only for normal
#: differences, and with fewer seeds nothing checks that; the sign-flip test cannot go below
#: p = 2^(1-n) = 0.0625 at 5).
MIN_SEEDS = 5


#: At most this many points per saved curve.
CURVE_POINTS = 100


def sig(x: float | None, digits: int = 6) -> float | None:
    """``x`` rounded to ``digits`` significant digits for the saved curves and grids (None if missing or
    not finite)."""
    return None if x is None or not math.isfinite(x) else float(f"{x:.{digits}g}")


@dataclass(frozen=True)
class Measure:
    """A per-seed measure: ``key`` in ``StudyResult.per_seed``, a label for tables, which way is better
    (``"lower"``, ``"higher"`` or ``None``), and ``horizon`` for a right-censored measure (never reached
    is stored as ``math.inf``; the horizon is the run length, see ``experiments.stats``)."""

    key: str
    label: str
    better: str | None = None
    horizon: float | None = None

    def __post_init__(self) -> None:
        if self.better is not None and self.better not in DIRECTIONS:
            raise ValueError(
                f"Measure {self.key!r}: `better` must be one of {DIRECTIONS} or None, got {self.better!r}"
            )


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """A paper's prediction, stated as a paired comparison: ``arm``'s ``measure`` is ``direction``
    (``"lower"``/``"higher"``) than ``baseline``'s. ``claim`` says it in words, ``source`` cites it
    (paper and section). ``by_construction``: why the comparison is decided by how the arms are built
    (shown as such, never counted as held or contradicted), or None. Built by keyword; the studies bind
    theirs from the one table of claims (``experiments.claims.predict``)."""

    claim: str
    source: str
    measure: str
    arm: str
    baseline: str
    direction: str
    by_construction: str | None = None

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(
                f"Prediction {self.claim!r}: `direction` must be one of {DIRECTIONS}, got {self.direction!r}"
            )


@dataclass(frozen=True)
class Verdict:
    """A prediction's outcome and the paired difference that decided it: ``diff`` (mean of
    arm − baseline over ``n`` seeds) with its t interval [``low``, ``high``] at ``level``, the t test's
    two-sided ``p``, ``p_adj`` (Holm-adjusted within the family it was decided in; = ``p`` alone),
    ``perm_p`` (exact sign-flip permutation test; None above ``EXACT_MAX`` seeds), ``mde`` (the minimal detectable effect: the true mean
    difference a two-sided t test at level ``alpha`` detects with ``POWER`` at these seeds' spread,
    (t_{1−alpha/2, n−1} + t_{power, n−1})·``se``, ``se`` = sd/√n; ``alpha`` is 1 − level until ``decide``
    sets it to the Holm step's level the prediction is tested at), ``side`` (``stats.decide``'s: predicted,
    opposite or tie) and the ``block`` of seeds it was computed on. ``identical`` (for a ``tied`` verdict):
    whether every measure of the two arms ties on every seed (the arms took identical steps, a tie built
    in) or only this one (e.g. two different arms reaching the threshold at the same step on every seed)."""

    prediction: Prediction
    verdict: str
    n: int = 0
    diff: float | None = None
    low: float | None = None
    high: float | None = None
    p: float | None = None
    p_adj: float | None = None
    perm_p: float | None = None
    mde: float | None = None
    side: str | None = None
    level: float = 0.95
    block: str = "discovery"
    se: float | None = None
    alpha: float | None = None
    identical: bool | None = None


def _finite_or_none(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


@dataclass
class StudyResult:
    """One study: what it asks, how it was run, and every arm's per-seed values.

    - ``name``: a file-name-safe id (``toy_main``, ``lm_main``);
    - ``title``, ``question``: a heading and the question in one or two sentences;
    - ``setting``: how it was run (scenario or task, steps, seeds, learning rate...), in words;
    - ``baseline``: the arm paired differences are taken against in the tables;
    - ``arms``: arm name → its description (``{"label": ..., "config": {...}}``), in display order;
    - ``measures``: the per-seed measures, in display order;
    - ``per_seed``: arm → measure key → {seed (str): value}; a missing value is NaN (or absent);
    - ``curves``: curve name (e.g. ``"expected_reward"``) → arm → {"x": [...], "seeds": {seed: [...]}}:
      one value per x per seed, for the figures;
    - ``predictions``: the paper predictions this study tests;
    - ``notes``: findings or caveats the report prints under the table (what the study cannot test);
    - ``seconds``: wall time of the study;
    - ``block``: ``"discovery"`` or ``"confirmation"`` (the module docstring), ``first_seed`` its first seed;
    - ``grid``: a sweep's table, one plain-data row per setting (``toy_frontier``: arm × lr × inner
      epochs with its seed means), rendered by the report; empty for other studies;
    - ``drift``: arm → the study-level template drift after the last step (``experiments.toy.template_drift``:
      ``drift2``, ``floor``, ``systematic``, ``se``, ``per_seed2``, ``n``); empty where the scenario has no
      template or the results predate the measure.
    """

    name: str
    title: str
    question: str
    setting: str
    baseline: str
    arms: dict[str, dict[str, Any]]
    measures: list[Measure]
    per_seed: dict[str, dict[str, dict[str, float]]]
    curves: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    predictions: list[Prediction] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    block: str = "discovery"
    first_seed: int = 0
    grid: list[dict[str, Any]] = field(default_factory=list)
    drift: dict[str, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.block not in BLOCKS:
            raise ValueError(f"study {self.name!r}: `block` must be one of {BLOCKS}, got {self.block!r}")
        if self.baseline not in self.arms:
            raise ValueError(
                f"study {self.name!r}: baseline {self.baseline!r} is not one of its arms {list(self.arms)}"
            )
        unknown = set(self.per_seed) - set(self.arms)
        if unknown:
            raise ValueError(
                f"study {self.name!r}: per_seed has arms {sorted(unknown)} not declared in `arms`"
            )
        keys = {m.key for m in self.measures}
        for p in self.predictions:
            if p.measure not in keys:
                raise ValueError(
                    f"study {self.name!r}: prediction {p.claim!r} uses unknown measure {p.measure!r}"
                )
            for arm in (p.arm, p.baseline):
                if arm not in self.arms:
                    raise ValueError(f"study {self.name!r}: prediction {p.claim!r} uses unknown arm {arm!r}")

    # ---- per-seed access

    def values(self, arm: str, measure: str) -> dict[str, float]:
        """``{seed: value}`` of one arm and measure (empty when missing)."""
        return dict(self.per_seed.get(arm, {}).get(measure, {}))

    def measure(self, key: str) -> Measure:
        for m in self.measures:
            if m.key == key:
                return m
        raise KeyError(f"study {self.name!r} has no measure {key!r}; it has {[m.key for m in self.measures]}")

    def verdicts(self, *, level: float = 0.95) -> list[Verdict]:
        """Each prediction's verdict, this study's predictions adjusted together (``decide``)."""
        return decide([self], level=level)

    def paired(self, p: Prediction, *, level: float = 0.95) -> Verdict:
        """``p``'s paired difference on this study's seeds with its unadjusted test (verdict undecided:
        ``"not resolved"`` stands in until ``decide`` reads the family's adjusted p)."""
        a, b = self.values(p.arm, p.measure), self.values(p.baseline, p.measure)
        common = sorted(set(a) & set(b))
        if not common:
            return Verdict(p, "not measured", level=level, block=self.block)
        pd = paired_difference(
            {s: a[s] for s in common},
            {s: b[s] for s in common},
            horizon=self.measure(p.measure).horizon,
            n_boot=1,
            level=level,
            tol=TOL,
        )
        if pd.n == 0:
            return Verdict(p, "not measured", level=level, block=self.block)
        d = np.asarray(pd.differences, dtype=float)
        r = decide_pair(d, p.direction, alpha=1.0 - level, tol=TOL, perm_max=EXACT_MAX)
        se = float(np.std(d, ddof=1)) / math.sqrt(pd.n) if pd.n >= 2 else math.nan
        mde = mde_at(se, pd.n, 1.0 - level)
        verdict = (
            "too few seeds"
            if pd.n < MIN_SEEDS
            else "by construction"
            if p.by_construction
            else "tied"
            if bool(np.all(np.abs(d) <= TOL))
            else "not resolved"
        )
        return Verdict(p, verdict, n=pd.n, diff=_finite_or_none(r["mean"]), low=_finite_or_none(r["low"]),
                       high=_finite_or_none(r["high"]), p=_finite_or_none(r["p"]), p_adj=_finite_or_none(r["p"]),
                       perm_p=_finite_or_none(r["perm_p"]), mde=_finite_or_none(mde), side=r["side"], level=level,
                       block=self.block, se=_finite_or_none(se), alpha=1.0 - level,
                       identical=self._identical(p.arm, p.baseline) if verdict == "tied" else None)  # fmt: skip

    def _identical(self, arm: str, baseline: str) -> bool:
        """Whether every measure the two arms share is equal (within ``TOL``, NaN = NaN, inf = inf) on every
        seed both have."""
        a, b = self.per_seed.get(arm, {}), self.per_seed.get(baseline, {})
        for key in set(a) & set(b):
            for seed in set(a[key]) & set(b[key]):
                x, y = float(a[key][seed]), float(b[key][seed])
                if x == y or (math.isnan(x) and math.isnan(y)):
                    continue
                if not (math.isfinite(x) and math.isfinite(y) and abs(x - y) <= TOL):
                    return False
        return True

    # ---- JSON

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["per_seed"] = {
            arm: {m: {str(s): _json_float(v) for s, v in vals.items()} for m, vals in measures.items()}
            for arm, measures in self.per_seed.items()
        }
        d["measures"] = [_json_measure(m) for m in self.measures]
        d["curves"] = _json_clean(self.curves, digits=CURVE_DIGITS)
        d["drift"] = {arm: {k: _json_float(v) for k, v in vals.items()} for arm, vals in self.drift.items()}
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StudyResult:
        return cls(
            name=d["name"],
            title=d["title"],
            question=d["question"],
            setting=d["setting"],
            baseline=d["baseline"],
            arms={k: dict(v) for k, v in d["arms"].items()},
            measures=[
                Measure(
                    m["key"],
                    m["label"],
                    m.get("better"),
                    None if m.get("horizon") is None else _from_json_float(m["horizon"]),
                )
                for m in d["measures"]
            ],
            per_seed={
                arm: {
                    m: {str(s): _from_json_float(v) for s, v in vals.items()} for m, vals in measures.items()
                }
                for arm, measures in d["per_seed"].items()
            },
            curves=d.get("curves", {}),
            predictions=[Prediction(**p) for p in d.get("predictions", [])],
            notes=list(d.get("notes", [])),
            seconds=float(d.get("seconds", 0.0)),
            block=d.get("block", "discovery"),
            first_seed=int(d.get("first_seed", 0)),
            grid=[dict(r) for r in d.get("grid", [])],
            drift={
                arm: {k: _from_json_float(v) for k, v in vals.items()}
                for arm, vals in d.get("drift", {}).items()
            },
        )

    def save(self, path: str | Path) -> Path:
        """Write the study as JSON (``inf`` as ``"inf"``, NaN as ``null``), gzip-compressed when the path
        ends in ``.gz`` (the committed results); return the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        data = json.dumps(self.to_json(), separators=(",", ":"), allow_nan=False).encode()
        tmp.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
        tmp.replace(path)  # never a half-written result
        return path

    @classmethod
    def load(cls, path: str | Path) -> StudyResult:
        path = Path(path)
        data = path.read_bytes()
        return cls.from_json(json.loads(gzip.decompress(data) if path.suffix == ".gz" else data))


def mde_at(se: float, n: int, alpha: float, power: float = POWER) -> float:
    """The minimal detectable effect of a two-sided paired t test at level ``alpha`` with ``power`` over
    ``n`` seeds whose mean difference has standard error ``se``: (t_{1−α/2, n−1} + t_{power, n−1})·se
    (NaN below 2 seeds or without a finite se)."""
    if n < 2 or se is None or not math.isfinite(se):
        return math.nan
    return (t_quantile(1.0 - alpha / 2.0, n - 1) + t_quantile(power, n - 1)) * se


def holm_levels(pvalues: Sequence[float], alpha: float) -> list[float]:
    """The level Holm's step-down method tests each p-value at, in the order given: the j-th smallest of
    the m p-values (ties in the order given) at α/(m − j + 1)."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    out = [math.nan] * len(pvalues)
    for j, i in enumerate(order):
        out[i] = alpha / (len(pvalues) - j)
    return out


def decide(studies: Sequence[StudyResult], *, level: float = 0.95, adjust: str = "holm") -> list[Verdict]:
    """The verdicts of every prediction of ``studies`` (in order), decided as one family.

    Each prediction's paired t test (``StudyResult.paired``); the p-values of the predictions that can
    be decided (enough seeds, measured, not by construction, not tied on every seed) are adjusted together
    with Holm's method (``adjust="holm"``; ``"none"``: each alone), and each verdict reads its adjusted p at
    α = 1 − level (module docstring). A family member's MDE is recomputed at the level its Holm step tests
    it at (``holm_levels``; α itself with ``adjust="none"``). Decide a report's family in one call: the
    adjustment depends on the family.
    """
    if adjust not in ("holm", "none"):
        raise ValueError(f"`adjust` must be 'holm' or 'none', got {adjust!r}")
    if not 0 < level < 1:
        raise ValueError(f"`level` must be in (0, 1), got {level}")
    alpha = 1.0 - level
    raw = [study.paired(p, level=level) for study in studies for p in study.predictions]
    family = [i for i, v in enumerate(raw) if v.verdict == "not resolved" and v.p is not None]
    ps = [raw[i].p for i in family]
    adjusted = holm(ps) if adjust == "holm" else ps
    levels = holm_levels(ps, alpha) if adjust == "holm" else [alpha] * len(ps)
    out = list(raw)
    for i, p_adj, a in zip(family, adjusted, levels, strict=True):
        v = raw[i]
        verdict = "not resolved"
        if p_adj < alpha and v.side != "tie":
            verdict = "held" if v.side == "predicted" else "contradicted"
        mde = _finite_or_none(mde_at(v.se if v.se is not None else math.nan, v.n, a))
        out[i] = replace(v, verdict=verdict, p_adj=float(p_adj), alpha=float(a), mde=mde)
    return out


def _json_float(v: Any) -> Any:
    if v is None:
        return None
    v = float(v)
    if math.isnan(v):
        return None
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def _from_json_float(v: Any) -> float | None:
    if v is None:
        return math.nan
    if v == "inf":
        return math.inf
    if v == "-inf":
        return -math.inf
    return float(v)


def _json_measure(m: Measure) -> dict[str, Any]:
    d = asdict(m)
    d["horizon"] = None if m.horizon is None else _json_float(m.horizon)
    return d


def _json_clean(x: Any, digits: int) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _json_clean(v, digits) for k, v in x.items()}
    if isinstance(x, Sequence) and not isinstance(x, str):
        return [_json_clean(v, digits) for v in x]
    if isinstance(x, float):
        v = _json_float(x)
        return float(f"{v:.{digits}g}") if isinstance(v, float) else v
    return x


__all__ = [
    "BLOCKS",
    "CONFIRM_FIRST_SEED",
    "DIRECTIONS",
    "EXACT_MAX",
    "MIN_SEEDS",
    "TOL",
    "VERDICTS",
    "Measure",
    "Prediction",
    "StudyResult",
    "Verdict",
    "decide",
    "holm_levels",
    "mde_at",
]
