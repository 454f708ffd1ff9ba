"""A learning-rate sweep of the batched toy: one call with a per-seed ``lr`` against one call per rate. Not a test.

    .venv/bin/python benchmarks/toy_lr_sweep.py            # 9 rates × 1,024 seeds, 100 steps: ~2 min on 1 core
    .venv/bin/python benchmarks/toy_lr_sweep.py --quick    # 9 rates × 64 seeds, 20 steps

``toymodel.batched.simulate_seeds`` takes ``lr`` as one value per seed, so a sweep of R rates × S seeds is
one call with R·S seeds (rate-major: seeds ``0..S−1`` at the first rate, then at the second, ...). Both
ways are timed in the same run on ``template_task`` (G = 8, μ = 4 inner epochs, SGD, one group per step,
one mini-batch, the cancellation meter on, ``torch.set_num_threads(1)``), and the results are checked to
agree: each rate's rows of the one call equal that rate's separate call (the largest |difference| over
every key of ``BATCHED_KEYS`` is printed, NaN where both are NaN counts as equal).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

# running as a script puts benchmarks/ on sys.path, not the repository root
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from toymodel.batched import BATCHED_KEYS, simulate_seeds

DEFAULT_LRS = "0.05,0.1,0.2,0.35,0.5,0.7,1.0,1.4,2.0"


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a − b| (inf where exactly one of the two is NaN)."""
    nan_a, nan_b = a.isnan(), b.isnan()
    if bool((nan_a != nan_b).any()):
        return math.inf
    d = (a - b).abs()[~nan_a]
    return float(d.max()) if d.numel() else 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="template_task")
    p.add_argument("--objectives", default="dfpo,gspo", help="comma-separated objectives")
    p.add_argument("--lrs", default=DEFAULT_LRS, help="comma-separated SGD learning rates")
    p.add_argument("--seeds", type=int, default=1024, help="seeds per learning rate")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--quick", action="store_true", help="64 seeds per rate, 20 steps")
    args = p.parse_args()
    if args.quick:
        args.seeds, args.steps = 64, 20
    lrs = [float(x) for x in args.lrs.split(",") if x.strip()]
    names = [o.strip() for o in args.objectives.split(",") if o.strip()]
    torch.set_num_threads(args.threads)
    cfg = dict(steps=args.steps, group_size=8, inner_epochs=4)
    seeds = list(range(args.seeds))
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); {args.scenario}, G=8, 4 inner epochs, "
        f"SGD, {args.steps} steps; {len(lrs)} learning rates × {args.seeds} seeds = {len(lrs) * args.seeds} seeds"
    )
    print(f"learning rates: {', '.join(f'{x:g}' for x in lrs)}")
    print(
        f"{'objective':10s} {'one call s':>11s} {'separate calls s':>17s} {'ratio':>7s} {'max |diff|':>11s}"
    )
    for objective in names:
        simulate_seeds(args.scenario, objective, 8, steps=3)  # warm-up
        per_seed_lr = torch.tensor(lrs, dtype=torch.float64).repeat_interleave(args.seeds)
        t0 = time.perf_counter()
        one = simulate_seeds(args.scenario, objective, seeds * len(lrs), lr=per_seed_lr, **cfg)
        t_one = time.perf_counter() - t0
        t0 = time.perf_counter()
        separate = [simulate_seeds(args.scenario, objective, seeds, lr=lr, **cfg) for lr in lrs]
        t_sep = time.perf_counter() - t0
        worst = max(
            _max_diff(one[k][j * args.seeds : (j + 1) * args.seeds], sep[k])
            for j, sep in enumerate(separate)
            for k in BATCHED_KEYS
        )
        print(f"{objective:10s} {t_one:11.2f} {t_sep:17.2f} {t_sep / t_one:6.2f}× {worst:11.1e}")
        final = one["expected_reward"][:, -1].view(len(lrs), args.seeds).mean(-1)
        print(
            "  mean final expected_reward per rate: "
            + ", ".join(f"{lr:g}: {r:.3f}" for lr, r in zip(lrs, final.tolist(), strict=True))
        )
        if worst > 1e-12:
            raise SystemExit(
                f"{objective}: the one call and the separate calls differ by {worst:.3e} (> 1e-12)"
            )
    print("ratio: the separate calls' seconds over the one call's (> 1: the one call is faster)")


if __name__ == "__main__":
    main()
