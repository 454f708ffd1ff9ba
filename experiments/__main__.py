"""``python -m experiments``: run the studies and write the report (``make experiments`` calls this).

    python -m experiments                 # everything: toy studies + language-model sweep, then the report
    python -m experiments --quick         # the smallest slice of each (a few minutes), its own folder
    python -m experiments --only toy      # only the toy studies (or: --only lm, the language-model power study)
    python -m experiments --only coupling # the token-level instruments (cancellation hypothesis), ~5 min
    python -m experiments --only lm-grid  # the old five-seed language-model grid (not part of the default run)
    python -m experiments --report-only   # rebuild the report from the saved results, run nothing

Full mode writes the per-study results (JSON) to ``experiments/results/``, the report to
``experiments/REPORT.md`` and its figures to ``experiments/figures/``; the language-model runs are normal
run folders under ``runs/experiments/`` (the app's Runs page opens them). Quick mode writes everything
under ``runs/experiments-quick/`` so it never overwrites the full report. Both are resumable: a toy
study is re-run (it takes seconds to minutes) but a finished language-model run is skipped, so an
interrupted ``make experiments`` continues where it stopped.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from .study import StudyResult

REPO = Path(__file__).resolve().parents[1]
PARTS = ("toy", "lm", "lm-residual", "coupling", "lm-grid")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m experiments",
        description=__doc__.split("\n")[0],
        epilog=__doc__.split("\n", 1)[1].replace("``", "`"),  # the commands and where each writes
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--quick", action="store_true", help="the smallest slice of every study (a few minutes)")
    ap.add_argument(
        "--only",
        choices=PARTS,
        help="run only the toy studies, only the language-model power study (lm), only the language-model "
        "study where the eq. 86 control's residual is large (lm-residual), only the token-level "
        "instruments (coupling), or the old five-seed language-model grid (lm-grid, run only when named)",
    )
    ap.add_argument(
        "--report-only", action="store_true", help="rebuild the report from saved results; run nothing"
    )
    ap.add_argument(
        "--out",
        type=Path,
        help="results folder (default: experiments/results, quick: runs/experiments-quick)",
    )
    ap.add_argument(
        "--report", type=Path, help="report path (default: experiments/REPORT.md, quick: <out>/REPORT.md)"
    )
    ap.add_argument(
        "--runs", type=Path, help="language-model run folders (default: runs/experiments[-quick])"
    )
    ap.add_argument(
        "--model", help="the language model to train (default: the tiny Qwen3 built for the task)"
    )
    ap.add_argument(
        "--jobs", type=int, default=None, help="language-model runs in parallel (default: the sweep's)"
    )
    ap.add_argument("--no-png", action="store_true", help="write the figures as HTML only")
    return ap


def _load(out: Path) -> list[StudyResult]:
    """The saved studies in ``out``: toy studies first, then language-model ones, each in file-name order."""
    files = sorted(
        [*out.glob("*.json"), *out.glob("*.json.gz")], key=lambda p: (not p.name.startswith("toy_"), p.name)
    )
    return [StudyResult.load(f) for f in files]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        _parser().error(f"--jobs must be ≥ 1, got {args.jobs}")
    quick_root = REPO / "runs" / "experiments-quick"
    out = args.out or (quick_root / "results" if args.quick else REPO / "experiments" / "results")
    report = args.report or (out.parent / "REPORT.md" if args.quick else REPO / "experiments" / "REPORT.md")
    runs = args.runs or (quick_root / "lm" if args.quick else REPO / "runs" / "experiments")
    started = time.perf_counter()

    if not args.report_only:
        out.mkdir(parents=True, exist_ok=True)
        if args.only in (None, "toy"):
            from .toy_studies import run_toy

            print(f"== toy studies ({'quick' if args.quick else 'full'}) -> {out}", flush=True)
            run_toy(out, quick=args.quick)  # saves each study's blocks as it finishes them
        kw = {} if args.jobs is None else {"jobs": args.jobs}
        if args.only in (None, "lm"):
            from .lm_power import run_power
            from .toy import result_path

            print(
                f"== language-model power study ({'quick' if args.quick else 'full'}) -> {runs / 'power'}",
                flush=True,
            )
            for study in run_power(runs / "power", quick=args.quick, model=args.model, **kw):
                study.save(result_path(out, study.name, study.block))
        if args.only in (None, "lm-residual"):
            from .lm_residual import run_residual
            from .toy import result_path

            print(
                f"== language-model residual study ({'quick' if args.quick else 'full'}) -> {runs / 'residual'}",
                flush=True,
            )
            for study in run_residual(runs / "residual", quick=args.quick, model=args.model, **kw):
                study.save(result_path(out, study.name, study.block))
        if args.only in (None, "coupling"):
            from .token_level import run_token_level

            print(f"== token-level instruments ({'quick' if args.quick else 'full'}) -> {out}", flush=True)
            run_token_level(out, runs / "power", quick=args.quick, model=args.model)
        if args.only == "lm-grid":
            from .lm import run_lm

            print(f"== language-model grid ({'quick' if args.quick else 'full'}) -> {runs}", flush=True)
            for study in run_lm(runs, quick=args.quick, model=args.model, **kw):
                study.save(out / f"{study.name}.json.gz")

    studies = _load(out)
    from .token_level import load as load_token_level
    from .token_level import markdown as token_level_markdown

    token_level = load_token_level(out)
    if not studies and token_level:  # only the token-level part has run: its section is the report
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(
            "# Cancellation Lab: experiment report (token-level section only)\n\n"
            f"No study results in {out} yet; `python -m experiments{' --quick' if args.quick else ''}` adds them.\n\n"
            + token_level_markdown(token_level)
        )
        print(f"report: {report} (the token-level section only, {time.perf_counter() - started:.0f} s)")
        return 0
    if not studies:
        print(
            f"error: no saved results in {out}; run `python -m experiments{' --quick' if args.quick else ''}` first"
        )
        return 2
    given = sys.argv[1:] if argv is None else argv
    command = " ".join(["python -m experiments", shlex.join(given)]).strip()
    from .report import write_report

    write_report(
        studies, report, png=not args.no_png, command=command, mode="quick" if args.quick else "full",
        appendix=token_level_markdown(token_level) if token_level else "",
    )  # fmt: skip
    print(f"report: {report} ({len(studies)} studies, {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
