"""The shared math of token-gradient cancellation in group-relative RL: pure torch, no I/O.

Modules: ``advantages``, ``aggregation``, ``objectives``, ``params`` (each objective's parameters, declared
once), ``transforms``, ``batching``, ``diagnostics``,
``update`` (the schedule of one RL step and its cancellation meters, shared by the toy and the trainer),
``coupling`` (the cancellation-hypothesis paper's token-level instruments: coupling kernel, masking effect).
Shapes and names follow docs/DESIGN.md ("The data that flows").
"""

from . import batching, coupling, diagnostics, params, update
from .advantages import group_advantages, reweight_advantages
from .aggregation import AGGREGATIONS, aggregate
from .objectives import (
    METRIC_KEYS,
    OBJECTIVES,
    PARAMS,
    compute_loss,
    default_params,
    objective_names,
    params_class,
)
from .transforms import TRANSFORMS, get_transform

__all__ = [
    "AGGREGATIONS",
    "METRIC_KEYS",
    "OBJECTIVES",
    "PARAMS",
    "TRANSFORMS",
    "aggregate",
    "batching",
    "compute_loss",
    "coupling",
    "default_params",
    "diagnostics",
    "get_transform",
    "group_advantages",
    "objective_names",
    "params",
    "params_class",
    "reweight_advantages",
    "update",
]
