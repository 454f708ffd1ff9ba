"""Render time of every app page with its default inputs (``streamlit.testing.v1.AppTest``). Not a test.

    .venv/bin/python benchmarks/app_render.py              # about 20 s on 2 CPU cores
    .venv/bin/python benchmarks/app_render.py --reruns 10
    .venv/bin/python benchmarks/app_render.py --pages runs --runs-dir runs   # the Runs page on your runs

Each page runs once (the first run: ``st.cache_data`` misses and first imports; torch is imported before
any timing), then ``--reruns`` more times with the same default inputs; it prints the first-run seconds
and the median and worst rerun seconds. The goal: every page's script run under 0.5 s after
the first. AppTest runs the page script in this process without a browser, so this is the script's own
time (what a user waits for on the server before the browser draws), not the network or the drawing.

The Runs page needs run folders. ``--runs-dir DIR`` times it on yours; without it the script makes a
temporary folder with two real runs of ``scaledrun.train`` (GRPO and DFPO Orth-Proj, ``--run-steps``
steps each, an evaluation every 10 steps) on the README's tiny model ``artifacts/tiny-qwen3`` when it
exists, else on one it builds there first (``python -m scaledrun.tiny``'s warm start); that set-up is
printed, not timed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# running as a script puts benchmarks/ on sys.path, not the repository root
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[1]

PAGES = [
    "shared_prefix",
    "clip_asymmetry",
    "transforms",
    "training_lab",
    "low_prob",
    "token_coupling",
    "runs",
    "about",
]
GOAL_S = 0.5
#: the README's tiny model (``python -m scaledrun.tiny --out artifacts/tiny-qwen3``)
TINY_MODEL = ROOT / "artifacts" / "tiny-qwen3"
#: the environment variable the Runs page's folder input defaults to (``app.views.runs.RUNS_DIR_ENV``; a page
#: script is not imported here, since importing it would run it)
RUNS_DIR_ENV = "CANCELLATION_RUNS_DIR"
#: the runs the Runs page is timed on when no ``--runs-dir`` is given: folder name -> RunConfig overrides
BENCH_RUNS = {
    "grpo": {"objective": "grpo"},
    "dfpo_orth_proj": {"objective": "dfpo", "transform": "orth_proj"},
}


def make_runs(root: Path, steps: int) -> Path:
    """Two real ``scaledrun.train`` runs of ``steps`` steps in ``root/runs`` (the tiny model, built if missing)."""
    from scaledrun.config import RunConfig
    from scaledrun.tiny import DEFAULT_STOP_ACCURACY, DEFAULT_WARM_START_STEPS, build_tiny
    from scaledrun.train import train

    t0 = time.perf_counter()
    model = TINY_MODEL
    if not (model / "config.json").is_file():
        print(f"building the tiny model in {model} (python -m scaledrun.tiny, once)", flush=True)
        build_tiny(
            model, "arithmetic", seed=0, warm_start_steps=DEFAULT_WARM_START_STEPS,
            stop_accuracy=DEFAULT_STOP_ACCURACY,
        )  # fmt: skip
    runs = root / "runs"
    for name, params in BENCH_RUNS.items():
        cfg = RunConfig(
            model=str(model), steps=steps, eval_every=10, num_eval=20, save_every=0,
            output_dir=str(runs / name), **params,
        )  # fmt: skip
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            train(cfg)
    print(
        f"Runs page: {len(BENCH_RUNS)} runs × {steps} steps of the tiny model in {runs} "
        f"(set-up {time.perf_counter() - t0:.0f} s, not timed)",
        flush=True,
    )
    return runs


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
    parser.add_argument(
        "--runs-dir",
        help="folder of run folders for the Runs page (default: two short runs made in a temp folder)",
    )
    parser.add_argument(
        "--run-steps", type=int, default=40, help="steps of each run made for the Runs page (default 40)"
    )
    args = parser.parse_args()
    if args.reruns < 1:
        parser.error("--reruns must be ≥ 1")
    if args.run_steps < 1:
        parser.error("--run-steps must be ≥ 1")
    if args.runs_dir is not None and not Path(args.runs_dir).is_dir():
        parser.error(f"--runs-dir {args.runs_dir} is not a folder")

    import streamlit
    import torch

    import app.common  # noqa: F401  (sets the app's torch thread count, so the line below shows it)

    # AppTest runs pages in this thread: streamlit's "missing ScriptRunContext" notes are noise here
    # (a filter: streamlit resets its loggers' levels when AppTest sets its config)
    logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").addFilter(
        lambda record: "missing ScriptRunContext" not in record.getMessage()
    )

    print(
        f"streamlit {streamlit.__version__}, torch {torch.__version__} ({torch.get_num_threads()} thread(s), as the app sets)"
    )
    print(
        f"each page: 1 first run, then {args.reruns} reruns with the default inputs (goal: rerun < {GOAL_S} s)\n"
    )
    with tempfile.TemporaryDirectory(prefix="app_render_") as tmp:
        if "runs" in args.pages:
            runs_dir = Path(args.runs_dir) if args.runs_dir else make_runs(Path(tmp), args.run_steps)
            os.environ[RUNS_DIR_ENV] = str(runs_dir)  # the Runs page's folder input defaults to it
            print(f"Runs page folder: {runs_dir}\n")
        all_met = time_pages(args.pages, args.reruns)
    print(f"\n{'every page meets' if all_met else 'NOT every page meets'} the {GOAL_S} s rerun goal (median)")


def time_pages(pages: list[str], reruns: int) -> bool:
    """Print one line per page; True when every page's median rerun meets the goal."""
    print(f"  {'page':16s} {'first run':>10s} {'median rerun':>13s} {'worst rerun':>12s}  goal")
    all_met = True
    for name in pages:
        first, times = time_page(name, reruns)
        median = statistics.median(times)
        met = median < GOAL_S
        all_met &= met
        print(
            f"  {name:16s} {first:9.3f}s {median:12.3f}s {max(times):11.3f}s  {'met' if met else 'MISSED'}",
            flush=True,
        )
    return all_met


if __name__ == "__main__":
    main()
