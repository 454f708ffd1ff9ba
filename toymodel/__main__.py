"""Command line of the tabular toy.

    python -m toymodel list                                   # the scenarios
    python -m toymodel demo                                   # the paper's toy results, ~10-20 s on 2 CPU cores
    python -m toymodel equivalent_solutions --objective gspo --steps 200 --seeds 5
    python -m toymodel template_task --objective dfpo --transform orth_proj --json > run.json
    python -m toymodel template_task --objective gspo --estimator paper   # DFPO's eq. 86 control
    python -m toymodel template_task --compare --seeds 10 --steps 150   # the README's table

A run prints every k-th step (the mean over seeds) and a final summary as ``rich`` tables whose columns
fit their values; "n/a" marks a value that does not exist (NaN: e.g. no token shared by the group at
that step) and a std over one seed. ``--json`` prints the config, every seed's rows and the summary as
JSON instead (NaN as null). Each option maps to one argument of ``toymodel.simulate`` (objective
parameters such as ``--epsilon-low`` are passed only when given, so the objective's own defaults apply
otherwise). Bad option values end in an argparse error naming the option (exit code 2, no traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from typing import Any

import torch
from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from cancellation import compute_loss
from cancellation.batching import SPLIT_MODES
from cancellation.objectives import PARAMS

from .batched import seed_rows, simulate_seeds
from .compare import compare, format_table
from .scenarios import (
    EQUIVALENT_SOLUTIONS,
    SCENARIOS,
    clip_asymmetry_net,
    shared_prefix_net,
)
from .simulate import OPTIMIZERS, simulate, summarize
from .theory import clip_coefficient, clip_surrogate, eq38_coefficient, eq38_gspo_coefficient

TABLE_KEYS = (
    "expected_reward",
    "sampled_reward",
    "entropy",
    "equiv_entropy",
    "equiv_log_odds",
    "template_kl",
    "shared_residual",
    "group_shared_residual",
    "sequence_net_residual",
    "clip/frac",
    "asym",
    "ratio/mean",
)
SUMMARY_KEYS = (
    "expected_reward",
    "equiv_entropy",
    "equiv_log_odds",
    "template_kl",
    "shared_residual",
    "group_shared_residual",
    "sequence_net_residual",
    "asym",
)

#: clipping disabled (clip(s, 1e-6, 1 + 1e9) never binds here)
NO_CLIP = {"epsilon_low": 0.999999, "epsilon_high": 1e9}


def _int_at_least(low: int, why: str = "") -> Any:
    """argparse type: an int ≥ ``low``; the error (argparse prefixes the option) says why."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be ≥ {low}, got {value}{why}")
        return value

    return parse


def _float(*, positive: bool):
    """argparse type: a finite float (> 0 with ``positive``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or (positive and value <= 0):
            raise argparse.ArgumentTypeError(
                f"must be a finite number{' > 0' if positive else ''}, got {text}"
            )
        return value

    return parse


#: why G = 1 is refused (the Training lab warns the same)
GROUP_OF_ONE = (
    ": a group of one completion is its own group's mean, so every advantage is 0 and nothing learns"
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m toymodel",
        description="Simulate group-relative RL objectives on the DFPO paper's tabular toy problems.",
    )
    p.add_argument("scenario", choices=[*SCENARIOS, "demo", "list"], help="a scenario, 'demo' or 'list'")
    p.add_argument("--objective", help="grpo, grpo_symclip, gspo or dfpo (required for a scenario run)")
    _add_objective_options(p)
    p.add_argument(
        "--no-clip", action="store_true", help="disable clipping (grpo/gspo/dfpo: ε_low=0.999999, ε_high=1e9)"
    )
    p.add_argument("--steps", type=_int_at_least(1, ": a run needs at least one step to report"), default=200)
    p.add_argument(
        "--group-size", type=_int_at_least(2, GROUP_OF_ONE), default=8, help="G, completions per group (≥ 2)"
    )
    p.add_argument(
        "--lr", type=_float(positive=True), default=None, help="default: 0.5 for sgd, 0.05 for adam"
    )
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd")
    p.add_argument("--inner-epochs", type=_int_at_least(1), default=4)
    p.add_argument("--seeds", type=_int_at_least(1), default=1, help="number of seeds (runs)")
    p.add_argument("--seed", type=int, default=0, help="first seed")
    p.add_argument("--num-groups", type=_int_at_least(1), default=1)
    p.add_argument("--batching", choices=SPLIT_MODES, default="query")
    p.add_argument("--num-minibatches", type=_int_at_least(1), default=1)
    p.add_argument("--reward-balanced-rho", type=float, default=None)
    p.add_argument("--lopti-eta", type=float, default=None)
    p.add_argument("--ar-alpha", type=float, default=None)
    p.add_argument("--adv-scale", choices=("group", "batch", "none"), default="group")
    p.add_argument("--aggregation", default=None)
    p.add_argument(
        "--every", type=_int_at_least(1), default=None, help="print every k-th step (default: about 20 rows)"
    )
    p.add_argument(
        "--threshold",
        type=_float(positive=False),
        default=0.9,
        help="expected-reward threshold for steps-to-threshold",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="run the standard objective comparison (toymodel.compare.VARIANTS) instead of --objective",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    return p


def objective_param_fields() -> dict[str, dict[str, dataclasses.Field]]:
    """Every objective parameter (``cancellation.params``) → {objective: its field}, in declaration order."""
    out: dict[str, dict[str, dataclasses.Field]] = {}
    for objective, cls in PARAMS.items():
        for f in dataclasses.fields(cls):
            out.setdefault(f.name, {})[objective] = f
    return out


def _add_objective_options(p: argparse.ArgumentParser) -> None:
    """One option per objective parameter, read from the objectives' dataclasses (``cancellation.params``): its
    type, valid choices, documentation and each objective's default. Not given: the objective's own default."""
    for name, by_objective in objective_param_fields().items():
        first = next(iter(by_objective.values()))
        defaults = ", ".join(f"{o} {f.default}" for o, f in by_objective.items())
        kw: dict[str, Any] = {"default": None, "help": f"{first.metadata['doc']} (default: {defaults})"}
        if isinstance(first.default, bool):
            kw["action"] = argparse.BooleanOptionalAction
        elif isinstance(first.default, float):
            kw["type"] = float
        elif isinstance(first.metadata.get("choices"), tuple):
            kw["choices"] = first.metadata["choices"]
        p.add_argument(f"--{name.replace('_', '-')}", **kw)


def _objective_params(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if args.no_clip:
        params.update(NO_CLIP)
    for name in objective_param_fields():
        value = getattr(args, name)
        if value is not None:
            params[name] = value
    return params


#: how a value that does not exist is shown (NaN, a std over one seed)
NA = "n/a"


def _fmt(x: float | None) -> str:
    """4 decimals; 'n/a' for NaN or None; scientific notation where 4 decimals would be unreadable."""
    if x is None or math.isnan(x):
        return NA
    if math.isinf(x) or abs(x) >= 1e9:
        return f"{x:.4e}"
    return f"{x:.4f}"


def _table(*columns: str) -> Table:
    """A plain table: a header rule, right-aligned columns that never wrap or truncate."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 and name != "step" else "right", no_wrap=True)
    return table


def _print_table(table: Table) -> None:
    """Print at the table's natural width, however narrow the terminal (nothing cut or wrapped)."""
    console = Console(file=sys.stdout, highlight=False)
    width = Measurement.get(console, console.options.update_width(1_000_000), table).maximum
    if width > console.width:
        console = Console(file=sys.stdout, highlight=False, width=width)
    console.print(table)


def _nan_to_none(x: Any) -> Any:
    """NaN (and ±inf) as None, recursively: the JSON output is strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_nan_to_none(v) for v in x]
    return x


def _dump_json(obj: Any) -> None:
    json.dump(_nan_to_none(obj), sys.stdout, indent=1, allow_nan=False)
    print()


#: options that choose or tune one objective (they do not apply to --compare's fixed variants)
OBJECTIVE_OPTIONS = ("objective", *objective_param_fields())


def run_compare(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    given = [f"--{n.replace('_', '-')}" for n in OBJECTIVE_OPTIONS if getattr(args, n) is not None]
    if args.no_clip:
        given.append("--no-clip")
    if given:
        parser.error(
            f"--compare runs the fixed variants of toymodel.compare.VARIANTS, each with its own objective "
            f"parameters, so {', '.join(given)} would be ignored: drop them, or run one objective without --compare"
        )
    config = _simulate_config(args)
    config.pop("steps")
    t0 = time.perf_counter()
    try:
        rows = compare(args.scenario, seeds=args.seeds, steps=args.steps, threshold=args.threshold, **config)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    if args.json:
        _dump_json({"scenario": args.scenario, "config": config, "rows": rows})
        return 0
    print(
        f"{args.scenario}: {args.seeds} seeds × {args.steps} steps, G={args.group_size}, "
        f"{args.inner_epochs} inner epochs, {args.optimizer} (mean ± std over seeds; "
        f"{time.perf_counter() - t0:.1f} s)\n"
    )
    print(format_table(rows, args.threshold, seeds=args.seeds))
    return 0


def _simulate_config(args: argparse.Namespace) -> dict[str, Any]:
    return dict(
        steps=args.steps,
        group_size=args.group_size,
        lr=args.lr,
        optimizer=args.optimizer,
        inner_epochs=args.inner_epochs,
        num_groups=args.num_groups,
        batching=args.batching,
        num_minibatches=args.num_minibatches,
        reward_balanced_rho=args.reward_balanced_rho,
        lopti_eta=args.lopti_eta,
        ar_alpha=args.ar_alpha,
        adv_scale=args.adv_scale,
        aggregation=args.aggregation,
    )


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.compare:
        return run_compare(args, parser)
    if args.objective is None:
        parser.error("--objective is required for a scenario run (grpo, grpo_symclip, gspo, dfpo)")
    params = _objective_params(args)
    config = _simulate_config(args)
    seeds = list(range(args.seed, args.seed + args.seeds))
    t0 = time.perf_counter()
    try:
        runs = [simulate(args.scenario, args.objective, seed=s, **config, **params) for s in seeds]
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    elapsed = time.perf_counter() - t0
    summary = {
        k: summarize(runs, k, threshold=args.threshold if k == "expected_reward" else None)
        for k in SUMMARY_KEYS
    }
    if args.json:
        out = {
            "scenario": args.scenario,
            "objective": args.objective,
            "objective_params": params,
            "config": config,
            "seeds": seeds,
            "rows": runs,
            "summary": summary,
            "seconds": elapsed,
        }
        _dump_json(out)
        return 0
    n = len(runs[0])
    every = args.every or max(1, n // 20)
    what = f"{args.objective} {params}" if params else args.objective
    print(f"{args.scenario} · {what} · {len(seeds)} seed(s) · {elapsed:.2f} s")
    print(step_table_title(every, n, len(seeds)))
    _print_table(step_table(runs, every))
    print("\nsummary over seeds (final value, Jitter₂ = DFPO eq. 20):")
    _print_table(summary_table(summary, runs))
    print()
    reward = summary["expected_reward"]
    reached = sum(h is not None for h in reward["steps_to_threshold"])
    if reached:
        print(
            f"steps to expected_reward ≥ {reward['threshold']:g}: {_fmt(reward['steps_mean'])} (mean over the "
            f"{reached} of {len(seeds)} seed(s) that reached it)"
        )
    else:
        print(f"steps to expected_reward ≥ {reward['threshold']:g}: n/a (no seed reached it in {n} steps)")
    print(
        "n/a: the value does not exist (no token shared by a group at that step, so no residual; a std over one seed)"
    )
    return 0


def step_table_title(every: int, steps: int, n_seeds: int) -> str:
    which = "every step" if every == 1 else f"every {every} steps of {steps} (and the last)"
    return f"{which}, " + (
        f"the mean over the {n_seeds} seeds' values (a seed without one is left out):"
        if n_seeds > 1
        else "one seed:"
    )


def step_table(runs: list[list[dict[str, float]]], every: int) -> Table:
    """Every ``every``-th step (and the last) of ``TABLE_KEYS``, the mean over seeds of the finite values."""
    n = len(runs[0])
    table = _table("step", *TABLE_KEYS)
    for i in range(n):
        if (i + 1) % every and i != n - 1:
            continue
        vals = []
        for k in TABLE_KEYS:
            xs = [r[i][k] for r in runs if not math.isnan(r[i][k])]
            vals.append(statistics.mean(xs) if xs else math.nan)
        table.add_row(str(i + 1), *(_fmt(v) for v in vals))
    return table


def summary_table(summary: dict[str, dict[str, Any]], runs: list[list[dict[str, float]]]) -> Table:
    """``summarize``'s final mean ± sample std and Jitter₂ per metric; the std is n/a when fewer than two
    seeds have a final value (``summarize`` reports 0 there)."""
    table = _table("metric", "final", "± std", "Jitter₂")
    for k, s in summary.items():
        finite = sum(not math.isnan(r[-1][k]) for r in runs)
        std = s["final_std"] if finite > 1 else math.nan
        table.add_row(k, _fmt(s["final_mean"]), _fmt(std), _fmt(s["jitter2_mean"]))
    return table


# -----------------------------------------------------------------------------------------------
# demo


def _demo_shared_prefix() -> None:
    print("(1) DFPO App. A.2, eq. (38): net coefficient of a shared prefix step (t = 1; t = 2 is equal)")
    print("    group {answer is 25, answer is 20}, Â = (−A, +A), A = 1, G = 2, clipping off everywhere.")
    print(
        "    closed form A·ρ1·ρ2·(λ2 − λ1)/G for s = Π r (the 1/G of eq. 11); (A/(G·T))·(s2 − s1) for GSPO's s = (Π r)^(1/T)."
    )
    head = (
        f"  {'ρ1':>5s} {'ρ2':>5s} {'λ1':>5s} {'λ2':>5s} | {'eq.(38)/G':>10s} {'GSPO Πr':>10s} | "
        f"{'closed':>10s} {'GSPO':>10s} | {'GRPO':>8s} {'DFPO min':>9s} {'DFPO orth':>9s}"
    )
    print(head)
    for rho1, rho2, lam1, lam2 in [
        (1.1, 0.9, 1.3, 0.7),
        (0.95, 1.15, 0.6, 1.8),
        (1.5, 0.5, 2.0, 1.0),
        (0.3, 1.7, 0.2, 3.0),
    ]:
        closed = eq38_coefficient(rho1, rho2, lam1, lam2)
        prod = shared_prefix_net(
            "gspo", rho1, rho2, lam1, lam2, length_norm=False, aggregation="seq-mean-token-mean", **NO_CLIP
        )[0]
        closed_ln = eq38_gspo_coefficient(rho1, rho2, lam1, lam2)
        ln = shared_prefix_net("gspo", rho1, rho2, lam1, lam2, **NO_CLIP)[0]
        grpo = shared_prefix_net("grpo", rho1, rho2, lam1, lam2, **NO_CLIP)[0]
        dmin = shared_prefix_net("dfpo", rho1, rho2, lam1, lam2, transform="min_replace", **NO_CLIP)[0]
        dorth = shared_prefix_net("dfpo", rho1, rho2, lam1, lam2, transform="orth_proj", **NO_CLIP)[0]
        print(
            f"  {rho1:5.2f} {rho2:5.2f} {lam1:5.2f} {lam2:5.2f} | {closed:10.6f} {prod:10.6f} | "
            f"{closed_ln:10.6f} {ln:10.6f} | {grpo:8.1e} {dmin:9.1e} {dorth:9.1e}"
        )
    print(
        "\n    DFPO App. F, eq. (75)/(76): GRPO (ε = 0.2) on a shared token with ratio w, Â = (−1, +1), token-mean over 4 tokens."
    )
    print(
        "    Eq. (75)/(76) give the aggregated surrogate C(w); along ∇log π its gradient is w·C'(w) = ∓w (the clipped"
    )
    print("    branch is constant), /4 for token-mean. GRPO-fix (App. H, eq. 82) cancels exactly.")
    print(f"  {'w':>5s} {'C(w)':>8s} {'w·Cʹ(w)/4':>10s} {'GRPO':>10s} {'GRPO-fix':>10s}")
    for w in (1.5, 1.9, 1.1, 0.6, 0.3):
        print(
            f"  {w:5.2f} {clip_surrogate(w):8.3f} {clip_coefficient(w, norm=4):10.4f} "
            f"{clip_asymmetry_net('grpo', w):10.4f} "
            f"{clip_asymmetry_net('grpo_symclip', w):10.4f}"
        )


def _demo_eq41() -> None:
    """First SGD step on App. A.3's group {τ1, τ2, τ3}, Â = (−2/3, 1/3, 1/3), θ ≠ θ_old, no clipping."""
    sc = EQUIVALENT_SOLUTIONS
    policy = sc.policy()
    old = sc.initial_logits()
    theta = policy.logits_from_probs(
        {(): {"The": 0.3, "10": 0.7}, ("The", "answer", "is"): {"25": 0.4, "20": 0.6}}
    )
    idx = torch.tensor([0, 1, 2])
    adv = torch.tensor([-2 / 3, 1 / 3, 1 / 3], dtype=torch.float64)
    group = torch.zeros(3, dtype=torch.long)
    mask = policy.mask[idx]
    old_logp = policy.token_logp(old, idx)

    def grad(fn) -> torch.Tensor:
        z = theta.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(fn(z), z)
        return torch.where(policy.valid, g, torch.zeros_like(g))

    def j(name: str, **kw):
        return lambda z: (
            -compute_loss(name, policy.token_logp(z, idx), old_logp, adv, mask, group, **NO_CLIP, **kw)[0]
        )

    score = [grad(lambda z, i=i: policy.traj_logp(z)[i]) for i in range(3)]
    d_lo = score[1] - score[2]
    lengths = mask.sum(-1)
    s = ((policy.token_logp(theta, idx) - old_logp).sum(-1) / lengths).exp()
    k = torch.stack([(d_lo * score[i]).sum() / (3 * lengths[i]) for i in range(3)])
    eta = 0.01
    lo = lambda z: float(policy.traj_logp(z)[1] - policy.traj_logp(z)[2])  # noqa: E731
    print(
        "\n    eq. (41) first-step check: θ = {π(The)=0.3, π(20|The answer is)=0.6}, θ_old uniform, SGD η = 0.01, no clipping"
    )
    print(f"    s = (s1, s2, s3) = ({s[0]:.4f}, {s[1]:.4f}, {s[2]:.4f}): s2 ≠ s3 (eq. 39)")
    firsts = []
    for label, name, kw in (("GSPO", "gspo", {}), ("DFPO min_replace", "dfpo", {"transform": "min_replace"})):
        g = grad(j(name, **kw))
        actual = lo(theta + eta * g) - lo(theta)
        first = eta * float((d_lo * g).sum())
        firsts.append(first)
        s_used = s if name == "gspo" else torch.full_like(s, float(s.min()))
        model = eta * float((adv * s_used * k).sum())
        what = "s_i" if name == "gspo" else "s_min"
        print(
            f"    {label:17s} Δ log π(τ2)/π(τ3) = {actual:+.6e}   first order η·∇LO·∇J = {first:+.6e}"
            f"   η·Σ Â_i·{what}·k_i = {model:+.6e}"
        )
    s_driven = eta * float((adv * (s - float(s.min())) * k).sum())
    print(
        f"    s-driven part η·Σ Â_i·(s_i − s_min)·k_i = {s_driven:+.3e} = GSPO − DFPO first order "
        f"({firsts[0] - firsts[1]:+.3e}): DFPO Min-Replace removes it"
    )
    print(
        "    (c of eq. 40 is not one constant here: |τ2| = 5, |τ3| = 6 and τ2 shares the root with τ1; k_i carries it.)"
    )


def _demo_equivalent_solutions(steps: int = 100, seeds: int = 10) -> None:
    print(
        f"\n(2) DFPO App. A.3: equivalent correct answers τ2 'The answer is 20 .' vs τ3 '10 + 10 = 20 .', {seeds} seeds × {steps} steps,"
    )
    print(
        "    G = 8, 4 inner epochs, SGD lr = 0.5. Start: equiv-set entropy 0.6365, log-odds log π(τ2)/π(τ3) = −0.6931."
    )
    configs = [
        ("GSPO", "gspo", {}),
        ("GRPO", "grpo", {}),
        ("GRPO-fix (symclip)", "grpo_symclip", {}),
        ("GSPO eq.86 (control)", "gspo", {"estimator": "paper"}),
        ("DFPO min_replace", "dfpo", {"transform": "min_replace"}),
        ("DFPO orth_proj", "dfpo", {"transform": "orth_proj"}),
        ("DFPO min_replace ppo_clip", "dfpo", {"transform": "min_replace", "estimator": "ppo_clip"}),
        ("GSPO ε=0.2", "gspo", {"epsilon_low": 0.2, "epsilon_high": 0.2}),
        (
            "DFPO min_replace ε=0.2",
            "dfpo",
            {"transform": "min_replace", "epsilon_low": 0.2, "epsilon_high": 0.2},
        ),
    ]
    print(f"  {'objective':26s} {'equiv entropy':>16s} {'log-odds':>16s} {'E[R]':>16s}")
    for label, name, kw in configs:
        # all seeds of a config in one batched call (per seed equal to ``simulate``, tested in toymodel)
        batch = simulate_seeds("equivalent_solutions", name, seeds, steps=steps, residuals=False, **kw)
        runs = [seed_rows(batch, i) for i in range(seeds)]
        h, lo, r = (summarize(runs, m) for m in ("equiv_entropy", "equiv_log_odds", "expected_reward"))
        print(
            f"  {label:26s} {h['final_mean']:8.4f} ± {h['final_std']:.4f} {lo['final_mean']:8.3f} ± {lo['final_std']:.3f} "
            f"{r['final_mean']:8.4f} ± {r['final_std']:.4f}"
        )
    # the clip fraction is one of the objective's own metrics, which only ``simulate`` logs
    gspo = [simulate("equivalent_solutions", "gspo", steps=steps, seed=s) for s in range(seeds)]
    gspo_clip = [row["clip/frac"] for rows in gspo for row in rows if row["zero_adv_group_frac"] < 1.0]
    clip = statistics.mean(gspo_clip) if gspo_clip else math.nan
    print(
        f"    GSPO's default clip range (3e-4/4e-4) clips most sequences after the first inner step ({clip:.0%} at"
    )
    print(
        "    the last inner step, mean over the steps with a learning signal). GSPO's own objective (and DFPO's"
    )
    print(
        "    ppo_clip variant) then gives them no gradient and moves slowly; the paper's estimator (DFPO, and the"
    )
    print(
        "    eq. 86 control: GSPO's s̄ under the same estimator, no transform) keeps their gradient, at the clipped"
    )
    print(
        "    weight, so both move as fast as GRPO. GSPO → control is the estimator's effect, control → DFPO the"
    )
    print("    transform's (here within noise). In this toy most of the drift towards τ3 is genuine credit")
    print(
        "    assignment (τ2 shares its first token 'The' with the wrong τ1), not the s-driven part: GRPO, which"
    )
    print("    cancels exactly, drifts as far.")


def demo() -> int:
    t0 = time.perf_counter()
    _demo_shared_prefix()
    _demo_eq41()
    _demo_equivalent_solutions()
    print(f"\n(demo took {time.perf_counter() - t0:.1f} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # the toy's tensors are tiny: intra-op threads only add overhead (a lot of it on a busy machine)
    torch.set_num_threads(1)
    if args.scenario == "demo":
        return demo()
    if args.scenario == "list":
        for name, sc in SCENARIOS.items():
            print(f"{name}  ({sc.reference})\n    {sc.description}\n")
        return 0
    return run(args, parser)


if __name__ == "__main__":
    sys.exit(main())
