"""What one rerun of the Training lab costs, estimated from its inputs before anything runs.

The page (``app/views/training_lab.py``) adds up, over the runs a rerun still has to compute, the seconds
that ``batched_seconds`` (one ``toymodel.batched.simulate_seeds`` call: every seed of one objective) or
``simulate_seconds`` (one ``toymodel.simulate`` run: one seed of one objective) predicts, plus
``drawing_seconds`` (turning every seed's rows into the summary table and the curves, done on every
rerun); above ``CONFIRM_ABOVE_S`` it shows the estimate and waits for the user to confirm.

Each cost is a sum of per-unit costs times counts of the work the simulator does (a linear model):

- batched, per objective: ``steps × inner × mini-batches`` optimiser steps (each a fixed number of torch
  calls on every seed at once), ``steps × inner × seeds × groups × G`` trajectories scored,
  ``steps × inner × mini-batches × seeds × groups`` cancellation-meter event tables (one per mini-batch, one
  row per seed and group), ``steps × inner × seeds`` per-seed shuffles (with more than one mini-batch)
  and ``steps × seeds`` exact statistics (every trajectory of every seed's policy, once per step);
- ``simulate``, per seed and objective: ``steps`` (sampling, exact statistics, metrics),
  ``steps × inner × mini-batches`` optimiser steps and ``steps × inner × groups × G`` trajectories;
- drawing: ``objectives × seeds × steps`` rows.

The per-unit costs (``UNIT_COSTS``) were measured on this project's development machine (2 CPU cores
shared with other work, torch on one thread as the app runs it) on ``template_task`` (the default
scenario and the largest: 729 trajectories of 7 tokens; the other scenarios cost less, so the estimate
errs high there) with GSPO (it keeps every seed moving, where DFPO's seeds that have converged stop
costing anything, so the estimate errs high for objectives that learn fast), by::

    python -m app.lab_cost

which times ``MEASURE_POINTS`` and prints the non-negative least-squares fit of the units to the times.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

#: a rerun estimated above this many seconds waits for the user's confirmation
CONFIRM_ABOVE_S = 10.0

#: seconds per unit, printed by ``python -m app.lab_cost`` (see the module docstring) on the development
#: machine (2 cores shared with other work, load average about 2). Every point it times was fitted within
#: 25 %. Checked against whole reruns timed by hand: the sliders at their maxima (3 default objectives ×
#: 256 seeds × 100 steps × 16 inner epochs × 16 mini-batches of 16 groups × G = 32, batched) estimate
#: 337 s and took 164 s (GSPO 123 s, the eq. 86 control 14 s, DFPO Min-Replace 16 s: the fast learners'
#: seeds stop moving after a few steps); the defaults estimate 1 s and took 3 s (a fresh process's first
#: rerun); the defaults with "Objective metrics" (48 ``simulate`` runs) estimate 16 s and took 13 s.
UNIT_COSTS: dict[str, float] = {
    # simulate_seeds, per objective
    "batched/optimiser_step": 5.81e-4,
    "batched/trajectory": 3.45e-7,
    "batched/event_table": 1.75e-7,
    "batched/shuffle": 1.57e-5,
    "batched/exact_stats": 7.67e-6,
    # simulate, per seed and objective
    "simulate/step": 8.91e-4,
    "simulate/optimiser_step": 5.95e-4,
    "simulate/trajectory": 1.3e-6,
    # the page, per row drawn (objective × seed × step)
    "draw/row": 1.47e-5,
}


def batched_units(
    seeds: int, steps: int, group_size: int, inner_epochs: int, num_groups: int, num_minibatches: int
) -> dict[str, float]:
    """The counts of ``UNIT_COSTS``' ``batched/*`` units in one ``simulate_seeds`` call."""
    updates = steps * inner_epochs
    return {
        "batched/optimiser_step": updates * num_minibatches,
        "batched/trajectory": updates * seeds * num_groups * group_size,
        "batched/event_table": updates * num_minibatches * seeds * num_groups,
        "batched/shuffle": updates * seeds if num_minibatches > 1 else 0.0,
        "batched/exact_stats": steps * seeds,
    }


def simulate_units(
    steps: int, group_size: int, inner_epochs: int, num_groups: int, num_minibatches: int
) -> dict[str, float]:
    """The counts of ``UNIT_COSTS``' ``simulate/*`` units in one ``simulate`` run (one seed)."""
    return {
        "simulate/step": steps,
        "simulate/optimiser_step": steps * inner_epochs * num_minibatches,
        "simulate/trajectory": steps * inner_epochs * num_groups * group_size,
    }


def _seconds(units: dict[str, float], costs: dict[str, float] | None = None) -> float:
    costs = UNIT_COSTS if costs is None else costs
    return sum(n * costs[k] for k, n in units.items())


def batched_seconds(
    seeds: int, steps: int, group_size: int, inner_epochs: int, num_groups: int, num_minibatches: int
) -> float:
    """Estimated seconds of one ``simulate_seeds`` call (all seeds of one objective)."""
    return _seconds(batched_units(seeds, steps, group_size, inner_epochs, num_groups, num_minibatches))


def simulate_seconds(
    steps: int, group_size: int, inner_epochs: int, num_groups: int, num_minibatches: int
) -> float:
    """Estimated seconds of one ``simulate`` run (one seed of one objective)."""
    return _seconds(simulate_units(steps, group_size, inner_epochs, num_groups, num_minibatches))


def drawing_seconds(objectives: int, seeds: int, steps: int) -> float:
    """Estimated seconds of turning every seed's rows into the table and the curves (every rerun)."""
    return objectives * seeds * steps * UNIT_COSTS["draw/row"]


#: (seeds, steps, G, inner epochs, groups, mini-batches) timed by ``measure``: each factor varied alone
#: from the page's defaults (16 seeds of 100 steps, G = 8, 4 inner epochs, 1 group, 1 mini-batch), and
#: some together up to the sliders' maxima
MEASURE_POINTS: tuple[tuple[int, int, int, int, int, int], ...] = (
    (16, 100, 8, 4, 1, 1),
    (256, 100, 8, 4, 1, 1),
    (16, 100, 32, 4, 1, 1),
    (16, 100, 8, 16, 1, 1),
    (16, 100, 8, 4, 16, 1),
    (16, 60, 8, 4, 16, 16),
    (64, 40, 8, 4, 16, 4),
    (256, 10, 32, 16, 16, 16),
    (256, 10, 8, 4, 16, 16),
)


def _nnls(rows: list[list[float]], times: list[float]) -> list[float]:
    """Non-negative least squares on the relative error (each row and time divided by the time): least
    squares, then the units with a negative cost dropped (cost 0) and the rest refitted, until none is."""
    import numpy as np

    a = np.array(rows, dtype=float) / np.array(times)[:, None]
    b = np.ones(len(times))
    free = np.ones(a.shape[1], dtype=bool)
    x = np.zeros(a.shape[1])
    while free.any():
        x[:] = 0.0
        x[free] = np.linalg.lstsq(a[:, free], b, rcond=None)[0]
        if (x >= 0).all():
            break
        free &= x > 0
    return x.tolist()


def _timed(fn: Any, *args: Any, **kwargs: Any) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def measure(scenario: str = "template_task", objective: str = "gspo") -> dict[str, float]:
    """Time ``simulate_seeds``, ``simulate`` and the page's drawing at ``MEASURE_POINTS`` and fit
    ``UNIT_COSTS`` to the times (printing each point's time and its fitted estimate)."""
    import torch
    from streamlit.testing.v1 import AppTest

    from toymodel import simulate
    from toymodel.batched import simulate_seeds

    torch.set_num_threads(1)  # as the app (app/common.py)
    simulate_seeds(scenario, objective, 2, steps=2, num_groups=2, num_minibatches=2)  # warm-up, not timed
    simulate(scenario, objective, steps=2, num_groups=2, num_minibatches=2)
    costs: dict[str, float] = {}
    for path in ("batched", "simulate"):
        rows, times = [], []
        for seeds, steps, g, inner, ng, mb in MEASURE_POINTS:
            args = {
                "steps": steps,
                "group_size": g,
                "inner_epochs": inner,
                "num_groups": ng,
                "num_minibatches": mb,
            }
            if path == "batched":
                t = _timed(simulate_seeds, scenario, objective, seeds, **args)
                units = batched_units(seeds, **args)
            else:
                steps_s = max(1, steps // 4)  # one seed: a quarter of the steps is plenty
                args["steps"] = steps_s
                t = _timed(simulate, scenario, objective, seed=0, **args)
                units = simulate_units(**args)
            keys = list(units)
            rows.append([units[k] for k in keys])
            times.append(t)
        fit = dict(zip(keys, _nnls(rows, times), strict=True))
        costs.update(fit)
        for point, row, t in zip(MEASURE_POINTS, rows, times, strict=True):
            est = sum(n * fit[k] for k, n in zip(keys, row, strict=True))
            print(f"{path:8s} {point}: measured {t:7.3f} s, fitted {est:7.3f} s")
    # drawing: a rerun of the page whose runs are cached (the defaults but 256 seeds), per row drawn
    page = AppTest.from_file(str(Path(__file__).parent / "views/training_lab.py"), default_timeout=600)
    page.session_state["seeds"] = 256
    page.run()
    start = time.perf_counter()
    page.run()
    costs["draw/row"] = (time.perf_counter() - start) / (3 * 256 * 100)
    print(f"drawing: {costs['draw/row'] * 1e6:.2f} µs per row (a cached rerun of 3 objectives × 256 seeds)")
    print("UNIT_COSTS = {")
    for k, v in costs.items():
        print(f'    "{k}": {v:.3g},')
    print("}")
    return costs


def format_seconds(seconds: float) -> str:
    """``about 40 s`` / ``about 3 min``: a rounded estimate, never below 1 s."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    return f"{math.ceil(seconds / 60)} min"


if __name__ == "__main__":
    measure()
