"""Compare objectives on one scenario over many seeds: the numbers the README reports.

``compare`` runs ``simulate`` for each variant and seed and summarises, per variant, the final exact
statistics (mean ± sample std over seeds), the learning tax paid to reach a reward threshold, the
mean cancellation residuals, steps-to-threshold (DFPO Table 2) and Jitter₂ (DFPO eq. 20).

    python -m toymodel template_task --compare --seeds 10 --steps 150
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from cancellation.update import RESIDUAL_KEYS

from .simulate import simulate, summarize

#: The standard comparison: label → (objective, objective parameters). DFPO runs the paper's
#: stop-gradient estimator (every trajectory, clipped or not, gets s̃_i·Â_i on ∇log s_i); "gspo eq.86"
#: is the paper's baseline under that same estimator (s̄_i·Â_i, no transform), so DFPO vs "gspo eq.86"
#: isolates the transform and "gspo eq.86" vs "gspo" (GSPO's own PPO-clip objective) isolates the
#: estimator. "dfpo min_replace ppo_clip" is DFPO's trust-region variant (not in the paper: a clipped
#: sequence gets no gradient), which at GSPO's clip range (3e-4 / 4e-4) behaves almost like GSPO. The
#: "ε=0.2" variants show the sequence-level objectives with GRPO's clip range.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo": ("grpo", {}),
    "grpo_symclip": ("grpo_symclip", {}),
    "gspo": ("gspo", {}),
    "gspo eq.86": ("gspo", {"estimator": "paper"}),
    "dfpo min_replace": ("dfpo", {"transform": "min_replace"}),
    "dfpo orth_proj": ("dfpo", {"transform": "orth_proj"}),
    "dfpo min_replace ppo_clip": ("dfpo", {"transform": "min_replace", "estimator": "ppo_clip"}),
    "gspo ε=0.2": ("gspo", {"epsilon_low": 0.2, "epsilon_high": 0.2}),
    "dfpo min_replace ε=0.2": ("dfpo", {"transform": "min_replace", "epsilon_low": 0.2, "epsilon_high": 0.2}),
    "dfpo orth_proj ε=0.2": ("dfpo", {"transform": "orth_proj", "epsilon_low": 0.2, "epsilon_high": 0.2}),
}

#: Columns of ``compare``'s rows (each also has a ``_std`` twin except ``variant`` and ``reached_frac``).
COLUMNS = (
    "expected_reward",
    "equiv_entropy",
    "equiv_log_odds",
    "template_kl",
    "template_kl_at_threshold",
    "shared_residual",
    "group_shared_residual",
    "sequence_net_residual",
    "steps_to_threshold",
    "jitter2",
)


def _mean_std(xs: Sequence[float]) -> tuple[float, float]:
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return math.nan, math.nan
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def summarize_variant(runs: Sequence[Sequence[Mapping[str, float]]], threshold: float) -> dict[str, float]:
    """One summary row for the runs (one per seed) of one variant.

    ``template_kl_at_threshold`` is the template KL at the first step whose expected reward reaches
    ``threshold`` (the learning tax paid for that much reward; seeds that never reach it are left
    out); the residuals (``shared_residual``, ``group_shared_residual``, ``sequence_net_residual``) are
    each seed's mean over the steps that had one.
    """
    out: dict[str, float] = {}
    for key in ("expected_reward", "equiv_entropy", "equiv_log_odds", "template_kl"):
        s = summarize(runs, key)
        out[key], out[f"{key}_std"] = s["final_mean"], s["final_std"]
    reward = summarize(runs, "expected_reward", threshold=threshold)
    hits = reward["steps_to_threshold"]
    out["steps_to_threshold"], out["steps_to_threshold_std"] = _mean_std([h for h in hits if h is not None])
    out["reached_frac"] = reward["reached_frac"]
    out["jitter2"], out["jitter2_std"] = reward["jitter2_mean"], reward["jitter2_std"]
    at = [rows[int(h) - 1]["template_kl"] for rows, h in zip(runs, hits, strict=True) if h is not None]
    out["template_kl_at_threshold"], out["template_kl_at_threshold_std"] = _mean_std(at)
    for key in RESIDUAL_KEYS:
        per_seed = [_mean_std([r[key] for r in rows])[0] for rows in runs]
        out[key], out[f"{key}_std"] = _mean_std(per_seed)
    return out


def compare(
    scenario: str,
    variants: Mapping[str, tuple[str, dict[str, Any]]] | None = None,
    *,
    seeds: int = 10,
    steps: int = 150,
    threshold: float = 0.9,
    **simulate_kwargs: Any,
) -> list[dict[str, Any]]:
    """Run every variant for ``seeds`` seeds (0..seeds−1) and return one summary row per variant.

    Args:
        scenario: a scenario name.
        variants: label → (objective, objective parameters); ``VARIANTS`` when None.
        seeds, steps: runs per variant and steps per run.
        threshold: expected-reward threshold for steps-to-threshold and the learning tax at it.
        **simulate_kwargs: shared ``simulate`` arguments (group_size, lr, inner_epochs, batching, ...).
    Returns:
        rows with ``variant`` and the ``COLUMNS`` (means over seeds), their ``_std`` and ``reached_frac``.
    """
    rows = []
    for label, (objective, params) in (VARIANTS if variants is None else variants).items():
        runs = [
            simulate(scenario, objective, steps=steps, seed=s, **simulate_kwargs, **params)
            for s in range(seeds)
        ]
        rows.append({"variant": label, **summarize_variant(runs, threshold)})
    return rows


def format_table(rows: Sequence[Mapping[str, Any]], threshold: float = 0.9, seeds: int | None = None) -> str:
    """A Markdown table of ``compare``'s rows (mean ± std over seeds).

    "n/a" stands for a value that does not exist: a NaN mean (e.g. no event shared by the whole group),
    and, when ``seeds`` (the seeds per variant) is given, a std over one seed: a run over one seed, or a
    column over the seeds that reached the threshold when only one did.
    """
    heads = {
        "expected_reward": "E[R] final",
        "equiv_entropy": "equiv. entropy",
        "equiv_log_odds": "log-odds τa/τb",
        "template_kl": "template KL",
        "template_kl_at_threshold": f"template KL at E[R]≥{threshold}",
        "shared_residual": "shared residual",
        "group_shared_residual": "group-shared residual",
        "sequence_net_residual": "sequence-net residual",
        "steps_to_threshold": f"steps to E[R]≥{threshold}",
        "jitter2": "Jitter₂ E[R]",
    }
    lines = ["| variant | " + " | ".join(heads[c] for c in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for r in rows:
        cells = []
        for c in COLUMNS:
            mean, std = r[c], r[f"{c}_std"]
            digits = 1 if c == "steps_to_threshold" else (5 if c == "jitter2" else 3)
            n = seeds
            if n is not None and c in ("steps_to_threshold", "template_kl_at_threshold"):
                n = round(r["reached_frac"] * seeds)  # the std is over the seeds that reached it
            spread = "n/a" if (n is not None and n < 2) or math.isnan(std) else f"{std:.{digits}f}"
            cell = "n/a" if math.isnan(mean) else f"{mean:.{digits}f} ± {spread}"
            if c == "steps_to_threshold" and r["reached_frac"] < 1.0:
                cell += f" ({r['reached_frac']:.0%} reached)"
            cells.append(cell)
        lines.append(f"| {r['variant']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
