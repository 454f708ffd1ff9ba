"""Speed of the tabular simulator: steps per second for every scenario × objective. Not a test.

    .venv/bin/python benchmarks/toy_speed.py            # about a minute on 2 CPU cores
    .venv/bin/python benchmarks/toy_speed.py --steps 100

The goal configuration (the app calls it interactively): ``equivalent_solutions``, G = 8, 4 inner epochs,
500 steps, target < 1 s. Each configuration is timed ``--repeats`` times (best and median wall-clock
seconds; the machine may be shared, so the best is the cleanest measure). ``signal`` is the fraction
of steps that had a non-zero advantage and so ran the backward passes: with plain SGD a step whose
advantages are all 0 has an exactly zero gradient and skips them (``simulate``'s exact shortcut), so
the speed depends on how fast the reward saturates. The ``no shortcut`` line times the goal
configuration with the shortcut off, i.e. every step paying for 4 forward/backward passes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

# running as a script puts benchmarks/ on sys.path, not the repository root
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from toymodel import SCENARIOS, simulate

OBJECTIVES = [
    ("grpo", {}),
    ("grpo_symclip", {}),
    ("gspo", {}),
    ("dfpo min_replace", {"transform": "min_replace"}),
    ("dfpo orth_proj", {"transform": "orth_proj"}),
]


def timed(repeats: int, scenario: str, objective: str, **kw) -> tuple[float, float, float]:
    times = []
    rows: list[dict[str, float]] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        rows = simulate(scenario, objective, **kw)
        times.append(time.perf_counter() - t0)
    signal = sum(r["zero_adv_group_frac"] < 1.0 for r in rows) / len(rows)
    return min(times), statistics.median(times), signal


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (the CLI and the app use 1)"
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; G=8, 4 inner epochs, SGD lr=0.5 (defaults)"
    )
    simulate("equivalent_solutions", "gspo", steps=20)  # warm-up

    print("\ngoal: equivalent_solutions, G=8, 4 inner epochs, 500 steps (target < 1 s)")
    for label, params in OBJECTIVES:
        best, med, signal = timed(args.repeats, "equivalent_solutions", label.split()[0], steps=500, **params)
        print(f"  {label:18s} best {best:6.3f} s   median {med:6.3f} s   signal {signal:4.0%}")
    best, med, signal = timed(
        args.repeats, "equivalent_solutions", "gspo", steps=500, _skip_zero_advantage=False
    )
    print(f"  {'gspo no shortcut':18s} best {best:6.3f} s   median {med:6.3f} s   signal {signal:4.0%}")

    print(f"\nsteps/s per scenario × objective ({args.steps} steps, best of {args.repeats})")
    print(f"  {'scenario':22s} " + " ".join(f"{label:>17s}" for label, _ in OBJECTIVES))
    for name in SCENARIOS:
        cells = []
        for label, params in OBJECTIVES:
            best, _, signal = timed(args.repeats, name, label.split()[0], steps=args.steps, **params)
            cells.append(f"{args.steps / best:8.0f} ({signal:4.0%})")
        print(f"  {name:22s} " + " ".join(f"{c:>17s}" for c in cells))
    print("  (in parentheses: the fraction of steps with a learning signal)")


if __name__ == "__main__":
    main()
