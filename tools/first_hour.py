"""The README's first hour, measured as several machines would run it: ``docs/first-hour.md``.

    python -m tools.first_hour                  # 3 instruction sets × 3 seeds × GRPO / GRPO-fix
    python -m tools.first_hour --collapse       # and the collapse study (the old 300-step model)
    python -m tools.first_hour --report-only    # rewrite docs/first-hour.md from the finished runs

The first hour builds the tiny model (``python -m scaledrun.tiny --out artifacts/tiny-qwen3``: a warm
start stopped at greedy accuracy 0.5) and trains GRPO and GRPO-fix with
``scaledrun/configs/offpolicy.yaml`` (200 steps). What a newcomer sees depends on the machine: its CPU's
kernels change the warm-started model and every token it samples. This command runs that protocol under
each instruction set of ``tools.machines`` (this CPU's own, AVX2, no SIMD: three "machines") and
with several training seeds, each as its own subprocess, and writes per run what the README quotes
(reward, held-out greedy accuracy, clip fractions, truncation, length, entropy) with each measure's
range over runs. The README's first-hour numbers are these ranges (``tests/test_readme.py`` checks
them against ``docs/first-hour.json``). Finished runs are kept (the command resumes); a run is
flagged ``collapsed`` when its last held-out greedy accuracy is below ``COLLAPSE_ACCURACY`` or more
than ``COLLAPSE_TRUNCATED`` of its last 10 steps' completions are truncated (the drift to long, cut-off
completions that a collapse starts with).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scaledrun.runlog import read_metrics

from .machines import INSTRUCTION_SETS

REPO = Path(__file__).resolve().parents[1]
CONFIG = "scaledrun/configs/offpolicy.yaml"
OBJECTIVES = ("grpo", "grpo_symclip")
SEEDS = (0, 1, 2)
STEPS = 200
COLLAPSE_ACCURACY = 0.1
#: ... or more than this fraction of its last 10 steps' completions hit max_new_tokens
COLLAPSE_TRUNCATED = 0.25
OUT_MD = REPO / "docs" / "first-hour.md"
#: the measures of one run: name -> (label, how it is read from metrics.jsonl)
MEASURES = {
    "reward_first_quarter": "reward, mean of the first 50 steps",
    "reward_last10": "reward, mean of the last 10 steps (the run's last line)",
    "eval_first": "held-out greedy accuracy, first eval (step 20)",
    "eval_last": "held-out greedy accuracy, last eval (step 200)",
    "clip_low_frac": "clip/low_frac, mean over the steps",
    "clip_high_frac": "clip/high_frac, mean over the steps",
    "truncated_last10": "truncated fraction, last 10 steps",
    "length_last10": "completion length (tokens), last 10 steps",
    "entropy_first": "entropy, step 1",
    "entropy_last10": "entropy, last 10 steps",
}


def _env(isa: str) -> dict[str, str]:
    # one thread per run: the tiny model is fastest so, and --jobs runs several side by side
    return {**os.environ, **INSTRUCTION_SETS[isa], "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}


def _run(cmd: list[str], isa: str, log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {isa}: {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.run(cmd, cwd=REPO, env=_env(isa), stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"failed ({isa}): {' '.join(cmd)}; see {log}")


#: The collapse study (``--collapse``): the old default model, 300 fixed warm-start steps (on an AVX-512
#: CPU greedy accuracy ~0.8, so most groups are all-correct), GRPO with each truncation policy.
COLLAPSE_TINY_ARGS = ("--warm-start-steps", "300", "--stop-at-accuracy", "none")
TRUNCATIONS = ("mask", "failure_reward")
COLLAPSE_SEEDS = (0, 1, 2, 3)


def _jobs(
    work: Path, isas: list[str], seeds: list[int], collapse: bool
) -> list[tuple[str, Path, Path, list[str]]]:
    """(instruction set, model folder, run folder, trainer arguments) of every run of the study."""
    jobs = [
        (
            isa,
            work / isa / "model",
            work / isa / f"{objective}-s{seed}",
            ["--objective", objective, "--seed", str(seed)],
        )
        for isa in isas
        for seed in seeds
        for objective in OBJECTIVES
    ]
    if collapse:
        jobs += [
            ("native", work / "collapse" / "model", work / "collapse" / f"grpo-{trunc}-s{seed}",
             ["--objective", "grpo", "--truncation", trunc, "--seed", str(seed)])
            for seed in COLLAPSE_SEEDS
            for trunc in TRUNCATIONS
        ]  # fmt: skip
    return jobs


def run_all(work: Path, isas: list[str], seeds: list[int], jobs: int = 1, collapse: bool = False) -> None:
    """Build each model (the README's command), then train every run not finished yet, ``jobs`` at a time."""
    from concurrent.futures import ThreadPoolExecutor

    def build(isa: str, model: Path) -> None:
        if not (model / "config.json").is_file():
            extra = list(COLLAPSE_TINY_ARGS) if model.parent.name == "collapse" else []
            print(f"[{isa}] python -m scaledrun.tiny --out {model} {' '.join(extra)}", flush=True)
            log = model.parent / ("tiny.log" if model.name == "model" else f"tiny-{isa}.log")
            _run([sys.executable, "-m", "scaledrun.tiny", "--out", str(model), *extra], isa, log)

    def train(isa: str, model: Path, out: Path, args: list[str]) -> None:
        print(f"[{isa}] {out.name}", flush=True)
        cmd = [
            sys.executable, "-m", "scaledrun.train", "--config", CONFIG, *args, "--model", str(model),
            "--output_dir", str(out), "--overwrite", "true",
        ]  # fmt: skip
        _run(cmd, isa, out.parent / f"train-{out.name}.log")

    todo = _jobs(work, isas, seeds, collapse)
    models = sorted({(isa, model) for isa, model, _, _ in todo})
    if collapse:  # the old model on the other instruction sets too: its accuracy is the machine's doing
        models += [(isa, work / "collapse" / f"model-{isa}") for isa in isas if isa != "native"]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(lambda m: build(*m), models))
        list(pool.map(lambda job: train(*job), [j for j in todo if len(read_metrics(j[2])) < STEPS]))


def summarize_run(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The ``MEASURES`` of one finished run's rows."""

    def mean(key: str, part: list[dict[str, Any]]) -> float:
        return statistics.fmean(r[key] for r in part if math.isfinite(r.get(key, math.nan)))

    evals = [
        r["eval/greedy_accuracy"] for r in rows if math.isfinite(r.get("eval/greedy_accuracy", math.nan))
    ]
    last = rows[-10:]
    out = {
        "reward_first_quarter": mean("reward/mean", rows[: len(rows) // 4]),
        "reward_last10": mean("reward/mean", last),
        "eval_first": evals[0],
        "eval_last": evals[-1],
        "clip_low_frac": mean("clip/low_frac", rows),
        "clip_high_frac": mean("clip/high_frac", rows),
        "truncated_last10": mean("truncated_frac", last),
        "length_last10": mean("completion_length", last),
        "entropy_first": rows[0]["entropy"],
        "entropy_last10": mean("entropy", last),
    }
    out["collapsed"] = float(
        out["eval_last"] < COLLAPSE_ACCURACY or out["truncated_last10"] > COLLAPSE_TRUNCATED
    )
    return out


def collect(work: Path, isas: list[str], seeds: list[int]) -> dict[str, Any]:
    """Every finished run's measures, each model's warm start, and each measure's range per objective."""
    models, runs = {}, []
    for isa in isas:
        rec = json.loads((work / isa / "model" / "warm_start.json").read_text())
        models[isa] = {
            "steps": len(rec["losses"]),
            "accuracy": rec["accuracy_after"],
            "seconds": rec.get("seconds"),
        }
        for seed in seeds:
            for objective in OBJECTIVES:
                rows = read_metrics(work / isa / f"{objective}-s{seed}")
                if len(rows) >= STEPS:
                    seconds = sum(r.get("time/step_s") or 0.0 for r in rows)
                    runs.append(
                        {
                            "isa": isa,
                            "seed": seed,
                            "objective": objective,
                            "seconds": seconds,
                            **summarize_run(rows),
                        }
                    )
    ranges = {
        objective: {
            key: [min(r[key] for r in runs if r["objective"] == objective),
                  max(r[key] for r in runs if r["objective"] == objective)]
            for key in [*MEASURES, "collapsed"]
        }
        for objective in OBJECTIVES
        if any(r["objective"] == objective for r in runs)
    }  # fmt: skip
    # paired by (instruction set, seed): how often GRPO-fix's measure is below GRPO's
    by = {(r["isa"], r["seed"], r["objective"]): r for r in runs}
    pairs = [
        (by[(i, s, "grpo")], by[(i, s, "grpo_symclip")])
        for i, s, o in by
        if o == "grpo" and (i, s, "grpo_symclip") in by
    ]
    below = {key: sum(fix[key] < grpo[key] for grpo, fix in pairs) for key in MEASURES}
    diff = {
        key: [min(f[key] - g[key] for g, f in pairs), max(f[key] - g[key] for g, f in pairs)]
        for key in MEASURES
        if pairs
    }
    acc = [m["accuracy"] for m in models.values()]
    collapse_model = work / "collapse" / "model" / "warm_start.json"
    collapse = None
    if collapse_model.is_file():
        rec = json.loads(collapse_model.read_text())
        done = [
            (t, s, read_metrics(work / "collapse" / f"grpo-{t}-s{s}"))
            for s in COLLAPSE_SEEDS
            for t in TRUNCATIONS
        ]
        old = {"native": rec}
        for isa in isas:
            path = work / "collapse" / f"model-{isa}" / "warm_start.json"
            if isa != "native" and path.is_file():
                old[isa] = json.loads(path.read_text())
        collapse = {
            "model": {"steps": len(rec["losses"]), "accuracy": rec["accuracy_after"]},
            "model_accuracy": {isa: r["accuracy_after"] for isa, r in old.items()},
            "runs": [
                {"truncation": t, "seed": s, **summarize_run(rows),
                 "no_update_steps": int(sum(r.get("truncation/no_update") == 1.0 for r in rows))}
                for t, s, rows in done
                if len(rows) >= STEPS
            ],
        }  # fmt: skip
    steps = [m["steps"] for m in models.values()]
    return {
        "models": models, "runs": runs, "ranges": ranges, "collapse": collapse, "pairs": len(pairs), "symclip_below_grpo": below, "symclip_minus_grpo": diff,
        "model_ranges": {
            "accuracy": [min(acc), max(acc)], "steps": [min(steps), max(steps)],
            "seconds": [min(m["seconds"] or math.nan for m in models.values()),
                        max(m["seconds"] or math.nan for m in models.values())],
        },
        "run_seconds": [min(r["seconds"] for r in runs), max(r["seconds"] for r in runs)] if runs else [],
    }  # fmt: skip


def _commit() -> str:
    """HEAD's short hash, with "+ uncommitted changes" when tracked files differ from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" + uncommitted changes" if dirty else "")


#: the objectives as the pages name them
NAMES = {"grpo": "GRPO", "grpo_symclip": "GRPO-fix"}


def _of(k: int, n: int) -> str:
    """``none of the 4``, ``2 of 4``."""
    return f"none of the {n}" if k == 0 else f"{k} of {n}"


def _collapse_prose(data: dict[str, Any]) -> list[str]:
    """What counts as a collapse, and the first hour's collapsed runs (the one most truncated described)."""
    runs = data["runs"]
    collapsed = [r for r in runs if r["collapsed"]]
    text = (
        f"A run counts as collapsed when its last held-out greedy accuracy is below {COLLAPSE_ACCURACY} or more "
        f"than {COLLAPSE_TRUNCATED:.0%} of its last 10 steps' completions hit `max_new_tokens` (the drift to long, "
        "cut-off completions that a collapse starts with). "
    )
    if not collapsed:
        return [text + f"None of the first hour's {len(runs)} runs collapsed."]
    by = ", ".join(
        f"{sum(r['objective'] == o for r in collapsed)} {NAMES.get(o, o)}"
        for o in OBJECTIVES
        if any(r["objective"] == o for r in collapsed)
    )
    w = max(collapsed, key=lambda r: r["truncated_last10"])
    text += (
        f"{len(collapsed)} of the first hour's {len(runs)} runs collapsed ({by}). "
        + ("The most truncated" if len(collapsed) > 1 else "It")
        + f" ({NAMES.get(w['objective'], w['objective'])} on {w['isa']}, seed {w['seed']}) ended with completions of {w['length_last10']:.2f} tokens on average over its last 10 steps, "
        f"{w['truncated_last10']:.2f} of them cut, entropy {w['entropy_last10']:.2f} (at step 1: "
        f"{w['entropy_first']:.2f}) and last held-out greedy accuracy {w['eval_last']:.2f}."
    )
    return [text]


def _truncation_prose(c: dict[str, Any]) -> list[str]:
    """What the collapse study's table shows, counted from its runs."""
    masked = [r for r in c["runs"] if r["truncation"] == "mask"]
    failed = [r for r in c["runs"] if r["truncation"] == "failure_reward"]
    if not masked or not failed:
        return []
    k = int(sum(r["collapsed"] for r in masked))
    worst = min(masked, key=lambda r: r["reward_last10"])
    cut = worst["no_update_steps"]
    text = (
        f"Under `mask`, GRPO collapsed in {_of(k, len(masked))} seeds"
        + (
            f"; the worst run ended at reward {worst['reward_last10']:.3f} and held-out accuracy "
            f"{worst['eval_last']:.2f}"
            + (
                f", with {cut} steps in which every completion was truncated (the run's last line counts them; "
                'the progress bar says "all completions truncated, no update")'
                if cut
                else ""
            )
            if k
            else ""
        )
        + ". Under `mask` (DAPO's overlong filtering) a truncated completion leaves the loss and its group's "
        "advantages, so nothing in the loss pushes back once completions start to run long; under "
        "`failure_reward` (a cut completion gets reward 0 and stays in the loss) "
        f"{_of(int(sum(r['collapsed'] for r in failed)), len(failed))} collapsed, and their last held-out "
        f"accuracy was {min(r['eval_last'] for r in failed):.2f}–{max(r['eval_last'] for r in failed):.2f} "
        f"(the model's before training: {c['model']['accuracy']:.2f}). {len(masked)} seeds each: this points at "
        "the mechanism, it does not prove it."
    )
    return [text]


def markdown(data: dict[str, Any], command: str) -> str:
    """``docs/first-hour.md``: the runs and the ranges, generated (not typed)."""
    lines = [
        "# The first hour, on three machines",
        "",
        "<!-- generated by `python -m tools.first_hour`; do not edit by hand -->",
        "",
        f"Generated by `{command}` on {time.strftime('%Y-%m-%d')} (commit {_commit()}). Each instruction set "
        "(`tools/machines.py`: this CPU's own kernels, AVX2, no SIMD; all three on one host) stands for "
        "a machine: it builds "
        "its own tiny model with the README's command, then trains the README's two runs "
        f"(`{CONFIG}`, {STEPS} steps, one torch thread each) with training seeds {', '.join(map(str, sorted({r['seed'] for r in data['runs']})))}.",
        "",
        "## The warm-started models",
        "",
        "| instruction set | warm-start steps | held-out greedy accuracy | seconds |",
        "|---|---|---|---|",
        *(
            f"| {isa} | {m['steps']} | {m['accuracy']:.2f} | {m['seconds'] or float('nan'):.0f} |"
            for isa, m in data["models"].items()
        ),
        "",
        f"Each training run took {data['run_seconds'][0]:.0f}–{data['run_seconds'][1]:.0f} s (the sum of its "
        "steps' `time/step_s`; two runs side by side on a 2-core machine).",
        "",
        "## Ranges over the runs (min – max)",
        "",
        "| measure | " + " | ".join(data["ranges"]) + " |",
        "|---|" + "---|" * len(data["ranges"]),
    ]
    for key, label in MEASURES.items():
        cells = [f"{lo:.3f} – {hi:.3f}" for lo, hi in (data["ranges"][o][key] for o in data["ranges"])]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    collapsed = [
        f"{int(sum(r['collapsed'] for r in data['runs'] if r['objective'] == o))}" for o in data["ranges"]
    ]
    lines.append("| runs that collapsed (see below) | " + " | ".join(collapsed) + " |")
    if data["pairs"]:
        lines += [
            "",
            f"## GRPO-fix against GRPO, paired by instruction set and seed ({data['pairs']} pairs)",
            "",
            "| measure | pairs where GRPO-fix is below GRPO | GRPO-fix − GRPO (min – max) |",
            "|---|---|---|",
            *(
                f"| {label} | {data['symclip_below_grpo'][k]} of {data['pairs']} | "
                f"{data['symclip_minus_grpo'][k][0]:+.3f} – {data['symclip_minus_grpo'][k][1]:+.3f} |"
                for k, label in MEASURES.items()
            ),
        ]
    lines += [
        "",
        "## Every run",
        "",
        "| instruction set | objective | seed | " + " | ".join(MEASURES) + " | collapsed |",
        "|---|---|---|" + "---|" * (len(MEASURES) + 1),
    ]
    for r in data["runs"]:
        vals = " | ".join(f"{r[k]:.3f}" for k in MEASURES)
        lines.append(
            f"| {r['isa']} | {r['objective']} | {r['seed']} | {vals} | {'yes' if r['collapsed'] else 'no'} |"
        )
    from scaledrun.tiny import DEFAULT_STOP_ACCURACY

    lines += ["", "## A collapse, and the truncation policy", "", *_collapse_prose(data)]
    if data.get("collapse") and data["collapse"]["runs"]:
        c = data["collapse"]
        lines += [
            "",
            f"`python -m tools.first_hour --collapse` also builds the old default model (`python -m "
            f"scaledrun.tiny {' '.join(COLLAPSE_TINY_ARGS)}`: {c['model']['steps']} fixed steps, held-out greedy "
            f"accuracy {c['model']['accuracy']:.2f} with this CPU's own kernels"
            + "".join(f", {a:.2f} with {isa}" for isa, a in c["model_accuracy"].items() if isa != "native")
            + ") and trains GRPO on the native one with each "
            "`truncation` policy (`mask`, the default: a truncated completion leaves the loss and its group's "
            "advantages; `failure_reward`: it gets reward 0 and stays in). These runs are not the first hour's: "
            f"its model stops its warm start at greedy accuracy {DEFAULT_STOP_ACCURACY}.",
            "",
            "| truncation | seed | reward_last10 | eval_last | truncated_last10 | length_last10 | entropy_first "
            "| entropy_last10 | steps without an update | collapsed |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *(
                f"| {r['truncation']} | {r['seed']} | {r['reward_last10']:.3f} | {r['eval_last']:.3f} | "
                f"{r['truncated_last10']:.3f} | {r['length_last10']:.3f} | {r['entropy_first']:.3f} | "
                f"{r['entropy_last10']:.3f} | {r['no_update_steps']} | {'yes' if r['collapsed'] else 'no'} |"
                for r in c["runs"]
            ),
            "",
            *_truncation_prose(c),
        ]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.first_hour", description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=REPO / "runs" / "first-hour", help="models and run folders")
    ap.add_argument("--isas", default=",".join(INSTRUCTION_SETS), help="instruction sets (tools.machines)")
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="training seeds")
    ap.add_argument("--out", type=Path, default=OUT_MD, help="the page to write (and its .json beside it)")
    ap.add_argument("--report-only", action="store_true", help="only rewrite the page from finished runs")
    ap.add_argument("--jobs", type=int, default=2, help="runs side by side, one thread each (default 2)")
    ap.add_argument(
        "--collapse",
        action="store_true",
        help="also the collapse study: the old 300-step model, both truncations",
    )
    args = ap.parse_args(argv)
    isas = [x for x in args.isas.split(",") if x]
    unknown = [x for x in isas if x not in INSTRUCTION_SETS]
    if unknown:
        ap.error(f"unknown instruction set(s) {', '.join(unknown)}; valid: {', '.join(INSTRUCTION_SETS)}")
    seeds = [int(x) for x in args.seeds.split(",") if x]
    if not args.report_only:
        run_all(args.work, isas, seeds, max(1, args.jobs), collapse=args.collapse)
    data = collect(args.work, isas, seeds)
    if not data["runs"]:
        ap.error(f"no finished run in {args.work}: run without --report-only first")
    command = (
        "python -m tools.first_hour"
        + ("" if isas == list(INSTRUCTION_SETS) else f" --isas {args.isas}")
        + (" --collapse" if data["collapse"] else "")
    )
    args.out.write_text(markdown(data, command))
    args.out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out} and {args.out.with_suffix('.json')} ({len(data['runs'])} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
