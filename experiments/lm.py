"""The language-model sweep: the arms grid through the real trainer, one run folder per (arm, seed).

    from experiments.lm import run_lm
    studies = run_lm(Path("runs/experiments"))             # the full grid (python -m experiments --only lm)
    studies = run_lm(Path("runs/experiments-quick/lm"), quick=True)

The sweep's arms, grid sizes, registered predictions and limits are declared in ``experiments.lm_studies``;
this module runs the grid and measures it.

What runs
    The task is ``template_forms`` (``scaledrun.tasks``): 2-digit additions answered with a long shared
    template in two equally correct surface forms (``The sum of a and b is c.`` / ``Adding a and b gives
    c.``), so a group's completions share most of their tokens and the equivalent-solution entropy
    (``eval/form_entropy``) is measurable. Unless ``model`` names one, the tiny Qwen3 is built once in
    ``<root>/model`` (``scaledrun.tiny.build_tiny``), warm-started on both forms so that RL starts with
    both successes and failures in most groups; a second call reuses it (``warm_start.json`` must record
    the same settings, else the call stops and names the folder: it never rebuilds silently).

    Every (arm, seed) is a normal run folder ``<root>/runs/<arm>/seed<k>`` written by
    ``python -m scaledrun.train --config experiments/configs/lm_base.yaml <arm's overrides> --seed k``
    in a subprocess (a crash or an out-of-memory kill of one run never stops the sweep, and each run's
    memory goes back when it ends), its output in ``<run folder>/sweep.log``. The app's Runs page opens
    ``<root>/runs`` (arm/seed folders) or one arm's folder.

    The arms are compute-matched: the same task, prompts, G, prompts per step, inner epochs, mini-batches,
    optimiser steps, learning rate and seeds (``lm_base.yaml``, off-policy as in
    ``scaledrun/configs/offpolicy.yaml``: 4 inner epochs × 2 query-preserved mini-batches, so that ratios
    leave 1 and the objectives differ). A seed draws the same prompts and, at step 1, the same
    completions in every arm (common random numbers), so differences are taken per seed.

Resuming (``run_grid``)
    A run whose ``metrics.jsonl`` reaches the configured ``steps`` is skipped (``finished``); one with
    fewer rows and a checkpoint is continued with ``--resume true`` (the trainer keeps exactly one row per
    step); one with rows but no checkpoint yet starts again (``--overwrite true``); a run that fails is
    reported with the tail of its ``sweep.log`` and the sweep goes on. A finished run whose saved config
    differs from the sweep's in a field that changes the math (``scaledrun.rundir.config_differences``) is
    reported as failed, not reused: delete it or use another root. So a second ``run_lm`` on the same
    root runs nothing new, and an interrupted one continues where it stopped. A run extended to more
    ``steps`` keeps the steps it took, but its lr schedule follows the new length from there on (the
    trainer's resume message says so): it is not a fresh run of that length, so a study starts in a root
    of its own.

Per-seed measures (``measure_run``; from each run's ``metrics.jsonl``, rows up to ``steps``)
    - ``steps_to_threshold``: the first step whose trailing mean of ``reward/mean`` over a full window of
      ``window`` = min(``MA_WINDOW``, steps) steps reaches the threshold; ``math.inf`` if never (right-
      censored, horizon = steps). The threshold is the start level + ``THRESHOLD_GAIN``, rounded to 0.01:
      the start level is the mean sampled reward of the first window (steps 1..window) over every run of
      the grid, all arms alike (step 1 alone, the same in every arm for a seed, is one draw of 32
      completions per seed: too noisy); a fixed one is ``run_lm(threshold=...)``. The study's
      ``setting`` states the value;
    - ``final_reward``: ``reward/mean`` (the sampled training reward) averaged over the last 10 steps;
    - ``final_greedy_accuracy``, ``final_avg_at_k``: the last eval row's ``eval/greedy_accuracy`` and
      ``eval/avg@k`` (the trainer always evaluates at the last step);
    - ``jitter2_reward`` / ``jitter2_eval_accuracy``: DFPO eq. 20 of the per-step ``reward/mean`` and of
      the eval greedy-accuracy curve (NaN with fewer than 3 points);
    - ``form_entropy_final`` / ``form_entropy_at_threshold`` (matched reward: the first eval at or after
      ``steps_to_threshold``; NaN if the run never reaches it), ``form_mass_final``,
      ``form_logodds_final``, ``head_logprob_final``: the trainer's ``eval/form_*`` and
      ``eval/head_logprob`` metrics (held-out prompts) when it logs them.
      Matched on the training reward, not on the held-out avg@k: on the tiny model the held-out avg@k
      barely moves while the training reward rises (the lr probe: ~0.3 throughout), so a threshold on it
      would match nothing;
    - ``shared_residual``, ``group_shared_residual``, ``sequence_net_residual``, ``asym``, ``clip_frac``,
      ``clip_low_frac``, ``clip_high_frac``, ``flip_rate``, ``flip_pos_suppressed``, ``flip_neg_boosted``:
      the mean over the steps with a finite value;
    - ``entropy_final``: the token entropy of π_old (mean of the last 10 steps); ``time_per_step``: the mean
      ``time/step_s`` (without eval).

    A run that failed or did not reach ``steps`` gives NaN for every measure (the report counts it as
    dropped). Curves (``CURVES``): per seed, the trailing mean of ``reward/mean`` (partial windows at the
    start), ``sequence_net_residual`` per step, and the eval greedy accuracy and form entropy per eval.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from cancellation.diagnostics import jitter2, trailing_mean
from scaledrun import tiny as _tiny

from .lm_studies import (
    ABLATION_ARMS,
    ABLATION_BASELINE,
    ABLATION_PREDICTIONS,
    ARM_LABELS,
    BASE_CONFIG,
    FULL,
    LIMITS,
    LM_ARMS,
    MAIN_PREDICTIONS,
    PROBE_ARMS,
    PROBE_LRS,
    QUICK,
)
from .study import CURVE_POINTS, Measure, Prediction, StudyResult, sig

REPO = Path(__file__).resolve().parents[1]
#: The synthetic task the tiny model is built and warm-started for.
TASK = "template_forms"
#: The tiny model's build settings (``scaledrun.tiny.build_tiny``), besides the warm start below.
MODEL_SETTINGS = {"task": TASK, "seed": 0, "digits": 2, "ops": "+"}
#: The tiny model's supervised warm start for ``template_forms``: ``scaledrun.tiny``'s constants (at most
#: ``FORMS_WARM_START_STEPS`` steps, stopped once greedy accuracy on unseen train-split problems reaches
#: ``FORMS_STOP_ACCURACY``; a fixed step count lands anywhere between 0.2 and 0.85, see ``scaledrun.tiny``).
WARM_START_STEPS: int = _tiny.FORMS_WARM_START_STEPS
STOP_ACCURACY: float | None = _tiny.FORMS_STOP_ACCURACY
#: The reward threshold is the start level + this (see the module docstring).
THRESHOLD_GAIN = 0.1
#: The trailing window (steps) of the reward's moving mean.
MA_WINDOW = 10
#: Steps averaged by ``final_reward`` and ``entropy_final``.
FINAL_STEPS = 10
#: At most this many points per per-step curve.
#: Runs in parallel by default, each with cpu_count // jobs torch threads: on 2 cores, 2 jobs x 1 thread beat
#: 1 job x 2 threads (measured, see ``lm_base.yaml``).
DEFAULT_JOBS = 2
#: The run folder's log of every sweep attempt (stdout and stderr of the trainer).
LOG_FILE = "sweep.log"
_IMPORT_LOCK = threading.Lock()

# --------------------------------------------------------------------------------------------------
# the model


def ensure_model(
    folder: Path,
    *,
    warm_start_steps: int = WARM_START_STEPS,
    stop_accuracy: float | None = STOP_ACCURACY,
    settings: Mapping[str, Any] = MODEL_SETTINGS,
    progress: Callable[[str], Any] | None = print,
) -> Path:
    """The tiny model in ``folder``: built once (``build_tiny``), reused while its settings match.

    ``settings``: ``build_tiny``'s task, seed, digits and operators (``MODEL_SETTINGS``: ``template_forms``).

    Raises ``ValueError`` naming the folder when its ``warm_start.json`` records other settings (a
    different task, seed, digits, operators, warm-start steps or stop accuracy): delete the folder or use
    another root. A folder without ``warm_start.json`` is an interrupted build and is built again.
    """
    want: dict[str, Any] = {**settings, "warm_start_steps": int(warm_start_steps)}
    extra: dict[str, Any] = {}
    if stop_accuracy is not None:
        want["stop_accuracy"] = extra["stop_accuracy"] = float(stop_accuracy)
    say = progress or (lambda _m: None)
    record = folder / "warm_start.json"
    if record.is_file():
        have = json.loads(record.read_text())
        diff = {k: (have.get(k), v) for k, v in want.items() if have.get(k) != v}
        if "stop_accuracy" in have and "stop_accuracy" not in want:
            diff["stop_accuracy"] = (have["stop_accuracy"], None)
        if diff:
            raise ValueError(
                f"the model folder {folder} was built with other settings ("
                + ", ".join(f"{k}: {a!r} there, {b!r} here" for k, (a, b) in diff.items())
                + "); delete it to rebuild, or run the sweep in another root"
            )
        return folder
    say(
        f"building the tiny model in {folder} ({settings['task']}, {warm_start_steps} warm-start steps"
        + (f", stopping at greedy accuracy {stop_accuracy}" if stop_accuracy is not None else "")
        + ")"
    )
    t0 = time.perf_counter()
    _tiny.build_tiny(folder, warm_start_steps=warm_start_steps, **settings, **extra)  # type: ignore[arg-type]
    rec = json.loads(record.read_text())
    if "accuracy_after" in rec:
        say(
            f"  {len(rec.get('losses', []))} warm-start steps, greedy accuracy on held-out prompts "
            f"{rec['accuracy_before']:.2f} -> {rec['accuracy_after']:.2f}, {time.perf_counter() - t0:.0f} s"
        )
    return folder


# --------------------------------------------------------------------------------------------------
# one run


@dataclass(frozen=True)
class RunSpec:
    """One (arm, seed) run: its folder and the command-line overrides of ``BASE_CONFIG``."""

    arm: str
    seed: int
    path: Path
    args: tuple[str, ...]
    steps: int
    imports: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunOutcome:
    """What the sweep did with one run.

    ``status``: ``finished`` (already complete, skipped), ``ran`` (a fresh run), ``resumed`` (continued
    from its checkpoint), ``restarted`` (rows but no checkpoint: started again) or ``failed``;
    ``steps_before`` / ``steps_after``: the last logged step before and after; ``message``: why it failed
    (the tail of its log) or the trainer's last line.
    """

    arm: str
    seed: int
    path: Path
    status: str
    steps_before: int
    steps_after: int
    seconds: float = 0.0
    message: str = ""


def _overrides(values: Mapping[str, Any]) -> list[str]:
    out = []
    for k, v in values.items():
        if isinstance(v, (list, tuple)):
            out += [f"--{k}", *map(str, v)]
            continue
        if isinstance(v, bool):
            v = "true" if v else "false"
        elif v is None:
            v = "none"
        out += [f"--{k}", str(v)]
    return out


def last_step(path: Path) -> int:
    """The last step in ``path/metrics.jsonl`` (0: none)."""
    from scaledrun.runlog import read_metrics

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a cut-off last line: the trainer drops it on resume
        rows = read_metrics(path)
    return int(max((r["step"] for r in rows), default=0))


def _config_problem(spec: RunSpec) -> str | None:
    """Why ``spec`` cannot run as configured (an invalid override), or why a finished run in its folder
    cannot count (its config differs from the sweep's in a field that changes the math); None if fine."""
    from scaledrun.config import config_dict, load_config
    from scaledrun.rundir import config_differences

    try:
        with _IMPORT_LOCK:  # transformers' lazy imports are not safe to race from two threads
            for module in spec.imports:  # e.g. a reward the config names, registered on import
                importlib.import_module(module)
            cfg = load_config(str(BASE_CONFIG), list(spec.args))
    except (ValueError, FileNotFoundError) as err:
        return f"invalid config: {err}"
    saved = spec.path / "config.yaml"
    if saved.is_file():
        diff = config_differences(yaml.safe_load(saved.read_text()) or {}, config_dict(cfg))
        if diff:
            return (
                f"{spec.path} holds a run with a different config ({'; '.join(diff)}); delete that folder "
                "or run the sweep in another root"
            )
    return None


def _tail(path: Path, lines: int = 15) -> str:
    if not path.is_file():
        return ""
    text = path.read_text(errors="replace").replace("\r", "\n")
    return "\n".join([x for x in text.splitlines() if x.strip()][-lines:])


def run_one(spec: RunSpec, *, threads: int = 1) -> RunOutcome:
    """Bring one run to ``spec.steps``: skip it, start it, resume it or restart it (see the module docstring)."""
    from scaledrun.checkpoint import latest_checkpoint

    before = last_step(spec.path)
    problem = _config_problem(spec)
    if problem is not None:
        return RunOutcome(spec.arm, spec.seed, spec.path, "failed", before, before, message=problem)
    if before >= spec.steps:
        return RunOutcome(spec.arm, spec.seed, spec.path, "finished", before, before)
    extra: list[str] = []
    status = "ran"
    if (spec.path / "config.yaml").exists() or (spec.path / "metrics.jsonl").exists():
        if latest_checkpoint(spec.path) is not None:
            extra, status = ["--resume", "true"], "resumed"
        else:
            extra, status = ["--overwrite", "true"], "restarted"
    cmd = [
        sys.executable, "-m", "scaledrun.train", *(a for m in spec.imports for a in ("--import", m)),
        "--config", str(BASE_CONFIG), *spec.args, "--output_dir", str(spec.path), *extra,
    ]  # fmt: skip
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "TQDM_DISABLE": "1",  # no progress bars in sweep.log
        "PYTHONUNBUFFERED": "1",
    }
    spec.path.mkdir(parents=True, exist_ok=True)
    log = spec.path / LOG_FILE
    t0 = time.perf_counter()
    with log.open("a") as f:
        f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {status}: {' '.join(cmd)}\n")
        f.flush()
        rc = subprocess.run(
            cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, check=False
        ).returncode
        f.write(f"=== exit code {rc} after {time.perf_counter() - t0:.1f} s\n")
    seconds = time.perf_counter() - t0
    after = last_step(spec.path)
    if rc != 0 or after < spec.steps:
        why = f"exit code {rc}" if rc != 0 else f"stopped at step {after} of {spec.steps}"
        return RunOutcome(
            spec.arm, spec.seed, spec.path, "failed", before, after, seconds,
            f"{why}; the end of {log}:\n{_tail(log)}",
        )  # fmt: skip
    last = [x for x in _tail(log, 5).splitlines() if x.startswith("run ")]
    return RunOutcome(
        spec.arm, spec.seed, spec.path, status, before, after, seconds, last[-1] if last else ""
    )


def run_grid(
    specs: Sequence[RunSpec],
    *,
    jobs: int = DEFAULT_JOBS,
    threads: int | None = None,
    progress: Callable[[str], Any] | None = print,
) -> list[RunOutcome]:
    """Run ``specs``, ``jobs`` at a time, each with ``threads`` torch threads (default cpu_count // jobs);
    outcomes in spec order."""
    if jobs < 1:
        raise ValueError(f"`jobs` must be ≥ 1, got {jobs}")
    say = progress or (lambda _m: None)
    threads = max(1, (os.cpu_count() or 1) // jobs) if threads is None else int(threads)
    lock = threading.Lock()
    done = [0]

    def work(spec: RunSpec) -> RunOutcome:
        out = run_one(spec, threads=threads)
        with lock:
            done[0] += 1
            head = f"[{done[0]}/{len(specs)}] {spec.arm}/seed{spec.seed}: {out.status}"
            if out.status == "finished":
                say(f"{head} (step {out.steps_after}, skipped)")
            elif out.status == "failed":
                say(f"{head}: {out.message}")
            else:
                say(f"{head}, steps {out.steps_before + 1}-{out.steps_after} in {out.seconds:.0f} s")
        return out

    if jobs == 1:
        return [work(s) for s in specs]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(work, specs))


# --------------------------------------------------------------------------------------------------
# per-seed measures


def _finite(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def _mean(values: Sequence[float]) -> float:
    v = _finite(values)
    return sum(v) / len(v) if v else math.nan


def _avg_key(rows: Sequence[Mapping[str, float]]) -> str | None:
    keys = {k for r in rows for k in r if k.startswith("eval/avg@")}
    return sorted(keys)[0] if keys else None


#: Step-mean measures: measure key → metrics.jsonl key.
MEAN_MEASURES = {
    "shared_residual": "shared_residual",
    "group_shared_residual": "group_shared_residual",
    "sequence_net_residual": "sequence_net_residual",
    "asym": "asym",
    "clip_frac": "clip/frac",
    "clip_low_frac": "clip/low_frac",
    "clip_high_frac": "clip/high_frac",
    "flip_rate": "flip/rate",
    "flip_pos_suppressed": "flip/pos_suppressed",
    "flip_neg_boosted": "flip/neg_boosted",
    "energy_frequent": "energy/bucket_0",
    "time_per_step": "time/step_s",
}


def measure_run(
    rows: Sequence[Mapping[str, float]], *, steps: int, threshold: float, window: int = MA_WINDOW
) -> dict[str, float]:
    """Every per-seed measure of one finished run (``rows``: its metrics rows, steps 1..``steps``)."""
    rows = [r for r in rows if r["step"] <= steps]
    window = max(1, min(window, steps))
    reward = [float(r.get("reward/mean", math.nan)) for r in rows]
    x = [int(r["step"]) for r in rows]
    smooth = trailing_mean(reward, window, full=True)
    hit = [s for s, v in zip(x, smooth, strict=True) if math.isfinite(v) and v >= threshold]
    evals = [r for r in rows if math.isfinite(r.get("eval/greedy_accuracy", math.nan))]
    avg = _avg_key(evals)
    out: dict[str, float] = {
        "steps_to_threshold": float(hit[0]) if hit else math.inf,
        "final_reward": _mean(reward[-FINAL_STEPS:]),
        "final_greedy_accuracy": float(evals[-1]["eval/greedy_accuracy"]) if evals else math.nan,
        "final_avg_at_k": float(evals[-1][avg]) if evals and avg else math.nan,
    }
    r_fin = _finite(reward)
    out["jitter2_reward"] = jitter2(r_fin) if len(r_fin) >= 3 and len(r_fin) == len(reward) else math.nan
    acc = [float(r["eval/greedy_accuracy"]) for r in evals]
    out["jitter2_eval_accuracy"] = jitter2(acc) if len(acc) >= 3 else math.nan
    for name in ("form_entropy", "form_mass", "form_logodds", "head_logprob"):
        key = f"eval/{name}"
        with_key = [r for r in evals if math.isfinite(r.get(key, math.nan))]
        out[f"{name}_final"] = float(with_key[-1][key]) if with_key else math.nan
    # matched reward: the first eval at or after the step where the training reward reached the threshold
    matched = [r for r in evals if hit and r["step"] >= hit[0]]
    ent = matched[0].get("eval/form_entropy", math.nan) if matched else math.nan
    out["form_entropy_at_threshold"] = float(ent) if ent is not None else math.nan
    for measure, key in MEAN_MEASURES.items():
        out[measure] = _mean([r.get(key, math.nan) for r in rows])
    out["entropy_final"] = _mean([r.get("entropy", math.nan) for r in rows[-FINAL_STEPS:]])
    return out


MEASURE_KEYS = (
    "steps_to_threshold", "final_reward", "final_greedy_accuracy", "final_avg_at_k", "jitter2_reward",
    "jitter2_eval_accuracy", "form_entropy_final", "form_entropy_at_threshold", "form_mass_final",
    "form_logodds_final", "head_logprob_final", "shared_residual", "group_shared_residual",
    "sequence_net_residual", "asym", "clip_frac", "clip_low_frac", "clip_high_frac", "flip_rate", "flip_pos_suppressed", "flip_neg_boosted",
    "energy_frequent", "entropy_final", "time_per_step",
)  # fmt: skip


def measure_defs(steps: int, threshold: float, k: int | str = "k") -> list[Measure]:
    thr = f"reward ≥ {threshold:.2f}"
    defs = {
        "steps_to_threshold": Measure(
            "steps_to_threshold", f"steps to {thr} ({MA_WINDOW}-step mean)", "lower", float(steps)
        ),
        "final_reward": Measure("final_reward", f"sampled reward, last {FINAL_STEPS} steps", "higher"),
        "final_greedy_accuracy": Measure(
            "final_greedy_accuracy", f"greedy accuracy at step {steps}", "higher"
        ),
        "final_avg_at_k": Measure("final_avg_at_k", f"avg@{k} at step {steps}", "higher"),
        "jitter2_reward": Measure("jitter2_reward", "Jitter₂ of the sampled reward (eq. 20)", "lower"),
        "jitter2_eval_accuracy": Measure(
            "jitter2_eval_accuracy", "Jitter₂ of eval accuracy (eq. 20)", "lower"
        ),
        "form_entropy_final": Measure("form_entropy_final", f"form entropy at step {steps}", "higher"),
        "form_entropy_at_threshold": Measure(
            "form_entropy_at_threshold",
            f"form entropy at {thr} (first eval after; the seeds that reach it only, a selection)",
            "higher",
        ),
        "form_mass_final": Measure("form_mass_final", f"mass on the two forms at step {steps}", None),
        "form_logodds_final": Measure("form_logodds_final", f"form log-odds at step {steps}", None),
        "head_logprob_final": Measure(
            "head_logprob_final", f"log π(shared head) at step {steps} (held out)", None
        ),
        "shared_residual": Measure("shared_residual", "shared residual (eq. 72)", "lower"),
        "group_shared_residual": Measure("group_shared_residual", "group-shared residual", "lower"),
        "sequence_net_residual": Measure("sequence_net_residual", "sequence-net residual", "lower"),
        "asym": Measure("asym", "Asym (eq. 23)", "lower"),
        "clip_frac": Measure("clip_frac", "clip fraction", None),
        "clip_low_frac": Measure("clip_low_frac", "clip fraction, lower side", None),
        "clip_high_frac": Measure("clip_high_frac", "clip fraction, upper side", None),
        "flip_rate": Measure(
            "flip_rate", "token-flip rate against Â (cancellation-hypothesis paper App. C)", None
        ),
        "flip_pos_suppressed": Measure("flip_pos_suppressed", "tokens suppressed in Â > 0 rollouts", None),
        "flip_neg_boosted": Measure("flip_neg_boosted", "tokens boosted in Â < 0 rollouts", None),
        "energy_frequent": Measure(
            "energy_frequent", "gradient-energy share of the most frequent third of tokens (eq. 24)", "lower"
        ),
        "entropy_final": Measure("entropy_final", f"token entropy, last {FINAL_STEPS} steps", None),
        "time_per_step": Measure("time_per_step", "seconds per step (no eval)", None),
    }
    return [defs[key] for key in MEASURE_KEYS]


#: Curves for the figures: curve name → (metrics key, per step or per eval).
CURVES = {
    "reward_moving_mean": ("reward/mean", "step"),
    "eval_greedy_accuracy": ("eval/greedy_accuracy", "eval"),
    "form_entropy": ("eval/form_entropy", "eval"),
    "sequence_net_residual": ("sequence_net_residual", "step"),
}


def run_curves(
    rows: Sequence[Mapping[str, float]], steps: int
) -> dict[str, tuple[list[int], list[float | None]]]:
    """Curve name → (x, values) of one finished run (``CURVES``; empty where the key is never logged)."""
    rows = [r for r in rows if r["step"] <= steps]
    out: dict[str, tuple[list[int], list[float | None]]] = {}
    for name, (key, kind) in CURVES.items():
        if kind == "eval":
            pts = [r for r in rows if math.isfinite(r.get(key, math.nan))]
            if pts:
                out[name] = ([int(r["step"]) for r in pts], [sig(r[key]) for r in pts])
            continue
        values = [float(r.get(key, math.nan)) for r in rows]
        if not _finite(values):
            continue
        if name == "reward_moving_mean":
            values = trailing_mean(values, max(1, min(MA_WINDOW, steps)), full=False)
        idx = np.unique(np.linspace(0, len(rows) - 1, min(CURVE_POINTS, len(rows))).round().astype(int))
        out[name] = ([int(rows[i]["step"]) for i in idx], [sig(values[i]) for i in idx])
    return out


# --------------------------------------------------------------------------------------------------
# the sweep


def _seed_list(seeds: int | Sequence[int]) -> list[int]:
    if isinstance(seeds, int):
        if seeds < 0:
            raise ValueError(f"`seeds` must be ≥ 0, got {seeds}")
        return list(range(seeds))
    return [int(s) for s in seeds]


def plan(
    root: Path,
    arms: Mapping[str, Mapping[str, Any]],
    seeds: Mapping[str, Sequence[int]],
    steps: int,
    model: str,
    overrides: Mapping[str, Any] | None = None,
    imports: Sequence[str] = (),
) -> list[RunSpec]:
    """The runs of the grid, seed-major (every arm's seed 0 first) so an interrupted sweep has paired seeds."""
    specs = []
    longest = max((len(s) for s in seeds.values()), default=0)
    for i in range(longest):
        for arm, params in arms.items():
            if i >= len(seeds[arm]):
                continue
            seed = seeds[arm][i]
            values = {**dict(params), **dict(overrides or {}), "model": model, "seed": seed, "steps": steps}
            path = root / "runs" / arm / f"seed{seed}"
            specs.append(RunSpec(arm, seed, path, tuple(_overrides(values)), steps, tuple(imports)))
    return specs


def run_lm(
    root: Path,
    *,
    quick: bool = False,
    seeds: int | Sequence[int] | None = None,
    ablation_seeds: int | Sequence[int] | None = None,
    steps: int | None = None,
    jobs: int = DEFAULT_JOBS,
    model: str | None = None,
    arms: Sequence[str] | Mapping[str, Mapping[str, Any]] | None = None,
    overrides: Mapping[str, Any] | None = None,
    warm_start_steps: int = WARM_START_STEPS,
    stop_accuracy: float | None = STOP_ACCURACY,
    threshold: float | None = None,
    imports: Sequence[str] = (),
    progress: Callable[[str], Any] | None = print,
) -> list[StudyResult]:
    """Run the language-model grid in ``root`` (resumable) and return its studies (``lm_main``, and
    ``lm_ablations`` when ablation arms ran). Nothing is saved here but the run folders; the caller
    saves the studies (``python -m experiments`` writes ``experiments/results/<name>.json.gz``).

    Args:
        root: the sweep's folder: ``model/`` (the tiny model, unless ``model`` is given) and
            ``runs/<arm>/seed<k>/``.
        quick: the small grid (``QUICK``) instead of ``FULL``.
        seeds, ablation_seeds: how many seeds (0..n−1) or which, for the main and the ablation arms.
        steps: RL steps per run (every arm the same).
        jobs: runs in parallel, each with cpu_count // jobs torch threads.
        model: a local folder or hub name for ``from_pretrained`` instead of the tiny model.
        arms: arm names of ``LM_ARMS``, or a mapping name → config overrides (e.g. a test's own arms).
        overrides: config fields set for every run (over ``lm_base.yaml`` and the arm's).
        warm_start_steps, stop_accuracy: the tiny model's supervised warm start (``ensure_model``).
        threshold: a fixed reward threshold instead of start level + ``THRESHOLD_GAIN``.
        imports: modules each trainer imports first (``--import``), e.g. one registering a reward.
    """
    started = time.perf_counter()
    say = progress or (lambda _m: None)
    sizes = QUICK if quick else FULL
    steps = sizes.steps if steps is None else int(steps)
    if steps < 1:
        raise ValueError(f"`steps` must be ≥ 1, got {steps}")
    main_seeds = _seed_list(sizes.seeds if seeds is None else seeds)
    abl_seeds = _seed_list(sizes.ablation_seeds if ablation_seeds is None else ablation_seeds)
    if arms is None:
        arms = sizes.arms
    if isinstance(arms, Mapping):
        grid = {str(k): dict(v) for k, v in arms.items()}
    else:
        unknown = [a for a in arms if a not in LM_ARMS]
        if unknown:
            raise ValueError(f"unknown arm(s) {unknown}; valid: {', '.join(LM_ARMS)}")
        grid = {a: LM_ARMS[a] for a in arms}
    seeds_of = {a: (abl_seeds if a in ABLATION_ARMS else main_seeds) for a in grid}
    grid = {a: p for a, p in grid.items() if seeds_of[a]}
    root = Path(root).resolve()

    if model is None:
        model_path = str(
            ensure_model(
                root / "model", warm_start_steps=warm_start_steps, stop_accuracy=stop_accuracy, progress=say
            )
        )
        model_desc = _model_note(root / "model")
    else:
        model_path, model_desc = model, f"`{model}`"
    specs = plan(root, grid, seeds_of, steps, model_path, overrides, imports)
    say(f"{len(specs)} runs ({len(grid)} arms) of {steps} steps in {root / 'runs'}, {jobs} at a time")
    outcomes = run_grid(specs, jobs=jobs, progress=say)
    counts = {
        s: sum(o.status == s for o in outcomes) for s in ("finished", "ran", "resumed", "restarted", "failed")
    }
    say("sweep: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v))
    return collect(
        outcomes, steps=steps, grid=grid, model_desc=model_desc, threshold=threshold,
        seconds=time.perf_counter() - started, overrides=overrides,
    )  # fmt: skip


#: The learning-rate probe's arms: GSPO, the estimator without a trust region (eq. 86) and DFPO.


def lr_probe(
    root: Path,
    *,
    lrs: Sequence[float] = PROBE_LRS,
    arms: Sequence[str] = PROBE_ARMS,
    seeds: int | Sequence[int] = 1,
    steps: int | None = None,
    jobs: int = DEFAULT_JOBS,
    model: str | None = None,
    progress: Callable[[str], Any] | None = print,
) -> list[dict[str, Any]]:
    """Run ``arms`` at each learning rate in ``lrs`` (``<root>/lr<lr>``, one model in ``<root>/model``) and
    return one row per (lr, arm): the seeds' mean first and last 10-step sampled reward, final greedy
    accuracy, the lowest 10-step reward after the first window (a collapse shows as a fall to ~0), and the
    final token entropy and completion length. The sweep uses one lr for every arm (``lm_base.yaml``)."""
    root = Path(root).resolve()
    if model is None:
        model = str(ensure_model(root / "model", progress=progress))
    out = []
    for lr in lrs:
        (main,) = run_lm(
            root / f"lr{lr:g}", arms=list(arms), seeds=seeds, steps=steps, jobs=jobs, model=model,
            overrides={"lr": lr}, progress=progress, threshold=1.0,
        )  # fmt: skip
        for arm in arms:
            per_run = []
            for seed_dir in sorted((root / f"lr{lr:g}" / "runs" / arm).glob("seed*")):
                rows = _read_rows(seed_dir)
                reward = [r["reward/mean"] for r in rows]
                smooth = trailing_mean(reward, MA_WINDOW, full=True)[MA_WINDOW - 1 :]
                evals = [r for r in rows if math.isfinite(r.get("eval/greedy_accuracy", math.nan))]
                per_run.append(
                    {
                        "first_reward": smooth[0] if smooth else math.nan,
                        "final_reward": _mean(reward[-FINAL_STEPS:]),
                        "min_reward": min(smooth) if smooth else math.nan,
                        "greedy_first": evals[0]["eval/greedy_accuracy"] if evals else math.nan,
                        "greedy_final": evals[-1]["eval/greedy_accuracy"] if evals else math.nan,
                        "entropy_final": _mean([r["entropy"] for r in rows[-FINAL_STEPS:]]),
                        "length_final": _mean([r["completion_length"] for r in rows[-FINAL_STEPS:]]),
                    }
                )
            row = {"lr": lr, "arm": arm, "runs": len(per_run)}
            row.update({k: _mean([p[k] for p in per_run]) for k in (per_run[0] if per_run else {})})
            out.append(row)
            if progress:
                progress(
                    f"lr {lr:g} {arm:<18} "
                    + " ".join(f"{k} {v:.3f}" for k, v in row.items() if isinstance(v, float) and k != "lr")
                )
        del main
    return out


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def _model_note(folder: Path) -> str:
    """The tiny model in words, from its ``warm_start.json``."""
    rec = json.loads((folder / "warm_start.json").read_text())
    steps = len(rec.get("losses", [])) or rec.get("warm_start_steps", 0)
    text = f"the tiny Qwen3 built in {_rel(folder)} ({rec.get('task')}, seed {rec.get('seed')}, {steps} supervised warm-start steps"
    if rec.get("stop_accuracy") is not None:
        text += f" (at most {rec['warm_start_steps']}, stopping at greedy accuracy {rec['stop_accuracy']})"
    if "accuracy_after" in rec:
        text += f", greedy accuracy {rec['accuracy_before']:.2f} -> {rec['accuracy_after']:.2f} on held-out prompts"
    return text + ")"


def _read_rows(path: Path) -> list[dict[str, Any]]:
    from scaledrun.runlog import read_metrics

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return read_metrics(path)


def start_threshold(
    runs: Mapping[tuple[str, int], list[dict[str, Any]]], window: int = MA_WINDOW
) -> tuple[float, float]:
    """(start level, threshold): the mean sampled reward of steps 1..``window`` over all ``runs`` (every arm
    and seed alike), and it + ``THRESHOLD_GAIN`` (rounded to 0.01, at most 0.95)."""
    first = [r["reward/mean"] for rows in runs.values() for r in rows if r["step"] <= window]
    start = _mean(first)
    if not math.isfinite(start):
        return math.nan, math.nan
    return start, min(0.95, round(start + THRESHOLD_GAIN, 2))


def probe_threshold(runs: Sequence[RunOutcome], steps: int) -> tuple[float, float]:
    """(start level, threshold) of a probe block, to be fixed before the block it measures runs: the mean
    sampled reward of steps 1..``MA_WINDOW`` over ``runs`` that finished ``steps`` steps (every arm alike),
    and that + ``THRESHOLD_GAIN`` (``start_threshold``)."""
    done = {
        (o.arm, o.seed): _read_rows(o.path) for o in runs if o.status != "failed" and o.steps_after >= steps
    }
    return start_threshold(done, max(1, min(MA_WINDOW, steps)))


@dataclass
class GridMeasures:
    """What a finished grid measured: ``per_seed`` (arm → measure → seed → value; measures no run logged
    are left out), ``curves`` (``CURVES``), the reward threshold ``threshold`` and how it was set
    (``threshold_text``), ``k`` of avg@k, the ``setting`` in words and ``notes`` (the limits, failed runs)."""

    per_seed: dict[str, dict[str, dict[str, float]]]
    curves: dict[str, dict[str, dict[str, Any]]]
    threshold: float
    threshold_text: str
    k: str
    setting: str
    notes: list[str]

    def study(
        self,
        name: str,
        arms: Sequence[str],
        baseline: str,
        title: str,
        question: str,
        predictions: Sequence[Prediction],
        grid: Mapping[str, Mapping[str, Any]],
        steps: int,
        seconds: float,
        labels: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> StudyResult:
        """A ``StudyResult`` of ``arms`` (those of ``predictions`` whose two arms are both here); ``labels``
        overrides ``ARM_LABELS``; ``extra``: other ``StudyResult`` fields (``block``, ``first_seed``)."""
        names = set(arms)
        labels = {**ARM_LABELS, **dict(labels or {})}
        return StudyResult(
            name=name, title=title, question=question, setting=self.setting, baseline=baseline,
            arms={a: {"label": labels.get(a, a), "config": dict(grid[a])} for a in arms},
            measures=measure_defs(steps, self.threshold, self.k),
            per_seed={a: self.per_seed[a] for a in arms},
            curves={c: {a: v for a, v in per_arm.items() if a in names} for c, per_arm in self.curves.items()},
            predictions=[p for p in predictions if p.arm in names and p.baseline in names],
            notes=list(self.notes), seconds=seconds, **extra,
        )  # fmt: skip


def measure_grid(
    outcomes: Sequence[RunOutcome],
    *,
    steps: int,
    grid: Mapping[str, Mapping[str, Any]],
    model_desc: str = "",
    threshold: float | None = None,
    overrides: Mapping[str, Any] | None = None,
    limits: Sequence[str] = (),
    threshold_source: str = "fixed",
) -> GridMeasures:
    """Measure every run of a finished grid (``measure_run``, ``run_curves``) and state its setting.
    ``threshold``: a fixed reward threshold (``threshold_source`` says where it came from, in the
    setting's words), else the start level of these runs + ``THRESHOLD_GAIN``."""
    complete = {
        (o.arm, o.seed): _read_rows(o.path)
        for o in outcomes
        if o.status != "failed" and o.steps_after >= steps
    }
    start, auto = start_threshold(complete, max(1, min(MA_WINDOW, steps)))
    thr = auto if threshold is None else float(threshold)
    if not math.isfinite(thr):
        thr = 1.0  # no complete run: nothing is measured anyway
    thr_text = (
        f"{thr:.2f} ({threshold_source})"
        if threshold is not None
        else f"{thr:.2f} = the start level {start:.3f} (the mean sampled reward of steps 1-{min(MA_WINDOW, steps)} "
        f"over every run of every arm) + {THRESHOLD_GAIN}"
    )
    saved = [o.path / "config.yaml" for o in outcomes if (o.path / "config.yaml").is_file()]
    ks = {str((yaml.safe_load(f.read_text()) or {}).get("eval_k")) for f in saved}
    k = ks.pop() if len(ks) == 1 else "k"
    per_seed: dict[str, dict[str, dict[str, float]]] = {a: {m: {} for m in MEASURE_KEYS} for a in grid}
    curves: dict[str, dict[str, dict[str, Any]]] = {c: {} for c in CURVES}
    for o in outcomes:
        rows = complete.get((o.arm, o.seed))
        values = (
            measure_run(rows, steps=steps, threshold=thr)
            if rows is not None
            else dict.fromkeys(MEASURE_KEYS, math.nan)
        )
        for m in MEASURE_KEYS:
            per_seed[o.arm][m][str(o.seed)] = values[m]
        if rows is None:
            continue
        for name, (x, ys) in run_curves(rows, steps).items():
            entry = curves[name].setdefault(o.arm, {"x": x, "seeds": {}})
            if entry["x"] == x:
                entry["seeds"][str(o.seed)] = ys
    curves = {c: v for c, v in curves.items() if v}
    # a measure no run has (e.g. form entropy from a trainer that does not log it) is left out; a failed
    # run keeps its NaN values (counted as dropped)
    measured = {
        m for ms in per_seed.values() for m, v in ms.items() if any(not math.isnan(x) for x in v.values())
    }
    per_seed = {arm: {m: v for m, v in ms.items() if m in measured} for arm, ms in per_seed.items()}
    failed = [o for o in outcomes if o.status == "failed"]
    shared = _shared_text(outcomes, grid, overrides)
    seeds_text = "; ".join(f"{a}: seeds {sorted({o.seed for o in outcomes if o.arm == a})}" for a in grid)
    task = dict(overrides or {}).get("task", TASK)
    setting = (
        f"scaledrun.train through {BASE_CONFIG.relative_to(REPO)} on task {task!r} with {model_desc}; {shared}. "
        f"{steps} steps per run; {seeds_text} (the same seed ids in every arm: common random numbers). "
        f"Reward threshold {thr_text}, on the trailing {min(MA_WINDOW, steps)}-step mean of reward/mean (full "
        "windows only); matched reward for the form entropy: the first eval at or after that step."
    )
    notes_common = list(limits)
    if not any("form_entropy_final" in per_seed[a] for a in per_seed):
        notes_common.append(
            "The trainer logged no eval/form_* metric in these runs, so the form-entropy predictions are not measured."
        )
    if failed:
        notes_common.append(
            f"{len(failed)} run(s) failed and count as missing (NaN): "
            + "; ".join(f"{o.arm}/seed{o.seed}: {o.message.splitlines()[0]}" for o in failed)
        )

    return GridMeasures(per_seed, curves, thr, thr_text, k, setting, notes_common)


def collect(
    outcomes: Sequence[RunOutcome],
    *,
    steps: int,
    grid: Mapping[str, Mapping[str, Any]],
    model_desc: str = "",
    threshold: float | None = None,
    seconds: float = 0.0,
    overrides: Mapping[str, Any] | None = None,
) -> list[StudyResult]:
    """The studies of a finished grid (``lm_main``; ``lm_ablations`` when an ablation arm ran)."""
    measured = measure_grid(
        outcomes, steps=steps, grid=grid, model_desc=model_desc, threshold=threshold, overrides=overrides,
        limits=LIMITS,
    )  # fmt: skip

    def study(
        name: str, arm_names: list[str], baseline: str, title: str, question: str, preds
    ) -> StudyResult:
        return measured.study(name, arm_names, baseline, title, question, preds, grid, steps, seconds)

    main = [a for a in grid if a not in ABLATION_ARMS]
    out = []
    if main:
        out.append(
            study(
                "lm_main", main, "gspo" if "gspo" in main else main[0],
                "Language model: GRPO, GRPO-fix, GSPO, the eq. 86 control and DFPO on template_forms",
                "On a tiny Qwen3 trained with the real trainer (LoRA, off-policy updates), does DFPO reach the reward "
                "threshold sooner than GSPO and than the eq. 86 control, with a smoother curve, a higher final "
                "accuracy and less collapse between the two equally correct answer forms; does GRPO-fix cancel "
                "more than GRPO?",
                MAIN_PREDICTIONS,
            )
        )  # fmt: skip
    ablations = [a for a in grid if a in ABLATION_ARMS]
    if ablations:
        arm_names = ([ABLATION_BASELINE] if ABLATION_BASELINE in grid else []) + ablations
        out.append(
            study(
                "lm_ablations", arm_names, arm_names[0],
                "Language model: DFPO's estimator and batching ablations",
                "Does DFPO's gain need the paper's estimator (vs its ppo_clip variant) and query-preserved "
                "mini-batches (vs random ones)?",
                ABLATION_PREDICTIONS,
            )
        )  # fmt: skip
    return out


def _shared_text(
    outcomes: Sequence[RunOutcome], grid: Mapping[str, Mapping[str, Any]], overrides: Mapping[str, Any] | None
) -> str:
    """The shared run settings, read from a run's saved config (else the base config)."""
    cfg: dict[str, Any] = {}
    for o in sorted(
        outcomes, key=lambda o: "batching" in grid.get(o.arm, {})
    ):  # an arm without its own batching first
        if (o.path / "config.yaml").is_file():
            cfg = yaml.safe_load((o.path / "config.yaml").read_text()) or {}
            break
    if not cfg:
        cfg = {**(yaml.safe_load(BASE_CONFIG.read_text()) or {}), **dict(overrides or {})}
    keys = (
        "group_size", "prompts_per_step", "inner_epochs", "num_minibatches", "batching", "lr", "max_new_tokens",
        "lora_rank", "num_train", "num_eval", "eval_every", "eval_k", "temperature",
    )  # fmt: skip
    per_arm = sorted({k for params in grid.values() for k in params})  # e.g. lr, when each arm has its own
    return (
        ", ".join(f"{k} = {cfg[k]}" for k in keys if k in cfg and k not in per_arm)
        + f"; each arm changes only the fields in its config ({', '.join(per_arm) or 'none'})"
    )


__all__ = [
    "RunOutcome",
    "RunSpec",
    "collect",
    "ensure_model",
    "measure_run",
    "plan",
    "run_grid",
    "run_lm",
    "run_one",
]
