"""Render time of every app page with its default inputs (``streamlit.testing.v1.AppTest``). Not a test.

    .venv/bin/python benchmarks/app_render.py              # about half a minute on 2 CPU cores
    .venv/bin/python benchmarks/app_render.py --reruns 10

Each page runs once (the first run: ``st.cache_data`` misses and first imports; torch is imported before
any timing), then ``--reruns`` more times with
the same default inputs; it prints the first-run seconds and the median and worst rerun seconds. The
goal (issue 3): every page's script run under 0.5 s after the first. AppTest runs the page script in
this process without a browser, so this is the script's own time (what a user waits for on the server
before the browser draws), not the network or the drawing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

# running as a script puts benchmarks/ on sys.path, not the repository root
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[1]

PAGES = ["shared_prefix", "clip_asymmetry", "transforms", "training_lab", "low_prob", "about"]
GOAL_S = 0.5


def time_page(name: str, reruns: int) -> tuple[float, list[float]]:
    """(first-run seconds, rerun seconds) of ``app/views/<name>.py`` with its default inputs."""
    at = AppTest.from_file(str(ROOT / "app/views" / f"{name}.py"), default_timeout=600)
    t0 = time.perf_counter()
    at.run()
    first = time.perf_counter() - t0
    if at.exception:
        raise SystemExit(f"{name}: the page raised on its first run: {at.exception[0].value}")
    times = []
    for _ in range(reruns):
        t0 = time.perf_counter()
        at.run()
        times.append(time.perf_counter() - t0)
        if at.exception:
            raise SystemExit(f"{name}: the page raised on a rerun: {at.exception[0].value}")
    return first, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reruns", type=int, default=5, help="timed reruns after the first run (default 5)")
    parser.add_argument(
        "--pages", nargs="*", default=PAGES, choices=PAGES, help="pages to time (default all)"
    )
    args = parser.parse_args()
    if args.reruns < 1:
        parser.error("--reruns must be ≥ 1")

    import streamlit
    import torch

    import app.common  # noqa: F401  (sets the app's torch thread count, so the line below shows it)

    print(
        f"streamlit {streamlit.__version__}, torch {torch.__version__} ({torch.get_num_threads()} thread(s), as the app sets)"
    )
    print(
        f"each page: 1 first run, then {args.reruns} reruns with the default inputs (goal: rerun < {GOAL_S} s)\n"
    )
    print(f"  {'page':16s} {'first run':>10s} {'median rerun':>13s} {'worst rerun':>12s}  goal")
    all_met = True
    for name in args.pages:
        first, times = time_page(name, args.reruns)
        median = statistics.median(times)
        met = median < GOAL_S
        all_met &= met
        print(
            f"  {name:16s} {first:9.3f}s {median:12.3f}s {max(times):11.3f}s  {'met' if met else 'MISSED'}",
            flush=True,
        )
    print(f"\n{'every page meets' if all_met else 'NOT every page meets'} the {GOAL_S} s rerun goal (median)")


if __name__ == "__main__":
    main()
