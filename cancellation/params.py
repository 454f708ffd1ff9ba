"""Each objective's parameters, declared once: a frozen dataclass per objective.

A field's name is the keyword of ``compute_loss`` (and of ``RunConfig``, the toy's CLI, the TRL plug-in), its
default is what the loss uses when the keyword is left out, its ``metadata`` holds one line of documentation
(``"doc"``) and the valid values (``"check"``: a predicate and what it requires; ``"choices"``: the valid
names; ``meta`` builds it). ``__post_init__`` refuses a value out of range with one message, which names the objective and the
field; the loss, ``scaledrun.config.ObjectiveConfig``, the toy's CLI and the TRL plug-in all raise it from
here. ``cancellation.objectives.register(name, params=...)`` ties a class to its objective.

A clip range (``epsilon_low`` / ``epsilon_high``) may also be a (B,) tensor, one ε per row (the batched
toy's per-seed ε); its check then holds in every row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor

from .transforms import ABLATIONS, TRANSFORMS

#: Valid ``estimator`` values of the sequence-level objectives (``gspo``, ``dfpo``).
ESTIMATORS = ("paper", "ppo_clip")

#: A range check: a predicate (elementwise on a tensor) and what it requires, as the error says it.
Check = tuple[Callable[[Any], Any], str]


def meta(doc: str, *, check: Check | None = None, choices: Any = None) -> dict[str, Any]:
    """A parameter field's ``metadata``: one line of documentation and its valid values."""
    return {"doc": doc, "check": check, "choices": choices}


#: the clip range, shared by grpo, gspo and dfpo (their defaults differ)
_CLIP_LOW = meta(
    "lower clip ε_low: the ratio's band is [1 − ε_low, 1 + ε_high] (DFPO eq. 46)",
    check=(lambda x: (x >= 0.0) & (x < 1.0), "must be in [0, 1)"),
)
_CLIP_HIGH = meta("upper clip ε_high (DAPO's clip-higher: 0.28)", check=(lambda x: x >= 0.0, "must be ≥ 0"))
_ESTIMATOR = meta(
    "paper: the stop-gradient estimator, eq. 86/91 (gspo: the eq. 86 control); ppo_clip: the clipped surrogate "
    "min(s·Â, clip(s)·Â), eq. 42 (dfpo: a trust-region variant)",
    choices=ESTIMATORS,
)
_LENGTH_NORM = meta("s = exp(mean_t log r), eq. 44 (True), or Π_t r, eq. 11/31 (False)")


@dataclass(frozen=True)
class ObjectiveParams:
    """Base of the per-objective parameter classes: coerces and checks every field (``__post_init__``)."""

    #: the objective's registered name, for the error messages: ``register`` registers a subclass per
    #: objective that sets it (the class it is given is left as it is)
    objective: ClassVar[str] = "<unregistered>"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, check_param(self.objective, f, getattr(self, f.name)))


def check_param(objective: str, f: dataclasses.Field, value: Any) -> Any:
    """``value`` of parameter field ``f`` of ``objective``, coerced to its type and checked (range, choices).

    The one check of a parameter value: the dataclasses run it on every field, and ``toymodel.theory``'s
    helpers on the values they take one at a time (``check_field``).
    """
    value = _coerce(objective, f, value)
    check, choices = f.metadata.get("check"), f.metadata.get("choices")
    if check is not None:
        ok, why = check
        if isinstance(value, Tensor):
            bad = ~ok(value.detach())
            if bool(bad.any()):
                row = int(bad.nonzero()[0, 0]) if bad.dim() else 0
                shown = float(value.detach().reshape(-1)[row]) if bad.dim() else float(value)
                raise ValueError(
                    f"objective {objective!r} parameter `{f.name}` (one ε per row): {why} in every "
                    f"row, got {shown!r} in row {row}"
                )
        elif not ok(value):
            raise param_error(objective, f.name, value, why)
    if choices is not None:
        valid = choices() if callable(choices) else choices
        if value not in valid:
            raise param_error(objective, f.name, value, f"unknown value; valid: {', '.join(valid)}")
    return value


def check_field(cls: type[ObjectiveParams], name: str, value: Any) -> Any:
    """``check_param`` of the field ``name`` of ``cls`` (a registered class names its objective)."""
    (f,) = (f for f in dataclasses.fields(cls) if f.name == name)
    return check_param(cls.objective, f, value)


def param_error(objective: str, name: str, value: Any, why: str) -> ValueError:
    """The one message of an invalid parameter value (the loss, the configs and the CLI all raise it)."""
    return ValueError(f"objective {objective!r} parameter `{name}`={value!r}: {why}")


def strict_bool(value: Any) -> bool:
    """``value`` if it is a real bool; ``TypeError`` otherwise (no truthiness: ``"false"``, 0, None are refused).

    The one bool coercer of the objective parameters and of ``scaledrun.config``'s fields.
    """
    if not isinstance(value, bool):
        raise TypeError("expected true or false")
    return value


def _coerce(objective: str, f: dataclasses.Field, value: Any) -> Any:
    """The value in the field's type (the type of its default); a float field also takes a (B,) tensor."""
    kind = type(f.default)
    if kind is float:
        if isinstance(value, Tensor) and value.dim() > 0:
            return value
        try:
            return float(value)
        except (TypeError, ValueError):
            raise param_error(objective, f.name, value, "must be a number") from None
    if kind is bool:
        try:
            return strict_bool(value)
        except TypeError as err:
            raise param_error(objective, f.name, value, str(err)) from None
    if kind is str:
        if not isinstance(value, str):
            choices = f.metadata.get("choices")
            valid = f"; valid: {', '.join(choices() if callable(choices) else choices)}" if choices else ""
            raise param_error(objective, f.name, value, f"expected a string{valid}")
        return value
    return value  # pragma: no cover - every field today is a float, bool or str


@dataclass(frozen=True)
class GrpoParams(ObjectiveParams):
    """GRPO's token-level clip (with DAPO's clip-higher)."""

    epsilon_low: float | Tensor = field(default=0.2, metadata=_CLIP_LOW)
    epsilon_high: float | Tensor = field(default=0.2, metadata=_CLIP_HIGH)


@dataclass(frozen=True)
class GrpoSymclipParams(ObjectiveParams):
    """GRPO-fix's symmetric clip(r, 0, 1 + ε) (DFPO App. H eq. 79)."""

    epsilon: float = field(
        default=0.2,
        metadata=meta("the symmetric clip ε of clip(r, 0, 1 + ε)", check=(lambda x: x >= 0.0, "must be ≥ 0")),
    )


@dataclass(frozen=True)
class GspoParams(ObjectiveParams):
    """GSPO's clipped sequence ratio (DFPO eq. 42-44), GSPO's own clip range."""

    epsilon_low: float | Tensor = field(default=3e-4, metadata=_CLIP_LOW)
    epsilon_high: float | Tensor = field(default=4e-4, metadata=_CLIP_HIGH)
    length_norm: bool = field(default=True, metadata=_LENGTH_NORM)
    estimator: str = field(default="ppo_clip", metadata=_ESTIMATOR)


@dataclass(frozen=True)
class DfpoParams(ObjectiveParams):
    """DFPO: GSPO's sign-aware post-clip weight, then a group transform (App. B)."""

    epsilon_low: float | Tensor = field(default=3e-4, metadata=_CLIP_LOW)
    epsilon_high: float | Tensor = field(default=4e-4, metadata=_CLIP_HIGH)
    length_norm: bool = field(default=True, metadata=_LENGTH_NORM)
    transform: str = field(
        default="min_replace",
        metadata=meta(
            "the group transform s̃ = T(s̄) (cancellation.TRANSFORMS, or an ablation of ABLATIONS)",
            choices=lambda: (*TRANSFORMS, *ABLATIONS),
        ),
    )
    estimator: str = field(default="paper", metadata=_ESTIMATOR)
    stop_grad: bool = field(
        default=True, metadata=meta("s̃ a constant in backprop (False: Table 3's ablation, through T and s̄)")
    )


def param_docs(cls: type[ObjectiveParams]) -> dict[str, str]:
    """Each field's one line of documentation."""
    return {f.name: f.metadata["doc"] for f in dataclasses.fields(cls)}
