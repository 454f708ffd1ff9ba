"""One study's results as data: arms, per-seed measures, curves and the predictions it tests.

Every experiment (a toy grid, a language-model sweep) produces ``StudyResult`` objects and saves them as
JSON (``StudyResult.save``); the report (``experiments.report``) reads them back and writes the tables,
the verdicts and the figures. Keeping this boundary as plain data means a study can be re-run, resumed
or replaced without touching the report, and the report can be rebuilt from saved results alone.

Verdicts (``Prediction.verdict``): a prediction says that ``arm`` has a lower (or higher) value of
``measure`` than ``baseline``. The paired difference arm − baseline (matched by seed, with its
bootstrap CI, ``experiments.stats.paired_difference``) decides:

- ``held``: the whole CI lies on the predicted side of 0;
- ``contradicted``: the whole CI lies on the other side;
- ``not resolved``: the CI contains 0 (the study cannot tell at its number of seeds);
- ``too few seeds``: fewer than ``MIN_SEEDS`` seeds have both values (quick mode's slices); the
  difference is still shown;
- ``not measured``: the arm, the baseline or the measure is missing, or no seed has both.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .stats import paired_difference

DIRECTIONS = ("lower", "higher")
#: Significant digits of the curves' values in the saved JSON (they only draw figures; per-seed measures
#: are saved at full precision).
CURVE_DIGITS = 5
VERDICTS = ("held", "contradicted", "not resolved", "too few seeds", "not measured")
#: A verdict needs at least this many seeds with both arms measured: a bootstrap CI of fewer paired
#: differences is too narrow to trust (with 2 seeds it has 3 possible values), and the exact sign test
#: cannot go below p = 2^(1-n) = 0.0625 with 5 seeds.
MIN_SEEDS = 5


# sources the studies cite (by title and arXiv id): docs/papers.md is the one table of the papers, and
# these strings follow it
#: "Design Conditions for Intra-Group Learning of Sequence-Level Rewards: Token Gradient Cancellation".
DFPO = "DFPO, 'Design Conditions for Intra-Group Learning of Sequence-Level Rewards' (arXiv 2604.13088)"
#: The public review of DFPO: does the gain come from restored cancellation, or from smaller steps?
REVIEW = "public review of DFPO (arXiv 2604.13088): the controlled ablation against the same estimator"
#: "The Cancellation Hypothesis in Critic-Free RL: From Outcome Rewards to Token Credits" (arXiv 2605.08666).
CANCEL = "cancellation-hypothesis paper, 'The Cancellation Hypothesis in Critic-Free RL' (arXiv 2605.08666)"
#: "Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs".
LOPTI = "Lopti, 'Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs' (arXiv 2505.12929)"
DAPO = "DAPO (arXiv 2503.14476)"


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


@dataclass(frozen=True)
class Prediction:
    """A paper's prediction, stated as a paired comparison: ``arm``'s ``measure`` is ``direction``
    (``"lower"``/``"higher"``) than ``baseline``'s. ``claim`` says it in words, ``source`` cites it
    (paper and section)."""

    claim: str
    source: str
    measure: str
    arm: str
    baseline: str
    direction: str

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(
                f"Prediction {self.claim!r}: `direction` must be one of {DIRECTIONS}, got {self.direction!r}"
            )


@dataclass(frozen=True)
class Verdict:
    """A prediction's outcome: the verdict and the paired difference that decided it."""

    prediction: Prediction
    verdict: str
    n: int = 0
    diff: float | None = None
    low: float | None = None
    high: float | None = None
    sign_p: float | None = None


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
    - ``seconds``: wall time of the study.
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

    def __post_init__(self) -> None:
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

    def verdicts(self, *, n_boot: int = 10_000, seed: int = 0, level: float = 0.95) -> list[Verdict]:
        """Each prediction's verdict from the paired difference arm − baseline (see the module docstring)."""
        out = []
        for p in self.predictions:
            a, b = self.values(p.arm, p.measure), self.values(p.baseline, p.measure)
            common = sorted(set(a) & set(b))
            if not common:
                out.append(Verdict(p, "not measured"))
                continue
            horizon = self.measure(p.measure).horizon
            pd = paired_difference(
                {s: a[s] for s in common},
                {s: b[s] for s in common},
                horizon=horizon,
                n_boot=n_boot,
                seed=seed,
                level=level,
            )
            if pd.n == 0 or not math.isfinite(pd.low) or not math.isfinite(pd.high):
                out.append(Verdict(p, "not measured", n=pd.n))
                continue
            lower_side, higher_side = pd.high < 0, pd.low > 0
            if pd.n < MIN_SEEDS:
                verdict = "too few seeds"
            elif (p.direction == "lower" and lower_side) or (p.direction == "higher" and higher_side):
                verdict = "held"
            elif (p.direction == "lower" and higher_side) or (p.direction == "higher" and lower_side):
                verdict = "contradicted"
            else:
                verdict = "not resolved"
            out.append(
                Verdict(p, verdict, n=pd.n, diff=_finite_or_none(pd.mean), low=_finite_or_none(pd.low),
                        high=_finite_or_none(pd.high), sign_p=_finite_or_none(pd.sign_p))
            )  # fmt: skip
        return out

    # ---- JSON

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["per_seed"] = {
            arm: {m: {str(s): _json_float(v) for s, v in vals.items()} for m, vals in measures.items()}
            for arm, measures in self.per_seed.items()
        }
        d["measures"] = [_json_measure(m) for m in self.measures]
        d["curves"] = _json_clean(self.curves, digits=CURVE_DIGITS)
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
        )

    def save(self, path: str | Path) -> Path:
        """Write the study as JSON (``inf`` as ``"inf"``, NaN as ``null``); return the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), separators=(",", ":"), allow_nan=False))
        tmp.replace(path)  # never a half-written result
        return path

    @classmethod
    def load(cls, path: str | Path) -> StudyResult:
        return cls.from_json(json.loads(Path(path).read_text()))


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
    "CANCEL",
    "DAPO",
    "DFPO",
    "DIRECTIONS",
    "LOPTI",
    "MIN_SEEDS",
    "REVIEW",
    "VERDICTS",
    "Measure",
    "Prediction",
    "StudyResult",
    "Verdict",
]
