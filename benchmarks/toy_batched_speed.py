"""Speed of the batched toy against the one-seed loop, in the same run. Not a test.

    .venv/bin/python benchmarks/toy_batched_speed.py                  # about 2 minutes on 2 CPU cores
    .venv/bin/python benchmarks/toy_batched_speed.py --objectives dfpo --threads 2

Target: 1,024 seeds × 500 steps of ``template_task`` (G = 8, μ = 4 inner epochs, SGD lr 0.5, one group
per step, one mini-batch) in under 10 s, i.e. at least 100× the seed-steps per second of the loop.

The loop (``toymodel.simulate``, one seed after the other) is timed on ``--loop-seeds`` seeds with the
same number of steps, and its seed-steps per second are extrapolated to the batched run's seeds: both
skip the steps whose advantages are all 0 (the exact shortcut), and how many there are depends on how
far a run has saturated, so the loop is timed over the whole run length, not over a few first steps.
Each configuration is timed at every ``--threads`` setting (torch intra-op threads), batched runs
``--repeats`` times (best wall-clock seconds; the machine may be shared).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# running as a script puts benchmarks/ on sys.path, not the repository root
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from toymodel import simulate
from toymodel.batched import simulate_seeds

OBJECTIVES = {
    "grpo": {},
    "gspo": {},
    "dfpo": {},  # Min-Replace, the paper's estimator, GSPO's ε
    "dfpo_orth_proj_pos": {"transform": "orth_proj_pos"},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="template_task")
    p.add_argument("--seeds", type=int, default=1024)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--loop-seeds", type=int, default=8, help="seeds the one-seed loop is timed on")
    p.add_argument("--objectives", default="grpo,gspo,dfpo", help=f"comma-separated: {', '.join(OBJECTIVES)}")
    p.add_argument("--threads", default="1,2", help="comma-separated torch thread counts to time")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--no-residuals", action="store_true", help="batched runs skip the cancellation meter")
    args = p.parse_args()
    names = [o.strip() for o in args.objectives.split(",") if o.strip()]
    unknown = [o for o in names if o not in OBJECTIVES]
    if unknown:
        p.error(f"unknown objective(s) {unknown}; valid: {', '.join(OBJECTIVES)}")
    threads = [int(t) for t in args.threads.split(",")]
    cfg = dict(steps=args.steps, group_size=8, inner_epochs=4)
    print(
        f"torch {torch.__version__}; {args.scenario}, G=8, 4 inner epochs, SGD lr=0.5, {args.steps} steps; "
        f"batched: {args.seeds} seeds (residuals {'off' if args.no_residuals else 'on'}); "
        f"loop: {args.loop_seeds} seeds, extrapolated per seed-step"
    )
    print(
        f"{'objective':20s} {'threads':>7s} {'loop s/seed-step':>17s} {'loop seed-steps/s':>18s} "
        f"{'batched s':>10s} {'batched seed-steps/s':>21s} {'ratio':>7s} {'loop est. s':>12s}"
    )
    for name in names:
        objective = name.split("_")[0]
        params = OBJECTIVES[name]
        for t in threads:
            torch.set_num_threads(t)
            simulate(args.scenario, objective, steps=5, **params)  # warm-up
            simulate_seeds(args.scenario, objective, 8, steps=5, **params)
            t0 = time.perf_counter()
            for seed in range(args.loop_seeds):
                simulate(args.scenario, objective, seed=seed, **cfg, **params)
            loop_rate = args.loop_seeds * args.steps / (time.perf_counter() - t0)
            best = float("inf")
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                simulate_seeds(
                    args.scenario, objective, args.seeds, residuals=not args.no_residuals, **cfg, **params
                )
                best = min(best, time.perf_counter() - t0)
            rate = args.seeds * args.steps / best
            print(
                f"{name:20s} {t:7d} {1 / loop_rate:17.2e} {loop_rate:18.0f} {best:10.2f} {rate:21.0f} "
                f"{rate / loop_rate:6.0f}× {args.seeds * args.steps / loop_rate:12.0f}"
            )
    print(
        "ratio: batched seed-steps/s over the loop's at the same thread count; 'loop est. s': the loop's "
        "time for the batched run's seeds × steps, extrapolated"
    )


if __name__ == "__main__":
    main()
